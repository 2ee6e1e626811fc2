"""Instructions a simulation executes, counted by valgrind: `python benchmarks/instructions.py`.

Wall and CPU seconds on a shared machine move by 30% from one run to the next, more than
most changes to the engine's inner loop. The number of instructions executed hardly moves.
This runs the workload of benchmarks/engine.py (ShareGPT lengths, Llama-2-7B on one
A100-80GB, roofline cost, Poisson arrivals at a fixed rate for each kind, 85% of one
replica's capacity as measured on 2026-12-04, 86 to 87% of it for the paged kinds since
commit 88cec25) at two sizes under valgrind's cachegrind (no cache simulation) and reports the
difference per request, so that start-up (imports, building the scenario) cancels. The
children run with a fixed PYTHONHASHSEED (str hashes are salted per process, and set and
dict orders follow them) and one BLAS thread (`ONE_THREAD`): with both, three runs of the
same code counted within 0.0004% of each other; with the hash seed alone, 1.9% apart.
Needs `valgrind` on the PATH; each case takes about a minute.

    python benchmarks/instructions.py [--kinds paged cluster ...] [--sizes 400 4000]

`cluster` is 16 replicas behind round-robin (benchmarks/cluster.py's fleet). Compare two
commits by running this in a checkout of each (PYTHONPATH set to it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import cluster as fleet  # noqa: E402 - benchmarks/cluster.py, beside this file
import engine as single  # noqa: E402 - benchmarks/engine.py, beside this file

KINDS = ("paged", "prefill_first", "chunked", "iteration_level", "cluster")
# 85% of one Llama-2-7B replica's capacity for each kind, as benchmarks/engine.py measures it
# (`capacity_rps`, 2026-12-04): fixed here so that both sizes, and every commit compared,
# see the same arrivals. One rate for every kind (paged's) ran Orca at 117% of its capacity,
# saturated, with the saturation warning silenced (a tester's finding).
# Since commit 88cec25 the prompt and output lengths are drawn as ShareGPT's pairs (they were
# drawn apart): the paged kinds' rates are 86 to 87% of the capacity measured then (paged
# 1.312, prefill-first 1.352, chunked 1.277 at 85%), iteration-level's about 85%, kept so
# that commits compare on the same arrivals;
# counts across that commit compare different workloads.
RATE_PER_S = {"paged": 1.3292486203585805, "prefill_first": 1.369507888254133,
              "chunked": 1.3004491745830977, "iteration_level": 1.002562483605634}
NUM_REPLICAS = fleet.NUM_REPLICAS
HASH_SEED = "0"
REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def scenario_dict(kind: str, num_requests: int) -> dict[str, Any]:
    _, cost_keys = single.choose_cost("roofline")
    if kind == "cluster":
        return fleet.scenario_dict("paged", "round_robin", num_requests,
                                   NUM_REPLICAS * RATE_PER_S["paged"], "fast", cost_keys)
    return single.scenario_dict(kind, num_requests, RATE_PER_S[kind], "fast", cost_keys)


def child(kind: str, num_requests: int) -> None:
    """One simulation in this process (what valgrind counts)."""
    import warnings

    from orcasim.run import run_scenario
    from orcasim.scenario import scenario_from_dict

    warnings.simplefilter("ignore")  # a saturation warning is not what is measured here
    run_scenario(scenario_from_dict(scenario_dict(kind, num_requests)))


# numpy's BLAS starts a pool of worker threads that spin while they wait, and how long they
# spin depends on how the threads are scheduled: with a fixed hash seed alone, three runs of
# the same code counted 563,514 to 574,277 instructions a paged request (1.9%); with one
# thread, 566,587 to 566,589.
ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                     "MKL_NUM_THREADS")}


def count(kind: str, num_requests: int) -> int:
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
           sys.executable, __file__, "--child", kind, str(num_requests)]
    env = {**os.environ, "PYTHONHASHSEED": HASH_SEED, **ONE_THREAD}
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    match = REFS.search(done.stderr)
    assert match is not None, done.stderr[-2000:]
    return int(match.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=["paged", "cluster"])
    parser.add_argument("--sizes", nargs=2, type=int, default=[400, 4000], metavar=("SMALL", "LARGE"))
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    small, large = sorted(args.sizes)
    if small == large or small < 1:
        parser.error(f"--sizes = {args.sizes}: expected two distinct positive request counts "
                     "(the difference is per request)")
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not on the PATH")
    print(f"{'kind':<16} {'instructions / request':>24}   ({large} - {small} requests)")
    rows = []
    for kind in args.kinds:
        start_s = time.perf_counter()
        per_request = (count(kind, large) - count(kind, small)) / (large - small)
        rows.append({"kind": kind, "instructions_per_request": per_request})
        print(f"{kind:<16} {per_request:>24,.0f}   {time.perf_counter() - start_s:.0f} s", flush=True)
    print(json.dumps({"sizes": [small, large], "rows": rows}))


if __name__ == "__main__":
    main()
