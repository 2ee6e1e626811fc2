"""`orcasim fidelity`'s parts by hand: the percentile table, the headline error, the replay.

tests/test_validation.py scores the shipped scenarios on the real runs; these cases pin
what a score is made of, on numbers worked out here.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from orcasim.config import ScenarioError
from orcasim.fidelity import (
    COLUMNS,
    check_replay_overrides,
    compare,
    fidelity_table,
    headline_error,
    headline_title,
    replay_of,
)
from orcasim.paths import PACKAGE_DATA_DIR
from tests.conftest import make_scenario


def _frame(ttft: list[float], tpot: list[float], e2e: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e})


def test_the_percentile_table_by_hand() -> None:
    """Real TTFTs 1..5 s and simulated 2..6 s: p50 3 against 4 (+1/3), p90 4.6 against 5.6;
    a metric the log lacks (all NaN) is left out; NaN requests are dropped first; a real
    value of 0 has no relative error."""
    real = _frame([1, 2, 3, 4, 5], [np.nan] * 5, [0.0, 0.0, 0.0, 0.0, np.nan])
    simulated = _frame([2, 3, 4, 5, 6], [0.1] * 5, [1.0, 1.0, 1.0, 1.0, 1.0])
    table = compare(real, simulated, (50, 90))
    assert list(table.columns) == list(COLUMNS) == ["metric", "percentile", "real", "simulated",
                                                    "rel_error", "requests"]
    assert table[["metric", "percentile"]].values.tolist() == [["ttft_s", 50], ["ttft_s", 90],
                                                               ["e2e_s", 50], ["e2e_s", 90]]
    assert table["real"].tolist()[:2] == pytest.approx([3.0, 4.6])
    assert table["simulated"].tolist()[:2] == pytest.approx([4.0, 5.6])
    assert table["rel_error"].tolist()[:2] == pytest.approx([1 / 3, 5.6 / 4.6 - 1])
    assert table["real"].tolist()[2:] == [0.0, 0.0] and table["rel_error"][2:].isna().all()
    assert compare(real, simulated)["percentile"].tolist()[:3] == [50, 90, 99]  # the default
    none = compare(real, _frame([np.nan] * 5, [np.nan] * 5, [np.nan] * 5))
    assert none.empty and list(none.columns) == list(COLUMNS)


def test_each_metric_is_compared_over_the_same_requests() -> None:
    """A request the log left unmeasured, or the simulation turned away, is left out of both
    sides: here the real run's longest TTFTs are missing and the simulation turned away its
    shortest request; what is left agrees exactly. (Each side's own requests gave TTFT p50
    2 against 4: +100% from comparing different requests.)"""
    real = _frame([1, 2, 3, np.nan, np.nan, np.nan], [0.1] * 6, [2, 3, 4, 5, 6, 7])
    simulated = _frame([np.nan, 2, 3, 4, 5, 6], [0.1] * 6, [np.nan, 3, 4, 5, 6, 7])
    table = compare(real, simulated, (50, 90))
    ttft = table[table["metric"] == "ttft_s"]
    assert ttft["real"].tolist() == ttft["simulated"].tolist() == pytest.approx([2.5, 2.9])
    assert (table["rel_error"].abs() < 1e-12).all()
    # How many each row compared, written with it: a replay that turned away 19 of 40
    # requests said so only on stderr, and fidelity.csv held percentiles of the other 21.
    assert table["requests"].tolist() == [2, 2, 6, 6, 5, 5]
    with pytest.raises(RuntimeError, match="internal error: 6 real requests against 5 simulated"):
        compare(real, simulated.iloc[1:])


def test_the_headline_error_is_the_median_over_p50_and_p90() -> None:
    """|errors| 0.1, 0.3 (p50, p90 of one metric) and 0.2, 0.4 (another): median 0.25; p99
    rows do not count, negative errors count by their size; no scored row: NaN."""
    table = pd.DataFrame({"metric": ["a", "a", "a", "b", "b"], "percentile": [50, 90, 99, 50, 90],
                          "rel_error": [0.1, -0.3, 5.0, 0.2, -0.4]})
    assert headline_error(table) == pytest.approx(0.25)
    assert headline_error(table, (99,)) == 5.0
    assert math.isnan(headline_error(table[table["percentile"] == 99]))


@pytest.mark.parametrize("headline", [headline_error, headline_title])
def test_the_headline_of_a_table_that_is_no_fidelity_table_names_its_missing_columns(
        headline: Any) -> None:
    """A sweep table (the committed example's sweep.csv) raised KeyError 'percentile' from
    inside, and one with a percentile column KeyError 'rel_error' (left alone by earlier
    reviews; found giving each table to the headline from Python)."""
    sweep = pd.read_csv(Path(__file__).parent.parent / "results" / "example" / "orca_gpt3_13b" / "sweep.csv")
    expected = r"; expected a fidelity table \(compare\(\.\.\.\), fidelity_table\(\.\.\.\)\[0\] or fidelity\.csv\)"
    with pytest.raises(ScenarioError, match=r"^table: no column 'percentile', 'rel_error'" + expected):
        headline(sweep)
    with pytest.raises(ScenarioError, match=r"^table: no column 'rel_error'" + expected):
        headline(sweep.assign(percentile=50))
    with pytest.raises(ScenarioError, match=r"^table \(NoneType, not a DataFrame\): no column"):
        headline(None)


def _scenario(**changes: object) -> object:
    """The tests' base scenario, seed 1, with two systems and a sweep a replay must drop (of
    the rate: a sweep of the seed is refused since ab14eb0, which failed 14 tests here)."""
    return make_scenario(**{
        "seed": 1, "workload.max_tokens": 256,
        "sweep": {"parameter": "workload.arrival.rate_per_s", "values": [1, 2]},
        "systems": [{"name": "a", "scheduler": {"kind": "iteration_level", "max_batch_size": 4}},
                    {"name": "b", "scheduler": {"kind": "request_level", "max_batch_size": 4}}],
        **changes})


def _priced_from(folder: Path) -> Any:
    """One paged system priced by a DistServe profile copied into `folder`, which the
    scenario names by a path relative to that folder."""
    import shutil

    from orcasim.paths import PACKAGE_DATA_DIR

    folder.mkdir()
    shutil.copy(PACKAGE_DATA_DIR / "profiles/distserve/profiler-a100-80g.vllm.json", folder / "profile.json")
    return _scenario(**{
        "sweep": None, "model": "opt-13b", "hardware": {"gpu": "a100-80gb"},
        "cost": {"kind": "fitted", "path": "profile.json", "model": "opt-13b", "tensor_parallel": 1},
        "systems": [{"name": "a", "scheduler": {"kind": "paged", "max_num_seqs": 4}}]})


def _run_log(tmp_path: Path) -> Path:
    """Three requests at 0, 1 and 2 s, with what a real server measured."""
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "run-7.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,tpot_s,e2e_s\n"
                    "0.0,10,3,0.05,0.02,0.09\n1.0,20,2,0.06,0.03,0.09\n2.0,30,5,0.07,0.01,0.11\n")
    return path


def test_every_run_keeps_its_own_figure_when_names_meet_once_flattened(tmp_path: Path) -> None:
    """a/run-7.csv and a__run-7.csv: the figure of run 'a/run-7' was written as
    a__run-7__a_cdf.png, and run 'a__run-7''s figure then replaced it (a tester's finding)."""
    from orcasim.results import write_fidelity

    logs = [_run_log(tmp_path / "a"), _run_log(tmp_path / "b")]
    logs.append(tmp_path / "a__run-7.csv")
    logs[-1].write_text(logs[0].read_text())
    table, frames = fidelity_table(_scenario(), logs, ["a"], "orcasim")
    out = write_fidelity(table, frames, tmp_path / "out")
    assert sorted(p.name for p in out.glob("*.png")) == [
        "a__run-7__a-2_cdf.png", "a__run-7__a_cdf.png", "b__run-7__a_cdf.png"]


def test_the_replay_takes_the_runs_arrivals_and_lengths_and_keeps_the_rest(tmp_path: Path,
                                                                           monkeypatch) -> None:  # noqa: ANN001
    """The workload becomes the run's (its path resolved, the format passed on, the
    scenario's max_tokens kept); a sweep is dropped (one replay per run); systems, cost and
    seed and name stay."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run-7.csv").write_text("arrival_s,prompt_tokens,output_tokens,ttft_s\n0,8,4,0.1\n")
    replay = replay_of(_scenario(), Path("run-7.csv"), "orcasim")
    arrival = replay.workload.arrival
    assert arrival.kind == "trace" and arrival.path == str(tmp_path / "run-7.csv")
    # A shipped run's name, as the scenarios write it, from another folder: it was made
    # absolute against the working folder ('not found' for a log the reader had found).
    shipped = replay_of(_scenario(), Path("ground_truth/distserve_opt13b_a100/vllm-100-1.csv"))
    assert shipped.workload.arrival.path == str(PACKAGE_DATA_DIR / "ground_truth" /
                                                "distserve_opt13b_a100" / "vllm-100-1.csv")
    assert arrival.format == "orcasim"
    assert replay.workload.max_tokens == 256 and replay.sweep is None
    assert [s.name for s in replay.systems] == ["a", "b"] and replay.seed == 1
    assert replay.name == "test"


def test_the_fidelity_table_runs_every_system_on_every_run(tmp_path: Path) -> None:
    """Two runs and two systems: four blocks of rows with their run (the file's stem) and
    system first; the figure frames, keyed run/system, stack the real requests and the
    simulated ones, marked by `source`."""
    first = _run_log(tmp_path)
    second = tmp_path / "run-8.csv"
    second.write_text(first.read_text())
    table, frames = fidelity_table(_scenario(), [first, second], ["a", "b"], "orcasim")
    assert list(table.columns) == ["run", "system", *COLUMNS]
    assert table.index.tolist() == list(range(len(table)))
    blocks = table[["run", "system"]].drop_duplicates().values.tolist()
    assert blocks == [["run-7", "a"], ["run-7", "b"], ["run-8", "a"], ["run-8", "b"]]
    assert len(table) == 4 * 3 * 3  # three metrics at p50, p90, p99
    assert sorted(frames) == ["run-7/a", "run-7/b", "run-8/a", "run-8/b"]
    frame = frames["run-7/a"]
    assert frame["source"].tolist() == ["real"] * 3 + ["simulated"] * 3
    assert frame[frame["source"] == "real"]["ttft_s"].tolist() == [0.05, 0.06, 0.07]
    real_p50 = table[(table["run"] == "run-7") & (table["metric"] == "ttft_s")]["real"].iloc[0]
    assert real_p50 == pytest.approx(0.06)


def test_the_runs_format_and_the_scenarios_folder_are_passed_on(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A log whose name would be read as another format (an orcasim CSV named .json, which
    auto-detection takes for Mooncake) is read as the format given, in the measurements and
    in the replay; a cost file named relative to the scenario's folder is found from any
    working directory when that folder is given."""
    log = tmp_path / "run-9.json"
    log.write_text(_run_log(tmp_path).read_text())
    folder = tmp_path / "scenario"
    scenario = _priced_from(folder)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    table, _ = fidelity_table(scenario, [log], ["a"], "orcasim", base_dir=folder)
    assert table["run"].unique().tolist() == ["run-9"] and len(table) == 9
    with pytest.raises((ScenarioError, FileNotFoundError)):
        fidelity_table(scenario, [log], ["a"], "auto", base_dir=folder)
    with pytest.raises((ScenarioError, FileNotFoundError)):
        fidelity_table(scenario, [log], ["a"], "orcasim")


def test_a_logs_format_is_detected_by_default(tmp_path: Path) -> None:
    """Without a format, the log's is detected: an orcasim CSV, read and replayed."""
    from orcasim.fidelity import read_real_run

    log = _run_log(tmp_path)
    assert read_real_run(log)["e2e_s"].tolist() == [0.09, 0.09, 0.11]
    assert replay_of(_scenario(), log).workload.arrival.format == "auto"


def test_a_log_path_that_is_no_path_is_named() -> None:
    """read_real_run(None) read str(None) and said "file 'None' not found (looked at:
    .../None, ...)", a file nobody named (found calling it from Python)."""
    from orcasim.fidelity import read_real_run

    with pytest.raises(ScenarioError, match=r"^path = None: expected a serving log's path \(str or Path\)$"):
        read_real_run(None)  # type: ignore[arg-type]


def test_logs_sharing_a_stem_stay_apart(tmp_path: Path) -> None:
    """a/run-7.csv and b/run-7.csv: two runs named by their folders, in the table, the
    summary and the figures; one log given twice is refused."""
    import json

    from orcasim.config import ScenarioError
    from orcasim.results import write_fidelity

    logs = [_run_log(tmp_path / "a"), _run_log(tmp_path / "b")]
    table, frames = fidelity_table(_scenario(), logs, ["a"], "orcasim")
    assert table["run"].unique().tolist() == ["a/run-7", "b/run-7"] and len(table) == 2 * 9
    out = write_fidelity(table, frames, tmp_path / "out")
    assert list(json.loads((out / "summary.json").read_text())) == ["a/run-7/a", "b/run-7/a"]
    assert sorted(p.name for p in out.glob("*.png")) == ["a__run-7__a_cdf.png", "b__run-7__a_cdf.png"]
    with pytest.raises(ScenarioError, match="given twice"):
        fidelity_table(_scenario(), [logs[0], tmp_path / "b" / ".." / "a" / "run-7.csv"], ["a"])
    # A shipped log by its data name and by its absolute path is one log (a tester's finding:
    # both were scored, one labelled by a folder that does not exist).
    from orcasim.fidelity import run_labels
    from orcasim.paths import PACKAGE_DATA_DIR

    shipped = "ground_truth/distserve_opt13b_a100/vllm-100-1.csv"
    with pytest.raises(ScenarioError, match=f"--real {PACKAGE_DATA_DIR / shipped}: given twice"):
        run_labels([Path(shipped), PACKAGE_DATA_DIR / shipped])


def test_a_system_named_twice_is_refused(tmp_path: Path) -> None:
    """--system orca --system orca wrote every row of fidelity.csv twice (a tester's finding)."""
    from typer.testing import CliRunner

    from orcasim.cli import app

    log = _run_log(tmp_path)
    result = CliRunner().invoke(app, ["fidelity", "scenarios/quickstart.yaml", "--real", str(log),
                                      "--system", "orca", "--system", "orca", "--out",
                                      str(tmp_path / "out"), "--no-plots"])
    assert result.exit_code == 2, result.output
    assert "--system = 'orca': given twice; expected each system once" in result.output
    assert not (tmp_path / "out").exists()


def test_a_run_the_scenario_cannot_replay_is_named(tmp_path: Path) -> None:
    """Of several runs, the one holding a request beyond max_tokens is named in the error."""
    from orcasim.config import ScenarioError

    good = _run_log(tmp_path)
    long = tmp_path / "long.csv"
    long.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s\n0.0,10,3,0.05\n1.0,300,2,0.06\n")
    with pytest.raises(ScenarioError, match=rf"^workload.max_tokens = 256 is below .* \(replaying "
                                            rf"--real {long}\)$"):
        fidelity_table(_scenario(), [good, long], ["a"], "orcasim")
    # A message that names the log already names it once ('--real hdr.csv: hdr.csv: ...').
    header = tmp_path / "hdr.csv"
    header.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s\n")
    # Read for its latencies first, it is named as any other bad log is (by its file, once).
    with pytest.raises(ScenarioError, match=r"^hdr\.csv: no requests \(a header alone\); "
                                            r"expected at least one$"):
        fidelity_table(_scenario(), [header], ["a"], "orcasim")


def test_the_format_option_names_the_formats_that_hold_latencies(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orcasim.cli import app

    result = CliRunner().invoke(app, ["fidelity", str(tmp_path / "s.yaml"), "--real",
                                      str(_run_log(tmp_path)), "--format", "xml"])
    assert result.exit_code == 2
    assert result.output == "error: --format = 'xml': expected auto, orcasim, vllm or aiperf\n"


def test_plot_on_a_fidelity_folder_says_what_it_is(tmp_path: Path) -> None:
    """It keeps no per-request frames, so `plot` cannot redraw it; it said summary.json was
    malformed, though orcasim wrote it."""
    from typer.testing import CliRunner

    from orcasim.cli import app
    from orcasim.results import write_fidelity

    table, frames = fidelity_table(_scenario(), [_run_log(tmp_path)], ["a"], "orcasim")
    out = write_fidelity(table, frames, tmp_path / "out", plots=False)
    result = CliRunner().invoke(app, ["plot", str(out)])
    assert result.exit_code == 2
    assert result.output == (f"error: {out}: an orcasim fidelity folder, whose CDF figures orcasim "
                             "fidelity writes (rerun it with --force to redraw them); expected a "
                             "run, sweep or capacity folder\n")


def test_the_figures_draw_each_metric_over_the_requests_the_table_compares(tmp_path: Path) -> None:
    """A request the log left unmeasured is left out of the simulated curve too (each side
    was drawn over its own requests, unlike the table's percentiles)."""
    log = tmp_path / "run.csv"
    log.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s\n0.0,10,3,0.05\n1.0,20,2,\n"
                   "2.0,30,5,0.07\n")
    _, frames = fidelity_table(_scenario(), [log], ["a"], "orcasim")
    simulated = frames["run/a"][frames["run/a"]["source"] == "simulated"]
    assert simulated["ttft_s"].isna().tolist() == [False, True, False]


def test_the_comparison_counts_the_requests_after_the_warm_up(tmp_path: Path) -> None:
    """The scenario's warm-up was checked against the log (past its last arrival: refused)
    but not applied: every request was compared."""
    table, _ = fidelity_table(_scenario(warmup_s=1.5), [_run_log(tmp_path)], ["a"], "orcasim")
    ttft = table[table["metric"] == "ttft_s"]
    assert ttft["real"].tolist() == pytest.approx([0.07] * 3)  # the request at 2 s alone


@pytest.mark.parametrize("override", ["workload.arrival.speedup=4", "workload.num_requests=5",
                                      "workload={max_tokens: 300}"])
def test_a_workload_setting_the_replay_would_drop_is_refused(tmp_path: Path, override: str) -> None:
    from typer.testing import CliRunner

    from orcasim.cli import app

    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nworkload: {num_requests: 3, arrival: {kind: poisson, rate_per_s: 1},"
                        " prompt_tokens: {kind: constant, value: 8}, output_tokens: {kind: constant,"
                        " value: 4}, max_tokens: 256}\ncost: {kind: linear, base_s: 0.01}\n"
                        "kv_capacity_tokens: 4096\nsystems: [{name: a, scheduler: {kind: paged}}]\n")
    result = CliRunner().invoke(app, ["fidelity", str(scenario), "--real", str(_run_log(tmp_path)),
                                      "--set", override, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: --set {override}: each log gives the workload")
    assert not (tmp_path / "o").exists()


def test_a_vllm_result_of_empty_lists_is_one_line(tmp_path: Path) -> None:
    """Empty lists made an empty Python mask, which pandas took for columns: KeyError."""
    from orcasim.config import ScenarioError
    from orcasim.workload.traces import read_trace

    path = tmp_path / "empty.json"
    path.write_text('{"completed": 0, "input_lens": [], "output_lens": [], "ttfts": [], "itls": [],'
                    ' "start_times": [], "errors": []}')
    with pytest.raises(ScenarioError, match=r"^empty.json: no requests"):
        read_trace(path)


@pytest.mark.parametrize("word", ["NaN", "null", "NA"])
def test_only_an_empty_cell_is_unmeasured(tmp_path: Path, word: str) -> None:
    """pandas reads 'NaN', 'null' and 'NA' as missing: a log that wrote them had its request
    left out of the comparison, where the contract says a number or empty."""
    from orcasim.config import ScenarioError
    from orcasim.fidelity import read_real_run

    log = tmp_path / "run.csv"
    log.write_text(f"arrival_s,prompt_tokens,output_tokens,e2e_s\n0.0,10,3,0.1\n1.0,20,2,{word}\n")
    with pytest.raises(ScenarioError, match=rf"run.csv line 3: e2e_s = '{word}', expected a number "
                                            "of seconds >= 0 or empty"):
        read_real_run(log)
    log.write_text("arrival_s,prompt_tokens,output_tokens,e2e_s\n0.0,10,3,0.1\n1.0,20,2,\n")
    assert read_real_run(log)["e2e_s"].isna().tolist() == [False, True]


def test_the_headline_says_how_many_numbers_it_scores() -> None:
    """A real TPOT of 0 (whole answers) has no relative error: the median went over 4
    numbers where it said p50 and p90 of three metrics, without a word. A simulated 0 against
    a real 0 is no error."""
    from orcasim.fidelity import headline_title

    real = _frame([1.0, 2.0], [0.0, 0.0], [1.0, 2.0])
    table = compare(real, _frame([1.1, 2.2], [0.1, 0.1], [1.1, 2.2]), (50, 90))
    assert headline_title(table) == ("median |error| at p50 and p90 = 10.0% (over 4 of 6 numbers: a "
                                      "real value of 0 has no relative error)")
    exact = compare(real, _frame([1.1, 2.2], [0.0, 0.0], [1.1, 2.2]), (50, 90))
    assert exact[exact["metric"] == "tpot_s"]["rel_error"].tolist() == [0.0, 0.0]
    assert headline_title(exact) == "median |error| at p50 and p90 = 10.0%"
    zeros = compare(_frame([0.0], [0.0], [0.0]), _frame([1.0], [1.0], [1.0]), (50, 90))
    assert headline_title(zeros) == ("median |error| at p50 and p90: none to take (a real value of "
                                     "0 has no relative error)")


def test_a_logs_warning_is_said_once(tmp_path: Path) -> None:
    """The log is read twice (its latencies, then its replay): a vLLM result's
    --max-concurrency warning was printed twice."""
    import json
    import warnings

    log = tmp_path / "bench.json"
    log.write_text(json.dumps({"input_lens": [10, 20], "output_lens": [3, 2], "ttfts": [0.05, 0.06],
                               "itls": [[0.02, 0.02], [0.03]], "start_times": [0.0, 1.0],
                               "errors": ["", ""], "max_concurrency": 4}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fidelity_table(_scenario(), [log], ["a"], "vllm")
    said = [str(w.message) for w in caught if "--max-concurrency" in str(w.message)]
    assert len(said) == 1, said


def test_a_metric_the_log_lacks_draws_an_empty_panel_quietly(tmp_path: Path) -> None:
    """A TTFT-only log: the TPOT and E2E panels have no curve (both sides are blanked where
    either lacks the metric), and matplotlib warned of a legend with nothing in it."""
    from typer.testing import CliRunner

    from orcasim.cli import app

    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nworkload: {num_requests: 3, arrival: {kind: poisson, rate_per_s: 1},"
                        " prompt_tokens: {kind: constant, value: 8}, output_tokens: {kind: constant,"
                        " value: 4}, max_tokens: 256}\ncost: {kind: linear, base_s: 0.01}\n"
                        "kv_capacity_tokens: 4096\nsystems: [{name: a, scheduler: {kind: paged}}]\n")
    log = tmp_path / "run.csv"
    log.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s\n0.0,10,3,0.05\n1.0,20,2,0.06\n")
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CliRunner().invoke(app, ["fidelity", str(scenario), "--real", str(log), "--out",
                                          str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert not [str(w.message) for w in caught if "legend" in str(w.message)]
    assert list((tmp_path / "o").glob("*.png"))


def test_a_scenarios_own_sweep_is_said_not_to_be_replayed(tmp_path: Path) -> None:
    """A replay runs the base values; the sweep was dropped without a word, and one table
    read as the sweep's (a tester's finding)."""
    data = _scenario().model_dump(mode="json", exclude_none=True)
    data["sweep"] = {"parameter": "cost.base_s", "values": [0.01, 0.02]}
    from orcasim.scenario import scenario_from_dict

    with pytest.warns(UserWarning, match=r"own sweep over cost.base_s is not replayed"):
        replay = replay_of(scenario_from_dict(data), _run_log(tmp_path))
    assert replay.sweep is None


def test_a_compressed_log_is_named_by_its_stem_as_a_plain_one(tmp_path: Path) -> None:
    """h60.csv.gz was named 'h60.csv' in the table, the summary and the figures (a tester's
    finding): the stem under its compression too."""
    import gzip

    from orcasim.fidelity import run_labels

    plain = _run_log(tmp_path)
    packed = tmp_path / "b" / "other.csv.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert run_labels([plain, packed]) == ["run-7", "other"]


def test_a_log_that_measured_no_latency_is_refused(tmp_path: Path) -> None:
    """Its columns there but empty, it printed nothing, wrote an empty fidelity.csv and
    exited 0, where calibrate logs refuses the same file (a tester's finding)."""
    from typer.testing import CliRunner

    from orcasim.cli import app

    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nworkload: {num_requests: 3, arrival: {kind: poisson, rate_per_s: 1},"
                        " prompt_tokens: {kind: constant, value: 8}, output_tokens: {kind: constant,"
                        " value: 4}, max_tokens: 256}\ncost: {kind: linear, base_s: 0.01}\n"
                        "kv_capacity_tokens: 4096\nsystems: [{name: a, scheduler: {kind: paged}}]\n")
    log = tmp_path / "empty.csv"
    log.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,e2e_s\n0,10,5,,\n")
    result = CliRunner().invoke(app, ["fidelity", str(scenario), "--real", str(log),
                                      "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and result.output == (
        f"error: --real {log}: no request has a ttft_s, tpot_s or e2e_s; expected measured "
        "latencies to compare\n"), result.output
    assert not (tmp_path / "o").exists()


def test_a_log_measured_only_before_the_warm_up_is_refused(tmp_path: Path) -> None:
    """Its measured requests all before warmup_s, the table compared none: it printed
    nothing, wrote an empty fidelity.csv and exited 0 (the whole-log check passed)."""
    log = tmp_path / "early.csv"
    log.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,e2e_s\n"
                   "3.0,10,3,0.1,0.3\n4.0,10,3,0.1,0.3\n5.0,10,3,,\n6.0,10,3,,\n")
    with pytest.raises(ScenarioError) as caught:
        fidelity_table(_scenario(warmup_s=1.5), [log], ["a"], "orcasim")
    assert str(caught.value) == (
        f"--real {log}: no request arriving from warmup_s = 1.5 s on (counted from its first "
        "request) has a ttft_s, tpot_s or e2e_s; the last measured one arrives at 1 s: expected "
        "warmup_s at most 1")
    table, _ = fidelity_table(_scenario(warmup_s=1.0), [log], ["a"], "orcasim")
    assert set(table["requests"]) == {1}  # the request at 4 s alone


def test_the_warm_up_a_log_measured_early_is_told_to_take_is_one_it_takes(tmp_path: Path) -> None:
    """The bound was written with ':g', so a last measured arrival at 1.2345678 s read
    'expected warmup_s at most 1.23457', and that warm-up was refused again."""
    log = tmp_path / "early.csv"
    log.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,e2e_s\n"
                   "3.0,10,3,0.1,0.3\n4.2345678,10,3,0.1,0.3\n5.0,10,3,,\n")
    with pytest.raises(ScenarioError) as caught:
        fidelity_table(_scenario(warmup_s=1.5), [log], ["a"], "orcasim")
    bound = str(caught.value).rsplit("at most ", 1)[1]
    assert bound == "1.2345678"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table, _ = fidelity_table(_scenario(warmup_s=float(bound)), [log], ["a"], "orcasim")
    assert set(table["requests"]) == {1}


def test_the_help_example_of_set_is_one_a_replay_takes() -> None:
    # `orcasim fidelity --help` showed --set workload.arrival.rate_per_s=4, which the
    # command refuses (each log gives the workload).
    import typer

    from orcasim.cli import app

    command = typer.main.get_command(app).commands["fidelity"]  # type: ignore[attr-defined]
    help_text = next(p.help for p in command.params if "--set" in p.opts)
    example = help_text.split("--set ")[-1]
    assert "=" in example, help_text
    check_replay_overrides([example])


def test_the_python_form_refuses_a_system_it_would_not_find_before_replaying(tmp_path: Path) -> None:
    """From a notebook, a mistyped system replayed the whole run and then raised KeyError
    'c' inside; a system given as a string compared its characters (KeyError 'a' of 'ab'),
    a run given as a path read each letter as a run ("--real r: given twice"), and an empty
    list said pandas' "No objects to concatenate" (found testing the Python API)."""
    log = _run_log(tmp_path)
    with pytest.raises(ScenarioError, match=r"^systems = 'c': expected one of a, b$"):
        fidelity_table(_scenario(), [log], ["c"], "orcasim")
    with pytest.raises(ScenarioError, match=r"^systems = 'ab': expected one of a, b$"):
        fidelity_table(_scenario(), [log], "ab", "orcasim")
    with pytest.raises(ScenarioError, match=r"^systems = \[\]: expected at least one"):
        fidelity_table(_scenario(), [log], [], "orcasim")
    with pytest.raises(ScenarioError, match=r"^runs = \[\]: expected at least one"):
        fidelity_table(_scenario(), [], ["a"], "orcasim")
    with pytest.raises(ScenarioError, match=r"^fmt = 'azure': expected auto, orcasim, vllm or aiperf$"):
        fidelity_table(_scenario(), [log], ["a"], "azure")
    one, _ = fidelity_table(_scenario(), str(log), "a", "orcasim")
    listed, _ = fidelity_table(_scenario(), [log], ["a"], "orcasim")
    pd.testing.assert_frame_equal(one, listed)
    assert one["run"].unique().tolist() == ["run-7"]


def test_a_loaded_scenario_replays_from_its_own_folder(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """fidelity_table(load_scenario("x/s.yaml"), ...) without base_dir looked for a cost file
    named relative to x/ in the working folder: the replay, a new scenario, lost the loaded
    one's folder, where run_scenario of the same object finds it (found testing the notebook
    API from another folder). A path given as the scenario replays from its folder too."""
    import yaml

    from orcasim.scenario import load_scenario

    log = _run_log(tmp_path)
    folder = tmp_path / "scenario"
    (folder / "s.yaml").write_text(yaml.safe_dump(_priced_from(folder).given_data()))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    given, _ = fidelity_table(load_scenario(folder / "s.yaml"), [log], ["a"], "orcasim", base_dir=folder)
    loaded, _ = fidelity_table(load_scenario(folder / "s.yaml"), [log], ["a"], "orcasim")
    by_path, _ = fidelity_table(folder / "s.yaml", [log], ["a"], "orcasim")
    pd.testing.assert_frame_equal(loaded, given)
    pd.testing.assert_frame_equal(by_path, given)


def test_a_log_in_unix_seconds_scores_as_the_same_log_counted_from_0(tmp_path: Path) -> None:
    """vllm-100-1's log with 1,700,000,000 s added to every arrival, as its text (a log
    stamped with the Unix clock): its replay and table are the log's from 0, bit for bit.
    Each time rounded to a float at 1.7e9 s first (2.4e-7 s apart) moved the simulated
    percentiles by up to 3.4e-7 of their value (a tester's finding)."""
    from decimal import Decimal

    source = PACKAGE_DATA_DIR / "ground_truth/distserve_opt13b_a100/vllm-100-1.csv"
    header, *rows = source.read_text().splitlines()
    epoch = tmp_path / "vllm-100-1.csv"
    shifted = [f"{Decimal(row.split(',', 1)[0]) + 1_700_000_000},{row.split(',', 1)[1]}" for row in rows]
    epoch.write_text("\n".join([header, *shifted]) + "\n")
    assert shifted[1].startswith("1700000001.380639359354972")  # the digits kept, as a log has them
    scenario = Path(__file__).parent.parent / "scenarios/validation/vllm_opt13b_a100.yaml"
    from_0, _ = fidelity_table(scenario, [source], ["vllm-v0.2.3"], "orcasim")
    from_epoch, _ = fidelity_table(scenario, [epoch], ["vllm-v0.2.3"], "orcasim")
    pd.testing.assert_frame_equal(from_epoch, from_0, check_exact=True)


def test_a_scenario_s_own_sweep_is_not_built_for_a_replay_of_its_base_values(
        tmp_path: Path) -> None:
    """A replay runs the base values (`replay_of`), so a --set that leaves the own sweep's
    points invalid (a scheduler's kind changed under its swept key) replays, as it did
    before the loader built every own point (ab14eb0), which refused it with
    "sweep.values[0] = 8: systems[1].scheduler: unknown key 'max_batch_size' for kind
    'paged'" (a reviewer's finding)."""
    import yaml
    from typer.testing import CliRunner

    from orcasim.cli import app

    quickstart = Path(__file__).parent.parent / "scenarios" / "quickstart.yaml"
    data = yaml.safe_load(quickstart.read_text())
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**data, "sweep": {
        "parameter": "systems[1].scheduler.max_batch_size", "values": [8, 16]}}))
    paged = "systems[1].scheduler={kind: paged, max_num_seqs: 8, max_num_batched_tokens: 2048}"
    with pytest.warns(UserWarning, match=r"own sweep over systems\[1\].scheduler.max_batch_size "
                                         "is not replayed"):
        result = CliRunner().invoke(app, ["fidelity", str(scenario), "--real",
                                          str(_run_log(tmp_path)), "--set", paged, "--out",
                                          str(tmp_path / "out"), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "fidelity.csv").exists()
