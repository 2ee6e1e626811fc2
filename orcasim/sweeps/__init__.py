"""Sweeps: a base scenario, a grid of dotted-path parameters, replications, and backends."""

from orcasim.sweeps.backends import Backend, default_workers, execute
from orcasim.sweeps.runner import SweepResult, run_scenario_sweep, run_sweep, run_sweep_in_memory
from orcasim.sweeps.spec import (
    Grid,
    Sweep,
    SweepSpec,
    Task,
    build_sweep,
    load_sweep,
    make_sweep,
    scenario_sweep,
)
from orcasim.sweeps.table import keeps_up, param_columns, throughput_under_bound, tidy_table
from orcasim.sweeps.task import Outcome, run_task

__all__ = [
    "Backend", "Grid", "Outcome", "Sweep", "SweepResult", "SweepSpec", "Task", "default_workers",
    "build_sweep", "execute", "load_sweep", "make_sweep", "param_columns", "run_sweep",
    "keeps_up", "run_scenario_sweep", "run_sweep_in_memory", "run_task", "scenario_sweep", "throughput_under_bound",
    "tidy_table",
]
