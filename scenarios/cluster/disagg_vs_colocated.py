"""Disaggregated against colocated serving at equal GPU count: SLO attainment by rate.

    python scenarios/cluster/disagg_vs_colocated.py     # writes results/cluster/ (seconds)

Runs `disagg_vs_colocated.yaml` (three GPUs each way) at each rate of `RATES_PER_S` (its
300 requests replayed at rate / `TRACE_RATE_PER_S` times their measured speed) and scores
the share of requests that meet both of DistServe's chatbot
SLOs for OPT-13B on ShareGPT (TTFT <= 0.25 s, TPOT <= 0.1 s: the `opt-13b-sharegpt` row of
DistServe's evaluation/ae-scripts/e2e/_plot.py). A system's goodput is the highest rate at
which at least 90% of requests meet both (DistServe's definition), read off the sweep by
linear interpolation between the two rates around 90%, per GPU.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orcasim.results import save_figure  # noqa: E402
from orcasim.run import run_scenario  # noqa: E402
from orcasim.slo import within  # noqa: E402
from orcasim.warmup import measured_requests  # noqa: E402

HERE = Path(__file__).parent
SCENARIO = HERE / "disagg_vs_colocated.yaml"
OUT = ROOT / "results" / "cluster"
# 0.06 req/s (0.02 per GPU) is nearly idle: what the prompts alone cost, before any queueing.
RATES_PER_S = (0.06, 1.5, 3.0, 4.5, 6.0, 7.5, 9.0, 10.5, 12.0)
GPUS = 3
COLOCATED, DISAGGREGATED = "vllm-x3", "distserve-c21d11"
TRACE_RATE_PER_S = 3.0  # the replayed run's own rate
TTFT_SLO_S, TPOT_SLO_S = 0.25, 0.1
ATTAINMENT = 0.9


def attainment(reqs: pd.DataFrame, warmup_s: float) -> dict[str, float]:
    done = measured_requests(reqs, warmup_s)
    # `slo.within`, as `orcasim run --slo` scores a bound (up to the clock's rounding).
    ttft_ok = pd.Series(within(done["ttft_s"].to_numpy(), TTFT_SLO_S), index=done.index)
    # A one-token request has no TPOT: it meets that SLO by definition.
    tpot_ok = done["tpot_s"].isna() | pd.Series(within(done["tpot_s"].to_numpy(), TPOT_SLO_S),
                                                index=done.index)
    return {"attainment": float((ttft_ok & tpot_ok).mean()),
            "ttft_attainment": float(ttft_ok.mean()), "tpot_attainment": float(tpot_ok.mean()),
            "ttft_p90_s": float(done["ttft_s"].quantile(0.9)),
            "tpot_p90_s": float(done["tpot_s"].quantile(0.9)),
            # Whether prompt length alone parts the TTFT misses from the rest: it does where
            # the shortest missing prompt is longer than the longest meeting one.
            "ttft_miss_prompt_tokens_min": float(done["prompt_tokens"][~ttft_ok].min()),
            "ttft_met_prompt_tokens_max": float(done["prompt_tokens"][ttft_ok].max())}


def sweep() -> pd.DataFrame:
    rows = []
    for rate in RATES_PER_S:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = run_scenario(SCENARIO, (f"workload.arrival.speedup={rate / TRACE_RATE_PER_S}",))
        for name, system in result.systems.items():
            rows.append({"system": name, "rate_per_s": rate, "rate_per_gpu": rate / GPUS,
                         **attainment(system.requests, result.scenario.warmup_s)})
    return pd.DataFrame(rows)


def by_load_lines(table: pd.DataFrame) -> list[str]:
    """What the table says at the two ends of the load: the colocated system's misses when
    nearly idle, and the rate per GPU from which it meets both SLOs at least as often as the
    disaggregated one (at that rate and every higher one tried), with the two TPOT tails at
    the highest rate. DistServe's case rests on TTFT here; its one decode instance is the
    first to saturate."""
    colo = table[table["system"] == COLOCATED].set_index("rate_per_gpu")
    disagg = table[table["system"] == DISAGGREGATED].set_index("rate_per_gpu")
    idle = colo.index[0]
    lines = [f"At {idle:.2f} req/s per GPU, nearly idle, {COLOCATED} misses the TTFT bound for "
             f"{1 - colo['ttft_attainment'][idle]:.1%} of requests, {DISAGGREGATED} for "
             f"{1 - disagg['ttft_attainment'][idle]:.1%}."]
    miss_min, met_max = colo["ttft_miss_prompt_tokens_min"][idle], colo["ttft_met_prompt_tokens_max"][idle]
    if miss_min > met_max:
        lines[0] += (f" Prompt length alone parts them there: {COLOCATED}'s misses are its prompts "
                     f"of {miss_min:,.0f} tokens or more, its longest prompt on time "
                     f"{met_max:,.0f}, prefilled on one GPU where {DISAGGREGATED} uses two.")
    ahead = (colo["attainment"] >= disagg["attainment"]).to_numpy()
    behind = np.nonzero(~ahead)[0]
    first = int(behind[-1]) + 1 if len(behind) else 0
    top = colo.index[-1]
    if first < len(ahead):
        rate = colo.index[first]
        lines.append(
            f"From {rate:.2f} req/s per GPU on, {COLOCATED} meets both SLOs at least as often "
            f"({colo['attainment'][rate]:.1%} against {disagg['attainment'][rate]:.1%} there); at "
            f"{top:.2f} its TPOT p90 is {colo['tpot_p90_s'][top]:.3f} s against "
            f"{disagg['tpot_p90_s'][top]:.3f} s, where {DISAGGREGATED}'s decode instance carries "
            "every decode.")
    else:
        lines.append(f"At {top:.2f} req/s per GPU, the highest rate tried, {DISAGGREGATED} still "
                     "meets both SLOs more often.")
    return lines


def goodput_per_gpu(rows: pd.DataFrame) -> float:
    """The highest per-GPU rate with attainment >= 90%, interpolated; NaN if none."""
    rates, share = rows["rate_per_gpu"].to_numpy(), rows["attainment"].to_numpy()
    if share[0] < ATTAINMENT:
        return float("nan")
    above = np.nonzero(share >= ATTAINMENT)[0]
    k = int(above[-1])
    if k == len(rates) - 1:
        return float(rates[k])  # still meeting it at the highest rate tried
    r0, r1, s0, s1 = rates[k], rates[k + 1], share[k], share[k + 1]
    return float(r0 + (s0 - ATTAINMENT) * (r1 - r0) / (s0 - s1))


GROUND_TRUTH = ROOT / "orcasim" / "data" / "ground_truth" / "distserve_opt13b_a100"
# The real runs at comparable per-GPU rates: vLLM on one GPU, DistServe on three.
MEASURED = {"vllm-100-1": ("vllm (one GPU)", 1), "vllm-100-2": ("vllm (one GPU)", 1),
            "vllm-200-2": ("vllm (one GPU)", 1), "vllm-300-3": ("vllm (one GPU)", 1),
            **{f"distserve-c21d11-300-{r}": ("distserve-c21d11", GPUS) for r in (3, 6, 9, 12)}}


def measured() -> pd.DataFrame:
    """SLO attainment of the real runs, by the same rule (whole runs, no warm-up)."""
    rows = []
    for run, (system, gpus) in MEASURED.items():
        reqs = pd.read_csv(GROUND_TRUTH / f"{run}.csv")
        rate = float(run.rsplit("-", 1)[1])
        rows.append({"run": run, "system": system, "rate_per_gpu": rate / gpus,
                     **attainment(reqs.assign(arrival_s=0.0), 0.0)})
    return pd.DataFrame(rows)


def figure(table: pd.DataFrame, real: pd.DataFrame) -> Figure:
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.subplots()
    for name, rows in table.groupby("system", sort=False):
        ax.plot(rows["rate_per_gpu"], rows["attainment"] * 100, marker="o", label=f"{name} (orcasim)")
    for name, rows in real.groupby("system", sort=False):
        ax.scatter(rows["rate_per_gpu"], rows["attainment"] * 100, marker="x", s=60, zorder=3,
                   label=f"{name}: measured")
    ax.axhline(ATTAINMENT * 100, color="k", linestyle="--", linewidth=1)
    ax.set_xlabel("request rate per GPU (req/s)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title(f"OPT-13B, 3 A100s: TTFT <= {TTFT_SLO_S} s and TPOT <= {TPOT_SLO_S} s")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    table, real = sweep(), measured()
    table.to_csv(OUT / "disagg_vs_colocated.csv", index=False)
    save_figure(figure(table, real), OUT / "disagg_vs_colocated.png")
    goodput = {name: goodput_per_gpu(rows) for name, rows in table.groupby("system", sort=False)}
    lines = ["# Disaggregated against colocated serving, equal GPU count", "",
             "Written by `python scenarios/cluster/disagg_vs_colocated.py` from "
             "`scenarios/cluster/disagg_vs_colocated.yaml`: OPT-13B on three A100-80GBs, as "
             "three vLLM v0.2.3 replicas or as DistServe's TP-2 prefill + TP-1 decode, each "
             "with the engine terms calibrated on its own real runs. Attainment: the share of "
             f"requests with TTFT <= {TTFT_SLO_S} s and TPOT <= {TPOT_SLO_S} s (DistServe's "
             "chatbot SLOs for OPT-13B).", "",
             "| system | goodput per GPU at 90% attainment (req/s) |", "|---|---:|"]
    best = table.groupby("system", sort=False)["attainment"].max()
    lines += [f"| {name} | {value:.2f} |" if np.isfinite(value) else
              f"| {name} | none: below 90% at every rate tried (at most {best[name]:.1%}) |"
              for name, value in goodput.items()]
    lines += ["", *by_load_lines(table)]
    lines += ["", "| system | rate per GPU | attainment | TTFT p90 (s) | TPOT p90 (s) |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| {r.system} | {r.rate_per_gpu:.2f} | {r.attainment:.1%} | {r.ttft_p90_s:.3f} "
              f"| {r.tpot_p90_s:.3f} |" for r in table.itertuples()]
    lines += ["", "The real runs, scored by the same rule (crosses in `disagg_vs_colocated.png`; "
              "vLLM's ran on one GPU, so its rate is already per GPU):", "",
              "| run | rate per GPU | attainment | TTFT p90 (s) | TPOT p90 (s) |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| {r.run} | {r.rate_per_gpu:.2f} | {r.attainment:.1%} | {r.ttft_p90_s:.3f} "
              f"| {r.tpot_p90_s:.3f} |" for r in real.itertuples()]
    (OUT / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
