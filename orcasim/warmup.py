"""The warm-up rule, in one place: a run's measurements count what starts from `warmup_s` on.

A request counts when it arrives at or after `warmup_s` (its latencies, the SLO, the
saturation tests' windows, the figures; those tests count the queue and the requests in
the system those requests join, earlier arrivals too, see `orcasim.saturation`); an iteration row when it starts at or after it (the engines
break their jump rows at `warmup_s`, so no row straddles it); a session when it starts at
or after it, and a session's step when it is sent at or after it.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import pandas as pd

Times = TypeVar("Times", np.ndarray, pd.Series)


def counted(start_s: Times, warmup_s: float) -> Times:
    """Which of the things starting at `start_s` a measurement counts (a boolean mask)."""
    return start_s >= warmup_s


def measured_requests(reqs: pd.DataFrame, warmup_s: float) -> pd.DataFrame:
    """The rows of a request table that a measurement counts: those arriving from `warmup_s` on."""
    return reqs[counted(reqs["arrival_s"], warmup_s)]


def measured_iterations(iters: pd.DataFrame, warmup_s: float) -> pd.DataFrame:
    """The rows of an iteration table that a measurement counts: those starting from `warmup_s` on."""
    return iters[counted(iters["start_s"], warmup_s)]
