"""The plain engine variant: one scheduler, one cost model, one iteration (or jump) at a time.

`GenericStepper` is the `orcasim.replica.Stepper` of every scheduler; `Engine` runs one
replica of it (or of the fused Orca loop) over a request table, on the clock loop of
`orcasim.replica.drive`. Both modes share one skeleton:

    admit every arrival at or before now
    plan = scheduler.schedule(now)
    if the plan is empty: wait for the next arrival (or the scheduler's wake-up time)
    else: run the plan (and, in fast mode, the decode run that follows it), then record

`reference` mode runs one iteration per unit: it is the specification.
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

Simulated time is a running sum of iteration durations; `np.add.accumulate` adds in the
same order, so both modes see the same boundaries.

Arrivals come from `ArrivalSource`, which the loop polls, and which hears of every
completion (`on_finished`). A jump's completions all fall on its last boundary, so a
follow-up request made from one (a closed-loop workload, `orcasim.closed_loop`) arrives
at or after the next time the loop looks: the source takes such pushes in time order,
and the clock loop delivers them before the replica plans again (`orcasim.replica`).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from orcasim import orca_fast
from orcasim.cost.base import CostModel
from orcasim.recorder import Recorder
from orcasim.replica import Load, Replica, Times, drive, scheduler_load, single
from orcasim.requests import Requests
from orcasim.schedulers.base import ContinuedRun, DecodeRun, Scheduler, SchedulerOutput
from orcasim.sources import ArrivalSource

if TYPE_CHECKING:
    from orcasim.replica import Stepper

__all__ = ["ArrivalSource", "Engine", "EngineMode", "EngineRun", "GenericStepper", "finished_run"]

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


@dataclass(slots=True)
class _Unit:
    """The pending unit: the plan's iteration (if any) and `n` iterations in all."""

    start_s: float
    ends_s: np.ndarray  # float64: every end the run could reach; the first `n` are kept
    n: int
    plan: SchedulerOutput | None  # None: a continued run
    run: DecodeRun | None  # None: one iteration
    duration_s: float = 0.0  # a single iteration's own duration (ends_s[0] - start_s rounds)


class GenericStepper:
    """The engine variant every scheduler supports, through the fast-forward hooks."""

    plans_on_arrival = False

    def __init__(self, scheduler: Scheduler, cost: CostModel, recorder: Recorder, fast: bool) -> None:
        self.scheduler, self.cost, self.recorder = scheduler, cost, recorder
        # A scheduler whose contract declares no fast-forward steps as in reference mode.
        self.fast = fast and scheduler.fast_forward.enabled
        self.replica: Replica  # set by the replica that runs it (see `Engine.run`)
        self.wake_s: float | None = None
        self._unit: _Unit | None = None
        self._continuing = False  # the last unit was a run that ended in completions

    def start(self, now_s: float) -> float | None:
        self.wake_s = None
        if self._continuing and not self.replica.arrived:
            self._continuing = False
            continued = self.scheduler.continue_run()
            if continued is not None:  # the rest decodes on without a `schedule` call
                return self._begin(now_s, self._run_ends(now_s, continued), None, continued)
        self._continuing = False
        plan = self.scheduler.schedule(now_s)
        if plan.is_empty:
            self.wake_s = plan.wake_at_s
            return None
        run = self.scheduler.decode_run(plan) if self.fast else None
        if run is None:  # one iteration: all of reference mode
            duration_s = self._plan_time_s(plan)
            end_s = now_s + duration_s
            self._unit = _Unit(now_s, np.array([end_s]), 1, plan, None, duration_s)
            return end_s
        return self._begin(now_s, self._run_ends(now_s, run, plan), plan, run)

    def _begin(self, start_s: float, ends_s: np.ndarray, plan: SchedulerOutput | None,
               run: DecodeRun) -> float:
        n = self._jump_length(start_s, ends_s)
        self._unit = _Unit(start_s, ends_s, n, plan, run)
        return float(ends_s[n - 1])

    def ends_s(self) -> Times:
        unit = self._unit
        return () if unit is None else unit.ends_s[: unit.n]

    def cut(self, num_iterations: int) -> None:
        assert self._unit is not None and 1 <= num_iterations <= self._unit.n
        self._unit.n = num_iterations

    def finish(self) -> None:
        unit, self._unit = self._unit, None
        assert unit is not None
        if unit.run is None:
            self._finish_iteration(unit)
        elif unit.plan is None:
            self._finish_continued(unit)
        else:
            self._finish_jump(unit)

    def load(self) -> Load:
        load = scheduler_load(self.scheduler)
        unit = self._unit
        if unit is None or unit.plan is not None or unit.run is None:
            return load
        # A continued run skipped the `schedule` call that would have grown its first
        # step's KV (its allocations are applied at its end): report them as made.
        step_reserved = unit.run.step_reserved_tokens
        if step_reserved is None:
            return load
        return dataclasses.replace(load, kv_used_tokens=int(step_reserved[0]))

    def close(self) -> None:
        """Nothing to write back: the scheduler's progress is always up to date."""

    def _finish_iteration(self, unit: _Unit) -> None:
        plan, start_s, end_s = unit.plan, unit.start_s, float(unit.ends_s[0])
        assert plan is not None
        result = self.scheduler.update_from_output(plan)
        self.recorder.record_iteration(start_s, unit.duration_s, 1, plan, self.scheduler.num_waiting)
        self.recorder.record_progress(plan.req_ids, start_s, result, end_s)
        self.replica.source.on_finished(result.finished_ids, end_s)

    def _finish_jump(self, unit: _Unit) -> None:
        """Apply the plan's iteration and `n - 1` steps of its run, which ended now."""
        plan, run, n, ends_s = unit.plan, unit.run, unit.n, unit.ends_s
        assert plan is not None and run is not None
        waiting = self.scheduler.num_waiting * n + self.replica.late_waiting(ends_s, n)
        first, last = self.scheduler.advance(plan, run, n)
        end_s = float(ends_s[n - 1])
        self.recorder.record_jump(unit.start_s, ends_s[:n], plan, run, waiting)
        self.recorder.record_scheduled(plan.req_ids, unit.start_s)
        self.recorder.record_result(first, float(ends_s[0]))
        self.recorder.record_result(last, end_s)
        source = self.replica.source
        source.on_finished(first.finished_ids, float(ends_s[0]))  # empty unless n == 1
        source.on_finished(last.finished_ids, end_s)
        self._continuing = n == len(ends_s)

    def _finish_continued(self, unit: _Unit) -> None:
        run, n, ends_s = unit.run, unit.n, unit.ends_s
        assert isinstance(run, ContinuedRun)
        end_s = float(ends_s[n - 1])
        waiting = self.scheduler.num_waiting * n + self.replica.late_waiting(ends_s, n)
        result = self.scheduler.advance_run(run, n)
        self.recorder.record_run(unit.start_s, ends_s[:n], run, waiting)
        self.recorder.record_result(result, end_s)
        self.replica.source.on_finished(result.finished_ids, end_s)
        self._continuing = n == len(ends_s)

    def _run_ends(self, now_s: float, run: DecodeRun, plan: SchedulerOutput | None = None) -> np.ndarray:
        """End times of the plan's iteration (if any, index 0) and of each step of the run."""
        head = 1 if plan is None else 2
        ends_s = np.empty(run.num_steps + head)
        ends_s[0] = now_s
        if plan is not None:
            ends_s[1] = self._plan_time_s(plan)
        if run.num_steps:  # a zero-step run prices nothing (a model may count what it prices)
            ends_s[head:] = self.cost.decode_steps_s(run.context_tokens, run.num_steps)
        # Running sums in order: the same float additions as one iteration at a time.
        return np.add.accumulate(ends_s)[1:]  # a new array: in place is slower

    def _plan_time_s(self, plan: SchedulerOutput) -> float:
        """One iteration of `plan`, with any KV copying to or from CPU memory it needs."""
        return self.cost.iteration_time_s(plan.batch) + plan.swap_time_s

    def _jump_length(self, start_s: float, ends_s: np.ndarray) -> int:
        """Iterations to run: up to the first boundary at or after the known cut."""
        if len(ends_s) == 1:
            return 1
        cut_s = self.replica.cut_s(start_s, float(ends_s[-2]))  # by the last inner boundary
        if cut_s == math.inf:
            return len(ends_s)
        return bisect.bisect_left(ends_s, cut_s) + 1


def stepper_for(scheduler: Scheduler, cost: CostModel, recorder: Recorder, mode: EngineMode,
                fused: bool = True) -> Stepper:
    """The engine variant for `scheduler`: the fused loop for plain Orca in fast mode (unless
    `fused` is False), else the generic stepper."""
    if fused and mode == "fast" and orca_fast.applies(scheduler):
        return orca_fast.OrcaFusedStepper(scheduler, cost, recorder)  # type: ignore[arg-type]  # applies() checked the kind
    return GenericStepper(scheduler, cost, recorder, mode == "fast")


class Engine:
    """Drives one scheduler over one request table with one cost model: a one-replica loop."""

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
        self.row_breaks_s = tuple(row_breaks_s)
        self.recorder = Recorder(len(requests))
        assert arrivals is not None or not requests.closed_loop, "a closed loop needs its source"
        self.arrivals = ArrivalSource(requests.arrival_s) if arrivals is None else arrivals
        # Fast mode on the plain Orca scheduler runs the fused loop (orcasim.orca_fast),
        # which equals the generic one bit for bit; `fused=False` keeps the generic one.
        self.fused = fused and mode == "fast" and orca_fast.applies(scheduler)

    def stepper(self) -> Stepper:
        return stepper_for(self.scheduler, self.cost, self.recorder, self.mode, self.fused)

    def run(self) -> EngineRun:
        stepper = self.stepper()
        replica = Replica(stepper, self.arrivals, self.recorder, self.row_breaks_s)
        end_s = drive([replica], self.arrivals, single(replica))
        stepper.close()
        return finished_run(self.recorder, end_s, self.scheduler)
