"""Fast mode for Orca's scheduler, fused: the engine's generic fast loop without its objects.

The generic fast loop (`orcasim.engine`) talks to a scheduler through objects made per
jump (SchedulerOutput, Batch, DecodeRun, StepResult) and a dozen hook calls; at a million
requests that traffic, not arithmetic, is most of a run. For the plain iteration-level
scheduler the engine runs this loop instead: the same jumps, driving the scheduler's own
queue, admission step and running list, with each member's progress kept implicit.

Implicit progress: a request whose first iteration is iteration g0 (counted from the
start of the run) has emitted g - g0 tokens once g iterations have ended, so its known
tokens are prompt + g - g0 = base + g with base = prompt - g0, and it finishes when g
reaches g0 + output_tokens. One counter moves every member at once: a jump costs no
per-request update. The scheduler's `computed`/`generated` arrays are written when the
loop ends.

Exactness: the cost model prices the same batches as in the generic loop (given as lists,
`CostModel.iteration_time_lists_s` and `decode_line`, which promise the same bits as
`iteration_time_s` and `decode_steps_s`), times are accumulated by the same additions, and
rows come from the recorder's same formulas, so this loop reproduces the generic one bit
for bit (tests/test_orca_fast.py), and with it reference mode.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import numpy as np
import simpy

from orcasim.schedulers.iteration_level import IterationLevelScheduler

if TYPE_CHECKING:
    from orcasim.engine import Engine

Events = Generator[simpy.Event, None, None]


def applies(scheduler: object) -> bool:
    """Only the plain scheduler: a subclass may plan differently."""
    return type(scheduler) is IterationLevelScheduler


class OrcaFastLoop:
    """One engine's fast loop over an `IterationLevelScheduler`, made once per run."""

    def __init__(self, engine: Engine) -> None:
        assert applies(engine.scheduler)
        self.engine = engine
        self.scheduler: IterationLevelScheduler = engine.scheduler  # type: ignore[assignment]
        self.cost, self.recorder = engine.cost, engine.recorder
        requests = self.scheduler.requests
        self.prompt_tokens, self.output_tokens = requests.prompt_tokens, requests.output_tokens
        self.iterations = 0  # ended so far: the clock of implicit progress
        # Parallel to scheduler.running (admission order):
        self.base: list[int] = []  # prompt - first iteration: known tokens are base + iterations
        self.finish_at: list[int] = []  # the iteration count at which each finishes
        self.base_total = 0

    def loop(self) -> Events:
        """The engine's `_loop` for fast mode, specialised (same steps, same order).

        Each jump is priced, recorded and applied at its start (nothing else acts on this
        scheduler in between), then the clock moves to its end: SimPy is visited only if
        another event is due by then, as in `Engine._sleep_until`.
        """
        engine, running, env = self.engine, self.scheduler.running, self.engine.env
        while True:
            engine._admit_arrivals()
            newcomers = self._admit()
            if not running:
                wake_s = engine._idle_until(None)
                if wake_s is None:
                    break
                yield from engine._sleep_until(wake_s)
                continue
            end_s, completions = self._plan_jump(newcomers, engine.now_s)
            engine.now_s = end_s
            if env.peek() <= end_s:
                yield engine._sync_env()
            while completions and self._may_continue():
                end_s, completions = self._continue_jump(engine.now_s)
                engine.now_s = end_s
                if env.peek() <= end_s:
                    yield engine._sync_env()
        self._write_progress()
        yield engine._sync_env()

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

    def _plan_jump(self, newcomers: list[int], start_s: float) -> tuple[float, bool]:
        """The plan's iteration and the decode run after it (cut like the generic loop's).

        Returns the jump's end and whether it ended in completions (a single iteration
        never counts: the generic loop looks again with `schedule` then). The plan is
        what `schedule` makes: every member in admission order; newcomers (the tail) run
        their whole prompt.
        """
        g, size = self.iterations, len(self.base)
        prompts = [self.prompt_tokens.item(r) for r in newcomers]
        query_total = size - len(newcomers) + sum(prompts)
        context_total = self.base_total + size * g
        plan_s = self.cost.iteration_time_lists_s([1] * (size - len(newcomers)) + prompts,
                                                  [b + g for b in self.base], query_total,
                                                  context_total)
        steps = min(self.finish_at) - g - 1  # pure-decode iterations before the first completion
        reserved, waiting = self.scheduler.reserved_tokens, self.scheduler.num_waiting
        if steps <= 0:  # one iteration, as reference mode runs it
            end_s = start_s + plan_s
            self.recorder.append_row(start_s, plan_s, 1, size, query_total, context_total,
                                     reserved, waiting, float(context_total), 0, 0)
            self._advance(1, newcomers, start_s, end_s, end_s)
            return end_s, False
        ends_s = self._ends_s(start_s, [start_s + plan_s], size, context_total + size, steps, 1)
        n = len(ends_s)
        waiting_sum = waiting * n + self.engine._late_waiting(ends_s, n)
        self.recorder.jump_row(start_s, ends_s, size, query_total, context_total,
                               context_total, size, context_total + size, reserved,
                               waiting_sum)
        return ends_s[-1], self._advance(n, newcomers, start_s, ends_s[0], ends_s[-1])

    def _ends_s(
        self, start_s: float, ends_s: list[float], size: int, context_total: int,
        num_steps: int, ahead: int,
    ) -> list[float]:
        """`ends_s` (the plan's end, if any) extended by the members' decode steps' ends.

        Up to `num_steps` steps, stopping at the first end at or after the cut, where the
        generic loop's `_jump_length` stops. The members hold `context_total` tokens at
        the first step (each base + iterations + `ahead`). Running sums in order: the same
        additions as one timeout per iteration.
        """
        cut_s = self.engine._cut_s(start_s)  # past the run's end: it runs whole
        t = ends_s[-1] if ends_s else start_s
        if t >= cut_s:
            return ends_s
        line = self.cost.decode_line(size, context_total)
        if line is None:
            context = np.array(self.base, dtype=np.int64) + (self.iterations + ahead)
            for duration_s in self.cost.decode_steps_s(context, num_steps).tolist():
                t += duration_s
                ends_s.append(t)
                if t >= cut_s:
                    break
            return ends_s
        intercept_s, x0, dx, slope_s, floor_s, plus_s = line
        if floor_s or plus_s:  # an engine's overhead on the line (orcasim.cost.overhead)
            for k in range(num_steps):
                t += max(intercept_s + (x0 + dx * k) * slope_s, floor_s) + plus_s
                ends_s.append(t)
                if t >= cut_s:
                    break
            return ends_s
        for k in range(num_steps):  # a plain loop: cheaper than numpy at these lengths
            t += intercept_s + (x0 + dx * k) * slope_s
            ends_s.append(t)
            if t >= cut_s:
                break
        return ends_s

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

    def _may_continue(self) -> bool:
        """The generic loop's `_continue` condition: nothing arrived, nobody waits."""
        arrivals = self.engine.arrivals
        if arrivals.pending() and arrivals.next_time_s() <= self.engine.now_s:
            return False
        return bool(self.base) and not self.scheduler.num_waiting

    def _continue_jump(self, start_s: float) -> tuple[float, bool]:
        """A decode run after completions (generic `_continue`'s step): end, completions."""
        g, size = self.iterations, len(self.base)
        num_steps = min(self.finish_at) - g
        context_total = self.base_total + size * g
        ends_s = self._ends_s(start_s, [], size, context_total, num_steps, 0)
        n = len(ends_s)
        # Nobody waits at the start; arrivals inside are queued after the jump.
        self.recorder.run_row(start_s, ends_s, size, context_total,
                              self.scheduler.reserved_tokens, self.engine._late_waiting(ends_s, n))
        self.iterations = g + n
        if n < num_steps:
            return ends_s[-1], False
        self._release(ends_s[-1])
        return ends_s[-1], True

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
            self.recorder.finish_s[req] = finish_s
            done.append(req)
        self.scheduler.reserved_tokens -= freed
        self.engine.arrivals.on_finished(done, finish_s)  # a closed loop's clients send again

    def _write_progress(self) -> None:
        """The scheduler's per-request progress, as the generic loop leaves it: all done."""
        assert not self.scheduler.running and not self.scheduler.num_waiting
        scheduler, done = self.scheduler, ~np.isnan(self.recorder.finish_s)
        scheduler.generated[done] = self.output_tokens[done]
        scheduler.computed[done] = self.prompt_tokens[done] + self.output_tokens[done] - 1
