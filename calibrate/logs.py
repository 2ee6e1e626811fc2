"""Calibrate a scenario's cost from serving logs, by simulating in the loop.

Users have per-request logs of their real server (arrival, prompt and output lengths,
TTFT, TPOT or E2E), not GPU profiles. `python -m calibrate logs RUN.csv ... --scenario
S.yaml --out cost.yaml` replays every log's arrivals and lengths through the scenario
(`orcasim.fidelity.replay_of`) and searches the named cost coefficients, by default the
engine's overhead (`overhead.per_iteration_s`, `overhead.per_sequence_s`,
`overhead.per_prefill_token_s`), for the smallest loss:

    loss = mean over logs, metrics and percentiles (10, 25, 50, 75, 90) of log(sim / real)^2

Coefficients are searched in log space (positive, scale-free) with Nelder-Mead from the
scenario's values (a coefficient at zero starts from `START_VALUES`). The search is
deterministic: the simulation is, and so is the simplex. Each log is also left out in
turn: fitted on the others, it is scored on its own (`headline_error`: the median |error|
over TTFT, TPOT and E2E at p50 and p90), which is the error to expect on a new run.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orcasim.config import ScenarioError
from orcasim.fidelity import METRICS, compare, headline_error, read_real_run, replay_of
from orcasim.run import run_scenario
from orcasim.scenario import Scenario, scenario_from_dict

DEFAULT_PARAMETERS = ("overhead.per_iteration_s", "overhead.per_sequence_s",
                      "overhead.per_prefill_token_s")
FORMAT = "orcasim-calibrated-cost/v1"
FIT_PERCENTILES = (10, 25, 50, 75, 90)
# Where a coefficient at zero starts: about Vidur's measured values, and a prompt token's
# share of an iteration's host work.
START_VALUES = {"overhead.per_iteration_s": 1e-3, "overhead.per_sequence_s": 1e-4,
                "overhead.per_prefill_token_s": 1e-6}
DEFAULT_START = 1e-3
XATOL = 1e-4  # in log-space: coefficients to 0.01%
FATOL = 1e-8
MAX_EVALUATIONS = 300  # per refinement
SURVEY_POINTS = 64
SURVEY_FACTOR = 10.0  # the survey spans start / 10 to start * 10 in every coefficient
SURVEY_SEED = 0
REFINED_POINTS = 2


@dataclass
class ServingLog:
    """One real run: the file the simulation replays, and what was measured."""

    path: Path
    real: pd.DataFrame
    fmt: str = "auto"

    @property
    def name(self) -> str:
        return self.path.stem


@dataclass
class Fit:
    """Fitted coefficients, the loss, and the errors on the logs fitted and left out."""

    parameters: dict[str, float]
    loss: float
    evaluations: int
    fitted_errors: dict[str, float] = field(default_factory=dict)
    left_out_errors: dict[str, float] = field(default_factory=dict)
    left_out_parameters: dict[str, dict[str, float]] = field(default_factory=dict)


def read_logs(paths: list[Path], fmt: str = "auto") -> list[ServingLog]:
    return [ServingLog(Path(p), read_real_run(Path(p), fmt), fmt) for p in paths]


def with_cost(scenario: Scenario, values: dict[str, float]) -> Scenario:
    """`scenario` whose cost (and every system's own cost) has `values` at their dotted paths."""
    data = scenario.model_dump(mode="json", exclude_none=True)
    for cost in _cost_blocks(data):
        for dotted, value in values.items():
            _set(cost, dotted, value)
    return scenario_from_dict(data, f"{scenario.name} (calibrating)")


def _cost_blocks(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [data["cost"], *(s["cost"] for s in data["systems"] if "cost" in s)]


def _set(node: dict[str, Any], dotted: str, value: float) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value


def current_values(scenario: Scenario, parameters: tuple[str, ...]) -> dict[str, float]:
    """The scenario cost's values of `parameters` (an absent overhead has its defaults)."""
    data = scenario.model_dump(mode="json", exclude_none=True)["cost"]
    if any(p.startswith("overhead.") for p in parameters) and "overhead" not in data:
        from orcasim.cost.overhead import OverheadConfig

        data["overhead"] = OverheadConfig().model_dump()
    values = {}
    for dotted in parameters:
        node: Any = data
        for key in dotted.split("."):
            if not isinstance(node, dict) or key not in node:
                raise ScenarioError(f"--fit {dotted}: not a field of the scenario's cost "
                                    f"(kind {data['kind']})")
            node = node[key]
        values[dotted] = float(node)
    return values


def simulate(scenario: Scenario, log: ServingLog, system: str, base_dir: Path | None) -> pd.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rejections and extrapolation: counted, not shouted
        result = run_scenario(replay_of(scenario, log.path, log.fmt), base_dir=base_dir)
    return result.systems[system].requests


def log_errors(simulated: pd.DataFrame, real: pd.DataFrame) -> np.ndarray:
    """log(sim / real) at the fit's percentiles of every metric the log measured."""
    table = compare(real, simulated, FIT_PERCENTILES)
    ratio = (table["simulated"] / table["real"]).to_numpy()
    return np.log(np.clip(ratio, 1e-9, None))


class Objective:
    """The loss of a coefficient vector (in log space), over a set of logs."""

    def __init__(self, scenario: Scenario, logs: list[ServingLog], system: str,
                 parameters: tuple[str, ...], base_dir: Path | None) -> None:
        self.scenario, self.logs, self.system = scenario, logs, system
        self.parameters, self.base_dir = parameters, base_dir
        self.evaluations = 0

    def values(self, x: np.ndarray) -> dict[str, float]:
        return dict(zip(self.parameters, np.exp(x).tolist(), strict=True))

    def __call__(self, x: np.ndarray) -> float:
        self.evaluations += 1
        try:
            scenario = with_cost(self.scenario, self.values(x))
        except ScenarioError:
            return math.inf  # outside a coefficient's valid range (an efficiency above 1)
        errors = [log_errors(simulate(scenario, log, self.system, self.base_dir), log.real)
                  for log in self.logs]
        return float(np.mean(np.concatenate(errors) ** 2))


def fit(scenario: Scenario, logs: list[ServingLog], system: str,
        parameters: tuple[str, ...] = DEFAULT_PARAMETERS, base_dir: Path | None = None,
        start: dict[str, float] | None = None, survey_points: int = SURVEY_POINTS) -> Fit:
    """A survey of the box around the start, then Nelder-Mead from its best points.

    A simulation's loss is rugged at fine scale (an iteration more or less moves a
    request's timestamps by a step), so a local search alone stops in whatever dip is
    nearest: a scrambled Sobol survey (seeded: deterministic) of `survey_points` points,
    a factor of `SURVEY_FACTOR` either side of the start, picks where to refine.
    """
    from scipy.optimize import minimize
    from scipy.stats import qmc

    start = start or current_values(scenario, parameters)
    x0 = np.log([start[p] if start[p] > 0 else START_VALUES.get(p, DEFAULT_START)
                 for p in parameters])
    objective = Objective(scenario, logs, system, parameters, base_dir)
    points = [x0]
    if survey_points:
        unit = qmc.Sobol(len(x0), seed=SURVEY_SEED).random(survey_points)
        points += list(x0 + np.log(SURVEY_FACTOR) * (2.0 * unit - 1.0))
    losses = [objective(x) for x in points]
    best = None
    for k in np.argsort(losses, kind="stable")[:REFINED_POINTS]:
        # A first simplex a factor of 2 wide: about the survey's spacing.
        simplex = np.vstack([points[k], points[k] + np.log(2.0) * np.eye(len(x0))])
        result = minimize(objective, points[k], method="Nelder-Mead",
                          options={"initial_simplex": simplex, "xatol": XATOL, "fatol": FATOL,
                                   "maxfev": MAX_EVALUATIONS})
        if best is None or result.fun < best.fun:
            best = result
    assert best is not None
    values = objective.values(best.x)
    fitted = with_cost(scenario, values)
    errors = {log.name: scored_error(fitted, log, system, base_dir) for log in logs}
    return Fit(values, float(best.fun), objective.evaluations, errors)


def scored_error(scenario: Scenario, log: ServingLog, system: str, base_dir: Path | None) -> float:
    return headline_error(compare(log.real, simulate(scenario, log, system, base_dir)))


def leave_one_out(scenario: Scenario, logs: list[ServingLog], system: str, result: Fit,
                  parameters: tuple[str, ...], base_dir: Path | None = None) -> None:
    """Fit on all logs but one, score the one; fills `result.left_out_*` in place."""
    for k, held in enumerate(logs):
        others = logs[:k] + logs[k + 1:]
        partial = fit(scenario, others, system, parameters, base_dir, start=result.parameters)
        result.left_out_parameters[held.name] = partial.parameters
        result.left_out_errors[held.name] = scored_error(
            with_cost(scenario, partial.parameters), held, system, base_dir)


def report(scenario: Scenario, logs: list[ServingLog], system: str, result: Fit) -> dict[str, Any]:
    """What `--out` records beside the cost block: the fit and its errors."""
    return {
        "scenario": scenario.name, "system": system, "logs": [str(log.path) for log in logs],
        "metrics": [m for m in METRICS if any(log.real[m].notna().any() for log in logs)],
        "fit_percentiles": list(FIT_PERCENTILES), "loss": result.loss,
        "evaluations": result.evaluations, "parameters": result.parameters,
        "error_fitted": result.fitted_errors,
        "error_left_out": result.left_out_errors,
        "parameters_left_out": result.left_out_parameters,
    }


def write_calibrated(path: Path, scenario: Scenario, logs: list[ServingLog], system: str,
                     result: Fit) -> None:
    """The calibrated cost block (`cost: {kind: fitted, path: ...}` loads it) and its report."""
    import yaml

    from orcasim.results import write_file_atomically

    fitted = with_cost(scenario, result.parameters)
    system_cfg = next(s for s in fitted.systems if s.name == system)
    cost = fitted.system_cost(system_cfg).model_dump(mode="json", exclude_none=True)
    doc = {"format": FORMAT, "cost": cost,
           "calibration": report(scenario, logs, system, result)}
    text = yaml.safe_dump(doc, sort_keys=False)
    write_file_atomically(path, lambda tmp: tmp.write_text(text))
