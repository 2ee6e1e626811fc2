"""Sarathi-Serve's stall-free batching (Agrawal et al., OSDI 2024, section 4).

The paged scheduler of `orcasim.schedulers.paged` with one per-iteration token budget,
`chunk_size_tokens`. Running requests come first in admission order, so ongoing decodes
(one token each) are planned before any prefill; prompts, including a prefill redone
after a recompute preemption, are then split into chunks that fill what is left of the
budget. A chunk that does not finish a prompt emits no token. Because no iteration
holds more than `chunk_size_tokens` of new tokens, a long prompt never stalls decodes,
and no prompt is too long for the budget.

Three departures from Sarathi-Serve's own code, all vLLM v1's: KV blocks are taken chunk by
chunk as the prompt is computed, where Sarathi's block manager allocates a whole prompt's at
admission (so here a prompt may start where Sarathi's would wait, and be preempted later);
the watermark is waived while nothing runs; and a decode preempts only when it needs a new
block and none is free, where Sarathi's `can_append_slot` wants one block free before every
decode step (it keeps one spare: under memory pressure it preempts sooner, so this is
slightly optimistic for Sarathi's victims). `max_num_seqs` defaults to 256 (vLLM's);
Sarathi-Serve's own default is 128. With `chunk_size_tokens` at the token budget and
`watermark: 0` this is vLLM v1's default scheduler (chunked prefill on).

Each running request takes a token of the chunk every step, so at most
`chunk_size_tokens` requests run at once, whatever `max_num_seqs` says: a run with the
chunk below `max_num_seqs` warns (vLLM refuses such a token budget, `paged` too).
"""

from __future__ import annotations

import warnings
from typing import Literal

from pydantic import PositiveInt

from orcasim.requests import Requests
from orcasim.schedulers.paged import PagedMemoryConfig, PagedScheduler


class ChunkedConfig(PagedMemoryConfig):
    kind: Literal["chunked"]
    chunk_size_tokens: PositiveInt = 512


class ChunkedScheduler(PagedScheduler):
    chunked_prefill = True
    # The paged hooks decline a run while any prompt chunk is left (paged_runs.decode_run).
    fast_forward = PagedScheduler.fast_forward

    def __init__(
        self, cfg: ChunkedConfig, requests: Requests, kv_capacity_tokens: int,
        kv_bytes_per_token: float | None = None, kv_groups: int = 1,
    ) -> None:
        self._setup(cfg, requests, kv_capacity_tokens, cfg.chunk_size_tokens, kv_bytes_per_token,
                    kv_groups)
        if cfg.chunk_size_tokens < cfg.max_num_seqs:
            warnings.warn(f"scheduler.chunk_size_tokens = {cfg.chunk_size_tokens} is below "
                          f"max_num_seqs = {cfg.max_num_seqs}: at most {cfg.chunk_size_tokens} "
                          "requests run at once (each takes a token of the chunk a step); "
                          "vLLM refuses a token budget below max_num_seqs", stacklevel=2)
