"""orcasim: a discrete-event simulator of LLM serving, request-level vs iteration-level."""

from orcasim.config import ScenarioError
from orcasim.run import RunResult, SystemResult, run_scenario
from orcasim.scenario import Scenario, load_scenario

__all__ = ["RunResult", "Scenario", "ScenarioError", "SystemResult", "load_scenario", "run_scenario"]
__version__ = "0.1.0"
