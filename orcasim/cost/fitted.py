"""The `fitted` cost kind: iteration time from a model fitted to measured iterations.

`cost: {kind: fitted, path: calibrate/cost_models/cpu-tiny.yaml}` loads a file written by
`python -m calibrate fit`. Its terms are those of Orca's selective batching (section 4.2):
token-wise operators scale with the flattened token count, attention with each request's
own context. For a batch with query tokens q_i and context tokens c_i:

    tokens             = Σ q_i
    num_requests       = B                       (one attention call per request)
    sum_context_decode = Σ c_i over q_i == 1      (decode attention reads the KV cache)
    sum_prefill_sq     = Σ q_i·c_i over q_i > 1   (prompt attention; Σ prompt² for whole prompts)
    tokens_over_K      = max(0, tokens − K)       (piecewise-linear in tokens, one per knot K)

    time_s = coefficients · [1, tokens, num_requests, sum_context_decode, sum_prefill_sq, ...]

A `.json` path instead loads DistServe's profile family (see `orcasim.cost.distserve`).
Outside the fitted range the model still answers (there is nothing better to say) but it
counts the evaluation and warns once per instance: it never extrapolates silently.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
)

from orcasim import yaml_strict
from orcasim.config import ScenarioError, format_validation_error, refuse_booleans
from orcasim.cost.base import (
    Batch,
    CostModel,
    OutOfRangeCounter,
    OutsideSteps,
    check_durations,
    counted_decode_steps_s,
    runnable_steps,
)
from orcasim.cost.catalog import is_model
from orcasim.cost.distserve import DistServeCost
from orcasim.cost.overhead import CostConfigBase
from orcasim.paths import DataPath, read_once, read_problem, resolve_data_path

FORMAT = "orcasim-fitted-cost/v1"
CALIBRATED_FORMAT = "orcasim-calibrated-cost/v1"  # a whole cost block (python -m calibrate logs)
BASE_TERMS = ("const", "tokens", "num_requests", "sum_context_decode", "sum_prefill_sq")
RANGE_INPUTS = ("tokens", "num_requests", "sum_context_decode", "sum_prefill_sq", "max_context")


class FittedCostConfig(CostConfigBase):
    """A fitted cost file. `model` and `tensor_parallel` pick an entry of a DistServe JSON."""

    kind: Literal["fitted"]
    path: DataPath
    model: str | None = None
    tensor_parallel: PositiveInt | None = None


def hinge_name(knot_tokens: int) -> str:
    return f"tokens_over_{knot_tokens}"


def term_names(knots_tokens: list[int]) -> list[str]:
    return [*BASE_TERMS, *(hinge_name(k) for k in knots_tokens)]


def batch_inputs(query_tokens: np.ndarray, context_tokens: np.ndarray) -> dict[str, float]:
    """The fitted model's inputs for one batch (see the module docstring)."""
    decode = query_tokens == 1
    return {
        "tokens": float(query_tokens.sum()),
        "num_requests": float(len(query_tokens)),
        "sum_context_decode": float(context_tokens[decode].sum()),
        "sum_prefill_sq": float((query_tokens[~decode] * context_tokens[~decode]).sum()),
        "max_context": float(context_tokens.max()) if len(context_tokens) else 0.0,
    }


def design_matrix(inputs: dict[str, np.ndarray], knots_tokens: list[int]) -> np.ndarray:
    """Rows of term values (n, len(term_names)) from arrays of inputs, for fitting and predicting."""
    tokens = np.asarray(inputs["tokens"], dtype=np.float64)
    cols = [np.ones_like(tokens)] + [np.asarray(inputs[t], dtype=np.float64) for t in BASE_TERMS[1:]]
    cols += [np.maximum(0.0, tokens - k) for k in knots_tokens]
    return np.column_stack(cols)


class FittedDoc(BaseModel):
    """What a fitter's YAML must hold (other keys, the fit's record, are kept as written)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    knots_tokens: list[NonNegativeInt] = []
    coefficients_s: dict[str, float]
    range: dict[str, tuple[float, float]]

    @field_validator("knots_tokens", "coefficients_s", "range", mode="before")
    @classmethod
    def _no_booleans(cls, value: Any) -> Any:
        return refuse_booleans(value)  # pydantic reads true as 1


class FittedCost(CostModel):
    """Linear in the terms above, loaded from the fitter's YAML."""

    def __init__(self, doc: dict[str, Any], source: str) -> None:
        try:
            fitted = FittedDoc.model_validate(doc)
        except ValidationError as e:
            raise ScenarioError(format_validation_error(e, source, doc)) from None
        self.knots_tokens = list(fitted.knots_tokens)
        coef = fitted.coefficients_s
        names = term_names(self.knots_tokens)
        missing = [n for n in names if n not in coef]
        if missing:
            raise ScenarioError(f"{source}: coefficients_s lacks {', '.join(missing)}")
        self.coef = np.array([coef[n] for n in names])
        self.range = dict(fitted.range)
        self.checked_source: str | None = source
        self._oor = OutOfRangeCounter(source)

    def iteration_time_s(self, batch: Batch) -> float:
        inputs = batch_inputs(batch.query_tokens, batch.context_tokens)
        outside = [k for k in RANGE_INPUTS if not self._inside(k, inputs[k])]
        if outside:
            self._oor.add(1, f"{outside[0]} = {inputs[outside[0]]:g}")
        row = design_matrix({k: np.array([v]) for k, v in inputs.items()}, self.knots_tokens)
        time_s = float(self._predict(row)[0])
        check_durations(time_s, self.checked_source, f"a batch of {len(batch.query_tokens)} requests")
        return time_s

    def _predict(self, rows: np.ndarray) -> np.ndarray:
        """rows @ coef, term by term in one order: a row's value never depends on how many
        rows are priced with it (a BLAS dot may sum in another order), so a decode run
        priced at once has the bits of its steps priced one by one."""
        total = rows[:, 0] * self.coef[0]
        for j in range(1, len(self.coef)):
            total = total + rows[:, j] * self.coef[j]
        return total

    def _inside(self, key: str, value: float) -> bool:
        low, high = self.range.get(key, (-np.inf, np.inf))
        return low <= value <= high

    def decode_steps_s(self, context_tokens: np.ndarray, num_steps: int) -> np.ndarray:
        return counted_decode_steps_s(self, context_tokens, num_steps)

    def decode_steps_outside(
        self, context_tokens: np.ndarray, num_steps: int
    ) -> tuple[np.ndarray, OutsideSteps]:
        # Step j has the same tokens and requests; Σ context grows by B·j, max context by j.
        # Each step is priced as `iteration_time_s` prices it (`_predict`): the same bits.
        size = len(context_tokens)
        steps = np.arange(num_steps)
        context_sums = context_tokens.sum() + size * steps
        # A decode step's prompt term is 0, which a fit that saw no pure-decode batch (its
        # sum_prefill_sq range starting above 0) counts in `iteration_time_s`: so here too.
        shape_fits = (self._inside("tokens", size) and self._inside("num_requests", size)
                      and self._inside("sum_prefill_sq", 0.0))
        fits = (np.full(num_steps, shape_fits)
                & self._inside_array("sum_context_decode", context_sums)
                & self._inside_array("max_context", context_tokens.max() + steps))
        inputs = {"tokens": np.full(num_steps, float(size)),
                  "num_requests": np.full(num_steps, float(size)),
                  "sum_context_decode": context_sums.astype(np.float64),
                  "sum_prefill_sq": np.zeros(num_steps)}
        times_s = runnable_steps(self._predict(design_matrix(inputs, self.knots_tokens)),
                                 self.checked_source)
        return times_s, OutsideSteps(~fits, {f"a decode step of {size} requests": ~fits})

    def count_outside(self, outside: OutsideSteps, num_steps: int) -> None:
        self._oor.add_steps(outside, num_steps)

    def _inside_array(self, key: str, values: np.ndarray) -> np.ndarray:
        low, high = self.range.get(key, (-np.inf, np.inf))
        return (values >= low) & (values <= high)

    def out_of_range_count(self) -> int:
        return self._oor.count


def read_fitted_yaml(path: Path) -> dict[str, Any]:
    try:
        doc = read_once(path, "fitted yaml", lambda: yaml_strict.load(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ScenarioError(f"cost.path = {str(path)!r}: cannot read a fitted cost model "
                            f"({read_problem(e)})") from None
    if not isinstance(doc, dict) or doc.get("format") not in (FORMAT, CALIBRATED_FORMAT):
        raise ScenarioError(f"cost.path = {str(path)!r}: expected a YAML file with format: "
                            f"{FORMAT} (python -m calibrate fit) or orcasim-calibrated-cost/v1 "
                            "(python -m calibrate logs)")
    return doc


def refuse_distserve_keys(cfg: FittedCostConfig) -> None:
    """`model` and `tensor_parallel` pick an entry of a DistServe .json; beside a YAML, refused."""
    if cfg.model is not None or cfg.tensor_parallel is not None:
        raise ScenarioError(
            f"cost.path = {cfg.path!r}: model and tensor_parallel apply only to a DistServe .json"
        )


def build_fitted_cost(cfg: FittedCostConfig, deployment: Any = None, hardware: Any = None) -> CostModel:
    """Load a fitter YAML, a cost calibrated from serving logs (`python -m calibrate logs`),
    or a DistServe JSON profile (which needs `model` and `tensor_parallel`). `hardware`:
    as `build_cost_model`'s, for a calibrated file's overhead."""
    try:
        path = resolve_data_path(cfg.path)
    except FileNotFoundError as e:
        raise ScenarioError(f"cost.path = {cfg.path!r}: {e}") from None
    if path.suffix == ".json":
        cost = DistServeCost.load(path, cfg.model, cfg.tensor_parallel)
        _warn_if_profiled_elsewhere(cfg, deployment, hardware)
        return cost
    refuse_distserve_keys(cfg)
    doc = read_fitted_yaml(path)
    # A calibrated file holds a whole cost block of any kind: `orcasim.cost` builds it.
    assert doc["format"] != CALIBRATED_FORMAT, f"{path} is a calibrated cost (orcasim.cost.calibrated)"
    provenance = doc.get("provenance")
    fitted_on = provenance.get("model") if isinstance(provenance, dict) else None
    partial = provenance.get("fitted_layers") if isinstance(provenance, dict) else None
    if partial is not None:  # `calibrate fit --target` of a profile of some layers
        warnings.warn(f"cost.path = {cfg.path!r}: {path.name} was fitted on the time of {partial}: "
                      "it prices those layers, not the whole model (as a calibrate replay with "
                      "--layers runs them; fit --target time_s for the whole model)",
                      UserWarning, stacklevel=2)
    if deployment is not None and isinstance(fitted_on, str) \
            and not is_model(fitted_on, deployment.model):
        # The fit prices its own model's iterations; the scenario's sets the KV capacity.
        warnings.warn(f"cost.path = {cfg.path!r}: {path.name} was fitted on model {fitted_on!r} "
                      f"(its provenance), but the deployment runs model "
                      f"{deployment.model.name!r}; its times are the fitted model's",
                      UserWarning, stacklevel=2)
    _warn_if_fitted_at_another_degree(cfg, path, provenance, deployment, hardware)
    return FittedCost(doc, path.name)


def _warn_if_fitted_at_another_degree(cfg: FittedCostConfig, path: Path, provenance: Any,
                                      deployment: Any, hardware: Any) -> None:
    """`python -m calibrate profile` times one device, so its fit prices TP 1 iterations (a
    profile may say otherwise in `tensor_parallel`); at another degree the times are still
    TP 1's, which a TP sweep read silently (a tester's finding). A fit without provenance
    (written by hand) says nothing of its degree and is not checked."""
    hw = deployment.hardware if deployment is not None else hardware
    if hw is None or not isinstance(provenance, dict) or "model" not in provenance:
        return
    profiled_tp = int(provenance.get("tensor_parallel", 1))
    if profiled_tp != hw.tensor_parallel:
        warnings.warn(f"cost.path = {cfg.path!r}: {path.name} was profiled at tensor_parallel "
                      f"{profiled_tp} (its provenance), but the deployment's "
                      f"hardware.tensor_parallel = {hw.tensor_parallel}; its times are those of "
                      f"tensor_parallel {profiled_tp}", UserWarning, stacklevel=3)


def _warn_if_profiled_elsewhere(cfg: FittedCostConfig, deployment: Any, hardware: Any) -> None:
    """A DistServe profile times its own model at its own TP degree, whatever the scenario's
    model and hardware say (which set the KV capacity): on another deployment, say so. A
    TP sweep of a DistServe scenario read the TP 1 profile's times at every degree, silently
    (a tester's finding); the hardware alone, without a model, is checked for its degree.
    A warning, not an error: a profile may stand in on purpose."""
    hw = deployment.hardware if deployment is not None else hardware
    if hw is None:
        return
    model, tp = (None if deployment is None else deployment.model.name), hw.tensor_parallel
    if cfg.model is not None and deployment is not None and not is_model(cfg.model, deployment.model):
        warnings.warn(f"cost.model = {cfg.model!r}: the DistServe profile prices that model's "
                      f"iterations, but the deployment runs model {model!r} (its KV capacity "
                      "and any transfer are that model's)", UserWarning, stacklevel=2)
    if cfg.tensor_parallel is not None and cfg.tensor_parallel != tp:
        derived = " (its KV capacity is that degree's)" if model is not None else ""
        warnings.warn(f"cost.tensor_parallel = {cfg.tensor_parallel}: the DistServe profile "
                      f"prices iterations at that degree, but the deployment's "
                      f"hardware.tensor_parallel = {tp}{derived}; "
                      "expected the same degree", UserWarning, stacklevel=2)
