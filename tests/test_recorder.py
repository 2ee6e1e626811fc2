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


def test_multi_iteration_rows_by_hand() -> None:
    """A decode run of 2 requests from 10 context tokens over steps ending at 1, 3 and 6 s:
    step j reads 10 + 2j tokens, so 10 + 12 + 14 = 36 read, and holds them for its duration,
    10 x 1 + 12 x 2 + 14 x 3 = 76 token-seconds, a mean of 76 / 6 over the row. A jump: a
    plan of 3 requests (30 query, 40 context tokens, 100 KV in use) ending at 11 s, then 2
    steps of a 2-request run from 42 context tokens ending at 12 and 14 s."""
    from orcasim.recorder import _reserved_mean_max, _run_context, _used_s

    assert _run_context(10, 2, 3) == 36 and _run_context(10, 2, 1) == 10
    assert _run_context(7, 3, 4) == 4 * 7 + 3 * 6  # steps read 7, 10, 13, 16
    assert _used_s(10, 2, 0.0, [1.0, 3.0, 6.0]) == 76.0
    assert _used_s(10, 2, 0.0, np.array([1.0, 3.0, 6.0])) == 76.0  # an array gives the same
    assert _reserved_mean_max(0.0, [1.0, 3.0, 6.0], np.array([10, 20, 30])) == (140 / 6, 30)
    assert _reserved_mean_max(0.0, [0.5], np.array([4])) == (4.0, 4)  # constant: as is
    assert _reserved_mean_max(2.0, [2.0, 2.0], np.array([1, 9])) == (9.0, 9)  # no duration
    rec = Recorder(3)
    rec.run_row(0.0, [1.0, 3.0, 6.0], 2, 10, 64, 5)
    rec.jump_row(10.0, [11.0, 12.0, 14.0], 3, 30, 40, 100, 2, 42, 64, 6, preemptions=1,
                 recomputed_tokens=7)
    run, jump = rec.iterations_frame().to_dict("records")
    assert run == {"start_s": 0.0, "duration_s": 6.0, "num_iterations": 3, "batch_size": 2,
                   "tokens": 6, "context_tokens": 36, "kv_reserved_tokens": 64.0,
                   "num_waiting": 5, "kv_used_tokens": pytest.approx(76 / 6),
                   "preemptions": 0, "recomputed_tokens": 0, "kv_reserved_tokens_max": 64}
    # KV in use: 100 for the plan's second, then the run's 42 x 1 + 44 x 2 = 130 token-seconds.
    assert jump == {"start_s": 10.0, "duration_s": 4.0, "num_iterations": 3, "batch_size": 3,
                    "tokens": 30 + 2 * 2, "context_tokens": 40 + 42 + 44,
                    "kv_reserved_tokens": 64.0, "num_waiting": 6,
                    "kv_used_tokens": pytest.approx(230 / 4), "preemptions": 1,
                    "recomputed_tokens": 7, "kv_reserved_tokens_max": 64}
    one = Recorder(1)
    one.jump_row(0.0, [2.0], 1, 5, 5, 9, 1, 5, 16, 0)  # a plan alone: its KV in use as is
    assert one.iterations_frame()["kv_used_tokens"].tolist() == [9.0]
    still = Recorder(1)
    still.run_row(5.0, [5.0], 2, 10, 16, 0)  # a row too short for the clock to move
    assert still.iterations_frame()["kv_used_tokens"].tolist() == [10.0]


def test_rows_that_start_late_are_short_or_take_no_time() -> None:
    """Durations are end - start (a row starting at 2 s); a jump of a plan and one step; a
    reservation that varies within a quarter of a second; rows too short for the clock."""
    from orcasim.recorder import _reserved_mean_max

    rec = Recorder(2)
    rec.run_row(2.0, [3.0, 5.0], 1, 4, 8, 0)  # holds 4 for 1 s, 5 for 2 s
    rec.jump_row(6.0, [7.0, 8.0], 1, 3, 3, 10, 1, 3, 8, 0)  # plan: 10 for 1 s, then 3 for 1 s
    late, short = rec.iterations_frame().to_dict("records")
    assert late["duration_s"] == 3.0 and late["kv_used_tokens"] == pytest.approx(14 / 3)
    assert short["duration_s"] == 2.0 and short["kv_used_tokens"] == pytest.approx(13 / 2)
    assert _reserved_mean_max(0.0, [0.25, 0.5], np.array([2, 4])) == (3.0, 4)
    still = Recorder(1)
    still.jump_row(5.0, [5.0, 5.0], 1, 3, 3, 10, 1, 3, 8, 0)
    assert still.iterations_frame()["kv_used_tokens"].tolist() == [10.0]


def test_a_recorder_with_no_rows_gives_an_empty_frame() -> None:
    frame = Recorder(0).iterations_frame()
    assert len(frame) == 0 and list(frame.columns) == list(ITERATION_COLUMNS)


def test_completions_told_as_a_list_are_recorded_once() -> None:
    recorder = Recorder(4)
    recorder.record_finished([2, 0], 1.5)
    recorder.record_finished([], 2.0)
    assert recorder.finish_s[[0, 2]].tolist() == [1.5, 1.5]
    assert np.isnan(recorder.finish_s[[1, 3]]).all()
    with pytest.raises(AssertionError, match="a request finished twice"):
        recorder.record_finished([3, 2], 3.0)
