"""Speed and memory of a cluster: `python benchmarks/cluster.py --force` (or `make bench-cluster`).

The workload and replica of benchmarks/engine.py (ShareGPT lengths, Llama-2-7B on one
A100-80GB, batch limit 64), 16 replicas behind a router, Poisson arrivals at 85% of 16
times one replica's measured capacity. Each case runs in its own process (its peak RSS
is its own); times are CPU seconds only (no wall time), end to end (build the scenario, draw,
simulate, frames, summary; unlike engine.py no summary is written and no warm-up run comes
first, so the first of the repeats pays the first calls), the median of `REPEATS` runs (one
at 1M requests); at the smallest size reference mode runs once in the same process for the
ratio (reference CPU seconds over fast; the first of three runs of 2,000 requests took
0.20 CPU s where the next took 0.15 to 0.16). Prints a table and writes
benchmarks/results/cluster.json (only where it ran every scheduler, else to an `--out` given).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import engine as single  # noqa: E402 - benchmarks/engine.py, beside this file

RESULTS = Path(__file__).parent / "results" / "cluster.json"
NUM_REPLICAS = 16
ROUTERS = ("round_robin", "least_outstanding")
# Paged to 1M: issue 12's target is a 16-replica paged cluster at 1M requests.
SIZES = {"iteration_level": (10_000, 100_000), "paged": (10_000, 100_000, 1_000_000)}
REPEATS = 3
REPEATS_AT = {1_000_000: 1}  # minutes per run


def scenario_dict(scheduler: str, router: str, num_requests: int, rate_per_s: float,
                  mode: str, cost_keys: dict[str, Any]) -> dict[str, Any]:
    data = single.scenario_dict(scheduler, num_requests, rate_per_s, mode, cost_keys)
    data["systems"][0]["cluster"] = {"replicas": NUM_REPLICAS, "router": {"kind": router}}
    return data


def child(spec: dict[str, Any]) -> dict[str, Any]:
    from orcasim.run import run_scenario
    from orcasim.scenario import scenario_from_dict

    out: dict[str, Any] = {}
    for mode, repeats in (("fast", spec["repeats"]), ("reference", spec["reference_repeats"])):
        if not repeats:
            continue
        data = scenario_dict(spec["scheduler"], spec["router"], spec["num_requests"],
                             spec["rate_per_s"], mode, spec["cost_keys"])
        times = []
        for _ in range(repeats):
            start_s = time.process_time()
            result = run_scenario(scenario_from_dict(data))
            times.append(time.process_time() - start_s)
        out[f"{mode}_cpu_s"] = statistics.median(times)
        out["throughput_rps"] = result.systems[spec["scheduler"]].summary["throughput_rps"]
    out["peak_rss_bytes"] = single.peak_rss_bytes()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--schedulers", nargs="+", choices=tuple(SIZES), default=list(SIZES))
    single.add_output_flags(parser, "benchmarks/results/cluster.json")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    complete = sorted(args.schedulers) == sorted(SIZES)
    single.check_out(parser, args.out, args.force, RESULTS if complete else None)
    cost_name, cost_keys = single.choose_cost()
    rows = []
    print(f"{'scheduler':<16}{'router':<19}{'requests':>9}{'cpu s':>8}{'sim req/cpu-s':>15}"
          f"{'peak RSS MB':>13}{'ref/fast':>10}")
    for scheduler in args.schedulers:
        rate = single.LOAD_FRACTION * NUM_REPLICAS * single.capacity_rps(scheduler, cost_keys)
        for router in ROUTERS:
            for n in SIZES[scheduler]:
                spec = {"scheduler": scheduler, "router": router, "num_requests": n,
                        "rate_per_s": rate, "cost_keys": cost_keys,
                        "repeats": REPEATS_AT.get(n, REPEATS),
                        "reference_repeats": 1 if n == min(SIZES[scheduler]) else 0}
                done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                                      check=True, capture_output=True, text=True)
                row = {**spec, **json.loads(done.stdout.strip().splitlines()[-1])}
                rows.append(row)
                ratio = (f"{row['reference_cpu_s'] / row['fast_cpu_s']:.1f}x"
                         if "reference_cpu_s" in row else "")
                print(f"{scheduler:<16}{router:<19}{n:>9,}{row['fast_cpu_s']:>8.2f}"
                      f"{n / row['fast_cpu_s']:>15,.0f}{row['peak_rss_bytes'] / 2**20:>13,.0f}"
                      f"{ratio:>10}", flush=True)
    report = {"cost": cost_name, "replicas": NUM_REPLICAS, "load_fraction": single.LOAD_FRACTION,
              "date": time.strftime("%Y-%m-%d"), "machine": single.machine(), "load_average": os.getloadavg(), "results": rows}
    single.write_report(report, args.out, RESULTS, complete)


if __name__ == "__main__":
    main()
