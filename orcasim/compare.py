"""Metric deltas between two result folders (runs, sweeps or baselines): pure functions."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from orcasim.config import ScenarioError
from orcasim.paths import read_json, read_parquet

# Summary of a folder: {label: {metric: value}}; a label is a system, or point/system in a sweep.
Metrics = dict[str, dict[str, float]]


def load_metrics(folder: Path) -> Metrics:
    """Read `summary.json` of a run (or baseline), or `sweep.parquet` of a sweep."""
    folder = Path(folder)
    if (folder / "summary.json").exists():
        return read_metrics(folder / "summary.json")
    if (folder / "sweep.parquet").exists():
        return _sweep_metrics(read_parquet(folder / "sweep.parquet"))
    raise FileNotFoundError(f"{folder}: no summary.json or sweep.parquet (is it a results folder?)")


def _sweep_metrics(table: pd.DataFrame) -> Metrics:
    from orcasim.sweeps.table import param_columns

    skip = {"point", "replication", "seed", "system", *param_columns(table)}
    metrics = [c for c in table.columns if c not in skip]
    return {
        f"p{int(r['point']):04d}-r{int(r['replication']):02d}/{r['system']}":
            {m: float(r[m]) for m in metrics}
        for r in table.to_dict("records")
    }


def read_metrics(path: Path) -> Metrics:
    """A summary or baseline file, {system: {metric: number or null}}; anything else is a
    one-line error naming the file."""
    data = read_json(path)
    ok = isinstance(data, dict) and all(
        isinstance(m, dict) and all(v is None or (isinstance(v, int | float) and not isinstance(v, bool))
                                    for v in m.values())
        for m in data.values())
    if not ok:
        raise ScenarioError(f"{path}: expected {{system: {{metric: number}}}}, as orcasim writes it")
    return {s: {k: math.nan if v is None else float(v) for k, v in m.items()} for s, m in data.items()}


def relative_change(before: float, after: float) -> float:
    """(after - before) / |before|; 0 when both agree (NaN == NaN), inf from a zero baseline."""
    if same_value(before, after):
        return 0.0
    if before == 0 or math.isnan(before) or math.isnan(after):
        return math.inf
    return (after - before) / abs(before)


def same_value(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def deltas(a: Metrics, b: Metrics) -> pd.DataFrame:
    """One row per (label, metric) present in either side: a, b, delta and relative change."""
    rows = []
    for label in list(a) + [x for x in b if x not in a]:
        ma, mb = a.get(label, {}), b.get(label, {})
        for metric in list(ma) + [x for x in mb if x not in ma]:
            va, vb = ma.get(metric, math.nan), mb.get(metric, math.nan)
            rows.append({"label": label, "metric": metric, "a": va, "b": vb,
                         "delta": vb - va, "rel_change": relative_change(va, vb)})
    return pd.DataFrame(rows, columns=["label", "metric", "a", "b", "delta", "rel_change"])
