"""The regression check's rules by hand: when a metric has moved, the rows it reports, the
baselines it writes. tests/test_regression.py runs the committed baselines themselves."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from orcasim.regression import check, compare_to_baseline, moved

SCENARIOS = Path(__file__).parent.parent / "scenarios" / "regression"


def test_tolerance_rules() -> None:
    assert not moved(1.0, 1.0 + 1e-12, 1e-9)
    assert moved(1.0, 1.0 + 1e-6, 1e-9)
    assert not moved(math.nan, math.nan, 1e-9)
    assert moved(3.0, 4.0, 0.0)
    rows = compare_to_baseline("s", {"a": {"x": 1.0, "gone": 2.0}}, {"a": {"x": 1.0, "new": 3.0}})
    assert list(rows["metric"]) == ["gone", "new"]


# The comparison by hand ------------------------------------------------------------------

def test_a_metric_moves_past_its_relative_tolerance_plus_a_float_floor() -> None:
    """Moved means |now - baseline| > rel_tol |baseline| + 1e-12 (the floor lets a zero
    baseline carry rounding noise); a count (tolerance 0) moves on any change, with no floor.
    A value that turns NaN, or stops being NaN, has moved."""
    from orcasim.compare import ABS_TOL, DEFAULT_REL_TOL

    assert (DEFAULT_REL_TOL, ABS_TOL) == (1e-9, 1e-12)
    assert not moved(1000.0, 1000.0 + 0.5e-6, 1e-9)  # 0.5e-6 <= 1e-6 + 1e-12
    assert moved(1000.0, 1000.0 + 2e-6, 1e-9)
    assert moved(-1000.0, -1000.0 - 2e-6, 1e-9)  # |baseline|
    assert not moved(0.0, 0.5e-12, 1e-9) and moved(0.0, 2e-12, 1e-9)  # the floor, at 0
    assert not moved(2.0, 2.0 + 1.5e-12, 1e-9)  # 1.5e-12 <= 2e-9 + 1e-12
    assert moved(0.0, 1e-13, 0.0) and moved(5.0, 5.0 + 1e-13, 0.0)  # counts: no floor
    assert not moved(5.0, 5.0, 0.0)
    assert moved(1.0, math.nan, 1e-9) and moved(math.nan, 1.0, 1e-9)
    assert moved(1.0, math.nan, 0.0)


def test_exactly_the_tolerance_is_not_a_move() -> None:
    """From a zero baseline the tolerance is the floor alone, 1e-12, which a change of
    exactly 1e-12 equals in floating point: not a move."""
    assert 1e-12 - 0.0 == 1e-9 * 0.0 + 1e-12
    assert not moved(0.0, 1e-12, 1e-9) and not moved(0.0, -1e-12, 1e-9)


def test_counts_use_no_tolerance_and_every_other_metric_the_default() -> None:
    from orcasim.compare import DEFAULT_REL_TOL, TOLERANCES, tolerance

    # Every count a summary reports (preemptions and the rest had 1e-9, which the README's
    # "counts must match exactly" did not allow).
    assert set(TOLERANCES) == {"requests_completed", "iterations", "cost_out_of_range",
                               "preemptions", "requests_rejected", "recomputed_tokens",
                               "cache_evictions", "prefill_tokens_saved", "kv_reserved_tokens_max",
                               "prefill_kv_reserved_tokens_max", "decode_kv_reserved_tokens_max",
                               "replicas", "prefill_replicas", "decode_replicas",
                               "sessions_completed", "sessions_failed", "kv_capacity_total_tokens"}
    for metric in TOLERANCES:
        assert tolerance(metric) == 0.0
    assert tolerance("e2e_s_p50") == DEFAULT_REL_TOL
    # A count one off is a move even at a size where the default tolerance would allow it.
    rows = compare_to_baseline("s", {"a": {"iterations": 1e9, "e2e_s_p50": 1e9}},
                               {"a": {"iterations": 1e9 + 1, "e2e_s_p50": 1e9 + 1}})
    assert rows.values.tolist() == [["s", "a", "iterations", 1e9, 1e9 + 1, 1e-9, 0.0, ""]]


def test_a_moved_systems_rows_by_hand() -> None:
    """Every metric only one side has is a row (the other side NaN, the change infinite),
    even one whose value was NaN; a metric present in both with NaN on both sides is not;
    rows keep the baseline's order, then the new metrics."""
    baseline = {"a": {"x": 1.0, "y": math.nan, "gone": 2.0, "gone_nan": math.nan}, "old": {"z": 4.0}}
    now = {"a": {"x": 1.5, "y": math.nan, "new": 3.0}, "fresh": {"w": 5.0}}
    rows = compare_to_baseline("s", baseline, now)
    assert list(rows.columns) == ["scenario", "system", "metric", "baseline", "now", "rel_change",
                                  "tolerance", "note"]
    got = [(r.system, r.metric, r.baseline, r.now, r.rel_change) for r in rows.itertuples()]
    # Which side is missing, where NaN could not say it: gone_nan and new.
    assert dict(zip(rows["metric"], rows["note"], strict=True)) == {
        "x": "", "gone": "no longer reported", "gone_nan": "no longer reported",
        "new": "not in the baseline", "z": "no longer reported", "w": "not in the baseline"}
    assert rows["tolerance"].tolist()[0] == 1e-9
    assert got[0] == ("a", "x", 1.0, 1.5, 0.5)
    assert [(s, m) for s, m, *_ in got] == [("a", "x"), ("a", "gone"), ("a", "gone_nan"),
                                            ("a", "new"), ("old", "z"), ("fresh", "w")]
    for s, m, b, n, change in got[1:]:
        if m != "gone_nan":  # NaN on both sides, yet gone: a row all the same
            assert math.isnan(b) != math.isnan(n) and change == math.inf, (s, m)
    assert compare_to_baseline("s", baseline, baseline).empty


def test_check_reports_a_missing_baseline_and_writes_readable_baselines(tmp_path: Path) -> None:
    """One scenario without a baseline gives one row (scenario, "*", "(no baseline)");
    `--update` writes each baseline as JSON indented by two, NaN as null, ending in a
    newline; with nothing moved the frame is empty but has the columns."""
    import json

    scenarios = tmp_path / "regression"
    scenarios.mkdir()
    shutil.copy(SCENARIOS / "iteration_level.yaml", scenarios / "one.yaml")
    shutil.copy(SCENARIOS / "iteration_level.yaml", scenarios / "two.yaml")
    baselines = tmp_path / "baselines"
    baselines.mkdir()
    rows = check(scenarios, baselines)
    assert rows.values.tolist()[0][:3] == ["one", "*", "(no baseline)"]
    assert rows["scenario"].tolist() == ["one", "two"] and rows.index.tolist() == [0, 1]
    rewritten = check(scenarios, baselines, update=True)  # says what it rewrote: the same rows
    assert rewritten.equals(rows)
    assert check(scenarios, baselines, update=True).empty  # nothing left to move
    text = (baselines / "one.json").read_text()
    assert text.endswith("}\n") and text.startswith('{\n  "')
    assert json.loads(text) == json.loads((baselines / "two.json").read_text())
    nothing = check(scenarios, baselines)
    assert nothing.empty and list(nothing.columns) == ["scenario", "system", "metric", "baseline",
                                                       "now", "rel_change", "tolerance", "note"]
    (baselines / "two.json").unlink()
    rows = check(scenarios, baselines)
    assert rows.values.tolist()[0][:3] == ["two", "*", "(no baseline)"] and rows.index.tolist() == [0]


def test_a_folder_without_scenarios_is_an_error(tmp_path: Path) -> None:
    import pytest

    from orcasim.regression import regression_scenarios

    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"^.*empty: no regression scenarios \(\*\.yaml\)$"):
        regression_scenarios(tmp_path / "empty")


def _two_scenarios(tmp_path: Path) -> tuple[Path, Path]:
    scenarios, baselines = tmp_path / "regression", tmp_path / "baselines"
    scenarios.mkdir()
    shutil.copy(SCENARIOS / "iteration_level.yaml", scenarios / "one.yaml")
    shutil.copy(SCENARIOS / "iteration_level.yaml", scenarios / "two.yml")  # .yml counts too
    return scenarios, baselines


def test_a_failing_update_writes_no_baseline(tmp_path: Path) -> None:
    """One scenario that fails left the baselines written before it rewritten, so a real
    change in those passed the next check unseen."""
    import pytest

    from orcasim.config import ScenarioError

    scenarios, baselines = _two_scenarios(tmp_path)
    check(scenarios, baselines, update=True)
    assert sorted(p.name for p in baselines.iterdir()) == ["one.json", "two.json"]
    before = {p.name: p.read_bytes() for p in baselines.iterdir()}
    one = scenarios / "one.yaml"
    one.write_text(one.read_text().replace("max_batch_size: 8", "max_batch_size: 2"))
    two = scenarios / "two.yml"
    two.write_text(two.read_text() + "warmup_s: 1.0e+9\n")
    with pytest.raises(ScenarioError, match=rf"^{two}: warmup_s = 1e\+09 is past the last arrival"):
        check(scenarios, baselines, update=True)
    one.write_text(one.read_text() + "warmup_s: -1\n")  # both reported, in one line
    with pytest.raises(ScenarioError, match=rf"^{one}: warmup_s = -1: .*; {two}: warmup_s = 1e\+09"):
        check(scenarios, baselines)
    assert {p.name: p.read_bytes() for p in baselines.iterdir()} == before


def test_a_baseline_without_its_scenario_counts_as_moved_and_update_removes_it(tmp_path: Path) -> None:
    import pytest

    scenarios, baselines = _two_scenarios(tmp_path)
    check(scenarios, baselines, update=True)
    (scenarios / "two.yml").unlink()
    rows = check(scenarios, baselines)
    assert rows.values.tolist()[0][:3] == ["two", "*", "(no scenario)"] and len(rows) == 1
    with pytest.warns(UserWarning, match=f"removed {baselines / 'two.json'}: .* has no scenario two"):
        check(scenarios, baselines, update=True)
    assert [p.name for p in baselines.iterdir()] == ["one.json"] and check(scenarios, baselines).empty


def test_other_json_beside_the_baselines_is_left_alone(tmp_path: Path) -> None:
    """A folder that holds baselines may hold other JSON (a project's package.json, an empty
    {}): it is no baseline without a scenario, so check neither fails on it nor, updating,
    removes it (update deleted both)."""
    scenarios, baselines = _two_scenarios(tmp_path)
    check(scenarios, baselines, update=True)
    others = {"package.json": '{"name": "myapp"}', "tsconfig.json": "{}",
              "notes.json": '{"a": {}}', "broken.json": "{"}
    for name, text in others.items():
        (baselines / name).write_text(text)
    (baselines / "folder.json").mkdir()  # read_json's OSError stopped the check
    (baselines / "dead.json").symlink_to(baselines / "nowhere")
    assert check(scenarios, baselines).empty
    check(scenarios, baselines, update=True)
    assert {name: (baselines / name).read_text() for name in others} == others


def test_what_check_cannot_gate_is_refused_on_one_line(tmp_path: Path) -> None:
    """A sweep block (a baseline holds one run per system; check ran the base point alone),
    a scenario under two suffixes, and a file passed as the baselines folder."""
    import pytest

    from orcasim.config import ScenarioError

    scenarios, baselines = _two_scenarios(tmp_path)
    swept = scenarios / "two.yml"
    # Of the warm-up: a sweep of the seed is refused in its own block since ab14eb0.
    swept.write_text(swept.read_text() + "sweep: {parameter: warmup_s, values: [0, 1]}\n")
    with pytest.raises(ScenarioError, match=rf"^{swept}: sweep: check gates one run per scenario"):
        check(scenarios, baselines)
    shutil.copy(SCENARIOS / "iteration_level.yaml", scenarios / "two.yaml")
    with pytest.raises(ScenarioError, match="two scenarios named two"):
        check(scenarios, baselines)
    (tmp_path / "afile").write_text("")
    with pytest.raises(ScenarioError, match="--baselines .*afile: is a file; expected a folder"):
        check(scenarios, tmp_path / "afile")


def test_the_command_says_how_to_write_a_missing_baseline(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orcasim.cli import app

    scenarios, baselines = _two_scenarios(tmp_path)
    res = CliRunner().invoke(app, ["check", "--scenarios", str(scenarios), "--baselines", str(baselines)])
    assert res.exit_code == 1, res.output
    assert "no baseline yet for one, two: write it with orcasim check --update" in res.output


def test_a_baseline_place_that_cannot_hold_one_is_refused_before_anything_runs(
        tmp_path: Path) -> None:
    """A folder where a baseline file should be failed as the machine's error (exit 1, as for
    moved metrics), under --update after the baselines before it were rewritten; a
    --baselines under a file likewise (a tester's findings)."""
    import pytest

    from orcasim.config import ScenarioError

    scenarios, baselines = _two_scenarios(tmp_path)
    check(scenarios, baselines, update=True)
    before = (baselines / "one.json").read_bytes()
    (baselines / "two.json").unlink()
    (baselines / "two.json").mkdir()
    one = scenarios / "one.yaml"
    one.write_text(one.read_text().replace("max_batch_size: 8", "max_batch_size: 2"))
    for update in (False, True):
        with pytest.raises(ScenarioError, match=f"--baselines {baselines}: {baselines / 'two.json'} "
                                                "is a folder; expected the baseline file of "
                                                "scenario two there"):
            check(scenarios, baselines, update=update)
    assert (baselines / "one.json").read_bytes() == before
    (tmp_path / "afile").write_text("")
    with pytest.raises(ScenarioError, match=f"{tmp_path / 'afile'} is a file; expected a folder"):
        check(scenarios, tmp_path / "afile" / "sub", update=True)


def test_an_update_the_machine_fails_says_which_baselines_it_rewrote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import pytest

    from orcasim import regression

    scenarios, baselines = _two_scenarios(tmp_path)
    real = regression.write_text_atomically

    def full_disk(path: Path, text: str) -> None:
        if path.name == "two.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, text)

    monkeypatch.setattr(regression, "write_text_atomically", full_disk)
    with pytest.raises(OSError, match="No space left on device writing two.json; 1 of 2 "
                                      r"baselines rewritten before it \(one\)"):
        check(scenarios, baselines, update=True)


def test_a_sweep_file_among_the_scenarios_is_named_as_one(tmp_path: Path) -> None:
    """It read "(top level): unknown key 'base'; did you mean 'seed'?"."""
    import pytest

    from orcasim.config import ScenarioError

    scenarios, baselines = _two_scenarios(tmp_path)
    sweep = scenarios / "grid.yaml"
    sweep.write_text("base: one.yaml\ngrid: {parameters: {seed: [1, 2]}}\n")
    with pytest.raises(ScenarioError, match=f"^{sweep}: a sweep file .*; expected a scenario"):
        check(scenarios, baselines)


def test_the_check_shows_every_digit_and_the_folders_its_hint_needs(tmp_path: Path) -> None:
    """A value moved past float noise read as its baseline at 4 digits (0.01417 | 0.01417);
    the hint for a missing baseline printed `orcasim check --update`, which rewrites the
    default folders, not the ones given."""
    import json

    from typer.testing import CliRunner

    from orcasim.cli import app

    scenarios, baselines = _two_scenarios(tmp_path)
    check(scenarios, baselines, update=True)
    data = json.loads((baselines / "one.json").read_text())
    system = next(iter(data))
    value = data[system]["e2e_s_p50"]
    data[system]["e2e_s_p50"] = value * (1 + 1e-6)
    (baselines / "one.json").write_text(json.dumps(data))
    (baselines / "two.json").unlink()
    res = CliRunner().invoke(app, ["check", "--scenarios", str(scenarios), "--baselines",
                                   str(baselines)])
    assert res.exit_code == 1, res.output
    assert repr(value * (1 + 1e-6)) in res.output and repr(value) in res.output, res.output
    assert (f"write it with orcasim check --update --scenarios {scenarios} --baselines "
            f"{baselines} (which") in " ".join(res.output.split()), res.output


def test_a_table_keeps_room_for_its_names_whatever_columns_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """COLUMNS=0 printed nothing of a failing check; COLUMNS=30 no metric name."""
    from orcasim import cli

    for given, width in (("0", cli.MIN_WIDTH), ("30", cli.MIN_WIDTH), ("120", 120),
                         ("wide", cli.LOG_WIDTH)):
        monkeypatch.setenv("COLUMNS", given)
        assert cli._console_width() == width, given


def test_an_update_into_a_results_folder_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """`check --update --baselines <a run folder>` removed the run's summary.json (a baseline
    without a scenario, by its shape) and wrote the baselines beside its frames."""
    from typer.testing import CliRunner

    from orcasim.cli import app

    scenarios = tmp_path / "regression"
    scenarios.mkdir()
    shutil.copy(SCENARIOS / "prefix.yaml", scenarios / "prefix.yaml")
    run = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(SCENARIOS.parent / "quickstart.yaml"), "--out",
                                   str(run), "--no-plots", "--set", "workload.num_requests=20"])
    assert res.exit_code == 0, res.output
    before = sorted(p.name for p in run.iterdir())
    res = CliRunner().invoke(app, ["check", "--update", "--scenarios", str(scenarios),
                                   "--baselines", str(run)])
    assert res.exit_code == 2 and len(res.output.splitlines()) == 1, res.output
    assert f"--baselines {run}: an orcasim results folder" in res.output
    assert sorted(p.name for p in run.iterdir()) == before
