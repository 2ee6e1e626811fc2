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
from orcasim.cost.flops import (
    attention_constants,
    attention_flops_bytes,
    prefill_attention_constants,
    token_ops,
)
from orcasim.cost.roofline import Roofline, RooflineCostConfig

# A Llama-family config small enough to read by hand (the config readers' tests vary it).
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
              "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64}


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
    norms = 80 * 2 * 8192 + 8192  # whole on every rank, as vLLM keeps them
    weights = (params - norms) * 2 / 8 + norms * 2
    free = 85.03e9 * 0.9 - 1024**3 - weights  # the 79.19 GiB an H100 reports
    assert figures == {
        "parameters": params, "active_parameters": params, "weight_bytes": params * 2,
        "kv_bytes_per_token": 2 * 80 * 8 * 128 * 2,
        "flops_per_token_at_context_1": model.flops_per_token(1),
        "flops_per_token_at_context_4096": model.flops_per_token(4096),
        "gpus": 8, "weight_bytes_per_gpu": weights, "kv_bytes_per_token_per_gpu": kv_per_gpu,
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
    with pytest.raises(ScenarioError, match=r"^model.hf_config: word_embed_proj_dim differs from hidden_size \(OPT-350m's projection\), "
                                               r"which is not modelled$"):
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


@pytest.mark.parametrize(("name", "gpu"), [("deepseek-v3", "h200"), ("llama-3.1-70b", "h200"),
                                           ("opt-13b", "a100-80gb")])
def test_a_batch_of_decodes_then_prompts_given_as_lists_costs_what_the_arrays_cost(
    name: str, gpu: str
) -> None:
    """A scheduler's usual batch, its running requests' decodes first (which the lists price
    without a test each when all are below `decode_memory_below_tokens`), then prompts; and
    the same with a decode past the bound (MLA's), or a one-token prompt among them."""
    model = ModelSpec.model_validate({"hf_config": f"hf_configs/{name}/config.json"})
    cost = Roofline(RooflineCostConfig(kind="roofline"),
                    Deployment(model=model, hardware=HardwareConfig.model_validate({"gpu": gpu})))
    rng = np.random.default_rng(2)
    for _ in range(80):
        decodes, prompts = int(rng.integers(0, 40)), int(rng.integers(0, 4))
        query = np.concatenate([np.ones(decodes), rng.integers(1, 2000, prompts)]).astype(np.int64)
        context = query + rng.integers(0, int(rng.choice([300, 3000])), decodes + prompts)
        lists = cost.iteration_time_lists_s(query.tolist(), context.tolist(), int(query.sum()),
                                            int(context.sum()))
        assert lists == cost.iteration_time_s(Batch(query, context))


@pytest.mark.parametrize(("name", "gpu"), [("deepseek-v3", "a100-80gb"), ("deepseek-v3", "h200"),
                                           ("llama-3.1-70b", "h200"), ("opt-13b", "a100-80gb")])
def test_a_decode_term_priced_as_memory_bound_has_the_bits_of_the_roofline_max(name: str, gpu: str) -> None:
    """The lists' shortcut for decodes (the memory side alone, below
    `decode_memory_below_tokens`) gives the bits `max(compute, memory)` gives, one request at
    a time, at contexts around the bound and, for MLA's low ridge, on both sides of it."""
    model = ModelSpec.model_validate({"hf_config": f"hf_configs/{name}/config.json"})
    hw = HardwareConfig.model_validate({"gpu": gpu})
    terms = Roofline(RooflineCostConfig(kind="roofline"), Deployment(model=model, hardware=hw))._attention
    bound = terms.decode_memory_below_tokens
    assert bound == min(terms.ridge_tokens * (1 - 1e-6), 1e6 * terms.query_bytes / terms.kv_bytes)
    around = [int(bound) + d for d in range(-40, 41)] + [1, 2, 16, 4095]
    for context in around:
        one, c = np.array([1]), np.array([context])
        assert terms.per_layer_lists_s([1], [context]) == terms.per_layer_s(one, c), context
    compute_bound = [c for c in around if c > terms.ridge_tokens]
    assert bool(compute_bound) == (name == "deepseek-v3")  # MLA: decodes past 301-713 tokens


# --- communication, experts and the host under parallelism, by hand -------------------------

NVLINK_H200_S_PER_BYTE = 1 / (900e9 / 2 * 0.8)  # one direction of NVLink at the roofline's 80%
LATENCY_S = 1e-5


def _h200(model: ModelSpec, **hardware: object) -> Roofline:
    hw = HardwareConfig.model_validate({"gpu": "h200", **hardware})
    return Roofline(RooflineCostConfig(kind="roofline"), Deployment(model=model, hardware=hw))


def test_tensor_parallel_all_reduces_by_hand() -> None:
    """Two all-reduces of N x hidden a layer (DeepSeek-V3, TP 8, 61 layers); with 4
    data-parallel groups of 2 GPUs, a group's N/4 tokens, and a MoE layer's second all-reduce
    becomes its experts' combine: 61 + 3 dense layers' all-reduces."""
    model = hf("deepseek-v3", weight_dtype="fp8")
    tokens, row_bytes = 1000, 7168 * 2
    tp8 = _h200(model, tensor_parallel=8)
    ring8 = LATENCY_S + 2 * 7 / 8 * tokens * row_bytes * NVLINK_H200_S_PER_BYTE
    assert float(tp8.tp_all_reduce_s(tokens)) == pytest.approx(122 * ring8, rel=1e-12)
    groups = _h200(model, tensor_parallel=2, data_parallel_attention=4, expert_parallel=8)
    ring2 = LATENCY_S + 2 * 1 / 2 * tokens / 4 * row_bytes * NVLINK_H200_S_PER_BYTE
    assert float(groups.tp_all_reduce_s(tokens)) == pytest.approx((61 + 3) * ring2, rel=1e-12)
    assert float(tp8.expert_all_to_all_s(tokens)) == 0.0  # every rank holds every token
    assert float(groups.expert_all_to_all_s(tokens)) > 0.0


def test_pipeline_stages_send_their_activations_by_hand() -> None:
    model = model_from_argument("llama3-70b")
    two = _h200(model, tensor_parallel=2, pipeline_parallel=2)
    send = LATENCY_S + 512 * 8192 * 2 * NVLINK_H200_S_PER_BYTE
    assert float(two.pipeline_sends_s(512)) == pytest.approx(send, rel=1e-12)
    assert float(_h200(model, tensor_parallel=2).pipeline_sends_s(512)) == 0.0
    # A lone GPU pays no collective at all; two stages do, on the scalar path as on numpy's.
    one = _h200(model)
    assert one._fixed_one_s(512, 4) == float(one._fixed_s(512, 4))
    assert two._fixed_one_s(512, 4) == pytest.approx(float(two._fixed_s(512, 4)), rel=1e-15)
    assert two._fixed_one_s(512, 4) > _h200(model, tensor_parallel=2)._fixed_one_s(512, 4)


def test_a_data_parallel_groups_ends_see_its_share() -> None:
    """The embedding gathers a group's N/DP tokens, the LM head its B/DP requests."""
    model = hf("deepseek-v3", weight_dtype="fp8")
    cost = _h200(model, data_parallel_attention=8, expert_parallel=8)
    tokens, requests = 4096.0, 64.0
    expected = (cost._layers_s(tokens) + cost.op_time_s(cost.embedding, tokens / 8)
                + cost.op_time_s(cost.lm_head, requests / 8) + cost.tp_all_reduce_s(tokens)
                + cost.pipeline_sends_s(tokens / 8) + cost.expert_all_to_all_s(tokens))
    assert float(cost._fixed_s(tokens, requests)) == float(expected)
    assert float(cost._fixed_s(tokens, requests)) > float(cost._layers_s(tokens) + cost.expert_all_to_all_s(tokens))


@pytest.mark.parametrize("tokens", [1.0, 16.0, 8192.0])
def test_a_moe_layers_experts_by_hand(tokens: float) -> None:
    """Qwen3-30B-A3B on one H100 (no shared experts): the router, then the experts'
    max(FLOPs, bytes) and three kernels. One token reads 8 experts' weights (memory-bound);
    8,192 tokens run 65,536 expert passes (compute-bound)."""
    model = hf("qwen3-30b-a3b")
    cost = Roofline(RooflineCostConfig(kind="roofline"),
                    Deployment(model=model, hardware=HardwareConfig(gpu="h100-80gb")))
    d, width, k, experts = 2048, 768, 8, 128
    flops = 2 * 3 * d * width * k * tokens
    hit = experts * (1 - (1 - k / experts) ** tokens)
    pair_bytes = (d + 6 * width + d) * 2
    memory = (hit * 3 * d * width * 2 + pair_bytes * k * tokens) / (3.35e12 * 0.8)
    ops = sum(op.count * float(cost.op_time_s(op, tokens)) for op in cost.moe_ops)
    expected = ops + max(flops / (989.4e12 * 0.7), memory) + 3 * 5e-6
    assert float(cost.moe_layer_extra_s(tokens)) == pytest.approx(expected, rel=1e-12)
    assert (flops / (989.4e12 * 0.7) > memory) == (tokens > 1000)


def test_data_parallel_hosts_by_hand() -> None:
    """Four groups, one GPU each: the multi-process term applies, and a group's host handles
    its quarter of the sequences and of the prompt tokens, or, where more, the group running
    the largest prompt does that request's own (a 2-token prompt counts)."""
    from orcasim.cost.linear import LinearCost, LinearCostConfig
    from orcasim.cost.overhead import OverheadConfig, OverheadCost

    cfg = OverheadConfig(per_iteration_s=1e-3, per_sequence_s=1e-4, per_prefill_token_s=1e-5,
                         tensor_parallel_per_iteration_s=7e-3)
    gpu = LinearCost(LinearCostConfig(kind="linear", base_s=0.01))
    cost = OverheadCost(gpu, cfg, None, tensor_parallel=1, data_parallel=4)
    query, context = [2, 1, 1, 1], [2, 50, 60, 70]
    # A quarter is 1e-4 + 0.5e-5; the prompt's group has its sequence and both tokens.
    host_s = 1e-3 + 7e-3 + 1e-4 + 2 * 1e-5
    batch = Batch(np.array(query, dtype=np.int64), np.array(context, dtype=np.int64))
    assert cost.iteration_time_s(batch) == pytest.approx(0.01 + host_s, rel=1e-12)
    assert cost.iteration_time_lists_s(query, context, 5, 182) == pytest.approx(0.01 + host_s, rel=1e-12)
    assert cost.host_units(4, 2, 2) == (1.0, 2.0)
    # Eight decodes: two sequences a group, above any one request's.
    assert cost.iteration_time_lists_s([1] * 8, [9] * 8, 8, 72) == pytest.approx(
        0.01 + 1e-3 + 7e-3 + 8 / 4 * 1e-4, rel=1e-12)
    assert cost.host_units(8, 0, 0) == (2.0, 0.0)
    empty = np.zeros(0, dtype=np.int64)
    assert cost.iteration_time_s(Batch(empty, empty)) == 0.0
    assert cost.iteration_time_lists_s([], [], 0, 0) == 0.0
    # No requests, no host work: the GPU model's own steps pass through.
    np.testing.assert_array_equal(cost.decode_steps_s(empty, 3), gpu.decode_steps_s(empty, 3))
    # Two decodes: half a sequence a group balanced, but each group that has one runs it whole.
    steps = cost.decode_steps_s(np.array([10, 20]), 2)
    assert steps[0] == pytest.approx(0.01 + 1e-3 + 7e-3 + 1e-4, rel=1e-12)
    # One host on top of another is not a plain line: no closed form.
    assert OverheadCost(cost, cfg, None, tensor_parallel=1).decode_line(2, 30) is None


def test_parameter_counts_of_small_models_by_hand() -> None:
    """Every term of the count on shapes small enough to add up by hand."""
    # GPT-style: learned positions, biases everywhere, a plain (ungated) MLP of 4d.
    gpt = ModelSpec(num_layers=2, hidden_size=8, num_heads=2, vocab_size=10, max_seq_len=16)
    attention = 8 * 24 + 8 * 8 + 24 + 8  # QKV and output weights, their biases
    mlp = 2 * 8 * 32 + 32 + 8  # up and down, their biases
    norms = 2 * 8 * 2  # two layer norms, gain and bias
    assert gpt.layer_params() == attention + mlp + norms
    assert gpt.embedding_params() == 10 * 8 + 16 * 8 + 8 * 2  # tied head, positions, final norm
    assert gpt.param_count() == 2 * gpt.layer_params() + gpt.embedding_params()
    assert gpt.routed_expert_params() == 0
    # Gated MLP with biases: the fused gate-and-up bias is twice the width.
    gated = gpt.model_copy(update={"gated_mlp": True, "intermediate_size": 4})
    assert gated.mlp_params(0) == 3 * 8 * 4 + 2 * 4 + 8
    # RoPE without biases: no position table, RMS norms with a gain only.
    rope = gpt.model_copy(update={"positional": "rope", "bias": False, "tied_embeddings": False})
    assert rope.embedding_params() == 2 * 10 * 8 + 8
    assert rope.layer_params() == 8 * 24 + 8 * 8 + 2 * 8 * 32 + 2 * 8


def test_latent_attention_parameters_by_hand() -> None:
    model = hf("deepseek-v3")
    d, heads = 7168, 128
    q = d * 1536 + 1536 + 1536 * heads * 192  # down, its norm, up
    kv = d * (512 + 64) + 512 + 512 * heads * (128 + 128)  # down, its norm, up to K-nope and V
    assert model.attention_params() == q + kv + heads * 128 * d
    direct = model.model_copy(update={"mla": model.mla.model_copy(update={"q_lora_rank": None})})
    assert direct.attention_params() == d * heads * 192 + kv + heads * 128 * d
    assert model.layer_params(0) - model.attention_params() - model.mlp_params(0) == 2 * d


def test_config_readers_fix_what_a_family_implies(tmp_path: Path) -> None:
    """DeepSeek: every query head reads the shared latent, head size nope + rope; gpt-oss:
    biased attention projections; a quantization_config that is not a table is refused."""
    config = json.loads(Path("orcasim/data/hf_configs/deepseek-v3/config.json").read_text())
    model = model_from_argument(write_config(tmp_path, {**config, "num_key_value_heads": 1}))
    assert (model.kv_heads, model.head_dim) == (128, 192)
    assert hf("gpt-oss-20b").qkv_bias is True
    with pytest.raises(ScenarioError, match="quant_method = None is not modelled"):
        model_from_argument(write_config(tmp_path, {**config, "quantization_config": "fp8"}))


def test_deployment_limits_are_inclusive_and_name_their_place() -> None:
    from orcasim.cost.catalog import check_deployment

    model = ModelSpec(name="tiny", num_layers=4, hidden_size=64, num_heads=4, max_seq_len=128)
    check_deployment(model, HardwareConfig(gpu="h200", pipeline_parallel=4), 128)  # both at the limit
    with pytest.raises(ScenarioError, match=r"^workload.max_tokens = 129 exceeds model tiny's context"):
        check_deployment(model, None, 129)
    with pytest.raises(ScenarioError, match=r"^systems\[0\].hardware.pipeline_parallel = 5 exceeds tiny's 4 layers; "
                                            "expected at most 4"):
        check_deployment(model, HardwareConfig(gpu="h200", pipeline_parallel=5), 1, "systems[0].")
    with pytest.raises(ScenarioError, match=r"^x.hardware.tensor_parallel = 3 does not divide tiny's 4"):
        check_deployment(model, HardwareConfig(gpu="h200", tensor_parallel=3), 1, "x.")
    for hardware, key in (({"data_parallel_attention": 2, "expert_parallel": 2}, "expert_parallel = 2"),
                          ({"tensor_parallel": 2, "data_parallel_attention": 2, "expert_parallel": 4},
                           "expert_parallel = 4")):
        with pytest.raises(ScenarioError, match=rf"^y.hardware.{key} needs a mixture-of-experts model"):
            check_deployment(model, HardwareConfig.model_validate({"gpu": "h200", **hardware}), 1, "y.")


# --- per-layer operators and attention constants, by hand ------------------------------------

def _op_table(model: ModelSpec, tp: int, moe_layer: bool = False) -> dict[str, tuple[float, float, float, int]]:
    return {op.name: (op.flops_per_token, op.weight_bytes, op.bytes_per_token, op.count)
            for op in token_ops(model, tp, moe_layer=moe_layer)}


def test_a_dense_layers_operators_by_hand() -> None:
    """Llama-3-70B on 8 GPUs: 8 query heads and 1 KV head a rank, head 128, SwiGLU width
    28,672 / 8, RoPE on Q and K, no biases; two residual adds."""
    model = model_from_argument("llama3-70b")
    d, q, kv, hd, f = 8192, 8, 1, 128, 28672 // 8
    qkv = (q + 2 * kv) * hd
    assert _op_table(model, 8) == {
        "input_layernorm": (8 * d, 0, 2 * d * 2, 1),
        "attn_pre_proj": (2 * d * qkv, d * qkv * 2, (d + qkv) * 2, 1),
        "attn_rope": (8 * (q + kv) * hd, 0, 2 * (q + kv) * hd * 2, 1),
        "attn_post_proj": (2 * q * hd * d, q * hd * d * 2, (q * hd + d) * 2, 1),
        "post_attention_layernorm": (8 * d, 0, 2 * d * 2, 1),
        "mlp_up_proj": (2 * d * 2 * f, d * 2 * f * 2, (d + 2 * f) * 2, 1),
        "mlp_act": (8 * f, 0, (2 * f + f) * 2, 1),
        "mlp_down_proj": (2 * f * d, f * d * 2, (f + d) * 2, 1),
        "add": (8 * d, 0, 3 * d * 2, 2),
    }


def test_biases_where_each_model_has_them() -> None:
    """OPT: biases on every projection and no RoPE; Qwen2: biases on Q, K and V only."""
    opt = _op_table(model_from_argument("opt-13b"), 1)
    d = 5120
    assert "attn_rope" not in opt
    assert opt["attn_pre_proj"][1] == (d * 3 * d + 3 * d) * 2
    assert opt["attn_post_proj"][1] == (d * d + d) * 2
    assert opt["mlp_up_proj"][1] == (d * 4 * d + 4 * d) * 2
    qwen = _op_table(hf("qwen2-7b"), 1)
    d, qkv = 3584, (28 + 2 * 4) * 128
    assert qwen["attn_pre_proj"][1] == (d * qkv + qkv) * 2
    assert qwen["attn_post_proj"][1] == 28 * 128 * d * 2
    assert qwen["mlp_down_proj"][1] == 18944 * d * 2


def test_a_moe_layers_own_operators_by_hand() -> None:
    """DeepSeek-V3's MoE layer on 8 GPUs: a replicated router (7,168 x 256, no bias) and one
    shared SwiGLU expert of width 2,048 / 8; its routed experts are apart (ExpertOp)."""
    model = hf("deepseek-v3")
    table = _op_table(model, 8, moe_layer=True)
    d, width = 7168, 2048 // 8
    assert table["moe_router"] == (2 * d * 256, d * 256 * 2, (d + 256) * 2, 1)
    assert table["shared_expert_up_proj"] == (2 * d * 2 * width, d * 2 * width * 2, (d + 2 * width) * 2, 1)
    assert table["shared_expert_down_proj"][:2] == (2 * width * d, width * d * 2)
    assert not any(name.startswith("mlp_") for name in table)
    assert "moe_router" not in _op_table(model, 8)  # a dense layer of the same model


@pytest.mark.parametrize(("name", "tp", "kv_dtype", "expected"), [
    # (FLOPs per query-key pair, KV bytes per context token, bytes per query token)
    ("llama3-70b", 8, None, (4 * 128 * 8, 2 * 1 * 128 * 2, (2 * 8 * 128 + 2 * 128) * 2)),
    ("llama3-70b", 8, "fp8", (4 * 128 * 8, 2 * 1 * 128 * 1, 2 * 8 * 128 * 2 + 2 * 128 * 1)),
    ("deepseek-v3", 8, None, (16 * (2 * 576 + 2 * 512), 576 * 2, 16 * (576 + 512) * 2 + 576 * 2)),
    ("deepseek-v3", 8, "fp8", (16 * (2 * 576 + 2 * 512), 576 * 1, 16 * (576 + 512) * 2 + 576 * 1)),
])
def test_attention_constants_by_hand(name: str, tp: int, kv_dtype: str | None, expected: tuple) -> None:
    from orcasim.cost.flops import attention_constants

    base = model_from_argument(name) if name == "llama3-70b" else hf(name)
    model = base.model_copy(update={"kv_cache_dtype": kv_dtype})
    assert attention_constants(model, tp) == expected


def test_latent_attention_prefills_in_the_compute_friendly_form_and_decodes_absorbed() -> None:
    """vLLM decodes MLA in the absorbed form (attention over the 576-wide latent) but runs a
    prefill, or a prefill chunk, in the compute-friendly one (vllm/v1/attention/backends/mla/
    common.py, `_forward_prefill`; SGLang likewise): the latent up-projected to each head's
    K and V, multi-head attention over 128 + 64 dims for QK^T and 128 for AV, and a chunk
    re-projects its cached context. Every request was priced absorbed: 278,528 FLOPs a
    query-key pair on DeepSeek-V3's 128 heads where vLLM's prefill does 81,920, a 4,096-token
    prompt's attention 3.4 times what it costs. DeepSeek-V3 at TP 8, 16 heads a rank."""
    model, heads = hf("deepseek-v3"), 16
    absorbed, friendly = heads * (2 * 576 + 2 * 512), heads * (2 * 192 + 2 * 128)
    up = 2 * 512 * heads * (128 + 128)  # kv_b_proj: W_UK and W_UV, a cached context token
    assert prefill_attention_constants(model, 8) == (
        friendly, 576 * 2 + 2 * heads * (192 + 128) * 2, heads * (192 + 128) * 2 + 576 * 2, up)
    # A decode at 2,048; a 4,096-token prompt; a 512-token chunk after 7,680 cached tokens.
    query, context = np.array([1, 4096, 512]), np.array([2048, 4096, 8192])
    flops, _ = attention_flops_bytes(model, 8, query, context)
    assert flops.tolist() == [absorbed * 2048, friendly * 4096 * 4097 / 2,
                              friendly * (512 * 7680 + 512 * 513 / 2) + up * 7680]
    # The roofline prices each so, in arrays, lists and the formula alike; the prompt is
    # compute-bound at 70% of the H200's bf16 peak, a kernel launch on top.
    cost = _h200(model, tensor_parallel=8)
    formula = float(cost.attention_per_layer_s(query, context))
    assert cost._attention.per_layer_s(query, context) == formula
    assert cost._attention.per_layer_lists_s(query.tolist(), context.tolist()) == formula
    prompt_s = float(cost.attention_per_layer_s(query[1:2], context[1:2]))
    assert prompt_s == pytest.approx(friendly * 4096 * 4097 / 2 / (989.4e12 * 0.7) + 5e-6, rel=1e-12)
    # A dense model's prefill is its decode's constants, nothing added.
    llama = model_from_argument("llama3-70b")
    assert prefill_attention_constants(llama, 8) == (*attention_constants(llama, 8), 0.0)


def test_expert_layouts_in_each_familys_words(tmp_path: Path) -> None:
    """Qwen2-MoE: a shared expert of its own width, MoE every `decoder_sparse_step` layers
    unless listed in mlp_only_layers; DeepSeek: n_shared_experts of the expert width, dense
    before first_k_dense_replace and off the moe_layer_freq; gpt-oss names top-k its way."""
    qwen = {"model_type": "qwen2_moe", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 6,
            "intermediate_size": 256, "vocab_size": 100, "max_position_embeddings": 64, "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    moe = model_from_argument(write_config(tmp_path, qwen)).moe
    assert moe is not None and (moe.dense_layers, moe.shared_intermediate_size) == ([], 0)
    moe = model_from_argument(write_config(tmp_path, {**qwen, "decoder_sparse_step": 2, "mlp_only_layers": [1],
                                                      "shared_expert_intermediate_size": 96})).moe
    assert moe is not None and (moe.dense_layers, moe.shared_intermediate_size) == ([0, 1, 2, 4], 96)
    deepseek = {**qwen, "model_type": "deepseek_v2", "n_routed_experts": 8, "num_experts": None,
                "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8}
    moe = model_from_argument(write_config(tmp_path, deepseek)).moe
    assert moe is not None and (moe.dense_layers, moe.shared_intermediate_size) == ([], 0)
    moe = model_from_argument(write_config(tmp_path, {**deepseek, "first_k_dense_replace": 1, "moe_layer_freq": 2,
                                                      "n_shared_experts": 2})).moe
    assert moe is not None and (moe.dense_layers, moe.shared_intermediate_size) == ([0, 1, 3, 5], 64)
    oss = {**qwen, "model_type": "gpt_oss", "num_local_experts": 8, "num_experts": None,
           "num_experts_per_tok": None, "experts_per_token": 3}
    moe = model_from_argument(write_config(tmp_path, oss)).moe
    assert moe is not None and (moe.experts_per_token, moe.num_experts, moe.dense_layers) == (3, 8, [])


def test_the_ends_of_the_model_by_hand() -> None:
    """The LM head (a rank's share of the vocabulary, for one token a request) and the
    embedding gather (a learned position row too, for GPT-2)."""
    llama = model_from_argument("llama3-70b")
    from orcasim.cost.flops import embedding_op, lm_head_op

    head = lm_head_op(llama, 8)
    vocab = 128256 / 8
    assert (head.name, head.flops_per_token, head.weight_bytes, head.bytes_per_token) == (
        "lm_head", 2.0 * 8192 * vocab + 8 * 8192, 8192 * vocab * 2, (2 * 8192 + vocab) * 2)
    # The LM head stays in bf16 under fp8 weights (vLLM's Fp8Config quantizes linear layers only).
    assert lm_head_op(hf("llama-3.1-70b", weight_dtype="fp8"), 8).weight_bytes == 128256 * 8192 * 2 / 8
    emb = embedding_op(llama)
    assert (emb.name, emb.flops_per_token, emb.weight_bytes, emb.bytes_per_token) == ("emb", 0.0, 0.0, 2 * 8192 * 2)
    assert embedding_op(hf("gpt2")).bytes_per_token == 3 * 768 * 2  # token row, position row, output


def test_fractional_attention_constants_take_the_exact_fallback() -> None:
    """A KV cache in mxfp4 (0.53 bytes a value) of heads of 15 makes the per-token constants
    fractional: the whole-number shortcut steps aside and lists, arrays and the formula agree."""
    model = ModelSpec(num_layers=2, hidden_size=60, num_heads=4, kv_cache_dtype="mxfp4")
    cost = _h200(model)
    assert not cost._attention.whole
    query, context = np.array([1, 1, 300]), np.array([500, 70, 300])
    formula = float(cost.attention_per_layer_s(query, context))
    assert cost._attention.per_layer_s(query, context) == formula
    assert cost._attention.per_layer_lists_s(query.tolist(), context.tolist()) == formula
    assert _h200(model_from_argument("llama3-70b"), tensor_parallel=8)._attention.whole


def test_config_defaults_and_names(tmp_path: Path) -> None:
    """Llama-family embeddings are untied unless the config says so; Qwen2-MoE biases its
    Q, K, V like Qwen2; a model is named by _name_or_path, else its folder; a bad file is
    named in the error."""
    base = TINY_LLAMA
    folder = tmp_path / "my-model"
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(base))
    model = model_from_argument(str(path))
    assert (model.tied_embeddings, model.qkv_bias, model.name) == (False, None, "my-model")
    path.write_text(json.dumps({**base, "tie_word_embeddings": True, "_name_or_path": "org/tiny"}))
    assert (model_from_argument(str(path)).tied_embeddings, model_from_argument(str(path)).name) == (True, "org/tiny")
    # (with its experts: a qwen2_moe config without their count or width is refused)
    path.write_text(json.dumps({**base, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 32}))
    assert model_from_argument(str(path)).qkv_bias is True
    path.write_text("{not json")
    with pytest.raises(ScenarioError, match=f"model.hf_config = '{path}': cannot read it as JSON"):
        model_from_argument(str(path))
    path.write_text(json.dumps({**base, "vision_config": {}}))
    with pytest.raises(ScenarioError, match=f"model.hf_config = '{path}': vision_config"):
        model_from_argument(str(path))


# --- what the second cost run found unpinned (2026-12-01) -------------------------------------

def test_every_projection_reads_its_weights_at_their_own_precision(tmp_path: Path) -> None:
    """fp8 weights under bf16 activations: each projection reads half the weight bytes of
    bf16 and the same FLOPs and activation bytes; OPT's down projection keeps its bias."""
    for name in ("llama3-70b", "opt-13b"):
        bf16 = _op_table(model_from_argument(name), 1)
        fp8 = _op_table(model_from_argument(name).model_copy(update={"weight_dtype": "fp8"}), 1)
        assert list(fp8) == list(bf16)
        for op, (flops, weights, activations, count) in bf16.items():
            assert fp8[op] == (flops, weights / 2, activations, count), (name, op)
    d = 5120
    assert _op_table(model_from_argument("opt-13b"), 1)["mlp_down_proj"][1] == (4 * d * d + d) * 2
    # DeepSeek's router, in bf16 under fp8 weights (vLLM builds its gate with
    # quant_config=None), and MLA without a query latent (DeepSeek-V2-Lite's shape): one
    # projection of the hidden state to every head's query, no bias.
    assert _op_table(hf("deepseek-v3", weight_dtype="fp8"), 8, moe_layer=True)["moe_router"][1] == 7168 * 256 * 2
    config = json.loads(Path("orcasim/data/hf_configs/deepseek-v3/config.json").read_text())
    direct = model_from_argument(write_config(tmp_path, {**config, "q_lora_rank": None}))
    q_proj = {op.name: op for op in token_ops(direct.model_copy(update={"weight_dtype": "fp8"}), 8)}["mla_q_proj"]
    heads, qk = 128 // 8, 128 + 64
    assert (q_proj.flops_per_token, q_proj.weight_bytes, q_proj.bytes_per_token) == (
        2 * 7168 * heads * qk, 7168 * heads * qk * 1, (7168 + heads * qk) * 2)


def test_a_dense_layers_operators_run_in_the_layers_order() -> None:
    assert list(_op_table(model_from_argument("llama3-70b"), 8)) == [
        "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
        "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add"]


def test_a_moe_models_dense_and_moe_layers_run_their_own_operators() -> None:
    """DeepSeek-V3's three dense layers run a dense MLP; its MoE layers run the router and
    the shared expert, whose time `moe_layer_extra_s` adds to the routed experts'."""
    model = hf("deepseek-v3", weight_dtype="fp8")
    cost = _h200(model, tensor_parallel=8)
    assert [op.name for op in cost.ops] == [op.name for op in token_ops(model, 8, moe_layer=False)]
    assert "mlp_up_proj" in [op.name for op in cost.ops]
    moe_ops = token_ops(model, 8, moe_layer=True)
    assert [op.name for op in cost.moe_ops] == [op.name for op in moe_ops]
    assert "moe_router" in [op.name for op in cost.moe_ops]
    assert (cost.num_dense_layers, cost.num_moe_layers) == (3, 58)
    experts_only = _h200(model, tensor_parallel=8)
    experts_only.moe_ops = []
    own = sum(op.count * float(cost.op_time_s(op, 64.0)) for op in moe_ops)
    assert float(cost.moe_layer_extra_s(64.0)) == pytest.approx(
        float(experts_only.moe_layer_extra_s(64.0)) + own, rel=1e-12)


def test_one_expert_a_rank_is_hit_by_a_tokens_top_k_alone() -> None:
    """Mixtral over 8 data-parallel groups, EP 8: each rank holds one of the 8 experts, and
    N tokens miss it with probability (1 - 2/8)^N."""
    from orcasim.cost.flops import expert_op

    op = expert_op(model_from_argument("mixtral-8x7b"), 1, ep=8)
    assert op is not None and op.num_experts == 1
    n = np.array([1.0, 3.0])
    np.testing.assert_allclose(op.experts_hit(n), 1 - (1 - 2 / 8) ** n, rtol=1e-15)


def test_a_kv_cache_wider_than_the_activations_by_hand() -> None:
    """fp32 KV under bf16 activations: 4 bytes a cached value, 2 a query's."""
    from orcasim.cost.flops import attention_constants

    model = model_from_argument("llama3-70b").model_copy(update={"kv_cache_dtype": "fp32"})
    assert attention_constants(model, 8) == (4 * 128 * 8, 2 * 128 * 4, 2 * 8 * 128 * 2 + 2 * 128 * 4)


def test_expert_dispatch_moves_the_activations_precision_unless_the_experts_take_fp8() -> None:
    """Qwen3-30B-A3B in bf16 over 2 groups: dispatch and combine both move 2 bytes a value;
    DeepSeek-V3's fp8 experts take 1 byte a value in and give 2 back."""
    bf16 = _h200(hf("qwen3-30b-a3b"), data_parallel_attention=2, expert_parallel=2)
    assert bf16.dispatch_bytes_per_pair == bf16.combine_bytes_per_pair == 2048 * 2
    assert float(bf16.expert_dispatch_s(512)) == float(bf16.expert_combine_s(512))
    fp8 = _h200(hf("deepseek-v3", weight_dtype="fp8"), data_parallel_attention=8, expert_parallel=8)
    assert (fp8.dispatch_bytes_per_pair, fp8.combine_bytes_per_pair) == (7168, 7168 * 2)


def test_all_to_alls_come_only_with_data_parallel_attention() -> None:
    """Experts split by tensor and expert parallelism over the same GPUs: every rank already
    holds every token, so the all-reduce combines (no all-to-all). Two groups of one GPU
    each: the busiest rank's pairs, half of them to the other GPU of the node."""
    model = hf("qwen3-30b-a3b")
    tokens = np.array([1.0, 512.0])
    for layout in ({"tensor_parallel": 2, "expert_parallel": 2}, {"tensor_parallel": 2}, {}):
        cost = _h200(model, **layout)
        result = cost.expert_all_to_all_s(tokens)
        assert result.shape == (2,) and result.dtype == np.float64 and not result.any(), layout
    two = _h200(model, data_parallel_attention=2, expert_parallel=2)
    pairs = tokens * 8 / 2
    one_way = LATENCY_S + pairs * 2048 * 2 * (1 / 2) * NVLINK_H200_S_PER_BYTE
    np.testing.assert_allclose(two.expert_all_to_all_s(tokens), 48 * 2 * one_way, rtol=1e-12)


def test_a_collective_over_one_gpu_is_zero_of_the_messages_shape() -> None:
    from orcasim.cost.parallel import Link, all_to_all_s, ring_all_reduce_s

    link, sizes = Link(1e9, 1e-5), np.array([1e6, 2e6])
    for result in (ring_all_reduce_s(sizes, 1, link), all_to_all_s(sizes, 1, 8, link, link)):
        assert result.shape == (2,) and result.dtype == np.float64 and not result.any()
    # Two ranks: half the message crosses, on either collective's formula.
    np.testing.assert_allclose(all_to_all_s(sizes, 2, 8, link, link), 1e-5 + sizes / 2 / 1e9, rtol=1e-15)
    np.testing.assert_allclose(ring_all_reduce_s(sizes, 2, link), 1e-5 + sizes / 1e9, rtol=1e-15)
    sends = _h200(model_from_argument("llama3-70b")).pipeline_sends_s(np.array([1.0, 9.0]))
    assert sends.shape == (2,) and sends.dtype == np.float64 and not sends.any()


def test_a_tensor_parallel_group_wider_than_a_node_all_reduces_over_the_network() -> None:
    """TP 16 on 8-GPU H200 nodes: the ring runs at the network's 50 GB/s (80% of it),
    with the configured latency."""
    cost = _h200(model_from_argument("llama3-70b").model_copy(update={"num_heads": 64}), tensor_parallel=16)
    ring = LATENCY_S + 2 * 15 / 16 * 100 * 8192 * 2 / (50e9 * 0.8)
    assert float(cost.tp_all_reduce_s(100)) == pytest.approx(2 * 80 * ring, rel=1e-12)


@pytest.mark.parametrize("hardware", [{"tensor_parallel": 2}, {"pipeline_parallel": 2},
                                      {"tensor_parallel": 2, "pipeline_parallel": 2}, {}])
@pytest.mark.parametrize(("tokens", "requests"), [(512, 4), (4096, 4096)])
def test_the_scalar_path_prices_one_batch_as_numpy_does(hardware: dict, tokens: int, requests: int) -> None:
    """Collectives under TP 2 or PP 2 alone, and an LM head over 4,096 requests (where its
    compute binds): the memoised scalar path gives numpy's value."""
    cost = _h200(model_from_argument("llama3-70b"), **hardware)
    assert cost._fixed_one_s(tokens, requests) == pytest.approx(float(cost._fixed_s(tokens, requests)), rel=1e-15)
    head = cost.lm_head
    assert head.flops_per_token * requests / cost.gemm_flops_per_s > (
        head.weight_bytes + head.bytes_per_token * requests) / cost.bytes_per_s or requests < 4096


def test_an_empty_batch_costs_nothing_and_has_no_decode_line() -> None:
    for model in (model_from_argument("llama3-70b"), hf("mistral-7b-v0.1")):
        cost = _h200(model)
        empty = np.zeros(0, dtype=np.int64)
        assert cost.iteration_time_s(Batch(empty, empty)) == 0.0
        assert cost.iteration_time_lists_s([], [], 0, 0) == 0.0
        np.testing.assert_array_equal(cost.decode_steps_s(empty, 3), np.zeros(3))
        assert cost.decode_line(0, 0) is None


@pytest.mark.parametrize("name", ["llama3-70b", "mistral-7b-v0.1"])
def test_one_requests_decode_steps_cost_what_each_step_costs(name: str) -> None:
    """A lone request, on the line (Llama) and off it (Mistral's window layers)."""
    cost = _h200(model_from_argument(name) if name == "llama3-70b" else hf(name))
    steps = cost.decode_steps_s(np.array([3000]), 4)  # inside Mistral's 4,096 window
    one = np.ones(1, dtype=np.int64)
    expected = [cost.iteration_time_s(Batch(one, np.array([3000 + k]))) for k in range(4)]
    np.testing.assert_allclose(steps, expected, rtol=1e-12)
    assert steps[3] > steps[0]


def test_a_host_over_a_plain_decode_line_adds_its_decode_terms_only() -> None:
    """A decode step has no prompt token: the per-prefill-token term stays out of the line.
    A GPU model without a line (a window model) leaves the host without one too."""
    from orcasim.cost.linear import LinearCost, LinearCostConfig
    from orcasim.cost.overhead import OverheadConfig, OverheadCost

    cfg = OverheadConfig(per_iteration_s=1e-3, per_sequence_s=1e-4, per_prefill_token_s=1e-2)
    gpu = LinearCost(LinearCostConfig(kind="linear", base_s=0.01, per_context_token_s=1e-6))
    line = OverheadCost(gpu, cfg, None, tensor_parallel=1).decode_line(4, 100)
    assert line is not None and line.plus_s == pytest.approx(1e-3 + 4 * 1e-4, rel=1e-12)
    window = _h200(hf("mistral-7b-v0.1"))
    assert OverheadCost(window, cfg, None, tensor_parallel=1).decode_line(4, 100) is None


def test_weights_per_gpu_by_hand() -> None:
    """Mixtral in bf16 over TP 2 x PP 2: each stage's weights split by TP 2, experts too,
    but its norms and routers (2 x 4,096 and 4,096 x 8 a layer), whole on each rank; the
    heavier stage is the last (its 16 layers, the LM head and the final norm; the first
    holds the embedding: untied, as large as the head).
    gpt-oss-20b over 2 data-parallel groups with EP 2: the bf16 non-expert weights whole
    on each GPU, half of the mxfp4 experts (17 bytes a block of 32 values) and of their
    bf16 biases."""
    from orcasim.cost.catalog import weight_bytes_per_gpu

    mixtral = model_from_argument("mixtral-8x7b")
    tp_pp = HardwareConfig(gpu="h200", tensor_parallel=2, pipeline_parallel=2)
    d = mixtral.hidden_size
    whole = 16 * (2 * d + d * 8)
    last = (16 * mixtral.layer_params() - whole + mixtral.vocab_size * d) / 2 + whole + d
    assert weight_bytes_per_gpu(mixtral, tp_pp) == pytest.approx(last * 2, rel=1e-15)
    oss = hf("gpt-oss-20b")
    experts = oss.routed_expert_params()
    matrices, biases = 24 * 32 * 3 * 2880 * 2880, 24 * 32 * (2 * 2880 + 2880)
    assert experts == matrices + biases
    dp_ep = HardwareConfig(gpu="h200", data_parallel_attention=2, expert_parallel=2)
    assert weight_bytes_per_gpu(oss, dp_ep) == pytest.approx(
        (oss.param_count() - experts) * 2 + (matrices * (17 / 32) + biases * 2) / 2, rel=1e-15)


def test_k_and_v_projections_past_tp_equal_kv_heads_are_replicated() -> None:
    """Llama-3-8B (8 KV heads) at TP 16: vLLM's QKVParallelLinear gives every rank a replica
    of one KV head (num_kv_head_replicas = 16 / 8), so a rank holds that head's K and V
    projections, as a 16-KV-head Llama-3-8B's rank would; an even share of the weights held
    half a head's (32 layers x 2 x 128 x 4,096 x 2 bytes x 1/2 = 33.6 MB a GPU light)."""
    from orcasim.cost.catalog import kv_bytes_per_token_per_gpu, weight_bytes_per_gpu

    gqa = model_from_argument("llama3-8b")
    wider = gqa.model_copy(update={"num_kv_heads": 16})
    hw = HardwareConfig(gpu="a100-40gb", tensor_parallel=16)
    assert wider.weight_bytes() - gqa.weight_bytes() == 32 * 2 * 8 * 128 * 4096 * 2
    assert weight_bytes_per_gpu(gqa, hw) == weight_bytes_per_gpu(wider, hw)
    assert kv_bytes_per_token_per_gpu(gqa, hw) == kv_bytes_per_token_per_gpu(wider, hw) == 2 * 32 * 128 * 2
    at_tp8 = HardwareConfig(gpu="a100-40gb", tensor_parallel=8)  # one head a rank: no replica
    assert weight_bytes_per_gpu(wider, at_tp8) - weight_bytes_per_gpu(gqa, at_tp8) == \
        (wider.weight_bytes() - gqa.weight_bytes()) / 8


def test_latent_down_projections_routers_and_norms_are_whole_on_every_rank() -> None:
    """DeepSeek-V3 in fp8 at TP 8: vLLM keeps MLA's down-projections to the query and KV
    latents (7,168 x (1,536 + 576), ReplicatedLinear) with the latents' norms, the two layer
    norms of each of 61 layers, the router of each of 58 MoE layers (7,168 x 256,
    ReplicatedLinear) and the final norm whole on every rank; an even share held an eighth of
    them, 0.996 GB a GPU light. Only the down-projections are fp8: Fp8Config quantizes linear
    layers' weight matrices, and the norms and the gate (built with quant_config=None) stay
    bf16, as the embeddings do."""
    from orcasim.cost.catalog import weight_bytes_per_gpu

    model = hf("deepseek-v3", weight_dtype="fp8")
    d = 7168
    fp8_whole = 61 * d * (1536 + 576)
    bf16_whole = 61 * (1536 + 512 + 2 * d) + 58 * d * 256 + d
    whole_bytes = fp8_whole * 1 + bf16_whole * 2
    hw = HardwareConfig(gpu="h200", tensor_parallel=8)
    assert weight_bytes_per_gpu(model, hw) == pytest.approx(
        model.weight_bytes() / 8 + whole_bytes * (1 - 1 / 8), rel=1e-12)
    assert whole_bytes * 7 / 8 == 996_049_152
    # Counted at one byte, the norms and routers left 107,429,888 bytes a GPU uncounted.
    assert bf16_whole - d == 58 * d * 256 + 61 * (1536 + 512 + 2 * d) == 107_429_888


def test_norms_output_biases_and_learned_positions_are_whole_on_every_rank() -> None:
    """GPT-3 175B at TP 8: each of 96 layers' two layer norms (gain and bias), the biases of
    its output and second MLP projections (a RowParallelLinear keeps its whole bias), the
    learned position table (2,048 x 12,288, an nn.Embedding in vLLM's OPT and GPT-2) and the
    final norm are whole on every rank; the vocabulary table is split (VocabParallelEmbedding)."""
    from orcasim.cost.catalog import weight_bytes_per_gpu

    model = model_from_argument("gpt3-175b")
    d = 12288
    whole_bytes = (96 * (2 * 2 * d + d + d) + 2048 * d + 2 * d) * 2
    hw = HardwareConfig(gpu="a100-80gb", tensor_parallel=8)
    assert weight_bytes_per_gpu(model, hw) == pytest.approx(
        model.weight_bytes() / 8 + whole_bytes * (1 - 1 / 8), rel=1e-12)


def test_weights_that_leave_no_room_for_one_tokens_kv_are_an_error() -> None:
    """A made-up GPU of exactly the weights plus one token's KV holds one token; a byte
    less holds none, which is an error naming the figures in GiB."""
    from orcasim.cost.catalog import derive_kv_capacity_tokens, kv_bytes_per_token_per_gpu

    model = ModelSpec(num_layers=2, hidden_size=64, num_heads=4, vocab_size=100, max_seq_len=64)
    gpu = {"peak_flops": 1e12, "hbm_bandwidth_bytes_per_s": 1e12, "nvlink_bandwidth_bytes_per_s": 1e9,
           "node_network_bytes_per_s": 1e9}

    def deployment(memory_bytes: float) -> HardwareConfig:
        return HardwareConfig.model_validate({"gpu": {**gpu, "memory_bytes": memory_bytes},
                                              "gpu_memory_utilization": 1.0, "activation_reserve_gib": 0})

    weights = model.weight_bytes()
    kv = kv_bytes_per_token_per_gpu(model, deployment(1e9))
    assert derive_kv_capacity_tokens(model, deployment(weights + kv)) == 1
    message = (r"^hardware.tensor_parallel = 1 \(pipeline_parallel 1\): model custom needs 0\.0 GiB of weights per GPU on 1 x custom, leaving no room "
               r"for KV in the 0\.0 GiB budget; expected more GPUs")
    with pytest.raises(ScenarioError, match=message):
        derive_kv_capacity_tokens(model, deployment(weights + kv - 1))
    big = model_from_argument("llama3-70b")
    with pytest.raises(ScenarioError, match=r"needs 131\.4 GiB of weights per GPU on 1 x h100-80gb, "
                                            r"leaving no room for KV in the 70\.3 GiB budget"):
        derive_kv_capacity_tokens(big, HardwareConfig(gpu="h100-80gb"))


def test_a_dense_model_refuses_expert_and_data_parallelism_by_its_key() -> None:
    from orcasim.cost.catalog import check_deployment

    dense = model_from_argument("llama3-70b")
    for hardware in ({"tensor_parallel": 2, "expert_parallel": 2},
                     {"data_parallel_attention": 2, "expert_parallel": 2}):
        with pytest.raises(ScenarioError, match=r"^hardware\.expert_parallel = 2 needs a mixture-of-experts "
                                                r"model; llama3-70b is dense"):
            check_deployment(dense, HardwareConfig.model_validate({"gpu": "h200", **hardware}), 1)


def test_an_unknown_name_says_which_catalog_it_looked_in() -> None:
    from orcasim.cost.catalog import gpu_spec, model_spec

    with pytest.raises(ScenarioError, match=r"^unknown model 'llama-9'; known models: "):
        model_spec("llama-9")
    with pytest.raises(ScenarioError, match=r"^unknown gpu 'z100'; known gpus: a100-40gb, a100-80gb, "):
        gpu_spec("z100")


def test_a_config_that_makes_no_model_is_one_line_without_pydantics_prefix(tmp_path: Path) -> None:
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 5, "num_hidden_layers": 2,
              "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64}
    with pytest.raises(ScenarioError) as caught:
        model_from_argument(write_config(tmp_path, config))
    assert not str(caught.value).startswith("Value error") and "\n" not in str(caught.value)
    assert "num_heads" in str(caught.value) or "hidden_size" in str(caught.value)


def test_config_errors_name_the_file_and_the_family(tmp_path: Path) -> None:
    path = write_config(tmp_path, [1, 2])
    with pytest.raises(ScenarioError, match=f"^model.hf_config = '{path}': expected a JSON object$"):
        model_from_argument(path)
    path = write_config(tmp_path, {"hidden_size": 64})
    with pytest.raises(ScenarioError, match=f"^model.hf_config = '{path}': model_type = '' is not a family "
                                            "orcasim reads; expected one of deepseek_v2, deepseek_v3, gpt2, "
                                            "gpt_oss, llama, mistral, mixtral, opt, qwen2, qwen2_moe, qwen3, "
                                            "qwen3_moe$"):
        model_from_argument(path)
    with pytest.raises(ScenarioError, match="^model.hf_config: missing num_attention_heads, which qwen2 configs have$"):
        model_from_argument(write_config(tmp_path, {"model_type": "qwen2", "hidden_size": 64}))


def test_a_llama_config_with_attention_bias_biases_q_k_v_and_o(tmp_path: Path) -> None:
    """transformers' LlamaAttention and vLLM's (bias_o_proj = attention_bias) bias the
    output projection too: it was left out, 64 of the 256 biases here."""
    base = TINY_LLAMA
    assert model_from_argument(write_config(tmp_path, base)).qkv_bias is None
    biased = model_from_argument(write_config(tmp_path, {**base, "attention_bias": True}))
    assert biased.qkv_bias is True and biased.out_bias is True and biased.bias is False
    # The biases count: 3 x 64 on Q, K and V, 64 on the output projection.
    plain = model_from_argument(write_config(tmp_path, base))
    assert biased.attention_params() - plain.attention_params() == 4 * 64


def test_chunked_attention_is_refused_only_when_set(tmp_path: Path) -> None:
    base = TINY_LLAMA
    assert model_from_argument(write_config(tmp_path, {**base, "attention_chunk_size": None})).num_layers == 2
    with pytest.raises(ScenarioError, match="attention_chunk_size = 8192 changes the cost and is not modelled"):
        model_from_argument(write_config(tmp_path, {**base, "attention_chunk_size": 8192}))


def test_qwens_window_is_off_unless_its_config_switches_it_on(tmp_path: Path) -> None:
    """transformers' Qwen2Config defaults use_sliding_window to False: a config without the
    key attends to everything. Mistral's has no such key: its window is always on."""
    qwen = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4,
            "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64,
            "sliding_window": 32, "max_window_layers": 2}
    assert model_from_argument(write_config(tmp_path, qwen)).sliding_window is None
    on = model_from_argument(write_config(tmp_path, {**qwen, "use_sliding_window": True}))
    assert (on.sliding_window, on.sliding_window_layers) == (32, [2, 3])
    # (With its KV heads given: transformers' MistralConfig defaults them to 8, which 4 heads
    # cannot share.)
    mistral = model_from_argument(write_config(tmp_path, {**qwen, "model_type": "mistral",
                                                          "num_key_value_heads": 4}))
    assert (mistral.sliding_window, mistral.sliding_window_layers) == (32, None)


def test_qwens_sparse_step_puts_experts_on_every_steps_last_layer(tmp_path: Path) -> None:
    """vLLM's Qwen2-MoE: layer i has experts when (i + 1) % decoder_sparse_step == 0."""
    qwen = {"model_type": "qwen2_moe", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 7,
            "intermediate_size": 256, "vocab_size": 100, "max_position_embeddings": 64, "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 3}
    moe = model_from_argument(write_config(tmp_path, qwen)).moe
    assert moe is not None and moe.dense_layers == [0, 1, 3, 4, 6]


def test_a_scenarios_own_weight_dtype_overrides_the_checkpoints(tmp_path: Path) -> None:
    config = json.loads(Path("orcasim/data/hf_configs/deepseek-v3/config.json").read_text())
    path = write_config(tmp_path, {**config, "quantization_config": {"quant_method": "fp8"}})
    assert ModelSpec.model_validate({"hf_config": path}).weight_dtype == "fp8"
    assert ModelSpec.model_validate({"hf_config": path, "weight_dtype": "bf16"}).weight_dtype == "bf16"


def test_a_scenarios_weight_dtype_stands_in_for_a_quantization_orcasim_does_not_read(tmp_path: Path) -> None:
    """The error for an AWQ checkpoint says to set model.weight_dtype: doing so is enough."""
    base = {**TINY_LLAMA, "quantization_config": {"quant_method": "awq"}}
    path = write_config(tmp_path, base)
    with pytest.raises(ScenarioError, match="or set model.weight_dtype"):
        model_from_argument(path)
    assert ModelSpec.model_validate({"hf_config": path, "weight_dtype": "int4"}).weight_element_bytes == 0.5


def test_an_unknown_kind_of_layer_is_named_with_the_kinds_orcasim_reads(tmp_path: Path) -> None:
    config = {"model_type": "mistral", "num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2,
              "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64,
              "sliding_window": 32, "layer_types": ["sliding_attention", "chunked_attention"]}
    with pytest.raises(ScenarioError, match="^model.hf_config: layer_types 'chunked_attention' is not modelled; "
                                            "expected sliding_attention or full_attention layers$"):
        model_from_argument(write_config(tmp_path, config))
    # Without a window too: a linear attention layer read as full attention (a tester's).
    del config["sliding_window"]
    config["layer_types"] = ["linear_attention", "full_attention"]
    with pytest.raises(ScenarioError, match="^model.hf_config: layer_types 'linear_attention' is not "):
        model_from_argument(write_config(tmp_path, config))


def test_fp32_weights_widen_the_embedding_and_lm_head_too() -> None:
    """Every weight at 4 bytes: the embedding and LM head stayed at 2 (Llama-3-8B read
    30.0 GB where 8.03e9 parameters x 4 bytes are 32.1 GB; a tester's finding); fp8 still
    keeps them at the model's 2 bytes, as vLLM's Fp8Config does."""
    wide = model_from_argument("llama3-8b", weight_dtype="fp32")
    assert wide.weight_bytes() == 4 * wide.param_count()
    narrow = model_from_argument("llama3-8b", weight_dtype="fp8")
    assert narrow.embedding_element_bytes == 2


def test_orcasim_model_takes_a_shipped_config_folder_as_a_scenario_does() -> None:
    """`orcasim model hf_configs/gpt2` read "unknown model" where `model: {hf_config:
    hf_configs/gpt2}` reads it from the package's data (a tester's finding)."""
    assert model_from_argument("hf_configs/gpt2").param_count() == 124_439_808
    with pytest.raises(ScenarioError, match="file 'hf_configs/nope' not found"):
        model_from_argument("hf_configs/nope")


def test_heads_that_do_not_divide_name_their_keys(tmp_path: Path) -> None:
    """It read '(top level): num_heads 32 is not a multiple of num_kv_heads 3' from
    `orcasim model` (a tester's finding): the message opens with the key."""
    path = write_config(tmp_path, {**TINY_LLAMA, "num_attention_heads": 4, "num_key_value_heads": 3})
    with pytest.raises(ScenarioError, match=r"^model.num_kv_heads = 3 does not divide "
                                            r"model.num_heads = 4; expected a divisor of 4$"):
        model_from_argument(path)
