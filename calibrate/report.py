"""The replay's figure and files: a pure plot function, and the one place that writes."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from calibrate.replay import ReplayResult  # noqa: E402


def fidelity_figure(table: pd.DataFrame, title: str) -> Figure:
    """Bars of |sim − real| / real beside |real₁ − real₂| / real, per metric."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    x = range(len(table))
    ax.bar([i - 0.2 for i in x], 100 * table["sim_vs_real"], width=0.4, label="simulated vs real")
    ax.bar([i + 0.2 for i in x], 100 * table["real_vs_real"], width=0.4, label="real vs real (noise)")
    ax.set_xticks(list(x), table.index, rotation=30, ha="right")
    ax.set_ylabel("relative difference (%)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def write_replay(out_dir: Path, result: ReplayResult) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "fidelity.json").write_text(json.dumps(result.report, indent=2) + "\n")
    for i, frame in enumerate(result.real_requests, start=1):
        frame.to_csv(out_dir / f"real_requests_{i}.csv", index=False)
    result.sim_requests.to_csv(out_dir / "sim_requests.csv", index=False)
    fig = fidelity_figure(result.table, f"replay of {result.report['scenario']}")
    fig.savefig(out_dir / "fidelity.png", dpi=120)
    plt.close(fig)
