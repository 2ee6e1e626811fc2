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

import math
from dataclasses import dataclass, field

import numpy as np

from orcasim.cost.catalog import ModelSpec
from orcasim.portable import libm_exp, libm_log, libm_power

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


def _matmul(name: str, k: float, m: float, dt: float, bias: bool, weight_dt: float) -> Op:
    """(N, k) by (k, m) in `dt`-byte activations; weights stored at `weight_dt` bytes (the
    activations' precision, or fp8, int4)."""
    return Op(name, 2.0 * k * m, (k * m + (m if bias else 0)) * weight_dt, (k + m) * dt)


def _per_head_matmul(name: str, heads: float, k: float, m: float, dt: float, weight_dt: float) -> Op:
    """A (k, m) matmul per head (a batched GEMM over `heads`), for every token."""
    return Op(name, 2.0 * heads * k * m, heads * k * m * weight_dt, heads * (k + m) * dt)


def _elementwise(name: str, read: float, write: float, dt: int, count: int = 1) -> Op:
    return Op(name, ELEMENTWISE_FLOPS * write, 0.0, (read + write) * dt, count)


def heads_per_rank(model: ModelSpec, tp: int) -> tuple[float, float]:
    """Query heads and KV heads on one rank (`ModelSpec.kv_heads_per_rank`)."""
    return model.num_heads / tp, model.kv_heads_per_rank(tp)


def token_ops(model: ModelSpec, tp: int, moe_layer: bool = False) -> list[Op]:
    """The token-batched operators of one layer, named as in Vidur's mlp.csv. A MoE layer's
    routed experts are not among them (`ExpertOp`): its router and shared experts are."""
    d, dt = model.hidden_size, model.dtype_bytes
    ops = [_elementwise("input_layernorm", d, d, dt), *_attention_token_ops(model, tp),
           _elementwise("post_attention_layernorm", d, d, dt)]
    if moe_layer and model.moe is not None:
        # The router is not quantized (`ModelSpec.unquantized_params_per_rank`).
        ops.append(_matmul("moe_router", d, model.moe.num_experts, dt, model.moe.expert_bias,
                           model.embedding_element_bytes))
        if model.moe.shared_intermediate_size:
            ops += _mlp_ops(model, model.moe.shared_intermediate_size / tp, "shared_expert_")
    else:
        ops += _mlp_ops(model, model.ffn_size / tp, "mlp_")
    ops.append(_elementwise("add", 2 * d, d, dt, count=2))  # the two residual connections
    return ops


def _mlp_ops(model: ModelSpec, ffn: float, prefix: str) -> list[Op]:
    d, dt, wdt = model.hidden_size, model.dtype_bytes, model.weight_element_bytes
    gated = model.gated_mlp or prefix != "mlp_"  # experts are SwiGLU
    bias = model.bias and prefix == "mlp_"
    up_width = ffn * (2 if gated else 1)  # SwiGLU fuses gate and up projections
    return [
        _matmul(f"{prefix}up_proj", d, up_width, dt, bias, wdt),
        _elementwise(f"{prefix}act", up_width, ffn, dt),
        _matmul(f"{prefix}down_proj", ffn, d, dt, bias, wdt),
    ]


def _attention_token_ops(model: ModelSpec, tp: int) -> list[Op]:
    """Projections into and out of attention (and RoPE), per token, on one rank."""
    d, hd, dt, bias, wdt = (model.hidden_size, model.head_dim, model.dtype_bytes, model.bias,
                            model.weight_element_bytes)
    q_heads, kv_heads = heads_per_rank(model, tp)
    if model.mla is not None:
        return _mla_token_ops(model, tp)
    qkv_width = (q_heads + 2 * kv_heads) * hd
    qkv_bias = bias if model.qkv_bias is None else model.qkv_bias
    ops = [_matmul("attn_pre_proj", d, qkv_width, dt, qkv_bias, wdt),
           _matmul("attn_post_proj", q_heads * hd, d, dt, model.has_out_bias, wdt)]
    if model.positional == "rope":
        rotated = (q_heads + kv_heads) * hd
        ops.insert(1, _elementwise("attn_rope", rotated, rotated, dt))
    return ops


def _mla_token_ops(model: ModelSpec, tp: int) -> list[Op]:
    """MLA in the absorbed form (DeepSeek-V2 section 2.1.2, as vLLM and SGLang decode):
    queries are projected into the KV latent (W_UK folded into the query), attention runs
    over the latent, and W_UV lifts its output per head; the latent's down-projection is
    replicated on every rank, the per-head weights are split."""
    assert model.mla is not None
    m, d, dt, wdt = model.mla, model.hidden_size, model.dtype_bytes, model.weight_element_bytes
    heads = model.num_heads / tp
    qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim
    if m.q_lora_rank:
        ops = [_matmul("mla_q_down", d, m.q_lora_rank, dt, False, wdt),
               _matmul("mla_q_up", m.q_lora_rank, heads * qk_dim, dt, False, wdt)]
    else:
        ops = [_matmul("mla_q_proj", d, heads * qk_dim, dt, False, wdt)]
    latent = m.kv_lora_rank + m.qk_rope_head_dim
    return ops + [
        _matmul("mla_kv_down", d, latent, dt, False, wdt),
        _per_head_matmul("mla_q_absorb", heads, m.qk_nope_head_dim, m.kv_lora_rank, dt, wdt),
        _per_head_matmul("mla_v_up", heads, m.kv_lora_rank, m.v_head_dim, dt, wdt),
        _elementwise("attn_rope", (heads + 1) * m.qk_rope_head_dim, (heads + 1) * m.qk_rope_head_dim, dt),
        _matmul("attn_post_proj", heads * m.v_head_dim, d, dt, False, wdt),
    ]


@dataclass(frozen=True, slots=True)
class ExpertOp:
    """A MoE layer's routed experts on its busiest rank, each a SwiGLU MLP.

    Without expert parallelism every rank holds every expert, split by tensor parallelism;
    with it, a rank holds `num_experts` whole experts (E / EP). A token routes to expert i
    of the rank with probability `pick_probabilities[i]` (its top-k includes i), tokens
    independently, so an iteration of N tokens reads the weights of
    sum_i 1 - (1 - q_i)^N experts and runs N sum_i q_i (token, expert) pairs. Under
    uniform routing q = k/E: E (1 - (1 - k/E)^N) experts, every one for large batches,
    about k N for small ones (`expert_routing_probabilities` for a skewed router).
    """

    num_experts: int  # on this rank
    experts_per_token: int
    total_experts: int  # in the layer
    flops_per_pair: float
    weight_bytes_per_expert: float
    bytes_per_pair: float
    pick_probabilities: tuple[float, ...]
    uniform: bool = True  # every q_i the same: the closed form
    kernels: int = 3  # the fused gate-and-up GEMM, the activation, the down GEMM
    # A skewed router's experts hit, by token count: a count costs a pow call per expert
    # (`experts_hit`), and a run prices the same counts over and over.
    _skewed_hits: dict[float, float] = field(default_factory=dict, init=False, repr=False,
                                             compare=False)

    @property
    def pairs_per_token(self) -> float:
        """Expected (token, expert) pairs per token on this rank: k without expert parallelism."""
        if self.uniform:  # k m / E: exactly k when the rank holds every expert
            return self.experts_per_token * self.num_experts / self.total_experts
        return math.fsum(self.pick_probabilities)

    @property
    def flops_per_token(self) -> float:
        return self.flops_per_pair * self.pairs_per_token

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_per_pair * self.pairs_per_token

    def experts_hit(self, num_tokens: np.ndarray | float) -> np.ndarray:
        n = np.asarray(num_tokens, dtype=np.float64)
        # The C library's pow, not numpy's: the same bits on every CPU (orcasim.portable).
        if self.uniform:
            miss = 1.0 - self.pick_probabilities[0]
            return self.num_experts * (1.0 - libm_power(miss, n))
        if n.ndim == 0:  # an iteration's tokens: most calls
            return np.asarray(self._skewed_hits_of(float(n)))
        counts, inverse = np.unique(n, return_inverse=True)
        hits = np.array([self._skewed_hits_of(count) for count in counts.tolist()])
        return hits[inverse].reshape(n.shape)

    def _skewed_hits_of(self, num_tokens: float) -> float:
        hits = self._skewed_hits.get(num_tokens)
        if hits is None:
            misses = libm_power(1.0 - np.asarray(self.pick_probabilities), num_tokens)
            hits = self._skewed_hits[num_tokens] = float((1.0 - misses).sum())
        return hits


def expert_routing_probabilities(num_experts: int, experts_per_token: int, skew: float) -> np.ndarray:
    """The chance that a token's top-k includes each expert, most popular first.

    Popularity follows Zipf's law with exponent `skew` (0: uniform, every expert k/E; real
    routers are skewed, hot experts taking several times their share). A token picks k
    distinct experts, so no expert exceeds 1 and they sum to k: the mass above 1 goes to
    the others in proportion (water-filling).
    """
    # The C library's log and exp, not numpy's: the same bits on every CPU (orcasim.portable).
    log_rank = libm_log(np.arange(1, num_experts + 1, dtype=np.float64))
    q = np.zeros(num_experts)
    free = np.ones(num_experts, dtype=bool)
    left = float(experts_per_token)
    while free.any():  # none left: every expert is in every token's top-k (k = E)
        # Relative to the most popular expert left, whose weight is 1: at a large skew the
        # others' weights underflow to 0, and the sum of those left read 0 (0/0: NaN times
        # at a skew of 700 for Mixtral; a tester's finding).
        ranks = log_rank[free]
        weights = libm_exp(-skew * (ranks - ranks[0]))
        share = left * weights / weights.sum()
        full = share >= 1.0
        if not full.any():
            q[free] = share
            return q
        picked = np.flatnonzero(free)[full]
        q[picked], free[picked] = 1.0, False
        left -= len(picked)
    return q


def expert_op(model: ModelSpec, tp: int, ep: int = 1, skew: float = 0.0) -> ExpertOp | None:
    """The routed experts of one MoE layer on its busiest rank (None for a dense model).

    With expert parallelism (`ep` > 1) experts are placed on ranks in popularity order,
    round-robin (the even spread that expert-parallel load balancers such as DeepSeek's
    EPLB aim for), so rank 0 holds the most popular of every `ep`: the busiest rank, whose
    time every rank waits for.
    """
    if model.moe is None:
        return None
    moe, d, dt = model.moe, model.hidden_size, model.dtype_bytes
    k, e = moe.experts_per_token, moe.num_experts
    width = moe.expert_intermediate_size / (tp if ep == 1 else 1)
    per_expert_params = 3.0 * d * width
    # Per routed token: the input in, gate-and-up out and back in, the activation, the output.
    bytes_per_pair = (d + 2.0 * width + 2.0 * width + width + width + d) * dt
    if skew == 0.0:
        q: tuple[float, ...] = (k / e,) * (e // ep)
    else:
        q = tuple(expert_routing_probabilities(e, k, skew)[::ep].tolist())
    # Biases (gpt-oss's): the gate-and-up one split as its matrix, the down one whole, as
    # vLLM's gpt_oss.py loads them and `stage_weight_bytes` holds them.
    bias_bytes = (2.0 * width + d) * model.embedding_element_bytes if moe.expert_bias else 0.0
    return ExpertOp(e // ep, k, e, 2.0 * per_expert_params,
                    per_expert_params * model.expert_element_bytes + bias_bytes,
                    bytes_per_pair, q, uniform=skew == 0.0)


def attention_constants(model: ModelSpec, tp: int) -> tuple[float, float, float]:
    """One layer's attention on one rank: FLOPs per query-key pair, bytes per context
    token (its KV read) and bytes per query token (Q read, O written, its new KV written).

    Multi-head attention: 2 head_dim FLOPs for QK^T and 2 for AV per pair and query head.
    MLA in the absorbed form: QK^T over the latent and the RoPE key, AV over the latent,
    per query head; the context is read once as the latent, shared by the heads.
    """
    q_heads, kv_heads = heads_per_rank(model, tp)
    dt, kv_dt = model.dtype_bytes, model.kv_element_bytes
    if model.mla is not None:
        m = model.mla
        latent = m.kv_lora_rank + m.qk_rope_head_dim
        flops_per_pair = q_heads * (2.0 * latent + 2.0 * m.kv_lora_rank)
        return flops_per_pair, latent * kv_dt, q_heads * (latent + m.kv_lora_rank) * dt + latent * kv_dt
    hd = model.head_dim
    kv_per_token = 2.0 * kv_heads * hd
    if kv_dt == dt:
        return 4.0 * hd * q_heads, kv_per_token * dt, (2.0 * q_heads * hd + kv_per_token) * dt
    return 4.0 * hd * q_heads, kv_per_token * kv_dt, 2.0 * q_heads * hd * dt + kv_per_token * kv_dt


def prefill_attention_constants(model: ModelSpec, tp: int) -> tuple[float, float, float, float]:
    """`attention_constants` of a request with more than one query token, and the FLOPs
    per cached context token (its context less its query) that such a request adds.

    The same as a decode's, and no extra FLOPs, but for MLA: vLLM runs a prefill (or a
    prefill chunk) in the compute-friendly form and only decodes in the absorbed one
    (vllm/v1/attention/backends/mla/common.py, `_forward_prefill`; SGLang likewise):
    the latent is up-projected to each head's K (nope dims) and V, and attention is
    multi-head over qk_nope + qk_rope dims for QK^T and v_head_dim for AV, where the
    absorbed form works over the 576-wide latent (DeepSeek-V3: 81,920 FLOPs a pair on
    128 heads against 278,528). The up-projection of the new tokens costs what the
    absorbed form's per-token `mla_q_absorb` and `mla_v_up` cost (the same weights, the
    same FLOPs: 2 * kv_lora_rank * heads * (qk_nope + v) a token); the cached context's,
    re-projected for every chunk, is the extra term. Bytes: the latent read, the K and V
    the up-projection writes and the kernel reads; Q read, O written, the new latent written.
    """
    if model.mla is None:
        return (*attention_constants(model, tp), 0.0)
    m = model.mla
    q_heads = model.num_heads / tp
    dt, kv_dt = model.dtype_bytes, model.kv_element_bytes
    qk_dim, latent = m.qk_nope_head_dim + m.qk_rope_head_dim, m.kv_lora_rank + m.qk_rope_head_dim
    flops_per_pair = q_heads * (2.0 * qk_dim + 2.0 * m.v_head_dim)
    kv_bytes = latent * kv_dt + 2.0 * q_heads * (qk_dim + m.v_head_dim) * dt
    query_bytes = q_heads * (qk_dim + m.v_head_dim) * dt + latent * kv_dt
    up_flops = 2.0 * m.kv_lora_rank * q_heads * (m.qk_nope_head_dim + m.v_head_dim)
    return flops_per_pair, kv_bytes, query_bytes, up_flops


def attention_flops_bytes(
    model: ModelSpec, tp: int, query_tokens: np.ndarray, context_tokens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """FLOPs and bytes of one layer's attention, per request (elementwise over the arrays).

    Query j (0-based) of q new tokens sits at position c - q + j and, with causal masking,
    attends to c - q + j + 1 keys, so a request covers q*(c - q) + q*(q + 1)/2 query-key
    pairs: quadratic in a prefill (q = c), linear in a decode step (q = 1). Each pair costs
    2*head_dim FLOPs for QK^T and 2*head_dim for AV, per query head.
    Bytes: the K and V of all c tokens are read, Q read and O written, new K and V written.
    MLA prices a request of one query token in the absorbed form and one of more in the
    compute-friendly form (`prefill_attention_constants`), as vLLM splits them.
    """
    q = query_tokens.astype(np.float64)
    c = context_tokens.astype(np.float64)
    flops_per_pair, kv_bytes, query_bytes = attention_constants(model, tp)
    pairs = q * (c - q) + q * (q + 1.0) / 2.0
    flops, bytes_ = flops_per_pair * pairs, c * kv_bytes + q * query_bytes
    if model.mla is None:
        return flops, bytes_
    prefill_pair, prefill_kv, prefill_query, up_flops = prefill_attention_constants(model, tp)
    prefill = q > 1.0
    return (np.where(prefill, prefill_pair * pairs + up_flops * (c - q), flops),
            np.where(prefill, c * prefill_kv + q * prefill_query, bytes_))


def lm_head_op(model: ModelSpec, tp: int) -> Op:
    """Final norm and the vocabulary projection, applied to one token per request."""
    vocab = model.vocab_size / tp
    d, dt = model.hidden_size, model.dtype_bytes
    weight_bytes = d * vocab * model.embedding_element_bytes  # not quantized (see catalog)
    return Op("lm_head", 2.0 * d * vocab + ELEMENTWISE_FLOPS * d, weight_bytes, (2 * d + vocab) * dt)


def embedding_op(model: ModelSpec) -> Op:
    """Token (and learned position) embedding lookup: a gather of N rows."""
    rows = 2 if model.positional == "learned" else 1
    d, dt = model.hidden_size, model.dtype_bytes
    return Op("emb", 0.0, 0.0, (rows + 1) * d * dt)
