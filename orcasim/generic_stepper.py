"""The generic stepper: the engine variant every scheduler supports, through its
fast-forward hooks (`orcasim.schedulers.base.Scheduler`). `orcasim.engine` says how a unit
is planned, cut and applied; the fused loops (`orcasim.orca_fast`, `orcasim.paged_fast`)
run the same units without the hooks' objects, and hand the generic stepper what they do
not handle themselves."""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from orcasim.cost.base import CostModel, OutsideSteps
from orcasim.recorder import Recorder
from orcasim.replica import Load, Times, scheduler_load
from orcasim.schedulers.base import ContinuedRun, DecodeRun, Scheduler, SchedulerOutput

if TYPE_CHECKING:
    from orcasim.replica import Replica


@dataclass(slots=True)
class _Unit:
    """The pending unit: the plan's iteration (if any) and `n` iterations in all."""

    start_s: float
    ends_s: np.ndarray  # float64: every end the run could reach; the first `n` are kept
    n: int
    plan: SchedulerOutput | None  # None: a continued run
    run: DecodeRun | None  # None: one iteration
    outside: OutsideSteps | None = None  # the run's steps outside the cost model's range


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
        self.continuing = False  # the last unit was a run that ended in completions

    def start(self, now_s: float) -> float | None:
        self.wake_s = None
        if self.continuing and not self.replica.arrived:
            self.continuing = False
            continued = self.scheduler.continue_run()
            if continued is not None:  # the rest decodes on without a `schedule` call
                ends_s, outside = self._run_ends(now_s, continued)
                # None priced (its first step too short: `runnable_steps`): `schedule`
                # plans that step, as reference mode does (continue_run changed nothing).
                if len(ends_s):
                    return self._begin(now_s, ends_s, outside, None, continued)
        self.continuing = False
        plan = self.scheduler.schedule(now_s)
        if plan.pulled:  # KV pulled in from prefill instances: they free it as copies end
            plan = self._placed_pulls(plan, now_s)
        if plan.is_empty:
            self.wake_s = plan.wake_at_s
            return None
        run = self.scheduler.decode_run(plan) if self.fast else None
        if run is None:  # one iteration: all of reference mode
            end_s = now_s + self._plan_time_s(plan)
            self._unit = _Unit(now_s, np.array([end_s]), 1, plan, None)
            return end_s
        return self._begin(now_s, *self._run_ends(now_s, run, plan), plan, run)

    def _begin(self, start_s: float, ends_s: np.ndarray, outside: OutsideSteps | None,
               plan: SchedulerOutput | None, run: DecodeRun) -> float:
        n = self._jump_length(start_s, ends_s)
        self._unit = _Unit(start_s, ends_s, n, plan, run, outside=outside)
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
        # The clock's span, as a jump's row has it, not the priced duration: late in a long
        # run the two differ by up to half the clock's resolution (7.5e-9 s at 1e8 s).
        self.recorder.record_iteration(start_s, end_s - start_s, 1, plan, self.scheduler.num_queued)
        self.recorder.record_progress(plan.req_ids, start_s, result, end_s)
        self.replica.source.on_finished(result.finished_ids, end_s)

    def _finish_jump(self, unit: _Unit) -> None:
        """Apply the plan's iteration and `n - 1` steps of its run, which ended now."""
        plan, run, n, ends_s = unit.plan, unit.run, unit.n, unit.ends_s
        assert plan is not None and run is not None
        waiting = self.scheduler.num_queued * n + self.replica.late_waiting(ends_s, n)
        first, last = self.scheduler.advance(plan, run, n)
        if unit.outside is not None:  # the steps that ran: n - 1 after the plan's iteration
            self.cost.count_outside(unit.outside, n - 1)
        end_s = float(ends_s[n - 1])
        self.recorder.record_jump(unit.start_s, ends_s[:n], plan, run, waiting)
        self.recorder.record_scheduled(plan.req_ids, unit.start_s)
        self.recorder.record_result(first, float(ends_s[0]))
        self.recorder.record_result(last, end_s)
        source = self.replica.source
        source.on_finished(first.finished_ids, float(ends_s[0]))  # empty unless n == 1
        source.on_finished(last.finished_ids, end_s)
        self.continuing = n == run.num_steps + 1  # not cut (by a step priced too short either)

    def _finish_continued(self, unit: _Unit) -> None:
        run, n, ends_s = unit.run, unit.n, unit.ends_s
        assert isinstance(run, ContinuedRun)
        end_s = float(ends_s[n - 1])
        waiting = self.scheduler.num_queued * n + self.replica.late_waiting(ends_s, n)
        result = self.scheduler.advance_run(run, n)
        if unit.outside is not None:
            self.cost.count_outside(unit.outside, n)
        self.recorder.record_run(unit.start_s, ends_s[:n], run, waiting)
        self.recorder.record_result(result, end_s)
        self.replica.source.on_finished(result.finished_ids, end_s)
        self.continuing = n == run.num_steps

    def _run_ends(
        self, now_s: float, run: DecodeRun, plan: SchedulerOutput | None = None
    ) -> tuple[np.ndarray, OutsideSteps | None]:
        """End times of the plan's iteration (if any, index 0) and of each step of the run
        the cost model priced (up to one too short: `runnable_steps`); which steps it counts
        outside its range once they have run."""
        head = 1 if plan is None else 2
        ends_s = np.empty(run.num_steps + head)
        ends_s[0] = now_s
        if plan is not None:
            ends_s[1] = self._plan_time_s(plan)
        outside = None
        if run.num_steps:  # a zero-step run prices nothing
            steps_s, outside = self.cost.decode_steps_outside(run.context_tokens, run.num_steps)
            if len(steps_s) < run.num_steps:
                ends_s = ends_s[:head + len(steps_s)]
            ends_s[head:] = steps_s
        # Running sums in order: the same float additions as one iteration at a time.
        return np.add.accumulate(ends_s)[1:], outside  # a new array: in place is slower

    def _placed_pulls(self, plan: SchedulerOutput, now_s: float) -> SchedulerOutput:
        """`plan` with its pulled copies as the links place them: a copy that waits for a
        busy sender's link makes the iteration wait longer."""
        placed = self.replica.source.on_pulled(plan.pulled, now_s)
        wait_s = placed[-1][1] - plan.pulled[-1][1]
        if wait_s == 0.0:
            return plan
        return dataclasses.replace(plan, pulled=placed, copy_time_s=plan.copy_time_s + wait_s)

    def _plan_time_s(self, plan: SchedulerOutput) -> float:
        """One iteration of `plan`, with the KV copying it waits for (swaps, pulled KV)."""
        return self.cost.iteration_time_s(plan.batch) + plan.copy_time_s

    def _jump_length(self, start_s: float, ends_s: np.ndarray) -> int:
        """Iterations to run: up to the first boundary at or after the known cut."""
        if len(ends_s) == 1:
            return 1
        cut_s = self.replica.cut_s(start_s, float(ends_s[-2]))  # by the last inner boundary
        if cut_s == math.inf:
            return len(ends_s)
        return bisect.bisect_left(ends_s, cut_s) + 1
