"""Closed-loop workloads: think times match theory, runs obey the interactive response-time law."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orcasim.closed_loop import ClosedLoopSource, arrival_source
from orcasim.config import ScenarioError
from orcasim.cost.linear import LinearCost, LinearCostConfig
from orcasim.engine import Engine
from orcasim.metrics import requests_frame
from orcasim.requests import ClientLoop, Requests
from orcasim.run import at_the_engine, make_requests, run_scenario
from orcasim.scenario import load_scenario
from orcasim.schedulers import build_scheduler
from orcasim.schedulers.iteration_level import IterationLevelConfig
from orcasim.schedulers.paged import PagedConfig
from orcasim.sources import ArrivalSource
from orcasim.warmup import closed_loop_start_text
from orcasim.workload.closed_loop import ClosedLoopArrival, ConstantThink, ExponentialThink
from tests.conftest import make_scenario, requests_in_both_modes

SAMPLES = 200_000
MEAN_SIGMAS = 5.0  # sample mean within 5 standard errors of the theoretical mean
EXACT_RTOL = 1e-9  # closed forms that hold exactly, up to float rounding
# N = X (R + Z) over a finite window: edge effects of O((R + Z) / window), about 0.5%
# on the runs below (a few hundred seconds, cycles of about a second).
RESPONSE_TIME_LAW_REL_TOL = 0.02
LITTLE_REL_TOL = 0.02  # as in test_queueing_theory

THINK_TIMES = [
    ExponentialThink(kind="exponential", mean_s=2.0),
    ConstantThink(kind="constant", value_s=0.7),
    ConstantThink(kind="constant", value_s=0.0),
]
# Linear cost of a lone request with constant lengths, as LinearCostConfig states it.
BASE_S, PER_TOKEN_S, PER_CONTEXT_TOKEN_S = 0.01, 1e-4, 1e-6
PROMPT_TOKENS, OUTPUT_TOKENS = 20, 10
SCHEDULERS = {
    "iteration_level": {"kind": "iteration_level", "max_batch_size": 4},
    "request_level": {"kind": "request_level", "max_batch_size": 4},
    "paged": {"kind": "paged", "max_num_seqs": 4},
}


def closed_loop(num_clients: int, think_time: dict) -> dict:
    return {"kind": "closed_loop", "num_clients": num_clients, "think_time": think_time}


def lone_service_s() -> float:
    """One request alone: its prompt iteration, then a decode step per later token."""
    prompt_s = BASE_S + (PER_TOKEN_S + PER_CONTEXT_TOKEN_S) * PROMPT_TOKENS
    steps = np.arange(1, OUTPUT_TOKENS)  # decode step j reads prompt + j tokens
    return prompt_s + float(np.sum(BASE_S + PER_TOKEN_S + PER_CONTEXT_TOKEN_S * (PROMPT_TOKENS + steps)))


def constant_scenario(num_clients: int, think_s: float, scheduler: dict, n: int = 60):
    return make_scenario(**{
        "workload.num_requests": n,
        "workload.arrival": closed_loop(num_clients, {"kind": "constant", "value_s": think_s}),
        "workload.prompt_tokens": {"kind": "constant", "value": PROMPT_TOKENS},
        "workload.output_tokens": {"kind": "constant", "value": OUTPUT_TOKENS},
        "cost": {"kind": "linear", "base_s": BASE_S, "per_token_s": PER_TOKEN_S,
                 "per_context_token_s": PER_CONTEXT_TOKEN_S},
        "systems": [{"name": "s", "scheduler": scheduler}],
    })


@pytest.mark.parametrize("dist", THINK_TIMES, ids=lambda d: f"{d.kind}-{d.mean_think_s()}")
def test_think_time_sample_mean_matches_theory(dist: ExponentialThink | ConstantThink) -> None:
    x = dist.sample(np.random.default_rng(4), SAMPLES)
    assert x.min() >= 0.0
    se = x.std() / np.sqrt(len(x))
    assert abs(x.mean() - dist.mean_think_s()) <= MEAN_SIGMAS * se + 1e-12 * dist.mean_think_s()


@pytest.mark.parametrize(("arrival", "message"), [
    (closed_loop(0, {"kind": "constant", "value_s": 0.0}),
     "workload.arrival.num_clients = 0: Input should be greater than 0"),
    (closed_loop(2, {"kind": "exponential", "mean_s": -1}),
     "workload.arrival.think_time.mean_s = -1: Input should be greater than 0"),
    (closed_loop(2, {"kind": "constant", "value_s": -0.5}),
     "workload.arrival.think_time.value_s = -0.5: Input should be greater than or equal to 0"),
    ({"kind": "closed_loop", "num_clients": 2}, "workload.arrival.think_time: Field required"),
])
def test_bad_closed_loop_is_one_line_naming_the_key(arrival: dict, message: str) -> None:
    with pytest.raises(ScenarioError) as e:
        make_scenario(**{"workload.arrival": arrival})
    assert str(e.value) == f"scenario: {message}"


def test_more_clients_than_requests_says_how_many_ever_send() -> None:
    with pytest.warns(UserWarning, match="num_clients = 50 is above workload.num_requests = "
                                         "10: only 10 clients ever send a request"):
        run_scenario(constant_scenario(50, 0.1, SCHEDULERS["paged"], n=10))


@pytest.mark.parametrize("scheduler", SCHEDULERS.values(), ids=SCHEDULERS.keys())
def test_a_lone_client_sees_the_bare_service_time(scheduler: dict) -> None:
    # N = 1: nobody queues, so R = S exactly, and each request is sent Z after the last.
    think_s = 0.25
    reqs = run_scenario(constant_scenario(1, think_s, scheduler)).systems["s"].requests
    np.testing.assert_allclose(reqs["e2e_s"], lone_service_s(), rtol=EXACT_RTOL)
    sent_s = reqs["finish_s"].to_numpy()[:-1] + think_s
    np.testing.assert_allclose(reqs["arrival_s"].to_numpy()[1:], sent_s, rtol=EXACT_RTOL)


def test_one_at_a_time_with_no_think_time_is_a_round_robin() -> None:
    # Batch size 1, zero think time, N clients: each request waits for the other N - 1,
    # so after the first round R = N S exactly and completions are S apart (X = 1 / S).
    num_clients, s = 5, lone_service_s()
    one = {"kind": "iteration_level", "max_batch_size": 1}
    reqs = run_scenario(constant_scenario(num_clients, 0.0, one)).systems["s"].requests
    np.testing.assert_allclose(reqs["e2e_s"][num_clients:], num_clients * s, rtol=EXACT_RTOL)
    np.testing.assert_allclose(np.diff(reqs["finish_s"]), s, rtol=EXACT_RTOL)
    assert reqs["arrival_s"][:num_clients].tolist() == [0.0] * num_clients


def response_time_law_clients(reqs: pd.DataFrame, think_s: np.ndarray, warmup_s: float) -> float:
    """N estimated as X (R + Z) over [warmup_s, last arrival], while every client cycles.

    X counts completions in the window; R and Z are the response and think times of
    those requests (Z realised, not the mean: its sampling error would swamp the law's).
    """
    end_s = float(reqs["arrival_s"].max())
    finish_s = reqs["finish_s"].to_numpy()
    done = (finish_s >= warmup_s) & (finish_s <= end_s)
    throughput_rps = done.sum() / (end_s - warmup_s)
    return throughput_rps * (reqs["e2e_s"].to_numpy()[done].mean() + think_s[done].mean())


@pytest.mark.validation
def test_runs_obey_the_interactive_response_time_law() -> None:
    num_clients, warmup_s = 16, 20.0
    scenario = make_scenario(**{
        "workload.num_requests": 3000, "warmup_s": warmup_s,
        "workload.arrival": closed_loop(num_clients, {"kind": "exponential", "mean_s": 1.0}),
    })
    clients = make_requests(scenario).clients
    assert clients is not None
    think_s = clients.think_s
    for name, system in run_scenario(scenario).systems.items():
        n = response_time_law_clients(system.requests, think_s, warmup_s)
        assert abs(n - num_clients) / num_clients < RESPONSE_TIME_LAW_REL_TOL, (name, n)
        assert system.summary["little_rel_error"] < LITTLE_REL_TOL, name


def test_each_system_gets_its_own_arrival_times() -> None:
    scenario = make_scenario(**{
        "workload.num_requests": 200,
        "workload.arrival": closed_loop(6, {"kind": "exponential", "mean_s": 0.2}),
    })
    shared = make_requests(scenario)
    runs = run_scenario(scenario).systems
    slow, fast = runs["request-level"].requests, runs["orca"].requests
    assert np.isnan(shared.arrival_s).all()  # the shared table stays system-free
    for reqs in (slow, fast):  # ids in arrival order, lengths by id
        assert reqs["arrival_s"].is_monotonic_increasing and reqs["finish_s"].notna().all()
        assert reqs["output_tokens"].tolist() == shared.output_tokens.tolist()
    # Orca answers sooner, so its clients come back sooner.
    assert fast["arrival_s"].iloc[-1] < slow["arrival_s"].iloc[-1]


def test_a_turned_away_request_frees_its_client_at_once() -> None:
    # Request 1 can never fit in 32 KV tokens: the client thinks and sends request 2.
    think_s = 0.5
    requests = Requests(np.full(3, np.nan), np.array([8, 40, 8]), np.array([2, 2, 2]),
                        np.full(3, 64), ClientLoop(1, np.full(3, think_s))).for_run()
    paged = PagedConfig(kind="paged", max_num_seqs=2, block_size_tokens=4)
    scheduler = build_scheduler(paged, requests, 32)
    cost = LinearCost(LinearCostConfig(kind="linear", base_s=1.0))
    run = Engine(requests, scheduler, cost, arrivals=ClosedLoopSource(requests)).run()
    reqs = requests_frame(requests, run.recorder, run.rejected_ids)
    assert reqs["rejected"].tolist() == [False, True, False]
    # Two 1 s iterations each; the rejection answers at its arrival (2.5 s).
    assert reqs["arrival_s"].tolist() == [0.0, 2.5, 3.0]
    assert reqs["finish_s"].tolist()[::2] == [2.0, 5.0]


@pytest.mark.parametrize("kind", ["iteration_level", "paged"])
def test_turned_away_requests_are_answered_on_time_in_fast_mode(kind: str) -> None:
    """Four clients out of step; every third request can never fit. Each rejection is
    answered at its arrival, inside whatever jump is pending, so its client comes back on
    time: the fused and generic fast loops give reference mode's timestamps."""
    n = 60
    prompt = np.where(np.arange(n) % 3 == 2, 40, 8)
    think_s = 0.25 + 0.5 * (np.arange(n) % 4)  # clients out of step with each other
    requests = Requests(np.full(n, np.nan), prompt, 3 + np.arange(n) % 7, prompt + 10,
                        ClientLoop(4, think_s)).for_run()
    cost = LinearCost(LinearCostConfig(kind="linear", base_s=1.0))
    config = (IterationLevelConfig(kind="iteration_level", max_batch_size=4) if kind == "iteration_level"
              else PagedConfig(kind="paged", max_num_seqs=4, block_size_tokens=4))
    frames = {}
    for mode, fused in (("reference", True), ("fast", True), ("fast", False)):
        scheduler = build_scheduler(config, requests, 32 if kind == "paged" else 36)
        run = Engine(requests, scheduler, cost, mode, fused=fused,  # type: ignore[arg-type]
                     arrivals=ClosedLoopSource(requests)).run()
        frames[mode, fused] = requests_frame(requests, run.recorder, run.rejected_ids)
    reference = frames["reference", True]
    assert reference["rejected"].sum() == n // 3
    for key, frame in frames.items():
        for column in ("arrival_s", "first_token_s", "finish_s"):
            assert frame[column].equals(reference[column]), (key, column)


def test_pipelined_orca_runs_a_closed_loop() -> None:
    # Two stages: a lone client's request still takes every stage of every iteration.
    scenario = constant_scenario(1, 0.1, SCHEDULERS["iteration_level"], n=20)
    staged = scenario.model_copy(update={"hardware": make_scenario(**{
        "hardware": {"gpu": "a100-40gb", "pipeline_parallel": 2}}).hardware})
    plain = run_scenario(scenario).systems["s"].requests
    piped_run = run_scenario(staged).systems["s"]
    assert set(piped_run.iterations["num_iterations"]) == {1}  # the pipelined engine's rows
    piped = piped_run.requests
    np.testing.assert_allclose(piped["e2e_s"], lone_service_s(), rtol=EXACT_RTOL)
    np.testing.assert_allclose(piped["arrival_s"], plain["arrival_s"], rtol=EXACT_RTOL)


def test_shipped_scenario_serves_orcas_clients_faster() -> None:
    scenario = load_scenario("scenarios/closed_loop.yaml")
    assert isinstance(scenario.workload.arrival, ClosedLoopArrival)
    clients = make_requests(scenario).clients
    assert clients is not None
    runs = run_scenario(scenario).systems
    for name, system in runs.items():
        n = response_time_law_clients(system.requests, clients.think_s, scenario.warmup_s)
        assert abs(n - clients.num_clients) / clients.num_clients < RESPONSE_TIME_LAW_REL_TOL, name
    orca, static = runs["orca"].summary, runs["request-level"].summary
    assert orca["throughput_rps"] > static["throughput_rps"]
    assert orca["e2e_s_p50"] < static["e2e_s_p50"]


def test_replaying_a_closed_loop_on_a_real_server_is_refused() -> None:
    pytest.importorskip("torch")
    from calibrate.replay import replay  # the real server replays fixed arrival times

    scenario = load_scenario("scenarios/closed_loop.yaml")
    with pytest.raises(ValueError, match=r"^workload.arrival.kind = closed_loop: replay expects"):
        replay(None, scenario, Path("scenarios"))  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore:.*can never fit")
@pytest.mark.parametrize("kind", ["iteration_level", "paged"])
def test_turned_away_requests_are_answered_on_time_behind_a_router(kind: str) -> None:
    """The same clients on two replicas behind round robin: a replica that does not see
    every arrival cannot plan its jump's end at a rejection, so the delivery of a request
    that can never fit cuts the pending jump there, and its client comes back on time."""
    scheduler = ({"kind": "iteration_level", "max_batch_size": 4, "kv_reservation": "oracle"}
                 if kind == "iteration_level"
                 else {"kind": "paged", "max_num_seqs": 4, "block_size_tokens": 4})
    frames = requests_in_both_modes("c", **{
        "seed": 2, "workload.num_requests": 60,
        "workload.arrival": {"kind": "closed_loop", "num_clients": 4,
                             "think_time": {"kind": "exponential", "mean_s": 0.7}},
        "workload.prompt_tokens": {"kind": "uniform", "low": 4, "high": 60},
        "workload.output_tokens": {"kind": "uniform", "low": 3, "high": 9},
        "workload.max_tokens": 80, "kv_capacity_tokens": 40,
        "cost": {"kind": "linear", "base_s": 1.0},
        "systems": [{"name": "c", "scheduler": scheduler,
                     "cluster": {"replicas": 2, "router": {"kind": "round_robin"}}}],
    })
    reference, fast = frames["reference"], frames["fast"]
    assert reference["rejected"].sum() >= 5 and (~reference["rejected"]).sum() >= 20
    for column in ("arrival_s", "first_token_s", "finish_s", "replica"):
        assert fast[column].equals(reference[column]), column


def test_a_way_in_shows_the_engine_each_send_its_latency_later() -> None:
    # Two clients thinking 1 s; requests reach the engine 0.25 s after they are sent.
    n = 3
    clients = Requests(np.full(n, np.nan), np.full(n, 5), np.full(n, 2), np.full(n, 7),
                       ClientLoop(2, np.full(n, 1.0)))
    table = clients.for_run()
    source = ClosedLoopSource(at_the_engine(table, 0.25))
    assert source.next_time_s() == 0.25
    assert source.take_until(0.2) == range(0)
    assert source.take_until(0.25) == range(0, 2)
    assert source.arrival_s[:2].tolist() == [0.25, 0.25]  # at the engine
    assert table.arrival_s[:2].tolist() == [0.0, 0.0]  # as sent
    source.on_finished([0], 2.0)  # its client sends again at 3.0, seen at 3.25
    assert source.times_until(3.2).tolist() == []
    assert source.times_until(4.0).tolist() == [3.25]
    assert source.take_until(3.25) == range(2, 3)
    assert (source.arrival_s[2], table.arrival_s[2]) == (3.25, 3.0)


def test_an_open_loop_table_gets_a_source_that_replays_its_times() -> None:
    """`arrival_source` picks the source by the table: fixed times are replayed as given,
    clients make a closed loop (this file's other tests only ever built the latter, so a
    replay of nothing survived mutation testing)."""
    times = np.array([0.0, 0.5, 0.5, 2.0])
    n = len(times)
    source = arrival_source(Requests(times, np.full(n, 5), np.full(n, 2), np.full(n, 7)))
    assert type(source) is ArrivalSource and not source.closed_loop
    assert source.next_time_s() == 0.0
    assert source.take_until(0.5) == range(0, 3)
    assert source.take_until(2.0) == range(3, 4) and not source.pending()
    clients = Requests(np.full(n, np.nan), np.full(n, 5), np.full(n, 2), np.full(n, 7),
                       ClientLoop(2, np.full(n, 1.0))).for_run()
    assert type(arrival_source(clients)) is ClosedLoopSource


def test_the_last_request_goes_to_one_of_two_clients_free_at_once() -> None:
    """Two clients, three requests: both first ones finish at 1 s, so both clients send
    again at 2 s (1 s of thought), but only one request is left. The source looks ahead at
    exactly 2 s (a send at the boundary is due) and offers one time only, then hands out
    id 2 and stops there: no fourth request exists to write (found by mutation testing:
    a `<` for `<=` in the look-ahead and a `<=` for `<` in the hand-out both survived)."""
    n = 3
    table = Requests(np.full(n, np.nan), np.full(n, 5), np.full(n, 2), np.full(n, 7),
                     ClientLoop(2, np.full(n, 1.0))).for_run()
    source = ClosedLoopSource(table)
    assert source.take_until(0.0) == range(0, 2)
    source.on_finished([0, 1], 1.0)
    assert source.pending() and source.next_time_s() == 2.0
    assert source.times_until(1.999).tolist() == []
    assert source.times_until(2.0).tolist() == [2.0]  # one request left, not two times
    assert source.take_until(2.0) == range(2, 3)
    assert table.arrival_s.tolist() == [0.0, 0.0, 2.0]
    assert not source.pending()
    assert source.times_until(5.0).tolist() == []  # a client waits with nothing to send


@pytest.mark.validation
def test_the_summarys_throughput_of_a_busy_server_is_one_over_its_service_time() -> None:
    # 64 clients, no think time, one request at a time of exactly D = 10 iterations x 10 ms:
    # the server never idles, so X = 1 / D = 10 req/s over any window (the bound X <= 1/D,
    # attained). Counting only the requests that arrived after the 10 s warm-up, while
    # dividing by the whole window from 10 s, read 836 / 90 = 9.29 (the closed-loop tester's).
    scenario = make_scenario(**{
        "seed": 1, "warmup_s": 10.0, "kv_capacity_tokens": 10_000,
        "workload.num_requests": 1000, "workload.max_tokens": 64,
        "workload.arrival": closed_loop(64, {"kind": "constant", "value_s": 0.0}),
        "workload.prompt_tokens": {"kind": "constant", "value": 10},
        "workload.output_tokens": {"kind": "constant", "value": 10},
        "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 0.0, "per_context_token_s": 0.0},
        "systems": [{"name": "s", "scheduler": {"kind": "request_level", "max_batch_size": 1}}],
    })
    system = run_scenario(scenario).systems["s"]
    finish_s = np.sort(system.requests["finish_s"].to_numpy())
    assert np.diff(finish_s) == pytest.approx(0.1, rel=EXACT_RTOL)  # busy throughout
    # A window's edges cut the periodic completions: one completion either way.
    one_completion_rps = 1.0 / system.summary["duration_s"]
    assert abs(system.summary["throughput_rps"] - 10.0) <= one_completion_rps
    assert abs(system.summary["throughput_tokens_per_s"] - 100.0) <= 10 * one_completion_rps


def test_a_short_run_without_warm_up_counts_the_first_sends_as_free() -> None:
    # N clients in lockstep (a batch holds them all, constant lengths and think time Z): k
    # cycles of response R then think Z, the last without its think. The window runs from
    # the first sends, all at time 0, to the last finish, one R after the last sends (the
    # drain), so X = k N / (k R + (k - 1) Z), above the steady N / (R + Z) by the think time
    # the first sends never waited: 1 / (1 - Z / (k (R + Z))) (README, Closed-loop workloads).
    num_clients, think_s, cycles = 4, 1.0, 3
    batch = {"kind": "iteration_level", "max_batch_size": num_clients}
    scenario = constant_scenario(num_clients, think_s, batch, n=cycles * num_clients)
    # Said before the run, with the bound n / (n - N) the lift reaches as R / Z goes to 0.
    with pytest.warns(UserWarning, match=r"^a closed loop of 4 clients over 12 requests from time 0: "
                      r"every client sends its first request at time 0, without a think time "
                      r"before it, so throughput_rps may read up to 1.50 times the steady rate "
                      r"\(n / \(n - N\)\); expected warmup_s longer than a think time and a "
                      r"response, or more requests$"):
        system = run_scenario(scenario).systems["s"]
    reqs, summary = system.requests, system.summary
    response_s = float(reqs["e2e_s"][0])
    np.testing.assert_allclose(reqs["e2e_s"], response_s, rtol=EXACT_RTOL)  # in lockstep
    window_s = cycles * response_s + (cycles - 1) * think_s
    assert summary["duration_s"] == pytest.approx(window_s, rel=EXACT_RTOL)
    assert summary["throughput_rps"] == pytest.approx(cycles * num_clients / window_s, rel=EXACT_RTOL)
    steady_rps = num_clients / (response_s + think_s)
    lift = 1 / (1 - think_s / (cycles * (response_s + think_s)))
    assert summary["throughput_rps"] == pytest.approx(steady_rps * lift, rel=EXACT_RTOL)
    assert 1.4 < lift < 12 / 8  # 3 cycles of 1 s think after ~0.1 s responses


@pytest.mark.parametrize(("clients", "requests", "warmup_s", "said"), [
    (32, 100, 0.0, "up to 1.47 times"),  # README's: 2.108 and 2.239 req/s against 1.509, 1.546
    (20, 20, 0.0, "every request is a client's first, sent at time 0, so the run measures one burst"),
    (32, 3000, 0.0, None),  # closed_loop.yaml's length: up to 1.011, immaterial
    (32, 100, 30.0, None),  # its first sends are not measured
    (32, 20, 0.0, None),  # more clients than requests: warned of as such
])
def test_a_closed_loop_measured_from_its_start_is_warned_of(
        clients: int, requests: int, warmup_s: float, said: str | None) -> None:
    text = closed_loop_start_text(clients, requests, warmup_s)
    assert (text is None) if said is None else (said in str(text))
