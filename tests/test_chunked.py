"""The chunked-prefill (Sarathi-Serve) scheduler: a token budget, decodes first, prompt chunks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from kv_driver import (
    assert_paged_end_state,
    check_paged_step,
    drive,
    make_requests,
    planned_tokens,
)
from test_paged import paged_cases

from orcasim.cost.linear import LinearCost, LinearCostConfig
from orcasim.engine import Engine
from orcasim.requests import PromptContent, Requests
from orcasim.schedulers.chunked import ChunkedConfig, ChunkedScheduler
from orcasim.schedulers.paged import PagedConfig, PagedScheduler
from tests.conftest import examples

EXAMPLES = 120


def _chunked(reqs, capacity: int, **kw) -> ChunkedScheduler:
    cfg = ChunkedConfig.model_validate({"kind": "chunked", "watermark": 0.0, **kw})
    return ChunkedScheduler(cfg, reqs, capacity)


def test_a_long_prompt_is_chunked_and_only_its_last_chunk_emits():
    reqs = make_requests([10], [2])
    sched = _chunked(reqs, capacity=64, chunk_size_tokens=4)
    trace = drive(sched, reqs, check_paged_step)
    assert planned_tokens(trace) == [{0: 4}, {0: 4}, {0: 2}, {0: 1}]
    assert trace.first_token_step == {0: 2} and trace.finish_step == {0: 3}


def test_decodes_go_first_and_a_prompt_fills_the_rest_of_the_budget():
    # Request 0 decodes while request 1's 9-token prompt arrives: it gets 6 - 1 = 5 tokens.
    reqs = make_requests([2, 9], [4, 2], arrivals=[0.0, 1.0])
    sched = _chunked(reqs, capacity=64, chunk_size_tokens=6)
    trace = drive(sched, reqs, check_paged_step)
    assert planned_tokens(trace) == [{0: 2}, {0: 1, 1: 5}, {0: 1, 1: 4}, {0: 1, 1: 1}]
    assert trace.first_token_step == {0: 0, 1: 2}


def _check_decodes_first(sched, out) -> None:
    """Stall-free batching: prefill chunks only take budget that no decode wanted."""
    check_paged_step(sched, out)
    req = sched.requests
    need = req.prompt_tokens + sched.generated - sched.computed  # before this step
    decoding = (sched.generated >= 1) & (need == 1)
    planned = set(out.req_ids.tolist())
    left_out = [r for r in sched.running if decoding[r] and r not in planned]
    if left_out:
        assert decoding[out.req_ids].all(), f"decodes {left_out} wait behind a prefill chunk"
    # Only the last planned request may get less than all its known tokens.
    partial = out.num_new_tokens < need[out.req_ids]
    assert not partial[:-1].any()


@given(paged_cases(chunked=True))
@settings(max_examples=examples(EXAMPLES), deadline=None)
def test_chunked_invariants_hold_and_every_request_completes(case):
    reqs, capacity, cfg = case
    sched = _chunked(reqs, capacity, **cfg)
    trace = drive(sched, reqs, _check_decodes_first)
    assert_paged_end_state(sched, reqs, trace)
    assert all(int(p.num_new_tokens.sum()) <= cfg["chunk_size_tokens"] for p in trace.plans)



class _VllmV1:
    """vLLM v1's `Scheduler.schedule` written out on its own (FCFS, recompute preemption, no
    prefix cache, no watermark), to compare plans with: running requests first, each taking
    min(its known tokens left, budget) and preempting the newest running request (maybe
    itself) while its blocks do not fit; then, if nobody was preempted, the preempted
    requests (oldest first) and the waiting ones while `max_num_seqs`, the budget and the
    free blocks allow. Without chunking a request takes all its tokens or waits."""

    def __init__(self, reqs, num_blocks: int, block: int, budget: int, max_seqs: int,
                 chunked: bool) -> None:
        self.reqs, self.num_blocks, self.block = reqs, num_blocks, block
        self.budget, self.max_seqs, self.chunked, self.free = budget, max_seqs, chunked, num_blocks
        n = len(reqs)
        self.computed, self.generated, self.blocks = [0] * n, [0] * n, [0] * n
        self.preempted: list[int] = []
        self.waiting: list[int] = []
        self.running: list[int] = []

    def add(self, req: int) -> None:
        peak = int(self.reqs.prompt_tokens[req] + self.reqs.output_tokens[req] - 1)
        if -(-peak // self.block) <= self.num_blocks:  # else turned away, as orcasim does
            self.waiting.append(req)

    def _take(self, req: int, budget: int) -> int:
        """Tokens `req` computes now: a chunk, or without chunking all or none."""
        left = int(self.reqs.prompt_tokens[req]) + self.generated[req] - self.computed[req]
        return min(left, budget) if self.chunked or left <= budget else 0

    def schedule(self) -> dict[int, int]:
        plan: dict[int, int] = {}
        budget, i, preempted_now = self.budget, 0, False
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = self._take(req, budget)
            need = -(-(self.computed[req] + num_new) // self.block) - self.blocks[req]
            while need > self.free and req in self.running:
                victim = self.running.pop()
                self.free += self.blocks[victim]
                self.blocks[victim] = self.computed[victim] = 0
                self.preempted = sorted([*self.preempted, victim])
                preempted_now = True
            if req not in self.running or num_new == 0:
                break
            self.free -= need
            self.blocks[req] += need
            plan[req], budget, i = num_new, budget - num_new, i + 1
        if preempted_now:
            return plan
        while budget > 0 and len(self.running) < self.max_seqs:
            queue = self.preempted or self.waiting
            if not queue:
                break
            req = queue[0]
            num_new = self._take(req, budget)
            need = -(-num_new // self.block)
            if num_new == 0 or need > self.free:
                break
            queue.pop(0)
            self.running.append(req)
            self.free -= need
            self.blocks[req] = need
            plan[req], budget = num_new, budget - num_new
        return plan

    def update(self, plan: dict[int, int]) -> None:
        for req, num_new in plan.items():
            self.computed[req] += num_new
            if self.computed[req] == int(self.reqs.prompt_tokens[req]) + self.generated[req]:
                self.generated[req] += 1
                if self.generated[req] == int(self.reqs.output_tokens[req]):
                    self.free += self.blocks[req]
                    self.blocks[req] = 0
                    self.running.remove(req)


@pytest.mark.parametrize("chunked", [True, False])
def test_plans_equal_an_independent_model_of_vllm_v1s_schedule(chunked: bool) -> None:
    """Random small cases (tight KV, budgets and max_num_seqs, so that requests chunk, wait
    and are preempted), stepped side by side: every plan is the model's, token for token."""
    for seed in range(examples(150)):
        rng = np.random.default_rng(seed)
        n, block = int(rng.integers(1, 12)), int(rng.choice([1, 2, 4, 16]))
        prompts, outputs = rng.integers(1, 60, n).tolist(), rng.integers(1, 20, n).tolist()
        arrivals = np.sort(rng.integers(0, 15, n)).astype(float).tolist()
        reqs = make_requests(prompts, outputs, arrivals)
        num_blocks, max_seqs = int(rng.integers(1, 40)), int(rng.integers(1, 8))
        budget = int(rng.integers(1, 64))
        if chunked:
            sched = _chunked(reqs, num_blocks * block, chunk_size_tokens=budget,
                             block_size_tokens=block, max_num_seqs=max_seqs)
        else:
            budget = max(budget, max_seqs, max(p + o - 1 for p, o in zip(prompts, outputs, strict=True)))
            cfg = PagedConfig(kind="paged", max_num_batched_tokens=budget, block_size_tokens=block,
                              max_num_seqs=max_seqs, watermark=0.0)
            sched = PagedScheduler(cfg, reqs, num_blocks * block)
        model = _VllmV1(reqs, num_blocks, block, budget, max_seqs, chunked)
        added, step = 0, 0
        while added < n or sched.has_unfinished():
            while added < n and arrivals[added] <= step:
                sched.add_request(added)
                model.add(added)
                added += 1
            out = sched.schedule(float(step))
            plan = dict(zip(out.req_ids.tolist(), out.num_new_tokens.tolist(), strict=True))
            assert plan == model.schedule(), (seed, step)
            if not out.is_empty:
                sched.update_from_output(out)
            model.update(plan)
            step += 1
        assert not (model.running or model.waiting or model.preempted), seed


def _run_one_second_steps(prompts, outputs, arrivals, capacity: int, mode: str, fused: bool,
                          content=None, **kw):
    """An engine run of a chunked scheduler where every iteration takes 1 s."""
    reqs = Requests(np.array(arrivals, dtype=float), np.array(prompts), np.array(outputs),
                    np.array(outputs), content=content)
    sched = _chunked(reqs, capacity, **kw)
    one_second = LinearCost(LinearCostConfig(kind="linear", base_s=1.0))
    return Engine(reqs, sched, one_second, mode, fused=fused).run().recorder


MODES = [("reference", False), ("fast", True), ("fast", False)]


@pytest.mark.parametrize(("mode", "fused"), MODES)
def test_a_decode_preempts_a_half_prefilled_prompt_which_recomputes_its_chunks(
    mode: str, fused: bool
) -> None:
    """Five 4-token blocks, a 5-token budget. A (4-token prompt, 10 tokens) decodes from
    1 s; B (19-token prompt) arrives at 2 s and takes 4 tokens a step beside A's decode.
    At 5 s A's 9th token needs a third block and the pool is full: B (12 tokens computed)
    is preempted, and nobody joins that step. B comes back at 6 s recomputing 4 + 4, then
    at 8 s its own chunk does not fit and it preempts itself; at 9 s it joins again (4
    recomputed) beside A's last decode. Alone from 10 s it takes 5, 5 (5 and 3 of them
    recomputed) and 5: its last prompt token is computed in the step ending at 13 s."""
    rec = _run_one_second_steps([4, 19], [10, 2], [0.0, 2.0], 20, mode, fused,
                                chunk_size_tokens=5, block_size_tokens=4, max_num_seqs=4)
    assert rec.first_scheduled_s.tolist() == [0.0, 2.0]
    assert rec.first_token_s.tolist() == [1.0, 13.0]
    assert rec.finish_s.tolist() == [10.0, 14.0]
    rows = rec.iterations_frame()
    assert rows["num_iterations"].sum() == 14 and rows["tokens"].sum() == 4 + 9 + 40
    assert rows["preemptions"].sum() == 2 and rows["recomputed_tokens"].sum() == 4 + 4 + 4 + 5 + 3
    if mode == "reference":
        assert rows["tokens"].tolist() == [4, 1, 5, 5, 5, 1, 5, 5, 1, 5, 5, 5, 5, 1]
        assert rows["preemptions"].tolist() == [0] * 5 + [1, 0, 0, 1] + [0] * 5
        assert rows["recomputed_tokens"].tolist() == [0] * 6 + [4, 4, 0, 4, 5, 3, 0, 0]


@pytest.mark.parametrize(("mode", "fused"), MODES)
def test_a_half_prefilled_prompt_resumes_from_its_own_cached_block(mode: str, fused: bool) -> None:
    """Four 4-token blocks, an 8-token budget, prefix caching. B (12-token prompt) computes
    7 tokens at 1 s (block 0 full, so cached) and preempts itself at 2 s. Its hit on block 0,
    which nobody holds, counts against the free pool: needing 2 more blocks for a 7-token
    chunk, it waits (without the cache it would join at 3 s) until A ends at 6 s. Then it
    starts at token 4 and computes the other 8 in one step (3 of them recomputed): first
    token at 7 s."""
    content = PromptContent([(100, 4), (200, 12)], np.array([900, 901]))
    rec = _run_one_second_steps([4, 12], [6, 2], [0.0, 1.0], 16, mode, fused, content=content,
                                chunk_size_tokens=8, block_size_tokens=4, max_num_seqs=4,
                                enable_prefix_caching=True)
    assert rec.first_token_s.tolist() == [1.0, 7.0]
    assert rec.finish_s.tolist() == [6.0, 8.0]
    rows = rec.iterations_frame()
    assert rows["preemptions"].sum() == 1 and rows["recomputed_tokens"].sum() == 3
    assert rows["tokens"].sum() == 4 + (1 + 7) + 4 + 8 + 1
    if mode == "reference":
        assert rows["context_tokens"].tolist() == [4, 12, 6, 7, 8, 9, 12, 13]
