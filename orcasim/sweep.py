"""A minimal load sweep: run a scenario once per value of one parameter, sequentially.

    sweep: {parameter: workload.arrival.rate_per_s, values: [0.5, 1, 2, 4]}

Each point is the scenario with that dotted key set (the same path syntax as `--set`),
validated afresh, and run on its own requests (same seed). The result is a tidy frame:
one row per (system, point) with every summary metric. Points run one after another;
parallel and distributed sweeps are a later issue.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from orcasim.run import run_scenario  # noqa: E402
from orcasim.scenario import Scenario, scenario_from_dict, set_dotted  # noqa: E402

X_METRIC = "throughput_rps"
Y_METRIC = "normalized_latency_s_per_token_p50"
SUSTAIN_FRACTION = 0.9  # a system sustains a load when it completes at least 90% of its rate


def sweep_points(scenario: Scenario) -> list[tuple[Any, Scenario]]:
    """(value, scenario at that value) for each point of the scenario's sweep."""
    if scenario.sweep is None:
        raise ValueError(f"scenario '{scenario.name}' has no 'sweep' block")
    # A derived KV capacity is re-derived at every point (the point may change the hardware).
    derived = {"kv_capacity_tokens"} if scenario.kv_capacity_derived else set()
    base = scenario.model_dump(mode="json", exclude_none=True, exclude={"sweep", *derived})
    points = []
    for value in scenario.sweep.values:
        data = _deep_copy(base)
        set_dotted(data, scenario.sweep.parameter, value)
        points.append((value, scenario_from_dict(data, f"sweep {scenario.sweep.parameter}={value}")))
    return points


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def run_sweep(scenario: Scenario, base_dir: Path | None = None) -> pd.DataFrame:
    """Run every point; one row per (system, point): system, parameter, value, metrics."""
    assert scenario.sweep is not None, "run_sweep needs a scenario with a sweep block"
    rows = []
    for value, point in sweep_points(scenario):
        result = run_scenario(point, base_dir=base_dir)
        for name, system in result.systems.items():
            offered = offered_rps(system.requests["arrival_s"].to_numpy())
            rows.append({"system": name, "parameter": scenario.sweep.parameter, "value": value,
                         "offered_rps": offered, **system.summary})
    return pd.DataFrame(rows)


def offered_rps(arrival_s: np.ndarray) -> float:
    """The realised arrival rate of a run: arrivals per second between the first and the last."""
    span_s = float(arrival_s.max() - arrival_s.min()) if len(arrival_s) > 1 else 0.0
    return (len(arrival_s) - 1) / span_s if span_s > 0 else float("nan")


def latency_throughput_figure(sweep: pd.DataFrame, title: str, bound_s: float | None = None) -> Figure:
    """The Orca paper's figure: median normalized latency (s/token) against throughput (req/s)."""
    fig = Figure(figsize=(6.5, 4.5), layout="constrained")
    ax = fig.subplots()
    for system, rows in sweep.groupby("system", sort=False):
        rows = rows.sort_values("value")
        ax.plot(rows[X_METRIC], rows[Y_METRIC], marker="o", markersize=3, label=str(system))
    if bound_s is not None:
        ax.axhline(bound_s, color="grey", linestyle="--", linewidth=0.8, label=f"bound {bound_s:g} s/token")
    ax.set_xlabel("throughput (req/s)")
    ax.set_ylabel("median normalized latency (s/token)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title)
    return fig


def throughput_under_bound(sweep: pd.DataFrame, bound_s: float, sustain_fraction: float = SUSTAIN_FRACTION) -> pd.Series:
    """Per system, the highest throughput it sustains with median normalized latency within the bound.

    A point counts when its median meets the bound and the system keeps up with the load
    (throughput >= sustain_fraction x the realised arrival rate): a finite run of an
    overloaded system can keep a low median for a while, but it does not sustain that load.
    A measured point, not an interpolation: the sweep's grid sets the resolution. NaN when
    no point qualifies.
    """
    keeps_up = sweep[X_METRIC] >= sustain_fraction * sweep["offered_rps"]
    ok = sweep[(sweep[Y_METRIC] <= bound_s) & keeps_up]
    best = ok.groupby("system", sort=False)[X_METRIC].max()
    return best.reindex(sweep["system"].unique()).astype(np.float64)


def write_sweep(
    sweep: pd.DataFrame, scenario: Scenario, out_dir: Path, force: bool = False, plots: bool = True
) -> Path:
    """results/<name>/: sweep.csv, the resolved scenario.yaml and latency_throughput.png, atomically."""
    from orcasim.results import save_figure, write_atomically
    from orcasim.scenario import scenario_to_yaml

    def fill(tmp: Path) -> None:
        sweep.to_csv(tmp / "sweep.csv", index=False)
        (tmp / "scenario.yaml").write_text(scenario_to_yaml(scenario))
        if plots:
            save_figure(latency_throughput_figure(sweep, scenario.name), tmp / "latency_throughput.png")

    return write_atomically(out_dir, fill, force)
