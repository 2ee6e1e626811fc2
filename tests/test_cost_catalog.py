"""Model and GPU catalogs, scenario syntax for them, and the derived KV capacity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orcasim.config import ScenarioError
from orcasim.cost.catalog import (
    GIB,
    HardwareConfig,
    derive_kv_capacity_tokens,
    gpu_spec,
    known_names,
    model_spec,
)
from orcasim.scenario import scenario_from_dict

PARAM_COUNT_REL_TOL = 0.01  # against the published parameter counts

# Published sizes: GPT-3 paper Table 2.1; Llama 2/3 model cards (config.json parameter totals).
PUBLISHED_PARAMS = {
    "gpt3-13b": 12.85e9,
    "gpt3-175b": 174.6e9,
    "llama2-7b": 6.738e9,
    "llama2-13b": 13.016e9,
    "llama2-70b": 68.977e9,
    "llama3-8b": 8.030e9,
    "llama3-70b": 70.554e9,
}


def test_every_catalog_entry_validates_and_cites_a_source() -> None:
    for name in known_names("models"):
        assert model_spec(name).source, name
    for name in known_names("gpus"):
        assert gpu_spec(name).source, name
    assert {"gpt3-13b", "gpt3-101b", "gpt3-175b", "gpt3-341b", "opt-66b", "llama3-70b"} <= set(known_names("models"))
    assert set(known_names("gpus")) == {"a100-40gb", "a100-80gb", "h100-80gb", "h200", "b200", "mi300x"}


@pytest.mark.parametrize("name,published", sorted(PUBLISHED_PARAMS.items()))
def test_parameter_counts_match_published_sizes(name: str, published: float) -> None:
    assert model_spec(name).param_count() == pytest.approx(published, rel=PARAM_COUNT_REL_TOL)


def test_orca_paper_gpt3_shapes() -> None:
    # Orca Table 1: (layers, hidden) for 13B, 101B, 175B, 341B; n_ctx 2048 throughout.
    shapes = {"gpt3-13b": (40, 5120), "gpt3-101b": (80, 10240), "gpt3-175b": (96, 12288), "gpt3-341b": (120, 15360)}
    for name, (layers, hidden) in shapes.items():
        m = model_spec(name)
        assert (m.num_layers, m.hidden_size, m.max_seq_len, m.head_dim) == (layers, hidden, 2048, 128)


def test_kv_bytes_per_token_mha_and_gqa() -> None:
    # 2 (K and V) * layers * kv_heads * head_dim * 2 bytes.
    assert model_spec("llama2-7b").kv_bytes_per_token() == 2 * 32 * 32 * 128 * 2  # MHA
    assert model_spec("llama2-70b").kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2  # GQA, 8 KV heads
    assert model_spec("llama3-8b").kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2
    assert model_spec("gpt3-175b").kv_bytes_per_token() == 2 * 96 * 96 * 128 * 2


def test_flops_per_token_is_twice_the_matmul_weights_plus_attention() -> None:
    m = model_spec("llama2-7b")
    matmul = 32 * (4096 * 4096 * 4 + 3 * 4096 * 11008) + 32000 * 4096  # layers + LM head
    assert m.flops_per_token(0) == pytest.approx(2 * matmul, rel=1e-3)  # norms add < 0.1%
    assert m.flops_per_token(1000) - m.flops_per_token(0) == 4 * 32 * 1000 * 4096


def test_kv_capacity_derivation_by_hand() -> None:
    m = model_spec("gpt3-13b")
    hw = HardwareConfig(gpu="a100-40gb")
    free = 42.41e9 * 0.9 - 1.0 * GIB - m.param_count() * 2  # the 39.50 GiB the driver reports
    assert derive_kv_capacity_tokens(m, hw) == int(free // (2 * 40 * 40 * 128 * 2))
    # TP 8 x PP 2 of 175B: each GPU holds an eighth of its stage's split weights (48 layers,
    # and the token embedding on the first, the tighter; the LM head, a copy of the tied
    # table, on the last), whole what vLLM replicates (each layer's two norms' gains and
    # biases and its output and down-projection biases, 6 x 12,288; the learned position
    # table on the first), and 48 layers x 12 heads of KV.
    big = model_spec("gpt3-175b")
    hw16 = HardwareConfig(gpu="a100-40gb", tensor_parallel=8, pipeline_parallel=2)
    whole = 48 * 6 * 12288
    first = (48 * big.layer_params() - whole + big.vocab_size * 12288) / 8 + whole + big.max_seq_len * 12288
    free16 = 42.41e9 * 0.9 - GIB - first * 2
    assert derive_kv_capacity_tokens(big, hw16) == int(free16 // (2 * 48 * 12 * 128 * 2)) == 51334


# Bound on the derived KV capacity against a real vLLM log: the spread of the driver totals
# one GPU model reports in different posts (79.14-79.25 GiB on an A100-80GB) plus vLLM's
# profiled activation peak, which the flat 1 GiB reserve only approximates.
LOGGED_KV_REL_TOLERANCE = 0.02


def test_derived_kv_capacity_is_what_a_real_vllm_logged() -> None:
    """Llama-2-7B fp16 on an A100-80GB at utilisation 0.9: vLLM 0.2 logged "# GPU blocks:
    7449" of 16 tokens (December 2023, FlightLLM's profiling README). The catalog's memory
    is the driver's total, as vLLM multiplies it; the datasheet's 80e9 bytes read 8% short."""
    logged_tokens = 7449 * 16
    model = model_spec("llama2-7b")
    derived = derive_kv_capacity_tokens(model, HardwareConfig(gpu="a100-80gb"))
    assert derived == pytest.approx(logged_tokens, rel=LOGGED_KV_REL_TOLERANCE)
    datasheet = HardwareConfig(gpu={**gpu_spec("a100-80gb").model_dump(), "memory_bytes": 80e9})
    assert derive_kv_capacity_tokens(model, datasheet) < 0.93 * logged_tokens


def test_weights_that_do_not_fit_are_an_error() -> None:
    with pytest.raises(ValueError, match="weights per GPU"):
        derive_kv_capacity_tokens(model_spec("gpt3-175b"), HardwareConfig(gpu="a100-40gb"))


def _scenario(base_dict: dict[str, Any], **top: Any) -> Any:
    data = {k: v for k, v in base_dict.items() if k != "kv_capacity_tokens"}
    data.update(top)
    return scenario_from_dict(data)


def test_scenario_names_a_model_and_hardware_and_derives_kv_capacity(base_dict: dict[str, Any]) -> None:
    sc = _scenario(base_dict, model="gpt3-175b", hardware={"gpu": "a100-40gb", "tensor_parallel": 8, "pipeline_parallel": 2},
                   cost={"kind": "roofline"})
    assert sc.model is not None and sc.model.num_layers == 96
    assert sc.kv_capacity_tokens == derive_kv_capacity_tokens(sc.model, sc.hardware)


def test_scenario_accepts_inline_specs(base_dict: dict[str, Any]) -> None:
    tiny = {"name": "tiny", "num_layers": 2, "hidden_size": 256, "num_heads": 4}
    gpu = {"peak_flops": 1e14, "hbm_bandwidth_bytes_per_s": 1e12, "memory_bytes": 16e9,
           "nvlink_bandwidth_bytes_per_s": 1e11, "node_network_bytes_per_s": 1e10}
    sc = _scenario(base_dict, model=tiny, hardware={"gpu": gpu}, cost={"kind": "roofline"})
    assert sc.model.kv_bytes_per_token() == 2 * 2 * 4 * 64 * 2
    assert sc.kv_capacity_tokens > 0


@pytest.mark.parametrize("key,value,known", [
    ("model", "gpt-5", "gpt3-175b"),
    ("hardware", {"gpu": "tpu-v5e"}, "a100-40gb"),
])
def test_unknown_names_list_the_known_ones(base_dict: dict[str, Any], key: str, value: Any, known: str) -> None:
    top = {"model": "gpt3-13b", "hardware": {"gpu": "a100-80gb"}, key: value}
    with pytest.raises(ScenarioError, match=known):
        _scenario(base_dict, **top)


def test_hardware_cost_without_model_is_an_error(base_dict: dict[str, Any]) -> None:
    base_dict["cost"] = {"kind": "roofline"}
    with pytest.raises(ScenarioError, match="needs the keys 'model' and 'hardware'"):
        scenario_from_dict(base_dict)
    del base_dict["kv_capacity_tokens"]
    base_dict["cost"] = {"kind": "linear", "base_s": 0.01}
    with pytest.raises(ScenarioError, match="kv_capacity_tokens is required"):
        scenario_from_dict(base_dict)


def test_cli_reports_an_unknown_model_on_one_line(tmp_path: Path) -> None:
    from tests.test_cli import orcasim

    text = Path("scenarios/orca_paper/gpt3_13b.yaml").read_text().replace("model: gpt3-13b", "model: gpt3-13")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    p = orcasim("validate", str(bad))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "unknown model 'gpt3-13'" in p.stderr and "gpt3-175b" in p.stderr


def test_the_2026_catalog_entries_come_from_their_configs_at_their_release_precision() -> None:
    """Catalog names for current models resolve through their shipped configs: DeepSeek-V3
    as released in fp8 (672.9 GB of weights: its bf16 embedding and LM head), gpt-oss with its mxfp4 experts and windows."""
    deepseek = model_spec("deepseek-v3")
    assert deepseek.name == "deepseek-v3" and deepseek.weight_dtype == "fp8"
    # 671B parameters at one byte, but for the embedding and LM head (129,280 x 7,168 each)
    # kept in bf16: 672.9 GB.
    assert deepseek.weight_bytes() == pytest.approx(671e9 + 2 * 129280 * 7168, rel=0.001)
    oss = model_spec("gpt-oss-120b")
    assert oss.sliding_window == 128 and oss.moe is not None and oss.moe.expert_weight_dtype == "mxfp4"
    assert model_spec("llama3.1-70b").param_count() == model_spec("llama3-70b").param_count()
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b"):
        assert model_spec(name).moe is not None and model_spec(name).source


def test_each_pipeline_stage_holds_its_own_weights_and_the_tightest_sets_the_kv() -> None:
    """GPT-3 13B (tied embeddings) on 3 A100-40GBs: 13, 14 and 13 layers (vLLM's
    get_pp_indices puts the remainder on the stages before the last), the embedding on the
    first stage, the LM head (a copy of the tied table) and final norm on the last, as vLLM
    builds them. The middle stage holds a layer more of KV: it sets the capacity (vLLM takes
    the fewest blocks of its workers). The even share of the weights read 99,491 tokens; the
    middle stage holds 98,651 (the first, when it took the remainder, 96,783)."""
    from orcasim.cost.catalog import (
        GIB,
        derive_kv_capacity_tokens,
        stage_weight_bytes,
    )

    model, hw = model_spec("gpt3-13b"), HardwareConfig(gpu="a100-40gb", pipeline_parallel=3)
    d, vocab, layer = 5120, model.vocab_size, model.layer_params()
    positions = model.max_seq_len * d if model.positional == "learned" else 0
    table, norm = vocab * d, 2 * d
    assert stage_weight_bytes(model, hw) == pytest.approx(
        [2 * (13 * layer + table + positions), 2 * 14 * layer, 2 * (13 * layer + table + norm)], rel=1e-12)
    # One stage shares the tied table: the model's own count.
    one = HardwareConfig(gpu="a100-40gb")
    assert stage_weight_bytes(model, one) == pytest.approx([model.weight_bytes()], rel=1e-12)
    budget = 42.41e9 * 0.9 - GIB  # the catalog's a100-40gb: 39.50 GiB, as the driver reports it
    kv_per_layer = 2 * d * 2  # K and V, bf16
    middle = int((budget - 2 * 14 * layer) // (14 * kv_per_layer))
    assert derive_kv_capacity_tokens(model, hw) == middle == 98651


def test_a_catalog_entry_with_some_fields_changed() -> None:
    """`model: {catalog: llama3-8b, kv_cache_dtype: fp8}` is the catalog's Llama-3-8B with
    fp8 KV; `--set model.kv_cache_dtype=fp8` on `model: llama3-8b` says the same. It read
    "'kv_cache_dtype' is not inside a mapping", and fp8 KV on a catalog model meant writing
    its whole spec out (a tester's finding). A nested block changes only the keys given."""
    from orcasim.cost.catalog import ModelSpec, kv_bytes_per_token_per_gpu
    from orcasim.scenario import load_scenario

    plain = model_spec("llama3-8b")
    fp8 = ModelSpec.model_validate({"catalog": "llama3-8b", "kv_cache_dtype": "fp8"})
    assert fp8.name == "llama3-8b" and fp8.num_kv_heads == plain.num_kv_heads == 8
    hw = HardwareConfig(gpu="a100-80gb")
    assert kv_bytes_per_token_per_gpu(fp8, hw) * 2 == kv_bytes_per_token_per_gpu(plain, hw)
    moe = ModelSpec.model_validate({"catalog": "mixtral-8x7b", "moe": {"experts_per_token": 1}})
    assert moe.moe is not None and moe.moe.experts_per_token == 1
    assert moe.moe.num_experts == model_spec("mixtral-8x7b").moe.num_experts  # kept
    gpu = HardwareConfig.model_validate({"gpu": {"catalog": "a100-80gb", "gpus_per_node": 4}})
    assert gpu.gpu.gpus_per_node == 4 and gpu.gpu.memory_bytes == gpu_spec("a100-80gb").memory_bytes
    root = Path(__file__).resolve().parents[1]
    chat = root / "scenarios" / "prefix" / "chat.yaml"
    base = load_scenario(chat)
    assert base.model is not None and base.model.name == "llama3-8b"
    changed = load_scenario(chat, ["model.kv_cache_dtype=fp8", "hardware.gpu.gpus_per_node=4"])
    assert changed.model is not None and changed.model.kv_cache_dtype == "fp8"
    assert changed.kv_capacity_tokens == pytest.approx(2 * base.kv_capacity_tokens, rel=1e-3)
    with pytest.raises(ScenarioError, match=r"model: unknown model 'llama9'; known models: "):
        load_scenario(chat, ["model={catalog: llama9, kv_cache_dtype: fp8}"])
    with pytest.raises(ScenarioError, match=r": model\.catalog = 3: expected a catalog model's name"):
        load_scenario(chat, ["model={catalog: 3}"])
