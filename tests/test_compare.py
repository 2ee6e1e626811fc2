"""`orcasim compare`: metric deltas between result folders."""

from __future__ import annotations

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from orcasim.cli import app
from orcasim.compare import deltas, load_metrics, relative_change


def write_summary(folder: Path, summary: dict[str, dict[str, float | None]]) -> Path:
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_deltas_of_two_runs(tmp_path: Path) -> None:
    a = write_summary(tmp_path / "a", {"orca": {"e2e_s_p50": 2.0, "tpot_s_p50": None}})
    b = write_summary(tmp_path / "b", {"orca": {"e2e_s_p50": 3.0, "tpot_s_p50": None}})
    frame = deltas(load_metrics(a), load_metrics(b))
    row = frame.set_index("metric").loc["e2e_s_p50"]
    assert (row["a"], row["b"], row["delta"], row["rel_change"]) == (2.0, 3.0, 1.0, 0.5)
    assert frame.set_index("metric").loc["tpot_s_p50", "rel_change"] == 0.0  # NaN == NaN here
    res = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code == 0
    assert "e2e_s_p50" in res.output and "tpot_s_p50" not in res.output


def test_relative_change_edges() -> None:
    assert relative_change(0.0, 0.0) == 0.0
    assert relative_change(0.0, 1.0) == math.inf
    assert relative_change(-2.0, -1.0) == 0.5


def test_not_a_results_folder_is_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["compare", str(tmp_path), str(tmp_path)])
    assert res.exit_code == 2
    assert "summary.json" in res.output


def test_sweep_folders_compare_point_by_point(tmp_path: Path) -> None:
    from sweep_files import write_sweep

    from orcasim.sweeps import load_sweep, run_sweep

    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [2.0]")
    run_sweep(load_sweep(path), tmp_path / "out", workers=1, progress=False)
    metrics = load_metrics(tmp_path / "out")
    assert list(metrics) == ["p0000-r00/request-level", "p0000-r00/orca"]
    assert "workload.arrival.rate_per_s" not in metrics["p0000-r00/orca"]
    assert (deltas(metrics, metrics)["rel_change"] == 0).all()
