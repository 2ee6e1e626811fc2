"""Figures: pure functions, DataFrame in, matplotlib Figure out. Nothing here writes files."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # headless: figures are written to files or shown by notebooks

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from orcasim.run import RunResult  # noqa: E402

CDF_METRICS = {
    "ttft_s": "time to first token (s)",
    "tpot_s": "time per output token (s)",
    "e2e_s": "end-to-end latency (s)",
    "normalized_latency_s_per_token": "normalized latency (s/token)",
}


def latency_cdfs(requests: pd.DataFrame) -> Figure:
    """CDFs of TTFT, TPOT, e2e and normalized latency; `requests` has a `system` column."""
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    axes = fig.subplots(2, 2)
    for ax, (metric, label) in zip(axes.flat, CDF_METRICS.items(), strict=True):
        for system, rows in requests.groupby("system", sort=False):
            values = np.sort(rows[metric].dropna().to_numpy())
            if len(values):
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=str(system))
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(loc="lower right")
    fig.suptitle("Latency distributions per system")
    return fig


def batch_size_timeline(iterations: pd.DataFrame, max_points: int = 4000) -> Figure:
    """Batch size over simulated time; `iterations` has a `system` column."""
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax = fig.subplots()
    for system, rows in iterations.groupby("system", sort=False):
        step = max(1, len(rows) // max_points)  # thin long runs so the plot stays readable
        ax.step(rows["start_s"].to_numpy()[::step], rows["batch_size"].to_numpy()[::step],
                where="post", label=str(system), alpha=0.8, linewidth=0.8)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("batch size (requests)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    ax.set_title("Batch size over time")
    return fig


def run_figures(result: RunResult) -> dict[str, Figure]:
    """The standard figures of one run, by file stem."""
    reqs = pd.concat([r.requests.assign(system=n) for n, r in result.systems.items()])
    iters = pd.concat([r.iterations.assign(system=n) for n, r in result.systems.items()])
    return {"latency_cdf": latency_cdfs(reqs), "batch_size": batch_size_timeline(iters)}
