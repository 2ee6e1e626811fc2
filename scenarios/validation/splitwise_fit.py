"""Fit the engine terms of `splitwise_llama2_70b_a100.yaml` to splitwise's A100 iterations.

    python scenarios/validation/splitwise_fit.py            # prints the fitted block and LOO
    python scenarios/validation/splitwise_fit.py --zero overhead.per_prefill_token_s
                                                            # the same with that term at 0

The GPU side is the roofline from datasheets, with NCCL's measured behaviour on a DGX A100
(Vidur's all_reduce.csv: ~40 us for a small message, 150-170 GB/s bus bandwidth for 64 MB,
i.e. network_efficiency 0.55 of NVLink's 300 GB/s a direction), fixed, not fitted. Fitted,
once for every tensor-parallel degree together (least squares on log errors, soft-L1):
the GEMM efficiency and the engine's terms (orcasim.cost.overhead). Leaving one degree out
at a time shows how the fit carries to a degree it did not see.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orcasim.scenario import load_scenario, scenario_from_dict, set_dotted  # noqa: E402
from orcasim.validation import iteration_table, median_errors, read_splitwise  # noqa: E402

SCENARIO = Path(__file__).with_name("splitwise_llama2_70b_a100.yaml")
FITTED = ("compute_efficiency", "overhead.launch_per_layer_s",
          "overhead.tensor_parallel_per_iteration_s", "overhead.per_sequence_s",
          "overhead.per_iteration_s", "overhead.per_prefill_token_s")


def measured() -> pd.DataFrame:
    return read_splitwise()  # without the failed runs (orcasim.validation.FAILED_RUNS)


def with_values(values: dict[str, float], zero: tuple[str, ...] = ()):
    """The scenario with `values` in its cost block (an efficiency capped at 1), and the
    terms named in `zero` at 0."""
    data = load_scenario(SCENARIO).model_dump(mode="json", exclude_none=True)
    for dotted, value in {**values, **dict.fromkeys(zero, 0.0)}.items():
        set_dotted(data["cost"], dotted, min(value, 1.0) if dotted.endswith("efficiency") else value)
    return scenario_from_dict(data)


def fit(points: pd.DataFrame, start: dict[str, float], zero: tuple[str, ...] = ()) -> dict[str, float]:
    """The FITTED terms but those in `zero` (held at 0) that fit `points` best."""
    from scipy.optimize import least_squares

    names = [name for name in FITTED if name not in zero]

    def residuals(x: np.ndarray) -> np.ndarray:
        values = dict(zip(names, np.exp(x), strict=True))
        table = iteration_table(with_values(values, zero), points)
        return np.log1p(np.concatenate([table["prompt_error"], table["token_error"]]))

    x0 = np.log([max(start[name], 1e-6) for name in names])  # log space: zero starts small
    result = least_squares(residuals, x0, loss="soft_l1", f_scale=0.1, diff_step=0.05,
                           max_nfev=300)
    return {**dict(zip(names, np.exp(result.x).tolist(), strict=True)), **dict.fromkeys(zero, 0.0)}


def current() -> dict[str, float]:
    cost = load_scenario(SCENARIO).cost.model_dump()
    return {name: float(cost[name] if "." not in name else cost["overhead"][name.split(".")[1]])
            for name in FITTED}


def leave_one_out(points: pd.DataFrame, start: dict[str, float],
                  zero: tuple[str, ...] = ()) -> dict[int, dict[str, float]]:
    """Fit on two degrees, score the third."""
    out = {}
    for held in sorted(points["tensor_parallel"].unique()):
        values = fit(points[points["tensor_parallel"] != held], start, zero)
        table = iteration_table(with_values(values), points[points["tensor_parallel"] == held])
        out[int(held)] = median_errors(table)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zero", action="append", default=[], choices=FITTED,
                        help="hold this term at 0 and fit the others (repeatable)")
    zero = tuple(parser.parse_args().zero)
    points = measured()
    values = fit(points, current(), zero)
    print(json.dumps(values, indent=2))
    table = iteration_table(with_values(values), points)
    print("fitted, all degrees:", median_errors(table))
    for degree, rows in table.groupby("tensor_parallel"):
        print(f"  TP {degree}:", median_errors(rows))
    print("left out:", json.dumps(leave_one_out(points, values, zero), indent=2))
