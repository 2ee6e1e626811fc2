"""The linear cost model: a fixed cost, a cost per processed token, a cost per KV token read."""

from __future__ import annotations

from typing import Literal, Self

import numpy as np
from pydantic import NonNegativeFloat, model_validator

from orcasim.config import ScenarioError
from orcasim.cost.base import MIN_ITERATION_S, Batch, CostModel, DecodeLine
from orcasim.cost.overhead import CostConfigBase


class LinearCostConfig(CostConfigBase):
    """time = base_s + per_token_s * Σ query tokens + per_context_token_s * Σ context tokens."""

    kind: Literal["linear"]
    base_s: NonNegativeFloat
    per_token_s: NonNegativeFloat = 0.0
    per_context_token_s: NonNegativeFloat = 0.0

    @model_validator(mode="after")
    def _takes_time(self) -> Self:
        # Every iteration computes at least one token, so it takes base_s + per_token_s at
        # least. Below a nanosecond (no GPU step is that fast) time barely moves: at t = 1e6 s
        # a float cannot tell 1e-10 s apart, and the clock would stand still.
        shortest_s = self.base_s + self.per_token_s
        if shortest_s < MIN_ITERATION_S:
            raise ScenarioError(
                f"base_s + per_token_s = {shortest_s:g} s: the shortest iteration would take "
                f"{'no time' if shortest_s == 0 else 'under a nanosecond'}; expected "
                f">= {MIN_ITERATION_S:g} s (times are in seconds)")
        return self


class LinearCost(CostModel):
    def __init__(self, cfg: LinearCostConfig) -> None:
        self.base_s = cfg.base_s
        self.per_token_s = cfg.per_token_s
        self.per_context_token_s = cfg.per_context_token_s

    def iteration_time_s(self, batch: Batch) -> float:
        return (
            self.base_s
            + self.per_token_s * batch.total_query_tokens
            + self.per_context_token_s * batch.total_context_tokens
        )

    def decode_steps_s(self, context_tokens: np.ndarray, num_steps: int) -> np.ndarray:
        size = len(context_tokens)
        # Each step adds one context token per request: an arithmetic series. Summing the
        # integer context first and adding in iteration_time_s's order keeps it bit-exact.
        first = sum(context_tokens.tolist())  # builtin: cheaper at batch sizes
        # Integer-valued floats (exact below 2**53), so this is iteration_time_s's arithmetic.
        context = np.arange(first, first + size * num_steps, size, dtype=np.float64) if size else (
            np.full(num_steps, float(first))
        )
        context *= self.per_context_token_s
        context += self.base_s + self.per_token_s * size
        return context

    def decode_line(self, size: int, context_total: int) -> DecodeLine | None:
        if size == 0:
            return None
        # decode_steps_s: float(context_total + size * k) * per_context + (base + per_token * size)
        fixed_s = self.base_s + self.per_token_s * size
        return DecodeLine(fixed_s, context_total, size, self.per_context_token_s)
