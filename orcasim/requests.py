"""The request table: one numpy array per field, indexed by request id (0..n-1, arrival order)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Requests:
    """Immutable description of the offered load, shared by every system in a run.

    Ids are positions in these arrays; arrivals are sorted, so id order is FCFS order.
    `max_tokens` is the per-request limit the server knows in advance (Orca reserves it).
    """

    arrival_s: np.ndarray  # float64 (n,)
    prompt_tokens: np.ndarray  # int64 (n,)
    output_tokens: np.ndarray  # int64 (n,)
    max_tokens: np.ndarray  # int64 (n,)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "output_tokens", "max_tokens"):
            assert len(getattr(self, name)) == n, f"{name} has a different length"
        assert n == 0 or bool(np.all(np.diff(self.arrival_s) >= 0)), "arrivals must be sorted"

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def total_tokens(self) -> np.ndarray:
        return self.prompt_tokens + self.output_tokens
