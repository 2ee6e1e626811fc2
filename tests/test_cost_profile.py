"""Interpolation in measured tables and the `profile` cost model built on it."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orcasim.config import ScenarioError
from orcasim.cost import Batch
from orcasim.cost.catalog import Deployment, HardwareConfig, model_spec
from orcasim.cost.interp import SlicedTable2D, Table1D
from orcasim.cost.profile import ProfileCost, ProfileCostConfig
from orcasim.cost.profile_tables import (
    aiconfigurator_attention,
    mlp_table,
    network_table,
    vidur_attention,
)
from orcasim.paths import PACKAGE_DATA_DIR
from tests.conftest import examples

VIDUR = "profiles/vidur"
MLP_70B_A100 = f"{VIDUR}/compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv"
ATTENTION_70B_TP2 = f"{VIDUR}/compute/a100/attention_llama2_70b_tp2.csv"
ALL_REDUCE_A100 = f"{VIDUR}/network/a100_dgx/all_reduce.csv"
HELD_OUT_MEDIAN_REL_ERROR = 0.10  # the target for points held out of the table
DECODE_STEP_REL_TOL = 1e-12


def llama70b_tp2(**cfg: str) -> ProfileCost:
    dep = Deployment(model=model_spec("llama2-70b"), hardware=HardwareConfig(gpu="a100-80gb", tensor_parallel=2))
    return ProfileCost(ProfileCostConfig(kind="profile", mlp_csv=MLP_70B_A100, **cfg), dep)


@settings(max_examples=examples(30), deadline=None)
@given(st.lists(st.floats(0.0, 1e4, allow_nan=False), min_size=2, max_size=20, unique=True))
def test_table1d_returns_measured_values_at_measured_points(xs: list[float]) -> None:
    x = np.array(xs)
    y = np.sin(x) + 2.0
    values, outside = Table1D.from_points(x, y)(x)
    np.testing.assert_array_equal(values, y)
    assert not outside.any()


def test_table1d_flags_and_extrapolates_linearly_outside() -> None:
    table = Table1D.from_points(np.array([1.0, 2.0, 4.0]), np.array([10.0, 20.0, 30.0]))
    values, outside = table(np.array([0.0, 3.0, 6.0]))
    np.testing.assert_allclose(values, [0.0, 25.0, 40.0])
    assert outside.tolist() == [True, False, True]


def test_sliced_table_is_exact_on_its_grid_and_bilinear_between() -> None:
    a = np.repeat([1.0, 2.0, 4.0], 3)
    b = np.tile([10.0, 20.0, 40.0], 3)
    z = a * 100 + b
    table = SlicedTable2D.from_points(a, b, z)
    values, outside = table(a, b)
    np.testing.assert_array_equal(values, z)
    assert not outside.any()
    mid, out = table(np.array([3.0]), np.array([30.0]))
    assert mid[0] == pytest.approx(330.0) and not out[0]  # z is bilinear, so exact
    _, out = table(np.array([8.0, 2.0]), np.array([20.0, 50.0]))
    assert out.tolist() == [True, True]


def _held_out_error(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Build the table from even-indexed points, evaluate on the odd ones."""
    order = np.argsort(x)
    x, y = x[order], y[order]
    table = Table1D.from_points(x[::2], y[::2])
    inner = slice(1, len(x) - 1, 2)
    values, outside = table(x[inner])
    assert not outside.any()
    return np.abs(values - y[inner]) / y[inner]


@pytest.mark.validation
def test_profile_is_accurate_on_held_out_points() -> None:
    errors = []
    for tp in (1, 2, 4):
        per_layer, _ = mlp_table(MLP_70B_A100, model_spec("llama2-70b"), tp)
        errors.append(_held_out_error(per_layer.x, per_layer.y))
    df = pd.read_csv(PACKAGE_DATA_DIR / ATTENTION_70B_TP2)
    decode = df[~df["is_prefill"] & (df["batch_size"] == 32)]
    errors.append(_held_out_error(decode["kv_cache_size"].to_numpy(), decode["time_stats.attn_decode.median"].to_numpy()))
    pooled = np.concatenate(errors)
    assert np.median(pooled) < HELD_OUT_MEDIAN_REL_ERROR, np.median(pooled)


def test_profile_decode_steps_agree_with_iteration_time() -> None:
    cost = llama70b_tp2(attention_csv=ATTENTION_70B_TP2, all_reduce_csv=ALL_REDUCE_A100)
    context = np.array([100, 700, 1500])
    steps = cost.decode_steps_s(context, 12)
    one = np.ones_like(context)
    expected = [cost.iteration_time_s(Batch(one, context + j)) for j in range(12)]
    np.testing.assert_allclose(steps, expected, rtol=DECODE_STEP_REL_TOL)
    assert cost.out_of_range_count() == 0


def test_out_of_range_warns_once_and_is_counted() -> None:
    cost = llama70b_tp2(attention_csv=ATTENTION_70B_TP2)
    with pytest.warns(UserWarning, match="outside its measured range"):
        cost.iteration_time_s(Batch(np.array([6000]), np.array([6000])))  # beyond 4096 tokens
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # already warned for these tables: silent, but counted
        cost.iteration_time_s(Batch(np.array([7000]), np.array([7000])))
    assert cost.out_of_range_count() == 2
    cost.iteration_time_s(Batch(np.array([64, 1]), np.array([64, 900])))
    assert cost.out_of_range_count() == 2


def test_aiconfigurator_attention_tables() -> None:
    dep = Deployment(model=model_spec("llama2-70b"), hardware=HardwareConfig(gpu="a100-80gb", tensor_parallel=2))
    cost = ProfileCost(ProfileCostConfig(kind="profile", mlp_csv=MLP_70B_A100,
                                         aiconfigurator_dir="profiles/aiconfigurator/a100_sxm"), dep)
    decode = cost.iteration_time_s(Batch(np.ones(16, np.int64), np.full(16, 1023)))
    prefill = cost.iteration_time_s(Batch(np.array([1024]), np.array([1024])))
    assert 0 < decode < prefill
    assert cost.out_of_range_count() == 0


def test_tables_measured_on_another_gpu_warn() -> None:
    """Vidur's A100 tables priced an H100 deployment's iterations as the A100's, with
    nothing said (a left-alone note): the GPU a table's folder names is the deployment's
    GPU family, or a warning names the key. The A100-40GB is the tables' A100 family."""
    def built(gpu: str, **tables: str) -> None:
        dep = Deployment(model=model_spec("llama2-70b"),
                         hardware=HardwareConfig(gpu=gpu, tensor_parallel=2))
        ProfileCost(ProfileCostConfig(kind="profile", mlp_csv=MLP_70B_A100, **tables), dep)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        built("a100-80gb", attention_csv=ATTENTION_70B_TP2, all_reduce_csv=ALL_REDUCE_A100)
        built("a100-40gb")
    with pytest.warns(UserWarning, match=r"^cost\.mlp_csv = '.*/a100/.*': measured on an a100 "
                                         r"\(its folder a100\), but the deployment runs on "
                                         r"h100-80gb; its times are the a100's"):
        built("h100-80gb")
    with pytest.warns(UserWarning, match=r"^cost\.all_reduce_csv = .*: measured on an h100 "
                                         r"\(its folder h100_dgx\)"):
        built("a100-80gb", all_reduce_csv=f"{VIDUR}/network/h100_dgx/all_reduce.csv")


def test_a_table_of_another_model_is_refused() -> None:
    dep = Deployment(model=model_spec("llama2-7b"), hardware=HardwareConfig(gpu="a100-80gb"))
    with pytest.raises(ScenarioError, match="n_embd"):
        ProfileCost(ProfileCostConfig(kind="profile", mlp_csv=MLP_70B_A100), dep)
    dep8 = Deployment(model=model_spec("llama2-70b"), hardware=HardwareConfig(gpu="a100-80gb", tensor_parallel=16))
    with pytest.raises(ScenarioError, match="num_tensor_parallel_workers = 16"):
        ProfileCost(ProfileCostConfig(kind="profile", mlp_csv=MLP_70B_A100), dep8)


@pytest.mark.slow
def test_profile_scenario_runs_and_counts_out_of_range_iterations() -> None:
    from orcasim import run_scenario
    from orcasim.scenario import load_scenario

    sc = load_scenario("scenarios/profile_llama2_70b.yaml", ["workload.num_requests=30"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # request-level pads 16 prompts past the 4096-token table
        result = run_scenario(sc)
    summary = result.summary_frame()
    assert summary.loc["request-level", "cost_out_of_range"] > 0
    assert summary.loc["orca-roofline", "cost_out_of_range"] == 0
    assert (summary["requests_completed"] == 30).all()


# --- tables and the profile cost by hand (what the mutation run found unpinned) ----------------

SEND_RECV_A100 = f"{VIDUR}/network/a100_dgx/send_recv.csv"
VIDUR_OPS = ["input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add"]


def _raw(path: str) -> pd.DataFrame:
    return pd.read_csv(PACKAGE_DATA_DIR / path)


def test_a_layers_token_ops_are_vidurs_medians_in_seconds_with_two_residual_adds() -> None:
    row = _raw(MLP_70B_A100).query("num_tensor_parallel_workers == 2 and num_tokens == 64").iloc[0]
    per_layer_ms = sum(row[f"time_stats.{op}.median"] for op in VIDUR_OPS) + row["time_stats.add.median"]
    ops, emb = mlp_table(MLP_70B_A100, model_spec("llama2-70b"), 2)
    assert float(ops(64.0)[0]) == pytest.approx(per_layer_ms * 1e-3, rel=1e-12)
    assert float(emb(64.0)[0]) == pytest.approx(row["time_stats.emb.median"] * 1e-3, rel=1e-12)


def test_a_table_without_embedding_times_gives_a_free_embedding(tmp_path) -> None:  # noqa: ANN001
    df = _raw(MLP_70B_A100).drop(columns=["time_stats.emb.median"])
    path = tmp_path / "mlp.csv"
    df.to_csv(path, index=False)
    ops, emb = mlp_table(str(path), model_spec("llama2-70b"), 2)
    assert float(emb(64.0)[0]) == 0.0 and float(ops(64.0)[0]) > 0.0


def test_vidur_attention_tables_hold_their_medians_in_seconds() -> None:
    df = _raw(ATTENTION_70B_TP2)
    decode, prefill = _raw_attention_rows(df)
    d_table, p_table = vidur_attention(ATTENTION_70B_TP2, model_spec("llama2-70b"), 2)
    assert float(d_table(decode.batch_size, decode.kv_cache_size)[0]) == pytest.approx(
        decode["time_stats.attn_decode.median"] * 1e-3, rel=1e-12)
    assert float(p_table(prefill.kv_cache_size, prefill.prefill_chunk_size)[0]) == pytest.approx(
        prefill["time_stats.attn_prefill.median"] * 1e-3, rel=1e-12)


def _raw_attention_rows(df: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    decode = df[~df["is_prefill"].astype(bool)].query("batch_size == 8 and kv_cache_size == 1024").iloc[0]
    prefill = df[df["is_prefill"].astype(bool)].query("kv_cache_size == 512 and prefill_chunk_size == 256").iloc[0]
    return decode, prefill


def test_a_collective_table_is_read_for_the_deployments_placement() -> None:
    """Two workers in one node (2 per node), or across nodes (1 per node)."""
    df = _raw(ALL_REDUCE_A100)
    hw = HardwareConfig(gpu="a100-80gb", tensor_parallel=2)
    for crosses, per_node in ((False, 2), (True, 1)):
        row = df.query(f"num_workers == 2 and devices_per_node == {per_node}").iloc[3]
        table = network_table(ALL_REDUCE_A100, "all_reduce", 2, hw, crosses)
        assert float(table(row["size"])[0]) == pytest.approx(row["time_stats.all_reduce.median"] * 1e-3, rel=1e-12)
    in_node = network_table(ALL_REDUCE_A100, "all_reduce", 2, hw)  # the default: inside a node
    assert in_node.y.tolist() == network_table(ALL_REDUCE_A100, "all_reduce", 2, hw, False).y.tolist()
    with pytest.raises(ScenarioError, match=r"^cost: .*all_reduce.csv has no rows for 16 workers with 1 per "
                                            r"node; measured: \[8\]$"):
        network_table(ALL_REDUCE_A100, "all_reduce", 16, hw, True)
    with pytest.raises(ScenarioError, match=r"^cost: .*all_reduce.csv has no rows for num_workers = 3; "
                                            r"measured: \[2, 4, 8, 16\]$"):
        network_table(ALL_REDUCE_A100, "all_reduce", 3, hw)


def test_a_table_of_another_shape_names_its_file() -> None:
    with pytest.raises(ScenarioError, match=f"^cost: {MLP_70B_A100}: column 'n_embd'"):
        mlp_table(MLP_70B_A100, model_spec("llama2-7b"), 1)
    with pytest.raises(ScenarioError, match=f"^cost: {ATTENTION_70B_TP2}: column 'n_embd'"):
        vidur_attention(ATTENTION_70B_TP2, model_spec("llama2-7b"), 2)
    with pytest.raises(ScenarioError, match=f"^cost: {MLP_70B_A100} has no rows for num_tensor_parallel_workers = 16"):
        mlp_table(MLP_70B_A100, model_spec("llama2-70b"), 16)


def test_aiconfigurator_tables_by_hand() -> None:
    """Decode: a generation row's latency; prefill: a context row of the smallest batch,
    per sequence, at zero cached KV."""
    directory = PACKAGE_DATA_DIR / "profiles/aiconfigurator/a100_sxm"
    gen = pd.read_parquet(sorted(directory.rglob("generation_attention_perf.parquet"))[0])
    ctx = pd.read_parquet(sorted(directory.rglob("context_attention_perf.parquet"))[0])
    shape = "num_heads == 32 and num_key_value_heads == 4 and head_dim == 128"
    g = gen.query(shape).iloc[5]
    smallest = ctx.query(shape)["batch_size"].min()
    c = ctx.query(f"{shape} and batch_size == {smallest}").iloc[2]
    decode, prefill = aiconfigurator_attention("profiles/aiconfigurator/a100_sxm", model_spec("llama2-70b"), 2)
    assert float(decode(g.batch_size, g.step)[0]) == pytest.approx(g.latency * 1e-3, rel=1e-12)
    assert float(prefill(0.0, c.isl)[0]) == pytest.approx(c.latency / c.batch_size * 1e-3, rel=1e-12)
    assert prefill.a.tolist() == [0.0]
    with pytest.raises(ScenarioError, match="^cost: aiconfigurator_dir 'nowhere' is not a folder$"):
        aiconfigurator_attention("nowhere", model_spec("llama2-70b"), 2)


def test_aiconfigurator_rows_of_one_shape_bf16_kv_no_window_and_one_kernel() -> None:
    from orcasim.cost.profile_tables import _select_heads

    model = model_spec("llama2-70b")  # TP 2: 32 query heads, 4 KV heads, head_dim 128 a rank
    rows = pd.DataFrame({
        "num_heads": [32, 32, 32, 32, 32, 16, 32], "num_key_value_heads": [4, 4, 4, 4, 8, 4, 4],
        "head_dim": [128, 128, 128, 128, 128, 128, 64],
        "kv_cache_dtype": ["bfloat16", "bfloat16", "fp8", "bfloat16", "bfloat16", "bfloat16", "bfloat16"],
        "window_size": [0, 0, 0, 128, 0, 0, 0],
        "kernel_source": ["b_kernel", "a_kernel", "a_kernel", "a_kernel", "a_kernel", "a_kernel", "a_kernel"],
    })
    assert _select_heads(rows, model, 2, "x").index.tolist() == [1]
    assert _select_heads(rows.iloc[[0]], model, 2, "x").index.tolist() == [0]
    with pytest.raises(ScenarioError, match=r"^cost: no generation attention rows for 32 query heads, 4 KV heads, "
                                            r"head_dim 128 per rank; measured \(heads, kv_heads, head_dim\): "
                                            r"\[\(16, 4, 128\), \(32, 8, 128\)\]$"):
        _select_heads(rows.iloc[[4, 5]], model, 2, "generation attention")
    # A table of many shapes lists the first twelve, sorted: the message stays one line.
    many = pd.DataFrame({"num_heads": np.arange(1, 15), "num_key_value_heads": np.ones(14, dtype=int),
                         "head_dim": np.full(14, 128)})
    with pytest.raises(ScenarioError) as error:
        _select_heads(many, model, 2, "x")
    listed = str(error.value).split("head_dim): ")[1]
    assert listed == str([(h, 1, 128) for h in range(1, 13)])


def test_the_profile_cost_composes_its_parts_by_hand() -> None:
    """Iteration = layers x (token ops + attention) + embedding + collectives + LM head.
    Attention: the decodes as one batch at their mean KV, each prefill at its cached KV and
    chunk; collectives: two all-reduces a layer from the table under TP 2."""
    cost = llama70b_tp2(attention_csv=ATTENTION_70B_TP2, all_reduce_csv=ALL_REDUCE_A100)
    d_table, p_table = vidur_attention(ATTENTION_70B_TP2, model_spec("llama2-70b"), 2)
    ops, emb = mlp_table(MLP_70B_A100, model_spec("llama2-70b"), 2)
    all_reduce = network_table(ALL_REDUCE_A100, "all_reduce", 2, HardwareConfig(gpu="a100-80gb", tensor_parallel=2))
    query, context = np.array([1, 1, 64, 128]), np.array([100, 300, 64, 384])
    tokens, layers = 194.0, 80
    attention = (float(d_table(2, 200.0)[0]) + float(p_table(0.0, 64.0)[0]) + float(p_table(256.0, 128.0)[0]))
    size = tokens * 8192 * 2
    expected = (layers * (float(ops(tokens)[0]) + attention) + float(emb(tokens)[0])
                + 2 * layers * float(all_reduce(size)[0])
                + float(cost.roofline.op_time_s(cost.roofline.lm_head, 4.0)))
    assert cost.iteration_time_s(Batch(query, context)) == pytest.approx(expected, rel=1e-12)
    # Decodes alone, and a prompt alone: the other side of attention is zero.
    decodes = cost.iteration_time_s(Batch(np.array([1, 1]), np.array([100, 300])))
    no_attention = layers * float(ops(2.0)[0]) + float(emb(2.0)[0]) + 2 * layers * float(all_reduce(2 * 16384.0)[0]) \
        + float(cost.roofline.op_time_s(cost.roofline.lm_head, 2.0))
    assert decodes == pytest.approx(no_attention + layers * float(d_table(2, 200.0)[0]), rel=1e-12)
    prompt = cost.iteration_time_s(Batch(np.array([64]), np.array([64])))
    alone = layers * (float(ops(64.0)[0]) + float(p_table(0.0, 64.0)[0])) + float(emb(64.0)[0]) \
        + 2 * layers * float(all_reduce(64 * 16384.0)[0]) + float(cost.roofline.op_time_s(cost.roofline.lm_head, 1.0))
    assert prompt == pytest.approx(alone, rel=1e-12)
    assert cost.out_of_range_count() == 0


def test_without_tables_attention_and_collectives_come_from_the_roofline() -> None:
    cost = llama70b_tp2()
    query, context = np.array([1, 30]), np.array([500, 30])
    ops, emb = mlp_table(MLP_70B_A100, model_spec("llama2-70b"), 2)
    roofline = cost.roofline
    expected = (80 * float(ops(31.0)[0]) + float(emb(31.0)[0]) + float(roofline.tp_all_reduce_s(31.0))
                + float(roofline.op_time_s(roofline.lm_head, 2.0))
                + 80 * float(roofline.attention_per_layer_s(query, context)))
    assert cost.iteration_time_s(Batch(query, context)) == pytest.approx(expected, rel=1e-12)
    steps = cost.decode_steps_s(np.array([100, 700]), 3)
    one = np.ones(2, dtype=np.int64)
    np.testing.assert_allclose(steps, [cost.iteration_time_s(Batch(one, np.array([100, 700]) + k))
                                       for k in range(3)], rtol=1e-12)
    empty = np.zeros(0, dtype=np.int64)
    assert cost.iteration_time_s(Batch(empty, empty)) == 0.0
    np.testing.assert_array_equal(cost.decode_steps_s(empty, 2), np.zeros(2))


def test_pipeline_stages_send_from_the_send_recv_table() -> None:
    dep = Deployment(model=model_spec("llama2-70b"),
                     hardware=HardwareConfig(gpu="a100-80gb", tensor_parallel=2, pipeline_parallel=2))
    plain = ProfileCost(ProfileCostConfig(kind="profile", mlp_csv=MLP_70B_A100), dep)
    sends = ProfileCost(ProfileCostConfig(kind="profile", mlp_csv=MLP_70B_A100, send_recv_csv=SEND_RECV_A100), dep)
    table = network_table(SEND_RECV_A100, "send_recv", 2, dep.hardware)
    tokens = np.array(64.0)
    comm, outside = sends._communication(tokens)
    assert float(comm) == pytest.approx(float(plain.roofline.tp_all_reduce_s(64.0)) + float(table(64 * 16384.0)[0]),
                                        rel=1e-12)
    assert not outside
    plain_comm, _ = plain._communication(tokens)
    assert float(plain_comm) == pytest.approx(float(plain.roofline.tp_all_reduce_s(64.0))
                                              + float(plain.roofline.pipeline_sends_s(64.0)), rel=1e-12)


def test_a_decode_step_past_the_tables_counts_every_step() -> None:
    """5,000 decodes a step: beyond mlp.csv's 4,096 tokens, each of three steps is counted."""
    cost = llama70b_tp2()
    with pytest.warns(UserWarning, match="mlp.csv num_tokens queried outside"):
        cost.decode_steps_s(np.full(5000, 10), 3)
    assert cost.out_of_range_count() == 3


def test_an_extrapolation_below_zero_is_refused_not_run_backwards() -> None:
    """Past 4,032 KV tokens and 128 requests the attention table's edge segments fall: 1,024
    decodes at 4,096 tokens priced -0.0104 s, and a run of them recorded an iteration of
    -0.0036 s. Refused as a fit's negative price is, naming the tables."""
    cost = llama70b_tp2(attention_csv=ATTENTION_70B_TP2)
    decodes = np.ones(1024, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cost.iteration_time_s(Batch(decodes, np.full(1024, 4000))) > 0.4
        with pytest.raises(ScenarioError, match=r"profile.*mlp\.csv.*priced a batch of 1024 "
                                                r"requests at -0\.01"):
            cost.iteration_time_s(Batch(decodes, np.full(1024, 4096)))
        with pytest.raises(ScenarioError, match=r"priced a batch of 1024 requests at -0\.0"):
            cost.decode_steps_s(np.full(1024, 4000), 97)


def test_the_profile_cost_names_what_its_tables_do_not_time() -> None:
    from orcasim.cost.profile import _check_profiled_shape

    llama = model_spec("llama2-70b")
    _check_profiled_shape(llama)
    _check_profiled_shape(llama.model_copy(update={"weight_dtype": "fp16", "kv_cache_dtype": "bf16"}))
    cases = [({"weight_dtype": "fp8"}, "fp8 weights"), ({"kv_cache_dtype": "fp8"}, "an fp8 KV cache"),
             ({"sliding_window": 4096}, r"sliding-window attention \(model.sliding_window\)")]
    for update, named in cases:
        with pytest.raises(ScenarioError, match=f"^cost.kind = 'profile': model llama2-70b has {named}, which its "
                                                "tables do not time; expected cost.kind roofline$"):
            _check_profiled_shape(llama.model_copy(update=update))
    with pytest.raises(ScenarioError, match=r"has mixture-of-experts layers \(model.moe\)"):
        _check_profiled_shape(model_spec("mixtral-8x7b"))
    with pytest.raises(ScenarioError, match=r"has latent attention \(model.mla\), fp8 weights, which"):
        _check_profiled_shape(model_spec("deepseek-v3").model_copy(update={"moe": None}))


def test_repeated_measurements_average_and_a_single_point_is_flat() -> None:
    table = Table1D.from_points(np.array([2.0, 1.0, 2.0]), np.array([10.0, 4.0, 20.0]))
    assert table.y.tolist() == [4.0, 15.0]
    flat = Table1D.from_points(np.array([5.0]), np.array([3.0]))
    values, outside = flat(np.array([4.0, 5.0, 6.0]))
    assert values.tolist() == [3.0, 3.0, 3.0] and outside.tolist() == [True, False, True]
    values, outside = table(np.array([1.0, 2.0]))  # the ends themselves: inside, measured
    assert values.tolist() == [4.0, 15.0] and not outside.any()


def test_a_one_slice_table_is_outside_off_its_slice() -> None:
    one = SlicedTable2D.from_points(np.zeros(3), np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0]))
    values, outside = one(np.array([0.0, 1.0, 0.0]), np.array([2.0, 2.0, 9.0]))
    assert values.tolist() == [2.0, 2.0, 9.0] and outside.tolist() == [False, True, True]
    two = SlicedTable2D.from_points(np.array([1.0, 1.0, 2.0, 2.0]), np.array([0.0, 10.0, 0.0, 10.0]),
                                    np.array([0.0, 10.0, 0.0, 20.0]))
    values, outside = two(np.array([1, 2]), np.array([5, 5]))  # integer queries are read as floats
    assert values.tolist() == [5.0, 10.0] and not outside.any()
    values, outside = two(np.array([0.5, 1.5]), np.array([10.0, 10.0]))
    assert values.tolist() == [5.0, 15.0] and outside.tolist() == [True, False]


def test_one_decode_reads_the_table_at_its_own_kv_beside_a_prompt() -> None:
    cost = llama70b_tp2(attention_csv=ATTENTION_70B_TP2)
    d_table, p_table = vidur_attention(ATTENTION_70B_TP2, model_spec("llama2-70b"), 2)
    with_prompt = cost._attention(np.array([[1, 64]]), np.array([[700, 64]]))[0][0]
    assert with_prompt == pytest.approx(80 * (float(d_table(1, 700.0)[0]) + float(p_table(0.0, 64.0)[0])), rel=1e-12)


def test_each_out_of_range_warning_names_its_table() -> None:
    dep = Deployment(model=model_spec("llama2-70b"),
                     hardware=HardwareConfig(gpu="a100-80gb", tensor_parallel=2, pipeline_parallel=2))
    cost = ProfileCost(ProfileCostConfig(kind="profile", mlp_csv=MLP_70B_A100, attention_csv=ATTENTION_70B_TP2,
                                         all_reduce_csv=ALL_REDUCE_A100, send_recv_csv=SEND_RECV_A100), dep)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cost.iteration_time_s(Batch(np.ones(300, dtype=np.int64), np.full(300, 3000)))
        cost.iteration_time_s(Batch(np.array([9000]), np.array([9000])))
    named = sorted(str(w.message).split(" queried")[0] for w in caught)
    assert named == ["profile cost: all_reduce.csv size", "profile cost: attention decode",
                     "profile cost: attention prefill", "profile cost: mlp.csv num_tokens",
                     "profile cost: send_recv.csv size"]
    # Only the send table past its range: the iteration still counts as out of range.
    comm, outside = cost._communication(np.array([2.0e6]))
    assert bool(outside)


def test_stages_across_nodes_send_at_one_gpu_a_node() -> None:
    """TP 8 x PP 2 spans two 8-GPU nodes: the stage boundary crosses them (1 per node);
    TP 4 x PP 2 fits one node: 2 workers in a node; TP 4 x PP 4 crosses at its middle
    boundary alone, and its iteration adds one send across and two inside."""
    def sends(tp: int, pp: int = 2) -> ProfileCost:
        dep = Deployment(model=model_spec("llama2-70b"),
                         hardware=HardwareConfig(gpu="a100-80gb", tensor_parallel=tp, pipeline_parallel=pp))
        return ProfileCost(ProfileCostConfig(kind="profile", mlp_csv=MLP_70B_A100, send_recv_csv=SEND_RECV_A100), dep)

    hw = HardwareConfig(gpu="a100-80gb")
    across = network_table(SEND_RECV_A100, "send_recv", 2, hw, True)
    inside = network_table(SEND_RECV_A100, "send_recv", 2, hw, False)
    assert [t.y.tolist() for t in sends(8).boundary_sends] == [across.y.tolist()] != [inside.y.tolist()]
    assert [t.y.tolist() for t in sends(4).boundary_sends] == [inside.y.tolist()]
    four = sends(4, pp=4)
    assert [t.y.tolist() for t in four.boundary_sends] == [inside.y.tolist(), across.y.tolist(),
                                                           inside.y.tolist()]
    size = 64 * 8192 * 2.0
    comm, _ = four._communication(np.array(64.0))
    want = float(four.roofline.tp_all_reduce_s(64.0)) + 2 * float(inside(size)[0]) + float(across(size)[0])
    assert float(comm) == pytest.approx(want, rel=1e-12)


def test_a_sliced_table_brackets_each_query_by_its_neighbouring_slices() -> None:
    """Slices at a = 1, 2, 4 of z = a^2 b / 10 (curved in a, so each pair of slices gives
    another line): queries below, between each pair, on a slice and above extrapolate or
    interpolate from the two nearest."""
    a = np.repeat([1.0, 2.0, 4.0], 2)
    b = np.tile([0.0, 10.0], 3)
    table = SlicedTable2D.from_points(a, b, a * a * b / 10)
    values, outside = table(np.array([0.5, 1.5, 2.0, 3.0, 5.0]), np.full(5, 10.0))
    np.testing.assert_allclose(values, [-0.5, 2.5, 4.0, 10.0, 22.0], rtol=1e-15)
    assert outside.tolist() == [True, False, False, False, True]


def test_tables_outside_the_data_say_what_is_missing(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(ScenarioError, match=r"^cost: .*nowhere\.csv"):
        mlp_table("nowhere.csv", model_spec("llama2-70b"), 2)
    empty = tmp_path / "aic"
    empty.mkdir()
    with pytest.raises(ScenarioError, match=f"^cost: aiconfigurator_dir '{empty}' holds no "
                                            "generation_attention_perf.parquet$"):
        aiconfigurator_attention(str(empty), model_spec("llama2-70b"), 2)
    with pytest.raises(ScenarioError, match=r"column 'n_embd' = \[8192\], expected 4096 for this model"):
        mlp_table(MLP_70B_A100, model_spec("llama2-7b"), 1)


@pytest.mark.parametrize(("reader", "missing"), [
    (lambda path: mlp_table(path, model_spec("llama2-70b"), 2), "num_tensor_parallel_workers, num_tokens"),
    (lambda path: vidur_attention(path, model_spec("llama2-70b"), 2), "is_prefill, batch_size"),
    (lambda path: network_table(path, "all_reduce", 2, HardwareConfig(gpu="a100-80gb")),
     "num_workers, devices_per_node, size, time_stats.all_reduce.median"),
])
def test_a_table_missing_a_column_names_the_file_and_the_columns(tmp_path, reader, missing) -> None:  # noqa: ANN001
    path = tmp_path / "p.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ScenarioError, match=f"^cost: {path}: missing column\\(s\\) {missing}.*; "
                                            "expected columns ") as caught:
        reader(str(path))
    assert "\n" not in str(caught.value)


def test_an_mlp_table_without_operator_times_is_refused(tmp_path) -> None:  # noqa: ANN001
    """Its shape columns alone would price every layer at nothing."""
    path = tmp_path / "mlp.csv"
    path.write_text("num_tensor_parallel_workers,num_tokens,time_stats.emb.median\n2,1,0.1\n")
    with pytest.raises(ScenarioError, match=f"^cost: {path}: no operator times; expected "
                                            "columns time_stats.<op>.median for each of "
                                            "input_layernorm, "):
        mlp_table(str(path), model_spec("llama2-70b"), 2)


def test_an_mlp_table_missing_one_operator_is_refused_naming_it(tmp_path) -> None:  # noqa: ANN001
    """Its layers were priced without that operator: 0 for its time, silently."""
    df = _raw(MLP_70B_A100).drop(columns=["time_stats.mlp_act.median"])
    path = tmp_path / "mlp.csv"
    df.to_csv(path, index=False)
    with pytest.raises(ScenarioError, match=f"^cost: {path}: no time for operator\\(s\\) mlp_act; "
                                            "expected a column time_stats.<op>.median for each"):
        mlp_table(str(path), model_spec("llama2-70b"), 2)


def test_an_aiconfigurator_folder_is_found_beside_the_scenario(tmp_path) -> None:  # noqa: ANN001
    import shutil

    from orcasim.paths import SCENARIO_DIR

    shutil.copytree(PACKAGE_DATA_DIR / "profiles/aiconfigurator/a100_sxm", tmp_path / "mine")
    token = SCENARIO_DIR.set(tmp_path)
    try:
        decode, _ = aiconfigurator_attention("mine", model_spec("llama2-70b"), 2)
    finally:
        SCENARIO_DIR.reset(token)
    reference, _ = aiconfigurator_attention("profiles/aiconfigurator/a100_sxm", model_spec("llama2-70b"), 2)
    assert decode.a.tolist() == reference.a.tolist()


@pytest.mark.parametrize(("reader", "path", "column", "tp"), [
    ("mlp", MLP_70B_A100, "n_head", 2), ("mlp", MLP_70B_A100, "n_kv_head", 2),
    ("mlp", MLP_70B_A100, "n_expanded_embd", 2), ("attention", ATTENTION_70B_TP2, "n_q_head", 2),
    ("attention", ATTENTION_70B_TP2, "n_kv_head", 2), ("attention", ATTENTION_70B_TP2, "num_tensor_parallel_workers", 2),
])
def test_a_table_measured_for_another_shape_is_refused_by_each_column(
    tmp_path, reader: str, path: str, column: str, tp: int,  # noqa: ANN001
) -> None:
    df = _raw(path)
    df[column] = df[column] + 1
    copy = tmp_path / "t.csv"
    df.to_csv(copy, index=False)
    read = mlp_table if reader == "mlp" else vidur_attention
    with pytest.raises(ScenarioError, match=f"column '{column}' = "):
        read(str(copy), model_spec("llama2-70b"), tp)


def test_aiconfigurator_tables_of_other_heads_are_refused_by_kind() -> None:
    with pytest.raises(ScenarioError, match=r"^cost: no generation attention rows for 32 query heads, 32 KV heads"):
        aiconfigurator_attention("profiles/aiconfigurator/a100_sxm", model_spec("llama2-7b"), 1)
    from orcasim.cost.profile_tables import _select_heads

    gen_ok = pd.DataFrame({"num_heads": [32], "num_key_value_heads": [4], "head_dim": [128], "kernel_source": ["k"]})
    with pytest.raises(ScenarioError, match=r"^cost: no context attention rows"):
        _select_heads(gen_ok.assign(num_heads=[16]), model_spec("llama2-70b"), 2, "context attention")


def test_bf16_weights_and_an_fp16_cache_are_what_the_tables_time() -> None:
    from orcasim.cost.profile import _check_profiled_shape

    _check_profiled_shape(model_spec("llama2-70b").model_copy(update={"weight_dtype": "bf16", "kv_cache_dtype": "fp16"}))


def test_a_send_or_an_attention_lookup_past_its_table_counts_the_iteration() -> None:
    """One GPU a stage (no all-reduce), two stages: a send of 5,000 tokens' activations is
    past send_recv.csv's 64 MiB. And a lone decode at a KV length past the attention table,
    beside a prompt inside it, counts the iteration too."""
    dep = Deployment(model=model_spec("llama2-70b"), hardware=HardwareConfig(gpu="a100-80gb", pipeline_parallel=2))
    cost = ProfileCost(ProfileCostConfig(kind="profile", mlp_csv=MLP_70B_A100, send_recv_csv=SEND_RECV_A100), dep)
    with pytest.warns(UserWarning, match="send_recv.csv size"):
        _, outside = cost._communication(np.array(5000.0))
    assert bool(outside)
    tables = llama70b_tp2(attention_csv=ATTENTION_70B_TP2)
    with pytest.warns(UserWarning, match="attention decode"):
        tables.iteration_time_s(Batch(np.array([1, 64]), np.array([10**6, 64])))
    assert tables.out_of_range_count() == 1


def test_aiconfigurator_context_rows_are_read_per_sequence_and_named_when_missing(tmp_path) -> None:  # noqa: ANN001
    """A copy whose context table starts at batch 2: prefill is a 2-sequence row's latency
    / 2; a copy without our head shape in its context table is refused by that table's name."""
    import shutil

    source = PACKAGE_DATA_DIR / "profiles/aiconfigurator/a100_sxm/attention"
    shape = "num_heads == 32 and num_key_value_heads == 4 and head_dim == 128"
    for name, keep in (("twos", "batch_size >= 2"), ("other", "num_key_value_heads == 8")):
        folder = tmp_path / name
        shutil.copytree(source, folder)
        path = sorted(folder.rglob("context_attention_perf.parquet"))[0]
        pd.read_parquet(path).query(keep).to_parquet(path)
    ctx = pd.read_parquet(sorted((tmp_path / "twos").rglob("context_attention_perf.parquet"))[0]).query(shape)
    row = ctx[ctx["batch_size"] == ctx["batch_size"].min()].iloc[0]
    assert row.batch_size == 2
    _, prefill = aiconfigurator_attention(str(tmp_path / "twos"), model_spec("llama2-70b"), 2)
    assert float(prefill(0.0, row.isl)[0]) == pytest.approx(row.latency / 2 * 1e-3, rel=1e-12)
    with pytest.raises(ScenarioError, match=r"^cost: no context attention rows for 32 query heads, 4 KV heads"):
        aiconfigurator_attention(str(tmp_path / "other"), model_spec("llama2-70b"), 2)


def test_a_query_on_a_measured_slice_reads_that_slice_alone() -> None:
    """Prefill tables stop at the model length, so slices cover different ranges of b.
    A query exactly on a measured a (the upper slice of its bracket, w = 1) is in range
    where that slice is measured, however short its neighbour; and the slice's own value,
    not an interpolation. Just off the slice, the short neighbour does count."""
    table = SlicedTable2D.from_points(np.array([1.0, 1.0, 2.0, 2.0, 2.0]),
                                      np.array([0.0, 10.0, 0.0, 50.0, 100.0]),
                                      np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    values, outside = table(np.array([2.0, 2.0, 1.0]), np.array([50.0, 75.0, 5.0]))
    assert values.tolist() == [4.0, 4.5, 1.5] and not outside.any()
    _, outside = table(np.array([1.9]), np.array([50.0]))
    assert outside.tolist() == [True]


def test_a_missing_table_names_the_key_that_gave_it() -> None:
    """It said 'cost: file ... not found': which of the four files?"""
    from typer.testing import CliRunner

    from orcasim.cli import app

    scenario = Path(__file__).parents[1] / "scenarios" / "regression" / "profile_vidur.yaml"
    result = CliRunner().invoke(app, ["validate", str(scenario), "--set", "cost.mlp_csv=nope.csv"])
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {scenario} with --set cost.mlp_csv=nope.csv: "
                                    "cost.mlp_csv: file 'nope.csv' not found"), result.output


def test_an_overhead_on_the_profiles_own_roofline_is_refused() -> None:
    """`cost.roofline` only fills in what the tables do not time: an overhead there was
    accepted and ignored (a 5 s per_iteration_s changed no latency)."""
    from orcasim.scenario import load_scenario

    path = Path(__file__).parent.parent / "scenarios" / "profile_llama2_70b.yaml"
    with pytest.raises(ScenarioError, match=r"cost.roofline.overhead is not used here .*expected "
                                            "the engine's overhead as cost.overhead$"):
        load_scenario(path, ["cost.roofline={kind: roofline, overhead: {per_iteration_s: 5.0}}"])


@pytest.mark.parametrize("tables", [{}, {"send_recv_csv": SEND_RECV_A100}])
def test_pipeline_stages_run_the_embedding_head_and_sends_where_they_are(tables: dict[str, str]) -> None:
    """Llama-2-70B, TP 2 x PP 4 (20 layers a stage): the first stage's embedding from the
    table, the last stage's LM head, a send on each of the others (from the table where
    given); the stages add up to the iteration."""
    dep = Deployment(model=model_spec("llama2-70b"),
                     hardware=HardwareConfig(gpu="a100-80gb", tensor_parallel=2, pipeline_parallel=4))
    cost = ProfileCost(ProfileCostConfig(kind="profile", mlp_csv=MLP_70B_A100, **tables), dep)
    batch = Batch(np.array([1] * 15 + [49]), np.array([700] * 15 + [49]))
    stages = cost.stage_times_s(batch, [20] * 4)
    assert sum(stages) == pytest.approx(cost.iteration_time_s(batch), rel=1e-12)
    ends = cost.stage_ends(batch)
    assert ends is not None and ends.first_s == float(cost.embedding(np.asarray(64.0))[0])
    send_s = (float(network_table(SEND_RECV_A100, "send_recv", 2, dep.hardware)(64 * 16384.0)[0])
              if tables else cost.roofline.stage_sends_s(64.0)[0])
    assert ends.sends_s == (send_s,) * 3 and send_s > 0
    assert ends.last_s == float(cost.roofline.op_time_s(cost.roofline.lm_head, 16.0)) > 0
    assert stages[3] - stages[1] == pytest.approx(ends.last_s - send_s, rel=1e-9)
    assert stages[0] - stages[1] == pytest.approx(ends.first_s, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("value", [np.nan, -3.0, np.inf])
@pytest.mark.parametrize(("table", "column", "used", "reader"), [
    (MLP_70B_A100, "time_stats.mlp_up_proj.median", "num_tensor_parallel_workers == 2",
     lambda p: mlp_table(p, model_spec("llama2-70b"), 2)),
    (ATTENTION_70B_TP2, "time_stats.attn_decode.median", "not is_prefill",
     lambda p: vidur_attention(p, model_spec("llama2-70b"), 2)),
    (ALL_REDUCE_A100, "time_stats.all_reduce.median", "num_workers == 2 and devices_per_node == 2",
     lambda p: network_table(p, "all_reduce", 2, HardwareConfig(gpu="a100-80gb"))),
])
def test_a_time_that_is_not_a_finite_time_names_its_line(tmp_path, table, column, used,  # noqa: ANN001
                                                          reader, value: float) -> None:
    """A NaN (or an empty field) in a table's times passed validate and ran to 'the run's
    clock overflows to infinity', naming no file; a negative time took time off every layer
    without a word (a tester's finding)."""
    df = _raw(table)
    row = df.query(used).index[-1]  # a row the reader uses
    df.loc[row, column] = value
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    with pytest.raises(ScenarioError, match=f"^cost: {path} line {row + 2}: {column} = "
                                            f"{value}, expected a finite time"):
        reader(str(path))
