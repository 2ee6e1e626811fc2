"""Orca's pipelining: several batches in flight, in-flight requests never selected twice."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from pydantic import TypeAdapter

from orcasim import run_scenario
from orcasim.cost import OverheadConfig, build_cost_model
from orcasim.cost.catalog import HardwareConfig
from orcasim.cost.linear import LinearCost, LinearCostConfig
from orcasim.pipeline import PipelinedIterationLevelScheduler, PipelineEngine, warn_unpipelined
from orcasim.requests import Requests
from orcasim.scenario import scenario_from_dict
from orcasim.schedulers import SchedulerConfig
from orcasim.schedulers.iteration_level import IterationLevelConfig
from tests.conftest import make_scenario

# A saturated queue: every request arrives at once; stages are balanced.
ITERATION_LEVEL_MIN_SPEEDUP = 1.8  # "approaches 2x"
REQUEST_LEVEL_MAX_SPEEDUP = 1.05  # "does not gain"


def saturated(pp: int) -> dict[str, float]:
    sc = make_scenario(**{
        "workload.num_requests": 400,
        "workload.arrival": {"kind": "constant", "rate_per_s": 1e6},
        "hardware": {"gpu": "a100-40gb", "pipeline_parallel": pp},
        "cost": {"kind": "linear", "base_s": 0.02, "per_token_s": 1e-5},
    })
    return {n: r.summary["throughput_rps"] for n, r in run_scenario(sc).systems.items()}


@pytest.mark.slow
def test_pipelining_doubles_iteration_level_but_not_request_level() -> None:
    one, two = saturated(1), saturated(2)
    assert two["orca"] / one["orca"] >= ITERATION_LEVEL_MIN_SPEEDUP
    assert two["request-level"] / one["request-level"] <= REQUEST_LEVEL_MAX_SPEEDUP


def requests(n: int) -> Requests:
    return Requests(np.zeros(n), np.full(n, 4, np.int64), np.full(n, 3, np.int64), np.full(n, 7, np.int64))


def test_in_flight_requests_are_not_selected_again() -> None:
    sched = PipelinedIterationLevelScheduler(IterationLevelConfig(kind="iteration_level", max_batch_size=2),
                                             requests(5), kv_capacity_tokens=100)
    for i in range(5):
        sched.add_request(i)
    first, second = sched.schedule(0.0), sched.schedule(0.0)
    assert first.req_ids.tolist() == [0, 1] and second.req_ids.tolist() == [2, 3]
    sched.update_from_output(first)
    third = sched.schedule(0.0)
    assert third.req_ids.tolist() == [0, 1]  # back in the pool, FCFS before request 4
    assert third.num_new_tokens.tolist() == [1, 1]


def test_batches_flow_through_balanced_stages() -> None:
    """Two stages of 0.5 s: the second batch finishes one stage time after the first."""
    reqs = requests(4)
    sched = PipelinedIterationLevelScheduler(IterationLevelConfig(kind="iteration_level", max_batch_size=2),
                                             reqs, kv_capacity_tokens=100)
    engine = PipelineEngine(reqs, sched, LinearCost(LinearCostConfig(kind="linear", base_s=1.0)), num_stages=2)
    run = engine.run()
    it = run.recorder.iterations_frame()
    # 3 output tokens each: 3 iterations per batch, batches alternating, one every 0.5 s,
    # each leaving the last stage two stage times after it entered the first.
    assert (it["start_s"] + 2 * it["duration_s"]).tolist() == pytest.approx([1.0, 1.5, 2.0, 2.5, 3.0, 3.5])
    assert run.recorder.finish_s.tolist() == pytest.approx([3.0, 3.0, 3.5, 3.5])


def test_pipeline_rejects_a_request_that_can_never_fit() -> None:
    """With oracle reservation a request larger than the KV cache is rejected, not hung on."""
    reqs = Requests(np.zeros(3), np.array([4, 90, 4]), np.full(3, 3, np.int64), np.full(3, 100, np.int64))
    cfg = IterationLevelConfig(kind="iteration_level", max_batch_size=2, kv_reservation="oracle")
    sched = PipelinedIterationLevelScheduler(cfg, reqs, kv_capacity_tokens=50)
    run = PipelineEngine(reqs, sched, LinearCost(LinearCostConfig(kind="linear", base_s=1.0)),
                         num_stages=2).run()
    assert run.rejected_ids.tolist() == [1]
    assert np.isnan(run.recorder.finish_s[1]) and not np.isnan(run.recorder.finish_s[[0, 2]]).any()


@pytest.mark.parametrize("capacity_tokens", [14, 21])
def test_a_pipeline_keeps_one_batch_per_stage_in_flight_by_hand(capacity_tokens: int) -> None:
    """Two stages of 0.5 s, batches of one, three requests at 0 (prompt 4, 3 tokens out,
    7 tokens reserved each; a pool of 14 holds two exactly, one of 21 all three, but a
    third batch would have no stage to enter). Requests 0 and 1 alternate,
    each iteration taking both stages, the second half a stage behind: 0 runs [0, 1],
    [1, 2], [2, 3]; 1 runs [0.5, 1.5], [1.5, 2.5], [2.5, 3.5]. Two batches are in flight
    at once, never a third, so request 2 waits for 0's KV and runs alone from 3.0, an
    iteration at a time: [3, 4], [4, 5], [5, 6]."""
    reqs = requests(3)
    sched = PipelinedIterationLevelScheduler(IterationLevelConfig(kind="iteration_level", max_batch_size=1),
                                             reqs, kv_capacity_tokens=capacity_tokens)
    run = PipelineEngine(reqs, sched, LinearCost(LinearCostConfig(kind="linear", base_s=1.0)),
                         num_stages=2).run()
    rows = run.recorder.iterations_frame()
    assert rows["start_s"].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0]
    assert rows["duration_s"].tolist() == [0.5] * 9  # its time on a stage: rows never overlap
    assert run.recorder.first_scheduled_s.tolist() == [0.0, 0.5, 3.0]
    assert run.recorder.first_token_s.tolist() == [1.0, 1.5, 4.0]
    assert run.recorder.finish_s.tolist() == [3.0, 3.5, 6.0]
    assert run.end_s == 6.0


def test_pipelined_rows_do_not_overlap_so_busy_shares_and_timelines_stay_physical() -> None:
    """A tester's case: two one-token-prompt requests at 0, batches of one, four stages of
    0.3 s (an iteration of 1.2 s, 1.1 s for a decode). Rows that spanned whole flights
    overlapped: the replica read 177% busy, and the timeline's batch size swung from +52
    to -36 (np.interp given times that went back). Each stage works 4.6 s of the 2.6 s
    span out of 4 stages: 44%."""
    sc = make_scenario(**{
        "workload.num_requests": 2, "workload.arrival": {"kind": "constant", "rate_per_s": 1e9},
        "workload.prompt_tokens": {"kind": "constant", "value": 2},
        "workload.output_tokens": {"kind": "constant", "value": 2},
        "hardware": {"gpu": "a100-40gb", "pipeline_parallel": 4},
        "cost": {"kind": "linear", "base_s": 1.0, "per_token_s": 0.1},
        "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 1},
                     "cluster": {"replicas": 1}}],
    })
    result = run_scenario(sc).systems["orca"]
    it = result.iterations.sort_values("start_s")
    assert result.requests["finish_s"].tolist() == pytest.approx([2.3, 2.6])
    assert ((it["start_s"] + it["duration_s"]).to_numpy()[:-1] <= it["start_s"].to_numpy()[1:] + 1e-12).all()
    assert result.replicas["busy_fraction"].iloc[0] == pytest.approx(4.6 / 4 / 2.6)
    from orcasim.plots import binned_time_average
    batch = binned_time_average(it, "batch_size", np.linspace(0.0, 2.6, 27))
    assert batch.min() >= 0.0 and batch.max() <= 1.0 + 1e-9
    # Every admitted request's KV, in flight or not: reported, not NaN.
    assert 0 < result.summary["kv_utilization_mean"] <= 1


def test_an_uneven_layer_split_paces_the_pipeline_by_its_busiest_stage() -> None:
    """GPT-3 13B's 40 layers on 3 stages are 13 + 14 + 13, as vLLM splits them (a tester's
    find: each stage took a third). Iterations of 1 s, batches of one, two requests of 2
    tokens out at 0: A's flights run [0, 1] and [1, 2]; B follows A through the stages,
    paced by the 14-layer one, and leaves the last stage at 1.35; its second flight ends at
    2.35 (a third each gave 1.333 and 2.333). A row is the first stage's pass: 13/40 s."""
    sc = make_scenario(**{
        "workload.num_requests": 2, "workload.arrival": {"kind": "constant", "rate_per_s": 1e9},
        "workload.prompt_tokens": {"kind": "constant", "value": 2},
        "workload.output_tokens": {"kind": "constant", "value": 2},
        "model": "gpt3-13b", "kv_capacity_tokens": 1000,
        "hardware": {"gpu": "a100-40gb", "pipeline_parallel": 3},
        "cost": {"kind": "linear", "base_s": 1.0, "per_token_s": 0.0, "per_context_token_s": 0.0},
        "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 1}}],
    })
    result = run_scenario(sc).systems["orca"]
    assert result.requests["first_token_s"].tolist() == pytest.approx([1.0, 1.35], abs=1e-8)  # arrivals 1 ns apart
    assert result.requests["finish_s"].tolist() == pytest.approx([2.0, 2.35], abs=1e-8)
    assert result.iterations["duration_s"].tolist() == pytest.approx([0.325] * 4)  # the first


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_each_stage_launches_its_own_layers(mode: str) -> None:
    """GPT-3 13B on 2 stages of 20 layers, a GPU step of 1 ms, 10 ms to launch a layer and
    50 ms of host work a batch. A stage takes max(its 0.5 ms of GPU, 20 x 10 ms) = 0.2 s,
    after the host's 50 ms: 0.45 s a token. Split by layers, the whole iteration's floor
    (20 x 10 ms: the busiest stage's) was halved too: 0.125 s, a stage faster than it can
    launch its kernels."""
    sc = make_scenario(**{
        "workload.num_requests": 1, "workload.arrival": {"kind": "constant", "rate_per_s": 1.0},
        "workload.prompt_tokens": {"kind": "constant", "value": 2},
        "workload.output_tokens": {"kind": "constant", "value": 3},
        "model": "gpt3-13b", "kv_capacity_tokens": 1000, "engine.mode": mode,
        "hardware": {"gpu": "a100-40gb", "pipeline_parallel": 2},
        "cost": {"kind": "linear", "base_s": 1e-3, "per_token_s": 0.0, "per_context_token_s": 0.0,
                 "overhead": {"per_iteration_s": 0.05, "per_sequence_s": 0.0,
                              "tensor_parallel_per_iteration_s": 0.0, "launch_per_layer_s": 0.01}},
        "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 1}}],
    })
    result = run_scenario(sc).systems["orca"]
    assert result.iterations["duration_s"].tolist() == pytest.approx([0.2] * 3, abs=1e-12)
    start_s = float(result.requests["arrival_s"][0])
    assert result.requests["finish_s"][0] == pytest.approx(start_s + 3 * 0.45, abs=1e-12)


def test_the_kv_in_use_is_every_admitted_request_s_tokens_at_each_step() -> None:
    # Kept as a running sum; checked against the sum over the running set at every step.
    rng = np.random.default_rng(3)
    n = 60
    reqs = Requests(np.sort(rng.uniform(0, 5, n)), rng.integers(1, 50, n), rng.integers(1, 20, n),
                    np.full(n, 80, np.int64))
    sched = PipelinedIterationLevelScheduler(IterationLevelConfig(kind="iteration_level", max_batch_size=4),
                                             reqs, kv_capacity_tokens=600)
    for r in range(n):
        sched.add_request(r)
    in_flight: list = []
    steps = 0
    while sched.has_unfinished():
        out = sched.schedule(0.0)
        running = np.array(sched.running, dtype=np.int64)
        assert out.kv_used_tokens == int((reqs.prompt_tokens[running] + sched.generated[running]).sum())
        if not out.is_empty:
            in_flight.append(out)
        if len(in_flight) == 3 or (out.is_empty and in_flight):  # three stages
            sched.update_from_output(in_flight.pop(0))
        steps += 1
    assert steps > n and sched.kv_held_tokens == 0


@pytest.mark.parametrize(("cfg", "stages", "warns"), [
    ({"kind": "paged"}, 2, True), ({"kind": "chunked", "chunk_size_tokens": 64}, 4, True),
    ({"kind": "paged", "policy": "prefill_first"}, 2, True), ({"kind": "paged"}, 1, False),
    ({"kind": "iteration_level", "max_batch_size": 4}, 2, False),
    ({"kind": "request_level", "max_batch_size": 4}, 2, False),
])
def test_a_scheduler_that_keeps_one_batch_in_flight_is_named_on_pipeline_stages(
    cfg: dict, stages: int, warns: bool,
) -> None:
    config = TypeAdapter(SchedulerConfig).validate_python(cfg)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_unpipelined(config, stages)
    messages = [str(w.message) for w in caught]
    if not warns:
        assert messages == []
        return
    assert messages == [
        f"scheduler.kind = '{cfg['kind']}' with hardware.pipeline_parallel = {stages}: one batch "
        "at a time passes through all stages (only iteration_level keeps several in flight, as "
        "Orca does)"]
    assert caught[0].category is UserWarning


def test_a_pipelined_system_warns_of_an_unpipelined_scheduler() -> None:
    scenario = make_scenario(**{
        "workload.num_requests": 5, "hardware": {"gpu": "a100-40gb", "pipeline_parallel": 2},
        "systems": [{"name": "v", "scheduler": {"kind": "paged", "max_num_seqs": 4}}],
    })
    with pytest.warns(UserWarning, match="'paged' with hardware.pipeline_parallel = 2"):
        run_scenario(scenario)


def test_an_arrival_at_a_flight_s_end_joins_the_batch_formed_after_it() -> None:
    """Request 1 arrives at 1.0, exactly when request 0's first flight ends: the flight
    ends first, so the next batch holds both (0's second token, 1's prompt), [1, 2], then
    [2, 3] (0 finishes) and 1 alone [3, 4]. Planning the arrival first would launch it
    alone into the free stage, a batch ahead of 0."""
    reqs = Requests(np.array([0.0, 1.0]), np.full(2, 4, np.int64), np.full(2, 3, np.int64),
                    np.full(2, 7, np.int64))
    sched = PipelinedIterationLevelScheduler(IterationLevelConfig(kind="iteration_level", max_batch_size=4),
                                             reqs, kv_capacity_tokens=100)
    run = PipelineEngine(reqs, sched, LinearCost(LinearCostConfig(kind="linear", base_s=1.0)),
                         num_stages=2).run()
    rows = run.recorder.iterations_frame()
    assert rows["start_s"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert rows["batch_size"].tolist() == [1, 2, 2, 1]
    assert run.recorder.finish_s.tolist() == [3.0, 4.0]


def test_pipelined_rows_never_overlap_when_a_later_stage_is_the_busiest() -> None:
    """A tester's case: Llama-3-8B over 16 stages (the last, with the LM head, the slowest),
    batches of one, 64 requests at once. Rows timed by the busiest stage from the first
    stage's start overlapped the next (927 of 1,390 in one run) and the time-averaged batch
    read 1.81 with batches of one. A row is the first stage's pass: one batch at a time."""
    sc = scenario_from_dict({
        "name": "pp16", "model": "llama3-8b", "hardware": {"gpu": "h100-80gb", "pipeline_parallel": 16},
        "workload": {"num_requests": 64, "arrival": {"kind": "constant", "rate_per_s": 1e6},
                     "prompt_tokens": {"kind": "constant", "value": 16},
                     "output_tokens": {"kind": "constant", "value": 4}, "max_tokens": 64},
        "kv_capacity_tokens": 100_000, "cost": {"kind": "roofline"},
        "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 1}}],
    })
    rows = run_scenario(sc).systems["orca"].iterations.sort_values("start_s")
    ends = (rows["start_s"] + rows["duration_s"]).to_numpy()
    assert (rows["start_s"].to_numpy()[1:] >= ends[:-1] - 1e-12).all()
    assert rows["batch_size"].max() == 1


def test_a_pipelined_replica_turns_away_a_request_longer_than_one_attention_group() -> None:
    """Data-parallel attention splits the KV pool in groups and a request lives in one: the
    pipelined Orca of a single replica admitted requests of up to 6,010 tokens where each
    of its 2 groups holds 4,000, which the same replica behind a one-replica cluster
    turned away."""
    orca = {"kind": "iteration_level", "max_batch_size": 8, "kv_reservation": "oracle"}
    sc = make_scenario(**{
        "workload.num_requests": 40,
        "workload.prompt_tokens": {"kind": "uniform", "low": 1000, "high": 6000},
        "workload.output_tokens": {"kind": "constant", "value": 10},
        "workload.max_tokens": 6010,
        "model": "qwen3-30b-a3b",
        "hardware": {"gpu": "h100-80gb", "data_parallel_attention": 2, "expert_parallel": 2,
                     "pipeline_parallel": 2},
        "kv_capacity_tokens": 8000,
        "cost": {"kind": "linear", "base_s": 0.01},
        "systems": [{"name": "single", "scheduler": orca},
                    {"name": "cluster", "scheduler": orca, "cluster": {"replicas": 1}}],
    })
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_scenario(sc)
    for name in ("single", "cluster"):
        reqs = result.systems[name].requests
        done = reqs[reqs["finish_s"].notna()]
        assert (done["prompt_tokens"] + done["output_tokens"]).max() <= 4000, name
        assert 0 < result.systems[name].summary["requests_rejected"] < 40, name


def flow_shop_orca(reqs: Requests, batch_size: int, capacity_tokens: int, stage_shares: list[float],
                   base_s: float, per_token_s: float) -> tuple[np.ndarray, list[tuple[float, float, int]]]:
    """Orca's pipeline written out on its own, for the engine to agree with: at each event
    (a flight leaving the last stage, then the arrivals due) launch batches while fewer than
    one per stage are in flight, each of up to `batch_size` admitted requests not in flight
    (FCFS), topped up from the queue while their reservations (prompt + output) fit; stage
    k takes its share of the linear iteration and starts once the batch left stage k - 1
    and stage k finished the batch before. Returns (first scheduled, first token, finish)
    per request and each batch's (first stage's start, its time there, size)."""
    n, stages = len(reqs), len(stage_shares)
    need = (reqs.prompt_tokens + reqs.output_tokens).tolist()
    out = np.full((n, 3), np.nan)
    generated, computed = [0] * n, [0] * n
    queue, running, in_flight, reserved, arrived = [], [], set(), 0, 0
    stage_free = [0.0] * stages
    flights: list[tuple[list[int], float]] = []  # (ids, when they leave the last stage)
    rows, now = [], 0.0
    while True:
        while flights and flights[0][1] <= now:
            ids, end_s = flights.pop(0)
            for r in ids:
                in_flight.discard(r)
                computed[r], generated[r] = int(reqs.prompt_tokens[r]) + generated[r], generated[r] + 1
                if generated[r] == 1:
                    out[r, 1] = end_s
                if generated[r] == reqs.output_tokens[r]:
                    out[r, 2] = end_s
                    running.remove(r)
                    reserved -= need[r]
        while arrived < n and reqs.arrival_s[arrived] <= now:
            queue.append(arrived)
            arrived += 1
        while len(flights) < stages:
            chosen = [r for r in running if r not in in_flight][:batch_size]
            while len(chosen) < batch_size and queue and reserved + need[queue[0]] <= capacity_tokens:
                r = queue.pop(0)
                reserved += need[r]
                running.append(r)
                chosen.append(r)
            if not chosen:
                break
            tokens = sum(int(reqs.prompt_tokens[r]) + generated[r] - computed[r] for r in chosen)
            iteration_s = base_s + per_token_s * tokens
            t = now
            for k, share in enumerate(stage_shares):
                begin_s = max(t, stage_free[k])
                if k == 0:
                    rows.append((begin_s, iteration_s * share, len(chosen)))
                    for r in chosen:
                        out[r, 0] = begin_s if np.isnan(out[r, 0]) else out[r, 0]
                t = stage_free[k] = begin_s + iteration_s * share
            in_flight.update(chosen)
            flights.append((chosen, t))
        events = [flights[0][1]] if flights else []
        events += [float(reqs.arrival_s[arrived])] if arrived < n else []
        if not events:
            return out, rows
        now = min(events)


@pytest.mark.parametrize("seed", range(40))
def test_the_pipelined_engine_agrees_with_orca_s_pipeline_written_out(seed: int) -> None:
    """Random small workloads (bursts and gaps, KV that holds a few requests or all, 2 to 5
    stages of even or uneven layers): every request's times and every row, as the flow
    shop written out in `flow_shop_orca` gives them."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    arrival_s = np.sort(rng.choice([0.0, 0.01, 0.03, 0.1], n) * rng.integers(0, 4, n))
    reqs = Requests(arrival_s, rng.integers(1, 40, n), rng.integers(1, 8, n), np.full(n, 50, np.int64))
    layers = [int(k) for k in rng.integers(1, 4, int(rng.integers(2, 6)))]
    batch_size = int(rng.integers(1, 5))
    capacity = int(rng.choice([47, 120, 10_000]))
    cfg = IterationLevelConfig(kind="iteration_level", max_batch_size=batch_size, kv_reservation="oracle")
    cost = LinearCost(LinearCostConfig(kind="linear", base_s=0.01, per_token_s=1e-3))
    run = PipelineEngine(reqs, PipelinedIterationLevelScheduler(cfg, reqs, capacity), cost,
                         len(layers), layers=layers).run()
    want, want_rows = flow_shop_orca(reqs, batch_size, capacity, [k / sum(layers) for k in layers],
                                     0.01, 1e-3)
    rec = run.recorder
    got = np.column_stack([rec.first_scheduled_s, rec.first_token_s, rec.finish_s])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    rows = rec.iterations_frame()
    assert rows["batch_size"].tolist() == [size for _, _, size in want_rows]
    np.testing.assert_allclose(rows[["start_s", "duration_s"]].to_numpy(),
                               [(start, dur) for start, dur, _ in want_rows], rtol=0, atol=1e-12)


@pytest.mark.parametrize(("tp", "round_trip_s"), [(1, 0.0), (2, 0.002)])
def test_the_round_trip_is_a_tensor_parallel_group_s_not_a_pipeline_s(
        tp: int, round_trip_s: float) -> None:
    """Two 10-token prompts at 0, 2 tokens out, one a batch, on 2 stages: a linear step of
    10 ms + 0.1 ms a token, and a 2 ms TP round trip, paid at TP 2 x PP 2, not at TP 1 x PP 2
    (Vidur keys its CPU overheads by the TP degree alone). The host pays it once a batch,
    before the first stage; each stage takes half the GPU time: a prompt 5.5 ms a stage, a
    decode 5.05. At TP 2: A's prompt leaves the host at 2 ms and the stages at 13, B's at 4
    and 18.5 (stage 1 busy until 7.5); A's decode, planned at 13, leaves the host at 15 and
    stage 2 at 25.1; B's, planned at 18.5, the host at 20.5, stage 2 at 30.6. At TP 1 the
    same without the host: 11, 16.5, 21.55 and 26.6 ms."""
    reqs = Requests(np.zeros(2), np.full(2, 10), np.full(2, 2), np.full(2, 64, np.int64))
    overhead = OverheadConfig(per_iteration_s=0.0, per_sequence_s=0.0,
                              tensor_parallel_per_iteration_s=0.002)
    cost = build_cost_model(LinearCostConfig(kind="linear", base_s=0.010, per_token_s=1e-4,
                                             overhead=overhead),
                            None, HardwareConfig(gpu="a100-80gb", tensor_parallel=tp,
                                                 pipeline_parallel=2))
    cfg = IterationLevelConfig(kind="iteration_level", max_batch_size=1)
    rec = PipelineEngine(reqs, PipelinedIterationLevelScheduler(cfg, reqs, 1000), cost, 2).run().recorder
    prompt_s, decode_s, host_s = 0.011 / 2, 0.0101 / 2, round_trip_s
    first_s = [host_s + 2 * prompt_s, host_s + 3 * prompt_s]
    a_end_s = max(first_s[0] + host_s + decode_s, first_s[1]) + decode_s
    b_end_s = max(first_s[1] + host_s, first_s[0] + host_s + decode_s) + 2 * decode_s
    np.testing.assert_allclose(rec.first_token_s, first_s, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rec.finish_s, [a_end_s, b_end_s], rtol=0, atol=1e-12)
    assert rec.finish_s.tolist() == pytest.approx([0.0251, 0.0306] if tp == 2 else [0.02155, 0.0266])
    rows = rec.iterations_frame()
    np.testing.assert_allclose(rows["duration_s"], [prompt_s, prompt_s, decode_s, decode_s], atol=1e-12)


def test_the_engine_host_prepares_one_batch_at_a_time() -> None:
    """Four one-token requests at 0, a batch each, over 4 stages: 4 ms of GPU a batch (1 ms
    a stage) and 10 ms of host work. One host schedules and prepares every batch in turn
    while the stages run (vLLM's engine loop, `OverheadCost.pipeline_host_s`): batch j
    leaves the host at 10 (j + 1) ms and the last stage 4 ms later, at 14, 24, 34 and 44 ms.
    Split by layers over the stages (3.5 ms a stage), four batches' host work ran at once:
    14, 17.5, 21 and 24.5 ms, the pipeline paced at a quarter of the host's time."""
    reqs = Requests(np.zeros(4), np.full(4, 4), np.ones(4, dtype=np.int64), np.full(4, 64, np.int64))
    overhead = OverheadConfig(per_iteration_s=0.01, per_sequence_s=0.0, tensor_parallel_per_iteration_s=0.0)
    cost = build_cost_model(LinearCostConfig(kind="linear", base_s=0.004, overhead=overhead), None,
                            HardwareConfig(gpu="a100-80gb", pipeline_parallel=4))
    cfg = IterationLevelConfig(kind="iteration_level", max_batch_size=1)
    rec = PipelineEngine(reqs, PipelinedIterationLevelScheduler(cfg, reqs, 1000), cost, 4).run().recorder
    np.testing.assert_allclose(rec.finish_s, [0.014, 0.024, 0.034, 0.044], rtol=0, atol=1e-12)
    rows = rec.iterations_frame()  # the first stage's GPU time, after the host's
    np.testing.assert_allclose(rows[["start_s", "duration_s"]].to_numpy(),
                               [(0.010 * (j + 1), 0.001) for j in range(4)], rtol=0, atol=1e-12)
