"""KV allocators: reservation policies, the paged block pool, and KV accounting."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_driver import assert_all_served, drive, make_requests

from orcasim.memory import PagedAllocator, blocks_for, next_power_of_two, reservation_tokens
from orcasim.metrics import kv_memory_stats
from orcasim.schedulers.iteration_level import IterationLevelConfig, IterationLevelScheduler
from tests.conftest import examples

EXAMPLES = 60


def test_next_power_of_two_is_exact_at_and_between_powers():
    got = next_power_of_two(np.array([1, 2, 3, 4, 5, 1023, 1024, 1025, 2**40 + 1]))
    assert got.tolist() == [1, 2, 4, 4, 8, 1024, 1024, 2048, 2**41]


def test_reservation_policies_match_the_vllm_paper_definitions():
    reqs = make_requests([100, 10, 1000], [50, 6, 1000], max_tokens=1500)
    # The third request's true total (2000) exceeds max_tokens only in this hand table.
    assert reservation_tokens(reqs, "max").tolist() == [1500, 1500, 1500]
    # Pow2 rounds the output's room up ("if the true output length is 25, it reserves 32
    # positions for outputs", section 6.1), not prompt + output: 100 + 64, 10 + 8.
    assert reservation_tokens(reqs, "pow2").tolist() == [164, 18, 1500]
    assert reservation_tokens(reqs, "oracle").tolist() == [150, 16, 2000]


@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 5000)), min_size=1, max_size=30),
       st.integers(1, 8000))
@settings(max_examples=examples(EXAMPLES), deadline=None)
def test_pow2_reservation_bounds(lengths, max_tokens):
    prompt, output = (np.array(column) for column in zip(*lengths, strict=True))
    reqs = make_requests(prompt.tolist(), output.tolist(), max_tokens=max_tokens)
    pow2 = reservation_tokens(reqs, "pow2")
    assert np.all(pow2 <= max_tokens)
    uncapped = pow2 < max_tokens
    room = pow2[uncapped] - prompt[uncapped]  # the output's room: at most twice the output
    assert np.all(room >= output[uncapped]) and np.all(room < 2 * output[uncapped])
    assert np.all(room & (room - 1) == 0)  # a power of two


def test_blocks_for_is_a_ceiling():
    assert [blocks_for(t, 16) for t in (0, 1, 16, 17, 32)] == [0, 1, 1, 2, 2]


def test_allocate_returns_none_and_changes_nothing_when_full():
    alloc = PagedAllocator(num_blocks=4, block_size_tokens=16)
    assert alloc.allocate(0, 3) == [0, 1, 2]
    assert alloc.allocate(1, 2) is None
    assert alloc.num_free_blocks == 1 and alloc.num_blocks_of(1) == 0
    assert alloc.grow_to(0, 64) == [3]  # 64 tokens = 4 blocks: one more
    assert alloc.grow_to(0, 50) == []  # already holds enough
    assert alloc.free(0) == 4 and alloc.num_free_blocks == 4
    alloc.check_invariants()


def test_allocate_one_each_gives_the_blocks_of_one_allocate_each():
    one_by_one, bulk = PagedAllocator(6, 4), PagedAllocator(6, 4)
    for alloc in (one_by_one, bulk):
        alloc.allocate(7, 2)
        alloc.allocate(8, 1)
        alloc.free(7)  # blocks come back last-in first-out: the order matters
    got = [one_by_one.allocate(r, 1) for r in (8, 9, 8)]
    assert bulk.allocate_one_each([8, 9, 8]) == [g[0] for g in got if g]
    assert bulk.tables == one_by_one.tables
    assert bulk.allocate_one_each([1, 2, 3]) is None and bulk.num_free_blocks == 2
    bulk.check_invariants()


@given(st.integers(1, 12), st.integers(0, 5), st.integers(0, 30))
def test_allocate_in_turns_gives_the_blocks_of_one_each_repeated(free_first: int, turns: int,
                                                                   num_blocks: int) -> None:
    """Dealing blocks in turns equals `allocate_one_each` of the ids repeated, round by
    round, the last round cut short: the same blocks, the same tables."""
    in_turns, one_each = PagedAllocator(40, 4), PagedAllocator(40, 4)
    for alloc in (in_turns, one_each):
        alloc.allocate(1, 2)  # a table to extend, and freed blocks to hand out first
        alloc.allocate(99, free_first)
        alloc.free(99)
    req_ids = list(range(1, turns + 1))
    repeated = (req_ids * num_blocks)[:num_blocks] if req_ids else []
    expected = one_each.allocate_one_each(repeated) if repeated or not num_blocks else None
    got = in_turns.allocate_in_turns(req_ids, num_blocks) if req_ids or not num_blocks else None
    assert got == expected
    assert in_turns.tables == one_each.tables and in_turns.free_pool() == one_each.free_pool()
    in_turns.check_invariants()


def test_allocate_in_turns_changes_nothing_when_too_few_blocks_are_free() -> None:
    alloc = PagedAllocator(4, 4)
    alloc.allocate(1, 2)
    assert alloc.allocate_in_turns([1, 2], 3) is None
    assert alloc.num_free_blocks == 2 and alloc.tables == {1: [0, 1]}


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "free"]), st.integers(0, 5), st.integers(0, 6)),
    max_size=60,
)


@given(st.integers(1, 12), ops)
@settings(max_examples=examples(EXAMPLES * 2), deadline=None)
def test_allocator_invariants_under_random_operations(num_blocks, operations):
    alloc = PagedAllocator(num_blocks, block_size_tokens=4)
    for op, req, n in operations:
        free_before = alloc.num_free_blocks
        if op == "alloc":
            got = alloc.allocate(req, n)
            assert (got is None) == (n > free_before)
            assert alloc.num_free_blocks == free_before - (0 if got is None else n)
        else:
            held = alloc.num_blocks_of(req)
            assert alloc.free(req) == held
            assert alloc.num_free_blocks == free_before + held
        assert alloc.allocated_tokens <= num_blocks * 4
        alloc.check_invariants()
    for req in list(alloc.tables):
        alloc.free(req)
    assert alloc.num_free_blocks == num_blocks and not alloc.tables
    alloc.check_invariants()


def _orca(policy: str, reqs, capacity: int) -> IterationLevelScheduler:
    cfg = IterationLevelConfig(kind="iteration_level", max_batch_size=64, kv_reservation=policy)
    return IterationLevelScheduler(cfg, reqs, capacity)


def test_orca_reservation_policies_admit_more_as_they_get_tighter():
    rng = np.random.default_rng(3)
    reqs = make_requests(rng.integers(10, 200, 80).tolist(), rng.integers(1, 200, 80).tolist(),
                         max_tokens=512)
    mean_batch = {}
    for policy in ("max", "pow2", "oracle"):
        sched = _orca(policy, reqs, capacity=4096)
        trace = drive(sched, reqs, lambda s, o: _check_reserved_within(s, o, 4096))
        assert_all_served(sched, reqs, trace)
        mean_batch[policy] = np.mean([len(p.req_ids) for p in trace.plans])
    assert mean_batch["max"] < mean_batch["pow2"] < mean_batch["oracle"]


def _check_reserved_within(sched, out, capacity):
    assert out.kv_used_tokens is not None
    assert out.kv_used_tokens <= out.kv_reserved_tokens <= capacity


def test_orca_rejects_a_request_whose_reservation_can_never_fit():
    reqs = make_requests([10, 300, 10], [5, 5, 5], max_tokens=400)
    sched = _orca("oracle", reqs, capacity=100)
    trace = drive(sched, reqs)
    assert sched.rejected_ids == [1]
    assert_all_served(sched, reqs, trace)


def test_kv_utilization_is_a_ratio_of_time_integrals():
    iters = pd.DataFrame({
        "duration_s": [1.0, 3.0], "kv_reserved_tokens": [100, 200], "kv_used_tokens": [50.0, 200.0],
        "preemptions": [2, 0], "recomputed_tokens": [0, 30],
    })
    stats = kv_memory_stats(iters)
    assert stats["kv_utilization_mean"] == pytest.approx((50 * 1 + 200 * 3) / (100 * 1 + 200 * 3))
    assert stats["preemptions"] == 2 and stats["recomputed_tokens"] == 30


def test_kv_utilization_is_nan_when_a_scheduler_does_not_track_it():
    iters = pd.DataFrame({"duration_s": [1.0], "kv_reserved_tokens": [10],
                          "kv_used_tokens": [np.nan], "preemptions": [0], "recomputed_tokens": [0]})
    assert np.isnan(kv_memory_stats(iters)["kv_utilization_mean"])


def test_a_huge_pool_costs_nothing_until_used() -> None:
    """1e9 tokens of KV in blocks of 16: no free list of 62.5M entries is built."""
    import tracemalloc

    tracemalloc.start()
    alloc = PagedAllocator(62_500_000, 16)
    assert alloc.allocate(7, 3) == [0, 1, 2] and alloc.num_free_blocks == 62_500_000 - 3
    alloc.free(7)
    assert alloc.allocate(8, 4) == [0, 1, 2, 3]  # the last freed first, then never-used ones
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak_bytes < 1_000_000
    alloc.check_invariants()


def test_a_pool_needs_a_block_of_a_token() -> None:
    from orcasim.config import ScenarioError

    for blocks, size in ((0, 16), (4, 0), (0, 0)):
        with pytest.raises(ScenarioError, match="need at least one block of at least one token"):
            PagedAllocator(blocks, size)


def test_the_audit_catches_each_corruption() -> None:
    """check_invariants is what the property tests lean on: each broken state fails its own
    check. The pool: 8 blocks of 2 tokens; request 1 holds blocks 0 and 1, block 2 was freed
    (recycled), blocks 3 to 7 were never used."""
    def fresh() -> PagedAllocator:
        alloc = PagedAllocator(8, 2)
        alloc.allocate(1, 2)
        alloc.allocate(2, 1)
        alloc.free(2)
        alloc.check_invariants()
        return alloc

    def never_used(a: PagedAllocator) -> None:  # block 3, never handed out, sits in a table
        a.tables[1] = [0, 3]
        a._refs = {0: 1, 3: 1}

    def held_twice(a: PagedAllocator) -> None:  # request 1 lists block 0 twice
        a.tables[1] = [0, 0]
        a._refs = {0: 2}

    corruptions = {
        "reference counts disagree with the tables": lambda a: a.tables.setdefault(3, []).append(0),
        "blocks lost or invented": lambda a: a._recycled.clear(),
        "free blocks miscounted": lambda a: setattr(a, "num_free_blocks", a.num_free_blocks + 1),
        "a block is both free and owned": lambda a: a._recycled.__setitem__(0, 1),
        "a never-used block is in use": never_used,
        "table lists a block twice": held_twice,
        "a cache without caching": lambda a: a._hash_of.__setitem__(2, 99),
    }
    for message, corrupt in corruptions.items():
        alloc = fresh()
        corrupt(alloc)
        with pytest.raises(AssertionError, match=message):
            alloc.check_invariants()
