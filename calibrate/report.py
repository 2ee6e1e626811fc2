"""The replay's figure and files: a pure plot function, and the one place that writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from calibrate.replay import ReplayResult
from orcasim.results import json_safe, save_figure, write_atomically


def fidelity_figure(table: pd.DataFrame, title: str) -> Figure:
    """Bars of |sim − real| / real beside |real₁ − real₂| / real, per metric."""
    fig = Figure(figsize=(8, 3.6))
    ax = fig.subplots()
    x = range(len(table))
    ax.bar([i - 0.2 for i in x], 100 * table["sim_vs_real"], width=0.4, label="simulated vs real")
    ax.bar([i + 0.2 for i in x], 100 * table["real_vs_real"], width=0.4, label="real vs real (noise)")
    ax.set_xticks(list(x), table.index, rotation=30, ha="right")
    ax.set_ylabel("relative difference (%)")
    ax.set_title(title)
    ax.legend()
    return fig


def write_replay(out_dir: Path, result: ReplayResult, force: bool = False) -> Path:
    """fidelity.json, fidelity.png and the per-request rows, written atomically; an existing
    `out_dir` is replaced only with `force`."""
    def fill(tmp: Path) -> None:
        (tmp / "fidelity.json").write_text(json.dumps(json_safe(result.report), indent=2) + "\n")
        for i, frame in enumerate(result.real_requests, start=1):
            frame.to_csv(tmp / f"real_requests_{i}.csv", index=False)
        result.sim_requests.to_csv(tmp / "sim_requests.csv", index=False)
        save_figure(fidelity_figure(result.table, f"replay of {result.report['scenario']}"),
                    tmp / "fidelity.png")

    return write_atomically(out_dir, fill, force=force)
