"""Pipeline parallelism as Orca runs it: several batches in flight through the stages.

Orca's scheduler (Yu et al., OSDI'22, section 4.4 and Algorithm 1) keeps up to
`n_workers` = `pipeline_parallel` batches in flight. Selecting the next batch skips every
request that is already in flight, so while stage k runs batch i, stage k-1 can run batch
i+1 made of other requests. The request-level baseline (FasterTransformer) is modelled
running one batch at a time through all stages, which the ordinary `Engine` already does
when the cost model's iteration time spans every stage. (FasterTransformer itself splits a
batch into micro-batches under pipeline parallelism, `getLocalBatchSize`; not modelled: its
pipelined prefills would overlap their stages, and its weight-bound decodes gain only if
steps overlap too.)

Timing: a cost model's `iteration_time_s` is the time of one iteration through all stages
(compute of every layer plus the stage-to-stage sends). Each stage is busy for its layers'
share of it (`catalog.stage_layers`, `CostModel.stage_times_s`; iteration_time_s /
pipeline_parallel where they divide evenly or no model is given; the embedding on the first
stage, the LM head on the last and each boundary's send on the stage that sends, where the
cost model knows them, `CostModel.stage_ends`; an engine overhead's launch floor is each
stage's own), and batches flow through the stages in order (a flow shop): stage k starts a
batch when the batch has left stage k-1 and stage k has finished the previous batch. An
engine overhead's host work (`CostModel.pipeline_host_s`) comes first, on one host that
prepares one batch after another while the stages run others, as vLLM's engine loop does
(`OverheadCost.pipeline_host_s`). An iteration row is the batch's time on the first stage,
which takes one batch at a time, so rows never overlap (the busiest stage's time, from the
first stage's start, overlapped the next row while the pipeline filled: a tester's find).
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orcasim.closed_loop import arrival_source
from orcasim.cost.base import Batch, CostModel
from orcasim.cost.catalog import attention_groups, stage_layers
from orcasim.engine import EngineRun, finished_run
from orcasim.recorder import Recorder
from orcasim.replica import Load, Replica, drive, scheduler_load, single
from orcasim.requests import Requests
from orcasim.scenario import Scenario, SystemConfig
from orcasim.schedulers.base import STEP_BY_STEP, SchedulerOutput, StepResult
from orcasim.schedulers.iteration_level import IterationLevelConfig, IterationLevelScheduler
from orcasim.schedulers.paged import PagedMemoryConfig
from orcasim.sources import ArrivalSource


class PipelinedIterationLevelScheduler(IterationLevelScheduler):
    """Orca's Algorithm 1 with n_workers > 1: a request in flight is never selected again.

    Each batch holds up to `max_batch_size` requests, chosen FCFS among the admitted
    requests not in flight, then topped up from the queue (KV reservation permitting).
    """

    # PipelineEngine steps every iteration and never calls the hooks; nor may another engine.
    fast_forward = STEP_BY_STEP

    def __init__(self, cfg: IterationLevelConfig, requests: Requests, kv_capacity_tokens: int,
                 kv_groups: int = 1):
        super().__init__(cfg, requests, kv_capacity_tokens, kv_groups)
        self.in_flight = np.zeros(len(requests), dtype=bool)
        # The KV holding tokens: every admitted request's prompt and generated tokens, in
        # flight or not (a batch holds only a share of them, unlike an unpipelined Orca's).
        # Kept as a running sum: summing the running set each step cost 15-20% of a run.
        self.kv_held_tokens = 0

    def schedule(self, now_s: float) -> SchedulerOutput:
        chosen = [r for r in self.running if not self.in_flight[r]][: self.max_batch_size]
        while len(chosen) < self.max_batch_size:
            head = self.admit_head()
            if head is None:
                break
            chosen.append(head)
            self.kv_held_tokens += int(self.requests.prompt_tokens[head] + self.generated[head])
        ids = np.array(chosen, dtype=np.int64)
        known = self.requests.prompt_tokens[ids] + self.generated[ids]
        new_tokens = known - self.computed[ids]
        self.in_flight[ids] = True
        assert self.reserved_tokens <= self.kv_capacity_tokens
        return SchedulerOutput(ids, new_tokens, Batch(new_tokens, known), self.reserved_tokens,
                               kv_used_tokens=self.kv_held_tokens)

    def update_from_output(self, out: SchedulerOutput) -> StepResult:
        self.in_flight[out.req_ids] = False
        result = super().update_from_output(out)
        done = result.finished_ids
        freed = (self.requests.prompt_tokens[done] + self.generated[done]).sum() if len(done) else 0
        self.kv_held_tokens += len(out.req_ids) - int(freed)  # a token each; the finished go
        return result


@dataclass(frozen=True, slots=True)
class _Flight:
    plan: SchedulerOutput
    start_s: float  # when stage 1 starts it
    end_s: float  # when the last stage finishes it
    stage_s: float  # its time on the first stage


class PipelineStepper:
    """The pipelined engine variant: up to `num_stages` batches in flight, one unit each.

    The pending unit is the oldest batch in flight; a request arriving while a stage is
    free is planned at once (`plans_on_arrival`), as Orca fills its pipeline.
    """

    plans_on_arrival = True

    def __init__(self, scheduler: PipelinedIterationLevelScheduler, cost: CostModel,
                 recorder: Recorder, num_stages: int,
                 layers: Sequence[int] | None = None) -> None:
        self.scheduler, self.cost, self.recorder = scheduler, cost, recorder
        self.num_stages = num_stages
        # Each stage's layers where the model is known; an uneven split makes the busiest
        # stage the pipeline's bottleneck (40 layers on 3 stages: 14 of 40, not a third),
        # as do the ends (the LM head on the last stage).
        # Without a model, equal shares.
        self.layers = tuple(layers) if layers is not None else (1,) * num_stages
        self.replica: Replica  # set by the replica that runs it
        self.wake_s: float | None = None
        self.stage_free_s = np.zeros(num_stages)  # when each stage finishes its last batch
        self.host_free_s = 0.0  # when the engine's host has prepared the last batch
        self.in_flight: deque[_Flight] = deque()

    def start(self, now_s: float) -> float | None:
        while len(self.in_flight) < self.num_stages:
            plan = self.scheduler.schedule(now_s)
            if plan.is_empty:
                break
            self.in_flight.append(self._launch(plan, now_s))
        return self.in_flight[0].end_s if self.in_flight else None

    def ends_s(self) -> Sequence[float]:
        return (self.in_flight[0].end_s,) if self.in_flight else ()

    def cut(self, num_iterations: int) -> None:
        assert num_iterations == 1, "a flight is one iteration"

    def finish(self) -> None:
        flight = self.in_flight.popleft()
        result = self.scheduler.update_from_output(flight.plan)
        # The row is the batch's time on the first stage, not its flight through all of them:
        # flights overlap, and rows that overlapped would count a stage's time num_stages
        # times over in the busy fraction, time-weighted means and timelines.
        self.recorder.record_iteration(flight.start_s, flight.stage_s, 1, flight.plan,
                                       self.scheduler.num_queued)
        self.recorder.record_progress(flight.plan.req_ids, flight.start_s, result, flight.end_s)
        self.replica.source.on_finished(result.finished_ids, flight.end_s)

    def load(self) -> Load:
        return scheduler_load(self.scheduler)

    def close(self) -> None:
        """Progress is always up to date."""

    def _launch(self, plan: SchedulerOutput, now_s: float) -> _Flight:
        times_s = self.cost.stage_times_s(plan.batch, self.layers)
        # The engine's host schedules and prepares the batch first, after the batch it
        # planned before (`CostModel.pipeline_host_s`: one host for every batch in flight).
        # Without host work the host is never behind: t = now_s, the same bits as before.
        t = max(now_s, self.host_free_s) + self.cost.pipeline_host_s(plan.batch)
        self.host_free_s = t
        start_s = t
        for k, stage_s in enumerate(times_s):
            begin = max(t, float(self.stage_free_s[k]))
            if k == 0:
                start_s = begin
            t = begin + stage_s
            self.stage_free_s[k] = t
        return _Flight(plan, start_s, t, times_s[0])


class PipelineEngine:
    """A one-replica loop over the pipelined stepper (see `orcasim.engine.Engine`)."""

    def __init__(
        self, requests: Requests, scheduler: PipelinedIterationLevelScheduler, cost: CostModel,
        num_stages: int, arrivals: ArrivalSource | None = None,
        layers: Sequence[int] | None = None,
    ) -> None:
        self.requests, self.scheduler, self.cost = requests, scheduler, cost
        self.num_stages, self.layers = num_stages, layers
        self.recorder = Recorder(len(requests))
        assert arrivals is not None or not requests.closed_loop, "a closed loop needs its source"
        self.arrivals = ArrivalSource(requests.arrival_s) if arrivals is None else arrivals

    def run(self) -> EngineRun:
        stepper = PipelineStepper(self.scheduler, self.cost, self.recorder, self.num_stages,
                                  self.layers)
        replica = Replica(stepper, self.arrivals, self.recorder)
        end_s = drive([replica], self.arrivals, single(replica))
        return finished_run(self.recorder, end_s, [self.scheduler])


def warn_unpipelined(scheduler: object, stages: int, hardware_first: bool = False) -> None:
    """Only Orca's scheduler keeps several batches in flight; say so for vLLM's and
    Sarathi's (a request-level batch, FasterTransformer's, is one at a time by design).
    The warning opens with the key whose owner it names (`config.naming_under`): the
    scheduler's, or with `hardware_first` the pipeline's, where a replica group gives its
    own hardware (the scenario's `hardware.pipeline_parallel` was named for the group's)."""
    if stages > 1 and isinstance(scheduler, PagedMemoryConfig):
        kind = getattr(scheduler, "kind", type(scheduler).__name__)
        # Opened by the group's hardware key, the scheduler is named by its kind alone: the
        # group's or the system's, an unqualified key would name the wrong one (a reviewer's
        # finding).
        opening = (f"hardware.pipeline_parallel = {stages} with a {kind!r} scheduler"
                   if hardware_first else
                   f"scheduler.kind = {kind!r} with hardware.pipeline_parallel = {stages}")
        warnings.warn(f"{opening}: one batch at a time passes through all stages (only "
                      "iteration_level keeps several in flight, as Orca does)",
                      UserWarning, stacklevel=3)


def pipeline_engine(
    scenario: Scenario, system: SystemConfig, requests: Requests, cost: CostModel
) -> PipelineEngine | None:
    """The multi-batch engine for an iteration-level system with pipeline_parallel > 1, else None."""
    stages = scenario.hardware.pipeline_parallel if scenario.hardware else 1
    warn_unpipelined(system.scheduler, stages)
    if stages == 1 or not isinstance(system.scheduler, IterationLevelConfig):
        return None
    assert scenario.kv_capacity_tokens is not None
    # A request's KV lives in one data-parallel attention group (as `run.scheduler_for`
    # and a fleet's replicas build theirs): without the groups, a request longer than one
    # group's share was admitted here and turned away behind a one-replica cluster.
    scheduler = PipelinedIterationLevelScheduler(system.scheduler, requests, scenario.kv_capacity_tokens,
                                                 attention_groups(scenario.hardware))
    deployment = scenario.deployment()
    layers = None if deployment is None else stage_layers(deployment.model, stages)
    return PipelineEngine(requests, scheduler, cost, stages, arrival_source(requests), layers)
