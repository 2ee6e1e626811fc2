"""Recorder rows: a multi-iteration row's reservation is its time-weighted mean and max."""

from __future__ import annotations

import numpy as np
import pytest

from orcasim.recorder import FLOAT_COLUMNS, ITERATION_COLUMNS, Recorder

MEAN_RTOL = 1e-12


def test_a_row_whose_reservation_grows_holds_its_mean_and_max() -> None:
    rec = Recorder(0)
    # Steps of 1 s, 2 s and 1 s holding 10, 20 and 30 tokens.
    rec.run_row(0.0, [1.0, 3.0, 4.0], 2, 5, 10, 0, np.array([10, 20, 30, 40]))
    # A plan of 1 s holding 8, then steps of 3 s (8) and 1 s (16).
    rec.jump_row(4.0, [5.0, 8.0, 9.0], 2, 4, 4, 4, 2, 6, 8, 0,
                 step_reserved_tokens=np.array([8, 16]))
    row = rec.iterations_frame()
    assert row["kv_reserved_tokens"].tolist() == pytest.approx(
        [(10 + 20 * 2 + 30) / 4, (8 * 4 + 16) / 5], rel=MEAN_RTOL)
    assert row["kv_reserved_tokens_max"].tolist() == [30, 16]


def test_a_constant_reservation_is_kept_exactly() -> None:
    rec = Recorder(0)
    rec.run_row(0.0, [0.1, 0.3, 0.7], 1, 3, 48, 0, np.array([48, 48, 48]))
    rec.run_row(0.7, [0.8, 0.9], 1, 3, 48, 0)  # no per-step reservations: the constant
    rec.jump_row(0.9, [1.0], 1, 3, 3, 3, 1, 4, 32, 0, step_reserved_tokens=np.array([64]))
    rec.append_row(1.0, 0.5, 1, 1, 1, 4, 32, 0, 4.0, 0, 0)  # the short form: max = value
    row = rec.iterations_frame()
    assert row["kv_reserved_tokens"].tolist() == [48.0, 48.0, 32.0, 32.0]
    assert row["kv_reserved_tokens_max"].tolist() == [48, 48, 32, 32]


def test_reserved_mean_is_a_float_column_and_its_max_a_count() -> None:
    assert "kv_reserved_tokens" in FLOAT_COLUMNS
    assert "kv_reserved_tokens_max" in ITERATION_COLUMNS
    assert "kv_reserved_tokens_max" not in FLOAT_COLUMNS
    rec = Recorder(0)
    rec.run_row(0.0, [1.0, 2.0], 1, 3, 16, 0, np.array([16, 32]))
    frame = rec.iterations_frame()
    assert frame["kv_reserved_tokens"].dtype == np.float64
    assert frame["kv_reserved_tokens_max"].dtype == np.int64
