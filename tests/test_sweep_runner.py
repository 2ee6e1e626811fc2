"""Running sweeps: the same table from any backend, resume, and failures as values."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from sweep_files import write_grid_4x3, write_sweep
from typer.testing import CliRunner

from orcasim.cli import app
from orcasim.sweeps import load_sweep, run_sweep, run_sweep_in_memory


def test_table_is_tidy(tmp_path: Path) -> None:
    grid_4x3 = write_grid_4x3(tmp_path)
    result = run_sweep(load_sweep(grid_4x3), tmp_path / "out", workers=1, progress=False)
    t = result.table
    assert len(t) == 12 * 2  # 12 points x 2 systems x 1 replication
    assert list(t.columns[:6]) == ["point", "replication", "seed", "workload.arrival.rate_per_s",
                                   "systems[1].scheduler.max_batch_size", "system"]
    assert "normalized_latency_s_per_token_p50" in t.columns
    assert all(s == ["request-level", "orca"] for s in t.groupby("point")["system"].apply(list))
    on_disk = pd.read_parquet(tmp_path / "out" / "sweep.parquet")
    pd.testing.assert_frame_equal(on_disk, t)
    assert len(pd.read_csv(tmp_path / "out" / "sweep.csv")) == len(t)


def test_process_pool_matches_in_process(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [1.0, 3.0]", replications=2)
    serial = run_sweep_in_memory(load_sweep(path), workers=1).table
    pooled = run_sweep(load_sweep(path), tmp_path / "pool", workers=2, progress=False).table
    pd.testing.assert_frame_equal(serial, pooled)
    assert serial.groupby("point")["seed"].nunique().eq(2).all()


def test_resume_runs_only_unfinished_points(tmp_path: Path) -> None:
    grid_4x3 = write_grid_4x3(tmp_path)
    out = tmp_path / "out"
    full = run_sweep(load_sweep(grid_4x3), out, workers=1, progress=False).table
    shutil.rmtree(out / "points" / "p0003-r00")
    (out / "sweep.parquet").unlink()
    resumed = run_sweep(load_sweep(grid_4x3), out, workers=1, resume=True, progress=False)
    assert (resumed.ran, resumed.skipped) == (1, 11)
    pd.testing.assert_frame_equal(resumed.table, full)


def test_resume_refuses_a_different_sweep(tmp_path: Path) -> None:
    grid_4x3 = write_grid_4x3(tmp_path)
    out = tmp_path / "out"
    run_sweep(load_sweep(grid_4x3), out, workers=1, progress=False)
    other = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [5.0]", name="other")
    with pytest.raises(ValueError, match="different run"):
        run_sweep(load_sweep(other), out, workers=1, resume=True, progress=False)
    with pytest.raises(FileExistsError, match="--resume"):
        run_sweep(load_sweep(grid_4x3), out, workers=1, progress=False)


def test_resume_refuses_a_folder_without_its_plan(tmp_path: Path) -> None:
    """Another sweep's points, plan lost: resuming must not count them as this sweep's."""
    out = tmp_path / "out"
    other = write_sweep(tmp_path, "parameters:\n  workload.arrival.rate_per_s: [5.0]", name="other")
    run_sweep(load_sweep(other), out, workers=1, progress=False)
    (out / "plan.json").unlink()
    with pytest.raises(ValueError, match="no plan.json"):
        run_sweep(load_sweep(write_grid_4x3(tmp_path)), out, workers=1, resume=True, progress=False)


def failing_sweep(tmp_path: Path) -> Path:
    # max_tokens = 64 is valid configuration, but the drawn prompts exceed it at run time.
    return write_sweep(tmp_path, """
mode: zip
parameters:
  workload.max_tokens: [320, 64, 320]
  workload.arrival.rate_per_s: [1.0, 2.0, 3.0]
""")


def test_failing_point_is_recorded_and_the_rest_finish(tmp_path: Path) -> None:
    result = run_sweep(load_sweep(failing_sweep(tmp_path)), tmp_path / "out", workers=2, progress=False)
    assert [o.id for o in result.failed] == ["p0001-r00"]
    assert "max_tokens" in result.failed[0].error
    assert sorted(result.table["point"].unique()) == [0, 2]
    failures = pd.read_csv(tmp_path / "out" / "failures.csv")
    assert list(failures["id"]) == ["p0001-r00"]


def test_cli_exits_nonzero_naming_failed_points(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["sweep", str(failing_sweep(tmp_path)), "--out",
                                   str(tmp_path / "out"), "--workers", "1", "--no-progress"])
    assert res.exit_code == 1
    assert "p0001-r00" in res.output


def test_cli_bad_backend_is_exit_2(tmp_path: Path) -> None:
    grid_4x3 = write_grid_4x3(tmp_path)
    res = CliRunner().invoke(app, ["sweep", str(grid_4x3), "--backend", "dask", "--out",
                                   str(tmp_path / "out")])
    assert res.exit_code == 2
    assert "expected 'local' or 'ray'" in res.output
