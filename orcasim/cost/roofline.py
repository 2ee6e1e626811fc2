"""The `roofline` cost model: selective batching expressed as cost.

One iteration on a deployment (model, GPU, TP x PP) costs, summed over all stages:

    layers * [ sum over token ops  t(op, N)           N = flattened query tokens
             + sum over requests   t(attention_i)     each request alone
             + 2 all-reduces of N x hidden ]           tensor parallelism
    + (PP - 1) send/recv of N x hidden                 pipeline boundaries
    + embedding(N) + LM head(B)

where every operator takes max(FLOPs / (peak * compute_eff), bytes / (bandwidth * memory_eff))
plus a kernel overhead (Williams et al. 2009's roofline with a launch floor). A MoE layer adds
its routed experts on the busiest rank. Under data-parallel attention (DP groups) a group runs
1/DP of the attention and token ops, but a request runs on one group and the groups meet at
every MoE layer, so an iteration costs at least its experts and all-to-alls plus the largest
request's own group work (`Roofline.data_parallel_floor_s`).

Default efficiencies (a rule, not a fit): large bf16 GEMMs reach about 70% of the
datasheet peak and streaming kernels about 80% of the datasheet HBM bandwidth on A100 and
H100 (the figures NVIDIA's own cuBLAS and STREAM-like benchmarks show); a kernel costs
about 5 us of launch and tail; NCCL on NVLink reaches about 80% of the link and 10 us of
latency per collective. The engine's own time (scheduling, sampling, kernel launches) is
the `overhead` block's (`orcasim.cost.overhead`), none by default: an ideal engine.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field, NonNegativeFloat

from orcasim.cost.base import Batch, CostModel, DecodeLine, StageEnds
from orcasim.cost.catalog import Deployment, check_parallel_layout
from orcasim.cost.flops import (
    ExpertOp,
    Op,
    attention_constants,
    attention_flops_bytes,
    embedding_op,
    expert_op,
    lm_head_op,
    prefill_attention_constants,
    token_ops,
)
from orcasim.cost.overhead import CostConfigBase
from orcasim.cost.parallel import (
    all_to_all_s,
    expert_parallel_links,
    pipeline_links,
    ring_all_reduce_s,
    send_recv_s,
    tensor_parallel_link,
)

FIXED_MEMO_ENTRIES = 1 << 18  # (tokens, batch size) pairs remembered: about 30 MB at most
DECODE_TERMS_MAX = 1 << 17  # contexts whose decode term is looked up: about 4 MB of floats


class RooflineCostConfig(CostConfigBase):
    kind: Literal["roofline"]
    compute_efficiency: float = Field(default=0.7, gt=0.0, le=1.0)
    memory_efficiency: float = Field(default=0.8, gt=0.0, le=1.0)
    network_efficiency: float = Field(default=0.8, gt=0.0, le=1.0)
    kernel_overhead_s: NonNegativeFloat = 5.0e-6
    collective_latency_s: NonNegativeFloat = 1.0e-5
    # Zipf exponent of a MoE router's expert popularity: 0 routes uniformly; a skewed
    # router hits fewer experts and loads one expert-parallel rank more than the others.
    expert_routing_skew: NonNegativeFloat = 0.0


class Roofline(CostModel):
    """Iteration time from FLOPs and bytes; see the module docstring for the formula."""

    def __init__(self, cfg: RooflineCostConfig, deployment: Deployment) -> None:
        self.cfg = cfg
        self.model = deployment.model
        hw = deployment.hardware
        # A scenario checks its layout on load; a deployment built by hand is checked here,
        # where a dense model with data-parallel attention reached an AssertionError in
        # `_routed_experts_s` when priced.
        check_parallel_layout(self.model, hw)
        self.tp, self.pipeline_stages = hw.tensor_parallel, hw.pipeline_parallel
        # Attention runs at the bf16 peak; GEMMs over fp8 weights at the fp8 peak where the
        # GPU has fp8 tensor cores (W8A8, as vLLM runs fp8 checkpoints on Hopper and later).
        self.flops_per_s = hw.gpu.peak_flops * cfg.compute_efficiency
        self.gemm_flops_per_s = self.flops_per_s
        if deployment.model.weight_dtype == "fp8" and hw.gpu.peak_flops_fp8:
            self.gemm_flops_per_s = hw.gpu.peak_flops_fp8 * cfg.compute_efficiency
        self.bytes_per_s = hw.gpu.hbm_bandwidth_bytes_per_s * cfg.memory_efficiency
        # Data-parallel attention: each group attends to its own requests and runs its own
        # tokens' dense operators. Balanced, a group does 1/dp of the iteration's attention:
        # as if at dp times the rate. But a request runs on one group, so no group finishes
        # before the largest request's own work does (`data_parallel_floor_s`).
        self.dp = hw.data_parallel_attention
        self.attention_flops_per_s = self.flops_per_s * self.dp
        self.attention_bytes_per_s = self.bytes_per_s * self.dp
        self.ops = token_ops(self.model, self.tp)
        self._op_terms = [(op.count, op.flops_per_token, op.weight_bytes, op.bytes_per_token)
                          for op in self.ops]
        # A mixture-of-experts model: its MoE layers run other token ops, and the experts.
        self.experts: ExpertOp | None = expert_op(self.model, self.tp, hw.expert_parallel,
                                                  cfg.expert_routing_skew)
        self.expert_parallel, self.gpus_per_node = hw.expert_parallel, hw.gpu.gpus_per_node
        moe = self.model.moe
        self.num_moe_layers = 0 if moe is None else self.model.num_layers - len(moe.dense_layers)
        self.num_dense_layers = self.model.num_layers - self.num_moe_layers
        self.moe_ops = token_ops(self.model, self.tp, moe_layer=True) if moe else []
        self.tp_link = tensor_parallel_link(hw, cfg.network_efficiency, cfg.collective_latency_s)
        self.pp_links = pipeline_links(hw, cfg.network_efficiency, cfg.collective_latency_s)
        # The boundaries by link, counted (most deployments have one: (PP - 1) x one send).
        self._pp_link_counts = list(Counter(self.pp_links).items())
        self.ep_links = expert_parallel_links(hw, cfg.network_efficiency, cfg.collective_latency_s)
        # Tokens go to their experts in fp8 when the experts' GEMMs take fp8 inputs (DeepEP's
        # FP8 dispatch for W8A8 experts) and come back in the activations' precision.
        fp8_gemms = self.gemm_flops_per_s != self.flops_per_s
        self.dispatch_bytes_per_pair = self.model.hidden_size * (1 if fp8_gemms else self.model.dtype_bytes)
        self.combine_bytes_per_pair = self.model.hidden_size * self.model.dtype_bytes
        self.activation_bytes_per_token = self.model.hidden_size * self.model.dtype_bytes
        self._fixed_memo: dict[tuple[int, int], float] = {}
        self._token_parts_memo: dict[float, tuple[float, float, float]] = {}
        self.embedding, self.lm_head = embedding_op(self.model), lm_head_op(self.model, self.tp)
        self._attention = _AttentionTerms(self)
        # Sliding-window layers attend to the last `sliding_window` tokens: their attention
        # stops growing with the context, so it is priced apart (`window_attention_per_layer_s`).
        self.window_layers = self.model.num_window_layers
        self.full_layers = self.model.num_layers - self.window_layers

    def op_time_s(self, op: Op, num_tokens: np.ndarray | float) -> np.ndarray:
        """One run of `op` over `num_tokens` tokens (elementwise over an array)."""
        n = np.asarray(num_tokens, dtype=np.float64)
        compute = op.flops_per_token * n / self.gemm_flops_per_s
        memory = (op.weight_bytes + op.bytes_per_token * n) / self.bytes_per_s
        return np.maximum(compute, memory) + self.cfg.kernel_overhead_s

    def token_ops_per_layer_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        """The token-batched operators of one layer on one rank (what Vidur's mlp.csv times)."""
        # (A float in gives a numpy scalar out, which every caller treats as an array.)
        return sum(op.count * self.op_time_s(op, num_tokens) for op in self.ops)  # type: ignore[return-value]

    def moe_layer_extra_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        """A MoE layer's own token ops (on a data-parallel group's share of the iteration's
        `num_tokens`) and its routed experts on the busiest rank (attention is any layer's)."""
        n = np.asarray(num_tokens, dtype=np.float64)
        experts_s, launches_s = self._routed_experts_s(n)
        return self._moe_ops_s(n / self.dp) + experts_s + launches_s

    def _moe_ops_s(self, group_tokens: np.ndarray) -> np.ndarray:
        """A MoE layer's token ops but its routed experts, on a group's `group_tokens`."""
        return sum(op.count * self.op_time_s(op, group_tokens) for op in self.moe_ops)  # type: ignore[return-value]

    def _routed_experts_s(self, num_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A MoE layer's routed experts on the busiest rank, for all `num_tokens` of the
        iteration: their roofline time, and their kernels' launches."""
        assert self.experts is not None
        experts, n = self.experts, num_tokens
        compute = experts.flops_per_token * n / self.gemm_flops_per_s
        memory = (experts.experts_hit(n) * experts.weight_bytes_per_expert
                  + experts.bytes_per_token * n) / self.bytes_per_s
        return np.maximum(compute, memory), np.asarray(experts.kernels * self.cfg.kernel_overhead_s)

    def _layers_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        """Every layer's token-batched work (dense layers, MoE layers) on one rank."""
        if self.experts is None:
            return self.model.num_layers * self.token_ops_per_layer_s(num_tokens)
        group_tokens = np.asarray(num_tokens, dtype=np.float64) / self.dp
        return (self.num_dense_layers * self.token_ops_per_layer_s(group_tokens)
                + self.num_moe_layers * self.moe_layer_extra_s(num_tokens))

    def attention_per_layer_s(self, query_tokens: np.ndarray, context_tokens: np.ndarray) -> np.ndarray:
        """Attention of one layer, summed over requests (the last axis); one kernel launch.

        The sum is exactly rounded (`math.fsum`), so it does not depend on the order or the
        grouping of the terms: the fast paths may list the same terms however they like.
        """
        flops, bytes_ = attention_flops_bytes(self.model, self.tp, query_tokens, context_tokens)
        per_request = np.maximum(flops / self.attention_flops_per_s, bytes_ / self.attention_bytes_per_s)
        return _fsum_last_axis(per_request) + self.cfg.kernel_overhead_s  # type: ignore[return-value]

    def window_attention_per_layer_s(self, query_tokens: np.ndarray, context_tokens: np.ndarray) -> np.ndarray:
        """A sliding-window layer's attention, summed over requests (the last axis).

        Query j of q new tokens at position c - q + j sees min(c - q + j + 1, W) keys, so a
        request covers sum over p = c-q+1..c of min(p, W) query-key pairs, and the kernel
        reads the union of the windows: min(c, W + q - 1) tokens' KV.
        """
        flops, bytes_ = self._window_flops_bytes(query_tokens, context_tokens)
        per_request = np.maximum(flops / self.attention_flops_per_s, bytes_ / self.attention_bytes_per_s)
        return _fsum_last_axis(per_request) + self.cfg.kernel_overhead_s  # type: ignore[return-value]

    def _window_flops_bytes(self, query_tokens: np.ndarray,
                            context_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A sliding-window layer's attention FLOPs and bytes, per request (elementwise)."""
        window = self.model.sliding_window
        assert window is not None
        q, c = query_tokens.astype(np.int64), context_tokens.astype(np.int64)
        first = c - q + 1  # keys the first new query sees, before the window caps them
        pairs = np.where(c <= window, (first + c) * q // 2,
                         np.where(first >= window, q * window,
                                  (first + window) * (window - first + 1) // 2 + (c - window) * window))
        terms = self._attention  # the per-token constants, computed once
        read = np.minimum(c, window + q - 1)
        flops = pairs * terms.flops_per_pair
        bytes_ = read * terms.kv_bytes + q * terms.query_bytes
        if terms.split:  # MLA: a prefill in the compute-friendly form, its window's past re-projected
            prefill = q > 1
            flops = np.where(prefill, pairs * terms.prefill_flops_per_pair
                             + terms.prefill_up_flops * (read - q), flops)
            bytes_ = np.where(prefill, read * terms.prefill_kv_bytes + q * terms.prefill_query_bytes, bytes_)
        return flops, bytes_

    def _attention_s(self, full_per_layer_s: float, query_tokens: np.ndarray,
                     context_tokens: np.ndarray) -> float:
        """Every layer's attention: full layers at `full_per_layer_s` each, windows apart."""
        if not self.window_layers:
            return self.model.num_layers * full_per_layer_s
        window_s = float(self.window_attention_per_layer_s(query_tokens, context_tokens))
        return self.full_layers * full_per_layer_s + self.window_layers * window_s

    def tp_all_reduce_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        """Two TP all-reduces of N x hidden per layer, over all layers; with data-parallel
        attention, of a group's share, and a MoE layer's second is its experts' combine."""
        if self.dp == 1:
            size = np.asarray(num_tokens, dtype=np.float64) * self.activation_bytes_per_token
            return 2 * self.model.num_layers * ring_all_reduce_s(size, self.tp, self.tp_link)
        return self._group_all_reduces_s(np.asarray(num_tokens, dtype=np.float64) / self.dp)

    def _group_all_reduces_s(self, group_tokens: np.ndarray) -> np.ndarray:
        """`tp_all_reduce_s` under data-parallel attention, of a group's `group_tokens`."""
        size = group_tokens * self.activation_bytes_per_token
        all_reduces = self.model.num_layers + self.num_dense_layers
        return all_reduces * ring_all_reduce_s(size, self.tp, self.tp_link)

    def expert_all_to_all_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        """Dispatch and combine of every MoE layer, when tokens live on their data-parallel
        group and experts on other ranks. Without data-parallel attention every rank
        already holds every token: the all-reduce combines."""
        n = np.asarray(num_tokens, dtype=np.float64)
        if self.dp == 1 or self.experts is None:
            return np.zeros_like(n)
        return self.num_moe_layers * (self.expert_dispatch_s(n) + self.expert_combine_s(n))

    def expert_dispatch_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        """One MoE layer's dispatch. The busiest rank receives its experts' share of all N
        tokens' top-k choices (no fewer than any rank sends): one message per (token,
        expert) pair, as DeepEP's low-latency kernels send them."""
        return self._expert_all_to_all_s(num_tokens, self.dispatch_bytes_per_pair)

    def expert_combine_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        """One MoE layer's combine: the dispatch's pairs back, in the activations' precision."""
        return self._expert_all_to_all_s(num_tokens, self.combine_bytes_per_pair)

    def _expert_all_to_all_s(self, num_tokens: np.ndarray | float, bytes_per_pair: float) -> np.ndarray:
        assert self.experts is not None
        pairs = self.experts.pairs_per_token * np.asarray(num_tokens, dtype=np.float64)
        return all_to_all_s(pairs * bytes_per_pair, self.expert_parallel, self.gpus_per_node,
                            *self.ep_links)

    def pipeline_sends_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        """One send/recv of N x hidden at each of the PP - 1 stage boundaries, over NVLink
        or across nodes as each boundary is placed."""
        size = np.asarray(num_tokens, dtype=np.float64) * self.activation_bytes_per_token
        total = np.zeros_like(size)
        for link, count in self._pp_link_counts:
            total = total + count * send_recv_s(size, link)
        return total

    def _fixed_s(self, num_tokens: np.ndarray | float, batch_size: float) -> np.ndarray:
        """Everything but attention: it depends only on the token and request counts (a
        data-parallel group's ends and stage sends see its share of them)."""
        layers = self._layers_s(num_tokens)
        group_tokens = np.asarray(num_tokens, dtype=np.float64) / self.dp
        ends = self.op_time_s(self.embedding, group_tokens)
        ends = ends + self.op_time_s(self.lm_head, batch_size / self.dp)
        comm = self.tp_all_reduce_s(num_tokens) + self.pipeline_sends_s(group_tokens)
        if self.experts is not None:
            comm = comm + self.expert_all_to_all_s(num_tokens)
        return layers + ends + comm

    def stage_ends(self, batch: Batch) -> StageEnds | None:
        """`_fixed_s`'s embedding, LM head and each boundary's send: the first stage embeds,
        the last runs the LM head, each but the last sends (see `StageEnds`)."""
        if self.pipeline_stages == 1 or batch.size == 0:
            return None
        group_tokens, group_requests = batch.total_query_tokens / self.dp, batch.size / self.dp
        if self.dp > 1:  # the slowest group's: the largest request's where it sets the time
            balanced_s = self._balanced_time_s(batch.query_tokens, batch.context_tokens,
                                               batch.total_query_tokens)
            _, largest_tokens = self._data_parallel_time_s(
                batch.query_tokens.tolist(), batch.context_tokens.tolist(), batch.total_query_tokens,
                balanced_s)
            if largest_tokens is not None:
                group_tokens, group_requests = float(largest_tokens), 1.0
        return StageEnds(float(self.op_time_s(self.embedding, group_tokens)),
                         float(self.op_time_s(self.lm_head, group_requests)),
                         self.stage_sends_s(group_tokens))

    def stage_sends_s(self, num_tokens: float) -> tuple[float, ...]:
        """Each stage boundary's send of N x hidden (`pipeline_sends_s` adds them up)."""
        size = num_tokens * self.activation_bytes_per_token
        return tuple(float(send_recv_s(size, link)) for link in self.pp_links)

    def _op_scalar_s(self, op: Op, n: float) -> float:
        """`op_time_s` on Python floats: the same IEEE operations without numpy's overhead."""
        compute = op.flops_per_token * n / self.gemm_flops_per_s
        memory = (op.weight_bytes + op.bytes_per_token * n) / self.bytes_per_s
        return max(compute, memory) + self.cfg.kernel_overhead_s

    def _fixed_scalar_s(self, num_tokens: float, batch_size: float) -> float:
        """`_fixed_s` of one batch, operation for operation in the same order (same bits)."""
        if self.experts is not None:  # the numpy path itself: MoE models are not the hot path
            return float(self._fixed_s(num_tokens, batch_size))
        layers, embedding_s, comm = self._token_parts_s(num_tokens)
        return layers + (embedding_s + self._op_scalar_s(self.lm_head, batch_size)) + comm

    def _token_parts_s(self, num_tokens: float) -> tuple[float, float, float]:
        """`_fixed_scalar_s`'s terms that depend on the tokens alone (the layers, the
        embedding, the communication), memoised by the tokens: an iteration with a new
        prompt is a new (tokens, batch size) pair, rarely a new token count."""
        parts = self._token_parts_memo.get(num_tokens)
        if parts is None:
            layers = self.model.num_layers * self._dense_layer_scalar_s(num_tokens)
            comm = 0.0  # exactly what the numpy zeros of one GPU add
            if self.tp > 1 or self.pipeline_stages > 1:
                comm = float(self.tp_all_reduce_s(num_tokens)) + float(self.pipeline_sends_s(num_tokens))
            parts = (layers, self._op_scalar_s(self.embedding, num_tokens), comm)
            if len(self._token_parts_memo) < FIXED_MEMO_ENTRIES:
                self._token_parts_memo[num_tokens] = parts
        return parts

    def _dense_layer_scalar_s(self, n: float) -> float:
        """`token_ops_per_layer_s` on Python floats, op by op in the same order (same bits)."""
        per_layer = 0.0  # sum() over the ops, unrolled: runs on every memo miss
        fps, bps, overhead_s = self.gemm_flops_per_s, self.bytes_per_s, self.cfg.kernel_overhead_s
        for count, flops_per_token, weight_bytes, bytes_per_token in self._op_terms:
            # _op_scalar_s inlined (a call per op costs more than its arithmetic): same order
            memory_s = (weight_bytes + bytes_per_token * n) / bps
            per_layer += count * (max(flops_per_token * n / fps, memory_s) + overhead_s)
        return per_layer

    def _fixed_one_s(self, num_tokens: int, batch_size: int) -> float:
        """`_fixed_s` of one batch, memoised: an engine asks about the same counts again and again."""
        key = (num_tokens, batch_size)
        fixed_s = self._fixed_memo.get(key)
        if fixed_s is None:
            fixed_s = self._fixed_scalar_s(float(num_tokens), float(batch_size))
            if len(self._fixed_memo) < FIXED_MEMO_ENTRIES:
                self._fixed_memo[key] = fixed_s
        return fixed_s

    def iteration_time_s(self, batch: Batch) -> float:
        if batch.size == 0:
            return 0.0
        balanced_s = self._balanced_time_s(batch.query_tokens, batch.context_tokens,
                                           batch.total_query_tokens)
        if self.dp == 1:
            return balanced_s
        return self._data_parallel_time_s(batch.query_tokens.tolist(), batch.context_tokens.tolist(),
                                          batch.total_query_tokens, balanced_s)[0]

    def _balanced_time_s(self, query_tokens: np.ndarray, context_tokens: np.ndarray,
                         query_total: int) -> float:
        """The iteration with its attention and dense operators spread evenly over the
        data-parallel groups (all of it, with one group)."""
        attention = self._attention.per_layer_s(query_tokens, context_tokens)
        fixed = self._fixed_one_s(query_total, len(query_tokens))
        return float(fixed + self._attention_s(attention, query_tokens, context_tokens))

    def iteration_time_lists_s(
        self, query_tokens: list[int], context_tokens: list[int], query_total: int,
        context_total: int,
    ) -> float:
        if not query_tokens:
            return 0.0
        attention = self._attention.per_layer_lists_s(query_tokens, context_tokens)
        fixed = self._fixed_one_s(query_total, len(query_tokens))
        if not self.window_layers:
            balanced_s = float(fixed + self.model.num_layers * attention)
        else:
            q, c = np.array(query_tokens, dtype=np.int64), np.array(context_tokens, dtype=np.int64)
            balanced_s = float(fixed + self._attention_s(attention, q, c))
        if self.dp == 1:
            return balanced_s
        # The floor from the same lists and the same function: iteration_time_s's bits.
        return self._data_parallel_time_s(query_tokens, context_tokens, query_total, balanced_s)[0]

    def data_parallel_floor_s(self, query_tokens: list[int], context_tokens: list[int],
                              query_total: int) -> float:
        """The least an iteration takes under data-parallel attention, where each request
        runs on the one group that holds its KV and the groups meet at every MoE layer:
        the busiest rank's experts and the all-to-alls (`_experts_shared_s`, every group
        waits for them) plus the largest request's own attention and dense work on its
        group (`_own_group_s`), which no placement spreads."""
        return self._floor_and_largest(query_tokens, context_tokens, query_total)[0]

    def _floor_and_largest(self, query_tokens: list[int], context_tokens: list[int],
                           query_total: int) -> tuple[float, int]:
        """`data_parallel_floor_s`, and its largest request's query tokens."""
        own_s, largest_tokens = self._largest_request(query_tokens, context_tokens)
        return self._experts_shared_s(query_total) + own_s, largest_tokens

    def _data_parallel_time_s(self, query_tokens: list[int], context_tokens: list[int],
                              query_total: int, balanced_s: float) -> tuple[float, int | None]:
        """Under data-parallel attention, an iteration's time, max(`balanced_s`, its floor
        `data_parallel_floor_s`), and its largest request's query tokens where the floor sets
        it (None where the balanced share does). The time (`iteration_time_s`) and the group
        whose ends each stage runs (`stage_ends`) come from this one comparison."""
        floor_s, largest_tokens = self._floor_and_largest(query_tokens, context_tokens, query_total)
        return (floor_s, largest_tokens) if floor_s > balanced_s else (balanced_s, None)

    def _largest_request(self, query_tokens: list[int], context_tokens: list[int]) -> tuple[float, int]:
        """The largest `_own_group_s` of a batch's requests, and that request's query tokens.

        `_own_group_s` never falls as the context grows at a fixed query (each term is a
        rounded sum and product of non-decreasing ones), so only each query length's longest
        context is priced; the maximum does not depend on their order."""
        longest: dict[int, int] = {}
        for q, c in zip(query_tokens, context_tokens, strict=True):
            if c > longest.get(q, -1):
                longest[q] = c
        queries = np.fromiter(longest.keys(), dtype=np.int64, count=len(longest))
        contexts = np.fromiter(longest.values(), dtype=np.int64, count=len(longest))
        own_s = self._own_group_s(queries, contexts)
        largest = int(np.argmax(own_s))
        return float(own_s[largest]), int(queries[largest])

    def _own_group_s(self, query_tokens: np.ndarray, context_tokens: np.ndarray) -> np.ndarray:
        """What a data-parallel group does for one request alone (elementwise over requests):
        its attention in every layer at one group's rate, its tokens' non-expert operators,
        embedding and LM head, and the group's own all-reduces and stage sends. The terms of
        `_fixed_s` and `_attention_s` that a group runs, for one request's tokens."""
        tokens = query_tokens.astype(np.float64)
        overhead_s = self.cfg.kernel_overhead_s
        flops, bytes_ = attention_flops_bytes(self.model, self.tp, query_tokens, context_tokens)
        attention = self.full_layers * (np.maximum(flops / self.flops_per_s,
                                                   bytes_ / self.bytes_per_s) + overhead_s)
        if self.window_layers:
            flops, bytes_ = self._window_flops_bytes(query_tokens, context_tokens)
            attention = attention + self.window_layers * (
                np.maximum(flops / self.flops_per_s, bytes_ / self.bytes_per_s) + overhead_s)
        layers = (self.num_dense_layers * self.token_ops_per_layer_s(tokens)
                  + self.num_moe_layers * self._moe_ops_s(tokens))
        ends = self.op_time_s(self.embedding, tokens) + self.op_time_s(self.lm_head, 1.0)
        comm = self._group_all_reduces_s(tokens) + self.pipeline_sends_s(tokens)
        return attention + layers + ends + comm

    def _experts_shared_s(self, num_tokens: float) -> float:
        """Every MoE layer's routed experts on the busiest rank, and its dispatch and
        combine, for all `num_tokens` of the iteration: what every group waits for."""
        n = np.asarray(num_tokens, dtype=np.float64)
        experts_s, launches_s = self._routed_experts_s(n)
        return float(self.num_moe_layers * (experts_s + launches_s) + self.expert_all_to_all_s(n))

    def decode_steps_s(self, context_tokens: np.ndarray, num_steps: int) -> np.ndarray:
        """All steps at once, from two integer sums per step (see `_AttentionTerms`)."""
        size = len(context_tokens)
        if size == 0:
            return np.zeros(num_steps)
        balanced_s = self._balanced_decode_steps_s(context_tokens, num_steps)
        if self.dp == 1:
            return balanced_s
        # Step k's largest request is the one holding the longest context: iteration_time_s's
        # floor, elementwise (the same operations on the same numbers, so the same bits).
        longest = max(context_tokens.tolist()) + np.arange(num_steps)
        own_s = self._own_group_s(np.ones(num_steps, dtype=np.int64), longest)
        return np.maximum(balanced_s, self._experts_shared_s(size) + own_s)

    def _balanced_decode_steps_s(self, context_tokens: np.ndarray, num_steps: int) -> np.ndarray:
        """`decode_steps_s` with the attention and dense operators spread evenly over the groups."""
        size = len(context_tokens)
        line = self._decode_line_s(size, sum(context_tokens.tolist()))
        if line is not None:  # the step's affine cost as one multiply-add
            first_s, slope_s = line
            return first_s + slope_s * np.arange(num_steps)
        fixed_s = self._fixed_one_s(size, size)
        full = self._attention.decode_steps_per_layer_s(context_tokens, num_steps)
        if not self.window_layers:
            return fixed_s + self.model.num_layers * full
        contexts = context_tokens[None, :] + np.arange(num_steps)[:, None]
        window = self.window_attention_per_layer_s(np.ones_like(contexts), contexts)
        return fixed_s + self.full_layers * full + self.window_layers * window

    def decode_line(self, size: int, context_total: int) -> DecodeLine | None:
        # Under data-parallel attention the longest context sets a floor (`decode_steps_s`)
        # that the totals do not know: no line, and the steppers price the contexts.
        line = self._decode_line_s(size, context_total) if size and self.dp == 1 else None
        if line is None:
            return None
        first_s, slope_s = line  # decode_steps_s: first_s + slope_s * k
        return DecodeLine(first_s, 0, 1, slope_s)

    def _decode_line_s(self, size: int, context_total: int) -> tuple[float, float] | None:
        """Decode step k costs first + slope * k when every attention op is memory-bound
        (and no layer's window stops a context's growth: then there is no line)."""
        if self.window_layers:
            return None
        line = self._attention.decode_line_s(size, context_total)
        if line is None:
            return None
        fixed_s, layers = self._fixed_one_s(size, size), self.model.num_layers
        return fixed_s + layers * line[0], layers * line[1]


def _fsum_last_axis(values: np.ndarray) -> np.ndarray | float:
    """Sums over the last axis of a vector (one batch) or a matrix (a batch's steps, a row
    each), each exactly rounded (math.fsum, Shewchuk's algorithm)."""
    if values.ndim == 1:
        return math.fsum(values.tolist())
    assert values.ndim == 2, values.shape
    return np.array([math.fsum(row) for row in values.tolist()])


@dataclass(frozen=True, slots=True)
class _IntConstants:
    """`_AttentionTerms`' constants as numpy scalars (whole ones as int64): cheaper operands."""

    one: np.int64
    half_flops_per_pair: np.int64
    kv_bytes: np.int64
    query_bytes: np.int64
    flops_per_s: np.float64
    bytes_per_s: np.float64
    # A prefill's (`prefill_attention_constants`), read where `_AttentionTerms.split`.
    prefill_half_flops_per_pair: np.int64
    prefill_kv_bytes: np.int64
    prefill_query_bytes: np.int64
    prefill_up_flops: np.int64


class _AttentionTerms:
    """Attention time from per-request constants, cheaper than `attention_flops_bytes`.

    With q query tokens and c context tokens (`attention_flops_bytes`):
        flops = flops_per_pair * (q*(c - q) + q*(q + 1)/2) = flops_per_pair/2 * q*(2c - q + 1)
        bytes = kv_bytes * c + query_bytes * q
    When these constants are whole numbers (heads divide by TP), flops and bytes are whole
    numbers below 2**53, exact in any order: `per_layer_s` then does the reference's own
    divisions, maximum and sum, so `iteration_time_s` keeps its bits. Otherwise it falls
    back to `attention_per_layer_s`. MLA (`split`) prices a request of more than one query
    token with a prefill's constants, plus up_flops * (c - q) (`prefill_attention_constants`).
    """

    def __init__(self, cost: Roofline) -> None:
        self.cost = cost
        self.flops_per_pair, self.kv_bytes, self.query_bytes = attention_constants(cost.model, cost.tp)
        self.half_flops_per_pair = self.flops_per_pair / 2.0
        (self.prefill_flops_per_pair, self.prefill_kv_bytes, self.prefill_query_bytes,
         self.prefill_up_flops) = prefill_attention_constants(cost.model, cost.tp)
        self.split = cost.model.mla is not None  # a prefill priced apart from a decode
        prefill = (self.prefill_flops_per_pair / 2.0, self.prefill_kv_bytes, self.prefill_query_bytes,
                   self.prefill_up_flops)
        consts = (self.half_flops_per_pair, self.kv_bytes, self.query_bytes)
        self.whole = all(float(x).is_integer() for x in (*consts, *prefill))
        if self.whole:
            half, kv, query = (np.int64(x) for x in consts)
            self._ints = _IntConstants(np.int64(1), half, kv, query,
                                       np.float64(cost.attention_flops_per_s),
                                       np.float64(cost.attention_bytes_per_s),
                                       *(np.int64(x) for x in prefill))
            self._whole_terms = tuple(int(x) for x in consts)  # Python ints: exact, as int64
            self._prefill_whole_terms = tuple(int(x) for x in prefill)
        self.flops_per_s, self.bytes_per_s = cost.attention_flops_per_s, cost.attention_bytes_per_s
        self.kernel_overhead_s = cost.cfg.kernel_overhead_s
        # A decode op (q = 1) is compute-bound above this context: the roofline's ridge.
        compute_slope_s = self.flops_per_pair / self.flops_per_s
        memory_slope_s = self.kv_bytes / self.bytes_per_s
        excess_s = compute_slope_s - memory_slope_s
        self.ridge_tokens = self.query_bytes / self.bytes_per_s / excess_s if excess_s > 0 else np.inf
        # Below this context a decode term's memory side exceeds its compute side by a
        # relative margin of at least 1e-12 (memory - compute = query_bytes / bytes_per_s
        # - c * excess_s: at least 1e-6 of query_bytes / bytes_per_s below 0.999999 of the
        # ridge, and memory is at most 1e6 of that below 1e6 query_bytes / kv_bytes tokens),
        # far above their rounding (~1e-16): `max` picks the memory side's bits, and
        # `per_layer_lists_s` computes that side alone.
        self.decode_memory_below_tokens = min(self.ridge_tokens * (1.0 - 1e-6),
                                              1e6 * self.query_bytes / max(self.kv_bytes, 1.0))
        # `_memory_bound_terms`' table: contexts 0 .. end - 1, all below the bound.
        self._decode_terms: list[float] = []
        self._decode_terms_end = min(math.ceil(self.decode_memory_below_tokens), DECODE_TERMS_MAX)

    def per_layer_s(self, query_tokens: np.ndarray, context_tokens: np.ndarray) -> float:
        """`Roofline.attention_per_layer_s` of one batch, bit for bit."""
        if not self.whole:
            return float(self.cost.attention_per_layer_s(query_tokens, context_tokens))
        q, c, ints = query_tokens, context_tokens, self._ints
        # All int64 (whole numbers, so exact) until the divisions; numpy scalars are cheap.
        twice_pairs = q * (c + c - q + ints.one)
        if self.split:  # each request's constants: a decode's, or a prefill's
            prefill = q > ints.one
            half = np.where(prefill, ints.prefill_half_flops_per_pair, ints.half_flops_per_pair)
            up = np.where(prefill, ints.prefill_up_flops, np.int64(0))
            kv = np.where(prefill, ints.prefill_kv_bytes, ints.kv_bytes)
            query = np.where(prefill, ints.prefill_query_bytes, ints.query_bytes)
            compute_s = (twice_pairs * half + (c - q) * up) / ints.flops_per_s
            memory_s = (c * kv + q * query) / ints.bytes_per_s
            return math.fsum(np.maximum(compute_s, memory_s).tolist()) + self.kernel_overhead_s
        compute_s = (twice_pairs * ints.half_flops_per_pair) / ints.flops_per_s
        memory_s = (c * ints.kv_bytes + q * ints.query_bytes) / ints.bytes_per_s
        # Exactly rounded, as attention_per_layer_s sums: the same bits from any order.
        return math.fsum(np.maximum(compute_s, memory_s).tolist()) + self.kernel_overhead_s

    def per_layer_lists_s(self, query_tokens: list[int], context_tokens: list[int]) -> float:
        """`per_layer_s` of a batch given as lists: the same terms on Python numbers.

        Each term repeats per_layer_s's operations (whole numbers, exact; then the same
        divisions and maximum), and the sum is exactly rounded, so the bits are the same.
        Cheaper than numpy for the batch sizes the engine sees.
        """
        if not self.whole:
            q, c = np.array(query_tokens, dtype=np.int64), np.array(context_tokens, dtype=np.int64)
            return float(self.cost.attention_per_layer_s(q, c))
        half, kv, qb = self._whole_terms
        fps, bps, below = self.flops_per_s, self.bytes_per_s, self.decode_memory_below_tokens
        # A decode (q = 1) below the ridge is memory-bound: its term is the memory side's
        # bits, as `max` would pick them (see `decode_memory_below_tokens`), at a third of the work.
        # A scheduler's batch is mostly its running requests' decodes, first: when every
        # q = 1 leads and all are below, they take that term with no test each. The sum is
        # exactly rounded, so which terms come first changes no bit.
        ones = query_tokens.count(1)
        leading = ones and query_tokens[:ones] == [1] * ones
        if leading and (terms := self._memory_bound_terms(context_tokens[:ones])) is not None:
            pairs = zip(query_tokens[ones:], context_tokens[ones:], strict=True)
        else:
            terms, pairs = [], zip(query_tokens, context_tokens, strict=True)
        if self.split:  # MLA: a prefill (q > 1) by its own constants (`per_layer_s`)
            return self._split_lists_s(terms, pairs)
        terms += [(c * kv + qb) / bps if q == 1 and c < below
                  else max((q * (c + c - q + 1) * half) / fps, (c * kv + q * qb) / bps)
                  for q, c in pairs]
        return math.fsum(terms) + self.kernel_overhead_s

    def _split_lists_s(self, terms: list[float], pairs: Iterator[tuple[int, int]]) -> float:
        """`per_layer_lists_s`'s terms under MLA (`split`): a request of more than one query
        token by a prefill's constants. A function of its own: Python 3.11 makes a cell for
        each variable a comprehension reads on every call of the function that holds it, so
        in `per_layer_lists_s` its four constants cost every dense batch their cells."""
        half, kv, qb = self._whole_terms
        p_half, p_kv, p_qb, up = self._prefill_whole_terms
        fps, bps, below = self.flops_per_s, self.bytes_per_s, self.decode_memory_below_tokens
        terms += [(c * kv + qb) / bps if q == 1 and c < below
                  else max((q * (c + c - q + 1) * half) / fps, (c * kv + q * qb) / bps) if q <= 1
                  else max((q * (c + c - q + 1) * p_half + (c - q) * up) / fps,
                           (c * p_kv + q * p_qb) / bps)
                  for q, c in pairs]
        return math.fsum(terms) + self.kernel_overhead_s

    def _memory_bound_terms(self, contexts: list[int]) -> list[float] | None:
        """The terms of decodes (q = 1) holding `contexts`, if every one is below
        `decode_memory_below_tokens` (memory-bound: (c * kv + qb) / bps); else None.

        Looked up in `_decode_terms`, whose entry c is that expression's value (the same
        bits), computed once, and which holds only contexts below the bound: a context past
        its end (an IndexError, rare once it has grown) grows it or answers None, so that
        no batch pays for a `max` over its contexts."""
        table = self._decode_terms
        try:
            return list(map(table.__getitem__, contexts))
        except IndexError:
            longest = max(contexts)
        if longest >= self._decode_terms_end:
            return None
        kv, qb, bps = self._whole_terms[1], self._whole_terms[2], self.bytes_per_s
        end = min(max(longest + 1, 2 * len(table), 1024), self._decode_terms_end)
        table.extend([(c * kv + qb) / bps for c in range(len(table), end)])
        return list(map(table.__getitem__, contexts))

    def decode_line_s(self, size: int, context_total: int) -> tuple[float, float] | None:
        """Decode steps' per-layer attention as first + slope * k, when all are memory-bound.

        `size` requests holding `context_total` context tokens at step 0.
        """
        if self.ridge_tokens != np.inf:
            return None
        first_bytes = context_total * self.kv_bytes + size * self.query_bytes
        first_s = first_bytes / self.bytes_per_s + self.kernel_overhead_s
        return first_s, size * self.kv_bytes / self.bytes_per_s

    def decode_steps_per_layer_s(self, context_tokens: np.ndarray, num_steps: int) -> np.ndarray:
        """Per-layer attention of `num_steps` decode steps, request contexts growing by one.

        A decode op's time is max(compute, memory), both affine in its context c, so at
        step k the batch costs the memory line over the requests still below the ridge plus
        the compute line over those above it: two counts and two context sums, from the
        sorted contexts. Differs from the per-request sum only by rounding (~1e-16).
        """
        size = len(context_tokens)
        steps = np.arange(num_steps)
        sorted_c = np.sort(context_tokens)
        prefix = np.concatenate(([0], np.cumsum(sorted_c)))
        below = np.searchsorted(sorted_c, self.ridge_tokens - steps, side="right")
        below_sum = prefix[below] + below * steps
        above_sum = prefix[-1] - prefix[below] + (size - below) * steps
        memory_s = (below_sum * self.kv_bytes + below * self.query_bytes) / self.bytes_per_s
        compute_s = (above_sum * self.flops_per_pair) / self.flops_per_s
        return memory_s + compute_s + self.kernel_overhead_s
