"""Closed-loop arrivals: a fixed population of clients, each with one request at a time.

Each of `num_clients` clients sends a request, waits for its last token, thinks, and
sends the next (an interactive system in the sense of the response-time law,
X = N / (R + Z); Lazowska et al., *Quantitative System Performance*, 1984, section 3.3).
Arrival times are therefore an outcome of the run, not of the workload: a faster
system gets its requests sooner. The workload fixes everything else in advance, per
request id: the lengths, and the think time its client takes after it finishes.

Each think-time distribution knows its theoretical mean (`mean_think_s`).
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from orcasim.config import MAX_TIME_S, Strict, check_rng


class ExponentialThink(Strict):
    """Exponential think times with mean `mean_s` (the machine-repairman's think time)."""

    kind: Literal["exponential"]
    mean_s: Annotated[PositiveFloat, Field(le=MAX_TIME_S)]

    def mean_think_s(self) -> float:
        return self.mean_s

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        check_rng(rng)
        return rng.exponential(self.mean_s, size=n)


class ConstantThink(Strict):
    """The same think time after every request; 0 resubmits at once (a saturating client)."""

    kind: Literal["constant"]
    value_s: Annotated[NonNegativeFloat, Field(le=MAX_TIME_S)]

    def mean_think_s(self) -> float:
        return self.value_s

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        check_rng(rng)
        return np.full(n, float(self.value_s))


ThinkTime = Annotated[ExponentialThink | ConstantThink, Field(discriminator="kind")]


class ClosedLoopArrival(Strict):
    """`num_clients` clients; all send their first request at time 0."""

    kind: Literal["closed_loop"]
    num_clients: PositiveInt
    think_time: ThinkTime

    def think_times_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """The think time after each of `n` requests finishes, by request id."""
        return self.think_time.sample(rng, n)
