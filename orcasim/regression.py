"""`orcasim check`: rerun the regression scenarios and compare every metric with its baseline.

Runs are deterministic, so a metric that moves beyond float noise means behaviour changed.
Each scenario `scenarios/regression/<stem>.yaml` has its baseline in
`results/baselines/<stem>.json` ({system: {metric: value}}, NaN written as null).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pandas as pd

from orcasim.compare import DEFAULT_REL_TOL, Metrics, moved, read_metrics, relative_change
from orcasim.results import json_safe, write_text_atomically

SCENARIO_DIR = Path("scenarios/regression")
BASELINE_DIR = Path("results/baselines")
# Counts are integers: any change is a change.
TOLERANCES: dict[str, float] = {"requests_completed": 0.0, "iterations": 0.0, "cost_out_of_range": 0.0}
MOVED_COLUMNS = ["scenario", "system", "metric", "baseline", "now", "rel_change"]


def tolerance(metric: str) -> float:
    return TOLERANCES.get(metric, DEFAULT_REL_TOL)


def compare_to_baseline(scenario: str, baseline: Metrics, now: Metrics) -> pd.DataFrame:
    """Rows for every metric that moved, appeared or disappeared, with its relative change."""
    rows = []
    for system in list(baseline) + [s for s in now if s not in baseline]:
        b, n = baseline.get(system, {}), now.get(system, {})
        for metric in list(b) + [m for m in n if m not in b]:
            vb, vn = b.get(metric, math.nan), n.get(metric, math.nan)
            missing = (metric in b) != (metric in n)
            if missing or moved(vb, vn, tolerance(metric)):
                rows.append([scenario, system, metric, vb, vn, relative_change(vb, vn)])
    return pd.DataFrame(rows, columns=MOVED_COLUMNS)


def run_regression(path: Path) -> Metrics:
    """Its systems' summaries; its warnings (a system saturated on purpose) name the scenario,
    as check runs many whose systems share names."""
    from orcasim.run import run_scenario

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_scenario(path)
    for w in caught:
        warnings.warn(f"{Path(path).stem}: {w.message}", w.category, stacklevel=2)
    return {name: r.summary for name, r in result.systems.items()}


def read_baseline(path: Path) -> Metrics:
    return read_metrics(path)


def regression_scenarios(scenario_dir: Path) -> list[Path]:
    paths = sorted(Path(scenario_dir).glob("*.yaml"))
    if not paths:
        raise FileNotFoundError(f"{scenario_dir}: no regression scenarios (*.yaml)")
    return paths


def check(
    scenario_dir: Path = SCENARIO_DIR, baseline_dir: Path = BASELINE_DIR, update: bool = False
) -> pd.DataFrame:
    """Run every regression scenario; return the moved metrics (empty when all agree).

    With `update`, write the current metrics as the new baselines and return nothing moved.
    """
    tables = []
    for path in regression_scenarios(scenario_dir):
        now = run_regression(path)
        baseline_file = Path(baseline_dir) / f"{path.stem}.json"
        if update:
            text = json.dumps(json_safe(now), indent=2) + "\n"
            write_text_atomically(baseline_file, text)
        elif not baseline_file.exists():
            tables.append(pd.DataFrame([[path.stem, "*", "(no baseline)", math.nan, math.nan, math.inf]],
                                       columns=MOVED_COLUMNS))
        else:
            tables.append(compare_to_baseline(path.stem, read_baseline(baseline_file), now))
    tables = [t for t in tables if len(t)]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=MOVED_COLUMNS)
