"""Model and GPU catalogs, the deployment (`hardware:`), and what follows from them.

A scenario names a catalog entry (`model: gpt3-175b`, `hardware: {gpu: a100-40gb}`) or gives
the same fields inline. The catalogs are data (`orcasim/data/catalog/*.yaml`, each entry
citing its source); this module only validates them and derives parameter counts, FLOPs
per token, KV bytes per token and the KV capacity of a deployment.
"""

from __future__ import annotations

import functools
import math
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, Field, PositiveFloat, PositiveInt, model_validator

from orcasim.config import ScenarioError, Strict
from orcasim.paths import PACKAGE_DATA_DIR

CATALOG_DIR = PACKAGE_DATA_DIR / "catalog"
GIB = 1024**3


class ModelSpec(Strict):
    """Shape of a decoder-only transformer. Defaults follow GPT-3's conventions."""

    name: str = "custom"
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_heads: PositiveInt
    num_kv_heads: PositiveInt | None = None  # None: multi-head attention (= num_heads)
    intermediate_size: PositiveInt | None = None  # None: 4 x hidden_size
    gated_mlp: bool = False
    vocab_size: PositiveInt = 50257
    max_seq_len: PositiveInt = 2048
    positional: Literal["learned", "rope"] = "learned"
    tied_embeddings: bool = True
    bias: bool = True
    dtype_bytes: PositiveInt = 2  # bf16 / fp16 weights, activations and KV cache
    source: str = ""
    notes: str = ""

    @model_validator(mode="after")
    def _divisible(self) -> ModelSpec:
        if self.hidden_size % self.num_heads:
            raise ScenarioError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.num_heads % self.kv_heads:
            raise ScenarioError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.kv_heads}")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    def layer_params(self) -> int:
        """Weights of one decoder layer (attention, MLP, two norms, biases if any)."""
        d, hd = self.hidden_size, self.head_dim
        qkv_out = (self.num_heads + 2 * self.kv_heads) * hd
        attention = d * qkv_out + self.num_heads * hd * d
        mlp = (3 if self.gated_mlp else 2) * d * self.ffn_size
        norms = 2 * d * (2 if self.bias else 1)  # gain (and bias) of two layer norms
        biases = (qkv_out + d + (self.ffn_size * (2 if self.gated_mlp else 1)) + d) if self.bias else 0
        return attention + mlp + norms + biases

    def embedding_params(self) -> int:
        """Token embedding, LM head if untied, learned positions, and the final norm."""
        tok = self.vocab_size * self.hidden_size
        head = 0 if self.tied_embeddings else tok
        pos = self.max_seq_len * self.hidden_size if self.positional == "learned" else 0
        return tok + head + pos + self.hidden_size * (2 if self.bias else 1)

    def param_count(self) -> int:
        return self.num_layers * self.layer_params() + self.embedding_params()

    def weight_bytes(self) -> int:
        return self.param_count() * self.dtype_bytes

    def kv_bytes_per_token(self) -> int:
        """K and V of every layer: 2 * layers * kv_heads * head_dim * dtype bytes (GQA shrinks it)."""
        return 2 * self.num_layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def flops_per_token(self, context_tokens: int) -> float:
        """Forward FLOPs for one token attending to `context_tokens` keys.

        2 FLOPs per weight of every matmul (layers and the LM head), plus 4 * layers *
        context * (heads * head_dim) for QK^T and AV: the forward third of PaLM's
        6N + 12LHQT per token (Chowdhery et al. 2022, Appendix B).
        """
        matmul_params = self.num_layers * self.layer_params() + self.vocab_size * self.hidden_size
        attention = 4 * self.num_layers * context_tokens * self.num_heads * self.head_dim
        return 2.0 * matmul_params + attention


class GpuSpec(Strict):
    """One GPU's datasheet numbers (see gpus.yaml for each source)."""

    name: str = "custom"
    peak_flops: PositiveFloat  # dense bf16, FLOP/s
    hbm_bandwidth_bytes_per_s: PositiveFloat
    memory_bytes: PositiveFloat
    nvlink_bandwidth_bytes_per_s: PositiveFloat  # total per GPU, both directions
    node_network_bytes_per_s: PositiveFloat  # per GPU, between nodes
    gpus_per_node: PositiveInt = 8
    source: str = ""
    # Rental price, for `orcasim capacity`'s cost per million tokens (overridable there).
    price_per_hour_usd: PositiveFloat | None = None
    price_source: str = ""


@functools.cache
def _catalog(kind: str) -> dict[str, dict[str, Any]]:
    with open(CATALOG_DIR / f"{kind}.yaml") as f:
        return yaml.safe_load(f)


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


ModelRef = Annotated[ModelSpec, BeforeValidator(lambda v: _resolve("models", v))]
GpuRef = Annotated[GpuSpec, BeforeValidator(lambda v: _resolve("gpus", v))]


def model_spec(name: str) -> ModelSpec:
    return ModelSpec.model_validate(_resolve("models", name))


def gpu_spec(name: str) -> GpuSpec:
    return GpuSpec.model_validate(_resolve("gpus", name))


class HardwareConfig(Strict):
    """The deployment: which GPU, how the model is split, and the KV memory budget.

    `activation_reserve_gib` is memory kept per GPU for activations and workspace, not
    for KV; 10% utilisation headroom plus this reserve follows vLLM's
    `gpu_memory_utilization = 0.9` default.
    """

    gpu: GpuRef
    tensor_parallel: PositiveInt = 1
    pipeline_parallel: PositiveInt = 1
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    activation_reserve_gib: float = Field(default=1.0, ge=0.0)

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel


def check_deployment(model: ModelSpec, hardware: HardwareConfig | None, max_tokens: int,
                     where: str = "") -> None:
    """Raise ValueError unless `model` can run as `hardware` splits it and its context holds
    a request of `max_tokens` (prompt + output). `where` prefixes the keys named."""
    if max_tokens > model.max_seq_len:
        raise ScenarioError(f"workload.max_tokens = {max_tokens} exceeds {where}model "
                         f"{model.name}'s context (max_seq_len {model.max_seq_len}); expected "
                         f"at most {model.max_seq_len}")
    if hardware is None:
        return
    if model.num_heads % hardware.tensor_parallel:
        raise ScenarioError(f"{where}hardware.tensor_parallel = {hardware.tensor_parallel} does not "
                         f"divide {model.name}'s {model.num_heads} attention heads")
    if hardware.pipeline_parallel > model.num_layers:
        raise ScenarioError(f"{where}hardware.pipeline_parallel = {hardware.pipeline_parallel} "
                         f"exceeds {model.name}'s {model.num_layers} layers")


def layers_per_stage(model: ModelSpec, pipeline_parallel: int) -> int:
    """Layers on the busiest stage (Orca splits layers evenly; a remainder goes to some stages)."""
    return math.ceil(model.num_layers / pipeline_parallel)


def kv_bytes_per_token_per_gpu(model: ModelSpec, hw: HardwareConfig) -> float:
    """KV bytes one GPU holds per token: its stage's layers, its share of the KV heads.

    With fewer KV heads than tensor-parallel ranks (GQA) each rank keeps a replica of one
    head, as Megatron and vLLM do.
    """
    heads_per_gpu = max(model.kv_heads / hw.tensor_parallel, 1.0)
    layers = layers_per_stage(model, hw.pipeline_parallel)
    return 2.0 * layers * heads_per_gpu * model.head_dim * model.dtype_bytes


def derive_kv_capacity_tokens(model: ModelSpec, hw: HardwareConfig) -> int:
    """KV tokens the deployment can hold: (memory x utilisation - weights - reserve) / KV bytes.

    Per GPU, since every GPU holds the same tokens' KV for its own layers and heads.
    Raises ValueError when the weights alone do not fit.
    """
    weights_per_gpu = model.weight_bytes() / hw.num_gpus
    budget = hw.gpu.memory_bytes * hw.gpu_memory_utilization - hw.activation_reserve_gib * GIB
    free = budget - weights_per_gpu
    if free <= 0:
        raise ScenarioError(
            f"model {model.name} needs {weights_per_gpu / 1e9:.1f} GB of weights per GPU on "
            f"{hw.num_gpus} x {hw.gpu.name}, above the {budget / 1e9:.1f} GB budget; "
            f"expected more GPUs (tensor_parallel x pipeline_parallel) or kv_capacity_tokens"
        )
    return int(free // kv_bytes_per_token_per_gpu(model, hw))


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
