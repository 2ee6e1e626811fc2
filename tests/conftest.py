"""Shared test helpers: small scenarios built in code, so tests do not depend on YAML files."""

from __future__ import annotations

import copy
import os
from typing import Any

import pandas as pd
import pytest
from hypothesis import settings

# pytest-xdist's workers inherit COLUMNS=80 (`make test` runs the suite in several), and the
# CLI's console takes its width from it once, at import: its tables would cut the metric names
# that tests read. Tests see the CLI as a CI log shows it (`orcasim.cli.LOG_WIDTH`), in one
# process or several.
os.environ.pop("COLUMNS", None)

from orcasim.scenario import Scenario, scenario_from_dict  # noqa: E402 - after the line above

# Property tests try the same examples on every run (`ci`, the default), so a failure in CI is
# one anybody can reproduce; `HYPOTHESIS_PROFILE=explore` draws fresh ones to hunt for bugs.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
# `make test-deep` multiplies every property test's example budget (CI's is sized for time).
DEPTH = int(os.environ.get("ORCASIM_TEST_DEPTH", "1"))


def examples(budget: int) -> int:
    """A property test's example budget, times ORCASIM_TEST_DEPTH."""
    return budget * DEPTH

BASE: dict[str, Any] = {
    "name": "test",
    "seed": 7,
    "workload": {
        "num_requests": 300,
        "arrival": {"kind": "poisson", "rate_per_s": 4.0},
        "prompt_tokens": {"kind": "uniform", "low": 8, "high": 64},
        "output_tokens": {"kind": "uniform", "low": 1, "high": 32},
        "max_tokens": 96,
    },
    "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4, "per_context_token_s": 1e-6},
    "kv_capacity_tokens": 2000,
    "systems": [
        {"name": "request-level", "scheduler": {"kind": "request_level", "max_batch_size": 4}},
        {"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 4}},
    ],
}

# A paged server whose running set (1,024) outgrows a 2,000-request run's backlog: it tops out
# near 107 req/s (runs of 20,000 requests at 117.6 offered served 105.7, saturated).
BIG_RUNNING_SET: dict[str, Any] = {
    "workload.arrival": {"kind": "poisson", "rate_per_s": 2.0},
    "workload.prompt_tokens": {"kind": "uniform", "low": 32, "high": 512},
    "workload.output_tokens": {"kind": "uniform", "low": 1, "high": 128},
    "workload.max_tokens": 640,
    "cost": {"kind": "linear", "base_s": 0.010, "per_token_s": 2.0e-5, "per_context_token_s": 1.0e-7},
    "kv_capacity_tokens": 10_000_000,
    "systems": [{"name": "paged", "scheduler": {"kind": "paged", "max_num_seqs": 1024,
                                                "max_num_batched_tokens": 8192}}],
}


# Eight paged replicas behind round robin, one 3x slower per token, running sets of 1,024: at
# 200 req/s the slow one holds its backlog in its running set, no waiting queue.
SLOW_REPLICA_FLEET: dict[str, Any] = {
    "workload.num_requests": 4000,
    "workload.arrival": {"kind": "poisson", "rate_per_s": 200.0},
    "workload.prompt_tokens": {"kind": "constant", "value": 100},
    "workload.output_tokens": {"kind": "constant", "value": 50},
    "workload.max_tokens": 200, "kv_capacity_tokens": 1_000_000,
    "cost": {"kind": "linear", "base_s": 0.010, "per_token_s": 1.0e-4, "per_context_token_s": 0.0},
    "systems": [{"name": "rr8", "scheduler": {"kind": "paged", "max_num_seqs": 1024,
                                              "max_num_batched_tokens": 100_000},
                 "cluster": {"router": {"kind": "round_robin"}, "replicas": [
                     {"count": 7},
                     {"count": 1, "cost": {"kind": "linear", "base_s": 0.010,
                                           "per_token_s": 3.0e-4, "per_context_token_s": 0.0}}]}}]}


def make_scenario(**changes: Any) -> Scenario:
    """BASE with dotted-path changes, e.g. make_scenario(**{"workload.num_requests": 10})."""
    from orcasim.scenario import set_dotted

    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        set_dotted(data, path, value)
    return scenario_from_dict(data)


def requests_in_both_modes(system: str, **changes: Any) -> dict[str, pd.DataFrame]:
    """`system`'s per-request frame from `make_scenario(**changes)` run in fast and in
    reference mode, keyed by mode (for tests that fast mode is exact)."""
    from orcasim.run import run_scenario

    return {mode: run_scenario(make_scenario(**changes, **{"engine.mode": mode}))
            .systems[system].requests for mode in ("fast", "reference")}


@pytest.fixture
def base_dict() -> dict[str, Any]:
    return copy.deepcopy(BASE)
