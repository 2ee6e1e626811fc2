"""`orcasim compare`: metric deltas between result folders."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orcasim.cli import app
from orcasim.compare import deltas, load_metrics, moved, relative_change
from orcasim.config import ScenarioError


def write_summary(folder: Path, summary: dict[str, dict[str, float | None]]) -> Path:
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_deltas_of_two_runs(tmp_path: Path) -> None:
    a = write_summary(tmp_path / "a", {"orca": {"e2e_s_p50": 2.0, "tpot_s_p50": None}})
    b = write_summary(tmp_path / "b", {"orca": {"e2e_s_p50": 3.0, "tpot_s_p50": None}})
    frame = deltas(load_metrics(a), load_metrics(b))
    row = frame.set_index("metric").loc["e2e_s_p50"]
    assert (row["a"], row["b"], row["delta"], row["rel_change"]) == (2.0, 3.0, 1.0, 0.5)
    assert frame.set_index("metric").loc["tpot_s_p50", "rel_change"] == 0.0  # NaN == NaN here
    res = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code == 0
    assert "e2e_s_p50" in res.output and "tpot_s_p50" not in res.output


def test_runs_with_no_system_in_common_are_named_in_a_warning(tmp_path: Path) -> None:
    # Every row read as removed or added (176 rows of nan and inf), without a word.
    a = write_summary(tmp_path / "a", {"orca": {"e2e_s_p50": 2.0}})
    b = write_summary(tmp_path / "b", {"vllm": {"e2e_s_p50": 2.0}})
    res = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code == 0
    assert "share no system (or point) to compare: orca against vllm" in res.output
    same = CliRunner().invoke(app, ["compare", str(a), str(a)])
    assert "share no system" not in same.output


def test_relative_change_edges() -> None:
    assert relative_change(0.0, 0.0) == 0.0
    assert relative_change(0.0, 1.0) == math.inf
    assert relative_change(-2.0, -1.0) == 0.5


def test_not_a_results_folder_is_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["compare", str(tmp_path), str(tmp_path)])
    assert res.exit_code == 2
    assert "summary.json" in res.output


def test_sweep_folders_compare_point_by_point(tmp_path: Path) -> None:
    from sweep_files import write_sweep

    from orcasim.sweeps import load_sweep, run_sweep

    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [2.0]")
    run_sweep(load_sweep(path), tmp_path / "out", workers=1, progress=False)
    metrics = load_metrics(tmp_path / "out")
    assert list(metrics) == ["rate_per_s=2 r00/request-level", "rate_per_s=2 r00/orca"]
    assert "workload.arrival.rate_per_s" not in metrics["rate_per_s=2 r00/orca"]
    assert (deltas(metrics, metrics)["rel_change"] == 0).all()
    # Its table given as a file, as the README names it: refused as "not UTF-8 text; expected
    # a JSON file" (a tester's find). A sweep folder and its table are one kind.
    from orcasim.compare import metrics_kind
    assert (deltas(load_metrics(tmp_path / "out" / "sweep.parquet"), metrics)["rel_change"] == 0).all()
    assert metrics_kind(tmp_path / "out" / "sweep.parquet") == metrics_kind(tmp_path / "out")


# By hand ---------------------------------------------------------------------------------

def test_deltas_by_hand_with_labels_and_metrics_on_one_side_only() -> None:
    """Rows: a's labels in order, then b's new ones; within a label, a's metrics then b's
    new ones; a value missing on one side is NaN there, its change infinite."""
    frame = deltas({"x": {"m": 1.0, "only_a": 2.0}, "gone": {"m": 4.0}},
                   {"x": {"m": -1.0, "only_b": 3.0}, "new": {"m": 5.0}})
    assert list(frame.columns) == ["label", "metric", "a", "b", "delta", "rel_change", "note"]
    assert frame["note"].tolist() == ["", "only in A", "only in B", "only in A", "only in B"]
    assert list(zip(frame["label"], frame["metric"], strict=True)) == [
        ("x", "m"), ("x", "only_a"), ("x", "only_b"), ("gone", "m"), ("new", "m")]
    assert frame.iloc[0, 2:6].tolist() == [1.0, -1.0, -2.0, -2.0]
    for i in range(1, 5):
        a, b, change = frame.loc[i, "a"], frame.loc[i, "b"], frame.loc[i, "rel_change"]
        assert math.isnan(a) != math.isnan(b) and change == math.inf, i
    empty = deltas({}, {})
    assert empty.empty and list(empty.columns) == list(frame.columns)


def test_relative_change_and_sameness_with_nan() -> None:
    from orcasim.compare import same_value

    assert same_value(math.nan, math.nan) and same_value(1.0, 1.0)
    assert not same_value(1.0, math.nan) and not same_value(math.nan, 1.0)
    assert relative_change(1.0, math.nan) == math.inf and relative_change(math.nan, 1.0) == math.inf
    assert relative_change(math.nan, math.nan) == 0.0
    # Infinity against anything else moved (inf - x > tol * inf was inf > inf: False).
    assert moved(math.inf, 5.0) and moved(5.0, math.inf) and moved(math.inf, -math.inf, 0.0)
    assert not moved(math.inf, math.inf)


def test_a_summary_that_is_not_systems_of_numbers_is_a_one_line_error(tmp_path: Path) -> None:
    import pytest

    from orcasim.compare import read_metrics
    from orcasim.config import ScenarioError

    path = tmp_path / "summary.json"
    # Python's json reads Infinity and NaN, and a baseline of Infinity matched any value (a
    # tester's find); a 401-digit count was an OverflowError traceback.
    for bad in ([1, 2], {"orca": [1.0]}, {"orca": {"e2e_s_p50": "fast"}}, {"orca": {"ok": True}},
                {"orca": {"x": 1.0}, "other": 3.0}, {"orca": {"x": math.inf}},
                {"orca": {"x": -math.inf}}, {"orca": {"x": math.nan}}, {"orca": {"n": 10**400}}):
        path.write_text(json.dumps(bad))
        with pytest.raises(ScenarioError) as error:
            read_metrics(path)
        assert str(error.value) == (f"{path}: expected {{system: {{metric: number}}}} with finite "
                                    "numbers (null where undefined), as orcasim writes it")
    path.write_text(json.dumps({"orca": {"n": 3, "x": None}}))
    metrics = read_metrics(path)
    assert metrics["orca"]["n"] == 3.0 and isinstance(metrics["orca"]["n"], float)
    assert math.isnan(metrics["orca"]["x"])


def test_a_sweeps_labels_and_metrics_by_hand() -> None:
    """A sweep table's rows are labelled by their parameter values (the last part of each
    name unless two clash), replication and system, so the same points in another order pair
    up; its metrics are every column but the point, replication, seed, system and parameter
    columns (those between the seed and the system). Without parameters: the point number."""
    import pandas as pd

    from orcasim.compare import _sweep_metrics

    table = pd.DataFrame({"point": [0, 3], "replication": [1, 0], "seed": [11, 12],
                          "workload.arrival.rate_per_s": [1.0, 2.0], "system": ["orca", "vllm"],
                          "e2e_s_p50": [0.5, 0.25], "requests_completed": [10, 20]})
    assert _sweep_metrics(table) == {
        "rate_per_s=1 r01/orca": {"e2e_s_p50": 0.5, "requests_completed": 10.0},
        "rate_per_s=2 r00/vllm": {"e2e_s_p50": 0.25, "requests_completed": 20.0}}
    reordered = table.iloc[::-1].assign(point=[0, 3])
    assert _sweep_metrics(reordered).keys() == _sweep_metrics(table).keys()
    clash = table.rename(columns={"workload.arrival.rate_per_s": "a.x"}).assign(**{"b.x": [4, 5]})
    clash = clash[["point", "replication", "seed", "a.x", "b.x", "system", "e2e_s_p50"]]
    assert list(_sweep_metrics(clash)) == ["a.x=1 b.x=4 r01/orca", "a.x=2 b.x=5 r00/vllm"]
    # The grid's keys in the other order, its numbers written as integers (a tester's find:
    # the same results read as 1,424 changed metrics and "no common point").
    swapped = clash[["point", "replication", "seed", "b.x", "a.x", "system", "e2e_s_p50"]]
    assert _sweep_metrics(swapped) == _sweep_metrics(clash.astype({"a.x": "int64"}))
    assert list(_sweep_metrics(table.assign(**{"workload.arrival.rate_per_s": [1.5, 2.0]}))) == [
        "rate_per_s=1.5 r01/orca", "rate_per_s=2 r00/vllm"]
    bare = table.drop(columns=["workload.arrival.rate_per_s"])
    assert list(_sweep_metrics(bare)) == ["p0000 r01/orca", "p0003 r00/vllm"]


def test_kinds_baselines_and_float_noise(tmp_path: Path) -> None:
    """A run against a sweep is refused on one line; a baseline file compares with a run, a
    baselines folder with another; a relative change of 1e-16 is no change."""
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.parquet").write_bytes(b"")
    run = write_summary(tmp_path / "run", {"orca": {"e2e_s_p50": 2.0, "ttft_s_p50": 1.0}})
    res = CliRunner().invoke(app, ["compare", str(run), str(tmp_path / "sweep")])
    assert res.exit_code == 2 and "different kinds" in res.output
    baselines = tmp_path / "baselines"
    baselines.mkdir()
    (baselines / "quick.json").write_text(json.dumps({"orca": {"e2e_s_p50": 2.0 * (1 + 1e-16),
                                                               "ttft_s_p50": 1.5}}))
    res = CliRunner().invoke(app, ["compare", str(baselines / "quick.json"), str(run)])
    assert res.exit_code == 0, res.output
    assert "ttft_s_p50" in res.output and "e2e_s_p50" not in res.output and "1 of 2" in res.output
    assert list(load_metrics(baselines)) == ["quick/orca"]
    # Other JSON beside them is no baseline, as `orcasim check` reads the folder (compare
    # failed on it: 'package.json: expected {system: {metric: number}}'; a tester's finding).
    (baselines / "package.json").write_text(json.dumps({"name": "x", "version": "1.0"}))
    assert list(load_metrics(baselines)) == ["quick/orca"]
    res = CliRunner().invoke(app, ["compare", "results/baselines", "results/baselines"])
    assert res.exit_code == 0 and " 0 of " in res.output


def test_a_capacity_folder_is_named_as_one(tmp_path: Path) -> None:
    """Its plan.json made it read as a baselines folder: 'cap is a baselines folder and run
    a run', or 'plan.json: expected {system: {metric: number}}'."""
    from orcasim.compare import metrics_kind

    cap = tmp_path / "cap"
    cap.mkdir()
    (cap / "capacity.csv").write_text("point,system,max_rate_per_s\n0,orca,1.0\n")
    (cap / "plan.json").write_text("{}")
    with pytest.raises(ScenarioError, match="a capacity folder, which compare does not read"):
        metrics_kind(cap)


def test_a_sweep_stopped_before_its_tables_is_named_as_one(tmp_path: Path) -> None:
    """An interrupted sweep holds plan.json and sweep.yaml but no table yet: it read as a
    baselines folder ('plan.json: expected {system: {metric: number}}')."""
    from orcasim.compare import metrics_kind

    sweep = tmp_path / "sw"
    sweep.mkdir()
    (sweep / "plan.json").write_text("{}")
    with pytest.raises(ScenarioError, match=r"a sweep or capacity search with no table yet .* run it "
                                            r"again with --resume$"):
        metrics_kind(sweep)  # a capacity search's holds plan.json alone
    (sweep / "sweep.yaml").write_text("name: sw\n")
    with pytest.raises(ScenarioError, match=r"a sweep or capacity search with no table yet"):
        metrics_kind(sweep)


def _sweep_csv(folder: Path, param: str) -> Path:
    folder.mkdir()
    (folder / "sweep.csv").write_text(f"point,replication,seed,{param},system,e2e_s_p50\n"
                                      "0,0,0,1,a,6.14\n1,0,0,8,a,2.0\n")
    return folder


def test_two_sweeps_of_different_parameters_are_refused(tmp_path: Path) -> None:
    """Labels name a parameter by its path's last part, so a sweep of systems[0]'s batch size
    and one of systems[1]'s paired point by point as one experiment (a tester's finding)."""
    a = _sweep_csv(tmp_path / "a", "systems[0].scheduler.max_batch_size")
    b = _sweep_csv(tmp_path / "b", "systems[1].scheduler.max_batch_size")
    res = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code == 2 and res.output.startswith(
        f"error: {a} sweeps systems[0].scheduler.max_batch_size and {b} sweeps "
        "systems[1].scheduler.max_batch_size: expected sweeps of the same parameters"), res.output
    res = CliRunner().invoke(app, ["compare", str(a), str(a)])
    assert res.exit_code == 0 and " 0 of 2 " in res.output, res.output


def test_a_table_that_is_not_a_sweep_table_is_a_one_line_error(tmp_path: Path) -> None:
    """A summary.csv saved as sweep.csv ('seed' is not in list) and a column of text
    (could not convert string to float) were tracebacks."""
    good = _sweep_csv(tmp_path / "good", "workload.arrival.rate_per_s")
    (tmp_path / "summary").mkdir()
    (tmp_path / "summary" / "sweep.csv").write_text("system,e2e_s_p50\na,1.0\n")
    res = CliRunner().invoke(app, ["compare", str(tmp_path / "summary"), str(good)])
    assert res.exit_code == 2 and "not a sweep table (no point, replication, seed)" in res.output
    assert len(res.output.splitlines()) == 1, res.output
    (tmp_path / "noted").mkdir()
    text = (good / "sweep.csv").read_text().splitlines()
    (tmp_path / "noted" / "sweep.csv").write_text(
        "\n".join([text[0] + ",note", text[1] + ",x", text[2] + ",y"]) + "\n")
    res = CliRunner().invoke(app, ["compare", str(tmp_path / "noted"), str(good)])
    assert res.exit_code == 2 and "column 'note' holds text ('x')" in res.output, res.output


def test_a_metric_on_one_side_only_is_a_change_even_where_it_is_null(tmp_path: Path) -> None:
    """A system dropped from B whose metric was null in A read as unchanged (NaN == NaN)."""
    from orcasim.compare import changed_rows

    frame = deltas({"x": {"m": 1.0}, "y": {"k": math.nan}}, {"x": {"m": 1.0}})
    assert changed_rows(frame).tolist() == [False, True]
    a = write_summary(tmp_path / "a", {"x": {"m": 1.0}, "y": {"k": None}})
    b = write_summary(tmp_path / "b", {"x": {"m": 1.0}})
    res = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code == 0 and "1 of 2 metrics" in res.output and "only in A" in res.output


def test_a_baselines_folder_with_a_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    """A baseline with a merge conflict left in it was skipped: every metric of it read as
    removed, exit 0. Other JSON (a package.json) is still skipped."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    for folder in (good, bad):
        folder.mkdir()
        (folder / "tiny.json").write_text(json.dumps({"orca": {"m": 1.0}}))
        (folder / "package.json").write_text(json.dumps({"name": "x"}))
    (bad / "tiny.json").write_text((bad / "tiny.json").read_text() + "\n<<<<<<< HEAD\n")
    res = CliRunner().invoke(app, ["compare", str(good), str(bad)])
    assert res.exit_code == 2 and f"{bad / 'tiny.json'}: not valid JSON" in res.output, res.output
    assert CliRunner().invoke(app, ["compare", str(good), str(good)]).exit_code == 0


@pytest.mark.parametrize("given", ["folder", "summary.json"])
def test_a_fidelity_folder_is_named_as_one(tmp_path: Path, given: str) -> None:
    """Its summary.json ({"run/system": headline error}) read as a run's and was refused as
    'summary.json: expected {system: {metric: number}} ..., as orcasim writes it', of a file
    orcasim wrote (a tester's finding)."""
    fid = tmp_path / "fid"
    fid.mkdir()
    (fid / "fidelity.csv").write_text("run,system,metric,percentile,real,simulated,rel_error,"
                                      "requests\nr,orca,ttft_s,50,1.0,1.1,0.1,10\n")
    (fid / "summary.json").write_text(json.dumps({"r/orca": 0.1}))
    path = fid if given == "folder" else fid / "summary.json"
    res = CliRunner().invoke(app, ["compare", str(path), str(path)])
    assert res.exit_code == 2
    assert "an orcasim fidelity folder, which compare does not read" in res.output
    assert "as orcasim writes it" not in res.output


def test_systems_named_as_numbers_stay_apart_in_a_sweep_csv(tmp_path: Path) -> None:
    """A scenario sweep's sweep.csv read its system names as numbers: systems '1' and '1.0'
    both read 1.0, and compare merged their rows into one label, '.../1.0' (49 metrics a
    point where there were 98; a tester's finding); '08' read 8."""
    from orcasim.compare import load_pair

    folder = tmp_path / "sw"
    folder.mkdir()
    (folder / "sweep.csv").write_text("point,replication,seed,workload.arrival.rate_per_s,system,"
                                      "e2e_s_p50\n0,0,0,1,1,6.0\n0,0,0,1,1.0,2.0\n0,0,0,1,08,3.0\n")
    a, _ = load_pair(folder, folder)
    assert sorted(a) == ["rate_per_s=1 r00/08", "rate_per_s=1 r00/1", "rate_per_s=1 r00/1.0"]
    assert a["rate_per_s=1 r00/1"]["e2e_s_p50"] == 6.0


def test_a_folder_whose_json_holds_no_baseline_is_refused(tmp_path: Path) -> None:
    """A sweep's point folder (outcome.json) read as a baselines folder of no baselines:
    two of them compared as '0 of 0 metrics', exit 0, as if equal (a tester's finding)."""
    a, b = tmp_path / "p0000-r00", tmp_path / "p0001-r00"
    for folder, e2e_s in ((a, 1.0), (b, 2.0)):
        folder.mkdir()
        (folder / "outcome.json").write_text(json.dumps(
            {"id": folder.name, "ok": True, "systems": {"orca": {"e2e_s_p50": e2e_s}}}))
    res = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code == 2, res.output
    assert f"{a}: none of its JSON files (outcome.json) is a baseline" in res.output


def test_a_count_that_moved_by_one_is_a_change_however_large(tmp_path: Path) -> None:
    """compare held every metric to 1e-9 'as orcasim check allows', where check holds counts
    exactly: 3,000,000,001 prefill tokens saved against 3,000,000,000 was shown unchanged."""
    from orcasim.compare import changed_rows

    a = write_summary(tmp_path / "a", {"orca": {"prefill_tokens_saved": 3e9, "e2e_s_p50": 1.0}})
    b = write_summary(tmp_path / "b", {"orca": {"prefill_tokens_saved": 3e9 + 1,
                                                "e2e_s_p50": 1.0 + 1e-10}})
    frame = deltas(load_metrics(a), load_metrics(b))
    assert changed_rows(frame).tolist() == [True, False]


def test_two_sweeps_run_on_other_seeds_are_said_to_be(tmp_path: Path) -> None:
    """Rows pair by replication, whatever its seed: a scenario's own sweep (its seed, 7)
    against a sweep file of the same grid (seeds spawned from 0) read every metric as moved,
    without a word that the requests themselves differed (a tester's finding)."""
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, seed in ((a, 7), (b, 123456789)):
        folder.mkdir()
        (folder / "sweep.csv").write_text("point,replication,seed,workload.arrival.rate_per_s,"
                                          f"system,e2e_s_p50\n0,0,{seed},1,orca,6.0\n")
    from orcasim.compare import load_pair

    with pytest.warns(UserWarning, match=r"replication 0 ran on seed 7 in .* against 123456789"):
        load_pair(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_pair(a, a)


def test_a_folder_named_with_brackets_is_printed_as_named(tmp_path: Path) -> None:
    """The table's title went through rich's markup: `compare 'run[bold]' ...` titled the
    table 'run -> ...', naming a folder that does not exist (a tester's finding)."""
    a = write_summary(tmp_path / "run[bold]", {"orca": {"e2e_s_p50": 2.0}})
    res = CliRunner().invoke(app, ["compare", str(a), str(a)])
    assert res.exit_code == 0, res.output
    assert f"{a}->{a}" in "".join(res.output.split())  # the title wraps at the table's width


def test_the_title_counts_the_changed_metrics_with_all_too(tmp_path: Path) -> None:
    """With --all, two identical runs were titled '2 of 2 metrics': the rows shown, read as
    every metric changed."""
    a = write_summary(tmp_path / "a", {"orca": {"e2e_s_p50": 2.0, "ttft_s_p50": 1.0}})
    b = write_summary(tmp_path / "b", {"orca": {"e2e_s_p50": 2.0, "ttft_s_p50": 1.5}})
    for flags in ([], ["--all"]):
        res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["compare", str(a), str(b), *flags])
        assert res.exit_code == 0 and "1 of 2 metrics changed" in res.output, res.output
