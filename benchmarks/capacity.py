"""Speed of a capacity search: `python benchmarks/capacity.py --force` (or `make bench-capacity`).

The issue's case: one system, the rate searched to within 2%, 3 replications, 2,000
requests per evaluated rate, SLOs TTFT p90 <= 0.5 s and TPOT p90 <= 0.1 s. Two systems of
different speed are timed: Orca on the quickstart workload (fused fast loop) and vLLM-style
paged serving of Llama-2-7B on one A100-80GB with ShareGPT-like lengths (the fused paged loop,
`orcasim.paged_fast`).
Wall time end to end (plan, every search on a local process pool, the table), the median of
`REPEATS`, with 1 worker and with 2 (this machine's cores); the number of rates evaluated
and the peak RSS of this (the parent) process: a spawned worker's RUSAGE_CHILDREN keeps the
parent's high-water mark, so the workers' own is not known. Prints a table and writes
benchmarks/results/capacity.json (or `--out`).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orcasim import capacity as cap  # noqa: E402
from orcasim.scenario import load_scenario, scenario_from_dict  # noqa: E402
from orcasim.slo import slo_from_strings  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import engine  # noqa: E402 - benchmarks/engine.py, beside this file

RESULTS = Path(__file__).parent / "results" / "capacity.json"
REPEATS = 3
SLO = ["ttft_p90 <= 0.5", "tpot_p90 <= 0.1"]
PAGED = {
    "name": "bench_capacity_paged", "seed": 0,
    "workload": {"num_requests": 2000, "arrival": {"kind": "poisson", "rate_per_s": 2.0},
                 "prompt_tokens": {"kind": "lognormal", "mean": 300, "sigma": 1.0, "max": 2048},
                 "output_tokens": {"kind": "lognormal", "mean": 200, "sigma": 1.0, "max": 1024},
                 "max_tokens": 4096},
    "model": "llama2-7b", "hardware": {"gpu": "a100-80gb"},
    "cost": {"kind": "roofline"},
    "systems": [{"name": "paged", "scheduler": {"kind": "paged", "max_num_seqs": 256}}],
}


def cases() -> dict[str, tuple[Any, str]]:
    quickstart = load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    return {"orca (quickstart)": (quickstart, "orca"),
            "paged (Llama-2-7B, A100)": (scenario_from_dict(PAGED), "paged")}


def time_search(scenario: Any, system: str, workers: int) -> dict[str, float]:
    slo = slo_from_strings(SLO)
    walls, evaluations, rate = [], 0, float("nan")
    for _ in range(REPEATS):
        start = time.perf_counter()
        jobs = cap.search_jobs(scenario, ROOT, slo, 3, cap.SearchSettings(), [system])
        result = cap.run_capacity(jobs, workers=workers)
        if result.failed:  # a search that failed has no row to time
            raise SystemExit(f"{system}: a search failed: {result.failed[0].error}")
        walls.append(time.perf_counter() - start)
        evaluations = int(result.table["evaluations"].iloc[0])
        rate = float(result.table["max_rate_per_s"].iloc[0])
    return {"wall_s": statistics.median(walls), "evaluations": evaluations,
            "max_rate_per_s": rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    engine.add_output_flags(parser, "benchmarks/results/capacity.json")
    args = parser.parse_args()
    engine.check_out(parser, args.out, args.force, RESULTS)
    rows = []
    for label, (scenario, system) in cases().items():
        for workers in (1, 2):
            row = {"case": label, "workers": workers, **time_search(scenario, system, workers)}
            rows.append(row)
            print(f"{label:28s} workers {workers}: {row['wall_s']:6.1f} s, "
                  f"{row['evaluations']} rates evaluated, capacity {row['max_rate_per_s']:.3g} req/s")
    # This process's own peak (VmHWM). The workers' is not reported: RUSAGE_CHILDREN keeps
    # this process's high-water mark in every spawned worker (it read exactly the parent's).
    self_rss = engine.peak_rss_bytes()
    record = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
              "python": platform.python_version(), "repeats": REPEATS, "slo": SLO,
              "replications": 3, "requests_per_rate": cap.DEFAULT_REQUESTS,
              "rel_tol": cap.DEFAULT_REL_TOL, "peak_rss_bytes": {"parent": self_rss},
              "cases": rows}
    print(f"peak RSS: parent {self_rss / 2**20:.0f} MiB")
    engine.write_report(record, args.out, RESULTS, complete=True)


if __name__ == "__main__":
    main()
