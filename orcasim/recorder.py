"""Per-request timestamps (numpy arrays) and per-iteration rows, collected by the engine."""

from __future__ import annotations

import numpy as np
import pandas as pd

from orcasim.schedulers.base import SchedulerOutput, StepResult

ITERATION_COLUMNS = [
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
]


class Recorder:
    """Collects what the engine observes. Nothing here decides anything."""

    def __init__(self, num_requests: int) -> None:
        self.first_scheduled_s = np.full(num_requests, np.nan)
        self.first_token_s = np.full(num_requests, np.nan)
        self.finish_s = np.full(num_requests, np.nan)
        self._rows: list[tuple[float, float, int, int, int, int, int, int, float, int, int]] = []

    def record_iteration(
        self, start_s: float, duration_s: float, num_iterations: int, plan: SchedulerOutput,
        num_waiting: int,
    ) -> None:
        batch = plan.batch
        self._rows.append((
            start_s, duration_s, num_iterations, len(plan.req_ids),
            batch.total_query_tokens, batch.total_context_tokens,
            plan.kv_reserved_tokens, num_waiting,
            np.nan if plan.kv_used_tokens is None else float(plan.kv_used_tokens),
            plan.preemptions, plan.recomputed_tokens,
        ))

    def record_progress(
        self, scheduled: np.ndarray, start_s: float, result: StepResult, end_s: float
    ) -> None:
        unset = scheduled[np.isnan(self.first_scheduled_s[scheduled])]
        self.first_scheduled_s[unset] = start_s
        self.first_token_s[result.first_token_ids] = end_s
        assert np.all(np.isnan(self.finish_s[result.finished_ids])), "a request finished twice"
        self.finish_s[result.finished_ids] = end_s

    def iterations_frame(self) -> pd.DataFrame:
        return pd.DataFrame.from_records(self._rows, columns=ITERATION_COLUMNS)
