"""Whole-iteration measurements against a scenario's cost model (splitwise's A100 table).

splitwise-sim's `perf_model_a100.csv` (Mutinifni/splitwise-sim, MIT; shipped in
`orcasim/data/ground_truth/splitwise_a100/`) times a real engine on a DGX-A100, framework
included: `prompt_time` is one prefill iteration of `batch_size` prompts of `prompt_size`
tokens; `token_time` is the mean decode iteration of those requests over their
`token_size` = 128 output tokens (e2e_time = prompt_time + 127 token_time in the file), so
the decode steps read contexts prompt_size + 1 .. prompt_size + 127.

`iteration_table` prices every measured point with a scenario's cost block at each
tensor-parallel degree; `median_errors` is what the validation report quotes.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from orcasim.cost import Batch, CostModel, build_cost_model
from orcasim.paths import read_csv, resolve_data_path
from orcasim.scenario import Scenario, scenario_from_dict

SPLITWISE_A100 = "ground_truth/splitwise_a100/perf_model_a100.csv"
DECODE_STEPS = 127  # token_size 128: the first token comes from the prefill
KEYS = ["model", "tensor_parallel", "prompt_size", "batch_size"]
# (model, TP, prompt, batch) points left out: at TP 2, 64 prompts of 512 took 794 ms, less
# than the 6,633 ms of 32 such prompts: a failed run (their KV, 64 x 640 tokens, beside
# 69 GB of weights per GPU overflows an 80 GB A100).
FAILED_RUNS = [("llama2-70b", 2, 512, 64)]


def read_splitwise(path: str = SPLITWISE_A100, model: str = "llama2-70b") -> pd.DataFrame:
    """Median of the repeats per (tensor parallel, prompt size, batch size), in seconds,
    without the `FAILED_RUNS`."""
    raw = read_csv(resolve_data_path(path))
    raw = raw[raw["model"] == model]
    table = raw.groupby(KEYS, as_index=False)[["prompt_time", "token_time"]].median()
    failed = [tuple(row) in FAILED_RUNS for row in table[KEYS].itertuples(index=False)]
    table = table[~np.array(failed, dtype=bool)].reset_index(drop=True)
    table["prompt_s"] = table.pop("prompt_time") / 1e3
    table["token_s"] = table.pop("token_time") / 1e3
    return table


def at_tensor_parallel(scenario: Scenario, tp: int, gpu: str | None = None) -> CostModel:
    """The scenario's cost model with `tensor_parallel = tp` (and another GPU, if given)."""
    data: dict[str, Any] = scenario.model_dump(mode="json", exclude_none=True)
    data["hardware"]["tensor_parallel"] = tp
    if gpu is not None:
        data["hardware"]["gpu"] = gpu
    # The dump carries the scenario's KV capacity (derived at its own degree, if it was):
    # the move derives none, so a degree whose weights leave no room for KV still prices.
    # Nor does it warn that the capacity is beyond the new degree's memory: a cost model
    # prices iterations whatever the capacity (257 such warnings in one validation report).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"kv_capacity_tokens = \S+ is beyond what "
                                "the deployment holds")
        moved = scenario_from_dict(data, f"{scenario.name} at TP {tp}")
    return build_cost_model(moved.cost, moved.deployment(), moved.hardware)


def iteration_table(scenario: Scenario, measured: pd.DataFrame, gpu: str | None = None
                    ) -> pd.DataFrame:
    """`measured` with the cost block's `prompt_sim_s`, `token_sim_s` and relative errors."""
    costs = {tp: at_tensor_parallel(scenario, int(tp), gpu)
             for tp in measured["tensor_parallel"].unique()}
    prompt, token = [], []
    for row in measured.itertuples():
        cost, size, batch = costs[row.tensor_parallel], int(row.prompt_size), int(row.batch_size)
        prompts = np.full(batch, size, dtype=np.int64)
        prompt.append(cost.iteration_time_s(Batch(prompts, prompts)))
        token.append(float(cost.decode_steps_s(prompts + 1, DECODE_STEPS).mean()))
    table = measured.assign(prompt_sim_s=prompt, token_sim_s=token)
    table["prompt_error"] = table["prompt_sim_s"] / table["prompt_s"] - 1.0
    table["token_error"] = table["token_sim_s"] / table["token_s"] - 1.0
    return table


def median_errors(table: pd.DataFrame) -> dict[str, float]:
    """Median |relative error| of prefill and decode iterations over the table's points."""
    return {"prefill": float(table["prompt_error"].abs().median()),
            "decode": float(table["token_error"].abs().median())}
