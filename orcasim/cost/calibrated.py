"""A cost calibrated from serving logs (`python -m calibrate logs`): a file holding a whole
cost block of any kind, its overhead included, loaded by `cost: {kind: fitted, path: ...}`.

Such a block may itself be a fitted cost that loads another file, so reading one needs the
union of every kind (`orcasim.cost.kinds`): this module sits above the kinds and below the
factory (`orcasim.cost.build_cost_model`), which builds the block it returns. The overhead a
cost runs with, and so a request's way in (`request_latency_s`), are read here too: a
calibrated file brings its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from orcasim.config import ScenarioError, format_validation_error
from orcasim.cost.fitted import (
    CALIBRATED_FORMAT,
    FittedCostConfig,
    read_fitted_yaml,
    refuse_distserve_keys,
)
from orcasim.cost.kinds import CostConfig
from orcasim.cost.overhead import OverheadConfig
from orcasim.paths import resolve_data_path

_COST_BLOCK: TypeAdapter[CostConfig] = TypeAdapter(CostConfig)


def calibrated_block(cfg: FittedCostConfig) -> CostConfig | None:
    """The cost block a log calibration wrote, where `cfg` loads such a file; None for any
    other fitted cost (a profile fit, a DistServe profile)."""
    if Path(cfg.path).suffix == ".json":
        return None
    refuse_distserve_keys(cfg)
    try:
        path = resolve_data_path(cfg.path)
    except FileNotFoundError as e:
        raise ScenarioError(f"cost.path = {cfg.path!r}: {e}") from None
    doc = read_fitted_yaml(path)
    if doc["format"] != CALIBRATED_FORMAT:
        return None
    block = _cost_block(doc, path)
    _check_chain(block, path)
    return block


def engine_overhead(cfg: CostConfig) -> OverheadConfig | None:
    """The overhead a cost runs with: its own block, or, for a calibrated cost, the file's
    (the way in, `request_latency_s`, included). One given beside the file's as well would
    add a second engine on top: refused."""
    if isinstance(cfg, FittedCostConfig):
        inner = calibrated_block(cfg)
        if inner is not None:
            return one_overhead(cfg, inner)
    return cfg.overhead


def one_overhead(cfg: FittedCostConfig, inner: CostConfig) -> OverheadConfig | None:
    """The overhead of `cfg`, which loads the calibrated block `inner`: the file's or the one
    beside its path, not both (a second engine on top of the file's is refused)."""
    own = engine_overhead(inner)
    if own is not None and cfg.overhead is not None:
        raise ScenarioError(
            f"cost.overhead: cost.path = {cfg.path!r} is a cost calibrated from serving logs "
            "that holds its own overhead, which this one would add to; expected the overhead "
            "in one place (edit the file's, or drop cost.overhead)")
    return own or cfg.overhead


def request_latency_s(cost_cfg: CostConfig) -> float:
    """How long after the client sent it a request reaches the engine (0 without overhead)."""
    overhead = engine_overhead(cost_cfg)
    return overhead.request_latency_s if overhead else 0.0


def _cost_block(doc: dict[str, Any], path: Path) -> CostConfig:
    """A calibrated file's `cost:` as a CostConfig, or a one-line error naming the file."""
    try:
        return _COST_BLOCK.validate_python(doc.get("cost"))
    except ValidationError as e:
        raise ScenarioError(format_validation_error(e, f"{path.name}: cost", doc.get("cost"))) from None


def _check_chain(cfg: CostConfig, path: Path) -> None:
    """A calibrated cost (at `path`, holding `cfg`) that loads itself, or calibrated files
    that load each other, are refused. The file's own path is compared, not its name: a
    profile fit named cost.yaml in another folder was refused as the file itself, and two
    files loading each other recursed to a traceback (a tester's findings)."""
    seen = [path.resolve()]
    while cfg.kind == "fitted" and Path(cfg.path).suffix != ".json":
        try:
            loaded = resolve_data_path(cfg.path).resolve()
        except FileNotFoundError:
            return  # said where the file is loaded
        if loaded in seen:
            chain = " -> ".join(str(p) for p in [*seen, loaded])
            what = "may not load itself" if len(seen) == 1 else f"loads itself through {chain}"
            raise ScenarioError(f"cost.path = {str(path)!r}: a calibrated cost {what}; expected "
                                "a chain of files that ends in a profile fit or a cost")
        seen.append(loaded)
        doc = read_fitted_yaml(loaded)
        if doc["format"] != CALIBRATED_FORMAT:
            return
        try:
            cfg = _cost_block(doc, loaded)
        except ScenarioError:
            return  # said where the file is loaded
