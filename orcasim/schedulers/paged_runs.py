"""Fast-forward over the pure-decode iterations of the paged schedulers (`Scheduler` hooks).

Between membership changes the paged running set only decodes: every running request
computes its one known token and emits the next. What `PagedScheduler.schedule` would do
at such an iteration is known without calling it, as long as

* every running request is decoding (none has prompt tokens, or a chunk of them, left)
  and all fit the token budget, so that all are planned, one token each;
* the FCFS head (preempted requests first, then the waiting queue) cannot join. Within
  a run the running set, the token budget left after the decodes and the head's own
  needs are fixed, and free blocks only go down, so a head that cannot join at the
  run's start cannot join at any of its iterations;
* no block allocation fails, which would preempt.

A run stops before the first iteration at which a request needs a new KV block (its
context crosses a multiple of `block_size_tokens`): the allocation changes
`kv_reserved_tokens`, which is constant over a recorded row. So the run after a plan
(`decode_run`) may have zero steps. The engine then asks `continue_run`, whose run
starts with that iteration's allocations (known to succeed: enough blocks are free) and
goes on to the next block boundary or completion, one row per run. No run holds a
preemption, a recomputation or a swap, so its rows' counts of those are zero, as the
reference's per-iteration rows would be.

State between iterations that these rely on: a running request's block table holds
exactly `blocks_for(computed)` blocks (its grow or admission asked for exactly that).
"""

from __future__ import annotations

import functools
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


@dataclass(slots=True)
class PagedContinuedRun(ContinuedRun):
    owed: np.ndarray  # int64 (B,) output tokens each still owes
    growing: np.ndarray  # int64 (k,) requests taking a block at the first step, in batch order


def decode_run(s: PagedScheduler, plan: SchedulerOutput) -> PagedRun | None:
    """The run after `plan` up to the first block boundary or completion (maybe 0 steps)."""
    ids = plan.req_ids
    size = len(ids)
    if size != len(s.running) or size > s.token_budget or not _owns_hooks(type(s)):
        return None  # someone running is not planned (or a subclass plans otherwise)
    known = s.requests.prompt_tokens[ids] + s.generated[ids]
    if not np.array_equal(s.computed[ids] + plan.num_new_tokens, known):
        return None  # a prompt chunk: that request emits nothing and is not decoding next
    if s._admissible_head(s.token_budget - size) is not None:
        return None
    # After the plan each has computed its known tokens and emitted one more.
    owed = s.requests.output_tokens[ids] - s.generated[ids] - 1
    # Step j needs known + j + 1 tokens in blocks_for(known) blocks.
    room = (-known) % s.cfg.block_size_tokens
    run = PagedRun(int(min(owed.min(), room.min())), known + 1, owed)
    run.context_total = plan.batch.total_context_tokens + size  # each reads one more
    return run


def continue_run(s: PagedScheduler) -> PagedContinuedRun | None:
    """The decodes the next iterations would plan: through the next boundary or completion."""
    if not s.running or not _owns_hooks(type(s)):
        return None
    ids = np.array(s.running, dtype=np.int64)
    size, computed, generated = len(ids), s.computed[ids], s.generated[ids]
    known = s.requests.prompt_tokens[ids] + generated
    if size > s.token_budget or (known - computed != 1).any():  # the method: no wrapper
        return None  # not all planned, or a prompt (chunk) still to compute
    if s._admissible_head(s.token_budget - size) is not None:
        return None
    block = s.cfg.block_size_tokens
    room = (-computed) % block  # steps before each needs a block; 0: at the first
    at_boundary = room == 0
    growing = ids[at_boundary]
    if len(growing) > s.allocator.num_free_blocks:
        return None  # an allocation would fail and preempt
    room[at_boundary] = block  # its new block lasts `block` steps
    owed = s.requests.output_tokens[ids] - generated
    reserved = s.allocator.allocated_tokens + len(growing) * block
    steps = int(min(owed.min(), room.min()))
    return PagedContinuedRun(steps, known, ids, reserved, owed, growing)


def admits_arrival(s: PagedScheduler, req_id: int) -> bool:
    """FCFS: a run exists only while the head cannot join, and an arrival queues behind it."""
    if s.never_fits(req_id):
        return True  # turned away, so a later arrival might join: say yes (always safe)
    if s._next_candidate() is not None:
        return False
    # As the head, with the free blocks of the run's start (never fewer later: safe).
    return s._admission(req_id, s.token_budget - len(s.running)) is not None


def advance(
    s: PagedScheduler, plan: SchedulerOutput, run: DecodeRun | None, num_iterations: int
) -> tuple[StepResult, StepResult]:
    """Apply `plan` as `update_from_output` does, then `num_iterations - 1` decode steps."""
    first = s.update_from_output(plan)
    if num_iterations == 1:
        return first, NO_RESULT
    assert isinstance(run, PagedRun) and num_iterations <= run.num_steps + 1
    return first, _decode(s, plan.req_ids, num_iterations - 1, run.owed)


def advance_run(s: PagedScheduler, run: ContinuedRun, num_steps: int) -> StepResult:
    """The first step's block allocations, in batch order as `schedule` makes them, then decodes."""
    assert isinstance(run, PagedContinuedRun) and 1 <= num_steps <= run.num_steps
    assert s.allocator.allocate_one_each(run.growing.tolist()) is not None
    return _decode(s, run.req_ids, num_steps, run.owed)


def _decode(s: PagedScheduler, ids: np.ndarray, num_steps: int, owed: np.ndarray) -> StepResult:
    """`num_steps` decode iterations of `ids`, which owed `owed` tokens; those done finish."""
    s.computed[ids] += num_steps
    s.peak_computed[ids] = np.maximum(s.peak_computed[ids], s.computed[ids])
    s.generated[ids] += num_steps
    done = ids[owed == num_steps]
    if len(done):
        s._release(done)
    return StepResult(EMPTY_IDS, done)


@functools.cache
def _owns_hooks(cls: type[PagedScheduler]) -> bool:
    """The hooks predict PagedScheduler's schedule/update; a subclass changing them opts out."""
    from orcasim.schedulers.paged import PagedScheduler

    return (
        cls.schedule is PagedScheduler.schedule
        and cls.update_from_output is PagedScheduler.update_from_output
    )
