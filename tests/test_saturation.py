"""Saturation is never silent: an unstable queue is flagged, a stable or recovering one is not.

M/D/1: one request at a time (max_batch_size 1, one output token, a constant prompt), so
every request is one iteration of a fixed time and rho = rate x service time exactly.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orcasim import run_scenario
from orcasim.saturation import SATURATION_Z, saturation, waiting_count
from tests.conftest import make_scenario

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
    out = saturation(reqs)
    assert out["saturation_growth_requests"] == pytest.approx(375.0, abs=1.5)
    # The span [250, 1000] holds arrivals 250..1000 and admissions 250, 252, .., 1000, ends included.
    assert out["saturation_arrival_rps"] == 751 / 750
    assert out["saturation_admission_rps"] == 376 / 750
    assert out["saturated"] == 1.0


def test_the_fewest_arrivals_judged_and_a_run_with_no_span() -> None:
    """Arrivals at 0..26 s: the span from 6.5 s holds exactly MIN_ARRIVALS (20), enough."""
    reqs = pd.DataFrame({"arrival_s": np.arange(27.0), "first_scheduled_s": np.arange(27.0)})
    assert np.isfinite(saturation(reqs)["saturation_z"])
    assert np.isnan(saturation(reqs.iloc[1:])["saturation_z"])  # 19: too few
    together = pd.DataFrame({"arrival_s": np.full(30, 5.0), "first_scheduled_s": np.full(30, 5.0)})
    assert np.isnan(saturation(together)["saturation_z"])  # all at once: no span to fit


def test_too_short_a_run_is_not_judged() -> None:
    reqs = pd.DataFrame({"arrival_s": np.arange(10.0), "first_scheduled_s": np.arange(10.0) * 5})
    out = saturation(reqs)
    assert out["saturated"] == 0.0 and np.isnan(out["saturation_z"])


EVIDENCE = {"saturated", "saturation_z", "saturation_growth_requests", "saturation_arrival_rps",
            "saturation_admission_rps"}


def test_the_evidence_is_the_same_on_every_path() -> None:
    short = saturation(pd.DataFrame({"arrival_s": [1.0], "first_scheduled_s": [1.0]}))
    assert set(short) == EVIDENCE and short["saturated"] == 0.0
    assert all(np.isnan(short[k]) for k in EVIDENCE - {"saturated"})


def backlog(n: int = 1001, shift_s: float = 0.0, scale: float = 1.0) -> pd.DataFrame:
    """Arrivals every second, admissions every two (as in the test above), moved and scaled."""
    arrival = shift_s + scale * np.arange(n, dtype=np.float64)
    return pd.DataFrame({"arrival_s": arrival,
                         "first_scheduled_s": shift_s + scale * 2.0 * np.arange(n)})


def test_the_test_is_unchanged_by_where_the_clock_starts_and_its_unit() -> None:
    """Growth and z are counts: the same a day later, or in milliseconds."""
    base = saturation(backlog())
    for moved in (saturation(backlog(shift_s=86400.0)), saturation(backlog(scale=1e-3))):
        assert moved["saturation_growth_requests"] == pytest.approx(base["saturation_growth_requests"])
        assert moved["saturation_z"] == pytest.approx(base["saturation_z"])
        assert moved["saturated"] == 1.0
    ms = saturation(backlog(scale=1e-3))
    assert ms["saturation_arrival_rps"] == pytest.approx(1000.0, rel=0.01)


def test_rejected_requests_are_not_a_queue() -> None:
    """Requests that never fit KV memory never start: they must not read as a growing queue."""
    stable = pd.DataFrame({"arrival_s": np.arange(400.0), "first_scheduled_s": np.arange(400.0)})
    rejected = pd.DataFrame({"arrival_s": np.linspace(200.0, 399.0, 150),
                             "first_scheduled_s": np.nan})
    frame = pd.concat([stable.assign(rejected=False), rejected.assign(rejected=True)])
    assert saturation(frame)["saturated"] == 0.0
    assert saturation(frame.drop(columns="rejected"))["saturated"] == 1.0  # counted, they would


def test_warmup_drops_the_early_arrivals() -> None:
    """A backlog that formed before the warm-up and drains after it is not a growing queue."""
    burst = pd.DataFrame({"arrival_s": np.zeros(300), "first_scheduled_s": np.arange(300.0)})
    steady = pd.DataFrame({"arrival_s": np.arange(300.0, 700.0),
                           "first_scheduled_s": np.arange(300.0, 700.0)})
    frame = pd.concat([burst, steady])
    assert saturation(frame, warmup_s=300.0)["saturation_growth_requests"] == pytest.approx(0.0)


def test_the_growth_is_the_continuous_least_squares_slope() -> None:
    """The closed form equals a fit of the waiting count sampled finely over the span, and
    moves by rounding when the timestamps move by rounding (fast and reference mode)."""
    rng = np.random.default_rng(7)
    arrival = np.sort(rng.uniform(0.0, 100.0, 400))
    scheduled = arrival + rng.exponential(5.0, 400) * np.linspace(0.5, 3.0, 400)
    scheduled[-5:] = np.inf  # never ran
    reqs = pd.DataFrame({"arrival_s": arrival, "first_scheduled_s": scheduled})
    out = saturation(reqs)
    from_s = arrival[0] + 0.25 * (arrival[-1] - arrival[0])
    x = np.linspace(0.0, 1.0, 400_001)
    waiting = waiting_count(arrival, scheduled, from_s + x * (arrival[-1] - from_s))
    sampled = np.polyfit(x, waiting.astype(np.float64), 1)[0]
    assert out["saturation_growth_requests"] == pytest.approx(sampled, abs=0.05)
    # A timestamp on a sample point of a sampled fit would flip its count; here nothing jumps.
    nudged = reqs.assign(first_scheduled_s=scheduled * (1 + 1e-15))
    assert saturation(nudged)["saturation_z"] == pytest.approx(out["saturation_z"], rel=1e-9)


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
    assert saturation(result.requests)["saturated"] == 0.0  # first schedules: on time
    assert (result.summary["decode_wait_s_mean"] > 10.0) == bool(saturated)
