"""vLLM's scheduler before v1 and before chunked prefill: prompts first, in iterations of their own.

`paged` with `policy: prefill_first`. Read from vLLM's `Scheduler._schedule`
(`vllm/core/scheduler.py`) and `BlockSpaceManager` (`vllm/core/block_manager.py`) of
v0.2.3 to v0.3.3, the engine of DistServe's vLLM runs (v0.2.3) and of most 2023-24
measurements; v0.4 and v0.5 keep the rules without the padding. Each iteration:

1. **Prompt phase**, only while no request is swapped out. The FCFS head of the waiting
   queue (requests preempted by recompute first, oldest first, as v0.2.3's `waiting.insert(0, ...)`
   puts them: nothing newer than a waiting one runs before it; under `preemption: swap`'s
   fallback to recompute, which vLLM lacks, a newer request swapped back in can be recomputed
   after an older one, which `insert(0, ...)` would put first and orcasim keeps behind) joins while
   - its blocks fit above the watermark: free - needed >= watermark blocks
     (`can_allocate`; unlike the newest vLLM v1's it applies even when nothing runs);
   - the prompts' tokens fit `max_num_batched_tokens`: with `pad_prompts` (v0.2.2 to v0.3.3,
     whose model runner pads every prompt of a batch to the longest) counted as
     count x longest, with at most `max_padding_tokens` of padding (`max_paddings`, 256);
     without it, as their sum (v0.4 on);
   - the running requests stay within `max_num_seqs`.
   If any prompt joined, the iteration runs the prompts alone (`prompt_run=True`): every
   running request's decode waits. A recomputed request prefills its prompt plus the
   tokens it had generated, as one prompt.
2. **Decode phase** otherwise: every running request, oldest first (`running` is kept in
   arrival order, as `policy.sort_by_priority` does each step), decodes one token. Before
   each, at least one block must be free (`can_append_slot`: one per running sequence,
   whether or not this one needs a new block); while none is, the newest running request
   is preempted, possibly the one being scheduled.
3. **Swap-in**, only if nobody was preempted in this step: swapped-out requests, oldest
   first, come back while free - (their blocks + 1) >= watermark (`can_swap_in`) and
   `max_num_seqs` allows; each decodes in this iteration.

vLLM preempts a single-sequence request by recompute unless told otherwise;
`preemption: swap` models the swap path. One departure, to keep FCFS from stalling: a
request that could not finish alone or come back from a preemption is rejected on arrival
(vLLM would wait for it at the head of the queue for good): one whose prompt, or whose peak
KV when it comes back by recompute, leaves fewer than the watermark's blocks free
(`can_allocate`); whose last decode would start with no block free (`can_append_slot`);
or, by swap, whose blocks before its last decode plus one leave fewer than the watermark's
(`can_swap_in`). See `_fits_alone_with`.

Fast-forward (`orcasim.schedulers.paged_runs`) is exact here too: a decode iteration plans
every running request, whether anyone can join (a prompt, or a swap-in while anything is
swapped) only gets less likely as free blocks fall, and a run stops before the first step
that would leave no block free (`spare_blocks_per_step`), where `can_append_slot` could
preempt; that step goes through `schedule`. Fast mode runs these units in the fused paged
loop (`orcasim.paged_fast`), which prices a prompt iteration by `padded_prompt_tokens`.
"""

from __future__ import annotations

import bisect

import numpy as np

from orcasim.cost.base import Batch
from orcasim.memory import blocks_for, peak_kv_tokens
from orcasim.requests import Requests
from orcasim.schedulers.base import FastForward, SchedulerOutput
from orcasim.schedulers.paged import Admission, PagedConfig, PagedScheduler, Plan


class PrefillFirstScheduler(PagedScheduler):
    fast_forward = FastForward(
        assumes=PagedScheduler.fast_forward.assumes + ("_swap_in", "_swap_in_blocks_fit"),
        reason="as paged, with every running request planned in a decode iteration and a "
               "step leaving one block free, so that can_append_slot never preempts in a run",
    )
    spare_blocks_per_step = 1

    def __init__(
        self, cfg: PagedConfig, requests: Requests, kv_capacity_tokens: int,
        kv_bytes_per_token: float | None = None, kv_groups: int = 1,
    ) -> None:
        assert cfg.policy == "prefill_first"
        super().__init__(cfg, requests, kv_capacity_tokens, kv_bytes_per_token, kv_groups)
        self.pad_prompts = cfg.pad_prompts
        self.max_padding_tokens = cfg.max_padding_tokens

    def schedule(self, now_s: float) -> SchedulerOutput:
        plan = Plan(self.token_budget)
        if not self.swapped:
            plan.prompts_only = True
            self.admit(plan)  # the candidates are the waiting queue: prompts
            if plan.ids:
                return self._output(plan)
            plan.prompts_only = False
        self._schedule_running(plan)
        if plan.preemptions == 0:
            self._swap_in(plan)
        return self._output(plan)

    def _swap_in(self, plan: Plan) -> None:
        """Swapped-out requests, oldest first, join this decode iteration while they fit."""
        while self.swapped and (fit := self._swap_in_blocks_fit(self.swapped[0])) is not None:
            self._join(plan, self.swapped[0], fit)

    def _fits_alone_with(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
        # vLLM v0.2.3's BlockSpaceManager: the prompt passes can_allocate (free - blocks >=
        # watermark); each decode step can_append_slot (a block free, needed or not), the
        # last one holding blocks(peak - 1). Preempted while others run, a request comes
        # back by recompute, re-prefilling up to its peak through can_allocate, or by swap
        # through can_swap_in (free - (blocks + 1) >= watermark). One that could not would
        # wait at the head of the queue for good (or, holding the whole pool with decodes
        # left, recompute itself every step), which orcasim turns away instead.
        block, room = self.cfg.block_size_tokens, self._room_blocks_alone()
        peak_tokens = peak_kv_tokens(prompt_tokens, output_tokens)
        decodes = output_tokens > 1
        held = blocks_for(np.maximum(peak_tokens - 1, 0), block)  # before the last decode
        fits = blocks_for(peak_tokens, block) <= room
        fits &= ~decodes | (held + 1 <= self._num_blocks // self.kv_groups)
        if self.cfg.preemption == "swap":
            fits &= ~decodes | (held + 1 <= room)
        return fits

    def _room_blocks_alone(self) -> int:
        """One data-parallel group's blocks less its watermark (the pool's, shared alike)."""
        group = self._num_blocks // self.kv_groups
        return group - self.watermark_blocks // self.kv_groups

    def _grow(self, req: int, target_tokens: int) -> bool:
        # can_append_slot: a block free per running sequence, needed or not.
        if self.allocator.num_free_blocks < 1:
            return False
        return self.allocator.grow_to(req, target_tokens) is not None

    def _next_candidate(self) -> int | None:
        if self.swapped:  # no prompt phase while anything is swapped out: only swap-ins
            return self.swapped[0]
        return super()._next_candidate()

    def _admission(self, req: int, plan: Plan) -> Admission | None:
        if self.swapped and req == self.swapped[0]:
            return self._swap_in_blocks_fit(req)
        return super()._admission(req, plan)

    def _swap_in_blocks_fit(self, req: int) -> Admission | None:
        """can_swap_in: its blocks plus one for this step's token, above the watermark."""
        if len(self.running) >= self.cfg.max_num_seqs:
            return None
        cpu_blocks = int(self.cpu_blocks[req])
        if self.allocator.num_free_blocks - (cpu_blocks + 1) < self.watermark_blocks:
            return None
        need = self.allocator.blocks_to_hold(req, int(self.computed[req]) + 1)
        return Admission(1, need, [])

    def _fits_batch(self, plan: Plan, num_new: int) -> bool:
        if not self.pad_prompts:
            return True  # the token budget (the prompts' sum) is checked by _num_new_tokens
        count = len(plan.num_new) + 1
        padded = count * max(num_new, max(plan.num_new, default=0))
        padding = padded - (sum(plan.num_new) + num_new)
        return padded <= self.token_budget and padding <= self.max_padding_tokens

    def _reserved_blocks(self) -> int:
        return self.watermark_blocks  # can_allocate keeps it even when nothing runs

    def _add_running(self, req: int) -> None:
        bisect.insort(self.running, req)  # oldest first: ids are in arrival order

    def padded_prompt_tokens(self, num_new: list[int]) -> int | None:
        """The length every prompt of a prompt iteration computing `num_new` runs at, as one
        causal sequence of that length, when the batch pads them (v0.2.2 to v0.3.3); None
        when each runs at its own. The fused loop (orcasim.paged_fast) prices by it too."""
        if not self.pad_prompts or len(num_new) < 2:
            return None
        return max(num_new)

    def _cost_batch(self, plan: Plan, num_new: np.ndarray, context: np.ndarray) -> Batch:
        longest = self.padded_prompt_tokens(plan.num_new) if plan.prompts_only else None
        if longest is None:
            return Batch(num_new, context)
        padded = np.full(len(num_new), longest, dtype=np.int64)
        return Batch(padded, padded.copy())

    def _join_plan(self, num_decoding: int) -> Plan:
        # A prompt iteration carries no decodes: the whole budget is the prompts'.
        return Plan(self.token_budget, prompts_only=True)
