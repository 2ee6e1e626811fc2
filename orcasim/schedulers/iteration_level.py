"""Orca's iteration-level scheduler (Yu et al., OSDI 2022, Algorithm 1).

Before every iteration it selects, FCFS, up to `max_batch_size` requests. A request in
its initiation phase is admitted only if its KV reservation fits; selection stops at
the first that does not (no skipping ahead). A joining request's whole prompt runs in
the same iteration as the others' decode tokens (selective batching), and a request
leaves right after its last token, freeing its reservation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import PositiveInt

from orcasim.config import Strict
from orcasim.cost.base import Batch
from orcasim.memory import ReservationPolicy, reservation_tokens
from orcasim.requests import Requests
from orcasim.schedulers.base import (
    EMPTY_IDS,
    NO_RESULT,
    ContinuedRun,
    DecodeRun,
    FastForward,
    Scheduler,
    SchedulerOutput,
    StepResult,
)


class IterationLevelConfig(Strict):
    """`kv_reservation`: the KV each admitted request reserves (see `orcasim.memory`)."""

    kind: Literal["iteration_level"]
    max_batch_size: PositiveInt
    kv_reservation: ReservationPolicy = "max"


class IterationLevelScheduler(Scheduler):
    fast_forward = FastForward(
        assumes=("schedule", "update_from_output", "admit_head", "never_fits", "_admit",
                 "_release"),
        reason="between admissions and completions the running set only decodes, and a "
               "fixed reservation per request keeps a blocked FCFS head blocked",
    )

    def __init__(self, cfg: IterationLevelConfig, requests: Requests, kv_capacity_tokens: int,
                 kv_groups: int = 1):
        super().__init__(requests, kv_capacity_tokens, kv_groups)
        self.max_batch_size = cfg.max_batch_size
        self.running: list[int] = []  # admitted, in admission (= arrival) order
        self.reserved_tokens = 0
        # KV tokens each request reserves while admitted (int64, by id). A session
        # workload writes each row at arrival (orcasim.sessions): its entries are made then.
        self.reservation_tokens = reservation_tokens(requests, cfg.kv_reservation)
        self.kv_reservation = cfg.kv_reservation
        self._rows_at_arrival = requests.sessions is not None
        self._reservation_memo: dict[tuple[int, int, int], int] = {}

    def add_request(self, req_id: int) -> None:
        self._reservation_of(req_id)
        super().add_request(req_id)

    def _reservation_of(self, req_id: int) -> int:
        """`req_id`'s reservation, made now from its row where rows are written at arrival
        (memoised by the row's lengths: the loop asks about the next arrival often)."""
        if not self._rows_at_arrival:
            return int(self.reservation_tokens[req_id])
        r = self.requests
        key = (r.prompt_tokens.item(req_id), r.output_tokens.item(req_id), r.max_tokens.item(req_id))
        need = self._reservation_memo.get(key)
        if need is None:
            prompt, output, limit = (np.array([k], dtype=np.int64) for k in key)
            one = Requests(np.zeros(1), prompt, output, limit)
            need = self._reservation_memo[key] = int(reservation_tokens(one, self.kv_reservation)[0])
        self.reservation_tokens[req_id] = need
        return need

    def schedule(self, now_s: float) -> SchedulerOutput:
        self._admit()
        ids = np.array(self.running, dtype=np.int64)
        known = self.requests.prompt_tokens[ids] + self.generated[ids]
        new_tokens = known - self.computed[ids]
        batch = Batch(new_tokens, known)  # its total context is the KV in use, memoised
        pull_s, pulled = self.take_pulled()
        out = SchedulerOutput(
            ids, new_tokens, batch, self.reserved_tokens, kv_used_tokens=batch.total_context_tokens,
            copy_time_s=pull_s, pulled=pulled,
        )
        assert len(ids) <= self.max_batch_size
        assert self.reserved_tokens <= self.kv_capacity_tokens
        return out

    def _admit(self) -> None:
        while len(self.running) < self.max_batch_size:
            if self.admit_head() is None:
                return

    def admit_head(self) -> int | None:
        """Admit the head of the queue if its reservation fits; its id, or None."""
        head = self._peek_waiting()
        if head is None:
            return None
        need = int(self.reservation_tokens[head])
        if self.reserved_tokens + need > self.kv_capacity_tokens:
            return None  # FCFS: never skip ahead of a request that does not fit
        self._pop_waiting()
        self.reserved_tokens += need
        self.running.append(head)
        return head

    def update_from_output(self, out: SchedulerOutput) -> StepResult:
        ids = out.req_ids
        self.computed[ids] += out.num_new_tokens
        # Every scheduled request computed all its known tokens, so each emits one token.
        self.generated[ids] += 1
        first = ids[self.generated[ids] == 1]
        done = ids[self.generated[ids] == self.requests.output_tokens[ids]]
        if len(done):
            self._release(done)
        return StepResult(first, done)

    def _release(self, done: np.ndarray) -> None:
        self.reserved_tokens -= sum(self.reservation_tokens[done].tolist())  # cheaper than .sum()
        for req_id in done.tolist():  # list.remove runs in C: cheaper than rebuilding
            self.running.remove(req_id)

    def never_fits(self, req_id: int) -> bool:
        return self._reservation_of(req_id) > self.request_kv_limit_tokens

    def has_unfinished(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def active_ids(self) -> list[int]:
        return list(self.running)

    @property
    def num_requests(self) -> int:
        return len(self.running) + self.num_waiting

    def kv_in_use_tokens(self) -> int:
        return self.reserved_tokens

    # Fast-forward hooks (see Scheduler). Between admissions and completions the running
    # set only decodes, and a fixed per-request reservation keeps the head of the queue
    # blocked, so the next change is the first completion or an admissible arrival.

    def decode_run(self, plan: SchedulerOutput) -> DecodeRun | None:
        ids = plan.req_ids
        generated = self.generated[ids]
        owed = self.requests.output_tokens[ids] - generated
        # Each owes one token to this plan's iteration; the smallest debt ends the run.
        steps = min(owed.tolist()) - 1  # a list: cheaper than numpy's min at batch sizes
        if steps <= 0:
            return None
        has_newcomers = 0 in generated.tolist()
        run = _OrcaRun(steps, plan.batch.context_tokens + 1, generated, owed, has_newcomers)
        run.context_total = plan.batch.total_context_tokens + len(ids)  # each reads one more
        return run

    def admits_arrival(self, req_id: int) -> bool:
        # Mirrors _admit: FCFS, so a non-empty queue blocks every later arrival too. A
        # request larger than the whole cache may be turned away instead of queued, and
        # then a later one could join: say yes (always safe) rather than reason about it.
        need = self._reservation_of(req_id)
        if need > self.request_kv_limit_tokens:
            return True
        return (
            self.num_waiting == 0
            and len(self.running) < self.max_batch_size
            and self.reserved_tokens + need <= self.kv_capacity_tokens
        )

    def advance(
        self, plan: SchedulerOutput, run: DecodeRun | None, num_iterations: int
    ) -> tuple[StepResult, StepResult]:
        if num_iterations == 1:
            return self.update_from_output(plan), NO_RESULT
        assert isinstance(run, _OrcaRun) and num_iterations <= run.num_steps + 1
        ids, before = plan.req_ids, run.generated_before
        # The plan computes every known token (its context); each decode step one more.
        self.computed[ids] = plan.batch.context_tokens + (num_iterations - 1)
        self.generated[ids] = before + num_iterations
        first = StepResult(ids[before == 0]) if run.has_newcomers else NO_RESULT
        if num_iterations <= run.num_steps:
            return first, NO_RESULT  # cut short: nobody finishes
        done = ids[run.owed == num_iterations]
        self._release(done)
        return first, StepResult(EMPTY_IDS, done)

    def continue_run(self) -> ContinuedRun | None:
        if self.num_waiting or not self.running:
            return None
        ids = np.array(self.running, dtype=np.int64)
        generated = self.generated[ids]
        owed = self.requests.output_tokens[ids] - generated
        context = self.requests.prompt_tokens[ids] + generated  # the known tokens
        return _OrcaContinuedRun(
            min(owed.tolist()), context, ids, self.reserved_tokens, generated, owed
        )

    def advance_run(self, run: ContinuedRun, num_steps: int) -> StepResult:
        assert isinstance(run, _OrcaContinuedRun) and num_steps <= run.num_steps
        ids = run.req_ids
        # Step j computes the token at position context + j - 1 of each request.
        self.computed[ids] = run.context_tokens + (num_steps - 1)
        self.generated[ids] = run.generated_before + num_steps
        if num_steps < run.num_steps:
            return NO_RESULT
        done = ids[run.owed == num_steps]
        self._release(done)
        return StepResult(EMPTY_IDS, done)


@dataclass(slots=True)
class _OrcaRun(DecodeRun):
    generated_before: np.ndarray  # int64 (B,) output tokens before the plan's iteration
    owed: np.ndarray  # int64 (B,) output tokens still to emit, counting the plan's
    has_newcomers: bool  # whether the plan holds a first iteration (a prompt)


@dataclass(slots=True)
class _OrcaContinuedRun(ContinuedRun):
    generated_before: np.ndarray  # int64 (B,)
    owed: np.ndarray  # int64 (B,) output tokens still to emit
