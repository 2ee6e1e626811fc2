"""Block hashes for prefix caching: two requests share exactly the blocks of their common prefix.

vLLM v1 (`vllm/v1/core/kv_cache_utils.py`, `hash_block_tokens`) hashes each full block
of a request's tokens together with the hash of the block before it, so one hash stands
for the whole prefix up to the block's end, and only full blocks are hashed. orcasim has
no tokens, only content segments (`orcasim.requests.PromptContent`): a request's sequence
is its prompt's segments and then its output. The same identity is kept without hashing
every block's tokens: segment j of a sequence gets the chained key
S_j = hash((S_{j-1}, namespace, id, tokens)), and the block that ends t tokens into
segment j gets hash((S_{j-1}, namespace, id, t)). Two sequences get the same hash for a
block exactly when they hold the same segments up to that block's end.

Python's hash of a tuple of ints does not depend on the process (only str and bytes are
salted), so runs are reproducible. An int below 2**61 - 1 hashes to itself, so distinct ids
stay distinct (a trace's ids are kept below 2**60, `orcasim.workload.traces.MAX_HASH_ID`: one
past 2**61 - 1 wraps onto a small one); two different prefixes then collide with probability
about 2^-61 per pair, which is negligible next to the sizes simulated.
"""

from __future__ import annotations

from orcasim.requests import Requests

# Namespaces of content: a segment named by the workload, and a request's own prompt or
# output when the workload names none (unique to that request).
NAMED, OWN_PROMPT, OWN_OUTPUT = 0, 1, 2

Segment = tuple[int, int, int]  # (namespace, id, tokens)


def sequence_segments(requests: Requests, req_id: int) -> list[Segment]:
    """The content of request `req_id`'s whole sequence: its prompt, then its output."""
    output_tokens = int(requests.output_tokens[req_id])
    content = requests.content
    if content is None:
        prompt = [(OWN_PROMPT, req_id, int(requests.prompt_tokens[req_id]))]
        return [*prompt, (OWN_OUTPUT, req_id, output_tokens)]
    flat = content.prompts[req_id]
    prompt = [(NAMED, flat[k], flat[k + 1]) for k in range(0, len(flat), 2)]
    return [*prompt, (NAMED, int(content.output_ids[req_id]), output_tokens)]


def block_hashes(segments: list[Segment], block_size_tokens: int, num_blocks: int) -> list[int]:
    """Hashes of the first `num_blocks` full blocks of a sequence (fewer if it is shorter)."""
    hashes: list[int] = []
    if num_blocks <= 0:  # checked only after a hash was added: 0 gave every block (a
        return hashes    # one-block prompt read as fully cached by prefix_affinity)
    chain, start = 0, 0  # the key of the segments before the current one, and its offset
    for namespace, seg_id, tokens in segments:
        # Block ends that fall inside this segment, as offsets into it.
        first_end = -start % block_size_tokens or block_size_tokens
        for end in range(first_end, tokens + 1, block_size_tokens):
            hashes.append(hash((chain, namespace, seg_id, end)))
            if len(hashes) == num_blocks:
                return hashes
        chain = hash((chain, namespace, seg_id, tokens, -1))  # -1: a whole segment, not a block
        start += tokens
    return hashes


class BlockHasher:
    """Each request's block hashes for one block size, computed as far as asked and kept
    until the request is forgotten (a finished request's are dropped)."""

    def __init__(self, requests: Requests, block_size_tokens: int) -> None:
        self.requests = requests
        self.block_size_tokens = block_size_tokens
        self._hashes: dict[int, list[int]] = {}

    def hashes(self, req_id: int, num_blocks: int) -> list[int]:
        """The hashes of request `req_id`'s first `num_blocks` blocks (all must be full)."""
        known = self._hashes.get(req_id)
        if known is None or len(known) < num_blocks:
            segments = sequence_segments(self.requests, req_id)
            # Compute ahead: a decoding request asks one block at a time.
            known = block_hashes(segments, self.block_size_tokens, max(num_blocks, 2 * len(known or ())))
            self._hashes[req_id] = known
        assert len(known) >= num_blocks, "hashes asked for beyond the sequence"
        return known[:num_blocks]

    def forget(self, req_id: int) -> None:
        self._hashes.pop(req_id, None)

    def __len__(self) -> int:
        """Requests whose hashes are kept."""
        return len(self._hashes)
