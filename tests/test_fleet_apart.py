"""A fleet behind a router that reads no replica runs its replicas apart, exactly.

Round robin, random, and a session router over either, route by the arrivals alone: the
routing is fixed before the run, and each replica runs on its own over its arrivals
(`Fleet.run`). That must give what the one clock loop gives, to the bit: the per-request
timestamps, the rows, where each request went and the run's end, for every scheduler kind,
both engine modes, both cost kinds, a warm-up break and a fleet of mixed groups.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orcasim.fleet import Fleet, build_fleet
from orcasim.requests import Requests
from orcasim.run import run_scenario
from tests.conftest import examples, make_scenario

ROUTERS = ({"kind": "round_robin"}, {"kind": "random"},
           {"kind": "session", "fallback": "round_robin"}, {"kind": "session", "fallback": "random"})
SCHEDULERS: tuple[dict[str, Any], ...] = (
    {"kind": "paged", "max_num_seqs": 6, "max_num_batched_tokens": 96},
    {"kind": "paged", "policy": "prefill_first", "max_num_seqs": 6, "max_num_batched_tokens": 96},
    {"kind": "paged", "max_num_seqs": 6, "max_num_batched_tokens": 96, "enable_prefix_caching": True},
    {"kind": "chunked", "max_num_seqs": 6, "chunk_size_tokens": 48},
    {"kind": "iteration_level", "max_batch_size": 4},
    {"kind": "request_level", "max_batch_size": 4},
)
ROOFLINE = {"cost": {"kind": "roofline", "overhead": {"per_iteration_s": 0.002, "per_sequence_s": 0.0003}},
            "model": "llama2-7b", "hardware": {"gpu": "a100-80gb"}}


def _requests(seed: int, n: int, rate_per_s: float) -> Requests:
    rng = np.random.default_rng(seed)
    arrival_s = np.sort(np.round(rng.uniform(0, n / rate_per_s, n), 2))  # ties too
    # About one in twenty can never fit the tests' 400 tokens of KV: turned away.
    never_fits = rng.random(n) < 0.05
    prompt_tokens = np.where(never_fits, 450, rng.integers(8, 64, n))
    return Requests(arrival_s, prompt_tokens, rng.integers(1, 32, n),
                    np.where(never_fits, 500, 96), session_ids=rng.integers(0, n // 4 + 1, n))


def _both(scenario_changes: dict[str, Any], requests: Requests) -> list[tuple[Fleet, Any]]:
    runs = []
    for apart in (True, False):
        scenario = make_scenario(**scenario_changes)
        fleet = build_fleet(scenario, scenario.systems[0], requests)
        runs.append((fleet, fleet.run(apart=apart)))
    return runs


def _assert_same(runs: list[tuple[Fleet, Any]]) -> None:
    (fleet_a, run_a), (fleet_b, run_b) = runs
    assert fleet_a.runs_apart() and fleet_b.runs_apart()
    for column in ("first_scheduled_s", "first_token_s", "finish_s"):
        np.testing.assert_array_equal(getattr(run_a.recorder, column), getattr(run_b.recorder, column))
    np.testing.assert_array_equal(fleet_a.assigned, fleet_b.assigned)
    np.testing.assert_array_equal(run_a.rejected_ids, run_b.rejected_ids)
    assert run_a.end_s == run_b.end_s
    pd.testing.assert_frame_equal(fleet_a.iterations_frame(), fleet_b.iterations_frame())
    for a, b in zip(fleet_a.replicas, fleet_b.replicas, strict=True):
        np.testing.assert_array_equal(a.scheduler.preemptions_per_request,
                                      b.scheduler.preemptions_per_request)


@settings(max_examples=examples(40))
@given(router=st.sampled_from(ROUTERS), scheduler=st.sampled_from(SCHEDULERS),
       mode=st.sampled_from(["fast", "reference"]), roofline=st.booleans(),
       replicas=st.integers(2, 4), seed=st.integers(0, 10_000),
       rate_per_s=st.sampled_from([2.0, 8.0, 40.0]), warmup_s=st.sampled_from([0.0, 3.0]))
def test_replicas_run_apart_as_on_one_clock(router: dict, scheduler: dict, mode: str,  # type: ignore[type-arg]
                                            roofline: bool, replicas: int, seed: int,
                                            rate_per_s: float, warmup_s: float) -> None:
    n = 80
    changes: dict[str, Any] = {
        "workload.num_requests": n, "engine.mode": mode, "warmup_s": warmup_s,
        "kv_capacity_tokens": 400,  # tight: preemptions and waits for KV
        "systems": [{"name": "c", "scheduler": scheduler,
                     "cluster": {"replicas": replicas, "router": router}}],
        **(ROOFLINE if roofline else {}),
    }
    _assert_same(_both(changes, _requests(seed, n, rate_per_s)))


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_mixed_fleet_runs_apart_as_on_one_clock(mode: str) -> None:
    # Groups of their own scheduler, cost and pipeline: a pipelined Orca replica, a paged
    # one with a slower cost, and two chunked ones.
    n = 300
    changes = {
        "workload.num_requests": n, "engine.mode": mode, **ROOFLINE,
        "systems": [{"name": "c", "scheduler": {"kind": "iteration_level", "max_batch_size": 4},
                     "cluster": {"router": {"kind": "round_robin"}, "replicas": [
                         {"count": 1, "hardware": {"gpu": "a100-80gb", "pipeline_parallel": 2}},
                         {"count": 1, "scheduler": {"kind": "paged", "max_num_seqs": 8},
                          "cost": {"kind": "linear", "base_s": 0.02, "per_token_s": 2e-4}},
                         {"count": 2, "scheduler": {"kind": "chunked", "max_num_seqs": 8,
                                                    "chunk_size_tokens": 32}}]}}],
    }
    _assert_same(_both(changes, _requests(3, n, 20.0)))


def test_an_arrival_turned_away_cuts_a_jump_as_on_one_clock() -> None:
    # Replica 0 decodes request 0 alone (batch of 1); request 2 waits behind it, so no arrival
    # can join, and request 4, larger than the KV pool, is turned away. On one clock a replica
    # behind a router ends its jump at the boundary after that arrival (a router that counts
    # would see it go); run apart, it kept the jump whole: 2 rows for its first run, not 3.
    requests = Requests(np.array([0.0, 0.0, 0.1, 0.1, 0.2, 0.2]), np.array([10, 10, 10, 10, 2100, 10]),
                        np.array([50, 5, 5, 5, 1, 5]), np.full(6, 2200))
    changes = {"workload.num_requests": 6, "workload.max_tokens": 2200, "kv_capacity_tokens": 2000,
               "systems": [{"name": "c", "scheduler": {"kind": "iteration_level", "max_batch_size": 1,
                                                        "kv_reservation": "oracle"},
                            "cluster": {"replicas": 2, "router": {"kind": "round_robin"}}}]}
    runs = _both(changes, requests)
    _assert_same(runs)
    assert list(runs[0][1].rejected_ids) == [4]
    assert len(runs[0][0].iterations_frame().query("replica == 0")) == 3


@pytest.mark.parametrize("router", ["least_outstanding", "least_tokens", "least_kv", "power_of_two",
                                    "prefix_affinity"])
@pytest.mark.filterwarnings("ignore:.*no replica keeps a prefix cache")
def test_a_router_that_reads_the_replicas_keeps_the_one_clock(router: str) -> None:
    scenario = make_scenario(**{"systems": [{"name": "c", "scheduler": {"kind": "paged"},
                                             "cluster": {"replicas": 2, "router": {"kind": router}}}]})
    fleet = build_fleet(scenario, scenario.systems[0], _requests(0, 20, 4.0))
    assert not fleet.runs_apart()


def test_a_closed_loop_keeps_the_one_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its arrivals depend on completions: a replica's finish moves another's next arrival.
    def apart(self: Fleet) -> float:
        raise AssertionError("a closed loop ran its replicas apart")

    monkeypatch.setattr(Fleet, "_run_apart", apart)
    scenario = make_scenario(**{
        "workload.arrival": {"kind": "closed_loop", "num_clients": 4,
                             "think_time": {"kind": "constant", "value_s": 0.1}},
        "workload.num_requests": 20,
        "systems": [{"name": "c", "scheduler": {"kind": "paged"},
                     "cluster": {"replicas": 2, "router": {"kind": "round_robin"}}}]})
    result = run_scenario(scenario).systems["c"]
    assert result.requests["finish_s"].notna().all()


def test_a_run_takes_its_replicas_apart_unless_told_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Fleet.run()` runs apart by default, as `orcasim run` does: the same results either
    way, so only the path taken tells (found by mutation: `apart=False` as the default
    passed every test, at the one clock loop's cost)."""
    taken: list[int] = []
    run_apart = Fleet._run_apart

    def noting(self: Fleet) -> float:
        taken.append(len(self.replicas))
        return run_apart(self)

    monkeypatch.setattr(Fleet, "_run_apart", noting)
    scenario = make_scenario(**{"workload.num_requests": 20, "systems": [
        {"name": "c", "scheduler": {"kind": "paged"},
         "cluster": {"replicas": 3, "router": {"kind": "round_robin"}}}]})
    assert run_scenario(scenario).systems["c"].requests["finish_s"].notna().all()
    build_fleet(scenario, scenario.systems[0], _requests(0, 20, 4.0)).run(apart=False)
    assert taken == [3]
