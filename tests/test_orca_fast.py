"""The fused Orca loop (orcasim.orca_fast) must equal the engine's generic fast loop bit for bit.

Both are fast mode; test_fast_engine.py checks fast mode (fused, the default) against
reference mode. Here the comparison is exact: same timestamps, same rows, same
scheduler state, for random Orca scenarios and for each cost model kind.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orcasim.closed_loop import arrival_source
from orcasim.cost import build_cost_model
from orcasim.cost.base import CostModel
from orcasim.cost.linear import LinearCost, LinearCostConfig
from orcasim.engine import Engine
from orcasim.requests import ClientLoop, Requests
from orcasim.run import make_requests
from orcasim.scenario import Scenario, load_scenario, scenario_from_dict
from orcasim.schedulers import build_scheduler
from orcasim.schedulers.iteration_level import IterationLevelConfig, IterationLevelScheduler
from orcasim.schedulers.request_level import RequestLevelConfig
from tests.conftest import examples

TIMESTAMPS = ("first_scheduled_s", "first_token_s", "finish_s")


def run_both(requests: Requests, cfg: IterationLevelConfig, make_cost, kv_capacity_tokens: int,
             row_breaks_s: tuple[float, ...] = ()) -> list[tuple[Engine, object]]:
    out = []
    for fused in (True, False):
        run_requests = requests.for_run()  # a closed loop's own arrival times
        scheduler = IterationLevelScheduler(cfg, run_requests, kv_capacity_tokens)
        engine = Engine(run_requests, scheduler, make_cost(), "fast", row_breaks_s, fused=fused,
                        arrivals=arrival_source(run_requests))
        assert engine.fused is fused
        out.append((engine, engine.run()))
    return out


def assert_identical(runs: list[tuple[Engine, object]]) -> None:
    assert_same_runs(runs)
    (fused, _), (generic, _) = runs
    for state in ("computed", "generated"):
        assert np.array_equal(getattr(fused.scheduler, state), getattr(generic.scheduler, state))
    assert fused.scheduler.reserved_tokens == generic.scheduler.reserved_tokens == 0


def assert_same_runs(runs: list[tuple[Engine, object]]) -> None:
    """A fused run and a generic one: the same arrivals, timestamps, rows, end and rejections."""
    (fused, fused_run), (generic, generic_run) = runs
    assert np.array_equal(fused.requests.arrival_s, generic.requests.arrival_s)
    for col in TIMESTAMPS:
        a, b = getattr(fused_run.recorder, col), getattr(generic_run.recorder, col)
        assert np.array_equal(a, b, equal_nan=True), col
    pd.testing.assert_frame_equal(fused_run.recorder.iterations_frame(),
                                  generic_run.recorder.iterations_frame(), check_exact=True)
    assert fused_run.end_s == generic_run.end_s
    assert np.array_equal(fused_run.rejected_ids, generic_run.rejected_ids)


@st.composite
def orca_cases(draw: st.DrawFn, closed_loop: bool = False) -> dict:
    n = draw(st.integers(1, 50))
    gaps_s = draw(st.lists(st.sampled_from([0.0, 0.01, 0.05, 0.2, 0.7]) | st.floats(0.0, 0.5),
                           min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    slack = draw(st.integers(0, 30))
    max_tokens = np.array(prompt) + np.array(output) + slack
    # A closed loop: clients send again after the gaps (think times), from completions.
    clients = ClientLoop(draw(st.integers(1, 8)), np.array(gaps_s)) if closed_loop else None
    requests = Requests(np.cumsum(gaps_s) if clients is None else np.full(n, np.nan),
                        np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64),
                        max_tokens.astype(np.int64), clients)
    cfg = IterationLevelConfig(kind="iteration_level", max_batch_size=draw(st.integers(1, 8)),
                               kv_reservation=draw(st.sampled_from(["max", "pow2", "oracle"])))
    # Some capacities reject the largest requests (never fit): both loops must agree.
    capacity = int(max_tokens.max()) * draw(st.integers(1, 5)) - draw(st.integers(0, 20))
    cost = LinearCostConfig(kind="linear", base_s=draw(st.sampled_from([0.01, 0.0125, 0.05])),
                            per_token_s=draw(st.sampled_from([0.0, 1e-4, 3.3e-4])),
                            per_context_token_s=draw(st.sampled_from([0.0, 1e-5, 7e-6])))
    breaks = tuple(draw(st.lists(st.floats(0.0, 5.0), max_size=2)))
    return dict(requests=requests, cfg=cfg, cost=cost, capacity=max(capacity, 1), breaks=breaks)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(orca_cases())
def test_fused_loop_equals_generic_loop(case: dict) -> None:
    runs = run_both(case["requests"], case["cfg"], lambda: LinearCost(case["cost"]),
                    case["capacity"], case["breaks"])
    assert_identical(runs)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(orca_cases(closed_loop=True))
def test_fused_loop_equals_generic_loop_in_a_closed_loop(case: dict) -> None:
    runs = run_both(case["requests"], case["cfg"], lambda: LinearCost(case["cost"]),
                    case["capacity"], case["breaks"])
    assert_identical(runs)


REGRESSION = Path(__file__).parent.parent / "scenarios" / "regression"


def _orca_parts(scenario: Scenario) -> tuple[Requests, IterationLevelConfig, CostModel, int]:
    """Requests, the (first) Orca system's config, a cost-model factory and KV capacity."""
    system = next(s for s in scenario.systems if s.scheduler.kind == "iteration_level")
    return (make_requests(scenario), system.scheduler,
            lambda: build_cost_model(scenario.system_cost(system), scenario.deployment()),
            scenario.kv_capacity_tokens)


def _scenario_cost(cost_keys: dict) -> tuple[Requests, IterationLevelConfig, CostModel, int]:
    data = {
        "name": "fused", "seed": 11, **cost_keys,
        "workload": {"num_requests": 600, "arrival": {"kind": "poisson", "rate_per_s": 6.0},
                     "prompt_tokens": {"kind": "uniform", "low": 1, "high": 500},
                     "output_tokens": {"kind": "uniform", "low": 1, "high": 300},
                     "max_tokens": 800},
        "kv_capacity_tokens": 8000,
        "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 16}}],
    }
    return _orca_parts(scenario_from_dict(data))


ROOFLINE = {"model": "llama2-7b", "hardware": {"gpu": "a100-80gb"}, "cost": {"kind": "roofline"}}
ROOFLINE_COMPUTE_BOUND = {"model": "gpt3-13b", "hardware": {"gpu": "a100-40gb"},
                          "cost": {"kind": "roofline", "memory_efficiency": 1.0,
                                   "compute_efficiency": 0.05}}


def test_fused_loop_equals_generic_loop_with_roofline() -> None:
    for keys in (ROOFLINE, ROOFLINE_COMPUTE_BOUND):
        requests, cfg, make_cost, capacity = _scenario_cost(keys)
        assert_identical(run_both(requests, cfg, make_cost, capacity, (20.0,)))


@pytest.mark.parametrize("name", ["profile_vidur.yaml", "fitted_distserve.yaml", "trace_azure_code.yaml"])
def test_fused_loop_equals_generic_loop_on_regression_scenarios(name: str) -> None:
    requests, cfg, make_cost, capacity = _orca_parts(load_scenario(REGRESSION / name))
    assert_identical(run_both(requests, cfg, make_cost, capacity))


def test_fused_loop_is_used_only_for_plain_orca() -> None:
    requests = Requests(np.zeros(2), np.ones(2, dtype=np.int64), np.ones(2, dtype=np.int64),
                        np.full(2, 4, dtype=np.int64))
    cost = LinearCost(LinearCostConfig(kind="linear", base_s=1.0))
    orca = IterationLevelConfig(kind="iteration_level", max_batch_size=2)
    static = RequestLevelConfig(kind="request_level", max_batch_size=2)

    class Subclass(IterationLevelScheduler):
        fast_forward = IterationLevelScheduler.fast_forward

    assert Engine(requests, IterationLevelScheduler(orca, requests, 8), cost, "fast").fused
    assert not Engine(requests, IterationLevelScheduler(orca, requests, 8), cost, "reference").fused
    assert not Engine(requests, Subclass(orca, requests, 8), cost, "fast").fused
    assert not Engine(requests, build_scheduler(static, requests, 8), cost, "fast").fused


@pytest.mark.parametrize("fused", [True, False])
def test_the_fused_loop_keeps_the_recorders_finished_once_check(fused: bool) -> None:
    """A request whose finish is already recorded (a replica sharing the fleet's recorder
    that finished it too) must trip the recorder's 'a request finished twice' check in
    the fused loop as in the generic one: the fused Orca loop wrote finish_s itself and
    overwrote it silently, where every other engine variant goes through
    `Recorder.record_finished`."""
    requests = Requests(np.array([0.0, 0.0]), np.array([4, 4]), np.array([3, 2]), np.array([8, 8]))
    cfg = IterationLevelConfig(kind="iteration_level", max_batch_size=2)
    engine = Engine(requests, IterationLevelScheduler(cfg, requests, 64),
                    LinearCost(LinearCostConfig(kind="linear", base_s=1.0)), "fast", fused=fused)
    assert engine.fused is fused
    engine.recorder.finish_s[1] = 0.5  # as if another replica had finished it
    with pytest.raises(AssertionError, match="a request finished twice"):
        engine.run()
