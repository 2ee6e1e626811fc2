"""The engine's overhead on top of any cost kind (orcasim.cost.overhead), on hand-made batches."""

from __future__ import annotations

import re

import numpy as np
import pytest

from orcasim.config import ScenarioError
from orcasim.cost import Batch, OverheadConfig, build_cost_model
from orcasim.cost.catalog import Deployment, HardwareConfig, gpu_spec, model_spec
from orcasim.cost.linear import LinearCostConfig
from orcasim.cost.roofline import RooflineCostConfig
from orcasim.run import run_scenario
from orcasim.scenario import scenario_from_dict

LINEAR = dict(kind="linear", base_s=0.010, per_token_s=1e-4, per_context_token_s=1e-6)
ZERO = OverheadConfig(per_iteration_s=0.0, per_sequence_s=0.0, per_prefill_token_s=0.0,
                      tensor_parallel_per_iteration_s=0.0, launch_per_layer_s=0.0)


def _deployment(tp: int = 1) -> Deployment:
    return Deployment(model=model_spec("llama2-7b"),
                      hardware=HardwareConfig(gpu=gpu_spec("a100-80gb"), tensor_parallel=tp))


def _batch(query: list[int], context: list[int]) -> Batch:
    return Batch(np.array(query, dtype=np.int64), np.array(context, dtype=np.int64))


def test_host_terms_add_per_iteration_per_request_and_per_prompt_token() -> None:
    overhead = OverheadConfig(per_iteration_s=0.002, per_sequence_s=0.0005,
                              per_prefill_token_s=1e-5)
    cost = build_cost_model(LinearCostConfig(**LINEAR, overhead=overhead))
    # A 50-token prompt beside two decodes: GPU 0.010 + 52e-4 + 1e-6 * (50 + 100 + 200).
    batch = _batch([50, 1, 1], [50, 100, 200])
    gpu_s = 0.010 + 52 * 1e-4 + 350 * 1e-6
    host_s = 0.002 + 3 * 0.0005 + 50 * 1e-5
    assert cost.iteration_time_s(batch) == pytest.approx(gpu_s + host_s, rel=1e-12)


def test_the_launch_floor_binds_only_when_the_gpu_is_quicker() -> None:
    # 32 layers x 1 ms = 32 ms of launches: a decode of a 7B model (about 8 ms) waits for
    # them, a 2,000-token prompt (about 40 ms of compute) does not.
    overhead = ZERO.model_copy(update={"launch_per_layer_s": 1e-3})
    plain = build_cost_model(RooflineCostConfig(kind="roofline"), _deployment())
    cost = build_cost_model(RooflineCostConfig(kind="roofline", overhead=overhead), _deployment())
    decode, prompt = _batch([1], [100]), _batch([2000], [2000])
    assert plain.iteration_time_s(decode) < 0.032 < plain.iteration_time_s(prompt)
    assert cost.iteration_time_s(decode) == 0.032
    assert cost.iteration_time_s(prompt) == plain.iteration_time_s(prompt)


def test_the_tensor_parallel_round_trip_applies_only_beyond_one_gpu() -> None:
    overhead = ZERO.model_copy(update={"tensor_parallel_per_iteration_s": 0.007})
    batch = _batch([1, 1], [10, 20])
    for tp, extra_s in ((1, 0.0), (2, 0.007)):
        plain = build_cost_model(RooflineCostConfig(kind="roofline"), _deployment(tp))
        cost = build_cost_model(RooflineCostConfig(kind="roofline", overhead=overhead), _deployment(tp))
        assert cost.iteration_time_s(batch) == plain.iteration_time_s(batch) + extra_s


@pytest.mark.parametrize("cluster", [False, True], ids=["engine", "fleet"])
def test_the_tensor_parallel_round_trip_reads_the_hardware_without_a_model(cluster: bool) -> None:
    """A linear cost beside `hardware: {tensor_parallel: 4}` and no model: one iteration of
    a lone request costs base 0.010 + 0.81 ms + 0.042 ms + the 7 ms round trip (Vidur's
    defaults). The round trip was dropped (0.010852 s), read as one GPU for want of a model."""
    system = {"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 4}}
    if cluster:
        system["cluster"] = {"replicas": 1}
    sc = scenario_from_dict({
        "name": "tp-no-model", "hardware": {"gpu": "a100-80gb", "tensor_parallel": 4},
        "workload": {"num_requests": 1, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                     "prompt_tokens": {"kind": "constant", "value": 8},
                     "output_tokens": {"kind": "constant", "value": 1}, "max_tokens": 64},
        "kv_capacity_tokens": 1_000, "systems": [system],
        "cost": {"kind": "linear", "base_s": 0.010, "overhead": {}},
    })
    req = run_scenario(sc).systems["orca"].requests.iloc[0]
    assert req["e2e_s"] == pytest.approx(0.010 + 0.81e-3 + 0.042e-3 + 7e-3, rel=1e-12)


@pytest.mark.parametrize("cfg", [LinearCostConfig(**LINEAR), RooflineCostConfig(kind="roofline")],
                         ids=["linear", "roofline"])
def test_zero_overhead_changes_no_bit(cfg) -> None:
    plain = build_cost_model(cfg, _deployment())
    zero = build_cost_model(cfg.model_copy(update={"overhead": ZERO}), _deployment())
    rng = np.random.default_rng(0)
    for _ in range(50):
        size = int(rng.integers(1, 9))
        query = rng.choice([1, 1, 1, 37, 400], size)
        context = query + rng.integers(0, 900, size)
        batch = Batch(query, context)
        assert zero.iteration_time_s(batch) == plain.iteration_time_s(batch)


@pytest.mark.parametrize("cfg", [LinearCostConfig(**LINEAR), RooflineCostConfig(kind="roofline")],
                         ids=["linear", "roofline"])
def test_decode_steps_and_line_repeat_iteration_time_bit_for_bit(cfg) -> None:
    # A floor that binds for the first steps and not after (contexts grow): both branches.
    overhead = OverheadConfig(launch_per_layer_s=3.375e-4 if cfg.kind == "roofline" else 0.0)
    cost = build_cost_model(cfg.model_copy(update={"overhead": overhead}), _deployment())
    context = np.array([900, 1500, 30], dtype=np.int64)
    steps = cost.decode_steps_s(context, 400).tolist()
    each = [cost.iteration_time_s(Batch(np.ones(3, dtype=np.int64), context + j))
            for j in range(400)]
    if cfg.kind == "linear":
        assert steps == each  # the same operations in the same order
    else:  # the roofline's closed form differs from its per-request sum in the last bit
        np.testing.assert_allclose(steps, each, rtol=1e-13)
    line = cost.decode_line(3, int(context.sum()))
    assert line is not None and (line.floor_s > 0) == (cfg.kind == "roofline")
    intercept_s, x0, dx, slope_s, floor_s, plus_s = line
    # The fused Orca loop walks the line: the same bits as decode_steps_s.
    assert [max(intercept_s + (x0 + dx * k) * slope_s, floor_s) + plus_s
            for k in range(400)] == steps
    if cfg.kind == "roofline":  # the floor binds at the first steps, not at the last
        gpu = build_cost_model(cfg, _deployment()).decode_steps_s(context, 400)
        assert gpu[0] < line.floor_s < gpu[-1]
    lists = cost.iteration_time_lists_s([1, 1, 1], context.tolist(), 3, int(context.sum()))
    assert lists == each[0]


def test_a_moved_key_names_its_new_place() -> None:
    with pytest.raises(ValueError, match=r"'iteration_overhead_s' has moved: write it as "
                                         r"cost.overhead.per_iteration_s"):
        RooflineCostConfig.model_validate({"kind": "roofline", "iteration_overhead_s": 0.001})


def test_launches_need_the_layer_count() -> None:
    overhead = OverheadConfig(launch_per_layer_s=1e-4)
    with pytest.raises(ValueError, match="^cost.overhead.launch_per_layer_s needs the layer count: give the scenario keys 'model' and 'hardware'$"):
        build_cost_model(LinearCostConfig(**LINEAR, overhead=overhead))


SCENARIO = {
    "name": "latency", "seed": 1, "kv_capacity_tokens": 4000,
    "workload": {"num_requests": 40, "arrival": {"kind": "poisson", "rate_per_s": 5.0},
                 "prompt_tokens": {"kind": "uniform", "low": 10, "high": 100},
                 "output_tokens": {"kind": "uniform", "low": 2, "high": 20}, "max_tokens": 120},
    "cost": LINEAR,
    "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 4}}],
}


def test_request_latency_adds_to_ttft_and_e2e_only() -> None:
    base = run_scenario(scenario_from_dict(SCENARIO)).systems["orca"].requests
    late = {**SCENARIO, "cost": {**LINEAR, "overhead": {**ZERO.model_dump(),
                                                        "request_latency_s": 0.25}}}
    shifted = run_scenario(scenario_from_dict(late)).systems["orca"].requests
    # Every request reaches the engine 0.25 s later: the same schedule, shifted.
    np.testing.assert_allclose(shifted["ttft_s"], base["ttft_s"] + 0.25, rtol=1e-12)
    np.testing.assert_allclose(shifted["e2e_s"], base["e2e_s"] + 0.25, rtol=1e-12)
    np.testing.assert_allclose(shifted["tpot_s"], base["tpot_s"], rtol=1e-9)
    assert shifted["arrival_s"].tolist() == base["arrival_s"].tolist()


@pytest.mark.parametrize(("where", "cluster"), [
    ("replicas[0]", {"replicas": [{"count": 2, "cost": {"kind": "linear", "base_s": 0.01,
                                                         "overhead": {"request_latency_s": 1.0}}}]}),
    ("prefill", {"prefill": {"count": 1, "cost": {"kind": "linear", "base_s": 0.01,
                                                   "overhead": {"request_latency_s": 1.0}}},
                 "decode": {"count": 1}}),
])
def test_a_groups_own_request_latency_is_refused(where: str, cluster: dict) -> None:
    """A request reaches the router before a replica: a group's or pool's own latency was
    dropped unread (TTFT 12 ms where it said 1 s). The system's applies."""
    system = {"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 4},
              "cluster": cluster}
    with pytest.raises(ScenarioError, match=rf"^systems\[0\].cluster.{re.escape(where)}.cost.overhead."
                                            r"request_latency_s = 1: a request reaches the router "
                                            r"before any replica, so its way in is the system's \(0 s\)"):
        run_scenario(scenario_from_dict({**SCENARIO, "systems": [system]}))
    # A group cost that does not give one (no overhead, or one without it) takes the system's.
    late = {**LINEAR, "overhead": {"request_latency_s": 0.5}}
    for own in ({"kind": "linear", "base_s": 0.02}, {"kind": "linear", "base_s": 0.02,
                                                     "overhead": {"per_iteration_s": 0.001}}):
        group = ({"prefill": {"count": 1, "cost": own}, "decode": {"count": 1}} if where == "prefill"
                 else {"replicas": [{"count": 2, "cost": own}]})
        reqs = run_scenario(scenario_from_dict({**SCENARIO, "cost": late, "systems": [
            {**system, "cluster": group}]})).systems["orca"].requests
        assert (reqs["ttft_s"] > 0.5).all()


@pytest.mark.parametrize("mode", ["fast", "reference"])
@pytest.mark.parametrize("cluster", [None, {"replicas": 2, "router": {"kind": "round_robin"}},
                                     {"prefill": {"count": 1}, "decode": {"count": 1}}])
def test_request_latency_in_a_closed_loop_delays_each_send(mode: str, cluster) -> None:
    # One client who sends again as soon as an answer is back: the engine is idle at each
    # arrival, so a request takes as long as without the way in, plus the way in, and the
    # next is sent when it is done.
    def requests(latency_s: float):
        system = {**SCENARIO["systems"][0], **({"cluster": cluster} if cluster else {})}
        data = {**SCENARIO, "cost": {**LINEAR, "overhead": {**ZERO.model_dump(),
                                                            "request_latency_s": latency_s}},
                "engine": {"mode": mode}, "systems": [system],
                "workload": {**SCENARIO["workload"], "arrival": {
                    "kind": "closed_loop", "num_clients": 1,
                    "think_time": {"kind": "constant", "value_s": 0.0}}}}
        return run_scenario(scenario_from_dict(data)).systems["orca"].requests

    base, late = requests(0.0), requests(0.1)
    np.testing.assert_allclose(late["e2e_s"], base["e2e_s"] + 0.1, rtol=1e-12)
    np.testing.assert_allclose(late["ttft_s"], base["ttft_s"] + 0.1, rtol=1e-12)
    np.testing.assert_allclose(late["first_scheduled_s"] - late["arrival_s"], 0.1, rtol=1e-9)
    assert late["arrival_s"][0] == 0.0  # sent at 0, seen at 0.1
    assert late["arrival_s"][1:].tolist() == late["finish_s"][:-1].tolist()


def test_one_batch_at_a_time_launches_every_stage_s_layers() -> None:
    """A one-batch engine's iteration passes all the stages, each launching its own layers:
    GPT-3 13B's 40 layers on 4 stages at 1 ms a layer take 40 ms a step, as the pipelined
    engine times one request alone (each stage floored by its 10 layers, in turn). The floor
    was the busiest stage's 10 layers: 10 ms a step, a quarter of the launches."""
    launch = ZERO.model_copy(update={"launch_per_layer_s": 1e-3})
    systems = [{"name": "rl", "scheduler": {"kind": "request_level", "max_batch_size": 8}},
               {"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 8}},
               {"name": "paged", "scheduler": {"kind": "paged", "max_num_seqs": 8}}]
    sc = scenario_from_dict({
        "name": "pp-launch", "model": "gpt3-13b",
        "hardware": {"gpu": "a100-40gb", "tensor_parallel": 8, "pipeline_parallel": 4},
        "workload": {"num_requests": 1, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                     "prompt_tokens": {"kind": "constant", "value": 8},
                     "output_tokens": {"kind": "constant", "value": 2}, "max_tokens": 64},
        "kv_capacity_tokens": 10_000, "systems": systems,
        "cost": {"kind": "roofline", "overhead": launch.model_dump()},
    })
    for name, system in run_scenario(sc).systems.items():
        req = system.requests.iloc[0]
        if name != "rl":  # a whole-request engine gives every token at its end
            assert req["ttft_s"] == pytest.approx(0.040, rel=1e-9), name
        assert req["e2e_s"] == pytest.approx(0.080, rel=1e-9), name


@pytest.mark.parametrize("launch_per_layer_s", [0.0, 1e-6, 4e-4])
def test_pipeline_stages_keep_the_models_ends_under_an_overhead(launch_per_layer_s: float) -> None:
    """Llama-2-7B over 4 stages with an engine's host work (once a batch, no stage's) and
    launches (each stage's own): the model's embedding, LM head and sends stay on their
    stages; a launch floor lifts a stage only where its GPU share is quicker than its launches."""
    dep = Deployment(model=model_spec("llama2-7b"),
                     hardware=HardwareConfig(gpu=gpu_spec("a100-80gb"), pipeline_parallel=4))
    overhead = OverheadConfig(per_iteration_s=0.002, per_sequence_s=0.0005, per_prefill_token_s=1e-5,
                              launch_per_layer_s=launch_per_layer_s)
    plain = build_cost_model(RooflineCostConfig(kind="roofline"), dep)
    cost = build_cost_model(RooflineCostConfig(kind="roofline", overhead=overhead), dep)
    batch, layers = _batch([1, 1, 40], [300, 500, 40]), [8, 8, 8, 8]
    host_s = 0.002 + 3 * 0.0005 + 40 * 1e-5
    gpu_s = plain.stage_times_s(batch, layers)
    assert cost.stage_ends(batch) == plain.stage_ends(batch) is not None
    want = [max(g, 8 * launch_per_layer_s) for g in gpu_s]
    assert cost.stage_times_s(batch, layers) == pytest.approx(want, rel=1e-12)
    assert cost.pipeline_host_s(batch) == pytest.approx(host_s, rel=1e-12)
    assert (max(gpu_s) < 8 * launch_per_layer_s) == (launch_per_layer_s == 4e-4)


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_stage_lifted_by_the_lm_head_is_timed_alike_by_every_engine(mode: str) -> None:
    """A tester's case: Llama-3-8B over 4 H100 stages, 0.23 ms to launch a layer, one
    request (8-token prompt, 2 tokens out). The first three stages sit on their launch
    floor (1.85 ms), the last, with the LM head, above it (2.16 ms). The pipelined Orca
    passes the stages in turn (7.71 ms); a one-batch engine took max(GPU, every layer's
    launches), 7.48 ms: 3% apart. Now the iteration's GPU time is the floored stages' sum."""
    overhead = ZERO.model_copy(update={"launch_per_layer_s": 2.3e-4})
    systems = [{"name": "rl", "scheduler": {"kind": "request_level", "max_batch_size": 8}},
               {"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 8}},
               {"name": "paged", "scheduler": {"kind": "paged", "max_num_seqs": 8}}]
    sc = scenario_from_dict({
        "name": "pp-head", "model": "llama3-8b", "engine": {"mode": mode},
        "hardware": {"gpu": "h100-80gb", "pipeline_parallel": 4},
        "workload": {"num_requests": 1, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                     "prompt_tokens": {"kind": "constant", "value": 8},
                     "output_tokens": {"kind": "constant", "value": 2}, "max_tokens": 64},
        "kv_capacity_tokens": 10_000, "systems": systems,
        "cost": {"kind": "roofline", "overhead": overhead.model_dump()},
    })
    cost = build_cost_model(sc.cost, sc.deployment())
    prompt = _batch([8], [8])
    stages = cost.stage_times_s(prompt, [8, 8, 8, 8])
    assert stages[0] == pytest.approx(8 * 2.3e-4) and stages[3] > 8 * 2.3e-4
    assert cost.iteration_time_s(prompt) == pytest.approx(sum(stages), rel=1e-12)
    decode = _batch([1], [9])
    step_s = cost.iteration_time_s(decode)
    assert cost.decode_steps_s(np.array([9]), 1)[0] == pytest.approx(step_s, rel=1e-12)
    for name, system in run_scenario(sc).systems.items():
        req = system.requests.iloc[0]
        if name != "rl":
            assert req["ttft_s"] == pytest.approx(sum(stages), rel=1e-9), name
        assert req["e2e_s"] == pytest.approx(sum(stages) + step_s, rel=1e-9), name


def test_data_parallel_pipeline_stages_by_hand() -> None:
    """Qwen3-30B-A3B over 2 stages of TP 2 x 2 data-parallel attention groups; a 3,000-token
    prompt beside three decodes. Its group sets the GPU time (its own work and every group's
    experts, `data_parallel_floor_s`) and the host's (1 sequence and 3,000 prompt tokens
    beside the 2 sequences and 1,500 tokens of a balanced share); the first stage embeds its
    3,000 tokens and sends them, the last runs the LM head of its 1 request; 0.578 ms to
    launch a layer floors the first stage (0.5770 ms a layer) and not the last (0.5796)."""
    hw = HardwareConfig(gpu=gpu_spec("h100-80gb"), tensor_parallel=2, pipeline_parallel=2,
                        data_parallel_attention=2, expert_parallel=4)
    dep = Deployment(model=model_spec("qwen3-30b-a3b"), hardware=hw)
    overhead = OverheadConfig(per_iteration_s=1e-3, per_sequence_s=2e-4, per_prefill_token_s=2e-6,
                              tensor_parallel_per_iteration_s=7e-3, launch_per_layer_s=5.78e-4)
    plain = build_cost_model(RooflineCostConfig(kind="roofline"), dep)
    cost = build_cost_model(RooflineCostConfig(kind="roofline", overhead=overhead), dep)
    queries, contexts = [3000, 1, 1, 1], [3000, 500, 500, 500]
    batch = _batch(queries, contexts)
    gpu_s = plain.data_parallel_floor_s(queries, contexts, 3003)
    assert plain.iteration_time_s(batch) == gpu_s
    first_s = float(plain.op_time_s(plain.embedding, 3000.0))
    last_s = float(plain.op_time_s(plain.lm_head, 1.0))
    (send_s,) = plain.stage_sends_s(3000.0)
    body_s = (gpu_s - first_s - last_s - send_s) / 2
    stages_gpu_s = [body_s + send_s + first_s, body_s + last_s]
    assert stages_gpu_s[0] < 24 * 5.78e-4 < stages_gpu_s[1]
    host_s = 1e-3 + 7e-3 + 2e-4 * 1 + 2e-6 * 3000  # the prompt's group: more than 2e-4 * 2 + 2e-6 * 1500
    assert cost.stage_times_s(batch, [24, 24]) == pytest.approx([24 * 5.78e-4, stages_gpu_s[1]], rel=1e-12)
    assert cost.pipeline_host_s(batch) == pytest.approx(host_s, rel=1e-12)
    # A one-batch engine passes both stages in turn, and its host works once.
    assert cost.iteration_time_s(batch) == pytest.approx(24 * 5.78e-4 + stages_gpu_s[1] + host_s, rel=1e-12)
