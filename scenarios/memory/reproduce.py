"""Reproduce, qualitatively, the vLLM paper's memory comparison on OPT-13B / A100-40GB.

    .venv/bin/python scenarios/memory/reproduce.py            # full sweep (about 80 s on 2 cores, 2026-12-04)
    .venv/bin/python scenarios/memory/reproduce.py --quick    # three rates, for a smoke run
    .venv/bin/python scenarios/memory/reproduce.py --from-csv # only redraw from sweep.csv

It (re)writes the request trace beside the scenario (deterministic: fixed seed), runs
every system of `opt13b_a100_sharegpt.yaml` at each request rate, and writes
results/memory/: `sweep.csv` (one row per system and rate), `normalized_latency.png`,
and `README.md` with our batch sizes and KV utilisation beside the paper's.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from orcasim.paths import PACKAGE_DATA_DIR  # noqa: E402
from orcasim.run import run_scenario  # noqa: E402

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "opt13b_a100_sharegpt.yaml"
TRACE = HERE / "sharegpt_opt13b_poisson_1rps.csv"
RESULTS = HERE.parent.parent / "results" / "memory"
SHAREGPT = PACKAGE_DATA_DIR / "traces" / "sharegpt_lengths_llama2.csv"
NUM_REQUESTS = 1000
TRACE_SEED = 0
RATES_PER_S = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5)
QUICK_RATES_PER_S = (0.5, 1.0, 2.0)
TABLE_RATE_PER_S = 2.0
# Kwon et al., SOSP 2023: Figure 13a (mean batched requests, OPT-13B, ShareGPT) and
# Figure 2 (share of KV memory holding token states). The paper's "vLLM" is our paged.
PAPER_BATCH = {"orca-max": 7.00, "orca-pow2": 9.81, "orca-oracle": 13.62, "vllm": 30.42}
PAPER_KV_USED = {"orca-max": 0.204, "orca-pow2": 0.268, "orca-oracle": 0.382, "vllm": 0.963}
COLUMNS = [
    "normalized_latency_s_per_token_mean", "batch_size_mean", "kv_utilization_mean",
    "preemptions", "recomputed_tokens", "tpot_s_p99", "requests_completed", "requests_rejected",
]


def write_trace(path: Path = TRACE, n: int = NUM_REQUESTS, seed: int = TRACE_SEED) -> pd.DataFrame:
    """ShareGPT (prompt, output) pairs drawn together, pruned as vLLM's benchmark prunes, at 1 req/s."""
    lengths = pd.read_csv(SHAREGPT)
    prompt, output = lengths["num_prefill_tokens"], lengths["num_decode_tokens"]
    # vLLM benchmarks/benchmark_serving.py: drop prompts < 4 or > 1024, outputs < 4, totals > 2048.
    keep = lengths[(prompt >= 4) & (prompt <= 1024) & (output >= 4) & (prompt + output <= 2048)]
    rng = np.random.default_rng(seed)
    rows = keep.iloc[rng.integers(0, len(keep), n)]
    arrival_s = np.cumsum(rng.exponential(1.0, n))
    trace = pd.DataFrame({
        "arrival_s": np.round(arrival_s - arrival_s[0], 6),
        "prompt_tokens": rows["num_prefill_tokens"].to_numpy(),
        "output_tokens": rows["num_decode_tokens"].to_numpy(),
    })
    trace.to_csv(path, index=False)
    return trace


def run_rate(rate_per_s: float) -> pd.DataFrame:
    """Every system at one rate: one summary row per system."""
    # Reference mode: one row per iteration, so that the p99 below is an iteration's (a fast
    # mode row covers a plan and the decode steps after it, averaging the stall away).
    result = run_scenario(SCENARIO, (f"workload.arrival.speedup={rate_per_s}",
                                     "engine.mode=reference"))
    frame = result.summary_frame()[COLUMNS]
    # The longest iterations are the stalls that chunked prefill bounds.
    frame["iteration_s_p99"] = [
        float(np.percentile(r.iterations["duration_s"], 99)) for r in result.systems.values()
    ]
    return frame.rename_axis("system").reset_index().assign(rate_per_s=rate_per_s)


def sweep(rates_per_s: tuple[float, ...], workers: int) -> pd.DataFrame:
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return pd.concat(pool.map(run_rate, rates_per_s), ignore_index=True)


def latency_figure(df: pd.DataFrame) -> Figure:
    """Mean normalized latency (s/token) against request rate, one line per system."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for system, rows in df.groupby("system", sort=False):
        ax.plot(rows["rate_per_s"], rows["normalized_latency_s_per_token_mean"], marker="o",
                label=str(system))
    ax.set_xlabel("request rate (requests/s)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.set_ylim(0, 1.0)
    ax.set_title("OPT-13B, A100-40GB (simulated), ShareGPT lengths")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def comparison_table(df: pd.DataFrame, rate_per_s: float) -> str:
    """Markdown: our batch size and KV utilisation at one rate beside the paper's."""
    at = df[np.isclose(df["rate_per_s"], rate_per_s)].set_index("system")
    lines = [
        "| system | batch size (ours) | batch size (paper) | KV holding real tokens (ours) "
        "| (paper) | preemptions | recomputed tokens | p99 TPOT (s) | p99 iteration (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system, row in at.iterrows():
        paper_b = PAPER_BATCH.get(str(system))
        paper_kv = PAPER_KV_USED.get(str(system))
        lines.append(
            f"| {system} | {row['batch_size_mean']:.2f} | "
            f"{'' if paper_b is None else f'{paper_b:.2f}'} | {row['kv_utilization_mean']:.1%} | "
            f"{'' if paper_kv is None else f'{paper_kv:.1%}'} | {int(row['preemptions'])} | "
            f"{int(row['recomputed_tokens'])} | {row['tpot_s_p99']:.3f} | {row['iteration_s_p99']:.3f} |"
        )
    return "\n".join(lines)


def latency_table(df: pd.DataFrame) -> str:
    wide = df.pivot(index="rate_per_s", columns="system",
                    values="normalized_latency_s_per_token_mean")[df["system"].unique()]
    header = "| rate (req/s) | " + " | ".join(wide.columns) + " |"
    rule = "|---:|" + "---:|" * len(wide.columns)
    rows = [f"| {rate:g} | " + " | ".join(f"{v:.3f}" for v in vals) + " |"
            for rate, vals in wide.iterrows()]
    return "\n".join([header, rule, *rows])


def trace_stats(trace: pd.DataFrame) -> str:
    return (f"{len(trace)} requests, mean prompt {trace['prompt_tokens'].mean():.0f} and mean "
            f"output {trace['output_tokens'].mean():.0f} tokens")


def readme(df: pd.DataFrame, trace: pd.DataFrame, rate_per_s: float) -> str:
    """The results page: setup, the figure, both tables and the differences from the paper."""
    return f"""# Memory-aware scheduling: the vLLM paper's comparison, simulated

Written by `scenarios/memory/reproduce.py` from `scenarios/memory/opt13b_a100_sharegpt.yaml`
(its header gives the sources of every number). OPT-13B on one A100-40GB: the catalog's
`opt-13b` and `a100-40gb`, with 15,212 tokens of KV (12.5 GB at 819,200 bytes per token:
vLLM's 0.9 of the 39.50 GiB the GPU reports, less 25.7 GB of weights, the paper's Figure 1
split) and the roofline cost model, whose decode steps agree with
DistServe's measured vLLM fit within 2%. Workload: ShareGPT (prompt, output) pairs
(Llama-2 tokenizer), pruned as vLLM's benchmark prunes (prompt <= 1024, total <= 2048),
{trace_stats(trace)}; Poisson arrivals, the rate swept by rescaling one trace.

Systems: Orca with `max`, `pow2` and `oracle` KV reservation (`iteration_level`), vLLM
(`paged`, 16-token blocks, recompute preemption, max 4,096 batched tokens) and Sarathi-Serve
(`chunked`, 512-token budget, the same paged memory).

![normalized latency against request rate](normalized_latency.png)

## Normalized latency (mean end-to-end latency / output tokens, s/token)

{latency_table(df)}

## Batch size and KV utilisation at {rate_per_s:g} requests/s, beside the paper

At this rate every system is limited by KV memory, not by arrivals. Batch size is the
mean number of requests per iteration; "KV holding real tokens" is the time-average of KV
holding token state over KV allocated (reserved slabs, or whole blocks). The paper's
numbers: Figure 13(a) (batched requests, OPT-13B on ShareGPT) and Figure 2 (share of KV
memory holding token states).

{comparison_table(df, rate_per_s)}

## How this differs from the paper

The ordering is the paper's: every step from Orca(max) to pow2 to oracle to paging
admits more requests and raises the share of KV memory holding real tokens, and the rate
each system sustains before its latency climbs follows the same order. Orca(max)'s batch
is set by its reservation alone, not by the trace: with 15,212 tokens it fits 7 requests
of 2,048, hence the paper's 7.00; oracle depends on the lengths and lands within about 10%
of the paper's ({_at(df, "orca-oracle", rate_per_s, "batch_size_mean"):.2f} against 13.62);
pow2, which rounds each output's room up to a power of two as the paper defines it (32 for
25), lands above it ({_at(df, "orca-pow2", rate_per_s, "batch_size_mean"):.2f} against
9.81): the paper's Pow2 loses 41.6% of its KV to external fragmentation between the slabs
its buddy allocator places (Figure 2), which a count of reserved tokens does not see.
Paging reaches
{_at(df, "vllm", rate_per_s):.1%} utilisation (paper 96.3%): the only waste left is each
request's last, partly filled block. Our Orca utilisations are higher than the paper's
(oracle {_at(df, "orca-oracle", rate_per_s):.1%} against 38.2%) for two reasons we can
name: we count reserved KV as a number of tokens, so there is no external fragmentation
between contiguous slabs, which the paper's Figure 2 includes; and our prompts are longer
({trace['prompt_tokens'].mean():.0f} Llama-2 tokens on average against the paper's 161
OPT tokens), so from admission on more of each reservation holds real tokens. The longer
requests (about {(trace['prompt_tokens'] + trace['output_tokens']).mean():.0f} tokens at
the end, against about 500) are also why our paged batch
({_at(df, "vllm", rate_per_s, "batch_size_mean"):.1f}) stays below the paper's 30.42.
Chunked prefill matches paging until both saturate, then trails it on normalized latency:
its 512-token budget spreads prefills over more iterations, and because it allocates
blocks only for the chunk it schedules it admits more requests and preempts more
({_at(df, "sarathi", rate_per_s, "preemptions"):.0f} recompute preemptions against
{_at(df, "vllm", rate_per_s, "preemptions"):.0f}). What it buys is bounded iterations:
its p99 iteration time is {_at(df, "sarathi", rate_per_s, "iteration_s_p99") * 1e3:.0f} ms
against {_at(df, "vllm", rate_per_s, "iteration_s_p99") * 1e3:.0f} ms, the stall that
Sarathi-Serve removes; its own paper judges it at latency SLOs, not by this metric. The
latencies of overloaded systems grow with the length of the trace ({len(trace)}
requests), so the right-hand side of the figure is qualitative, and the roofline's
prefill is 25-40% faster than DistServe's measurement, which flatters long prompts.
"""


def _at(df: pd.DataFrame, system: str, rate_per_s: float, column: str = "kv_utilization_mean") -> float:
    row = df[(df["system"] == system) & np.isclose(df["rate_per_s"], rate_per_s)]
    return float(row[column].iloc[0])


def write_results(df: pd.DataFrame, trace: pd.DataFrame, out_dir: Path = RESULTS) -> None:
    """The one place that writes files under results/memory/."""
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_dir / "sweep.csv", index=False, float_format="%.6g")
    fig = latency_figure(df)
    fig.savefig(out_dir / "normalized_latency.png", dpi=120)
    plt.close(fig)
    (out_dir / "README.md").write_text(readme(df, trace, TABLE_RATE_PER_S))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three rates only")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--from-csv", action="store_true",
                        help="redraw the figure and README from results/memory/sweep.csv")
    args = parser.parse_args()
    trace = write_trace()
    if args.from_csv:
        df = pd.read_csv(RESULTS / "sweep.csv")
    else:
        df = sweep(QUICK_RATES_PER_S if args.quick else RATES_PER_S, args.workers)
    write_results(df, trace)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
