"""Fast mode against reference mode on a disaggregated cluster, drawn as the single engine is.

`tests/test_disagg.py` compares the modes over pool sizes, routers, handoffs and schedulers
with room to spare (a linear cost, KV for every request at once). Here each pool is drawn
as `tests/test_fast_engine.py` draws a single engine: every scheduler kind a pool takes
(paged of every policy, prefill caching, padding, chunks down to one token, swapping), KV so
tight that requests preempt and some never fit, every cost kind with and without the
engine's overhead, warm-ups, a way in, closed loops, agents' sessions, and a pipelined decode
pool. Fast mode must give reference mode's routing, handoffs, per-request timestamps to 1e-9
and iteration rows.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orcasim.config import ScenarioError
from orcasim.cost.catalog import HardwareConfig
from orcasim.cost.linear import LinearCostConfig
from orcasim.cost.roofline import RooflineCostConfig
from orcasim.disagg import DisaggregatedFleet, build_disaggregated
from orcasim.requests import Requests
from orcasim.run import at_the_engine
from orcasim.schedulers.chunked import ChunkedConfig
from orcasim.schedulers.paged import PagedConfig
from tests.conftest import examples
from tests.test_fast_engine import (
    DEPLOYMENTS,
    KINDS,
    TIMESTAMP_RTOL,
    _scheduler,
    assert_rows_cover,
    overheads,
    scenarios,
)
from tests.test_fast_reference_fleets import ROUTERS, _kv_tokens, assert_same_tables, case_scenario
from tests.test_sessions import session_cases

POOL_KINDS = tuple(kind for kind in KINDS if kind != "request_level")  # refused in a pool


@st.composite
def pools(draw: st.DrawFn, longest_tokens: int, decode: bool, pull: bool) -> dict[str, Any]:
    """One pool: 1 or 2 instances of a kind a pool takes, behind any router."""
    kind = draw(st.sampled_from(POOL_KINDS + (("distserve_decode",) if decode and pull else ())))
    if kind == "distserve_decode":
        scheduler: Any = PagedConfig(kind="paged", policy="distserve_decode",
                                     max_num_seqs=draw(st.integers(1, 8)),
                                     block_size_tokens=draw(st.integers(1, 16)))
    else:
        scheduler = _scheduler(draw, kind, longest_tokens)
    # DistServe's decode rule deadlocks under the tight KV the others are drawn with.
    kv_tokens = (longest_tokens * draw(st.integers(4, 8)) * scheduler.block_size_tokens
                 if kind == "distserve_decode" else _kv_tokens(draw, scheduler, longest_tokens))
    router = {"kind": draw(st.sampled_from(ROUTERS))}
    if router["kind"] == "session":  # a session's calls to one instance, else round robin
        router["fallback"] = "round_robin"
    return {"count": draw(st.sampled_from([1, 2])), "scheduler": scheduler,
            "kv_capacity_tokens": kv_tokens, "router": router}


@st.composite
def disagg_cases(draw: st.DrawFn) -> dict[str, Any]:
    """A single-engine case (requests, cost, warm-up, way in, closed loop or not) split
    into a prefill pool and a decode pool of their own schedulers and KV."""
    case = draw(st.one_of(scenarios(), scenarios(closed_loop=True), session_cases()))
    longest_tokens = int(case["requests"].max_tokens[0])
    pull = draw(st.booleans())
    cluster: dict[str, Any] = {
        "prefill": draw(pools(longest_tokens, decode=False, pull=pull)),
        "decode": draw(pools(longest_tokens, decode=True, pull=pull)),
        "first_token": draw(st.sampled_from(["prefill", "decode"])),
        "handoff": "pull" if pull else "push",
        "link": {"latency_s": draw(st.sampled_from([0.0, 0.01, 0.3])),
                 "bandwidth_bytes_per_s": draw(st.sampled_from([1e9, 1e12]))},
    }
    if not pull and draw(st.booleans()):
        # A decode pool over two pipeline stages (Orca's pipelined engine where it is Orca),
        # priced by the roofline, each stage's launches floored where the overhead has them.
        deployment = DEPLOYMENTS[draw(st.sampled_from([1, 2]))]
        case["deployment"] = deployment
        case["cost"] = RooflineCostConfig(kind="roofline", overhead=draw(overheads(launches=True)))
        hardware = deployment.hardware.model_dump() | {"pipeline_parallel": 2}
        cluster["decode"]["hardware"] = HardwareConfig.model_validate(hardware)
    return {**case, "cluster": cluster}


def _fleet(case: dict[str, Any], mode: str) -> tuple[DisaggregatedFleet, Requests]:
    scenario = case_scenario(case, mode, case["cluster"])
    requests = at_the_engine(case["requests"].for_run(), case["request_latency_s"])
    return build_disaggregated(scenario, scenario.systems[0], requests), requests


def _run(case: dict[str, Any], mode: str) -> tuple[DisaggregatedFleet, Any, Requests] | str:
    """The cluster, its run and its requests as the prefill pool's router saw them, or the
    one-line refusal of building or running it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # links without a model, tables extrapolated
        try:
            fleet, requests = _fleet(case, mode)
            return fleet, fleet.run(), requests
        except ScenarioError as err:  # DistServe's decode policy deadlocking, say
            return str(err)


def _assert_same(fast: tuple[DisaggregatedFleet, Any, Requests],
                 ref: tuple[DisaggregatedFleet, Any, Requests]) -> None:
    (fleet_f, run_f, requests_f), (fleet_r, run_r, requests_r) = fast, ref
    assert_same_tables(requests_f, requests_r)
    for name in ("prefill_replica", "decode_replica"):
        np.testing.assert_array_equal(getattr(fleet_f, name), getattr(fleet_r, name), err_msg=name)
    np.testing.assert_array_equal(run_f.rejected_ids, run_r.rejected_ids, err_msg="rejected")
    np.testing.assert_allclose(fleet_f.kv_transfer_s, fleet_r.kv_transfer_s, rtol=TIMESTAMP_RTOL,
                               err_msg="kv_transfer_s")
    for column in ("first_scheduled_s", "first_token_s", "finish_s"):
        np.testing.assert_allclose(getattr(run_f.recorder, column), getattr(run_r.recorder, column),
                                   rtol=TIMESTAMP_RTOL, err_msg=column)
    np.testing.assert_allclose(fleet_f.decode_first_scheduled_s(), fleet_r.decode_first_scheduled_s(),
                               rtol=TIMESTAMP_RTOL, err_msg="decode first_scheduled_s")
    for replica_f, replica_r in zip(fleet_f.replicas, fleet_r.replicas, strict=True):
        assert_rows_cover(replica_f.recorder.iterations_frame(), replica_r.recorder.iterations_frame())
        for name in ("cached_tokens", "prefill_saved_tokens", "preemptions_per_request"):
            np.testing.assert_array_equal(getattr(replica_f.scheduler, name, None),
                                          getattr(replica_r.scheduler, name, None), err_msg=name)


def assert_same_or_refused_alike(case: dict[str, Any]) -> None:
    fast, ref = _run(case, "fast"), _run(case, "reference")
    if isinstance(ref, str):  # refused alike (a pool that could admit nothing, a deadlock)
        assert fast == ref
        return
    assert not isinstance(fast, str), fast
    _assert_same(fast, ref)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(disagg_cases())
def test_a_disaggregated_cluster_in_fast_mode_matches_reference_mode(case: dict[str, Any]) -> None:
    assert_same_or_refused_alike(case)


@st.composite
def pulled_turned_away_cases(draw: st.DrawFn) -> dict[str, Any]:
    """A burst of 10 to 30 requests into a prefill pool whose KV holds one to a few prompts, pulled
    by a paged decode instance of 4 to 12 tokens that turns the longer ones away: each turned
    away frees prefill KV that a waiting prompt takes, while the decode instance is mid-run."""
    n = draw(st.integers(10, 30))
    prompt, output = (np.array(draw(st.lists(st.integers(1, 8), min_size=n, max_size=n)))
                      for _ in range(2))
    arrival_s = np.sort(np.array(draw(st.lists(st.sampled_from([0.0, 0.0, 0.05, 0.1]), min_size=n,
                                               max_size=n))))
    requests = Requests(arrival_s, prompt, output, np.full(n, 16, dtype=np.int64))
    block = draw(st.integers(1, 4))
    memory = dict(max_num_seqs=draw(st.integers(1, 4)), block_size_tokens=block, watermark=0.0)
    decode = draw(st.sampled_from([
        PagedConfig(kind="paged", **memory), ChunkedConfig(kind="chunked", chunk_size_tokens=4, **memory),
        PagedConfig(kind="paged", policy="distserve_decode", **memory)]))
    prefill = draw(pools(16, decode=False, pull=True))
    prefill_block = getattr(prefill["scheduler"], "block_size_tokens", 1)
    # A few prompts' KV (up to 8 tokens and one more each), held until the decode side pulls it.
    prefill["kv_capacity_tokens"] = max(draw(st.integers(9, 18)) // prefill_block, 1) * prefill_block
    cluster: dict[str, Any] = {
        "prefill": prefill,
        # One decode instance: alone behind its router, it learns of a turned-away request
        # from its source (two cut at every delivery they will turn away, as routed).
        "decode": {"count": 1, "scheduler": decode,
                   "kv_capacity_tokens": max(draw(st.integers(4, 12)) // block, 1) * block},
        "first_token": draw(st.sampled_from(["prefill", "decode"])), "handoff": "pull",
        "link": {"latency_s": draw(st.sampled_from([0.0, 0.01]))}}
    return dict(requests=requests, scheduler=cluster["prefill"]["scheduler"],
                cost=LinearCostConfig(kind="linear", base_s=2**-5), deployment=None,
                kv_capacity_tokens=16, warmup_s=0.0, request_latency_s=0.0, cluster=cluster)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pulled_turned_away_cases())
def test_a_pulled_request_turned_away_mid_run_frees_prefill_kv_as_reference_mode_does(
        case: dict[str, Any]) -> None:
    assert_same_or_refused_alike(case)
