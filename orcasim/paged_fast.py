"""Fast mode for vLLM's paged scheduler (both policies) and Sarathi's chunked one, fused:
the generic fast stepper without its objects.

The `PagedScheduler` (policy `mixed`, vLLM v1), the `PrefillFirstScheduler` (policy
`prefill_first`, vLLM before v1) and the `ChunkedScheduler`, without prefix caching,
fast-forward through the generic hooks (`orcasim.schedulers.paged_runs`), which cost numpy
work on small arrays and a `schedule` call with per-request work at every admission. This
stepper runs the same units, as `OrcaFusedStepper` does for Orca (`orcasim.orca_fast`):

* Implicit progress. Between units every running request has computed all its known
  tokens but the last one it emitted, so its progress is one number: a request whose
  known tokens are `base + g` once `g` decode iterations have ended. One counter moves
  every member at once; the scheduler's `computed`/`generated` arrays are written back
  (`_write_back`) before anything reads them: `load`, `close`, and a unit run by the
  generic stepper. The one exception is a prompt that a chunked plan left half done
  (`partial`): it is always the newest running request, and its progress stays in the
  scheduler's arrays.
* A plan is what `schedule` makes when nobody is preempted: every running request decodes
  one token (a block for those whose last block is full, in batch order: `_decode_all`'s
  rule), a half-done prompt takes its next chunk from what the budget leaves, then FCFS
  admission, the scheduler's own (`PagedScheduler.admit`; under chunking its last joiner
  may take a chunk too). Prefill-first plans its prompts first, alone: if any is admitted
  the iteration is theirs (priced padded where the scheduler pads), the decodes wait and
  the counter stands still; its joiners take their places in `running`'s arrival order.
* Its decode run (none while a chunk is left or decodes wait), and a continued run after
  completions, are the generic hooks' (the block arithmetic is `paged_runs.block_growth`,
  the blocks `paged_runs.allocate_steps`), priced as a line up to the known cut
  (`orca_fast.decode_ends`) and recorded from plain numbers.

Anything else (a step that would preempt, more decodes than the token budget, prefill-first's
swap-ins, a prefill instance that holds finished requests' KV) is a unit of the generic
stepper: progress is written back first and read back after, so the two loops take turns on
one state.

Exactness: the same plans, blocks, prices (`CostModel.iteration_time_lists_s` and
`decode_line` promise `iteration_time_s`'s and `decode_steps_s`'s bits), additions and row
formulas as the generic loop: per-request timestamps, rows and scheduler state equal it bit
for bit (tests/test_paged_fast.py), and with it reference mode.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from orcasim.generic_stepper import GenericStepper
from orcasim.orca_fast import decode_ends
from orcasim.replica import Load, scheduler_load
from orcasim.schedulers import paged_runs
from orcasim.schedulers.chunked import ChunkedScheduler
from orcasim.schedulers.paged import PagedScheduler, Plan
from orcasim.schedulers.prefill_first import PrefillFirstScheduler

if TYPE_CHECKING:
    from orcasim.cost.base import CostModel, OutsideSteps
    from orcasim.recorder import Recorder
    from orcasim.replica import Replica
    from orcasim.schedulers.paged_runs import BlockGrowth


def applies(scheduler: object) -> bool:
    """The paged scheduler (either policy) or Sarathi's chunked one, without prefix caching
    (a cache names blocks one request at a time); a further subclass may plan otherwise."""
    return (type(scheduler) in (PagedScheduler, ChunkedScheduler, PrefillFirstScheduler)
            and not scheduler.caching)  # type: ignore[attr-defined]  # all three have it


@dataclass(slots=True)
class _Unit:
    """A pending unit of this loop: a plan's iteration and its decode run, or a continued run."""

    start_s: float
    ends_s: list[float]  # cut in place; the unit ends at the last
    size: int
    full: int  # iterations the unit has if nothing cuts it
    context_total: int  # the plan's (or the continued run's first step's) context tokens
    growth: BlockGrowth | None  # None: no decode run
    kv_reserved_tokens: int  # the plan's (or the continued run's first step's) KV reserved
    joiners: list[int] | None = None  # None: a continued run
    query_total: int = 0
    recomputed_tokens: int = 0
    run_context_total: int = 0  # the run's context at its first step
    # The last `fresh` members of the implicit lists joined them in this plan: the
    # scheduler's arrays still hold what they held before it.
    fresh: int = 0
    chunk_req: int = -1  # the request left with a prompt chunk after the plan (-1: none)
    chunk_tokens: int = 0  # its tokens computed in the plan
    # A prefill-first prompt iteration: the running requests' decodes wait (the iteration
    # counter does not move), and its joiners sit among them in arrival order.
    prompts_only: bool = False
    # The plan's KV in use: its context unpadded, and a prompt iteration's waiting decodes'.
    kv_used_tokens: int = 0
    outside: OutsideSteps | None = None  # decode steps outside the cost model's range


class PagedFusedStepper:
    """One replica's fast stepper over a paged or chunked scheduler, made once per run."""

    plans_on_arrival = False

    def __init__(self, scheduler: PagedScheduler, cost: CostModel, recorder: Recorder) -> None:
        assert applies(scheduler)
        self.scheduler, self.cost, self.recorder = scheduler, cost, recorder
        self.replica: Replica  # set by the replica that runs it
        self.wake_s: float | None = None
        self.generic = GenericStepper(scheduler, cost, recorder, True)
        requests = scheduler.requests
        self.prompt_tokens, self.output_tokens = requests.prompt_tokens, requests.output_tokens
        self.block_size_tokens = scheduler.cfg.block_size_tokens
        self.iterations = 0  # ended so far: the clock of implicit progress
        # Parallel to scheduler.running (admission order) but for `partial`:
        self.base: list[int] = []  # known tokens are base + iterations
        self.finish_at: list[int] = []  # the iteration count at which each finishes
        # The members again, by base mod the block size, each in batch order: those with
        # one residue take their blocks at the same steps, so a run's takers come in
        # whole lists (`_by_room`), not from a pass over every member. Changed only with
        # base (`_reset_members`, `_add_member`, `_drop_members`).
        self.by_residue: list[list[int]] = [[] for _ in range(self.block_size_tokens)]
        # Chunked prefill: the running request with prompt tokens left after its last plan,
        # always the newest (it took what was left of a budget, so nobody joined after it,
        # and preemption takes the newest first). Its progress is the scheduler's own.
        self.partial: int | None = None
        # vLLM before v1: prompts run in iterations of their own, and `running` is kept in
        # arrival order (a request resumed after a recompute rejoins among older ones).
        self.prompts_first = isinstance(scheduler, PrefillFirstScheduler)
        self._unit: _Unit | None = None
        self._delegated = False  # the pending unit is the generic stepper's
        self.continuing = False  # the last unit was a run that was not cut
        # Requests finished by its own units: `close` writes back theirs alone (a fleet's
        # replicas share finish_s; the generic stepper's units leave their own written).
        self.finished_ids: list[int] = []

    # The Stepper protocol.

    def start(self, now_s: float) -> float | None:
        """The generic stepper's `start`, specialised (same steps, same order)."""
        self.wake_s = None
        if self.scheduler.holds_finished:
            return self._delegate(now_s)
        if self.continuing and not self.replica.arrived:
            self.continuing = False
            unit = self._continued(now_s)
            if unit is not None:
                self._unit = unit
                return unit.ends_s[-1]
        self.continuing = False
        return self._plan(now_s)

    def ends_s(self) -> Sequence[float]:
        if self._delegated:
            return self.generic.ends_s()  # type: ignore[return-value]  # ascending either way
        return () if self._unit is None else self._unit.ends_s

    def cut(self, num_iterations: int) -> None:
        if self._delegated:
            self.generic.cut(num_iterations)
            return
        assert self._unit is not None and 1 <= num_iterations <= len(self._unit.ends_s)
        del self._unit.ends_s[num_iterations:]

    def finish(self) -> None:
        if self._delegated:
            self.generic.finish()
            self._delegated = False
            self.continuing = self.generic.continuing
            self._read_back()
            return
        unit, self._unit = self._unit, None
        assert unit is not None
        if unit.joiners is None:
            self._finish_continued(unit)
        elif unit.growth is None:
            self._finish_single(unit)
        else:
            self._finish_plan(unit)

    def load(self) -> Load:
        if self._delegated:
            return self.generic.load()
        unit = self._unit
        if unit is not None and unit.prompts_only:
            self._write_back(skip_ids=set(unit.joiners or ()))
        else:
            self._write_back(skip=unit.fresh if unit is not None else 0)
        load = scheduler_load(self.scheduler)
        if unit is None or unit.joiners is not None:
            return load
        # A continued run's first step grows KV that its end allocates: report it as made,
        # as the generic stepper does.
        return dataclasses.replace(load, kv_used_tokens=unit.kv_reserved_tokens)

    def close(self) -> None:
        """The scheduler's per-request progress, as the generic stepper leaves it: all done."""
        s = self.scheduler
        assert not s.running and not s.num_waiting
        done = np.array(self.finished_ids, dtype=np.int64)
        s.generated[done] = self.output_tokens[done]
        s.computed[done] = self.prompt_tokens[done] + self.output_tokens[done] - 1
        s.peak_computed[done] = np.maximum(s.peak_computed[done], s.computed[done])

    # Units run by the generic stepper, on the written-back state.

    def _delegate(self, now_s: float) -> float | None:
        self._write_back()
        self.generic.replica = self.replica
        self.generic.continuing = self.continuing
        end_s = self.generic.start(now_s)
        self.wake_s = self.generic.wake_s
        self.continuing = self.generic.continuing
        if end_s is None:
            self._read_back()  # nothing ran; schedule changed nothing it would not redo
            return None
        self._delegated = True
        return end_s

    def _write_back(self, skip: int = 0, skip_ids: set[int] | None = None) -> None:
        """The running requests' progress into the scheduler's arrays, but the last `skip`
        or those in `skip_ids` (a pending plan's joiners, whose arrays still hold what they
        held on joining)."""
        s, g = self.scheduler, self.iterations
        count = len(self.base) - skip
        if count <= 0:
            return
        members, base = s.running[:count], self.base[:count]
        if skip_ids:
            kept = [(r, b) for r, b in zip(members, base, strict=True) if r not in skip_ids]
            members, base = [r for r, _ in kept], [b for _, b in kept]
        ids = np.array(members, dtype=np.int64)
        known = np.array(base, dtype=np.int64) + g
        s.computed[ids] = known - 1
        s.generated[ids] = known - self.prompt_tokens[ids]
        s.peak_computed[ids] = np.maximum(s.peak_computed[ids], known - 1)

    def _read_back(self) -> None:
        """Implicit progress from the scheduler's arrays (after a generic unit).

        No prompt is left half done there: this loop hands over a plan only when a decode or
        the chunk would not fit, and then `schedule` preempts the newest request first, which
        is the chunk, and admits nobody. A prefill instance that holds finished requests' KV
        runs every unit through the generic stepper, so its lists stay empty (they would
        hold its half-done prompts)."""
        s, g = self.scheduler, self.iterations
        if s.holds_finished:
            return
        ids = np.array(s.running, dtype=np.int64)
        generated = s.generated[ids]
        assert np.all((self.prompt_tokens[ids] + generated - s.computed[ids] == 1)
                      & (generated > 0)), "a generic unit left a prompt to compute"
        self.partial = None
        self._reset_members((self.prompt_tokens[ids] + generated - g).tolist(),
                            (self.output_tokens[ids] - generated + g).tolist())

    # The implicit lists: every change of membership goes through these three.

    def _reset_members(self, base: list[int], finish_at: list[int]) -> None:
        """The running requests (no prompt half done) are the members, with these lists."""
        self.base, self.finish_at = base, finish_at
        block = self.block_size_tokens
        self.by_residue = [[] for _ in range(block)]
        for req, b in zip(self.scheduler.running, base, strict=True):
            self.by_residue[b % block].append(req)

    def _add_member(self, at: int, req: int, base: int, finish_at: int) -> None:
        """`req` becomes the member at index `at` of the lists (batch order). Its residue's
        list keeps batch order: a joiner at the end goes last, and one inserted (prefill-
        first, whose batch order is by id) goes by its id."""
        self.base.insert(at, base)
        self.finish_at.insert(at, finish_at)
        same = self.by_residue[base % self.block_size_tokens]
        if at == len(self.base) - 1:
            same.append(req)
        else:
            bisect.insort(same, req)

    def _drop_members(self, indices: list[int]) -> list[int]:
        """Drop the members at `indices` (ascending) from the lists; their ids."""
        s, block = self.scheduler, self.block_size_tokens
        done = [s.running[i] for i in indices]
        for i, req in zip(reversed(indices), reversed(done), strict=True):
            self.by_residue[self.base[i] % block].remove(req)
            del self.base[i]
            del self.finish_at[i]
        return done

    def _by_room(self, offset: int) -> list[list[int]]:
        """The members by room for a run whose first step computes position base + offset
        of each: room r = -(base + offset) mod b holds residue (-offset - r) mod b, so
        the residues' lists, from -offset mod b down."""
        k, by_residue = -offset % self.block_size_tokens, self.by_residue
        return by_residue[k::-1] + by_residue[:k:-1]

    def check_members(self) -> None:
        """Audit: the lists are parallel to `running` (but for `partial`), and `by_residue`
        groups them by base as it says. Not while a generic unit is pending (the lists are
        read back at its end), nor on a prefill instance (whose units are all generic)."""
        s, block = self.scheduler, self.block_size_tokens
        if self._delegated or s.holds_finished:
            return
        members = [r for r in s.running if r != self.partial]
        assert len(members) == len(self.base) == len(self.finish_at)
        expected: list[list[int]] = [[] for _ in range(block)]
        for req, b in zip(members, self.base, strict=True):
            expected[b % block].append(req)
        assert self.by_residue == expected, "by_residue disagrees with the members' base"

    # A plan and its decode run.

    def _plan(self, now_s: float) -> float | None:
        """`schedule`, then `decode_run`, as the generic stepper calls them."""
        s, g, block = self.scheduler, self.iterations, self.block_size_tokens
        running, base = s.running, self.base
        if self.prompts_first:
            if s.swapped:
                return self._delegate(now_s)  # a decode iteration with swap-ins
            if s.fcfs_head() is not None:  # the prompt phase: prompts alone, if any fit
                prompts = Plan(s.token_budget, prompts_only=True)
                s.admit(prompts)
                if prompts.ids:
                    return self._prompt_plan(now_s, prompts)
        decoding = len(base)
        if decoding > s.token_budget:
            return self._delegate(now_s)  # not every decode fits: schedule's loop decides
        # Those whose next position, base + g - 1, starts a block: one residue.
        takers = self.by_residue[(1 - g) % block]
        chunk, chunk_new, chunk_blocks = self.partial, 0, 0
        if chunk is not None:  # next in `schedule`'s loop: a chunk of what the budget leaves
            # At least a token: the plan that left it half done gave it the budget's rest,
            # at least one token, and nobody has joined the decodes since.
            chunk_start = s.computed.item(chunk)
            chunk_new = min(s.known_tokens(chunk) - chunk_start, s.token_budget - decoding)
            chunk_blocks = s.allocator.blocks_to_hold(chunk, chunk_start + chunk_new)
        if len(takers) + chunk_blocks + s.spare_blocks_per_step > s.allocator.num_free_blocks:
            return self._delegate(now_s)  # a decode (or the chunk) would preempt
        if takers:
            s.allocator.allocate_one_each(takers)
        plan = Plan(s.token_budget - decoding)
        if chunk is not None:
            s.allocator.grow_to(chunk, chunk_start + chunk_new)
            s.add_to_plan(plan, chunk, chunk_new)
        if not self.prompts_first and s.fcfs_head() is not None:  # else nobody can join now
            s.admit(plan)
        if not running:
            return None
        context, joiners, fresh, left = [b + g for b in base], [], 0, -1
        for req, num_new in zip(plan.ids, plan.num_new, strict=True):
            computed, generated = s.computed.item(req), s.generated.item(req)
            context.append(computed + num_new)
            prompt = self.prompt_tokens.item(req)
            if req != chunk:
                joiners.append(req)  # a new member: scheduled now
            if computed + num_new < prompt + generated:
                left = req  # a chunk: it emits nothing (the plan's last)
                continue
            # It emits at the plan's end.
            self._add_member(len(base), req, prompt + generated - g,
                             g + self.output_tokens.item(req) - generated)
            fresh += 1
            if req == chunk:
                joiners.append(req)  # its first token comes now, if it is its first
        self.partial = left if left >= 0 else None
        unit = self._priced(now_s, plan, [1] * decoding + plan.num_new, context, joiners,
                            None, fresh=fresh, chunk_req=left,
                            chunk_tokens=plan.num_new[-1] if left >= 0 else 0)
        if self.partial is None:
            # Each member's context in the plan is its known tokens (it computes them all):
            # the positions its run computes first.
            self._maybe_decode_run(unit, context)
        return unit.ends_s[-1]

    def _priced(self, now_s: float, plan: Plan, query: list[int], context: list[int],
                joiners: list[int], kv_used_tokens: int | None, **marks: int | bool) -> _Unit:
        """The pending unit of a plan's iteration, priced on `query` and `context` (as the
        cost model sees them) plus any swap copies; the plan's recomputed tokens counted,
        as `PagedScheduler._output` counts them in the generic loop. `kv_used_tokens`
        None: the context's total (unpadded, the plan's KV in use)."""
        s = self.scheduler
        s.recomputed_tokens_total += plan.recomputed_tokens
        query_total, context_total = sum(query), sum(context)
        if kv_used_tokens is None:
            kv_used_tokens = context_total
        plan_s = self.cost.iteration_time_lists_s(query, context, query_total, context_total)
        plan_s += plan.copy_time_s
        unit = _Unit(now_s, [now_s + plan_s], len(query), 1, context_total, None,
                     s.allocator.allocated_tokens, joiners, query_total,
                     plan.recomputed_tokens, kv_used_tokens=kv_used_tokens,
                     **marks)  # type: ignore[arg-type]  # the _Unit fields named
        self._unit = unit
        return unit

    def _maybe_decode_run(self, unit: _Unit, known: list[int]) -> None:
        """The decode run after a plan that every running request is in, if `decode_run`
        would give one: all fit the budget and nobody could join."""
        s = self.scheduler
        size = len(s.running)
        if size <= s.token_budget and not s.can_join(size):
            self._decode_run(unit, known)

    def _prompt_plan(self, now_s: float, plan: Plan) -> float:
        """A prefill-first prompt iteration that `plan` (the prompts admitted) makes: the
        decodes wait. Its joiners take their places in the implicit lists (arrival order);
        each emits its first token at the iteration's end. With decodes waiting the counter
        stands still; without, the iteration is every member's, as a plan's is, and a decode
        run may follow it, as `decode_run` allows."""
        s, g = self.scheduler, self.iterations
        base = self.base
        waiting = len(base)
        waiting_kv = sum(base) + waiting * (g - 1)  # the decodes' KV: known - 1 each
        context = [s.computed.item(req) + n for req, n in zip(plan.ids, plan.num_new, strict=True)]
        moves = 0 if waiting else 1  # the counter at the iteration's end, for the joiners
        for req in sorted(plan.ids):  # ascending: each index counts the members before it
            at = bisect.bisect_left(s.running, req)
            generated = s.generated.item(req)
            self._add_member(at, req, self.prompt_tokens.item(req) + generated + 1 - g - moves,
                             g + moves + self.output_tokens.item(req) - generated - 1)
        query = plan.num_new
        longest = s.padded_prompt_tokens(query)  # type: ignore[attr-defined]  # prompts_first
        priced_query, priced_context = (query, context) if longest is None else \
            ([longest] * len(query), [longest] * len(query))
        unit = self._priced(now_s, plan, priced_query, priced_context, plan.ids,
                            waiting_kv + sum(context), fresh=len(query),
                            prompts_only=bool(waiting))
        if not waiting:
            self._maybe_decode_run(unit, context)
        return unit.ends_s[-1]

    def _decode_run(self, unit: _Unit, known: list[int]) -> None:
        """`paged_runs.decode_run`: the plan's members, which held `known` tokens before it,
        decode on up to a completion or a step whose blocks do not fit; its ends up to the
        known cut."""
        s, g = self.scheduler, self.iterations
        # Every member's first step computes its known tokens' next position: base + g.
        steps, unit.growth = paged_runs.growth_by_room(s, self._by_room(g),
                                                       min(self.finish_at) - g - 1)
        unit.full = steps + 1
        unit.run_context_total = unit.kv_used_tokens + unit.size  # its KV: unpadded
        if steps:
            start_s, replica = unit.start_s, self.replica
            unit.outside = decode_ends(
                self.cost, unit.ends_s, start_s, replica.cut_bound_s(start_s), unit.size,
                unit.run_context_total, steps, lambda: np.array(known, dtype=np.int64) + 1,
                lambda: replica.cut_s(start_s))

    def _finish_single(self, unit: _Unit) -> None:
        """The plan's iteration alone (no decode run): `GenericStepper._finish_iteration`."""
        end_s = unit.ends_s[0]
        if not unit.prompts_only:  # the decodes computed a token each
            self.iterations += 1
        self._apply_joiners(unit, end_s)
        if unit.chunk_req >= 0:  # its prompt chunk: progress the implicit lists do not hold
            s, req = self.scheduler, unit.chunk_req
            s.computed[req] += unit.chunk_tokens
            s.peak_computed[req] = max(s.peak_computed.item(req), s.computed.item(req))
        done = self._completions()
        self.recorder.append_row(
            unit.start_s, end_s - unit.start_s, 1, unit.size, unit.query_total, unit.context_total,
            unit.kv_reserved_tokens, self.scheduler.num_queued, float(unit.kv_used_tokens), 0,
            unit.recomputed_tokens)
        self._record(done, end_s)

    def _finish_plan(self, unit: _Unit) -> None:
        """The plan's iteration and `n - 1` steps of its run: `GenericStepper._finish_jump`."""
        s, ends_s = self.scheduler, unit.ends_s
        n = len(ends_s)
        waiting = s.num_queued * n + self.replica.late_waiting(ends_s, n)
        assert unit.growth is not None
        if n > 1:
            paged_runs.allocate_steps(s, unit.growth, n - 1)
        if unit.outside is not None:  # the decode steps that ran: all but the plan's
            self.cost.count_outside(unit.outside, n - 1)
        self.iterations += n
        self._apply_joiners(unit, ends_s[0])
        done = self._completions()
        self.recorder.jump_row(
            unit.start_s, ends_s, unit.size, unit.query_total, unit.context_total,
            unit.kv_used_tokens, unit.size, unit.run_context_total, unit.kv_reserved_tokens,
            waiting, 0, unit.recomputed_tokens, unit.growth.reserved_tokens(n - 1))
        # As the generic stepper tells the source: the plan's completions at its end when
        # nothing follows it, else the run's at the run's end (the unit's end either way).
        self._record(done, ends_s[-1])
        self.continuing = n == unit.full

    def _apply_joiners(self, unit: _Unit, first_token_s: float) -> None:
        """Joiners scheduled at the unit's start; the new ones' first tokens at the plan's end."""
        recorder = self.recorder
        for req in unit.joiners or ():
            if math.isnan(recorder.first_scheduled_s.item(req)):
                recorder.first_scheduled_s[req] = unit.start_s
            if req != unit.chunk_req and math.isnan(recorder.first_token_s.item(req)):
                recorder.first_token_s[req] = first_token_s

    # A continued run.

    def _continued(self, start_s: float) -> _Unit | None:
        """`paged_runs.continue_run`: the running requests decode on, no `schedule` call."""
        s, g = self.scheduler, self.iterations
        size = len(s.running)
        assert self.partial is None, "a run follows only a plan that left no prompt chunk"
        if not size or size > s.token_budget or s.can_join(size):
            return None
        # Each computes its last known token first, at position base + g - 1.
        steps, growth = paged_runs.growth_by_room(s, self._by_room(g - 1), min(self.finish_at) - g)
        if steps == 0:
            return None  # the first step's allocations would fail and preempt
        base = self.base
        context_total = sum(base) + size * g  # each reads its known tokens: base + g
        unit = _Unit(start_s, [], size, steps, context_total, growth, growth.reserved_at(0))
        replica = self.replica
        unit.outside = decode_ends(self.cost, unit.ends_s, start_s, replica.cut_bound_s(start_s),
                                   size, context_total, steps,
                                   lambda: np.array(base, dtype=np.int64) + g,
                                   lambda: replica.cut_s(start_s))
        # None priced (the first step too short: `runnable_steps`): planned, as reference
        # mode plans it; nothing here has changed the scheduler.
        return unit if unit.ends_s else None

    def _finish_continued(self, unit: _Unit) -> None:
        s, ends_s = self.scheduler, unit.ends_s
        n = len(ends_s)
        waiting = s.num_queued * n + self.replica.late_waiting(ends_s, n)
        assert unit.growth is not None
        paged_runs.allocate_steps(s, unit.growth, n)
        if unit.outside is not None:
            self.cost.count_outside(unit.outside, n)
        self.iterations += n
        done = self._completions()
        self.recorder.run_row(unit.start_s, ends_s, unit.size, unit.context_total,
                              unit.kv_reserved_tokens, waiting, unit.growth.reserved_tokens(n))
        self._record(done, ends_s[-1])
        self.continuing = n == unit.full

    # Completions.

    def _completions(self) -> list[int]:
        """Members whose last token ended now: dropped from the lists and released (their
        blocks freed in batch order, as `release` frees them)."""
        g, finish_at = self.iterations, self.finish_at
        # A unit ends at its first completion, so a few members finish of tens: found by
        # the list's own count and index, not a pass in Python.
        indices, i = [], -1
        for _ in range(finish_at.count(g)):
            i = finish_at.index(g, i + 1)
            indices.append(i)
        if not indices:
            return []
        done = self._drop_members(indices)
        self.scheduler.release(done)
        return done

    def _record(self, done: list[int], end_s: float) -> None:
        """Completions at `end_s`, told to the source."""
        if done:
            self.finished_ids += done
            self.recorder.record_finished(done, end_s)
            self.replica.source.on_finished(done, end_s)
