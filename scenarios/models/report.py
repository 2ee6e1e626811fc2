"""results/models/: a dense model against a mixture-of-experts model of the same active
size, and a large MoE at expert parallelism 1, 8 and 16.

    python scenarios/models/report.py            # under 2 minutes on two cores (76-107 s on 2026-12-04)

Runs scenarios/models/dense_vs_moe.yaml for Llama-3.2-3B (dense, 3.21B) and Qwen3-30B-A3B
(MoE, 30.5B total, 3.35B active) across arrival rates, under Orca and vLLM's paged
scheduler, on one H100-80GB in bf16, and again with the MoE's weights in fp8. Reports what
`orcasim model` derives (weights, KV bytes a token, KV capacity) and each run's throughput,
latency, batch size and saturation. Then scenarios/models/expert_parallel.yaml: DeepSeek-V3
in fp8 on H200s at EP 1 (TP 8), EP 8 (8 data-parallel attention groups) and EP 16 (16
groups over two nodes), and EP 16 again under a skewed router. Writes
results/models/README.md, models.csv and expert_parallel.csv.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orcasim.cost.catalog import HardwareConfig, ModelSpec, model_figures  # noqa: E402
from orcasim.run import run_scenario  # noqa: E402
from orcasim.saturation import behind_at_constant_rate  # noqa: E402
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
EP_SCENARIO = ROOT / "scenarios" / "models" / "expert_parallel.yaml"
EP_RATES = (2.0, 4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0)
VLLM_MAX_NUM_SEQS, VLLM_MAX_BATCHED_TOKENS = 256, 9216  # each group's, as in the scenario
EP_SKEW = 1.0  # a sensitivity, not a measured router: Zipf popularity with exponent 1


def _layout(tp: int, groups: int, skew: float = 0.0) -> tuple[str, ...]:
    """Overrides for `groups` data-parallel attention groups of `tp` GPUs: each group's own
    vLLM limits (and Orca's batch) add up over the groups, one scheduler for them all."""
    return (f"hardware.tensor_parallel={tp}", f"hardware.data_parallel_attention={groups}",
            f"hardware.expert_parallel={1 if groups == 1 else tp * groups}",
            f"systems[0].scheduler.max_batch_size={VLLM_MAX_NUM_SEQS * groups}",
            f"systems[1].scheduler.max_num_seqs={VLLM_MAX_NUM_SEQS * groups}",
            f"systems[1].scheduler.max_num_batched_tokens={VLLM_MAX_BATCHED_TOKENS * groups}",
            f"cost.expert_routing_skew={skew}")


LAYOUTS = {  # label: (GPUs, overrides)
    "EP 1 (TP 8)": (8, _layout(8, 1)),
    "EP 8 (DP 8)": (8, _layout(1, 8)),
    "EP 16 (DP 16, 2 nodes)": (16, _layout(1, 16)),
    f"EP 16, skewed router (Zipf {EP_SKEW:g})": (16, _layout(1, 16, EP_SKEW)),
}
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


def _sweep(scenario: Path, overrides: tuple[str, ...], rates: tuple[float, ...]) -> Iterator[dict]:
    """One row per rate and system: the rate, the system and its summary."""
    for rate in rates:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # saturation is in the table
            result = run_scenario(scenario, (*overrides, f"workload.arrival.rate_per_s={rate}"),
                                  base_dir=scenario.parent)
        for system, r in result.systems.items():
            row = {c: r.summary[c] for c in COLUMNS}
            # One constant rate a run, read as the capacity search reads its runs: requests
            # piling up with no waiting queue (data-parallel groups admit the backlog) is
            # falling behind too (vLLM at EP 8 served 17.3 of 20 req/s and read as stable).
            row["saturated"] = float(behind_at_constant_rate(r.summary))
            yield {"system": system, "rate_per_s": rate, **row}


def runs() -> pd.DataFrame:
    rows = []
    for label, keys in MODELS.items():
        overrides = tuple(f"model.{k}={v}" for k, v in keys.items())
        rows += [{"model": label, **row} for row in _sweep(SCENARIO, overrides, RATES)]
    return pd.DataFrame(rows)


def ep_shapes() -> pd.DataFrame:
    """What each layout holds per GPU, and a decode step of 64 requests per group."""
    from orcasim.cost import build_cost_model
    from orcasim.cost.base import Batch
    from orcasim.scenario import load_scenario

    rows = []
    for label, (gpus, overrides) in LAYOUTS.items():
        scenario = load_scenario(EP_SCENARIO, overrides)
        assert scenario.model is not None and scenario.hardware is not None
        f = model_figures(scenario.model, scenario.hardware)
        groups = scenario.hardware.data_parallel_attention
        cost = build_cost_model(scenario.cost, scenario.deployment())
        size = 64 * groups
        step_s = cost.iteration_time_s(Batch(np.ones(size, dtype=np.int64), np.full(size, 2048, dtype=np.int64)))
        rows.append({"layout": label, "gpus": gpus, "weights_per_gpu_gb": f["weight_bytes_per_gpu"] / 1e9,
                     "kv_capacity_tokens": f["kv_capacity_tokens"],
                     "decode_step_ms_64_per_group": step_s * 1e3,
                     "decode_tokens_per_s_per_gpu": size / step_s / gpus})
    return pd.DataFrame(rows)


def ep_runs() -> pd.DataFrame:
    rows = []
    for label, (gpus, overrides) in LAYOUTS.items():
        rows += [{"layout": label, **row, "tokens_per_s_per_gpu": row["throughput_tokens_per_s"] / gpus}
                 for row in _sweep(EP_SCENARIO, overrides, EP_RATES)]
    return pd.DataFrame(rows)


def ep_findings(shape: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """The expert-parallel table's story, read off it."""
    shape = shape.set_index("layout")
    labels = list(LAYOUTS)
    vllm = table[(table["system"] == "vllm") & (table["saturated"] == 0)]
    best = vllm.groupby("layout")["rate_per_s"].max()
    best_tokens = vllm.groupby("layout")["tokens_per_s_per_gpu"].max()
    low = table[(table["system"] == "vllm") & (table["rate_per_s"] == EP_RATES[0])].set_index("layout")
    return [
        f"- Memory: at EP 1 every GPU holds an eighth of every weight but those vLLM keeps whole on each rank, MLA's down-projections, norms and routers ({shape.loc[labels[0], 'weights_per_gpu_gb']:.0f} GB) "
        f"and, MLA's latent being whole on every tensor-parallel rank, one GPU's worth of KV for the "
        f"whole node ({shape.loc[labels[0], 'kv_capacity_tokens']:,.0f} tokens); eight data-parallel groups "
        f"hold the attention whole ({shape.loc[labels[1], 'weights_per_gpu_gb']:.0f} GB a GPU) but each keeps "
        f"its own requests' KV: {shape.loc[labels[1], 'kv_capacity_tokens']:,.0f} tokens, and "
        f"{shape.loc[labels[2], 'kv_capacity_tokens']:,.0f} over 16 GPUs.",
        f"- Latency at low load ({EP_RATES[0]:g} req/s, vLLM): TPOT p50 "
        + ", ".join(f"{label} {low.loc[label, 'tpot_s_p50'] * 1e3:.0f} ms" for label in labels[:3])
        + ". A small batch is bound by reading weights: the experts' are spread over 8 or 16 GPUs "
        "(EP 16 reads half of what EP 8 does a GPU), while a data-parallel group reads its "
        "attention and dense layers whole where TP 8 reads an eighth; EP 16's two all-to-alls per "
        "MoE layer cross InfiniBand but carry few tokens. A prompt runs on one group's GPU, where "
        "TP 8 splits it over eight, and every group's decodes wait for it at each MoE layer.",
        f"- Orca reserves max_tokens ({9216:,}) a request: at EP 1 the node's KV holds "
        f"{int(shape.loc[labels[0], 'kv_capacity_tokens']) // 9216} of them (its batch mean at saturation "
        f"{table[(table['layout'] == labels[0]) & (table['system'] == 'orca')]['batch_size_mean'].max():.0f}), "
        "so it saturates first; data-parallel groups' pooled KV lifts that limit.",
        "- Throughput: highest swept rate without saturation under vLLM (grid "
        + ", ".join(f"{r:g}" for r in EP_RATES) + " req/s): "
        + "; ".join(f"{label} {best.get(label, float('nan')):g} req/s" for label in labels)
        + "; output tokens/s per GPU there " + "; ".join(
            f"{label} {best_tokens.get(label, float('nan')):,.0f}" for label in labels) + ".",
        f"- A skewed router (Zipf {EP_SKEW:g}, most popular experts spread round-robin over ranks) "
        "loads one rank more than the rest, and every rank waits for it: the same fleet saturates "
        "earlier.",
        "- Assumed, not measured: one scheduler over the data-parallel groups' pooled KV, each "
        "group a 1/DP share of every iteration's attention and dense work or, where more, its "
        "largest request's own (the imbalance an engine's placement leaves beyond that is not "
        "modelled); uniform routing unless stated; "
        "no expert-parallel load balancer's redundant experts; dispatch in fp8 (the experts' W8A8 "
        "GEMMs), combine in bf16, one message per (token, expert) pair.",
    ]


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
        "- On one GPU the experts are not split at all; expert parallelism is the next section.",
    ]
    return lines


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    shape, table = shapes(), runs()
    table.to_csv(OUT / "models.csv", index=False)
    ep_shape, ep_table = ep_shapes(), ep_runs()
    ep_table.to_csv(OUT / "expert_parallel.csv", index=False)
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
        "# Expert parallelism: DeepSeek-V3 at EP 1, 8 and 16",
        "",
        "`scenarios/models/expert_parallel.yaml`: DeepSeek-V3 in fp8 on H200s, ShareGPT lengths,",
        "Poisson arrivals, the roofline cost, under Orca and vLLM's paged scheduler; each",
        "data-parallel group's vLLM limits (256 sequences, 9,216 tokens an iteration) add up.",
        "",
        *section("What it shows", ep_findings(ep_shape, ep_table)),
        *section("The layouts", markdown_table(ep_shape)),
        *section("Runs", markdown_table(ep_table)),
    ]
    write_readme(OUT / "README.md", lines)


if __name__ == "__main__":
    main()
