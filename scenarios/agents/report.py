"""results/agents/: agent sessions under request-level, Orca and paged serving, with and
without prefix caching.

    python scenarios/agents/report.py            # seconds on two cores (2 s on 2026-12-04)

Runs each agent scenario (scenarios/agents/*.yaml) with its systems and one more: the paged
system with `enable_prefix_caching: true`, so that caching is compared on the same
scheduler. Reports per system the tasks per hour, the task time (first call's arrival to
the last step's end: its first `wait_for` answers, with a fan-out) at p50 and p99, the share
of task time spent queued at the server,
the calls' TTFT, and the prefix cache's hit rate. Writes results/agents/README.md and
agents.csv.
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orcasim.run import run_scenario  # noqa: E402
from scenarios.markdown import markdown_table, section, write_readme  # noqa: E402

OUT = ROOT / "results" / "agents"
HERE = ROOT / "scenarios" / "agents"
SCENARIOS = ("react.yaml", "tree_of_thoughts.yaml")
COLUMNS = ("tasks_per_hour", "task_time_p50_s", "task_time_p99_s", "task_queued_share",
           "ttft_s_p50", "ttft_s_p90", "tpot_s_p50", "prefix_hit_rate", "saturated")


def with_caching(scenario: dict[str, Any]) -> dict[str, Any]:
    """The scenario plus its paged system with prefix caching on."""
    scenario = copy.deepcopy(scenario)
    paged = next(s for s in scenario["systems"] if s["scheduler"]["kind"] == "paged")
    cached = copy.deepcopy(paged)
    cached["name"] = f"{paged['name']}-prefix-cache"
    cached["scheduler"]["enable_prefix_caching"] = True
    scenario["systems"].append(cached)
    return scenario


def run(name: str) -> pd.DataFrame:
    scenario = with_caching(yaml.safe_load((HERE / name).read_text()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # saturation is in the table
        result = run_scenario(scenario, base_dir=HERE)
    rows = [{"scenario": name.removesuffix(".yaml"), "system": system,
             **{c: r.summary.get(c, float("nan")) for c in COLUMNS}}
            for system, r in result.systems.items()]
    return pd.DataFrame(rows)


def findings(table: pd.DataFrame) -> list[str]:
    """What the table says, read off it (so that it is what this run measured)."""
    lines = []
    for scenario, rows in table.groupby("scenario", sort=False):
        by = rows.set_index("system")
        static = by[by.index.str.startswith("request")].iloc[0]
        orca = by[by.index.str.startswith("orca")].iloc[0]
        paged = by[by.index.str.startswith("paged") & ~by.index.str.endswith("cache")].iloc[0]
        cached = by[by.index.str.endswith("prefix-cache")].iloc[0]
        # A saturated run's task time describes how long it ran, not the server: say so.
        behind = "; saturated: it falls behind the sessions started, so its task time grows " \
                 "with the run's length" if static["saturated"] else ""
        lines.append(
            f"- {scenario}: iteration-level scheduling (Orca) takes task time p50 from "
            f"{static['task_time_p50_s']:.3g} s (request-level{behind}) to {orca['task_time_p50_s']:.3g} s "
            f"and tasks per hour from {static['tasks_per_hour']:.3g} to {orca['tasks_per_hour']:.3g}; "
            f"the share of task time queued at the server from {static['task_queued_share']:.1%} "
            f"to {orca['task_queued_share']:.1%}. Paged: {paged['task_time_p50_s']:.3g} s; with "
            f"prefix caching ({cached['prefix_hit_rate']:.1%} of prompt tokens cached) "
            f"{cached['task_time_p50_s']:.3g} s, TTFT p50 {paged['ttft_s_p50']:.3g} -> "
            f"{cached['ttft_s_p50']:.3g} s.")
    return lines


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    table = pd.concat([run(name) for name in SCENARIOS], ignore_index=True)
    table.to_csv(OUT / "agents.csv", index=False)
    lines = [
        "# Agent sessions",
        "",
        "Written by `python scenarios/agents/report.py`. Each agent runs tasks of LLM calls",
        "in a closed loop: a call is sent when the previous one (and its tool time) is done,",
        "and its prompt is the task's whole context so far, so the server's latency is the",
        "agent's critical path. Each scenario's systems, plus its paged system with prefix",
        "caching on. `task_queued_share` is the share of task time spent waiting for the",
        "server to start a call.",
        "",
        *section("What it shows", findings(table)),
        *section("The table", markdown_table(table)),
    ]
    write_readme(OUT / "README.md", lines)


if __name__ == "__main__":
    main()
