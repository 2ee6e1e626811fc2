"""The command line: results layout, overwrite protection, --set/--out, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

QUICK = ["--set", "workload.num_requests=200"]


def orcasim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orcasim.cli", *args],
                          capture_output=True, text=True, timeout=300)


def test_run_writes_results_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = orcasim("run", "scenarios/quickstart.yaml", "--out", str(out), *QUICK)
    assert p.returncode == 0, p.stderr
    assert "norm. lat. p50" in p.stdout and "orca" in p.stdout  # the comparison table
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"request-level", "orca"}
    assert summary["orca"]["requests_completed"] == 200
    for f in ("summary.csv", "scenario.yaml", "latency_cdf.png", "timelines.png",
              "orca/requests.parquet", "orca/iterations.parquet"):
        assert (out / f).is_file(), f
    assert len(pd.read_parquet(out / "orca" / "requests.parquet")) == 200
    assert "num_requests: 200" in (out / "scenario.yaml").read_text()

    again = orcasim("run", "scenarios/quickstart.yaml", "--out", str(out), *QUICK)
    assert again.returncode == 2 and "--force" in again.stderr
    forced = orcasim("run", "scenarios/quickstart.yaml", "--out", str(out), "--force", *QUICK,
                     "--set", "seed=5", "--no-plots")
    assert forced.returncode == 0, forced.stderr
    assert "seed: 5" in (out / "scenario.yaml").read_text()
    assert not list(tmp_path.glob(".run.*")), "temporary folders left behind"


def test_force_never_deletes_the_scenario_being_run(tmp_path: Path) -> None:
    """The tester's case: the scenario copied into the results folder and run from there."""
    out = tmp_path / "run"
    assert orcasim("run", "scenarios/quickstart.yaml", "--out", str(out), *QUICK, "--no-plots").returncode == 0
    for mine in (out / "mine.yaml", out / "scenario.yaml"):  # a user's file; orcasim's own
        if mine.name == "mine.yaml":
            mine.write_text(Path("scenarios/quickstart.yaml").read_text())
        p = orcasim("run", str(mine), "--out", str(out), "--force", *QUICK, "--no-plots")
        assert p.returncode == 2 and f"holds {mine}" in p.stderr and mine.is_file()
        assert len(p.stderr.strip().splitlines()) == 1


def test_force_never_deletes_a_data_file_the_run_reads(tmp_path: Path) -> None:
    """A trace kept in a results folder (calibrate replay writes sim_requests.csv into its
    own) and replayed from there: --force deleted it, and the new scenario.yaml named a file
    that was gone. Refused, named, nothing deleted."""
    out = tmp_path / "run"
    assert orcasim("run", "scenarios/quickstart.yaml", "--out", str(out), *QUICK, "--no-plots").returncode == 0
    trace = out / "orca" / "requests.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,10,5\n0.5,20,5\n")
    from orcasim.results import mark_results

    mark_results(out, ["orca/requests.csv"])  # as if orcasim had written it there
    scenario = tmp_path / "replay.yaml"
    scenario.write_text("name: replay\nseed: 1\nworkload: {arrival: {kind: trace, path: run/orca/requests.csv},"
                        " max_tokens: 64}\ncost: {kind: linear, base_s: 0.01}\nkv_capacity_tokens: 1000\n"
                        "systems: [{name: orca, scheduler: {kind: iteration_level, max_batch_size: 4}}]\n")
    p = orcasim("run", str(scenario), "--out", str(out), "--force", "--no-plots")
    assert p.returncode == 2 and f"holds {trace}, an input of this run" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and trace.is_file()
    # The same trace named from the home folder, ~/run/...: the path read as relative.
    scenario.write_text(scenario.read_text().replace("path: run/", "path: ~/run/"))
    home = subprocess.run([sys.executable, "-m", "orcasim.cli", "run", str(scenario), "--out",
                           str(out), "--force", "--no-plots"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HOME": str(tmp_path)})
    assert home.returncode == 2 and f"holds {trace}, an input" in home.stderr, home.stderr
    assert trace.is_file()


@pytest.mark.parametrize("args,message", [
    (["--set", "workload.arrival.rate_per_s=-2"], "workload.arrival.rate_per_s = -2"),
    (["--set", "workload.max_tokens=100"], "workload.max_tokens = 100 is below request"),
    (["--set", "workload.arival.rate_per_s=2"], "did you mean 'arrival'"),
    (["--set", "workload.arrival={kind: trace, path: missing.csv}",
      "--set", "workload.prompt_tokens=null", "--set", "workload.output_tokens=null"],
     "file 'missing.csv' not found"),
    # What only building the engine found: validate builds it (run refused it at the start).
    (["--set", "systems[1].scheduler={kind: paged, policy: distserve_decode}"],
     "systems[1].scheduler.policy = 'distserve_decode'"),
    (["--set", "cost={kind: fitted, path: missing.json, model: opt-13b}"],
     "file 'missing.json' not found"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    p = orcasim("validate", "scenarios/quickstart.yaml", *args)
    assert p.returncode == 2
    assert message in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_bad_trace_row_is_named(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,3\n1,10,-3\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(Path("scenarios/quickstart.yaml").read_text().replace(
        "arrival: {kind: poisson, rate_per_s: 2.0}", "arrival: {kind: trace, path: t.csv}")
        .replace("  num_requests: 2000\n", "")
        .replace("  prompt_tokens: {kind: uniform, low: 32, high: 512}\n", "")
        .replace("  output_tokens: {kind: uniform, low: 1, high: 128}\n", ""))
    p = orcasim("validate", str(scenario))
    assert p.returncode == 2 and "t.csv line 3: output_tokens = '-3'" in p.stderr, p.stderr


def test_malformed_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n  oops: [\n")
    for target in (str(bad), str(tmp_path / "nope.yaml")):
        p = orcasim("run", target)
        assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.startswith("error:")


def test_validate_accepts_sweep_files_and_names_bad_points(tmp_path: Path) -> None:
    ok = orcasim("validate", "scenarios/sweeps/rate_x_batch.yaml")
    assert ok.returncode == 0 and "12 points x 2 replications" in ok.stdout, ok.stderr
    bad = tmp_path / "bad_sweep.yaml"
    bad.write_text(Path("scenarios/sweeps/rate_x_batch.yaml").read_text()
                   .replace("base: ../quickstart.yaml", f"base: {Path('scenarios/quickstart.yaml').resolve()}")
                   .replace("workload.arrival.rate_per_s:", "workload.arival.rate_per_s:"))
    p = orcasim("validate", str(bad))
    assert p.returncode == 2 and "did you mean 'arrival'" in p.stderr and "Traceback" not in p.stderr


def test_validate_runs_a_runs_checks_at_every_sweep_point(tmp_path: Path) -> None:
    """'ok' was said of a point whose warm-up passed its last arrival: the run then failed it.
    In a sweep file and in a scenario's own sweep block."""
    from typer.testing import CliRunner

    from orcasim.cli import app

    base = Path("scenarios/quickstart.yaml").resolve()
    grid = tmp_path / "late.yaml"
    grid.write_text(f"name: late\nbase: {base}\nset: [workload.num_requests=50]\ngrid:\n"
                    "  parameters:\n    warmup_s: [0, 100000]\n")
    late = CliRunner().invoke(app, ["validate", str(grid)])
    assert late.exit_code == 2, late.output
    # The point as other messages name it (path=value), not a Python dict.
    assert late.output.startswith("error: point p0001-r00 (warmup_s=100000): warmup_s = 100000 "
                                  "is past the last arrival"), late.output
    own = CliRunner().invoke(app, ["validate", str(base), "--set", "workload.num_requests=50",
                                   "--set", "sweep={parameter: warmup_s, values: [0, 100000]}"])
    # The override that brings it is named, the one that does not is not.
    assert own.exit_code == 2 and own.output.startswith(
        f"error: {base} with --set sweep={{parameter: warmup_s, values: [0, 100000]}}: sweep point "
        "p0001-r00 (warmup_s=100000): warmup_s = 100000 is past"), own.output


def test_a_saved_scenario_reruns_from_its_results_folder(tmp_path: Path) -> None:
    """scenario.yaml in a run folder names the run's data files absolutely, so it reruns from
    there; names of orcasim's shipped data are kept, as they resolve from anywhere."""
    from sweep_files import write_trace_scenario

    from orcasim.paths import portable_data_path

    here = tmp_path / "in"
    first, second = tmp_path / "first", tmp_path / "second"
    assert orcasim("run", str(write_trace_scenario(here)), "--out", str(first), "--no-plots").returncode == 0
    assert f"path: {(here / 'trace.csv').resolve()}" in (first / "scenario.yaml").read_text()
    rerun = orcasim("run", str(first / "scenario.yaml"), "--out", str(second), "--no-plots")
    assert rerun.returncode == 0, rerun.stderr
    assert (first / "summary.json").read_text() == (second / "summary.json").read_text()
    shipped = "traces/sharegpt_lengths_llama2.csv"
    assert portable_data_path(shipped, here) == shipped


def test_run_of_a_sweep_file_points_to_orcasim_sweep(tmp_path: Path) -> None:
    from sweep_files import write_sweep

    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [2.0]")
    p = orcasim("run", str(path), "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and f"orcasim sweep {path}" in p.stderr and "'base'" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def _callers_sigterm(signum: int, frame: object) -> None:
    raise AssertionError("a test's own SIGTERM handler, never sent")


def _interrupt(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


# (arguments, what raises Ctrl-C if anything, exit code): a run done, an error exit, Ctrl-C
# in a run and Ctrl-C in a sweep (its resumable path, `interrupted`).
IN_PROCESS_EXITS = {
    "done": (["run", "scenarios/quickstart.yaml", "--no-plots", "--set", "workload.num_requests=20"],
             None, 0),
    "bad input": (["validate", "nope.yaml"], None, 2),
    "ctrl-c": (["run", "scenarios/quickstart.yaml", "--no-plots"], ("orcasim.run", "run_system"), 130),
    "ctrl-c in a sweep": (["sweep", "scenarios/sweeps/rate_x_batch.yaml"], ("orcasim.sweeps", "run_sweep"),
                          130),
}


@pytest.mark.parametrize("case", IN_PROCESS_EXITS)
def test_main_in_process_hands_back_the_callers_handlers(case: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`orcasim.cli.main()` called from Python (a test, a notebook) left SIGINT ignored after
    a run that wrote its results or was interrupted (the command's guard for its own exit),
    so Ctrl-C did nothing for the rest of the session, and `warnings.showwarning` replaced
    (left alone by earlier reviews; found with signal.getsignal before and after). Each
    exit hands back what it found; typer's CliRunner, which runs a command without `main`,
    too."""
    import importlib
    import signal
    import warnings

    from typer.testing import CliRunner

    from orcasim.cli import app, main

    args, raises, code = IN_PROCESS_EXITS[case]
    if raises is not None:
        monkeypatch.setattr(importlib.import_module(raises[0]), raises[1], _interrupt)
    def out(folder: str) -> list[str]:
        return [] if args[0] == "validate" else ["--out", str(tmp_path / folder)]

    monkeypatch.setattr(sys, "argv", ["orcasim", *args, *out("o")])
    previous = signal.signal(signal.SIGINT, signal.default_int_handler), signal.signal(signal.SIGTERM,
                                                                                        _callers_sigterm)
    shown = warnings.showwarning
    try:
        with pytest.raises(SystemExit) as done:
            main()
        assert done.value.code == code
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) is _callers_sigterm
        assert warnings.showwarning is shown
        assert CliRunner().invoke(app, [*args, *out("again")]).exit_code == code
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
        warnings.showwarning = shown


def test_ctrl_c_in_process_after_an_interrupted_sweep_still_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`main()` called twice in one process: a sweep interrupted first left the flag that it
    had said how to resume, so a run interrupted next exited 130 without a word (found
    calling main() for a run, a sweep and a run, each interrupted)."""
    import importlib
    import signal

    from orcasim.cli import main

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for folder, args, (module, name) in (
                ("s", ["sweep", "scenarios/sweeps/rate_x_batch.yaml"], ("orcasim.sweeps", "run_sweep")),
                ("r", ["run", "scenarios/quickstart.yaml", "--no-plots"], ("orcasim.run", "run_system"))):
            with monkeypatch.context() as m:
                m.setattr(importlib.import_module(module), name, _interrupt)
                m.setattr(sys, "argv", ["orcasim", *args, "--out", str(tmp_path / folder)])
                with pytest.raises(SystemExit) as done:
                    main()
            assert done.value.code == 130
            assert "interrupted" in capsys.readouterr().err, args[0]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_warning_is_shown_once_per_command(capsys: pytest.CaptureFixture[str]) -> None:
    """A command's checks may draw the same requests for several systems: `capacity` showed a
    short trace's warning once per system (a tester's finding)."""
    from orcasim.cli import _show_warning

    for _ in range(2):
        _show_warning(UserWarning("a trace of 3 requests, once only"), UserWarning, "f.py", 1)
    _show_warning(UserWarning("another"), UserWarning, "f.py", 1)
    err = capsys.readouterr().err
    assert err.count("warning: a trace of 3 requests, once only\n") == 1 and "warning: another" in err


def test_each_command_in_one_process_shows_its_own_warnings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`main()` called twice in a notebook: the record of warnings shown lasted the process,
    so the second command hid a warning the first had shown (flake2's finding)."""
    from orcasim.cli import main

    scenario = tmp_path / "w.yaml"
    scenario.write_text(
        "name: w\nworkload: {num_requests: 20, arrival: {kind: poisson, rate_per_s: 2},"
        " prompt_tokens: {kind: constant, value: 16}, output_tokens: {kind: constant, value: 4},"
        " max_tokens: 32}\ncost: {kind: linear, base_s: 0.01}\nkv_capacity_tokens: 4096\n"
        "systems: [{name: p, scheduler: {kind: paged, swap_space_bytes: 9}}]\n")
    for _ in range(2):
        monkeypatch.setattr(sys, "argv", ["orcasim", "run", str(scenario), "--no-plots", "--force",
                                          "--out", str(tmp_path / "out")])
        with pytest.raises(SystemExit) as done:
            main()
        assert done.value.code == 0
        assert "swap_space_bytes = 9 is not used" in capsys.readouterr().err
