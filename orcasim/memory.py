"""KV-cache allocators: how much memory a request holds, and who owns which block.

Two families, as the vLLM paper (Kwon et al., SOSP 2023, section 3) contrasts them:

* Reserving (Orca, FasterTransformer): a request holds one contiguous slab from admission
  to finish. Its size is a policy (`reservation_tokens`): `max` reserves the request's
  `max_tokens`, `pow2` its prompt and the next power of two of its true output (capped at
  `max_tokens`: the paper's Orca (Pow2) "over-reserves the space for outputs by at most
  2x", 32 positions for an output of 25), `oracle` exactly its true total. What the slab holds beyond the request's current
  tokens is reserved but empty.
* Paged (vLLM's PagedAttention): memory is cut into blocks of `block_size_tokens`; a
  request owns a table of blocks and gets one more only when its last block fills, so at
  most one partly empty block per request is wasted.

`PagedAllocator.allocate` returns `None` when it cannot: the caller decides to wait or to
preempt. Its invariants (never more blocks out than exist, no block owned twice, every
block back once its owner is freed) are asserted and property-tested.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal, TypeVar

import numpy as np

from orcasim.config import ScenarioError
from orcasim.requests import Requests

ReservationPolicy = Literal["max", "pow2", "oracle"]
NO_OWNER = -1
TokenCount = TypeVar("TokenCount", int, np.ndarray)


def next_power_of_two(tokens: np.ndarray) -> np.ndarray:
    """Smallest power of two >= each entry (entries >= 1), in exact integer arithmetic."""
    return np.array([1 << (int(t) - 1).bit_length() for t in tokens], dtype=np.int64)


def reservation_tokens(requests: Requests, policy: ReservationPolicy) -> np.ndarray:
    """Tokens of KV each request reserves at admission under a reserving policy (vLLM paper, 6.1)."""
    total = requests.total_tokens
    match policy:
        case "max":
            return requests.max_tokens.copy()
        case "pow2":  # the output's room rounded up, not the prompt's (section 6.1)
            rounded = requests.prompt_tokens + next_power_of_two(requests.output_tokens)
            return np.minimum(rounded, requests.max_tokens)
        case "oracle":
            return total.copy()
    raise AssertionError(f"unhandled reservation policy {policy!r}")


def peak_kv_tokens(prompt_tokens: TokenCount, output_tokens: TokenCount) -> TokenCount:
    """Tokens of KV a request holds at its peak: every token but the last generated one,
    whose KV is never computed (nothing attends to it)."""
    return prompt_tokens + output_tokens - 1


def blocks_for(tokens: TokenCount, block_size_tokens: int) -> TokenCount:
    """Blocks that hold `tokens` tokens (a count or an array): the ceiling of tokens / block size."""
    return -(-tokens // block_size_tokens)


class PagedAllocator:
    """A pool of `num_blocks` KV blocks, each request's block table, and (with `caching`)
    the blocks kept for their content after their last holder is done.

    Lifecycle of a request's blocks: `allocate` appends new blocks to its table (or returns
    None, changing nothing); `share` puts cached blocks (a prefix-cache hit) at the start
    of an empty table; `cache` names a table's full blocks by their hashes; `free` drops
    the request's hold on all of them and forgets the table. A block held by several
    tables (a shared prefix) has a reference count, and goes back to the pool only when
    the last holder frees it.

    Which free block is handed out next:

    * Without caching a block's identity changes nothing, so freed blocks are reused
      last-in first-out (vLLM v0's free list); blocks never used yet come after, lowest
      id first. Memory grows with the blocks in use, not with the pool: the never-used
      blocks are the range [fresh, num_blocks), so a pool of a billion blocks costs
      nothing until used.
    * With caching the pool is vLLM v1's `FreeKVCacheBlockQueue` (`vllm/v1/core/block_pool.py`):
      never-used blocks first, then freed blocks least recently freed first, a request's
      blocks freed tail first (its last block is evicted before its first). A freed block
      keeps its content and its hash until it is handed out again (evicted); a cache hit
      on it takes it back out of the queue.

    A hash may name several blocks (two requests computed the same block before either
    was cached, as vLLM v1 allows); a lookup takes the one cached first.
    """

    def __init__(self, num_blocks: int, block_size_tokens: int, caching: bool = False) -> None:
        if num_blocks < 1 or block_size_tokens < 1:
            raise ScenarioError(f"need at least one block of at least one token, got "
                             f"{num_blocks} block(s) of {block_size_tokens} token(s)")
        self.num_blocks = num_blocks
        self.block_size_tokens = block_size_tokens
        self.caching = caching
        self._recycled: list[int] = []  # without caching: freed blocks; pop() = the last freed
        self._queue: OrderedDict[int, None] = OrderedDict()  # with caching: freed, oldest first
        self._fresh = 0  # blocks from here on were never used
        # Blocks nobody holds (never used, freed, or cached and evictable): kept as a count,
        # not summed from the pools, because every admission and decode step asks.
        self.num_free_blocks = num_blocks
        # Block -> the tables holding it, for blocks in use. Kept with caching only: without
        # it nothing is shared, every held block has one holder, and the hot path skips it.
        self._refs: dict[int, int] = {}
        self.tables: dict[int, list[int]] = {}
        self._hash_of: dict[int, int] = {}  # cached block -> its hash
        self._blocks_of: dict[int, dict[int, None]] = {}  # hash -> its blocks, first cached first
        self._num_cached: dict[int, int] = {}  # request -> leading blocks of its table cached
        self.evictions = 0  # cached blocks handed out again (their content lost)
        self.num_shared_holds = 0  # holds beyond a block's first: sum of (references - 1)

    @property
    def num_allocated_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def allocated_tokens(self) -> int:  # not through num_allocated_blocks: a run asks twice
        return (self.num_blocks - self.num_free_blocks) * self.block_size_tokens

    @property
    def num_cached_blocks(self) -> int:
        return len(self._hash_of)

    def free_pool(self) -> tuple[tuple[int, ...], int]:
        """The free pool, which fixes every later allocation: the freed blocks in the order
        they are handed out last (without caching the last is handed out first, with
        caching the first) and the first never-used block (then the ones after it)."""
        return tuple(self._recycled) + tuple(self._queue), self._fresh

    def cache_state(self) -> tuple[tuple[int, int], ...]:
        """Every cached block and its hash, in the order a lookup prefers them."""
        return tuple((h, b) for h, blocks in self._blocks_of.items() for b in blocks)

    def num_blocks_of(self, req_id: int) -> int:
        return len(self.tables.get(req_id, ()))

    def blocks_to_hold(self, req_id: int, tokens: int) -> int:
        """How many more blocks `req_id` needs for its table to hold `tokens` tokens."""
        # blocks_for and num_blocks_of, inlined: every admission check asks
        return max(0, -(-tokens // self.block_size_tokens) - len(self.tables.get(req_id, ())))

    def _take(self, count: int) -> list[int]:
        """`count` free blocks, in the order the pool hands them out (see the class)."""
        self.num_free_blocks -= count
        if self.caching:
            fresh = min(count, self.num_blocks - self._fresh)
            taken = list(range(self._fresh, self._fresh + fresh))
            self._fresh += fresh
            for _ in range(count - fresh):
                block, _none = self._queue.popitem(last=False)
                self._evict(block)
                taken.append(block)
            return taken
        recycled = self._recycled
        start = len(recycled) - count
        if start >= 0:  # freed blocks only: nearly every take once blocks come back
            if count == 1:
                return [recycled.pop()]
            taken = recycled[start:]
            taken.reverse()  # the last freed first
            del recycled[start:]
            return taken
        taken = recycled[::-1]  # all of them, the last freed first; then never-used ones
        recycled.clear()
        fresh = count - len(taken)
        if fresh:
            taken.extend(range(self._fresh, self._fresh + fresh))
            self._fresh += fresh
        return taken

    def _evict(self, block: int) -> None:
        """`block` is handed out again: the content it cached is gone."""
        block_hash = self._hash_of.pop(block, None)
        if block_hash is None:
            return
        holders = self._blocks_of[block_hash]
        del holders[block]
        if not holders:
            del self._blocks_of[block_hash]
        self.evictions += 1

    def _hold(self, blocks: list[int]) -> None:
        """With caching: `blocks`, just taken, have a holder each."""
        refs = self._refs
        for block in blocks:
            assert block not in refs, "a new block is already held"
            refs[block] = 1

    def allocate(self, req_id: int, num_blocks: int) -> list[int] | None:
        """Give `req_id` `num_blocks` more blocks, or return None (and change nothing)."""
        assert num_blocks >= 0 and req_id != NO_OWNER
        if num_blocks > self.num_free_blocks:
            return None
        new = self._take(num_blocks)
        if self.caching:  # without, a table is a block's only holder
            self._hold(new)
        self.tables.setdefault(req_id, []).extend(new)
        return new

    def allocate_one_each(self, req_ids: list[int]) -> list[int] | None:
        """One more block for each of `req_ids`: what `allocate(r, 1)` for each, in order,
        gives (the same blocks), or None (and nothing changes) if there are too few."""
        if len(req_ids) > self.num_free_blocks:
            return None
        new = self._take(len(req_ids))
        if self.caching:  # without, a table is a block's only holder
            self._hold(new)
        self._append_each(req_ids, new)
        return new

    def _append_each(self, req_ids: list[int], blocks: list[int]) -> None:
        """blocks[i] onto req_ids[i]'s table, for as many as there are blocks."""
        tables = self.tables
        for req_id, block in zip(req_ids, blocks, strict=False):  # blocks may be fewer
            table = tables.get(req_id)  # not setdefault: it would build a list every call
            if table is None:
                tables[req_id] = [block]
            else:
                table.append(block)

    def allocate_in_turns(self, req_ids: list[int], num_blocks: int) -> list[int] | None:
        """`num_blocks` more blocks dealt to the distinct `req_ids` in turn, one each a round
        (the last round may stop short): what `allocate_one_each` of the ids repeated gives
        (the same blocks), or None (and nothing changes) if there are too few. A table takes
        its round's blocks as one slice: a run's steps deal thousands of blocks."""
        if num_blocks > self.num_free_blocks:
            return None
        new = self._take(num_blocks)
        if self.caching:  # without, a table is a block's only holder
            self._hold(new)
        tables, turns = self.tables, len(req_ids)
        if num_blocks <= turns:  # one round, maybe short: most runs (tens of steps, blocks of 16)
            self._append_each(req_ids, new)
            return new
        for turn, req_id in enumerate(req_ids):
            dealt = new[turn::turns]  # its block of each round, in order
            table = tables.get(req_id)
            if table is None:
                tables[req_id] = dealt
            else:
                table.extend(dealt)
        return new

    def grow_to(self, req_id: int, tokens: int) -> list[int] | None:
        """Make `req_id`'s table hold `tokens` tokens; the new blocks, or None if they do not fit."""
        need = self.blocks_to_hold(req_id, tokens)
        return self.allocate(req_id, need) if need else []  # most decode steps need none

    def free(self, req_id: int) -> int:
        """Drop `req_id`'s hold on its blocks; those nobody else holds go back to the pool,
        last block first. The number of blocks in its table (0 if it had none)."""
        blocks = self.tables.pop(req_id, [])
        if not self.caching:  # nobody else holds them: all go back, the last block first
            self._recycled.extend(reversed(blocks))
            self.num_free_blocks += len(blocks)
            return len(blocks)
        self._num_cached.pop(req_id, None)
        refs, queue = self._refs, self._queue
        for block in reversed(blocks):
            left = refs.pop(block) - 1  # not inside an assert: python -O drops asserts
            if left:
                refs[block] = left
                self.num_shared_holds -= 1
            else:  # its last holder is done: the free queue's tail, content kept
                queue[block] = None
                self.num_free_blocks += 1
        return len(blocks)

    # Prefix caching (vLLM v1's KVCacheManager: get_computed_blocks, allocate_slots).

    def lookup(self, hashes: list[int]) -> list[int]:
        """The cached blocks of the longest prefix of `hashes` (a chain: see orcasim.prefix)."""
        hits = []
        for block_hash in hashes:
            holders = self._blocks_of.get(block_hash)
            if holders is None:
                break
            hits.append(next(iter(holders)))
        return hits

    def num_evictable(self, blocks: list[int]) -> int:
        """How many of `blocks` nobody holds: a hit on one takes it out of the free pool."""
        if not blocks:  # no hits: every admission without caching asks
            return 0
        refs = self._refs
        return sum(1 for block in blocks if block not in refs)

    def takes_before_evicting(self, blocks: list[int]) -> int | None:
        """How many blocks the pool hands out before the first of `blocks` that nobody
        holds (None if none of them is free)."""
        evictable = {b for b in blocks if b not in self._refs}
        if not evictable:
            return None
        for position, block in enumerate(self._queue):
            if block in evictable:
                return self.num_blocks - self._fresh + position
        raise AssertionError("a free cached block is not in the free queue")

    def share(self, req_id: int, blocks: list[int]) -> None:
        """A cache hit: `blocks` (from `lookup`) start `req_id`'s empty table."""
        assert self.caching and not self.tables.get(req_id), "a hit starts an empty table of a caching pool"
        refs, queue = self._refs, self._queue
        for block in blocks:
            held = refs.get(block, 0)
            if held:
                self.num_shared_holds += 1
            else:
                del queue[block]
                self.num_free_blocks -= 1
            refs[block] = held + 1
        self.tables[req_id] = list(blocks)
        self._num_cached[req_id] = len(blocks)

    def cache(self, req_id: int, hashes: list[int]) -> None:
        """Name `req_id`'s first len(hashes) blocks (full ones) by their hashes, as vLLM v1
        caches a request's full blocks when it schedules them."""
        table = self.tables[req_id]
        start = self._num_cached.get(req_id, 0)
        for block, block_hash in zip(table[start:len(hashes)], hashes[start:], strict=True):
            self._hash_of[block] = block_hash
            self._blocks_of.setdefault(block_hash, {})[block] = None
        self._num_cached[req_id] = max(start, len(hashes))

    def num_cached_of(self, req_id: int) -> int:
        """Leading blocks of `req_id`'s table that are cached (named by their hashes)."""
        return self._num_cached.get(req_id, 0)

    def check_invariants(self) -> None:
        """Full audit: every block is free xor held, held blocks as often as tables list
        them, and the cache names only blocks that still hold their content."""
        held = [b for table in self.tables.values() for b in table]
        counts: dict[int, int] = {}
        for block in held:
            counts[block] = counts.get(block, 0) + 1
        for req_id, table in self.tables.items():
            assert len(table) == len(set(table)), f"request {req_id}'s table lists a block twice"
        free = self._recycled + list(self._queue)
        assert len(free) == len(set(free)), "a block is free twice"
        pooled = len(free) + self.num_blocks - self._fresh
        assert len(counts) + pooled == self.num_blocks, "blocks lost or invented"
        assert self.num_free_blocks == pooled, "free blocks miscounted"
        assert not set(counts) & set(free), "a block is both free and owned"
        assert all(b < self._fresh for b in held + free), "a never-used block is in use"
        if self.caching:
            assert counts == self._refs, "reference counts disagree with the tables"
        else:  # nothing is shared without caching, and no counts are kept
            assert not self._refs and len(held) == len(counts), "reference counts disagree with the tables"
        assert self.num_shared_holds == len(held) - len(counts), "shared holds miscounted"
        assert self.caching or not (self._queue or self._hash_of), "a cache without caching"
        assert all(b < self._fresh for b in self._hash_of), "a never-used block is cached"
        named = {(h, b) for h, blocks in self._blocks_of.items() for b in blocks}
        assert named == {(h, b) for b, h in self._hash_of.items()}, "the cache's two maps disagree"
