"""Cost models: the time of one iteration for a batch (see `orcasim.cost.base.Batch`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from orcasim.config import ScenarioError
from orcasim.cost.base import Batch, CostModel
from orcasim.cost.catalog import Deployment
from orcasim.cost.fitted import FittedCostConfig, build_fitted_cost
from orcasim.cost.linear import LinearCost, LinearCostConfig
from orcasim.cost.profile import ProfileCost, ProfileCostConfig
from orcasim.cost.roofline import Roofline, RooflineCostConfig

CostConfig = Annotated[
    LinearCostConfig | RooflineCostConfig | ProfileCostConfig
    | FittedCostConfig,
    Field(discriminator="kind"),
]


def build_cost_model(cfg: CostConfig, deployment: Deployment | None = None) -> CostModel:
    """Explicit factory: one line per cost kind. Hardware-aware kinds need the deployment."""
    match cfg:
        case LinearCostConfig():
            return LinearCost(cfg)
        case RooflineCostConfig():
            return Roofline(cfg, _required(deployment, cfg.kind))
        case ProfileCostConfig():
            return ProfileCost(cfg, _required(deployment, cfg.kind))
        case FittedCostConfig():
            return build_fitted_cost(cfg)
    raise AssertionError(f"unhandled cost config {cfg!r}")


def _required(deployment: Deployment | None, kind: str) -> Deployment:
    if deployment is None:
        raise ScenarioError(f"cost.kind = '{kind}' needs the scenario keys 'model' and 'hardware'")
    return deployment


__all__ = ["Batch", "CostConfig", "CostModel", "Deployment", "build_cost_model"]
