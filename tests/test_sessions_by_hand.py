"""Session workloads end to end against an independent replay of their rules.

Each iteration takes 1 s, the batch holds every call in flight (a fan-out's unused
stragglers too) and every send falls on an iteration boundary, so a call answers
`output_tokens` seconds after it is sent. From the drawn plan
alone the tests replay the closed loop (prompt = system prompt + earlier turns, oldest
dropped to the limit, + the new message; a fan-out step done at its `wait_for`-th answer,
ties by branch; the next step sent its pause later; the next session started as one
ends) and check the run's rows, its sessions table and its summary against it; and, with
prefix caching and an unbounded pool, that a turn finds exactly the earlier turn's context
in whole blocks.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest

from orcasim.run import make_requests, run_scenario
from orcasim.scenario import scenario_from_dict
from orcasim.workload.sessions import SessionPlan

SECONDS_PER_HOUR = 3600.0


def agents_scenario(mode: str, seed: int) -> dict[str, Any]:
    """Five agent tasks, two at a time, each step fanning out to three calls and going on
    with the first two answers; a context limit that truncation reaches."""
    arrival = {"kind": "agents", "num_sessions": 5, "concurrent_sessions": 2,
               "system_prompt": {"tokens": 10, "shared_fraction": 0.5},
               "steps": {"kind": "uniform", "low": 1, "high": 5},
               "observation_tokens": {"kind": "uniform", "low": 1, "high": 12},
               "output_tokens": {"kind": "uniform", "low": 1, "high": 6},
               "tool_time": {"kind": "constant", "value_s": 1.0},
               "fan_out": {"branches": 3, "wait_for": 2},
               "max_context_tokens": 40}
    return {"name": "by-hand", "seed": seed, "workload": {"max_tokens": 46, "arrival": arrival},
            "cost": {"kind": "linear", "base_s": 1.0}, "kv_capacity_tokens": 100_000,
            "engine": {"mode": mode},
            "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level",
                                                       "max_batch_size": 64}}]}


def replay(plan: SessionPlan) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every call's send time, prompt and answer time, and every session's start and end,
    by the rules alone (each call answers `output_tokens` s after it is sent)."""
    calls, sessions = [], []
    free_s = [0.0] * plan.concurrent  # when each of the concurrent agents is next free
    for s in range(plan.num_sessions):
        lane = int(np.argmin(free_s))  # the next session starts as the first one ends
        send_s = start_s = free_s[lane]
        system = plan.system_tokens if plan.system_ids[s] >= 0 else 0
        turns: list[int] = []
        for t in range(int(plan.step_start[s]), int(plan.step_start[s + 1])):
            message = int(plan.message_tokens[t])
            while system + sum(turns) + message > plan.max_context_tokens:
                turns.pop(0)
            prompt = system + sum(turns) + message
            outputs = [int(x) for x in plan.output_tokens[t]]
            for b, output in enumerate(outputs):
                calls.append((s, t - int(plan.step_start[s]), b, send_s, prompt, send_s + output))
            kept = sorted(range(len(outputs)), key=lambda b: (outputs[b], b))[: plan.wait_for]
            done_s = send_s + outputs[kept[-1]]
            turns.append(message + sum(outputs[b] for b in kept))
            send_s = done_s + float(plan.pause_s[t])
        free_s[lane] = done_s
        sessions.append((s, start_s, done_s))
    return (pd.DataFrame(calls, columns=["session_id", "session_step", "branch", "arrival_s",
                                         "prompt_tokens", "finish_s"]),
            pd.DataFrame(sessions, columns=["session_id", "start_s", "end_s"]))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_fan_out_agent_run_follows_its_rules_by_hand(seed: int, mode: str) -> None:
    data = agents_scenario(mode, seed)
    plan = make_requests(scenario_from_dict(data)).sessions
    assert plan is not None
    calls, sessions = replay(plan)
    result = run_scenario(data).systems["orca"]
    key = ["session_id", "session_step", "branch"]
    got = result.requests.sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(got[calls.columns], calls, check_dtype=False)
    assert result.sessions is not None
    table = result.sessions
    pd.testing.assert_frame_equal(table[sessions.columns], sessions, check_dtype=False)
    np.testing.assert_allclose(table["task_time_s"], table["server_s"] + table["tool_s"])
    task_s = (sessions["end_s"] - sessions["start_s"]).to_numpy()
    summary = result.summary
    assert summary["sessions_completed"] == 5 and summary["sessions_failed"] == 0
    span_s = sessions["end_s"].max() - sessions["start_s"].min()
    assert summary["tasks_per_hour"] == pytest.approx(5 * SECONDS_PER_HOUR / span_s)
    assert summary["task_time_p50_s"] == pytest.approx(np.percentile(task_s, 50))
    assert summary["task_time_p90_s"] == pytest.approx(np.percentile(task_s, 90))


def conversations_scenario(mode: str, block_tokens: int, seed: int,
                           disaggregated: bool = False) -> dict[str, Any]:
    """Conversations on a caching server whose pool never evicts, without truncation."""
    arrival = {"kind": "conversations", "num_sessions": 12, "concurrent_sessions": 4,
               "system_prompt": {"tokens": 30, "shared_fraction": 0.5},
               "turns": {"kind": "uniform", "low": 1, "high": 6},
               "user_tokens": {"kind": "uniform", "low": 1, "high": 50},
               "output_tokens": {"kind": "uniform", "low": 1, "high": 40},
               "think_time": {"kind": "exponential", "mean_s": 1.0},
               "max_context_tokens": 10_000}
    scheduler = {"kind": "chunked", "chunk_size_tokens": 32, "max_num_seqs": 16,
                 "block_size_tokens": block_tokens, "enable_prefix_caching": True}
    system: dict[str, Any] = {"name": "x", "scheduler": scheduler}
    if disaggregated:
        system["cluster"] = {"prefill": {"count": 2, "router": {"kind": "session",
                                                                 "fallback": "round_robin"}},
                             "decode": {"count": 2}, "link": {"kind": "infiniband"}}
    return {"name": "turns", "seed": seed, "workload": {"max_tokens": 10_100, "arrival": arrival},
            "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4},
            "kv_capacity_tokens": 10_000_000, "engine": {"mode": mode}, "systems": [system]}


@pytest.mark.parametrize("block_tokens", [1, 16])
@pytest.mark.parametrize("mode", ["fast", "reference"])
@pytest.mark.parametrize("disaggregated", [False, True])
def test_a_later_turn_finds_the_earlier_context_in_whole_blocks(
        block_tokens: int, mode: str, disaggregated: bool) -> None:
    """Turn t resends turn t - 1's prompt and answer: it finds what turn t - 1 computed
    (its prompt and every answer token but the last, never fed back) in whole blocks. A
    disaggregated cluster's prefill instance computed turn t - 1's prompt alone (its
    answer was the decode side's), which is what turn t finds there."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a short run is not judged for saturation
        data = conversations_scenario(mode, block_tokens, seed=block_tokens, disaggregated=disaggregated)
        result = run_scenario(data).systems["x"]
    turns = result.requests.sort_values(["session_id", "session_step"])
    for _, calls in turns.groupby("session_id"):
        prompt, output = calls["prompt_tokens"].to_numpy(), calls["output_tokens"].to_numpy()
        computed = prompt[:-1] if disaggregated else prompt[:-1] + output[:-1] - 1
        expected = computed // block_tokens * block_tokens
        assert calls["cached_tokens"].to_numpy()[1:].tolist() == expected.tolist()
