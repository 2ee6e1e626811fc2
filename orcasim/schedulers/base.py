"""The scheduler contract: a pure state machine driven by the engine.

Lifecycle of a request inside a scheduler (vLLM v1's vocabulary: there is no prefill or
decode phase, only `computed` tokens against `known` tokens):

    add_request(id)      -> waiting (or rejected at once if it could never fit in KV memory)
    schedule(now_s)      -> picked into a batch (admitted: KV reserved); tokens to compute
    update_from_output() -> computed += new tokens; if all known tokens are computed, one
                            output token is emitted; when `output_tokens` are emitted it
                            finishes, frees its KV, and never appears again.

The engine owns time. `schedule` receives the engine's current time only so that a
scheduler with a batching delay (Triton's max_queue_delay) can decide; none reads a clock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from orcasim.cost.base import Batch
from orcasim.requests import Requests

EMPTY_IDS = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)  # not frozen: one is made per iteration or jump; treat as read-only
class SchedulerOutput:
    """One iteration's plan: which requests compute how many tokens, and what it costs.

    `batch` is what the cost model sees; it can differ from the logical work (a static
    batch pads finished members). `wake_at_s` is set only on an empty plan: the time at
    which the scheduler wants to be asked again even if nothing arrives.

    Memory accounting: `kv_reserved_tokens` is the KV allocated (reserved slabs or whole
    blocks); `kv_used_tokens` the part holding real token state once this iteration ends
    (None where a scheduler does not track it). `preemptions` counts the requests evicted
    while planning it (and while planning any empty plan before it, which runs nothing and
    so is never recorded), `recomputed_tokens` the tokens it computes again after an eviction,
    and `copy_time_s` is KV copying that the engine adds to the iteration's duration: to or
    from CPU memory, and KV pulled in from a prefill instance. `pulled` names the requests
    whose KV is pulled in before this iteration, each with the seconds after the
    iteration's start at which its copy ends (they run one after another, first).
    """

    req_ids: np.ndarray  # int64 (B,) requests that make progress
    num_new_tokens: np.ndarray  # int64 (B,) tokens each computes
    batch: Batch
    kv_reserved_tokens: int
    wake_at_s: float | None = None
    kv_used_tokens: int | None = None
    preemptions: int = 0
    recomputed_tokens: int = 0
    copy_time_s: float = 0.0
    pulled: tuple[tuple[int, float], ...] = ()

    @property
    def is_empty(self) -> bool:
        return self.batch.size == 0


@dataclass(slots=True)  # not frozen (hot, like SchedulerOutput); treat as read-only
class StepResult:
    """What became visible to users at the end of an iteration."""

    first_token_ids: np.ndarray = field(default_factory=lambda: EMPTY_IDS)
    finished_ids: np.ndarray = field(default_factory=lambda: EMPTY_IDS)


@dataclass(slots=True)  # not frozen: one is made per jump, and frozen __init__ is slow
class DecodeRun:
    """Pure-decode iterations that follow a plan with the same requests, if nothing arrives.

    Step j (0-based) gives each request one query token and reads `context_tokens + j`
    KV tokens: exactly the batch `CostModel.decode_steps_s(context_tokens, n)` prices.
    A scheduler whose KV reservation grows during a run (paged blocks) sets
    `step_reserved_tokens`; otherwise every step reserves what the plan (or the
    continued run) does.
    """

    num_steps: int
    context_tokens: np.ndarray  # int64 (B,) context of the first decode step
    # Their total, memoised (a scheduler that knows it may set it): the recorder asks.
    context_total: int | None = field(default=None, init=False, repr=False, compare=False)
    # (num_steps,): KV reserved at step j, once that step's allocations are made.
    step_reserved_tokens: Sequence[int] | None = field(default=None, init=False, repr=False,
                                                    compare=False)
    # KV the requests share (a prefix cache's blocks), counted once per holder beyond the
    # first: a step holds its context's KV less this.
    kv_shared_tokens: int = field(default=0, init=False, repr=False, compare=False)

    @property
    def size(self) -> int:
        return len(self.context_tokens)

    @property
    def total_context_tokens(self) -> int:
        if self.context_total is None:
            self.context_total = sum(self.context_tokens.tolist())  # builtin: cheaper here
        return self.context_total


@dataclass(slots=True)
class ContinuedRun(DecodeRun):
    """A decode run with no plan before it: the batch left after a run's completions.

    Each step holds its context's KV (`kv_used_tokens` in the rows), as a decode plan does.
    """

    req_ids: np.ndarray  # int64 (B,) the requests decoding
    kv_reserved_tokens: int


NO_RESULT = StepResult()


@dataclass(frozen=True, slots=True)
class FastForward:
    """What a scheduler's fast-forward hooks assume: declared by each class, never inferred.

    The hooks (`decode_run`, `admits_arrival`, `advance`, `continue_run`, `advance_run`)
    predict what `schedule` and `update_from_output` would do over a run of iterations
    without calling them. `assumes` names the methods whose behaviour they predict, and
    `reason` says in one line why the prediction is exact. Every subclass of `Scheduler`
    restates its contract in its own body (`Scheduler.__init_subclass__` enforces it):

    * `fast_forward = Parent.fast_forward` keeps the parent's hooks; it is refused if the
      class overrides one of the methods they assume (they would silently predict the
      parent's behaviour, not the subclass's);
    * a new `FastForward(...)` claims that the hooks still hold for the overrides, and says why;
    * `STEP_BY_STEP` turns fast-forward off: the engine then steps every iteration.
    """

    assumes: tuple[str, ...]
    reason: str

    @property
    def enabled(self) -> bool:
        return bool(self.assumes)


STEP_BY_STEP = FastForward((), "no fast-forward: schedule plans every iteration")


def empty_output(kv_reserved_tokens: int, wake_at_s: float | None = None) -> SchedulerOutput:
    empty = np.zeros(0, dtype=np.int64)
    return SchedulerOutput(empty, empty, Batch(empty, empty), kv_reserved_tokens, wake_at_s)


class Scheduler(ABC):
    """Common state: request table, token progress, the FCFS waiting queue and KV capacity."""

    # Restated by every subclass (see FastForward); the base hooks step one iteration.
    fast_forward: ClassVar[FastForward] = STEP_BY_STEP

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        check_fast_forward_declared(cls)

    def __init__(self, requests: Requests, kv_capacity_tokens: int, kv_groups: int = 1) -> None:
        self.requests = requests
        self.kv_capacity_tokens = kv_capacity_tokens
        # Data-parallel attention (`hardware.data_parallel_attention`): the pool is the
        # groups' caches together, and a request lives in one group's, so it may hold no
        # more than a share (one pooled scheduler admitted a request of 18,016 tokens where
        # each group holds 12,480, which vLLM's DP engines refuse; a tester's finding).
        self.kv_groups = kv_groups
        self.request_kv_limit_tokens = kv_capacity_tokens // kv_groups
        n = len(requests)
        self.computed = np.zeros(n, dtype=np.int64)  # tokens whose KV exists
        self.generated = np.zeros(n, dtype=np.int64)  # output tokens emitted
        self.waiting: list[int] = []  # FCFS queue of request ids
        self._waiting_head = 0  # index of the queue's head, so that popping is O(1)
        self.rejected_ids: list[int] = []  # requests that could never fit, in arrival order
        self.preemptions_per_request = np.zeros(n, dtype=np.int64)  # evictions, where any
        # Prefix caching, where any: prompt tokens found cached at first admission, and
        # tokens not prefilled thanks to the cache over every admission (readmissions too).
        self.cached_tokens = np.zeros(n, dtype=np.int64)
        self.prefill_saved_tokens = np.zeros(n, dtype=np.int64)
        # A pulled handoff (orcasim.disagg): copy seconds of KV still on a prefill instance,
        # by id, and the ones admitted since the last plan was made (`take_pulled`).
        self._pull_s: dict[int, float] = {}
        self._pulled: list[tuple[int, float]] = []

    # Per-request state, indexed by request id. A request runs on one replica of a pool, so
    # the pool's schedulers of one kind may hold one set (`share_per_request_state`).
    PER_REQUEST_ARRAYS: ClassVar[tuple[str, ...]] = (
        "computed", "generated", "preemptions_per_request", "cached_tokens", "prefill_saved_tokens")

    def share_per_request_state(self, other: Scheduler) -> None:
        """Hold `other`'s per-request arrays in place of this scheduler's own, which nothing
        has written yet: each replica of a pool writes only the entries of the requests routed
        to it, and 16 paged replicas' own arrays held 16 copies of every request's state (7
        int64 each, 0.9 GB at 1M requests)."""
        assert type(self) is type(other) and self.requests is other.requests, "not one pool"
        for name in self.PER_REQUEST_ARRAYS:
            mine = getattr(self, name)
            assert not mine.any(), f"{name} already written"
            setattr(self, name, getattr(other, name))

    def add_request(self, req_id: int) -> None:
        """Queue a request, or reject it now (a value, not an error) if it can never fit."""
        if self.never_fits(req_id):
            self.rejected_ids.append(req_id)
            return
        self.waiting.append(req_id)

    def never_fits(self, req_id: int) -> bool:
        """True if the request could not run even alone in an empty KV cache.

        The default assumes a reservation of `max_tokens`; schedulers that reserve
        otherwise override it. Queuing such a request would stall FCFS forever.
        """
        return bool(self.requests.max_tokens[req_id] > self.request_kv_limit_tokens)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) - self._waiting_head

    @property
    def num_queued(self) -> int:
        """len(queued_ids()), without the list: what an iteration row reports as waiting
        (`num_waiting` is the FCFS queue alone; a scheduler that keeps preempted requests
        apart adds them, as the router's `Load` and vLLM's num_requests_waiting count them)."""
        return self.num_waiting

    def _peek_waiting(self) -> int | None:
        head = self._waiting_head  # not `num_waiting`: every admission check asks, twice
        return self.waiting[head] if head < len(self.waiting) else None

    def _pop_waiting(self) -> int:
        req = self.waiting[self._waiting_head]
        self._waiting_head += 1
        if self._waiting_head > 4096 and self._waiting_head * 2 > len(self.waiting):
            del self.waiting[: self._waiting_head]  # compact now and then
            self._waiting_head = 0
        if self._pull_s:  # admitted now: its KV moves in before the plan's iteration
            copy_s = self._pull_s.pop(req, None)
            if copy_s is not None:
                self._pulled.append((req, copy_s))
        return req

    def take_pulled(self) -> tuple[float, tuple[tuple[int, float], ...]]:
        """KV pulled in by the admissions since the last call, for the plan they join:
        the copies' total seconds, and each request with the end of its copy (seconds
        after the iteration's start; the copies run one after another, in admission order)."""
        if not self._pulled:
            return 0.0, ()
        ends, total_s = [], 0.0
        for req, copy_s in self._pulled:
            total_s += copy_s
            ends.append((req, total_s))
        self._pulled.clear()
        return total_s, tuple(ends)

    @abstractmethod
    def schedule(self, now_s: float) -> SchedulerOutput:
        """Plan the next iteration; an empty plan means nothing can run now."""

    @abstractmethod
    def update_from_output(self, out: SchedulerOutput) -> StepResult:
        """Apply a finished iteration's progress and report first tokens and completions."""

    @abstractmethod
    def has_unfinished(self) -> bool:
        """True while any added request has not finished."""

    # What a replica reports of its load (orcasim.replica.Load).

    @abstractmethod
    def active_ids(self) -> list[int]:
        """The requests running now (admitted, holding KV, not finished)."""

    def mark_transferred(self, req_id: int, first_token_emitted: bool = True,
                         pull_s: float | None = None) -> None:
        """`req_id` will arrive with its prompt's KV computed elsewhere (a decode instance
        of a disaggregated cluster). With its first token emitted there, it only decodes
        here; without, its first step computes the last prompt token again to emit it
        (vLLM's disaggregated prefill, whose decode instance streams every token).

        With `pull_s`, the KV is still on the prefill instance when the request arrives: it
        is pulled in when this scheduler admits the request, and the iteration it joins
        waits `pull_s` seconds for the copy (DistServe's decode instance; `take_pulled`)."""
        if pull_s is not None:
            self._pull_s[req_id] = pull_s
        prompt = self.requests.prompt_tokens[req_id]
        self.computed[req_id] = prompt if first_token_emitted else prompt - 1
        self.generated[req_id] = 1 if first_token_emitted else 0

    def held_ids(self) -> list[int]:
        """Finished requests whose KV is still held (a prefill instance's, until moved)."""
        return []

    def queued_ids(self) -> list[int]:
        """The requests added and not running: the waiting queue, and any preempted ones."""
        return self.waiting[self._waiting_head :]

    @property
    def num_requests(self) -> int:
        """len(active_ids()) + len(queued_ids()), without the lists: fixed during a decode
        run (nobody joins, nothing is visible before its end), so a router may read it
        without applying a pending jump."""
        return len(self.active_ids()) + len(self.queued_ids())

    def cached_prefix_tokens(self, req_id: int) -> int:
        """Prompt tokens of `req_id` (not yet added here) this scheduler's prefix cache holds,
        for a router to weigh; 0 without a prefix cache."""
        return 0

    def cache_evictions(self) -> int:
        """Cached KV blocks whose content was dropped to make room (prefix caching)."""
        return 0

    @abstractmethod
    def kv_in_use_tokens(self) -> int:
        """KV allocated now (reserved slabs or whole blocks), in tokens."""

    # Fast-forward hooks (used by the engine's fast mode). The defaults make a scheduler
    # step one iteration at a time, which is trivially exact; overriding them is optional.

    def decode_run(self, plan: SchedulerOutput) -> DecodeRun | None:
        """The pure-decode run that follows `plan` if nothing is added, or None.

        Promise: the next `num_steps` iterations after `plan`'s own are the run's steps
        (priced as `DecodeRun` says), with `plan.req_ids` unchanged, `kv_reserved_tokens`
        unchanged or as `step_reserved_tokens` says, nobody admitted, and nothing visible
        before the last step. Called
        after `schedule` returned `plan`, before the plan is applied. A run of zero steps
        is the plan alone; like any run that is not cut short, it is followed by
        `continue_run` (how a scheduler whose rows must break often still skips `schedule`).
        """
        return None

    def admits_arrival(self, req_id: int) -> bool:
        """Could `req_id` (or any later arrival), added now, join before the run ends?

        The engine asks only about the next arrival, so a scheduler may answer False
        only if no later arrival could join either (true of FCFS). True is always safe.
        """
        return True

    def advance(
        self, plan: SchedulerOutput, run: DecodeRun | None, num_iterations: int
    ) -> tuple[StepResult, StepResult]:
        """Apply `plan`, then the first `num_iterations - 1` steps of `run`, at once.

        Returns what became visible at the end of the first iteration and at the end of
        the last one (a run shows nothing in between). The default handles one iteration.
        """
        assert num_iterations == 1, "a scheduler without a decode run advances one iteration"
        return self.update_from_output(plan), NO_RESULT

    def continue_run(self) -> ContinuedRun | None:
        """After a run that ended in completions: the run the next plans would form.

        Only if nothing can be admitted (the engine has checked that nothing arrived):
        the remaining requests decode on, so no `schedule` call is needed to know it.
        None (the default) sends the engine back through `schedule`.
        """
        return None

    def advance_run(self, run: ContinuedRun, num_steps: int) -> StepResult:
        """Apply the first `num_steps` steps of a `continue_run`; what became visible at the end."""
        raise NotImplementedError("only schedulers whose continue_run returns a run")


def check_fast_forward_declared(cls: type[Scheduler]) -> None:
    """Raise TypeError unless `cls` states its own fast-forward contract (see FastForward)."""
    declared = cls.__dict__.get("fast_forward")
    if not isinstance(declared, FastForward):
        raise TypeError(
            f"{cls.__name__} must declare `fast_forward` in its class body: the parent's "
            "contract if the hooks still hold, a new FastForward saying why, or STEP_BY_STEP"
        )
    contract: FastForward = declared
    for parent in cls.__mro__[1:]:
        if parent.__dict__.get("fast_forward") is not contract:
            continue
        changed = [name for name in contract.assumes if name in cls.__dict__]
        if changed:
            raise TypeError(
                f"{cls.__name__} overrides {', '.join(changed)}, which the fast-forward hooks "
                f"of {parent.__name__} assume; declare a new FastForward that says why they "
                "still hold, or fast_forward = STEP_BY_STEP"
            )
        return
