"""The contract between schedulers and cost models.

A scheduler describes one iteration as a `Batch`: for each request in it, how many new
(query) tokens it processes and how many KV tokens its attention reads. Selective
batching (Orca section 4.2) makes this the whole story: token-wise operators see the
flattened sum of query tokens, attention sees each request on its own.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


@dataclass(slots=True)  # not frozen: one is made per plan, and frozen __init__ is slow
class Batch:
    """One iteration's work.

    query_tokens[i]:   new tokens request i processes now (prompt length, a chunk, or 1).
    context_tokens[i]: KV tokens request i's attention reads, cached ones plus the new ones.
    """

    query_tokens: np.ndarray  # int64 (B,)
    context_tokens: np.ndarray  # int64 (B,)
    # The totals, memoised: the scheduler, the cost model and the recorder all ask.
    _query_total: int | None = field(default=None, init=False, repr=False, compare=False)
    _context_total: int | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def with_totals(
        cls, query_tokens: np.ndarray, context_tokens: np.ndarray, query_total: int,
        context_total: int,
    ) -> Batch:
        """A batch whose totals the caller already knows (they must be the arrays' sums)."""
        batch = cls(query_tokens, context_tokens)
        batch._query_total, batch._context_total = query_total, context_total
        return batch

    @property
    def size(self) -> int:
        return len(self.query_tokens)

    # The builtin sum over a list beats a numpy reduction at batch sizes (hot in the engine).
    @property
    def total_query_tokens(self) -> int:
        if self._query_total is None:
            self._query_total = sum(self.query_tokens.tolist())
        return self._query_total

    @property
    def total_context_tokens(self) -> int:
        if self._context_total is None:
            self._context_total = sum(self.context_tokens.tolist())
        return self._context_total


@dataclass(frozen=True, slots=True)
class StageEnds:
    """The parts of a pipelined iteration's time that one stage spends alone.

    vLLM builds the embedding on the first pipeline rank only and the LM head on the last
    (`PPMissingLayer` stands in for them elsewhere; `get_pp_indices` puts an uneven split's
    extra layers on the stages before the last), and each stage but the last sends the
    activations to the next. Split by layers instead, the LM head of a large vocabulary (Llama-3-8B's
    128k x 4096, 1 GB read per decode step) spread over the stages, hiding the last stage's
    lead and so the pipeline's pace.
    """

    first_s: float  # the embedding
    last_s: float  # the LM head
    sends_s: tuple[float, ...]  # each stage boundary's send, on the sending stage


def split_stages(iteration_s: float, layers: Sequence[int], ends: StageEnds | None) -> list[float]:
    """`iteration_s` over stages holding `layers[k]` layers: its ends where they run, the
    rest by layers. Equal stages without ends take iteration / stages, whose bits a product
    by layers need not keep."""
    if ends is None or len(layers) == 1:
        if len(set(layers)) == 1:
            return [iteration_s / len(layers)] * len(layers)
        total = sum(layers)
        return [iteration_s * k / total for k in layers]
    assert len(ends.sends_s) == len(layers) - 1, "one send a boundary"
    body_s = iteration_s - ends.first_s - ends.last_s - sum(ends.sends_s)
    total = sum(layers)
    times_s = [body_s * k / total + send_s for k, send_s in zip(layers, (*ends.sends_s, 0.0),
                                                                 strict=True)]
    times_s[0] += ends.first_s
    times_s[-1] += ends.last_s
    return times_s


# No GPU step is faster: below it time barely moves (at t = 1e6 s a float cannot tell 1e-10 s
# apart) and the clock would stand still. A model read from a file may price below it (a fit
# with a negative coefficient, used beyond its data): `check_durations` refuses that, and a
# decode run priced ahead stops before such a step (`runnable_steps`).
MIN_ITERATION_S = 1e-9


def check_durations(durations_s: np.ndarray | float, source: str | None, what: str) -> None:
    """A ScenarioError naming the model's file (`source`; None: no check) if any duration
    is under MIN_ITERATION_S (or NaN): a negative one ran time backwards (finish before
    arrival)."""
    if source is None or (isinstance(durations_s, float) and durations_s >= MIN_ITERATION_S):
        return
    shortest_s = float(np.min(durations_s)) if np.size(durations_s) else MIN_ITERATION_S
    if not shortest_s >= MIN_ITERATION_S:
        from orcasim.config import ScenarioError

        raise ScenarioError(
            f"{source}: priced {what} at {shortest_s:g} s; expected >= {MIN_ITERATION_S:g} s "
            "(its coefficients give no time, or less, to a batch it is asked to price)")


def runnable_steps(durations_s: np.ndarray, source: str | None) -> np.ndarray:
    """A decode run priced ahead (`CostModel.decode_steps_outside`), up to its first step
    under MIN_ITERATION_S (or NaN) where the model is checked (`source`; None: all of it).

    Not refused here: a fast stepper prices up to the run's natural end, beyond where an
    arrival will cut it, and a fit with a negative coefficient may price a step there that
    reference mode never runs. The run stops before that step, and the stepper plans it
    again (`schedule`), as reference mode does, whose `iteration_time_s` refuses it if it
    runs. Cut there, the ends left rise, as every search over them (bisect) needs."""
    if source is None or not len(durations_s) or durations_s.min() >= MIN_ITERATION_S:
        return durations_s  # the usual case: one reduction, as the check was
    return durations_s[:int(np.argmin(durations_s >= MIN_ITERATION_S))]  # the first short one


@dataclass(frozen=True, slots=True)
class OutsideSteps:
    """Which steps of a decode run priced ahead (`CostModel.decode_steps_outside`) fall
    outside the model's measured or fitted range: `steps`, a bool per step (what is
    counted), and `why`, each subject a warning would name against a bool per step."""

    steps: np.ndarray
    why: dict[str, np.ndarray]

    def among_first(self, num_steps: int) -> tuple[int, list[str]]:
        """How many of the first `num_steps` steps are outside, and the subjects among them."""
        count = int(self.steps[:num_steps].sum())
        return count, [what for what, mask in self.why.items() if mask[:num_steps].any()]


class OutOfRangeCounter:
    """Counts evaluations outside the measured range and warns once per cost-model instance."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.count = 0

    def add(self, n: int, what: str) -> None:
        if n <= 0:
            return
        if self.count == 0:
            warnings.warn(
                f"cost model {self.source}: {what} is outside the fitted range; the value is an "
                "extrapolation (further cases are counted in cost_out_of_range)",
                RuntimeWarning, stacklevel=3,
            )
        self.count += n

    def add_steps(self, outside: OutsideSteps, num_steps: int) -> None:
        """The first `num_steps` steps of a decode run priced ahead: those outside."""
        count, why = outside.among_first(num_steps)
        if count:
            self.add(count, why[0])


def counted_decode_steps_s(cost: CostModel, context_tokens: np.ndarray, num_steps: int) -> np.ndarray:
    """`decode_steps_s` of a model that says which steps are outside its range
    (`CostModel.decode_steps_outside`): every step priced runs, so every one is counted,
    and one priced too short is refused as `iteration_time_s` refuses its batch."""
    times_s, outside = cost.decode_steps_outside(context_tokens, num_steps)
    if len(times_s) < num_steps:  # step len(times_s) is too short (`runnable_steps`)
        cost.iteration_time_s(Batch(np.ones_like(context_tokens), context_tokens + len(times_s)))
        raise AssertionError(f"{type(cost).__name__} priced decode step {len(times_s)} under "
                             f"{MIN_ITERATION_S:g} s but not the same batch alone")
    if outside is not None:
        cost.count_outside(outside, num_steps)
    return times_s


class DecodeLine(NamedTuple):
    """Decode step k lasts `max(intercept_s + (x0 + dx * k) * slope_s, floor_s) + plus_s`,
    evaluated on Python numbers in that order: the same IEEE operations, so the same bits,
    as the model's `decode_steps_s`. (x0 + dx * k is a whole number, exact as a float below
    2**53.) `floor_s` and `plus_s` are an engine's overhead (`orcasim.cost.overhead`); at
    their defaults they change nothing (a duration is never negative).
    """

    intercept_s: float
    x0: int
    dx: int
    slope_s: float
    floor_s: float = 0.0
    plus_s: float = 0.0


class CostModel(ABC):
    """Maps a batch to the wall time of one iteration, in seconds."""

    # A model read from a file (fitted, DistServe's, a profile's tables) may price below
    # MIN_ITERATION_S: it checks what it prices (`check_durations`, `runnable_steps`) under
    # this name. Under an engine overhead, `build_cost_model` moves the check to the
    # overhead, which checks the floored GPU part.
    checked_source: str | None = None

    @abstractmethod
    def iteration_time_s(self, batch: Batch) -> float:
        """Duration of one iteration that processes `batch`."""

    def iteration_time_lists_s(
        self, query_tokens: list[int], context_tokens: list[int], query_total: int,
        context_total: int,
    ) -> float:
        """`iteration_time_s` of a batch given as lists, with their totals: the same value.

        The default builds the `Batch`; a model that prices lists directly overrides it
        (the fused Orca loop, orcasim.orca_fast, calls this once per plan).
        """
        batch = Batch.with_totals(np.array(query_tokens, dtype=np.int64),
                                  np.array(context_tokens, dtype=np.int64),
                                  query_total, context_total)
        return self.iteration_time_s(batch)

    def decode_steps_s(self, context_tokens: np.ndarray, num_steps: int) -> np.ndarray:
        """Durations of `num_steps` pure-decode iterations of the same requests.

        Step j (0-based) has one query token per request and context `context_tokens + j`.
        The default evaluates each step; models with a closed form override it. The fast
        engine relies on this agreeing with `iteration_time_s` step by step.
        """
        ones = np.ones_like(context_tokens)
        return np.array(
            [self.iteration_time_s(Batch(ones, context_tokens + j)) for j in range(num_steps)]
        )

    def decode_steps_outside(
        self, context_tokens: np.ndarray, num_steps: int
    ) -> tuple[np.ndarray, OutsideSteps | None]:
        """`decode_steps_s`'s durations, counting none of the steps outside the model's range
        but saying which they are (None: the model counts nothing). A fast stepper prices a
        run ahead and cuts it; it counts (`count_outside`) only the steps that ran, so that
        `out_of_range_count` and the warnings are reference mode's. A model that checks its
        prices (`checked_source`) gives the steps before the first too short, maybe fewer
        than `num_steps` (`runnable_steps`): the stepper runs no further."""
        return self.decode_steps_s(context_tokens, num_steps), None

    def count_outside(self, outside: OutsideSteps, num_steps: int) -> None:
        """Count (and warn of) the first `num_steps` steps of a run that
        `decode_steps_outside` priced; a model that says which steps are outside overrides it."""
        raise NotImplementedError(f"{type(self).__name__} says which decode steps are outside "
                                  "its range but does not count them")

    def decode_line(self, size: int, context_total: int) -> DecodeLine | None:
        """`decode_steps_s` as a line, for `size` requests holding `context_total` context
        tokens at the first step; None (the default) where the durations depend on each
        request's own context. See `DecodeLine`.

        The fused Orca loop (orcasim.orca_fast) asks this first: it knows the totals
        without building the per-request array, and prices only the steps it needs.
        """
        return None

    def stage_times_s(self, batch: Batch, layers: Sequence[int]) -> list[float]:
        """A pipelined iteration's time on each stage, which holds `layers[k]` layers: the
        iteration's time split by layers, but for the parts one stage runs alone
        (`stage_ends`, see `split_stages`)."""
        return split_stages(self.iteration_time_s(batch), layers, self.stage_ends(batch))

    def pipeline_host_s(self, batch: Batch) -> float:
        """The engine host's work for one batch of a pipeline that keeps several in flight,
        apart from its stages (`stage_times_s`): done once a batch, one batch after another,
        while the stages run others (`orcasim.pipeline`). 0 (the default): a model of the
        GPU alone; an engine's overhead has its own (`OverheadCost`)."""
        return 0.0

    def stage_ends(self, batch: Batch) -> StageEnds | None:
        """The parts of `iteration_time_s(batch)` that the first stage, the last stage and
        each sending stage run alone; None (the default) where the model does not know its
        parts (a `linear` or `fitted` cost): the whole iteration splits by layers."""
        return None

    def out_of_range_count(self) -> int:
        """How many evaluations fell outside the model's measured or fitted range."""
        return 0
