"""The SimPy engine: it owns the clock, feeds arrivals to a scheduler and times iterations.

Both modes share one loop:

    admit every arrival at or before now
    plan = scheduler.schedule(now)
    if the plan is empty: sleep until the next arrival (or the scheduler's wake-up time)
    else: run the plan (and, in fast mode, the decode run that follows it), then record

`reference` mode runs one iteration per SimPy timeout: it is the specification.
`fast` mode asks the scheduler how many pure-decode iterations follow the plan with the
same requests (`Scheduler.decode_run`), prices them at once (`CostModel.decode_steps_s`)
and sleeps once. The jump is cut at the first iteration boundary at or after the next
arrival if the scheduler could admit it (`Scheduler.admits_arrival`), exactly where the
reference loop would admit it, and at `row_breaks_s` (the warm-up) so that no recorded
row straddles one. When a run ends in completions, nothing has arrived and nobody waits,
the rest of the batch decodes on: `Scheduler.continue_run` gives that run without a new
`schedule` call, and the engine jumps over it the same way. For the plain Orca scheduler
fast mode runs the same loop fused (`orcasim.orca_fast`): the same jumps and numbers, bit
for bit, without the per-jump objects of these hooks.

The engine keeps the simulated time itself (`now_s`), as a running sum of iteration
durations; `np.add.accumulate` adds in the same order, so both modes see the same boundaries.
SimPy sequences the events; its `env.now` can differ from `now_s` by an ulp, because
`now + (t - now)` need not round to `t`.

Arrivals come from `ArrivalSource`, which the loop polls, and which hears of every
completion (`on_finished`). A jump's completions all fall on its last boundary, so a
follow-up request made from one (a closed-loop workload, `orcasim.closed_loop`) arrives
at or after the next time the loop looks: the source takes such pushes in time order,
which keeps fast mode exact without changing the loop.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import simpy

from orcasim import orca_fast
from orcasim.cost.base import CostModel
from orcasim.recorder import Recorder
from orcasim.requests import Requests
from orcasim.schedulers.base import DecodeRun, Scheduler, SchedulerOutput

EngineMode = Literal["fast", "reference"]


@dataclass
class EngineRun:
    """Raw output of one simulated system."""

    recorder: Recorder
    end_s: float
    # Requests the scheduler could never fit (int64), which never ran.
    rejected_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def finished_run(recorder: Recorder, end_s: float, scheduler: Scheduler) -> EngineRun:
    """Close a run: every request finished exactly once, except those the scheduler rejected."""
    rejected = np.asarray(scheduler.rejected_ids, dtype=np.int64)
    assert np.all(np.isnan(recorder.finish_s[rejected])), "a rejected request finished"
    unfinished = int(np.isnan(recorder.finish_s).sum()) - len(rejected)
    assert unfinished == 0, f"{unfinished} admitted requests never finished"
    return EngineRun(recorder, end_s, rejected)


class ArrivalSource:
    """The requests not yet given to the scheduler, in arrival (= id) order.

    An open-loop source replays fixed times. `on_finished` is how the engine reports
    completions, for a source whose arrivals depend on them (`orcasim.closed_loop`).
    """

    closed_loop = False  # whether completions and rejections make arrivals

    def __init__(self, arrival_s: np.ndarray) -> None:
        self.arrival_s = arrival_s
        self._times = arrival_s.tolist()  # Python floats: cheap scalar reads in the loop
        self.next_index = 0

    def pending(self) -> bool:
        return self.next_index < len(self._times)

    def next_time_s(self) -> float:
        return self._times[self.next_index]

    def take_until(self, now_s: float) -> range:
        """Ids that arrived by `now_s`."""
        times, i = self._times, self.next_index
        while i < len(times) and times[i] <= now_s:
            i += 1
        taken = range(self.next_index, i)
        self.next_index = i
        return taken

    def times_until(self, time_s: float) -> np.ndarray:
        """Times of the pending arrivals at or before `time_s`, in order (float64)."""
        stop = int(np.searchsorted(self.arrival_s, time_s, side="right"))
        return self.arrival_s[self.next_index : stop]

    def on_finished(self, req_ids: Iterable[int], time_s: float) -> None:
        """Requests done (or turned away) at `time_s`: nothing follows in an open loop."""


def admit_arrivals(arrivals: ArrivalSource, scheduler: Scheduler, now_s: float) -> None:
    """Give the scheduler every arrival by `now_s`; one it turns away is answered at once."""
    taken = arrivals.take_until(now_s)
    if not taken:
        return
    rejected = scheduler.rejected_ids
    before = len(rejected)
    for req_id in taken:
        scheduler.add_request(req_id)
    if len(rejected) > before:
        arrivals.on_finished(np.array(rejected[before:], dtype=np.int64), now_s)


class Engine:
    """Drives one scheduler over one request table with one cost model."""

    def __init__(
        self, requests: Requests, scheduler: Scheduler, cost: CostModel,
        mode: EngineMode = "fast", row_breaks_s: Sequence[float] = (), fused: bool = True,
        arrivals: ArrivalSource | None = None,
    ) -> None:
        """`arrivals` defaults to replaying `requests.arrival_s` (open loop)."""
        self.requests = requests
        self.scheduler = scheduler
        self.cost = cost
        self.mode = mode
        self._breaks_s = sorted(row_breaks_s, reverse=True)  # warm-up breaks to come, next last
        self.env = simpy.Environment()
        self.now_s = 0.0
        self.recorder = Recorder(len(requests))
        assert arrivals is not None or requests.clients is None, "a closed loop needs its source"
        self.arrivals = ArrivalSource(requests.arrival_s) if arrivals is None else arrivals
        # Fast mode on the plain Orca scheduler runs the fused loop (orcasim.orca_fast),
        # which equals `_loop` bit for bit; `fused=False` keeps `_loop` (tests compare them).
        self.fused = fused and mode == "fast" and orca_fast.applies(scheduler)

    def run(self) -> EngineRun:
        self.env.process(orca_fast.OrcaFastLoop(self).loop() if self.fused else self._loop())
        self.env.run()
        return finished_run(self.recorder, self.now_s, self.scheduler)

    def _admit_arrivals(self) -> None:
        admit_arrivals(self.arrivals, self.scheduler, self.now_s)

    def _sleep_until(self, target_s: float) -> Generator[simpy.Event, None, None]:
        """Move the clock to `target_s`, handing control to SimPy only when it must.

        A SimPy round trip costs more than a whole jump's bookkeeping. Only an event
        due by `target_s` (another process's) could act in between; the engine is
        usually its environment's only process, so its clock runs ahead of SimPy's
        and `_sync_env` catches SimPy up when the loop ends.
        """
        self.now_s = target_s
        if self.env.peek() <= target_s:
            yield self._sync_env()

    def _sync_env(self) -> simpy.Timeout:
        return self.env.timeout(max(0.0, self.now_s - self.env.now))

    def _loop(self) -> Generator[simpy.Event, None, None]:
        # A scheduler whose contract declares no fast-forward steps as in reference mode.
        fast = self.mode == "fast" and self.scheduler.fast_forward.enabled
        while True:
            self._admit_arrivals()
            plan = self.scheduler.schedule(self.now_s)
            if plan.is_empty:
                wake_s = self._idle_until(plan.wake_at_s)
                if wake_s is None:
                    yield self._sync_env()
                    return
                yield from self._sleep_until(wake_s)
                continue
            start_s = self.now_s
            run = self.scheduler.decode_run(plan) if fast else None
            if run is None:  # one iteration: all of reference mode
                duration_s = self._plan_time_s(plan)
                yield from self._sleep_until(start_s + duration_s)
                self._finish_iteration(plan, start_s, duration_s)
            else:
                ends_s = self._run_ends(run, plan)
                n = self._jump_length(start_s, ends_s)
                yield from self._sleep_until(float(ends_s[n - 1]))
                self._finish_jump(plan, run, start_s, ends_s, n)
                if n == len(ends_s):  # the run ended in completions: the rest may go on
                    yield from self._continue()

    def _continue(self) -> Generator[simpy.Event, None, None]:
        """Jumps over runs that follow completions when nobody can join (no `schedule`)."""
        while not (self.arrivals.pending() and self.arrivals.next_time_s() <= self.now_s):
            run = self.scheduler.continue_run()
            if run is None:
                return
            start_s = self.now_s
            ends_s = self._run_ends(run)
            n = self._jump_length(start_s, ends_s)
            yield from self._sleep_until(float(ends_s[n - 1]))
            waiting = self.scheduler.num_waiting * n + self._late_waiting(ends_s, n)
            result = self.scheduler.advance_run(run, n)
            self.recorder.record_run(start_s, ends_s[:n], run, waiting)
            self.recorder.record_result(result, self.now_s)
            self.arrivals.on_finished(result.finished_ids, self.now_s)
            if n < len(ends_s):
                return

    def _finish_iteration(self, plan: SchedulerOutput, start_s: float, duration_s: float) -> None:
        result = self.scheduler.update_from_output(plan)
        self.recorder.record_iteration(start_s, duration_s, 1, plan, self.scheduler.num_waiting)
        self.recorder.record_progress(plan.req_ids, start_s, result, self.now_s)
        self.arrivals.on_finished(result.finished_ids, self.now_s)

    def _finish_jump(
        self, plan: SchedulerOutput, run: DecodeRun, start_s: float, ends_s: np.ndarray, n: int
    ) -> None:
        """Apply the plan's iteration and `n - 1` steps of its run, which ended at now_s."""
        waiting = self.scheduler.num_waiting * n + self._late_waiting(ends_s, n)
        first, last = self.scheduler.advance(plan, run, n)
        self.recorder.record_jump(start_s, ends_s[:n], plan, run, waiting)
        self.recorder.record_scheduled(plan.req_ids, start_s)
        self.recorder.record_result(first, float(ends_s[0]))
        self.recorder.record_result(last, self.now_s)
        self.arrivals.on_finished(first.finished_ids, float(ends_s[0]))  # empty unless n == 1
        self.arrivals.on_finished(last.finished_ids, self.now_s)

    def _run_ends(self, run: DecodeRun, plan: SchedulerOutput | None = None) -> np.ndarray:
        """End times of the plan's iteration (if any, index 0) and of each step of the run."""
        head = 1 if plan is None else 2
        ends_s = np.empty(run.num_steps + head)
        ends_s[0] = self.now_s
        if plan is not None:
            ends_s[1] = self._plan_time_s(plan)
        if run.num_steps:  # a zero-step run prices nothing (a model may count what it prices)
            ends_s[head:] = self.cost.decode_steps_s(run.context_tokens, run.num_steps)
        # Running sums in order: the same float additions as one timeout per iteration.
        return np.add.accumulate(ends_s)[1:]  # a new array: in place is slower

    def _plan_time_s(self, plan: SchedulerOutput) -> float:
        """One iteration of `plan`, with any KV copying to or from CPU memory it needs."""
        return self.cost.iteration_time_s(plan.batch) + plan.swap_time_s

    def _jump_length(self, start_s: float, ends_s: Sequence[float]) -> int:
        """Iterations to run: up to the boundary at which something must be looked at.

        `ends_s`: the boundaries, ascending (an array, or a list in the fused Orca loop).
        """
        if len(ends_s) == 1:
            return 1
        cut_s = self._cut_s(start_s, float(ends_s[-2]))  # by the run's last inner boundary
        if cut_s == math.inf:
            return len(ends_s)
        # The first boundary at or after the cut: the reference loop looks again there.
        return bisect.bisect_left(ends_s, cut_s) + 1

    def _cut_s(self, start_s: float, until_s: float = math.inf) -> float:
        """Where a jump from `start_s` must stop, or inf if nothing does by `until_s`.

        The first warm-up break after the start, or the next arrival if it could join,
        or else, in a closed loop, the first pending arrival that will be turned away.
        The jump ends at the first iteration boundary at or after the cut. Jumps start
        at the engine's clock, which only moves on, so passed breaks are dropped for good.
        """
        breaks_s = self._breaks_s
        while breaks_s and breaks_s[-1] <= start_s:
            breaks_s.pop()
        cut_s = breaks_s[-1] if breaks_s and breaks_s[-1] <= until_s else math.inf
        if self.arrivals.pending():
            t = self.arrivals.next_time_s()
            if t <= until_s and t < cut_s:
                if self.scheduler.admits_arrival(self.arrivals.next_index):
                    cut_s = t
                elif self.arrivals.closed_loop:
                    cut_s = min(cut_s, self._rejection_s(min(cut_s, until_s)))
        return cut_s

    def _rejection_s(self, until_s: float) -> float:
        """Time of the first pending arrival by `until_s` that will be turned away, or inf.

        In a closed loop turning a request away is visible (its client sends again at
        once), so a jump stops at the boundary where the reference loop turns it away.
        (In an open loop only the waiting count could tell, and `_late_waiting` skips it.)
        """
        first = self.arrivals.next_index
        for k, t in enumerate(self.arrivals.times_until(until_s).tolist()):
            if self.scheduler.never_fits(first + k):
                return t
        return math.inf

    def _late_waiting(self, ends_s: Sequence[float], n: int) -> int:
        """Waiting-count summed over a jump's later iterations, for arrivals inside it.

        Such arrivals were not admissible; the reference loop would have queued each at
        the first boundary at or after it. They are queued after the jump (same order,
        no `schedule` in between, so the same state) and counted here as if on time.
        """
        if n == 1 or not self.arrivals.pending() or self.arrivals.next_time_s() > ends_s[n - 2]:
            return 0
        inner_ends_s = ends_s[: n - 1]
        arrival_s = self.arrivals.times_until(float(ends_s[n - 2]))
        ids = range(self.arrivals.next_index, self.arrivals.next_index + len(arrival_s))
        if any(map(self.scheduler.never_fits, ids)):  # turned away when queued: never waits
            arrival_s = arrival_s[np.array([not self.scheduler.never_fits(i) for i in ids])]
        boundary = np.searchsorted(inner_ends_s, arrival_s, side="left")
        return int((n - 1 - boundary).sum())

    def _idle_until(self, wake_at_s: float | None) -> float | None:
        """Next time to look again: the next arrival or the scheduler's wake-up time."""
        arrival_s = self.arrivals.next_time_s() if self.arrivals.pending() else None
        if arrival_s is not None and (wake_at_s is None or arrival_s <= wake_at_s):
            return arrival_s
        if wake_at_s is not None:
            return wake_at_s
        assert not self.scheduler.has_unfinished(), "scheduler idle with unfinished requests"
        return None

