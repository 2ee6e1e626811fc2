"""Assembling replicas: a scheduler and an engine variant per replica, a fleet per cluster.

`replica_for` is the one place that decides which `Stepper` runs a scheduler (pipelined
for Orca with pipeline_parallel > 1, fused for plain Orca in fast mode, generic
otherwise); `build_fleet` makes one per replica of a system's `cluster:` section and
runs them behind its router on one clock loop (`orcasim.replica.drive`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orcasim.closed_loop import arrival_source
from orcasim.cluster import LinkConfig, ReplicaGroup, RoutedRouter, build_router
from orcasim.config import ScenarioError, naming_under
from orcasim.cost import (
    CostConfig,
    CostModel,
    Deployment,
    build_cost_model,
    engine_overhead,
    request_latency_s,
)
from orcasim.cost.catalog import (
    NOT_SHAPE,
    HardwareConfig,
    ModelRef,
    ModelSpec,
    attention_groups,
    known_names,
    model_spec,
    stage_layers,
)
from orcasim.engine import EngineMode, EngineRun, finished_run, stepper_for
from orcasim.paths import DATA_PATH
from orcasim.pipeline import PipelinedIterationLevelScheduler, PipelineStepper, warn_unpipelined
from orcasim.recorder import Recorder
from orcasim.replica import Replica, Stepper, drive, share_a_router, shared_recorder, single
from orcasim.requests import Requests
from orcasim.scenario import Scenario, SystemConfig
from orcasim.schedulers import SchedulerConfig, build_scheduler
from orcasim.schedulers.base import Scheduler
from orcasim.schedulers.iteration_level import IterationLevelConfig
from orcasim.sources import ArrivalSource, RoutedSource


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything one replica is made of, resolved from the scenario, system and group."""

    scheduler: SchedulerConfig
    cost: CostConfig
    kv_capacity_tokens: int
    model: ModelRef | None
    hardware: HardwareConfig | None
    own_hardware: bool = False  # a replica group's own, not the scenario's (warnings name it)
    kv_capacity_derived: bool = False  # from its model and hardware, not given in the file

    @property
    def kv_groups(self) -> int:
        """The data-parallel attention groups its KV pool is split over."""
        return attention_groups(self.hardware)

    def deployment(self) -> Deployment | None:
        if self.model is None or self.hardware is None:
            return None
        return Deployment(model=self.model, hardware=self.hardware)


def describe(specs: Sequence[ReplicaSpec]) -> pd.DataFrame:
    """What each replica runs, one row each in order, for the front of replicas.csv: a mixed
    fleet's rows said only 'replica i', to be mapped by counting its groups (a tester's
    finding). The model, GPU, and the TP, PP, data-parallel attention and expert-parallel
    degrees (blank and 1s where a plain cost model names no model or hardware: a mixture-of-
    experts replica on 2 x 2 GPUs with data-parallel attention read as TP 2 alone, like one on
    2), the scheduler (its kind, and its policy and prefix caching where they apply), the cost
    (`cost_label`) and the KV capacity in tokens (of all its attention groups), and whether
    that was derived from its model and hardware. The model is named as `model_label` names
    it."""
    def scheduler(cfg: SchedulerConfig) -> str:
        notes = [getattr(cfg, "policy", None),
                 "prefix caching" if getattr(cfg, "enable_prefix_caching", False) else None]
        given = [note for note in notes if note]
        return f"{cfg.kind} ({', '.join(given)})" if given else cfg.kind

    def degree(key: str) -> list[int]:
        return [1 if s.hardware is None else int(getattr(s.hardware, key)) for s in specs]

    # Labelled once per group's model: a fleet's replicas share their group's.
    models = {id(s.model): model_label(s.model) for s in specs if s.model is not None}
    return pd.DataFrame({
        "model": [models[id(s.model)] if s.model is not None else "" for s in specs],
        "gpu": [s.hardware.gpu.name if s.hardware is not None else "" for s in specs],
        **{key: degree(key) for key in ("tensor_parallel", "pipeline_parallel",
                                        "data_parallel_attention", "expert_parallel")},
        "scheduler": [scheduler(s.scheduler) for s in specs],
        "cost": [cost_label(s.cost) for s in specs],
        "kv_capacity_tokens": [s.kv_capacity_tokens for s in specs],
        "kv_capacity_derived": [s.kv_capacity_derived for s in specs],
    })


def cost_label(cfg: CostConfig) -> str:
    """The cost's kind and, in brackets, the settings given that are not the kind's defaults
    (an overhead block as `overhead`, its terms as `overhead.<term>`; a data file by its
    name): groups that differ only in their cost block read alike by kind alone."""
    values = cfg.model_dump(exclude_defaults=True)
    values["overhead"] = values.pop("overhead", None)  # after the kind's own settings
    given = _settings({k: v for k, v in values.items() if v is not None}, _data_fields(cfg))
    return f"{cfg.kind} ({', '.join(given)})" if given else cfg.kind


def model_label(model: ModelSpec) -> str:
    """The model's name and, in brackets, what differs from the catalog's entry of that name
    (`{catalog: llama2-7b, kv_cache_dtype: fp8}` read as llama2-7b), or an unnamed inline
    model's settings that are not the defaults (every one read 'custom'). A model the user
    named outside the catalog is its name."""
    if model.name in known_names("models"):
        changed = _changed(model.model_dump(), model_spec(model.name).model_dump())
    elif model.name == ModelSpec.model_fields["name"].default:
        changed = model.model_dump(exclude_defaults=True)
    else:
        return model.name
    given = _settings({k: v for k, v in changed.items() if k not in NOT_SHAPE}, set())
    return f"{model.name} ({', '.join(given)})" if given else model.name


def _changed(now: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The settings of `now` that differ from `base`'s (within a nested block, its own)."""
    return {key: _changed(value, base[key])
            if isinstance(value, dict) and isinstance(base.get(key), dict) else value
            for key, value in now.items() if base.get(key) != value}


def _data_fields(cfg: CostConfig) -> set[str]:
    """The cost config's fields that name a data file (shown by their file name: the stored
    path is resolved, and would tie a results table to the machine that wrote it)."""
    return {name for name, field in type(cfg).model_fields.items() if DATA_PATH in field.metadata}


def _settings(values: dict[str, Any], files: set[str], prefix: str = "") -> list[str]:
    """`key=value` for each setting in `values` (a model_dump), nested blocks as
    `block.key=value` or, given with only defaults, `block`; a block's `kind` is left out."""
    out: list[str] = []
    for key, value in values.items():
        if key == "kind":
            continue
        if isinstance(value, dict):
            out += _settings(value, set(), f"{prefix}{key}.") or [f"{prefix}{key}"]
        elif key in files and isinstance(value, str):
            out.append(f"{prefix}{key}={Path(value).name}")
        else:
            out.append(f"{prefix}{key}={value}")
    return out


def replica_for(
    spec: ReplicaSpec, requests: Requests, cost: CostModel, source: ArrivalSource,
    recorder: Recorder, mode: EngineMode, row_breaks_s: tuple[float, ...] = (), index: int = 0,
    fused: bool = True, pool: SchedulersByKind | None = None,
) -> Replica:
    """One replica of `spec` over `requests`, reporting to `source`. `fused=False` keeps
    the generic stepper for plain Orca (a decode instance's requests arrive prefilled,
    which the fused loop does not model). Replicas built with one `pool` (a pool's, over the
    same `requests`) share their schedulers' per-request state by kind
    (`Scheduler.share_per_request_state`)."""
    deployment = spec.deployment()
    stages = spec.hardware.pipeline_parallel if spec.hardware else 1
    warn_unpipelined(spec.scheduler, stages, hardware_first=spec.own_hardware)
    stepper: Stepper
    if stages > 1 and isinstance(spec.scheduler, IterationLevelConfig):
        pipelined = PipelinedIterationLevelScheduler(spec.scheduler, requests, spec.kv_capacity_tokens,
                                                     spec.kv_groups)
        _join_pool(pipelined, pool)
        layers = None if deployment is None else stage_layers(deployment.model, stages)
        stepper = PipelineStepper(pipelined, cost, recorder, stages, layers)
        return Replica(stepper, source, recorder, (), index)  # rows are per iteration already
    kv_bytes = None if deployment is None else deployment.kv_bytes_per_token_per_gpu
    scheduler = build_scheduler(spec.scheduler, requests, spec.kv_capacity_tokens, kv_bytes,
                                spec.kv_groups)
    _join_pool(scheduler, pool)
    stepper = stepper_for(scheduler, cost, recorder, mode, fused)
    return Replica(stepper, source, recorder, row_breaks_s, index)


# A pool's first scheduler of each kind, whose per-request state the others share.
SchedulersByKind = dict[type, Scheduler]


def _join_pool(scheduler: Scheduler, pool: SchedulersByKind | None) -> None:
    if pool is None:
        return
    first = pool.setdefault(type(scheduler), scheduler)
    if first is not scheduler:
        scheduler.share_per_request_state(first)


# Cost models built, by the id of their spec, each kept with its spec: a spec freed once
# its group was built gave its id to a later group's, which got the earlier model.
BuiltCosts = dict[int, tuple[ReplicaSpec, CostModel]]


def cost_models(specs: Sequence[ReplicaSpec], built: BuiltCosts) -> list[CostModel]:
    """Each replica's cost model, built once per spec into `built`: a group's replicas share
    one spec and one (stateless) model. Keyed by the whole spec, not by cost and hardware
    alone: two groups may differ only in their model."""
    for spec in specs:
        if id(spec) not in built:
            built[id(spec)] = (spec, build_cost_model(spec.cost, spec.deployment(), spec.hardware))
    return [built[id(spec)][1] for spec in specs]


def built_models(built: BuiltCosts) -> list[CostModel]:
    """The distinct cost models in `built`, in the order they were built."""
    return [model for _, model in built.values()]


@contextlib.contextmanager
def naming_group(where: str, group: ReplicaGroup) -> Iterator[None]:
    """A refusal while building a group (or a pool) that gives keys of its own names it
    (`where`, e.g. 'cluster.replicas[1]'): 'scheduler.x = ...' as 'cluster.replicas[1].
    scheduler.x = ...' where the group gives its scheduler (so for `cost.`), any other as
    'cluster.replicas[1]: ...' (the system's scheduler meeting the group's capacity, say). A
    group of a count alone runs the system's settings: its refusals name the system's keys."""
    given = [key for key in ("model", "hardware", "kv_capacity_tokens", "scheduler", "cost")
             if getattr(group, key) is not None]
    try:
        # A warning about a key the group gives names the group (its errors, below).
        with naming_under(f"{where}.", tuple(f"{key}." for key in given), errors=False):
            yield
    except ScenarioError as e:
        if not given:
            raise
        text = str(e)
        own = text.startswith(tuple(f"{key}." for key in given))
        raise ScenarioError(f"{where}.{text}" if own else f"{where}: {text}") from None


def replica_specs(scenario: Scenario, system: SystemConfig) -> list[ReplicaSpec]:
    """One spec per replica of `system`'s (colocated) cluster, in order."""
    assert system.cluster is not None
    return [spec for group in system.cluster.groups()
            for spec in pool_specs(scenario, system, group)]


def pool_specs(scenario: Scenario, system: SystemConfig, group: ReplicaGroup) -> list[ReplicaSpec]:
    """`group.count` copies of one spec: the group's keys, else the system's, else the
    scenario's. A group with its own model or hardware derives its own KV capacity."""
    if group.cost is not None:
        check_way_in(group.cost, scenario.system_cost(system))
    kv_tokens, kv_derived = scenario.group_kv_capacity(group)
    spec = ReplicaSpec(group.scheduler or system.scheduler,
                       group.cost or scenario.system_cost(system), kv_tokens,
                       group.model or scenario.model, group.hardware or scenario.hardware,
                       group.hardware is not None, kv_derived)
    return [spec] * group.count


def check_way_in(group_cost: CostConfig, system_cost: CostConfig) -> None:
    """A request reaches the router before any replica: its way in (`request_latency_s`) is
    the system's, and one a group gives itself would be dropped unread. A group that does not
    give it (no overhead, or an overhead without it) takes the system's."""
    overhead = engine_overhead(group_cost)
    given = overhead is not None and "request_latency_s" in overhead.model_fields_set
    own_s, system_s = request_latency_s(group_cost), request_latency_s(system_cost)
    if given and own_s != system_s:
        raise ScenarioError(f"cost.overhead.request_latency_s = {own_s:g}: a request reaches the "
                            f"router before any replica, so its way in is the system's "
                            f"({system_s:g} s); expected it on the system's or the scenario's cost")


@dataclass
class Fleet:
    """A system's replicas, their cost models, its router and where each request went."""

    replicas: list[Replica]
    costs: list[CostModel]  # one per distinct replica kind
    source: ArrivalSource
    router: RoutedRouter
    recorder: Recorder  # the per-request timestamps, shared by every replica
    specs: list[ReplicaSpec]  # what each replica is made of, in order
    groups: list[int]  # the index of each replica's group in `cluster.replicas`

    @property
    def assigned(self) -> np.ndarray:
        return self.router.assigned

    def run(self, apart: bool = True) -> EngineRun:
        """Run every replica to the end. Where the router reads nothing the replicas do
        and the arrivals do not depend on completions (`runs_apart`), the routing is fixed
        before the run, and each replica runs on its own with its arrivals in sight (the
        same timestamps and rows, 1.2 to 1.3 times as fast at 16 paged replicas: its jumps
        stop at its next arrival instead of being cut there); `apart=False` keeps the one
        clock loop."""
        if apart and self.runs_apart():
            end_s = self._run_apart()
        else:
            end_s = drive(self.replicas, self.source, self.router)
        for replica in self.replicas:
            replica.stepper.close()
        assert np.all(self.assigned >= 0), "a request was never routed"
        return finished_run(self.recorder, end_s, [r.scheduler for r in self.replicas])

    def runs_apart(self) -> bool:
        """Whether the replicas never meet: a router that reads none of them, over arrivals
        fixed in advance (an open loop), so no replica's state changes another's."""
        return (len(self.replicas) > 1 and not self.router.router.reads_replicas
                and type(self.source) is ArrivalSource)

    def _run_apart(self) -> float:
        """Route every arrival in arrival order, as the loop would at its time, then run
        each replica alone over its own arrivals (`RoutedSource`); the last event's time."""
        arrival_s = self.source.arrival_s
        own: list[list[int]] = [[] for _ in self.replicas]
        for req_id in self.source.take_until(math.inf):
            own[self.router(req_id, float(arrival_s[req_id])).index].append(req_id)
        end_s = 0.0
        for replica, ids in zip(self.replicas, own, strict=True):
            replica.source, replica.sole = RoutedSource(arrival_s, ids), True
            end_s = max(end_s, drive([replica], replica.source, single(replica)))
        return end_s

    def iterations_frame(self) -> pd.DataFrame:
        frames = []
        for replica in self.replicas:
            frame = replica.recorder.iterations_frame()
            frame["replica"] = replica.index
            frames.append(frame)
        return pd.concat(frames, ignore_index=True)


def build_fleet(scenario: Scenario, system: SystemConfig, requests: Requests,
                share_state: bool = True) -> Fleet:
    """`system`'s cluster over `requests` (a run's own table, as they reach the engines).
    `share_state=False` gives each replica's scheduler its own per-request arrays (the same
    results, in 16 times the memory for 16 replicas: tests read each replica's alone)."""
    assert system.cluster is not None
    if system.cluster.link != LinkConfig():  # read only between a prefill and a decode pool
        warnings.warn(f"system {system.name}: cluster.link is not used: a colocated cluster "
                      "moves no KV between instances (a disaggregated one, with prefill and "
                      "decode pools, does)", UserWarning, stacklevel=2)
    source = arrival_source(requests)
    recorder = Recorder(len(requests))
    replicas: list[Replica] = []
    built: BuiltCosts = {}
    all_specs: list[ReplicaSpec] = []
    groups: list[int] = []
    pool: SchedulersByKind | None = {} if share_state else None
    for g, group in enumerate(system.cluster.groups()):
        with naming_group(f"cluster.replicas[{g}]", group):
            specs = pool_specs(scenario, system, group)
            for spec, cost in zip(specs, cost_models(specs, built), strict=True):
                replicas.append(replica_for(spec, requests, cost, source,
                                            shared_recorder(requests, recorder),
                                            scenario.engine.mode, (scenario.warmup_s,),
                                            len(replicas), pool=pool))
        all_specs += specs
        groups += [g] * len(specs)
    share_a_router(replicas)
    router_seed = np.random.SeedSequence(scenario.seed).spawn(3)[2]
    router = build_router(system.cluster.colocated_router, replicas, np.random.default_rng(router_seed),
                          requests.session_ids, f"system {system.name}: cluster.router")
    assigned = np.full(len(requests), -1, dtype=np.int64)
    return Fleet(replicas, built_models(built), source, RoutedRouter(router, assigned), recorder,
                 all_specs, groups)


def system_hardware(scenario: Scenario, system: SystemConfig) -> list[HardwareConfig | None]:
    """The hardware of each replica (or prefill and decode instance) that `system` runs on;
    None where a replica names none (a plain cost model: one GPU of unknown kind)."""
    cluster = system.cluster
    if cluster is None:
        return [scenario.hardware]
    if cluster.prefill is not None and cluster.decode is not None:
        specs = pool_specs(scenario, system, cluster.prefill) + pool_specs(scenario, system, cluster.decode)
    else:
        specs = replica_specs(scenario, system)
    return [spec.hardware for spec in specs]
