"""`orcasim check`: committed baselines match, and a perturbed cost model is caught."""

from __future__ import annotations

import json
import shutil
import typing
import warnings
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orcasim.cli import app
from orcasim.cost import CostConfig
from orcasim.regression import check
from orcasim.schedulers import SchedulerConfig

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios" / "regression"
BASELINES = ROOT / "results" / "baselines"
# A 1% change of one cost coefficient: far above float noise, small enough to be subtle.
PERTURBATION = 1.01


def kinds(union: object) -> set[str]:
    members = typing.get_args(typing.get_args(union)[0]) or (typing.get_args(union)[0],)
    return {typing.get_args(m.model_fields["kind"].annotation)[0] for m in members}


def test_committed_baselines_match() -> None:
    """And a warning names its scenario: systems of several scenarios share names."""
    with pytest.warns(UserWarning, match="^iteration_level: orca-b32-slow: saturated"):
        moved_rows = check(SCENARIOS, BASELINES)
    assert moved_rows.empty, moved_rows.to_string()


def test_every_scheduler_and_cost_kind_is_covered() -> None:
    used_schedulers, used_costs = set(), set()
    for path in SCENARIOS.glob("*.yaml"):
        sc = yaml.safe_load(path.read_text())
        used_costs.add(sc["cost"]["kind"])
        for system in sc["systems"]:
            used_schedulers.add(system["scheduler"]["kind"])
            used_costs.add((system.get("cost") or sc["cost"])["kind"])
    assert kinds(SchedulerConfig) <= used_schedulers
    assert kinds(CostConfig) <= used_costs


def test_reference_mode_the_overhead_block_and_closed_workloads_are_covered() -> None:
    """Each moves metrics through code no scheduler or cost kind reaches alone: fast mode
    replaces a scheduler's admission step with a fused loop's own, and roofline_pipeline's
    stages price batches by another path than the fused loops' lists. Without them, a
    3% change of the overhead's host time, of the closed loop's think time or of the
    roofline's list-priced batches, or Orca admitting one request fewer in reference mode,
    passed the check (a tester's finding)."""
    modes, overheads, arrivals = set(), 0, set()
    for path in SCENARIOS.glob("*.yaml"):
        sc = yaml.safe_load(path.read_text())
        modes.add(sc.get("engine", {}).get("mode", "fast"))
        costs = [sc["cost"], *(s["cost"] for s in sc["systems"] if "cost" in s)]
        overheads += sum("overhead" in c for c in costs)
        arrivals.add(sc["workload"]["arrival"]["kind"])
    assert modes == {"fast", "reference"}
    assert overheads >= 1
    assert {"closed_loop", "agents"} <= arrivals


def test_a_mixture_of_experts_and_sliding_window_layers_are_covered() -> None:
    """The roofline prices each apart (experts on the busiest expert-parallel rank, a
    window's capped attention); with no such model among the scenarios, a 3% change of the
    experts' compute time or a window one token wider passed the check (a tester's finding)."""
    from orcasim.scenario import load_scenario

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a system saturated on purpose
        models = [m for m in (load_scenario(p).model for p in SCENARIOS.glob("*.yaml")) if m]
    assert any(m.moe is not None for m in models)
    assert any(m.num_window_layers for m in models)


def test_perturbed_cost_coefficient_fails_check(tmp_path: Path) -> None:
    scenarios = tmp_path / "regression"
    shutil.copytree(SCENARIOS, scenarios)
    path = scenarios / "iteration_level.yaml"
    data = yaml.safe_load(path.read_text())
    data["cost"]["per_token_s"] *= PERTURBATION
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["check", "--scenarios", str(scenarios), "--baselines", str(BASELINES)])
    assert res.exit_code == 1
    assert "e2e_s_p50" in res.output
    moved_rows = check(scenarios, BASELINES)
    assert set(moved_rows["scenario"]) == {"iteration_level"}
    assert set(moved_rows["system"]) == {"orca-b8"}  # orca-b32-slow has its own cost model


def test_update_writes_baselines_that_then_match(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["check", "--update", "--scenarios", str(SCENARIOS),
                                   "--baselines", str(tmp_path)])
    assert res.exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{p.stem}.json" for p in SCENARIOS.glob("*.yaml"))
    assert check(SCENARIOS, tmp_path).empty
    # An update says what it rewrote, with every digit, as a failing check does.
    assert f"metrics rewritten in {tmp_path}" in " ".join(res.output.split())
    baseline = tmp_path / "iteration_level.json"
    moved = json.loads(baseline.read_text())
    moved["orca-b8"]["e2e_s_p50"] *= 1.5
    baseline.write_text(json.dumps(moved))
    res = CliRunner().invoke(app, ["check", "--update", "--scenarios", str(SCENARIOS),
                                   "--baselines", str(tmp_path)])
    assert res.exit_code == 0 and "1 metric rewritten in" in res.output, res.output
    assert "e2e_s_p50" in res.output and repr(moved["orca-b8"]["e2e_s_p50"]) in res.output
    res = CliRunner().invoke(app, ["check", "--update", "--scenarios", str(SCENARIOS),
                                   "--baselines", str(tmp_path)])
    assert "(no metric moved)" in res.output


def test_missing_baseline_counts_as_moved(tmp_path: Path) -> None:
    moved_rows = check(SCENARIOS, tmp_path)
    assert set(moved_rows["metric"]) == {"(no baseline)"}
