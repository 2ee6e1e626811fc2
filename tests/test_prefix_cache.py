"""Prefix caching: block hashes, the reference-counted pool with LRU eviction, and the
paged schedulers' use of it (vLLM v1's KVCacheManager semantics)."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orcasim.closed_loop import arrival_source
from orcasim.config import ScenarioError
from orcasim.cost.linear import LinearCost, LinearCostConfig
from orcasim.engine import Engine
from orcasim.memory import PagedAllocator, blocks_for
from orcasim.prefix import OWN_OUTPUT, OWN_PROMPT, BlockHasher, block_hashes, sequence_segments
from orcasim.requests import PromptContent, Requests
from orcasim.run import run_scenario
from orcasim.schedulers import build_scheduler
from orcasim.schedulers.chunked import ChunkedConfig
from orcasim.schedulers.paged import PagedConfig, PagedScheduler
from orcasim.workload.traces import read_trace_with_content
from tests.conftest import examples
from tests.kv_driver import drive

ONE_SECOND = LinearCostConfig(kind="linear", base_s=1.0)
PER_TOKEN = LinearCostConfig(kind="linear", base_s=0.01, per_token_s=0.001)
UNBOUNDED_TOKENS = 2**40  # a pool no trace here fills: nothing is ever evicted


# Block hashes ------------------------------------------------------------------------

def test_block_hashes_are_equal_exactly_over_the_common_prefix() -> None:
    """Blocks of 16 tokens. A = segment 5 (40 tokens); B = segment 5 cut at 32, then
    segment 6; C = segment 7 then segment 5. A and B share blocks ending at 16 and 32 and
    no more (A's third block holds 5's tokens 32-40, B's holds 6's); C shares none."""
    a = block_hashes([(0, 5, 40), (0, 99, 8)], 16, 3)
    b = block_hashes([(0, 5, 32), (0, 6, 16)], 16, 3)
    c = block_hashes([(0, 7, 16), (0, 5, 32)], 16, 3)
    assert len(a) == len(b) == len(c) == 3
    assert a[:2] == b[:2] and a[2] != b[2]
    assert not set(c) & set(a) and not set(c) & set(b)
    # Only full blocks: 40 prompt tokens and nothing after hold two.
    assert block_hashes([(0, 5, 40)], 16, 10) == a[:2]
    # None asked, none given: 0 gave every block, so prefix_affinity read a prompt of one
    # block, of which no block can be a hit (its last token is computed), as fully cached
    # (a tester's finding).
    assert block_hashes([(0, 7, 16), (2, 0, 100)], 16, 0) == []


def test_block_hashes_do_not_depend_on_how_a_segment_is_reached() -> None:
    """A block that straddles two segments is named by both: the same two segments give the
    same hash, another second segment does not."""
    first = block_hashes([(0, 1, 10), (0, 2, 30)], 16, 2)
    again = block_hashes([(0, 1, 10), (0, 2, 6)], 16, 1)
    other = block_hashes([(0, 1, 10), (0, 3, 30)], 16, 1)
    assert first[0] == again[0] != other[0]


# The pool -----------------------------------------------------------------------------

def test_a_hit_shares_blocks_and_eviction_takes_the_least_recently_freed() -> None:
    """Pool of 4 blocks of 2 tokens. Request 1 computes blocks named h1, h2 and finishes;
    request 2 hits both, holds them with no new block; after it finishes the free queue
    holds the never-used blocks 2 and 3 first, then 1 and 0 (a table is freed tail first),
    so a request needing 3 blocks evicts block 1 (h2) and keeps h1 cached."""
    pool = PagedAllocator(4, 2, caching=True)
    assert pool.allocate(1, 2) == [0, 1]
    pool.cache(1, [11, 12])
    pool.free(1)
    assert pool.num_free_blocks == 4 and pool.lookup([11, 12, 13]) == [0, 1]
    assert pool.num_evictable([0, 1]) == 2
    pool.share(2, [0, 1])
    assert pool.num_free_blocks == 2 and pool.tables[2] == [0, 1]
    pool.free(2)
    assert pool.free_pool() == ((1, 0), 2)
    assert pool.allocate(3, 3) == [2, 3, 1]
    assert pool.evictions == 1 and pool.lookup([11, 12]) == [0]
    pool.check_invariants()


def test_a_shared_block_returns_to_the_pool_only_when_its_last_holder_frees_it() -> None:
    pool = PagedAllocator(3, 4, caching=True)
    pool.allocate(1, 1)
    pool.cache(1, [7])
    pool.share(2, pool.lookup([7]))
    assert pool.num_shared_holds == 1 and pool.num_free_blocks == 2
    pool.free(1)
    assert pool.num_free_blocks == 2 and pool.num_shared_holds == 0
    pool.free(2)
    assert pool.num_free_blocks == 3
    pool.check_invariants()


def test_the_audit_catches_a_corrupt_cache() -> None:
    pool = PagedAllocator(4, 2, caching=True)
    pool.allocate(1, 2)
    pool.cache(1, [11, 12])
    pool.check_invariants()
    pool._hash_of[1] = 99  # the two maps disagree
    with pytest.raises(AssertionError, match="the cache's two maps disagree"):
        pool.check_invariants()


CHAINS = [[1, 2, 3, 4], [1, 2, 5, 6], [1, 7], [8, 9, 10], [1, 2, 3, 11]]  # shared prefixes


@settings(max_examples=examples(150), deadline=None)
@given(st.integers(1, 12), st.lists(st.tuples(st.sampled_from(["admit", "free"]),
                                              st.integers(0, 5), st.integers(0, 4)), max_size=60))
def test_pool_invariants_under_random_hits_and_frees(num_blocks: int, ops: list) -> None:
    """Requests take their longest cached prefix, then new blocks, and cache them all: a
    held block is never evicted (it keeps its hash), capacity is never exceeded, and
    references go back to zero."""
    pool = PagedAllocator(num_blocks, 4, caching=True)
    chain_of: dict[int, list[int]] = {}
    for op, req, chain_index in ops:
        if op == "free" or req in pool.tables:
            pool.free(req)
        else:
            chain = CHAINS[chain_index]
            hits = pool.lookup(chain)
            need = len(chain) - len(hits)
            if need + pool.num_evictable(hits) <= pool.num_free_blocks:
                if hits:
                    pool.share(req, hits)
                assert pool.allocate(req, need) is not None
                pool.cache(req, chain)
                chain_of[req] = chain
        named = {b: h for h, b in pool.cache_state()}
        for held_req, table in pool.tables.items():
            for block, block_hash in zip(table, chain_of[held_req], strict=True):
                assert named[block] == block_hash  # held, so never evicted: still named
        assert 0 <= pool.num_free_blocks <= num_blocks
        pool.check_invariants()
    for req in list(pool.tables):
        pool.free(req)
    assert pool.num_free_blocks == num_blocks and pool.num_shared_holds == 0
    pool.check_invariants()


# The schedulers ---------------------------------------------------------------------

def _content(prompts: list[tuple[int, ...]], first_output_id: int = 1000) -> PromptContent:
    return PromptContent(prompts, np.arange(len(prompts), dtype=np.int64) + first_output_id)


def _run(requests: Requests, cfg: PagedConfig | ChunkedConfig, kv_tokens: int,
         cost: LinearCostConfig = ONE_SECOND, mode: str = "reference"
         ) -> tuple[PagedScheduler, np.ndarray, np.ndarray]:
    requests = requests.for_run()
    scheduler = build_scheduler(cfg, requests, kv_tokens)
    assert isinstance(scheduler, PagedScheduler)
    run = Engine(requests, scheduler, LinearCost(cost), mode,
                 arrivals=arrival_source(requests)).run()
    return scheduler, run.recorder.first_token_s, run.recorder.first_scheduled_s


def test_a_shared_system_prompt_is_prefilled_once() -> None:
    """Blocks of 16; iterations cost 0.01 s + 1 ms a token. Two requests of 40 prompt
    tokens that start with the same 32-token system prompt, the second arriving after the
    first finished: it finds 2 blocks cached and prefills 8 tokens (TTFT 0.018 s) where
    without caching it prefills 40 (0.050 s)."""
    content = _content([(1, 32, 2, 8), (1, 32, 3, 8)])
    requests = Requests(np.array([0.0, 10.0]), np.array([40, 40]), np.array([2, 2]),
                        np.array([64, 64]), content=content)
    for caching, ttft_s, cached in ((True, 0.018, 32), (False, 0.050, 0)):
        cfg = PagedConfig(kind="paged", enable_prefix_caching=caching)
        scheduler, first_token_s, _ = _run(requests, cfg, 1024, PER_TOKEN)
        assert first_token_s[1] - 10.0 == pytest.approx(ttft_s, abs=1e-12)
        assert scheduler.cached_tokens.tolist() == [0, cached]


def test_a_prompt_fully_cached_still_computes_its_last_token() -> None:
    """vLLM v1 recomputes the last prompt token for its logits: an identical 32-token
    prompt (two full blocks) hits one block, not two, and prefills 16 tokens."""
    content = _content([(1, 32), (1, 32)])
    requests = Requests(np.array([0.0, 10.0]), np.array([32, 32]), np.array([1, 1]),
                        np.array([64, 64]), content=content)
    scheduler, _, _ = _run(requests, PagedConfig(kind="paged", enable_prefix_caching=True), 1024)
    assert scheduler.cached_tokens.tolist() == [0, 16]


def test_a_conversation_turn_reuses_the_previous_answer() -> None:
    """Turn 2 resends turn 1's prompt (16 tokens) and answer (17 tokens: the 16 whose KV
    was computed, and the last, never fed back) plus 15 new tokens: it finds 2 blocks."""
    content = PromptContent([(1, 16), (1, 16, 1000, 17, 2, 15)], np.array([1000, 1001]))
    requests = Requests(np.array([0.0, 100.0]), np.array([16, 48]), np.array([17, 1]),
                        np.array([64, 64]), content=content)
    scheduler, _, _ = _run(requests, PagedConfig(kind="paged", enable_prefix_caching=True), 1024)
    assert scheduler.cached_tokens.tolist() == [0, 32]


def test_prefix_caching_needs_vllm_v1s_rules() -> None:
    with pytest.raises(ValueError, match="needs preemption: recompute"):
        PagedConfig(kind="paged", enable_prefix_caching=True, preemption="swap",
                    kv_bytes_per_token=1)
    with pytest.raises(ValueError, match="applies only to policy: mixed"):
        PagedConfig(kind="paged", enable_prefix_caching=True, policy="prefill_first")



def test_prefix_caching_over_data_parallel_attention_groups_is_refused(tmp_path: Path) -> None:
    """Each data-parallel attention group's engine keeps its own prefix cache; one
    scheduler over the groups' pooled KV shared it: two requests 1 ms apart with a
    2,000-token system prompt, on Mixtral over two groups, read the second's 2,000 tokens
    as cached (hit rate 0.48), where vLLM's balancer sends it to the idle group, whose
    cache is empty. Refused, naming both keys, at `validate` as at `run`."""
    f = tmp_path / "dp.yaml"
    f.write_text(
        "name: dp\nseed: 0\nworkload:\n  num_requests: 2\n  arrival: {kind: poisson, rate_per_s: 1000}\n"
        "  prompt_tokens: {kind: constant, value: 100}\n  output_tokens: {kind: constant, value: 16}\n"
        "  system_prompt: {tokens: 2000}\n  max_tokens: 4096\nmodel: mixtral-8x7b\n"
        "hardware: {gpu: h100-80gb, data_parallel_attention: 2, expert_parallel: 2}\n"
        "cost: {kind: roofline}\n"
        "systems: [{name: s, scheduler: {kind: chunked, chunk_size_tokens: 8192, "
        "enable_prefix_caching: true}}]\n")
    with pytest.raises(ScenarioError, match=r"^systems\[0\]\.scheduler\.enable_prefix_caching = true "
                       r"needs hardware\.data_parallel_attention = 1, got 2"):
        run_scenario(f)
    plain = run_scenario(f, ["systems[0].scheduler.enable_prefix_caching=false"])
    assert plain.summary_frame()["requests_completed"].iloc[0] == 2

def _independent_hits(prompts: list[tuple[int, ...]], prompt_tokens: list[int], block: int) -> int:
    """Cached prompt tokens an unbounded cache gives, counted from the segments alone: a
    block's key is the list of segments up to its end, and a request hits the leading
    blocks whose keys an earlier request's prompt had, but never its last prompt token."""
    seen: set[tuple] = set()
    hits = 0
    for segments, tokens in zip(prompts, prompt_tokens, strict=True):
        flat = [(segments[k], segments[k + 1]) for k in range(0, len(segments), 2)]
        keys = []
        for end in range(block, tokens + 1, block):
            prefix, left = [], end
            for seg_id, length in flat:
                prefix.append((seg_id, min(length, left)))
                left -= min(length, left)
                if not left:
                    break
            keys.append(tuple(prefix))
        leading = 0
        while leading < (tokens - 1) // block and keys[leading] in seen:
            leading += 1
        hits += leading * block
        seen.update(keys)
    return hits


@st.composite
def shared_prefix_traces(draw: st.DrawFn) -> Requests:
    """Prompts from a few shared starts (a system prompt, a document) and text of their own."""
    n = draw(st.integers(1, 25))
    starts = draw(st.lists(st.lists(st.integers(1, 30), min_size=1, max_size=3), min_size=1,
                           max_size=3))
    prompts, prompt_tokens = [], []
    for i in range(n):
        start = draw(st.sampled_from(starts))
        depth = draw(st.integers(0, len(start)))
        segments: list[int] = []
        for level, tokens in enumerate(start[:depth]):
            segments += [10 * starts.index(start) + level, tokens]  # a shared tree of ids
        own = draw(st.integers(0 if segments else 1, 30))
        if own:
            segments += [500 + i, own]
        prompts.append(tuple(segments))
        prompt_tokens.append(sum(segments[1::2]))
    gaps_s = draw(st.lists(st.floats(0.0, 3.0), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 8), min_size=n, max_size=n))
    return Requests(np.cumsum(gaps_s), np.array(prompt_tokens, dtype=np.int64),
                    np.array(outputs, dtype=np.int64), np.full(n, 200, dtype=np.int64),
                    content=_content(prompts))


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_prefix_traces(), st.sampled_from([1, 4, 16]))
def test_an_unbounded_cache_hits_every_repeated_block(requests: Requests, block: int) -> None:
    """Without eviction and without chunking, every block an earlier prompt held is
    cached by the time a later request is admitted (FCFS, the earlier one first): the
    hits equal the count made from the segments alone."""
    assert requests.content is not None
    cfg = PagedConfig(kind="paged", enable_prefix_caching=True, block_size_tokens=block)
    scheduler, _, _ = _run(requests, cfg, UNBOUNDED_TOKENS // block * block)
    expected = _independent_hits(requests.content.prompts, requests.prompt_tokens.tolist(), block)
    assert int(scheduler.cached_tokens.sum()) == expected


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_prefix_traces(), st.integers(2, 30), st.integers(1, 12),
       st.sampled_from(["paged", "chunked"]))
def test_caching_changes_when_tokens_are_computed_not_which(
    requests: Requests, num_blocks: int, extra_blocks: int, kind: str
) -> None:
    """With caching on or off every request emits its output tokens, and requests are
    first scheduled in arrival order (FCFS)."""
    block = 4
    for caching in (False, True):
        cfg = (PagedConfig(kind="paged", block_size_tokens=block, max_num_batched_tokens=256,
                           enable_prefix_caching=caching)
               if kind == "paged" else
               ChunkedConfig(kind="chunked", block_size_tokens=block, chunk_size_tokens=16,
                             enable_prefix_caching=caching))
        scheduler, _, first_scheduled_s = _run(requests, cfg, (num_blocks + extra_blocks) * block)
        ran = ~np.isin(np.arange(len(requests)), scheduler.rejected_ids)
        assert (scheduler.generated[ran] == requests.output_tokens[ran]).all()
        assert (np.diff(first_scheduled_s[ran]) >= 0).all()


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_prefix_traces(), st.integers(4, 40))
def test_the_hit_rate_never_falls_as_the_cache_grows(requests: Requests, num_blocks: int) -> None:
    """One request at a time, each fitting the smallest pool: every pool then sees the same
    blocks in the same order, and an LRU pool keeps what a smaller one keeps. Not so where
    the pool decides who runs together or at all: four requests at once (prompts 5, 25, 1
    and 5 tokens, the last repeating the first; blocks of 4) hit 4 tokens on 4 blocks, where
    the 25-token prompt is turned away, and none on 8, where it runs and the 1-token prompt
    admitted beside it evicts the repeated block."""
    block = 4
    longest_blocks = int(blocks_for(requests.prompt_tokens + requests.output_tokens - 1, block).max())
    num_blocks = max(num_blocks, longest_blocks)
    one_at_a_time = dataclasses.replace(requests, arrival_s=1000.0 * np.arange(len(requests)))
    cfg = PagedConfig(kind="paged", block_size_tokens=block, max_num_batched_tokens=256,
                      enable_prefix_caching=True)
    hits = [int(_run(one_at_a_time, cfg, blocks * block)[0].cached_tokens.sum())
            for blocks in (num_blocks, num_blocks + 1, 2 * num_blocks, 8 * num_blocks,
                           UNBOUNDED_TOKENS // block)]
    assert hits == sorted(hits)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_prefix_traces(), st.integers(8, 40), st.sampled_from(["paged", "chunked"]))
def test_the_pool_stays_sound_at_every_step(requests: Requests, num_blocks: int, kind: str) -> None:
    """Driven step by step: the pool's audit passes after every plan, and every block is
    back (held by nobody) once the requests are done."""
    block = 4
    cfg = (PagedConfig(kind="paged", block_size_tokens=block, max_num_batched_tokens=256,
                       enable_prefix_caching=True) if kind == "paged" else
           ChunkedConfig(kind="chunked", block_size_tokens=block, chunk_size_tokens=8,
                         enable_prefix_caching=True))
    scheduler = build_scheduler(cfg, requests, num_blocks * block)
    assert isinstance(scheduler, PagedScheduler)
    drive(scheduler, requests, lambda s, _out: s.allocator.check_invariants())  # type: ignore[attr-defined]
    assert scheduler.allocator.num_free_blocks == num_blocks
    assert scheduler.allocator.num_shared_holds == 0


# Mooncake -------------------------------------------------------------------------

def _independent_mooncake_hits(path: Path, block: int) -> tuple[int, int]:
    """Cached prompt tokens an unbounded cache of `block`-token blocks gives the trace, from
    its hash_ids alone: a block is named by the 512-token block id holding its last token
    and that token's offset in it (ids are prefix hashes, so that names the whole prefix)."""
    seen: set[tuple[int, int]] = set()
    hits = total = 0
    for line in path.read_text().splitlines():
        record = json.loads(line)
        ids, tokens = record["hash_ids"], record["input_length"]
        keys = [(ids[(end - 1) // 512], (end - 1) % 512) for end in range(block, tokens + 1, block)]
        leading = 0
        while leading < (tokens - 1) // block and keys[leading] in seen:
            leading += 1
        hits += leading * block
        total += tokens
        seen.update(keys)
    return hits, total


def test_mooncake_hash_ids_hit_as_often_as_counted_from_the_trace(tmp_path: Path) -> None:
    """The first 300 requests of Mooncake's conversation trace (all arriving at once, in
    file order) through an unbounded cache: the hits equal the independent count."""
    source = Path(__file__).parents[1] / "orcasim/data/traces/mooncake_conversation_first1000.jsonl"
    path = tmp_path / "head.jsonl"
    lines = source.read_text().splitlines()[:300]
    path.write_text("\n".join(json.dumps({**json.loads(x), "timestamp": 0}) for x in lines) + "\n")
    (arrival_s, prompt, output), content = read_trace_with_content(str(path))
    requests = Requests(arrival_s, prompt, np.ones_like(output), np.full(len(prompt), 2**20),
                        content=content)
    cfg = PagedConfig(kind="paged", enable_prefix_caching=True, max_num_batched_tokens=2**20,
                      max_num_seqs=1024)
    scheduler, _, _ = _run(requests, cfg, UNBOUNDED_TOKENS // 16 * 16)
    hits, total = _independent_mooncake_hits(path, 16)
    assert int(scheduler.cached_tokens.sum()) == hits
    assert int(prompt.sum()) == total


# The shipped scenarios -------------------------------------------------------------

SCENARIOS = Path(__file__).parents[1] / "scenarios" / "prefix"


@pytest.mark.parametrize(("scenario", "shorter", "least_hit_rate"), [
    ("chat.yaml", "workload.num_requests=300", 0.6),  # 0.9 x 1,488 of ~1,650 tokens: ~0.81
    ("mooncake.yaml", "workload.arrival.max_requests=60", 0.02),
    ("conversations.yaml", "workload.arrival.num_sessions=20", 0.5),  # the history: ~0.9
])
def test_the_prefix_scenarios_hit_only_with_caching_on(
    scenario: str, shorter: str, least_hit_rate: float
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a short replay may be flagged saturated
        result = run_scenario(SCENARIOS / scenario, (shorter, "warmup_s=0"), base_dir=SCENARIOS)
    off, on = (result.systems[name].summary for name in ("vllm", "vllm-prefix-cache"))
    assert off["prefix_hit_rate"] == 0 and off["cache_evictions"] == 0
    assert on["prefix_hit_rate"] >= least_hit_rate
    assert on["ttft_s_p50"] < off["ttft_s_p50"]
    requests = result.systems["vllm-prefix-cache"].requests
    assert (requests["cached_tokens"] <= requests["prefill_saved_tokens"]).all()
    assert (requests["cached_tokens"] < requests["prompt_tokens"]).all()


def test_a_system_prompt_is_put_before_each_carrier_s_own_prompt() -> None:
    """Seeded: 1,000 requests, 60% carry one of 3 system prompts of 100 tokens; their
    prompts grow by exactly 100 tokens, the lengths drawn before are unchanged, and the
    content adds up."""
    from orcasim.workload import WorkloadConfig, generate_requests

    base = dict(num_requests=1000, arrival={"kind": "poisson", "rate_per_s": 1.0},
                prompt_tokens={"kind": "uniform", "low": 1, "high": 50},
                output_tokens={"kind": "constant", "value": 5}, max_tokens=200)
    plain = generate_requests(WorkloadConfig(**base), np.random.default_rng(3))
    shared = generate_requests(
        WorkloadConfig(**base, system_prompt={"tokens": 100, "fraction": 0.6, "variants": 3}),
        np.random.default_rng(3))
    assert shared.content is not None and plain.content is None
    shared.content.check(shared.prompt_tokens)
    grew = shared.prompt_tokens - plain.prompt_tokens
    assert set(grew.tolist()) == {0, 100}
    assert abs((grew == 100).mean() - 0.6) < 0.05  # 1,000 draws: 3.1 standard deviations
    assert {p[0] for p, g in zip(shared.content.prompts, grew, strict=True) if g} == {0, 1, 2}
    np.testing.assert_array_equal(shared.arrival_s, plain.arrival_s)


def test_a_system_prompt_with_a_mooncake_trace_is_refused_only_where_it_has_hash_ids(
        tmp_path: Path) -> None:
    """A Mooncake file of lengths alone says nothing about sharing: with `format: mooncake`
    it was refused for hash_ids it does not have, though `format: auto` took it."""
    from orcasim.workload import WorkloadConfig, generate_requests

    lengths_only = tmp_path / "lengths.jsonl"
    lengths_only.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n')
    with_ids = tmp_path / "ids.jsonl"
    with_ids.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [0]}\n')
    for fmt in ("mooncake", "auto"):
        cfg = WorkloadConfig(arrival={"kind": "trace", "path": str(lengths_only), "format": fmt},
                             max_tokens=16, system_prompt={"tokens": 5})
        assert generate_requests(cfg, np.random.default_rng(0)).prompt_tokens.tolist() == [10]
        cfg = WorkloadConfig(arrival={"kind": "trace", "path": str(with_ids), "format": fmt},
                             max_tokens=16, system_prompt={"tokens": 5})
        with pytest.raises(ValueError, match="hash_ids already say"):
            generate_requests(cfg, np.random.default_rng(0))


# Routing for the cache ---------------------------------------------------------------

def _conversation_fleet(router: dict, mode: str = "fast") -> dict:
    """20 conversations of 3-6 turns on 4 replicas of a chunked, caching scheduler."""
    return {
        "name": "fleet", "seed": 5,
        "workload": {"max_tokens": 4096, "arrival": {
            "kind": "conversations", "num_sessions": 20, "concurrent_sessions": 8,
            "system_prompt": {"tokens": 64, "shared_fraction": 1.0},
            "turns": {"kind": "uniform", "low": 3, "high": 6},
            "user_tokens": {"kind": "uniform", "low": 20, "high": 200},
            "output_tokens": {"kind": "uniform", "low": 10, "high": 100},
            "think_time": {"kind": "exponential", "mean_s": 1.0},
            "max_context_tokens": 3000}},
        "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4},
        "kv_capacity_tokens": 8192, "engine": {"mode": mode},
        "systems": [{"name": "c", "scheduler": {"kind": "chunked", "chunk_size_tokens": 256,
                                                "enable_prefix_caching": True},
                     "cluster": {"replicas": 4, "router": router}}],
    }


def test_prefix_affinity_routing_finds_a_conversation_s_history() -> None:
    """Round-robin scatters a conversation's turns over the replicas, so a turn rarely
    finds its history cached; routing by the cached prefix sends it back to it."""
    rates = {}
    for router in ({"kind": "round_robin"}, {"kind": "prefix_affinity"}):
        result = run_scenario(_conversation_fleet(router))
        rates[router["kind"]] = result.systems["c"].summary["prefix_hit_rate"]
    assert rates["prefix_affinity"] > rates["round_robin"] + 0.2, rates


def test_prefix_affinity_routing_is_exact_in_fast_mode() -> None:
    """The router reads the replicas' caches at each arrival: fast mode must show it what
    reference mode does, so the same requests go to the same replicas and hit alike."""
    frames = {mode: run_scenario(_conversation_fleet({"kind": "prefix_affinity"}, mode))
              .systems["c"].requests for mode in ("fast", "reference")}
    for column in ("replica", "cached_tokens", "arrival_s"):
        np.testing.assert_array_equal(frames["fast"][column], frames["reference"][column], column)
    np.testing.assert_allclose(frames["fast"]["finish_s"], frames["reference"]["finish_s"], rtol=1e-9)



def test_prefix_affinity_spreads_a_fan_out_steps_branches_before_any_is_cached() -> None:
    """The README's Tree-of-Thoughts case: a step's 4 branches, routed before any of them is
    cached, go to replicas 0, 1, 0, 1, so the fleet caches less than behind `session`. The
    README gave hit rates 0.696 against 0.844 with no command that reproduced them; one
    session of scenarios/agents/tree_of_thoughts.yaml on two chunked replicas gives 0.831
    against 0.887, and the README quotes those."""
    import re

    from orcasim.scenario import load_scenario

    def fleet(name: str, router: str) -> str:
        return (f"{{name: {name}, scheduler: {{kind: chunked, enable_prefix_caching: true}}, "
                f"cluster: {{replicas: 2, router: {{kind: {router}}}}}}}")

    root = Path(__file__).parents[1]
    sc = load_scenario(root / "scenarios" / "agents" / "tree_of_thoughts.yaml", [
        "workload.arrival.num_sessions=1", "warmup_s=0",
        f"systems=[{fleet('affinity', 'prefix_affinity')}, {fleet('session', 'session')}]"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one session: too short to judge saturation
        result = run_scenario(sc)
    first = result.systems["affinity"].requests.query("session_step == 0")
    assert first["replica"].tolist() == [0, 1, 0, 1]
    rates = {name: system.summary["prefix_hit_rate"] for name, system in result.systems.items()}
    readme = " ".join((root / "README.md").read_text().split())
    quoted = re.search(r"hit rate (0\.\d+) against (0\.\d+) behind `session`, "
                       r"`tests/test_prefix_cache.py`", readme)
    assert quoted is not None
    assert quoted.groups() == (f"{rates['affinity']:.3f}", f"{rates['session']:.3f}")


# Named tests for what mutation testing found unpinned (quality/README.md) -------------

def test_prompts_without_a_content_table_share_nothing() -> None:
    """Without `Requests.content` every prompt and output is its own: two requests of the
    same lengths, one after the other, find nothing cached."""
    requests = Requests(np.array([0.0, 10.0]), np.array([40, 40]), np.array([2, 2]),
                        np.array([64, 64]))
    scheduler, _, _ = _run(requests, PagedConfig(kind="paged", enable_prefix_caching=True), 1024)
    assert scheduler.cached_tokens.tolist() == [0, 0]
    assert sequence_segments(requests, 1) == [(OWN_PROMPT, 1, 40), (OWN_OUTPUT, 1, 2)]


def test_a_block_after_a_different_first_segment_differs() -> None:
    """The chain carries the segments before: the same second segment after a different
    first one gives different blocks (and after the same first one, the same)."""
    a = block_hashes([(0, 1, 16), (0, 3, 32)], 16, 3)
    b = block_hashes([(0, 2, 16), (0, 3, 32)], 16, 3)
    c = block_hashes([(0, 1, 16), (0, 3, 32)], 16, 3)
    assert not set(a) & set(b) and a == c


def test_a_forgotten_request_is_hashed_afresh() -> None:
    """A session run rewrites a pending row before it arrives (PagedScheduler.add_request
    forgets what was hashed for it): forgetting drops the remembered hashes."""
    content = PromptContent([(1, 32)], np.array([1000]))
    requests = Requests(np.array([0.0]), np.array([32]), np.array([4]), np.array([64]),
                        content=content)
    hasher = BlockHasher(requests, 16)
    before = hasher.hashes(0, 2)
    content.prompts[0] = (2, 32)  # the row rewritten
    assert hasher.hashes(0, 2) == before  # remembered
    hasher.forget(0)
    assert hasher.hashes(0, 2) != before


def test_evictions_are_counted_one_by_one() -> None:
    pool = PagedAllocator(2, 4, caching=True)
    pool.allocate(1, 2)
    pool.cache(1, [11, 12])
    pool.free(1)
    assert pool.allocate(2, 2) is not None
    assert pool.evictions == 2 and pool.num_cached_blocks == 0


def test_takes_before_evicting_counts_fresh_blocks_then_the_queue() -> None:
    """Pool of 6 blocks: request 1 caches blocks 0-2 and frees them (queue 2, 1, 0), 3 blocks
    were never used. A head starting from blocks 0 and 1 loses a hit after 3 fresh blocks
    and 1 queued one (block 2) are handed out: 4; from nothing free, no limit."""
    pool = PagedAllocator(6, 4, caching=True)
    pool.allocate(1, 3)
    pool.cache(1, [11, 12, 13])
    pool.free(1)
    assert pool.free_pool() == ((2, 1, 0), 3)
    assert pool.takes_before_evicting([0, 1]) == 4
    assert pool.takes_before_evicting([2]) == 3
    pool.share(2, [0])
    assert pool.takes_before_evicting([0]) is None  # held: never evicted


def test_the_audit_catches_each_corruption_of_a_caching_pool() -> None:
    def fresh() -> PagedAllocator:
        pool = PagedAllocator(6, 2, caching=True)
        pool.allocate(1, 2)
        pool.cache(1, [11, 12])
        pool.share(2, [0])
        pool.check_invariants()
        return pool

    corruptions = {
        "a block is free twice": lambda p: p._recycled.extend([5, 5]),
        "shared holds miscounted": lambda p: setattr(p, "num_shared_holds", 0),
        "a never-used block is cached": lambda p: p._hash_of.__setitem__(p._fresh, 99),
        "the cache's two maps disagree": lambda p: p._blocks_of.__setitem__(77, {1: None}),
    }
    for message, corrupt in corruptions.items():
        pool = fresh()
        corrupt(pool)
        with pytest.raises(AssertionError, match=message):
            pool.check_invariants()


def test_the_cache_summary_by_hand() -> None:
    """Prompt tokens 100 and 300, 40 and 0 found cached at first admission, 40 and 64
    saved over all admissions: hit rate 0.1, 104 tokens saved; a frame without the cache's
    columns, or nothing finished, reads 0."""
    from orcasim.metrics import prefix_cache_stats

    done = pd.DataFrame({"prompt_tokens": [100, 300], "cached_tokens": [40, 0],
                         "prefill_saved_tokens": [40, 64]})
    assert prefix_cache_stats(done) == {"prefix_hit_rate": 0.1, "prefill_tokens_saved": 104.0}
    assert prefix_cache_stats(done[["prompt_tokens"]]) == {"prefix_hit_rate": 0.0,
                                                           "prefill_tokens_saved": 0.0}
    assert prefix_cache_stats(done.iloc[:0]) == {"prefix_hit_rate": 0.0, "prefill_tokens_saved": 0.0}


def test_a_replica_reports_the_prompt_blocks_it_holds_for_a_request_by_hand() -> None:
    """What a prefix-affinity router reads. Blocks of 4; request 0 (prompt of 12 tokens of
    segment 1) ran first and its three blocks are cached. A later prompt of the same 8
    tokens finds one block: its last token is always recomputed, so of 8 only (8 - 1) // 4
    = 1 block counts; a prompt of 9 finds both; a prompt of other text (segment 7) finds
    the one block it cached itself when it ran; without caching, nothing counts."""
    content = _content([(1, 12), (1, 8), (1, 9), (7, 8)])
    requests = Requests(np.array([0.0, 10.0, 10.0, 10.0]), np.array([12, 8, 9, 8]), np.array([2, 2, 2, 2]),
                        np.array([16, 16, 16, 16]), content=content)
    cfg = PagedConfig(kind="paged", enable_prefix_caching=True, block_size_tokens=4)
    scheduler, _, _ = _run(requests, cfg, 1024)
    assert [scheduler.cached_prefix_tokens(r) for r in (1, 2, 3)] == [4, 8, 4]
    plain, _, _ = _run(requests, PagedConfig(kind="paged", block_size_tokens=4), 1024)
    assert plain.cached_prefix_tokens(1) == 0


def test_a_prompt_quoting_a_running_requests_output_is_named() -> None:
    """Request 1's prompt quotes request 0's output (content 1000, the third segment id);
    request 2's does not. Only while request 0 runs, and only with caching, does that
    matter to the fast-forward."""
    content = PromptContent([(5, 4), (7, 3, 1000, 5), (7, 3, 9, 5)], np.array([1000, 1001, 1002]))
    requests = Requests(np.zeros(3), np.array([4, 8, 8]), np.array([50, 2, 2]), np.array([64, 64, 64]),
                        content=content).for_run()
    for caching in (True, False):
        scheduler = build_scheduler(PagedConfig(kind="paged", enable_prefix_caching=caching, max_num_seqs=1),
                                    requests, 1024)
        assert isinstance(scheduler, PagedScheduler)
        assert not scheduler.quotes_running_output(1)  # nobody runs yet
        scheduler.add_request(0)
        scheduler.schedule(0.0)
        assert scheduler.running == [0]
        assert [scheduler.quotes_running_output(r) for r in (1, 2)] == [caching, False]


def _caching(prompts: list[tuple[int, ...]], outputs: list[int], kv_tokens: int = 64,
             arrivals: list[float] | None = None) -> tuple[PagedScheduler, Requests]:
    """A caching paged scheduler, blocks of 4, over requests with these prompt contents."""
    prompt_tokens = [sum(segments[1::2]) for segments in prompts]
    n = len(prompts)
    requests = Requests(np.array(arrivals if arrivals is not None else [0.0] * n),
                        np.array(prompt_tokens), np.array(outputs), np.full(n, 64),
                        content=_content(prompts)).for_run()
    scheduler = build_scheduler(PagedConfig(kind="paged", block_size_tokens=4,
                                            enable_prefix_caching=True), requests, kv_tokens)
    assert isinstance(scheduler, PagedScheduler)
    return scheduler, requests


def test_a_request_whose_kv_moved_in_does_not_start_from_the_cache() -> None:
    """A decode instance with caching: request 0 (content 1, 10 tokens) ran here and left
    two blocks cached. Request 1, with the same prompt, arrives with its prompt's KV moved
    in (computed 10, its first token emitted): it computes only its next token and finds no
    hit (a hit would reset what it computed to the 8 cached tokens and compute 3)."""
    scheduler, _ = _caching([(1, 10), (1, 10)], [1, 3])
    scheduler.add_request(0)
    scheduler.update_from_output(scheduler.schedule(0.0))
    assert not scheduler.running and scheduler.cached_prefix_tokens(1) == 8
    scheduler.mark_transferred(1)
    scheduler.add_request(1)
    plan = scheduler.schedule(0.0)
    assert plan.req_ids.tolist() == [1] and plan.num_new_tokens.tolist() == [1]
    assert scheduler.computed[1] == 10 and scheduler.cached_tokens[1] == 0
    assert scheduler.prefill_saved_tokens[1] == 0


def test_a_requests_saved_prefill_adds_up_over_its_admissions() -> None:
    """Blocks of 4, a pool of 6. Request 0 (content 1, 8 tokens, 12 out) runs; request 1
    (content 1 then 2: 8 + 4 tokens, 6 out) joins from request 0's two blocks: 8 tokens
    saved, the hit vLLM reports. When the pool runs out (request 1's fifth output token
    needs a seventh block), request 1, the newest, is preempted by recompute; it joins
    again once request 0 is done, from those two blocks and its own third prompt block,
    still cached: 12 more saved, 20 in all, while the reported hit stays 8."""
    scheduler, requests = _caching([(1, 8), (1, 8, 2, 4)], [12, 6], 6 * 4, [0.0, 1.0])
    trace = drive(scheduler, requests)
    assert scheduler.preemptions_per_request.tolist() == [0, 1]
    assert scheduler.cached_tokens.tolist() == [0, 8]
    assert scheduler.prefill_saved_tokens.tolist() == [0, 20]
    assert sorted(trace.finish_step) == [0, 1]


def test_the_hasher_keeps_no_finished_requests_hashes() -> None:
    """Hashes are kept while a request may still ask for them: after a run, none (a million
    requests' hashes would otherwise stay in memory)."""
    scheduler, requests = _caching([(1, 8), (1, 8, 2, 4), (3, 6)], [5, 4, 3], 64, [0.0, 1.0, 2.0])
    drive(scheduler, requests)
    assert scheduler.cached_tokens.tolist() == [0, 8, 0]
    assert len(scheduler.hasher) == 0


def test_a_row_rewritten_before_its_arrival_is_hashed_afresh() -> None:
    """A session run writes a pending call's row ahead and may rewrite it before the call
    arrives; the fast loop may ask about the pending call in between, which computes its
    hashes. Request 1's row first quotes nothing cached (content 5), then is rewritten to
    start with request 0's prompt (content 1): on arrival it finds those blocks."""
    scheduler, requests = _caching([(1, 8), (5, 12)], [2, 2])
    scheduler.add_request(0)
    scheduler.update_from_output(scheduler.schedule(0.0))
    assert scheduler.admits_arrival(1)  # asks: hashes request 1's row as written now
    assert len(scheduler.hasher) == 2
    requests.content.prompts[1] = (1, 8, 5, 4)  # type: ignore[union-attr]
    scheduler.add_request(1)
    scheduler.schedule(0.0)
    assert scheduler.cached_tokens[1] == 8
