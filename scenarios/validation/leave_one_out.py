"""Leave one run out, from a start that no run chose: `python scenarios/validation/leave_one_out.py`.

The shipped validation scenarios' engine terms were fitted to all four runs, and the
records' left-out errors (`vllm_calibration.yaml`, `distserve_calibration.yaml`) refitted
without each run starting from those terms: the run left out had already chosen where its
fit began. Here each fit of three runs starts where a user without any log starts, from
the overhead's defaults (Vidur's measured per-iteration and per-sequence times, nothing per
prefill token, no way in; `orcasim.cost.overhead`), and is then scored on the fourth. Same
fit (`calibrate.logs.fit`), same parameters as the record, same score as `python -m
calibrate logs`.

    python scenarios/validation/leave_one_out.py [--setup vllm|distserve] [--jobs 2] [--only RUN ...]
        [--prior-weight W]

Writes `results/validation/<setup>_leave_one_out.yaml` (each held-out run's parameters and
errors, the start, the commit); with `--only`, the named runs only, merged into that file.
With `--prior-weight W` above 0 each fit is penalised toward the defaults it starts from
(`calibrate logs --prior-weight`, `calibrate.logs.Prior`), recorded in
`<setup>_leave_one_out_prior_<W>.yaml`; with `--prior-weight auto` each fit of three runs
takes the weight its own fit without a prior gives (`calibrate.logs.auto_prior_weight`),
recorded per run, in `<setup>_leave_one_out_prior_auto.yaml`.
vLLM: 10 minutes for the four runs on two cores, DistServe's 24 (2026-12-06, other work
beside them; 5 each before the search from two starts, daaf846).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from calibrate.__main__ import prior_weight  # noqa: E402
from calibrate.logs import (  # noqa: E402
    DEFAULT_PARAMETERS,
    PriorWeight,
    fit_under,
    read_logs,
    scored_error,
    with_cost,
)
from orcasim.cost.overhead import OverheadConfig  # noqa: E402
from orcasim.paths import resolve_data_path  # noqa: E402
from orcasim.scenario import Scenario, load_scenario  # noqa: E402

HERE = Path(__file__).parent
GROUND_TRUTH = "ground_truth/distserve_opt13b_a100"
# Per setup: the scenario, its runs, and the terms its record fitted on all four runs.
SETUPS = {
    "vllm": (HERE / "vllm_opt13b_a100.yaml",
             [f"{GROUND_TRUTH}/vllm-{name}.csv" for name in ("100-1", "100-2", "200-2", "300-3")],
             ("overhead.request_latency_s", *DEFAULT_PARAMETERS)),
    "distserve": (HERE / "distserve_disagg_opt13b_a100.yaml",
                  [f"{GROUND_TRUTH}/distserve-c21d11-300-{n}.csv" for n in (3, 6, 9, 12)],
                  ("overhead.per_iteration_s", "overhead.per_sequence_s",
                   "overhead.request_latency_s")),
}


def from_defaults(scenario: Scenario) -> Scenario:
    """The scenario with its engine terms back at the overhead's defaults (TP 1: no
    multi-process term, as the scenario sets), the start of every fit here."""
    start = OverheadConfig(tensor_parallel_per_iteration_s=0.0)
    values = {f"overhead.{k}": float(getattr(start, k)) for k in
              ("per_iteration_s", "per_sequence_s", "per_prefill_token_s", "request_latency_s")}
    return with_cost(scenario, values)


def one_fold(setup: str, held_name: str, weight: PriorWeight = 0.0) -> dict[str, Any]:
    path, runs, parameters = SETUPS[setup]
    scenario = from_defaults(load_scenario(path))
    system = scenario.systems[0].name
    logs = read_logs([resolve_data_path(p) for p in runs])
    held = next(log for log in logs if log.name == held_name)
    others = [log for log in logs if log is not held]
    result = fit_under(scenario, others, system, parameters, HERE, weight)
    fitted = with_cost(scenario, result.parameters, system)
    return {"parameters": result.parameters, "error_fitted": result.fitted_errors,
            "error_left_out": scored_error(fitted, held, system, HERE),
            "evaluations": result.evaluations,
            **({"prior_weight": result.prior.weight} if result.prior is not None else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", choices=tuple(SETUPS), default="vllm")
    parser.add_argument("--only", nargs="+", metavar="RUN", help="runs by name (default: all four)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--prior-weight", type=prior_weight, default=0.0, metavar="W",
                        help="a sourced prior's weight, or auto (calibrate logs --prior-weight; "
                             "default 0)")
    args = parser.parse_args()
    path, runs, parameters = SETUPS[args.setup]
    names = [Path(p).stem for p in runs]
    only = args.only or names
    unknown = sorted(set(only) - set(names))
    if unknown:
        parser.error(f"--only {' '.join(unknown)}: expected runs of {args.setup}: {', '.join(names)}")
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        folds = dict(zip(only, pool.map(one_fold, [args.setup] * len(only), only,
                                        [args.prior_weight] * len(only)), strict=True))
    suffix = (f"_prior_{args.prior_weight}" if isinstance(args.prior_weight, str)
              else f"_prior_{args.prior_weight:g}" if args.prior_weight else "")
    out = ROOT / "results" / "validation" / f"{args.setup}_leave_one_out{suffix}.yaml"
    record: dict[str, Any] = yaml.safe_load(out.read_text()) if out.exists() else {}
    start = from_defaults(load_scenario(path))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    record.update({"scenario": path.name, "parameters_fitted": list(parameters),
                   "start": dict(load_overhead(start)), "commit": commit or "unknown",
                   **({"prior_weight": args.prior_weight} if args.prior_weight else {})})
    record.setdefault("left_out", {}).update(folds)
    record["left_out"] = dict(sorted(record["left_out"].items()))
    out.write_text(yaml.safe_dump(record, sort_keys=False))
    for name, fold in folds.items():
        print(f"{name}: left out {100 * fold['error_left_out']:.1f}%  {fold['parameters']}")


def load_overhead(scenario: Scenario) -> dict[str, float]:
    """The engine terms every fit here starts from."""
    overhead = scenario.system_cost(scenario.systems[0]).overhead
    return {} if overhead is None else {k: float(v) for k, v in overhead.model_dump().items()}


if __name__ == "__main__":
    main()
