"""results/models/: a dense model against a mixture-of-experts model of the same active size.

    python scenarios/models/report.py            # about 3 minutes on two cores

Runs scenarios/models/dense_vs_moe.yaml for Llama-3.2-3B (dense, 3.21B) and Qwen3-30B-A3B
(MoE, 30.5B total, 3.35B active) across arrival rates, under Orca and vLLM's paged
scheduler, on one H100-80GB in bf16, and again with the MoE's weights in fp8. Reports what
`orcasim model` derives (weights, KV bytes a token, KV capacity) and each run's throughput,
latency, batch size and saturation. Writes results/models/README.md and models.csv.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orcasim.cost.catalog import HardwareConfig, ModelSpec, model_figures  # noqa: E402
from orcasim.run import run_scenario  # noqa: E402
from scenarios.markdown import markdown_table, section, write_readme  # noqa: E402

OUT = ROOT / "results" / "models"
SCENARIO = ROOT / "scenarios" / "models" / "dense_vs_moe.yaml"
MODELS = {  # label: model keys
    "llama-3.2-3b (dense)": {"hf_config": "hf_configs/llama-3.2-3b/config.json"},
    "qwen3-30b-a3b (MoE)": {"hf_config": "hf_configs/qwen3-30b-a3b/config.json"},
    "qwen3-30b-a3b (MoE, fp8)": {"hf_config": "hf_configs/qwen3-30b-a3b/config.json",
                                 "weight_dtype": "fp8"},
}
RATES = (1.0, 2.0, 4.0, 8.0, 12.0)
COLUMNS = ("throughput_rps", "throughput_tokens_per_s", "ttft_s_p50", "tpot_s_p50",
           "batch_size_mean", "saturated")


def shapes() -> pd.DataFrame:
    hw = HardwareConfig(gpu="h100-80gb")
    rows = []
    for label, keys in MODELS.items():
        f = model_figures(ModelSpec.model_validate(keys), hw)
        rows.append({"model": label, "parameters_b": f["parameters"] / 1e9,
                     "active_b": f["active_parameters"] / 1e9, "weights_gb": f["weight_bytes"] / 1e9,
                     "kv_bytes_per_token": f["kv_bytes_per_token"],
                     "kv_capacity_tokens": f["kv_capacity_tokens"]})
    return pd.DataFrame(rows)


def runs() -> pd.DataFrame:
    rows = []
    for label, keys in MODELS.items():
        overrides = tuple(f"model.{k}={v}" for k, v in keys.items())
        for rate in RATES:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # saturation is in the table
                result = run_scenario(SCENARIO, (*overrides, f"workload.arrival.rate_per_s={rate}"),
                                      base_dir=SCENARIO.parent)
            for system, r in result.systems.items():
                rows.append({"model": label, "system": system, "rate_per_s": rate,
                             **{c: r.summary[c] for c in COLUMNS}})
    return pd.DataFrame(rows)


def findings(shape: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """The table's story, read off it (so that it is what this run measured)."""
    kept = table[table["saturated"] == 0]
    best = kept.groupby(["model", "system"])["rate_per_s"].max()
    dense, moe = shape.iloc[0], shape.iloc[1]
    first = table[table["rate_per_s"] == RATES[0]].set_index(["model", "system"])
    low = first["tpot_s_p50"]
    moe_spec = ModelSpec.model_validate(MODELS[moe["model"]]).moe
    assert moe_spec is not None
    batch = float(first.loc[(moe["model"], "vllm"), "batch_size_mean"])
    hit = moe_spec.num_experts * (1 - (1 - moe_spec.experts_per_token / moe_spec.num_experts) ** batch)
    lines = [
        f"- Same active size, different memory: the MoE's {moe['weights_gb']:.0f} GB of weights leave "
        f"{moe['kv_capacity_tokens']:,.0f} tokens of KV against the dense model's "
        f"{dense['kv_capacity_tokens']:,.0f}, so far fewer requests run at once.",
        f"- At {RATES[0]:g} req/s (decode batches of about {batch:.1f}) a MoE step reads the experts "
        f"its tokens chose, about {hit:.0f} of {moe_spec.num_experts} per layer (E (1 - (1 - k/E)^N) "
        f"under uniform routing), already more bytes than the whole dense model: TPOT p50 "
        f"{low[(moe['model'], 'vllm')] * 1e3:.1f} ms against {low[(dense['model'], 'vllm')] * 1e3:.1f} ms.",
        "- Highest swept rate without saturation: " + "; ".join(
            f"{m} {s} {r:g} req/s" for (m, s), r in best.items()) + ".",
        "- Not modelled here: expert parallelism (the MoE's experts are split by tensor",
        "  parallelism; on one GPU there is none), skewed routing, fp8 attention.",
    ]
    return lines


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    shape, table = shapes(), runs()
    table.to_csv(OUT / "models.csv", index=False)
    lines = [
        "# Dense against mixture-of-experts",
        "",
        "Written by `python scenarios/models/report.py`: Llama-3.2-3B (dense) and Qwen3-30B-A3B",
        "(MoE, the same active size), from their Hugging Face configs, on one H100-80GB",
        "(`scenarios/models/dense_vs_moe.yaml`: ShareGPT lengths, Poisson arrivals, the roofline",
        "cost), under Orca (batch 64, reserving max_tokens) and vLLM's paged scheduler.",
        "",
        *section("What it shows", findings(shape, table)),
        *section("The models on one H100-80GB (`orcasim model ... --gpu h100-80gb`)",
                 markdown_table(shape)),
        *section("Runs", markdown_table(table)),
    ]
    write_readme(OUT / "README.md", lines)


if __name__ == "__main__":
    main()
