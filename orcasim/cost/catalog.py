"""Model and GPU catalogs, the deployment (`hardware:`), and what follows from them.

A scenario names a catalog entry (`model: gpt3-175b`, `hardware: {gpu: a100-40gb}`) or gives
the same fields inline. The catalogs are data (`orcasim/data/catalog/*.yaml`, each entry
citing its source); this module only validates them and derives parameter counts, FLOPs
per token, KV bytes per token and the KV capacity of a deployment.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from orcasim import yaml_strict
from orcasim.config import ScenarioError, Strict, format_field_error
from orcasim.cost.hf_config import resolve_hf_model
from orcasim.paths import PACKAGE_DATA_DIR

CATALOG_DIR = PACKAGE_DATA_DIR / "catalog"
GIB = 1024**3
# A model's shape, far above any real one's (DeepSeek-V3: 61 layers, hidden size 7,168, 256
# experts, a vocabulary of 129,280): past these an inline model is a typo, whose per-layer
# loops (a billion layers hung validate) or byte counts (a hidden size of 1e159 overflowed a
# float) would fail deep inside instead of naming the key.
MAX_LAYERS = 10_000
MAX_WIDTH = 10_000_000
Layers = Annotated[PositiveInt, Field(le=MAX_LAYERS)]
Width = Annotated[PositiveInt, Field(le=MAX_WIDTH)]


Precision = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4", "mxfp4"]
# mxfp4 (OCP microscaling): blocks of 32 fp4 values sharing one 8-bit scale, 4.25 bits each.
PRECISION_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5,
                                     "mxfp4": (32 * 0.5 + 1) / 32}


class MoESpec(Strict):
    """Mixture-of-experts MLPs: each token goes to `experts_per_token` of `num_experts`
    routed experts (gated MLPs of `expert_intermediate_size`), plus always-on shared
    experts of `shared_intermediate_size` in all; `dense_layers` (0-based) keep a dense
    MLP of the model's `intermediate_size` instead (DeepSeek's first layers)."""

    num_experts: Width
    experts_per_token: Width
    expert_intermediate_size: Width
    shared_intermediate_size: Annotated[NonNegativeInt, Field(le=MAX_WIDTH)] = 0
    dense_layers: list[NonNegativeInt] = Field(default_factory=list)
    # Biases on the router (one an expert) and on every routed expert's gate-and-up and
    # down projections (2 x expert_intermediate_size + hidden_size): gpt-oss's. Kept in the
    # model's own dtype by its mxfp4 checkpoint, which quantizes the matrices alone.
    expert_bias: bool = False
    # The routed experts' storage precision, if not the model's weights' (gpt-oss ships its
    # experts in mxfp4 and the rest in bf16): weight-only, the GEMMs still run at the
    # model's compute precision.
    expert_weight_dtype: Precision | None = None
    # Where that precision came from: the model's own keys, or a checkpoint's
    # quantization_config (`model.hf_config`), which a `weight_dtype` given overrides.
    expert_weight_dtype_from: Literal["model", "checkpoint"] = "model"

    @model_validator(mode="after")
    def _top_k(self) -> MoESpec:
        if self.experts_per_token > self.num_experts:
            raise ScenarioError(f"model.moe.experts_per_token = {self.experts_per_token} exceeds "
                                f"num_experts = {self.num_experts}; expected at most that")
        return self


class MLASpec(Strict):
    """Multi-head latent attention (DeepSeek-V2, section 2.1): K and V come from a latent of
    `kv_lora_rank` (plus a shared RoPE key of `qk_rope_head_dim`), which is all the KV cache
    holds; queries go through a `q_lora_rank` latent when it is set."""

    kv_lora_rank: Width
    q_lora_rank: Width | None = None
    qk_nope_head_dim: Width
    qk_rope_head_dim: Width
    v_head_dim: Width


def _given_precision_first(data: Any) -> Any:
    """A `weight_dtype` given overrides a checkpoint's quantization, its experts' too (as
    `model.hf_config` reads it): a model read once and set again, as a sweep's point sets
    `model.weight_dtype` on the read model, kept gpt-oss's mxfp4 experts (a tester's finding)."""
    moe = data.get("moe") if isinstance(data, dict) else None
    if not isinstance(moe, dict) or data.get("weight_dtype") is None \
            or moe.get("expert_weight_dtype_from") != "checkpoint":
        return data
    kept = {k: v for k, v in moe.items() if k not in ("expert_weight_dtype", "expert_weight_dtype_from")}
    return {**data, "moe": kept}


class ModelSpec(Strict):
    """Shape of a decoder-only transformer. Defaults follow GPT-3's conventions."""

    name: str = "custom"
    num_layers: Layers
    hidden_size: Width
    num_heads: Width
    num_kv_heads: Width | None = None  # None: multi-head attention (= num_heads)
    intermediate_size: Width | None = None  # None: 4 x hidden_size
    gated_mlp: bool = False
    vocab_size: Width = 50257
    max_seq_len: PositiveInt = 2048
    positional: Literal["learned", "rope"] = "learned"
    tied_embeddings: bool = True
    bias: bool = True
    dtype_bytes: Annotated[PositiveInt, Field(le=8)] = 2  # bf16 / fp16 weights, activations, KV
    # Storage precision of the weights and of the KV cache, if not `dtype_bytes` (fp8
    # checkpoints, an fp8 KV cache): what memory holds and what each iteration reads.
    weight_dtype: Precision | None = None
    kv_cache_dtype: Precision | None = None
    head_size: Width | None = None  # None: hidden_size / num_heads (Qwen3 sets its own)
    qkv_bias: bool | None = None  # None: as `bias` (Qwen2 has biases on Q, K, V only)
    # None: as `bias`; a config's `attention_bias` biases the output projection too
    # (transformers' and vLLM's Llama and gpt-oss attention: bias_o_proj = attention_bias).
    out_bias: bool | None = None
    # Qwen3's per-head RMSNorm on queries and keys before RoPE (`q_norm`, `k_norm`: a gain of
    # head_size each, a layer), held whole on every tensor-parallel rank as vLLM builds them.
    qk_norm: bool = False
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    # Sliding-window attention (Mistral-7B-v0.1, gpt-oss, Gemma): a query attends to the
    # last `sliding_window` tokens only, in `sliding_window_layers` (0-based; None: every
    # layer), so its attention reads at most that many keys however long the context.
    sliding_window: PositiveInt | None = None
    sliding_window_layers: list[NonNegativeInt] | None = None
    source: str = ""
    notes: str = ""

    @model_validator(mode="before")
    @classmethod
    def _from_hf_config(cls, data: Any) -> Any:
        """`{hf_config: path, ...}`: the fields of that config.json (see orcasim.cost.hf_config)."""
        data = from_catalog("models", data)
        if isinstance(data, dict) and "hf_config" in data:
            return resolve_hf_model(data)
        return _given_precision_first(data)

    @model_validator(mode="after")
    def _divisible(self) -> ModelSpec:
        if self.head_size is None and self.hidden_size % self.num_heads:
            raise ScenarioError(f"model.hidden_size = {self.hidden_size} is not a multiple of "
                                f"model.num_heads = {self.num_heads}; expected a multiple, or "
                                "model.head_size")
        for key, layers in (("moe.dense_layers", self.moe.dense_layers if self.moe else []),
                            ("sliding_window_layers", self.sliding_window_layers or [])):
            twice = next((i for i in layers if layers.count(i) > 1), None)
            if twice is not None:  # counted twice, a dense layer's experts were taken off twice
                raise ScenarioError(f"model.{key} {layers} names layer {twice} twice; expected "
                                    "each layer once")
        if self.moe is not None and any(i >= self.num_layers for i in self.moe.dense_layers):
            raise ScenarioError(f"model.moe.dense_layers {self.moe.dense_layers} names a layer "
                                f"beyond the model's {self.num_layers}; expected 0-based indices")
        if self.sliding_window_layers is not None:
            if self.sliding_window is None:
                raise ScenarioError("model.sliding_window_layers is set without model.sliding_window; "
                                    "expected the window's size in tokens")
            if any(i >= self.num_layers for i in self.sliding_window_layers):
                raise ScenarioError(f"model.sliding_window_layers {self.sliding_window_layers} names a "
                                    f"layer beyond the model's {self.num_layers}; expected 0-based indices")
        if self.num_heads % self.kv_heads:
            # Opens with its key: it read '(top level): num_heads 32 ...' (a tester's finding).
            raise ScenarioError(f"model.num_kv_heads = {self.kv_heads} does not divide "
                                f"model.num_heads = {self.num_heads}; expected a divisor of "
                                f"{self.num_heads}")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def num_window_layers(self) -> int:
        """Layers with sliding-window attention (0 without a window)."""
        if self.sliding_window is None:
            return 0
        return self.num_layers if self.sliding_window_layers is None else len(set(self.sliding_window_layers))

    @property
    def weight_element_bytes(self) -> float:
        return PRECISION_BYTES[self.weight_dtype] if self.weight_dtype else self.dtype_bytes

    @property
    def kv_element_bytes(self) -> float:
        return PRECISION_BYTES[self.kv_cache_dtype] if self.kv_cache_dtype else self.dtype_bytes

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    def attention_params(self) -> int:
        """Weights of one layer's attention: Q, K, V and output projections (MLA: its
        down- and up-projections and their norms), with biases where the model has them."""
        d, heads = self.hidden_size, self.num_heads
        if self.mla is not None:
            m = self.mla
            qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim
            q_up = (m.q_lora_rank or d) * heads * qk_dim  # from the latent, or directly
            kv_up = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
            return self._mla_down_params(m) + q_up + kv_up + heads * m.v_head_dim * d
        q_out = heads * self.head_dim
        q = d * q_out + (q_out if self._has_qkv_bias else 0)
        return q + self.kv_projection_params() + q_out * d + (d if self.has_out_bias else 0)

    def _mla_down_params(self, m: MLASpec) -> int:
        """MLA's down-projections to the query latent (if any) and to the KV latent with the
        shared RoPE key, and the two latents' norms."""
        q_down = self.hidden_size * m.q_lora_rank if m.q_lora_rank else 0
        kv_down = self.hidden_size * (m.kv_lora_rank + m.qk_rope_head_dim)
        return q_down + kv_down + self._mla_latent_norm_params(m)

    @staticmethod
    def _mla_latent_norm_params(m: MLASpec) -> int:
        """Gains of MLA's latent norms: the query latent's (if any) and the KV latent's."""
        return (m.q_lora_rank or 0) + m.kv_lora_rank

    @property
    def _has_qkv_bias(self) -> bool:
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def has_out_bias(self) -> bool:
        """Whether attention's output projection has a bias (MLA's has none)."""
        return self.mla is None and (self.bias if self.out_bias is None else self.out_bias)

    def kv_projection_params(self) -> int:
        """Weights of one layer's K and V projections, biases too (0 under MLA, whose K and
        V come from the latent)."""
        if self.mla is not None:
            return 0
        width = 2 * self.kv_heads * self.head_dim
        return self.hidden_size * width + (width if self._has_qkv_bias else 0)

    def kv_heads_per_rank(self, tp: int) -> float:
        """KV heads one of `tp` tensor-parallel ranks holds, with their K and V projections
        and cache: its share, or past TP = KV heads a replica of one (vLLM's
        QKVParallelLinear: num_kv_head_replicas = tp / num_kv_heads; Megatron's likewise)."""
        return max(self.kv_heads / tp, 1.0)

    def routed_expert_params(self) -> int:
        """Weights of every routed expert of every MoE layer (what expert parallelism splits)."""
        moe = self.moe
        if moe is None:
            return 0
        moe_layers = self.num_layers - len(moe.dense_layers)
        return moe_layers * moe.num_experts * self._params_per_expert(moe)

    def layer_routed_expert_params(self, layer: int) -> int:
        """Weights of decoder layer `layer`'s routed experts (0 in a dense layer)."""
        moe = self.moe
        if moe is None or layer in moe.dense_layers:
            return 0
        return moe.num_experts * self._params_per_expert(moe)

    def _params_per_expert(self, moe: MoESpec) -> int:
        """One routed expert's weights: its matrices and biases (`expert_bias_params`)."""
        return self.expert_matrix_params() + self.expert_bias_params()

    def expert_matrix_params(self) -> int:
        """One routed expert's weight matrices, the fused gate-and-up and the down
        projection of a SwiGLU MLP (what `expert_weight_dtype` stores): 0 in a dense model."""
        return 3 * self.hidden_size * self.moe.expert_intermediate_size if self.moe else 0

    def expert_bias_params(self) -> int:
        """One routed expert's biases (`MoESpec.expert_bias`), kept in the model's dtype."""
        moe = self.moe
        return 2 * moe.expert_intermediate_size + self.hidden_size if moe and moe.expert_bias else 0

    def _gated_mlp_params(self, width: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * width

    def mlp_params(self, layer: int, active: bool = False) -> int:
        """Weights of layer `layer`'s MLP; `active`: only those one token uses (its top-k
        routed experts, the shared ones and the router)."""
        moe = self.moe
        if moe is None or layer in moe.dense_layers:
            biases = self.ffn_size * (2 if self.gated_mlp else 1) + self.hidden_size if self.bias else 0
            return self._gated_mlp_params(self.ffn_size) + biases
        routed = moe.experts_per_token if active else moe.num_experts
        expert = self._params_per_expert(moe)
        return (self._router_params(moe) + routed * expert
                + 3 * self.hidden_size * moe.shared_intermediate_size)

    def _router_params(self, moe: MoESpec) -> int:
        return (self.hidden_size + (1 if moe.expert_bias else 0)) * moe.num_experts

    def _layer_norm_params(self) -> int:
        """Gains (and biases) of a layer's two norms and Qwen3's query and key norms (MLA's
        latents' norms are its attention's)."""
        qk = 2 * self.head_dim if self.qk_norm else 0
        return 2 * self.hidden_size * (2 if self.bias and self.mla is None else 1) + qk

    def layer_params(self, layer: int = 0, active: bool = False) -> int:
        """Weights of decoder layer `layer` (attention, MLP, norms, biases if any)."""
        return self.attention_params() + self.mlp_params(layer, active) + self._layer_norm_params()

    def tp_replicated_params(self, layer: int = 0) -> int:
        """Weights of layer `layer` that vLLM keeps whole on every tensor-parallel rank: its
        norms (RMSNorm, LayerNorm), the biases of its output and down projections (a
        RowParallelLinear holds its whole bias), a MoE router (ReplicatedLinear) and MLA's
        down-projections with the latents' norms (ReplicatedLinear). K and V projections
        are replicated only past TP = KV heads (`kv_heads_per_rank`)."""
        d, moe = self.hidden_size, self.moe
        whole = self._layer_norm_params()
        if self.mla is not None:
            whole += self._mla_down_params(self.mla)
        elif self.has_out_bias:
            whole += d  # the output projection's bias
        if moe is not None and layer not in moe.dense_layers:
            return whole + self._router_params(moe)
        return whole + (d if self.bias else 0)  # the MLP's down-projection bias

    def unquantized_params_per_rank(self, layer: int = 0, tp: int = 1) -> float:
        """Weights of layer `layer` that one of `tp` tensor-parallel ranks holds in the
        model's own dtype whatever `weight_dtype` says (`embedding_element_bytes`): vLLM's
        Fp8Config quantizes the weight matrices of linear layers and fused experts only. So
        the norms stay (not linear layers; MLA's latent norms too), every bias stays
        (Fp8LinearMethod quantizes `weight` alone; a column-parallel bias is split as its
        weight is, a row-parallel one whole), and a MoE router stays (DeepSeek's, Mixtral's
        and Qwen's gate is a ReplicatedLinear built with quant_config=None)."""
        d, moe = self.hidden_size, self.moe
        whole = self._layer_norm_params()  # on every rank
        split = 0  # over the ranks
        kv_bias = 0.0  # on each rank, its KV heads' (`kv_heads_per_rank`)
        if self.mla is not None:
            whole += self._mla_latent_norm_params(self.mla)
        else:
            if self._has_qkv_bias:
                split += self.num_heads * self.head_dim
                kv_bias = 2 * self.head_dim * self.kv_heads_per_rank(tp)
            if self.has_out_bias:
                whole += d  # the output projection's
        if moe is not None and layer not in moe.dense_layers:
            whole += self._router_params(moe)
        elif self.bias:
            split += self.ffn_size * (2 if self.gated_mlp else 1)  # up (and gate) projection
            whole += d  # the down projection's
        return whole + split / tp + kv_bias

    def _all_layers_params(self, active: bool) -> int:
        if self.moe is None:
            return self.num_layers * self.layer_params()
        return sum(self.layer_params(i, active) for i in range(self.num_layers))

    def embedding_params(self) -> int:
        """Token embedding, LM head if untied, learned positions, and the final norm."""
        tok = self.vocab_size * self.hidden_size
        head = 0 if self.tied_embeddings else tok
        pos = self.max_seq_len * self.hidden_size if self.positional == "learned" else 0
        return tok + head + pos + self.hidden_size * (2 if self.bias else 1)

    def param_count(self) -> int:
        return self._all_layers_params(active=False) + self.embedding_params()

    def active_param_count(self) -> int:
        """Parameters one token uses: all of a dense model; a MoE's routed top-k, shared
        experts and routers, not its other experts. The embedding table counts whole, as
        Mixtral's and DeepSeek-V3's published figures count it (12.9B, 37B); gpt-oss's card
        leaves one table out (5.1B and 3.6B against 5.71B and 4.19B here, the gap one
        201,088 x 2,880 table). A count shown, not priced: FLOPs take the layers' own."""
        return self._all_layers_params(active=True) + self.embedding_params()

    @property
    def expert_element_bytes(self) -> float:
        """Bytes a routed expert's weight takes (the model's, unless the experts have their own)."""
        if self.moe is not None and self.moe.expert_weight_dtype is not None:
            return PRECISION_BYTES[self.moe.expert_weight_dtype]
        return self.weight_element_bytes

    @property
    def embedding_element_bytes(self) -> float:
        """Bytes an embedding, LM head, norm, bias or router weight takes: the model's own
        dtype whatever `weight_dtype` says, as vLLM's Fp8Config quantizes only linear layers'
        weight matrices and fused experts (the vocabulary embedding and LM head stay in bf16;
        DeepSeek-V3's report, section 3.3.2, keeps them too; `unquantized_params_per_rank`).
        A `weight_dtype` wider than that (fp32) widens them too: it kept the embedding and LM
        head at 2 bytes (a tester's finding)."""
        return max(float(self.dtype_bytes), self.weight_element_bytes)

    def non_expert_weight_bytes(self) -> float:
        """Bytes of every weight but the routed experts': the layers' matrices at
        `weight_dtype`; the embedding, LM head, norms, biases and routers at their own
        (`embedding_element_bytes`, `unquantized_params_per_rank`)."""
        rest = self.param_count() - self.routed_expert_params()
        if self.weight_element_bytes == self.embedding_element_bytes:
            return rest * self.weight_element_bytes
        unquantized = self.embedding_params() + sum(
            self.unquantized_params_per_rank(i) for i in range(self.num_layers))
        return ((rest - unquantized) * self.weight_element_bytes
                + unquantized * self.embedding_element_bytes)

    def routed_expert_bytes_per_expert(self) -> float:
        """Bytes of one routed expert: its matrices at `expert_element_bytes`, its biases
        (if any) at the model's own dtype, as vLLM keeps biases (`embedding_element_bytes`)."""
        return (self.expert_matrix_params() * self.expert_element_bytes
                + self.expert_bias_params() * self.embedding_element_bytes)

    def layer_routed_expert_bytes(self, layer: int) -> float:
        """Bytes of decoder layer `layer`'s routed experts (0 in a dense layer)."""
        moe = self.moe
        if moe is None or layer in moe.dense_layers:
            return 0.0
        return moe.num_experts * self.routed_expert_bytes_per_expert()

    def layer_expert_down_bias_bytes(self, layer: int) -> float:
        """Bytes of decoder layer `layer`'s routed experts' down-projection biases (vLLM's
        w2_bias, hidden_size an expert; 0 without `MoESpec.expert_bias` or in a dense layer)."""
        moe = self.moe
        if moe is None or not moe.expert_bias or layer in moe.dense_layers:
            return 0.0
        return moe.num_experts * self.hidden_size * self.embedding_element_bytes

    def weight_bytes(self) -> float:
        # Whole numbers times a power of two, or 17/32 (mxfp4): the sum is exact.
        return self.non_expert_weight_bytes() + sum(
            self.layer_routed_expert_bytes(i) for i in range(self.num_layers))

    def kv_values_per_token_per_layer(self) -> int:
        """Values a layer caches per token: K and V of every KV head (GQA shrinks it), or
        MLA's latent and shared RoPE key."""
        if self.mla is not None:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim

    def kv_bytes_per_token(self) -> float:
        """KV cache bytes of one token over every layer."""
        return self.num_layers * self.kv_values_per_token_per_layer() * self.kv_element_bytes

    def flops_per_token(self, context_tokens: int) -> float:
        """Forward FLOPs for one token attending to `context_tokens` keys.

        2 FLOPs per weight of every matmul (layers and the LM head), plus 4 * layers *
        context * (heads * head_dim) for QK^T and AV: the forward third of PaLM's
        6N + 12LHQT per token (Chowdhery et al. 2022, Appendix B).
        """
        matmul_params = self._all_layers_params(active=True) + self.vocab_size * self.hidden_size
        if self.mla is not None:  # per query head: QK over nope + rope dims, AV over v dims
            m = self.mla
            per_pair = m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim
            attention = 2 * self.num_layers * context_tokens * self.num_heads * per_pair
        else:  # a sliding-window layer attends to the window's keys at most
            keys = (self.num_layers - self.num_window_layers) * context_tokens
            if self.sliding_window is not None:
                keys += self.num_window_layers * min(context_tokens, self.sliding_window)
            attention = 4 * keys * self.num_heads * self.head_dim
        return 2.0 * matmul_params + attention


class GpuSpec(Strict):
    """One GPU's datasheet numbers (see gpus.yaml for each source)."""

    name: str = "custom"
    peak_flops: PositiveFloat  # dense bf16, FLOP/s
    peak_flops_fp8: PositiveFloat | None = None  # dense fp8; None: no fp8 tensor cores
    hbm_bandwidth_bytes_per_s: PositiveFloat
    memory_bytes: PositiveFloat  # as the driver reports it, which vLLM takes its share of
    nvlink_bandwidth_bytes_per_s: PositiveFloat  # total per GPU, both directions
    # A full mesh of this many point-to-point links, the total split evenly among them
    # (None: a switch, which gives any peer the whole bandwidth). See cost.parallel._nvlink.
    mesh_links: PositiveInt | None = None
    node_network_bytes_per_s: PositiveFloat  # per GPU, between nodes
    gpus_per_node: PositiveInt = 8
    source: str = ""
    memory_source: str = ""
    # Rental price, for `orcasim capacity`'s cost per million tokens (overridable there).
    price_per_hour_usd: PositiveFloat | None = None
    price_source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _from_catalog(cls, data: Any) -> Any:
        return from_catalog("gpus", data)


@functools.cache
def _catalog(kind: str) -> dict[str, dict[str, Any]]:
    # Read as a user's file is (YAML 1.2 numbers): PyYAML's safe_load kept 312.0e12 as text.
    return yaml_strict.load((CATALOG_DIR / f"{kind}.yaml").read_text(encoding="utf-8"))


def known_names(kind: Literal["models", "gpus"]) -> list[str]:
    return sorted(_catalog(kind))


def _resolve(kind: Literal["models", "gpus"], value: Any) -> Any:
    """A catalog name becomes its entry (with `name` set); a mapping passes through."""
    if not isinstance(value, str):
        return value
    entries = _catalog(kind)
    key = value.strip().lower()
    if key not in entries:
        label = "model" if kind == "models" else "gpu"
        raise ScenarioError(f"unknown {label} '{value}'; known {kind}: {', '.join(known_names(kind))}")
    return {"name": key, **entries[key]}


CATALOG_KEY = "catalog"


def from_catalog(kind: Literal["models", "gpus"], data: Any) -> Any:
    """`{catalog: NAME, key: value, ...}`: that catalog entry with the keys given changed (a
    nested block, such as `moe`, only in the keys it gives), so fp8 KV on a catalog model
    needs no spec written out (a tester's finding); anything else as it is."""
    if not isinstance(data, dict) or CATALOG_KEY not in data:
        return data
    name, label = data[CATALOG_KEY], "model" if kind == "models" else "gpu"
    if not isinstance(name, str):
        raise ScenarioError(f"{label}.{CATALOG_KEY} = {name!r}: expected a catalog {label}'s "
                            f"name ({', '.join(known_names(kind))})")
    entry = _resolve(kind, name)
    if "hf_config" in entry:  # its fields, for a nested block to change some of them
        entry = resolve_hf_model(entry)
    return _merged(entry, {k: v for k, v in data.items() if k != CATALOG_KEY})


def _merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        old = out.get(key)
        out[key] = _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


ModelRef = Annotated[ModelSpec, BeforeValidator(lambda v: _resolve("models", v))]
GpuRef = Annotated[GpuSpec, BeforeValidator(lambda v: _resolve("gpus", v))]


def model_spec(name: str) -> ModelSpec:
    return ModelSpec.model_validate(_resolve("models", name))


# What names a model and says where it comes from, not what it computes.
NOT_SHAPE = frozenset({"name", "source", "notes"})


def is_model(name: str, model: ModelSpec) -> bool:
    """Whether `name` (a fit's or a profile's model: 'facebook/opt-13b', a catalog name) is
    `model`: the same name without its organisation, or a catalog model of the same shape
    (the same model read from its config.json, or written out, goes by another name)."""
    bare = name.rsplit("/", 1)[-1].strip().lower()
    if bare == model.name.rsplit("/", 1)[-1].strip().lower():
        return True
    if bare not in _catalog("models"):
        return False
    return model_spec(bare).model_dump(exclude=set(NOT_SHAPE)) == model.model_dump(exclude=set(NOT_SHAPE))


def gpu_spec(name: str) -> GpuSpec:
    return GpuSpec.model_validate(_resolve("gpus", name))


MAX_PIPELINE_STAGES = 1024


class HardwareConfig(Strict):
    """The deployment: which GPU, how the model is split, and the KV memory budget.

    `activation_reserve_gib` is memory kept per GPU for activations and workspace, not
    for KV; 10% utilisation headroom plus this reserve follows vLLM's
    `gpu_memory_utilization = 0.9` default.

    A mixture-of-experts model may also run its attention data-parallel
    (`data_parallel_attention` groups of `tensor_parallel` GPUs, each with its own
    requests and KV cache: SGLang's `--enable-dp-attention`, vLLM's `--data-parallel-size`)
    and its routed experts expert-parallel (`expert_parallel` ranks, each holding whole
    experts, `num_experts / expert_parallel` of them: vLLM's `--enable-expert-parallel`).
    As in both engines, expert parallelism spans the attention GPUs of a stage, so it is
    1 (experts split by tensor parallelism) or tensor_parallel x data_parallel_attention.
    """

    gpu: GpuRef
    tensor_parallel: PositiveInt = 1
    # A bound, not a stage per layer: without a model nothing else caps it, and a run keeps
    # per-stage state (1e11 stages was a MemoryError; 1e6 took 69 s for 20 requests). No
    # model has near this many layers (Llama-3.1-405B: 126).
    pipeline_parallel: PositiveInt = Field(default=1, le=MAX_PIPELINE_STAGES)
    data_parallel_attention: PositiveInt = 1
    expert_parallel: PositiveInt = 1
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    activation_reserve_gib: float = Field(default=1.0, ge=0.0)

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel * self.data_parallel_attention * self.pipeline_parallel

    @property
    def gpus_per_stage(self) -> int:
        return self.tensor_parallel * self.data_parallel_attention

    @model_validator(mode="after")
    def _expert_parallel_spans_the_stage(self) -> HardwareConfig:
        ep, stage = self.expert_parallel, self.gpus_per_stage
        if ep not in (1, stage) or (self.data_parallel_attention > 1 and ep != stage):
            raise ScenarioError(
                f"hardware.expert_parallel = {ep} with tensor_parallel = {self.tensor_parallel} and "
                f"data_parallel_attention = {self.data_parallel_attention}: expected "
                f"{stage} (tensor_parallel x data_parallel_attention: expert parallelism spans "
                "the attention GPUs of a stage)" + (
                    "" if self.data_parallel_attention > 1 or stage == 1
                    else " or 1 (experts split by tensor parallelism)")
                + (", or data_parallel_attention = 1 on a dense model (data-parallel attention is "
                   "for mixture-of-experts models)" if self.data_parallel_attention > 1 else ""))
        return self


def attention_groups(hardware: HardwareConfig | None) -> int:
    """The data-parallel attention groups a KV pool is split over, each holding its own
    requests' KV as vLLM's data-parallel engines do: 1 without hardware. The one rule the
    scenario's checks, a fleet's replicas and a plain run's scheduler read."""
    return 1 if hardware is None else hardware.data_parallel_attention


def check_deployment(model: ModelSpec, hardware: HardwareConfig | None, max_tokens: int,
                     where: str = "", hardware_where: str | None = None) -> None:
    """Raise ValueError unless `model` can run as `hardware` splits it and its context holds
    a request of `max_tokens` (prompt + output). `where` prefixes the keys named, and
    `hardware_where` (default `where`) the hardware's, where it comes from elsewhere (a
    fleet's group of its own model on the scenario's hardware)."""
    hw_where = where if hardware_where is None else hardware_where
    if max_tokens > model.max_seq_len:
        raise ScenarioError(f"workload.max_tokens = {max_tokens} exceeds {where}model "
                         f"{model.name}'s context (max_seq_len {model.max_seq_len}); expected "
                         f"at most {model.max_seq_len}")
    if hardware is not None:
        check_parallel_layout(model, hardware, hw_where)


def check_parallel_layout(model: ModelSpec, hardware: HardwareConfig, where: str = "") -> None:
    """Raise ValueError unless `hardware` can split `model`: its tensor parallelism its
    attention and KV heads, its pipeline its layers, and its expert parallelism (with the
    data-parallel attention it spans) routed experts the model has. `where` prefixes the
    keys named. The one rule a scenario's checks and a hand-built cost model
    (`Roofline`) apply: a dense model with data-parallel attention, built by hand, reached
    an AssertionError from inside the roofline's expert pricing."""
    if model.num_heads % hardware.tensor_parallel:
        raise ScenarioError(f"{where}hardware.tensor_parallel = {hardware.tensor_parallel} does not "
                         f"divide {model.name}'s {model.num_heads} attention heads; expected one of "
                         f"{', '.join(map(str, _divisors(model.num_heads)))}")
    kv, tp = model.kv_heads, hardware.tensor_parallel
    if model.mla is None and (kv % tp if kv >= tp else tp % kv):
        # vLLM splits the KV heads over the ranks, or gives each rank a replica of one
        # (fewer heads than ranks); it refuses the rest (QKVParallelLinear, LlamaAttention).
        raise ScenarioError(f"{where}hardware.tensor_parallel = {tp} does not split {model.name}'s "
                            f"{kv} KV heads: expected a divisor or a multiple of {kv}")
    if hardware.pipeline_parallel > model.num_layers:
        raise ScenarioError(f"{where}hardware.pipeline_parallel = {hardware.pipeline_parallel} "
                         f"exceeds {model.name}'s {model.num_layers} layers; expected at most "
                         f"{model.num_layers}")
    _check_expert_parallel(model, hardware, where)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_expert_parallel(model: ModelSpec, hardware: HardwareConfig, where: str) -> None:
    ep = hardware.expert_parallel  # > 1 with data-parallel attention too (HardwareConfig)
    if model.moe is None and ep > 1:
        raise ScenarioError(f"{where}hardware.expert_parallel = {ep} needs a mixture-of-experts "
                            f"model; {model.name} is dense (expected 1; replicas: a cluster)")
    if model.moe is not None and model.moe.num_experts % ep:
        raise ScenarioError(f"{where}hardware.expert_parallel = {ep} does not divide {model.name}'s "
                            f"{model.moe.num_experts} routed experts; expected a divisor")


def layers_per_stage(model: ModelSpec, pipeline_parallel: int) -> int:
    """Layers on the busiest stage (Orca splits layers evenly; a remainder goes to some stages)."""
    return math.ceil(model.num_layers / pipeline_parallel)


def stage_layers(model: ModelSpec, pipeline_parallel: int) -> list[int]:
    """Each stage's layers, split as evenly as they go, as vLLM's `get_pp_indices` splits
    them: the remainder one each on the stages before the last, from the last but one back
    (the last holds the LM head, the first the embedding). Orca does not say; the first
    stages took it here before, which moved a stage's weights, and so the KV capacity of the
    fewest-token stage, by a few per cent (a tester's finding: DeepSeek-V3 on 4 stages)."""
    base, extra = divmod(model.num_layers, pipeline_parallel)
    layers = [base] * pipeline_parallel
    for k in range(2, extra + 2):
        layers[-k] += 1
    return layers


def kv_bytes_per_token_per_gpu(model: ModelSpec, hw: HardwareConfig) -> float:
    """KV bytes one GPU holds per token: its stage's layers, its KV heads
    (`ModelSpec.kv_heads_per_rank`: a replica of one past TP = KV heads)."""
    return kv_bytes_per_token_of_layers(model, hw, layers_per_stage(model, hw.pipeline_parallel))


def kv_bytes_per_token_of_layers(model: ModelSpec, hw: HardwareConfig, layers: int) -> float:
    """KV bytes one GPU holding `layers` layers keeps per token (`kv_bytes_per_token_per_gpu`)."""
    if model.mla is not None:  # the latent is not split by heads: every rank keeps it whole
        return float(layers * model.kv_values_per_token_per_layer() * model.kv_element_bytes)
    heads_per_gpu = model.kv_heads_per_rank(hw.tensor_parallel)
    return 2.0 * layers * heads_per_gpu * model.head_dim * model.kv_element_bytes


def weight_bytes_per_gpu(model: ModelSpec, hw: HardwareConfig) -> float:
    """Weights one GPU of the heaviest stage holds (`stage_weight_bytes`): everything but the
    routed experts split by tensor parallelism as vLLM splits it (replicated over
    data-parallel attention groups), and the routed experts split by expert parallelism (or
    by tensor parallelism without it)."""
    return max(stage_weight_bytes(model, hw))


def layer_params_per_rank(model: ModelSpec, layer: int, tp: int) -> float:
    """Weights of layer `layer` but its routed experts that one of `tp` tensor-parallel
    ranks holds, as vLLM lays them out: an even share of the split ones, the replicated
    ones whole (`ModelSpec.tp_replicated_params`), and the K and V projections of its KV
    heads, a replica of one head's past TP = KV heads (`ModelSpec.kv_heads_per_rank`)."""
    own = model.layer_params(layer) - model.layer_routed_expert_params(layer)
    whole, kv = model.tp_replicated_params(layer), model.kv_projection_params()
    return (own - whole - kv) / tp + whole + kv * model.kv_heads_per_rank(tp) / model.kv_heads


def stage_weight_bytes(model: ModelSpec, hw: HardwareConfig) -> list[float]:
    """Weights one GPU of each pipeline stage holds: its layers (`stage_layers`), the token
    (and learned position) embedding on the first stage, the final norm and LM head on the
    last. vLLM builds them so (`PPMissingLayer` elsewhere), and with tied embeddings the
    last stage keeps a copy of the table for its LM head. Tensor parallelism splits the
    vocabulary (VocabParallelEmbedding, ParallelLMHead), not the position table (a plain
    embedding in vLLM's OPT and GPT-2) nor the final norm."""
    tp = hw.tensor_parallel
    expert_ranks = hw.expert_parallel if hw.expert_parallel > 1 else tp
    d, emb_bytes = model.hidden_size, model.embedding_element_bytes
    positions = model.max_seq_len * d if model.positional == "learned" else 0
    first = (model.vocab_size * d / tp + positions) * emb_bytes
    # One stage shares a tied table between embedding and LM head.
    head = model.vocab_size * d if hw.pipeline_parallel > 1 or not model.tied_embeddings else 0
    last = (head / tp + d * (2 if model.bias else 1)) * emb_bytes
    out, start = [], 0
    for k, count in enumerate(stage_layers(model, hw.pipeline_parallel)):
        layers = range(start, start + count)
        start += count
        own = sum(layer_params_per_rank(model, i, tp) for i in layers)
        unquantized = sum(model.unquantized_params_per_rank(i, tp) for i in layers)
        expert = sum(model.layer_routed_expert_bytes(i) for i in layers)
        # Expert parallelism holds whole experts, num_experts / ep of them; tensor parallelism
        # a 1/tp slice of every expert's matrices and gate-and-up bias, but each expert's
        # down-projection bias whole: vLLM's gpt_oss.py (GptOssModel.load_weights) loads
        # w2_bias whole on every TP rank, zeroed but on rank 0, so the all-reduce adds it once.
        whole = 0.0 if hw.expert_parallel > 1 else sum(model.layer_expert_down_bias_bytes(i) for i in layers)
        # What stays unquantized adds its difference (0 where nothing is quantized: the same bits).
        weights = (own * model.weight_element_bytes + unquantized * (emb_bytes - model.weight_element_bytes)
                   + (expert - whole) / expert_ranks + whole)
        out.append(weights + (first if k == 0 else 0.0) + (last if k == hw.pipeline_parallel - 1 else 0.0))
    return out


def derive_kv_capacity_tokens(model: ModelSpec, hw: HardwareConfig) -> int:
    """KV tokens the deployment can hold: (memory x utilisation - weights - reserve) / KV bytes.

    Per GPU, since every GPU holds the same tokens' KV for its own layers and heads; each
    data-parallel attention group holds its own requests' KV, so the groups add up. Over
    pipeline stages, the fewest any stage holds (vLLM takes the minimum of its workers'
    blocks): each with its own weights and layers. Raises ScenarioError when the weights
    leave no room for one token's KV.
    """
    if hw.pipeline_parallel > 1:
        return min(_kv_capacity_tokens(model, hw, weights, layers) for weights, layers in
                   zip(stage_weight_bytes(model, hw), stage_layers(model, hw.pipeline_parallel),
                       strict=True))
    return _kv_capacity_tokens(model, hw, weight_bytes_per_gpu(model, hw), model.num_layers)


def _kv_capacity_tokens(model: ModelSpec, hw: HardwareConfig, weights_per_gpu: float,
                        layers: int) -> int:
    """`derive_kv_capacity_tokens` of one stage of `layers` layers and those weights."""
    budget = hw.gpu.memory_bytes * hw.gpu_memory_utilization - hw.activation_reserve_gib * GIB
    if budget <= 0:  # the two settings alone: say so, not that the weights are too large
        raise ScenarioError(
            f"hardware.gpu_memory_utilization = {hw.gpu_memory_utilization:g} of "
            f"{hw.gpu.memory_bytes / GIB:.2f} GiB less activation_reserve_gib = "
            f"{hw.activation_reserve_gib:g} leaves {budget / GIB:.3g} GiB for weights and KV; "
            "expected a utilisation near vLLM's 0.9 and a reserve well under the GPU's memory")
    tokens_per_gpu = int((budget - weights_per_gpu) // kv_bytes_per_token_of_layers(model, hw, layers))
    if tokens_per_gpu < 1:  # weights over the budget, or too close to it for one token's KV
        # Opens with the key it is about: under --set it read '(top level): model ...'.
        raise ScenarioError(
            f"hardware.tensor_parallel = {hw.tensor_parallel} (pipeline_parallel "
            f"{hw.pipeline_parallel}): model {model.name} needs {weights_per_gpu / GIB:.1f} GiB of "
            f"weights per GPU on {hw.num_gpus} x {hw.gpu.name}, leaving no room for KV in the {budget / GIB:.1f} GiB "
            f"budget; expected more GPUs (tensor_parallel, pipeline_parallel, expert_parallel), "
            f"fewer weight bytes (weight_dtype), or in a scenario an explicit kv_capacity_tokens "
            "(a replica group's or pool's own, where it names its own model or GPUs)"
        )
    return hw.data_parallel_attention * tokens_per_gpu


class Deployment(Strict):
    """What a hardware-aware cost model needs besides its own settings: model and hardware."""

    model: ModelSpec
    hardware: HardwareConfig

    @property
    def kv_capacity_tokens(self) -> int:
        return derive_kv_capacity_tokens(self.model, self.hardware)

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        return kv_bytes_per_token_per_gpu(self.model, self.hardware)


def model_figures(model: ModelSpec, hw: HardwareConfig | None = None) -> dict[str, float]:
    """What follows from a model (and a deployment, if given): what `orcasim model` prints."""
    figures = {
        "parameters": float(model.param_count()),
        "active_parameters": float(model.active_param_count()),
        "weight_bytes": float(model.weight_bytes()),
        "kv_bytes_per_token": float(model.kv_bytes_per_token()),
        "flops_per_token_at_context_1": model.flops_per_token(1),
        "flops_per_token_at_context_4096": model.flops_per_token(4096),
    }
    if hw is not None:
        figures["gpus"] = float(hw.num_gpus)
        figures["weight_bytes_per_gpu"] = weight_bytes_per_gpu(model, hw)
        figures["kv_bytes_per_token_per_gpu"] = kv_bytes_per_token_per_gpu(model, hw)
        figures["kv_capacity_tokens"] = float(derive_kv_capacity_tokens(model, hw))
    return figures


def model_from_argument(value: str, weight_dtype: str | None = None) -> ModelSpec:
    """A catalog name, or the path of a Hugging Face config.json (or of the model's folder,
    which holds it); `weight_dtype` overrides the precision it gives (as the scenario key
    does)."""
    # A catalog name first: a folder of that name beside the user does not hide it.
    # A path as a scenario's key takes one: with a folder in it, or a file found where data
    # is found (the shipped hf_configs/gpt2 read "unknown model"; a tester's finding).
    is_path = value.strip().lower() not in _catalog("models") and (
        value.endswith(".json") or "/" in value or Path(value).exists())
    fields = {"hf_config": value} if is_path else dict(_resolve("models", value))
    if weight_dtype is not None:
        fields["weight_dtype"] = weight_dtype
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as e:  # a config whose fields do not make a model: name the field
        # A reader's own message names its key already; pydantic's need the field named.
        source = f"model {value}"
        raise ScenarioError(format_field_error(e, source, fields)) from None
