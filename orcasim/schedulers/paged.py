"""vLLM's scheduler over a paged KV cache (Kwon et al., SOSP 2023, section 4.5).

KV memory is a pool of blocks of `block_size_tokens` (`orcasim.memory.PagedAllocator`);
a request takes a new block only when its last one fills. Each iteration, in the order
of vLLM v1's `Scheduler.schedule`:

1. Running requests, in admission order, each get their next tokens. When a block is
   needed and none is free, the most recently admitted running request is preempted
   (possibly the one being scheduled) until the block fits.
2. If nobody was preempted, preempted requests (oldest first) and then waiting ones
   are admitted FCFS, never skipping the head, while `max_num_seqs`, the token budget
   and the admission watermark allow. The watermark keeps `watermark` of the blocks
   free for running requests to grow into; it is waived when nothing runs, so the head
   can always start. A head whose whole prompt exceeds what is left of the budget stops
   admission for the step, as vLLM's main branch does; v1 releases differ here (v0.10
   skips it and admits later, shorter prompts; v0.8.5 chunks it even with chunked
   prefill off).

Preemption by `recompute` drops the victim's KV; on readmission it prefills its prompt
plus the tokens it already generated, in one step, which emits its next token (no
output token is counted twice). Preemption by `swap` copies the victim's blocks to CPU
memory (`swap_space_bytes`) over PCIe at `swap_bandwidth_bytes_per_s`, and back on
readmission; the copy time is added to the iteration. When CPU space is full, a swap
falls back to recompute. The bytes copied per token are one GPU's share of the KV
(`kv_bytes_per_token`, derived from the scenario's model and hardware unless given).

Without chunking a request's whole prompt (or, after a recompute preemption, its prompt
plus generated tokens) runs in one step, so `max_num_batched_tokens` must cover the
longest such sequence. `orcasim.schedulers.chunked` lifts that limit, and `orcasim.schedulers.prefill_first`
follows vLLM before v1 (prompts in iterations of their own).

Prefix caching (`enable_prefix_caching`, vLLM v1's `KVCacheManager`; off by default): a
request with nothing computed (new, or preempted by recompute) starts from the longest
cached prefix of its known tokens but the last (`_cache_hits`), whose blocks it shares
(`PagedAllocator.share`); a hit on a block nobody holds counts against the free pool, as
`allocate_slots` counts it. Full blocks are named by their hashes (`orcasim.prefix`) as
they are scheduled (`cache_full`). Freed blocks keep their content until handed out again.

The engine's fast mode skips `schedule` over runs of pure decodes, across KV block
boundaries up to a completion or a preemption; `orcasim.schedulers.paged_runs` says when
that is exact.
"""

from __future__ import annotations

import heapq
import warnings
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Self

import numpy as np
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

import orcasim.schedulers.paged_runs as paged_runs
from orcasim.config import ScenarioError, Strict
from orcasim.cost.base import Batch
from orcasim.memory import PagedAllocator, blocks_for, peak_kv_tokens
from orcasim.prefix import BlockHasher, block_hashes, sequence_segments
from orcasim.requests import Requests
from orcasim.schedulers.base import (
    ContinuedRun,
    DecodeRun,
    FastForward,
    Scheduler,
    SchedulerOutput,
    StepResult,
)

VLLM_SWAP_SPACE_BYTES = 4 * 2**30  # vLLM's default CPU swap space per GPU
VLLM_V0_WATERMARK = 0.01  # vLLM v0's BlockSpaceManager(watermark=0.01), which Sarathi-Serve keeps
VLLM_V0_MAX_PADDINGS = 256  # vLLM v0.2.2-v0.3.3 engine/arg_utils.py: max_paddings default (not in v0.2.1 or v0.4)
MAX_LOST_CAPACITY_FRACTION = 0.01  # KV left over after whole blocks, silently unused
PCIE4_X16_BYTES_PER_S = 25e9  # achievable host<->device copy rate of PCIe 4.0 x16 (32 GB/s peak)


class PagedMemoryConfig(Strict):
    """Settings shared by every scheduler over a paged KV cache."""

    max_num_seqs: PositiveInt = 256
    block_size_tokens: PositiveInt = 16
    preemption: Literal["recompute", "swap"] = "recompute"
    # None: the engine's own (`watermark_fraction`), resolved where the scheduler is built,
    # so that a policy set later (a sweep, an override of a saved scenario) gets its own.
    watermark: float | None = Field(default=None, ge=0.0, lt=1.0)
    swap_space_bytes: NonNegativeInt = VLLM_SWAP_SPACE_BYTES
    swap_bandwidth_bytes_per_s: PositiveFloat = PCIE4_X16_BYTES_PER_S
    # One GPU's share of a token's KV; None: derived from the scenario's model and hardware.
    kv_bytes_per_token: PositiveInt | None = None
    # vLLM v1's automatic prefix caching: off unless given, as in vLLM v0 and DistServe (v1
    # turns it on by default, SGLang its radix cache): see the module docstring.
    enable_prefix_caching: bool = False

    def watermark_fraction(self) -> float:
        """The share of blocks an admission leaves free: as given, else Sarathi-Serve's
        (vLLM v0's BlockSpaceManager default, 0.01)."""
        return VLLM_V0_WATERMARK if self.watermark is None else self.watermark

    @model_validator(mode="after")
    def _caching_settings(self) -> Self:
        if self.enable_prefix_caching and self.preemption == "swap":
            raise ScenarioError("scheduler.enable_prefix_caching needs preemption: recompute "
                                "(vLLM v1, whose prefix cache it follows, never swaps)")
        return self


# Each policy's admission watermark unless given, from its engine's code: vLLM v1's
# KVCacheManager.allocate_slots keeps none (v0.8.5; a later `watermark` argument defaults to
# 0.0); vLLM v0's BlockSpaceManager keeps 1% (watermark=0.01); DistServe's decode instance
# admits on free blocks alone (_check_add_to_cur_batch).
POLICY_WATERMARK = {"mixed": 0.0, "prefill_first": VLLM_V0_WATERMARK, "distserve_decode": 0.0}


class PagedConfig(PagedMemoryConfig):
    """`policy`: `mixed` (vLLM v1 with chunked prefill off: prefills ride with decodes under
    one token budget, a prompt whole or not at all; v1's default, chunked prefill, is
    `kind: chunked`), `prefill_first` (vLLM before v1; see `orcasim.schedulers.prefill_first`)
    or `distserve_decode` (DistServe's decode instance, for a disaggregated cluster's decode
    pool that pulls its KV; see `orcasim.schedulers.distserve_decode`). The watermark's
    default is the policy's engine's (POLICY_WATERMARK)."""

    kind: Literal["paged"]
    # Not an engine's default, which follows the model's context: vLLM before v1 takes
    # max(max_model_len, 2048), v1 without chunked prefill max_model_len (arg_utils, v0.10.1).
    # A burst of long prompts starts as many per step as this budget holds: set the engine's.
    max_num_batched_tokens: PositiveInt = 4096
    policy: Literal["mixed", "prefill_first", "distserve_decode"] = "mixed"
    pad_prompts: bool = False
    max_padding_tokens: NonNegativeInt = VLLM_V0_MAX_PADDINGS

    def watermark_fraction(self) -> float:
        """As given, else the policy's engine's (POLICY_WATERMARK)."""
        return POLICY_WATERMARK[self.policy] if self.watermark is None else self.watermark

    @model_validator(mode="after")
    def _policy_settings(self) -> Self:
        if self.enable_prefix_caching and self.policy != "mixed":
            raise ScenarioError("scheduler.enable_prefix_caching applies only to policy: mixed "
                                "(it follows vLLM v1's prefix cache)")
        if self.pad_prompts and self.policy != "prefill_first":
            raise ScenarioError("pad_prompts applies only to policy: prefill_first (vLLM v0.2-v0.3)")
        if self.policy != "distserve_decode":  # DistServe's decode instance has no such rule
            check_budget_holds_seqs("max_num_batched_tokens", self.max_num_batched_tokens,
                                    self.max_num_seqs)
        return self


def check_budget_holds_seqs(key: str, budget_tokens: int, max_num_seqs: int) -> None:
    """vLLM's SchedulerConfig._verify_args (v0 and v1, chunked prefill on or off): the
    token budget holds at least `max_num_seqs` tokens. Every running request takes one
    token of it a step, so below that it would quietly cap the batch at the budget."""
    if budget_tokens < max_num_seqs:
        raise ScenarioError(
            f"{key} = {budget_tokens} is below max_num_seqs = {max_num_seqs}; expected >= "
            "max_num_seqs, as vLLM requires (each running request takes a token a step: "
            f"at most {budget_tokens} would run)")


# Settings read only under another one's value: (the setting, the one it needs, its value).
_READ_ONLY_WITH = (("swap_space_bytes", "preemption", "swap"),
                   ("swap_bandwidth_bytes_per_s", "preemption", "swap"),
                   ("kv_bytes_per_token", "preemption", "swap"),  # the bytes a swap copies
                   ("max_padding_tokens", "pad_prompts", True))


def warn_unused_settings(cfg: PagedMemoryConfig) -> None:
    """A setting given where what reads it is off (swap_space_bytes under preemption:
    recompute, max_padding_tokens without pad_prompts) changed nothing without a word (a
    tester's finding). Said where it differs from the default, which a saved scenario's dump
    writes out; not refused, as a sweep of `preemption` over one base keeps the swap's."""
    for key, needs, value in _READ_ONLY_WITH:
        if key not in type(cfg).model_fields or getattr(cfg, needs) == value:
            continue
        given = getattr(cfg, key)
        if given != type(cfg).model_fields[key].default:
            warnings.warn(f"scheduler.{key} = {given} is not used: it is read only with "
                          f"{needs}: {str(value).lower()}, and {needs} is "
                          f"{str(getattr(cfg, needs)).lower()}; expected {needs}: "
                          f"{str(value).lower()}, or the key left out", UserWarning, stacklevel=3)


class Admission(NamedTuple):
    """What the FCFS head would take on joining: tokens to compute, new blocks, and the
    cached blocks of its prefix it starts from (a prefix-cache hit)."""

    num_new_tokens: int
    new_blocks: int
    hit_blocks: list[int]


@dataclass
class Plan:
    """One iteration being assembled (also what an admission check is asked against)."""

    budget_tokens: int
    prompts_only: bool = False  # a prefill-first prompt iteration (no decodes)
    ids: list[int] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)
    preemptions: int = 0
    recomputed_tokens: int = 0
    copy_time_s: float = 0.0


def num_blocks_for_capacity(kv_capacity_tokens: int, block_size_tokens: int) -> int:
    """Whole blocks in the pool. A capacity derived from model and hardware is rarely a
    multiple of the block size, so the tail is dropped, but only if it is a sliver."""
    num_blocks = kv_capacity_tokens // block_size_tokens
    lost_tokens = kv_capacity_tokens - num_blocks * block_size_tokens
    if num_blocks == 0 or lost_tokens > MAX_LOST_CAPACITY_FRACTION * kv_capacity_tokens:
        lower = num_blocks * block_size_tokens
        hint = f"a multiple such as {lower} or {lower + block_size_tokens}" if lower else \
            f"at least {block_size_tokens}"
        raise ScenarioError(
            f"scheduler.block_size_tokens = {block_size_tokens} does not divide "
            f"kv_capacity_tokens = {kv_capacity_tokens} (whole blocks would lose {lost_tokens} "
            f"tokens); expected kv_capacity_tokens {hint}, or a smaller block"
        )
    return num_blocks


class PagedScheduler(Scheduler):
    """vLLM-style continuous batching over paged KV; `chunked_prefill` is Sarathi's variant."""

    chunked_prefill = False
    PER_REQUEST_ARRAYS = (*Scheduler.PER_REQUEST_ARRAYS, "cpu_blocks", "peak_computed")
    fast_forward = FastForward(
        assumes=("schedule", "update_from_output", "_schedule_running", "_decode_all", "_make_room",
                 "_preempt", "admit", "_admissible_head", "_admission", "_next_candidate",
                 "_join", "_take_candidate", "_num_new_tokens", "_grow", "_fits_batch", "_reserved_blocks",
                 "_add_running", "_cost_batch", "_join_plan", "release", "never_fits",
                 "known_tokens", "_cache_hits", "cache_full", "quotes_running_output", "fcfs_head"),
        reason="between admissions, completions and preemptions the running set only decodes; "
               "free blocks only fall, so a blocked FCFS head stays blocked (paged_runs)",
    )

    def __init__(
        self, cfg: PagedConfig, requests: Requests, kv_capacity_tokens: int,
        kv_bytes_per_token: float | None = None, kv_groups: int = 1,
    ) -> None:
        self._setup(cfg, requests, kv_capacity_tokens, cfg.max_num_batched_tokens,
                    kv_bytes_per_token, kv_groups)
        self._check_budget()

    def _setup(
        self, cfg: PagedMemoryConfig, requests: Requests, kv_capacity_tokens: int,
        token_budget: int, kv_bytes_per_token: float | None, kv_groups: int = 1,
    ) -> None:
        """`kv_bytes_per_token`: one GPU's share, derived from the deployment (cfg's wins)."""
        super().__init__(requests, kv_capacity_tokens, kv_groups)
        self.cfg = cfg
        self.token_budget = token_budget
        num_blocks = num_blocks_for_capacity(kv_capacity_tokens, cfg.block_size_tokens)
        self.caching = cfg.enable_prefix_caching
        if self.caching and kv_groups > 1:
            # Each group's engine has its own prefix cache; one allocator over the pooled KV
            # would let a request hit what another group cached (and hold a prefix once).
            raise ScenarioError(
                f"scheduler.enable_prefix_caching = true needs hardware.data_parallel_attention = 1, "
                f"got {kv_groups}: each data-parallel attention group keeps its own prefix cache, "
                "which one scheduler over the groups' pooled KV would share; expected "
                "data_parallel_attention: 1, or enable_prefix_caching: false")
        self.allocator = PagedAllocator(num_blocks, cfg.block_size_tokens, self.caching)
        self.hasher = BlockHasher(requests, cfg.block_size_tokens)
        self.watermark_blocks = int(cfg.watermark_fraction() * num_blocks)
        self._num_blocks = num_blocks
        self._rows_at_arrival = requests.sessions is not None
        self._peak_tokens = peak_kv_tokens(requests.prompt_tokens, requests.output_tokens)
        if requests.sessions is not None:
            # Rows are written at arrival (orcasim.sessions), and `never_fits` reads them
            # then. Here, for `_check_budget`: each step's bound, where a call that fits
            # alone may reach it (a longer one is turned away).
            # Clipped to the room, each bound fits.
            room_tokens = self._room_blocks_alone() * cfg.block_size_tokens
            self._peak_tokens = np.minimum(requests.sessions.peak_bound_tokens(), room_tokens)
            self._fits_alone = np.ones(len(self._peak_tokens), dtype=bool)
        else:
            self._fits_alone = self._fits_alone_with(requests.prompt_tokens, requests.output_tokens)
        self.swap_capacity_blocks = self._swap_capacity_blocks(kv_bytes_per_token)
        warn_unused_settings(cfg)
        self.swapped_blocks = 0  # blocks now held in CPU memory
        n = len(requests)
        self.running: list[int] = []  # holds GPU blocks, in admission order
        self.resumable: list[int] = []  # heap of ids preempted by recompute
        self.swapped: list[int] = []  # heap of ids whose KV is in CPU memory
        self.cpu_blocks = np.zeros(n, dtype=np.int64)
        self.peak_computed = np.zeros(n, dtype=np.int64)  # to tell recomputation from progress
        self.preemptions_total = 0
        # Preempted while planning a step that ran nothing (a prefill instance's lone request,
        # its blocks held by finished requests whose KV has not moved yet): no iteration row
        # records that plan, so the next plan that runs carries the count.
        self.unrecorded_preemptions = 0
        self.recomputed_tokens_total = 0
        self.holds_finished = False  # set on a disaggregated cluster's prefill instances
        self.held: set[int] = set()  # finished, KV not yet moved (see `release`)
        self.held_tokens = 0  # their KV, which `running`'s context sums leave out

    def _swap_capacity_blocks(self, derived_kv_bytes_per_token: float | None) -> int:
        kv_bytes = self.cfg.kv_bytes_per_token or derived_kv_bytes_per_token
        if kv_bytes is None:
            if self.cfg.preemption == "swap":
                raise ScenarioError(
                    "scheduler.preemption = 'swap' needs the bytes of a token's KV: give "
                    "scheduler.kv_bytes_per_token, or the scenario keys 'model' and 'hardware'"
                )
            return 0  # recompute never swaps
        self.kv_bytes_per_token = float(kv_bytes)
        # swap_space_bytes is per GPU: each data-parallel group's rank has its own.
        return self.kv_groups * int(self.cfg.swap_space_bytes // (kv_bytes * self.cfg.block_size_tokens))

    def _fits_alone_with(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
        """Whether each request can run to its end, alone or coming back from a preemption:
        its peak KV (every token but the last generated one) fits the pool."""
        peak_blocks = blocks_for(peak_kv_tokens(prompt_tokens, output_tokens), self.cfg.block_size_tokens)
        return peak_blocks <= self._room_blocks_alone()

    def _room_blocks_alone(self) -> int:
        """The most blocks a request that fits may hold (a bound of `_fits_alone_with`):
        one data-parallel group's share of the pool."""
        return self._num_blocks // self.kv_groups

    def _check_budget(self) -> None:
        """Without chunking the longest (re)prefill must fit one step's token budget."""
        # After a recompute preemption a request prefills prompt + generated tokens at once.
        longest = np.where(self._fits_alone, self._peak_tokens, 0)
        i = int(np.argmax(longest)) if len(longest) else 0
        what = "a session step" if self._rows_at_arrival else f"request {i}"
        if len(longest) and longest[i] > self.token_budget:
            raise ScenarioError(
                f"scheduler.max_num_batched_tokens = {self.token_budget} is below {what}'s "
                f"prompt + output - 1 = {int(longest[i])} tokens, which it must "
                f"prefill in one step without chunking; expected >= {int(longest[i])} "
                "(or use kind: chunked)"
            )

    def add_request(self, req_id: int) -> None:
        # A session run writes a row when it arrives (and may rewrite the next one before):
        # hashes computed while it was pending would be of another row.
        self.hasher.forget(req_id)
        super().add_request(req_id)

    def never_fits(self, req_id: int) -> bool:
        if self._rows_at_arrival:
            r = self.requests
            return not bool(self._fits_alone_with(r.prompt_tokens[req_id:req_id + 1],
                                                  r.output_tokens[req_id:req_id + 1])[0])
        return not self._fits_alone.item(req_id)

    def known_tokens(self, req_id: int) -> int:
        return self.requests.prompt_tokens.item(req_id) + self.generated.item(req_id)

    def _num_new_tokens(self, req_id: int, budget_tokens: int, computed_tokens: int | None = None) -> int:
        """Tokens to compute now: all that are known, or a chunk of them when chunking
        (`computed_tokens`: where it would start, if not from its computed tokens)."""
        start = self.computed.item(req_id) if computed_tokens is None else computed_tokens
        # known_tokens, inlined: every admission check asks
        need = self.requests.prompt_tokens.item(req_id) + self.generated.item(req_id) - start
        if self.chunked_prefill:
            return min(need, budget_tokens)
        return need if need <= budget_tokens else 0

    def schedule(self, now_s: float) -> SchedulerOutput:
        plan = Plan(self.token_budget)
        self._schedule_running(plan)
        if plan.preemptions == 0:
            self.admit(plan)
        return self._output(plan)

    def _schedule_running(self, plan: Plan) -> None:
        if self._decode_all(plan):
            return
        i = 0
        while i < len(self.running):
            req = self.running[i]
            num_new = self._num_new_tokens(req, plan.budget_tokens)
            if num_new == 0 or not self._make_room(req, num_new, plan):
                return
            self.add_to_plan(plan, req, num_new)
            i += 1

    def _decode_all(self, plan: Plan) -> bool:
        """The loop of `_schedule_running` at once when it cannot preempt: every running
        request decodes one token and the blocks they take leave `spare_blocks_per_step`
        free (so every `_grow` succeeds, `prefill_first`'s included). The same plan, the
        same blocks in the same order (`allocate_one_each`); False: nothing changed, the
        loop decides. Most iterations are this; the loop costs Python work per request."""
        running = self.running
        size = len(running)
        if self.caching or size == 0 or size > plan.budget_tokens:
            return False  # caching names blocks one request at a time (`cache_full`)
        ids = np.array(running, dtype=np.int64)
        computed = self.computed[ids]
        if not np.all(self.requests.prompt_tokens[ids] + self.generated[ids] - computed == 1):
            return False  # a prompt (chunk) to compute
        tables = self.allocator.tables
        short = blocks_for(computed + 1, self.cfg.block_size_tokens) - \
            np.array([len(tables.get(r, ())) for r in running], dtype=np.int64)
        takers = ids[short > 0]
        if len(takers) + self.spare_blocks_per_step > self.allocator.num_free_blocks:
            return False
        if int(short.max()) > 1:
            return False  # a table short of more than this token's block: the loop grows it
        blocks = self.allocator.allocate_one_each(takers.tolist())  # not in the assert: -O drops it
        assert blocks is not None, "the free blocks were counted"
        # No recomputed tokens: a running request one token from its known ones has computed
        # at least as many as ever (a recompute re-prefills all but the last known token).
        plan.ids.extend(running)
        plan.num_new.extend([1] * size)
        plan.budget_tokens -= size
        return True

    def _make_room(self, req: int, num_new: int, plan: Plan) -> bool:
        """Grow `req`'s blocks, preempting the newest running requests; False if `req` went."""
        target_tokens = int(self.computed[req]) + num_new
        while not self._grow(req, target_tokens):
            victim = self.running.pop()  # newest; everyone before `req` is already planned
            self._preempt(victim, plan)
            if victim == req:
                return False
        self.cache_full(req, target_tokens)
        return True

    def _grow(self, req: int, target_tokens: int) -> bool:
        """Grow `req`'s table to `target_tokens` if the policy allows it now; else change
        nothing and return False (the caller preempts)."""
        return self.allocator.grow_to(req, target_tokens) is not None

    def _preempt(self, victim: int, plan: Plan) -> None:
        blocks = self.allocator.free(victim)
        self.preemptions_per_request[victim] += 1
        self.preemptions_total += 1
        plan.preemptions += 1
        if self.cfg.preemption == "swap" and self.swapped_blocks + blocks <= self.swap_capacity_blocks:
            self.cpu_blocks[victim] = blocks
            self.swapped_blocks += blocks
            plan.copy_time_s += self._copy_time_s(blocks)
            heapq.heappush(self.swapped, victim)
        else:  # recompute (also the fallback when CPU swap space is full)
            self.computed[victim] = 0
            heapq.heappush(self.resumable, victim)

    def _swapped_head(self) -> int:
        """The swapped-out request that comes back first: the oldest (vLLM sorts its swapped
        queue by arrival)."""
        return self.swapped[0]

    def _pop_swapped(self) -> None:
        heapq.heappop(self.swapped)

    def _copy_time_s(self, blocks: int) -> float:
        copied_bytes = blocks * self.cfg.block_size_tokens * self.kv_bytes_per_token
        return copied_bytes / self.cfg.swap_bandwidth_bytes_per_s

    def _next_candidate(self) -> int | None:
        """FCFS head: preempted requests (all admitted before any waiting one), oldest first."""
        if not (self.swapped or self.resumable):  # nobody preempted: most calls
            return self._peek_waiting()
        heads = [q[0] for q in (self.swapped, self.resumable) if q]
        return min(heads)

    def admit(self, plan: Plan) -> None:
        """FCFS admission into `plan` (its running part assembled): preempted requests first,
        then waiting ones, while each fits. The fused loop (orcasim.paged_fast) calls it too."""
        while (head := self._admissible_head(plan)) is not None:
            self._join(plan, *head)

    def _join(self, plan: Plan, req: int, admission: Admission) -> None:
        """The candidate `req` joins `plan` as `admission` says."""
        num_new, need_blocks, hits = admission
        if hits:  # it starts from its cached prefix: those tokens are computed already
            self.allocator.share(req, hits)
            self.computed[req] = len(hits) * self.cfg.block_size_tokens
        if self.caching:
            self._count_hit(req, len(hits) * self.cfg.block_size_tokens)
        blocks = self.allocator.allocate(req, need_blocks)  # not in the assert: python -O drops it
        assert blocks is not None, "_admission counted the free blocks"
        if self.caching:  # tested here, not in the call: every joiner passes
            self.cache_full(req, self.computed.item(req) + num_new)
        self._take_candidate(req, plan)
        self._add_running(req)
        self.add_to_plan(plan, req, num_new)

    def _add_running(self, req: int) -> None:
        self.running.append(req)

    def _admissible_head(self, plan: Plan) -> tuple[int, Admission] | None:
        """The FCFS head and what it takes, if it can join `plan` now; else None."""
        req = self._next_candidate()
        if req is None:
            return None
        admission = self._admission(req, plan)
        return None if admission is None else (req, admission)

    def _admission(self, req: int, plan: Plan) -> Admission | None:
        """What `req` would take if, as the head, it could join `plan` now; else None."""
        if len(self.running) >= self.cfg.max_num_seqs:
            return None
        if self.caching:
            hits = self._cache_hits(req)
            start = self.computed.item(req) + len(hits) * self.cfg.block_size_tokens
        else:  # no hits without a cache
            hits, start = [], self.computed.item(req)
        num_new = self._num_new_tokens(req, plan.budget_tokens, start)
        if num_new == 0 or not self._fits_batch(plan, num_new):
            return None
        need = self.allocator.blocks_to_hold(req, start + num_new) - len(hits)
        # A hit on a block nobody holds takes it out of the free pool (vLLM v1's
        # allocate_slots counts it as allocated).
        taken = need + self.allocator.num_evictable(hits) if hits else need
        if taken + self._reserved_blocks() > self.allocator.num_free_blocks:
            return None  # FCFS: never skip ahead of a request that does not fit
        return Admission(num_new, need, hits)

    # Prefix caching (vLLM v1's KVCacheManager; see the module docstring).

    def _cache_hits(self, req: int) -> list[int]:
        """The cached blocks `req` would start from: the longest cached prefix of its known
        tokens but the last, which is computed again for its logits (vLLM v1's
        get_computed_blocks). Only a request with nothing computed looks (a new one, or
        one preempted by recompute)."""
        if not self.caching or self.computed[req]:
            return []
        max_blocks = (self.known_tokens(req) - 1) // self.cfg.block_size_tokens
        return self.allocator.lookup(self.hasher.hashes(req, max_blocks))

    def cache_full(self, req: int, tokens: int) -> None:
        """Name `req`'s full blocks up to `tokens` by their hashes, as it schedules them."""
        if not self.caching:  # every decode step of every request passes here
            return
        full_blocks = tokens // self.cfg.block_size_tokens
        if full_blocks > self.allocator.num_cached_of(req):
            self.allocator.cache(req, self.hasher.hashes(req, full_blocks))

    def _count_hit(self, req: int, hit_tokens: int) -> None:
        self.prefill_saved_tokens[req] += hit_tokens
        if not self.preemptions_per_request[req]:  # vLLM reports its first scheduling's hit
            self.cached_tokens[req] = hit_tokens

    def quotes_running_output(self, req: int) -> bool:
        """Whether `req`'s prompt holds the output of a request still running: that
        output's blocks, cached as it decodes, would be hits for `req` (fast-forward
        must not predict across that)."""
        content = self.requests.content
        if not self.caching or content is None or not self.running:
            return False
        quoted = set(content.prompts[req][0::2])
        return any(int(content.output_ids[r]) in quoted for r in self.running)

    def _fits_batch(self, plan: Plan, num_new: int) -> bool:
        """Batch limits beyond the token budget (prefill-first padding); none here."""
        return True

    def _reserved_blocks(self) -> int:
        """The watermark an admission must leave free; waived when nothing runs (as the
        newest vLLM v1 applies its own, only while requests are scheduled)."""
        return self.watermark_blocks if self.running else 0

    def _take_candidate(self, req: int, plan: Plan) -> None:
        if self.swapped and self._swapped_head() == req:
            self._pop_swapped()
            plan.copy_time_s += self._copy_time_s(int(self.cpu_blocks[req]))
            self.swapped_blocks -= int(self.cpu_blocks[req])
            self.cpu_blocks[req] = 0
        elif self.resumable and self.resumable[0] == req:
            heapq.heappop(self.resumable)
        else:
            popped = self._pop_waiting()  # not inside the assert: python -O drops it
            assert popped == req

    def add_to_plan(self, plan: Plan, req: int, num_new: int) -> None:
        """`req` computes `num_new` tokens in `plan` (those it computed before and lost to a
        recompute preemption count as recomputed). The fused loop (orcasim.paged_fast) adds
        a prompt chunk left over from an earlier plan this way too."""
        redo = self.peak_computed.item(req) - self.computed.item(req)
        plan.recomputed_tokens += min(max(redo, 0), num_new)
        plan.ids.append(req)
        plan.num_new.append(num_new)
        plan.budget_tokens -= num_new

    def _output(self, plan: Plan) -> SchedulerOutput:
        ids = np.array(plan.ids, dtype=np.int64)
        num_new = np.array(plan.num_new, dtype=np.int64)
        context = self.computed[ids] + num_new
        used = int(self.computed[self.running].sum() + num_new.sum())
        allocated = self.allocator.allocated_tokens
        used -= self.shared_kv_tokens()
        assert used >= 0
        assert plan.budget_tokens >= 0 and len(ids) <= self.cfg.max_num_seqs
        assert used <= allocated <= self.allocator.num_blocks * self.cfg.block_size_tokens
        assert self.allocator.num_blocks * self.cfg.block_size_tokens <= self.kv_capacity_tokens
        assert self.swapped_blocks <= self.swap_capacity_blocks
        self.recomputed_tokens_total += plan.recomputed_tokens
        preemptions = plan.preemptions + self.unrecorded_preemptions
        self.unrecorded_preemptions = 0 if len(ids) else preemptions
        pull_s, pulled = self.take_pulled()
        return SchedulerOutput(
            ids, num_new, self._cost_batch(plan, num_new, context), allocated, kv_used_tokens=used,
            preemptions=preemptions if len(ids) else 0, recomputed_tokens=plan.recomputed_tokens,
            copy_time_s=pull_s + plan.copy_time_s, pulled=pulled,
        )

    def _cost_batch(self, plan: Plan, num_new: np.ndarray, context: np.ndarray) -> Batch:
        """What the cost model sees: the tokens computed (a padding policy pads them)."""
        return Batch(num_new, context)

    def update_from_output(self, out: SchedulerOutput) -> StepResult:
        ids = out.req_ids
        self.computed[ids] += out.num_new_tokens
        self.peak_computed[ids] = np.maximum(self.peak_computed[ids], self.computed[ids])
        known = self.requests.prompt_tokens[ids] + self.generated[ids]
        assert np.all(self.computed[ids] <= known)
        # Only a request whose known tokens are all computed emits one; a prompt chunk does not.
        emitting = ids[self.computed[ids] == known]
        self.generated[emitting] += 1
        first = emitting[self.generated[emitting] == 1]
        done = emitting[self.generated[emitting] == self.requests.output_tokens[emitting]]
        if len(done):
            self.release(done)
        return StepResult(first, done)

    def release(self, done: np.ndarray | list[int]) -> None:
        """Free finished requests' blocks, in batch order, and drop them from `running`.

        A prefill instance of a disaggregated cluster (`holds_finished`) keeps them until
        the KV has moved to a decode instance (`release_held`).
        """
        ids = done.tolist() if isinstance(done, np.ndarray) else done
        for req in ids:
            if self.holds_finished:
                self.held.add(req)
                self.held_tokens += int(self.computed[req])
            else:
                self.allocator.free(req)
            self.hasher.forget(req)
        running = self.running
        for req in ids:  # each is running: a few of tens, where a rebuilt list costs more
            running.remove(req)

    def has_unfinished(self) -> bool:
        return bool(self.running or self.resumable or self.swapped) or self.num_waiting > 0

    def release_held(self, req_id: int) -> None:
        """A held request's KV has moved away: free its blocks."""
        self.held.remove(req_id)
        self.held_tokens -= int(self.computed[req_id])
        self.allocator.free(req_id)

    def held_ids(self) -> list[int]:
        return sorted(self.held)

    def mark_transferred(self, req_id: int, first_token_emitted: bool = True,
                         pull_s: float | None = None) -> None:
        super().mark_transferred(req_id, first_token_emitted, pull_s)
        self.peak_computed[req_id] = self.computed[req_id]  # moved in, not recomputed

    def active_ids(self) -> list[int]:
        return list(self.running)

    @property
    def num_requests(self) -> int:
        return len(self.running) + len(self.swapped) + len(self.resumable) + self.num_waiting

    def queued_ids(self) -> list[int]:
        return sorted(self.swapped) + sorted(self.resumable) + super().queued_ids()

    @property
    def num_queued(self) -> int:
        return len(self.swapped) + len(self.resumable) + self.num_waiting

    def cache_evictions(self) -> int:
        return self.allocator.evictions

    def cached_prefix_tokens(self, req_id: int) -> int:
        if not self.caching:
            return 0
        block = self.cfg.block_size_tokens
        # Not remembered: the request may go elsewhere (and a session row may be rewritten).
        hashes = block_hashes(sequence_segments(self.requests, req_id), block,
                              (int(self.requests.prompt_tokens[req_id]) - 1) // block)
        return len(self.allocator.lookup(hashes)) * block

    def kv_in_use_tokens(self) -> int:
        return self.allocator.allocated_tokens

    # What the fast-forward hooks (orcasim.schedulers.paged_runs) ask of the policy.

    # Blocks a decode step must leave free for it to be sure nobody is preempted.
    spare_blocks_per_step = 0

    def can_join(self, num_decoding: int) -> bool:
        """Whether the next `schedule`, with `num_decoding` decodes planned, would admit anyone."""
        if self._next_candidate() is None:
            return False  # nobody to admit (most runs): no plan to build
        return self._admissible_head(self._join_plan(num_decoding)) is not None

    def arrival_can_join(self, req_id: int) -> bool:
        """Whether `req_id`, queued now, would join at the next `schedule` (FCFS: only as head)."""
        if self._next_candidate() is not None:
            return False
        return self._admission(req_id, self._join_plan(len(self.running))) is not None

    # With prefix caching a blocked head can become admissible in two ways that fast-forward
    # must not predict across: a running request's output that its prompt quotes gets cached
    # as it decodes, or (chunked prefill) an eviction cuts its cached prefix short, so
    # that it needs fewer blocks for the chunk that fits its budget (the evicted hits stop
    # counting against the free pool, and the chunk's blocks stay as many).

    def shared_kv_tokens(self) -> int:
        """What the running requests' KV summed misses of the KV in use, negated: tokens
        they share (a cached prefix) counted once per holder beyond the first, less the KV
        of finished requests a prefill instance holds until it moves (`held`). Their shares
        of a cached prompt were subtracted and their own KV never added: a prefill pool with
        caching read down to -46,060 tokens in use on a pool of 5,000 (a tester's finding)."""
        return self.allocator.num_shared_holds * self.cfg.block_size_tokens - self.held_tokens

    def fcfs_head(self) -> int | None:
        """The request that joins next if anyone does: preempted ones first, then waiting."""
        return self._next_candidate()

    def cache_may_admit(self, req_id: int) -> bool:
        """Whether the prefix cache could let `req_id`, blocked now, join in a decode run."""
        if not self.caching:
            return False
        if self.quotes_running_output(req_id):
            return True
        return self.chunked_prefill and self.allocator.num_evictable(self._cache_hits(req_id)) > 0

    def allocations_keeping_head(self) -> int | None:
        """How many blocks a run may take before one of them would evict a cached block
        the FCFS head starts from (None: no limit; see `cache_may_admit`)."""
        if not (self.caching and self.chunked_prefill):
            return None
        req = self._next_candidate()
        return None if req is None else self.allocator.takes_before_evicting(self._cache_hits(req))

    def _join_plan(self, num_decoding: int) -> Plan:
        """The plan an admission would join after `num_decoding` decodes took their tokens."""
        return Plan(self.token_budget - num_decoding)

    # Fast-forward hooks (see Scheduler); the reasoning is in `orcasim.schedulers.paged_runs`.

    def decode_run(self, plan: SchedulerOutput) -> DecodeRun | None:
        return paged_runs.decode_run(self, plan)

    def admits_arrival(self, req_id: int) -> bool:
        return paged_runs.admits_arrival(self, req_id)

    def advance(
        self, plan: SchedulerOutput, run: DecodeRun | None, num_iterations: int
    ) -> tuple[StepResult, StepResult]:
        return paged_runs.advance(self, plan, run, num_iterations)

    def continue_run(self) -> ContinuedRun | None:
        return paged_runs.continue_run(self)

    def advance_run(self, run: ContinuedRun, num_steps: int) -> StepResult:
        return paged_runs.advance_run(self, run, num_steps)
