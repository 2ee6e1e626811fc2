"""A scenario's own `sweep:` block: its points, the tidy frame, the bound metric and the CLI output."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from orcasim.config import ScenarioError
from orcasim.metrics import SERVED_FILL_QUANTILE, keeps_up_with, served_rps
from orcasim.run import run_scenario
from orcasim.scenario import Scenario, load_scenario, scenario_from_dict
from orcasim.sweeps import keeps_up, run_scenario_sweep, scenario_sweep, throughput_under_bound
from orcasim.sweeps.table import SUSTAIN_FRACTION
from tests.conftest import make_scenario
from tests.test_cli import orcasim

RATES = [1.0, 2.0, 4.0]
RATE = "workload.arrival.rate_per_s"


def small_sweep(**changes: object) -> Scenario:
    return make_scenario(**{"workload.num_requests": 60, "seed": 11,
                            "sweep": {"parameter": RATE, "values": RATES}, **changes})


def test_a_scenarios_own_sweep_keeps_its_folder_and_its_keys_as_given(tmp_path: Path) -> None:
    """The folder its data paths start from, resolved, and the keys the scenario gave (no
    defaults, no `sweep` block), where a point that changes a kind starts again (mutation
    testing: `None` for either passed every test)."""
    sc = small_sweep()
    sweep = scenario_sweep(sc, tmp_path)
    assert sweep.base_dir == tmp_path.resolve()
    assert {t.base_dir for t in sweep.tasks()} == {str(tmp_path.resolve())}
    assert sweep.given == sc.given_data(frozenset({"sweep"}), exclude_unset=True)
    assert "sweep" not in sweep.given and sweep.given["seed"] == 11


def point_scenarios(sc: Scenario) -> list[Scenario]:
    return [task.scenario() for task in scenario_sweep(sc, Path.cwd()).tasks()]


def test_each_point_sets_the_parameter_on_the_scenarios_own_seed() -> None:
    tasks = scenario_sweep(small_sweep(), Path.cwd()).tasks()
    assert [t.params for t in tasks] == [{RATE: r} for r in RATES]
    points = [t.scenario() for t in tasks]
    assert [p.workload.arrival.rate_per_s for p in points] == RATES
    assert [p.seed for p in points] == [11] * len(RATES)
    assert all(p.sweep is None for p in points)


def test_a_bad_value_names_the_point_before_any_runs() -> None:
    with pytest.raises(ScenarioError, match=r"^scenario: sweep.values\[1\] = -1: workload.arrival.rate_per_s = -1"):
        small_sweep(**{"sweep.values": [1.0, -1]})


def test_a_value_must_fit_one_table_column() -> None:
    with pytest.raises(ScenarioError, match=r"sweep.values\[0\] = \{.*expected a number, string or boolean"):
        small_sweep(**{"sweep": {"parameter": "workload.arrival", "values": [{"kind": "poisson", "rate_per_s": 1}]}})


@pytest.mark.parametrize(("block", "message"), [
    ({"parameter": RATE, "values": [1, "2"]},
     "sweep.values = [1, '2']: mixes number and text values; expected values of one type"),
    ({"parameter": "workload.num_requests", "values": [10, 10**20]},
     "sweep.values[1] = 100000000000000000000: beyond a 64-bit integer"),
    ({"parameter": "workload..rate_per_s", "values": [1, 2]},
     "sweep.parameter = 'workload..rate_per_s': a malformed path; expected names joined by dots"),
])
def test_a_blocks_values_and_path_are_refused_in_its_own_keys(block: dict, message: str) -> None:
    """Refused in the words of the sweep file the block becomes (`quickstart: sweep:
    grid.parameters.... = ...`, keys the block does not have) or of an override
    (`override path ... is malformed`, naming neither file nor key): a tester's finding."""
    with pytest.raises(ScenarioError) as refused:
        small_sweep(sweep=block)
    assert message in str(refused.value)
    assert "grid" not in str(refused.value) and "override" not in str(refused.value)


def test_a_seed_sweep_is_refused_in_the_block_s_own_keys() -> None:
    """It named `grid.parameters.seed` and `replications`, keys a scenario's sweep block does
    not have (a tester's low finding)."""
    with pytest.raises(ScenarioError, match=r"sweep.parameter = 'seed': a scenario's sweep runs "
                                            "every point on its seed"):
        small_sweep(**{"sweep": {"parameter": "seed", "values": [1, 2]}})


SWEEP_OVERRIDES_CLI_REFUSES = [
    ("sweep={parameter: workload.arrival.rate_per_s, values: [1, -2]}",
     "sweep.values[1] = -2: workload.arrival.rate_per_s = -2: Input should be greater than 0"),
    ("sweep={parameter: kv_capacity_tokens, values: [100000, 20]}",
     "sweep.values[1] = 20: workload.max_tokens = 640 exceeds kv_capacity_tokens = 20"),
    ("sweep={parameter: 'systems[1].scheduler.max_batch_size', values: [8, 0]}",
     "sweep.values[1] = 0: systems[1].scheduler.max_batch_size = 0: Input should be greater than 0"),
    ("sweep={parameter: seed, values: [1, 2]}",
     "sweep.parameter = 'seed': a scenario's sweep runs every point on its seed"),
]


@pytest.mark.parametrize(("override", "message"), SWEEP_OVERRIDES_CLI_REFUSES)
def test_the_loader_refuses_a_sweep_block_the_cli_refuses(override: str, message: str) -> None:
    """`orcasim validate` and `orcasim run` build every point of a scenario's own sweep
    before any runs and refuse a bad one; `load_scenario` and `scenario_from_dict` accepted
    it, and `run_scenario` then ran the base values of a file the CLI refuses (found
    comparing what `validate` checks after loading with what the loader checks)."""
    quickstart = Path(__file__).parent.parent / "scenarios" / "quickstart.yaml"
    cli = orcasim("validate", str(quickstart), "--set", "workload.num_requests=50", "--set", override)
    assert cli.returncode == 2 and message in cli.stderr + cli.stdout
    with pytest.raises(ScenarioError) as loaded:
        load_scenario(quickstart, ["workload.num_requests=50", override])
    assert message in str(loaded.value)
    with pytest.raises(ScenarioError) as ran:
        run_scenario(quickstart, ["workload.num_requests=50", override])
    assert message in str(ran.value)


def test_a_derived_kv_capacity_is_derived_again_at_each_point() -> None:
    sc = small_sweep(**{"kv_capacity_tokens": None, "model": "llama2-7b", "hardware": {"gpu": "a100-40gb"},
                        "sweep": {"parameter": "hardware.gpu", "values": ["a100-40gb", "a100-80gb"]}})
    caps = [p.kv_capacity_tokens for p in point_scenarios(sc)]
    assert caps[0] < caps[1]


def test_run_is_one_row_per_system_and_point_with_the_offered_load() -> None:
    frame = run_scenario_sweep(small_sweep(), Path.cwd())
    assert len(frame) == 2 * len(RATES)
    assert set(frame["system"]) == {"request-level", "orca"}
    assert list(frame[RATE].unique()) == RATES
    assert {"offered_rps", "throughput_rps", "normalized_latency_s_per_token_p50"} <= set(frame.columns)
    # Each point is a plain run of the scenario at that value: same requests, same numbers.
    plain = run_scenario(point_scenarios(small_sweep())[1]).systems["orca"].summary
    row = frame[(frame[RATE] == RATES[1]) & (frame["system"] == "orca")].iloc[0]
    assert row["throughput_rps"] == plain["throughput_rps"]


def test_throughput_under_bound_is_the_best_point_within_it() -> None:
    frame = pd.DataFrame({
        "system": ["a", "a", "a", "b"], RATE: [1, 2, 3, 1],
        "throughput_rps": [1.0, 2.0, 2.5, 0.5], "normalized_latency_s_per_token_p50": [0.1, 0.15, 0.3, 0.5],
        "offered_rps": [1.0, 2.0, 3.0, 0.5],
    })
    best = throughput_under_bound(frame, 0.2)
    assert best["a"] == 2.0 and pd.isna(best["b"])
    overloaded = frame.assign(offered_rps=[1.0, 4.0, 3.0, 0.5])  # at 2.0 it falls behind a 4.0 load
    assert throughput_under_bound(overloaded, 0.2)["a"] == 1.0


def test_throughput_under_bound_says_when_it_mixes_configurations() -> None:
    """Rate x batch size: a system's answer is its best over both batch sizes, said so."""
    frame = pd.DataFrame({
        "point": [0, 1, 2, 3], "replication": 0, "seed": 0, RATE: [1, 2, 1, 2],
        "scheduler.max_batch_size": [4, 4, 8, 8], "system": "a",
        "throughput_rps": [1.0, 1.5, 1.0, 2.0], "normalized_latency_s_per_token_p50": 0.1,
        "offered_rps": [1.0, 1.5, 1.0, 2.0],
    })
    with pytest.warns(UserWarning, match=r"varies .*max_batch_size"):
        assert throughput_under_bound(frame, 0.2)["a"] == 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one configuration: nothing to say
        assert throughput_under_bound(frame[frame["scheduler.max_batch_size"] == 4], 0.2)["a"] == 1.5


@pytest.mark.slow
def test_cli_run_of_a_sweep_writes_csv_and_figure(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(Path("scenarios/quickstart.yaml").read_text()
                        + "sweep: {parameter: workload.arrival.rate_per_s, values: [1, 3]}\n")
    out = tmp_path / "out"
    p = orcasim("run", str(scenario), "--out", str(out), "--set", "workload.num_requests=100")
    assert p.returncode == 0, p.stderr
    frame = pd.read_csv(out / "sweep.csv")
    assert len(frame) == 4 and list(frame[RATE].unique()) == [1, 3]
    assert (out / "latency_vs_throughput.png").is_file() and (out / "scenario.yaml").is_file()
    (out / "latency_vs_throughput.png").unlink()
    replot = orcasim("plot", str(out))  # the same figure, by the same name
    assert replot.returncode == 0, replot.stderr
    assert replot.stdout.split() == [str(out / "latency_vs_throughput.png")]


def test_validate_says_the_points_of_a_sweep_block(tmp_path: Path) -> None:
    """It said 'ok (2000 requests, 2 systems)' of a scenario that runs as a sweep of points."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(Path("scenarios/quickstart.yaml").read_text()
                        + "sweep: {parameter: workload.arrival.rate_per_s, values: [1, 3]}\n")
    p = orcasim("validate", str(scenario), "--set", "workload.num_requests=100")
    assert p.returncode == 0, p.stderr
    assert p.stdout == (f"{scenario}: ok (100 requests, 2 systems; sweep: 2 points of "
                        "workload.arrival.rate_per_s)\n")


@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_set_on_the_swept_key_is_refused_not_dropped(tmp_path: Path, command: str) -> None:
    """--set workload.arrival.rate_per_s=3 on a scenario sweeping that rate ran the block's
    rates without a word (exit 0), and validate said ok, where a sweep file's grid refuses it
    (a tester's finding)."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(Path("scenarios/quickstart.yaml").read_text()
                        + "sweep: {parameter: workload.arrival.rate_per_s, values: [1, 3]}\n")
    p = orcasim(command, str(scenario), "--out" if command == "run" else "--set",
                str(tmp_path / "out") if command == "run" else "workload.num_requests=100",
                "--set", "workload.arrival.rate_per_s=3")
    assert p.returncode == 2, p.stdout
    assert p.stderr == ("error: --set 'workload.arrival.rate_per_s=3': its sweep block sets "
                        "workload.arrival.rate_per_s at every point, so this value would never be "
                        "used; expected it in its sweep block's values, or a key its sweep block "
                        "does not sweep (with --set sweep=null, the value given runs alone)\n")
    assert not (tmp_path / "out").exists()


def test_a_saturated_closed_loop_offers_what_it_completes() -> None:
    # 128 clients of a saturated server, thinking 0.1 s: all send at time 0, then one
    # request per completion. Counting the 128 first sends as a rate offered far more than
    # a server that cannot fall behind its clients completes (in scenarios/closed_loop.yaml
    # at 300 requests, 9.8 req/s against 6.1), and the keeps-up test (90%) dropped the row.
    sc = make_scenario(**{"workload.num_requests": 300, "seed": 1, "kv_capacity_tokens": 100000,
                          "workload.arrival": {"kind": "closed_loop", "num_clients": 128,
                                               "think_time": {"kind": "exponential", "mean_s": 0.1}},
                          "sweep": {"parameter": "workload.arrival.num_clients", "values": [128]}})
    frame = run_scenario_sweep(sc, Path.cwd())
    ratio = frame["throughput_rps"] / frame["offered_rps"]
    assert ratio.between(0.95, 1.05).all(), frame[["system", "offered_rps", "throughput_rps"]]
    assert throughput_under_bound(frame, float("inf")).notna().all()


@pytest.mark.parametrize("kind", ["conversations", "agents"])
def test_fixed_sessions_offer_what_they_complete(kind: str) -> None:
    """64 sessions of three steps, 32 or 64 at once, no pause, on Orca with batches of 4: all
    of their first calls go out at time 0 (an agent's fan-out of 2 sends two a step), then
    one per answer. Counting the first ones as a rate read 0.83 and 0.64 of it completed (a
    tester's find) and the keeps-up test dropped rows of a loop that cannot fall behind."""
    steps = {"kind": "constant", "value": 3}
    arrival = {"kind": kind, "num_sessions": 64, "concurrent_sessions": 32,
               "output_tokens": {"kind": "uniform", "low": 8, "high": 32},
               "max_context_tokens": 1024}
    if kind == "conversations":
        arrival |= {"turns": steps, "user_tokens": {"kind": "uniform", "low": 32, "high": 128},
                    "think_time": {"kind": "constant", "value_s": 0.0}}
    else:
        arrival |= {"steps": steps, "observation_tokens": {"kind": "uniform", "low": 32, "high": 128},
                    "tool_time": {"kind": "constant", "value_s": 0.0},
                    "fan_out": {"branches": 2, "wait_for": 2}}
    sc = make_scenario(**{"workload": {"max_tokens": 2048, "arrival": arrival},
                          "kv_capacity_tokens": 100000,
                          "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level",
                                                                     "max_batch_size": 4}}],
                          "sweep": {"parameter": "workload.arrival.concurrent_sessions",
                                    "values": [32, 64]}})
    frame = run_scenario_sweep(sc, Path.cwd())
    ratio = frame["throughput_rps"] / frame["offered_rps"]
    assert ratio.between(SUSTAIN_FRACTION, 1.1).all(), frame[["offered_rps", "throughput_rps"]]
    assert throughput_under_bound(frame, float("inf"))["orca"] == frame["throughput_rps"].max()


def test_every_request_sent_at_once_offers_no_rate_and_keeps_up() -> None:
    """A closed loop of as many clients as requests sends them all at time 0: no rate is
    offered after them (NaN), and such a row is not dropped as falling behind."""
    frame = pd.DataFrame({"system": ["a", "a"], "throughput_rps": [3.0, 5.0],
                          "normalized_latency_s_per_token_p50": [0.1, 0.1],
                          "offered_rps": [3.0, float("nan")]})
    assert throughput_under_bound(frame, 0.2)["a"] == 5.0


def test_the_keeps_up_test_reads_completions_while_requests_arrive() -> None:
    """By hand, 100 requests at 1 req/s. A server that keeps up, each request 30 s: the
    throughput's window runs to the last finish, 100 / 129 s, 0.78 of the load, and the row
    failed; its completions from 30 s (the p90 latency) to the last arrival, 70 in 69 s,
    read the load. A server of 0.8 req/s, busy from the first arrival on, reads its own rate."""
    arrival_s = np.arange(100.0)
    kept = arrival_s + 30.0
    assert served_rps(arrival_s, kept) == pytest.approx(70 / 69)
    behind = 1.0 + 1.25 * arrival_s  # request k done at 1 + k / 0.8
    start_s = float(np.quantile(behind - arrival_s, SERVED_FILL_QUANTILE))
    in_window = np.count_nonzero((behind >= start_s) & (behind <= 99.0))
    assert served_rps(arrival_s, behind) == pytest.approx(in_window / (99.0 - start_s))
    assert 0.78 < served_rps(arrival_s, behind) < 0.82
    assert np.isnan(served_rps(arrival_s, arrival_s + 200.0))  # no longer than its latency
    frame = pd.DataFrame({"system": ["kept", "behind", "short"], "offered_rps": 1.0,
                          "throughput_rps": [100 / 129, 100 / 124.75, 100 / 299],
                          "served_rps": [70 / 69, served_rps(arrival_s, behind), np.nan],
                          "normalized_latency_s_per_token_p50": 0.1})
    best = throughput_under_bound(frame, 1.0)
    assert best["kept"] == 100 / 129 and best.drop("kept").isna().all()
    assert throughput_under_bound(frame.drop(columns="served_rps"), 1.0).isna().all()  # as before


def test_one_keeps_up_rule_for_sweeps_and_capacity_searches() -> None:
    """`keeps_up_with` is the rule both read (sweeps' rows, capacity's runs, which were two
    copies until 2026-12-06): served at least 0.9 of offered, on numbers as on a Series; no
    rate offered keeps up, nothing served does not (each caller says what stands in)."""
    nan = float("nan")
    assert keeps_up_with(10.0, 9.0) is True and keeps_up_with(10.0, 8.99) is False
    assert keeps_up_with(nan, 0.0) is True and keeps_up_with(10.0, nan) is False
    offered = pd.Series([10.0, 10.0, nan, 10.0])
    served = pd.Series([9.0, 8.99, 1.0, nan])
    assert keeps_up_with(offered, served).tolist() == [True, False, True, False]
    frame = pd.DataFrame({"offered_rps": offered, "served_rps": served,
                          "throughput_rps": [1.0, 1.0, 1.0, 9.5]})
    # A sweep's row reads its throughput where it measured no served rate.
    assert keeps_up(frame).tolist() == [True, False, True, True]


def test_a_short_run_of_a_fleet_that_keeps_up_keeps_up(tmp_path: Path) -> None:
    """8 paged replicas of routers.yaml (about 50 req/s in all) over 400 requests at 22
    req/s, not saturated: throughput 0.62 of the load (a drain of 8 s after 18 s of
    arrivals), so the keeps-up test dropped the row; its served rate reads the load."""
    scenario = load_scenario(Path(__file__).parents[1] / "scenarios/cluster/routers.yaml", [
        "workload.num_requests=400", "warmup_s=0", "workload.arrival.rate_per_s=22",
        "systems=[{name: rr, scheduler: {kind: paged, max_num_seqs: 64, max_num_batched_tokens: "
        "4096}, cluster: {replicas: 8, router: {kind: round_robin}}}]",
        "sweep={parameter: workload.arrival.rate_per_s, values: [22]}"])
    frame = run_scenario_sweep(scenario, Path.cwd())
    row = frame.iloc[0]
    assert row["saturated"] == 0 and row["throughput_rps"] < 0.7 * row["offered_rps"]
    assert row["served_rps"] == pytest.approx(row["offered_rps"], rel=0.1)
    assert throughput_under_bound(frame, float("inf"))["rr"] == row["throughput_rps"]


def test_throughput_under_bound_names_a_table_or_bound_it_cannot_read() -> None:
    """From a notebook, a run's summary_frame() (no 'system' or 'offered_rps' column)
    raised KeyError 'offered_rps' inside, a bound given as text "Invalid comparison between
    dtype=float64 and str", and a negative bound returned NaN for every system (found
    testing the Python API)."""
    summary = pd.DataFrame({"throughput_rps": [1.0], "normalized_latency_s_per_token_p50": [0.1]},
                           index=["a"])
    with pytest.raises(ScenarioError, match=r"^table: no column 'system', 'offered_rps'; expected "
                                            r"a sweep's tidy table"):
        throughput_under_bound(summary, 0.2)
    with pytest.raises(ScenarioError, match=r"^table: no column 'offered_rps'"):
        keeps_up(summary)
    frame = summary.assign(system="a", offered_rps=1.0)
    for bound in ("0.2", -1.0, float("nan")):
        with pytest.raises(ScenarioError, match=r"^bound_s = .*: expected a positive number"):
            throughput_under_bound(frame, bound)  # type: ignore[arg-type]
    assert throughput_under_bound(frame, 0.2)["a"] == 1.0

def test_a_request_turned_away_as_never_fitting_is_no_load_to_keep_up_with() -> None:
    """A paged server at 2 req/s (0.01 s iterations) with KV for 400 tokens rejects 130 of
    400 quickstart-like requests as never fitting: it completed 1.35 of its 2.02 req/s while
    they arrived, and the row failed the keeps-up test at any load; the rest, 1.36 req/s, it
    served as they came."""
    sc = scenario_from_dict({
        "name": "rejects", "seed": 1,
        "workload": {"num_requests": 400, "arrival": {"kind": "poisson", "rate_per_s": 2.0},
                     "prompt_tokens": {"kind": "uniform", "low": 32, "high": 512},
                     "output_tokens": {"kind": "uniform", "low": 1, "high": 128},
                     "max_tokens": 640},
        "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 2e-5,
                 "per_context_token_s": 1e-7},
        "kv_capacity_tokens": 400,
        "systems": [{"name": "p", "scheduler": {"kind": "paged", "max_num_seqs": 8,
                                                "max_num_batched_tokens": 2048}}],
        "sweep": {"parameter": "workload.arrival.rate_per_s", "values": [2.0]}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the rejections, said
        frame = run_scenario_sweep(sc, Path.cwd())
    row = frame.iloc[0]
    assert row["requests_rejected"] == 130 and row["served_rps"] < 0.7 * row["offered_rps"]
    assert keeps_up(frame).all()
    assert throughput_under_bound(frame, float("inf"))["p"] == row["throughput_rps"]


@pytest.mark.parametrize(("changes", "refusal"), [
    ({"sweep": {"parameter": "warmup_s", "values": [0, 100000]}},
     "sweep point p0001-r00 (warmup_s=100000): warmup_s = 100000 is past the last arrival"),
    ({"systems": [{"name": "p", "scheduler": {"kind": "paged", "max_num_seqs": 4}}],
      "workload.prompt_tokens": {"kind": "uniform", "low": 600, "high": 700},
      "workload.max_tokens": 800, "kv_capacity_tokens": 1024,
      "sweep": {"parameter": "kv_capacity_tokens", "values": [1024, 512]}},
     "sweep point p0001-r00 (kv_capacity_tokens=512): p: every request is too large for its "
     "KV memory"),
], ids=["warm-up", "KV fit"])
def test_run_scenario_refuses_a_sweep_point_as_validate_does(tmp_path: Path, changes: dict[str, Any],
                                                              refusal: str) -> None:
    """`run_scenario(path)` on a scenario whose own sweep has a point that cannot run (its
    warm-up past its last arrival, no request fitting its KV) ran the base values as if
    nothing were wrong; `orcasim validate` refused it. Both now check with
    `orcasim.run.check_runs`, in the same words."""
    from typer.testing import CliRunner

    from orcasim.cli import app

    path = tmp_path / "s.yaml"
    data = small_sweep(**changes).given_data()
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ScenarioError) as refused:
        run_scenario(path)
    assert str(refused.value).startswith(refusal)
    validated = CliRunner().invoke(app, ["validate", str(path)])
    assert (validated.exit_code, validated.output) == (2, f"error: {refused.value}\n")
