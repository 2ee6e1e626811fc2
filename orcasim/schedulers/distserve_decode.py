"""DistServe's decode instance: requests accepted with their KV, then taken into the batch.

`paged` with `policy: distserve_decode`, for the decode pool of a disaggregated cluster
that pulls its KV (`handoff: pull`). Read from DistServe's `DecodingStageFCFSScheduler`
(`distserve/decoding_stage_scheduler.py` at 82831f1) and the decode loop that drives it
(`DecodingStageLLMEngine._step` in `distserve/single_stage_engine.py`). A request handed
over by a prefill instance passes three queues:

1. **Unaccepted** (the scheduler's waiting queue here): its KV is still on the prefill
   instance. After every step (`post_process`) the head is accepted, oldest first, while
   the accepted requests' prompt blocks are below `WAITING_BLOCK_PROP_THRESHOLD` of the
   pool (`waiting_block_prop_threshold`, 0.05 in `DecodingStageSchedConfig` and
   `distserve/llm.py`) and its prompt's blocks fit the free ones. Accepting allocates
   them and copies the KV in (`migrate_blocks`, awaited in the decode loop: the next
   iteration waits for the copies, `Scheduler.take_pulled`).
2. **Accepted** (DistServe's `waiting_queue`): KV here, not decoding. Before each step
   (`get_next_batch`) the newest running requests are swapped out while the running
   requests' blocks plus the accepted ones' exceed the pool (here: growing the running
   requests' tables, preempting the newest, as `paged` does); then a swapped-out request
   (first) or the accepted head joins, FCFS, while the batch's limits allow and
   `_check_add_to_cur_batch` holds: the running requests' blocks, every accepted
   request's prompt blocks and the joining request's own blocks fit the pool. An accepted
   request's own blocks are among the accepted ones already, so they count twice: it
   joins only while as many blocks again are free.
3. **Running**: decodes a token each step until done.

Swapped-out requests come back in the order they went out (DistServe appends each victim
to `swapped_queue` and swaps in from its front): the newest running request goes first,
so the most recently admitted return first. vLLM sorts by arrival instead (`paged`'s
order): taken here, a small request swapped out early waited behind a larger one that
could not fit (a tester's finding, read from DistServe's `get_next_batch`).

One departure, to keep FCFS from stalling: a request whose prompt's blocks and its own
blocks again exceed the pool is turned away on arrival (DistServe would accept it and wait
for room that never comes).

Fast-forward (`orcasim.schedulers.paged_runs`) stays exact: both gates only close as free
blocks fall, the accepted blocks are fixed within a run, and an arrival that the gate
would accept cuts the run (`arrival_can_join`), since its copy changes the next iteration.
"""

from __future__ import annotations

import heapq
from collections import deque

from orcasim.config import ScenarioError
from orcasim.memory import blocks_for
from orcasim.requests import Requests
from orcasim.schedulers.base import FastForward, SchedulerOutput
from orcasim.schedulers.paged import Admission, PagedConfig, PagedScheduler, Plan

# DecodingStageSchedConfig.waiting_block_prop_threshold (distserve/config.py, distserve/llm.py).
WAITING_BLOCK_PROP_THRESHOLD = 0.05


class DistServeDecodeScheduler(PagedScheduler):
    fast_forward = FastForward(
        assumes=PagedScheduler.fast_forward.assumes + (
            "_accept", "_accept_gate", "_take_candidate", "can_join", "arrival_can_join",
            "_preempt", "_swapped_head", "_pop_swapped"),
        reason="as paged: within a run the accepted blocks are fixed and free blocks only "
               "fall, so a closed accept or join gate stays closed; an arrival it would "
               "accept cuts the run",
    )

    def __init__(
        self, cfg: PagedConfig, requests: Requests, kv_capacity_tokens: int,
        kv_bytes_per_token: float | None = None, kv_groups: int = 1,
    ) -> None:
        assert cfg.policy == "distserve_decode"
        super().__init__(cfg, requests, kv_capacity_tokens, kv_bytes_per_token, kv_groups)
        self.accepted: list[int] = []  # KV copied in, not yet running, oldest first
        self.swap_order: deque[int] = deque()  # the swapped-out requests, first out first
        self.accepted_blocks = 0  # their prompts' blocks
        self._transferred: set[int] = set()
        self._accept_limit_blocks = WAITING_BLOCK_PROP_THRESHOLD * self._num_blocks

    def mark_transferred(self, req_id: int, first_token_emitted: bool = True,
                         pull_s: float | None = None) -> None:
        super().mark_transferred(req_id, first_token_emitted, pull_s)
        self._transferred.add(req_id)

    def add_request(self, req_id: int) -> None:
        if req_id not in self._transferred:
            raise ScenarioError(
                "scheduler.policy = 'distserve_decode' is for the decode pool of a "
                f"disaggregated cluster; request {req_id} reached it with its prompt to compute"
            )
        super().add_request(req_id)

    def never_fits(self, req_id: int) -> bool:
        """Also turned away: a request that, accepted into an empty pool, could not join,
        its own blocks needing to be free once more (DistServe would wait for it forever)."""
        if super().never_fits(req_id):
            return True
        join_blocks = blocks_for(self.known_tokens(req_id), self.cfg.block_size_tokens)
        return self._prompt_blocks(req_id) + join_blocks > self._room_blocks_alone()

    def schedule(self, now_s: float) -> SchedulerOutput:
        self._accept()  # post_process after the last step, then get_next_batch
        out = super().schedule(now_s)
        if not self.running and (self.accepted or self.swapped or self.resumable):
            raise ScenarioError(self._deadlock(now_s))
        return out

    def _deadlock(self, now_s: float) -> str:
        """Nobody runs, so no block will be freed, and the head cannot join: DistServe's
        loop would wait forever (a preempted head needs its blocks beside every accepted
        prompt's; an accepted one its own twice). Said in one line, not simulated."""
        head = self._next_candidate()
        assert head is not None
        held = self._num_blocks - self.allocator.num_free_blocks
        state = "accepted" if self.accepted and head == self.accepted[0] else "preempted"
        return (f"scheduler.policy = 'distserve_decode' deadlocks at {now_s:.6g} s: request "
                f"{head} ({state}, {blocks_for(self.known_tokens(head), self.cfg.block_size_tokens)} "
                f"blocks) can never join while the accepted requests hold {held} of the pool's "
                f"{self._num_blocks} blocks and nothing runs (DistServe's scheduler would wait "
                "forever); expected a decode pool with more KV (kv_capacity_tokens)")

    def _prompt_blocks(self, req_id: int) -> int:
        return blocks_for(self.requests.prompt_tokens.item(req_id), self.cfg.block_size_tokens)

    def _accept_gate(self, req_id: int) -> bool:
        return (self.accepted_blocks < self._accept_limit_blocks
                and self._prompt_blocks(req_id) <= self.allocator.num_free_blocks)

    def _accept(self) -> None:
        """Accept the unaccepted head while the gate is open: its KV is copied in now."""
        while (head := self._peek_waiting()) is not None and self._accept_gate(head):
            self._pop_waiting()  # the copy of a pulled request's KV is registered here
            blocks = self.allocator.allocate(head, self._prompt_blocks(head))
            assert blocks is not None, "the gate counted the free blocks"
            self.accepted.append(head)
            self.accepted_blocks += len(blocks)

    def _next_candidate(self) -> int | None:
        """Swapped-out requests first (in the order they went out), then any preempted by
        recompute (orcasim's fallback when the swap space is full; DistServe only swaps),
        then the accepted head (the unaccepted are not yet here)."""
        if self.swapped:
            return self._swapped_head()
        if self.resumable:
            return self.resumable[0]
        return self.accepted[0] if self.accepted else None

    def _preempt(self, victim: int, plan: Plan) -> None:
        super()._preempt(victim, plan)
        if self.cpu_blocks[victim]:  # swapped out, not recomputed
            self.swap_order.append(victim)

    def _swapped_head(self) -> int:
        return self.swap_order[0]

    def _pop_swapped(self) -> None:
        req = self.swap_order.popleft()
        self.swapped.remove(req)  # rare: a swap-in
        heapq.heapify(self.swapped)

    def _admission(self, req: int, plan: Plan) -> Admission | None:
        if not self.accepted or req != self.accepted[0]:
            return super()._admission(req, plan)  # a swap-in: its blocks are in CPU memory
        if len(self.running) >= self.cfg.max_num_seqs:
            return None
        num_new = self._num_new_tokens(req, plan.budget_tokens)
        known = self.known_tokens(req)
        # _check_add_to_cur_batch: its own blocks are among the accepted ones and again its own.
        if num_new == 0 or blocks_for(known, self.cfg.block_size_tokens) > self.allocator.num_free_blocks:
            return None
        return Admission(num_new, self.allocator.blocks_to_hold(req, known), [])

    def _take_candidate(self, req: int, plan: Plan) -> None:
        if self.accepted and self.accepted[0] == req:
            self.accepted.pop(0)
            self.accepted_blocks -= self._prompt_blocks(req)
            return
        super()._take_candidate(req, plan)

    def can_join(self, num_decoding: int) -> bool:
        head = self._peek_waiting()
        if head is not None and self._accept_gate(head):
            return True  # the next schedule accepts it (and copies its KV)
        return super().can_join(num_decoding)

    def arrival_can_join(self, req_id: int) -> bool:
        # Queued now, it is accepted at the next schedule if nobody waits before it.
        return self.num_waiting == 0 and self._accept_gate(req_id)

    def has_unfinished(self) -> bool:
        return bool(self.accepted) or super().has_unfinished()

    @property
    def num_requests(self) -> int:
        return len(self.accepted) + super().num_requests

    def queued_ids(self) -> list[int]:
        return super().queued_ids() + self.accepted

    @property
    def num_queued(self) -> int:
        return len(self.accepted) + super().num_queued
