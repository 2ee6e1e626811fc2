"""orcasim: a discrete-event simulator of LLM serving, request-level vs iteration-level.

The public names load on first use (PEP 562), so that `import orcasim.cli` (the `orcasim`
command) does not pay for the simulator's imports before it can catch Ctrl-C; nor does this
module import `typing` (3 to 5 ms, in which a Ctrl-C is Python's traceback)."""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing's own, without importing typing (mypy reads it so)
if TYPE_CHECKING:
    from typing import Any

    from orcasim.config import ScenarioError
    from orcasim.run import RunResult, SystemResult, run_scenario
    from orcasim.scenario import Scenario, load_scenario

__all__ = ["RunResult", "Scenario", "ScenarioError", "SystemResult", "load_scenario", "run_scenario"]
__version__ = "0.1.0"

_HOMES = {"ScenarioError": "orcasim.config", "RunResult": "orcasim.run",
          "SystemResult": "orcasim.run", "run_scenario": "orcasim.run",
          "Scenario": "orcasim.scenario", "load_scenario": "orcasim.scenario"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'orcasim' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})  # a name loaded is in both: listed once
