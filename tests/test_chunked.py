"""The chunked-prefill (Sarathi-Serve) scheduler: a token budget, decodes first, prompt chunks."""

from __future__ import annotations

from hypothesis import given, settings
from kv_driver import (
    assert_paged_end_state,
    check_paged_step,
    drive,
    make_requests,
    planned_tokens,
)
from test_paged import paged_cases

from orcasim.schedulers.chunked import ChunkedConfig, ChunkedScheduler
from tests.conftest import examples

EXAMPLES = 120


def _chunked(reqs, capacity: int, **kw) -> ChunkedScheduler:
    cfg = ChunkedConfig.model_validate({"kind": "chunked", "watermark": 0.0, **kw})
    return ChunkedScheduler(cfg, reqs, capacity)


def test_a_long_prompt_is_chunked_and_only_its_last_chunk_emits():
    reqs = make_requests([10], [2])
    sched = _chunked(reqs, capacity=64, chunk_size_tokens=4)
    trace = drive(sched, reqs, check_paged_step)
    assert planned_tokens(trace) == [{0: 4}, {0: 4}, {0: 2}, {0: 1}]
    assert trace.first_token_step == {0: 2} and trace.finish_step == {0: 3}


def test_decodes_go_first_and_a_prompt_fills_the_rest_of_the_budget():
    # Request 0 decodes while request 1's 9-token prompt arrives: it gets 6 - 1 = 5 tokens.
    reqs = make_requests([2, 9], [4, 2], arrivals=[0.0, 1.0])
    sched = _chunked(reqs, capacity=64, chunk_size_tokens=6)
    trace = drive(sched, reqs, check_paged_step)
    assert planned_tokens(trace) == [{0: 2}, {0: 1, 1: 5}, {0: 1, 1: 4}, {0: 1, 1: 1}]
    assert trace.first_token_step == {0: 0, 1: 2}


def _check_decodes_first(sched, out) -> None:
    """Stall-free batching: prefill chunks only take budget that no decode wanted."""
    check_paged_step(sched, out)
    req = sched.requests
    need = req.prompt_tokens + sched.generated - sched.computed  # before this step
    decoding = (sched.generated >= 1) & (need == 1)
    planned = set(out.req_ids.tolist())
    left_out = [r for r in sched.running if decoding[r] and r not in planned]
    if left_out:
        assert decoding[out.req_ids].all(), f"decodes {left_out} wait behind a prefill chunk"
    # Only the last planned request may get less than all its known tokens.
    partial = out.num_new_tokens < need[out.req_ids]
    assert not partial[:-1].any()


@given(paged_cases(chunked=True))
@settings(max_examples=examples(EXAMPLES), deadline=None)
def test_chunked_invariants_hold_and_every_request_completes(case):
    reqs, capacity, cfg = case
    sched = _chunked(reqs, capacity, **cfg)
    trace = drive(sched, reqs, _check_decodes_first)
    assert_paged_end_state(sched, reqs, trace)
    assert all(int(p.num_new_tokens.sum()) <= cfg["chunk_size_tokens"] for p in trace.plans)
