"""Models from their Hugging Face configs: parameters, KV bytes and costs against published
figures, mixture-of-experts and latent attention, precision, and bad configs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from orcasim.config import ScenarioError
from orcasim.cost.base import Batch
from orcasim.cost.catalog import (
    Deployment,
    HardwareConfig,
    ModelSpec,
    kv_bytes_per_token_per_gpu,
    model_from_argument,
    model_spec,
)
from orcasim.cost.flops import expert_op
from orcasim.cost.profile import ProfileCost, ProfileCostConfig
from orcasim.cost.roofline import Roofline, RooflineCostConfig

# Published counts are rounded to three significant figures (a model card's "46.7B").
PUBLISHED_RTOL = 0.006


def hf(name: str, **extra: object) -> ModelSpec:
    return ModelSpec.model_validate({"hf_config": f"hf_configs/{name}/config.json", **extra})


@pytest.mark.parametrize(("name", "total", "active"), [
    ("llama-3.1-70b", 70.6e9, 70.6e9),  # Llama 3.1 model card
    ("llama-3.2-3b", 3.21e9, 3.21e9),  # Llama 3.2 model card (tied embeddings)
    ("mixtral-8x7b", 46.7e9, 12.9e9),  # Mixtral of Experts (Jiang et al. 2024), section 2
    ("deepseek-v3", 671e9, 37e9),  # DeepSeek-V3 technical report, abstract (MTP excluded)
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),  # Qwen3 model card
    ("qwen2-7b", 7.61e9, 7.61e9),  # Qwen2 technical report, Table 1 (7.6B; 7.07B non-embedding)
    ("opt-13b", 12.85e9, 12.85e9),  # the catalog's opt-13b, which the OPT paper lists as 13B
])
def test_parameter_counts_match_the_published_figures(name: str, total: float, active: float) -> None:
    model = hf(name)
    # The "activated" counts of DeepSeek-V3 and Qwen3 are truncated, not rounded (37.55B is
    # published as 37B, 3.353B as 3.3B): within 2%, and never below the published figure.
    truncated = name in ("deepseek-v3", "qwen3-30b-a3b")
    rtol = 0.02 if truncated else PUBLISHED_RTOL
    assert not truncated or model.active_param_count() >= active
    assert model.param_count() == pytest.approx(total, rel=PUBLISHED_RTOL)
    assert model.active_param_count() == pytest.approx(active, rel=rtol)


def test_gpt2_small_has_exactly_its_124439808_parameters() -> None:
    assert hf("gpt2").param_count() == 124_439_808


def test_qwen3_counts_its_query_and_key_norms() -> None:
    """Qwen3-30B-A3B's checkpoint holds 61,064,245,248 bytes of bf16 weights (its
    safetensors index's `total_size`): 30,532,122,624 parameters. orcasim counted 12,288
    fewer, the q_norm and k_norm gains (128 each) of its 48 layers, found checking `orcasim
    model` by hand. Active: the same norms on top of 3,353,020,416."""
    model = hf("qwen3-30b-a3b")
    assert model.param_count() == 30_532_122_624
    assert model.weight_bytes() == 61_064_245_248
    assert model.active_param_count() == 3_353_032_704


def test_a_config_and_its_catalog_entry_agree() -> None:
    """The catalog's llama3-70b and Llama-3.1-70B's config differ only in context length."""
    catalog, config = model_spec("llama3-70b"), hf("llama-3.1-70b")
    assert catalog.param_count() == config.param_count()
    assert catalog.kv_bytes_per_token() == config.kv_bytes_per_token()
    assert (catalog.max_seq_len, config.max_seq_len) == (8192, 131072)


def test_kv_bytes_per_token_by_hand() -> None:
    # Llama-3.1-70B: 2 (K, V) x 80 layers x 8 KV heads x 128 x 2 bytes.
    assert hf("llama-3.1-70b").kv_bytes_per_token() == 2 * 80 * 8 * 128 * 2 == 327_680
    # DeepSeek-V3 (MLA): 61 layers x (512 latent + 64 RoPE key) x 2 bytes; fp8 halves it.
    assert hf("deepseek-v3").kv_bytes_per_token() == 61 * 576 * 2 == 70_272
    assert hf("deepseek-v3", kv_cache_dtype="fp8").kv_bytes_per_token() == 35_136
    # Mixtral: GQA with 8 KV heads, the experts hold no KV.
    assert hf("mixtral-8x7b").kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2


def test_latent_attention_keeps_the_whole_latent_on_every_rank() -> None:
    model = hf("deepseek-v3")
    for tp in (1, 8):
        hw = HardwareConfig(gpu="h200", tensor_parallel=tp)
        assert kv_bytes_per_token_per_gpu(model, hw) == model.kv_bytes_per_token()
    gqa = hf("llama-3.1-70b")
    assert kv_bytes_per_token_per_gpu(gqa, HardwareConfig(gpu="h200", tensor_parallel=8)) == \
        gqa.kv_bytes_per_token() / 8


def test_fp8_weights_halve_the_layers_bytes_not_the_embeddings() -> None:
    """vLLM's Fp8Config quantizes linear layers' weight matrices and fused experts only: the
    vocabulary embedding and LM head stay in bf16 (as DeepSeek-V3's report keeps them), and
    so do the norms and the MoE routers (a gate built with quant_config=None). Counted at one
    byte, Qwen3-8B-FP8's weights read 13% light (a tester's reading)."""
    # By hand: each layer's two norms and, in a MoE layer, its router (d x experts); MLA's
    # two latent norms (1,536 + 512).
    deepseek = 61 * (2 * 7168 + 1536 + 512) + 58 * 7168 * 256
    mixtral = 32 * (2 * 4096 + 4096 * 8)
    for name, dtype, ratio, norms_and_routers in (("deepseek-v3", "fp8", 2, deepseek),
                                                  ("mixtral-8x7b", "int4", 4, mixtral)):
        full, low = hf(name), hf(name, weight_dtype=dtype)
        kept = full.embedding_params() + norms_and_routers
        layers = full.param_count() - kept
        assert low.weight_bytes() == layers * 2 / ratio + kept * 2
        assert full.weight_bytes() == full.param_count() * 2


def test_fp8_keeps_the_biases_and_splits_the_column_parallel_ones() -> None:
    """OPT-13B in fp8 (d = 5,120, 40 heads of 128, MLP 4d, biases): each layer keeps in bf16
    its two LayerNorms' gains and biases (4d), its QKV bias (3d), output bias (d), fc1 bias
    (4d) and fc2 bias (d), 13d; at TP 2 a rank holds the row-parallel and norm ones whole
    (6d), half the query's and fc1's (5d / 2) and its 20 KV heads' K and V biases (d)."""
    d = 5120
    opt = model_from_argument("opt-13b").model_copy(update={"weight_dtype": "fp8"})
    assert opt.unquantized_params_per_rank() == 13 * d
    assert opt.unquantized_params_per_rank(0, 2) == 6 * d + 5 * d / 2 + d
    kept = opt.embedding_params() + 40 * 13 * d
    assert opt.weight_bytes() == (opt.param_count() - kept) * 1 + kept * 2


def test_moe_layers_follow_each_familys_rule() -> None:
    deepseek = hf("deepseek-v3")
    assert deepseek.moe is not None and deepseek.moe.dense_layers == [0, 1, 2]  # first_k_dense_replace
    assert deepseek.moe.shared_intermediate_size == 2048  # one shared expert
    mixtral = hf("mixtral-8x7b")
    assert mixtral.moe is not None and mixtral.moe.dense_layers == []


def test_experts_hit_grow_from_top_k_to_all() -> None:
    """Uniform routing: one token reads its k experts' weights, a large batch all of them,
    and the expectation E (1 - (1 - k/E)^N) never falls as the batch grows."""
    op = expert_op(hf("mixtral-8x7b"), 1)
    assert op is not None
    hits = op.experts_hit(np.arange(1, 200))
    assert hits[0] == pytest.approx(2.0) and hits[-1] == pytest.approx(8.0)
    assert (np.diff(hits) >= 0).all()
    assert op.experts_hit(2.0) == pytest.approx(8 * (1 - 0.75**2))


def _decode_s(model: ModelSpec, batch: int, gpu: str = "h100-80gb", tp: int = 1) -> float:
    cost = Roofline(RooflineCostConfig(kind="roofline"),
                    Deployment(model=model, hardware=HardwareConfig(gpu=gpu, tensor_parallel=tp)))
    return cost.iteration_time_s(Batch(np.ones(batch, dtype=np.int64), np.full(batch, 1024, dtype=np.int64)))


def test_a_moe_decode_step_reads_the_active_weights_alone_and_all_in_a_big_batch() -> None:
    """Mixtral at batch 1 reads its 12.9B active parameters, so it decodes about as fast as
    a dense model of that size and far faster than one of its 46.7B; at batch 512 every
    expert is hit and it reads them all (weight-bound either way on an H100)."""
    mixtral = hf("mixtral-8x7b")
    assert _decode_s(mixtral, 1) < 0.4 * _decode_s(model_spec("llama3-70b"), 1)
    one, many = _decode_s(mixtral, 1), _decode_s(mixtral, 512)
    weight_s = mixtral.weight_bytes() / (3.35e12 * 0.8)  # H100 HBM at the roofline's 80%
    assert many > weight_s > one


@pytest.mark.parametrize(("name", "message"), [
    ("mixtral-8x7b", "mixture-of-experts layers"),
    ("mistral-7b-v0.1", "sliding-window attention"),
    ("fp32", r"4-byte activations \(model.dtype_bytes\)"),
])
def test_the_profile_cost_refuses_what_its_tables_do_not_time(name: str, message: str) -> None:
    # An fp32 model: Mistral's shape without its window, in 4-byte activations.
    model = hf(name) if name != "fp32" else hf("mistral-7b-v0.1", sliding_window=None, dtype_bytes=4)
    deployment = Deployment(model=model, hardware=HardwareConfig(gpu="a100-80gb"))
    cfg = ProfileCostConfig(kind="profile",
                            mlp_csv="profiles/vidur/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv")
    with pytest.raises(ScenarioError, match=message):
        ProfileCost(cfg, deployment)


@pytest.mark.parametrize(("config", "message"), [
    ({"model_type": "mamba"}, "model_type = 'mamba' is not a family orcasim reads"),
    ({"model_type": "llama", "hidden_size": 64}, "missing num_attention_heads"),
    ({"model_type": "mistral", "num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2,
      "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64,
      "sliding_window": 32, "layer_types": ["sliding_attention", "chunked_attention"]},
     "layer_types 'chunked_attention' is not modelled"),
    # A traceback (an int is not iterable), a string read letter by letter, a list too short.
    *[({"model_type": "mistral", "num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64,
        "sliding_window": 32, "layer_types": types},
       r"layer_types = .*: expected a list of 2 layer kinds, one per hidden layer")
      for types in (3, "sliding_attention", ["sliding_attention"])],
    ({"model_type": "llama", "num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2,
      "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64,
      "quantization_config": {"quant_method": "awq"}}, "quant_method = 'awq' is not modelled"),
    ({"model_type": "llama", "num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2,
      "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64,
      "quantization_config": {"quant_method": "mxfp4"}}, "quant_method = 'mxfp4' is not modelled"),
    ({"model_type": "llama", "vision_config": {}}, "vision_config"),
    ([1, 2], "expected a JSON object"),
])
def test_a_config_orcasim_cannot_model_is_a_one_line_error(
    tmp_path: Path, config: object, message: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ScenarioError, match=message):
        model_from_argument(str(path))


def test_mistral_without_a_window_reads_and_a_missing_file_is_named(tmp_path: Path) -> None:
    config = json.loads(Path("orcasim/data/hf_configs/mistral-7b-v0.1/config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "sliding_window": None}))
    assert model_from_argument(str(path)).param_count() == pytest.approx(7.24e9, rel=PUBLISHED_RTOL)
    with pytest.raises(ScenarioError, match="file 'nowhere.json' not found"):
        model_from_argument("nowhere.json")


def test_a_scenario_s_hf_config_is_read_beside_the_scenario(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """`model: {hf_config: cfg.json}` next to the scenario file, run from another folder: it
    was looked up in the working directory only (not found there, or worse, a different
    cfg.json found there read silently; a tester's finding)."""
    from orcasim.scenario import load_scenario

    config = json.loads(Path("orcasim/data/hf_configs/mistral-7b-v0.1/config.json").read_text())
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "cfg.json").write_text(json.dumps(config))
    (tmp_path / "cfg.json").write_text(json.dumps({**config, "num_hidden_layers": 8}))
    (tmp_path / "d" / "s.yaml").write_text(
        "name: s\nworkload: {num_requests: 4, arrival: {kind: poisson, rate_per_s: 1},\n"
        "  prompt_tokens: {kind: constant, value: 8}, output_tokens: {kind: constant, value: 4},\n"
        "  max_tokens: 64}\nmodel: {hf_config: cfg.json}\nhardware: {gpu: a100-80gb}\n"
        "cost: {kind: roofline}\nsystems: [{name: a, scheduler: {kind: iteration_level, max_batch_size: 4}}]\n")
    monkeypatch.chdir(tmp_path)
    scenario = load_scenario("d/s.yaml")
    assert scenario.model.num_layers == config["num_hidden_layers"] == 32


@pytest.mark.parametrize(("key", "field"), [("head_dim", "head_size"),
                                            ("num_key_value_heads", "num_kv_heads")])
def test_a_zero_in_a_config_is_refused_not_replaced(tmp_path: Path, key: str, field: str) -> None:
    """`head_dim: 0` read as no head_dim, and `num_key_value_heads: 0` as Mistral's default of
    8: a broken config ran as another model (a tester's low finding)."""
    config = json.loads(Path("orcasim/data/hf_configs/mistral-7b-v0.1/config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, key: 0}))
    with pytest.raises(ScenarioError, match=f"{field} = 0: Input should be greater than 0"):
        model_from_argument(str(path))


def test_fp8_weights_run_their_gemms_at_the_fp8_peak_where_the_gpu_has_one() -> None:
    """4,096 tokens of prefill: fp8 weights on an H100 (fp8 tensor cores) halve the
    compute-bound GEMMs and leave attention as it was; on an A100 (none) they only save
    weight reads, which compute-bound GEMMs do not feel."""
    def costs(gpu: str, **extra: object) -> Roofline:
        return Roofline(RooflineCostConfig(kind="roofline"), Deployment(
            model=hf("llama-3.1-70b", **extra), hardware=HardwareConfig(gpu=gpu, tensor_parallel=8)))

    q = c = np.array([4096])
    for gpu, speedup in (("h100-80gb", 1978.9 / 989.4), ("a100-80gb", 1.0)):  # the datasheets'
        bf16, fp8 = costs(gpu), costs(gpu, weight_dtype="fp8")
        for slow, fast in zip(bf16.ops, fp8.ops, strict=True):
            launch_s = bf16.cfg.kernel_overhead_s
            ratio = float((bf16.op_time_s(slow, 4096.0) - launch_s)
                          / (fp8.op_time_s(fast, 4096.0) - launch_s))
            # GEMMs (compute-bound) by the peaks' ratio; elementwise ops are memory-bound.
            expected = speedup if slow.name.endswith("proj") else 1.0
            assert ratio == pytest.approx(expected, rel=1e-9), (gpu, slow.name)
        assert float(bf16.attention_per_layer_s(q, c)) == float(fp8.attention_per_layer_s(q, c))


def test_the_models_scenario_runs_each_model_it_compares() -> None:
    """scenarios/models/dense_vs_moe.yaml, shortened, with the dense model and the MoE:
    the MoE's KV never exceeds the 146,372 tokens its 61 GB of weights leave on an H100,
    and its decode steps, reading many experts, are slower than the dense model's."""
    from orcasim.run import run_scenario

    scenario = Path("scenarios/models/dense_vs_moe.yaml")
    summaries = {}
    for model in ("llama-3.2-3b", "qwen3-30b-a3b"):
        result = run_scenario(scenario, ("workload.num_requests=150", "warmup_s=0",
                                         f"model.hf_config=hf_configs/{model}/config.json",
                                         "workload.arrival.rate_per_s=4"), base_dir=scenario.parent)
        summaries[model] = result.systems["vllm"].summary
    assert summaries["qwen3-30b-a3b"]["kv_reserved_tokens_max"] <= 146_372
    assert summaries["qwen3-30b-a3b"]["tpot_s_p50"] > summaries["llama-3.2-3b"]["tpot_s_p50"]


def test_the_roofline_holds_where_it_applies_on_measured_kernels() -> None:
    """aiconfigurator's measured vLLM kernels (scenarios/models/validate_operators.py): the
    fused MoE within 15% (median |error|) up to 256 tokens on the H100, and MLA decode within
    15% where the KV read dominates; the compute-bound MoE is off by more (reported, not hidden)."""
    from scenarios.models.validate_operators import TARGET, mla_errors, moe_errors

    moe = moe_errors("h100-80gb")
    assert moe.loc[moe["num_tokens"] <= 256, "error"].abs().median() <= TARGET
    assert moe.loc[moe["num_tokens"] > 1024, "error"].median() < -TARGET  # too fast: see the report
    mla = mla_errors()
    assert mla.loc[mla["kv_tokens_read"] > 1e6, "error"].abs().median() <= TARGET


def test_the_model_command_takes_a_weight_precision() -> None:
    """The README's command: the shipped DeepSeek-V3 config names no quantization_config
    (bf16, 1.34 TB: too much for 8 H200s); with --weight-dtype fp8 it fits, at 671 GB."""
    from typer.testing import CliRunner

    from orcasim.cli import app

    args = ["model", "hf_configs/deepseek-v3/config.json", "--gpu", "h200", "--tensor-parallel", "8"]
    assert CliRunner().invoke(app, args).exit_code == 2
    done = CliRunner().invoke(app, [*args, "--weight-dtype", "fp8"])
    assert done.exit_code == 0, done.output
    assert "671,026,404,352" in done.output


@pytest.mark.parametrize(("options", "message"), [
    (["--pipeline-parallel", "2000"], "error: --pipeline-parallel = 2000: Input should be less than or equal to 1024"),
    (["--tensor-parallel", "3"], "error: --tensor-parallel = 3 does not divide llama3-70b's 64 attention heads; expected one of 1, 2, 4, 8, 16, 32, 64"),
    (["--gpu", "nope"], "error: --gpu = 'nope': unknown gpu 'nope'; known gpus: "),
    ([], "error: --tensor-parallel = 1 (--pipeline-parallel 1): model llama3-70b needs 131.4 GiB of weights per GPU on 1 x h100-80gb, leaving no "
         "room for KV in the 70.3 GiB budget; expected more GPUs (--tensor-parallel, "
         "--pipeline-parallel, --expert-parallel), fewer weight bytes (--weight-dtype), or in a "
         "scenario an explicit kv_capacity_tokens"),
])
def test_the_model_commands_errors_name_its_flags(options: list[str], message: str) -> None:
    """The command has flags, not the scenario's hardware keys: `--pipeline-parallel 2000`
    read 'hardware: pipeline_parallel = 2000', a key the user never typed."""
    from typer.testing import CliRunner

    from orcasim.cli import app

    done = CliRunner().invoke(app, ["model", "llama3-70b", "--gpu", "h100-80gb", *options])
    assert done.exit_code == 2
    assert done.output.startswith(message), done.output
    assert "hardware" not in done.output and len(done.output.strip().splitlines()) == 1


def test_a_mistral_config_without_kv_heads_has_transformers_default(tmp_path: Path) -> None:
    """transformers' MistralConfig (and MixtralConfig) default num_key_value_heads to 8, where
    Llama's default to the attention heads: a trimmed Mistral-7B config read as 32 KV heads,
    four times the KV and 8.05B parameters against 7.24B."""
    config = {"model_type": "mistral", "num_attention_heads": 32, "hidden_size": 4096,
              "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 32000,
              "max_position_embeddings": 32768}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert model_from_argument(str(path)).num_kv_heads == 8
    path.write_text(json.dumps({**config, "model_type": "llama"}))
    assert model_from_argument(str(path)).num_kv_heads == 32


def test_a_moe_block_error_names_its_key_once(tmp_path: Path) -> None:
    """`orcasim model` validates a model alone, under `moe`: the error read
    'moe.model.moe.experts_per_token'."""
    config = json.loads((Path(__file__).parent.parent / "orcasim" / "data" / "hf_configs"
                         / "mixtral-8x7b" / "config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "num_experts_per_tok": 9}))
    with pytest.raises(ScenarioError) as err:
        model_from_argument(str(path))
    assert str(err.value) == (f"model {path}: model.moe.experts_per_token = 9 exceeds "
                              "num_experts = 8; expected at most that")


def test_a_model_s_folder_stands_for_its_config_json(tmp_path: Path) -> None:
    """A downloaded model is a folder holding config.json: `orcasim model ./Mistral-7B` said
    'unknown model' and `model: {hf_config: ./Mistral-7B}` 'is a folder'. A folder without
    one is refused saying what it should hold; a catalog name still wins over a folder."""
    import os
    import subprocess
    import sys

    from orcasim.cost.catalog import model_from_argument
    from orcasim.scenario import scenario_from_dict

    config = Path("orcasim/data/hf_configs/mistral-7b-v0.1/config.json").read_text()
    folder = tmp_path / "Mistral-7B"
    folder.mkdir()
    (folder / "config.json").write_text(config)
    by_folder, by_file = model_from_argument(str(folder)), model_from_argument(str(folder / "config.json"))
    assert by_folder.num_layers == by_file.num_layers == 32 and by_folder.name == "Mistral-7B"
    scenario = scenario_from_dict({
        "name": "s", "model": {"hf_config": str(folder)}, "hardware": {"gpu": "a100-80gb"},
        "cost": {"kind": "roofline"},
        "workload": {"num_requests": 4, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                     "prompt_tokens": {"kind": "constant", "value": 8},
                     "output_tokens": {"kind": "constant", "value": 4}, "max_tokens": 64},
        "systems": [{"name": "a", "scheduler": {"kind": "iteration_level", "max_batch_size": 4}}]})
    assert scenario.model is not None and scenario.model.num_layers == 32
    (tmp_path / "empty").mkdir()
    done = subprocess.run([sys.executable, "-m", "orcasim", "model", str(tmp_path / "empty")],
                          capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "is a folder" in done.stderr and "or a folder holding config.json" in done.stderr
    (tmp_path / "opt-13b").mkdir()  # a folder named as a catalog model, in the working folder
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert model_from_argument("opt-13b").num_layers == 40
    finally:
        os.chdir(cwd)


def test_a_weight_dtype_set_on_a_read_model_overrides_its_checkpoints_experts_too() -> None:
    """A sweep's point sets `model.weight_dtype` on the model as read (its dump): gpt-oss's
    mxfp4 experts, from its quantization_config, stayed mxfp4 (13.7 GB of weights where
    `--set model.weight_dtype=bf16` on the file gives 41.8; a tester's finding). Experts a
    model gives in its own keys keep their precision."""
    from orcasim.cost.catalog import ModelSpec, model_from_argument

    config = "orcasim/data/hf_configs/gpt-oss-20b/config.json"
    read = ModelSpec.model_validate({"hf_config": config})
    assert read.moe is not None and read.moe.expert_weight_dtype == "mxfp4"
    as_set = ModelSpec.model_validate({"hf_config": config, "weight_dtype": "bf16"})
    swept = ModelSpec.model_validate({**read.model_dump(mode="json"), "weight_dtype": "bf16"})
    assert swept.moe is not None and swept.moe.expert_weight_dtype is None
    assert swept.weight_bytes() == as_set.weight_bytes() > 2.5 * read.weight_bytes()
    assert model_from_argument(config, "bf16").weight_bytes() == as_set.weight_bytes()
    # The dump of a read model reads back as the same model.
    assert ModelSpec.model_validate(read.model_dump(mode="json")) == read
    own = {**read.model_dump(mode="json"), "weight_dtype": "bf16"}
    own["moe"] = {**own["moe"], "expert_weight_dtype_from": "model"}
    assert ModelSpec.model_validate(own).moe.expert_weight_dtype == "mxfp4"  # type: ignore[union-attr]


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("sliding_window", "abc", "expected an integer"), ("sliding_window", 100.7, "expected an integer"),
    ("max_window_layers", "x", "expected an integer"), ("hidden_size", True, "expected an integer"),
    ("tie_word_embeddings", "false", "expected true or false"),
])
def test_a_config_value_of_the_wrong_type_is_refused_by_name(tmp_path: Path, key: str,
                                                             value: object, expected: str) -> None:
    """int() took 100.7 as 100, bool() the string "false" as true, and "abc" failed without
    naming its key (a tester's finding)."""
    from orcasim.cost.catalog import model_from_argument

    config = json.loads(Path("orcasim/data/hf_configs/qwen2-7b/config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, key: value, "use_sliding_window": True}
                               if key != "use_sliding_window" else {**config, key: value}))
    with pytest.raises(ScenarioError, match=f": {key} = {re.escape(json.dumps(value))}; {expected}$"):
        model_from_argument(str(path))


def test_a_layer_named_twice_is_refused() -> None:
    """dense_layers [0, 0, 0, 0, 0] took layer 0's experts off five times: negative routed
    parameters and a faster roofline (a tester's finding)."""
    from orcasim.cost.catalog import ModelSpec

    moe = {"num_experts": 8, "experts_per_token": 2, "expert_intermediate_size": 2048}
    base = {"num_layers": 4, "hidden_size": 512, "num_heads": 8}
    # Raised inside the model's validation (a scenario names it as one line).
    with pytest.raises(ValueError, match=r"model.moe.dense_layers \[0, 0\] names layer 0 twice"):
        ModelSpec.model_validate({**base, "moe": {**moe, "dense_layers": [0, 0]}})
    with pytest.raises(ValueError, match=r"model.sliding_window_layers \[1, 3, 1\] names layer 1"):
        ModelSpec.model_validate({**base, "sliding_window": 64, "sliding_window_layers": [1, 3, 1]})


@pytest.mark.parametrize(("name", "key"), [
    ("mixtral-8x7b", "num_local_experts"), ("qwen3-30b-a3b", "num_experts"),
    ("gpt-oss-20b", "num_local_experts"),
    ("qwen3-30b-a3b", "moe_intermediate_size"), ("deepseek-v3", "moe_intermediate_size"),
])
def test_a_moe_family_s_config_without_its_expert_count_or_width_is_refused(
    tmp_path: Path, name: str, key: str,
) -> None:
    """Without its expert count a Mixtral config read as a dense 7.24B model (46.70B) and
    Qwen3-30B-A3B as a dense 3.34B one (30.53B), in silence; without its experts' own
    width Qwen3-30B-A3B took the dense MLP's, 233.5B parameters, and DeepSeek-V3 5.9T."""
    config = json.loads(Path(f"orcasim/data/hf_configs/{name}/config.json").read_text())
    del config[key]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    expected = "missing moe_intermediate_size" if key == "moe_intermediate_size" else \
        "missing the expert count (num_local_experts"
    with pytest.raises(ScenarioError, match=re.escape(expected)):
        model_from_argument(str(path))


@pytest.mark.parametrize(("name", "key", "value", "expected"), [
    ("qwen3-30b-a3b", "moe_intermediate_size", 0, "expert_intermediate_size = 0: Input should be greater than 0"),
    ("gpt2", "n_inner", 0, "intermediate_size = 0: Input should be greater than 0"),
    ("mixtral-8x7b", "num_local_experts", 0, "moe.num_experts = 0: Input should be greater than 0"),
    ("qwen3-30b-a3b", "num_experts", 0, "moe.num_experts = 0: Input should be greater than 0"),
    ("deepseek-v3", "n_routed_experts", 0, "moe.num_experts = 0: Input should be greater than 0"),
    ("qwen3-30b-a3b", "decoder_sparse_step", 0, "decoder_sparse_step = 0; expected a positive integer"),
    ("deepseek-v3", "moe_layer_freq", 0, "moe_layer_freq = 0; expected a positive integer"),
    ("qwen3-30b-a3b", "mlp_only_layers", 5, "mlp_only_layers = 5; expected a list of 0-based layer"),
])
def test_a_moe_config_s_zero_or_wrong_kind_is_refused_not_replaced(
    tmp_path: Path, name: str, key: str, value: object, expected: str,
) -> None:
    """`moe_intermediate_size: 0` read as the dense MLP's 6,144 (Qwen3-30B-A3B: 233.5B
    parameters, not 30.5B), `n_inner: 0` as 4 x hidden, a step of 0 as 1, an expert count
    of 0 as a dense model (Mixtral-8x7B: 7.24B parameters, not 46.70B), and
    `mlp_only_layers: 5` was a TypeError traceback (a tester's finding)."""
    config = json.loads(Path(f"orcasim/data/hf_configs/{name}/config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, key: value}))
    with pytest.raises(ScenarioError, match=re.escape(expected)):
        model_from_argument(str(path))


def test_orcasim_model_says_what_its_kv_capacity_assumed() -> None:
    """`orcasim model qwen2-7b --gpu a100-80gb` printed kv_capacity_tokens 1,049,560 with no
    word of the utilisation and reserve it took, so it could not be redone by hand: (79.15 GiB
    x 0.9 - 1 GiB - 15,231,233,024 weight bytes) / 57,344 bytes a token is 1,049,560."""
    from typer.testing import CliRunner

    from orcasim.cli import app

    result = CliRunner().invoke(app, ["model", "hf_configs/qwen2-7b/config.json", "--gpu", "a100-80gb"])
    assert result.exit_code == 0, result.output
    assert "1,049,560" in result.output
    assert ("kv_capacity_tokens: 79.15 GiB a GPU x gpu_memory_utilization 0.9, less "
            "activation_reserve_gib 1 and the weights") in result.output
    without_gpu = CliRunner().invoke(app, ["model", "hf_configs/qwen2-7b/config.json"])
    assert "gpu_memory_utilization" not in without_gpu.output
