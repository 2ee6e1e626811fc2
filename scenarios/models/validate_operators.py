"""results/models/operators.md: the roofline's MoE and MLA operators against measured kernels.

    python scenarios/models/validate_operators.py        # a few seconds
    python scenarios/models/validate_operators.py --gpu b200 --moe-table B200/moe_perf.parquet \
        [--mla-table B200/generation_mla_perf.parquet]   # another GPU's tables: printed only

The measurements are NVIDIA aiconfigurator's (Apache-2.0, vendored under
orcasim/data/profiles/aiconfigurator/): vLLM 0.14.0's fused MoE kernel in bf16 with the
experts split by tensor parallelism (no expert parallelism) on an H100-SXM (balanced
routing) and an A100-SXM (power-law routing, exponent 1.01: the only A100 distribution),
and vLLM's MLA decode module (DeepSeek-V3's latent shape, bf16 KV cache) on an H100. Nothing
is fitted: the roofline's defaults (70% of the bf16 peak, 80% of HBM bandwidth, 5 us a
kernel) price each measured shape, and the error is prediction / measurement - 1, reported
by regime (tokens for MoE, KV tokens read for MLA), since where it binds decides whether
the roofline applies.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orcasim.cost.catalog import Deployment, HardwareConfig, ModelSpec  # noqa: E402
from orcasim.cost.flops import expert_op  # noqa: E402
from orcasim.cost.roofline import Roofline, RooflineCostConfig  # noqa: E402
from scenarios.markdown import markdown_table, section, write_readme  # noqa: E402

DATA = ROOT / "orcasim" / "data" / "profiles" / "aiconfigurator"
OUT = ROOT / "results" / "models"
TARGET = 0.15  # the bar: median |error| per operator
MOE_TABLES = {"h100-80gb": DATA / "h100_sxm/moe/vllm/0.14.0/moe_perf.parquet",
              "a100-80gb": DATA / "a100_sxm/moe/vllm/0.14.0/moe_perf.parquet"}
MLA_TABLE = DATA / "h100_sxm/mla/vllm/0.14.0/generation_mla_perf.parquet"
DEEPEP_TABLE = ROOT / "orcasim" / "data" / "profiles" / "deepep" / "low_latency_h800.csv"
# DeepEP's test machine (docs/legacy.md): H800 (an H100 SXM with NVLink cut to 400 GB/s
# both ways), one CX7 400 Gb/s InfiniBand NIC per GPU, 8 GPUs a node.
H800 = {"name": "h800", "peak_flops": 989.4e12, "peak_flops_fp8": 1978.9e12,
        "hbm_bandwidth_bytes_per_s": 3.35e12, "memory_bytes": 85.03e9,  # as an H100 reports it
        "nvlink_bandwidth_bytes_per_s": 400e9, "node_network_bytes_per_s": 50e9}
DEEPEP_TOKENS_PER_RANK = 128
TOKEN_BINS = [0, 64, 256, 1024, 4096, np.inf]
KV_BINS = [0, 1e4, 1e5, 1e6, np.inf]


def _moe_layer(hidden: int, inter: int, topk: int, experts: int) -> ModelSpec:
    """One MoE layer of the measured shape (attention is not timed here)."""
    return ModelSpec(name="moe", num_layers=1, hidden_size=hidden, num_heads=16, num_kv_heads=16,
                     intermediate_size=inter, gated_mlp=True, vocab_size=1000, max_seq_len=4096,
                     positional="rope", tied_embeddings=False, bias=False,
                     moe={"num_experts": experts, "experts_per_token": topk,
                          "expert_intermediate_size": inter})


def moe_errors(gpu: str, path: Path | None = None) -> pd.DataFrame:
    """Every measured fused-MoE shape of `gpu` (its vendored table, or `path`: aiconfigurator's
    moe_perf layout), 16-bit and without expert parallelism, priced by the roofline."""
    table = pd.read_parquet(MOE_TABLES[gpu] if path is None else path)
    table = table[table["moe_dtype"].isin(["bfloat16", "float16"]) & (table["moe_ep_size"] == 1)]
    if table.empty:
        raise SystemExit(f"{path}: no 16-bit rows without expert parallelism to compare")
    frames = []
    for (hidden, inter, topk, experts, tp), rows in table.groupby(
            ["hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size"]):
        model = _moe_layer(int(hidden), int(inter), int(topk), int(experts))
        cost = Roofline(RooflineCostConfig(kind="roofline"),
                        Deployment(model=model, hardware=HardwareConfig(gpu=gpu)))
        op = expert_op(model, int(tp))
        assert op is not None
        n = rows["num_tokens"].to_numpy(dtype=np.float64)
        compute_s = op.flops_per_token * n / cost.gemm_flops_per_s
        memory_s = (op.experts_hit(n) * op.weight_bytes_per_expert + op.bytes_per_token * n) / cost.bytes_per_s
        predicted_ms = (np.maximum(compute_s, memory_s) + op.kernels * cost.cfg.kernel_overhead_s) * 1e3
        frames.append(pd.DataFrame({"num_tokens": n, "compute_bound": compute_s > memory_s,
                                    "error": predicted_ms / rows["latency"].to_numpy() - 1}))
    return pd.concat(frames, ignore_index=True)


def mla_errors(gpu: str = "h100-80gb", path: Path | None = None) -> pd.DataFrame:
    table = pd.read_parquet(MLA_TABLE if path is None else path)
    table = table[table["kv_cache_dtype"].isin(["bfloat16", "float16"])]
    model = ModelSpec.model_validate({"hf_config": "hf_configs/deepseek-v3/config.json"})
    frames = []
    for heads, rows in table.groupby("num_heads"):
        tp = model.num_heads // int(heads)  # the rank's query heads
        cost = Roofline(RooflineCostConfig(kind="roofline"),
                        Deployment(model=model, hardware=HardwareConfig(gpu=gpu, tensor_parallel=tp)))
        # The timed module (vLLM's MLA forward) runs the absorbed per-head matmuls around the
        # kernel: the query into the latent (W_UK) and the output out of it (W_UV).
        absorbed = [op for op in cost.ops if op.name in ("mla_q_absorb", "mla_v_up")]
        predicted_ms = [(float(cost.attention_per_layer_s(np.ones(b, dtype=np.int64),
                                                          np.full(b, s + 1, dtype=np.int64)))
                         + sum(float(cost.op_time_s(op, float(b))) for op in absorbed)) * 1e3
                        for b, s in zip(rows["batch_size"], rows["step"], strict=True)]
        frames.append(pd.DataFrame({
            "kv_tokens_read": (rows["batch_size"] * (rows["step"] + 1)).to_numpy(dtype=np.float64),
            "error": np.array(predicted_ms) / rows["latency"].to_numpy() - 1}))
    return pd.concat(frames, ignore_index=True)


def all_to_all_errors() -> pd.DataFrame:
    """The roofline's expert dispatch and combine against DeepEP's low-latency kernels:
    DeepSeek-V3 in fp8 (hidden 7168, top-8 of 256 experts: FP8 dispatch, BF16 combine),
    data-parallel attention over EP ranks of one GPU each, 128 tokens per rank."""
    table = pd.read_csv(DEEPEP_TABLE)
    model = ModelSpec.model_validate({"hf_config": "hf_configs/deepseek-v3/config.json",
                                      "weight_dtype": "fp8"})
    rows = []
    for ep, dispatch_us, combine_us in table.itertuples(index=False):
        hw = HardwareConfig(gpu=H800, data_parallel_attention=int(ep), expert_parallel=int(ep))
        cost = Roofline(RooflineCostConfig(kind="roofline"), Deployment(model=model, hardware=hw))
        tokens = DEEPEP_TOKENS_PER_RANK * int(ep)
        for name, measured_us, predicted_s in (("dispatch", dispatch_us, cost.expert_dispatch_s(tokens)),
                                                ("combine", combine_us, cost.expert_combine_s(tokens))):
            rows.append({"collective": name, "expert_parallel": int(ep), "measured_us": float(measured_us),
                         "predicted_us": float(predicted_s) * 1e6,
                         "error": float(predicted_s) * 1e6 / measured_us - 1})
    return pd.DataFrame(rows)


def by_regime(errors: pd.DataFrame, column: str, bins: list[float]) -> pd.DataFrame:
    grouped = errors.groupby(pd.cut(errors[column], bins), observed=True)["error"]
    frame = pd.DataFrame({"median error": grouped.median(),
                          "median |error|": grouped.apply(lambda e: e.abs().median()),
                          "shapes": grouped.size()})
    frame.index = [f"{int(i.left)}-{int(i.right) if np.isfinite(i.right) else 'inf'}" for i in frame.index]
    return frame.rename_axis(column).reset_index()


def held_out(gpu: str, moe_table: Path, mla_table: Path | None) -> None:
    """Another GPU's measured tables, scored as the shipped ones are; printed, not written."""
    moe = moe_errors(gpu, moe_table)
    print(f"fused MoE on {gpu}: median |error| {moe['error'].abs().median():.3f} over {len(moe)} shapes, "
          f"{(moe.loc[~moe['compute_bound'], 'error'].abs().median()):.3f} memory-bound")
    print("\n".join(markdown_table(by_regime(moe, "num_tokens", TOKEN_BINS))))
    if mla_table is not None:
        mla = mla_errors(gpu, mla_table)
        kv_bound = mla.loc[mla["kv_tokens_read"] > 1e6, "error"].abs().median()
        print(f"MLA decode on {gpu}: median |error| {mla['error'].abs().median():.3f} over {len(mla)} shapes, "
              f"{kv_bound:.3f} over a million KV tokens read")
        print("\n".join(markdown_table(by_regime(mla, "kv_tokens_read", KV_BINS))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", help="a GPU of the catalog, for another GPU's tables")
    parser.add_argument("--moe-table", type=Path, help="that GPU's moe_perf.parquet (aiconfigurator)")
    parser.add_argument("--mla-table", type=Path, help="that GPU's generation_mla_perf.parquet")
    args = parser.parse_args()
    if args.gpu or args.moe_table:
        if not (args.gpu and args.moe_table):
            parser.error("--gpu and --moe-table go together")
        held_out(args.gpu, args.moe_table, args.mla_table)
        return
    OUT.mkdir(parents=True, exist_ok=True)
    moe = {gpu: moe_errors(gpu) for gpu in MOE_TABLES}
    mla = mla_errors()
    a2a = all_to_all_errors()
    across_nodes = a2a[a2a["expert_parallel"] > 8]
    overall = pd.DataFrame([
        {"operator": f"fused MoE, {gpu}", "median |error|": e["error"].abs().median(),
         "memory-bound shapes": e.loc[~e["compute_bound"], "error"].abs().median(),
         "compute-bound shapes": e.loc[e["compute_bound"], "error"].abs().median(), "shapes": len(e)}
        for gpu, e in moe.items()
    ] + [{"operator": "MLA decode, h100-80gb", "median |error|": mla["error"].abs().median(),
          "memory-bound shapes": mla.loc[mla["kv_tokens_read"] > 1e6, "error"].abs().median(),
          "compute-bound shapes": float("nan"), "shapes": len(mla)},
        {"operator": "expert all-to-all across nodes, h800", "median |error|": across_nodes["error"].abs().median(),
         "memory-bound shapes": float("nan"), "compute-bound shapes": float("nan"),
         "shapes": len(across_nodes)}])
    lines = [
        "# MoE and MLA operators against measured kernels",
        "",
        "Written by `python scenarios/models/validate_operators.py`. " + " ".join(
            (__doc__ or "").split("\n\n")[2].split()),
        "",
        *section(f"Median |error| per operator (the issue's bar: {TARGET:.0%})", markdown_table(overall),
                 "For MLA, \"memory-bound\" is the shapes reading over a million KV tokens."),
        *[part for gpu, e in moe.items() for part in section(
            f"Fused MoE on the {gpu}, by tokens in the batch", markdown_table(by_regime(e, "num_tokens", TOKEN_BINS)))],
        *section("MLA decode on the h100-80gb, by KV tokens read (batch x context)",
                 markdown_table(by_regime(mla, "kv_tokens_read", KV_BINS))),
        *section("Expert dispatch and combine against DeepEP's low-latency kernels (H800, CX7 400 Gb/s)",
                 markdown_table(a2a),
                 "DeepSeek-V3's shape, 128 tokens per rank (deepseek-ai/DeepEP, docs/legacy.md, MIT). The "
                 "roofline sends one message per (token, expert) pair, the in-node share over NVLink "
                 "and the rest over the network at the links' 80%, plus 10 us. Across nodes (EP 16-256) "
                 "it is the network's bandwidth that sets the time, and it agrees; at EP 8 the "
                 "low-latency kernels send over RDMA even inside the node, where the roofline (and "
                 "DeepEP's own normal kernels, 153 GB/s over H800 NVLink against the roofline's 160) "
                 "uses NVLink: not the same transport, reported and not counted above."),
        *section("What is off, and why",
                 "- MoE, large batches: the prediction is too fast, by 40-60% beyond 1,024 tokens. "
                 "The fused MoE kernel's grouped GEMMs (a few hundred rows per expert) reach about a "
                 "third of the bf16 peak, not the 70% a large dense GEMM does; the roofline has one "
                 "compute efficiency for both. A per-operator efficiency would need a source (a "
                 "kernel's measured throughput), not a fit to these tables.",
                 "- MLA, small batches: the timed module costs 0.11-0.17 ms even for one request "
                 "and a short context, whatever its heads (1 to 128 a rank). aiconfigurator's "
                 "collector (collector/vllm/collect_mla.py) times vLLM's MLA forward eagerly, "
                 "with CUDA events around the host's launches, so a small shape measures the host "
                 "launching the module's kernels, which a decode under CUDA graphs (vLLM's default) "
                 "does not pay; the roofline prices the module's GPU work (the absorbed per-head "
                 "matmuls W_UK and W_UV and the attention kernel). Where the KV read dominates "
                 "(over a million KV tokens) it is within a few percent.",
                 "- A100 routing is power-law skewed (exponent 1.01); the roofline assumes uniform "
                 "routing, which hits more experts: its small-batch memory time is an upper bound."),
    ]
    write_readme(OUT / "operators.md", lines)


if __name__ == "__main__":
    main()
