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

Exactness: the cost model sees the same arrays (values, dtypes, order) as in the generic
loop, times are accumulated by the same additions, and rows come from the recorder's same
formulas, so this loop reproduces the generic one bit for bit (tests/test_orca_fast.py),
and with it reference mode.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import numpy as np
import simpy

from orcasim.cost.base import Batch
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
        """The engine's `_loop` for fast mode, specialised (same steps, same order)."""
        engine, running = self.engine, self.scheduler.running
        while True:
            engine._admit_arrivals()
            newcomers = self._admit()
            if not running:
                wake_s = engine._idle_until(None)
                if wake_s is None:
                    break
                yield from engine._sleep_until(wake_s)
                continue
            ended_in_completions = yield from self._plan_jump(newcomers)
            if ended_in_completions:
                yield from self._continue()
        self._write_progress()
        yield engine._sync_env()

    def _admit(self) -> list[int]:
        """Orca's admission step (the scheduler's own); the ids admitted, in order."""
        scheduler, g = self.scheduler, self.iterations
        admitted = []
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

    def _plan_jump(self, newcomers: list[int]) -> Generator[simpy.Event, None, bool]:
        """The plan's iteration and the decode run after it (cut like the generic loop's).

        Returns whether the run ended in completions. The plan is what `schedule` makes:
        every member in admission order; newcomers (the tail) run their whole prompt.
        """
        engine, g, size = self.engine, self.iterations, len(self.base)
        start_s = engine.now_s
        prompts = [self.prompt_tokens.item(r) for r in newcomers]
        query_total = size - len(newcomers) + sum(prompts)
        context_total = self.base_total + size * g
        context = np.array(self.base, dtype=np.int64) + g
        batch = Batch.with_totals(np.array([1] * (size - len(newcomers)) + prompts, dtype=np.int64),
                                  context, query_total, context_total)
        plan_s = self.cost.iteration_time_s(batch)
        steps = min(self.finish_at) - g - 1  # pure-decode iterations before the first completion
        reserved, waiting = self.scheduler.reserved_tokens, self.scheduler.num_waiting
        if steps <= 0:  # one iteration, as reference mode runs it
            yield from engine._sleep_until(start_s + plan_s)
            self.recorder.append_row(start_s, plan_s, 1, size, query_total, context_total,
                                     reserved, waiting, float(context_total), 0, 0)
            self._advance(1, newcomers, start_s, engine.now_s)
            return False  # the generic loop looks again with `schedule`, not `_continue`
        ends_s = np.empty(steps + 2)
        ends_s[0], ends_s[1] = start_s, plan_s
        ends_s[2:] = self.cost.decode_steps_s(context + 1, steps)
        ends_s = np.add.accumulate(ends_s)[1:]  # the same additions as one timeout per iteration
        n = engine._jump_length(start_s, ends_s)
        yield from engine._sleep_until(float(ends_s[n - 1]))
        waiting_sum = waiting * n + engine._late_waiting(ends_s, n)
        self.recorder.jump_row(start_s, ends_s[:n], size, query_total, context_total,
                               context_total, size, context_total + size, reserved,
                               waiting_sum)
        return self._advance(n, newcomers, start_s, float(ends_s[0]))

    def _advance(self, n: int, newcomers: list[int], start_s: float, head_end_s: float) -> bool:
        """`n` iterations ended at the engine's now; True if they ended in completions."""
        self.iterations += n
        recorder = self.recorder
        for req in newcomers:  # scheduled at the plan's start, first token at its end
            recorder.first_scheduled_s[req] = start_s
            recorder.first_token_s[req] = head_end_s
        if min(self.finish_at) != self.iterations:
            return False
        self._release()
        return True

    def _continue(self) -> Events:
        """The generic loop's `_continue`: decode on after completions while nobody can join."""
        engine, scheduler, arrivals = self.engine, self.scheduler, self.engine.arrivals
        while not (arrivals.pending() and arrivals.next_time_s() <= engine.now_s):
            if scheduler.num_waiting or not self.base:
                return
            g, size, start_s = self.iterations, len(self.base), engine.now_s
            num_steps = min(self.finish_at) - g
            ends_s = np.empty(num_steps + 1)
            ends_s[0] = start_s
            ends_s[1:] = self.cost.decode_steps_s(np.array(self.base, dtype=np.int64) + g, num_steps)
            ends_s = np.add.accumulate(ends_s)[1:]
            n = engine._jump_length(start_s, ends_s)
            yield from engine._sleep_until(float(ends_s[n - 1]))
            # Nobody waits at the start; arrivals inside are queued after the jump.
            self.recorder.run_row(start_s, ends_s[:n], size, self.base_total + size * g,
                                  scheduler.reserved_tokens, engine._late_waiting(ends_s, n))
            self.iterations = g + n
            if n < num_steps:
                return
            self._release()

    def _release(self) -> None:
        """Members whose last token ended at the engine's now: finished, reservations freed."""
        g, finish_s = self.iterations, self.engine.now_s
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
