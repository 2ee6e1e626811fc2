"""KV-cache allocators: how much memory a request holds, and who owns which block.

Two families, as the vLLM paper (Kwon et al., SOSP 2023, section 3) contrasts them:

* Reserving (Orca, FasterTransformer): a request holds one contiguous slab from admission
  to finish. Its size is a policy (`reservation_tokens`): `max` reserves the request's
  `max_tokens`, `pow2` the next power of two of its true total (capped at `max_tokens`),
  `oracle` exactly its true total. What the slab holds beyond the request's current
  tokens is reserved but empty.
* Paged (vLLM's PagedAttention): memory is cut into blocks of `block_size_tokens`; a
  request owns a table of blocks and gets one more only when its last block fills, so at
  most one partly empty block per request is wasted.

`PagedAllocator.allocate` returns `None` when it cannot: the caller decides to wait or to
preempt. Its invariants (never more blocks out than exist, no block owned twice, every
block back once its owner is freed) are asserted and property-tested.
"""

from __future__ import annotations

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
        case "pow2":
            return np.minimum(next_power_of_two(total), requests.max_tokens)
        case "oracle":
            return total.copy()
    raise AssertionError(f"unhandled reservation policy {policy!r}")


def blocks_for(tokens: TokenCount, block_size_tokens: int) -> TokenCount:
    """Blocks that hold `tokens` tokens (a count or an array): the ceiling of tokens / block size."""
    return -(-tokens // block_size_tokens)


class PagedAllocator:
    """A pool of `num_blocks` KV blocks and each request's block table.

    Lifecycle of a request's blocks: `allocate` appends blocks to its table (or returns
    None, changing nothing); `free` returns them all to the pool and forgets the table.
    Freed blocks are reused last-in first-out, as vLLM's free-block queue does; blocks never
    used yet are handed out lowest id first, after any freed one.

    Memory grows with the blocks in use, not with the pool: the never-used blocks are the
    range [fresh, num_blocks), so a pool of a billion blocks costs nothing until used.
    """

    def __init__(self, num_blocks: int, block_size_tokens: int) -> None:
        if num_blocks < 1 or block_size_tokens < 1:
            raise ScenarioError(f"need at least one block of at least one token, got "
                             f"{num_blocks} block(s) of {block_size_tokens} token(s)")
        self.num_blocks = num_blocks
        self.block_size_tokens = block_size_tokens
        self._recycled: list[int] = []  # freed blocks; pop() = the last freed
        self._fresh = 0  # blocks from here on were never used
        self._owner: dict[int, int] = {}  # block -> request, for the blocks in use
        self.tables: dict[int, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._recycled) + self.num_blocks - self._fresh

    @property
    def num_allocated_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def allocated_tokens(self) -> int:
        return self.num_allocated_blocks * self.block_size_tokens

    def free_pool(self) -> tuple[tuple[int, ...], int]:
        """The free pool, which fixes every later allocation: the freed blocks (the last is
        handed out first) and the first never-used block (then the ones after it)."""
        return tuple(self._recycled), self._fresh

    def num_blocks_of(self, req_id: int) -> int:
        return len(self.tables.get(req_id, ()))

    def blocks_to_hold(self, req_id: int, tokens: int) -> int:
        """How many more blocks `req_id` needs for its table to hold `tokens` tokens."""
        return max(0, blocks_for(tokens, self.block_size_tokens) - self.num_blocks_of(req_id))

    def _take(self, count: int) -> list[int]:
        """`count` free blocks, in the order of a free list that reuses the last freed first."""
        recycled = self._recycled
        taken = [recycled.pop() for _ in range(min(count, len(recycled)))]
        fresh = count - len(taken)
        if fresh:
            taken.extend(range(self._fresh, self._fresh + fresh))
            self._fresh += fresh
        return taken

    def _own(self, blocks: list[int], owners: list[int]) -> None:
        owner = self._owner
        for block, req_id in zip(blocks, owners, strict=True):
            assert block not in owner, "a block would be owned twice"
            owner[block] = req_id

    def allocate(self, req_id: int, num_blocks: int) -> list[int] | None:
        """Give `req_id` `num_blocks` more blocks, or return None (and change nothing)."""
        assert num_blocks >= 0 and req_id != NO_OWNER
        if num_blocks > self.num_free_blocks:
            return None
        new = self._take(num_blocks)
        self._own(new, [req_id] * num_blocks)
        self.tables.setdefault(req_id, []).extend(new)
        return new

    def allocate_one_each(self, req_ids: list[int]) -> list[int] | None:
        """One more block for each of `req_ids`: what `allocate(r, 1)` for each, in order,
        gives (the same blocks), or None (and nothing changes) if there are too few."""
        if len(req_ids) > self.num_free_blocks:
            return None
        new = self._take(len(req_ids))
        self._own(new, list(req_ids))
        for req_id, block in zip(req_ids, new, strict=True):
            self.tables.setdefault(req_id, []).append(block)
        return new

    def grow_to(self, req_id: int, tokens: int) -> list[int] | None:
        """Make `req_id`'s table hold `tokens` tokens; the new blocks, or None if they do not fit."""
        need = self.blocks_to_hold(req_id, tokens)
        return self.allocate(req_id, need) if need else []  # most decode steps need none

    def free(self, req_id: int) -> int:
        """Return all of `req_id`'s blocks to the pool; the number freed (0 if it held none)."""
        blocks = self.tables.pop(req_id, [])
        owner = self._owner
        for block in blocks:
            holder = owner.pop(block)  # not inside the assert: python -O drops asserts
            assert holder == req_id, "freeing a block the request does not own"
        self._recycled.extend(reversed(blocks))
        return len(blocks)

    def check_invariants(self) -> None:
        """Full audit: every block is free xor owned once, by the table that lists it."""
        owned = [b for table in self.tables.values() for b in table]
        assert len(owned) == len(set(owned)), "a block is in two tables"
        assert len(owned) + self.num_free_blocks == self.num_blocks, "blocks lost or invented"
        assert not set(owned) & set(self._recycled), "a block is both free and owned"
        assert all(b < self._fresh for b in owned + self._recycled), "a never-used block is in use"
        for req_id, table in self.tables.items():
            assert all(self._owner[b] == req_id for b in table), f"request {req_id}'s table disagrees"
        assert len(self._owner) == len(owned), "an owner without a table"
