"""The plain engine variant: one scheduler, one cost model, one iteration (or jump) at a time.

`GenericStepper` (`orcasim.generic_stepper`) is the `orcasim.replica.Stepper` of every
scheduler; `Engine` runs one replica of it (or of a fused loop) over a request table, on the
clock loop of `orcasim.replica.drive`. Both modes share one skeleton:

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
and the paged (either policy) and chunked ones (no prefix caching) fast mode runs the same
loop fused (`orcasim.orca_fast`, `orcasim.paged_fast`): the same jumps and numbers, bit for
bit, without the per-jump objects of these hooks.

Simulated time is a running sum of iteration durations; `np.add.accumulate` adds in the
same order, so both modes see the same boundaries.

Arrivals come from `ArrivalSource`, which the loop polls, and which hears of every
completion (`on_finished`). A jump's completions all fall on its last boundary, so a
follow-up request made from one (a closed-loop workload, `orcasim.closed_loop`) arrives
at or after the next time the loop looks: the source takes such pushes in time order,
and the clock loop delivers them before the replica plans again (`orcasim.replica`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from orcasim import orca_fast, paged_fast
from orcasim.cost.base import CostModel
from orcasim.generic_stepper import GenericStepper
from orcasim.recorder import Recorder
from orcasim.replica import Replica, drive, single
from orcasim.requests import Requests
from orcasim.schedulers.base import Scheduler
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


def finished_run(recorder: Recorder, end_s: float, schedulers: Sequence[Scheduler]) -> EngineRun:
    """Close a run of one or more replicas (a scheduler each) over `recorder`'s per-request
    times: every request finished exactly once (the recorder refuses a second finish),
    except those a scheduler rejected, which never finished. The one place this is checked,
    for a lone engine, a fleet and a disaggregated cluster alike."""
    rejected = np.unique(np.concatenate(
        [np.asarray(s.rejected_ids, dtype=np.int64) for s in schedulers]))
    assert np.all(np.isnan(recorder.finish_s[rejected])), "a rejected request finished"
    unfinished = int(np.isnan(recorder.finish_s).sum()) - len(rejected)
    assert unfinished == 0, f"{unfinished} admitted requests never finished"
    return EngineRun(recorder, end_s, rejected)


def fused_applies(scheduler: Scheduler) -> bool:
    """Whether fast mode runs a fused loop for `scheduler` (plain Orca, or paged of either
    policy or chunked, without prefix caching) rather than the generic stepper."""
    return orca_fast.applies(scheduler) or paged_fast.applies(scheduler)


def stepper_for(scheduler: Scheduler, cost: CostModel, recorder: Recorder, mode: EngineMode,
                fused: bool = True) -> Stepper:
    """The engine variant for `scheduler`: in fast mode a fused loop where one applies
    (unless `fused` is False), else the generic stepper."""
    if fused and mode == "fast" and orca_fast.applies(scheduler):
        return orca_fast.OrcaFusedStepper(scheduler, cost, recorder)  # type: ignore[arg-type]  # applies() checked the kind
    if fused and mode == "fast" and paged_fast.applies(scheduler):
        return paged_fast.PagedFusedStepper(scheduler, cost, recorder)  # type: ignore[arg-type]  # applies() checked the kind
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
        # Fast mode on the plain Orca and paged schedulers runs a fused loop
        # (orcasim.orca_fast, orcasim.paged_fast), which equals the generic one bit for bit;
        # `fused=False` keeps the generic one.
        self.fused = fused and mode == "fast" and fused_applies(scheduler)

    def stepper(self) -> Stepper:
        return stepper_for(self.scheduler, self.cost, self.recorder, self.mode, self.fused)

    def run(self) -> EngineRun:
        stepper = self.stepper()
        replica = Replica(stepper, self.arrivals, self.recorder, self.row_breaks_s)
        end_s = drive([replica], self.arrivals, single(replica))
        stepper.close()
        return finished_run(self.recorder, end_s, [self.scheduler])
