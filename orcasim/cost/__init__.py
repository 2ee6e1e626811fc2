"""Cost models: the time of one iteration for a batch (see `orcasim.cost.base.Batch`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from orcasim.cost.base import Batch, CostModel
from orcasim.cost.fitted import FittedCostConfig, build_fitted_cost
from orcasim.cost.linear import LinearCost, LinearCostConfig

CostConfig = Annotated[
    LinearCostConfig
    | FittedCostConfig,
    Field(discriminator="kind"),
]


def build_cost_model(cfg: CostConfig) -> CostModel:
    """Explicit factory: one line per cost kind."""
    match cfg:
        case LinearCostConfig():
            return LinearCost(cfg)
        case FittedCostConfig():
            return build_fitted_cost(cfg)
    raise AssertionError(f"unhandled cost config {cfg!r}")


__all__ = ["Batch", "CostConfig", "CostModel", "build_cost_model"]
