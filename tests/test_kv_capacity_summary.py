"""Each system's KV capacity in its summary: the tokens that decide its preemptions and when
it saturates, and whether the figure was given or derived from a model and hardware."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from conftest import BASE, make_scenario
from typer.testing import CliRunner

from orcasim.cli import app
from orcasim.cost.catalog import HardwareConfig, model_figures, model_spec
from orcasim.run import run_scenario

LLAMA_ON_A100 = {"model": "llama2-7b", "hardware": {"gpu": "a100-80gb"},
                 "cost": {"kind": "roofline"}, "workload.num_requests": 20,
                 "kv_capacity_tokens": None}


def derived_tokens(gpu: str, tensor_parallel: int = 1) -> float:
    """What `orcasim model llama2-7b --gpu GPU` prints as kv_capacity_tokens."""
    hardware = HardwareConfig(gpu=gpu, tensor_parallel=tensor_parallel)
    return model_figures(model_spec("llama2-7b"), hardware)["kv_capacity_tokens"]


def test_a_given_capacity_is_in_summary_json_and_the_printed_table(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({**BASE, "workload": {**BASE["workload"], "num_requests": 40}}))
    done = CliRunner().invoke(app, ["run", str(spec), "--out", str(tmp_path / "out"),
                                    "--no-plots"])
    assert done.exit_code == 0, done.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for system in ("request-level", "orca"):
        assert summary[system]["kv_capacity_total_tokens"] == 2000
        assert summary[system]["kv_capacity_derived_share"] == 0
    row = next(line for line in done.output.splitlines() if "KV capacity (tokens)" in line)
    assert [cell.strip() for cell in row.split("│")[2:4]] == ["2,000 given", "2,000 given"]


def test_a_derived_capacity_is_what_orcasim_model_derives() -> None:
    result = run_scenario(make_scenario(**LLAMA_ON_A100))
    for system in result.systems.values():
        assert system.summary["kv_capacity_total_tokens"] == derived_tokens("a100-80gb") > 0
        assert system.summary["kv_capacity_derived_share"] == 1


def test_a_fleets_capacity_is_its_replicas_with_the_share_derived() -> None:
    """Two replicas given 20,000 tokens each, one on 2 H100s deriving its own."""
    scenario = make_scenario(**{
        **LLAMA_ON_A100, "kv_capacity_tokens": 20_000,
        "systems": [{"name": "c", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                     "cluster": {"router": {"kind": "round_robin"}, "replicas": [
                         {"count": 2},
                         {"count": 1, "hardware": {"gpu": "h100-80gb", "tensor_parallel": 2}}]}}]})
    result = run_scenario(scenario).systems["c"]
    own = derived_tokens("h100-80gb", tensor_parallel=2)
    assert result.replicas is not None
    assert result.replicas["kv_capacity_derived"].tolist() == [False, False, True]
    assert result.summary["kv_capacity_total_tokens"] == 40_000 + own
    assert result.summary["kv_capacity_derived_share"] == own / (40_000 + own)
