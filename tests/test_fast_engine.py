"""Fast mode must reproduce reference mode: per-request timestamps and summary metrics."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import get_args

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from orcasim.closed_loop import arrival_source
from orcasim.cost import Batch, CostConfig, CostModel, Deployment, OverheadConfig, build_cost_model
from orcasim.cost.catalog import HardwareConfig, ModelSpec, gpu_spec, model_spec
from orcasim.cost.fitted import FittedCostConfig
from orcasim.cost.linear import LinearCost, LinearCostConfig
from orcasim.cost.profile import ProfileCostConfig
from orcasim.cost.roofline import Roofline, RooflineCostConfig
from orcasim.engine import Engine
from orcasim.metrics import requests_frame, summarize
from orcasim.requests import ClientLoop, PromptContent, Requests
from orcasim.run import at_the_engine, run_scenario
from orcasim.scenario import scenario_from_dict
from orcasim.schedulers import SchedulerConfig, build_scheduler
from orcasim.schedulers.base import STEP_BY_STEP
from orcasim.schedulers.chunked import ChunkedConfig
from orcasim.schedulers.iteration_level import IterationLevelConfig, IterationLevelScheduler
from orcasim.schedulers.paged import PagedConfig
from orcasim.schedulers.request_level import RequestLevelConfig
from tests.conftest import examples

# The bar is 1e-9 relative; the linear model is in fact bit-exact.
TIMESTAMP_RTOL = 1e-9
SUMMARY_RTOL = 1e-9
# The saturation test's growth is a difference of two nearly equal sums where the queue
# never grows (a closed loop admits each request as it arrives): rounding, 1e-16 either way
# in either mode (fast 9.6e-16 against reference 0 on a closed loop that Hypothesis drew).
# Measured against its own scale, 1 request, not relative to 0.
# Statistics whose value may be 0, where float noise of the timestamps is no relative change:
# the in-system z read 4.2e-16 in fast mode and 0 in reference on a closed loop of Orca at
# batch 1 on the roofline (HYPOTHESIS_PROFILE=explore), as the queue's saturation_z would.
SUMMARY_ATOL = {"saturation_z": 1e-9, "saturation_growth_requests": 1e-9, "in_system_z": 1e-9,
                "in_system_growth_requests": 1e-9}
TIMESTAMPS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "cached_tokens",
              "prefill_saved_tokens")
SUMMED_COLUMNS = ("num_iterations", "tokens", "context_tokens", "num_waiting", "preemptions",
                  "recomputed_tokens")


def scheduler_kinds() -> tuple[str, ...]:
    """Every scheduler kind of the configuration union, so that no new kind escapes the tests."""
    union = get_args(SchedulerConfig)[0]
    return tuple(get_args(cfg.model_fields["kind"].annotation)[0] for cfg in get_args(union))


KINDS = scheduler_kinds()


def _orca(draw: st.DrawFn) -> IterationLevelConfig:
    return IterationLevelConfig(
        kind="iteration_level", max_batch_size=draw(st.integers(1, 8)),
        kv_reservation=draw(st.sampled_from(["max", "pow2", "oracle"])),
    )


def _static(draw: st.DrawFn) -> RequestLevelConfig:
    return RequestLevelConfig(
        kind="request_level", max_batch_size=draw(st.integers(1, 8)),
        max_queue_delay_s=draw(st.sampled_from([0.0, 0.05, 0.4])), padding=draw(st.booleans()),
    )


def _paged(draw: st.DrawFn, kind: str, longest_tokens: int) -> PagedConfig | ChunkedConfig:
    """Small blocks and CPU swap spaces, so that boundaries, preemptions and fallbacks are common."""
    memory = dict(
        max_num_seqs=draw(st.integers(1, 8)), block_size_tokens=draw(st.integers(1, 16)),
        preemption=draw(st.sampled_from(["recompute", "swap"])),
        watermark=draw(st.sampled_from([0.0, 0.01, 0.2])),
        swap_space_bytes=draw(st.sampled_from([0, 16, 64, 10**6])), kv_bytes_per_token=1,
        swap_bandwidth_bytes_per_s=draw(st.sampled_from([1e3, 1e6])),
    )
    # Prefix caching (vLLM v1's: recompute preemption, mixed policy) half the time it may be on.
    caching = memory["preemption"] == "recompute" and draw(st.booleans())
    if kind == "chunked":  # budgets down to one token: decodes alone can exceed them
        return ChunkedConfig(kind="chunked", chunk_size_tokens=draw(st.integers(1, 40)),
                             enable_prefix_caching=caching, **memory)
    budget_tokens = draw(st.sampled_from([longest_tokens, longest_tokens + 7, 4096]))
    policy = "mixed" if caching else draw(st.sampled_from(["mixed", "prefill_first"]))
    memory["enable_prefix_caching"] = caching
    padding = dict(pad_prompts=draw(st.booleans()),
                   max_padding_tokens=draw(st.sampled_from([0, 8, 256])))
    return PagedConfig(kind="paged", max_num_batched_tokens=max(budget_tokens, 8), policy=policy,
                       **(padding if policy == "prefill_first" else {}), **memory)


def _scheduler(draw: st.DrawFn, kind: str, longest_tokens: int) -> SchedulerConfig:
    """A random configuration of `kind`: a kind without a strategy fails here (KeyError)."""
    strategies = {
        "iteration_level": lambda: _orca(draw),
        "request_level": lambda: _static(draw),
        "paged": lambda: _paged(draw, "paged", longest_tokens),
        "chunked": lambda: _paged(draw, "chunked", longest_tokens),
    }
    return strategies[kind]()


@st.composite
def scenarios(
    draw: st.DrawFn, closed_loop: bool = False, kinds: tuple[str, ...] = KINDS
) -> dict:
    n = draw(st.integers(1, 40))
    gaps_s = draw(st.lists(st.floats(0.0, 0.3), min_size=n, max_size=n))
    clients = draw(client_loops(n)) if closed_loop else None
    prompt = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    max_tokens = max(p + o for p, o in zip(prompt, output, strict=True)) + draw(st.integers(0, 30))
    kind = draw(st.sampled_from(kinds))
    scheduler = _scheduler(draw, kind, max_tokens)
    if kind in ("paged", "chunked"):
        # Down to half the longest request (some never fit), often a few: preemptions.
        kv_capacity_tokens = draw(st.integers(max_tokens // 2, max_tokens * 4))
        block = scheduler.block_size_tokens
        kv_capacity_tokens = -(-kv_capacity_tokens // block) * block  # whole blocks
    else:
        kv_capacity_tokens = max_tokens * draw(st.integers(1, 6)) + draw(st.integers(0, max_tokens))
    cost, deployment = draw(costs())
    requests = Requests(
        np.cumsum(gaps_s) if clients is None else np.full(n, np.nan),
        np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64),
        np.full(n, max_tokens, dtype=np.int64), clients,
        content=draw(st.none() | contents(prompt, output)),
    )
    warmup_s = draw(st.sampled_from([0.0, 0.0, 0.5, 2.0]))
    latency_s = draw(st.sampled_from([0.0, 0.0, 0.01, 0.2]))  # the way in (request_latency_s)
    return dict(requests=requests, scheduler=scheduler, cost=cost,
                kv_capacity_tokens=kv_capacity_tokens, warmup_s=warmup_s, deployment=deployment,
                request_latency_s=latency_s)


@st.composite
def contents(draw: st.DrawFn, prompt: list[int], output: list[int]) -> PromptContent:
    """Prompts that share prefixes: a shared start drawn from a few, sometimes an earlier
    request's output quoted (as a conversation resends its history), then text of its own;
    outputs now and then named alike (identical requests, identical answers)."""
    shared = draw(st.lists(st.integers(1, 40), min_size=1, max_size=3))  # segment i: id i
    output_ids = [10_000 + draw(st.integers(0, len(prompt) - 1)) if draw(st.integers(0, 5)) == 0
                  else 10_000 + i for i in range(len(prompt))]
    prompts = []
    for i, tokens in enumerate(prompt):
        segments: list[int] = []
        start = draw(st.integers(0, len(shared)))  # len(shared): no shared start
        if start < len(shared) and shared[start] <= tokens:
            segments += [start, shared[start]]
        earlier = draw(st.integers(-1, i - 1))
        if earlier >= 0 and sum(segments[1::2]) + output[earlier] <= tokens:
            segments += [output_ids[earlier], output[earlier]]
        left = tokens - sum(segments[1::2])
        if left:
            segments += [100 + i, left]
        prompts.append(tuple(segments))
    return PromptContent(prompts, np.array(output_ids, dtype=np.int64))


# A deployment for the hardware-aware kinds: TP 2 exercises the overhead's TP term.
DEPLOYMENTS = {tp: Deployment(model=model_spec("llama2-7b"),
                              hardware=HardwareConfig(gpu=gpu_spec("a100-80gb"), tensor_parallel=tp))
               for tp in (1, 2)}
# Mixture of experts and latent attention in fp8 (DeepSeek-V3 on 8 H200s): the roofline's
# expert and MLA terms under the same fast paths.
DEPLOYMENTS[8] = Deployment(
    model=ModelSpec.model_validate({"hf_config": "hf_configs/deepseek-v3/config.json",
                                    "weight_dtype": "fp8"}),
    hardware=HardwareConfig(gpu=gpu_spec("h200"), tensor_parallel=8))
# gpt-oss-20b: sliding windows on every other layer, mxfp4 experts.
DEPLOYMENTS[4] = Deployment(
    model=ModelSpec.model_validate({"hf_config": "hf_configs/gpt-oss-20b/config.json"}),
    hardware=HardwareConfig(gpu=gpu_spec("h100-80gb"), tensor_parallel=4))
# DeepSeek-V3 over two nodes: data-parallel attention, expert parallelism, all-to-alls.
DEPLOYMENTS[16] = Deployment(
    model=DEPLOYMENTS[8].model,
    hardware=HardwareConfig(gpu=gpu_spec("h200"), data_parallel_attention=16, expert_parallel=16))
# Llama-2-7B over two pipeline stages at TP 2, priced by a one-batch engine (every scheduler
# here but Orca's own pipelined engine, which the fleets draw): a batch passes the stages in
# turn, each floored by launching its own layers (`OverheadCost.staged_gpu_s`).
PIPELINED = "tp2-pp2"
DEPLOYMENTS[PIPELINED] = Deployment(
    model=model_spec("llama2-7b"),
    hardware=HardwareConfig(gpu=gpu_spec("a100-80gb"), tensor_parallel=2, pipeline_parallel=2))
VIDUR_PROFILE = dict(kind="profile",
                     mlp_csv="profiles/vidur/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv")
DISTSERVE = dict(kind="fitted", path="profiles/distserve/profiler-a100-80g.vllm.json",
                 model="opt-13b", tensor_parallel=1)
# orcasim's own fitted form (`python -m calibrate fit`): hinges at 64 and 256 tokens, a
# range narrower than some drawn batches, and its own decode-run pricing (FittedCost).
FITTED_YAML = dict(kind="fitted", path=str(Path(__file__).parent.parent / "scenarios" / "regression"
                                           / "cost_models" / "cpu_tiny_frozen.yaml"))


def cost_kinds() -> tuple[str, ...]:
    """Every cost kind of the configuration union, so that no new kind escapes the tests."""
    union = get_args(CostConfig)[0]
    return tuple(get_args(cfg.model_fields["kind"].annotation)[0] for cfg in get_args(union))


@st.composite
def overheads(draw: st.DrawFn, launches: bool) -> OverheadConfig | None:
    """None, the defaults, or drawn terms: a launch floor that binds sometimes, or always."""
    choice = draw(st.sampled_from(["none", "defaults", "drawn"]))
    if choice != "drawn":
        return None if choice == "none" else OverheadConfig()
    return OverheadConfig(
        per_iteration_s=draw(st.floats(0.0, 0.02)), per_sequence_s=draw(st.floats(0.0, 2e-3)),
        per_prefill_token_s=draw(st.floats(0.0, 1e-4)),
        tensor_parallel_per_iteration_s=draw(st.floats(0.0, 0.01)),
        launch_per_layer_s=draw(st.sampled_from([0.0, 1e-4, 1e-3])) if launches else 0.0,
    )


@st.composite
def costs(draw: st.DrawFn) -> tuple[CostConfig, Deployment | None]:
    """A random cost of every kind, each with or without the engine's overhead."""
    kind = draw(st.sampled_from(["linear", "linear", *cost_kinds()]))
    if kind == "linear":
        cfg = dict(kind="linear", base_s=draw(st.floats(1e-4, 0.05)),
                   per_token_s=draw(st.floats(0.0, 1e-3)),
                   per_context_token_s=draw(st.floats(0.0, 1e-4)))
        return LinearCostConfig(**cfg, overhead=draw(overheads(launches=False))), None
    # The deployment's key: its TP degree, or PIPELINED (the roofline only; profile: dense only).
    key = draw(st.sampled_from([1, 2, 4, 8, 16, PIPELINED] if kind == "roofline" else [1, 2]))
    deployment = DEPLOYMENTS[key] if kind in ("roofline", "profile") else None
    overhead = draw(overheads(launches=deployment is not None))
    strategies = {
        "roofline": lambda: RooflineCostConfig(  # a skewed router on the MoE deployments
            kind="roofline", overhead=overhead,
            expert_routing_skew=draw(st.sampled_from([0.0, 1.1])) if key in (4, 8, 16) else 0.0),
        "profile": lambda: ProfileCostConfig(**VIDUR_PROFILE, overhead=overhead),
        "fitted": lambda: FittedCostConfig(**draw(st.sampled_from([DISTSERVE, FITTED_YAML])),
                                           overhead=overhead),
    }
    return strategies[kind](), deployment  # a kind without a strategy fails here (KeyError)


@st.composite
def client_loops(draw: st.DrawFn, n: int) -> ClientLoop:
    """Clients thinking 0 (ties with the completion), a constant, or a drawn time per request."""
    think = draw(st.sampled_from(["zero", "constant", "drawn"]))
    if think == "drawn":
        think_s = np.array(draw(st.lists(st.floats(0.0, 0.5), min_size=n, max_size=n)))
    else:
        think_s = np.full(n, 0.0 if think == "zero" else draw(st.floats(0.0, 0.5)))
    return ClientLoop(draw(st.integers(1, 8)), think_s)


def cost_model(case: dict) -> CostModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tables extrapolated at tiny batches: counted, fine
        return build_cost_model(case["cost"], case.get("deployment"))


def simulate(case: dict, mode: str) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, float]]:
    requests = case["requests"].for_run()  # a closed loop's own arrival times
    # As the engine sees them (a way in of request_latency_s); the frame is the clients'.
    at_engine = at_the_engine(requests, case.get("request_latency_s", 0.0))
    scheduler = build_scheduler(case["scheduler"], at_engine, case["kv_capacity_tokens"])
    engine = Engine(at_engine, scheduler, cost_model(case), mode,
                    row_breaks_s=(case["warmup_s"],), arrivals=arrival_source(at_engine))
    rec = engine.run().recorder
    reqs, iters = requests_frame(requests, rec), rec.iterations_frame()
    reqs["cached_tokens"] = scheduler.cached_tokens
    reqs["prefill_saved_tokens"] = scheduler.prefill_saved_tokens
    return reqs, iters, summarize(reqs, iters, case["warmup_s"])


def assert_rows_cover(fast: pd.DataFrame, ref: pd.DataFrame) -> None:
    """Row by row, not only in total: each fast row spans `num_iterations` consecutive
    reference rows, starting where the first does, of one batch size, with their sums, the
    time-weighted means of their KV columns and the largest reservation. (The pipelined
    engine writes a row per stage iteration in both modes: row for row there.)"""
    if (ref["num_iterations"] != 1).any():
        pd.testing.assert_frame_equal(fast, ref, rtol=TIMESTAMP_RTOL)
        return
    starts = np.concatenate([[0], np.cumsum(fast["num_iterations"].to_numpy())[:-1]])
    if not len(fast):
        return
    np.testing.assert_allclose(fast["start_s"], ref["start_s"].to_numpy()[starts],
                               rtol=TIMESTAMP_RTOL, err_msg="start_s")
    batch = ref["batch_size"].to_numpy()
    for reduce in (np.minimum, np.maximum):
        np.testing.assert_array_equal(reduce.reduceat(batch, starts), fast["batch_size"],
                                      err_msg="batch_size")
    for col in SUMMED_COLUMNS:
        np.testing.assert_array_equal(np.add.reduceat(ref[col].to_numpy(), starts), fast[col],
                                      err_msg=col)
    duration_s = ref["duration_s"].to_numpy()
    span_s = np.add.reduceat(duration_s, starts)
    for col in ("kv_reserved_tokens", "kv_used_tokens"):
        mean = np.add.reduceat(ref[col].to_numpy() * duration_s, starts) / np.where(span_s > 0, span_s, 1)
        np.testing.assert_allclose(fast[col][span_s > 0], mean[span_s > 0], rtol=1e-9, atol=1e-9,
                                   err_msg=col)
    np.testing.assert_array_equal(
        np.maximum.reduceat(ref["kv_reserved_tokens_max"].to_numpy(), starts),
        fast["kv_reserved_tokens_max"], err_msg="kv_reserved_tokens_max")


def assert_same_run(case: dict) -> pd.DataFrame:
    """Compare both modes on one case; returns fast mode's iteration rows."""
    ref_reqs, ref_iters, ref_summary = simulate(case, "reference")
    fast_reqs, fast_iters, fast_summary = simulate(case, "fast")
    for col in TIMESTAMPS:
        np.testing.assert_allclose(fast_reqs[col], ref_reqs[col], rtol=TIMESTAMP_RTOL, err_msg=col)
    for col in SUMMED_COLUMNS:
        assert fast_iters[col].sum() == ref_iters[col].sum(), col
    assert_rows_cover(fast_iters, ref_iters)
    assert fast_summary.keys() == ref_summary.keys()
    for key, value in ref_summary.items():
        np.testing.assert_allclose(fast_summary[key], value, rtol=SUMMARY_RTOL,
                                   atol=SUMMARY_ATOL.get(key, 0.0), err_msg=key)
    return fast_iters


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fast_mode_matches_reference(case: dict) -> None:
    assert_same_run(case)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_mode_matches_reference_for_every_kind(kind: str, data: st.DataObject) -> None:
    # KINDS comes from the configuration union: a new kind is tested here or fails here.
    assert_same_run(data.draw(scenarios(kinds=(kind,))))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(closed_loop=True))
def test_fast_mode_matches_reference_in_a_closed_loop(case: dict) -> None:
    # Follow-up requests are made from completions, so arrival times are outputs too.
    assert_same_run(case)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(kinds=("paged", "chunked")))
def test_fast_mode_matches_reference_over_paged_kv(case: dict) -> None:
    # The paged hooks have the most to predict: block boundaries, preemption, swapping.
    assert_same_run(case)


def _free_list_after(case: dict, mode: str) -> tuple[object, ...]:
    """The paged allocator's free list once every request is done: which blocks each took,
    and when, shows in its order."""
    requests = case["requests"].for_run()
    scheduler = build_scheduler(case["scheduler"], requests, case["kv_capacity_tokens"])
    Engine(requests, scheduler, cost_model(case), mode, row_breaks_s=(case["warmup_s"],),
           arrivals=arrival_source(requests)).run()
    return scheduler.allocator.free_pool(), scheduler.allocator.cache_state()


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(kinds=("paged", "chunked")))
def test_paged_runs_take_the_blocks_reference_mode_takes(case: dict) -> None:
    # Fast mode allocates a run's blocks at once, in the order schedule would, step by step.
    assert _free_list_after(case, "fast") == _free_list_after(case, "reference")


def _case(arrival_s: list[float], prompt: list[int], output: list[int], scheduler) -> dict:
    n = len(arrival_s)
    requests = Requests(np.array(arrival_s), np.array(prompt), np.array(output),
                        np.full(n, 100, dtype=np.int64))
    cost = LinearCostConfig(kind="linear", base_s=1.0)
    return dict(requests=requests, scheduler=scheduler, cost=cost,
                kv_capacity_tokens=1000, warmup_s=0.0)


ORCA = IterationLevelConfig(kind="iteration_level", max_batch_size=4)


def test_arrival_inside_a_jump_joins_at_the_next_boundary() -> None:
    # Iterations of 1 s: request 1 arrives at 2.5 s, mid-jump, and joins at 3 s.
    case = _case([0.0, 2.5], [5, 5], [10, 3], ORCA)
    iters = assert_same_run(case)
    reqs, _, _ = simulate(case, "fast")
    assert reqs["first_scheduled_s"].tolist() == [0.0, 3.0]
    assert reqs["finish_s"].tolist() == [10.0, 6.0]
    # Rows: request 0 alone; both until request 1 finishes; request 0 continues alone.
    assert iters["num_iterations"].tolist() == [3, 3, 4]
    assert iters["batch_size"].tolist() == [1, 2, 1]


def test_blocked_arrivals_do_not_cut_a_jump() -> None:
    # Batch size 1: requests 1 and 2 queue behind request 0 without breaking its run.
    case = _case([0.0, 0.5, 1.5], [5, 5, 5], [6, 2, 2], ORCA.model_copy(update={"max_batch_size": 1}))
    iters = assert_same_run(case)
    assert iters["num_iterations"].tolist() == [6, 2, 2]
    # Waiting summed over iterations: request 1 waits in 2-6, request 2 in 3-6 and 7-8.
    assert iters["num_waiting"].tolist() == [9, 2, 0]


def test_a_rejected_arrival_inside_a_jump_never_waits() -> None:
    # Request 1 queues behind request 0 (batch size 1) without cutting its run; request 2
    # arrives in the same run but can never fit, so it is turned away, not counted waiting.
    case = _case([0.0, 2.5, 3.5], [5, 5, 5], [10, 2, 2], ORCA.model_copy(update={"max_batch_size": 1}))
    case["requests"].max_tokens[2] = 2 * case["kv_capacity_tokens"]
    iters = assert_same_run(case)
    assert iters["num_waiting"].tolist() == [7, 0]  # request 1 waits in iterations 4-10


def test_a_jump_whose_only_arrival_is_rejected_counts_nobody_waiting() -> None:
    # A static batch admits nobody until it ends, so request 1, arriving mid-batch, does
    # not cut it; it can never fit and is turned away: nobody waits in any iteration.
    case = _case([0.0, 3.5], [5, 5], [10, 2],
                 RequestLevelConfig(kind="request_level", max_batch_size=4))
    case["requests"].max_tokens[1] = 2 * case["kv_capacity_tokens"]
    iters = assert_same_run(case)
    assert iters["num_iterations"].tolist() == [10]
    assert iters["num_waiting"].tolist() == [0]


PAGED = PagedConfig(kind="paged", block_size_tokens=4)


@pytest.mark.parametrize("scheduler", [
    PagedConfig(kind="paged", max_num_seqs=3), IterationLevelConfig(kind="iteration_level",
                                                                    max_batch_size=3),
])
def test_a_rejection_inside_a_jump_cuts_it_in_a_closed_loop(scheduler) -> None:
    # Requests 1 and 2 finish at 2 s; their clients send 5 (fits, but the batch is full)
    # at 2.3 s and 6 (never fits) at 2.6 s. Turning 6 away at 3 s makes its client send 7
    # at 3 s: the jump over 0, 3 and 4's decodes must stop there, not reject 6 late.
    prompt = np.array([1, 1, 1, 1, 1, 1, 200, 1])
    output = np.array([10, 2, 2, 5, 5, 1, 1, 1])
    think_s = np.array([0.0, 0.3, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0])
    requests = Requests(np.full(8, np.nan), prompt, output, prompt + output,
                        ClientLoop(5, think_s))
    case = dict(requests=requests, scheduler=scheduler,
                cost=LinearCostConfig(kind="linear", base_s=1.0), kv_capacity_tokens=160,
                warmup_s=0.0)
    assert_same_run(case)
    reqs, _, _ = simulate(case, "fast")
    assert reqs["arrival_s"].tolist()[5:] == [2.3, 2.6, 3.0]


def test_paged_rows_span_block_boundaries() -> None:
    # Prompt 5 takes 2 blocks of 4; then the context crosses a multiple of 4 every 4 steps.
    # One row: iterations of 1 s hold 8, 8, 8, 8, 12 (x4), 16 (x4), 20 (x4), 24 (x4) tokens.
    iters = assert_same_run(_case([0.0], [5], [20], PAGED))
    assert iters["num_iterations"].tolist() == [20]
    assert iters["kv_reserved_tokens"].tolist() == [16.0]
    assert iters["kv_reserved_tokens_max"].tolist() == [24]


def test_paged_run_stops_before_a_preemption() -> None:
    # 6 blocks of 4 for two requests that need 4 each at their peak: the runs end where a
    # block would not fit, and `schedule` preempts there, as in reference mode.
    case = _case([0.0, 0.0], [4, 4], [12, 12], PAGED)
    case["kv_capacity_tokens"] = 24
    iters = assert_same_run(case)
    assert iters["preemptions"].sum() > 0
    assert len(iters) < iters["num_iterations"].sum() / 2
    assert iters["kv_reserved_tokens_max"].max() == 24


def test_paged_decode_runs_span_many_boundaries() -> None:
    # Blocks of 16 and prompts of every length: some request crosses a boundary at most
    # iterations, yet rows break only at completions.
    n = 8
    prompt = np.array([3, 7, 11, 16, 20, 25, 30, 40])
    output = 200 + 10 * np.arange(n)
    requests = Requests(np.zeros(n), prompt, output, prompt + output)
    case = dict(requests=requests, scheduler=PagedConfig(kind="paged"),
                cost=LinearCostConfig(kind="linear", base_s=1e-2, per_context_token_s=1e-6),
                kv_capacity_tokens=8000, warmup_s=0.0)
    iters = assert_same_run(case)
    assert len(iters) < iters["num_iterations"].sum() / 10
    assert (iters["kv_reserved_tokens_max"] > iters["kv_reserved_tokens"]).all()


@pytest.mark.parametrize("scheduler", [PagedConfig(kind="paged"),
                                       ChunkedConfig(kind="chunked", chunk_size_tokens=32)])
def test_fast_mode_jumps_over_paged_decodes(scheduler: PagedConfig | ChunkedConfig) -> None:
    # Same-length prompts cross block boundaries together: long runs of pure decodes.
    case = _case([0.0, 0.0, 0.0, 0.5], [16, 16, 16, 48], [90, 70, 80, 60], scheduler)
    iters = assert_same_run(case)
    assert len(iters) < iters["num_iterations"].sum() / 3


class _NoHooks(IterationLevelScheduler):
    """A scheduler that changes update_from_output and so must opt out of the hooks."""

    fast_forward = STEP_BY_STEP

    def update_from_output(self, out):  # type: ignore[no-untyped-def]
        return super().update_from_output(out)


def test_scheduler_without_hooks_steps_one_iteration_at_a_time() -> None:
    case = _case([0.0, 2.5], [5, 5], [10, 3], ORCA)
    requests = case["requests"]
    engine = Engine(requests, _NoHooks(ORCA, requests, 1000), LinearCost(case["cost"]), "fast")
    iters = engine.run().recorder.iterations_frame()
    assert set(iters["num_iterations"]) == {1}
    assert len(iters) == 10


@pytest.mark.parametrize("padding", [True, False])
def test_static_batch_is_one_jump_per_change(padding: bool) -> None:
    scheduler = RequestLevelConfig(kind="request_level", max_batch_size=4, padding=padding)
    iters = assert_same_run(_case([0.0, 0.0, 0.0], [4, 8, 2], [5, 9, 2], scheduler))
    # Padded: one jump for the whole batch; unpadded: the costed set shrinks at steps 2 and 5.
    assert iters["num_iterations"].tolist() == ([9] if padding else [2, 3, 4])


def test_linear_cost_is_bit_exact() -> None:
    # The linear model's decode steps repeat iteration_time_s's arithmetic, and boundaries
    # are running sums in the same order, so the timestamps are identical, not just close.
    rng = np.random.default_rng(5)
    n = 300
    requests = Requests(np.cumsum(rng.exponential(0.05, n)), rng.integers(1, 200, n),
                        rng.integers(1, 100, n), np.full(n, 300, dtype=np.int64))
    cost = LinearCostConfig(kind="linear", base_s=0.0123, per_token_s=3.3e-5,
                            per_context_token_s=7.1e-7)
    case = dict(requests=requests, scheduler=ORCA, cost=cost, kv_capacity_tokens=1500,
                warmup_s=1.0)
    fast, ref = simulate(case, "fast")[0], simulate(case, "reference")[0]
    for col in TIMESTAMPS:
        assert np.array_equal(fast[col].to_numpy(), ref[col].to_numpy()), col


def assert_same_scenario(runs: dict) -> None:
    fast, ref = runs["fast"], runs["reference"]
    for name, ref_system in ref.systems.items():
        fast_system = fast.systems[name]
        for col in TIMESTAMPS:
            np.testing.assert_allclose(fast_system.requests[col], ref_system.requests[col],
                                       rtol=TIMESTAMP_RTOL, err_msg=f"{name} {col}")
        for key, value in ref_system.summary.items():
            np.testing.assert_allclose(fast_system.summary[key], value, rtol=SUMMARY_RTOL,
                                       atol=SUMMARY_ATOL.get(key, 0.0), err_msg=f"{name} {key}")


CLOSED_LOOP = {"kind": "closed_loop", "num_clients": 12,
               "think_time": {"kind": "exponential", "mean_s": 0.3}}


@pytest.mark.parametrize("arrival", [{"kind": "poisson", "rate_per_s": 20.0}, CLOSED_LOOP],
                         ids=["poisson", "closed_loop"])
def test_roofline_cost_matches_reference(arrival: dict) -> None:
    # The vectorised decode_steps_s of the hardware-aware models must agree with
    # iteration_time_s step by step, so that fast mode stays exact with them too.
    data = {
        "name": "fast-vs-reference", "seed": 3, "model": "llama2-7b",
        "hardware": {"gpu": "a100-80gb"}, "cost": {"kind": "roofline"},
        "workload": {"num_requests": 300, "arrival": arrival,
                     "prompt_tokens": {"kind": "uniform", "low": 1, "high": 400},
                     "output_tokens": {"kind": "uniform", "low": 1, "high": 200},
                     "max_tokens": 600},
        "kv_capacity_tokens": 6000,
        "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 8}},
                    {"name": "ft", "scheduler": {"kind": "request_level", "max_batch_size": 8}}],
    }
    assert_same_scenario({
        mode: run_scenario(scenario_from_dict({**data, "engine": {"mode": mode}}))
        for mode in ("fast", "reference")
    })


# The engine's host work under data-parallel attention: the largest prompt's group sets it
# (`OverheadCost.host_s`), large beside the GPU's so that the floor decides many iterations.
DP_OVERHEAD = {"per_iteration_s": 1e-3, "per_sequence_s": 2e-4, "per_prefill_token_s": 2e-6}


@pytest.mark.parametrize("cost", [
    {"kind": "roofline"},
    {"kind": "roofline", "overhead": DP_OVERHEAD},
    # A cost kind that ignores the groups keeps its decode line: the host's floor is a
    # step's constant, one sequence where the batch has fewer than the groups.
    {"kind": "linear", "base_s": 0.004, "per_token_s": 2e-6, "per_context_token_s": 1e-8,
     "overhead": DP_OVERHEAD},
], ids=["roofline", "roofline-overhead", "linear-overhead"])
def test_data_parallel_attention_matches_reference(cost: dict) -> None:
    """Qwen3-30B-A3B over four data-parallel groups, under Orca and vLLM's paged scheduler:
    prompts long enough that the largest request's own group sets many iterations' time
    (`Roofline.data_parallel_floor_s`, and the host's `OverheadCost.host_s`), which the
    fused loops must price as reference mode does (no roofline decode line: the floor
    follows the longest context)."""
    data = {
        "name": "dp-attention", "seed": 5, "model": "qwen3-30b-a3b",
        "hardware": {"gpu": "h100-80gb", "data_parallel_attention": 4, "expert_parallel": 4},
        "cost": cost,
        "workload": {"num_requests": 200, "arrival": {"kind": "poisson", "rate_per_s": 8.0},
                     "prompt_tokens": {"kind": "uniform", "low": 1, "high": 3000},
                     "output_tokens": {"kind": "uniform", "low": 1, "high": 200},
                     "max_tokens": 3200},
        "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 32}},
                    {"name": "vllm", "scheduler": {"kind": "paged", "max_num_seqs": 64,
                                                   "max_num_batched_tokens": 4096}}],
    }
    scenario = scenario_from_dict(data)
    if cost["kind"] == "roofline" and "overhead" not in cost:
        roofline = Roofline(RooflineCostConfig(kind="roofline"), scenario.deployment())
        prompt = Batch(np.array([1500]), np.array([1500]))
        assert roofline.iteration_time_s(prompt) == roofline.data_parallel_floor_s([1500], [1500], 1500)
        assert roofline.decode_line(8, 8 * 1000) is None
    assert_same_scenario({
        mode: run_scenario(scenario_from_dict({**data, "engine": {"mode": mode}}))
        for mode in ("fast", "reference")
    })


# The profile cost interpolates its tables an iteration at a time, so reference mode is slow:
# 120 of the scenario's requests (36 s for 300 on a loaded CI machine, 10 s for 120).
@pytest.mark.parametrize(("path", "num_requests"), [("profile_vidur.yaml", 120),
                                                    ("fitted_distserve.yaml", 300)])
def test_profile_and_fitted_costs_match_reference(path: str, num_requests: int) -> None:
    scenario = Path(__file__).parent.parent / "scenarios" / "regression" / path
    assert_same_scenario({
        mode: run_scenario(scenario, (f"workload.num_requests={num_requests}", f"engine.mode={mode}"))
        for mode in ("fast", "reference")
    })


@pytest.mark.parametrize("kind", cost_kinds())
def test_every_cost_kind_is_drawn_with_an_overhead(kind: str) -> None:
    # The property tests above draw each kind, with and without the engine's overhead.
    cfg, _ = find(costs(), lambda c: c[0].kind == kind and c[0].overhead is not None
                  and (kind == "linear" or c[0].overhead.per_iteration_s > 0))
    assert cfg.kind == kind


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_mode_matches_reference_with_a_binding_launch_floor(data: st.DataObject) -> None:
    # Roofline under an overhead whose launches bind at small batches and not at large ones.
    case = data.draw(scenarios(kinds=("iteration_level", "paged")))
    case["deployment"] = DEPLOYMENTS[data.draw(st.sampled_from([1, 2]))]
    case["cost"] = RooflineCostConfig(kind="roofline", overhead=OverheadConfig(
        launch_per_layer_s=data.draw(st.sampled_from([2e-4, 4e-4, 1e-3])),
        per_sequence_s=data.draw(st.floats(0.0, 1e-3))))
    assert_same_run(case)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_mode_matches_reference_on_pipeline_stages(data: st.DataObject) -> None:
    # Every kind on a one-batch engine over two stages: each stage floored by its own
    # launches where the overhead has them, so runs of decodes are priced stage by stage.
    # Launches of 0.200-0.210 ms a layer straddle a small decode's stages (16 layers in
    # 3.20-3.36 ms, the last with the LM head): the first sits on its floor, the last above
    # it, where the stages' sum exceeds max(GPU time, every layer's launches).
    case = data.draw(scenarios())
    case["deployment"] = DEPLOYMENTS[PIPELINED]
    straddling = OverheadConfig(per_iteration_s=0.0, per_sequence_s=0.0,
                                tensor_parallel_per_iteration_s=0.0,
                                launch_per_layer_s=data.draw(st.floats(2.0e-4, 2.1e-4)))
    overhead = data.draw(st.sampled_from([straddling, data.draw(overheads(launches=True))]))
    case["cost"] = RooflineCostConfig(kind="roofline", overhead=overhead)
    assert_same_run(case)


# Qwen3-30B-A3B over two pipeline stages, each of two data-parallel attention groups at TP 2
# (expert parallelism spans a stage's 4 GPUs): every scheduler kind, on a one-batch engine.
DP_PIPELINED_HARDWARE = {"gpu": "h100-80gb", "tensor_parallel": 2, "pipeline_parallel": 2,
                         "data_parallel_attention": 2, "expert_parallel": 4}
DP_PIPELINED = Deployment(model=model_spec("qwen3-30b-a3b"),
                          hardware=HardwareConfig.model_validate(DP_PIPELINED_HARDWARE))
DP_PIPELINED_SCHEDULERS = {
    "iteration_level": IterationLevelConfig(kind="iteration_level", max_batch_size=4),
    "request_level": RequestLevelConfig(kind="request_level", max_batch_size=4),
    "paged": PagedConfig(kind="paged", max_num_seqs=4, max_num_batched_tokens=8192),
    "chunked": ChunkedConfig(kind="chunked", max_num_seqs=4, chunk_size_tokens=512),
}


@pytest.mark.parametrize("kind", KINDS)
def test_fast_mode_matches_reference_on_data_parallel_pipeline_stages(kind: str) -> None:
    """Three requests of 2,130, 1,000 and 1,000 prompt tokens decode together over two
    groups: the longest's own group sets the time until, its lead shrinking by a token a
    step, the balanced share overtakes it (at 2,114 + k against 1,000 + k), and the stages'
    ends switch from its tokens to the share's. Launches of 0.121 ms a layer sit between
    the two stages' GPU times (0.119 and 0.123 ms a layer at that batch), so the first stage
    sits on its floor and the last above it: the ends move the sum. A run of decodes priced
    at once took the first step's ends for every step and finished 4.2-4.9e-7 s early."""
    requests = Requests(np.zeros(3), np.array([2130, 1000, 1000]), np.array([60, 60, 60]),
                        np.full(3, 4300, dtype=np.int64))
    overhead = OverheadConfig(launch_per_layer_s=1.21e-4)
    case = dict(requests=requests, scheduler=DP_PIPELINED_SCHEDULERS[kind], kv_capacity_tokens=20_000,
                cost=RooflineCostConfig(kind="roofline", overhead=overhead), warmup_s=0.0,
                deployment=DP_PIPELINED)
    roofline = Roofline(RooflineCostConfig(kind="roofline"), DP_PIPELINED)
    ends = {roofline.stage_ends(Batch(np.ones(3, dtype=np.int64), np.array([2131, 1001, 1001]) + k))
            for k in (0, 58)}
    assert len(ends) == 2, "the run's ends change within it"
    assert_same_run(case)


def test_data_parallel_pipelines_match_reference_in_a_scenario() -> None:
    """The same deployment in a scenario: Orca's pipelined engine (several batches in
    flight, each stage floored by its own launches) and the one-batch engines of the other
    kinds, under host work large enough that the largest prompt's group often sets it."""
    data = {
        "name": "dp-pp", "seed": 5, "model": "qwen3-30b-a3b", "hardware": DP_PIPELINED_HARDWARE,
        "cost": {"kind": "roofline", "overhead": {**DP_OVERHEAD, "launch_per_layer_s": 1.2e-4}},
        "workload": {"num_requests": 60, "arrival": {"kind": "poisson", "rate_per_s": 20.0},
                     "prompt_tokens": {"kind": "uniform", "low": 1, "high": 3000},
                     "output_tokens": {"kind": "uniform", "low": 1, "high": 200},
                     "max_tokens": 3200},
        "systems": [{"name": kind, "scheduler": DP_PIPELINED_SCHEDULERS[kind].model_dump()}
                    for kind in KINDS],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one batch at a time through the stages: said, fine
        assert_same_scenario({
            mode: run_scenario(scenario_from_dict({**data, "engine": {"mode": mode}}))
            for mode in ("fast", "reference")
        })


# Llama-2-70B at TP 2 on Vidur's A100 tables beside the MLP's: measured attention (decode
# and prefill, or aiconfigurator's), all-reduces, and over two stages the sends between them.
MLP_70B = "profiles/vidur/compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv"
PROFILE_TABLES = {
    "vidur": dict(attention_csv="profiles/vidur/compute/a100/attention_llama2_70b_tp2.csv",
                  all_reduce_csv="profiles/vidur/network/a100_dgx/all_reduce.csv"),
    "aiconfigurator": dict(aiconfigurator_dir="profiles/aiconfigurator/a100_sxm"),
    "sends": dict(attention_csv="profiles/vidur/compute/a100/attention_llama2_70b_tp2.csv",
                  send_recv_csv="profiles/vidur/network/a100_dgx/send_recv.csv"),
}


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_mode_matches_reference_on_profile_tables(data: st.DataObject) -> None:
    # The profile cost's tables in place of the roofline's terms: a decode run looks up its
    # steps' attention, collectives and sends as arrays, an iteration one batch at a time.
    case = data.draw(scenarios())
    tables = data.draw(st.sampled_from(sorted(PROFILE_TABLES)))
    case["deployment"] = Deployment(model=model_spec("llama2-70b"), hardware=HardwareConfig(
        gpu=gpu_spec("a100-80gb"), tensor_parallel=2, pipeline_parallel=2 if tables == "sends" else 1))
    case["cost"] = ProfileCostConfig(kind="profile", mlp_csv=MLP_70B, **PROFILE_TABLES[tables],
                                     overhead=data.draw(overheads(launches=True)))
    assert_same_run(case)


# --- cost_out_of_range: fast mode prices a decode run ahead and cuts it at an arrival; only
# the steps that ran count (and warn), as in reference mode ---

FITTED_KNOTS = [64]
NARROW_FIT = {"format": "orcasim-fitted-cost/v1", "knots_tokens": FITTED_KNOTS,
              "coefficients_s": dict(zip(["const", "tokens", "num_requests", "sum_context_decode",
                                          "sum_prefill_sq", "tokens_over_64"],
                                         [1e-3, 2e-5, 1e-4, 3e-7, 1e-8, 5e-6], strict=True)),
              # decodes of 8 requests leave this range within a run, so cut runs reach past it
              "range": {"tokens": [1, 4096], "num_requests": [1, 64],
                        "sum_context_decode": [0, 600], "sum_prefill_sq": [0, 1e9],
                        "max_context": [1, 100000]}}
# Llama-2-70B at TP 2 on Vidur's A100 tables: decode attention is measured up to 4,032 KV
# tokens, so a batch of prompts past 4,030 decodes outside it at every step.
VIDUR_70B = {"kind": "profile",
             "mlp_csv": "profiles/vidur/compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv",
             "attention_csv": "profiles/vidur/compute/a100/attention_llama2_70b_tp2.csv"}


def out_of_range_in_both_modes(data: dict) -> dict[str, tuple[dict[str, float], int]]:
    """Per mode: each system's cost_out_of_range, and how many range warnings were given."""
    seen = {}
    for mode in ("fast", "reference"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = run_scenario(scenario_from_dict({**data, "engine": {"mode": mode}}))
        seen[mode] = ({name: s.summary["cost_out_of_range"] for name, s in result.systems.items()},
                      sum("range" in str(w.message) for w in caught))
    return seen


def every_paged_kind(batch: int) -> list[dict]:
    return [{"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": batch}},
            {"name": "paged", "scheduler": {"kind": "paged", "max_num_seqs": batch}},
            {"name": "prefill-first", "scheduler": {"kind": "paged", "policy": "prefill_first",
                                                    "max_num_seqs": batch}},
            {"name": "chunked", "scheduler": {"kind": "chunked", "max_num_seqs": batch}}]


@pytest.mark.parametrize("overhead", [None, {"per_iteration_s": 0.0}], ids=["plain", "overhead"])
def test_out_of_range_counts_only_steps_that_ran_with_a_fitted_cost(tmp_path: Path,
                                                                     overhead: dict | None) -> None:
    path = tmp_path / "narrow.yaml"
    path.write_text(yaml.safe_dump(NARROW_FIT))
    cost = {"kind": "fitted", "path": str(path), **({"overhead": overhead} if overhead else {})}
    data = {"name": "oor", "seed": 1, "cost": cost,
            "workload": {"num_requests": 60, "arrival": {"kind": "poisson", "rate_per_s": 40.0},
                         "prompt_tokens": {"kind": "uniform", "low": 1, "high": 60},
                         "output_tokens": {"kind": "uniform", "low": 20, "high": 120},
                         "max_tokens": 200},
            "kv_capacity_tokens": 4000, "systems": every_paged_kind(8)}
    seen = out_of_range_in_both_modes(data)
    assert all(count > 0 for count in seen["reference"][0].values())
    assert seen["fast"] == seen["reference"]  # 79 against 71 when steps past a cut counted


def test_out_of_range_counts_only_steps_that_ran_with_a_profile_cost() -> None:
    data = {"name": "oor", "seed": 2, "model": "llama2-70b",
            "hardware": {"gpu": "a100-80gb", "tensor_parallel": 2}, "cost": VIDUR_70B,
            "workload": {"num_requests": 16, "arrival": {"kind": "poisson", "rate_per_s": 0.3},
                         "prompt_tokens": {"kind": "uniform", "low": 4030, "high": 4040},
                         "output_tokens": {"kind": "uniform", "low": 20, "high": 56},
                         "max_tokens": 4096},
            "systems": every_paged_kind(4)[:2]}
    seen = out_of_range_in_both_modes(data)
    assert all(count > 0 for count in seen["reference"][0].values())
    assert seen["fast"] == seen["reference"]  # 413 against 353 when steps past a cut counted


def _late(case: dict, offset_s: float) -> dict:
    """`case` with every arrival and its warm-up `offset_s` later on the clock."""
    requests = case["requests"]
    later = dataclasses.replace(requests, arrival_s=requests.arrival_s + offset_s)
    return dict(case, requests=later, warmup_s=case["warmup_s"] + offset_s)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from([1e6, 1e8, 9e8]))
def test_fast_mode_matches_reference_late_on_the_clock(case: dict, offset_s: float) -> None:
    """Where a float keeps 1.5e-8 s (1e8 s) to 1.2e-7 s (9e8 s), below the 1e9 s a run
    may reach: an iteration's priced duration and its clock span (end - start) differ by
    up to half that. Rows of one iteration recorded the price, rows of a jump the span, so
    busy_fraction and the KV's time-weighted means told the modes apart by up to 1.1e-8
    (a tester's finding). Latencies, differences of the timestamps, agree too."""
    late = _late(case, offset_s)
    assert_same_run(late)
    ref_reqs, _, _ = simulate(late, "reference")
    fast_reqs, _, _ = simulate(late, "fast")
    for later, earlier in (("first_token_s", "arrival_s"), ("finish_s", "first_token_s")):
        np.testing.assert_allclose(fast_reqs[later] - fast_reqs[earlier],
                                   ref_reqs[later] - ref_reqs[earlier], rtol=TIMESTAMP_RTOL,
                                   err_msg=f"{later} - {earlier}")
