"""Fast-forward over the pure-decode iterations of the paged schedulers (`Scheduler` hooks).

Between membership changes the paged running set only decodes: every running request
computes its one known token and emits the next. What `PagedScheduler.schedule` would do
at such an iteration is known without calling it, as long as

* every running request is decoding (none has prompt tokens, or a chunk of them, left)
  and all fit the token budget, so that all are planned, one token each;
* the FCFS head (preempted requests first, then the waiting queue) cannot join
  (`PagedScheduler.can_join`, which each policy defines). Within
  a run the running set, the token budget left after the decodes and the head's own
  needs are fixed, and free blocks only go down, so a head that cannot join at the
  run's start cannot join at any of its iterations;
* no block allocation fails, which would preempt (under `prefill_first`, whose
  `can_append_slot` wants a block free before every decode, no step may leave none:
  `spare_blocks_per_step`).

Runs cross KV block boundaries. Request i, whose next decode computes the token at
position p_i, takes a block at step j exactly when p_i + j is a multiple of the block
size b, i.e. when j % b == room_i = -p_i mod b: so step j takes counts[j % b] blocks,
with counts the histogram of the rooms, in batch order (as `schedule` grows them), and
steps 0..j take (j // b) B + cum[j % b] blocks in all (cum: the histogram's running
sum; B the batch size). A run stops before the first step whose blocks exceed
the free ones (the reference would preempt there), at its first completion, or where
the engine cuts it; the per-step reservations (`DecodeRun.step_reserved_tokens`) give
the recorder each row's time-weighted mean and maximum. The engine asks `continue_run`
after a run that was not cut (completions, or a preemption ahead, where it declines and
`schedule` takes over). No run holds a preemption, a recomputation or a swap, so its
rows' counts of those are zero, as the reference's per-iteration rows would be.

State between iterations that these rely on: a running request's block table holds
exactly `blocks_for(computed)` blocks (its grow or admission asked for exactly that).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from orcasim.schedulers.base import (
    EMPTY_IDS,
    NO_RESULT,
    ContinuedRun,
    DecodeRun,
    SchedulerOutput,
    StepResult,
)

if TYPE_CHECKING:
    from orcasim.schedulers.paged import PagedScheduler


@dataclass(slots=True)
class PagedRun(DecodeRun):
    owed: np.ndarray  # int64 (B,) output tokens each still owes after the plan's iteration
    growth: BlockGrowth


@dataclass(slots=True)
class PagedContinuedRun(ContinuedRun):
    owed: np.ndarray  # int64 (B,) output tokens each still owes
    growth: BlockGrowth


@dataclass(slots=True)
class BlockGrowth:
    """Who takes a KV block at which step of a run, and what each step reserves (see the
    module docstring). Plain lists: a run's batch is tens of requests, where numpy's
    per-call cost exceeds the work."""

    order: list[int]  # ids by room, batch order within a room: one period's takers
    cum: list[int]  # blocks taken by steps 0..r of a period (r < b)
    block_size_tokens: int
    allocated_tokens: int  # KV allocated before the run's first step

    def takers(self, num_steps: int) -> list[int]:
        """Requests taking a block in the first `num_steps` steps, in allocation order:
        `order` again each period, the last one cut at `blocks_taken`."""
        periods = num_steps // self.block_size_tokens
        return self.order * periods + self.order[:self.blocks_taken(num_steps) - periods * len(self.order)]

    def blocks_taken(self, num_steps: int) -> int:
        """Blocks the first `num_steps` steps take in all."""
        periods, rem = divmod(num_steps, self.block_size_tokens)
        return periods * len(self.order) + (self.cum[rem - 1] if rem else 0)

    def reserved_at(self, step: int) -> int:
        """KV reserved at step `step`, once its allocations are made."""
        periods, rem = divmod(step, self.block_size_tokens)
        taken = periods * len(self.order) + self.cum[rem]
        return self.allocated_tokens + taken * self.block_size_tokens

    def reserved_tokens(self, num_steps: int) -> list[int]:
        """`reserved_at` of each of the first `num_steps` steps."""
        block, size = self.block_size_tokens, len(self.order)
        period = [self.allocated_tokens + taken * block for taken in self.cum[:num_steps]]
        if num_steps <= block:
            return period  # most runs end within their first period
        reserved = period.copy()
        for p in range(1, -(-num_steps // block)):  # a period at a time: size blocks more each
            more = p * size * block
            reserved.extend([tokens + more for tokens in period])
        del reserved[num_steps:]
        return reserved


def block_growth(
    s: PagedScheduler, ids: list[int], position: list[int], max_steps: int
) -> tuple[int, BlockGrowth]:
    """Steps (up to `max_steps`) before a step's blocks would not fit, and who grows when.

    `position`: the token each of `ids` computes at the run's first step.
    """
    block = s.cfg.block_size_tokens
    by_room: list[list[int]] = [[] for _ in range(block)]  # batch order within a room
    for req, p in zip(ids, position, strict=True):
        by_room[-p % block].append(req)
    return growth_by_room(s, by_room, max_steps)


def growth_by_room(
    s: PagedScheduler, by_room: list[list[int]], max_steps: int
) -> tuple[int, BlockGrowth]:
    """`block_growth` of a batch grouped already: by_room[r] holds, in batch order, the
    requests whose room is r (those that take a block at step r of each period)."""
    block = s.cfg.block_size_tokens
    cum = list(itertools.accumulate(map(len, by_room)))
    size = cum[-1]
    # Steps 0..j take (j // b) B + cum[j % b] blocks: the first period that takes more
    # than the free blocks is free // B, and within it the first r with cum[r] > over.
    # A policy may need blocks left free after each step (`spare_blocks_per_step`).
    available = s.allocator.num_free_blocks - s.spare_blocks_per_step
    keeping_head = s.allocations_keeping_head()  # prefix caching: see PagedScheduler
    if keeping_head is not None:
        available = min(available, keeping_head)
    period, over = divmod(available, size)
    fits = period * block + bisect.bisect_right(cum, over) if available >= 0 else 0
    order = list(itertools.chain.from_iterable(by_room))
    return min(max_steps, fits), BlockGrowth(order, cum, block, s.allocator.allocated_tokens)


def decode_run(s: PagedScheduler, plan: SchedulerOutput) -> PagedRun | None:
    """The run after `plan` up to its first completion or failing allocation (maybe 0 steps)."""
    ids = plan.req_ids
    size = len(ids)
    if size != len(s.running) or size > s.token_budget:
        return None  # someone running is not planned (or a subclass plans otherwise)
    known = s.requests.prompt_tokens[ids] + s.generated[ids]
    if not np.array_equal(s.computed[ids] + plan.num_new_tokens, known):
        return None  # a prompt chunk: that request emits nothing and is not decoding next
    if s.can_join(size) or _head_may_join_later(s):
        return None
    # After the plan each has computed its known tokens and emitted one more: step j
    # computes the token at known + j.
    owed = s.requests.output_tokens[ids] - s.generated[ids] - 1
    known_list = known.tolist()
    steps, growth = block_growth(s, ids.tolist(), known_list, int(owed.min()))
    run = PagedRun(steps, known + 1, owed, growth)
    run.context_total = sum(known_list) + size  # each reads one more (plan.batch may pad)
    run.step_reserved_tokens = growth.reserved_tokens(steps)
    run.kv_shared_tokens = s.shared_kv_tokens()
    return run


def continue_run(s: PagedScheduler) -> PagedContinuedRun | None:
    """The decodes the next iterations would plan, up to a completion or failing allocation."""
    if not s.running:
        return None
    ids = np.array(s.running, dtype=np.int64)
    size, computed, generated = len(ids), s.computed[ids], s.generated[ids]
    known = s.requests.prompt_tokens[ids] + generated
    if size > s.token_budget or (known - computed != 1).any():  # the method: no wrapper
        return None  # not all planned, or a prompt (chunk) still to compute
    if s.can_join(size) or _head_may_join_later(s):
        return None
    owed = s.requests.output_tokens[ids] - generated
    steps, growth = block_growth(s, s.running, computed.tolist(), int(owed.min()))
    if steps == 0:
        return None  # the first step's allocations would fail and preempt
    run = PagedContinuedRun(steps, known, ids, growth.reserved_at(0), owed, growth)
    run.step_reserved_tokens = growth.reserved_tokens(steps)
    run.kv_shared_tokens = s.shared_kv_tokens()
    return run


def admits_arrival(s: PagedScheduler, req_id: int) -> bool:
    """FCFS: a run exists only while the head cannot join, and an arrival queues behind it."""
    if s.never_fits(req_id) or s.cache_may_admit(req_id):
        return True  # turned away, so a later arrival might join: say yes (always safe)
    # As the head, with the free blocks of the run's start (never fewer later: safe).
    return s.arrival_can_join(req_id)


def _head_may_join_later(s: PagedScheduler) -> bool:
    """Whether the prefix cache could let the blocked FCFS head join within a run, other
    than by an eviction (which `allocations_keeping_head` stops a run before)."""
    head = s.fcfs_head()
    return head is not None and s.quotes_running_output(head)


def advance(
    s: PagedScheduler, plan: SchedulerOutput, run: DecodeRun | None, num_iterations: int
) -> tuple[StepResult, StepResult]:
    """Apply `plan` as `update_from_output` does, then `num_iterations - 1` decode steps."""
    first = s.update_from_output(plan)
    if num_iterations == 1:
        return first, NO_RESULT
    assert isinstance(run, PagedRun) and num_iterations <= run.num_steps + 1
    allocate_steps(s, run.growth, num_iterations - 1)
    return first, _decode(s, plan.req_ids, num_iterations - 1, run.owed)


def advance_run(s: PagedScheduler, run: ContinuedRun, num_steps: int) -> StepResult:
    """The steps' block allocations, in the order `schedule` makes them, then the decodes."""
    assert isinstance(run, PagedContinuedRun) and 1 <= num_steps <= run.num_steps
    allocate_steps(s, run.growth, num_steps)
    return _decode(s, run.req_ids, num_steps, run.owed)


def allocate_steps(s: PagedScheduler, growth: BlockGrowth, num_steps: int) -> None:
    """The blocks of `num_steps` steps: step by step, batch order within a step, as
    `schedule` grows them (one call gives the same blocks: nothing is freed in between).
    Those are `growth.takers(num_steps)`, `order` in turns: dealt as such."""
    num_blocks = growth.blocks_taken(num_steps)
    if num_blocks:
        # Not inside the assert: python -O drops it.
        blocks = s.allocator.allocate_in_turns(growth.order, num_blocks)
        assert blocks is not None, "the run stops before a step whose blocks do not fit"


def _decode(s: PagedScheduler, ids: np.ndarray, num_steps: int, owed: np.ndarray) -> StepResult:
    """`num_steps` decode iterations of `ids`, which owed `owed` tokens; those done finish."""
    if s.caching:
        _cache_filled(s, ids, num_steps)
    s.computed[ids] += num_steps
    s.peak_computed[ids] = np.maximum(s.peak_computed[ids], s.computed[ids])
    s.generated[ids] += num_steps
    done = ids[owed == num_steps]
    if len(done):
        s.release(done)
    return StepResult(EMPTY_IDS, done)


def _cache_filled(s: PagedScheduler, ids: np.ndarray, num_steps: int) -> None:
    """Cache the blocks `num_steps` decode steps fill, in the order `schedule` caches them:
    step by step, batch order within a step. Step j computes the token at computed + j,
    so a request's block k (holding tokens up to (k + 1) b) fills at step (k + 1) b - computed - 1."""
    block = s.cfg.block_size_tokens
    filled = []
    for index, (req, computed) in enumerate(zip(ids.tolist(), s.computed[ids].tolist(), strict=True)):
        for k in range(computed // block, (computed + num_steps) // block):
            filled.append(((k + 1) * block - computed - 1, index, req, (k + 1) * block))
    for _step, _index, req, tokens in sorted(filled):
        s.cache_full(req, tokens)
