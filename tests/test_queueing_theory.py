"""The engine against closed forms: M/D/1 and M/G/1 waits (Pollaczek-Khinchine), Little's law.

With max_batch_size 1 and one output token per request, every request is one iteration
whose time is base_s + per_token_s * prompt_tokens, so the system is an M/G/1 FCFS queue
with a service-time distribution we know exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from orcasim import run_scenario
from tests.conftest import make_scenario

PK_REL_TOL = 0.03  # the bound on |simulated - PK| / PK
LITTLE_REL_TOL = 0.02  # edge effects of a finite window, for runs of thousands of requests
REPLICATIONS = 8
REQUESTS_PER_REPLICATION = 20_000
WARMUP_REQUESTS = 1_000
RATE_PER_S = 0.5
BASE_S, PER_TOKEN_S = 0.5, 0.01


def pk_mean_wait_s(rate_per_s: float, service_s: np.ndarray, weights: np.ndarray) -> float:
    """Pollaczek-Khinchine: Wq = lambda E[S^2] / (2 (1 - rho)), rho = lambda E[S]."""
    p = weights / weights.sum()
    es, es2 = float((p * service_s).sum()), float((p * service_s**2).sum())
    rho = rate_per_s * es
    assert rho < 1
    return rate_per_s * es2 / (2 * (1 - rho))


def simulated_mean_wait_s(prompt: dict) -> float:
    waits = []
    for seed in range(REPLICATIONS):
        sc = make_scenario(**{
            "seed": seed,
            "workload.num_requests": REQUESTS_PER_REPLICATION,
            "workload.arrival": {"kind": "poisson", "rate_per_s": RATE_PER_S},
            "workload.prompt_tokens": prompt,
            "workload.output_tokens": {"kind": "constant", "value": 1},
            "workload.max_tokens": 200,
            "cost": {"kind": "linear", "base_s": BASE_S, "per_token_s": PER_TOKEN_S},
            "systems": [{"name": "m-g-1", "scheduler": {"kind": "iteration_level", "max_batch_size": 1}}],
        })
        queue_delay = run_scenario(sc).systems["m-g-1"].requests["queue_delay_s"].to_numpy()
        waits.append(queue_delay[WARMUP_REQUESTS:].mean())
    return float(np.mean(waits))


@pytest.mark.validation
def test_md1_wait_matches_pollaczek_khinchine() -> None:
    service_s = np.array([BASE_S + PER_TOKEN_S * 50])
    expected = pk_mean_wait_s(RATE_PER_S, service_s, np.ones(1))
    got = simulated_mean_wait_s({"kind": "constant", "value": 50})
    assert abs(got - expected) / expected < PK_REL_TOL, (got, expected)


@pytest.mark.validation
def test_mg1_wait_matches_pollaczek_khinchine() -> None:
    prompts = np.arange(1, 101)
    service_s = BASE_S + PER_TOKEN_S * prompts
    expected = pk_mean_wait_s(RATE_PER_S, service_s, np.ones_like(service_s))
    got = simulated_mean_wait_s({"kind": "uniform", "low": 1, "high": 100})
    assert abs(got - expected) / expected < PK_REL_TOL, (got, expected)


@pytest.mark.parametrize("system", ["request-level", "orca"])
def test_littles_law_holds_on_ordinary_runs(system: str) -> None:
    sc = make_scenario(**{"workload.num_requests": 4000})
    s = run_scenario(sc).systems[system].summary
    assert s["little_rel_error"] < LITTLE_REL_TOL, s

