"""DistServe's per-iteration latency profiles (Zhong et al., OSDI 2024; LLMServe/DistServe).

The JSON maps model -> tensor-parallel degree -> coefficients in milliseconds, fitted on
an A100-80GB. DistServe's simulator (`simdistserve/estimators/time_estimator.py`) uses

    prefill_ms = a + b·Σ len + c·Σ len²                 (`prefill`)
    decode_ms  = a + b·Σ context_tokens + c·batch_size  (`decoding_smallbs` when
                 batch_size < decoding_large_small_bs_threshold, else `decoding_largebs`)

DistServe never mixes phases in one iteration; Orca does. Here a mixed iteration is one
forward pass, so it pays the prefill formula for its prompts (or chunks: Σ q·c stands for
Σ len²) plus only the marginal decode terms (b·Σ context + c·batch) of its decode
requests. That rule is orcasim's assumption, not DistServe's.

DistServe's estimator divides by the pipeline degree and, for prefill, adds a constant
marked TODO there; orcasim models one pipeline stage and leaves that constant out.

The range check: the batch's KV tokens must fit the GPU's KV capacity that DistServe
reports (`max_num_tokens.csv`, pipeline degree 1); beyond it the profile says nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import (
    BaseModel,
    ConfigDict,
    FiniteFloat,
    NonNegativeInt,
    ValidationError,
    model_validator,
)

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
from orcasim.paths import read_json

MS = 1e-3


Coefficients = tuple[FiniteFloat, FiniteFloat, FiniteFloat]


class DistServeEntry(BaseModel):
    """One model and TP degree of the profile: three coefficients a phase, and the decode
    batch size from which the large-batch ones apply."""

    model_config = ConfigDict(extra="ignore")
    prefill: Coefficients
    decoding_smallbs: Coefficients
    decoding_largebs: Coefficients
    decoding_large_small_bs_threshold: NonNegativeInt

    @model_validator(mode="before")
    @classmethod
    def _no_booleans(cls, data: Any) -> Any:
        return refuse_booleans(data)  # pydantic reads true as 1: 1 ms, silently


def _read_profiles(path: Path) -> dict[str, dict[str, Any]]:
    """The profile file as {model: {tp: entry}}, or one line saying why it is not one."""
    where = f"cost.path = {path.name!r}"
    try:
        doc = read_json(path)
    except OSError as e:
        raise ScenarioError(f"{where}: cannot read ({e.strerror})") from None
    except ScenarioError as e:  # not JSON, or not UTF-8: the reader's line, under the key
        raise ScenarioError(f"{where}: {e}") from None
    if not (isinstance(doc, dict) and doc and all(isinstance(v, dict) for v in doc.values())):
        raise ScenarioError(f"{where}: expected DistServe's profile JSON, a mapping of model "
                            "names to tensor-parallel degrees to coefficients")
    return doc


class DistServeCost(CostModel):
    def __init__(self, entry: dict, kv_capacity_tokens: float, source: str) -> None:
        self.prefill_ms = np.array(entry["prefill"], dtype=np.float64)
        self.small_ms = np.array(entry["decoding_smallbs"], dtype=np.float64)
        self.large_ms = np.array(entry["decoding_largebs"], dtype=np.float64)
        self.threshold = int(entry["decoding_large_small_bs_threshold"])
        self.kv_capacity_tokens = kv_capacity_tokens
        self.checked_source: str | None = source
        self._oor = OutOfRangeCounter(source)

    @classmethod
    def load(cls, path: Path, model: str | None, tensor_parallel: int | None) -> DistServeCost:
        where = f"cost.path = {path.name!r}"
        if model is None or tensor_parallel is None:
            raise ScenarioError(f"{where}: a DistServe profile needs cost.model and cost.tensor_parallel")
        doc = _read_profiles(path)
        key = model if model in doc else f"facebook/{model}"
        if key not in doc:
            raise ScenarioError(f"cost.model = {model!r}: expected one of {', '.join(doc)}")
        if str(tensor_parallel) not in doc[key]:
            raise ScenarioError(
                f"cost.tensor_parallel = {tensor_parallel}: {key} was profiled at "
                f"{', '.join(doc[key])}"
            )
        source = f"{path.name}[{key}, tp={tensor_parallel}]"
        entry = doc[key][str(tensor_parallel)]
        try:
            checked = DistServeEntry.model_validate(entry).model_dump()
        except ValidationError as e:
            raise ScenarioError(format_validation_error(e, f"{where}: {key}: {tensor_parallel}",
                                                        entry)) from None
        capacity = _kv_capacity_tokens(path.parent / "max_num_tokens.csv", key, tensor_parallel)
        return cls(checked, capacity, source)

    def _decode_coef(self, batch_size: int) -> np.ndarray:
        return self.small_ms if batch_size < self.threshold else self.large_ms

    def iteration_time_s(self, batch: Batch) -> float:
        q, c = batch.query_tokens, batch.context_tokens
        if c.sum() > self.kv_capacity_tokens:
            self._oor.add(1, f"a batch reading {int(c.sum())} KV tokens")
        decode = q == 1
        n_decode = int(decode.sum())
        a_d, b_d, c_d = self._decode_coef(n_decode)
        decode_ms = b_d * c[decode].sum() + c_d * n_decode
        if n_decode == len(q):
            time_s = float(a_d + decode_ms) * MS
        else:
            a_p, b_p, c_p = self.prefill_ms
            prefill_ms = a_p + b_p * q[~decode].sum() + c_p * (q[~decode] * c[~decode]).sum()
            time_s = float(prefill_ms + decode_ms) * MS
        check_durations(time_s, self.checked_source, f"a batch of {len(q)} requests")
        return time_s

    def decode_steps_s(self, context_tokens: np.ndarray, num_steps: int) -> np.ndarray:
        return counted_decode_steps_s(self, context_tokens, num_steps)

    def decode_steps_outside(
        self, context_tokens: np.ndarray, num_steps: int
    ) -> tuple[np.ndarray, OutsideSteps]:
        # Step j reads sum(context) + size * j KV tokens. Each step is priced with the
        # operations of `iteration_time_s`, in its order, so fast mode gets the same bits.
        size = len(context_tokens)
        context_sums = context_tokens.sum() + size * np.arange(num_steps, dtype=np.int64)
        over = context_sums > self.kv_capacity_tokens
        a_d, b_d, c_d = self._decode_coef(size)
        times_s = runnable_steps((a_d + (b_d * context_sums + c_d * size)) * MS, self.checked_source)
        return times_s, OutsideSteps(over, {f"a decode step of {size} requests": over})

    def count_outside(self, outside: OutsideSteps, num_steps: int) -> None:
        self._oor.add_steps(outside, num_steps)

    def out_of_range_count(self) -> int:
        return self._oor.count


def _kv_capacity_tokens(csv_path: Path, model: str, tensor_parallel: int) -> float:
    """DistServe's KV capacity for (model, TP, PP=1); infinite if the table lacks the entry."""
    if not csv_path.is_file():
        return float("inf")
    table = pd.read_csv(csv_path)
    row = table[(table["model"] == model) & (table["tp"] == tensor_parallel) & (table["pp"] == 1)]
    return float(row["max_num_tokens"].iloc[0]) if len(row) else float("inf")
