"""Vidur's iteration times for splitwise's points; run by vidur.py in Vidur's own interpreter.

    cd VIDUR_CHECKOUT && PYTHON vidur_predict.py REQUEST.json OUT.json CACHE_DIR

Imports nothing of orcasim (Vidur's interpreter has none). For each tensor-parallel degree
it builds Vidur's default predictor (random forest, `RandomForrestExecutionTimePredictor`,
its default grid) for meta-llama/Llama-2-70b-hf on `a100` with the `a100_dgx` network
profile, trained on the checkout's CSVs, and asks its `get_execution_time(batch, 0)` for

* the prefill of `batch_size` fresh requests of `prompt_size` tokens, one `Batch`;
* the mean of the 127 decode iterations of those requests, each request advanced by
  Vidur's own `Request.on_batch_end` (after the prefill, a request holds prompt + 1 tokens,
  as orcasim's decode steps do).

`total_time` (s) is Vidur's iteration time: its model time plus its CPU overhead, which its
default (`skip_cpu_overhead_modeling`) leaves at zero. Where the checkout lacks the model's
`attention.csv` (and REQUEST names none for the degree), the three terms it trains (attention
prefill, decode, KV-cache save) are priced at zero and `attention` in the output says so;
everything else is Vidur's, unmodified.

REQUEST holds `points` (tensor_parallel, prompt_size, batch_size), `grid` and
`attention_csv`, a file per degree (as a string) in Vidur's attention format that stands in
for the checkout's. Grid `default` searches Vidur's own grid for each forest (27 settings, 10-fold: about two
minutes a forest on two cores, 30 forests); `one` fits its one setting `ONE` (a point of
that grid) with the same 10-fold scoring, some fifty times faster.
"""

import json
import os
import sys
import tempfile

import numpy as np
import pandas as pd

# The checkout's `vidur`, not vidur.py beside this file (the script's folder comes first).
sys.path[0] = os.getcwd()

from vidur.config import (  # noqa: E402
    MetricsConfig,
    RandomForrestExecutionTimePredictorConfig,
    ReplicaConfig,
    VllmSchedulerConfig,
)
from vidur.entities import Batch, Request  # noqa: E402
from vidur.execution_time_predictor.random_forrest_execution_time_predictor import (  # noqa: E402
    RandomForrestExecutionTimePredictor,
)

MODEL = "meta-llama/Llama-2-70b-hf"
DEVICE, NETWORK = "a100", "a100_dgx"  # splitwise's DGX-A100 (NVSwitch)
OUTPUT_TOKENS = 128  # splitwise's token_size: 127 decode iterations after the prefill
ATTENTION_MODELS = ("attn_prefill", "attn_decode", "attn_kv_cache_save")
GRANULARITY = 64  # Vidur's kv_cache_prediction_granularity (its default)
ONE = {"num_estimators": [250], "max_depth": [32], "min_samples_split": [2]}


class Zero:
    """Stands in for an attention model whose profile the checkout lacks."""

    def predict(self, features):
        return np.zeros(len(features))

    def __repr__(self):
        return "Zero()"


class Predictor(RandomForrestExecutionTimePredictor):
    """Vidur's predictor, its forests seeded; where `attention.csv` is missing, its terms
    are zero."""

    def _load_attention_df(self, file_path):
        if os.path.exists(file_path):
            return super()._load_attention_df(file_path)
        return pd.DataFrame(columns=["prefill_chunk_size", "batch_size", "kv_cache_size"])

    def _train_model(self, model_name, df, feature_cols, target_col):
        if model_name in ATTENTION_MODELS and not os.path.exists(self._attention_input_file):
            return Zero()
        # Vidur seeds no forest: each starts from the same seed, so that a forest is the same
        # whichever others came from its cache (the cross-validation's own fits run in
        # worker processes, so a grid of several points may still pick differently).
        np.random.seed(0)
        return super()._train_model(model_name, df, feature_cols, target_col)


def predictor(tp, max_tokens, max_prompt, folder, cache_dir, grid, attention_csv):
    more = dict(ONE) if grid == "one" else {}
    if attention_csv:
        more["attention_input_file"] = attention_csv
    config = RandomForrestExecutionTimePredictorConfig(
        # Vidur predicts from tables over 1..max tokens (and KV up to it) and prefill chunks
        # up to the longest prompt: cover the longest iteration and prompt asked. Its
        # profile's range is reported apart (`profiled_tokens`).
        prediction_max_tokens_per_request=max_tokens,
        prediction_max_prefill_chunk_size=max_prompt, **more)
    replica = ReplicaConfig(model_name=MODEL, tensor_parallel_size=tp, device=DEVICE,
                            network_device=NETWORK)
    metrics = MetricsConfig(output_dir=folder, cache_dir=cache_dir)
    return Predictor(config, replica, VllmSchedulerConfig(), metrics)


def iteration_s(model, requests, num_tokens):
    return model.get_execution_time(Batch(0, requests, num_tokens), 0).total_time


def price(model, prompt_tokens, batch_size):
    """(prefill s, mean decode iteration s) of `batch_size` prompts of `prompt_tokens`."""
    requests = [Request(0.0, prompt_tokens, OUTPUT_TOKENS) for _ in range(batch_size)]
    prefill_s = iteration_s(model, requests, [prompt_tokens] * batch_size)
    for request in requests:
        request.on_batch_end(0.0, prompt_tokens)  # prefill done: prompt + 1 tokens held
    steps = []
    for _ in range(OUTPUT_TOKENS - 1):
        steps.append(iteration_s(model, requests, [1] * batch_size))
        for request in requests:
            request.on_batch_end(0.0, 1)
    return prefill_s, float(np.mean(steps))


def profiled_tokens(model):
    frame = model._load_compute_df(model._compute_input_file)
    return int(frame["num_tokens"].max())


def main():
    request_path, out_path, cache_dir = sys.argv[1:4]
    request = json.load(open(request_path))
    points, grid = request["points"], request.get("grid", "default")
    if grid not in ("default", "one"):
        sys.exit(f"grid = {grid!r}: expected 'default' or 'one'")
    longest = max(max(p["prompt_size"] * p["batch_size"], p["prompt_size"] + OUTPUT_TOKENS)
                  for p in points)
    max_tokens = -(-longest // GRANULARITY) * GRANULARITY
    max_prompt = max(p["prompt_size"] for p in points)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for tp in sorted({p["tensor_parallel"] for p in points}):
            model = predictor(tp, max_tokens, max_prompt, folder, cache_dir, grid,
                              request.get("attention_csv", {}).get(str(tp)))
            attention = os.path.exists(model._attention_input_file)
            profiled = profiled_tokens(model)
            for p in points:
                if p["tensor_parallel"] != tp:
                    continue
                prefill_s, decode_s = price(model, p["prompt_size"], p["batch_size"])
                rows.append({**p, "prompt_sim_s": prefill_s, "token_sim_s": decode_s,
                             "attention": attention, "profiled_tokens": profiled})
    json.dump(rows, open(out_path, "w"))


if __name__ == "__main__":
    main()
