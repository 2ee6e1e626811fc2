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



# Operational laws on one seeded replication each: they hold over any window, so only the
# window's edges (a request or so over thousands) and the sampled service times move them.
UTILISATION_REL_TOL = 0.03  # busy share against lambda E[S], over 4 replications
BUSY_EDGE_REL_TOL = 1e-3  # a server busy throughout: X E[S] = 1 up to its first arrival's wait
CLUSTER_REPLICAS = 4


def m_g_1(rate_per_s: float, num_requests: int, seed: int, cluster: bool = False,
          warmup_s: float = 0.0, scheduler: dict | None = None) -> dict:
    """The M/G/1 of `simulated_mean_wait_s` (prompts 1 to 100, one output token, batch 1),
    or CLUSTER_REPLICAS of them behind round robin."""
    system: dict = {"name": "s", "scheduler": scheduler or {"kind": "request_level",
                                                           "max_batch_size": 1}}
    if cluster:
        system["cluster"] = {"router": {"kind": "round_robin"},
                             "replicas": [{"count": CLUSTER_REPLICAS}]}
    return make_scenario(**{
        "seed": seed, "warmup_s": warmup_s, "workload.num_requests": num_requests,
        "workload.arrival": {"kind": "poisson", "rate_per_s": rate_per_s},
        "workload.prompt_tokens": {"kind": "uniform", "low": 1, "high": 100},
        "workload.output_tokens": {"kind": "constant", "value": 1},
        "workload.max_tokens": 200, "kv_capacity_tokens": 100_000,
        "cost": {"kind": "linear", "base_s": BASE_S, "per_token_s": PER_TOKEN_S},
        "systems": [system],
    })


def test_a_replicas_busy_share_is_its_arrival_rate_times_the_mean_service_time() -> None:
    """Utilisation law, U = lambda E[S]: four M/G/1 replicas behind round robin at 0.5 each."""
    mean_service_s = BASE_S + PER_TOKEN_S * 50.5  # prompts uniform on 1..100
    busy = []
    for seed in range(4):
        sc = m_g_1(CLUSTER_REPLICAS * RATE_PER_S, 4000, seed, cluster=True)
        replicas = run_scenario(sc).systems["s"].replicas
        assert replicas is not None
        busy.append(replicas["busy_fraction"].mean())
    expected = RATE_PER_S * mean_service_s
    assert abs(np.mean(busy) - expected) / expected < UTILISATION_REL_TOL, (busy, expected)


def test_a_single_servers_busy_fraction_is_its_arrival_rate_times_the_mean_service_time() -> None:
    """Utilisation law, U = lambda E[S], in a lone server's summary (which had no busy share:
    only a cluster's replicas.csv did), and a fleet's summary: its replicas' mean."""
    mean_service_s = BASE_S + PER_TOKEN_S * 50.5  # prompts uniform on 1..100
    expected = RATE_PER_S * mean_service_s
    lone = [run_scenario(m_g_1(RATE_PER_S, 4000, seed)).systems["s"].summary["busy_fraction"]
            for seed in range(4)]
    assert abs(np.mean(lone) - expected) / expected < UTILISATION_REL_TOL, (lone, expected)
    fleet = run_scenario(m_g_1(CLUSTER_REPLICAS * RATE_PER_S, 2000, 0, cluster=True)).systems["s"]
    assert fleet.replicas is not None
    assert fleet.summary["busy_fraction"] == pytest.approx(fleet.replicas["busy_fraction"].mean(),
                                                           rel=1e-12)


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_a_server_busy_throughout_is_busy_a_share_of_one_not_more(seed: int) -> None:
    """A paged server at 50 req/s is never idle: its iterations' seconds, summed, overshot
    the clock's span by an ulp and the summary read busy_fraction 1.0000000000000002."""
    scenario = make_scenario(seed=seed, **{
        "workload.arrival": {"kind": "poisson", "rate_per_s": 50.0},
        "systems": [{"name": "s", "scheduler": {"kind": "paged"}},
                    {"name": "c", "scheduler": {"kind": "paged"}, "cluster": {"replicas": 1}}]})
    for system in run_scenario(scenario).systems.values():
        assert 0.0 <= system.summary["busy_fraction"] <= 1.0, system.summary["busy_fraction"]


def test_an_overloaded_servers_throughput_is_one_over_its_mean_service_time() -> None:
    """At twice what it serves the server never idles after its first arrival: X E[S] = 1,
    with E[S] the run's own service times, and the flag is up."""
    with pytest.warns(UserWarning, match="s: saturated: the waiting queue grew"):
        system = run_scenario(m_g_1(2 / (BASE_S + PER_TOKEN_S * 50.5), 2000, 0)).systems["s"]
    service_s = BASE_S + PER_TOKEN_S * system.requests["prompt_tokens"].to_numpy()
    busy_share = system.summary["throughput_rps"] * service_s.mean()
    assert abs(busy_share - 1) < BUSY_EDGE_REL_TOL, busy_share
    assert system.summary["saturated"] == 1.0


@pytest.mark.parametrize("warmup_s", [0.0, 500.0])
def test_littles_law_holds_per_replica_and_for_the_fleet(warmup_s: float) -> None:
    """L = lambda W on each replica and on the fleet, with and without a warm-up. Each
    replica is measured over the fleet's window (first to last measured arrival), so the
    replicas' L and lambda W add up to the fleet's, to rounding: over their own windows
    they read L summed 0.01% (no warm-up) and 0.04% (500 s) above the fleet's."""
    result = run_scenario(m_g_1(3.0, 6000, 1, cluster=True, warmup_s=warmup_s)).systems["s"]
    replicas = result.replicas
    assert replicas is not None
    assert result.summary["little_rel_error"] < LITTLE_REL_TOL
    assert (replicas["little_rel_error"] < LITTLE_REL_TOL).all(), replicas["little_rel_error"]
    for side in ("little_L", "little_lambda_W"):
        assert replicas[side].sum() == pytest.approx(result.summary[side], rel=1e-12), side


def test_every_scheduler_at_batch_one_is_the_same_m_g_1() -> None:
    """One request at a time with one output token: every scheduler runs the same FCFS
    queue, so the waits agree to rounding (the PK tests check one of them against theory)."""
    schedulers = [{"kind": "request_level", "max_batch_size": 1},
                  {"kind": "iteration_level", "max_batch_size": 1},
                  {"kind": "paged", "max_num_seqs": 1, "max_num_batched_tokens": 4096},
                  {"kind": "chunked", "max_num_seqs": 1, "chunk_size_tokens": 4096}]
    waits = [run_scenario(m_g_1(0.9, 2000, 2, scheduler=s)).systems["s"].requests["queue_delay_s"]
             .to_numpy() for s in schedulers]
    for other in waits[1:]:
        np.testing.assert_allclose(other, waits[0], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("mode", ["reference", "fast"])
def test_a_server_busy_throughout_late_on_the_clock_is_busy_a_share_of_one(tmp_path, mode: str) -> None:  # noqa: ANN001
    """One request at 0, then 200 at once 9e8 s later (a float keeps 1.2e-7 s there), on a
    server of batch 4 that never idles until they are done: busy 1 in both modes. A
    one-iteration row counted its priced duration, a jump's row its span on the clock, and
    the two differ by up to 6e-8 s an iteration there: both read 1.0000002 in reference
    mode, and Orca 0.9999999987 in fast (a tester's finding)."""
    trace = tmp_path / "late.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,16,1\n"
                     + "".join(f"900000000,{20 + i % 40},{1 + i % 30}\n" for i in range(200)))
    scenario = make_scenario(**{
        "warmup_s": 9e8, "engine": {"mode": mode},
        "workload": {"arrival": {"kind": "trace", "path": str(trace)}, "max_tokens": 96},
        "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 4}},
                    {"name": "paged", "scheduler": {"kind": "paged", "max_num_seqs": 4}}]})
    for system in run_scenario(scenario).systems.values():
        assert system.summary["busy_fraction"] == 1.0, system.summary["busy_fraction"]
