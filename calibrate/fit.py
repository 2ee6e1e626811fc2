"""The fitter: weighted least squares of iteration time on the terms of `orcasim.cost.fitted`.

Weights are 1/time², so the fit minimises relative error: a 1 ms decode step matters as
much as a 100 ms prefill. Columns are scaled to unit norm before solving (the terms span
ten orders of magnitude). Quality is measured out of sample: repeated random splits,
each fitting on 75% of the rows and predicting the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from orcasim.config import ScenarioError
from orcasim.cost.fitted import FORMAT, RANGE_INPUTS, design_matrix, term_names
from orcasim.results import write_file_atomically

DEFAULT_KNOTS_TOKENS = (64, 256)
SPLITS = 20
TEST_FRACTION = 0.25
R2_SPREAD = 1e-20  # held-out times spread less than this (relative, squared) have no R²


def _weighted(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The relative-error system (rows over y), its columns scaled to unit norm, and the scale."""
    w = 1.0 / y
    xw = x * w[:, None]
    scale = np.linalg.norm(xw, axis=0)
    scale[scale == 0] = 1.0
    return xw / scale, y * w, scale


def wls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients minimising Σ ((x·β − y) / y)²."""
    a, b, scale = _weighted(x, y)
    beta, *_ = np.linalg.lstsq(a, b, rcond=None)
    return beta / scale


def rows_to_fit(knots_tokens: list[int] | tuple[int, ...]) -> int:
    """The fewest profile rows a fit takes: one a coefficient, and two to hold out."""
    return len(term_names(list(knots_tokens))) + 2


def determined(x: np.ndarray, y: np.ndarray) -> int:
    """How many coefficients the rows tell apart: the rank of the relative-error system."""
    return int(np.linalg.matrix_rank(_weighted(x, y)[0]))


def check_determined(x: np.ndarray, y: np.ndarray, names: list[str]) -> None:
    """Refuse rows that cannot tell every coefficient apart (a rank-deficient design: all
    decodes, or a few distinct rows repeated): lstsq would still answer, one of many."""
    rank = determined(x, y)
    if rank < len(names):
        raise ScenarioError(f"the rows determine {rank} of the {len(names)} coefficients "
                            f"({', '.join(names)}); expected rows whose prompt tokens, decode "
                            "batch sizes and contexts vary apart, as python -m calibrate "
                            "profile's grid does")


def _check_knots(tokens: np.ndarray, knots_tokens: list[int]) -> None:
    """A knot that no row's tokens pass has a term of zeros, which no row determines: named
    (it read as rows whose prompts and batches do not vary apart; a tester's finding)."""
    most = int(tokens.max()) if len(tokens) else 0
    for knot in knots_tokens:
        if knot >= most:
            raise ScenarioError(f"knot {knot} tokens: no row has more tokens (the most is "
                                f"{most}); expected knots below the profile's largest batch")


def inputs_of(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    return {k: rows[k].to_numpy(dtype=np.float64) for k in RANGE_INPUTS}


@dataclass(frozen=True)
class Quality:
    heldout_r2: float
    median_rel_error: float
    p90_rel_error: float


def heldout_quality(x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> Quality:
    """Mean R² over the splits; relative errors pooled over all held-out predictions."""
    r2s, rel = [], []
    n_test = max(1, int(round(TEST_FRACTION * len(y))))
    for _ in range(SPLITS):
        perm = rng.permutation(len(y))
        test, train = perm[:n_test], perm[n_test:]
        pred = x[test] @ wls(x[train], y[train])
        resid = ((y[test] - pred) ** 2).sum()
        total = ((y[test] - y[test].mean()) ** 2).sum()
        # Equal times leave rounding in `total` (1e-36, not 0): R² says nothing there.
        spread = total > R2_SPREAD * (y[test] ** 2).sum()
        r2s.append(1.0 - resid / total if spread else np.nan)
        rel.append(np.abs(pred - y[test]) / y[test])
    errors = np.concatenate(rel)
    r2 = float(np.nanmean(r2s)) if not np.isnan(r2s).all() else float("nan")  # equal times: none
    return Quality(r2, float(np.median(errors)), float(np.percentile(errors, 90)))


def fit_profile(rows: pd.DataFrame, knots_tokens: list[int], seed: int = 0,
                target: str = "time_s") -> dict[str, Any]:
    """The fitted-cost document (without provenance) for profile rows."""
    inputs = inputs_of(rows)
    x = design_matrix(inputs, knots_tokens)
    y = rows[target].to_numpy(dtype=np.float64)
    # The terms without knots first: rows that cannot tell those apart are named as such,
    # then a knot past every row, then the whole design.
    check_determined(design_matrix(inputs, []), y, term_names([]))
    _check_knots(inputs["tokens"], knots_tokens)
    check_determined(x, y, term_names(knots_tokens))
    beta = wls(x, y)
    quality = heldout_quality(x, y, np.random.default_rng(seed))
    return {
        "format": FORMAT,
        "formula": "time_s = Σ coefficients_s[term] · term (terms: see orcasim.cost.fitted)",
        "knots_tokens": list(knots_tokens),
        "coefficients_s": {n: float(b) for n, b in zip(term_names(knots_tokens), beta, strict=True)},
        "range": {k: [float(v.min()), float(v.max())] for k, v in inputs.items()},
        "quality": {
            "heldout_r2": quality.heldout_r2,
            "median_rel_error": quality.median_rel_error,
            "p90_rel_error": quality.p90_rel_error,
            "splits": SPLITS,
            "test_fraction": TEST_FRACTION,
            "rows": len(y),
        },
    }


def write_cost_model(path: Path, doc: dict[str, Any], profile_path: Path,
                     header: dict[str, str], target: str, force: bool = False) -> None:
    """Add provenance and write the YAML atomically."""
    doc = {**doc, "provenance": {
        "profile": str(profile_path), "target_column": target, **header,
        "fitted_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }}
    text = ("# Written by `python -m calibrate fit`; loaded by `cost: {kind: fitted, path: ...}`.\n"
            + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    write_file_atomically(path, lambda tmp: tmp.write_text(text), replace=force)
