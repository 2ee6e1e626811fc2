"""FLOPs and bytes of one decoder layer on one tensor-parallel rank, operator by operator.

Counting rules (the standard ones, e.g. Kaplan et al. 2020 Table 1; Chowdhery et al. 2022
Appendix B): a matmul of an (N, K) activation by a (K, M) weight costs 2*N*K*M FLOPs and
moves the weight once plus its input and output activations. Elementwise operators move
their inputs and outputs; their FLOPs are a few per element and never bind.

Selective batching (Orca section 4.2) splits the layer in two:
- token-batched operators see the N flattened tokens of the whole iteration: `token_ops`;
- attention sees each request alone, with its own query and context: `attention_flops_bytes`.

Megatron-style tensor parallelism (Shoeybi et al. 2019) splits heads and the MLP width
across `tp` ranks and replicates layer norms and residual adds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orcasim.cost.catalog import ModelSpec

ELEMENTWISE_FLOPS = 8.0  # per element: a layer norm or GELU does a handful of operations


@dataclass(frozen=True, slots=True)
class Op:
    """An operator whose FLOPs and bytes are affine in the number of tokens N.

    flops(N) = flops_per_token * N;  bytes(N) = weight_bytes + bytes_per_token * N.
    `count` is how many times it runs per layer (two residual adds, for instance).
    """

    name: str
    flops_per_token: float
    weight_bytes: float
    bytes_per_token: float
    count: int = 1


def _matmul(name: str, k: float, m: float, dt: int, bias: bool) -> Op:
    weight = (k * m + (m if bias else 0)) * dt
    return Op(name, 2.0 * k * m, weight, (k + m) * dt)


def _elementwise(name: str, read: float, write: float, dt: int, count: int = 1) -> Op:
    return Op(name, ELEMENTWISE_FLOPS * write, 0.0, (read + write) * dt, count)


def heads_per_rank(model: ModelSpec, tp: int) -> tuple[float, float]:
    """Query heads and KV heads on one rank (KV heads are replicated when fewer than tp)."""
    return model.num_heads / tp, max(model.kv_heads / tp, 1.0)


def token_ops(model: ModelSpec, tp: int) -> list[Op]:
    """The token-batched operators of one layer, named as in Vidur's mlp.csv."""
    d, hd, dt, bias = model.hidden_size, model.head_dim, model.dtype_bytes, model.bias
    q_heads, kv_heads = heads_per_rank(model, tp)
    qkv_width = (q_heads + 2 * kv_heads) * hd
    ffn = model.ffn_size / tp
    up_width = ffn * (2 if model.gated_mlp else 1)  # SwiGLU fuses gate and up projections
    ops = [
        _elementwise("input_layernorm", d, d, dt),
        _matmul("attn_pre_proj", d, qkv_width, dt, bias),
        _matmul("attn_post_proj", q_heads * hd, d, dt, bias),
        _elementwise("post_attention_layernorm", d, d, dt),
        _matmul("mlp_up_proj", d, up_width, dt, bias),
        _elementwise("mlp_act", up_width, ffn, dt),
        _matmul("mlp_down_proj", ffn, d, dt, bias),
        _elementwise("add", 2 * d, d, dt, count=2),  # the two residual connections
    ]
    if model.positional == "rope":
        rotated = (q_heads + kv_heads) * hd
        ops.insert(2, _elementwise("attn_rope", rotated, rotated, dt))
    return ops


def attention_flops_bytes(
    model: ModelSpec, tp: int, query_tokens: np.ndarray, context_tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """FLOPs and bytes of one layer's attention, per request (elementwise over the arrays).

    Query j (0-based) of q new tokens sits at position c - q + j and, with causal masking,
    attends to c - q + j + 1 keys, so a request covers q*(c - q) + q*(q + 1)/2 query-key
    pairs: quadratic in a prefill (q = c), linear in a decode step (q = 1). Each pair costs
    2*head_dim FLOPs for QK^T and 2*head_dim for AV, per query head.
    Bytes: the K and V of all c tokens are read, Q read and O written, new K and V written.
    """
    q = query_tokens.astype(np.float64)
    c = context_tokens.astype(np.float64)
    q_heads, kv_heads = heads_per_rank(model, tp)
    hd, dt = model.head_dim, model.dtype_bytes
    pairs = q * (c - q) + q * (q + 1.0) / 2.0
    flops = 4.0 * hd * q_heads * pairs
    kv_per_token = 2.0 * kv_heads * hd
    bytes_ = (c * kv_per_token + q * 2.0 * q_heads * hd + q * kv_per_token) * dt
    return flops, bytes_


def lm_head_op(model: ModelSpec, tp: int) -> Op:
    """Final norm and the vocabulary projection, applied to one token per request."""
    vocab = model.vocab_size / tp
    d, dt = model.hidden_size, model.dtype_bytes
    return Op("lm_head", 2.0 * d * vocab + ELEMENTWISE_FLOPS * d, d * vocab * dt, (2 * d + vocab) * dt)


def embedding_op(model: ModelSpec) -> Op:
    """Token (and learned position) embedding lookup: a gather of N rows."""
    rows = 2 if model.positional == "learned" else 1
    d, dt = model.hidden_size, model.dtype_bytes
    return Op("emb", 0.0, 0.0, (rows + 1) * d * dt)
