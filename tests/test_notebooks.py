"""The notebooks run top to bottom at small size, and are committed without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def small_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel inherits this process's environment.
    monkeypatch.setenv("ORCASIM_NOTEBOOK_SMALL", "1")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK_DIR)}}).execute()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, f"{path.name} showed no figure"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert [c for c in nb.cells if c.cell_type == "code" and (c.outputs or c.execution_count)] == []


def test_the_six_notebooks_exist() -> None:
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_orca_paper.ipynb", "03_memory.ipynb",
                                       "04_fidelity.ipynb", "05_cluster.ipynb",
                                       "06_prefix_and_agents.ipynb"]
