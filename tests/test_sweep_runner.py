"""Running sweeps: the same table from any backend, resume, and failures as values."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pandas as pd
import pytest
from sweep_files import TINY_SCENARIO, write_grid_4x3, write_sweep
from typer.testing import CliRunner

from orcasim.cli import app
from orcasim.config import ScenarioError
from orcasim.sweeps import load_sweep, run_sweep, run_sweep_in_memory


def test_table_is_tidy(tmp_path: Path) -> None:
    grid_4x3 = write_grid_4x3(tmp_path)
    result = run_sweep(load_sweep(grid_4x3), tmp_path / "out", workers=1, progress=False)
    t = result.table
    assert len(t) == 12 * 2  # 12 points x 2 systems x 1 replication
    assert list(t.columns[:6]) == ["point", "replication", "seed", "workload.arrival.rate_per_s",
                                   "systems[1].scheduler.max_batch_size", "system"]
    assert "normalized_latency_s_per_token_p50" in t.columns
    assert all(s == ["request-level", "orca"] for s in t.groupby("point")["system"].apply(list))
    on_disk = pd.read_parquet(tmp_path / "out" / "sweep.parquet")
    pd.testing.assert_frame_equal(on_disk, t)
    assert len(pd.read_csv(tmp_path / "out" / "sweep.csv")) == len(t)


def test_process_pool_matches_in_process(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0, 3.0]", replications=2)
    serial = run_sweep_in_memory(load_sweep(path), workers=1).table
    pooled = run_sweep(load_sweep(path), tmp_path / "pool", workers=2, progress=False).table
    pd.testing.assert_frame_equal(serial, pooled)
    assert serial.groupby("point")["seed"].nunique().eq(2).all()


def test_resume_runs_only_unfinished_points(tmp_path: Path) -> None:
    grid_4x3 = write_grid_4x3(tmp_path)
    out = tmp_path / "out"
    full = run_sweep(load_sweep(grid_4x3), out, workers=1, progress=False).table
    shutil.rmtree(out / "points" / "p0003-r00")
    (out / "sweep.parquet").unlink()
    resumed = run_sweep(load_sweep(grid_4x3), out, workers=1, resume=True, progress=False)
    assert (resumed.ran, resumed.skipped) == (1, 11)
    pd.testing.assert_frame_equal(resumed.table, full)


def test_resume_refuses_a_different_sweep(tmp_path: Path) -> None:
    grid_4x3 = write_grid_4x3(tmp_path)
    out = tmp_path / "out"
    run_sweep(load_sweep(grid_4x3), out, workers=1, progress=False)
    other = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [5.0]", name="other")
    with pytest.raises(ValueError, match="different run"):
        run_sweep(load_sweep(other), out, workers=1, resume=True, progress=False)
    with pytest.raises(FileExistsError, match="--resume"):
        run_sweep(load_sweep(grid_4x3), out, workers=1, progress=False)


@pytest.mark.parametrize(("overrides", "grid", "where"), [
    (["workload.num_requests=50"], "[1.0, 3.0]", "base.workload.num_requests is 60 there, 50 here"),
    ([], "[1.0, 2.0]", "tasks[1].params.workload.arrival.rate_per_s is 3.0 there, 2.0 here"),
    ([], "[1.0, 3.0, 5.0]", "tasks: 2 items there, 3 here"),
])
def test_a_resume_refused_says_where_the_plan_differs(tmp_path: Path, overrides: list[str],
                                                      grid: str, where: str) -> None:
    """Told only 'plan.json differs', a user who resumed without the run's --set, or after
    an edit, had to diff plan.json to find which (a tester's finding)."""
    out = tmp_path / "out"
    first = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0, 3.0]")
    run_sweep(load_sweep(first), out, workers=1, progress=False)
    changed = write_sweep(tmp_path, f"parameters:\n  workload.arrival.rate_per_s: {grid}")
    with pytest.raises(ValueError) as refused:
        run_sweep(load_sweep(changed, overrides), out, workers=1, resume=True, progress=False)
    assert f"holds a different run (plan.json differs), so this run cannot resume it: {where}; " \
        in str(refused.value)


def test_a_changed_data_file_is_named_when_a_resume_is_refused() -> None:
    from orcasim.sweeps.runner import plan_change

    there = json.dumps({"tasks": [], "inputs": {"/d/a.csv": "1" * 64, "/d/b.csv": "2" * 64}})
    assert plan_change(there, json.dumps({"tasks": [], "inputs": {"/d/a.csv": "1" * 64,
                                                                    "/d/b.csv": "3" * 64}})) \
        == ": data file /d/b.csv changed since (its SHA-256 differs)"
    assert plan_change(there, json.dumps({"tasks": [], "inputs": {"/d/a.csv": "1" * 64}})) \
        == ": data file /d/b.csv is not read here"
    assert plan_change("not json", there) == ""


def test_resume_refuses_a_folder_without_its_plan(tmp_path: Path) -> None:
    """Another sweep's points, plan lost: resuming must not count them as this sweep's."""
    out = tmp_path / "out"
    other = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [5.0]", name="other")
    run_sweep(load_sweep(other), out, workers=1, progress=False)
    (out / "plan.json").unlink()
    with pytest.raises(ValueError, match="no plan.json"):
        run_sweep(load_sweep(write_grid_4x3(tmp_path)), out, workers=1, resume=True, progress=False)


def failing_sweep(tmp_path: Path) -> Path:
    # max_tokens = 64 is valid configuration, but the drawn prompts exceed it at run time.
    return write_sweep(tmp_path, """
mode: zip
parameters:
  workload.max_tokens: [320, 64, 320]
  workload.arrival.rate_per_s: [1.0, 2.0, 3.0]
""")


def test_failing_point_is_recorded_and_the_rest_finish(tmp_path: Path) -> None:
    result = run_sweep(load_sweep(failing_sweep(tmp_path)), tmp_path / "out", workers=2, progress=False)
    assert [o.id for o in result.failed] == ["p0001-r00"]
    assert "max_tokens" in result.failed[0].error
    assert sorted(result.table["point"].unique()) == [0, 2]
    failures = pd.read_csv(tmp_path / "out" / "failures.csv")
    assert list(failures["id"]) == ["p0001-r00"]


def test_cli_exits_nonzero_naming_failed_points(tmp_path: Path) -> None:
    # Point 1 is valid and its requests are, but its run reaches past MAX_TIME_S (iterations
    # of 1e8 s): only running it tells. (Arrivals past it are refused with the requests.)
    sweep = write_sweep(tmp_path, """
parameters:
  cost.base_s: [0.01, 1.0e8, 0.02]
""")
    res = CliRunner().invoke(app, ["sweep", str(sweep), "--out", str(tmp_path / "out"),
                                   "--workers", "1", "--no-progress"])
    assert res.exit_code == 1
    assert "p0001-r00" in res.output and "beyond 1e+09 s" in res.output


def test_cli_refuses_what_a_run_of_a_point_would_refuse_before_any_work(tmp_path: Path) -> None:
    """Point 1's drawn prompts exceed its max_tokens, as `validate` says; the sweep ran every
    point and exited 1, and a missing data file failed every point alike."""
    res = CliRunner().invoke(app, ["sweep", str(failing_sweep(tmp_path)), "--out",
                                   str(tmp_path / "out"), "--workers", "1", "--no-progress"])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: point p0001-r00 (") and "max_tokens" in res.output
    assert not (tmp_path / "out").exists()
    missing = write_sweep(tmp_path, """
parameters:
  workload.arrival.speedup: [1.0, 2.0]
""", name="missing")
    (tmp_path / "tiny.yaml").write_text(
        "name: rel\nworkload: {arrival: {kind: trace, path: gone.csv}, max_tokens: 100}\n"
        "cost: {kind: linear, base_s: 0.01}\nkv_capacity_tokens: 20000\n"
        "systems: [{name: orca, scheduler: {kind: iteration_level, max_batch_size: 4}}]\n")
    res = CliRunner().invoke(app, ["sweep", str(missing), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "gone.csv" in res.output and "not found" in res.output, res.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["sweep", "capacity"])
def test_an_address_without_ray_is_refused(tmp_path: Path, command: str) -> None:
    res = CliRunner().invoke(app, [command, str(write_grid_4x3(tmp_path)), "--address", "auto",
                                   "--out", str(tmp_path / "out"), "--slo", "ttft_p90=1"][
                                       : 6 if command == "sweep" else None])
    assert res.exit_code == 2, res.output
    assert "--address auto applies to --backend ray" in res.output


def test_cli_bad_backend_is_exit_2(tmp_path: Path) -> None:
    grid_4x3 = write_grid_4x3(tmp_path)
    res = CliRunner().invoke(app, ["sweep", str(grid_4x3), "--backend", "dask", "--out",
                                   str(tmp_path / "out")])
    assert res.exit_code == 2
    assert "error: --backend = 'dask': expected 'local' or 'ray'" in res.output


@pytest.mark.parametrize("command", ["sweep", "capacity"])
def test_cli_workers_below_one_names_the_option(tmp_path: Path, command: str) -> None:
    grid_4x3 = write_grid_4x3(tmp_path)  # and its base, tiny.yaml, for capacity
    given = grid_4x3 if command == "sweep" else tmp_path / "tiny.yaml"
    res = CliRunner().invoke(app, [command, str(given), "--workers", "0", "--out",
                                   str(tmp_path / "out"), "--slo", "ttft_p90=1"][
                                       : 6 if command == "sweep" else None])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == "error: --workers = 0: expected at least 1"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("workers", ["2", 1.5, True])
def test_workers_that_are_no_whole_number_are_refused_from_python(tmp_path: Path, workers: object) -> None:
    """run_sweep_in_memory(sweep, workers="2") raised "'<' not supported between instances of
    'str' and 'int'" and workers=1.5 "'float' object cannot be interpreted as an integer" from
    the pool (found testing the sweep API as a notebook would)."""
    sweep = load_sweep(write_grid_4x3(tmp_path))
    with pytest.raises(ScenarioError, match=r"^--workers = .*: expected a whole number, at least 1$"):
        run_sweep_in_memory(sweep, workers=workers)  # type: ignore[arg-type]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_points_warnings_are_shown_alike_from_every_backend(tmp_path: Path, workers: int) -> None:
    """An overloaded point warns that it saturated. Run here, the warning reached the user
    ('warning: ...' from the command line); from a pool's worker it was printed raw by the
    worker, and from Ray not at all. The warnings travel in the outcome and this process
    warns of them, whatever ran the point."""
    sweep = write_sweep(tmp_path, """
parameters:
  workload.arrival.rate_per_s: [1.0, 400.0]
""")
    # Named by its point: the message's own numbers do not say which point saturated.
    with pytest.warns(UserWarning, match=r"point p0001-r00 \(workload.arrival.rate_per_s=400.0\): "
                      "orca: saturated"):
        run_sweep(load_sweep(sweep), tmp_path / "out", workers=workers, progress=False)
    outcome = json.loads((tmp_path / "out" / "points" / "p0001-r00" / "outcome.json").read_text())
    assert any(w.startswith("orca: saturated") for w in outcome["warnings"])
    quiet = json.loads((tmp_path / "out" / "points" / "p0000-r00" / "outcome.json").read_text())
    assert quiet["warnings"] == []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_warning_every_point_gives_is_shown_once(tmp_path: Path, workers: int) -> None:
    """An SLO target below the attainment share warns at every point: once, from every
    backend (in this process each task's catch_warnings wiped Python's memory of it, and it
    came once per point)."""
    sweep = write_sweep(tmp_path, """
parameters:
  workload.arrival.rate_per_s: [1.0, 2.0, 3.0]
""")
    (tmp_path / "tiny.yaml").write_text((tmp_path / "tiny.yaml").read_text()
                                        + "slo: {targets: ['e2e_p50 <= 100']}\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # only the sweep's own rule may hold repeats back
        run_sweep(load_sweep(sweep), tmp_path / "out", workers=workers, progress=False)
    held = [w for w in caught if "held at the attainment share" in str(w.message)]
    assert len(held) == 1, [str(w.message) for w in held]


def test_a_failed_points_warnings_are_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a point warned of before it failed may say why it failed; it was dropped with
    the run's result. (Points that fail every request are refused before a sweep starts, so
    the failure is made here: a run that warns, then raises.)"""
    import orcasim.run

    def warn_then_fail(*args: object, **kwargs: object) -> None:
        warnings.warn("orca: 3 request(s) can never fit in KV memory", UserWarning, stacklevel=1)
        raise RuntimeError("the run stopped")

    monkeypatch.setattr(orcasim.run, "run_scenario", warn_then_fail)
    sweep = write_sweep(tmp_path, """
parameters:
  workload.arrival.rate_per_s: [1.0]
""")
    with pytest.warns(UserWarning, match=r"point p0000-r00 \(workload.arrival.rate_per_s=1.0\): "
                      "orca: 3 request"):
        result = run_sweep(load_sweep(sweep), tmp_path / "out", workers=1, progress=False)
    assert [(o.id, o.error) for o in result.failed] == [("p0000-r00", "RuntimeError: the run stopped")]
    assert result.failed[0].warnings == ["orca: 3 request(s) can never fit in KV memory"]


def _closed_port() -> int:
    """A local port where nothing listens (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("command", ["sweep", "capacity"])
@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}"])
def test_a_ray_address_where_nothing_answers_is_refused_at_once(
        tmp_path: Path, command: str, address: str) -> None:
    """Given a head that is not there, ray.init retried for minutes, printing warnings (a
    sweep killed after 120 s); now the run is refused before it writes anything."""
    address = address.format(port=_closed_port())
    spec = write_grid_4x3(tmp_path) if command == "sweep" else Path("scenarios/quickstart.yaml")
    slo = ["--slo", "ttft_p90<=1"] if command == "capacity" else []
    res = CliRunner().invoke(app, [command, str(spec), "--backend", "ray", "--address", address,
                                   "--out", str(tmp_path / "out"), *slo])
    assert res.exit_code == 2, res.output
    assert f"--address = '{address}': nothing answers at" in res.output
    assert "running Ray head" in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["sweep", "capacity"])
def test_ray_auto_without_a_cluster_is_refused_before_writing(
        tmp_path: Path, command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--address auto` with no Ray cluster running failed once the folder held plan.json,
    said "nothing was left half-written", and the same command then needed --resume or
    --force (a tester's note): Ray is joined before the folder is made."""
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "no-ray-here"))  # no cluster file to find
    spec = write_grid_4x3(tmp_path) if command == "sweep" else Path("scenarios/quickstart.yaml")
    slo = ["--slo", "ttft_p90<=1"] if command == "capacity" else []
    res = CliRunner().invoke(app, [command, str(spec), "--backend", "ray", "--address", "auto",
                                   "--out", str(tmp_path / "out"), *slo])
    assert res.exit_code == 2, res.output
    assert "--address = 'auto': " in res.output and "ray start --head" in res.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("address", ["127.0.0.1", "host:port", ":80"])
def test_a_ray_address_without_a_port_is_refused(address: str) -> None:
    from orcasim.config import ScenarioError
    from orcasim.sweeps.backends import check_backend

    with pytest.raises(ScenarioError, match=r"--address = .*expected the host:port of a running Ray head"):
        check_backend("ray", None, address)
    check_backend("local", None, None)


def test_a_points_checking_warning_is_said_once_naming_it_and_the_base_s_not_at_all(
        tmp_path: Path) -> None:
    """A clipped lognormal whose mean the grid sets warned for the base's mean, which no
    point runs, then for each point twice: once as the sweep was checked (naming no point)
    and once as it ran (a tester's finding)."""
    (tmp_path / "base.yaml").write_text(TINY_SCENARIO.replace(
        "prompt_tokens: {kind: uniform, low: 16, high: 256}",
        "prompt_tokens: {kind: lognormal, mean: 60, sigma: 2.0, max: 200}"))
    (tmp_path / "sw.yaml").write_text("name: sw\nbase: base.yaml\ngrid:\n  parameters:\n"
                                      "    workload.prompt_tokens.mean: [20, 80]\n")
    for command in (["sweep", str(tmp_path / "sw.yaml"), "--out", str(tmp_path / "out"),
                     "--workers", "1", "--no-progress"], ["validate", str(tmp_path / "sw.yaml")]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = CliRunner().invoke(app, command)
        assert res.exit_code == 0, res.output
        said = [str(w.message) for w in caught if "lognormal" in str(w.message)]
        assert [m.split(": workload.prompt_tokens: lognormal mean ")[1][:2] for m in said] == \
            ["20", "80"], said
        assert said[0].startswith("point p0000-r00 (workload.prompt_tokens.mean=20): ")


def test_force_interrupted_while_deleting_leaves_a_folder_force_replaces(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--force deleted the old sweep folder in place: Ctrl-C while its points were deleted
    (its marker gone first, as the file system listed it) left a folder without its marker,
    which every later --force refused as one orcasim did not write, and --resume as one
    without its plan (a tester's finding)."""
    from orcasim.results import MARKER

    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0, 3.0]")
    out = tmp_path / "out"
    run_sweep(load_sweep(path), out, workers=1, progress=False)
    real_rmtree = shutil.rmtree

    def interrupted(folder: Path, *args: object, **kwargs: object) -> None:
        for marker in Path(folder).rglob(MARKER):  # the top marker and plan first, then Ctrl-C
            if marker.parent.name != "points" and marker.parent.parent.name != "points":
                marker.unlink()
        for plan in Path(folder).rglob("plan.json"):
            plan.unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(load_sweep(path), out, workers=1, progress=False, force=True)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    result = run_sweep(load_sweep(path), out, workers=1, progress=False, force=True)
    assert result.ran == 2 and not result.failed


def test_a_results_folder_named_with_brackets_is_printed_as_named(tmp_path: Path) -> None:
    """'2 rows in sq/sweep.parquet' of --out sq[bold]: rich read '[bold]' as markup."""
    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0]")
    out = tmp_path / "sq[bold]"
    res = CliRunner().invoke(app, ["sweep", str(path), "--out", str(out), "--workers", "1",
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    assert f"rowsin{out}/sweep.parquet" in "".join(res.output.split())


def test_replications_of_a_trace_are_said_to_be_one_sample(tmp_path: Path) -> None:
    """A trace's replications replay the same requests: three identical runs ran without a
    word, and their band of zero width read as a certain answer (a tester's finding). Said
    once, naming the first point, as capacity says it; a point that draws its requests
    (a Poisson grid value) gives no such warning."""
    from sweep_files import write_trace_scenario

    write_trace_scenario(tmp_path)
    path = tmp_path / "trace_sweep.yaml"
    path.write_text("name: t\nbase: s.yaml\nreplications: 3\ngrid:\n  parameters:\n"
                    "    workload.arrival.speedup: [1.0, 2.0]\n")
    with pytest.warns(UserWarning) as said:
        table = run_sweep(load_sweep(path), tmp_path / "out", workers=1, progress=False).table
    alike = [str(w.message) for w in said if "replays the same requests" in str(w.message)]
    assert alike == ["point p0000-r00 (workload.arrival.speedup=1.0): workload.arrival.kind = "
                     "'trace': every replication replays the same requests, so the 3 "
                     "replications differ only where a system draws at random (a random or "
                     "power_of_two router); a band of zero width across them is one sample, "
                     "not a certain answer"]
    assert table.groupby("point")["throughput_rps"].nunique().eq(1).all()  # as it says
    with pytest.warns(UserWarning, match="replays the same requests"):  # validate says it too
        assert CliRunner().invoke(app, ["validate", str(path)]).exit_code == 0
    drawn = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0]",
                        replications=2, name="drawn")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_sweep_in_memory(load_sweep(drawn), workers=1)


def test_a_task_that_kills_its_worker_fails_alone() -> None:
    """A worker that dies breaks the whole pool: one task killed by the OOM killer failed
    every task still queued with it, 5 of 8 that never ran (a tester's finding). Those in
    flight run again alone, so that only the one that kills its worker fails."""
    from sweep_files import die_at_two

    from orcasim.sweeps.backends import WORKER_DIED, execute_jobs

    results = list(execute_jobs(list(range(8)), die_at_two, lambda job, e: ("failed", job, str(e)),
                                "local", workers=3))
    assert sorted(r for r in results if r[0] == "ok") == [("ok", j) for j in (0, 1, 3, 4, 5, 6, 7)]
    assert [r for r in results if r[0] == "failed"] == [
        ("failed", 2, WORKER_DIED)]


def test_a_damaged_plan_or_outcome_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 in plan.json or a point's outcome.json ended --resume in a
    UnicodeDecodeError's traceback (a tester's finding); now the refusals a damaged JSON
    file already gets."""
    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0, 3.0]")
    out = tmp_path / "out"
    run_sweep(load_sweep(path), out, workers=1, progress=False)
    (out / "points" / "p0000-r00" / "outcome.json").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="outcome.json: not an outcome this version wrote"):
        run_sweep(load_sweep(path), out, workers=1, resume=True, progress=False)
    (out / "plan.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match=r"holds a different run \(plan.json differs\)"):
        run_sweep(load_sweep(path), out, workers=1, resume=True, progress=False)


class _FakeRay:
    """Ray's calls that `_ray` makes, in this process, counting the tasks in flight."""

    def __init__(self) -> None:
        self.most_in_flight = 0

    def is_initialized(self) -> bool:
        return True  # a caller's instance (a cluster joined with --address)

    def remote(self, **_: object):  # type: ignore[no-untyped-def]
        class Remote:
            def __init__(self, run) -> None:  # type: ignore[no-untyped-def]
                self.run = run

            def remote(self, task):  # type: ignore[no-untyped-def]
                return (self.run, task)

        return lambda run: Remote(run)

    def wait(self, refs, num_returns, timeout):  # type: ignore[no-untyped-def]
        self.most_in_flight = max(self.most_in_flight, len(refs))
        return refs[:1], refs[1:]

    def get(self, ref):  # type: ignore[no-untyped-def]
        run, task = ref
        return run(task)


def test_workers_caps_the_tasks_in_flight_on_a_ray_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside --address, --workers was read by nothing: every task was submitted at once
    and a cluster ran as many as it had CPUs (a tester's note). It caps those in flight."""
    import sys

    from orcasim.sweeps.backends import execute_jobs

    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    got = list(execute_jobs(list(range(10)), abs, lambda job, e: None, "ray", 3, "auto"))
    assert sorted(got) == list(range(10))
    assert fake.most_in_flight == 3
    fake.most_in_flight = 0
    assert sorted(execute_jobs(list(range(10)), abs, lambda job, e: None, "ray", None, "auto")) \
        == list(range(10))
    assert fake.most_in_flight == 10  # no --workers: the cluster decides


@pytest.mark.parametrize(("record", "why"), [
    ({"version": "0.0.9", "sha256": "0" * 64}, "was run by orcasim 0.0.9, this is "),
    ("same version", "was run by other orcasim code"),
    (None, "records no orcasim code"),
])
def test_resume_refuses_a_folder_that_other_orcasim_code_began(
        tmp_path: Path, record: dict[str, str] | str | None, why: str) -> None:
    """plan.json recorded the work, not the code that did it: a sweep resumed after an
    upgrade or an edit of orcasim ran its remaining points with the new code and its table
    mixed the two, nothing said. code.json records the code; a different one is refused."""
    from orcasim.paths import code_record

    grid = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0, 3.0]")
    out = tmp_path / "out"
    run_sweep(load_sweep(grid), out, workers=1, progress=False)
    assert json.loads((out / "code.json").read_text()) == code_record()
    shutil.rmtree(out / "points" / "p0001-r00")
    if record is None:
        (out / "code.json").unlink()
    else:
        held = {**code_record(), "sha256": "f" * 64} if record == "same version" else record
        (out / "code.json").write_text(json.dumps(held))
    with pytest.raises(ValueError) as refused:
        run_sweep(load_sweep(grid), out, workers=1, resume=True, progress=False)
    assert why in str(refused.value)
    assert str(refused.value).endswith("so this run cannot resume it: its finished points "
                                       "would mix with this code's; use another --out, or "
                                       "--force to start over")
    assert not (out / "points" / "p0001-r00").exists()  # nothing ran
    # The remedy it offers, added to the command it refused, starts over on this code.
    result = run_sweep(load_sweep(grid), out, workers=1, resume=True, force=True, progress=False)
    assert (result.ran, result.skipped) == (2, 0)
    assert json.loads((out / "code.json").read_text()) == code_record()


def test_the_code_record_reads_modules_and_data_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stray file beside the modules (an editor's swap file) must not refuse every resume;
    a module or a shipped data file changed must."""
    import orcasim.paths as paths

    package = tmp_path / "orcasim"
    (package / "data").mkdir(parents=True)
    (package / "core.py").write_text("x = 1\n")
    (package / "data" / "catalog.yaml").write_text("a: 1\n")
    monkeypatch.setattr(paths, "__file__", str(package / "paths.py"))

    def record() -> dict[str, str]:
        paths.code_record.cache_clear()
        return paths.code_record()

    try:
        first = record()
        (package / ".core.py.swp").write_text("editor state")
        assert record() == first
        (package / "data" / "catalog.yaml").write_text("a: 2\n")
        second = record()
        assert second != first
        (package / "core.py").write_text("x = 2\n")
        assert record() != second
    finally:
        paths.code_record.cache_clear()  # the next caller reads orcasim's own files again
