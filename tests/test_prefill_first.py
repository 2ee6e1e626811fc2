"""vLLM's prefill-first scheduler (v0.2-v0.5), driven in plain Python with hand-made steps.

Each trace is worked out by hand from the rules of `vllm/core/scheduler.py` and
`block_manager.py` of v0.2.3 (see orcasim.schedulers.prefill_first).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kv_driver import assert_paged_end_state, check_paged_step, drive, make_requests, planned_tokens

from orcasim.schedulers import build_scheduler
from orcasim.schedulers.paged import PagedConfig, PagedScheduler
from orcasim.schedulers.prefill_first import PrefillFirstScheduler
from tests.conftest import examples


def _sched(reqs, capacity: int, **kw) -> PagedScheduler:
    cfg = PagedConfig.model_validate({"kind": "paged", "policy": "prefill_first",
                                      "watermark": 0.0, **kw})
    return build_scheduler(cfg, reqs, capacity)


def test_prompts_run_alone_and_decodes_wait() -> None:
    # A, B at step 0; C at step 2. C's prompt gets an iteration of its own: A and B stall.
    reqs = make_requests([3, 2, 5], [4, 3, 2], arrivals=[0, 0, 2])
    sched = _sched(reqs, capacity=40, block_size_tokens=2, max_num_seqs=4,
                   max_num_batched_tokens=16)
    assert isinstance(sched, PrefillFirstScheduler)
    trace = drive(sched, reqs, check_paged_step)
    assert planned_tokens(trace) == [{0: 3, 1: 2}, {0: 1, 1: 1}, {2: 5}, {0: 1, 1: 1, 2: 1},
                                     {0: 1}]
    assert trace.finish_step == {1: 3, 2: 3, 0: 4}
    assert_paged_end_state(sched, reqs, trace)


def test_the_mixed_policy_lets_the_prompt_ride_with_decodes() -> None:
    # The same requests under vLLM v1's rule: C's prompt joins A's and B's decodes.
    reqs = make_requests([3, 2, 5], [4, 3, 2], arrivals=[0, 0, 2])
    cfg = PagedConfig(kind="paged", watermark=0.0, block_size_tokens=2, max_num_seqs=4,
                      max_num_batched_tokens=16)
    trace = drive(build_scheduler(cfg, reqs, 40), reqs, check_paged_step)
    assert planned_tokens(trace)[2] == {0: 1, 1: 1, 2: 5}


def test_padding_limits_which_prompts_share_an_iteration() -> None:
    # 10 + 100 padded to 2 x 100 = 200 tokens with 90 of padding: above 64, so apart.
    reqs = make_requests([10, 100], [2, 2])
    sched = _sched(reqs, capacity=400, block_size_tokens=2, max_num_batched_tokens=256,
                   pad_prompts=True, max_padding_tokens=64)
    trace = drive(sched, reqs, check_paged_step)
    assert planned_tokens(trace) == [{0: 10}, {1: 100}, {0: 1, 1: 1}]


def test_padded_prompts_are_costed_at_the_longest() -> None:
    reqs = make_requests([10, 40, 40], [2, 2, 2])
    sched = _sched(reqs, capacity=400, block_size_tokens=2, max_num_batched_tokens=100, max_num_seqs=8,
                   pad_prompts=True)
    for req in range(3):
        sched.add_request(req)
    plan = sched.schedule(0.0)
    # A third prompt would make 3 x 40 = 120 padded tokens, above the budget of 100.
    assert plan.req_ids.tolist() == [0, 1]
    assert plan.num_new_tokens.tolist() == [10, 40]
    assert plan.batch.query_tokens.tolist() == [40, 40]
    assert plan.batch.context_tokens.tolist() == [40, 40]


def test_unpadded_prompts_are_costed_at_their_own_lengths() -> None:
    # The same prompts without padding (the default, vLLM from v0.4): all three fit the
    # budget of 100 (10 + 40 + 40 = 90), each priced at its own length.
    reqs = make_requests([10, 40, 40], [2, 2, 2])
    sched = _sched(reqs, capacity=400, block_size_tokens=2, max_num_batched_tokens=100, max_num_seqs=8)
    for req in range(3):
        sched.add_request(req)
    plan = sched.schedule(0.0)
    assert plan.req_ids.tolist() == [0, 1, 2]
    assert plan.batch.query_tokens.tolist() == [10, 40, 40]
    assert plan.batch.context_tokens.tolist() == [10, 40, 40]
    assert sched.padded_prompt_tokens([10, 40]) is None


def test_the_watermark_holds_even_when_nothing_runs() -> None:
    # 100 blocks of one token, 5 kept free. Peak 96 tokens needs 96 + 5 > 100: rejected.
    reqs = make_requests([96, 90], [1, 4], max_tokens=100)
    sched = _sched(reqs, capacity=100, block_size_tokens=1, watermark=0.05)
    trace = drive(sched, reqs, check_paged_step)
    assert sched.rejected_ids == [0]
    assert planned_tokens(trace)[0] == {1: 90}
    # Peak 95 passes can_allocate (100 - 95 >= 5), and can_append_slot's free block is the
    # watermark's: vLLM v0.2.3's BlockSpaceManager serves it (a tester ran it); orcasim
    # turned it away, a block too strict. A prompt alone is never preempted, so it fits
    # under swap too (it was turned away there).
    served = make_requests([95], [1], max_tokens=100)
    sched = _sched(served, capacity=100, block_size_tokens=1, watermark=0.05)
    assert drive(sched, served, check_paged_step).finish_step == {0: 0} and not sched.rejected_ids
    swap = build_scheduler(PagedConfig(kind="paged", policy="prefill_first", block_size_tokens=1,
                                       watermark=0.05, preemption="swap", kv_bytes_per_token=1),
                           served, 100)
    assert not swap.never_fits(0)
    # vLLM v1's rule waives the watermark for a lone request, which then fits.
    mixed = build_scheduler(PagedConfig(kind="paged", block_size_tokens=1, watermark=0.05),
                            reqs, 100)
    assert not mixed.never_fits(0)


def test_a_decode_needs_a_free_block_even_when_it_takes_none() -> None:
    # 5 blocks of 4. After the prompts A (8) and B (7) hold 2 blocks each. At step 1 A takes
    # the last free block; B needs none but finds no block free, so it preempts itself
    # (can_append_slot). Recomputed at step 2 (7 + 1 tokens, 2 blocks), it is preempted
    # again at step 3; at step 4 its 9 tokens need 3 blocks, 2 are free, so A decodes.
    reqs = make_requests([8, 7], [4, 3])
    sched = _sched(reqs, capacity=20, block_size_tokens=4)
    trace = drive(sched, reqs, check_paged_step)
    assert planned_tokens(trace) == [{0: 8, 1: 7}, {0: 1}, {1: 8}, {0: 1}, {0: 1}, {1: 9}]
    assert [p.preemptions for p in trace.plans] == [0, 1, 0, 1, 0, 0]
    assert_paged_end_state(sched, reqs, trace)
    # vLLM v1's rule grows B without a preemption: it needs no block at step 1.
    mixed = build_scheduler(PagedConfig(kind="paged", watermark=0.0, block_size_tokens=4),
                            reqs, 20)
    assert planned_tokens(drive(mixed, reqs))[1] == {0: 1, 1: 1}


def test_nothing_is_prefilled_while_a_request_is_swapped_out() -> None:
    # As above with swap: B is swapped out at step 1 and C arrives at step 2, yet C's
    # prompt waits until B is back (step 4, once A is done); copies cost 1 s a token.
    reqs = make_requests([8, 7, 2], [4, 3, 1], arrivals=[0, 0, 2])
    sched = _sched(reqs, capacity=20, block_size_tokens=4, preemption="swap",
                   swap_space_bytes=100, kv_bytes_per_token=1, swap_bandwidth_bytes_per_s=1.0)
    trace = drive(sched, reqs, check_paged_step)
    assert planned_tokens(trace) == [{0: 8, 1: 7}, {0: 1}, {0: 1}, {0: 1}, {1: 1}, {2: 2},
                                     {1: 1}]
    assert [p.copy_time_s for p in trace.plans] == [0.0, 8.0, 0.0, 0.0, 8.0, 0.0, 0.0]
    assert_paged_end_state(sched, reqs, trace)


def test_a_swap_in_that_leaves_exactly_the_watermark_comes_back() -> None:
    # Three blocks of 4 tokens. A's prompt runs alone, then B's and C's: the pool is full.
    # At step 2, A needs a second block: C and then B (a free block per running sequence)
    # are swapped out, 4 tokens each at 1 byte/s. A finishes at step 3, leaving 3 blocks
    # free. At step 4, B comes back (3 - (1 + 1) = 1 >= 0 blocks above the watermark),
    # then C with exactly none to spare (2 - (1 + 1) = 0 >= 0): both decode together.
    reqs = make_requests([4, 1, 2], [3, 3, 3], arrivals=[0, 1, 1])
    sched = _sched(reqs, capacity=12, block_size_tokens=4, preemption="swap",
                   swap_space_bytes=100, kv_bytes_per_token=1, swap_bandwidth_bytes_per_s=1.0)
    swapped = []
    trace = drive(sched, reqs, lambda s, out: swapped.append(list(s.swapped)))
    assert planned_tokens(trace) == [{0: 4}, {1: 1, 2: 2}, {0: 1}, {0: 1}, {1: 1, 2: 1},
                                     {1: 1, 2: 1}]
    assert swapped == [[], [], [1, 2], [1, 2], [], []]
    assert [p.copy_time_s for p in trace.plans] == [0.0, 0.0, 8.0, 0.0, 8.0, 0.0]
    assert trace.finish_step == {0: 3, 1: 5, 2: 5}
    assert_paged_end_state(sched, reqs, trace)


def test_a_readmitted_request_decodes_in_arrival_order() -> None:
    # B (id 1) is preempted and readmitted after C (id 2) started: running stays [0, 1, 2].
    reqs = make_requests([8, 7, 1], [6, 3, 8], arrivals=[0, 0, 1])
    sched = _sched(reqs, capacity=24, block_size_tokens=4)
    orders = []
    drive(sched, reqs, lambda s, out: orders.append(list(s.running)))
    assert all(order == sorted(order) for order in orders)


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="pad_prompts applies only to policy: prefill_first"):
        PagedConfig(kind="paged", pad_prompts=True)
    with pytest.raises(ValueError, match="expected >= max_num_seqs"):
        PagedConfig(kind="paged", policy="prefill_first", max_num_seqs=64,
                    max_num_batched_tokens=32)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_runs_keep_the_paged_invariants(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 12))
    prompts = data.draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    outputs = data.draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    arrivals = np.cumsum(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    reqs = make_requests(prompts, outputs, arrivals=arrivals.tolist())
    block = data.draw(st.integers(1, 8))
    longest = max(p + o for p, o in zip(prompts, outputs, strict=True))
    capacity = block * data.draw(st.integers(1, 3 * longest // block + 2))
    sched = _sched(reqs, capacity, block_size_tokens=block, max_num_seqs=8,
                   max_num_batched_tokens=max(longest, 8), pad_prompts=data.draw(st.booleans()),
                   preemption=data.draw(st.sampled_from(["recompute", "swap"])),
                   watermark=data.draw(st.sampled_from([0.0, 0.1])),
                   swap_space_bytes=data.draw(st.sampled_from([0, 64, 10**6])),
                   kv_bytes_per_token=1)
    trace = drive(sched, reqs, _check_prefill_first_step)
    assert_paged_end_state(sched, reqs, trace)


def _check_prefill_first_step(sched, out) -> None:
    """A plan is all prompts (nothing computed yet) or all decodes (one known token left)."""
    check_paged_step(sched, out)
    ids = out.req_ids
    known = sched.requests.prompt_tokens[ids] + sched.generated[ids]
    prompts, decodes = sched.computed[ids] == 0, known - sched.computed[ids] == 1
    assert prompts.all() or decodes.all()
    assert (out.num_new_tokens == known - sched.computed[ids]).all()  # never a chunk


def test_decodes_are_costed_at_their_own_contexts_even_when_prompts_are_padded() -> None:
    """Padding applies to prompt iterations only: a decode iteration of A (prompt 3) and B
    (prompt 5) reads 4 and 6 tokens, not a padded batch."""
    reqs = make_requests([3, 5], [3, 3])
    sched = _sched(reqs, capacity=64, block_size_tokens=2, max_num_batched_tokens=16,
                   max_num_seqs=4, pad_prompts=True)
    batches = []
    drive(sched, reqs, lambda s, out: batches.append(
        (out.batch.query_tokens.tolist(), out.batch.context_tokens.tolist())))
    assert batches[:2] == [([5, 5], [5, 5]), ([1, 1], [4, 6])]


@pytest.mark.parametrize(("second_prompt", "joins"), [(4, True), (5, False)])
def test_padded_prompts_may_fill_the_token_budget_exactly(second_prompt: int, joins: bool) -> None:
    """Two prompts padded to the longer: 2 x 4 = 8 tokens fill a budget of 8; 2 x 5 do not."""
    reqs = make_requests([4, second_prompt], [2, 2])
    sched = _sched(reqs, capacity=64, block_size_tokens=2, max_num_batched_tokens=8,
                   max_num_seqs=2, pad_prompts=True)
    sched.add_request(0)
    sched.add_request(1)
    assert sched.schedule(0.0).req_ids.tolist() == ([0, 1] if joins else [0])


@pytest.mark.parametrize("scheduler", [
    {"kind": "paged", "policy": "prefill_first", "preemption": "swap"},
    {"kind": "chunked", "preemption": "swap"},
])
def test_swap_space_is_sized_from_the_model_when_bytes_are_not_given(scheduler: dict) -> None:
    """Without `kv_bytes_per_token` the bytes a block copies come from the scenario's model
    and hardware (OPT-13B: 2 x 40 layers x 5120 x 2 bytes), for every paged policy."""
    from orcasim.run import run_scenario
    from orcasim.scenario import scenario_from_dict

    data = {"name": "swap", "seed": 1, "model": "opt-13b", "hardware": {"gpu": "a100-80gb"},
            "cost": {"kind": "roofline"},
            "workload": {"num_requests": 5, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                         "prompt_tokens": {"kind": "uniform", "low": 8, "high": 64},
                         "output_tokens": {"kind": "uniform", "low": 4, "high": 16},
                         "max_tokens": 96},
            "systems": [{"name": "s", "scheduler": scheduler}]}
    result = run_scenario(scenario_from_dict(data))
    assert result.systems["s"].summary["requests_completed"] == 5
    cfg = scenario_from_dict(data).systems[0].scheduler
    kv_bytes = 2 * 40 * 5120 * 2
    sched = build_scheduler(cfg, make_requests([8], [4]), 1024, kv_bytes)
    assert sched.swap_capacity_blocks == 4 * 2**30 // (kv_bytes * 16)


def test_a_request_fits_alone_by_the_blocks_its_last_decode_holds() -> None:
    """4 blocks of 16, no watermark. Prompt 20 + output 30 peaks at 49 tokens, 4 blocks, but
    its last decode starts holding 48 (3 blocks): can_append_slot finds the 4th free, and it
    finishes. A prompt of 64 with one output token fills the pool in its prompt step and
    ends there. Both were turned away (its peak's blocks + 1 > 4); vLLM v0.2.3 serves both.
    Prompt 20 + output 31 would start its last decode holding all 4: turned away."""
    reqs = make_requests([20, 64, 20], [30, 1, 31], max_tokens=64)
    for preemption in ("recompute", "swap"):
        sched = build_scheduler(PagedConfig(kind="paged", policy="prefill_first", block_size_tokens=16,
                                            preemption=preemption, kv_bytes_per_token=1), reqs, 64)
        assert [sched.never_fits(i) for i in range(3)] == [False, False, True], preemption
    alone = make_requests([20], [30], max_tokens=64)
    sched = _sched(alone, capacity=64, block_size_tokens=16, watermark=0.0)
    assert drive(sched, alone, check_paged_step).finish_step == {0: 29}
    assert not sched.rejected_ids and sched.preemptions_total == 0


def test_coming_back_by_swap_takes_a_block_more_than_by_recompute() -> None:
    """3 blocks of 16, one kept by the watermark. Prompt 20 + output 13 peaks at 32 tokens
    (2 blocks): preempted by recompute it re-prefills 2 blocks (can_allocate: 3 - 2 >= 1);
    by swap, can_swap_in asks for its 2 blocks + 1 (3 - 3 < 1), so it could never come back."""
    reqs = make_requests([20], [13], max_tokens=48)
    fits = {}
    for preemption in ("recompute", "swap"):
        sched = build_scheduler(PagedConfig(kind="paged", policy="prefill_first", block_size_tokens=16,
                                            watermark=0.34, preemption=preemption,
                                            kv_bytes_per_token=1), reqs, 48)
        assert sched.watermark_blocks == 1
        fits[preemption] = not sched.never_fits(0)
    assert fits == {"recompute": True, "swap": False}
