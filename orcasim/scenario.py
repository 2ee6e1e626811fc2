"""The scenario file: YAML in, a frozen and validated `Scenario` out.

Loading errors are `ScenarioError`s with one line that names the key, the value and
what was expected. `--set a.b[1].c=value` overrides use the same dotted paths.
"""

from __future__ import annotations

import copy
import math
import re
import warnings
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import (
    BaseModel,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from orcasim import yaml_strict
from orcasim.cluster import ClusterConfig, ReplicaGroup
from orcasim.config import (
    ScenarioError,
    Strict,
    errors_under,
    first_repeat,
    format_validation_error,
    kind_form,
)
from orcasim.cost import CostConfig, Deployment
from orcasim.cost.catalog import (
    CATALOG_KEY,
    HardwareConfig,
    ModelRef,
    ModelSpec,
    attention_groups,
    check_deployment,
)
from orcasim.cost.roofline import RooflineCostConfig
from orcasim.paths import DATA_PATH, SCENARIO_DIR, as_path, portable_data_path
from orcasim.schedulers import SchedulerConfig, reserves_max_tokens
from orcasim.schedulers.iteration_level import IterationLevelConfig
from orcasim.slo import SLOConfig
from orcasim.workload import WorkloadConfig

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
# A name is a folder's (results/<scenario>/<system>/): well under a file system's 255 bytes, so
# that a long one is refused here, not after the run when its folder cannot be made.
NAME_MAX_CHARS = 100


# What a results folder holds beside one folder per system: a system may not be named so.
RESERVED_NAMES = ("summary.json", "summary.csv", "scenario.yaml", "plan.json", "sweep.yaml",
                  "sweep.csv", "sweep.parquet", "points", "fidelity.csv", "capacity.csv",
                  "evaluations.csv", "failures.csv", "pareto.csv", "slo.yaml")
# Names that CSV readers (pandas, spreadsheets) take for a missing value: a system so named
# vanished from its own tables when read back (`orcasim plot` of a sweep.csv).
MISSING_VALUE_NAMES = ("na", "nan", "null", "none")


class SystemConfig(Strict):
    """One serving system to compare. `cost` overrides the scenario's cost model;
    `cluster` makes it a fleet of replicas behind a router (`orcasim.cluster`)."""

    name: str = Field(pattern=NAME_PATTERN, max_length=NAME_MAX_CHARS)
    scheduler: SchedulerConfig
    cost: CostConfig | None = None
    cluster: ClusterConfig | None = None

    @model_validator(mode="after")
    def _not_a_result_file(self) -> Self:
        if self.name in RESERVED_NAMES or self.name.endswith((".png", ".svg")):
            raise ScenarioError(f"name = {self.name!r} is a file of the results folder; expected "
                             "another name")
        if self.name.lower() in MISSING_VALUE_NAMES:
            raise ScenarioError(f"name = {self.name!r} reads as a missing value in CSV tables "
                                "(pandas, spreadsheets), where the system would vanish; "
                                "expected another name")
        return self


class EngineConfig(Strict):
    """`fast` jumps over pure-decode runs; `reference` steps every iteration (the spec)."""

    mode: Literal["fast", "reference"] = "fast"


class SweepConfig(Strict):
    """Run the scenario once per value of one dotted parameter (see `orcasim.sweeps.scenario_sweep`)."""

    parameter: str
    values: list[Any] = Field(min_length=1)

    @model_validator(mode="after")
    def _scalar_values(self) -> Self:
        # Each point is one value in one column of the sweep table (orcasim.sweeps).
        for i, value in enumerate(self.values):
            if not isinstance(value, int | float | str | bool):
                raise ScenarioError(f"values[{i}] = {value!r}: expected a number, string or boolean")
            if isinstance(value, float) and not math.isfinite(value):  # a sweep file's grid
                # refused it naming its own keys (grid.parameters...), not this block's
                raise ScenarioError(f"values[{i}] = {value}: expected a finite number")
        column = column_problem(self.values)
        if column is not None:  # as a sweep file's grid refuses it, in this block's own keys
            at, why = column
            raise ScenarioError(f"values{'' if at is None else f'[{at}]'} = "
                                f"{self.values if at is None else self.values[at]!r}: {why}")
        if not _WHOLE_PATH.match(self.parameter):
            raise ScenarioError(f"parameter = {self.parameter!r}: a malformed path; {MALFORMED_PATH}")
        twice = first_repeat(self.values)
        if twice is not None:  # as a sweep file's grid, in this block's own keys
            raise ScenarioError(f"values[{twice}] = {self.values[twice]!r} repeats values"
                                f"[{self.values.index(self.values[twice])}]: a point listed "
                                "twice runs twice on the same seed; expected distinct values")
        if self.parameter == "sweep" or self.parameter.startswith(("sweep.", "sweep[")):
            raise ScenarioError(f"parameter = {self.parameter!r}: a sweep cannot sweep its own "
                                "block; expected a key of the scenario")
        if parse_dotted(self.parameter)[0] == "seed":  # in the block's own keys: it has no
            # grid or replications, which the sweep built from it would name
            raise ScenarioError(f"parameter = {self.parameter!r}: a scenario's sweep runs every "
                                "point on its seed; expected another key (independent seeds "
                                "are a sweep file's `replications`)")
        return self


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # an integer column of the sweep table


def value_kind(value: Any) -> str:
    """A swept value's type as its sweep table column holds it: integers and floats are numbers."""
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, int | float) else "text"


def column_problem(values: list[Any]) -> tuple[int | None, str] | None:
    """Why `values` cannot be one column of the sweep table (a Parquet column holds one
    type, an integer column 64 bits), as (the index of the value at fault, or None for the
    whole list; what is wrong); None where they can."""
    kinds = sorted({value_kind(v) for v in values})
    if len(kinds) > 1:
        return None, f"mixes {' and '.join(kinds)} values; expected values of one type"
    huge = next((i for i, v in enumerate(values) if value_kind(v) == "number"
                 and isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX), None)
    if huge is not None:  # Parquet's OverflowError, after every point had run
        return huge, (f"beyond a 64-bit integer, which the sweep table's column holds; "
                      f"expected at most {INT64_MAX} in size, or a float ({float(values[huge]):g})")
    return None


HARDWARE_COST_KINDS = ("roofline", "profile")


# Hardware keys that set only the KV capacity, which a group may change under the
# scenario's prices: a lower memory share on the same GPUs is no other deployment.
_KV_ONLY_HARDWARE = {"gpu_memory_utilization", "activation_reserve_gib"}


def _priced_alike(own: object, inherited: object) -> bool:
    """Whether a group's own model or hardware is what the inherited cost was written for,
    but for keys that set only the KV capacity."""
    if own == inherited:
        return True
    return isinstance(own, HardwareConfig) and isinstance(inherited, HardwareConfig) and \
        own.model_dump(exclude=_KV_ONLY_HARDWARE) == inherited.model_dump(exclude=_KV_ONLY_HARDWARE)


class Scenario(Strict):
    """A validated, frozen scenario: the workload, the cost model, the KV capacity and the
    systems to run on the same requests. Built by `load_scenario` (a YAML file, with
    overrides) or `scenario_from_dict` (a mapping of the same keys), which refuse a bad key
    with a `ScenarioError` naming it; run by `orcasim.run_scenario`, which leaves it as it is.
    To change a key, pass an override (`run_scenario(scenario, "seed=2")`) or build a new one
    from `given_data()`: its fields cannot be assigned."""

    name: str = Field(pattern=NAME_PATTERN, max_length=NAME_MAX_CHARS)
    seed: NonNegativeInt = 0  # numpy's SeedSequence takes non-negative integers
    workload: WorkloadConfig
    cost: CostConfig
    model: ModelRef | None = None
    hardware: HardwareConfig | None = None
    # Derived from model and hardware when omitted; never None after validation.
    kv_capacity_tokens: PositiveInt | None = None
    systems: list[SystemConfig] = Field(min_length=1)
    warmup_s: NonNegativeFloat = 0.0
    engine: EngineConfig = EngineConfig()
    sweep: SweepConfig | None = None
    slo: SLOConfig | None = None
    _kv_capacity_derived: bool = PrivateAttr(default=False)
    # The folder of the file it was loaded from: its relative data paths start there.
    _source_dir: Path | None = PrivateAttr(default=None)

    @property
    def source_dir(self) -> Path | None:
        return self._source_dir

    @property
    def kv_capacity_derived(self) -> bool:
        """True when kv_capacity_tokens came from model and hardware, not from the file."""
        return self._kv_capacity_derived

    def given_data(self, exclude: frozenset[str] = frozenset(), **dump: Any) -> dict[str, Any]:
        """The scenario as plain data (JSON types, no None), a derived KV capacity left out:
        whatever is built from this data derives its own, from its own model and hardware.
        Kept in, a saved scenario rerun with another GPU (or a sweep's point, or a capacity
        search's) ran with the first one's capacity (a tester's finding)."""
        derived = {"kv_capacity_tokens"} if self.kv_capacity_derived else set()
        return self.model_dump(mode="json", exclude_none=True, exclude={*exclude, *derived}, **dump)

    def deployment(self) -> Deployment | None:
        if self.model is None or self.hardware is None:
            return None
        return Deployment(model=self.model, hardware=self.hardware)

    def _derive_kv_capacity(self) -> None:
        for key, cost, model, hardware in self._cost_places():
            if cost.kind in HARDWARE_COST_KINDS and (model is None or hardware is None):
                missing = " and ".join(f"'{k}'" for k, v in (("model", model), ("hardware", hardware))
                                       if v is None)
                raise ScenarioError(f"{key}.kind = '{cost.kind}' needs the keys 'model' and "
                                    f"'hardware': {missing} not given")
        deployment = self.deployment()
        if self.kv_capacity_tokens is None:
            if deployment is None:
                raise ScenarioError("kv_capacity_tokens is required unless 'model' and 'hardware' are given")
            self.__dict__["kv_capacity_tokens"] = deployment.kv_capacity_tokens  # frozen: set once, here
            self._kv_capacity_derived = True
        elif deployment is not None:
            _warn_if_beyond_memory(self.kv_capacity_tokens, deployment)
        for key, group, model, hardware in self._group_deployments():  # a group's own tokens
            if group.kv_capacity_tokens is not None and model is not None and hardware is not None:
                _warn_if_beyond_memory(group.kv_capacity_tokens,
                                       Deployment(model=model, hardware=hardware),
                                       f"{key}.kv_capacity_tokens")
        self._warn_memory_share_unused()

    def _warn_memory_share_unused(self) -> None:
        """A hardware's memory share (`_KV_ONLY_HARDWARE`) derives a KV capacity and does
        nothing else: beside a capacity given, or without a model, it is not read (a sweep of
        gpu_memory_utilization over a scenario that gave kv_capacity_tokens ran identical
        points; a tester's finding). Said where it differs from the default, which a saved
        scenario's dump writes out."""
        groups = self._group_deployments()
        # A group of its own model on the scenario's hardware derives from the scenario's.
        read_by_group = any(g.kv_capacity_tokens is None and g.hardware is None and g.model
                            is not None for _, g, _, _ in groups)
        places = [("", self.hardware, self.model, None if self.kv_capacity_derived or read_by_group
                   else self.kv_capacity_tokens)]
        places += [(f"{key}.", group.hardware, model, group.kv_capacity_tokens)
                   for key, group, model, _ in groups if group.hardware is not None]
        for where, hardware, model, given_tokens in places:
            if hardware is None or (model is not None and given_tokens is None):
                continue  # its capacity is derived from it
            why, expected = (
                (f"and {where}kv_capacity_tokens = {given_tokens} is given", "one of the two (without "
                 "kv_capacity_tokens the capacity is derived from it)") if model is not None
                else ("which needs a model", "a model, or the key left out"))
            for name in sorted(_KV_ONLY_HARDWARE):
                value = getattr(hardware, name)
                if value != HardwareConfig.model_fields[name].default:
                    warnings.warn(f"{where}hardware.{name} = {value:g} is not used: it only derives "
                                  f"a KV capacity, {why}; expected {expected}",
                                  UserWarning, stacklevel=2)

    def _cost_places(self) -> list[tuple[str, CostConfig, ModelSpec | None, HardwareConfig | None]]:
        """Every cost block with its key and the deployment it prices: the scenario's, a
        system's, and a fleet's group's or a pool's (with that group's model and hardware;
        a group's roofline without a model anywhere validated, and failed at run time)."""
        places = [("cost", self.cost, self.model, self.hardware)]
        places += [(f"systems[{j}].cost", system.cost, self.model, self.hardware)
                   for j, system in enumerate(self.systems) if system.cost is not None]
        places += [(f"{key}.cost", group.cost, model, hardware)
                   for key, group, model, hardware in self._group_deployments()
                   if group.cost is not None]
        return places

    def _group_deployments(self) -> list[tuple[str, ReplicaGroup, ModelSpec | None, HardwareConfig | None]]:
        """Each fleet group and pool the file gives, with its key (`systems[j].cluster.<key>`)
        and the model and hardware it runs: its own, else the scenario's."""
        return [(f"systems[{j}].cluster.{key}", group, group.model or self.model,
                 group.hardware or self.hardware)
                for j, system in enumerate(self.systems) if system.cluster is not None
                for key, group in system.cluster.given_groups()]

    def _check_deployments(self) -> None:
        """The model fits its parallelism and its context holds every request (catalog limits)."""
        if self.model is not None:
            check_deployment(self.model, self.hardware, self.workload.max_tokens)
        for key, group, model, hardware in self._group_deployments():
            # A group of its own model on the scenario's hardware names the hardware's keys
            # as the file gives them, under the group: 'replicas[0].hardware.pipeline_parallel'
            # named a key the file did not have.
            if model is not None:
                check_deployment(model, hardware, self.workload.max_tokens,
                                 f"{key}." if group.model is not None else "",
                                 _group_naming(key, group.hardware is not None))

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        self._check_deployments()
        self._derive_kv_capacity()
        assert self.kv_capacity_tokens is not None
        # Compared case-blind: each name is a folder, and on macOS or Windows 'orca' and
        # 'ORCA' are one, where the second system's frames overwrote the first's.
        names = [s.name.casefold() for s in self.systems]
        again = next((i for i, n in enumerate(names) if n in names[:i]), None)
        if again is not None:
            first = names.index(names[again])
            raise ScenarioError(f"systems[{again}].name = {self.systems[again].name!r}: expected a "
                                f"name no other system has, in any case (systems[{first}] has "
                                f"{self.systems[first].name!r}; each is a results folder)")
        self._check_pool_models()  # before a pool's KV: another model there is the problem
        self._check_reservations()
        self._check_distserve_placement()
        self._check_pool_schedulers()
        self._check_routing_skew()
        self._warn_deployment_unpriced()
        self._check_sweep_points()
        return self

    def _check_sweep_points(self) -> None:
        """Every point of the scenario's own `sweep:` block validates, as `orcasim run` and
        `orcasim validate` build them before any runs: the loader accepted a block with a
        value the points refuse (a rate of -2), which `run_scenario` then ran at its base
        values, and `run_scenario_sweep` refused only later. A point's warnings are said as
        it runs, not here (the base's own are said once, above)."""
        if self.sweep is None or not _CHECK_OWN_SWEEP.get():
            return
        base, given = sweep_base_data(self)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, value in enumerate(self.sweep.values):
                sweep_point(base, given, {self.sweep.parameter: value}, self.seed,
                            f"sweep.values[{i}] = {value!r}")

    def _priced_models(self) -> list[tuple[str, CostConfig, list[ModelSpec | None]]]:
        """Each cost block with its key and the models whose iterations it prices: a
        system's or a group's own, else the ones it inherits from (scenario, system)."""
        priced: dict[int, list[ModelSpec | None]] = {id(self.cost): []}
        for system in self.systems:
            system_cost = self.system_cost(system)
            groups = system.cluster.given_groups() if system.cluster is not None else []
            if not groups or (system.cluster is not None and
                              isinstance(system.cluster.replicas, int)):
                priced.setdefault(id(system_cost), []).append(self.model)
            for _, group in groups:
                priced.setdefault(id(group.cost or system_cost), []).append(
                    group.model or self.model)
        return [(key, cost, priced.get(id(cost), []))
                for key, cost, _, _ in self._cost_places()]

    def _check_routing_skew(self) -> None:
        """A roofline's expert_routing_skew skews a router over routed experts: beside dense
        models alone it was accepted and read by nothing (a tester's finding), as
        hardware.expert_parallel on a dense model is refused."""
        for key, cost, models in self._priced_models():
            roofline, where = ((cost, key) if isinstance(cost, RooflineCostConfig) else
                               (getattr(cost, "roofline", None), f"{key}.roofline"))
            if not isinstance(roofline, RooflineCostConfig) or roofline.expert_routing_skew == 0:
                continue
            if models and all(m is not None and m.moe is None for m in models):
                names = ", ".join(dict.fromkeys(m.name for m in models if m is not None))
                raise ScenarioError(
                    f"{where}.expert_routing_skew = {roofline.expert_routing_skew:g} skews a "
                    f"router over routed experts, and {names} "
                    f"{'is' if ',' not in names else 'are'} dense (no routed experts); "
                    "expected 0, or a mixture-of-experts model")

    def _warn_deployment_unpriced(self) -> None:
        """A group or pool that gives its own model or hardware but inherits a linear cost
        runs at that cost's prices, which read neither: a group on 4 H100s under the
        scenario's linear cost (written for one A100) ran as fast as the A100 and took only
        its KV capacity from the H100s, silently (a tester's finding). Said, not refused: the
        inherited prices may stand in on purpose."""
        for j, system in enumerate(self.systems):
            cost = self.system_cost(system)
            if system.cluster is None or cost.kind != "linear":
                continue
            for key, group in system.cluster.given_groups():
                if group.cost is not None:
                    continue  # the group prices its own iterations
                for name, own, inherited in (("model", group.model, self.model),
                                             ("hardware", group.hardware, self.hardware)):
                    if own is None or _priced_alike(own, inherited):
                        continue
                    where = f"systems[{j}].cluster.{key}"
                    owner = "cost" if system.cost is None else f"systems[{j}].cost"
                    # An overhead reads the group's layers and parallel degrees (its launches,
                    # the TP round trip), and Orca's pipeline its stages (batches in flight,
                    # each stage a share of the iteration): the GPU time alone is inherited.
                    reads = ["any KV transfer"]
                    if cost.overhead is not None:
                        reads.append("its overhead's launches and process count")
                    stages = _pipelined_stages(group.scheduler or system.scheduler, own, inherited)
                    if stages is not None:
                        reads.append(f"the {stages} batches Orca keeps in flight on its "
                                     f"pipeline_parallel = {stages}")
                    also = ", ".join(reads[:-1]) + (", and " if len(reads) > 1 else "") + reads[-1]
                    warnings.warn(
                        f"{where}.{name}: its iterations are priced by {owner}.kind = 'linear', "
                        f"which reads no model or hardware, so its own {name} changes only its "
                        f"KV capacity (and {also}), not its GPU time; expected a "
                        f"cost of its own ({where}.cost, e.g. {{kind: roofline}})",
                        UserWarning, stacklevel=2)

    def _check_pool_models(self) -> None:
        """A decode instance continues the KV a prefill instance computed: both pools serve
        one model (the transfer is sized by it)."""
        for j, system in enumerate(self.systems):
            cluster = system.cluster
            if cluster is None or cluster.prefill is None or cluster.decode is None:
                continue
            prefill = cluster.prefill.model or self.model
            decode = cluster.decode.model or self.model
            if prefill is not None and decode is not None and prefill != decode:
                # Name the pool that gives its own model: one given only on the prefill pool
                # was reported as `decode.model`, a key the file never wrote (a tester's note).
                if cluster.decode.model is not None:
                    key, given, expected = "decode", decode, f"the prefill pool's ({prefill.name!r})"
                else:
                    key, given, expected = ("prefill", prefill, f"the decode pool's "
                                            f"({decode.name!r}, the scenario's model)")
                raise ScenarioError(
                    f"systems[{j}].cluster.{key}.model = {given.name!r}: a decode instance "
                    "continues the KV of a prefill instance, so both pools serve one model; "
                    f"expected {expected}")

    def _check_pool_schedulers(self) -> None:
        """A disaggregated pool runs iterations: a request-level scheduler, its own or the
        system's (which a pool without one inherits), cannot hand a prompt over."""
        for j, system in enumerate(self.systems):
            cluster = system.cluster
            if cluster is None or cluster.prefill is None or cluster.decode is None:
                continue
            for name, pool in (("prefill", cluster.prefill), ("decode", cluster.decode)):
                if pool.scheduler is None and system.scheduler.kind == "request_level":
                    raise ScenarioError(
                        f"systems[{j}].cluster.{name}.scheduler.kind = 'request_level' (from "
                        f"systems[{j}].scheduler, which a pool without one inherits): a "
                        "disaggregated pool needs iteration_level, paged or chunked")

    def _check_distserve_placement(self) -> None:
        """DistServe's decode policy runs only where requests arrive with their KV to pull."""
        for j, system in enumerate(self.systems):
            cluster, where = system.cluster, f"systems[{j}]"
            if cluster is None or cluster.prefill is None or cluster.decode is None:
                places: list[tuple[str, object]] = [(f"{where}.scheduler", system.scheduler)]
                places += [(f"{where}.cluster.replicas[{i}].scheduler", g.scheduler)
                           for i, g in enumerate(cluster.groups() if cluster else [])]
            else:
                places = [(f"{where}.cluster.prefill.scheduler",
                           cluster.prefill.scheduler or system.scheduler)]
                if not cluster.pulls_kv:
                    places.append((f"{where}.cluster.decode.scheduler",
                                   cluster.decode.scheduler or system.scheduler))
            for place, scheduler in places:
                if getattr(scheduler, "policy", None) == "distserve_decode":
                    raise ScenarioError(
                        f"{place}.policy = 'distserve_decode': DistServe's decode instance takes "
                        "requests whose KV it pulls; expected it only in cluster.decode, with "
                        "cluster.handoff: pull")

    def group_kv_capacity_tokens(self, group: ReplicaGroup) -> int:
        """A fleet's group's or a pool's KV capacity: its own key, else derived from its own
        model or hardware (the scenario's other half beside it), else the scenario's."""
        return self.group_kv_capacity(group)[0]

    def group_kv_capacity(self, group: ReplicaGroup) -> tuple[int, bool]:
        """`group_kv_capacity_tokens`, and whether it was derived from a model and hardware
        (True) or given as kv_capacity_tokens (False)."""
        assert self.kv_capacity_tokens is not None
        if group.kv_capacity_tokens is not None:
            return group.kv_capacity_tokens, False
        model, hardware = group.model or self.model, group.hardware or self.hardware
        own_deployment = group.model is not None or group.hardware is not None
        if own_deployment and model is not None and hardware is not None:
            return Deployment(model=model, hardware=hardware).kv_capacity_tokens, True
        if group.model is not None and self.model is not None and group.model != self.model:
            # The scenario's tokens were stated for its own model: another's would run on
            # them silently (Llama-2-13B on Llama-2-7B's count; a tester's note).
            raise ScenarioError(
                f"model = '{group.model.name}': without hardware its KV capacity cannot be "
                f"derived, and kv_capacity_tokens = {self.kv_capacity_tokens} is the scenario's "
                f"model's ('{self.model.name}'); expected the group's own kv_capacity_tokens, "
                "or hardware")
        return self.kv_capacity_tokens, self.kv_capacity_derived

    def _check_reservations(self) -> None:
        """A scheduler that reserves max_tokens per request (request_level, or Orca's
        `kv_reservation: max`) admits nothing where the KV capacity is below
        workload.max_tokens: refused, naming the key the capacity comes from. Each replica
        counts with the scheduler and KV it runs: a fleet's group or a decode pool with its own
        (a prefill instance holds a prompt and one token, whatever its scheduler reserves)."""
        max_tokens, blocked = self.workload.max_tokens, []
        for j, system in enumerate(self.systems):
            for where, group in _kv_places(system):
                scheduler = system.scheduler if group is None or group.scheduler is None \
                    else group.scheduler
                if group is None:
                    kv = self.kv_capacity_tokens
                else:  # a group's own deployment that leaves no KV names the group
                    hardware_at = _group_naming(f"systems[{j}].{where}", group.hardware is not None)
                    with errors_under(f"systems[{j}].{where}.", opening=("model = ",)), \
                            errors_under(hardware_at, opening=("hardware.",)):
                        kv = self.group_kv_capacity_tokens(group)
                assert kv is not None
                # A request's KV lives in one data-parallel attention group's cache.
                groups = attention_groups(self.hardware if group is None or group.hardware is None
                                           else group.hardware)
                if kv // groups >= max_tokens or not reserves_max_tokens(scheduler):
                    continue
                if group is None or not _own_kv(group):
                    blocked.append(system.name if where is None else f"{system.name} ({where})")
                    continue
                key = f"systems[{j}].{where}"
                source = (f"{key}.kv_capacity_tokens = {kv} is below" if group.kv_capacity_tokens
                          else f"{key}: its KV capacity, {kv} tokens as its own model and hardware "
                               "leave it, is below")
                if groups > 1:
                    given = (f"{key}.kv_capacity_tokens = {kv}" if group.kv_capacity_tokens
                             else f"{kv} tokens as its own model and hardware leave it")
                    owner = f"{key}.hardware" if group.hardware is not None else "hardware"
                    source = (f"{key}: its KV capacity per data-parallel attention group, "
                              f"{kv // groups} tokens ({given}, over {owner}."
                              f"data_parallel_attention = {groups}), is below")
                raise ScenarioError(
                    f"{source} workload.max_tokens = {max_tokens}: its scheduler reserves "
                    "max_tokens per request, so no request could ever be admitted there")
        if blocked:
            assert self.kv_capacity_tokens is not None  # derived before the checks
            groups = attention_groups(self.hardware)
            capacity = f"kv_capacity_tokens = {self.kv_capacity_tokens}" if groups == 1 else (
                f"the KV capacity of one data-parallel attention group, "
                f"{self.kv_capacity_tokens // groups} tokens (kv_capacity_tokens = "
                f"{self.kv_capacity_tokens} over hardware.data_parallel_attention = {groups}; a "
                "request's KV lives in one group)")
            raise ScenarioError(
                f"workload.max_tokens = {max_tokens} exceeds {capacity}: {', '.join(blocked)} "
                "reserve max_tokens per request, so no request could ever be admitted")

    def system_cost(self, system: SystemConfig) -> CostConfig:
        return system.cost if system.cost is not None else self.cost


def _warn_if_beyond_memory(kv_capacity_tokens: int, deployment: Deployment,
                           key: str = "kv_capacity_tokens") -> None:
    """A KV capacity given beside a model and hardware that no memory of theirs could hold
    (the whole of every GPU less the weights, at utilisation 1 and no reserve) runs as
    given, with a warning: OPT-13B on one A100-40GB with 2,000,000 tokens reserved 85.6 GB
    of KV on the 42 GB GPU without a word (a tester's finding). Within that bound a given
    capacity is another utilisation's or reserve's (DistServe's logged 66,144 tokens for
    OPT-13B on an A100-80GB, where the catalog's 0.9 and 1 GiB derive 60,681): silent."""
    hardware = deployment.hardware.model_copy(update={"gpu_memory_utilization": 1.0,
                                                      "activation_reserve_gib": 0.0})
    try:
        most = Deployment(model=deployment.model, hardware=hardware).kv_capacity_tokens
    except ScenarioError:  # the weights alone fill the memory: a hypothetical deployment
        most = 0
    if kv_capacity_tokens > most:
        hw = deployment.hardware
        warnings.warn(
            f"{key} = {kv_capacity_tokens} is beyond what the deployment holds: "
            f"{hw.num_gpus} x {hw.gpu.name}, their whole memory less model {deployment.model.name}'s "
            f"weights, leave room for at most {most:,} tokens of KV (its utilisation and "
            f"reserve derive {_derived_or_none(deployment)}); the run uses the tokens given",
            UserWarning, stacklevel=2)


def _derived_or_none(deployment: Deployment) -> str:
    try:
        return f"{deployment.kv_capacity_tokens:,}"
    except ScenarioError:
        return "none"


def _kv_places(system: SystemConfig) -> list[tuple[str | None, ReplicaGroup | None]]:
    """Where `system` holds KV as it decodes, each with its key: the system itself (None), a
    fleet's groups, or a disaggregated cluster's decode pool. A fleet of a count alone runs
    the system's settings, as the system itself does."""
    cluster = system.cluster
    if cluster is not None and cluster.disaggregated:
        assert cluster.decode is not None
        return [("cluster.decode", cluster.decode)]
    if cluster is None or not isinstance(cluster.replicas, list):
        return [(None, None)]
    return [(f"cluster.replicas[{i}]", group) for i, group in enumerate(cluster.replicas)]


def _pipelined_stages(scheduler: SchedulerConfig, own: object, inherited: object) -> int | None:
    """A group's own pipeline stages where they change how Orca runs (several batches in
    flight, `orcasim.pipeline`): its `pipeline_parallel` where it differs from the inherited
    hardware's under an iteration-level scheduler, else None."""
    if not isinstance(own, HardwareConfig) or not isinstance(scheduler, IterationLevelConfig):
        return None
    inherited_stages = inherited.pipeline_parallel if isinstance(inherited, HardwareConfig) else 1
    return own.pipeline_parallel if own.pipeline_parallel != inherited_stages else None


def _group_naming(key: str, given: bool) -> str:
    """What names a key of a fleet's group or pool: `key.hardware.x` where the group gives
    the block, else `key: hardware.x`, the scenario's key, which the group runs on."""
    return f"{key}." if given else f"{key}: "


def _own_kv(group: ReplicaGroup) -> bool:
    """Whether a group's KV capacity is its own (given, or derived from its own deployment)."""
    return any(key is not None for key in (group.kv_capacity_tokens, group.model, group.hardware))


def read_text_file(path: Path) -> str:
    """A user's text file, or a one-line ScenarioError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{path}: not UTF-8 text (byte {e.start}); expected a YAML file") from None
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read ({e.strerror})") from None


def one_or_more(overrides: list[str] | tuple[str, ...] | str | None) -> list[str] | tuple[str, ...]:
    """Overrides as given from Python: one may come alone, a string, which is that one
    override and not its characters (`load_scenario(path, "seed=2")` said "override 's'");
    None is none. Anything else is refused here: a dict or a number raised TypeError (or
    "override 'seed'" for a dict's key) from inside."""
    if overrides is None:
        return ()
    if isinstance(overrides, str):
        return (overrides,)
    if not isinstance(overrides, list | tuple) or not all(isinstance(o, str) for o in overrides):
        raise ScenarioError(f"overrides = {overrides!r:.80}: expected KEY=VALUE strings, one alone "
                            "or a list, e.g. ['workload.num_requests=100']")
    return overrides


# Whether a scenario's validation builds every point of its own `sweep:` block
# (`Scenario._check_sweep_points`): not for a sweep file's base, whose grid replaces it.
_CHECK_OWN_SWEEP: ContextVar[bool] = ContextVar("check_own_sweep", default=True)


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] | str = (),
                  overrides_key: str | list[str] = "--set", own_sweep: bool = True) -> Scenario:
    """Read, override and validate a scenario file. Raises ScenarioError on any problem; one
    that the file alone does not have names the overrides that bring it, as given
    (`--set KEY=VALUE`; a sweep file's `set:` list; or one such key per override). One
    override may be given alone, as `run_scenario` takes it. `own_sweep` False: the points
    of the file's own `sweep:` block are not built (a sweep file's grid replaces them, so
    its `set:` may leave them invalid: a scheduler's kind changed under a swept key)."""
    overrides = one_or_more(overrides)
    path = as_path(path)
    text = read_text_file(path)
    try:
        data = yaml_strict.load(text)
    except yaml.YAMLError as e:
        raise malformed_yaml(path, e) from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: {yaml_strict.top_level_problem(data)}expected a mapping of scenario "
                            "keys at the top level")
    base = copy.deepcopy(data) if overrides else data
    for item in overrides:
        apply_override(data, item)
    # Validation reads the files a model names (`model.hf_config`): against this file's
    # folder, as a run reads its traces, not the working directory's.
    token = SCENARIO_DIR.set(path.resolve().parent)
    own_token = _CHECK_OWN_SWEEP.set(own_sweep)
    try:
        scenario = _validated(data, base, path, overrides, overrides_key)
    finally:
        _CHECK_OWN_SWEEP.reset(own_token)
        SCENARIO_DIR.reset(token)
    scenario._source_dir = path.resolve().parent
    return scenario


def malformed_yaml(path: Path, e: yaml.YAMLError) -> ScenarioError:
    """A file the YAML reader refuses, with the line of its problem where the reader says."""
    mark = getattr(e, "problem_mark", None)
    where = f" line {mark.line + 1}" if mark else ""
    return ScenarioError(f"{path}:{where} malformed YAML ({getattr(e, 'problem', e)})")


def _validated(data: dict[str, Any], base: dict[str, Any], path: Path,
               overrides: list[str] | tuple[str, ...], overrides_key: str | list[str]) -> Scenario:
    """`data` validated; an error that the file without its overrides (`base`) does not
    have names the overrides that bring it."""
    try:
        return scenario_from_dict(data, str(path))
    except ScenarioError:
        if not overrides or not _valid(base):
            raise
        # The file is right without them: a mistyped --set key must not read as the file's.
        # Validating again raises the same error, under that name.
        keys = [overrides_key] * len(overrides) if isinstance(overrides_key, str) else overrides_key
        _refuse_kind_change(data, base, path, list(zip(keys, overrides, strict=True)))
        culprits = _culprits(base, overrides)
        given = " ".join(f"{key} {item}" for key, item in zip(keys, overrides, strict=True)
                         if item in culprits)
        return scenario_from_dict(data, f"{path} with {given}")


def _refuse_kind_change(data: dict[str, Any], base: dict[str, Any], path: Path,
                        given: list[tuple[str, str]]) -> None:
    """An override of a block's `kind` that leaves it keys of its old kind only: said as
    such, with the way to change a kind (setting the whole block)."""
    paths = {item.split("=", 1)[0].strip(): (key, item) for key, item in given}
    problem = kind_change_problem(base, data, paths)
    if problem:
        key, item = paths[problem[0]]
        owner, new = problem[0].removesuffix(".kind"), get_dotted(data, problem[0])
        raise ScenarioError(f"{path} with {key} {item}: {problem[1]}; to change a block's "
                            f"kind, set the whole block, e.g. {key} '{owner}={{kind: {new}, ...}}'")


def _culprits(base: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> list[str]:
    """The overrides that each alone make a valid scenario invalid; all of them where only
    their combination does. One that cannot apply alone, into what an earlier one makes (a
    key of `systems[0].cluster.replicas[1]` after `systems=[...]` gives that list), counts
    as one: its path's problem on the bare file ('index [1] of something not a list') is
    not the scenario's, and raised in place of its real one (a tester's finding)."""
    alone = []
    for item in overrides:
        data = copy.deepcopy(base)
        try:
            apply_override(data, item)
        except ScenarioError:
            alone.append(item)
            continue
        if not _valid(data):
            alone.append(item)
    return alone or list(overrides)


def _valid(data: dict[str, Any]) -> bool:
    try:
        scenario_from_dict(data)
    except ScenarioError:
        return False
    return True


def scenario_from_dict(data: dict[str, Any], source: str = "scenario") -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(format_validation_error(e, source, data)) from None


_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
_NAME = r"[^.\[\]\s]+(?:\[\d+\])*"
_WHOLE_PATH = re.compile(rf"^{_NAME}(?:\.{_NAME})*$")
MALFORMED_PATH = ("expected names joined by dots, each with optional [index], e.g. "
                  "systems[1].scheduler.max_batch_size")


def parse_dotted(path: str) -> list[str | int]:
    """`systems[1].scheduler.max_batch_size` -> ['systems', 1, 'scheduler', 'max_batch_size'].
    Anything else (`a..b`, `a]]`, `a[x]`) is an error naming the path."""
    if path and not _WHOLE_PATH.match(path):
        raise ScenarioError(f"override path '{path}' is malformed; {MALFORMED_PATH}")
    parts: list[str | int] = []
    for name, index in _PATH_PART.findall(path):
        parts.append(int(index) if index else name)
    if not parts:
        raise ScenarioError(f"override path '{path}' is empty")
    return parts


def set_dotted(data: dict[str, Any], path: str, value: Any) -> None:
    """Set a value at a dotted path, creating mappings on the way; errors name the path."""
    parts = parse_dotted(path)
    _refuse_groups_to_a_count(data, parts, path, value)
    _seed_inherited(data, parts, value)
    node: Any = data
    for part in parts[:-1]:
        node = _descend(node, part, path)
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise _no_index(node, last, path)
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise _not_a_mapping(node, last, path)


def _refuse_groups_to_a_count(data: dict[str, Any], parts: list[str | int], path: str,
                              value: Any) -> None:
    """A count set over a cluster's list of groups would run that many of the system's own
    replica, dropping what each group gives (its scheduler, hardware, cost): a sweep over
    `replicas: [4, 8]` of a mixed fleet ran plain fleets without a word."""
    groups = _node_at(data, parts)
    if parts[-2:] != ["cluster", "replicas"] or not isinstance(groups, list) or \
            not isinstance(value, int) or isinstance(value, bool):
        return
    total = sum(g.get("count", 1) if isinstance(g, dict) else 1 for g in groups)
    named = f"{len(groups)} groups" if len(groups) > 1 else "group"
    raise ScenarioError(f"override '{path}': {value} would replace its {named} "
                        f"({total} replica{'s' if total != 1 else ''}) with {value} of the "
                        "system's own replica, dropping "
                        f"what each group gives; expected a group's count, e.g. "
                        f"{path}[0].count={value}, or a whole list, e.g. {path}=[{{count: {value}}}]")


# Where a cluster's group or pool (or a system) runs a block it does not give, whose it is:
# `systems[i].cluster.replicas[j]` or `.prefill`/`.decode` run the system's scheduler and cost
# and the scenario's model and hardware; a system, the scenario's cost.
_GROUP_BLOCKS = {"scheduler": ("system",), "cost": ("system", "scenario"),
                 "model": ("scenario",), "hardware": ("scenario",)}


def _inherited_block(data: dict[str, Any], parts: list[str | int]) -> tuple[int, Any]:
    """For a path into a group's, a pool's or a system's block, the length of the block's
    own path and the block it runs now (another's, where it gives none); (0, None) where
    the path names no such block."""
    if len(parts) < 3 or parts[0] != "systems" or not isinstance(parts[1], int):
        return 0, None
    systems = data.get("systems")
    if not isinstance(systems, list) or parts[1] >= len(systems) or \
            not isinstance(systems[parts[1]], dict):
        return 0, None
    system = systems[parts[1]]
    if parts[2] == "cost":  # a system's own cost, else the scenario's
        return 3, data.get("cost")
    tail = parts[3:]
    head = 4 if tail[:1] in (["prefill"], ["decode"]) else \
        5 if tail[:1] == ["replicas"] and len(tail) > 1 and isinstance(tail[1], int) else 0
    if parts[2] != "cluster" or head == 0 or len(parts) <= head:
        return 0, None
    block = parts[head]
    if not isinstance(block, str) or block not in _GROUP_BLOCKS:
        return 0, None
    for owner in _GROUP_BLOCKS[block]:
        found = (system if owner == "system" else data).get(block)
        if found is not None:
            return head + 1, found
    return head + 1, None


def _seed_inherited(data: dict[str, Any], parts: list[str | int], value: Any) -> None:
    """A path into a block that a group, a pool or a system does not give starts from the
    block it runs (`_inherited_block`), as a key a group leaves out is its system's:
    `systems[1].cluster.replicas[0].scheduler.max_num_seqs=16` on a group running its
    system's paged scheduler was refused ('scheduler.kind: Field required'), and
    `...scheduler.kind=paged` ran vLLM's defaults (256 sequences) in place of the system's
    64 without a word (a tester's finding). A `kind` other than the inherited one starts
    from nothing, as a kind changed anywhere keeps only the keys given for it."""
    length, inherited = _inherited_block(data, parts)
    if length == 0 or len(parts) <= length or not isinstance(inherited, dict | str):
        return  # a catalog name (`model: llama3-8b`) is one too, which _descend opens
    owner = _node_at(data, parts[:length - 1])
    name = parts[length - 1]
    if not isinstance(owner, dict) or owner.get(name) is not None:
        return  # it gives its own (or the path cannot reach: set_dotted says why)
    kind = inherited.get("kind") if isinstance(inherited, dict) else None
    if parts[length:] == ["kind"] and kind != value:
        return
    owner[name] = copy.deepcopy(inherited)


def apply_params(data: dict[str, Any], params: dict[str, Any], given: dict[str, Any]) -> None:
    """Set each of a point's parameters (a sweep's, a capacity search's) in `data`, a
    validated dump. Where one changes a `kind`, its object starts again from `given` (the
    keys the user wrote, no defaults), as `--set ....kind=` on the file would: the dump's
    defaults are the old kind's (a request-level scheduler's `max_queue_delay_s` is no
    iteration-level key). Kinds first, so that a reset keeps no swept key."""
    before = copy.deepcopy(data)
    for path, value in params.items():
        owner, _, key = path.rpartition(".")
        if key == "kind" and owner and get_dotted(data, path) != value:
            if get_dotted(data, owner) is None:  # a group's inherited block, of this kind
                _seed_inherited(data, parse_dotted(path), value)
            if get_dotted(data, path) != value:
                set_dotted(data, owner, copy.deepcopy(get_dotted(given, owner) or {}))
    for path, value in params.items():
        set_dotted(data, path, value)
    problem = kind_change_problem(before, data, params)
    if problem:
        raise ScenarioError(f"{problem[1]}; a grid cannot drop a key: leave it out of the base "
                            "scenario, or compare the kinds as two systems")


def task_id(point: int, replication: int) -> str:
    """A sweep's task as its files and messages name it: `p0001-r00`."""
    return f"p{point:04d}-r{replication:02d}"


def point_name(task_id: str, params: dict[str, Any]) -> str:
    """How a message names a sweep's task: `point p0001-r00 (workload.arrival.rate_per_s=4.0)`."""
    where = ", ".join(f"{path}={value}" for path, value in params.items())
    return f"point {task_id} ({where})"


def own_sweep_points(scenario: Scenario) -> list[tuple[str, Scenario]]:
    """Each point of `scenario`'s own `sweep:` block as `orcasim run` builds it (one
    replication, on the scenario's seed), with its name (`point_name`); none without one."""
    if scenario.sweep is None:
        return []
    base, given = sweep_base_data(scenario)
    points = []
    for i, value in enumerate(scenario.sweep.values):
        params = {scenario.sweep.parameter: value}
        name = point_name(task_id(i, 0), params)
        points.append((name, sweep_point(base, given, params, scenario.seed, name)))
    return points


def sweep_base_data(scenario: Scenario) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scenario as plain data that every point of a sweep starts from, and its keys as given."""
    # The validated dump holds every default, so each swept path already exists in it. A
    # derived KV capacity is left out so that each point derives its own (it may change the
    # hardware), and a scenario's own one-parameter `sweep:` block is replaced by the grid.
    exclude = frozenset({"sweep"})
    return scenario.given_data(exclude), scenario.given_data(exclude, exclude_unset=True)


def sweep_point(base: dict[str, Any], given: dict[str, Any], params: dict[str, Any], seed: int,
                name: str) -> Scenario:
    """One point of a sweep: `base` (`sweep_base_data`) with `params` set (`apply_params`)
    on `seed`, validated; a refusal starts with `name`."""
    data = copy.deepcopy(base)
    data["seed"] = seed
    try:
        apply_params(data, params, given)
    except ScenarioError as e:  # a grid's key, not an override (a tester's finding)
        text = str(e)
        if text.startswith("override '"):  # "override 'PATH': why" -> "PATH: why"
            text = text.removeprefix("override '").replace("': ", ": ", 1)
        raise ScenarioError(f"{name}: {text}") from None
    return scenario_from_dict(data, name)


def kind_change_problem(before: dict[str, Any], after: dict[str, Any],
                        paths: Iterable[str]) -> tuple[str, str] | None:
    """Where one of `paths` changes a block's `kind` (from `before` to `after`) and the block
    keeps keys the new kind does not take (`max_num_seqs` of a paged scheduler set to
    iteration_level, a linear cost's `base_s` set to roofline), what to say: pydantic's own
    'unknown key ... did you mean max_batch_size?' read as if the user had written the key
    for the new kind, and named no way to drop it. Returns the path and the problem."""
    for path in paths:
        parts = parse_dotted(path)
        if parts[-1] != "kind":
            continue
        block, new = _node_at(after, parts[:-1]), get_dotted(after, path)
        # A block the file leaves out runs its system's (or the scenario's): a key set into
        # it before the kind copied that block's keys (`_seed_inherited`).
        old = get_dotted(before, path) if _node_at(before, parts[:-1]) is not None else \
            _inherited_kind(before, parts)
        if not isinstance(block, dict) or old in (None, new):
            continue
        form = kind_form(Scenario, parts[:-1], new)
        stale = [f"{key} = {value!r}" for key, value in block.items()
                 if form is not None and key not in form.model_fields]
        if stale:
            owner = path.removesuffix(".kind")
            keys = "is no key" if len(stale) == 1 else "are no keys"
            return path, (f"{owner}: {', '.join(stale)} (given for kind {old!r}) {keys} of "
                          f"kind {new!r}, and changing the kind keeps them")
    return None


def _inherited_kind(data: dict[str, Any], parts: list[str | int]) -> Any:
    """The kind of the block that the one owning `parts` (a path to its `kind`) runs where
    it gives none (`_inherited_block`): a key set into it first (`_seed_inherited`) copies
    that block's keys, which a kind set after it then keeps."""
    length, inherited = _inherited_block(data, parts)
    if length != len(parts) - 1 or not isinstance(inherited, dict):
        return None
    return inherited.get("kind")


def get_dotted(data: Any, path: str) -> Any:
    """The value at a dotted path (`set_dotted`'s), or None where the path does not reach."""
    return _node_at(data, parse_dotted(path))


def _node_at(data: Any, parts: list[str | int]) -> Any:
    node = data
    for part in parts:
        if isinstance(part, int) and isinstance(node, list) and part < len(node):
            node = node[part]
        elif isinstance(part, str) and isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def _no_index(node: Any, index: int, path: str) -> ScenarioError:
    if not isinstance(node, list):
        return ScenarioError(f"override '{path}': index [{index}] of something not a list")
    return ScenarioError(f"override '{path}': index [{index}] does not exist; expected an "
                         f"index below {len(node)} (the list's length)")


def _not_a_mapping(node: Any, part: str, path: str) -> ScenarioError:
    if isinstance(node, list) and part.isdigit():  # systems.0, as other tools write it
        return ScenarioError(f"override '{path}': '{part}' names an item of a list; expected "
                             f"an index in brackets, e.g. {path.replace(f'.{part}', f'[{part}]', 1)}")
    return ScenarioError(f"override '{path}': '{part}' is not inside a mapping")


# Keys that name a catalog entry (`model: llama3-8b`, `hardware.gpu: h100-80gb`): a dotted
# path into one changes a key of that entry (`from_catalog`).
CATALOG_REFS = ("model", "gpu")


def _descend(node: Any, part: str | int, path: str) -> Any:
    if isinstance(part, int):
        if not isinstance(node, list) or part >= len(node):
            raise _no_index(node, part, path)
        return node[part]
    if not isinstance(node, dict):
        raise _not_a_mapping(node, part, path)
    if part in CATALOG_REFS and isinstance(node.get(part), str):
        # `model.kv_cache_dtype=fp8` on `model: llama3-8b`: that entry with a key changed
        node[part] = {CATALOG_KEY: node[part]}
    return node.setdefault(part, {})


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one `dotted.path=value` override; the value is parsed as a scenario file's YAML
    is (so 4 and 5e-1 are numbers, and a mapping's key given twice is refused)."""
    if "=" not in item:
        raise ScenarioError(f"override '{item}': expected KEY=VALUE, e.g. workload.arrival.rate_per_s=4")
    key, raw = item.split("=", 1)
    try:
        value = yaml_strict.load(raw)
    except yaml.YAMLError:
        raise ScenarioError(f"override '{item}': value '{raw}' is not valid YAML") from None
    set_dotted(data, key.strip(), value)


def scenario_to_yaml(scenario: Scenario) -> str:
    """The scenario as YAML that reruns from any folder: its data paths relative to the
    scenario's own folder are written absolute (see portable_data_path)."""
    data = scenario.given_data()
    _portable_paths(scenario, data, scenario.source_dir)
    text = yaml.safe_dump(data, sort_keys=False)
    if scenario.kv_capacity_derived:  # said, but not as if given: a rerun derives its own
        text = (f"# kv_capacity_tokens: {scenario.kv_capacity_tokens} here, derived from model "
                "and hardware (left out: a rerun derives it from its own)\n" + text)
    return text


def portable_dump(block: BaseModel, base: Path | None) -> dict[str, Any]:
    """A part of a scenario (a cost block, say) as `scenario_to_yaml` writes it: its data
    paths relative to `base`, the scenario's folder, made absolute where found there."""
    data = block.model_dump(mode="json", exclude_none=True)
    _portable_paths(block, data, base)
    return data


def data_inputs(scenario: Scenario, base: Path | None = None) -> list[Path]:
    """The files and folders the scenario's data paths name (a trace, a length column, a cost
    file), where found beside the scenario (`base`, else its own folder) or under the working
    folder: inputs of its run, which `--force` must not delete with a results folder."""
    base = base or scenario.source_dir
    found = [Path(portable_data_path(value, base)).expanduser() for value in _data_path_values(scenario)]
    return [path for path in found if path.is_absolute()]


def _data_path_values(obj: Any) -> Iterator[str]:
    """Every value of a field marked as a data path, anywhere in `obj`."""
    if isinstance(obj, BaseModel):
        for name, field in type(obj).model_fields.items():
            value = getattr(obj, name)
            if DATA_PATH in field.metadata and isinstance(value, str):
                yield value
            else:
                yield from _data_path_values(value)
    elif isinstance(obj, list | tuple):
        for item in obj:
            yield from _data_path_values(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _data_path_values(item)


def _portable_paths(obj: Any, data: Any, base: Path | None) -> None:
    """Rewrite in `data` (the dump of `obj`) every field marked as a data path."""
    if isinstance(obj, BaseModel) and isinstance(data, dict):
        for name, field in type(obj).model_fields.items():
            if name not in data:
                continue
            value = getattr(obj, name)
            if DATA_PATH in field.metadata and isinstance(value, str):
                data[name] = portable_data_path(value, base)
            else:
                _portable_paths(value, data[name], base)
    elif isinstance(obj, list | tuple) and isinstance(data, list):
        for item, dumped in zip(obj, data, strict=False):
            _portable_paths(item, dumped, base)
    elif isinstance(obj, dict) and isinstance(data, dict):
        for key, item in obj.items():
            if key in data:
                _portable_paths(item, data[key], base)

