"""Operator shapes, FLOPs per token, the figures `orcasim model` prints and the config
readers' less common paths, each checked against numbers worked out by hand (what the
mutation run found unpinned in the cost models)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orcasim.config import ScenarioError
from orcasim.cost.base import Batch
from orcasim.cost.catalog import (
    Deployment,
    HardwareConfig,
    ModelSpec,
    model_figures,
    model_from_argument,
)
from orcasim.cost.flops import token_ops
from orcasim.cost.roofline import Roofline, RooflineCostConfig


def hf(name: str, **extra: object) -> ModelSpec:
    return ModelSpec.model_validate({"hf_config": f"hf_configs/{name}/config.json", **extra})


def write_config(tmp_path: Path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("weight_bytes", [2, 1])
def test_latent_attention_operators_by_hand(weight_bytes: int) -> None:
    """DeepSeek-V3 on 8 GPUs: 16 query heads a rank; (flops, weight bytes, activation bytes)
    per token of every projection in the absorbed form, in bf16 and with fp8 weights."""
    model = hf("deepseek-v3", weight_dtype="fp8" if weight_bytes == 1 else None)
    ops = {op.name: op for op in token_ops(model, 8) if op.name.startswith(("mla", "attn"))}
    d, heads, w, a = 7168, 16, weight_bytes, 2

    def matmul(k: int, m: int) -> tuple[float, float, float]:
        return 2 * k * m, k * m * w, (k + m) * a

    def per_head(k: int, m: int) -> tuple[float, float, float]:
        return 2 * heads * k * m, heads * k * m * w, heads * (k + m) * a

    expected = {
        "mla_q_down": matmul(d, 1536), "mla_q_up": matmul(1536, heads * 192),
        "mla_kv_down": matmul(d, 576), "mla_q_absorb": per_head(128, 512), "mla_v_up": per_head(512, 128),
        "attn_rope": (8 * 17 * 64, 0, 2 * 17 * 64 * a), "attn_post_proj": matmul(heads * 128, d),
    }
    assert list(ops) == list(expected)
    for name, (flops, weights, activations) in expected.items():
        op = ops[name]
        assert (op.flops_per_token, op.weight_bytes, op.bytes_per_token) == (flops, weights, activations), name


def test_latent_attention_without_a_query_latent_projects_queries_directly(tmp_path: Path) -> None:
    config = json.loads(Path("orcasim/data/hf_configs/deepseek-v3/config.json").read_text())
    model = model_from_argument(write_config(tmp_path, {**config, "q_lora_rank": None}))
    names = [op.name for op in token_ops(model, 1)]
    assert "mla_q_down" not in names and "mla_q_up" not in names
    q_proj = next(op for op in token_ops(model, 1) if op.name == "mla_q_proj")
    assert q_proj.flops_per_token == 2 * 7168 * 128 * 192


def test_flops_per_token_by_hand() -> None:
    """2 FLOPs a weight one token uses, plus attention over its context: MLA per query head
    over (nope + rope) for QK and v for AV; a window caps its layers' keys."""
    deepseek = hf("deepseek-v3")
    weights = sum(deepseek.layer_params(i, active=True) for i in range(61)) + 129280 * 7168
    for context in (0, 1000):
        assert deepseek.flops_per_token(context) == 2.0 * weights + 2 * 61 * context * 128 * (128 + 64 + 128)
    oss = hf("gpt-oss-20b")
    weights = sum(oss.layer_params(i, active=True) for i in range(24)) + 201088 * 2880
    for context in (50, 1000):
        keys = 12 * context + 12 * min(context, 128)
        assert oss.flops_per_token(context) == 2.0 * weights + 4 * keys * 64 * 64


def test_the_model_commands_figures_by_hand() -> None:
    """Llama-3-70B on 8 H100s: what `orcasim model llama3-70b --gpu h100-80gb
    --tensor-parallel 8` prints, from the catalog name."""
    model = model_from_argument("llama3-70b")
    assert model.name == "llama3-70b"
    hw = HardwareConfig(gpu="h100-80gb", tensor_parallel=8)
    figures = model_figures(model, hw)
    params = model.param_count()
    kv_per_gpu = 2 * 80 * 1 * 128 * 2  # one KV head a rank
    free = 80e9 * 0.9 - 1024**3 - params * 2 / 8
    assert figures == {
        "parameters": params, "active_parameters": params, "weight_bytes": params * 2,
        "kv_bytes_per_token": 2 * 80 * 8 * 128 * 2,
        "flops_per_token_at_context_1": model.flops_per_token(1),
        "flops_per_token_at_context_4096": model.flops_per_token(4096),
        "gpus": 8, "weight_bytes_per_gpu": params * 2 / 8, "kv_bytes_per_token_per_gpu": kv_per_gpu,
        "kv_capacity_tokens": free // kv_per_gpu,
    }
    assert set(model_figures(model)) == set(list(figures)[:6])  # no deployment: no per-GPU figures


def test_opt_and_gpt2_configs_read_their_own_fields_and_defaults(tmp_path: Path) -> None:
    opt = {"model_type": "opt", "hidden_size": 512, "ffn_dim": 2048, "num_attention_heads": 8,
           "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 256}
    model = model_from_argument(write_config(tmp_path, opt))  # OPT's defaults: tied, biases
    assert (model.tied_embeddings, model.bias, model.intermediate_size) == (True, True, 2048)
    model = model_from_argument(write_config(tmp_path, {**opt, "enable_bias": False,
                                                        "tie_word_embeddings": False}))
    assert (model.tied_embeddings, model.bias) == (False, False)
    with pytest.raises(ScenarioError, match="word_embed_proj_dim differs from hidden_size"):
        model_from_argument(write_config(tmp_path, {**opt, "word_embed_proj_dim": 256}))
    # GPT-2 under the names newer configs use, with its MLP width given.
    gpt2 = {"model_type": "gpt2", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 3,
            "max_position_embeddings": 128, "vocab_size": 500, "n_inner": 100}
    model = model_from_argument(write_config(tmp_path, gpt2))
    assert (model.hidden_size, model.num_heads, model.num_layers, model.max_seq_len,
            model.intermediate_size) == (64, 4, 3, 128, 100)
    assert model_from_argument(write_config(tmp_path, {**gpt2, "n_inner": None})).intermediate_size == 256


@pytest.mark.parametrize(("model", "hardware"), [
    (ModelSpec.model_validate({"hf_config": "hf_configs/llama-3.1-70b/config.json"}), {"tensor_parallel": 8}),
    (ModelSpec.model_validate({"hf_config": "hf_configs/deepseek-v3/config.json", "weight_dtype": "fp8"}),
     {"tensor_parallel": 8}),
    (ModelSpec.model_validate({"hf_config": "hf_configs/gpt-oss-20b/config.json"}), {"tensor_parallel": 4}),
    (ModelSpec.model_validate({"hf_config": "hf_configs/deepseek-v3/config.json", "weight_dtype": "fp8"}),
     {"data_parallel_attention": 16, "expert_parallel": 16}),
])
def test_a_batch_given_as_lists_costs_what_the_arrays_cost(model: ModelSpec, hardware: dict) -> None:
    """The fused Orca loop prices lists; reference mode prices arrays: the same bits."""
    hw = HardwareConfig.model_validate({"gpu": "h200", **hardware})
    cost = Roofline(RooflineCostConfig(kind="roofline"), Deployment(model=model, hardware=hw))
    rng = np.random.default_rng(1)
    for _ in range(60):
        size = int(rng.integers(1, 40))
        query = np.where(rng.random(size) < 0.7, 1, rng.integers(1, 2000, size)).astype(np.int64)
        context = query + rng.integers(0, 3000, size)
        lists = cost.iteration_time_lists_s(query.tolist(), context.tolist(), int(query.sum()),
                                            int(context.sum()))
        assert lists == cost.iteration_time_s(Batch(query, context))
