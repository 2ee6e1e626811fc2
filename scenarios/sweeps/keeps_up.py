"""The sweep's keeps-up rule around a server's full-load rate: README's Sweeps table.

    python scenarios/sweeps/keeps_up.py            # about 2 minutes on two cores

Two servers whose full-load rate is known: an M/D/1 server of 10 req/s (one request at a
time, 0.1 s each: tests.test_capacity_edges.MD1) and one vLLM-style paged replica of
scenarios/cluster/routers.yaml (Llama-2-7B, one A100-80GB, no warm-up), whose full-load
rate is measured as its completions while requests arrive (`served_rps`) in a 4,000-request
Poisson run at twice what it completes with every request arriving at once. Each is swept
from 0.8 to 1.2 times that rate over 300, 1,000 and 3,000 requests, 20 replications each
(seeds from the sweep's seed 0). Per load and run length: the lowest and highest served
rate over offered rate (`served_rps / offered_rps`), how many of the 20 rows pass the 0.9
fraction alone, and how many pass `orcasim.sweeps.keeps_up` (the fraction, and not
`saturated`). Then, per run length, what the sweeps answer under no latency bound
(`throughput_under_bound`): the median answer over the full-load rate, and how many of the
20 answered from a row above the full-load rate.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orcasim.metrics import served_rps  # noqa: E402
from orcasim.run import run_scenario  # noqa: E402
from orcasim.scenario import scenario_from_dict  # noqa: E402
from orcasim.sweeps import keeps_up, make_sweep, run_sweep_in_memory, throughput_under_bound  # noqa: E402
from orcasim.sweeps.spec import ParamValue  # noqa: E402
from tests.test_capacity_edges import MD1  # noqa: E402

LOADS = (0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2)
LENGTHS = (300, 1000, 3000)
FULL_LOAD_REQUESTS = 4000
NO_BOUND_S = 1e6  # s/token: the keeps-up rule alone decides


def paged_replica() -> dict[str, Any]:
    """One replica of scenarios/cluster/routers.yaml's fleets, without the warm-up (which
    would drop most of a 300-request run)."""
    data = yaml.safe_load((ROOT / "scenarios" / "cluster" / "routers.yaml").read_text())
    data["systems"] = [{"name": "one", "scheduler": data["systems"][0]["scheduler"]}]
    data["warmup_s"] = 0.0
    return data


def full_load_rps(data: dict[str, Any]) -> float:
    """Completions while requests arrive at twice the all-at-once completion rate."""
    data = copy.deepcopy(data)
    data["workload"]["num_requests"] = FULL_LOAD_REQUESTS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # saturated by design
        data["workload"]["arrival"]["rate_per_s"] = 1e6
        at_once = next(iter(run_scenario(scenario_from_dict(data)).systems.values()))
        data["workload"]["arrival"]["rate_per_s"] = 2 * at_once.summary["throughput_rps"]
        run = next(iter(run_scenario(scenario_from_dict(data)).systems.values()))
    return served_rps(run.requests["arrival_s"].to_numpy(dtype=np.float64),
                      run.requests["finish_s"].to_numpy(dtype=np.float64))


def sweep_table(base: Path, full_rps: float, num_requests: int, replications: int,
                workers: int) -> pd.DataFrame:
    rates: list[ParamValue] = [round(load * full_rps, 6) for load in LOADS]
    sweep = make_sweep(base, {"workload.arrival.rate_per_s": rates}, replications=replications,
                       overrides=[f"workload.num_requests={num_requests}"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the loads above 1 saturate
        table = run_sweep_in_memory(sweep, workers=workers).table
    table["load"] = np.round(table["workload.arrival.rate_per_s"] / full_rps, 2)
    return table


def load_rows(table: pd.DataFrame, n: int) -> dict[float, str]:
    ratio = table["served_rps"] / table["offered_rps"]
    fraction = keeps_up(table.drop(columns="saturated"))
    rule = keeps_up(table)
    cells = {}
    for load, rows in table.groupby("load").groups.items():
        cells[float(load)] = (f"{ratio[rows].min():.3f} to {ratio[rows].max():.3f}: "
                              f"{int(fraction[rows].sum())}, {int(rule[rows].sum())}")
    return cells


def answers(table: pd.DataFrame, full_rps: float) -> str:
    said = []
    for rule, rows in (("fraction", table.drop(columns="saturated")), ("rule", table)):
        best, over = [], 0
        for _, one in rows.groupby("replication"):
            answer = throughput_under_bound(one, NO_BOUND_S).iloc[0]
            best.append(answer / full_rps)
            kept = one[keeps_up(one)]
            over += bool(len(kept)) and float(kept["load"].max()) > 1.0
        said.append(f"{rule}: median {np.nanmedian(best):.3f}, {over} keep a row above 1")
    return "; ".join(said)


def report(name: str, data: dict[str, Any], full_rps: float, replications: int,
           workers: int) -> list[str]:
    cells: dict[int, dict[float, str]] = {}
    answered: dict[int, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.yaml"
        base.write_text(yaml.safe_dump(json.loads(json.dumps(data))))
        for n in LENGTHS:
            table = sweep_table(base, full_rps, n, replications, workers)
            cells[n], answered[n] = load_rows(table, n), answers(table, full_rps)
    lines = [f"{name}, full-load rate {full_rps:.3f} req/s; served / offered (lowest to highest): "
             f"rows passing the 0.9 fraction alone, passing keeps_up; of {replications}", "",
             "| load | " + " | ".join(f"{n:,} requests" for n in LENGTHS) + " |",
             "|---|" + "---|" * len(LENGTHS)]
    for load in LOADS:
        lines.append(f"| {load:.2f} | " + " | ".join(cells[n][load] for n in LENGTHS) + " |")
    lines += ["", "answers over the full-load rate (no latency bound):"]
    lines += [f"- {n:,} requests: {answered[n]}" for n in LENGTHS]
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--replications", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    lines = report("M/D/1", MD1, 10.0, args.replications, args.workers)
    paged = paged_replica()
    lines += report("paged replica", paged, full_load_rps(paged), args.replications, args.workers)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
