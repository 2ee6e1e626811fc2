"""The `roofline` cost model: selective batching expressed as cost.

One iteration on a deployment (model, GPU, TP x PP) costs, summed over all stages:

    layers * [ sum over token ops  t(op, N)           N = flattened query tokens
             + sum over requests   t(attention_i)     each request alone
             + 2 all-reduces of N x hidden ]           tensor parallelism
    + (PP - 1) send/recv of N x hidden                 pipeline boundaries
    + embedding(N) + LM head(B) + iteration_overhead_s

where every operator takes max(FLOPs / (peak * compute_eff), bytes / (bandwidth * memory_eff))
plus a kernel overhead (Williams et al. 2009's roofline with a launch floor).

Default efficiencies (a rule, not a fit): large bf16 GEMMs reach about 70% of the
datasheet peak and streaming kernels about 80% of the datasheet HBM bandwidth on A100 and
H100 (the figures NVIDIA's own cuBLAS and STREAM-like benchmarks show); a kernel costs
about 5 us of launch and tail; NCCL on NVLink reaches about 80% of the link and 10 us of
latency per collective. `iteration_overhead_s` is the CPU side (scheduling, sampling),
zero by default because the Orca paper's engine overlaps it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, NonNegativeFloat

from orcasim.config import Strict
from orcasim.cost.base import Batch, CostModel
from orcasim.cost.catalog import Deployment
from orcasim.cost.flops import Op, attention_flops_bytes, embedding_op, lm_head_op, token_ops
from orcasim.cost.parallel import (
    pipeline_link,
    ring_all_reduce_s,
    send_recv_s,
    tensor_parallel_link,
)

FIXED_MEMO_ENTRIES = 1 << 16  # (tokens, batch size) pairs remembered: a few MB at most


class RooflineCostConfig(Strict):
    kind: Literal["roofline"]
    compute_efficiency: float = Field(default=0.7, gt=0.0, le=1.0)
    memory_efficiency: float = Field(default=0.8, gt=0.0, le=1.0)
    network_efficiency: float = Field(default=0.8, gt=0.0, le=1.0)
    kernel_overhead_s: NonNegativeFloat = 5.0e-6
    collective_latency_s: NonNegativeFloat = 1.0e-5
    iteration_overhead_s: NonNegativeFloat = 0.0


class Roofline(CostModel):
    """Iteration time from FLOPs and bytes; see the module docstring for the formula."""

    def __init__(self, cfg: RooflineCostConfig, deployment: Deployment) -> None:
        self.cfg = cfg
        self.model = deployment.model
        hw = deployment.hardware
        self.tp, self.pipeline_stages = hw.tensor_parallel, hw.pipeline_parallel
        self.flops_per_s = hw.gpu.peak_flops * cfg.compute_efficiency
        self.bytes_per_s = hw.gpu.hbm_bandwidth_bytes_per_s * cfg.memory_efficiency
        self.ops = token_ops(self.model, self.tp)
        self.tp_link = tensor_parallel_link(hw, cfg.network_efficiency, cfg.collective_latency_s)
        self.pp_link = pipeline_link(hw, cfg.network_efficiency, cfg.collective_latency_s)
        self.activation_bytes_per_token = self.model.hidden_size * self.model.dtype_bytes
        self._fixed_memo: dict[tuple[int, int], float] = {}

    def op_time_s(self, op: Op, num_tokens: np.ndarray | float) -> np.ndarray:
        """One run of `op` over `num_tokens` tokens (elementwise over an array)."""
        n = np.asarray(num_tokens, dtype=np.float64)
        compute = op.flops_per_token * n / self.flops_per_s
        memory = (op.weight_bytes + op.bytes_per_token * n) / self.bytes_per_s
        return np.maximum(compute, memory) + self.cfg.kernel_overhead_s

    def token_ops_per_layer_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        """The token-batched operators of one layer on one rank (what Vidur's mlp.csv times)."""
        return sum(op.count * self.op_time_s(op, num_tokens) for op in self.ops)

    def attention_per_layer_s(self, query_tokens: np.ndarray, context_tokens: np.ndarray) -> np.ndarray:
        """Attention of one layer, summed over requests (the last axis); one kernel launch."""
        flops, bytes_ = attention_flops_bytes(self.model, self.tp, query_tokens, context_tokens)
        per_request = np.maximum(flops / self.flops_per_s, bytes_ / self.bytes_per_s)
        return per_request.sum(axis=-1) + self.cfg.kernel_overhead_s

    def tp_all_reduce_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        """Two TP all-reduces of N x hidden per layer, over all layers."""
        size = np.asarray(num_tokens, dtype=np.float64) * self.activation_bytes_per_token
        return 2 * self.model.num_layers * ring_all_reduce_s(size, self.tp, self.tp_link)

    def pipeline_sends_s(self, num_tokens: np.ndarray | float) -> np.ndarray:
        """One send/recv of N x hidden at each of the PP - 1 stage boundaries."""
        size = np.asarray(num_tokens, dtype=np.float64) * self.activation_bytes_per_token
        if self.pipeline_stages == 1:
            return np.zeros_like(size)
        return (self.pipeline_stages - 1) * send_recv_s(size, self.pp_link)

    def _fixed_s(self, num_tokens: np.ndarray | float, batch_size: int) -> np.ndarray:
        """Everything but attention: it depends only on the token and request counts."""
        layers = self.model.num_layers * self.token_ops_per_layer_s(num_tokens)
        ends = self.op_time_s(embedding_op(self.model), num_tokens)
        ends = ends + self.op_time_s(lm_head_op(self.model, self.tp), batch_size)
        comm = self.tp_all_reduce_s(num_tokens) + self.pipeline_sends_s(num_tokens)
        return layers + ends + comm + self.cfg.iteration_overhead_s

    def _fixed_one_s(self, num_tokens: int, batch_size: int) -> float:
        """`_fixed_s` of one batch, memoised: an engine asks about the same counts again and again."""
        key = (num_tokens, batch_size)
        fixed_s = self._fixed_memo.get(key)
        if fixed_s is None:
            fixed_s = float(self._fixed_s(num_tokens, batch_size))
            if len(self._fixed_memo) < FIXED_MEMO_ENTRIES:
                self._fixed_memo[key] = fixed_s
        return fixed_s

    def iteration_time_s(self, batch: Batch) -> float:
        if batch.size == 0:
            return 0.0
        attention = self.attention_per_layer_s(batch.query_tokens, batch.context_tokens)
        fixed = self._fixed_one_s(batch.total_query_tokens, batch.size)
        return float(fixed + self.model.num_layers * attention)

    def decode_steps_s(self, context_tokens: np.ndarray, num_steps: int) -> np.ndarray:
        """All steps at once: a (num_steps, B) grid of contexts, one query token each."""
        size = len(context_tokens)
        if size == 0:
            return np.zeros(num_steps)
        contexts = context_tokens[None, :] + np.arange(num_steps)[:, None]
        attention = self.attention_per_layer_s(np.ones_like(contexts), contexts)
        return self._fixed_one_s(size, size) + self.model.num_layers * attention
