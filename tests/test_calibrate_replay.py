"""End to end on this machine: profile (ci grid), fit, then replay a real serving run.

The simulated mean latency and total iteration time must be within max(25%, 2× the
real-versus-real difference) of the real runs' mean: a shared CPU is noisy, so the bound
is set by the noise measured in the same test rather than by hope.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")

from calibrate.__main__ import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE_TOLERANCE = 0.25
NOISE_MULTIPLE = 2.0
LOAD = 0.55  # of the capacity the fitted model predicts: busy, but not saturated
# Below this share of CPU time in its iterations, the serving thread was mostly waiting for
# another process: the real runs then measure the neighbours, and there is nothing to judge.
MIN_CPU_SHARE = 0.75
# A profile of the ci grid taken again after the replay must agree with the one the
# simulation used to within this (median over shapes), or the machine changed speed.
PROFILE_DRIFT_LIMIT = 0.10
ATTEMPTS = 2
SCENARIO = """\
name: replay_ci
seed: 5
workload:
  num_requests: 80
  arrival: {kind: poisson, rate_per_s: 10.0}
  prompt_tokens: {kind: uniform, low: 16, high: 192}
  output_tokens: {kind: uniform, low: 8, high: 96}
  max_tokens: 288
cost: {kind: fitted, path: cpu-ci.yaml}
kv_capacity_tokens: 4096
systems:
  - {name: orca, scheduler: {kind: iteration_level, max_batch_size: 8}}
"""


def _profile(path: Path) -> None:
    assert main(["profile", "--model", "tiny", "--device", "cpu", "--grid", "ci",
                 "--max-tokens", "288", "--out", str(path)]) == 0


def _profile_drift(before: Path, after: Path) -> float:
    """How far the machine's speed moved between two profiles of the same grid: the median
    over shapes of the step time's ratio, less one. Two back-to-back profiles on a quiet
    machine differ by ~0.4% (median); a neighbour that shares the core (a hyperthread
    sibling, the memory bus) slows every step without taking CPU time from the serving
    thread, so the CPU share alone does not see it."""
    time_s = [pd.read_csv(p, comment="#").set_index(["query_tokens", "context_tokens"]).time_s
              for p in (before, after)]
    return float((time_s[1] / time_s[0]).median() - 1.0)


def _profile_fit_replay(folder: Path) -> tuple[dict, float]:
    """The report of one profile → fit → replay, and the profile's drift over it."""
    folder.mkdir()
    profile, out = folder / "cpu-ci.csv", folder / "out"
    _profile(profile)
    assert main(["fit", str(profile), "--out", str(folder / "cpu-ci.yaml")]) == 0
    scenario = folder / "replay_ci.yaml"
    scenario.write_text(SCENARIO)
    assert main(["replay", str(scenario), "--model", "tiny", "--device", "cpu",
                 "--load", str(LOAD), "--out", str(out)]) == 0
    _profile(folder / "after.csv")
    assert (out / "fidelity.png").stat().st_size > 0
    return json.loads((out / "fidelity.json").read_text()), _profile_drift(profile, folder / "after.csv")


@pytest.mark.validation
@pytest.mark.slow
def test_profile_fit_replay_within_noise(tmp_path: Path) -> None:
    # The test judges the simulation against the machine the profile measured. Where the
    # machine's speed moved under it (CI's run of 2026-12-06: every simulated step 38% over
    # the real loop's, after a profile taken beside a busy neighbour), the comparison says
    # nothing about orcasim: try once more, then skip, naming what moved.
    unsteady = []
    for attempt in range(ATTEMPTS):
        report, drift = _profile_fit_replay(tmp_path / f"attempt{attempt}")
        share = min(report["real_cpu_share"])
        if share >= MIN_CPU_SHARE and abs(drift) <= PROFILE_DRIFT_LIMIT:
            break
        unsteady.append(f"serving thread's CPU share {share:.2f} (at least {MIN_CPU_SHARE}), "
                        f"profile drift {drift:+.1%} (at most ±{PROFILE_DRIFT_LIMIT:.0%})")
    else:
        pytest.skip(f"machine unsteady in {ATTEMPTS} attempts: {'; '.join(unsteady)}")
    for metric in ("e2e_s_mean", "total_iteration_s"):
        m = report["metrics"][metric]
        bound = max(BASE_TOLERANCE, NOISE_MULTIPLE * m["real_vs_real"])
        # The profiled step alone misses the loop's own time; with the overhead fitted to
        # run 1's per-request log, the simulation must match run 2, which it never saw.
        assert m["sim_calibrated_vs_real_2"] <= bound, (metric, m, report["overhead_from_run_1"], drift)
    assert set(report["overhead_from_run_1"]) == {"overhead.per_iteration_s",
                                                  "overhead.per_sequence_s"}


def test_cli_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "x.yaml")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["profile", "--model", "nope", "--out", str(tmp_path / "p.csv")]) == 2
    assert "expected one of" in capsys.readouterr().err


SHIPPED_PROFILE = ROOT / "calibrate" / "profiles" / "cpu-tiny.csv"


def _profile_with(tmp_path: Path, edit) -> Path:  # noqa: ANN001 - a text edit
    path = tmp_path / "p.csv"
    path.write_text(edit(SHIPPED_PROFILE.read_text()))
    return path


@pytest.mark.parametrize(("edit", "message"), [
    # A tester's finds: each was a traceback (exit 1) or a model written from nonsense.
    (lambda t: t.replace(",time_s,", ",time,"), r"no column time_s; expected a profile CSV"),
    (lambda t: t.replace("decode,1,1,8,0,8,0.000573976,", "decode,1,1,8,0,8,-0.001,"),
     r"p.csv line 15: time_s = -0.001, expected a number > 0"),
    # An empty cell was "data row 6: time_s = nan" (line 20 of the file).
    (lambda t: t.replace("decode,1,1,512,0,512,0.000727295,", "decode,1,1,512,0,512,,"),
     r"p.csv line 20: time_s is empty, expected a number > 0"),
    (lambda t: "\n".join(t.splitlines()[:15]) + "\n", r": 1 row\(s\); expected at least"),
    (lambda t: "\n".join(t.splitlines()[:14]) + "\n", r": 0 row\(s\); expected at least"),
    (lambda t: "format: orcasim-fitted-cost/v1\n", r"no column tokens, .*; expected a profile CSV"),
])
def test_fit_refuses_a_profile_it_cannot_fit_in_one_line(tmp_path: Path, edit, message: str,  # noqa: ANN001
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.yaml"
    assert main(["fit", str(_profile_with(tmp_path, edit)), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and __import__("re").search(message, err), err
    assert not out.exists()


def test_fit_and_profile_options_are_checked_before_any_work(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.yaml"
    assert main(["fit", str(SHIPPED_PROFILE), "--out", str(out), "--target", "device_s"]) == 2
    assert "device_s is empty in every row" in capsys.readouterr().err
    assert main(["fit", str(SHIPPED_PROFILE), "--out", str(out), "--knots", "abc"]) == 2
    assert "--knots = 'abc': expected increasing token counts" in capsys.readouterr().err
    assert main(["fit", str(tmp_path), "--out", str(out)]) == 2
    assert "is a folder" in capsys.readouterr().err
    out.write_text("mine")  # nothing is overwritten without --force
    assert main(["fit", str(SHIPPED_PROFILE), "--out", str(out)]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err and out.read_text() == "mine"
    assert main(["fit", str(SHIPPED_PROFILE), "--out", str(out), "--force"]) == 0
    capsys.readouterr()
    for option, value, said in [("--layers", "0", "expected an integer >= 1"),
                                ("--layers", "-1", "expected an integer >= 1"),
                                ("--threads", "0", "expected an integer >= 1"),
                                ("--max-tokens", "0", "expected an integer >= 1")]:
        with pytest.raises(SystemExit) as exit_:
            main(["profile", option, value, "--out", str(tmp_path / "p.csv")])
        assert exit_.value.code == 2 and said in capsys.readouterr().err
    assert main(["profile", "--layers", "5", "--out", str(tmp_path / "p.csv")]) == 2
    assert "--layers = 5: tiny has 2 layers; expected 1 to 2" in capsys.readouterr().err
    # A grid too small to fit: 0 rows written, exit 0; 7 rows that fit then refused.
    assert main(["profile", "--grid", "ci", "--max-tokens", "8", "--out", str(tmp_path / "p.csv")]) == 2
    assert capsys.readouterr().err == ("error: --max-tokens 8: the ci grid has 7 batch shape(s) within "
                                       "it; expected at least 9 for python -m calibrate fit (a "
                                       "larger --max-tokens)\n")
    assert not (tmp_path / "p.csv").exists()
    # Enough shapes, but none past the 256-token knot: fit would refuse what it timed.
    assert main(["profile", "--grid", "ci", "--max-tokens", "64", "--out", str(tmp_path / "p.csv")]) == 2
    assert capsys.readouterr().err == ("error: --max-tokens 64: the ci grid has shapes that determine "
                                       "6 of the 7 coefficients (too few tokens past the 256-token "
                                       "knot); expected all 7 for python -m calibrate fit (a larger "
                                       "--max-tokens)\n")
    with pytest.raises(SystemExit):
        main(["replay", "s.yaml", "--load", "0"])
    assert "--load: '0': expected a number > 0" in capsys.readouterr().err


def test_a_seed_and_threads_out_of_range_name_their_option(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    """--seed -3 read 'error: expected non-negative integer', --seed 1e23 and --threads 1e23
    'error: Overflow when unpacking long long' (no option named), --threads 100000 a
    segmentation fault."""
    cores = os.cpu_count() or 1
    for option, value, said in [
            ("--seed", "-3", "argument --seed: '-3': expected an integer from 0 to 18446744073709551615"),
            ("--seed", str(10**23), "expected an integer from 0 to 18446744073709551615"),
            ("--seed", "1.5", "argument --seed: '1.5': expected an integer from 0 to"),
            ("--threads", "100000", f"argument --threads: '100000': expected an integer from 1 "
                                    f"to {cores}, this machine's cores")]:
        for command in (["profile"], ["replay", "s.yaml"]):
            with pytest.raises(SystemExit) as exit_:
                main([*command, option, value, "--out", str(tmp_path / "p.csv")])
            err = capsys.readouterr().err
            assert exit_.value.code == 2 and said in err and err.count("\n") == 1, err


def test_a_max_tokens_past_the_grid_builds_only_the_positions_timed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--max-tokens only caps the grid: 1e8 built a rotary table of 1e8 positions (killed,
    out of memory) and 1e23 overflowed torch (a traceback); both time the grid's shapes."""
    import calibrate.model

    built: list[int] = []

    class Built(Exception):
        pass

    def stop(*args: object, max_positions: int, **kwargs: object) -> None:
        built.append(max_positions)
        raise Built  # enough: the size is what this checks

    monkeypatch.setattr(calibrate.model, "build_model", stop)
    for max_tokens, grid, positions in [(10**23, "ci", 385), (10**8, "default", 1025),
                                        (300, "ci", 257)]:
        with pytest.raises(Built):
            main(["profile", "--grid", grid, "--max-tokens", str(max_tokens), "--out",
                  str(tmp_path / "p.csv")])
        assert built.pop() == positions


def run_gpu_check(env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """calibrate/gpu_check.sh --device cpu, in a session of its own, whose every process is
    killed if it runs past `timeout_s` (then TimeoutExpired, as subprocess.run raises).
    subprocess.run's timeout killed bash alone: the step it was running lives in a process
    group of its own (`timeout` makes one), so it ran on, orphaned, until its own limit
    (450 s of pytest at GPU_CHECK_LIMIT_SCALE=10), beside the suite's other workers."""
    with subprocess.Popen(["bash", str(ROOT / "calibrate" / "gpu_check.sh"), "--device", "cpu"],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_session(proc.pid)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid` (its leader's and every group made in it),
    until none is left; without /proc, the leader's process group alone."""
    if not Path("/proc/self/stat").exists():
        os.killpg(sid, 9)
        return
    while members := _session_members(sid):
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def _session_members(sid: int) -> list[int]:
    """The live processes of session `sid` (a zombie, already dead, is left to its parent)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, _pgid, session = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except OSError:  # ended meanwhile
            continue
        if int(session) == sid and state != "Z":
            members.append(int(stat.parent.name))
    return members


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_a_gpu_check_past_its_timeout_leaves_no_process(tmp_path: Path) -> None:
    """The gpu_check tests' timeout killed bash and left the step it was running alive
    (left alone by earlier reviews; found with ps after a 12 s timeout: `timeout ... 450.000
    env ... python -m pytest` and its pytest, in a process group of their own, still ran).
    Here a stand-in Python passes the preflight and hangs in the first step; past the
    timeout no process that carries this test's mark is left."""
    python = tmp_path / "python"
    python.write_text('#!/usr/bin/env bash\nif [[ "$1" == "-" ]]; then cat > /dev/null; exit 0; fi\n'
                      "exec sleep 600\n")
    python.chmod(0o755)
    mark = f"ORCASIM_TEST_MARK={uuid.uuid4().hex}"
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": str(python),
           mark.split("=")[0]: mark.split("=")[1]}
    with pytest.raises(subprocess.TimeoutExpired):
        run_gpu_check(env, timeout_s=3)
    left = [p.parent for p in Path("/proc").glob("[0-9]*/environ") if _carries(p, mark)]
    shown = [(p / "cmdline").read_bytes().replace(b"\0", b" ") for p in left]
    for process in left:  # not left running when this fails
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(process.name), 9)
    assert not left, shown


def _carries(environ: Path, mark: str) -> bool:
    try:
        return mark.encode() in environ.read_bytes().split(b"\0")
    except OSError:  # ended meanwhile, or another user's
        return False


@pytest.mark.slow
def test_gpu_check_cpu_path(tmp_path: Path) -> None:
    """calibrate/gpu_check.sh is run on a lent GPU in one try: its CPU path proves the steps."""
    # The steps' limits are sized for a lent machine that runs the script alone; here the
    # suite's other workers share the CPUs. Beside one busy core on a 2-core machine the
    # correctness step (a pytest of its own) ran past its 45 s limit (exit 124; 2 of 2 runs
    # of this file with -n 2 and a CPU hog), and the whole script took 237 s of the 300 s
    # it was given. This test proves the steps run and what they write; a step that hangs
    # is stopped by its limit in test_gpu_check_stops_a_step_that_runs_past_its_limit.
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable,
           "GPU_CHECK_LIMIT_SCALE": "10"}
    done = run_gpu_check(env, timeout_s=540)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    dest = tmp_path / "cpu"
    for name in ("profile.csv", "cost_model.yaml", "cost_model_measured.yaml", "replay/fidelity.json",
                 "kernels.csv", "kernels_eager.csv"):
        assert (dest / name).stat().st_size > 0, name
    assert json.loads((dest / "replay" / "fidelity.json").read_text())["requests"] == 12
    provenance = (dest / "provenance.txt").read_text()
    assert "model: tiny" in provenance and "torch: " in provenance and "date: 20" in provenance


@pytest.mark.parametrize("arrival", [
    "{kind: conversations, num_sessions: 4, session_rate_per_s: 1.0, turns: {kind: constant, value: 2},"
    " user_tokens: {kind: constant, value: 16}, output_tokens: {kind: constant, value: 8},"
    " think_time: {kind: exponential, mean_s: 1.0}, max_context_tokens: 256}",
    "{kind: closed_loop, num_clients: 2, think_time: {kind: exponential, mean_s: 1.0}}",
])
def test_replay_refuses_arrivals_that_wait_for_answers(tmp_path: Path, arrival: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The real server replays fixed arrival times: a session's next turn, which waits for an
    answer, cannot be replayed. Conversations crashed with --load (AttributeError: no
    rate_per_s, a traceback) and were replayed as if open without it (a tester's finding)."""
    scenario = tmp_path / "s.yaml"
    text = SCENARIO.replace("{kind: poisson, rate_per_s: 10.0}", arrival).replace(
        "cpu-ci.yaml", str(ROOT / "calibrate" / "cost_models" / "cpu-tiny.yaml"))
    if "sessions" in arrival:  # the sessions make the requests
        text = text.replace("  num_requests: 80\n", "").replace(
            "  output_tokens: {kind: uniform, low: 8, high: 96}\n", "").replace(
            "  prompt_tokens: {kind: uniform, low: 16, high: 192}\n", "")
    scenario.write_text(text)
    assert main(["replay", str(scenario), "--model", "tiny", "--device", "cpu", "--load", "0.5",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "workload.arrival.kind" in err and "expects poisson, gamma, constant or trace" in err


def test_gpu_check_names_a_missing_module_before_any_step(tmp_path: Path) -> None:
    """On a lent GPU without network, a module the replay imports late (scipy, for the
    overhead fit) failed the script after the correctness test, the profile and the fits
    (minutes of a 15-minute budget): every module is now imported first, and a missing one
    is one line, exit 2, before any step (a tester's finding)."""
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "scipy.py").write_text("raise ImportError('no scipy on this machine')\n")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
           "PYTHONPATH": f"{blocked}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = run_gpu_check(env, timeout_s=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "scipy" in done.stderr and "== correctness" not in done.stdout, done.stdout + done.stderr
    assert not (tmp_path / "out" / "cpu" / "profile.csv").exists()


def test_replay_with_layers_but_no_cost_warns_that_the_price_is_the_whole_models(
        tmp_path: Path) -> None:
    """`replay --layers 1` of the 2-layer tiny model ran one layer for real and priced two in
    the simulation (the scenario's fit of the whole model), silently; a fit of those layers
    is what such a replay compares with, and says so in its provenance."""
    from calibrate.__main__ import warn_layers_unpriced
    from orcasim.cost.fitted import FittedCostConfig
    from orcasim.scenario import load_scenario

    scenario = load_scenario(ROOT / "scenarios" / "calibrated" / "cpu_tiny.yaml")
    with pytest.warns(UserWarning, match=r"--layers 1: the real engine runs 1 of tiny's 2 layers"):
        warn_layers_unpriced("tiny", 1, scenario)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_layers_unpriced("tiny", None, scenario)
        warn_layers_unpriced("tiny", 2, scenario)  # every layer: the whole model's price
        # A fit of the layers the replay runs (`fit --target measured_s` writes this):
        fit = tmp_path / "one-layer.yaml"
        fit.write_text((ROOT / "calibrate" / "cost_models" / "cpu-tiny.yaml").read_text()
                       .replace("  model: tiny\n", "  model: tiny\n  fitted_layers: 1 of 2\n"))
        scenario = scenario.model_copy(update={"cost": FittedCostConfig(kind="fitted", path=str(fit))})
        warn_layers_unpriced("tiny", 1, scenario)


def test_at_load_offers_a_trace_the_rate_capacity_reads(tmp_path: Path) -> None:
    """`--load 1` of a 1 req/s capacity replays a trace of one arrival a second at 1 req/s,
    the rate `orcasim.metrics.offered_rps` reads (a capacity search's rule for a trace).
    The replay counted its n arrivals over the n - 1 gaps from 0 to the last: 4 arrivals at
    0, 1, 2, 3 s offered 4/3 req/s, so --load 1 replayed them at 0.75 req/s, and the
    report's offered_rps read 1.333 for a trace of 1 req/s."""
    from calibrate.replay import at_load
    from orcasim.metrics import offered_rps
    from orcasim.run import make_requests
    from orcasim.scenario import scenario_from_dict

    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,12,3\n2,8,4\n3,9,2\n")
    scenario = scenario_from_dict({
        "name": "t", "workload": {"arrival": {"kind": "trace", "path": str(trace)}, "max_tokens": 64},
        "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4},
        "kv_capacity_tokens": 1000,
        "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 4}}],
    }, "t")
    requests = make_requests(scenario)
    assert offered_rps(requests.arrival_s) == pytest.approx(1.0)
    scaled = make_requests(at_load(scenario, requests, capacity=1.0, load=1.0))
    assert offered_rps(scaled.arrival_s) == pytest.approx(1.0)
    halved = make_requests(at_load(scenario, requests, capacity=2.0, load=0.25))
    assert offered_rps(halved.arrival_s) == pytest.approx(0.5)


def test_real_busy_fraction_is_the_simulations_rule() -> None:
    """A real run's busy fraction is `orcasim.run.busy_fraction`'s, which the simulation's
    summary reports beside it: from the first arrival to the last finish. Counted from
    time 0, a loop busy from the first arrival at 10 s to the last finish at 60 s read 0.83."""
    from calibrate.replay import Served
    from orcasim.run import busy_fraction

    requests = pd.DataFrame({"arrival_s": [10.0, 20.0], "finish_s": [20.0, 60.0]})
    iterations = pd.DataFrame({"start_s": [10.0, 20.0], "duration_s": [10.0, 40.0],
                               "num_iterations": [1, 1]})
    served = Served(requests, iterations, [], 1.0)
    assert busy_fraction(requests, iterations, 0.0) == pytest.approx(1.0)
    assert served.busy_fraction == pytest.approx(1.0)


def test_gpu_check_stops_a_step_that_runs_past_its_limit(tmp_path: Path) -> None:
    """On a lent GPU a step that hangs ate the whole device budget (the script had no limit
    but the tool's): each command now runs under its own limit, and one that passes it
    stops the script naming the step, with exit 124 (timeout's), no later step run."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable,
           "GPU_CHECK_LIMIT_SCALE": "0.0001"}  # 45 s becomes 5 ms: the first step stops
    done = run_gpu_check(env, timeout_s=300)
    assert done.returncode == 124, done.stdout[-2000:] + done.stderr[-2000:]
    assert "error: step 'correctness on cpu' ran past its limit of 0.005 s" in done.stderr, done.stderr
    assert "== profile" not in done.stdout and not (tmp_path / "cpu" / "profile.csv").exists()


def test_the_replays_overhead_fit_runs_on_a_cost_calibrated_from_logs(tmp_path: Path) -> None:
    """`replay --cost FILE` of `calibrate logs`: the loop's overhead, fitted to real run 1,
    was added as a second overhead beside the file's own, which is refused, so the replay
    failed after its real runs ('log /tmp/.../real_1.csv: cost.overhead: ... holds its own
    overhead'). It is fitted in the file's block, as `calibrate logs` refits such a file."""
    import yaml

    from calibrate.replay import orca_system, overhead_from_log
    from orcasim.run import run_scenario
    from orcasim.scenario import scenario_from_dict

    truth = {"per_iteration_s": 0.002, "per_sequence_s": 0.0003}
    block = {"kind": "linear", "base_s": 0.004, "per_token_s": 2e-5,
             "overhead": {"per_iteration_s": 0.0, "per_sequence_s": 0.0}}
    (tmp_path / "calibrated.yaml").write_text(yaml.safe_dump(
        {"format": "orcasim-calibrated-cost/v1", "cost": block, "calibration": {}}))
    data = yaml.safe_load(SCENARIO) | {"cost": {"kind": "fitted", "path": "calibrated.yaml"}}
    data["workload"]["num_requests"] = 30
    real = run_scenario(scenario_from_dict(data | {"cost": {**block, "overhead": truth}}))
    scenario = scenario_from_dict(data)
    system = orca_system(scenario)
    fitted, _ = overhead_from_log(scenario, system, real.systems[system.name].requests, tmp_path)
    assert fitted == pytest.approx({f"overhead.{k}": v for k, v in truth.items()}, rel=1e-3)


def test_replay_with_too_many_layers_is_its_error_alone(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`replay --layers 5` of the 2-layer tiny model first warned that the real engine runs
    '5 of tiny's 2 layers', then refused the 5."""
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert main(["replay", str(ROOT / "scenarios" / "calibrated" / "cpu_tiny.yaml"),
                     "--layers", "5", "--out", str(tmp_path / "out")]) == 2
    assert [str(w.message) for w in said] == []
    assert capsys.readouterr().err == "error: --layers = 5: tiny has 2 layers; expected 1 to 2\n"


def test_replays_layers_help_says_they_run_for_real(capsys: pytest.CaptureFixture[str]) -> None:
    """replay --help said of --layers 'profile times are scaled to the full count', the
    profiler's meaning; in a replay they run for real and need a fit of them (--cost)."""
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "run only this many layers for real" in text and "scaled" not in text
