"""The paged schedulers under KV pressure against a second, independent reading of vLLM's rules.

`VllmReading` is a plain loop written from vLLM's schedulers, not from orcasim's code: v1's
`Scheduler.schedule` (`policy: mixed`, and `kind: chunked`, its chunked prefill) and v0.2.3's
`Scheduler._schedule` with `BlockSpaceManager` (`policy: prefill_first`), preemption by
recompute, and v1's prefix cache (`KVCacheManager`, `BlockPool`) where a case shares a system
prompt: a request with nothing computed starts from the cached blocks of its tokens but the
last (a hit on a free block takes it from the free queue), full blocks are cached as they are
scheduled, freed blocks join the free queue's tail, a request's last block first, and the
queue's head is handed out (and evicted) first. Running requests go first, oldest first; a
block that does not fit preempts the newest running request (possibly the one asking), which
drops its KV and goes to the front of the waiting queue (`appendleft`, v0's `insert(0, ...)`); nobody is admitted
in a step that preempted (v1), or prompts run alone and decodes need a free block each
(v0's `can_append_slot`). A readmitted request prefills its prompt and every token it had
generated, and emits its next token. Two rules are orcasim's, vLLM having none to read: a
request whose peak KV cannot fit the pool is turned away on arrival (`never_fits`), and a
watermark given to v1's policies holds back an admission only while something runs (v0's
`can_allocate` keeps it always).

On tiny random cases (a few blocks, a few requests, a linear cost whose sums are exact in
binary) both engine modes must give the same first-token and finish times, per-request
preemptions, preemptions recorded in the iteration rows and recomputed tokens; with the cache,
the same hits at first admission (`cached_tokens`), saved prefill over every admission (a
preempted request finds its own blocks again) and evictions.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orcasim.cost.linear import LinearCost, LinearCostConfig
from orcasim.engine import Engine
from orcasim.requests import PromptContent, Requests
from orcasim.schedulers import build_scheduler
from orcasim.schedulers.chunked import ChunkedConfig
from orcasim.schedulers.paged import PagedConfig
from tests.conftest import examples

# Powers of two: every iteration time and every sum of them is exact in binary.
BASE_S, PER_TOKEN_S, PER_CONTEXT_TOKEN_S = 1.0, 0.125, 0.0625
EXAMPLES = 60


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Case:
    arrival_s: list[float]
    prompts: list[int]
    outputs: list[int]
    policy: str  # mixed, chunked or prefill_first
    block: int
    num_blocks: int
    budget: int
    max_seqs: int
    watermark: float
    shared_tokens: int = 0  # a system prompt before every prompt, cached (v1 only); 0: no cache

    @property
    def caching(self) -> bool:
        return self.shared_tokens > 0


class VllmReading:
    """vLLM's scheduling of `case`'s requests, one step at a time (see the module docstring)."""

    def __init__(self, case: Case) -> None:
        self.c = case
        n = len(case.prompts)
        self.reserve = int(case.watermark * case.num_blocks)
        self.computed, self.generated, self.peak = [0] * n, [0] * n, [0] * n
        self.first_token_s, self.finish_s = [np.nan] * n, [np.nan] * n
        self.preemptions, self.cached_tokens, self.saved_tokens = [0] * n, [0] * n, [0] * n
        self.recomputed_tokens, self.evictions = 0, 0
        self.tables: list[list[int]] = [[] for _ in range(n)]
        self.queue = OrderedDict.fromkeys(range(case.num_blocks))  # free blocks, head first
        self.refs: dict[int, int] = {}
        self.cached: dict[tuple, dict[int, None]] = {}  # a block's tokens, from the start -> blocks
        self.hash_of: dict[int, tuple] = {}
        self.waiting: deque[int] = deque()
        self.running: list[int] = []

    def run(self) -> VllmReading:
        c, now_s, arrived = self.c, 0.0, 0
        while True:
            while arrived < len(c.prompts) and c.arrival_s[arrived] <= now_s:
                if self.fits_alone(arrived):
                    self.waiting.append(arrived)
                arrived += 1
            if not self.waiting and not self.running:
                if arrived == len(c.prompts):
                    return self
                now_s = c.arrival_s[arrived]
                continue
            plan = self.v0_step() if c.policy == "prefill_first" else self.v1_step()
            assert plan, "a step with nothing to run"
            now_s = self.apply(plan, now_s)

    def fits_alone(self, r: int) -> bool:
        c = self.c
        peak_tokens = c.prompts[r] + c.outputs[r] - 1
        if c.policy != "prefill_first":
            return _cdiv(peak_tokens, c.block) <= c.num_blocks
        last_decode_ok = c.outputs[r] == 1 or _cdiv(peak_tokens - 1, c.block) + 1 <= c.num_blocks
        return _cdiv(peak_tokens, c.block) <= c.num_blocks - self.reserve and last_decode_ok

    def to_compute(self, r: int) -> int:
        return self.c.prompts[r] + self.generated[r] - self.computed[r]

    @property
    def free(self) -> int:
        return len(self.queue)

    def tokens(self, r: int, num_tokens: int) -> tuple:
        """What `r`'s first `num_tokens` tokens are: the system prompt, its own, its output."""
        shared, prompt = self.c.shared_tokens, self.c.prompts[r]
        return tuple(("system", k) if k < shared else ("own" if k < prompt else "out", r, k)
                     for k in range(num_tokens))

    def take(self, r: int, count: int) -> None:
        """`count` blocks from the free queue's head onto `r`'s table; their content is lost."""
        for _ in range(count):
            block, _ = self.queue.popitem(last=False)
            content = self.hash_of.pop(block, None)
            if content is not None:
                del self.cached[content][block]
                if not self.cached[content]:
                    del self.cached[content]
                self.evictions += 1
            self.refs[block] = 1
            self.tables[r].append(block)

    def cache_full(self, r: int, num_tokens: int) -> None:
        """Name `r`'s full blocks by their content (a block cached already keeps its name)."""
        if not self.c.caching:
            return
        for j in range(num_tokens // self.c.block):
            block = self.tables[r][j]
            if block not in self.hash_of:
                content = self.tokens(r, (j + 1) * self.c.block)
                self.hash_of[block] = content
                self.cached.setdefault(content, {})[block] = None

    def grow(self, r: int, num_tokens: int) -> bool:
        need = max(0, _cdiv(num_tokens, self.c.block) - len(self.tables[r]))
        if need > self.free:
            return False
        self.take(r, need)
        self.cache_full(r, num_tokens)
        return True

    def release(self, r: int) -> None:
        """Drop `r`'s hold on its blocks, its last block first; free ones keep their content."""
        for block in reversed(self.tables[r]):
            self.refs[block] -= 1
            if not self.refs[block]:
                del self.refs[block]
                self.queue[block] = None
        self.tables[r] = []

    def hits(self, r: int) -> list[int]:
        """The cached blocks `r` starts from: its known tokens but the last (get_computed_blocks)."""
        if not self.c.caching or self.computed[r]:
            return []
        found = []
        for j in range((self.c.prompts[r] + self.generated[r] - 1) // self.c.block):
            blocks = self.cached.get(self.tokens(r, (j + 1) * self.c.block))
            if blocks is None:
                break
            found.append(next(iter(blocks)))
        return found

    def preempt(self, victim: int) -> None:
        """By recompute: its KV is dropped, and it waits at the front of the queue."""
        self.release(victim)
        self.computed[victim] = 0
        self.preemptions[victim] += 1
        self.waiting.appendleft(victim)

    def v1_step(self) -> list[tuple[int, int]]:
        """vLLM v1's schedule(): running requests, then (if nobody was preempted) waiting ones."""
        c, running, plan = self.c, self.running, []
        budget, i, preempted = c.budget, 0, False
        while i < len(running) and budget > 0:
            r = running[i]
            k = self.to_compute(r)
            k = min(k, budget) if c.policy == "chunked" else k
            if k > budget:
                break
            while not self.grow(r, self.computed[r] + k):
                victim = running.pop()  # the newest
                self.preempt(victim)
                preempted = True
                if victim == r:
                    return plan  # nobody joins a step that preempted
            plan.append((r, k))
            budget -= k
            i += 1
        while not preempted and self.waiting and budget > 0 and len(running) < c.max_seqs:
            r = self.waiting[0]
            hits = self.hits(r)
            start = self.computed[r] + len(hits) * c.block
            k = c.prompts[r] + self.generated[r] - start
            k = min(k, budget) if c.policy == "chunked" else k
            taken = _cdiv(start + k, c.block) - len(hits) + sum(b not in self.refs for b in hits)
            if k > budget or taken + (self.reserve if running else 0) > self.free:
                break
            self.waiting.popleft()
            self.join(r, hits)
            assert self.grow(r, start + k)
            running.append(r)
            plan.append((r, k))
            budget -= k
        return plan

    def join(self, r: int, hits: list[int]) -> None:
        """`r` starts from its cached blocks; vLLM reports its first admission's hit."""
        for block in hits:
            if block in self.refs:
                self.refs[block] += 1
            else:
                del self.queue[block]
                self.refs[block] = 1
        self.tables[r] = list(hits)
        self.computed[r] = len(hits) * self.c.block
        self.saved_tokens[r] += self.computed[r]
        if not self.preemptions[r]:
            self.cached_tokens[r] = self.computed[r]

    def v0_step(self) -> list[tuple[int, int]]:
        """vLLM v0.2.3's _schedule(): a prompt iteration if any prompt fits, else every decode."""
        c, plan = self.c, []
        while self.waiting:
            r = self.waiting[0]
            k = c.prompts[r] + self.generated[r]  # a recomputed request's prompt holds its output
            fits = self.free - _cdiv(k, c.block) >= self.reserve and len(self.running) < c.max_seqs
            if not fits or sum(t for _, t in plan) + k > c.budget:
                break
            self.waiting.popleft()
            assert self.grow(r, k)
            self.running.append(r)
            self.running.sort()  # sort_by_priority: arrival order
            plan.append((r, k))
        if plan:
            return plan
        queue, self.running = self.running, []
        while queue:
            r = queue.pop(0)
            while self.free < 1:  # can_append_slot
                victim = queue.pop() if queue else r  # the newest
                self.preempt(victim)
                if victim == r:
                    break
            else:
                assert self.grow(r, self.computed[r] + 1)
                self.running.append(r)
                plan.append((r, 1))
        return plan

    def apply(self, plan: list[tuple[int, int]], now_s: float) -> float:
        """The step's end under the linear cost; its tokens computed, its tokens emitted."""
        c = self.c
        end_s = now_s + (BASE_S + PER_TOKEN_S * sum(k for _, k in plan)
                         + PER_CONTEXT_TOKEN_S * sum(self.computed[r] + k for r, k in plan))
        for r, k in plan:
            self.recomputed_tokens += min(max(self.peak[r] - self.computed[r], 0), k)
            self.computed[r] += k
            self.peak[r] = max(self.peak[r], self.computed[r])
            if self.computed[r] < c.prompts[r] + self.generated[r]:
                continue  # a prompt chunk: no token yet
            self.generated[r] += 1
            if self.generated[r] == 1:
                self.first_token_s[r] = end_s
            if self.generated[r] == c.outputs[r]:
                self.finish_s[r] = end_s
                self.release(r)
                self.running.remove(r)
        return end_s


@st.composite
def tiny_cases(draw) -> Case:  # noqa: ANN001 - hypothesis' draw
    block = draw(st.sampled_from([1, 2, 3, 4]))
    num_blocks = draw(st.integers(2, 10))
    n = draw(st.integers(2, 7))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.5, 3.0]), min_size=n, max_size=n))
    pool_tokens = block * num_blocks
    prompts = draw(st.lists(st.integers(1, pool_tokens), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, pool_tokens // 2 + 2), min_size=n, max_size=n))
    policy = draw(st.sampled_from(["mixed", "prefill_first", "chunked"]))
    max_seqs = draw(st.sampled_from([1, 2, 3, 8]))
    budget = max(max_seqs, draw(st.sampled_from([3, 4, 8, 64])) if policy == "chunked" else 64)
    watermark = draw(st.sampled_from([0.0, 0.0, 0.2, 0.34]))
    shared = 0 if policy == "prefill_first" else draw(st.sampled_from([0, 0, 1, block, 2 * block + 1]))
    return Case(np.cumsum(gaps).tolist(), [shared + p for p in prompts], outputs, policy, block,
                num_blocks, budget, max_seqs, watermark, shared)


@pytest.mark.parametrize("mode", ["fast", "reference"])
@given(case=tiny_cases())
@settings(max_examples=examples(EXAMPLES), deadline=None)
def test_preemption_follows_vllm_s_rules(mode: str, case: Case) -> None:
    n, shared = len(case.prompts), case.shared_tokens
    content = PromptContent([(0, shared, 1 + i, p - shared) for i, p in enumerate(case.prompts)],
                            np.arange(n, dtype=np.int64) + 1 + n) if case.caching else None
    requests = Requests(np.array(case.arrival_s), np.array(case.prompts), np.array(case.outputs),
                        np.full(n, 64), content=content)
    common = {"block_size_tokens": case.block, "max_num_seqs": case.max_seqs,
              "watermark": case.watermark, "enable_prefix_caching": case.caching}
    cfg = (ChunkedConfig(kind="chunked", chunk_size_tokens=case.budget, **common)
           if case.policy == "chunked" else
           PagedConfig(kind="paged", policy=case.policy, max_num_batched_tokens=case.budget, **common))
    scheduler = build_scheduler(cfg, requests, case.block * case.num_blocks)
    cost = LinearCost(LinearCostConfig(kind="linear", base_s=BASE_S, per_token_s=PER_TOKEN_S,
                                       per_context_token_s=PER_CONTEXT_TOKEN_S))
    run = Engine(requests, scheduler, cost, mode).run()
    want = VllmReading(case).run()
    np.testing.assert_array_equal(run.recorder.first_token_s, want.first_token_s)
    np.testing.assert_array_equal(run.recorder.finish_s, want.finish_s)
    assert scheduler.preemptions_per_request.tolist() == want.preemptions
    rows = run.recorder.iterations_frame()
    assert int(rows["preemptions"].sum()) == sum(want.preemptions)
    assert int(rows["recomputed_tokens"].sum()) == want.recomputed_tokens
    assert scheduler.cached_tokens.tolist() == want.cached_tokens
    assert scheduler.prefill_saved_tokens.tolist() == want.saved_tokens
    assert scheduler.cache_evictions() == want.evictions
