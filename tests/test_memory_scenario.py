"""The shipped memory scenario (scenarios/memory/) stays valid and shows the paper's ordering."""

from __future__ import annotations

from pathlib import Path

from orcasim.run import run_scenario

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "memory" / "opt13b_a100_sharegpt.yaml"


def test_memory_scenario_orders_systems_by_kv_utilization():
    result = run_scenario(SCENARIO, ("workload.arrival.max_requests=80", "workload.arrival.speedup=2"))
    summary = result.summary_frame()
    assert (summary["requests_completed"] == 80).all()
    util = summary["kv_utilization_mean"]
    assert util["orca-max"] < util["orca-pow2"] < util["orca-oracle"] < util["vllm"] <= 1.0
    batch = summary["batch_size_mean"]
    assert batch["orca-max"] < batch["orca-pow2"] < batch["orca-oracle"] < batch["vllm"]
