"""Cost models: the time of one iteration for a batch (see `orcasim.cost.base.Batch`)."""

from __future__ import annotations

from orcasim.config import ScenarioError
from orcasim.cost.base import Batch, CostModel
from orcasim.cost.calibrated import (
    calibrated_block,
    engine_overhead,
    one_overhead,
    request_latency_s,
)
from orcasim.cost.catalog import Deployment, HardwareConfig, stage_layers
from orcasim.cost.fitted import FittedCostConfig, build_fitted_cost
from orcasim.cost.kinds import CostConfig
from orcasim.cost.linear import LinearCost, LinearCostConfig
from orcasim.cost.overhead import OverheadConfig, OverheadCost
from orcasim.cost.profile import ProfileCost, ProfileCostConfig
from orcasim.cost.roofline import Roofline, RooflineCostConfig


def build_cost_model(cfg: CostConfig, deployment: Deployment | None = None,
                     hardware: HardwareConfig | None = None) -> CostModel:
    """The cost kind's model, with the engine's overhead on top when the config has one.
    `hardware`: the scenario's where it gives no model (else the deployment's), whose
    parallel degrees the overhead's multi-process term reads."""
    gpu = _gpu_cost_model(cfg, deployment, hardware)
    if cfg.overhead is None:
        return gpu
    # The overhead checks the floored GPU time (`OverheadCost.gpu_part_s`): the model it
    # wraps, built here for it alone, gives up its own check.
    checked, gpu.checked_source = gpu.checked_source, None
    if deployment is None:
        # No layers to launch without a model, but TP x DP processes all the same: read as
        # one GPU, a linear cost beside tensor_parallel 4 lost the 7 ms round trip.
        tp, dp = (1, 1) if hardware is None else (hardware.tensor_parallel,
                                                  hardware.data_parallel_attention)
        return OverheadCost(gpu, cfg.overhead, None, tp, dp, checked_source=checked)
    hw = deployment.hardware
    # An iteration's time spans every stage (one batch passes them in turn, each stage's
    # host launching its own layers), so its floor is every layer's launch: the sum of the
    # stages' own floors, which a pipelined engine applies stage by stage (stage_times_s).
    return OverheadCost(gpu, cfg.overhead, deployment.model.num_layers, hw.tensor_parallel,
                        hw.data_parallel_attention, checked_source=checked,
                        stage_layers=stage_layers(deployment.model, hw.pipeline_parallel))


def _gpu_cost_model(cfg: CostConfig, deployment: Deployment | None,
                    hardware: HardwareConfig | None) -> CostModel:
    """Explicit factory: one line per cost kind. Hardware-aware kinds need the deployment."""
    match cfg:
        case LinearCostConfig():
            return LinearCost(cfg)
        case RooflineCostConfig():
            return Roofline(cfg, _required(deployment, cfg.kind))
        case ProfileCostConfig():
            return ProfileCost(cfg, _required(deployment, cfg.kind))
        case FittedCostConfig():
            inner = calibrated_block(cfg)
            if inner is None:  # a profile fit or a DistServe profile
                return build_fitted_cost(cfg, deployment, hardware)
            one_overhead(cfg, inner)  # refuses an overhead given twice
            return build_cost_model(inner, deployment, hardware)
    raise AssertionError(f"unhandled cost config {cfg!r}")


def _required(deployment: Deployment | None, kind: str) -> Deployment:
    if deployment is None:
        raise ScenarioError(f"cost.kind = '{kind}' needs the scenario keys 'model' and 'hardware'")
    return deployment


__all__ = ["Batch", "CostConfig", "CostModel", "Deployment", "OverheadConfig",
           "build_cost_model", "engine_overhead", "request_latency_s"]
