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


@pytest.mark.slow
def test_ray_capacity_search_matches_local(tmp_path: Path) -> None:
    """A capacity search's jobs on Ray give the table the local pool gives."""
    from orcasim import capacity as cap
    from orcasim.slo import slo_from_strings
    from tests.conftest import make_scenario

    jobs = cap.search_jobs(make_scenario(), tmp_path, slo_from_strings(["e2e_p90 <= 2"]), 2,
                           cap.SearchSettings(num_requests=300))
    local = cap.run_capacity(jobs, tmp_path / "local", workers=2)
    on_ray = cap.run_capacity(jobs, tmp_path / "ray", backend="ray", workers=RAY_WORKERS)
    assert not local.failed and not on_ray.failed
    pd.testing.assert_frame_equal(local.table, on_ray.table)
    assert not ray.is_initialized()
