"""Per-request timestamps and per-iteration rows, collected by the engine.

Per-request data are numpy arrays indexed by request id. Rows are buffered as tuples
and packed every `ROW_CHUNK` rows into one float64 block (8 bytes a value, no Python
object per row), so a million-request run keeps its rows in tens of megabytes.

A row covers `num_iterations` consecutive iterations of the same requests (one in
reference mode; a whole jump in fast mode). `batch_size` is the same in each of them;
`duration_s`, `tokens`, `context_tokens`, `num_waiting`, `preemptions` and
`recomputed_tokens` are summed over them; `kv_used_tokens` and `kv_reserved_tokens` are
their time-weighted means (a paged run takes KV blocks as it goes) and
`kv_reserved_tokens_max` the largest reservation among them. So a one-iteration row
holds that iteration's values, and every summary (iteration-weighted or time-weighted
mean, maximum) is the same in both modes.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence

import numpy as np
import pandas as pd

from orcasim.schedulers.base import ContinuedRun, DecodeRun, SchedulerOutput, StepResult

ITERATION_COLUMNS = (
    "start_s",
    "duration_s",
    "num_iterations",
    "batch_size",
    "tokens",
    "context_tokens",
    "kv_reserved_tokens",
    "num_waiting",
    "kv_used_tokens",
    "preemptions",
    "recomputed_tokens",
    "kv_reserved_tokens_max",
)
# Summed over a row's iterations (see the module docstring): a row's per-iteration value is
# the sum over `num_iterations`.
SUMMED_COLUMNS = ("duration_s", "tokens", "context_tokens", "num_waiting", "preemptions",
                  "recomputed_tokens")
# Time-weighted means and times; the others are integer counts.
FLOAT_COLUMNS = ("start_s", "duration_s", "kv_reserved_tokens", "kv_used_tokens")
# A row given without its last column (the callers of constant reservations) repeats
# kv_reserved_tokens there: its maximum is its value.
_RESERVED_INDEX = ITERATION_COLUMNS.index("kv_reserved_tokens")
_SHORT_ROW = len(ITERATION_COLUMNS) - 1
ROW_CHUNK = 4096
# Counts are stored as float64 in the blocks: exact below 2**53.
MAX_EXACT_COUNT = 2**53


class Recorder:
    """Collects what the engine observes. Nothing here decides anything."""

    def __init__(self, num_requests: int) -> None:
        self.first_scheduled_s = np.full(num_requests, np.nan)
        self.first_token_s = np.full(num_requests, np.nan)
        self.finish_s = np.full(num_requests, np.nan)
        self._pending: list[tuple[float, ...]] = []
        self._blocks: list[np.ndarray] = []  # float64 (ROW_CHUNK, columns) each

    def append_row(self, *row: float) -> None:
        """One row of ITERATION_COLUMNS values, in that order (the last may be left out)."""
        if len(row) == _SHORT_ROW:
            row = (*row, row[_RESERVED_INDEX])
        self._pending.append(row)
        if len(self._pending) >= ROW_CHUNK:
            self._pack()

    def _pack(self) -> None:
        pending = self._pending
        if pending:
            # One flat pass (a quarter cheaper than np.array over the tuples); each value
            # converted to float64 as np.array converts it.
            values = np.fromiter(itertools.chain.from_iterable(pending), dtype=np.float64,
                                 count=len(pending) * len(ITERATION_COLUMNS))
            self._blocks.append(values.reshape(len(pending), len(ITERATION_COLUMNS)))
            self._pending = []

    def record_iteration(
        self, start_s: float, duration_s: float, num_iterations: int, plan: SchedulerOutput,
        num_waiting: int,
    ) -> None:
        """One iteration that ran `plan` (`num_iterations` is 1; kept for callers' clarity)."""
        assert num_iterations == 1, "a multi-iteration row is record_jump's"
        batch = plan.batch
        used = math.nan if plan.kv_used_tokens is None else float(plan.kv_used_tokens)
        self.append_row(
            start_s, duration_s, 1, len(plan.req_ids), batch.total_query_tokens,
            batch.total_context_tokens, plan.kv_reserved_tokens, num_waiting, used,
            plan.preemptions, plan.recomputed_tokens,
        )

    def record_jump(
        self, start_s: float, ends_s: np.ndarray, plan: SchedulerOutput, run: DecodeRun,
        num_waiting_sum: int,
    ) -> None:
        """`plan`'s iteration, ending at ends_s[0], then a step of `run` per later end."""
        batch = plan.batch
        self.jump_row(
            start_s, ends_s, len(plan.req_ids), batch.total_query_tokens,
            batch.total_context_tokens, plan.kv_used_tokens, run.size, run.total_context_tokens,
            plan.kv_reserved_tokens, num_waiting_sum, plan.preemptions, plan.recomputed_tokens,
            run.step_reserved_tokens, run.kv_shared_tokens,
        )

    def jump_row(
        self, start_s: float, ends_s: Sequence[float] | np.ndarray, size: int, query_total: int,
        context_total: int, kv_used_tokens: int | None, run_size: int, run_context_total: int,
        kv_reserved_tokens: int, num_waiting_sum: int, preemptions: int = 0,
        recomputed_tokens: int = 0, step_reserved_tokens: Sequence[int] | None = None,
        run_shared_tokens: int = 0,
    ) -> None:
        """`record_jump` from plain numbers: a plan of `size` requests, then its decode run.

        The run decodes `run_size` requests (a static batch may price more than make
        progress) from `run_context_total` context tokens at its first step; a step holds
        its context's KV less `run_shared_tokens` (see `DecodeRun.kv_shared_tokens`), as
        the plan holds `kv_used_tokens`. The plan reserves
        `kv_reserved_tokens`, and so does each step unless `step_reserved_tokens` gives
        the run's steps their own (int64, at least one a step).
        """
        n, end_s = len(ends_s), float(ends_s[-1])
        steps, used = n - 1, math.nan
        if kv_used_tokens is not None and n > 1:
            head_end_s = float(ends_s[0])
            run_used_s = _used_s(run_context_total - run_shared_tokens, run_size, head_end_s,
                                 ends_s[1:])
            used_s = kv_used_tokens * (head_end_s - start_s) + run_used_s
            # A row too short for the clock to move (end_s == start_s) has no time average.
            used = used_s / (end_s - start_s) if end_s > start_s else float(kv_used_tokens)
        elif kv_used_tokens is not None:
            used = float(kv_used_tokens)
        reserved, reserved_max = float(kv_reserved_tokens), kv_reserved_tokens
        if step_reserved_tokens is not None and steps:
            held = [kv_reserved_tokens, *step_reserved_tokens[:steps]]
            reserved, reserved_max = _reserved_mean_max(start_s, ends_s, held)
        self.append_row(
            start_s, end_s - start_s, n, size, query_total + steps * run_size,
            context_total + _run_context(run_context_total, run_size, steps),
            reserved, num_waiting_sum, used, preemptions, recomputed_tokens, reserved_max,
        )

    def record_run(
        self, start_s: float, ends_s: np.ndarray, run: ContinuedRun, num_waiting_sum: int
    ) -> None:
        """A step of a continued run per end in `ends_s`, as one row."""
        self.run_row(start_s, ends_s, len(run.req_ids), run.total_context_tokens,
                     run.kv_reserved_tokens, num_waiting_sum, run.step_reserved_tokens,
                     run.kv_shared_tokens)

    def run_row(
        self, start_s: float, ends_s: Sequence[float] | np.ndarray, size: int, context_total: int,
        kv_reserved_tokens: int, num_waiting_sum: int,
        step_reserved_tokens: Sequence[int] | None = None, shared_tokens: int = 0,
    ) -> None:
        """`record_run` from plain numbers: `size` requests decoding from `context_total`,
        reserving `kv_reserved_tokens` at every step, or step_reserved_tokens[j] at step j;
        `shared_tokens` of their KV is held once for several of them."""
        n, end_s = len(ends_s), float(ends_s[-1])
        used_total = context_total - shared_tokens
        used_s = _used_s(used_total, size, start_s, ends_s)
        reserved, reserved_max = float(kv_reserved_tokens), kv_reserved_tokens
        if step_reserved_tokens is not None:
            reserved, reserved_max = _reserved_mean_max(start_s, ends_s, step_reserved_tokens[:n])
        self.append_row(
            start_s, end_s - start_s, n, size, n * size, _run_context(context_total, size, n),
            reserved, num_waiting_sum,
            used_s / (end_s - start_s) if end_s > start_s else float(used_total), 0, 0,
            reserved_max,
        )

    def record_progress(
        self, scheduled: np.ndarray, start_s: float, result: StepResult, end_s: float
    ) -> None:
        """An iteration that ran `scheduled` from `start_s` to `end_s`, with its result."""
        self.record_scheduled(scheduled, start_s)
        self.record_result(result, end_s)

    def record_scheduled(self, scheduled: np.ndarray, start_s: float) -> None:
        """Requests in a batch starting at `start_s`; the first time counts."""
        # Time never goes back, so an earlier time is the smaller; fmin keeps it (and
        # replaces NaN, never set). Fewer numpy calls than masking out the unset ones.
        earlier_s = self.first_scheduled_s[scheduled]
        self.first_scheduled_s[scheduled] = np.fmin(earlier_s, start_s)

    def record_result(self, result: StepResult, end_s: float) -> None:
        """First tokens and completions that became visible at `end_s`."""
        if len(result.first_token_ids):
            self.first_token_s[result.first_token_ids] = end_s
        if len(result.finished_ids):
            self.record_finished(result.finished_ids.tolist(), end_s)

    def record_finished(self, req_ids: list[int], end_s: float) -> None:
        """Completions at `end_s`, one at a time (an iteration has a few, where indexing
        with a list costs more than the loop); none may finish twice."""
        finish_s = self.finish_s
        for req in req_ids:
            assert math.isnan(finish_s.item(req)), "a request finished twice"
            finish_s[req] = end_s

    def iterations_frame(self) -> pd.DataFrame:
        self._pack()
        blocks = self._blocks or [np.zeros((0, len(ITERATION_COLUMNS)))]
        columns = {}
        for i, name in enumerate(ITERATION_COLUMNS):  # column by column: no 2-D copy
            values = np.concatenate([block[:, i] for block in blocks])
            if name not in FLOAT_COLUMNS:
                assert not len(values) or values.max() < MAX_EXACT_COUNT, f"{name} lost precision"
                values = values.astype(np.int64)
            columns[name] = values
        return pd.DataFrame(columns, copy=False)

def _used_s(context_total: int, size: int, start_s: float,
            ends_s: Sequence[float] | np.ndarray) -> float:
    """KV-token-seconds in use over a run's steps, from start_s to each end in ends_s.

    The run has `size` requests and `context_total` context tokens at its first step.
    Step j holds context_tokens + j, so the integral is sum_j (C + B j) d_j with d_j the
    step's duration; by parts, sum_j j d_j = (n - 1) t_(n-1) - sum_(j < n-1) t_j, with
    times t taken from start_s (small numbers, so no cancellation). Python floats, summed
    in order: the same bits whether the ends come as a list or an array.
    """
    ends = ends_s.tolist() if isinstance(ends_s, np.ndarray) else ends_s
    n, total_s = len(ends), ends[-1] - start_s
    inner_s = sum(map(operator.sub, ends[:-1], itertools.repeat(start_s)))  # in C, in order
    return context_total * total_s + size * ((n - 1) * total_s - inner_s)


def _reserved_mean_max(
    start_s: float, ends_s: Sequence[float] | np.ndarray, held_tokens: Sequence[int]
) -> tuple[float, int]:
    """Time-weighted mean and max of KV held_tokens[j] over start_s..ends_s[0]..ends_s[j].

    A constant reservation is returned as is (no rounding); so is the max of a row of
    no duration (which a time-weighted summary gives no weight). Python floats, summed in
    order: the same bits whether the ends come as a list or an array (and cheaper than
    numpy at a jump's tens of steps).
    """
    most = max(held_tokens)
    total_s = float(ends_s[-1]) - start_s
    if most == min(held_tokens) or total_s <= 0:
        return float(most), most
    ends = ends_s.tolist() if isinstance(ends_s, np.ndarray) else ends_s
    held_s, before_s = 0.0, start_s
    for held, end_s in zip(held_tokens, ends, strict=True):
        held_s += held * (end_s - before_s)
        before_s = end_s
    return held_s / total_s, most


def _run_context(context_total: int, size: int, steps: int) -> int:
    """KV tokens read by a run's first `steps` steps: step j reads context_tokens + j."""
    return steps * context_total + size * steps * (steps - 1) // 2

