"""Per-request timestamps and per-iteration rows, collected by the engine.

Per-request data are numpy arrays indexed by request id. Rows are buffered as tuples
and packed every `ROW_CHUNK` rows into one float64 block (8 bytes a value, no Python
object per row), so a million-request run keeps its rows in tens of megabytes.

A row covers `num_iterations` consecutive iterations of the same requests (one in
reference mode; a whole jump in fast mode). `batch_size` and `kv_reserved_tokens` are
the same in each of them; `duration_s`, `tokens`, `context_tokens` and `num_waiting`
are summed over them, so a one-iteration row holds that iteration's values and every
summary (iteration-weighted or time-weighted mean) is the same in both modes.
"""

from __future__ import annotations

import math

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
)
FLOAT_COLUMNS = ("start_s", "duration_s")  # the others are integer counts
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

    def _append(self, *row: float) -> None:
        self._pending.append(row)
        if len(self._pending) >= ROW_CHUNK:
            self._pack()

    def _pack(self) -> None:
        if self._pending:
            self._blocks.append(np.array(self._pending, dtype=np.float64))
            self._pending = []

    def record_iteration(
        self, start_s: float, duration_s: float, plan: SchedulerOutput, num_waiting: int
    ) -> None:
        """One iteration that ran `plan`."""
        batch = plan.batch
        self._append(
            start_s, duration_s, 1, len(plan.req_ids), _total(batch.query_tokens),
            _total(batch.context_tokens), plan.kv_reserved_tokens, num_waiting,
        )

    def record_jump(
        self, start_s: float, end_s: float, num_iterations: int, plan: SchedulerOutput,
        run: DecodeRun, num_waiting_sum: int,
    ) -> None:
        """`plan`'s iteration then the first `num_iterations - 1` steps of `run`, as one row."""
        steps = num_iterations - 1
        batch = plan.batch
        self._append(
            start_s, end_s - start_s, num_iterations, len(plan.req_ids),
            _total(batch.query_tokens) + steps * run.size,
            _total(batch.context_tokens) + _run_context(run, steps),
            plan.kv_reserved_tokens, num_waiting_sum,
        )

    def record_run(
        self, start_s: float, end_s: float, num_steps: int, run: ContinuedRun,
        num_waiting_sum: int,
    ) -> None:
        """The first `num_steps` steps of a continued run, as one row."""
        self._append(
            start_s, end_s - start_s, num_steps, len(run.req_ids), num_steps * run.size,
            _run_context(run, num_steps), run.kv_reserved_tokens, num_waiting_sum,
        )

    def record_scheduled(self, scheduled: np.ndarray, start_s: float) -> None:
        """Requests in a batch starting at `start_s`; the first time counts."""
        unset = scheduled[np.isnan(self.first_scheduled_s[scheduled])]
        if len(unset):
            self.first_scheduled_s[unset] = start_s

    def record_result(self, result: StepResult, end_s: float) -> None:
        """First tokens and completions that became visible at `end_s`."""
        if len(result.first_token_ids):
            self.first_token_s[result.first_token_ids] = end_s
        done = result.finished_ids
        if len(done):
            assert all(map(math.isnan, self.finish_s[done].tolist())), "a request finished twice"
            self.finish_s[done] = end_s

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

def _run_context(run: DecodeRun, steps: int) -> int:
    """KV tokens read by a run's first `steps` steps: step j reads context_tokens + j."""
    return steps * _total(run.context_tokens) + run.size * steps * (steps - 1) // 2


def _total(tokens: np.ndarray) -> int:
    """Sum of a batch-sized int array; the builtin over a list beats a numpy reduction here."""
    return sum(tokens.tolist())
