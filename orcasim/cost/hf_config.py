"""A model from its Hugging Face `config.json`: `model: {hf_config: path/to/config.json}`.

The reader knows the fields of the common families (by `model_type`): Llama, Mistral,
Qwen2/Qwen3 and Mixtral, Qwen2-MoE/Qwen3-MoE, DeepSeek-V2/V3, gpt-oss, OPT and GPT-2. It
reads layers, hidden size, heads, KV heads, head dim, MLP and expert widths, vocabulary,
tied embeddings and context length into a `ModelSpec`. A field that would change the
cost and that orcasim does not model (a sliding window, a vision tower) is an error
naming it, never a silent default; fields that only describe numerics (RoPE scaling,
norm epsilon, initialiser ranges) are ignored. Sliding windows are read in each family's
words: Mistral's `sliding_window` (every layer), `layer_types` (gpt-oss, Gemma: which layers
are "sliding_attention"), Qwen2's `use_sliding_window` with `max_window_layers` (layers from
that index on slide, as transformers' Qwen2Config lays them out).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orcasim.config import ScenarioError

Config = dict[str, Any]

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe")


def model_fields_from_hf(path: Path, given: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The `ModelSpec` fields of the model whose config.json is at `path`; `given`: the
    fields the scenario sets itself (a `weight_dtype` given overrides the checkpoint's)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ScenarioError(f"model.hf_config = {str(path)!r}: cannot read it as JSON ({e})") from None
    if not isinstance(config, dict):
        raise ScenarioError(f"model.hf_config = {str(path)!r}: expected a JSON object")
    model_type = str(config.get("model_type", ""))
    reader = READERS.get(model_type)
    if reader is None:
        raise ScenarioError(f"model.hf_config = {str(path)!r}: model_type = {model_type!r} is not "
                            f"a family orcasim reads; expected one of {', '.join(sorted(READERS))}")
    for key, modelled in UNMODELLED.items():
        if key in config and not modelled(config):
            raise ScenarioError(f"model.hf_config = {str(path)!r}: {key} = {config[key]!r} changes "
                                "the cost and is not modelled; expected a model without it")
    _check_scalars(config, path)
    fields = reader(config)
    if "weight_dtype" not in given:
        fields |= _quantization(config, fields)
    fields.setdefault("name", str(config.get("_name_or_path") or path.parent.name or model_type))
    fields["source"] = f"{path.name} ({model_type})"
    return fields


# The keys the readers take as counts or switches. A value of another type is refused by
# name: Python's int() and bool() took 100.7 as 100 and the string "false" as true, and a
# string such as "abc" failed without naming its key (a tester's finding).
INTEGER_KEYS = (
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "vocab_size", "max_position_embeddings", "head_dim", "sliding_window",
    "max_window_layers", "moe_intermediate_size", "shared_expert_intermediate_size",
    "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step",
    "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
    "experts_per_token", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "ffn_dim", "word_embed_proj_dim", "n_embd", "n_layer", "n_head", "n_inner",
    "n_positions")
SWITCH_KEYS = ("tie_word_embeddings", "enable_bias", "use_sliding_window", "attention_bias")


def _check_scalars(config: Config, path: Path) -> None:
    """Every count an integer (an integral float too) and every switch true or false; null
    is absent."""
    for key in INTEGER_KEYS:
        value = config.get(key)
        if value is None or (isinstance(value, int | float) and not isinstance(value, bool)
                             and float(value).is_integer()):
            continue
        raise ScenarioError(f"model.hf_config = {str(path)!r}: {key} = {json.dumps(value)}; "
                            "expected an integer")
    for key in SWITCH_KEYS:
        value = config.get(key)
        if value is not None and not isinstance(value, bool):
            raise ScenarioError(f"model.hf_config = {str(path)!r}: {key} = {json.dumps(value)}; "
                                "expected true or false")


def _quantization(config: Config, fields: dict[str, Any]) -> dict[str, Any]:
    """The weights' precision from `quantization_config`: fp8 checkpoints (DeepSeek-V3's,
    Qwen's -FP8) store every linear weight in fp8; gpt-oss's mxfp4 quantizes the experts
    only. Other schemes are errors: say `weight_dtype` instead."""
    quant = config.get("quantization_config")
    if not quant:
        return {}
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method == "fp8":
        return {"weight_dtype": "fp8"}
    if method == "mxfp4" and "moe" in fields:
        return {"moe": {**fields["moe"], "expert_weight_dtype": "mxfp4",
                        "expert_weight_dtype_from": "checkpoint"}}
    raise ScenarioError(f"model.hf_config: quantization_config.quant_method = {method!r} is not "
                        "modelled; expected fp8 (or mxfp4 experts), or set model.weight_dtype")


def _need(config: Config, *keys: str) -> Any:
    """The first of `keys` present (families name the same field differently)."""
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    raise ScenarioError(f"model.hf_config: missing {keys[0]}, which {config.get('model_type')} "
                        "configs have")


def _present_or(config: Config, key: str, default: Any) -> Any:
    """`config[key]` where present, `default` where absent or null. A 0 is taken as given,
    for the model's checks to refuse: `or` read `moe_intermediate_size: 0` as the dense MLP's
    width (Qwen3-30B-A3B counted 233B parameters; a tester's finding)."""
    return config[key] if config.get(key) is not None else default


def _layer_step(config: Config, key: str) -> int:
    """Every how many layers a MoE layer comes (`decoder_sparse_step`, `moe_layer_freq`):
    1 where absent; 0 is refused (transformers divides by it), not read as 1."""
    step = int(_present_or(config, key, 1))
    if step < 1:
        raise ScenarioError(f"model.hf_config: {key} = {step}; expected a positive integer")
    return step


def _layer_list(config: Config, key: str) -> list[int]:
    """A list of layer indices (`mlp_only_layers`): an int there was a TypeError traceback."""
    value = _present_or(config, key, [])
    if not (isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)):
        raise ScenarioError(f"model.hf_config: {key} = {json.dumps(value)}; expected a list of "
                            "0-based layer indices")
    return value


def _default_kv_heads(config: Config, heads: int) -> int:
    """KV heads where a config leaves them out: transformers' MistralConfig defaults to 8 (a
    trimmed Mistral config read as 32, four times the KV); Llama's and the others' default
    to the attention heads."""
    return 8 if config["model_type"] in ("mistral", "mixtral") else heads


def _llama_like(config: Config) -> dict[str, Any]:
    heads = _need(config, "num_attention_heads")
    fields: dict[str, Any] = {
        "num_layers": _need(config, "num_hidden_layers"),
        "hidden_size": _need(config, "hidden_size"),
        "num_heads": heads,
        "num_kv_heads": _present_or(config, "num_key_value_heads", _default_kv_heads(config, heads)),
        "intermediate_size": _need(config, "intermediate_size"),
        "gated_mlp": True,
        "vocab_size": _need(config, "vocab_size"),
        "max_seq_len": _need(config, "max_position_embeddings"),
        "positional": "rope",
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
        "bias": False,
    }
    if config.get("head_dim") is not None:
        fields["head_size"] = config["head_dim"]
    if config["model_type"] in ("qwen2", "qwen2_moe") or config.get("attention_bias"):
        fields["qkv_bias"] = True  # Qwen2's Q, K and V projections have biases
    if config.get("attention_bias"):  # and the output projection's, as vLLM's bias_o_proj
        fields["out_bias"] = True
    if config["model_type"] in ("qwen3", "qwen3_moe"):
        fields["qk_norm"] = True  # Qwen3Attention's q_norm and k_norm
    moe = _moe(config)
    if moe is not None:
        fields["moe"] = moe
    return fields | _sliding_window(config)


def _sliding_window(config: Config) -> dict[str, Any]:
    """`sliding_window` and its layers, or nothing for a model that attends to everything."""
    window = config.get("sliding_window")
    # Qwen's configs switch the window on with use_sliding_window, off when absent
    # (transformers' Qwen2Config and Qwen3Config default it to False); Mistral's has no such key.
    uses = config.get("use_sliding_window", False if config["model_type"].startswith("qwen") else None)
    layers = int(_need(config, "num_hidden_layers"))
    types = config.get("layer_types")
    if types is not None:  # checked with or without a window: a linear or chunked attention
        # layer read as full attention where no window was set (a tester's finding)
        if not (isinstance(types, list) and len(types) == layers
                and all(isinstance(t, str) for t in types)):
            raise ScenarioError(f"model.hf_config: layer_types = {types!r}: expected a list of "
                                f"{layers} layer kinds, one per hidden layer")
        unknown = sorted({t for t in types} - {"sliding_attention", "full_attention"})
        if unknown:
            raise ScenarioError(f"model.hf_config: layer_types {unknown[0]!r} is not modelled; "
                                "expected sliding_attention or full_attention layers")
    if window is None or uses is False:
        return {}
    if types is not None:
        sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    elif uses and config.get("max_window_layers") is not None:
        sliding = list(range(int(config["max_window_layers"]), layers))  # Qwen2
    else:
        sliding = list(range(layers))  # Mistral: every layer
    if not sliding:
        return {}
    return {"sliding_window": int(window),
            "sliding_window_layers": None if len(sliding) == layers else sliding}


EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# Families whose every model has routed experts (DeepSeek's layers go dense without them).
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")


def _moe(config: Config) -> dict[str, Any] | None:
    """Routed and shared experts, and which layers stay dense, in each family's words."""
    family = config["model_type"]
    # The first key present: `or` read a 0 as absent, so `num_local_experts: 0` made Mixtral
    # a dense 7.2B model in silence; a 0 goes on for MoESpec to refuse (`_present_or`).
    num_experts = next((config[key] for key in EXPERT_COUNT_KEYS if config.get(key) is not None), None)
    if num_experts is None and family in MOE_FAMILIES:
        # Absent, a Mixtral config read as a dense 7.24B model (46.70B) and Qwen3-30B-A3B
        # as a dense 3.34B one (30.53B), silently.
        raise ScenarioError(f"model.hf_config: missing the expert count ({' or '.join(EXPERT_COUNT_KEYS)}), "
                            f"which {family} configs have")
    if num_experts is None:  # a DeepSeek config without routed experts is dense, as in vLLM
        return None
    layers = range(int(_need(config, "num_hidden_layers")))
    # Mixtral's and gpt-oss's experts are as wide as `intermediate_size`; Qwen's and
    # DeepSeek's have their own width, which is no default: absent, the dense MLP's width
    # read Qwen3-30B-A3B as 233.5B parameters (30.53B) and DeepSeek-V3 as 5.9T (671.0B).
    own_width = family.startswith(("qwen", "deepseek"))
    expert_width = int(_need(config, "moe_intermediate_size") if own_width  # (0 is refused)
                       else _need(config, "intermediate_size"))
    shared_width = int(config.get("shared_expert_intermediate_size") or 0)  # Qwen2-MoE
    if family.startswith("deepseek"):
        shared_width = int(config.get("n_shared_experts") or 0) * expert_width
        first, step = int(config.get("first_k_dense_replace") or 0), _layer_step(config, "moe_layer_freq")
        dense = [i for i in layers if i < first or i % step]
    elif family.startswith("qwen"):
        step, only_mlp = _layer_step(config, "decoder_sparse_step"), _layer_list(config, "mlp_only_layers")
        dense = [i for i in layers if i in only_mlp or (i + 1) % step]
    else:  # Mixtral, gpt-oss: every layer
        dense = []
    return {
        "num_experts": num_experts,
        "experts_per_token": _need(config, "num_experts_per_tok", "experts_per_token"),
        "expert_intermediate_size": expert_width,
        "shared_intermediate_size": shared_width,
        "dense_layers": dense,
    }


def _deepseek(config: Config) -> dict[str, Any]:
    # MLA has no KV heads of its own: every query head reads the shared latent.
    fields = _llama_like({**config, "num_key_value_heads": _need(config, "num_attention_heads")})
    fields["mla"] = {
        "kv_lora_rank": _need(config, "kv_lora_rank"),
        "q_lora_rank": config.get("q_lora_rank"),
        "qk_nope_head_dim": _need(config, "qk_nope_head_dim"),
        "qk_rope_head_dim": _need(config, "qk_rope_head_dim"),
        "v_head_dim": _need(config, "v_head_dim"),
    }
    fields["head_size"] = fields["mla"]["qk_nope_head_dim"] + fields["mla"]["qk_rope_head_dim"]
    return fields


def _gpt_oss(config: Config) -> dict[str, Any]:
    fields = _llama_like(config)
    # gpt-oss's attention projections have biases (GptOssConfig's attention_bias defaults to
    # true), and so do its router and experts (transformers' GptOssTopKRouter, GptOssExperts).
    fields["qkv_bias"] = fields["out_bias"] = True
    fields["moe"] = {**fields["moe"], "expert_bias": True}
    return fields


def _opt(config: Config) -> dict[str, Any]:
    hidden = _need(config, "hidden_size")
    if config.get("word_embed_proj_dim", hidden) != hidden:
        raise ScenarioError("model.hf_config: word_embed_proj_dim differs from hidden_size "
                            "(OPT-350m's projection), which is not modelled")
    return {
        "num_layers": _need(config, "num_hidden_layers"),
        "hidden_size": hidden,
        "num_heads": _need(config, "num_attention_heads"),
        "intermediate_size": _need(config, "ffn_dim"),
        "vocab_size": _need(config, "vocab_size"),
        # OPT's learned position table has two extra rows (an offset of 2).
        "max_seq_len": int(_need(config, "max_position_embeddings")),
        "positional": "learned",
        "tied_embeddings": bool(config.get("tie_word_embeddings", True)),
        "bias": bool(config.get("enable_bias", True)),
    }


def _gpt2(config: Config) -> dict[str, Any]:
    hidden = _need(config, "n_embd", "hidden_size")
    return {
        "num_layers": _need(config, "n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "num_heads": _need(config, "n_head", "num_attention_heads"),
        "intermediate_size": _present_or(config, "n_inner", 4 * hidden),
        "vocab_size": _need(config, "vocab_size"),
        "max_seq_len": _need(config, "n_positions", "max_position_embeddings"),
        "positional": "learned",
        "tied_embeddings": True,
        "bias": True,
    }


READERS: dict[str, Callable[[Config], dict[str, Any]]] = {
    **{family: _llama_like for family in LLAMA_LIKE},
    "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
    "gpt_oss": _gpt_oss,
    "opt": _opt, "gpt2": _gpt2,
}

# Fields that change the cost, with when they are harmless (absent, null, or switched off).
UNMODELLED: dict[str, Callable[[Config], bool]] = {
    "vision_config": lambda c: False,
    "attention_chunk_size": lambda c: c.get("attention_chunk_size") is None,
}


def resolve_hf_model(value: dict[str, Any]) -> dict[str, Any]:
    """`{hf_config: path, ...}`: the config's fields, with any other keys given overriding
    them (say, `dtype_bytes` or `name`). The path (a config.json, or the model's folder
    holding one) is looked up as data paths are."""
    from orcasim.paths import resolve_data_path

    rest = {k: v for k, v in value.items() if k != "hf_config"}
    try:
        # A downloaded model's folder stands for its config.json.
        path = resolve_data_path(str(value["hf_config"]), inside="config.json")
    except FileNotFoundError as e:
        raise ScenarioError(f"model.hf_config = {value['hf_config']!r}: {e}") from None
    return {**model_fields_from_hf(path, frozenset(rest)), **rest}
