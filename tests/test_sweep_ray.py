"""The Ray backend gives the same table as the local process pool (Ray is in the `cluster` extra)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from sweep_files import write_grid_4x3

from orcasim.sweeps import load_sweep, run_sweep

ray = pytest.importorskip("ray")

RAY_WORKERS = 2


@pytest.mark.slow
def test_ray_4x3_matches_local(tmp_path: Path) -> None:
    grid_4x3 = write_grid_4x3(tmp_path)
    sweep = load_sweep(grid_4x3)
    local = run_sweep(sweep, tmp_path / "local", backend="local", workers=2, progress=False)
    on_ray = run_sweep(sweep, tmp_path / "ray", backend="ray", workers=RAY_WORKERS, progress=False)
    assert not local.failed and not on_ray.failed
    assert len(on_ray.table) == 12 * 2
    pd.testing.assert_frame_equal(local.table, on_ray.table)
    assert not ray.is_initialized()  # the instance the sweep started is shut down
