"""The fitter recovers known coefficients from noise-free timings, independent of hardware."""

from __future__ import annotations

import numpy as np
import pandas as pd

from calibrate.fit import fit_profile, wls
from orcasim.cost.fitted import batch_inputs, term_names

RECOVERY_RTOL = 1e-6
KNOTS = [64, 256]
TRUE_S = dict(zip(term_names(KNOTS), [3e-4, 2e-5, 1.5e-4, 4e-8, 2e-9, 1e-5, -6e-6], strict=True))


def synthetic_rows(rng: np.random.Generator, n: int = 300) -> pd.DataFrame:
    """Random decode, prefill and mixed batches, timed exactly by TRUE_S."""
    rows = []
    for _ in range(n):
        b = int(rng.integers(1, 24))
        query = np.ones(b, dtype=np.int64)
        context = rng.integers(8, 1024, b)
        if rng.random() < 0.5:
            p = int(rng.integers(2, 700))
            query, context = np.append(query, p), np.append(context, p + int(rng.integers(0, 2)) * 64)
        rows.append(batch_inputs(query, context))
    frame = pd.DataFrame(rows)
    x = np.column_stack([np.ones(len(frame))] + [frame[t] for t in ("tokens", "num_requests",
                        "sum_context_decode", "sum_prefill_sq")]
                        + [np.maximum(0, frame["tokens"] - k) for k in KNOTS])
    frame["time_s"] = x @ np.array(list(TRUE_S.values()))
    return frame


def test_noise_free_recovery() -> None:
    doc = fit_profile(synthetic_rows(np.random.default_rng(1)), KNOTS)
    got = doc["coefficients_s"]
    for name, true in TRUE_S.items():
        assert abs(got[name] - true) <= RECOVERY_RTOL * abs(true), (name, got[name], true)


def test_noise_free_quality_is_perfect() -> None:
    q = fit_profile(synthetic_rows(np.random.default_rng(2)), KNOTS)["quality"]
    assert q["heldout_r2"] > 1 - 1e-9
    assert q["p90_rel_error"] < RECOVERY_RTOL


def test_range_covers_rows() -> None:
    rows = synthetic_rows(np.random.default_rng(3), n=50)
    rng_ = fit_profile(rows, KNOTS)["range"]
    assert rng_["tokens"] == [float(rows["tokens"].min()), float(rows["tokens"].max())]
    assert rng_["max_context"][1] == float(rows["max_context"].max())


def test_wls_minimises_relative_error() -> None:
    # y = 2x, except one large outlier in absolute terms only: relative weights ignore scale.
    x = np.column_stack([np.arange(1.0, 6.0)])
    y = 2.0 * x[:, 0]
    assert np.allclose(wls(x, y), [2.0])
    y_scaled = y * np.array([1, 1, 1, 1, 1.1])  # 10% off on the largest point
    beta = wls(x, y_scaled)[0]
    assert 2.0 < beta < 2.0 * 1.1 / 5 + 2.0  # pulled by a fifth of the 10%, not by its size
