"""`python -m calibrate logs` on awkward input: a metric at 0, logs that share a stem or are
given twice, a bad --fit, and an interrupt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from calibrate.__main__ import main
from calibrate.logs import (
    Objective,
    fit,
    ineffective_terms,
    log_errors,
    read_logs,
    solve_linear,
    with_cost,
)
from orcasim.config import ScenarioError
from orcasim.run import run_scenario
from orcasim.scenario import scenario_from_dict

FIT_RTOL = 0.02  # as tests/test_calibrate_logs.py's round trip
TRUE_BASE_S = 0.008
SCENARIO = {
    "name": "logs_input", "seed": 3, "kv_capacity_tokens": 8192,
    "workload": {"num_requests": 24, "arrival": {"kind": "poisson", "rate_per_s": 3.0},
                 "prompt_tokens": {"kind": "uniform", "low": 16, "high": 400},
                 "output_tokens": {"kind": "uniform", "low": 2, "high": 60}, "max_tokens": 512},
    "cost": {"kind": "linear", "base_s": TRUE_BASE_S, "per_token_s": 5e-5,
             "per_context_token_s": 2e-7,
             "overhead": {"per_iteration_s": 0.001, "per_sequence_s": 1e-4,
                          "per_prefill_token_s": 1e-6, "tensor_parallel_per_iteration_s": 0.0}},
    "systems": [{"name": "vllm", "scheduler": {"kind": "paged", "policy": "prefill_first",
                                               "max_num_seqs": 32, "max_num_batched_tokens": 1024}},
                {"name": "ft", "scheduler": {"kind": "request_level", "max_batch_size": 8}}],
}
COLUMNS = ["arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "tpot_s", "e2e_s"]


def _write_log(path: Path, system: str = "vllm") -> Path:
    """A 'real' log made by the simulator itself, with the scenario's own cost."""
    path.parent.mkdir(parents=True, exist_ok=True)
    run_scenario(scenario_from_dict(SCENARIO)).systems[system].requests[COLUMNS].to_csv(
        path, index=False)
    return path


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def test_a_metric_at_zero_in_the_log_is_left_out_of_the_loss() -> None:
    # Request-level serving returns whole responses: TPOT is 0 for every request.
    real = pd.DataFrame({"ttft_s": [1.0, 2.0, 3.0], "tpot_s": [0.0] * 3, "e2e_s": [1.0, 2.0, 3.0]})
    sim = real.assign(ttft_s=real["ttft_s"] * 2.0, e2e_s=real["e2e_s"] * 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value encountered in scalar divide"
        errors = log_errors(sim, real)
    # TTFT and E2E, 5 percentiles and the mean each; TPOT has no log-ratio and no entry.
    np.testing.assert_array_equal(errors, np.full(12, np.log(2.0)))


def test_a_request_level_log_fits_a_searched_coefficient(tmp_path: Path) -> None:
    log = _write_log(tmp_path / "ft.csv", "ft")
    assert (pd.read_csv(log)["tpot_s"].dropna() == 0).all()
    start = with_cost(scenario_from_dict(SCENARIO), {"base_s": TRUE_BASE_S / 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = fit(start, read_logs([log]), "ft", ("base_s",), survey_points=8)
    assert np.isfinite(result.loss)
    assert result.parameters["base_s"] == pytest.approx(TRUE_BASE_S, rel=FIT_RTOL)


def test_a_tpot_only_log_leaves_the_linear_terms_to_the_search(tmp_path: Path) -> None:
    # Least squares fits TTFT and E2E; with neither measured it has no rows (it used to fail
    # with numpy's "zero-size array to reduction operation maximum").
    full = pd.read_csv(_write_log(tmp_path / "full.csv"))
    log = tmp_path / "tpot.csv"
    full[["arrival_s", "prompt_tokens", "output_tokens", "tpot_s"]].to_csv(log, index=False)
    start = {"overhead.per_sequence_s": 3e-4}
    assert solve_linear(scenario_from_dict(SCENARIO), read_logs([log]), "vllm",
                        list(start), start, None) == start


def test_a_loss_over_no_metric_is_an_error_not_nan(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    # A simulation that measures nothing the log does: the loss would be a mean of nothing.
    logs = read_logs([_write_log(tmp_path / "run.csv")])
    nothing = logs[0].real.assign(arrival_s=0.0, ttft_s=np.nan, tpot_s=np.nan, e2e_s=np.nan)
    monkeypatch.setattr("calibrate.logs.simulate", lambda *args: nothing)
    objective = Objective(scenario_from_dict(SCENARIO), logs, "vllm", ("base_s",), None)
    with pytest.raises(ScenarioError, match="--system vllm: simulates none of the latencies"):
        objective(np.log([TRUE_BASE_S]))


def test_a_log_with_no_positive_latency_is_refused(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    log = tmp_path / "zero.csv"
    log.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,tpot_s,e2e_s\n"
                   "0,10,5,0,0,0\n1,10,5,0,0,0\n")
    assert main(["logs", str(log), "--scenario", str(_scenario(tmp_path)),
                 "--out", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: log {log}: no ttft_s, tpot_s or e2e_s above 0; expected measured "
                   "latencies to fit to\n"), err


def test_a_log_measured_only_before_the_warm_up_is_refused(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """The loss compares the requests after the warm-up: with none measured there, the
    fit said the system "simulates none of the latencies the logs measure"."""
    log = tmp_path / "early.csv"
    log.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,tpot_s,e2e_s\n"
                   "0,10,5,0.1,0.02,0.18\n1,10,5,,,\n2,10,5,,,\n")
    assert main(["logs", str(log), "--scenario", str(_scenario(tmp_path)), "--set", "warmup_s=0.5",
                 "--out", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: log {log}: no request arriving from warmup_s = 0.5 s on (counted from "
                   "its first request) has a ttft_s, tpot_s or e2e_s; the last measured one "
                   "arrives at 0 s: expected warmup_s at most 0\n"), err


def test_logs_that_share_a_stem_keep_their_folders_in_the_report(tmp_path: Path) -> None:
    """The report's errors are keyed by the logs' names (`fit`'s `{log.name: ...}`): the
    report kept one of two logs named `run`."""
    logs = [_write_log(tmp_path / folder / "run.csv") for folder in ("a", "b")]
    assert [log.name for log in read_logs(logs)] == ["a/run", "b/run"]


def test_a_misspelt_fit_name_lists_the_overhead_terms_of_a_cost_without_one(
    tmp_path: Path, capsys,  # noqa: ANN001
) -> None:
    """Every kind takes an overhead, fitted from its defaults where the scenario gives none:
    the list named base_s, per_token_s and per_context_token_s alone."""
    data = {**SCENARIO, "cost": {k: v for k, v in SCENARIO["cost"].items() if k != "overhead"}}
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(data))
    assert main(["logs", str(tmp_path / "absent.csv"), "--scenario", str(scenario), "--out",
                 str(tmp_path / "c.yaml"), "--fit", "per_iteration_s"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: --fit per_iteration_s: not a field of the scenario's cost (kind "
                   "linear); expected one of its coefficients base_s, per_token_s, "
                   "per_context_token_s, overhead.per_iteration_s, overhead.per_sequence_s, "
                   "overhead.per_prefill_token_s, overhead.tensor_parallel_per_iteration_s, "
                   "overhead.launch_per_layer_s, overhead.request_latency_s\n"), err


def test_a_log_given_twice_is_refused_before_reading(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    log = tmp_path / "absent.csv"
    handler = signal.getsignal(signal.SIGTERM)
    assert main(["logs", str(log), str(log), "--scenario", str(_scenario(tmp_path)),
                 "--out", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: log {log}: given twice; expected each run once\n", err
    assert signal.getsignal(signal.SIGTERM) == handler  # main leaves its caller's handler


@pytest.mark.parametrize(("value", "message"), [
    ("", "--fit '': no coefficient named; expected one or more dotted paths inside `cost`, "
         "comma-separated (e.g. overhead.per_iteration_s)"),
    (" , ", "--fit ' , ': no coefficient named; expected one or more dotted paths inside `cost`, "
            "comma-separated (e.g. overhead.per_iteration_s)"),
    ("base_s,per_token_s,base_s", "--fit 'base_s,per_token_s,base_s': base_s given twice; "
                                  "expected each coefficient once"),
])
def test_a_bad_fit_list_is_one_line_naming_fit(tmp_path: Path, capsys, value: str,  # noqa: ANN001
                                                message: str) -> None:
    # The log does not exist: --fit is refused before anything is read or fitted.
    assert main(["logs", str(tmp_path / "absent.csv"), "--scenario", str(_scenario(tmp_path)),
                 "--out", str(tmp_path / "c.yaml"), "--fit", value]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_sigterm_during_a_fit_is_an_interrupt(tmp_path: Path) -> None:
    log = _write_log(tmp_path / "run.csv")
    out = tmp_path / "cost.yaml"
    # The fit sends itself SIGTERM: deterministic, where a timer could hit the imports.
    script = (
        "import os, signal, sys, time\n"
        "import calibrate.logs\n"
        "def fit(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
        "calibrate.logs.fit = fit\n"
        "from calibrate.__main__ import main\n"
        f"sys.exit(main(['logs', {str(log)!r}, '--scenario', {str(_scenario(tmp_path))!r}, "
        f"'--out', {str(out)!r}, '--no-leave-one-out']))\n")  # one log: no warning
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parent.parent, env=os.environ.copy())
    assert (done.returncode, done.stderr) == (130, "interrupted; nothing was left half-written\n")
    assert not out.exists()


@pytest.mark.parametrize(("argv", "phrase"), [
    (["logs", "x.csv", "--scenario", "s.yaml", "--out", "c.yaml", "--format", "xml"],
     "python -m calibrate logs: argument --format: invalid choice: 'xml'"),
    ([], "python -m calibrate: the following arguments are required"),
], ids=["a format without latencies", "no command"])
def test_a_command_line_that_does_not_parse_is_one_line(argv: list[str], phrase: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """argparse printed its usage block first; --format listed five trace formats."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.startswith(f"error: {phrase}") and err.count("\n") == 1, err


@pytest.mark.parametrize("out, phrase", [
    ("{log}", "is an input of this command; expected another path for the cost YAML "
              "(--force never replaces an input)"),
    ("{scenario}", "is an input of this command"),
    ("{log}/c.yaml", "{log} is a file, not a folder; expected a path in a folder for the cost YAML"),
])
def test_out_is_checked_against_the_inputs_before_any_work(tmp_path: Path, capsys, out: str,  # noqa: ANN001
                                                           phrase: str) -> None:
    """--force replaced the log or the scenario with the fitted YAML; an --out under a file
    failed after the whole fit, naming neither --out nor what was expected."""
    log, scenario = tmp_path / "run.csv", _scenario(tmp_path)
    log.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s\n0,10,5,0.1\n")
    before = log.read_text(), scenario.read_text()
    target = out.format(log=log, scenario=scenario)
    assert main(["logs", str(log), "--scenario", str(scenario), "--out", target, "--force"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {target}") and err.count("\n") == 1, err
    assert phrase.format(log=log) in err, err
    assert (log.read_text(), scenario.read_text()) == before


def test_out_may_not_be_a_file_the_scenario_reads(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """--force wrote over the profile fit the scenario's cost loads, and the new file then
    loaded itself (a tester's finding)."""
    root = Path(__file__).resolve().parents[1]
    profile = tmp_path / "prof.yaml"
    profile.write_text((root / "calibrate" / "cost_models" / "cpu-tiny.yaml").read_text())
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**SCENARIO, "cost": {"kind": "fitted", "path": "prof.yaml"}}))
    log = tmp_path / "run.csv"
    log.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s\n0,10,5,0.1\n")
    before = profile.read_text()
    assert main(["logs", str(log), "--scenario", str(scenario), "--out", str(profile), "--force"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out {profile} is an input of this command; expected another path " \
                  "for the cost YAML (--force never replaces an input)\n", err
    assert profile.read_text() == before


def test_an_out_folder_that_cannot_be_written_is_one_line_before_the_fit(
        tmp_path: Path, capsys, monkeypatch) -> None:  # noqa: ANN001
    """--out /sys/nope.yaml fitted for seconds, then ended on a PermissionError traceback
    (exit 1 with a stack; a tester's finding). Now refused before the fit, in one line,
    with exit 1: the machine, not the input. As root no chmod stops a write, so the
    folder's refusal is simulated where the command probes it."""
    import errno

    import calibrate.__main__ as cli

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    log = tmp_path / "run.csv"
    log.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s\n0,10,5,0.1\n")
    monkeypatch.setattr(cli.tempfile, "TemporaryFile", read_only)
    assert main(["logs", str(log), "--scenario", str(_scenario(tmp_path)), "--out",
                 str(tmp_path / "out" / "c.yaml")]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: cannot write the cost YAML here: Read-only file system ({tmp_path}); "
                   "nothing was left half-written\n"), err
    assert not (tmp_path / "out").exists()


def test_a_calibrated_cost_finds_its_profile_from_any_folder(tmp_path: Path,
                                                           monkeypatch) -> None:  # noqa: ANN001
    """The written cost kept the scenario's `path: prof.json`, relative to the scenario's
    folder, so a scenario elsewhere loading it failed, or found another prof.json (a
    tester's finding). It is written as a scenario's copy writes its paths: absolute."""
    import shutil

    import yaml

    from orcasim.paths import PACKAGE_DATA_DIR
    from orcasim.scenario import load_scenario

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "scen").mkdir()
    (tmp_path / "out").mkdir()
    shutil.copy(PACKAGE_DATA_DIR / "profiles/distserve/profiler-a100-80g.vllm.json",
                tmp_path / "scen" / "prof.json")
    text = (root / "scenarios/validation/vllm_opt13b_a100.yaml").read_text()
    assert "path: profiles/distserve/profiler-a100-80g.vllm.json" in text
    (tmp_path / "scen" / "s.yaml").write_text(
        text.replace("path: profiles/distserve/profiler-a100-80g.vllm.json", "path: prof.json"))
    log = PACKAGE_DATA_DIR / "ground_truth/distserve_opt13b_a100/vllm-100-1.csv"
    (tmp_path / "log.csv").write_text("".join(log.read_text().splitlines(keepends=True)[:21]))
    monkeypatch.chdir(tmp_path)
    assert main(["logs", "log.csv", "--scenario", "scen/s.yaml", "--out", "out/cost.yaml",
                 "--fit", "overhead.request_latency_s", "--no-leave-one-out"]) == 0
    written = yaml.safe_load((tmp_path / "out" / "cost.yaml").read_text())
    assert written["cost"]["path"] == str(tmp_path / "scen" / "prof.json")
    user = yaml.safe_load((tmp_path / "scen" / "s.yaml").read_text())
    user["cost"] = {"kind": "fitted", "path": "cost.yaml"}
    (tmp_path / "out" / "use.yaml").write_text(yaml.safe_dump(user))
    monkeypatch.chdir(tmp_path / "out")
    load_scenario("use.yaml")  # raised: file 'prof.json' not found


def test_a_workload_setting_is_refused_as_each_log_replaces_it(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    log = _write_log(tmp_path / "run.csv")
    assert main(["logs", str(log), "--scenario", str(_scenario(tmp_path)), "--out",
                 str(tmp_path / "c.yaml"), "--set", "workload.arrival.rate_per_s=100"]) == 2
    assert capsys.readouterr().err == (
        "error: --set workload.arrival.rate_per_s=100: each log gives the workload (its arrivals "
        "and lengths); expected --set on workload.max_tokens, the cost, the scheduler or the "
        "hardware\n")


def test_a_replays_bad_input_names_its_log(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """A request longer than the scenario's max_tokens, in one of two logs: the error did
    not say which."""
    good = _write_log(tmp_path / "good.csv")
    long = tmp_path / "long.csv"
    long.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s\n0,10,5,0.1\n1,500,100,0.2\n")
    assert main(["logs", str(good), str(long), "--scenario", str(_scenario(tmp_path)),
                 "--out", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: log {long}: ") and "max_tokens = 512" in err, err
    # The way out it names: the log keeps the scenario's max_tokens, which --set may raise.
    assert main(["logs", str(good), str(long), "--scenario", str(_scenario(tmp_path)), "--out",
                 str(tmp_path / "c.yaml"), "--set", "workload.max_tokens=1024", "--fit",
                 "overhead.per_iteration_s", "--no-leave-one-out"]) == 0


def test_a_shipped_log_is_recorded_by_its_name_in_orcasim_data(tmp_path: Path) -> None:
    """The committed record held this machine's absolute paths (a tester's note)."""
    from calibrate.logs import recorded_path
    from orcasim.paths import PACKAGE_DATA_DIR, resolve_data_path

    shipped = PACKAGE_DATA_DIR / "ground_truth" / "distserve_opt13b_a100" / "vllm-100-1.csv"
    name = recorded_path(shipped)
    assert name == "ground_truth/distserve_opt13b_a100/vllm-100-1.csv"
    assert resolve_data_path(name) == shipped.resolve()  # found from anywhere
    own = tmp_path / "run.csv"
    assert recorded_path(own) == str(own)


def test_a_term_the_logs_cannot_determine_is_named(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A log of one request gives two timed rows (its TTFT and its decode) for three terms,
    and the fit returned whatever the search stopped at (per_iteration_s +940% on a real run's
    first request) without a word. Now each such term is named; the command still writes."""
    import calibrate.logs

    full = _write_log(tmp_path / "run.csv")
    one = tmp_path / "one.csv"
    pd.read_csv(full).iloc[:1].to_csv(one, index=False)
    scenario = scenario_from_dict(SCENARIO)
    values = calibrate.logs.current_values(scenario, calibrate.logs.DEFAULT_PARAMETERS, "vllm")
    assert calibrate.logs.unidentified_terms(scenario, read_logs([full]), "vllm", values) == []
    said = calibrate.logs.unidentified_terms(scenario, read_logs([one]), "vllm", values)
    # One request alone: every iteration one request, so its share is the iteration's. Its
    # prompt tokens come only in its TTFT: that term is determined.
    assert [s.split(" ")[0] for s in said] == ["overhead.per_iteration_s", "overhead.per_sequence_s"]
    assert said[1].startswith("overhead.per_sequence_s = 0.0001 is not determined by these logs: "
                              "its column in the linear fit is collinear with the other terms' "
                              "(2 timed rows for 3 terms); give more requests"), said[1]
    # What the command says, not how well it fits: the fit is stubbed.
    monkeypatch.setattr(calibrate.logs, "fit", lambda scenario, logs, system, parameters, *a, **kw:
                        calibrate.logs.Fit(values, 0.0, 0))
    with pytest.warns(UserWarning) as record:
        assert main(["logs", str(one), "--scenario", str(_scenario(tmp_path)), "--out",
                     str(tmp_path / "c.yaml"), "--no-leave-one-out"]) == 0
    assert [str(w.message) for w in record] == said


def test_a_poor_fit_says_to_check_the_scenario(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A paged vLLM log fitted with a request-level system came back 100% off (its terms run
    down to 1e-21 s) and the command said nothing; the shipped runs' fits are 2 to 22% off."""
    import calibrate.logs

    log = _write_log(tmp_path / "run.csv")
    scenario = scenario_from_dict(SCENARIO)
    values = calibrate.logs.current_values(scenario, ("base_s",), "ft")
    # What the command says, not how well it fits: the fit is stubbed.
    monkeypatch.setattr(calibrate.logs, "fit", lambda scenario, logs, system, parameters, *a, **kw:
                        calibrate.logs.Fit(values, 0.0, 0, {"run": 1.0}))
    with pytest.warns(UserWarning) as record:
        assert main(["logs", str(log), "--scenario", str(_scenario(tmp_path)), "--out",
                     str(tmp_path / "c.yaml"), "--system", "ft", "--fit", "base_s",
                     "--no-leave-one-out"]) == 0
    assert [str(w.message) for w in record] == [
        "the fit is poor: its median |error| is 100% on run (more than 50%); check that the "
        "scenario's system ft (its scheduler, model, hardware and parallelism) is the engine "
        "that produced the logs"]


def test_a_term_that_changes_nothing_is_named(tmp_path: Path) -> None:
    """A tensor-parallel term on one GPU: the search returned its start (7 ms by default),
    reported as fitted, exit 0. A term the cost uses is not named."""
    scenario = scenario_from_dict(SCENARIO)
    logs = read_logs([_write_log(tmp_path / "run.csv")])
    said = ineffective_terms(scenario, logs, "vllm", {"overhead.tensor_parallel_per_iteration_s": 0.007,
                                                      "base_s": TRUE_BASE_S})
    assert said == ["overhead.tensor_parallel_per_iteration_s = 0.007 changes nothing in these "
                    "logs' simulation (the same loss at half and twice it), so the fit left it "
                    "where it started; expected a coefficient the system's cost uses (a "
                    "tensor-parallel term needs more than one GPU)"]
    assert ineffective_terms(scenario, logs, "vllm", {"overhead.tensor_parallel_per_iteration_s": 0.0}) != []
    assert ineffective_terms(scenario, logs, "vllm", {"overhead.per_iteration_s": 0.0}) == []


@pytest.mark.parametrize("command", ["logs", "fit"])
def test_a_cost_file_named_json_is_refused_before_the_work(tmp_path: Path, capsys,  # noqa: ANN001
                                                           command: str) -> None:
    """A scenario loading it read the YAML as a DistServe profile: 'a DistServe profile needs
    cost.model and cost.tensor_parallel', after a fit of minutes."""
    out = tmp_path / "c.json"
    first = ([str(tmp_path / "absent.csv"), "--scenario", str(_scenario(tmp_path))]
             if command == "logs" else [str(Path(__file__).parents[1] / "calibrate/profiles/cpu-tiny.csv")])
    assert main([command, *first, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: --out {out}: a cost file named .json is read as a "
                                       "DistServe profile; expected a .yaml path\n")
    assert not out.exists()


def test_a_scenario_s_own_sweep_is_not_built_for_a_fit_at_its_base_values(
        tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """The logs are replayed at the base values, so a --set that leaves the own sweep's points
    invalid (a scheduler's kind changed under its swept key) fits, and says the sweep is not
    replayed. The loader's check of every own point (ab14eb0) refused it, where it fitted
    before; loaded with that check off alone, every evaluation rebuilt the points (`with_cost`)
    and refused them again (a reviewer's finding)."""
    log = _write_log(tmp_path / "vllm.csv")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**SCENARIO, "sweep": {
        "parameter": "systems[1].scheduler.max_batch_size", "values": [4, 8]}}))
    paged = "systems[1].scheduler={kind: paged, max_num_seqs: 8, max_num_batched_tokens: 1024}"
    with pytest.warns(UserWarning, match=r"logs_input's own sweep over systems\[1\].scheduler."
                                         "max_batch_size is not replayed"):
        assert main(["logs", str(log), "--scenario", str(scenario), "--set", paged, "--fit",
                     "overhead.per_iteration_s", "--out", str(tmp_path / "cost.yaml")]) == 0
    assert "sweep.values" not in capsys.readouterr().err
