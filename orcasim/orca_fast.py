"""Fast mode for Orca's scheduler, fused: the generic fast stepper without its objects.

The generic stepper (`orcasim.engine.GenericStepper`) talks to a scheduler through objects made per
jump (SchedulerOutput, Batch, DecodeRun, StepResult) and a dozen hook calls; at a million
requests that traffic, not arithmetic, is most of a run. For the plain iteration-level
scheduler a replica runs this stepper instead: the same jumps, driving the scheduler's own
queue, admission step and running list, with each member's progress kept implicit. Like
every stepper it plans a unit at its start and applies it at its end (`orcasim.replica`),
so a delivery can cut it and a router never reads its future.

Implicit progress: a request whose first iteration is iteration g0 (counted from the
start of the run) has emitted g - g0 tokens once g iterations have ended, so its known
tokens are prompt + g - g0 = base + g with base = prompt - g0, and it finishes when g
reaches g0 + output_tokens. One counter moves every member at once: a jump costs no
per-request update. The scheduler's `computed`/`generated` arrays are written when the
run ends (`close`); `load` reads the implicit progress.

Exactness: the cost model prices the same batches as in the generic loop (given as lists,
`CostModel.iteration_time_lists_s` and `decode_line`, which promise the same bits as
`iteration_time_s` and `decode_steps_s`), times are accumulated by the same additions, and
rows come from the recorder's same formulas, so this loop reproduces the generic one bit
for bit (tests/test_orca_fast.py), and with it reference mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from orcasim.replica import Load
from orcasim.schedulers.iteration_level import IterationLevelScheduler

if TYPE_CHECKING:
    from orcasim.cost.base import CostModel, DecodeLine, OutsideSteps
    from orcasim.recorder import Recorder
    from orcasim.replica import Replica


def applies(scheduler: object) -> bool:
    """Only the plain scheduler: a subclass may plan differently."""
    return type(scheduler) is IterationLevelScheduler


def decode_ends(
    cost: CostModel, ends_s: list[float], start_s: float, cut_s: float, size: int,
    context_total: int, num_steps: int, contexts: Callable[[], np.ndarray],
    recut_s: Callable[[], float] | None = None,
) -> OutsideSteps | None:
    """Append to `ends_s` (a unit's ends so far, maybe none) the ends of its next decode steps.

    Up to `num_steps` steps of `size` requests holding `context_total` context tokens at the
    first (`contexts()`: each one's, asked only when the cost has no line), stopping at the
    first end at or after `cut_s`, where the generic stepper's `_jump_length` stops, or
    before a step the cost model prices too short (`runnable_steps`). Running
    sums in order from the last end (or `start_s`): the same additions as one iteration at
    a time, so a fused loop's ends are the generic loop's bits. Which of the steps the cost
    model counts outside its range once they have run (`CostModel.count_outside`).

    With `recut_s`, `cut_s` is only a bound no later than the cut (`Replica.cut_bound_s`),
    and `recut_s()` the cut itself, asked only if the ends reach the bound: stepping on from
    the first end at or after the bound to the first at or after the cut stops where one
    pass to the cut stops.
    """
    t = ends_s[-1] if ends_s else start_s
    if t >= cut_s:
        cut = _cut_beyond(t, recut_s)
        if cut is None:
            return None
        cut_s, recut_s = cut, None
    line = cost.decode_line(size, context_total)
    if line is None:
        durations_s, outside = cost.decode_steps_outside(contexts(), num_steps)
        _extend_by(ends_s, durations_s.tolist(), t, cut_s, recut_s)
        return outside
    _extend_on_line(ends_s, line, num_steps, t, cut_s, recut_s)
    return None


def _cut_beyond(t: float, recut_s: Callable[[], float] | None) -> float | None:
    """Where ends that reached their bound at `t` step on to: the cut itself (`recut_s()`),
    or None where there is no cut to ask (the bound was the cut) or it is not after `t`."""
    if recut_s is None:
        return None
    cut_s = recut_s()
    return cut_s if t < cut_s else None


def _extend_by(ends_s: list[float], durations_s: list[float], t: float, cut_s: float,
               recut_s: Callable[[], float] | None) -> None:
    """`decode_ends` for steps of the given durations."""
    first = 0
    while True:
        for k in range(first, len(durations_s)):
            t += durations_s[k]
            ends_s.append(t)
            if t >= cut_s:
                break
        else:
            return  # every step ran
        cut = _cut_beyond(t, recut_s)  # the bound reached: on to the cut itself
        if cut is None:
            return
        cut_s, recut_s, first = cut, None, k + 1


def _extend_on_line(ends_s: list[float], line: DecodeLine, num_steps: int, t: float,
                    cut_s: float, recut_s: Callable[[], float] | None) -> None:
    """`decode_ends` for steps priced by `line` (see `DecodeLine`)."""
    intercept_s, x0, dx, slope_s, floor_s, plus_s = line
    first = 0
    while True:
        if floor_s or plus_s:  # an engine's overhead on the line (orcasim.cost.overhead)
            for k in range(first, num_steps):
                t += max(intercept_s + (x0 + dx * k) * slope_s, floor_s) + plus_s
                ends_s.append(t)
                if t >= cut_s:
                    break
            else:
                return
        else:
            for k in range(first, num_steps):  # a plain loop: cheaper than numpy at these lengths
                t += intercept_s + (x0 + dx * k) * slope_s
                ends_s.append(t)
                if t >= cut_s:
                    break
            else:
                return
        cut = _cut_beyond(t, recut_s)  # the bound reached: on to the cut itself
        if cut is None:
            return
        cut_s, recut_s, first = cut, None, k + 1


@dataclass(slots=True)
class _Jump:
    """A pending unit: a plan's iteration and the decode steps after it, or a continued run."""

    start_s: float
    ends_s: list[float]  # cut in place; the unit ends at the last
    size: int
    context_total: int  # members' known tokens at the start (a plan) or at its first step
    newcomers: list[int] | None  # None: a continued run
    num_steps: int = 0  # a continued run's natural length
    query_total: int = 0
    single: bool = False  # the plan alone, as reference mode runs it
    outside: OutsideSteps | None = None  # decode steps outside the cost model's range


class OrcaFusedStepper:
    """One replica's fast stepper over an `IterationLevelScheduler`, made once per run."""

    plans_on_arrival = False

    def __init__(self, scheduler: IterationLevelScheduler, cost: CostModel, recorder: Recorder) -> None:
        assert applies(scheduler)
        self.scheduler, self.cost, self.recorder = scheduler, cost, recorder
        self.replica: Replica  # set by the replica that runs it
        self.wake_s: float | None = None
        requests = scheduler.requests
        self.prompt_tokens, self.output_tokens = requests.prompt_tokens, requests.output_tokens
        self.iterations = 0  # ended so far: the clock of implicit progress
        # Parallel to scheduler.running (admission order):
        self.base: list[int] = []  # prompt - first iteration: known tokens are base + iterations
        self.finish_at: list[int] = []  # the iteration count at which each finishes
        self.base_total = 0
        self._jump: _Jump | None = None
        self._continuing = False  # the last jump ended in completions
        # Requests finished here: `close` writes back theirs alone (a fleet's replicas share
        # finish_s, and every replica's scheduler read the whole fleet's as its own).
        self.finished_ids: list[int] = []

    def start(self, now_s: float) -> float | None:
        """The generic stepper's `start`, specialised (same steps, same order)."""
        scheduler = self.scheduler
        if (self._continuing and not self.replica.arrived and self.base
                and not scheduler.num_waiting):
            jump = self._continue_jump(now_s)
            if jump.ends_s:  # else its first step is priced too short: planned, as reference mode does
                self._jump = jump
                return jump.ends_s[-1]
        self._continuing = False
        newcomers = self._admit()
        if not scheduler.running:
            return None
        self._jump = self._plan_jump(newcomers, now_s)
        return self._jump.ends_s[-1]

    def ends_s(self) -> Sequence[float]:
        return () if self._jump is None else self._jump.ends_s

    def cut(self, num_iterations: int) -> None:
        assert self._jump is not None and 1 <= num_iterations <= len(self._jump.ends_s)
        del self._jump.ends_s[num_iterations:]

    def finish(self) -> None:
        jump, self._jump = self._jump, None
        assert jump is not None
        if jump.newcomers is None:
            self._continuing = self._finish_continued(jump)
        else:
            self._continuing = self._finish_plan(jump)

    def load(self) -> Load:
        scheduler, g = self.scheduler, self.iterations
        waiting = scheduler.queued_ids()
        prompt = self.prompt_tokens
        waiting_prompt = sum(prompt[waiting].tolist()) if waiting else 0
        waiting_left = waiting_prompt + (sum(self.output_tokens[waiting].tolist()) if waiting else 0)
        in_flight = self._jump.newcomers if self._jump is not None else None
        prefill_left = sum(prompt[in_flight].tolist()) if in_flight else 0
        decode_left = sum(self.finish_at) - len(self.finish_at) * g
        return Load(len(scheduler.running), len(waiting), waiting_prompt,
                    waiting_left + prefill_left + decode_left, scheduler.reserved_tokens,
                    scheduler.kv_capacity_tokens)

    def close(self) -> None:
        """The scheduler's per-request progress, as the generic stepper leaves it: all done."""
        assert not self.scheduler.running and not self.scheduler.num_waiting
        scheduler, done = self.scheduler, np.array(self.finished_ids, dtype=np.int64)
        scheduler.generated[done] = self.output_tokens[done]
        scheduler.computed[done] = self.prompt_tokens[done] + self.output_tokens[done] - 1

    def _admit(self) -> list[int]:
        """Orca's admission step (the scheduler's own); the ids admitted, in order."""
        scheduler, g = self.scheduler, self.iterations
        admitted: list[int] = []
        if not scheduler.num_waiting:  # the usual case below saturation: nothing to try
            return admitted
        while len(scheduler.running) < scheduler.max_batch_size:
            head = scheduler.admit_head()
            if head is None:
                break
            admitted.append(head)
            prompt = self.prompt_tokens.item(head)
            self.base.append(prompt - g)
            self.finish_at.append(g + self.output_tokens.item(head))
            self.base_total += prompt - g
        return admitted

    def _plan_jump(self, newcomers: list[int], start_s: float) -> _Jump:
        """The plan's iteration and the decode run after it (cut like the generic stepper's).

        The plan is what `schedule` makes: every member in admission order; newcomers (the
        tail) run their whole prompt.
        """
        g, size = self.iterations, len(self.base)
        prompts = [self.prompt_tokens.item(r) for r in newcomers]
        query_total = size - len(newcomers) + sum(prompts)
        context_total = self.base_total + size * g
        plan_s = self.cost.iteration_time_lists_s([1] * (size - len(newcomers)) + prompts,
                                                  [b + g for b in self.base], query_total,
                                                  context_total)
        steps = min(self.finish_at) - g - 1  # pure-decode iterations before the first completion
        jump = _Jump(start_s, [start_s + plan_s], size, context_total, newcomers,
                     query_total=query_total, single=steps <= 0)
        if steps > 0:
            self._extend(jump, context_total + size, steps, 1)
        return jump

    def _finish_plan(self, jump: _Jump) -> bool:
        """Record and apply a plan's jump; True if it ended in completions (a single
        iteration never counts: the generic stepper looks again with `schedule` then)."""
        scheduler, ends_s, n = self.scheduler, jump.ends_s, len(jump.ends_s)
        reserved, waiting = scheduler.reserved_tokens, scheduler.num_waiting
        size, query_total, context_total = jump.size, jump.query_total, jump.context_total
        if jump.single:
            end_s = ends_s[0]
            self.recorder.append_row(jump.start_s, end_s - jump.start_s, 1, size, query_total,
                                     context_total, reserved, waiting, float(context_total), 0, 0)
            self._advance(1, jump.newcomers or [], jump.start_s, end_s, end_s)
            return False
        waiting_sum = waiting * n + self.replica.late_waiting(ends_s, n)
        if jump.outside is not None:  # the decode steps that ran: all but the plan's
            self.cost.count_outside(jump.outside, n - 1)
        self.recorder.jump_row(jump.start_s, ends_s, size, query_total, context_total,
                               context_total, size, context_total + size, reserved, waiting_sum)
        return self._advance(n, jump.newcomers or [], jump.start_s, ends_s[0], ends_s[-1])

    def _extend(self, jump: _Jump, context_total: int, num_steps: int, ahead: int) -> None:
        """Extend `jump.ends_s` (the plan's end, if any) by the members' decode steps' ends,
        up to `num_steps`, stopping at the known cut (`decode_ends`). The members hold
        `context_total` tokens at the first step (each base + iterations + `ahead`)."""
        jump.outside = decode_ends(
            self.cost, jump.ends_s, jump.start_s, self.replica.cut_s(jump.start_s), jump.size,
            context_total, num_steps,
            lambda: np.array(self.base, dtype=np.int64) + (self.iterations + ahead))

    def _advance(
        self, n: int, newcomers: list[int], start_s: float, head_end_s: float, end_s: float
    ) -> bool:
        """`n` iterations from `start_s` to `end_s`; True if they ended in completions."""
        self.iterations += n
        recorder = self.recorder
        for req in newcomers:  # scheduled at the plan's start, first token at its end
            recorder.first_scheduled_s[req] = start_s
            recorder.first_token_s[req] = head_end_s
        if min(self.finish_at) != self.iterations:
            return False
        self._release(end_s)
        return True

    def _continue_jump(self, start_s: float) -> _Jump:
        """A decode run after completions (the generic `continue_run`'s unit)."""
        g, size = self.iterations, len(self.base)
        num_steps = min(self.finish_at) - g
        jump = _Jump(start_s, [], size, self.base_total + size * g, None, num_steps=num_steps)
        self._extend(jump, jump.context_total, num_steps, 0)
        return jump

    def _finish_continued(self, jump: _Jump) -> bool:
        ends_s, n = jump.ends_s, len(jump.ends_s)
        if jump.outside is not None:
            self.cost.count_outside(jump.outside, n)
        # Nobody waited at the start; deliveries inside are queued after the jump.
        self.recorder.run_row(jump.start_s, ends_s, jump.size, jump.context_total,
                              self.scheduler.reserved_tokens, self.replica.late_waiting(ends_s, n))
        self.iterations += n
        if n < jump.num_steps:
            return False
        self._release(ends_s[-1])
        return True

    def _release(self, finish_s: float) -> None:
        """Members whose last token ended at `finish_s`: finished, reservations freed."""
        g = self.iterations
        done_at = [i for i, at in enumerate(self.finish_at) if at == g]
        running, reservation = self.scheduler.running, self.scheduler.reservation_tokens
        freed, done = 0, []
        for i in reversed(done_at):
            req = running.pop(i)
            self.base_total -= self.base.pop(i)
            del self.finish_at[i]
            freed += reservation.item(req)
            done.append(req)
        self.scheduler.reserved_tokens -= freed
        done.reverse()  # batch order, as the generic stepper tells them: a router downstream
        # (a disaggregated cluster's decode pool) sees simultaneous completions in that order
        self.recorder.record_finished(done, finish_s)  # none finished twice, as every variant
        self.finished_ids += done
        self.replica.source.on_finished(done, finish_s)  # a closed loop's clients send again
