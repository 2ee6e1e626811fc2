"""results/capacity/: SLO attainment real against simulated, and capacity answers.

    python scenarios/capacity/report.py            # about 2 minutes on two cores (90 s on 2026-12-04)

1. Real against simulated attainment. Each real run of DistServe's OPT-13B measurements
   (vLLM v0.2.3 on one A100-80GB; DistServe's disaggregated prefill 2 x decode 1) is scored
   against TTFT <= 0.2 s and TPOT <= 0.1 s (the issue's targets for this setup) and replayed
   through its validation scenario: with the engine overhead fitted on every run, fitted
   with that run left out (the calibration record's `parameters_left_out`), and with none.
2. `orcasim capacity` on the quickstart and on the Orca paper's GPT-3 13B and 175B
   scenarios (normalized latency p50 <= 0.19 s/token, the paper's bound, at attainment
   0.5: the median), beside the sweep's answer in results/orca_paper/.
Writes results/capacity/README.md (the tables), attainment.csv and one folder per
capacity search (capacity.csv, evaluations.csv, attainment.png).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orcasim.fidelity import read_real_run, replay_of  # noqa: E402
from orcasim.run import run_scenario  # noqa: E402
from orcasim.scenario import load_scenario  # noqa: E402
from orcasim.slo import SLOConfig, attains  # noqa: E402
from orcasim.sweeps import keeps_up, throughput_under_bound  # noqa: E402

OUT = ROOT / "results" / "capacity"
VALIDATION = ROOT / "scenarios" / "validation"
TRUTH = ROOT / "orcasim" / "data" / "ground_truth" / "distserve_opt13b_a100"
SLO = SLOConfig(targets=["ttft_p90 <= 0.2", "tpot_p90 <= 0.1"], attainment=0.9)
SETUPS = {  # scenario, system, real runs, calibration record, where its overhead lives
    "vllm": ("vllm_opt13b_a100.yaml", "vllm-v0.2.3",
             [f"vllm-{r}" for r in ("100-1", "100-2", "200-2", "300-3")],
             "vllm_calibration.yaml", ("cost.overhead",)),
    "distserve": ("distserve_disagg_opt13b_a100.yaml", "distserve-c21d11",
                  [f"distserve-c21d11-300-{r}" for r in (3, 6, 9, 12)],
                  "distserve_calibration.yaml",
                  ("cost.overhead", "systems[0].cluster.prefill.cost.overhead")),
}
ORCA_BOUND_S = 0.19
CAPACITY_RUNS = {  # folder: (scenario, extra arguments)
    "quickstart": ("scenarios/quickstart.yaml", ["--slo", "e2e_p90=3"]),
    **{f"orca_paper_gpt3_{model}{suffix}": (
        f"scenarios/orca_paper/gpt3_{model}.yaml",
        ["--slo", f"normalized_latency_p50={ORCA_BOUND_S}", "--attainment", "0.5", *extra])
       for model in ("13b", "175b")
       for suffix, extra in (("", []), ("_300", ["--requests", "300"]))},
}


def real_attainment(path: Path) -> float:
    real = read_real_run(path, "auto")
    real = real.assign(finish_s=real["e2e_s"])  # every logged request finished: e2e is known
    return float(attains(real, SLO).mean())


def simulated_attainment(scenario_file: str, system: str, run: str, overrides: tuple[str, ...]) -> float:
    path = TRUTH / f"{run}.csv"
    scenario = replay_of(load_scenario(VALIDATION / scenario_file, overrides), path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_scenario(scenario, base_dir=VALIDATION)
    return float(attains(result.systems[system].requests, SLO).mean())


def left_out(calibration: str, where: tuple[str, ...], run: str) -> tuple[str, ...]:
    """Overrides setting the overhead fitted on the other runs, wherever the scenario has it."""
    record = yaml.safe_load((ROOT / "results" / "validation" / calibration).read_text())
    params = record["calibration"]["parameters_left_out"][run]
    return tuple(f"{place}.{key.removeprefix('overhead.')}={value}"
                 for place in where for key, value in params.items())


def attainment_table() -> pd.DataFrame:
    rows = []
    for setup, (scenario_file, system, runs, calibration, where) in SETUPS.items():
        for run in runs:
            rows.append({
                "setup": setup, "run": run,
                "rate_per_s": float(run.rsplit("-", 1)[-1]),
                "real": real_attainment(TRUTH / f"{run}.csv"),
                "simulated": simulated_attainment(scenario_file, system, run, ()),
                "simulated_left_out": simulated_attainment(scenario_file, system, run,
                                                           left_out(calibration, where, run)),
                "simulated_no_overhead": simulated_attainment(
                    scenario_file, system, run, tuple(f"{place}=null" for place in where)),
            })
    return pd.DataFrame(rows)


def run_capacity(folder: str, scenario: str, args: list[str]) -> pd.DataFrame:
    out = OUT / folder
    subprocess.run([sys.executable, "-m", "orcasim.cli", "capacity", scenario, "--out", str(out),
                    "--force", *args], cwd=ROOT, check=True)
    for transient in ("points", "plan.json", "code.json"):  # resumable state: not in git
        path = out / transient
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return pd.read_csv(out / "capacity.csv")


def percent(value: float) -> str:
    return f"{value:.1%}"


def attainment_lines(table: pd.DataFrame) -> list[str]:
    lines = ["| setup | run (req/s) | real | simulated | left out of the fit | no overhead |",
             "|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.setup} | {r.run} ({r.rate_per_s:g}) | {percent(r.real)} | "
                     f"{percent(r.simulated)} | {percent(r.simulated_left_out)} | "
                     f"{percent(r.simulated_no_overhead)} |")
    errors = {c: (table[c] - table["real"]).abs() for c in
              ("simulated", "simulated_left_out", "simulated_no_overhead")}
    lines += ["", "Mean |simulated - real| in attainment points: "
              + ", ".join(f"{c.replace('_', ' ')} {100 * e.mean():.1f}" for c, e in errors.items())
              + " (vLLM only: "
              + ", ".join(f"{100 * e[table['setup'] == 'vllm'].mean():.1f}" for e in errors.values())
              + ")."]
    return lines


def goodput(rates: np.ndarray, share: np.ndarray, target: float = 0.9) -> float:
    """The highest rate at which `share` >= target, interpolated linearly between the runs
    around the crossing (runs at one rate averaged); NaN if the lowest rate misses it."""
    frame = pd.DataFrame({"rate": rates, "share": share}).groupby("rate")["share"].mean()
    rates, share = frame.index.to_numpy(), frame.to_numpy()
    if share[0] < target:
        return float("nan")
    k = int(np.nonzero(share >= target)[0][-1])
    if k == len(rates) - 1:
        return float(rates[k])
    return float(rates[k] + (share[k] - target) * (rates[k + 1] - rates[k]) / (share[k] - share[k + 1]))


def goodput_lines(table: pd.DataFrame) -> list[str]:
    lines = ["| setup | real | simulated | left out of the fit | no overhead |", "|---|---|---|---|---|"]
    for setup, rows in table.groupby("setup", sort=False):
        values = [goodput(rows["rate_per_s"].to_numpy(), rows[c].to_numpy())
                  for c in ("real", "simulated", "simulated_left_out", "simulated_no_overhead")]
        cells = [f"{v:.2f}" if np.isfinite(v) else "below the lowest rate run" for v in values]
        lines.append(f"| {setup} | " + " | ".join(cells) + " |")
    return lines


def capacity_lines(folder: str, table: pd.DataFrame) -> list[str]:
    lines = [f"`{folder}`:", "", "| system | max rate (req/s) | 95% interval | goodput per GPU | "
             "USD per million output tokens |", "|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.system} | {r.max_rate_per_s:.3g} | {r.ci_low:.3g} to {r.ci_high:.3g} | "
                     f"{r.goodput_per_gpu:.3g} | {r.cost_per_million_tokens:.3g} |")
    return lines


def sweep_bracket(model: str) -> pd.DataFrame:
    """Per system, the sweep's answer (results/orca_paper/: the throughput at the highest
    passing grid point) and the offered rates between which its capacity lies: the highest
    grid rate that passed and the next one, which failed."""
    sweep = pd.read_csv(ROOT / "results" / "orca_paper" / f"gpt3_{model}" / "sweep.csv")
    answer = throughput_under_bound(sweep, ORCA_BOUND_S)
    rows = {}
    for system, points in sweep.groupby("system", sort=False):
        points = points.sort_values("offered_rps")
        ok = (points["normalized_latency_s_per_token_p50"] <= ORCA_BOUND_S) & keeps_up(points)
        low = points.loc[ok, "offered_rps"].max()
        above = points.loc[~ok & (points["offered_rps"] > low), "offered_rps"]
        rows[system] = {"answer": answer.get(system, np.nan), "low": low,
                        "high": above.min() if len(above) else np.inf}
    return pd.DataFrame(rows).T


def _low_point(name: str, model: str, system: str, bracket: pd.DataFrame) -> dict[str, str]:
    """The bracket of `system`'s sweep answer, and what it served at the bracket's low point."""
    sweep = pd.read_csv(ROOT / "results" / "orca_paper" / f"gpt3_{model}" / "sweep.csv")
    low = bracket.loc[system, "low"]
    point = sweep[(sweep["system"] == system) & (sweep["offered_rps"] == low)].iloc[0]
    return {f"{name}_bracket": f"{low:.2f} to {bracket.loc[system, 'high']:.2f}",
            f"{name}_low": f"{low:.2f}", f"{name}_served": f"{point['served_rps']:.2f}",
            f"{name}_share": f"{point['served_rps'] / low:.1%}"}


def _full_load(system: str) -> str:
    """The range of the full-load rates that the 175B search's saturated runs measured."""
    runs = pd.read_csv(OUT / "orca_paper_gpt3_175b" / "evaluations.csv")
    rates = runs.loc[runs["system"] == system, "full_load_rps"].dropna()
    return f"{rates.min():.1f} to {rates.max():.1f}"


def orca_figures(tables: dict[str, pd.DataFrame]) -> dict[str, str]:
    """The numbers the prose about the Orca answers quotes, read from the tables it quotes
    (typed by hand, two of them had drifted from the table: 7.58 and 6.75 against 7.57 and
    6.73; a tester's finding)."""
    long = {m: tables[f"orca_paper_gpt3_{m}"].set_index("system") for m in ("13b", "175b")}
    short = tables["orca_paper_gpt3_175b_300"].set_index("system")
    bracket = sweep_bracket("175b")
    figures = {"o16_long": f"{long['175b'].loc['orca-bs16', 'max_rate_per_s']:.2f}",
               "o16_short": f"{short.loc['orca-bs16', 'max_rate_per_s']:.2f}",
               "ft8_long": f"{long['175b'].loc['ft-bs8', 'max_rate_per_s']:.2f}",
               "ft8_short": f"{short.loc['ft-bs8', 'max_rate_per_s']:.2f}",
               "ft8_low": f"{bracket.loc['ft-bs8', 'low']:.2f}",
               "ft8_ci": f"{long['175b'].loc['ft-bs8', 'ci_low']:.2f} to {long['175b'].loc['ft-bs8', 'ci_high']:.2f}"}
    figures.update(_low_point("o16", "175b", "orca-bs16", bracket))
    figures.update(_low_point("o8", "175b", "orca-bs8", bracket))
    figures["o8_long"] = f"{long['175b'].loc['orca-bs8', 'max_rate_per_s']:.2f}"
    figures["o8_short"] = f"{short.loc['orca-bs8', 'max_rate_per_s']:.2f}"
    figures["o16_full"] = _full_load("orca-bs16")
    figures["o8_full"] = _full_load("orca-bs8")
    bracket_13b = sweep_bracket("13b")
    figures.update(_low_point("ft8_13", "13b", "ft-bs8", bracket_13b))
    figures["ft8_13_long"] = f"{long['13b'].loc['ft-bs8', 'max_rate_per_s']:.2f}"
    figures["ft8_13_short"] = f"{tables['orca_paper_gpt3_13b_300'].set_index('system').loc['ft-bs8', 'max_rate_per_s']:.2f}"
    for model, b in (("13b", bracket_13b), ("175b", bracket)):
        ft = b.loc[b.index.str.startswith("ft"), "answer"].max()
        orca = b.loc[b.index.str.startswith("orca"), "answer"].max()
        figures[f"sweep_{model}"] = f"{orca / ft:.1f}x"
    for model, table in long.items():
        rates = table["max_rate_per_s"]
        orca = rates[rates.index.str.startswith("orca")].max()
        ft = rates[rates.index.str.startswith("ft")].max()
        figures[f"advantage_{model}"] = f"{orca / ft:.1f}x ({orca:.2f} against {ft:.2f}"
    return figures


def orca_lines(tables: dict[str, pd.DataFrame]) -> list[str]:
    lines = ["| model | system | capacity, 2,000 requests (95% interval) | capacity, 300 requests | "
             "sweep's answer | sweep's bracket (offered req/s) |", "|---|---|---|---|---|---|"]
    inside, total = 0, 0
    for model in ("13b", "175b"):
        table = tables[f"orca_paper_gpt3_{model}"].set_index("system")
        short = tables[f"orca_paper_gpt3_{model}_300"].set_index("system")
        bracket = sweep_bracket(model)
        for system, r in table.iterrows():
            b = bracket.loc[system]
            for rate in (r["max_rate_per_s"], short.loc[system, "max_rate_per_s"]):
                inside += int(b["low"] <= rate <= b["high"])
                total += 1
            lines.append(f"| GPT-3 {model.upper()} | {system} | {r['max_rate_per_s']:.2f} "
                         f"({r['ci_low']:.2f} to {r['ci_high']:.2f}) | "
                         f"{short.loc[system, 'max_rate_per_s']:.2f} | {b['answer']:.2f} | "
                         f"{b['low']:.2f} to {b['high']:.2f} |")
    return lines + ["", f"{inside} of the {total} capacity answers (both run lengths) lie inside "
                    "the sweep's bracket."]


README = """# Capacity: SLO attainment real against simulated, and capacity answers

Written by `python scenarios/capacity/report.py` (about two minutes on two cores); every
number below is its output. Folders: one `orcasim capacity` result each (`capacity.csv`,
`evaluations.csv`, `attainment.png`); `attainment.csv` is the first table.

## Real against simulated SLO attainment

DistServe's real OPT-13B runs on A100-80GB (`orcasim/data/ground_truth/distserve_opt13b_a100/`,
Apache-2.0): vLLM v0.2.3 on one GPU, and DistServe with prefill on two GPUs (TP 2) and decode on
one. Each request is scored against TTFT <= 0.2 s and TPOT <= 0.1 s (a one-token request meets
the TPOT bound); attainment is the share that meets both. The simulated column replays each
run's arrivals and lengths through its validation scenario (`scenarios/validation/`), whose
engine overhead was fitted on all four runs of its setup; "left out of the fit" uses the
overhead fitted on the other three (`parameters_left_out` in
`results/validation/*_calibration.yaml`), so it is a prediction of a run the model never saw;
"no overhead" drops the engine's own time (GPU time alone).

{attainment}

Goodput (DistServe's definition: the highest rate at which at least 90% of requests meet both
targets), interpolated linearly between the runs' rates (vLLM's two runs at 2 req/s averaged):

{goodput}

What this says:
- DistServe's disaggregated runs: attainment within 3 points at every rate, fitted or left out;
  goodput 5.35 req/s simulated against 6.06 real, 12% low. The miss is between 3 and 6 req/s:
  simulated 88.3% at 6 req/s against 90.7% real puts the 90% crossing below 6 instead of just
  above it, a small difference in attainment that moves the interpolated crossing a lot.
  Without the overhead model the 9 and 12 req/s runs read 11 and 6 points too optimistic.
- vLLM: neither the real server nor the simulation meets 90% at the lowest measured rate
  (1 req/s: 68% real, 60% simulated), so its goodput under these targets is below 1 req/s in
  both, and these runs cannot place it more precisely. At 1 to 2 req/s the simulation is within
  8 points. At 3 req/s it is 16 points pessimistic (10.7% against 27.0%): the same run whose
  TTFT tail the fidelity report misses most (results/validation/README.md: this run's median
  |error| is 21% fitted, 27% left out), where the simulated queue of prefills builds faster
  than the real one. Without overhead the simulation is 20 points optimistic there instead:
  the overhead model moves this run from one side of the truth to the other. This is the
  knee issue 11 leaves open, not a capacity-search error.

## Capacity answers

`orcasim capacity scenarios/quickstart.yaml --slo e2e_p90=3 --out /tmp/quickstart` (no
hardware, so no price; without `--out` it writes to `results/capacity/quickstart`, which holds
this committed answer):

{quickstart}

The Orca question as a capacity answer: GPT-3 13B (one A100-40GB) and 175B (16 A100-40GB,
TP 8 x PP 2), request-level (FT) and iteration-level (Orca) batching at batch limits 8 and 16,
the highest rate whose median normalized latency stays within the paper's 190 ms/token
(`--slo normalized_latency_p50=0.19 --attainment 0.5`), 3 replications:

{orca}

The sweep's answer (`results/orca_paper/README.md`) is the measured throughput at the highest
grid rate that met the bound while the server kept up (its completions while requests still
arrived, `served_rps`, at least 90% of the offered rate), over 300-request runs; its bracket is
that grid point's offered rate and the next one's, which failed. The capacity search answers in
offered rate, to 2%, and stops at the server's measured throughput at full load. Outside the
bracket (both run lengths), each below it, as the 90% rule allows a grid point up to a tenth
above what a server sustains:
- 13B ft-bs8 ({ft8_13_long} and {ft8_13_short} against {ft8_13_bracket}): at the {ft8_13_low} point
  it completed {ft8_13_served} req/s while requests arrived, {ft8_13_share} of the offered rate.
- 175B orca-bs16 ({o16_long} and {o16_short} against {o16_bracket}): at the {o16_low} point it
  completed {o16_served} req/s while requests arrived ({o16_share}), not yet saturated by the
  queue's growth test in 300 requests; the search's saturated 2,000-request runs measure its
  full-load rate at {o16_full} req/s.
- 175B orca-bs8 ({o8_long} and {o8_short} against {o8_bracket}): at the {o8_low} point it
  completed {o8_served} req/s while requests arrived ({o8_share}); the search's saturated runs
  measure its full-load rate at {o8_full} req/s.
- 175B ft-bs8 ({ft8_long} and {ft8_short} against {ft8_low}): the 2,000-request interval, {ft8_ci},
  contains the bracket's lower end; the sweep's one 300-request replication passed at 1.28.

Until 2026-12-06 the keeps-up test read the throughput to the last finish, which holds the
drain after the last arrival: 175B orca-bs16's bracket was 5.13 to 5.98 (its 5.98 point failed
that rule alone, the server 10% below its full-load rate), 13B ft-bs8's 2.14 to 2.56, and 12 of
the 16 answers lay inside.

Orca's advantage as capacity: 13B {advantage_13b} req/s, the best batch limit of
each), 175B {advantage_175b}); the sweep read {sweep_13b} and {sweep_175b}. Still far from the
paper's 36.9x for 175B, for the reasons results/orca_paper/README.md gives.

Caveat, stated in the search's design: near the stability limit a finite run reads better
than steady state. The search refuses rates at or above the measured full-load throughput
(less its 2% tolerance), but just below it a 2,000-request run's queue has not reached its steady-state length, and a
loose target such as a median of 190 ms/token is still met (orca-bs16's answers sit 2 to 5%
below its full-load throughput). A tighter target, a higher percentile or more `--requests`
bring the answer down where steady state would.

## Speed

`make bench-capacity` (`benchmarks/results/capacity.json`, {bench_date}): one system, 3
replications, 2,000 requests per evaluated rate, 2% resolution: Orca on the quickstart in
{orca_s} s with one worker ({orca_rates} rates evaluated), vLLM-style paged serving of
Llama-2-7B on an A100-80GB in {paged_s} s with two ({paged_rates} rates).
"""


def bench_figures() -> dict[str, str]:
    """The speed the benchmark's committed record says (typed by hand, it went stale)."""
    record = json.loads((ROOT / "benchmarks" / "results" / "capacity.json").read_text())
    cases = {(c["case"].split()[0], c["workers"]): c for c in record["cases"]}
    orca, paged = cases[("orca", 1)], cases[("paged", 2)]
    return {"bench_date": record["date"], "orca_s": f"{orca['wall_s']:.1f}",
            "orca_rates": str(orca["evaluations"]), "paged_s": f"{paged['wall_s']:.1f}",
            "paged_rates": str(paged["evaluations"])}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    attainment = attainment_table()
    attainment.to_csv(OUT / "attainment.csv", index=False)
    tables = {folder: run_capacity(folder, scenario, args)
              for folder, (scenario, args) in CAPACITY_RUNS.items()}
    sections = {"attainment": attainment_lines(attainment), "goodput": goodput_lines(attainment),
                "quickstart": capacity_lines("quickstart", tables["quickstart"]),
                "orca": orca_lines(tables)}
    tables_md = ({k: "\n".join(v) for k, v in sections.items()} | orca_figures(tables)
                 | bench_figures())
    (OUT / "README.md").write_text(README.format(**tables_md))
    print((OUT / "README.md").read_text())


if __name__ == "__main__":
    main()
