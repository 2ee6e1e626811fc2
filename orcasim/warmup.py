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


# A closed loop's start lifts a short run's throughput by up to n / (n - N) (README,
# Closed-loop workloads); said where that bound passes 1 + this, without a warm-up.
CLOSED_LOOP_START_LIFT = 0.05


def closed_loop_start_text(num_clients: int, num_requests: int, warmup_s: float) -> str | None:
    """Why a closed loop of `num_clients` over `num_requests` measured from time 0 may read
    high, or None. Every client sends its first request at time 0, with no think time before
    it, so n requests take about the time of n - N sends at the steady rate and
    `throughput_rps` reads up to n / (n - N) of it where think time dominates (think 20 s,
    32 clients, 100 requests: 2.108 and 2.239 req/s, against 1.509 and 1.546 over 20,000
    after a warm-up). A saturated server is not lifted, so this is a bound, said before the run."""
    if warmup_s > 0 or num_clients > num_requests:
        return None  # more clients than requests is warned of as such (WorkloadConfig)
    start = f"a closed loop of {num_clients} clients over {num_requests} requests from time 0"
    advice = "expected warmup_s longer than a think time and a response, or more requests"
    if num_clients == num_requests:
        return (f"{start}: every request is a client's first, sent at time 0, so the run "
                f"measures one burst, not the loop's steady rate; {advice}")
    lift = num_requests / (num_requests - num_clients)
    if lift <= 1 + CLOSED_LOOP_START_LIFT:
        return None
    return (f"{start}: every client sends its first request at time 0, without a think time "
            f"before it, so throughput_rps may read up to {lift:.2f} times the steady rate "
            f"(n / (n - N)); {advice}")
