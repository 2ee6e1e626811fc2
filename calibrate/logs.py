"""Calibrate a scenario's cost from serving logs, by simulating in the loop.

Users have per-request logs of their real server (arrival, prompt and output lengths,
TTFT, TPOT or E2E), not GPU profiles. `python -m calibrate logs RUN.csv ... --scenario
S.yaml --out cost.yaml` replays every log's arrivals and lengths through the scenario
(`orcasim.fidelity.replay_of`) and fits the named cost coefficients, by default the
engine's overhead (`overhead.per_iteration_s`, `overhead.per_sequence_s`,
`overhead.per_prefill_token_s`), in two stages:

1. A linear fit of the overhead terms that times are linear in (`LINEAR_TERMS`): on the
   schedule a replay makes, each request's TTFT and decode time (E2E - TTFT), or its E2E
   where the log has no TTFT, is a known part plus a linear combination of them
   (`linear_rows`); solve (non-negative, least absolute relative errors), replay with the
   answer, a step that does worse halved, for a few rounds (`solve_linear`).
2. Nelder-Mead on every fitted coefficient in log space (positive, scale-free), from
   there, on the loss

       mean over logs and metrics of log(sim / real)^2, at the mean and the percentiles
       10, 25, 50, 75 and 90 (a real value of 0, TPOT where a server returns whole
       responses, has no log-ratio and is left out)

   plus, with `--prior-weight W` above 0, W times each term's squared log-ratio to the
   scenario's value (`Prior`: a MAP fit, for terms the logs cannot tell apart); with
   `--prior-weight auto`, W from the loss of a fit without one (`auto_prior_weight`)

   A simulation's loss is rugged at fine scale (a coefficient 1% off can admit a request
   an iteration later), so the simplex starts narrow, and restarts narrower still. A
   coefficient outside the linear terms (a launch floor, a roofline efficiency) is first
   surveyed with a seeded Sobol sequence a factor of 10 either side of its start; fitted
   beside linear terms, it is first searched alone with them solved at each of its points
   (stage 1 there: `_profiled_search`), as an efficiency and the per-iteration term trade
   off along a valley where a simplex over both stalls. A term at 0 (where the linear stage
   put it) starts there and is surveyed from its floor (`zero_floors`) up; a term below its
   floor is 0.

Everything is deterministic: the simulation is, and so is the search. A log simulated
with known coefficients is fitted back to them (tests/test_calibrate_logs.py: within 2%,
in practice 1e-5). Each log is also left out in turn: fitted on the others, it is scored
on its own (`headline_error`: the median |error| over TTFT, TPOT and E2E at p50 and
p90), the error to expect on a new run of the same setup.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orcasim.config import ScenarioError, errors_under
from orcasim.cost import Batch, CostModel, build_cost_model, engine_overhead, request_latency_s
from orcasim.cost.fitted import CALIBRATED_FORMAT
from orcasim.cost.overhead import OverheadCost
from orcasim.fidelity import (
    METRICS,
    after_warmup,
    compare,
    headline_error,
    measured_on_both,
    read_real_run,
    replay_of,
    run_labels,
)
from orcasim.paths import PACKAGE_DATA_DIR
from orcasim.portable import libm_exp, libm_log
from orcasim.run import data_dir, make_requests, run_scenario, run_system
from orcasim.scenario import (
    EngineConfig,
    Scenario,
    portable_dump,
    scenario_from_dict,
    set_dotted,
)
from orcasim.warmup import counted

DEFAULT_PARAMETERS = ("overhead.per_iteration_s", "overhead.per_sequence_s",
                      "overhead.per_prefill_token_s")
FIT_PERCENTILES = (10, 25, 50, 75, 90)
# Where a coefficient at zero starts: about Vidur's measured values, and a prompt token's
# share of an iteration's host work.
START_VALUES = {"overhead.per_iteration_s": 1e-3, "overhead.per_sequence_s": 1e-4,
                "overhead.per_prefill_token_s": 1e-6}
DEFAULT_START = 1e-3
# A fitted term below this fraction of its scale is 0 (`zero_floors`): log space cannot hold
# 0, and a search toward it walked on down (a term reported as 2.8e-20). The scale is
# START_VALUES' for an overhead term (floors of 1e-7 s an iteration, 1e-8 s a request, 1e-10 s
# a prompt token, 1e-7 s for the others), the scenario's value for any other coefficient.
ZERO_FRACTION = 1e-4
XATOL = 1e-4  # in log-space: coefficients to 0.01%
FATOL = 1e-8
MAX_EVALUATIONS = 200  # per Nelder-Mead run
SIMPLEX_WIDTHS = (1.5, 1.1, 1.02)
SURVEY_POINTS = 64
SURVEY_FACTOR = 10.0  # the survey spans start / 10 to start * 10 in every coefficient
SURVEY_SEED = 0
REFINED_POINTS = 2
# The profiled stage's survey and Nelder-Mead (`_profiled_search`): each point replays the
# logs a few times to solve the linear terms there, so fewer points than the survey's.
PROFILED_POINTS = 8
PROFILED_EVALUATIONS = 40
MIN_RATIO = 1e-9  # a simulated value of 0 against a real one costs log(1e-9)^2, not infinity


@dataclass
class ServingLog:
    """One real run: the file the simulation replays, what was measured, and its name in
    the report (`read_logs` gives logs that share a stem their folders: a/run, b/run)."""

    path: Path
    real: pd.DataFrame
    fmt: str = "auto"
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or self.path.stem


@dataclass
class Fit:
    """Fitted coefficients, the loss, and the errors on the logs fitted and left out."""

    parameters: dict[str, float]
    loss: float
    evaluations: int
    fitted_errors: dict[str, float] = field(default_factory=dict)
    left_out_errors: dict[str, float] = field(default_factory=dict)
    left_out_parameters: dict[str, dict[str, float]] = field(default_factory=dict)
    left_out_prior_weights: dict[str, float] = field(default_factory=dict)  # where a prior held
    prior: Prior | None = None  # the prior the fit ran under (its penalty is in `loss`)
    prior_penalty: float = 0.0


@dataclass(frozen=True)
class Prior:
    """A sourced prior on the fitted terms: the fit minimises the loss plus

        weight * sum over terms of log(value / centre)^2

    (a MAP fit with a log-normal prior on each term, of log-sd sigma, where weight =
    s^2 / (n sigma^2) for n independent errors of residual log-variance s^2; `AUTO` takes
    one a log, `auto_prior_weight`, as a run's error is mostly its engine's speed): a term a
    factor e from its centre costs `weight`, as much as every compared statistic
    sqrt(weight) off in log. The centres are the scenario's values (`overhead: {}`: Vidur's
    measured defaults). A term whose centre is 0 (`per_prefill_token_s` and
    `request_latency_s` by default) has no log-ratio and no prior: it is fitted freely."""

    weight: float
    centre: dict[str, float]
    # How the weight was chosen: given, or AUTO (`auto_prior_weight`, from a fit without one).
    chosen: str = "given"

    def penalty(self, values: dict[str, float], floors: dict[str, float]) -> float:
        """The penalty at `values`; a term at 0 is taken at its floor (`zero_floors`), what
        the search in log space holds it at."""
        return self.weight * sum(math.log(max(values[p], floors.get(p, 0.0)) / c) ** 2
                                 for p, c in self.centre.items())


# The prior's log-sd on each engine term: the spread of Vidur's own measurements of them at
# TP 1 (cpu_overheads.csv: OPT-13B's 0.81 ms an iteration and 0.042 ms a request at 6d98aa8;
# Llama-2-7B's 1.20 and 0.100 and CodeLlama-34B's 1.12 and 0.162 at 0633efa: a factor of 1.5
# an iteration and 3.9 a request, the wider taken for both; results/validation/README.md).
PRIOR_LOG_SD = math.log(4.0)
# `--prior-weight auto`: the weight from the fit without a prior (`auto_prior_weight`).
AUTO = "auto"
PriorWeight = float | str  # a weight >= 0, or AUTO


def auto_prior_weight(data_loss: float, num_logs: int) -> float:
    """W = s^2 / (n sigma^2): s^2 the logs' loss at the fit without a prior (their residual
    log-variance), n the logs (one independent error a log: a run's error is mostly its
    engine's own speed, results/validation/README.md), sigma `PRIOR_LOG_SD`. Logs fitted
    exactly give 0, no prior: a fit that needs no help gets none."""
    return data_loss / (num_logs * PRIOR_LOG_SD ** 2)


def sourced_prior(scenario: Scenario, system: str, parameters: tuple[str, ...],
                  weight: float) -> Prior | None:
    """The prior of `weight` centred on the scenario's values of `parameters` (those above
    0); None at weight 0 (the fit as without one). A weight below 0 or not finite is a
    one-line error."""
    if not (math.isfinite(weight) and weight >= 0):
        raise ScenarioError(f"--prior-weight = {weight!r}: expected a finite number >= 0")
    if weight == 0:
        return None
    return Prior(weight, prior_centre(scenario, system, parameters))


def prior_centre(scenario: Scenario, system: str, parameters: tuple[str, ...]) -> dict[str, float]:
    """The scenario's values of `parameters` above 0: a term at 0 has no log-ratio, no prior."""
    values = current_values(scenario, parameters, system)
    return {p: v for p, v in values.items() if v > 0}


def read_logs(paths: list[Path], fmt: str = "auto") -> list[ServingLog]:
    """Each log, named as `orcasim fidelity` names runs; a log given twice, or one with no
    latency above 0 to fit to, is a one-line error."""
    names = run_labels([Path(p) for p in paths], given_as="log")
    logs = [ServingLog(Path(p), read_real_run(Path(p), fmt), fmt, name)
            for p, name in zip(paths, names, strict=True)]
    for log in logs:
        if not fitted_metrics(log.real):
            raise ScenarioError(f"log {log.path}: no {', '.join(METRICS[:-1])} or {METRICS[-1]} "
                                "above 0; expected measured latencies to fit to")
    return logs


def fitted_metrics(real: pd.DataFrame) -> list[str]:
    """The metrics a log measured above 0. A log-ratio needs a positive real value: a metric
    at 0 throughout (TPOT where a server returns whole responses) tells the fit nothing."""
    return [m for m in METRICS if real[m].mean() > 0]


def with_cost(scenario: Scenario, values: dict[str, float], system: str | None = None) -> Scenario:
    """`scenario` whose cost has `values` at their dotted paths: the cost `system` runs (and
    its cluster groups' and pools' own), or with no system every cost block. Another system's
    own cost is another engine: a fit of the linear `base_s` wrote it into a roofline system's
    block too, which refused every evaluation (a tester's finding).
    A cost without an `overhead` block has none: fitting some of its terms adds a block
    whose other terms are 0, where they took OverheadConfig's defaults unasked (7 ms a step
    under TP 2, and the fitted terms came back near 0 to make up for it; a tester's finding)."""
    data = scenario.model_dump(mode="json", exclude_none=True)
    fits_overhead = any(dotted.startswith("overhead.") for dotted in values)
    for cost in _cost_blocks(data, system):
        if fits_overhead and "overhead" not in cost:
            cost["overhead"] = no_overhead()
        for dotted, value in values.items():
            set_dotted(cost, dotted, value)
    return scenario_from_dict(data, f"{scenario.name} (calibrating)")


def no_overhead() -> dict[str, float]:
    """An overhead block that adds nothing: every term 0."""
    from orcasim.cost.overhead import OverheadConfig

    return dict.fromkeys(OverheadConfig.model_fields, 0.0)


def inline_calibrated(scenario: Scenario, base_dir: Path | None) -> Scenario:
    """`scenario` with every cost that loads a file this command wrote (`kind: fitted` on a
    calibrated cost) replaced by the block the file holds: a refit starts from the file's
    terms and writes a whole block, where fitting the loading block's `overhead` stacked a
    second engine on the file's (and started from the defaults)."""
    from orcasim.cost.calibrated import calibrated_block
    from orcasim.cost.fitted import FittedCostConfig

    data = scenario.model_dump(mode="json", exclude_none=True)
    inlined = False
    with data_dir(base_dir):
        for block in _cost_blocks(data):
            if block.get("kind") != "fitted":
                continue
            cfg = FittedCostConfig.model_validate(block)
            inner = calibrated_block(cfg)
            if inner is None:
                continue
            overhead = engine_overhead(cfg)  # the file's, or the one beside its path
            block.clear()
            block.update(inner.model_dump(mode="json", exclude_none=True))
            if overhead is not None:
                block["overhead"] = overhead.model_dump(mode="json", exclude_none=True)
            inlined = True
    return scenario_from_dict(data, scenario.name) if inlined else scenario


def _cost_blocks(data: dict[str, Any], system: str | None = None) -> list[dict[str, Any]]:
    """Every cost block: the scenario's, each system's, and each cluster group's or pool's
    (one engine's overhead is fitted once, and holds wherever that engine runs); with
    `system`, the one it runs (its own, or the scenario's) and its groups' and pools'."""
    systems = [s for s in data["systems"] if system is None or s["name"] == system]
    if system is None:
        blocks = [data["cost"], *(s["cost"] for s in systems if "cost" in s)]
    else:
        blocks = [systems[0].get("cost", data["cost"])]
    for system_data in systems:
        cluster = system_data.get("cluster") or {}
        groups = [cluster.get("prefill"), cluster.get("decode")]
        if isinstance(cluster.get("replicas"), list):
            groups += cluster["replicas"]
        blocks += [g["cost"] for g in groups if g and "cost" in g]
    return blocks


def own_cost_blocks(scenario: Scenario, system: str) -> list[str]:
    """The keys of `system`'s cluster groups and pools that give a cost of their own: the fit
    sets its coefficients there too (`with_cost`), and a calibrated file, which holds the
    system's one block, does not carry them (a disaggregated fit loaded back missed its
    prefill pool's: 10% off where the fit said 2%; a tester's finding)."""
    j, system_cfg = next((j, s) for j, s in enumerate(scenario.systems) if s.name == system)
    cluster = system_cfg.cluster
    return [] if cluster is None else [f"systems[{j}].cluster.{where}.cost"
                                       for where, g in cluster.given_groups() if g.cost is not None]


def current_values(scenario: Scenario, parameters: tuple[str, ...],
                   system: str | None = None) -> dict[str, float]:
    """The values of `parameters` in the cost `system` runs (the scenario's first system by
    default; an absent overhead has its defaults); a name that is not one of its
    coefficients is a one-line error listing those that are. (The scenario's top-level cost
    was read, where the system had its own: a name of neither was accepted and failed every
    evaluation; a tester's finding.)"""
    name = system or scenario.systems[0].name
    system_cfg = next(s for s in scenario.systems if s.name == name)
    data = scenario.system_cost(system_cfg).model_dump(mode="json", exclude_none=True)
    if "overhead" not in data:  # every kind takes one: its terms are fitted from its defaults
        # and listed (a misspelt name on a linear cost listed base_s and two more alone,
        # where overhead.per_iteration_s was accepted too)
        from orcasim.cost.overhead import OverheadConfig

        data["overhead"] = OverheadConfig().model_dump()
    fittable = _coefficients(data)
    for dotted in parameters:
        if dotted not in fittable:
            raise ScenarioError(f"--fit {dotted}: {_not_a_coefficient(data, dotted)}; expected "
                                f"one of its coefficients {', '.join(fittable)}")
    return {dotted: fittable[dotted] for dotted in parameters}


def _coefficients(cost: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The cost's real-valued leaves by dotted path: what a fit can vary. Integers (a
    tensor-parallel degree), strings (a model name) and groups (overhead) are not."""
    found: dict[str, float] = {}
    for key, value in cost.items():
        if isinstance(value, dict):
            found.update(_coefficients(value, f"{prefix}{key}."))
        elif isinstance(value, float):
            found[f"{prefix}{key}"] = value
    return found


def _not_a_coefficient(cost: dict[str, Any], dotted: str) -> str:
    """Why `dotted` cannot be fitted: absent, a group of fields, or not a real number."""
    node: Any = cost
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return f"not a field of the scenario's cost (kind {cost['kind']})"
        node = node[key]
    shown = f"{dotted} as a group of fields" if isinstance(node, dict) else f"{dotted} = {node!r}"
    return f"the scenario's cost (kind {cost['kind']}) has {shown}, not a real-valued coefficient"


def simulate(scenario: Scenario, log: ServingLog, system: str, base_dir: Path | None) -> pd.DataFrame:
    # A replay's bad input names the log it came from (one of several).
    with warnings.catch_warnings(), errors_under(f"log {log.path}: "):
        warnings.simplefilter("ignore")  # rejections and extrapolation: counted, not shouted
        result = run_scenario(replay_of(scenario, log.path, log.fmt), base_dir=base_dir)
    return result.systems[system].requests


def log_errors(simulated: pd.DataFrame, real: pd.DataFrame) -> np.ndarray:
    """log(sim / real) of the mean and the fit's percentiles of every metric measured; a
    real value of 0 has no log-ratio and is left out (`fitted_metrics`)."""
    table = compare(real, simulated, FIT_PERCENTILES)
    table = table[table["real"] > 0]
    quantiles = libm_log(np.clip((table["simulated"] / table["real"]).to_numpy(), MIN_RATIO, None))
    means = [math.log(max(_mean_ratio(simulated, real, m), MIN_RATIO))
             for m in fitted_metrics(real) if simulated[m].notna().any()]
    return np.concatenate([quantiles, means])


def _mean_ratio(simulated: pd.DataFrame, real: pd.DataFrame, metric: str) -> float:
    """Simulated over real mean of `metric`, over the requests `compare` takes its
    percentiles over (`measured_on_both`: a request turned away is left out of both)."""
    both = measured_on_both(real, simulated, metric)
    return float(simulated[metric].to_numpy()[both].mean() / real[metric].to_numpy()[both].mean())


class Objective:
    """The loss of a coefficient vector (in log space), over a set of logs."""

    def __init__(self, scenario: Scenario, logs: list[ServingLog], system: str,
                 parameters: tuple[str, ...], base_dir: Path | None,
                 prior: Prior | None = None) -> None:
        self.scenario, self.logs, self.system = scenario, logs, system
        self.parameters, self.base_dir, self.prior = parameters, base_dir, prior
        self.evaluations = 0  # simulations run: a point seen before is answered from `_known`
        self.floors = zero_floors(scenario, system, parameters)
        self._known: dict[tuple[tuple[str, float], ...], float] = {}

    def values(self, x: np.ndarray) -> dict[str, float]:
        """The coefficients at `x` (log space), 0 where below their floors."""
        return floored(dict(zip(self.parameters, libm_exp(x).tolist(), strict=True)), self.floors)

    def __call__(self, x: np.ndarray) -> float:
        return self.loss_of(self.values(x))

    def loss_of(self, values: dict[str, float]) -> float:
        """The loss at `values` (a term at 0 included, which log space cannot hold), with
        the prior's penalty where there is one."""
        return self.data_loss_of(values) + self.penalty_of(values)

    def data_loss_of(self, values: dict[str, float]) -> float:
        """The logs' loss at `values` alone, without the prior."""
        key = tuple(sorted(values.items()))
        if key not in self._known:  # below their floors, many points are one (`floored`)
            self._known[key] = self._loss_of(values)
        return self._known[key]

    def penalty_of(self, values: dict[str, float]) -> float:
        return 0.0 if self.prior is None else self.prior.penalty(values, self.floors)

    def _loss_of(self, values: dict[str, float]) -> float:
        self.evaluations += 1
        try:
            scenario = with_cost(self.scenario, values, self.system)
        except ScenarioError:
            return math.inf  # outside a coefficient's valid range (an efficiency above 1)
        parts = []
        for log in self.logs:  # the requests after the warm-up, as `fidelity` compares them
            simulated = simulate(scenario, log, self.system, self.base_dir)
            real, simulated = after_warmup(log.real, simulated, scenario.warmup_s)
            parts.append(log_errors(simulated, real))
        errors = np.concatenate(parts)
        if errors.size == 0:  # the mean of nothing is NaN, which the search takes for a value
            raise ScenarioError(f"--system {self.system}: simulates none of the latencies the "
                                "logs measure above 0; expected a system that serves requests")
        return float(np.mean(errors ** 2))


def zero_floors(scenario: Scenario, system: str, parameters: tuple[str, ...]) -> dict[str, float]:
    """Each parameter's floor, below which it is 0: `ZERO_FRACTION` of its scale."""
    values = current_values(scenario, parameters, system)
    return {p: ZERO_FRACTION * _scale(p, values[p]) for p in parameters}


def _scale(name: str, value: float) -> float:
    """A coefficient's typical size: `START_VALUES`' for an overhead term (the scenario's
    may be a previous fit's 0), and any other's value in the scenario (a per-context-token
    slope of 2e-7 s would fall under a floor taken from a 1 ms default)."""
    if name.startswith("overhead."):
        return START_VALUES.get(name, DEFAULT_START)
    return value if value > 0 else DEFAULT_START


def floored(values: dict[str, float], floors: dict[str, float]) -> dict[str, float]:
    """`values`, each below its floor made 0 (what a search in log space means by it)."""
    return {p: v if v >= floors[p] else 0.0 for p, v in values.items()}


# Overhead terms an iteration's time (or a request's TTFT) is linear in, and the feature
# each multiplies: solved by least absolute relative errors on a fixed schedule (`solve_linear`).
LINEAR_TERMS = {"overhead.per_iteration_s": "one", "overhead.per_sequence_s": "batch",
                "overhead.per_prefill_token_s": "prefill", "overhead.request_latency_s": "latency"}
LINEAR_ROUNDS = 12  # replays; a halved step counts as one
LINEAR_RTOL = 1e-6  # a fixed point: no coefficient moved more than this


class RecordingCost(CostModel):
    """An `OverheadCost` that notes, per iteration, its GPU part and its batch's features."""

    def __init__(self, cost: OverheadCost) -> None:
        self.cost = cost
        # (max(gpu, floor), host time, and the sequences and prompt tokens a unit of
        # per_sequence_s and per_prefill_token_s costs: `OverheadCost.host_units`)
        self.rows: list[tuple[float, float, float, float]] = []

    def iteration_time_s(self, batch: Batch) -> float:
        # OverheadCost.iteration_time_s, term by term (the same operations, the same bits),
        # priced once and noted.
        if batch.size == 0:
            return 0.0
        gpu_s = self.cost.gpu_part_s(batch)
        prompts = batch.query_tokens[batch.query_tokens > 1].tolist()
        host_s = self.cost.batch_host_s(batch)
        sequences, prompt_tokens = self.cost.host_units(batch.size, sum(prompts), max(prompts, default=0))
        self.rows.append((gpu_s, host_s, sequences, prompt_tokens))
        return gpu_s + host_s

    def stage_times_s(self, batch: Batch, layers: Sequence[int]) -> list[float]:
        # One row per iteration is what the fit solves over; a pipeline's stages overlap.
        raise ScenarioError("a pipelined Orca system cannot be calibrated from logs: its "
                            "stages overlap, and the fit needs one iteration after another")

    def out_of_range_count(self) -> int:
        return self.cost.out_of_range_count()


@dataclass
class Schedule:
    """One replay's iterations and requests, in engine time, to write times as linear sums."""

    start_s: np.ndarray  # (I,) iteration starts
    end_s: np.ndarray  # (I,) iteration ends
    # (I,) each: gpu, host (all of it, as priced), and per unit of each linear term: one,
    # batch and prefill (a request's and a prompt token's share under data-parallel attention)
    features: dict[str, np.ndarray]
    arrival_s: np.ndarray  # (R,) at the engine
    first_token_s: np.ndarray  # (R,)
    finish_s: np.ndarray  # (R,)
    compared: np.ndarray  # (R,) arrived after the warm-up: the requests the loss compares
    latency_s: float = 0.0  # the request latency the replay ran with


def replay_schedule(scenario: Scenario, log: ServingLog, system: str,
                    base_dir: Path | None) -> Schedule:
    """Replay `log` in reference mode (one row per iteration) and note every iteration."""
    replay = replay_of(scenario, log.path, log.fmt).model_copy(
        update={"engine": EngineConfig(mode="reference")})
    system_cfg = next(s for s in replay.systems if s.name == system)
    with data_dir(base_dir), warnings.catch_warnings(), errors_under(f"log {log.path}: "):
        warnings.simplefilter("ignore")
        cost = build_cost_model(replay.system_cost(system_cfg), replay.deployment(), replay.hardware)
        assert isinstance(cost, OverheadCost), "with_cost gives a calibrated cost an overhead"
        recording = RecordingCost(cost)
        result = run_system(replay, system_cfg, make_requests(replay), cost=recording)
        latency_s = request_latency_s(replay.system_cost(system_cfg))  # may read a cost file
    iters = result.iterations
    if len(iters) != len(recording.rows):
        raise ScenarioError(f"{log.name}: {system}'s engine priced {len(recording.rows)} plans in "
                         f"{len(iters)} iterations; a pipelined engine cannot be calibrated so")
    gpu, host, batch, prefill = (np.array(c, dtype=np.float64)
                                 for c in zip(*recording.rows, strict=True))
    # Under data-parallel attention a unit of the per-request and per-prompt-token terms
    # costs the slowest group's share (1/dp of the batch's, or its largest request's own):
    # the features are the replay's, at the values it ran with.
    reqs = result.requests  # arrivals are the client's; the engine saw them latency_s later
    return Schedule(
        iters["start_s"].to_numpy(), (iters["start_s"] + iters["duration_s"]).to_numpy(),
        {"gpu": gpu, "host": host, "one": np.ones_like(gpu), "batch": batch, "prefill": prefill},
        reqs["arrival_s"].to_numpy() + latency_s, reqs["first_token_s"].to_numpy(),
        reqs["finish_s"].to_numpy(), counted(reqs["arrival_s"].to_numpy(), replay.warmup_s),
        latency_s)


def linear_rows(schedule: Schedule, real: pd.DataFrame, values: dict[str, float],
                fitted: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows `(known, x, measured)`, with measured = known + x @ c for the `fitted` terms' c.

    A request's decode window (first token to finish) holds whole iterations: their sum.
    Its TTFT holds the request latency, the rest of the iteration it arrived in (the part
    already gone is kept as a fraction), and every iteration up to its first token's. A
    request whose log has no TTFT is timed by its E2E, the two summed.
    Terms not fitted stay as the replay priced them and go into `known`: each iteration's
    time less the fitted terms at `values`, the ones the schedule was made with (taken as 0,
    the scenario's other terms fell into the fitted ones).
    """
    features = schedule.features
    per_iteration = features["gpu"] + features["host"]
    for name in fitted:
        if LINEAR_TERMS[name] != "latency":
            per_iteration -= values.get(name, 0.0) * features[LINEAR_TERMS[name]]
    columns = {"known": per_iteration, **{n: features[LINEAR_TERMS[n]] for n in fitted
                                          if LINEAR_TERMS[n] != "latency"}}
    cum = {k: np.concatenate(([0.0], np.cumsum(v))) for k, v in columns.items()}
    n_iter = len(schedule.end_s)
    first = np.searchsorted(schedule.end_s, schedule.first_token_s - 1e-12)
    last = np.searchsorted(schedule.end_s, schedule.finish_s - 1e-12)
    arrived = np.minimum(np.searchsorted(schedule.end_s, schedule.arrival_s, side="right"),
                         n_iter - 1)
    span = schedule.end_s[arrived] - schedule.start_s[arrived]
    gone = np.clip((schedule.arrival_s - schedule.start_s[arrived]) / np.where(span > 0, span, 1),
                   0.0, 1.0)

    def decode(c: np.ndarray) -> np.ndarray:
        return c[np.minimum(last, n_iter - 1) + 1] - c[np.minimum(first, n_iter - 1) + 1]

    def ttft(c: np.ndarray) -> np.ndarray:
        whole = c[np.minimum(first, n_iter - 1) + 1] - c[arrived]
        return whole - gone * (c[arrived + 1] - c[arrived])

    def rows(c: np.ndarray) -> np.ndarray:  # decode, TTFT, E2E
        return np.concatenate([decode(c), ttft(c), decode(c) + ttft(c)])

    r = len(first)
    latency = np.concatenate([np.zeros(r), np.ones(r), np.ones(r)])
    known = rows(cum["known"]) + (0.0 if "overhead.request_latency_s" in fitted
                                  else schedule.latency_s) * latency
    x = np.column_stack([latency if LINEAR_TERMS[n] == "latency" else rows(cum[n])
                         for n in fitted])
    ttft_s, e2e_s = real["ttft_s"].to_numpy(), real["e2e_s"].to_numpy()
    # A request timed by its E2E alone (a server that does not stream, an AIPerf run without
    # --streaming) gives a row of its own: without it such a log had no rows, the stage was
    # skipped, and Nelder-Mead alone stopped 84-101% off the truth at 8-17% error.
    measured = np.concatenate([e2e_s - ttft_s, ttft_s, np.where(np.isnan(ttft_s), e2e_s, np.nan)])
    # The requests the loss compares (`after_warmup`): a cold start's pulled the stage off.
    ran = np.isfinite(schedule.first_token_s) & np.isfinite(schedule.finish_s) & schedule.compared
    ok = np.isfinite(measured) & (measured > 0) & np.concatenate([ran, ran, ran])
    return known[ok], x[ok], measured[ok]


def solve_linear(scenario: Scenario, logs: list[ServingLog], system: str,
                 fitted: list[str], values: dict[str, float], base_dir: Path | None
                 ) -> dict[str, float]:
    """The linear terms by non-negative least absolute relative errors, damped to a fixed
    point.

    With the schedule of the current values, every measured time is a known part plus a
    linear combination of the fitted terms, and the rows give those values' own error
    exactly. Solve them (a step that holds the schedule still) and replay there; a step
    whose error is worse than the best point's (the schedule moved under it: other
    batches, another request first) is halved back toward that point. The best point
    replayed is the answer. Near the truth most requests keep its schedule and fit it
    exactly, while the few an iteration early or late are far off: absolute errors follow
    the many, where squared errors followed the few (undamped, their steps from a start 4
    to 20 times off went round a cycle 8 to 41% from the truth for some coefficients).
    Noise-free logs give their coefficients back: at them the error is 0.
    """
    values = dict(values)
    best: np.ndarray | None = None
    best_error, target, step = math.inf, np.zeros(len(fitted)), 1.0
    for _ in range(LINEAR_ROUNDS):
        known, x, measured = linear_system(scenario, logs, system, fitted, values, base_dir)
        if measured.size == 0:  # no TTFT or E2E above 0 (a TPOT-only log): Nelder-Mead alone
            break
        # Relative errors: a 10 ms miss on a 50 ms TTFT counts as much as 1 s on 5 s.
        scale = 1.0 / measured
        current = np.array([values.get(n, 0.0) for n in fitted])
        error = float(np.sum(np.abs((measured - known - x @ current) * scale)))
        if error < best_error:
            best, best_error, step = current, error, 1.0
            target = _robust_nnls(x * scale[:, None], (measured - known) * scale)
        else:
            step /= 2.0
        assert best is not None
        new = best + step * (target - best)
        moved = float(np.max(np.abs(new - current) / np.maximum(np.abs(new), 1e-300)))
        values.update(zip(fitted, new.tolist(), strict=True))
        if moved < LINEAR_RTOL:
            break
    if best is not None:
        values.update(zip(fitted, best.tolist(), strict=True))
    return values


def linear_system(scenario: Scenario, logs: list[ServingLog], system: str, fitted: list[str],
                  values: dict[str, float], base_dir: Path | None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every log's `linear_rows` on the schedule a replay at `values` makes, stacked."""
    parts = [linear_rows(replay_schedule(with_cost(scenario, values, system), log, system, base_dir),
                         log.real, values, fitted) for log in logs]
    return (np.concatenate([p[0] for p in parts]), np.vstack([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]))


# How close a term's column in the linear fit may come to the others' span (the sine of the
# angle, columns scaled to 1) before the logs cannot tell it from them: moving the term by
# its whole size then changes the fit's rows by a thousandth of that. The shipped vLLM runs'
# columns stand 0.31 to 0.74 off the others' span; a one-request log's, 1e-16.
COLLINEAR_SIN = 1e-3


def unidentified_terms(scenario: Scenario, logs: list[ServingLog], system: str,
                       values: dict[str, float], base_dir: Path | None = None) -> list[str]:
    """One line for each linear term (`LINEAR_TERMS`) among `values` that the logs' timed
    rows, on the schedule a replay at `values` makes, cannot determine: its column zero, or
    in the others' span (fewer rows than terms, or every iteration one request, where a
    request's share and an iteration's are one column). Such a term's value is whatever the
    search stopped at. Terms outside the linear stage, and a cluster's, are not checked."""
    fitted = linear_terms(scenario, system, tuple(values))
    if not fitted:
        return []
    _, x, measured = linear_system(scenario, logs, system, fitted, values, base_dir)
    if measured.size == 0:
        return []
    a = x / measured[:, None]  # relative, as the fit weighs them
    norms = np.linalg.norm(a, axis=0)
    a = a / np.where(norms > 0, norms, 1.0)
    said = []
    for j, name in enumerate(fitted):
        others = np.delete(a, j, axis=1)
        beta = np.linalg.lstsq(others, a[:, j], rcond=None)[0] if others.size else np.zeros(0)
        if norms[j] > 0 and np.linalg.norm(a[:, j] - others @ beta) >= COLLINEAR_SIN:
            continue
        why = ("zero (no timed request's iterations had any)" if norms[j] == 0 else
               "collinear with the other terms'")
        said.append(f"{name} = {values[name]:.4g} is not determined by these logs: its column in "
                    f"the linear fit is {why} ({measured.size} timed rows for {len(fitted)} terms); "
                    "give more requests, at other loads, or fit fewer terms (--fit)")
    return said


def ineffective_terms(scenario: Scenario, logs: list[ServingLog], system: str,
                      values: dict[str, float], base_dir: Path | None = None) -> list[str]:
    """One line for each fitted term outside the linear stage (`unidentified_terms` checks
    those) whose value changes nothing in these logs' simulation: the loss the same, bit for
    bit, at half and at twice it. The search then returns its start, reported as fitted (a
    tensor-parallel term at TP 1 came back at its default of 7 ms, exit 0, without a word)."""
    checked = linear_terms(scenario, system, tuple(values))
    objective = Objective(scenario, logs, system, tuple(values), base_dir)
    at_fit = objective.loss_of(values)
    said = []
    for name, value in values.items():
        if name in checked:
            continue
        probes = [2.0 * value, 0.5 * value] if value > 0 else [START_VALUES.get(name, DEFAULT_START)]
        if all(objective.loss_of({**values, name: probe}) == at_fit for probe in probes):
            said.append(f"{name} = {value:.4g} changes nothing in these logs' simulation (the "
                        "same loss at half and twice it), so the fit left it where it started; "
                        "expected a coefficient the system's cost uses (a tensor-parallel term "
                        "needs more than one GPU)")
    return said


def _robust_nnls(a: np.ndarray, b: np.ndarray, rounds: int = 50) -> np.ndarray:
    """min |a c - b|_1 over c >= 0, by reweighted least squares."""
    from scipy.optimize import nnls

    norms = np.maximum(np.abs(a).max(axis=0), 1e-300)  # conditioning
    a = a / norms
    weights = np.ones(len(b))
    solution = np.zeros(a.shape[1])
    for _ in range(rounds):
        root = np.sqrt(weights)
        solution, _ = nnls(a * root[:, None], b * root)
        weights = 1.0 / np.maximum(np.abs(a @ solution - b), 1e-6)
    return solution / norms


def fit(scenario: Scenario, logs: list[ServingLog], system: str,
        parameters: tuple[str, ...] = DEFAULT_PARAMETERS, base_dir: Path | None = None,
        start: dict[str, float] | None = None, survey_points: int = SURVEY_POINTS,
        prior_weight: float = 0.0) -> Fit:
    """Start the overhead terms that times are linear in by least absolute errors (`solve_linear`),
    then refine every coefficient by Nelder-Mead on the loss.

    A simulation's loss is rugged at fine scale (an iteration more or less moves a
    request's timestamps by a step), so a local search alone stops in whatever dip is
    nearest. The linear stage's start lands near the answer for the linear terms; any other
    coefficient is first surveyed (a scrambled Sobol sequence, seeded: deterministic) a
    factor of `SURVEY_FACTOR` either side of its start. A term that starts at 0 (the linear
    stage's answer, or the scenario's) starts there, and the survey spans it from its floor
    (`zero_floors`) to `SURVEY_FACTOR` times its scale: started at 1 ms instead, a
    per-iteration term the linear stage put at 0 stopped in the nearest dip, 1.1 ms at a loss
    of 0.0158 on a log where 0.28 ms gave 0.0118.

    With `prior_weight` above 0 the search minimises the loss plus a sourced prior's penalty
    (`Prior`, centred on the scenario's values), and starts from those centres too; the
    linear stage does not see it (it gives a start).
    """
    prior = sourced_prior(scenario, system, parameters, prior_weight)
    start = dict(start or current_values(scenario, parameters, system))
    linear = linear_terms(scenario, system, parameters)
    searched = [p for p in parameters if p not in LINEAR_TERMS]
    objective = Objective(scenario, logs, system, parameters, base_dir, prior)
    if linear and searched and survey_points:
        start.update(_profiled_search(objective, linear, searched, start))
    elif linear:
        start.update(solve_linear(scenario, logs, system, linear, start, base_dir))
    floors = objective.floors if survey_points else {}
    x0 = _log_start(start, parameters, floors)
    surveyed = [i for i, p in enumerate(parameters) if p in searched and start[p] >= floors.get(p, 0)]
    spans = _spans_from_zero(start, parameters, floors)
    points = _survey_points(x0, surveyed, spans, survey_points)
    if prior is not None and prior.centre:
        # The prior's centre is a start too: on logs that cannot tell two terms apart, the
        # linear stage's answer and the survey lie along the valley, wherever the data put them.
        points.append(_at_centre(x0, parameters, prior))
    if spans and not surveyed:
        # Nelder-Mead from the terms at START_VALUES too, as before there was a survey, and
        # from the survey's best: the best of the two. From the survey's alone, the shipped
        # vLLM fit (four logs, two terms at 0) stopped at a loss of 0.0155, where 0.0147.
        points = [_log_start(start, parameters, {}), *points]
        best_x, best_loss = _search(objective, points, 2, keep_first=True)
    else:
        best_x, best_loss = _search(objective, points, REFINED_POINTS)
    values = objective.values(best_x)
    fitted = with_cost(scenario, values, system)
    errors = {log.name: scored_error(fitted, log, system, base_dir) for log in logs}
    return Fit(values, best_loss, objective.evaluations, errors, prior=prior,
               prior_penalty=objective.penalty_of(values))


def fit_under(scenario: Scenario, logs: list[ServingLog], system: str,
              parameters: tuple[str, ...] = DEFAULT_PARAMETERS, base_dir: Path | None = None,
              prior_weight: PriorWeight = 0.0) -> Fit:
    """`fit` with `prior_weight` a weight or `AUTO`: fitted without a prior first, then, at
    the weight that fit's loss gives (`auto_prior_weight`), with one, from the same start."""
    if prior_weight != AUTO:
        return fit(scenario, logs, system, parameters, base_dir, prior_weight=float(prior_weight))
    free = fit(scenario, logs, system, parameters, base_dir)
    weight = auto_prior_weight(free.loss, len(logs))
    if weight == 0:  # fitted exactly: no prior, and the record says auto chose none
        free.prior = Prior(0.0, prior_centre(scenario, system, parameters), chosen=AUTO)
        return free
    held = fit(scenario, logs, system, parameters, base_dir, prior_weight=weight)
    if held.prior is not None:
        held.prior = dataclasses.replace(held.prior, chosen=AUTO)
    return held


def _at_centre(x0: np.ndarray, names: Sequence[str], prior: Prior) -> np.ndarray:
    """`x0` with each term the prior holds at its centre (log space)."""
    x = x0.copy()
    for i, p in enumerate(names):
        if p in prior.centre:
            x[i] = math.log(prior.centre[p])
    return x


def _log_start(start: dict[str, float], names: Sequence[str], floors: dict[str, float]
               ) -> np.ndarray:
    """`names`' starting values in log space. A value below its floor in `floors` starts at 0
    (a factor of `SURVEY_FACTOR` below the floor, which `floored` reads as 0), and one at 0
    without a floor (no survey to leave it) at `START_VALUES`' (or `DEFAULT_START`)."""
    def one(p: str) -> float:
        if p in floors and start[p] < floors[p]:
            return floors[p] / SURVEY_FACTOR
        return start[p] if start[p] > 0 else START_VALUES.get(p, DEFAULT_START)

    return libm_log(np.array([one(p) for p in names], dtype=np.float64))


def _spans_from_zero(start: dict[str, float], names: Sequence[str], floors: dict[str, float]
                     ) -> dict[int, tuple[float, float]]:
    """The log-space spans the survey covers for the terms that start at 0 (below their
    floors): from the floor to `SURVEY_FACTOR` times the term's scale (`_scale`), 5 decades."""
    return {i: (math.log(floors[p]), math.log(floors[p] / ZERO_FRACTION * SURVEY_FACTOR))
            for i, p in enumerate(names) if p in floors and start[p] < floors[p]}


def _survey_points(x0: np.ndarray, around: list[int], spans: dict[int, tuple[float, float]],
                   num_points: int) -> list[np.ndarray]:
    """`x0`, then a seeded scrambled Sobol survey of `num_points` (deterministic): in log
    space, a factor of `SURVEY_FACTOR` either side of `x0` in the coordinates `around`, and
    over its (low, high) span in each coordinate of `spans`; the others stay at `x0`."""
    from scipy.stats import qmc

    dim = len(around) + len(spans)
    if not dim or not num_points:
        return [x0]
    unit = qmc.Sobol(dim, seed=SURVEY_SEED).random(num_points)
    offsets = math.log(SURVEY_FACTOR) * (2.0 * unit[:, :len(around)] - 1.0)
    points = [x0]
    for offset, row in zip(offsets, unit[:, len(around):], strict=True):
        x = x0.copy()
        x[around] += offset
        for u, (i, (low, high)) in zip(row, spans.items(), strict=True):
            x[i] = low + (high - low) * u
        points.append(x)
    return points


def _profiled_search(objective: Objective, linear: list[str], searched: list[str],
                     start: dict[str, float]) -> dict[str, float]:
    """The searched coefficients (a roofline efficiency, a launch floor) with the linear
    terms solved afresh at every point (`solve_linear`; variable projection): a survey of
    `PROFILED_POINTS` points a factor of `SURVEY_FACTOR` either side of the start (from the
    floor up, for a term at 0), then Nelder-Mead on the searched coordinates alone from the
    best. Searched beside the linear terms instead, an efficiency and the per-iteration term
    trade off along a narrow valley where the simplex stalls: a memory efficiency of 0.6 with
    3 and 0.5 ms of overhead came back 0.80, 5.5 and 0.50 ms (33% and 84% off) from 0.8, 1
    and 0.1 ms."""
    from scipy.optimize import minimize

    solved: dict[tuple[float, ...], tuple[float, dict[str, float]]] = {}
    floors = {p: objective.floors[p] for p in searched}

    def loss(y: np.ndarray) -> float:
        key = tuple(np.round(y, 12).tolist())
        if key not in solved:
            at = floored(dict(zip(searched, libm_exp(y).tolist(), strict=True)), floors)
            values = {**start, **at}
            try:
                values = solve_linear(objective.scenario, objective.logs, objective.system,
                                      linear, values, objective.base_dir)
            except ScenarioError:  # outside a coefficient's valid range (an efficiency above 1)
                solved[key] = (math.inf, values)
            else:
                solved[key] = (objective.loss_of(values), values)
        return solved[key][0]

    y0 = _log_start(start, searched, floors)
    around = [i for i, p in enumerate(searched) if start[p] >= floors[p]]
    points = _survey_points(y0, around, _spans_from_zero(start, searched, floors), PROFILED_POINTS)
    best = points[int(np.argmin([loss(y) for y in points]))]
    simplex = np.vstack([best, best + math.log(SIMPLEX_WIDTHS[0]) * np.eye(len(searched))])
    minimize(loss, best, method="Nelder-Mead",
             options={"initial_simplex": simplex, "xatol": XATOL, "fatol": FATOL,
                      "maxfev": PROFILED_EVALUATIONS})
    return min(solved.values(), key=lambda pair: pair[0])[1]


def linear_terms(scenario: Scenario, system: str, parameters: tuple[str, ...]) -> list[str]:
    """The `parameters` the linear stage fits. It records one cost model's schedule; a
    cluster has several, so there every coefficient is searched (from its start, without a
    survey)."""
    clustered = any(s.cluster is not None for s in scenario.systems if s.name == system)
    return [] if clustered else [p for p in parameters if p in LINEAR_TERMS]


def _search(objective: Objective, points: list[np.ndarray], refined: int,
            keep_first: bool = False) -> tuple[np.ndarray, float]:
    """Nelder-Mead from each of the `refined` best of `points` (a start and its survey), the
    first of them among those whatever its loss where `keep_first`."""
    from scipy.optimize import minimize

    losses = [objective(x) for x in points]
    order = np.argsort(losses, kind="stable").tolist()
    if keep_first:
        order = [0, *(k for k in order if k != 0)]
    best_x, best_loss = points[0], math.inf
    for k in order[:refined]:
        x, loss = points[k], losses[k]
        # Simplexes a factor of 1.5, then 1.1, then 1.02 wide: Nelder-Mead collapses early
        # on a rugged loss, and a fresh, narrower simplex from its answer goes on.
        for width in SIMPLEX_WIDTHS:
            simplex = np.vstack([x, x + math.log(width) * np.eye(len(x))])
            result = minimize(objective, x, method="Nelder-Mead",
                              options={"initial_simplex": simplex, "xatol": XATOL,
                                       "fatol": FATOL, "maxfev": MAX_EVALUATIONS})
            if result.fun <= loss:
                x, loss = result.x, float(result.fun)
        if loss < best_loss:
            best_x, best_loss = x, loss
    return best_x, best_loss


def scored_error(scenario: Scenario, log: ServingLog, system: str, base_dir: Path | None) -> float:
    """The headline error of a replay, over the requests after the warm-up (as `fidelity`)."""
    simulated = simulate(scenario, log, system, base_dir)
    return headline_error(compare(*after_warmup(log.real, simulated, scenario.warmup_s)))


def leave_one_out(scenario: Scenario, logs: list[ServingLog], system: str, result: Fit,
                  parameters: tuple[str, ...], base_dir: Path | None = None,
                  prior_weight: PriorWeight = 0.0) -> None:
    """Fit on all logs but one, score the one; fills `result.left_out_*` in place. Under
    `AUTO` each fit takes its own weight, from its own logs.

    Each fit starts where a fit of those logs alone would, from the scenario's values, not
    from `result` (the fit on all logs, the held-out one among them): started there, a
    left-out fit on three test logs came back 13% off the fit that never saw the fourth."""
    for k, held in enumerate(logs):
        others = logs[:k] + logs[k + 1:]
        partial = fit_under(scenario, others, system, parameters, base_dir, prior_weight)
        result.left_out_parameters[held.name] = partial.parameters
        if partial.prior is not None:  # under AUTO each fold's own weight
            result.left_out_prior_weights[held.name] = partial.prior.weight
        result.left_out_errors[held.name] = scored_error(
            with_cost(scenario, partial.parameters, system), held, system, base_dir)


# A fitted error no engine of the right kind leaves: more than twice the worst of the shipped
# fits (21.5% on vllm-300-3; DistServe's 1.9 to 4.8%). A paged vLLM log fitted with a
# request-level system came back 100% off.
POOR_FIT_ERROR = 0.5


def poor_fit(result: Fit, system: str) -> str | None:
    """A line saying the fit is poor where a log's fitted error exceeds `POOR_FIT_ERROR`: a
    scenario of another engine than the logs' fits them badly whatever its coefficients."""
    poor = {name: error for name, error in result.fitted_errors.items() if error > POOR_FIT_ERROR}
    if not poor:
        return None
    worst = max(poor, key=poor.__getitem__)
    return (f"the fit is poor: its median |error| is {poor[worst]:.0%} on {worst}"
            f"{f' and {len(poor) - 1} other logs' if len(poor) > 1 else ''} (more than "
            f"{POOR_FIT_ERROR:.0%}); check that the scenario's system {system} (its scheduler, "
            "model, hardware and parallelism) is the engine that produced the logs")


# Left-out fits more than this factor apart (or from the fit on all logs) leave a term's value
# undetermined. The shipped vLLM runs' per-iteration term, refitted from the defaults without
# each run in turn, ranged from 0.91 to 4.84 ms: it trades off with the per-request term.
SPREAD_FACTOR = 2.0


def spread_terms(result: Fit) -> list[str]:
    """A line for each fitted term whose left-out fits (`leave_one_out`) range more than
    `SPREAD_FACTOR` apart, the fit on all logs included: the logs fix what the terms predict
    together, not that term's value. Empty without left-out fits."""
    said = []
    for name, value in result.parameters.items():
        left_out = [params[name] for params in result.left_out_parameters.values()
                    if name in params]
        if not left_out:
            continue
        low, high = min(value, *left_out), max(value, *left_out)
        if high > 0 and (low <= 0 or high / low > SPREAD_FACTOR):
            # Fitted alone it trades off with nothing: the search found other dips of a flat
            # or rugged loss (per_iteration_s alone on 40 vLLM requests: 0.034 ms, and 0.7 us
            # with one AIPerf record failed, at about the same loss over 0 to 0.5 ms).
            why = ("the loss over it is flat or rugged near these logs, so trust what the fit "
                   "predicts near them, not its value (add logs of other loads)"
                   if len(result.parameters) == 1 else
                   "it trades off with the other terms, so trust what the fit predicts near "
                   "these logs, not this term's value alone (fit fewer terms with --fit, or add "
                   "logs of other loads)")
            said.append(
                f"{name} is not pinned down by these logs: {value:.3g} fitted on all of them, "
                f"{min(left_out):.3g} to {max(left_out):.3g} with one left out (more than "
                f"{SPREAD_FACTOR:g}x apart); {why}")
    return said


def recorded_path(path: Path) -> str:
    """A log's path as the record keeps it: one of orcasim's shipped data by its name there
    (found from anywhere; the committed record held this machine's /work/main/... paths, a
    tester's note), any other as given."""
    try:
        return Path(path).resolve().relative_to(PACKAGE_DATA_DIR.resolve()).as_posix()
    except ValueError:
        return str(path)


def report(scenario: Scenario, logs: list[ServingLog], system: str, result: Fit,
           overrides: Sequence[str] = ()) -> dict[str, Any]:
    """What `--out` records beside the cost block: the fit and its errors, and the `--set`
    overrides it ran under (the errors are the scenario's with them: loaded back without
    them, a fit under a smaller max_num_seqs read 11% where it reported 220%)."""
    return {
        "scenario": scenario.name, "system": system, "logs": [recorded_path(log.path) for log in logs],
        **({"set": list(overrides)} if overrides else {}),
        "metrics": [m for m in METRICS if any(m in fitted_metrics(log.real) for log in logs)],
        "fit_percentiles": list(FIT_PERCENTILES), "loss": result.loss,
        "evaluations": result.evaluations,
        **({"prior": {"weight": result.prior.weight, "chosen": result.prior.chosen,
                      "centre": result.prior.centre, "penalty": result.prior_penalty}}
           if result.prior is not None else {}),
        "parameters": result.parameters,
        "error_fitted": result.fitted_errors,
        "error_left_out": result.left_out_errors,
        "parameters_left_out": result.left_out_parameters,
        **({"prior_weight_left_out": result.left_out_prior_weights}
           if result.left_out_prior_weights else {}),
    }


def write_calibrated(path: Path, scenario: Scenario, logs: list[ServingLog], system: str,
                     result: Fit, overrides: Sequence[str] = (), force: bool = False) -> None:
    """The calibrated cost block (`cost: {kind: fitted, path: ...}` loads it) and its report."""
    import yaml

    from orcasim.results import write_file_atomically

    fitted = with_cost(scenario, result.parameters, system)
    system_cfg = next(s for s in fitted.systems if s.name == system)
    # Its data paths (a profile's) as a scenario's copy writes them: found from any folder,
    # not only from the scenario's (a tester's finding).
    cost = portable_dump(fitted.system_cost(system_cfg), scenario.source_dir)
    doc: dict[str, Any] = {"format": CALIBRATED_FORMAT, "cost": cost,
           "calibration": report(scenario, logs, system, result, overrides)}
    elsewhere = own_cost_blocks(scenario, system)
    if elsewhere:  # the fit set them there too; one cost block cannot carry them
        doc["calibration"]["also_set_in"] = elsewhere
        warnings.warn(f"the fit set {', '.join(result.parameters)} in {', '.join(elsewhere)} too, "
                      f"which {path.name} (one cost block) does not hold: give them the same "
                      "values to reproduce the fit", UserWarning, stacklevel=2)
    text = yaml.safe_dump(doc, sort_keys=False)
    write_file_atomically(path, lambda tmp: tmp.write_text(text), replace=force)
