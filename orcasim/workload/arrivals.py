"""Arrival processes. Each one knows its theoretical mean rate (`mean_rate_per_s`)."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field, PositiveFloat, PositiveInt

from orcasim.config import Strict, check_rng
from orcasim.paths import DataPath
from orcasim.workload.closed_loop import ClosedLoopArrival
from orcasim.workload.sessions import AgentArrival, ConversationArrival


class PoissonArrival(Strict):
    """Exponential inter-arrival gaps (no cap on the gap, unlike Vidur's generator)."""

    kind: Literal["poisson"]
    rate_per_s: PositiveFloat

    def mean_rate_per_s(self) -> float:
        return self.rate_per_s

    def gaps_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        check_rng(rng)
        return rng.exponential(1.0 / self.rate_per_s, size=n)


class GammaArrival(Strict):
    """Gamma inter-arrival gaps with coefficient of variation `cv` (cv > 1 is bursty).

    Shape k = 1/cv^2 and scale = 1/(rate * k), so the mean gap is 1/rate and the
    gap's standard deviation is cv/rate.
    """

    kind: Literal["gamma"]
    rate_per_s: PositiveFloat
    # Beyond these the shape 1/cv^2 overflows or underflows; use `constant` for cv 0.
    cv: float = Field(ge=1e-6, le=1e6)

    def mean_rate_per_s(self) -> float:
        return self.rate_per_s

    def gaps_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        check_rng(rng)
        shape = 1.0 / self.cv**2
        return rng.gamma(shape, 1.0 / (self.rate_per_s * shape), size=n)

    def span_cv(self, n: int) -> float:
        """The coefficient of variation of n gaps' sum, a run's span: the sum is gamma of
        shape n/cv^2, so cv/sqrt(n). Where it is large, seeds' realised rates spread wide
        (cv 30 over 1,000 requests: 0.22 to 106 times `rate_per_s` over 20 draws of 1,000 gaps)."""
        return self.cv / float(np.sqrt(n))


class ConstantArrival(Strict):
    """Evenly spaced arrivals, 1/rate apart (a D arrival process)."""

    kind: Literal["constant"]
    rate_per_s: PositiveFloat

    def mean_rate_per_s(self) -> float:
        return self.rate_per_s

    def gaps_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        check_rng(rng)
        return np.full(n, 1.0 / self.rate_per_s)

    def times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """The k-th arrival at k / rate, each rounded once: a running sum of the gaps drifts
        by ulps (at 10 req/s the 100th arrival read 9.99999999999998 s), so a warm-up of 10 s
        left out the request at 10 s that it keeps at 7 req/s."""
        check_rng(rng)
        return np.arange(1, n + 1, dtype=np.float64) / self.rate_per_s


class TraceArrival(Strict):
    """Arrivals and lengths replayed from a file (see `orcasim.workload.traces`).

    `speedup` divides every arrival time (2.0 replays the trace twice as fast).
    """

    kind: Literal["trace"]
    path: DataPath
    format: Literal["auto", "orcasim", "azure", "mooncake", "vllm", "aiperf"] = "auto"
    max_requests: PositiveInt | None = None
    speedup: PositiveFloat = 1.0


GeneratedArrival = PoissonArrival | GammaArrival | ConstantArrival
Arrival = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | TraceArrival | ClosedLoopArrival
    | ConversationArrival | AgentArrival,
    Field(discriminator="kind"),
]


def initial_sends(arrival: Arrival) -> int:
    """How many requests the workload sends at once at its start, before any answer: a
    closed loop's clients, or the calls of a fixed number of sessions' first steps (an
    agent's fan-out issues `branches` a step). What it offers after them is one send per
    answer; an open process starts with one arrival."""
    match arrival:
        case ClosedLoopArrival():
            return arrival.num_clients
        case AgentArrival(concurrent_sessions=int(sessions)):
            return min(sessions, arrival.num_sessions) * arrival.fan_out.branches
        case ConversationArrival(concurrent_sessions=int(sessions)):
            return min(sessions, arrival.num_sessions)
        case _:
            return 1
