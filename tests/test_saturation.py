"""Saturation is never silent: an unstable queue is flagged, a stable or recovering one is not.

M/D/1: one request at a time (max_batch_size 1, one output token, a constant prompt), so
every request is one iteration of a fixed time and rho = rate x service time exactly.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from orcasim import run_scenario
from orcasim.saturation import (
    SATURATION_Z,
    behind_at_constant_rate,
    grew,
    in_system_text,
    in_system_window_is_short,
    judged,
    saturation,
    saturation_text,
    waiting_count,
    waiting_saturation,
)
from orcasim.scenario import scenario_from_dict
from tests.conftest import BIG_RUNNING_SET, make_scenario

SERVICE_S = 1.0
SEEDS = range(10)
REQUESTS = 2000  # z near 6 at rho = 1.2 (see orcasim.saturation on power)


def md1(rho: float, seed: int, arrival: dict | None = None, **changes: object):
    sc = make_scenario(**{
        "seed": seed,
        "workload.num_requests": REQUESTS,
        "workload.arrival": arrival or {"kind": "poisson", "rate_per_s": rho / SERVICE_S},
        "workload.prompt_tokens": {"kind": "constant", "value": 10},
        "workload.output_tokens": {"kind": "constant", "value": 1},
        "cost": {"kind": "linear", "base_s": SERVICE_S, "per_token_s": 0.0},
        "systems": [{"name": "md1", "scheduler": {"kind": "iteration_level", "max_batch_size": 1}}],
        **changes,
    })
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_scenario(sc).systems["md1"]


@pytest.mark.parametrize("seed", SEEDS)
def test_md1_overloaded_is_flagged(seed: int) -> None:
    summary = md1(1.2, seed).summary
    assert summary["saturated"] == 1.0, summary
    # The evidence: arrivals outpace admissions by about rho - 1 of the service rate.
    assert summary["saturation_arrival_rps"] > summary["saturation_admission_rps"]
    assert summary["saturation_admission_rps"] == pytest.approx(1 / SERVICE_S, rel=0.01)


@pytest.mark.parametrize("seed", SEEDS)
def test_md1_stable_is_not_flagged(seed: int) -> None:
    summary = md1(0.8, seed).summary
    assert summary["saturated"] == 0.0, summary
    assert summary["saturation_z"] < SATURATION_Z / 3


def test_an_overloaded_run_warns() -> None:
    sc = make_scenario(**{"workload.num_requests": REQUESTS,
                          "workload.arrival": {"kind": "poisson", "rate_per_s": 1.2},
                          "workload.prompt_tokens": {"kind": "constant", "value": 10},
                          "workload.output_tokens": {"kind": "constant", "value": 1},
                          "cost": {"kind": "linear", "base_s": 1.0, "per_token_s": 0.0},
                          "systems": [{"name": "md1", "scheduler": {"kind": "iteration_level",
                                                                    "max_batch_size": 1}}]})
    with pytest.warns(UserWarning, match="md1: saturated: the waiting queue grew by"):
        run_scenario(sc)


def burst_trace(path: Path, rng: np.random.Generator) -> Path:
    """Poisson at rho = 0.5 for 1,000 requests, with 150 extra arriving within 10 s at 60%
    of the window: the queue jumps by over a hundred and drains long before the end."""
    gaps = rng.exponential(SERVICE_S / 0.5, size=1000)
    arrival = np.cumsum(gaps)
    burst = arrival[-1] * 0.6 + rng.uniform(0, 10, size=150)
    arrival_s = np.sort(np.concatenate([arrival, burst]))
    frame = pd.DataFrame({"arrival_s": arrival_s, "prompt_tokens": 10, "output_tokens": 1})
    frame.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("seed", range(3))
def test_a_burst_that_drains_is_not_flagged(tmp_path: Path, seed: int) -> None:
    trace = burst_trace(tmp_path / "burst.csv", np.random.default_rng(seed))
    system = md1(0.5, seed, arrival={"kind": "trace", "path": str(trace)},
                 **{"workload.num_requests": None, "workload.prompt_tokens": None,
                    "workload.output_tokens": None})
    reqs = system.requests
    peak = waiting_count(reqs["arrival_s"].to_numpy(), reqs["first_scheduled_s"].to_numpy(),
                         reqs["arrival_s"].to_numpy()).max()
    assert peak > 100  # the burst did overload the server for a while
    assert system.summary["saturated"] == 0.0, system.summary


def test_waiting_count_by_hand() -> None:
    arrival = np.array([0.0, 1.0, 2.0, 3.0])
    scheduled = np.array([0.0, 2.5, 2.0, np.inf])  # the last never ran
    t = np.array([0.0, 1.0, 2.0, 2.5, 3.0, 9.0])
    assert waiting_count(arrival, scheduled, t).tolist() == [0, 1, 1, 0, 1, 1]


def test_a_linear_backlog_reads_its_growth() -> None:
    """Arrivals every second, admissions every two: the queue grows by 0.5 a second, so the
    growth over the last three quarters of a 1,000 s window is 375 requests (within a step)."""
    n = 1001
    arrival = np.arange(n, dtype=np.float64)
    scheduled = 2.0 * np.arange(n, dtype=np.float64)
    reqs = pd.DataFrame({"arrival_s": arrival, "first_scheduled_s": scheduled})
    out = waiting_saturation(reqs)
    assert out["saturation_growth_requests"] == pytest.approx(375.0, abs=1.5)
    # The span [250, 1000] holds arrivals 250..1000 and admissions 250, 252, .., 1000, ends included.
    assert out["saturation_arrival_rps"] == 751 / 750
    assert out["saturation_admission_rps"] == 376 / 750
    assert grew(out["saturation_z"])


def test_the_fewest_arrivals_judged_and_a_run_with_no_span() -> None:
    """Arrivals at 0..26 s: the span from 6.5 s holds exactly MIN_ARRIVALS (20), enough."""
    reqs = pd.DataFrame({"arrival_s": np.arange(27.0), "first_scheduled_s": np.arange(27.0)})
    assert np.isfinite(waiting_saturation(reqs)["saturation_z"])
    assert np.isnan(waiting_saturation(reqs.iloc[1:])["saturation_z"])  # 19: too few
    together = pd.DataFrame({"arrival_s": np.full(30, 5.0), "first_scheduled_s": np.full(30, 5.0)})
    assert np.isnan(waiting_saturation(together)["saturation_z"])  # all at once: no span to fit


def test_too_short_a_run_is_not_judged() -> None:
    reqs = pd.DataFrame({"arrival_s": np.arange(10.0), "first_scheduled_s": np.arange(10.0) * 5})
    out = waiting_saturation(reqs)
    assert np.isnan(out["saturation_z"]) and not grew(out["saturation_z"])


EVIDENCE = {"saturated", "saturation_z", "saturation_growth_requests", "saturation_arrival_rps",
            "saturation_admission_rps", "in_system_z", "in_system_growth_requests",
            "in_system_arrival_rps", "in_system_finish_rps"}


def test_the_evidence_is_the_same_on_every_path() -> None:
    short = saturation(pd.DataFrame({"arrival_s": [1.0], "first_scheduled_s": [1.0],
                                     "finish_s": [2.0]}))
    assert set(short) == EVIDENCE and short["saturated"] == 0.0
    assert all(np.isnan(short[k]) for k in EVIDENCE - {"saturated"})
    judged = saturation(running_set_backlog())
    assert set(judged) == EVIDENCE and not any(np.isnan(v) for v in judged.values())


def backlog(n: int = 1001, shift_s: float = 0.0, scale: float = 1.0) -> pd.DataFrame:
    """Arrivals every second, admissions every two (as in the test above), moved and scaled."""
    arrival = shift_s + scale * np.arange(n, dtype=np.float64)
    return pd.DataFrame({"arrival_s": arrival,
                         "first_scheduled_s": shift_s + scale * 2.0 * np.arange(n)})


def test_the_test_is_unchanged_by_where_the_clock_starts_and_its_unit() -> None:
    """Growth and z are counts: the same a day later, or in milliseconds."""
    base = waiting_saturation(backlog())
    for moved in (waiting_saturation(backlog(shift_s=86400.0)), waiting_saturation(backlog(scale=1e-3))):
        assert moved["saturation_growth_requests"] == pytest.approx(base["saturation_growth_requests"])
        assert moved["saturation_z"] == pytest.approx(base["saturation_z"])
        assert grew(moved["saturation_z"])
    ms = waiting_saturation(backlog(scale=1e-3))
    assert ms["saturation_arrival_rps"] == pytest.approx(1000.0, rel=0.01)


def test_rejected_requests_are_not_a_queue() -> None:
    """Requests that never fit KV memory never start: they must not read as a growing queue."""
    stable = pd.DataFrame({"arrival_s": np.arange(400.0), "first_scheduled_s": np.arange(400.0)})
    rejected = pd.DataFrame({"arrival_s": np.linspace(200.0, 399.0, 150),
                             "first_scheduled_s": np.nan})
    frame = pd.concat([stable.assign(rejected=False), rejected.assign(rejected=True)])
    assert not grew(waiting_saturation(frame)["saturation_z"])
    assert grew(waiting_saturation(frame.drop(columns="rejected"))["saturation_z"])  # counted, they would


def test_warmup_drops_the_early_arrivals() -> None:
    """A backlog that formed before the warm-up and drains after it is not a growing queue."""
    burst = pd.DataFrame({"arrival_s": np.zeros(300), "first_scheduled_s": np.arange(300.0)})
    steady = pd.DataFrame({"arrival_s": np.arange(300.0, 700.0),
                           "first_scheduled_s": np.arange(300.0, 700.0)})
    frame = pd.concat([burst, steady])
    assert waiting_saturation(frame, warmup_s=300.0)["saturation_growth_requests"] == pytest.approx(0.0)


def test_the_growth_is_the_continuous_least_squares_slope() -> None:
    """The closed form equals a fit of the waiting count sampled finely over the span, and
    moves by rounding when the timestamps move by rounding (fast and reference mode)."""
    rng = np.random.default_rng(7)
    arrival = np.sort(rng.uniform(0.0, 100.0, 400))
    scheduled = arrival + rng.exponential(5.0, 400) * np.linspace(0.5, 3.0, 400)
    scheduled[-5:] = np.inf  # never ran
    reqs = pd.DataFrame({"arrival_s": arrival, "first_scheduled_s": scheduled})
    out = waiting_saturation(reqs)
    from_s = arrival[0] + 0.25 * (arrival[-1] - arrival[0])
    x = np.linspace(0.0, 1.0, 400_001)
    waiting = waiting_count(arrival, scheduled, from_s + x * (arrival[-1] - from_s))
    sampled = np.polyfit(x, waiting.astype(np.float64), 1)[0]
    assert out["saturation_growth_requests"] == pytest.approx(sampled, abs=0.05)
    # A timestamp on a sample point of a sampled fit would flip its count; here nothing jumps.
    nudged = reqs.assign(first_scheduled_s=scheduled * (1 + 1e-15))
    assert waiting_saturation(nudged)["saturation_z"] == pytest.approx(out["saturation_z"], rel=1e-9)


# A decode pool of one instance running at most 4 requests, 50 steps of 10 ms each: 8 req/s.
# The prefill instance (64 at once, one 10 ms step a prompt) keeps up at any of these rates.
DISAGGREGATED = {
    "name": "decode-bound", "seed": 1,
    "workload": {"num_requests": 1000, "arrival": {"kind": "poisson", "rate_per_s": 4.0},
                 "prompt_tokens": {"kind": "constant", "value": 100},
                 "output_tokens": {"kind": "constant", "value": 50}, "max_tokens": 200},
    "cost": {"kind": "linear", "base_s": 0.010, "per_token_s": 0.0, "per_context_token_s": 0.0},
    "kv_capacity_tokens": 100_000,
    "systems": [{"name": "split", "scheduler": {"kind": "paged", "max_num_seqs": 4,
                                                "kv_bytes_per_token": 1000},
                 "cluster": {"prefill": {"count": 1, "scheduler": {
                     "kind": "paged", "max_num_seqs": 64, "kv_bytes_per_token": 1000}},
                             "decode": {"count": 1}, "link": {"kind": "nvlink"}}}],
}


@pytest.mark.parametrize(("rate_per_s", "saturated"), [(4.0, 0.0), (12.0, 1.0)])
def test_a_disaggregated_cluster_queues_at_its_decode_pool(rate_per_s: float,
                                                           saturated: float) -> None:
    """Past the decode pool's 8 req/s every request is still scheduled on time by the
    prefill instance: the queue that grows is the decode side's, and the test watches it
    (it read z = 0 at 12 req/s, with 39 s of decode wait on average)."""
    from orcasim.scenario import scenario_from_dict

    data = DISAGGREGATED | {"workload": DISAGGREGATED["workload"] | {
        "arrival": {"kind": "poisson", "rate_per_s": rate_per_s}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_scenario(scenario_from_dict(data)).systems["split"]
    assert result.summary["saturated"] == saturated
    assert not grew(waiting_saturation(result.requests)["saturation_z"])  # first schedules: on time
    assert (result.summary["decode_wait_s_mean"] > 10.0) == bool(saturated)


def running_set_backlog(n: int = 1001) -> pd.DataFrame:
    """Arrivals every second, each admitted at once, finishing at 2 i + 1: nothing waits,
    and the requests in the system grow by half a request a second."""
    arrival = np.arange(n, dtype=np.float64)
    return pd.DataFrame({"arrival_s": arrival, "first_scheduled_s": arrival,
                         "finish_s": 2.0 * arrival + 1.0})


def test_a_running_set_that_grows_reads_its_growth() -> None:
    """Latencies i + 1, median 501 s, past half the arrival window: the window is its second
    half, [500, 1000], with 501 arrivals and the 250 finishes 2 i + 1 of i = 250..499; growth
    half a request a second over 500 s (within a step), in units of sqrt(501 + 250). The
    waiting queue stays empty."""
    out = saturation(running_set_backlog())
    assert out["saturation_growth_requests"] == 0.0
    assert out["in_system_growth_requests"] == pytest.approx(250, abs=1.5)
    assert out["in_system_z"] == pytest.approx(out["in_system_growth_requests"] / np.sqrt(751))
    assert (out["in_system_arrival_rps"], out["in_system_finish_rps"]) == (501 / 500, 250 / 500)
    assert out["saturated"] == 0.0 and saturation_text(out) is None  # evidence, not the flag
    text = in_system_text(out)
    assert text is not None and text.startswith("the requests in the system (waiting and running) "
                                                "grew by 250 over the arrivals from a p90 latency after "
                                                "the first (or half-way, if sooner) to the last (")


def test_each_test_that_fired_is_named() -> None:
    """Neither: no text; both: each its own, with its z, and the waiting queue's is the flag."""
    quiet = saturation(running_set_backlog().assign(finish_s=lambda f: f["arrival_s"] + 1.0))
    assert quiet["saturated"] == 0.0 and saturation_text(quiet) is None
    assert in_system_text(quiet) is None
    both = saturation(backlog().assign(finish_s=lambda f: f["first_scheduled_s"] + 1.0))
    waiting, in_system = saturation_text(both), in_system_text(both)
    assert both["saturated"] == 1.0 and waiting is not None and in_system is not None
    assert waiting.startswith("the waiting queue grew by 375 requests") and "z = " in waiting
    assert in_system.startswith("the requests in the system (waiting and running) grew by")


def test_a_running_set_that_holds_the_backlog_is_said() -> None:
    """A paged server of 1,024 sequences (about 107 req/s at most) at 117.6 offered admits
    every arrival at once: its waiting queue stays flat (z 0.2 at 2,000 requests) while the
    requests in the system pile up (z 10.4; 13.7 from a median latency in) and its e2e p50 grows with the run (3.2 s at
    1,000 requests, 5.2 s at 2,000). `orcasim run` said nothing below 4,000 requests; it now
    says what grew and what else grows it, without the flag (see the next test)."""
    p50 = []
    for n in (1000, 2000):
        sc = make_scenario(**{**BIG_RUNNING_SET, "workload.num_requests": n,
                              "workload.arrival": {"kind": "poisson", "rate_per_s": 117.6}})
        with pytest.warns(UserWarning, match=r"paged: the requests in the system \(waiting and "
                          r"running\) grew by \d+ over the arrivals from a p90 .* with no "
                          r"waiting queue: a server whose running set holds the backlog"):
            summary = run_scenario(sc).systems["paged"].summary
        assert summary["saturation_z"] < SATURATION_Z < summary["in_system_z"], summary
        assert summary["saturated"] == 0.0
        p50.append(summary["e2e_s_p50"])
    assert p50[1] > 1.5 * p50[0]  # the latencies measure the run's length


def test_a_running_set_whose_latency_outgrows_the_run_is_said() -> None:
    """No limit on the running set (16,384 sequences) at 193 req/s, 1.8 times what the
    server serves, over 1,000 requests: each request slows as the run goes on, the median
    latency (5.7 s) outgrew the arrival window (5.6 s), and the window that starts a median
    latency in held nothing to judge: no warning, NaN evidence. It starts no later than
    half-way now."""
    sc = make_scenario(**{**BIG_RUNNING_SET, "workload.num_requests": 1000,
                          "workload.arrival": {"kind": "poisson", "rate_per_s": 193.0},
                          "systems": [{"name": "paged", "scheduler": {
                              "kind": "paged", "max_num_seqs": 16384,
                              "max_num_batched_tokens": 100_000}}]})
    with pytest.warns(UserWarning, match=r"paged: the requests in the system \(waiting and running\)"):
        system = run_scenario(sc).systems["paged"]
    reqs = system.requests
    span_s = reqs["arrival_s"].max() - reqs["arrival_s"].min()
    assert (reqs["finish_s"] - reqs["arrival_s"]).median() > span_s
    assert system.summary["in_system_z"] > SATURATION_Z, system.summary


def test_a_rising_arrival_rate_served_in_time_is_not_saturated(tmp_path: Path) -> None:
    """Little's law: at a constant latency the requests in the system rise with the arrival
    rate. A rate rising from 2 to 20 req/s over 300 s on a server that keeps up at 20 (e2e
    p50 about the same in every quarter of the run) read in-system z 4.5 to 5.2 and was
    flagged saturated when that test was the flag (a tester's probe); it is evidence, and
    the flag is the waiting queue's."""
    rng = np.random.default_rng(1)
    times = np.cumsum(rng.exponential(1 / 20.0, 20_000))
    times = times[times < 300.0]
    kept = times[rng.random(len(times)) < (2.0 + 18.0 * times / 300.0) / 20.0]  # thinning
    trace = pd.DataFrame({"arrival_s": kept,
                          "prompt_tokens": rng.integers(50, 401, len(kept)),
                          "output_tokens": rng.integers(1000, 3001, len(kept))})
    trace.to_csv(tmp_path / "ramp.csv", index=False)
    sc = scenario_from_dict({
        "name": "ramp", "seed": 1,
        "workload": {"arrival": {"kind": "trace", "path": str(tmp_path / "ramp.csv")},
                     "max_tokens": 3500},
        "cost": {"kind": "linear", "base_s": 0.010, "per_token_s": 5.0e-6},
        "kv_capacity_tokens": 100_000_000,
        "systems": [{"name": "vllm", "scheduler": {"kind": "paged", "max_num_seqs": 4096,
                                                   "max_num_batched_tokens": 100_000}}]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        system = run_scenario(sc).systems["vllm"]
    assert system.summary["saturated"] == 0.0 and system.summary["saturation_z"] < 1
    quarters = pd.qcut(system.requests["arrival_s"], 4, labels=False)
    e2e = (system.requests["finish_s"] - system.requests["arrival_s"]).groupby(quarters).median()
    assert e2e.max() < 1.5 * e2e.iloc[1]  # it keeps up
    # z 4.4 on this seed: said, and not as saturation (the test's point; a review found the
    # check behind an `if`, which passed whether or not the run said it)
    assert system.summary["in_system_z"] > SATURATION_Z
    assert any("not flagged saturated" in str(w.message) for w in caught)


def quiet_long_latency_run(seed: int, num_requests: int, rate_per_s: float,
                           output_tokens: dict[str, Any], max_batch_size: int,
                           kv_capacity_tokens: int) -> Any:
    """An Orca server of 20 ms steps and 100-token prompts, its KV and batch limit far beyond
    the load, run with any saturation warning an error; its system's result."""
    top = output_tokens.get("high", output_tokens.get("value"))
    sc = make_scenario(**{"seed": seed, "workload.num_requests": num_requests,
                          "workload.arrival": {"kind": "poisson", "rate_per_s": rate_per_s},
                          "workload.prompt_tokens": {"kind": "constant", "value": 100},
                          "workload.output_tokens": output_tokens,
                          "workload.max_tokens": top + 100, "kv_capacity_tokens": kv_capacity_tokens,
                          "cost": {"kind": "linear", "base_s": 0.020, "per_token_s": 1.0e-6},
                          "systems": [{"name": "big", "scheduler": {"kind": "iteration_level",
                                                                    "max_batch_size": max_batch_size}}]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no saturation warning
        return run_scenario(sc).systems["big"]


@pytest.mark.parametrize("seed", range(4))
def test_a_stable_server_of_spread_latencies_is_not_flagged(seed: int) -> None:
    """Latencies spread from 2 to 38 s (outputs of 100 to 1,900 tokens, 20 ms steps) at 120
    req/s, far below the server's limit (about 2,500 running of 4,096): the requests in the
    system rise until the slowest early ones finish, 38 s in. From a median latency (21 s)
    in, 9,000 requests read in-system z 3.9 to 5.0 on seeds 0 to 5, and the capacity search
    failed the rate; from the 90th percentile, 0.0 to 2.0."""
    system = quiet_long_latency_run(seed, 9000, 120.0, {"kind": "uniform", "low": 100, "high": 1900},
                                    4096, 40_000_000)
    reqs = system.requests
    quarters = pd.qcut(reqs["arrival_s"], 4, labels=False)
    e2e = (reqs["finish_s"] - reqs["arrival_s"]).groupby(quarters).median()
    assert e2e.max() < 1.2 * e2e.min()  # it keeps up (the first quarter ramps up)
    assert system.summary["in_system_z"] < SATURATION_Z, system.summary


def test_requests_that_never_finish_start_the_window_half_way() -> None:
    """Where a tenth or more of the requests never finish (inf), the 90th percentile of
    latency is inf, not an interpolation between inf and inf (NaN, which left the window's
    start NaN): the window is the arrivals' second half."""
    reqs = running_set_backlog()
    reqs.loc[reqs.index[-150:], "finish_s"] = np.nan
    out = saturation(reqs)
    assert out["in_system_arrival_rps"] == 501 / 500, out
    assert out["in_system_z"] > SATURATION_Z


def test_a_window_too_short_to_judge_is_not_called_short() -> None:
    """50 requests all arriving at 0 s and finishing at 1 s: nothing is judged (NaN), and
    the capacity search's evaluations recorded in_system_short = 1 without evidence (a
    reviewer's note)."""
    reqs = pd.DataFrame({"arrival_s": np.zeros(50), "finish_s": np.ones(50),
                         "first_scheduled_s": np.zeros(50)})
    assert np.isnan(saturation(reqs)["in_system_z"])
    assert not in_system_window_is_short(reqs)


@pytest.mark.parametrize("seed", range(12))
def test_a_stable_server_of_long_latency_is_not_flagged(seed: int) -> None:
    """The requests in the system rise for a latency before the first ones finish: a server
    of 20 s latency at any load (1,024 sequences, 1,000-token outputs, 20 ms steps), at 40
    req/s over a 50 s window, read z 4.2 from the usual quarter (20,000 requests read -0.1)
    and failed the capacity search (a review's finding). The window starts a p90 latency
    in, and the growth is in units of both counts' noise (seeds 0 to 11: -1.2 to 2.4)."""
    system = quiet_long_latency_run(seed, 2000, 40.0, {"kind": "constant", "value": 1000}, 1024,
                                    2_000_000)
    assert (system.requests["finish_s"] - system.requests["arrival_s"]).median() > 20
    assert system.summary["in_system_z"] < SATURATION_Z
    assert system.summary["saturated"] == 0.0, system.summary


def test_a_run_too_short_to_judge_is_not_called_stable() -> None:
    """25 requests at three times what the server serves: every request waits longer than
    the one before (e2e 2.5 s to 15 s), but no test's window holds `MIN_ARRIVALS`, so
    `saturated` is 0 for want of evidence. The table printed `saturated  no`, as for a run
    judged stable; it says it could not judge."""
    from rich.console import Console

    from orcasim.cli import summary_table

    summary = md1(3.0, 0, **{"workload.num_requests": 25}).summary
    assert summary["saturated"] == 0.0 and not judged(summary), summary
    console = Console(record=True, width=120)
    console.print(summary_table({"md1": summary, "stable": md1(0.5, 0).summary}, "t"))
    row = next(line for line in console.export_text().splitlines() if "saturated" in line)
    assert "not judged" in row and row.count(" no ") == 1, row


def closed_loop_busy_server(warmup_s: float) -> Any:
    """64 clients with no think time, one request at a time of D = 10 iterations x 10 ms,
    400 requests: the server never idles (X = 1 / D) and every request waits 63 D."""
    return md1(1.0, 1, arrival={"kind": "closed_loop", "num_clients": 64,
                                "think_time": {"kind": "constant", "value_s": 0.0}},
               **{"workload.num_requests": 400, "warmup_s": warmup_s,
                  "workload.output_tokens": {"kind": "constant", "value": 10},
                  "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 0.0}})


def test_a_warm_up_does_not_make_a_closed_loop_queue_grow() -> None:
    """After a 25 s warm-up 87 requests are judged, each joining the 63 that arrived before
    it. Counting only the judged ones, the waiting count filled from 0 to 63 over most of the
    window: z 5.6, flagged saturated with an arrival rate of 10.1 req/s against 3.72 admitted,
    on a server admitting 10 a second throughout. The queue the judged requests join is
    counted now, and its evidence is the server's: as many admitted as arrived."""
    system = closed_loop_busy_server(25.0)
    summary = system.summary
    assert summary["requests_completed"] == 87
    assert system.requests["e2e_s"].iloc[-87:].max() == pytest.approx(6.4, rel=1e-9)  # flat
    assert summary["saturated"] == 0.0 and abs(summary["saturation_z"]) < 1, summary
    assert summary["saturation_admission_rps"] == pytest.approx(summary["saturation_arrival_rps"])


def test_an_overload_after_a_warm_up_is_still_flagged() -> None:
    """The queue that formed before the warm-up grows on after it: counted, it is growth."""
    for seed in range(3):
        summary = md1(1.2, seed, warmup_s=400.0).summary
        assert summary["saturated"] == 1.0, summary
        assert summary["saturation_admission_rps"] == pytest.approx(1 / SERVICE_S, rel=0.01)


def test_a_warm_up_does_not_make_a_stable_servers_requests_in_the_system_grow() -> None:
    """Latencies spread from 2 to 38 s at 40 req/s, far below the server's limit, over
    3,000 requests: in-system z 0.6 without a warm-up. With 25 s of one, counting only the
    requests after it, the count filled from zero and its latency tail read z 3.8, a warning
    and a rate the capacity search failed; the requests in the system are all counted now."""
    sc = make_scenario(**{"seed": 0, "warmup_s": 25.0, "workload.num_requests": 3000,
                          "workload.arrival": {"kind": "poisson", "rate_per_s": 40.0},
                          "workload.prompt_tokens": {"kind": "constant", "value": 100},
                          "workload.output_tokens": {"kind": "uniform", "low": 100, "high": 1900},
                          "workload.max_tokens": 2000, "kv_capacity_tokens": 40_000_000,
                          "cost": {"kind": "linear", "base_s": 0.020, "per_token_s": 1.0e-6},
                          "systems": [{"name": "big", "scheduler": {"kind": "iteration_level",
                                                                    "max_batch_size": 4096}}]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no saturation warning
        summary = run_scenario(sc).systems["big"].summary
    assert summary["in_system_z"] < 1.0 and not behind_at_constant_rate(summary), summary


def test_the_printed_table_names_its_throughput_row() -> None:
    """The first row read `req/s 12.89` under a run offered 13.55 req/s: a number without its
    name, which a capacity planner took for the rate offered. It is the throughput."""
    from rich.console import Console

    from orcasim.cli import summary_table

    console = Console(width=200, record=True)
    console.print(summary_table({"paged": {"throughput_rps": 12.89}}, "t"))
    row = next(line for line in console.export_text().splitlines() if "12.89" in line)
    assert row.split("│")[1].strip() == "throughput (req/s)"
