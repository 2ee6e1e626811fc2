"""Sliding-window attention and checkpoint precision read from configs: gpt-oss (windows on
every other layer, mxfp4 experts), Mistral-7B-v0.1 (a window on every layer), Qwen2's
layout, fp8 checkpoints, and the window's cost against a brute-force count."""

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
    model_from_argument,
    stage_weight_bytes,
)
from orcasim.cost.flops import attention_constants
from orcasim.cost.roofline import Roofline, RooflineCostConfig
from orcasim.scenario import load_scenario

GIB = 1024**3


def hf(name: str, **extra: object) -> ModelSpec:
    return ModelSpec.model_validate({"hf_config": f"hf_configs/{name}/config.json", **extra})


def roofline(model: ModelSpec, gpu: str = "h100-80gb", tp: int = 1) -> Roofline:
    return Roofline(RooflineCostConfig(kind="roofline"),
                    Deployment(model=model, hardware=HardwareConfig(gpu=gpu, tensor_parallel=tp)))


@pytest.mark.parametrize(("name", "total", "active", "checkpoint_gib"), [
    # The gpt-oss model card (OpenAI 2025), Table 1: parameters, active parameters per token
    # (counting the unembedding, not the input embedding table), and checkpoint size.
    ("gpt-oss-20b", 20.91e9, 3.61e9, 12.8),
    ("gpt-oss-120b", 116.83e9, 5.13e9, 60.8),
])
def test_gpt_oss_matches_its_model_card(name: str, total: float, active: float, checkpoint_gib: float) -> None:
    model = hf(name)
    assert model.param_count() == pytest.approx(total, rel=0.006)
    input_embedding = model.vocab_size * model.hidden_size
    assert model.active_param_count() - input_embedding == pytest.approx(active, rel=0.006)
    # mxfp4 experts (4.25 bits a weight), everything else bf16: the checkpoint's size.
    assert model.moe is not None and model.moe.expert_weight_dtype == "mxfp4"
    assert model.weight_bytes() / GIB == pytest.approx(checkpoint_gib, rel=0.01)


@pytest.mark.parametrize(("name", "layers", "experts", "total_b", "active_b", "checkpoint_gib"), [
    ("gpt-oss-20b", 24, 32, 20.91, 3.61, 12.8), ("gpt-oss-120b", 36, 128, 116.83, 5.13, 60.8)])
def test_gpt_oss_counts_its_biases_and_matches_the_card_to_its_digits(
    name: str, layers: int, experts: int, total_b: float, active_b: float, checkpoint_gib: float,
) -> None:
    """gpt-oss's attention projections all have biases (q, k, v and o: `attention_bias`),
    and so do its router and every expert's gate-and-up and down projections
    (transformers' GptOssAttention, GptOssTopKRouter, GptOssExperts), all kept in bf16 by
    the mxfp4 checkpoint. Without the output, router and expert ones, 116.79B parameters
    and 60.69 GiB where the card (Table 1) says 116.83B and 60.8 GiB. The attention sinks
    (one a head a layer, 2,304 in gpt-oss-120b) are not counted."""
    d, heads, kv, hd, inter, vocab, top_k = 2880, 64, 8, 64, 2880, 201088, 4
    attention = d * heads * hd + heads * hd + 2 * (d * kv * hd + kv * hd) + heads * hd * d + d
    expert_matrices, expert_biases = 3 * d * inter, 2 * inter + d
    router = d * experts + experts
    layer = attention + 2 * d + router + experts * (expert_matrices + expert_biases)
    model = hf(name)
    assert model.param_count() == layers * layer + 2 * vocab * d + d
    assert round(model.param_count() / 1e9, 2) == total_b
    # Active: the unembedding counts, the input embedding table does not (the card's rule).
    active = layers * (attention + 2 * d + router + top_k * (expert_matrices + expert_biases)) + vocab * d + d
    assert model.active_param_count() - vocab * d == active
    assert round(active / 1e9, 2) == active_b
    # mxfp4 expert matrices (17/32 bytes a weight); their biases and the rest in bf16.
    matrices = layers * experts * expert_matrices
    assert model.weight_bytes() == matrices * 17 / 32 + (model.param_count() - matrices) * 2
    assert round(model.weight_bytes() / GIB, 1) == checkpoint_gib


def test_gpt_oss_keeps_each_experts_down_bias_whole_on_every_tensor_parallel_rank() -> None:
    """vLLM's vllm/model_executor/models/gpt_oss.py, GptOssModel.load_weights (its mxfp4
    and bf16 loaders alike): without expert parallelism a rank takes its 1/tp slice of the
    expert matrices and of gate_up_proj_bias (w13_bias), but down_proj_bias (w2_bias,
    num_experts x hidden_size) whole, zeroed on every rank but 0 ("only load on rank 0 to
    avoid duplication") so the all-reduce adds it once; with expert parallelism each rank
    takes its own experts' rows of both. So at TP 8 every GPU holds all 128 x 2,880 down
    biases of each of gpt-oss-120b's 36 layers, 23,224,320 bytes more than an eighth of
    them; `expert_op` already reads the down bias whole at TP (2 x width / tp + hidden)."""
    d, heads, hd, inter, vocab, experts, layers, tp = 2880, 64, 64, 2880, 201088, 128, 36, 8
    model = hf("gpt-oss-120b")
    # One of the 8 KV heads a rank; o's bias, the norms and the router whole.
    attention = (d * heads * hd + heads * hd) / tp + 2 * (d * hd + hd) + heads * hd * d / tp + d
    down_bias = experts * d
    bf16 = attention + 2 * d + (d + 1) * experts + experts * 2 * inter / tp + down_bias
    mxfp4 = experts * 3 * d * inter / tp
    layer = bf16 * 2 + mxfp4 * 17 / 32
    by_hand = layers * layer + 2 * (vocab * d / tp) * 2 + d * 2  # embedding, LM head, final norm
    tensor = HardwareConfig(gpu="h100-80gb", tensor_parallel=tp)
    assert stage_weight_bytes(model, tensor) == [by_hand]
    expert = HardwareConfig(gpu="h100-80gb", tensor_parallel=tp, expert_parallel=tp)
    assert stage_weight_bytes(model, expert) == [by_hand - layers * down_bias * 2 * (tp - 1) / tp]
    assert layers * down_bias * 2 * (tp - 1) / tp == 23_224_320


def test_windows_are_read_in_each_familys_words(tmp_path: Path) -> None:
    oss = hf("gpt-oss-20b")
    assert oss.sliding_window == 128 and oss.sliding_window_layers == list(range(0, 24, 2))
    assert oss.num_window_layers == 12
    mistral = hf("mistral-7b-v0.1")
    assert mistral.sliding_window == 4096 and mistral.sliding_window_layers is None
    assert mistral.num_window_layers == 32
    # Qwen2 slides from max_window_layers on, and only with use_sliding_window.
    config = json.loads(Path("orcasim/data/hf_configs/qwen2-7b/config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "use_sliding_window": True, "sliding_window": 4096,
                                "max_window_layers": 20}))
    qwen = model_from_argument(str(path))
    assert qwen.sliding_window_layers == list(range(20, 28))
    assert hf("qwen2-7b").sliding_window is None  # use_sliding_window: false


def test_a_checkpoints_fp8_quantization_sets_the_weights_precision_unless_the_scenario_does(
    tmp_path: Path,
) -> None:
    config = json.loads(Path("orcasim/data/hf_configs/deepseek-v3/config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}))
    assert model_from_argument(str(path)).weight_dtype == "fp8"
    given = ModelSpec.model_validate({"hf_config": str(path), "weight_dtype": "bf16"})
    assert given.weight_dtype == "bf16"


def _brute_force(q: int, c: int, window: int) -> tuple[int, int]:
    """Query-key pairs and KV tokens read, counted query by query."""
    pairs = sum(min(position + 1, window) for position in range(c - q, c))
    first_key = max(0, c - q - window + 1)
    return pairs, c - first_key


def test_a_window_layers_attention_counts_what_each_query_sees() -> None:
    cost = roofline(hf("mistral-7b-v0.1"))
    window = 4096
    flops_per_pair, kv_bytes, query_bytes = attention_constants(cost.model, 1)
    rng = np.random.default_rng(0)
    for _ in range(300):
        c = int(rng.integers(1, 3 * window))
        q = int(rng.choice([1, int(rng.integers(1, c + 1))]))
        pairs, keys = _brute_force(q, c, window)
        want = max(pairs * flops_per_pair / cost.flops_per_s,
                   (keys * kv_bytes + q * query_bytes) / cost.bytes_per_s) + cost.cfg.kernel_overhead_s
        got = float(cost.window_attention_per_layer_s(np.array([q]), np.array([c])))
        assert got == pytest.approx(want, rel=1e-14), (q, c)


def test_past_the_window_a_decode_step_stops_growing() -> None:
    """Mistral-7B-v0.1 slides on every layer: a step at 8k or 32k of context costs what it
    does at the window; without the window it keeps growing."""
    windowed = roofline(hf("mistral-7b-v0.1"))
    full = roofline(hf("mistral-7b-v0.1", sliding_window=None))

    def step(cost: Roofline, context: int) -> float:
        return cost.iteration_time_s(Batch(np.ones(32, dtype=np.int64), np.full(32, context, dtype=np.int64)))

    assert step(windowed, 1000) == step(full, 1000)
    assert step(windowed, 4096) == step(windowed, 8192) == step(windowed, 32768)
    assert step(full, 32768) > 3 * step(windowed, 32768)


def test_decode_steps_agree_with_each_iteration_across_the_window() -> None:
    """Contexts that cross the window within the run: no line, and every step priced as the
    iteration itself would be."""
    cost = roofline(hf("gpt-oss-20b"), tp=4)
    contexts = np.array([5, 100, 127, 128, 129, 3000])
    assert cost.decode_line(len(contexts), int(contexts.sum())) is None
    steps = cost.decode_steps_s(contexts, 40)
    ones = np.ones_like(contexts)
    expected = [cost.iteration_time_s(Batch(ones, contexts + k)) for k in range(40)]
    np.testing.assert_allclose(steps, expected, rtol=1e-13)
    lists = cost.iteration_time_lists_s([1] * 6, (contexts + 7).tolist(), 6, int(contexts.sum()) + 42)
    assert lists == pytest.approx(expected[7], rel=1e-13)


def test_flops_per_token_count_the_windows_keys() -> None:
    model = hf("gpt-oss-20b")
    per_key = 4 * model.num_heads * model.head_dim
    assert model.flops_per_token(100_128) - model.flops_per_token(128) == 12 * 100_000 * per_key


@pytest.mark.parametrize(("overrides", "message"), [
    (("model.sliding_window=null", "model.sliding_window_layers=[0]"),
     "sliding_window_layers is set without model.sliding_window"),
    (("model.sliding_window_layers=[40]",), "names a layer beyond the model's 32"),
])
def test_a_bad_window_is_a_one_line_error(overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(ScenarioError, match=message) as caught:
        load_scenario("scenarios/models/dense_vs_moe.yaml",
                      ["model.hf_config=hf_configs/mistral-7b-v0.1/config.json", *overrides])
    assert "\n" not in str(caught.value)
