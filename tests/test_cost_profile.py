"""Interpolation in measured tables and the `profile` cost model built on it."""

from __future__ import annotations

import warnings

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
from orcasim.cost.profile_tables import mlp_table
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
