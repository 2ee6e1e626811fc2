"""The minimal load sweep: points, the tidy frame, the bound metric and the CLI output."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from orcasim.config import ScenarioError
from orcasim.sweep import run_sweep, sweep_points, throughput_under_bound
from tests.conftest import make_scenario
from tests.test_cli import orcasim

RATES = [1.0, 2.0, 4.0]


def small_sweep(**changes: object):  # noqa: ANN201 - a Scenario
    return make_scenario(**{"workload.num_requests": 60, "sweep": {"parameter": "workload.arrival.rate_per_s",
                                                                     "values": RATES}, **changes})


def test_each_point_sets_the_parameter() -> None:
    points = sweep_points(small_sweep())
    assert [v for v, _ in points] == RATES
    assert [p.workload.arrival.rate_per_s for _, p in points] == RATES
    assert all(p.sweep is None for _, p in points)


def test_a_bad_value_names_the_point() -> None:
    with pytest.raises(ScenarioError, match="rate_per_s=-1"):
        sweep_points(small_sweep(**{"sweep.values": [1.0, -1]}))


def test_a_derived_kv_capacity_is_derived_again_at_each_point() -> None:
    sc = small_sweep(**{"kv_capacity_tokens": None, "model": "llama2-7b", "hardware": {"gpu": "a100-40gb"},
                        "sweep": {"parameter": "hardware.gpu", "values": ["a100-40gb", "a100-80gb"]}})
    caps = [p.kv_capacity_tokens for _, p in sweep_points(sc)]
    assert caps[0] < caps[1]


def test_run_sweep_is_one_row_per_system_and_point() -> None:
    frame = run_sweep(small_sweep())
    assert len(frame) == 2 * len(RATES)
    assert set(frame["system"]) == {"request-level", "orca"}
    assert {"value", "throughput_rps", "normalized_latency_s_per_token_p50"} <= set(frame.columns)


def test_throughput_under_bound_is_the_best_point_within_it() -> None:
    frame = pd.DataFrame({
        "system": ["a", "a", "a", "b"], "value": [1, 2, 3, 1],
        "throughput_rps": [1.0, 2.0, 2.5, 0.5], "normalized_latency_s_per_token_p50": [0.1, 0.15, 0.3, 0.5],
        "offered_rps": [1.0, 2.0, 3.0, 0.5],
    })
    best = throughput_under_bound(frame, 0.2)
    assert best["a"] == 2.0 and pd.isna(best["b"])
    overloaded = frame.assign(offered_rps=[1.0, 4.0, 3.0, 0.5])  # at 2.0 it falls behind a 4.0 load
    assert throughput_under_bound(overloaded, 0.2)["a"] == 1.0


@pytest.mark.slow
def test_cli_run_of_a_sweep_writes_csv_and_figure(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(Path("scenarios/quickstart.yaml").read_text()
                        + "sweep: {parameter: workload.arrival.rate_per_s, values: [1, 3]}\n")
    out = tmp_path / "out"
    p = orcasim("run", str(scenario), "--out", str(out), "--set", "workload.num_requests=100")
    assert p.returncode == 0, p.stderr
    frame = pd.read_csv(out / "sweep.csv")
    assert len(frame) == 4 and (out / "latency_throughput.png").is_file()
