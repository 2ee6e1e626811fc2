"""Speed and memory of the engine itself: `python benchmarks/engine.py --force` (or `make bench`).

Workload: ShareGPT lengths (prompt and output resampled from the Llama-2 tokenised trace),
Poisson arrivals at 85% of each system's capacity, Llama-2-7B on one A100-80GB,
`max_batch_size: 64`, iteration-level (Orca) and request-level schedulers, vLLM's paged
scheduler with the same batch limit (`max_num_seqs: 64`, blocks of 16 tokens) under both
policies (`mixed`, vLLM v1, as `paged`; `prefill_first`, vLLM before v1) and
Sarathi-Serve's chunked one (the same, chunks of 512 tokens), 10k / 100k / 1M requests. Capacity is measured, not assumed: the completion rate of a saturated run
(every request arriving at once) in fast mode.

Each case runs in its own process, so that its peak RSS is its own. The timed region is
what a user waits for: drawing the requests, simulating, building the per-request frame
and the summary, and writing the summary to disk. Short cases report the median of a
few repeats (`REPEATS`: 5 at 10k, 3 at 100k, 1 otherwise); at the smallest size (10k by
default) reference mode runs once in the same process for the ratio (reference wall seconds
over fast). Before its timed runs each case runs the same scenario once at
`WARMUP_REQUESTS`, untimed, so that no timed run pays for first calls (imports, caches): at
sizes run once, the first fast run paid about 0.1 s that the reference run after it did not.
CPU seconds are reported beside wall seconds because a shared machine's load inflates
wall time; the load averages before and after go into the JSON.
Prints a table and writes benchmarks/results/engine.json (engine_linear.json when the linear
cost ran), only where it ran every default size and scheduler (a partial run, which would
replace the README table's source, writes only to an `--out` given).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "engine.json"
SIZES = (10_000, 100_000, 1_000_000)
SCHEDULERS = ("iteration_level", "request_level", "paged", "prefill_first", "chunked")
# Every size for every scheduler (the paged kinds at 1M take a few minutes each).
MAX_REQUESTS: dict[str, int] = {}
LOAD_FRACTION = 0.85
CAPACITY_REQUESTS = 4_000  # requests in the saturated run that measures capacity
REPEATS = {10_000: 5, 100_000: 3, 1_000_000: 1}
REFERENCE_REPEATS = 1  # reference mode at 10k takes tens of seconds: not short
MAX_BATCH_SIZE = 64
WARMUP_REQUESTS = 200

TRACE = "traces/sharegpt_lengths_llama2.csv"
# Prompt and output are resampled independently, so a request may pair the longest
# prompt (8,141) with the longest output (1,024): max_tokens must cover the sum.
MAX_TOKENS = 9_216
# Llama-2-7B in bf16 on one A100-80GB: real vLLM logs 119,184 tokens of KV for it at
# utilisation 0.9, and the catalog derives 118,141 (79.15 GiB x 0.9 - 13.5 GB of weights -
# 1 GiB, over 2 (K, V) x 32 layers x 4096 x 2 bytes = 512 KiB per token). Stated here, not
# derived, so that a checkout without the catalog runs the same workload.
KV_CAPACITY_TOKENS = 120_000

# The single switch: "auto" uses the roofline model when this checkout has it.
COST_KIND = "auto"
# Linear stand-in for Llama-2-7B on A100-80GB (roofline arithmetic, our estimates):
#   base_s: 13.5 GB of weights read once per iteration at 80% of 2,039 GB/s = 8.3 ms;
#   per_token_s: 2 x 6.7 GFLOP per token at 60% of 312 TFLOP/s (bf16) = 72 us;
#   per_context_token_s: 512 KiB of KV read per context token at 1.63 TB/s = 0.32 us.
LINEAR_COST = {"kind": "linear", "base_s": 8.3e-3, "per_token_s": 7.2e-5,
               "per_context_token_s": 3.2e-7}
# Llama-2-7B's shape (the catalog's llama2-7b) with its context widened to hold ShareGPT's
# longest conversations (prompt + output up to 9,216 tokens, past Llama-2's 4,096), as a
# long-context fine-tune would: the scenario refuses requests beyond a model's context.
LLAMA2_7B_LONG = {"name": "llama2-7b-long", "num_layers": 32, "hidden_size": 4096,
                  "num_heads": 32, "num_kv_heads": 32, "intermediate_size": 11008,
                  "gated_mlp": True, "vocab_size": 32000, "max_seq_len": 16384,
                  "positional": "rope", "tied_embeddings": False, "bias": False}
ROOFLINE_KEYS = {"cost": {"kind": "roofline"}, "model": LLAMA2_7B_LONG,
                 "hardware": {"gpu": "a100-80gb"}}


def scenario_dict(scheduler: str, num_requests: int, rate_per_s: float, mode: str,
                  cost_keys: dict[str, Any]) -> dict[str, Any]:
    lengths = {"kind": "empirical", "path": TRACE}
    return {
        "name": f"bench-{scheduler}", "seed": 0,
        "workload": {
            "num_requests": num_requests,
            "arrival": {"kind": "poisson", "rate_per_s": rate_per_s},
            "prompt_tokens": {**lengths, "column": "num_prefill_tokens"},
            "output_tokens": {**lengths, "column": "num_decode_tokens"},
            "max_tokens": MAX_TOKENS,
        },
        "kv_capacity_tokens": KV_CAPACITY_TOKENS,
        "systems": [{"name": scheduler, "scheduler": scheduler_keys(scheduler)}],
        "engine": {"mode": mode},
        **cost_keys,
    }


def scheduler_keys(scheduler: str) -> dict[str, Any]:
    """The batch limit of 64 in each scheduler's own words."""
    match scheduler:
        case "paged":
            # Without chunking the longest prompt + output - 1 must fit one step's budget.
            return {"kind": "paged", "max_num_seqs": MAX_BATCH_SIZE,
                    "max_num_batched_tokens": MAX_TOKENS}
        case "prefill_first":  # vLLM before v1: prompts in iterations of their own
            return {"kind": "paged", "policy": "prefill_first", "max_num_seqs": MAX_BATCH_SIZE,
                    "max_num_batched_tokens": MAX_TOKENS}
        case "chunked":  # Sarathi-Serve's default chunk
            return {"kind": "chunked", "max_num_seqs": MAX_BATCH_SIZE, "chunk_size_tokens": 512}
        case _:
            return {"kind": scheduler, "max_batch_size": MAX_BATCH_SIZE}


def choose_cost(kind: str = COST_KIND) -> tuple[str, dict[str, Any]]:
    """The roofline keys if they validate here, else the documented linear stand-in."""
    if kind in ("auto", "roofline"):
        from orcasim.config import ScenarioError
        from orcasim.scenario import scenario_from_dict

        try:
            scenario_from_dict(scenario_dict(SCHEDULERS[0], 1, 1.0, "fast", ROOFLINE_KEYS))
            return "roofline", ROOFLINE_KEYS
        except ScenarioError:
            if kind == "roofline":
                raise
            print("roofline cost not available in this checkout: using the linear stand-in")
    return "linear", {"cost": LINEAR_COST}


def simulate_once(data: dict[str, Any]) -> tuple[float, float, float]:
    """Wall and CPU seconds of one end-to-end run with the summary written; simulated seconds."""
    from orcasim.run import run_scenario
    from orcasim.scenario import scenario_from_dict

    scenario = scenario_from_dict(data)
    start_wall_s, start_cpu_s = time.perf_counter(), time.process_time()
    result = run_scenario(scenario)
    system = result.systems[data["systems"][0]["name"]]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "summary.json").write_text(json.dumps(system.summary))
    wall_s, cpu_s = time.perf_counter() - start_wall_s, time.process_time() - start_cpu_s
    return wall_s, cpu_s, float(system.requests["finish_s"].max())


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one case (fast, and reference when asked) in this process."""
    out: dict[str, Any] = {}
    simulate_once(scenario_dict(spec["scheduler"], min(WARMUP_REQUESTS, spec["num_requests"]),
                                spec["rate_per_s"], "fast", spec["cost_keys"]))
    for mode, repeats in (("fast", spec["repeats"]), ("reference", spec["reference_repeats"])):
        if repeats == 0:
            continue
        data = scenario_dict(spec["scheduler"], spec["num_requests"], spec["rate_per_s"], mode,
                             spec["cost_keys"])
        runs = [simulate_once(data) for _ in range(repeats)]
        out[f"{mode}_wall_s"] = statistics.median(r[0] for r in runs)
        out[f"{mode}_cpu_s"] = statistics.median(r[1] for r in runs)
        out["simulated_s"] = runs[0][2]
    out["peak_rss_bytes"] = peak_rss_bytes()
    return out


def peak_rss_bytes() -> int:
    """This process's own peak resident set. Linux's VmHWM starts afresh at exec; getrusage's
    ru_maxrss in a child that subprocess started keeps the parent's high-water mark (a bare
    Python child of a parent holding 600 MB read 611 MB there, 11 MB in VmHWM)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def capacity_rps(scheduler: str, cost_keys: dict[str, Any]) -> float:
    """Completion rate when every request arrives at once (a saturated system)."""
    from orcasim.run import run_scenario
    from orcasim.scenario import scenario_from_dict

    data = scenario_dict(scheduler, CAPACITY_REQUESTS, 1.0e6, "fast", cost_keys)
    with warnings.catch_warnings():  # saturated by design: its throughput at full load
        warnings.simplefilter("ignore", UserWarning)
        result = run_scenario(scenario_from_dict(data))
    return float(result.systems[scheduler].summary["throughput_rps"])


def benchmark(sizes: tuple[int, ...], cost_kind: str,
              schedulers: tuple[str, ...] = SCHEDULERS) -> dict[str, Any]:
    cost_name, cost_keys = choose_cost(cost_kind)
    print(HEADER)
    load_before = os.getloadavg()
    rows = []
    for scheduler in schedulers:
        rate = LOAD_FRACTION * capacity_rps(scheduler, cost_keys)
        for n in (n for n in sizes if n <= MAX_REQUESTS.get(scheduler, n)):
            spec = {"scheduler": scheduler, "num_requests": n, "rate_per_s": rate,
                    "cost_keys": cost_keys, "repeats": REPEATS.get(n, 1),
                    "reference_repeats": REFERENCE_REPEATS if n == min(sizes) else 0}
            # The repeat counts go in the row: its times are medians over them.
            row = {"scheduler": scheduler, "num_requests": n, "rate_per_s": rate,
                   "repeats": spec["repeats"], "reference_repeats": spec["reference_repeats"],
                   **run_child(spec)}
            rows.append(row)
            print(format_row(row), flush=True)
    return {"cost": cost_name, "cost_keys": cost_keys, "load_fraction": LOAD_FRACTION,
            "max_batch_size": MAX_BATCH_SIZE, "kv_capacity_tokens": KV_CAPACITY_TOKENS,
            "date": time.strftime("%Y-%m-%d"), "machine": machine(),
            "load_average_before_after": [load_before, os.getloadavg()], "results": rows}


def machine() -> dict[str, Any]:
    import numpy

    return {"platform": platform.platform(), "processor": platform.processor(),
            "cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
            "numpy": numpy.__version__}


HEADER = (f"{'scheduler':<16}{'requests':>10}{'wall s':>9}{'cpu s':>8}{'sim req/wall-s':>16}"
          f"{'sim s/wall-s':>14}{'peak RSS MB':>13}{'ref/fast':>10}")


def format_row(row: dict[str, Any]) -> str:
    wall_s = row["fast_wall_s"]
    ratio = f"{row['reference_wall_s'] / wall_s:.1f}x" if "reference_wall_s" in row else ""
    return (f"{row['scheduler']:<16}{row['num_requests']:>10,}{wall_s:>9.2f}{row['fast_cpu_s']:>8.2f}"
            f"{row['num_requests'] / wall_s:>16,.0f}{row['simulated_s'] / wall_s:>14,.0f}"
            f"{row['peak_rss_bytes'] / 2**20:>13,.0f}{ratio:>10}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--schedulers", nargs="+", choices=SCHEDULERS, default=list(SCHEDULERS))
    parser.add_argument("--cost", choices=("auto", "roofline", "linear"), default=COST_KIND)
    add_output_flags(parser, "benchmarks/results/engine.json; engine_linear.json with the "
                             "linear cost")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if len(set(args.sizes)) < len(args.sizes) or min(args.sizes) < 1:
        parser.error(f"--sizes = {args.sizes}: expected distinct positive request counts")
    complete = sorted(args.sizes) == list(SIZES) and sorted(args.schedulers) == sorted(SCHEDULERS)
    # The file of the cost that will run: --cost auto falls back to the linear stand-in.
    default = RESULTS.with_name("engine_linear.json") if choose_cost(args.cost)[0] == "linear" \
        else RESULTS
    check_out(parser, args.out, args.force, default if complete else None)
    report = benchmark(tuple(args.sizes), args.cost, tuple(args.schedulers))
    print(f"cost model: {report['cost']}")
    write_report(report, args.out, default, complete)


def add_output_flags(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results file (default {default}, written only by a run of every "
                             "default case: a partial run writes only to --out)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite an existing --out, or the committed results file")


def check_out(parser: argparse.ArgumentParser, out: Path | None, force: bool,
              replaces: Path | None = None) -> None:
    """Refused before anything runs: an --out that exists, or, without --out, the committed
    file `replaces` that a complete run would write over, without --force (a complete run
    replaced the README's source unasked, where nothing else is overwritten without it)."""
    if force:
        return
    if out is not None and out.exists():
        parser.error(f"--out = {str(out)!r} exists; expected a new file, or --force to overwrite it")
    if out is None and replaces is not None and replaces.exists():
        parser.error(f"this run would replace {replaces}, the README's source; expected --force "
                     "to replace it, or --out FILE")


def write_report(report: dict[str, Any], out: Path | None, default: Path, complete: bool) -> None:
    """Atomically to `out`, else to `default` (a committed file, the README's source) when the
    run was `complete`; a partial run without --out is printed only (a partial run replaced
    the 15 rows behind the README's table with one; a tester's finding)."""
    path = out or (default if complete else None)
    if path is None:
        print(f"a partial run: {default} is left as it was (give --out FILE to keep this one)")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
