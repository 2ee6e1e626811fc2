"""The sweep file: a base scenario, a grid of dotted-path parameters, and replications.

    name: rate_x_batch
    base: ../quickstart.yaml            # relative to this file
    set: [workload.num_requests=500]    # optional fixed overrides, as with `orcasim run --set`
    grid:
      mode: product                     # or zip (all value lists the same length)
      parameters:
        workload.arrival.rate_per_s: [1, 2, 4, 8]
        systems[1].scheduler.max_batch_size: [4, 8, 16]
    replications: 3
    seed: 0

A *point* is one parameter combination; a *task* is one point under one replication.
Replication r uses the same seed at every point (common random numbers), so curves
across points differ by the parameters, not by sampling noise.

A scenario's own `sweep: {parameter, values}` block is the same thing with one parameter
and one replication on the scenario's own seed (`scenario_sweep`).
"""

from __future__ import annotations

import itertools
import math
import re
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import numpy as np
import yaml
from pydantic import (
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from orcasim import yaml_strict
from orcasim.config import ScenarioError, Strict, first_repeat, format_validation_error
from orcasim.paths import as_path
from orcasim.scenario import (
    MALFORMED_PATH,
    NAME_MAX_CHARS,
    NAME_PATTERN,
    Scenario,
    column_problem,
    data_inputs,
    load_scenario,
    malformed_yaml,
    one_or_more,
    parse_dotted,
    point_name,
    read_text_file,
    sweep_base_data,
    sweep_point,
    task_id,
)

ParamValue = int | float | str | bool
MAX_REPLICATIONS = 10_000
# Tasks (points x replications) a sweep may hold: every one is built and its point checked
# before any runs, about 0.4 KB and 0.6 ms each, so 1e6 is 0.4 GB and ten minutes of checks
# already; three lists of 1,000 values (1e9 points) built tasks until memory ran out.
MAX_TASKS = 1_000_000


def replication_seeds(seed: int, replications: int) -> list[int]:
    """One independent seed per replication, spawned from `seed` with numpy's SeedSequence:
    the rule a sweep's replications and a capacity search's both use, so replication r of
    either runs on the same seed for the same base seed."""
    children = np.random.SeedSequence(seed).spawn(replications)
    # 63 bits keep the seed a non-negative int64 in the results table.
    return [int(c.generate_state(1, np.uint64)[0] >> np.uint64(1)) for c in children]


# A sweep file's keys that no scenario has (`name` and `seed` are a scenario's too).
SWEEP_ONLY_KEYS = ("base", "set", "grid", "replications")


class Grid(Strict):
    """A sweep file's `grid`: each parameter's dotted path and its values, combined as their
    product or zipped (lists of equal length)."""

    mode: Literal["product", "zip"] = "product"
    parameters: dict[str, list[ParamValue]] = Field(min_length=1)

    @field_validator("parameters", mode="before")
    @classmethod
    def _single_values(cls, parameters: Any) -> Any:
        """A grid value is one table cell. A block (an output length distribution) read 'Input
        should be a valid integer or ...; expected a number of tokens', where the key takes a
        block and no number: the grid can sweep the block's own keys instead."""
        for path, values in parameters.items() if isinstance(parameters, dict) else ():
            for i, value in enumerate(values if isinstance(values, list) else ()):
                if isinstance(value, dict | list):
                    keys = [k for k in value if k != "kind"] if isinstance(value, dict) else []
                    advice = (f"; sweep the block's own keys instead, e.g. {path}.{keys[0]}"
                              if keys else "; each item of the list is one point's value")
                    raise ScenarioError(
                        f"parameters.{path}[{i}] = {value!r}: expected a single value (a number, "
                        f"text or true/false), one column of the table{advice}")
        return parameters

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        for path, values in self.parameters.items():
            try:
                parse_dotted(path)
            except ScenarioError:  # in the grid's words: it is no override
                raise ScenarioError(f"parameters ({path!r}): a malformed path; "
                                    f"{MALFORMED_PATH}") from None
            if not values:
                raise ScenarioError(f"parameters.{path}: needs at least one value")
            if parse_dotted(path)[0] == "seed":
                raise ScenarioError("parameters.seed: use `replications` for independent seeds")
            column = column_problem(values)
            if column is not None:  # one table column per parameter
                i, why = column
                raise ScenarioError(f"parameters.{path} = {values if i is None else values[i]}: {why}")
        lengths = {len(v) for v in self.parameters.values()}
        if self.mode == "zip" and len(lengths) > 1:
            raise ScenarioError(f"mode = zip needs value lists of one length; got {sorted(lengths)}")
        self._distinct_points()
        return self

    def _distinct_points(self) -> None:
        """A point listed twice ran twice under the same seeds, and `compare` merged the two
        rows as one point: refused, naming the repeat."""
        if self.mode == "product":
            for path, values in self.parameters.items():
                twice = first_repeat(values)
                if twice is not None:
                    raise ScenarioError(
                        f"parameters.{path} = {values}: lists {values[values.index(values[twice])]!r} "
                        "twice; expected "
                        "distinct values (`replications` repeats a point with independent seeds)")
            return
        points = list(zip(*self.parameters.values(), strict=True))
        twice = first_repeat(points)
        if twice is not None:
            named = ", ".join(f"{path} = {v!r}" for path, v in zip(self.parameters, points[twice],
                                                                     strict=True))
            raise ScenarioError(f"mode = zip: point {twice} ({named}) repeats point "
                                f"{points.index(points[twice])}; expected distinct points")


class SweepSpec(Strict):
    """A sweep file's keys, validated: the base scenario, the overrides applied to it
    (`set`), the grid, and the replications drawn from `seed`."""

    name: str = Field(pattern=NAME_PATTERN, max_length=NAME_MAX_CHARS)
    base: str
    set: list[str] = []
    grid: Grid
    # A bound, not a hang in SeedSequence.spawn: 1e12 replications never finished validating.
    replications: Annotated[PositiveInt, Field(le=MAX_REPLICATIONS)] = 1
    seed: NonNegativeInt = 0

    @model_validator(mode="after")
    def _bounded(self) -> Self:
        lengths = [len(v) for v in self.grid.parameters.values()]
        points = math.prod(lengths) if self.grid.mode == "product" else lengths[0]
        tasks = points * self.replications
        if tasks > MAX_TASKS:
            sizes = " x ".join(map(str, lengths)) + " = " if self.grid.mode == "product" else ""
            raise ScenarioError(
                f"grid.parameters make {sizes}{points:.3g} points, {tasks:.3g} tasks with "
                f"replications = {self.replications}, beyond the {MAX_TASKS:,} a sweep may "
                "hold (each is built and checked before any runs); expected fewer values, "
                "or several sweeps")
        return self


@dataclass(frozen=True)
class Task:
    """One point under one replication: everything a worker needs, as plain picklable data."""

    point: int
    replication: int
    seed: int
    params: dict[str, ParamValue]
    base: dict[str, Any]
    base_dir: str
    # The base's keys as given (no defaults): where a point changes a `kind`, the object
    # starts again from these, as `--set ....kind=` on the scenario file would.
    given: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return task_id(self.point, self.replication)

    def scenario(self) -> Scenario:
        return sweep_point(self.base, self.given, self.params, self.seed,
                           point_name(self.id, self.params))


@dataclass(frozen=True)
class Sweep:
    """A sweep ready to run: its spec, the base scenario's data and the folder its data paths
    start from; `tasks()` lists one task per point and replication. Built by `make_sweep`,
    `load_sweep` or `scenario_sweep`; run by `run_sweep` or `run_sweep_in_memory`."""

    spec: SweepSpec
    base: dict[str, Any]
    base_dir: Path
    # A scenario's own sweep block runs on the scenario's seed, as a plain run of it would.
    own_seed: bool = False
    given: dict[str, Any] = field(default_factory=dict)  # see Task.given
    # The warnings said so far, each once, naming the first point that gave it: checking a
    # point, then running it, said each twice (the first time naming no point).
    said: set[str] = field(default_factory=set)

    @contextmanager
    def naming(self, task: Task) -> Iterator[None]:
        """Warnings raised inside, each said once per sweep and naming `task`'s point, as the
        run's are (`task.show_warnings`, which starts from `said`)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        for w in caught:
            message = str(w.message)
            if message not in self.said:
                self.said.add(message)
                warnings.warn(f"{point_name(task.id, task.params)}: {message}", w.category,
                              stacklevel=3)

    def points(self) -> list[dict[str, ParamValue]]:
        names = list(self.spec.grid.parameters)
        lists = list(self.spec.grid.parameters.values())
        combos = itertools.product(*lists) if self.spec.grid.mode == "product" else zip(*lists, strict=True)
        return [dict(zip(names, combo, strict=True)) for combo in combos]

    def replication_seeds(self) -> list[int]:
        """Independent seeds, one per replication, spawned from one SeedSequence."""
        if self.own_seed:
            return [int(self.base["seed"])] * self.spec.replications
        return replication_seeds(self.spec.seed, self.spec.replications)

    def data_inputs(self) -> list[Path]:
        """The data files every point reads (a point may name its own): `scenario.data_inputs`."""
        paths = set()
        for task in self.tasks()[:: self.spec.replications]:
            with self.naming(task):
                paths.update(data_inputs(task.scenario(), Path(task.base_dir)))
        return sorted(paths)

    def warn_alike_replications(self) -> None:
        """Replications of a point whose requests no seed draws (a trace) repeat one run:
        said once, naming the first such point, as capacity says it of its searches. A
        sweep of a trace with 3 replications ran three identical runs without a word, and
        its band across replications, of zero width, read as a certain answer."""
        if self.spec.replications < 2:
            return
        for task in self.tasks()[:: self.spec.replications]:
            with self.naming(task):
                what = task.scenario().workload.draws_nothing()
                if what is not None:
                    warnings.warn(f"{what}: every replication replays the same requests, so the "
                                  f"{self.spec.replications} replications differ only where a "
                                  "system draws at random (a random or power_of_two router); a "
                                  "band of zero width across them is one sample, not a certain "
                                  "answer", UserWarning, stacklevel=2)

    def tasks(self) -> list[Task]:
        seeds = self.replication_seeds()
        return [
            Task(p, r, seed, params, self.base, str(self.base_dir), self.given)
            for p, params in enumerate(self.points())
            for r, seed in enumerate(seeds)
        ]


def load_sweep(path: str | Path, overrides: list[str] | tuple[str, ...] | str = ()) -> Sweep:
    """Read and validate a sweep file; `base` is relative to the file. `overrides` (as with
    `--set`; one may be given alone) apply after the file's own `set:` list."""
    overrides = one_or_more(overrides)
    path = as_path(path, "path", "a sweep file's path")  # None raised pathlib's TypeError
    spec = _parse_spec(path)
    keys = ["set:"] * len(spec.set) + ["--set"] * len(overrides)  # who gave each, for errors
    if overrides:
        spec = spec.model_copy(update={"set": [*spec.set, *overrides]})
    base = path.parent / spec.base
    _refuse_a_sweep_as_base(base, f"{path}: base = {spec.base!r}")
    return build_sweep(spec, base, keys)


def make_sweep(
    base: str | Path, parameters: dict[str, list[ParamValue]], mode: str = "product",
    replications: int = 1, seed: int = 0, name: str = "sweep",
    overrides: list[str] | tuple[str, ...] | str | None = None,
) -> Sweep:
    """The Python form of a sweep file, for notebooks and scripts; `overrides` (one may be
    given alone) are its `set:` list. `base` is a scenario file's path, as a sweep file's is."""
    base = as_path(base, "base")  # a Scenario or a dict raised os.fspath's TypeError
    data = {"name": name, "base": str(base), "set": list(one_or_more(overrides or [])), "replications": replications,
            "seed": seed, "grid": {"mode": mode, "parameters": parameters}}
    _refuse_a_sweep_as_base(Path(base), f"base = {str(base)!r}")
    return build_sweep(_validate_spec(data, "sweep"), Path(base))


def _refuse_a_sweep_as_base(base: Path, named: str) -> None:
    """Read as a scenario, a sweep file as the base said "(top level): unknown key 'base';
    did you mean 'seed'?" (a tester's finding)."""
    if base.is_file() and yaml_strict.is_sweep_file(base):
        raise ScenarioError(f"{named} is a sweep file (it names a base scenario itself), not a "
                            "scenario; expected a scenario file, such as that sweep's own base")


def scenario_sweep(scenario: Scenario, base_dir: Path) -> Sweep:
    """A scenario's own `sweep: {parameter, values}` block as a sweep: one point per value,
    one replication on the scenario's seed. `base_dir` resolves the scenario's data files.
    Every point is validated here, so a bad value fails before any point runs."""
    if not isinstance(scenario, Scenario):  # None raised "'NoneType' has no attribute 'sweep'"
        raise ScenarioError(f"scenario = {scenario!r:.80}: expected a Scenario, e.g. "
                            "orcasim.load_scenario(path)")
    if scenario.sweep is None:
        raise ScenarioError(f"scenario '{scenario.name}' has no 'sweep' block")
    data = {"name": scenario.name, "base": scenario.name, "seed": scenario.seed,
            "grid": {"parameters": {scenario.sweep.parameter: scenario.sweep.values}}}
    spec = _validate_spec(data, f"{scenario.name}: sweep")
    base, given = sweep_base_data(scenario)
    base_dir = as_path(base_dir, "base_dir", "the folder its data paths resolve from")
    sweep = Sweep(spec, base, base_dir.resolve(), own_seed=True, given=given)
    for task in sweep.tasks():
        task.scenario()
    return sweep


def _validate_spec(data: dict[str, Any], source: str) -> SweepSpec:
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(format_validation_error(e, source, data)) from None


def build_sweep(spec: SweepSpec, base_path: Path, set_keys: list[str] | None = None) -> Sweep:
    """Resolve the base scenario; every point's scenario is validated too (its first
    replication's: they differ by the seed alone), so a mistyped parameter path or a bad
    value fails here, before any work starts. `set_keys` says who gave each of `spec.set`
    (the file's `set:` or the command line's `--set`), for an error to name."""
    # None raised "'NoneType' object has no attribute 'resolve'"
    base_path = as_path(base_path, "base_path", "the base scenario file's path").resolve()
    keys = set_keys or ["set:"] * len(spec.set)
    for given, key in zip(spec.set, keys, strict=True):  # a set seed would be lost: each
        if "=" not in given:
            raise ScenarioError(f"{key} {given!r}: expected KEY=VALUE, e.g. "
                                "workload.arrival.rate_per_s=4")
        if given.split("=", 1)[0].strip() == "seed":   # point's is its replication's
            raise ScenarioError(f"{key} {given!r}: a sweep's seeds come from its own `seed` and "
                                "`replications`; expected seed: at the sweep file's top level")
        top = re.split(r"[.\[]", given.split("=", 1)[0].strip(), maxsplit=1)[0]
        if top in SWEEP_ONLY_KEYS:  # read as the base's key, it was "unknown key 'grid'"
            raise ScenarioError(f"{key} {given!r}: {top} is a key of the sweep file, not of its "
                                "base scenario, whose keys set: and --set change; expected "
                                f"{top} in the sweep file itself")
        refuse_swept_override(given, key, spec.grid.parameters)
    # The base as given runs at no point where the grid changes it: its warnings (a clipped
    # lognormal whose mean every point sets) are said by the points that have them.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Its own sweep is never run (the grid replaces it), so its points are not built:
        # a `set:` that leaves them invalid (a kind changed under a swept key) is fine.
        scenario = load_scenario(base_path, spec.set, overrides_key=set_keys or "set:",
                                 own_sweep=False)
    own = scenario.sweep
    if own is not None and own.parameter not in spec.grid.parameters:  # else the grid redoes it
        warnings.warn(f"{base_path.name}'s own sweep over {own.parameter} is not run: a sweep "
                      "file's grid replaces it (add the parameter to the grid to sweep it too)",
                      UserWarning, stacklevel=2)
    base, as_given = sweep_base_data(scenario)
    sweep = Sweep(spec, base, base_path.parent, given=as_given)
    for task in sweep.tasks()[:: spec.replications]:
        with sweep.naming(task):
            task.scenario()
    return sweep


def refuse_swept_override(given: str, key: str, swept: Iterable[str], by: str = "the grid",
                          alone: str = "") -> None:
    """Refuse an override (`key` says who gave it: `set:` or `--set`) of a key that `by` sets
    at every point: it would never be used, and the sweep ran `by`'s values without a word.
    `alone`: how to run the value given by itself, where there is a way."""
    path = given.split("=", 1)[0].strip()
    if path in swept:
        raise ScenarioError(f"{key} {given!r}: {by} sets {path} at every point, so this value "
                            f"would never be used; expected it in {by}'s values, or a key {by} "
                            f"does not sweep{alone}")


def _parse_spec(path: Path) -> SweepSpec:
    data = _read_yaml(path)
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(format_validation_error(e, str(path), data)) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml_strict.load(read_text_file(path))  # not UTF-8: one line, as a scenario's
    except yaml.YAMLError as e:
        raise malformed_yaml(path, e) from None  # with its line, as a scenario's says it
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: {yaml_strict.top_level_problem(data)}expected a mapping of sweep "
                            "keys at the top level")
    return data
