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

from orcasim.compare import (
    Metrics,
    checked_metrics,
    is_baseline,
    moved,
    read_metrics,
    relative_change,
    tolerance,
)
from orcasim.config import ScenarioError
from orcasim.paths import as_path
from orcasim.results import MARKER, json_safe, write_text_atomically
from orcasim.yaml_strict import is_sweep_file

SCENARIO_DIR = Path("scenarios/regression")
BASELINE_DIR = Path("results/baselines")
# `tolerance`: the relative change the metric may make (0: a count); `note` says where a
# side is missing rather than NaN, which a table cannot tell apart.
MOVED_COLUMNS = ["scenario", "system", "metric", "baseline", "now", "rel_change", "tolerance", "note"]


def compare_to_baseline(scenario: str, baseline: Metrics, now: Metrics) -> pd.DataFrame:
    """Rows for every metric that moved, appeared or disappeared, with its relative change."""
    if not isinstance(scenario, str):
        raise ScenarioError(f"scenario = {scenario!r:.80}: expected the scenario's name (str)")
    baseline, now = checked_metrics(baseline, "baseline"), checked_metrics(now, "now")
    rows = []
    for system in list(baseline) + [s for s in now if s not in baseline]:
        b, n = baseline.get(system, {}), now.get(system, {})
        for metric in list(b) + [m for m in n if m not in b]:
            vb, vn = b.get(metric, math.nan), n.get(metric, math.nan)
            note = "" if (metric in b) == (metric in n) else \
                "not in the baseline" if metric in n else "no longer reported"
            if note or moved(vb, vn, tolerance(metric)):
                rows.append([scenario, system, metric, vb, vn, relative_change(vb, vn),
                             tolerance(metric), note])
    return pd.DataFrame(rows, columns=MOVED_COLUMNS)


def run_regression(path: Path) -> Metrics:
    """Its systems' summaries; its warnings (a system saturated on purpose) and its errors
    name the scenario, as check runs many whose systems share names."""
    from orcasim.run import run_scenario
    from orcasim.scenario import load_scenario

    path = as_path(path, "path", "a regression scenario's path")
    if is_sweep_file(path):  # it read "(top level): unknown key 'base'"
        raise ScenarioError(f"{path}: a sweep file (it names a base scenario); expected a "
                            "scenario: check gates one run per scenario")
    try:
        scenario = load_scenario(path)
        if scenario.sweep is not None:  # a baseline holds one run's metrics per system
            raise ScenarioError(f"sweep: check gates one run per scenario, and this one sweeps "
                                f"{scenario.sweep.parameter}; give each point a scenario of its own")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = run_scenario(scenario)
    except (ScenarioError, FileNotFoundError) as e:
        text = str(e)
        raise ScenarioError(text if text.startswith(str(path)) else f"{path}: {text}") from None
    for w in caught:
        warnings.warn(f"{Path(path).stem}: {w.message}", w.category, stacklevel=2)
    return {name: r.summary for name, r in result.systems.items()}


def read_baseline(path: Path) -> Metrics:
    return read_metrics(path)


def regression_scenarios(scenario_dir: Path) -> list[Path]:
    """The folder's scenario files (.yaml and .yml), by name; two of one name are refused,
    as both would gate against one baseline."""
    scenario_dir = as_path(scenario_dir, "scenario_dir", "a folder of regression scenarios")
    if Path(scenario_dir).is_file():
        raise ScenarioError(f"--scenarios {scenario_dir} is a file; expected a folder of "
                            "regression scenarios (*.yaml)")
    if not Path(scenario_dir).is_dir():  # the default is relative: run outside a checkout
        raise ScenarioError(f"--scenarios {scenario_dir}: no such folder (from "
                            f"{Path.cwd()}); expected a folder of regression scenarios (*.yaml)")
    paths = sorted([*Path(scenario_dir).glob("*.yaml"), *Path(scenario_dir).glob("*.yml")])
    if not paths:
        raise FileNotFoundError(f"{scenario_dir}: no regression scenarios (*.yaml)")
    stems = [p.stem for p in paths]
    twice = next((p for p in paths if stems.count(p.stem) > 1), None)
    if twice is not None:
        raise ScenarioError(f"{scenario_dir}: two scenarios named {twice.stem} (.yaml and .yml) "
                            f"would share one baseline, {twice.stem}.json; rename one")
    return paths


def check(
    scenario_dir: Path = SCENARIO_DIR, baseline_dir: Path = BASELINE_DIR, update: bool = False
) -> pd.DataFrame:
    """Run every regression scenario; return the moved metrics (empty when all agree). A
    baseline whose scenario is gone counts as moved: a deleted scenario must not drop its
    check without a word.

    With `update`, write the current metrics as the new baselines, remove those without a
    scenario, and return what the update rewrote (the same rows, against the old baselines). Every scenario runs before anything is written: one
    that fails leaves every baseline as it was."""
    baseline_dir = as_path(baseline_dir, "baseline_dir", "a folder of baselines")
    scenario_dir = as_path(scenario_dir, "scenario_dir", "a folder of regression scenarios")
    _check_baseline_folder(baseline_dir, update)
    paths = regression_scenarios(scenario_dir)
    _check_baseline_files(baseline_dir, [p.stem for p in paths])
    runs, errors = {}, []
    for path in paths:  # every scenario's error at once: fixing one must not reveal the next
        try:
            runs[path.stem] = run_regression(path)
        except ScenarioError as e:
            errors.append(str(e))
    if errors:
        raise ScenarioError("; ".join(errors))
    orphans = [b for b in sorted(baseline_dir.glob("*.json")) if b.stem not in runs and is_baseline(b)]
    # Measured before an update too, so that it says what it rewrote: the record of what
    # moved was lost unless a check had been run first (a tester's finding).
    tables = [_against_baseline(stem, now, baseline_dir / f"{stem}.json") for stem, now in runs.items()]
    tables += [_row(b.stem, "(no scenario)") for b in orphans]
    tables = [t for t in tables if len(t)]
    moved = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=MOVED_COLUMNS)
    if update:
        _write_baselines(baseline_dir, runs)
        for orphan in orphans:
            orphan.unlink()
            warnings.warn(f"removed {orphan}: {scenario_dir} has no scenario {orphan.stem}",
                          UserWarning, stacklevel=2)
    return moved


def _check_baseline_folder(baseline_dir: Path, update: bool = False) -> None:
    """Before any run: the folder (or where it would be made) can hold baselines. A file
    on the way failed as the machine's error (exit 1, which also says 'metrics moved').
    An update is refused a results folder: its summary.json reads as a baseline without a
    scenario, which the update removed (a tester's finding)."""
    if update and (baseline_dir / MARKER).is_file():
        raise ScenarioError(f"--baselines {baseline_dir}: an orcasim results folder, whose "
                            "summary.json --update would remove as a baseline without a "
                            "scenario; expected a folder of <scenario>.json baselines")
    if baseline_dir.exists() and not baseline_dir.is_dir():
        raise ScenarioError(f"--baselines {baseline_dir}: is a file; expected a folder of "
                            "<scenario>.json baselines")
    above = next((a for a in baseline_dir.parents if a.exists() and not a.is_dir()), None)
    if above is not None:
        raise ScenarioError(f"--baselines {baseline_dir}: {above} is a file; expected a folder "
                            "of <scenario>.json baselines")


def _check_baseline_files(baseline_dir: Path, stems: list[str]) -> None:
    """Before any run: no folder stands where a scenario's baseline file goes. It failed as
    the machine's error, and under --update after earlier baselines were rewritten."""
    folder = next((baseline_dir / f"{s}.json" for s in stems if (baseline_dir / f"{s}.json").is_dir()),
                  None)
    if folder is not None:
        raise ScenarioError(f"--baselines {baseline_dir}: {folder} is a folder; expected the "
                            f"baseline file of scenario {folder.stem} there")


def _write_baselines(baseline_dir: Path, runs: dict[str, Metrics]) -> None:
    """Each baseline whole (atomically); should the machine fail one (a full disk), the
    error says which were already rewritten, as the set is not one write."""
    written: list[str] = []
    for stem, now in runs.items():
        try:
            write_text_atomically(baseline_dir / f"{stem}.json",
                                  json.dumps(json_safe(now), indent=2) + "\n")
        except OSError as e:
            done = f"{len(written)} of {len(runs)} baselines rewritten before it"
            raise OSError(e.errno, f"{e.strerror or e} writing {stem}.json; {done}"
                          f"{' (' + ', '.join(written) + ')' if written else ''}",
                          str(baseline_dir / f"{stem}.json")) from e
        written.append(stem)


def _against_baseline(stem: str, now: Metrics, baseline_file: Path) -> pd.DataFrame:
    if not baseline_file.exists():
        return _row(stem, "(no baseline)")
    return compare_to_baseline(stem, read_baseline(baseline_file), now)


def _row(stem: str, what: str) -> pd.DataFrame:
    return pd.DataFrame([[stem, "*", what, math.nan, math.nan, math.inf, math.nan, ""]],
                        columns=MOVED_COLUMNS)
