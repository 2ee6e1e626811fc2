"""The SimPy engine: it owns the clock, feeds arrivals to a scheduler and times iterations.

Reference mode runs one iteration per SimPy timeout. The loop:

    admit every arrival at or before now
    plan = scheduler.schedule(now)
    if the plan is empty: sleep until the next arrival (or the scheduler's wake-up time)
    else: sleep for cost(plan.batch), then scheduler.update_from_output(plan), and record
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np
import simpy

from orcasim.cost.base import CostModel
from orcasim.recorder import Recorder
from orcasim.requests import Requests
from orcasim.schedulers.base import Scheduler


@dataclass
class EngineRun:
    """Raw output of one simulated system."""

    recorder: Recorder
    end_s: float
    # Requests the scheduler could never fit (int64), which never ran.
    rejected_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class Engine:
    """Drives one scheduler over one request table with one cost model."""

    def __init__(self, requests: Requests, scheduler: Scheduler, cost: CostModel) -> None:
        self.requests = requests
        self.scheduler = scheduler
        self.cost = cost
        self.env = simpy.Environment()
        self.recorder = Recorder(len(requests))
        self._next_arrival = 0  # index of the first request not yet given to the scheduler

    def run(self) -> EngineRun:
        self.env.process(self._loop())
        self.env.run()
        rejected = np.asarray(self.scheduler.rejected_ids, dtype=np.int64)
        assert np.all(np.isnan(self.recorder.finish_s[rejected])), "a rejected request finished"
        unfinished = int(np.isnan(self.recorder.finish_s).sum()) - len(rejected)
        assert unfinished == 0, f"{unfinished} admitted requests never finished"
        return EngineRun(self.recorder, float(self.env.now), rejected)

    def _admit_arrivals(self, up_to_index: int = -1) -> None:
        """Give the scheduler every request that has arrived (and at least up to `up_to_index`)."""
        arrival_s, n = self.requests.arrival_s, len(self.requests)
        i = self._next_arrival
        while i < n and (i <= up_to_index or arrival_s[i] <= self.env.now):
            self.scheduler.add_request(i)
            i += 1
        self._next_arrival = i

    def _loop(self) -> Generator[simpy.Event, None, None]:
        while True:
            self._admit_arrivals()
            plan = self.scheduler.schedule(self.env.now)
            if plan.is_empty:
                wake = self._idle_until(plan.wake_at_s)
                if wake is None:
                    return
                target_s, arrival_index = wake
                yield self.env.timeout(max(0.0, target_s - self.env.now))
                # Admit by index too: now + (t - now) can miss t by one ulp.
                self._admit_arrivals(arrival_index)
                continue
            start_s = self.env.now
            duration_s = self.cost.iteration_time_s(plan.batch) + plan.swap_time_s
            yield self.env.timeout(duration_s)
            result = self.scheduler.update_from_output(plan)
            self.recorder.record_iteration(start_s, duration_s, 1, plan, self.scheduler.num_waiting)
            self.recorder.record_progress(plan.req_ids, start_s, result, self.env.now)

    def _idle_until(self, wake_at_s: float | None) -> tuple[float, int] | None:
        """Next time to look again, and the index of the arrival it admits (-1 for none)."""
        has_arrival = self._next_arrival < len(self.requests)
        arrival_s = float(self.requests.arrival_s[self._next_arrival]) if has_arrival else None
        if arrival_s is not None and (wake_at_s is None or arrival_s <= wake_at_s):
            return arrival_s, self._next_arrival
        if wake_at_s is not None:
            return wake_at_s, -1
        assert not self.scheduler.has_unfinished(), "scheduler idle with unfinished requests"
        return None
