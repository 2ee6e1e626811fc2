"""Orca's iteration-level scheduler (Yu et al., OSDI 2022, Algorithm 1).

Before every iteration it selects, FCFS, up to `max_batch_size` requests. A request in
its initiation phase is admitted only if its KV reservation fits; selection stops at
the first that does not (no skipping ahead). A joining request's whole prompt runs in
the same iteration as the others' decode tokens (selective batching), and a request
leaves right after its last token, freeing its reservation.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import PositiveInt

from orcasim.config import Strict
from orcasim.cost.base import Batch
from orcasim.memory import ReservationPolicy, reservation_tokens
from orcasim.requests import Requests
from orcasim.schedulers.base import Scheduler, SchedulerOutput, StepResult


class IterationLevelConfig(Strict):
    """`kv_reservation`: the KV each admitted request reserves (see `orcasim.memory`)."""

    kind: Literal["iteration_level"]
    max_batch_size: PositiveInt
    kv_reservation: ReservationPolicy = "max"


class IterationLevelScheduler(Scheduler):
    def __init__(self, cfg: IterationLevelConfig, requests: Requests, kv_capacity_tokens: int):
        super().__init__(requests, kv_capacity_tokens)
        self.max_batch_size = cfg.max_batch_size
        self.running: list[int] = []  # admitted, in admission (= arrival) order
        self.reserved_tokens = 0
        self._reservation = reservation_tokens(requests, cfg.kv_reservation)

    def schedule(self, now_s: float) -> SchedulerOutput:
        self._admit()
        ids = np.array(self.running, dtype=np.int64)
        known = self.requests.prompt_tokens[ids] + self.generated[ids]
        new_tokens = known - self.computed[ids]
        out = SchedulerOutput(
            ids, new_tokens, Batch(new_tokens, known), self.reserved_tokens,
            kv_used_tokens=int(known.sum()),
        )
        assert len(ids) <= self.max_batch_size
        assert self.reserved_tokens <= self.kv_capacity_tokens
        return out

    def _admit(self) -> None:
        while len(self.running) < self.max_batch_size:
            head = self._peek_waiting()
            if head is None:
                return
            need = int(self._reservation[head])
            if self.reserved_tokens + need > self.kv_capacity_tokens:
                return  # FCFS: never skip ahead of a request that does not fit
            self._pop_waiting()
            self.reserved_tokens += need
            self.running.append(head)

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
        self.reserved_tokens -= int(self._reservation[done].sum())
        finished = set(done.tolist())
        self.running = [r for r in self.running if r not in finished]

    def never_fits(self, req_id: int) -> bool:
        return bool(self._reservation[req_id] > self.kv_capacity_tokens)

    def has_unfinished(self) -> bool:
        return bool(self.running) or self.num_waiting > 0
