"""The paged schedulers' fast-forward hooks (orcasim.schedulers.paged_runs), by hand.

A run's jump must leave the scheduler exactly where its iterations, planned one at a time by
`schedule`, would: the same progress, the same blocks in the same order and, with prefix
caching, the same blocks named by their hashes in the same order. test_fast_engine checks
this on random scenarios through the engine; these cases check it on the hooks themselves,
with the numbers worked out in each docstring.
"""

from __future__ import annotations

import numpy as np
import pytest

from orcasim.requests import PromptContent, Requests
from orcasim.schedulers import build_scheduler
from orcasim.schedulers.chunked import ChunkedConfig
from orcasim.schedulers.paged import PagedConfig, PagedScheduler
from orcasim.schedulers.paged_runs import BlockGrowth, PagedContinuedRun, PagedRun

BLOCK = 4


def _build(prompts: list[int], outputs: list[int], kv_tokens: int = 1024, *, kind: str = "paged",
           content: PromptContent | None = None, **cfg: object) -> PagedScheduler:
    """A `kind` scheduler (blocks of 4 tokens) over requests of these lengths, none added."""
    requests = Requests(np.zeros(len(prompts)), np.array(prompts), np.array(outputs),
                        np.array(prompts) + np.array(outputs), content=content).for_run()
    config = ChunkedConfig(kind="chunked", block_size_tokens=BLOCK, **cfg) if kind == "chunked" \
        else PagedConfig(kind="paged", block_size_tokens=BLOCK, **cfg)
    scheduler = build_scheduler(config, requests, kv_tokens)
    assert isinstance(scheduler, PagedScheduler)
    return scheduler


def _scheduler(prompts: list[int], outputs: list[int], kv_tokens: int = 1024, *,
               caching: bool = False, kind: str = "paged", **cfg: object) -> PagedScheduler:
    """Requests of these lengths, all added at once. With caching, each prompt is its own
    content and each output its own id, so no two blocks share a hash."""
    n = len(prompts)
    content = PromptContent([(10 + i, prompts[i]) for i in range(n)],
                            np.arange(n, dtype=np.int64) + 1000) if caching else None
    if caching:
        cfg["enable_prefix_caching"] = True
    scheduler = _build(prompts, outputs, kv_tokens, kind=kind, content=content, **cfg)
    for req in range(n):
        scheduler.add_request(req)
    return scheduler


def _record_cache_calls(scheduler: PagedScheduler) -> list[tuple[int, tuple[int, ...]]]:
    """Every `allocator.cache(req, hashes)` call from now on, in order."""
    calls: list[tuple[int, tuple[int, ...]]] = []
    cache = scheduler.allocator.cache

    def recording(req_id: int, hashes: list[int]) -> None:
        calls.append((req_id, tuple(hashes)))
        cache(req_id, hashes)

    scheduler.allocator.cache = recording  # type: ignore[method-assign]
    return calls


def _step(scheduler: PagedScheduler, steps: int) -> list[int]:
    """`steps` iterations planned one at a time; the ids that finished, in order."""
    finished: list[int] = []
    for _ in range(steps):
        finished += scheduler.update_from_output(scheduler.schedule(0.0)).finished_ids.tolist()
    return finished


def _assert_same_state(jumped: PagedScheduler, stepped: PagedScheduler) -> None:
    for state in ("computed", "generated", "peak_computed"):
        np.testing.assert_array_equal(getattr(jumped, state), getattr(stepped, state), state)
    assert jumped.running == stepped.running
    assert jumped.allocator.tables == stepped.allocator.tables
    assert jumped.allocator.free_pool() == stepped.allocator.free_pool()
    assert jumped.allocator.allocated_tokens == stepped.allocator.allocated_tokens


# The block arithmetic -------------------------------------------------------------------

def test_block_growth_by_hand() -> None:
    """Blocks of 4; requests 7, 8, 9 compute positions 5, 6, 8 at the run's first step.
    Their rooms (steps to their next block) are 3, 2, 0: step 0 takes 9's block, step 2
    8's, step 3 7's, and every 4 steps the same again. With 40 tokens allocated before the
    run, the reservations after each step are 44, 44, 48, 52, 56, 56, 60, 64, 68."""
    growth = BlockGrowth(order=[9, 8, 7], cum=[1, 1, 2, 3], block_size_tokens=BLOCK,
                         allocated_tokens=40)
    assert growth.reserved_tokens(9) == [44, 44, 48, 52, 56, 56, 60, 64, 68]
    assert [growth.reserved_at(step) for step in range(9)] == growth.reserved_tokens(9)
    assert growth.reserved_tokens(0) == []
    assert growth.takers(0) == []
    assert growth.takers(1) == [9]
    assert growth.takers(3) == [9, 8]
    assert growth.takers(4) == [9, 8, 7]
    assert growth.takers(6) == [9, 8, 7, 9]
    assert growth.takers(9) == [9, 8, 7, 9, 8, 7, 9]
    assert [growth.blocks_taken(n) for n in range(10)] == [len(growth.takers(n)) for n in range(10)]


@pytest.mark.parametrize(("free_blocks", "steps"), [(5, 7), (4, 6), (3, 4), (2, 3), (1, 2), (0, 0)])
def test_the_steps_a_pool_allows_by_hand(free_blocks: int, steps: int) -> None:
    """Prompts 5, 6, 8 take 2 blocks each at the prompts' iteration (6 of the pool's 6 + f).
    After it the decodes compute positions 5, 6, 8: rooms 3, 2, 0, so the steps take blocks
    at 0 (request 2), 2 (1), 3 (0), 4 (2), 6 (1), 7 (0), ... A run holds the steps before
    the one that takes the (f+1)-th block: f = 0 free gives 0 steps, 1 gives 2 (steps 0
    and 1), 2 gives 3, 3 gives 4, 4 gives 6 and 5 gives 7."""
    scheduler = _scheduler([5, 6, 8], [12, 12, 12], BLOCK * (6 + free_blocks))
    plan = scheduler.schedule(0.0)
    assert plan.req_ids.tolist() == [0, 1, 2]
    assert scheduler.allocator.num_free_blocks == free_blocks
    run = scheduler.decode_run(plan)
    assert isinstance(run, PagedRun)
    assert run.num_steps == steps


# Jumps against their iterations ------------------------------------------------------------

PROMPTS, OUTPUTS = [5, 6, 8], [9, 12, 7]


@pytest.mark.parametrize("caching", [False, True])
def test_a_jump_after_a_plan_equals_its_iterations_one_at_a_time(caching: bool) -> None:
    """Prompts 5, 6, 8 and outputs 9, 12, 7: after the prompts' iteration each owes 8, 11, 6
    tokens, so the run holds 6 decode steps and the plan with n - 1 of them is n iterations.
    For every n up to the run's end (request 2 finishes at the 7th), the jump leaves the
    progress, the blocks and, with prefix caching, the blocks named by their hashes (the
    same calls, in the same order) where the iterations would."""
    probe = _scheduler(PROMPTS, OUTPUTS, caching=caching)
    run = probe.decode_run(probe.schedule(0.0))
    assert isinstance(run, PagedRun) and run.num_steps == 6
    for n in range(1, run.num_steps + 2):
        jumped, stepped = (_scheduler(PROMPTS, OUTPUTS, caching=caching) for _ in range(2))
        jumped_calls, stepped_calls = _record_cache_calls(jumped), _record_cache_calls(stepped)
        plan = jumped.schedule(0.0)
        first, last = jumped.advance(plan, jumped.decode_run(plan), n)
        finished = _step(stepped, n)
        assert first.finished_ids.tolist() + last.finished_ids.tolist() == finished
        _assert_same_state(jumped, stepped)
        assert jumped_calls == stepped_calls


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("steps_before", [3, 7, 8])
def test_a_continued_run_equals_its_iterations_one_at_a_time(caching: bool, steps_before: int) -> None:
    """After some iterations (3: all three decoding; 7: request 2 finished; 8: one more),
    the run `continue_run` offers, applied for each of its step counts, leaves the state
    where that many iterations would, blocks named by hashes included."""
    probe = _scheduler(PROMPTS, OUTPUTS, caching=caching)
    _step(probe, steps_before)
    run = probe.continue_run()
    assert isinstance(run, PagedContinuedRun)
    owed = [o - g for o, g in zip(OUTPUTS, probe.generated.tolist(), strict=True) if g < o]
    assert run.num_steps == min(owed) and run.req_ids.tolist() == probe.running
    # The reservation a continued run reports: its first step's, once its blocks are taken.
    assert run.step_reserved_tokens is not None
    assert run.kv_reserved_tokens == run.step_reserved_tokens[0]
    assert run.kv_reserved_tokens >= probe.allocator.allocated_tokens
    for n in range(1, run.num_steps + 1):
        jumped, stepped = (_scheduler(PROMPTS, OUTPUTS, caching=caching) for _ in range(2))
        _step(jumped, steps_before)
        _step(stepped, steps_before)
        jumped_calls, stepped_calls = _record_cache_calls(jumped), _record_cache_calls(stepped)
        result = jumped.advance_run(jumped.continue_run(), n)
        assert result.finished_ids.tolist() == _step(stepped, n)
        _assert_same_state(jumped, stepped)
        assert jumped_calls == stepped_calls


def test_the_blocks_a_jump_fills_are_named_step_by_step_by_hand() -> None:
    """Prompts 5, 6, 9 and outputs 9, 12, 8, blocks of 4, prefix caching on. The prompts'
    iteration names each prompt's full blocks (1, 1, 2). Decode iteration i computes
    positions 4 + i, 5 + i and 8 + i, so a block fills when that is 7, 11, 15, ...: request
    1's second block at i = 2, request 0's second and request 2's third at i = 3 (batch
    order), request 1's third at 6, then request 0's third and request 2's fourth at 7, the
    run's last step (request 2 owes 7 tokens after the prompts). The jump names them in
    that order, each with the hashes of its request's blocks up to it."""
    scheduler = _scheduler([5, 6, 9], [9, 12, 8], caching=True)
    calls = _record_cache_calls(scheduler)
    plan = scheduler.schedule(0.0)
    run = scheduler.decode_run(plan)
    assert isinstance(run, PagedRun) and run.num_steps == 7
    first, last = scheduler.advance(plan, run, 8)
    assert last.finished_ids.tolist() == [2]
    named = [(req, len(hashes)) for req, hashes in calls]
    assert named == [(0, 1), (1, 1), (2, 2), (1, 2), (0, 2), (2, 3), (1, 3), (0, 3), (2, 4)]
    for req, hashes in calls:
        assert list(hashes) == scheduler.hasher.hashes(req, len(hashes))


# When there is no run ----------------------------------------------------------------------

def _one_running(prompts: list[int], outputs: list[int], kv_tokens: int = 1024, *,
                 kind: str = "paged", content: PromptContent | None = None,
                 **cfg: object) -> PagedScheduler:
    """Request 0 alone after its prompt's iteration; the others not yet added."""
    scheduler = _build(prompts, outputs, kv_tokens, kind=kind, content=content, **cfg)
    scheduler.add_request(0)
    _step(scheduler, 1)
    return scheduler


def test_no_run_without_anyone_running() -> None:
    scheduler = _scheduler([5], [3])
    assert scheduler.continue_run() is None
    _step(scheduler, 3)  # the request's prompt and two decodes: it finishes
    assert not scheduler.running and scheduler.continue_run() is None


def test_no_run_while_the_fcfs_head_can_join() -> None:
    """Request 1 arrives while request 0 decodes, with room: it joins at the next plan,
    so no run is offered, and the hook says the arrival could join. Once it is queued
    behind a full batch (`max_num_seqs: 1`), a run goes on without it."""
    scheduler = _one_running([5, 6], [9, 9])
    assert scheduler.continue_run() is not None
    assert scheduler.admits_arrival(1)
    scheduler.add_request(1)
    assert scheduler.continue_run() is None
    plan = scheduler.schedule(0.0)
    assert plan.req_ids.tolist() == [0, 1] and scheduler.decode_run(plan) is not None

    full = _one_running([5, 6], [9, 9], max_num_seqs=1)
    assert not full.admits_arrival(1)
    full.add_request(1)
    run = full.continue_run()
    assert run is not None and run.req_ids.tolist() == [0] and run.num_steps == 8


def test_an_arrival_that_can_never_fit_is_admitted_so_that_it_is_turned_away() -> None:
    """A 100-token prompt in a 64-token pool can never be served: the hook answers yes (the
    arrival is turned away at once, and a later arrival may join behind it)."""
    scheduler = _one_running([5, 100], [9, 1], kv_tokens=64, max_num_seqs=1)
    assert scheduler.never_fits(1) and scheduler.admits_arrival(1)


def test_no_run_when_its_first_step_needs_a_block_none_is_free() -> None:
    """Prompts of 8 and 12 tokens fill 2 + 3 blocks, the whole 5-block pool: the first
    decodes compute positions 8 and 12, each in a new block, so the reference preempts at
    once: no continued run, and the prompts' plan has a run of no step."""
    scheduler = _scheduler([8, 12], [3, 2], kv_tokens=5 * BLOCK)
    plan = scheduler.schedule(0.0)
    assert plan.req_ids.tolist() == [0, 1] and scheduler.allocator.num_free_blocks == 0
    run = scheduler.decode_run(plan)
    assert isinstance(run, PagedRun) and run.num_steps == 0
    scheduler.update_from_output(plan)
    assert scheduler.continue_run() is None


def test_no_run_while_a_prompt_chunk_is_left() -> None:
    """Chunks of 4: a 10-token prompt takes three iterations (4, 4, 2 tokens); only after
    the last does it decode, and only then is there a run."""
    scheduler = _one_running([10], [5], kind="chunked", chunk_size_tokens=4)
    assert scheduler.computed[0] == 4 and scheduler.continue_run() is None
    plan = scheduler.schedule(0.0)
    assert plan.num_new_tokens.tolist() == [4] and scheduler.decode_run(plan) is None
    scheduler.update_from_output(plan)
    plan = scheduler.schedule(0.0)
    assert plan.num_new_tokens.tolist() == [2]
    run = scheduler.decode_run(plan)
    assert isinstance(run, PagedRun) and run.num_steps == 4


def test_no_run_while_a_blocked_head_quotes_a_running_output() -> None:
    """Prefix caching: request 1's prompt quotes request 0's output (content id 1000). It
    cannot join now (`max_num_seqs: 1`), but the blocks request 0 fills as it decodes
    become hits for it, so what it will take changes within a run: no run, and the hook
    admits such an arrival. Request 2, quoting nothing, blocks nothing."""
    content = PromptContent([(5, 4), (7, 3, 1000, 5), (7, 3, 9, 5)], np.array([1000, 1001, 1002]))
    scheduler = _one_running([4, 8, 8], [20, 2, 2], content=content, max_num_seqs=1,
                             enable_prefix_caching=True)
    assert scheduler.admits_arrival(1) and not scheduler.admits_arrival(2)
    scheduler.add_request(1)
    assert scheduler.continue_run() is None
    plan = scheduler.schedule(0.0)
    assert plan.req_ids.tolist() == [0] and scheduler.decode_run(plan) is None

    other = _one_running([4, 8, 8], [20, 2, 2], content=content, max_num_seqs=1,
                             enable_prefix_caching=True)
    other.add_request(2)
    run = other.continue_run()
    assert run is not None and run.num_steps == 19



# Prefix caching's questions to the policy ----------------------------------------------------

def _blocked_behind_a_full_batch(kind: str, caching: bool = True, prompt_1: tuple[int, ...] = (1, 8, 2, 4)
                                 ) -> PagedScheduler:
    """Blocks of 4, a pool of 10, `max_num_seqs: 2`. Request 0 (content 1, 8 tokens) runs
    one iteration and finishes, leaving its two blocks cached and free; requests 2 and 3
    (unique content) fill the batch and decode; request 1 (`prompt_1`) then waits behind
    them. Block 0 and 1 were request 0's; 2 and 3 requests 2 and 3's prompts, 4 request 2's
    first decode block; the free queue is 1, 0 (a table is freed tail first)."""
    content = PromptContent([(1, 8), prompt_1, (9, 4), (7, 4)], np.array([1000, 1001, 1002, 1003]))
    chunk = {"chunk_size_tokens": 64} if kind == "chunked" else {}
    scheduler = _build([8, sum(prompt_1[1::2]), 4, 4], [1, 2, 20, 20], 10 * BLOCK, kind=kind,
                       content=content, max_num_seqs=2, enable_prefix_caching=caching, **chunk)
    scheduler.add_request(0)
    scheduler.add_request(2)
    assert _step(scheduler, 1) == [0]
    scheduler.add_request(3)
    _step(scheduler, 1)
    scheduler.add_request(1)
    assert scheduler.running == [2, 3] and scheduler.fcfs_head() == 1
    return scheduler


def test_the_cache_may_admit_a_blocked_head_only_through_free_cached_blocks_when_chunking() -> None:
    """With chunked prefill, a head whose cached prefix sits in free blocks may join within
    a run (a run's allocations can evict those hits, and a shorter prefix can need fewer
    blocks for the chunk that fits): request 1 starts from request 0's two free blocks, and
    from one of them with a prompt that shares only the first. Without chunking, or with
    the prefix held by nobody cached (unique content), or without caching, no."""
    assert _blocked_behind_a_full_batch("chunked").cache_may_admit(1)
    assert _blocked_behind_a_full_batch("chunked", prompt_1=(1, 4, 5, 8)).cache_may_admit(1)
    assert not _blocked_behind_a_full_batch("chunked", prompt_1=(6, 12)).cache_may_admit(1)
    assert not _blocked_behind_a_full_batch("paged").cache_may_admit(1)
    assert not _blocked_behind_a_full_batch("chunked", caching=False).cache_may_admit(1)


def test_a_head_quoting_a_running_output_may_be_admitted_only_with_caching() -> None:
    """Request 1's prompt quotes request 2's output (content 1002), which request 2 caches
    as it decodes: the cache may let it in within a run, whatever the policy."""
    for kind in ("paged", "chunked"):
        assert _blocked_behind_a_full_batch(kind, prompt_1=(9, 4, 1002, 4)).cache_may_admit(1)
        assert not _blocked_behind_a_full_batch(kind, caching=False,
                                                prompt_1=(9, 4, 1002, 4)).cache_may_admit(1)


def test_a_run_may_take_the_blocks_before_the_heads_first_free_hit_by_hand() -> None:
    """Chunked prefill with caching: the pool hands out its 5 never-used blocks first, then
    the free queue 1, 0; request 1's hits are blocks 0 and 1, so the 6th block a run takes
    (block 1) would evict one: a run may take 5. Without a head, or without chunking or
    caching, there is no such limit."""
    scheduler = _blocked_behind_a_full_batch("chunked")
    assert scheduler.allocator.free_pool() == ((1, 0), 5)
    assert scheduler.allocations_keeping_head() == 5
    assert _blocked_behind_a_full_batch("chunked", prompt_1=(6, 12)).allocations_keeping_head() is None
    assert _blocked_behind_a_full_batch("paged").allocations_keeping_head() is None
    assert _blocked_behind_a_full_batch("chunked", caching=False).allocations_keeping_head() is None


def test_a_run_stops_before_a_block_that_would_evict_the_heads_cached_prefix() -> None:
    """The decoding requests 2 and 3 compute positions 5 and 4 next: blocks at steps 0
    (request 3), 3 (2), 4, 7, 8, 11, 12, 15, ... With 7 free blocks a run has 15 steps;
    when the blocked head starts from free cached blocks that the 6th block handed out
    would evict, it has 11 (its blocks are those of steps 0-8), so the head's admission is
    decided by `schedule` when it may change."""
    limited = _blocked_behind_a_full_batch("chunked")
    assert limited.allocator.num_free_blocks == 7 and limited.allocations_keeping_head() == 5
    run = limited.continue_run()
    assert run is not None and run.num_steps == 11
    free = _blocked_behind_a_full_batch("chunked", prompt_1=(6, 12))
    run = free.continue_run()
    assert run is not None and run.num_steps == 15


def test_a_run_with_no_free_block_lasts_until_someone_needs_one() -> None:
    """Prompts 5, 6, 7 in a pool of exactly their 6 blocks: the decodes compute positions
    5, 6, 7, none of which opens a block, and position 8 (request 2's, at step 1) does: a
    run of one step. Prefill-first keeps a block free after every step: none there."""
    for policy, steps in (("mixed", 1), ("prefill_first", 0)):
        scheduler = _scheduler([5, 6, 7], [12, 12, 12], 6 * BLOCK, policy=policy, watermark=0.0)
        plan = scheduler.schedule(0.0)
        assert plan.req_ids.tolist() == [0, 1, 2] and scheduler.allocator.num_free_blocks == 0
        run = scheduler.decode_run(plan)
        assert isinstance(run, PagedRun) and run.num_steps == steps, policy


def test_a_run_may_fill_the_token_budget_exactly() -> None:
    """Chunks of 3 tokens, prompts of 2: iteration 1 plans 2 + 1 prompt tokens, iteration 2
    one token each, which leaves request 2 its last prompt token (computed and emitting, as
    a decode is). Three one-token requests take the whole budget and still run, to request
    0's completion: it has emitted 2 of its 12 tokens, so 10 steps."""
    scheduler = _scheduler([2, 2, 2], [12, 12, 12], kind="chunked", chunk_size_tokens=3)
    _step(scheduler, 2)
    assert len(scheduler.running) == 3 and scheduler.token_budget == 3
    run = scheduler.continue_run()
    assert run is not None and run.num_steps == 10
