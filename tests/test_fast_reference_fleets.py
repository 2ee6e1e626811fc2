"""Fast mode against reference mode where replicas meet: fleets behind every router.

`tests/test_fast_engine.py` compares the modes on one engine (every scheduler kind, cost
kind and overhead). A fleet adds what one engine never does: a router that reads a
replica's load mid-jump, arrivals cut into jumps by other replicas' completions (closed
loops, sessions), replicas run apart over routed arrivals, groups of their own scheduler,
cost and pipeline. Here a fleet drawn at random, with the single-engine test's schedulers,
costs, warm-ups, closed loops and agents' sessions, runs in fast mode (replicas apart where
the router allows) and in reference mode on one clock: the same routing, per-request
timestamps to 1e-9, iteration rows covering the reference's, the same cache hits and each
replica's summary.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, get_args

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orcasim.cluster import RouterConfig
from orcasim.config import ScenarioError
from orcasim.cost import OverheadConfig
from orcasim.cost.catalog import HardwareConfig
from orcasim.cost.linear import LinearCostConfig
from orcasim.cost.roofline import RooflineCostConfig
from orcasim.fleet import Fleet, build_fleet
from orcasim.metrics import requests_frame
from orcasim.requests import ClientLoop, PromptContent, Requests
from orcasim.run import at_the_engine, replica_summaries
from orcasim.scenario import Scenario
from orcasim.schedulers import SchedulerConfig
from orcasim.schedulers.iteration_level import IterationLevelConfig
from orcasim.schedulers.paged import PagedConfig
from tests.conftest import examples, make_scenario
from tests.test_fast_engine import (
    KINDS,
    SUMMARY_ATOL,
    SUMMARY_RTOL,
    TIMESTAMP_RTOL,
    _scheduler,
    assert_rows_cover,
    scenarios,
)
from tests.test_sessions import session_cases


def router_kinds() -> tuple[str, ...]:
    """Every router kind of the configuration union, so that no new kind escapes the test."""
    union = get_args(RouterConfig)[0]
    return tuple(get_args(cfg.model_fields["kind"].annotation)[0] for cfg in get_args(union))


ROUTERS = router_kinds()
# A group's own hardware for Llama-2-7B: two pipeline stages (Orca's pipelined engine, or a
# one-batch engine whose stages each launch their own layers).
PIPELINED_HARDWARE = HardwareConfig.model_validate({"gpu": "a100-80gb", "pipeline_parallel": 2})


def _kv_tokens(draw: st.DrawFn, scheduler: SchedulerConfig, longest_tokens: int) -> int:
    """As the single-engine cases draw it: tight (some requests never fit), whole blocks."""
    if isinstance(scheduler, IterationLevelConfig) or scheduler.kind == "request_level":
        return longest_tokens * draw(st.integers(1, 4)) + draw(st.integers(0, longest_tokens))
    block = scheduler.block_size_tokens  # type: ignore[union-attr]
    return -(-draw(st.integers(longest_tokens // 2, longest_tokens * 4)) // block) * block


@st.composite
def shared_clock_cases(draw: st.DrawFn) -> dict[str, Any]:
    """20 to 40 requests of up to 20 tokens each way from 2 to 6 clients who send again at
    once, every iteration 2^-7 s: the replicas' boundaries fall together, and with the sends."""
    n = draw(st.integers(20, 40))
    prompt, output = (np.array(draw(st.lists(st.integers(1, 20), min_size=n, max_size=n)))
                      for _ in range(2))
    requests = Requests(np.full(n, np.nan), prompt, output, np.full(n, 64, dtype=np.int64),
                        ClientLoop(draw(st.integers(2, 6)), np.zeros(n)))
    kind = draw(st.sampled_from(KINDS))
    scheduler = _scheduler(draw, kind, 64)
    kv_tokens = draw(st.sampled_from([_kv_tokens(draw, scheduler, 64), 4096]))  # tight, or not
    return dict(requests=requests, scheduler=scheduler, kv_capacity_tokens=kv_tokens,
                cost=LinearCostConfig(kind="linear", base_s=2**-7), deployment=None,
                warmup_s=draw(st.sampled_from([0.0, 0.5])), request_latency_s=0.0)


# Routers that read the replicas' loads, so that what a look at a shared boundary sees matters.
LOOKING = ("least_outstanding", "least_tokens", "least_kv", "power_of_two", "prefix_affinity")


@st.composite
def fleet_cases(draw: st.DrawFn, shared_clock: bool = False) -> dict[str, Any]:
    """A single-engine case (requests, scheduler, cost, warm-up, a closed loop or sessions)
    made a fleet: 1 to 3 replicas behind a drawn router, half the time beside a second group
    of 1 or 2 with a scheduler and KV of its own, and its own cost or pipelined hardware.

    `shared_clock`: iterations of binary fractions of a second and a closed loop whose
    clients send again at once, behind a router that reads the replicas: boundaries of
    several replicas fall together and with the sends, where a router's look must see the
    ENDs the reference loop took before it at that time and no others."""
    if shared_clock:
        case = draw(shared_clock_cases())
    else:
        case = draw(st.one_of(scenarios(), scenarios(closed_loop=True), session_cases()))
    longest_tokens = int(case["requests"].max_tokens[0])
    router: dict[str, Any] = {"kind": draw(st.sampled_from(LOOKING if shared_clock else ROUTERS))}
    if router["kind"] == "session":
        router["fallback"] = draw(st.sampled_from(["round_robin", "random", "least_outstanding",
                                                   "least_tokens", "least_kv", "power_of_two"]))
    groups: list[dict[str, Any]] = [{"count": draw(st.sampled_from([2, 1, 3]))}]
    if draw(st.booleans()):
        kind = draw(st.sampled_from(KINDS))
        other = _scheduler(draw, kind, longest_tokens)
        group: dict[str, Any] = {"count": draw(st.sampled_from([1, 2])), "scheduler": other,
                                 "kv_capacity_tokens": _kv_tokens(draw, other, longest_tokens)}
        own = "same" if shared_clock else draw(st.sampled_from(["linear", "pipelined", "same"]))
        if own == "linear":
            group["cost"] = LinearCostConfig(kind="linear", base_s=draw(st.floats(1e-3, 0.05)),
                                             per_token_s=draw(st.floats(0.0, 1e-3)))
        elif own == "pipelined":  # the roofline with launches that may bind, each stage's own
            overhead = OverheadConfig(per_sequence_s=draw(st.floats(0.0, 1e-3)),
                                      launch_per_layer_s=draw(st.floats(0.0, 5e-4)))
            group.update(model="llama2-7b", hardware=PIPELINED_HARDWARE,
                         cost=RooflineCostConfig(kind="roofline", overhead=overhead))
        groups.append(group)
    requests = case["requests"]
    if requests.sessions is None:  # ids for the session router (agents have their own)
        n = len(requests)
        ids = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=np.int64)
        requests = dataclasses.replace(requests, session_ids=ids)
    return {**case, "requests": requests, "router": router, "groups": groups}


def case_scenario(case: dict[str, Any], mode: str, cluster: dict[str, Any]) -> Scenario:
    """`case`'s cost, KV and warm-up in `mode`, one system of `cluster` (the requests are
    the case's own, given apart, so the workload's keys are not read)."""
    deployment = case["deployment"]
    changes: dict[str, Any] = {
        "engine.mode": mode, "warmup_s": case["warmup_s"], "cost": case["cost"],
        "workload.max_tokens": 1,  # the requests are the case's own: no reservation to refuse
        "kv_capacity_tokens": case["kv_capacity_tokens"],
        "systems": [{"name": "c", "scheduler": case["scheduler"], "cluster": cluster}],
    }
    if deployment is not None:
        changes.update(model=deployment.model, hardware=deployment.hardware)
    return make_scenario(**changes)


def _fleet(case: dict[str, Any], mode: str) -> tuple[Fleet, Requests]:
    scenario = case_scenario(case, mode, {"replicas": case["groups"], "router": case["router"]})
    requests = at_the_engine(case["requests"].for_run(), case["request_latency_s"])
    return build_fleet(scenario, scenario.systems[0], requests), requests


def _run(case: dict[str, Any], mode: str) -> tuple[Fleet, Any, Requests] | str:
    """The fleet, its run (fast mode runs replicas apart where it may, reference mode on one
    clock) and its requests as the engines saw them, or the one-line refusal of building it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # routers without sessions or caches, tables extrapolated
        try:
            fleet, requests = _fleet(case, mode)
        except ScenarioError as err:
            return str(err)
        return fleet, fleet.run(apart=mode == "fast"), requests


def assert_same_tables(fast: Requests, ref: Requests) -> None:
    """The tables the arrival sources wrote: a closed loop's arrivals, and a session's
    calls, whose prompts are made from the answers that came first."""
    np.testing.assert_allclose(fast.arrival_s, ref.arrival_s, rtol=TIMESTAMP_RTOL, err_msg="arrival_s")
    for name in ("prompt_tokens", "output_tokens", "session_ids"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name), err_msg=name)


def _assert_same_fleet(fast: tuple[Fleet, Any, Requests], ref: tuple[Fleet, Any, Requests],
                       warmup_s: float) -> None:
    (fleet_f, run_f, requests_f), (fleet_r, run_r, requests_r) = fast, ref
    assert_same_tables(requests_f, requests_r)
    np.testing.assert_array_equal(fleet_f.assigned, fleet_r.assigned, err_msg="replica")
    np.testing.assert_array_equal(run_f.rejected_ids, run_r.rejected_ids, err_msg="rejected")
    for column in ("first_scheduled_s", "first_token_s", "finish_s"):
        np.testing.assert_allclose(getattr(run_f.recorder, column), getattr(run_r.recorder, column),
                                   rtol=TIMESTAMP_RTOL, err_msg=column)
    rows_f, rows_r = fleet_f.iterations_frame(), fleet_r.iterations_frame()
    for replica_f, replica_r in zip(fleet_f.replicas, fleet_r.replicas, strict=True):
        mine_f = rows_f[rows_f["replica"] == replica_f.index].reset_index(drop=True)
        mine_r = rows_r[rows_r["replica"] == replica_r.index].reset_index(drop=True)
        assert_rows_cover(mine_f, mine_r)
        for name in ("cached_tokens", "prefill_saved_tokens", "preemptions_per_request"):
            np.testing.assert_array_equal(getattr(replica_f.scheduler, name, None),
                                          getattr(replica_r.scheduler, name, None), err_msg=name)
    summary_f, summary_r = _replica_summaries(fast, warmup_s), _replica_summaries(ref, warmup_s)
    for key in summary_r.columns:
        np.testing.assert_allclose(summary_f[key].astype(float), summary_r[key].astype(float),
                                   rtol=SUMMARY_RTOL, atol=SUMMARY_ATOL.get(key, 0.0), err_msg=key)


def _replica_summaries(ran: tuple[Fleet, Any, Requests], warmup_s: float) -> pd.DataFrame:
    """Each replica's summary row (latencies, busy share, KV use) as a fleet's run has it."""
    fleet, run, requests = ran
    reqs = requests_frame(requests, run.recorder, run.rejected_ids)
    reqs["replica"] = fleet.assigned
    return replica_summaries(reqs, fleet.iterations_frame(), warmup_s, len(fleet.replicas))


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet_cases())
def test_a_fleet_in_fast_mode_matches_reference_mode(case: dict[str, Any]) -> None:
    fast, ref = _run(case, "fast"), _run(case, "reference")
    if isinstance(ref, str):  # refused alike (prefix caching over data-parallel groups, say)
        assert fast == ref
        return
    assert not isinstance(fast, str), fast
    _assert_same_fleet(fast, ref, case["warmup_s"])


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet_cases(shared_clock=True))
def test_a_router_s_look_at_a_shared_boundary_sees_what_reference_mode_sees(case: dict[str, Any]) -> None:
    # Every scheduler kind, so every engine variant's jump (fused Orca and paged loops, the
    # generic stepper, a static batch) is split at a boundary it shares with another's.
    fast, ref = _run(case, "fast"), _run(case, "reference")
    assert not isinstance(fast, str) and not isinstance(ref, str), (fast, ref)
    _assert_same_fleet(fast, ref, case["warmup_s"])


@pytest.mark.parametrize("kind", ROUTERS)
def test_every_router_kind_runs_a_fleet_in_both_modes(kind: str) -> None:
    # ROUTERS comes from the configuration union: a new kind that the draws above would
    # build only with keys of its own (and so be refused alike, unseen) fails here.
    rng = np.random.default_rng(0)
    n = 30
    prompt = rng.integers(1, 40, n)
    content = PromptContent([(0, int(p)) for p in prompt], np.arange(10_000, 10_000 + n))
    requests = Requests(np.sort(rng.uniform(0.0, 1.0, n)), prompt, rng.integers(1, 20, n),
                        np.full(n, 64, dtype=np.int64), session_ids=rng.integers(0, 4, n),
                        content=content)
    case = dict(requests=requests, cost=LinearCostConfig(kind="linear", base_s=0.01),
                scheduler=PagedConfig(kind="paged", max_num_seqs=4, enable_prefix_caching=True),
                kv_capacity_tokens=256, warmup_s=0.0, request_latency_s=0.0, deployment=None,
                router={"kind": kind}, groups=[{"count": 3}])
    fast, ref = _run(case, "fast"), _run(case, "reference")
    assert not isinstance(fast, str) and not isinstance(ref, str), (fast, ref)
    _assert_same_fleet(fast, ref, 0.0)
    assert len(set(fast[0].assigned.tolist())) > 1  # routed to more than one replica
