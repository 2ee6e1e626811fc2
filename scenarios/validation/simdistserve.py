"""Score DistServe's own simulator (`simdistserve`) on the shipped real runs, as orcasim is scored.

    python scenarios/validation/simdistserve.py --repo DISTSERVE_CHECKOUT --python PYTHON

`DISTSERVE_CHECKOUT` is a checkout of LLMServe/DistServe (the figures in
results/validation/README.md are of commit 82831f1); `PYTHON` is an interpreter with what
simdistserve imports (simpy, numpy, pandas), kept apart from orcasim's environment. Each run
of `orcasim/data/ground_truth/distserve_opt13b_a100/` is replayed unmodified, with its own
arrivals and lengths: the vLLM runs by its vLLM mode (`--backend vllm`, TP 1), DistServe's
disaggregated runs by its DistServe mode (`--backend distserve --tp-prefill 2 --tp-decode 1`,
the runs' c21d11: one TP-2 prefill instance, one TP-1 decode instance). Each uses its own A100
profiles. Its per-request latencies are scored by `orcasim.fidelity.compare`, with TPOT as the
runs measure it, (e2e - ttft) / (output - 1); simdistserve's own `tpot` divides by the output
length. Prints each run's relative errors at p50 and p90 (%). report.py holds the figures it
printed, since simdistserve is not part of orcasim and the report runs without it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orcasim.fidelity import compare  # noqa: E402
from scenarios.validation.outside import check_checkout, check_interpreter, failed  # noqa: E402

RUNS = ROOT / "orcasim" / "data" / "ground_truth" / "distserve_opt13b_a100"
MODES = {"vllm": ("--backend", "vllm"),
         "distserve": ("--backend", "distserve", "--tp-prefill", "2", "--tp-decode", "1")}
COLUMNS = ["ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50", "e2e_p90"]


def simulate(real: pd.DataFrame, mode: str, repo: Path, python: str, folder: Path) -> pd.DataFrame:
    """simdistserve's per-request TTFT, TPOT and E2E (s) for the run's requests, in its order."""
    workload = folder / "workload.json"
    # A custom workload's start times are in s (simdistserve's clock, in ms, multiplies the
    # gaps by 1000: `convert_absolutearrival_to_interarrival`).
    start_s = real["arrival_s"] - real["arrival_s"].iloc[0]
    workload.write_text(json.dumps([
        {"start_time": float(t), "prompt_len": int(p), "output_len": int(o)}
        for t, p, o in zip(start_s, real["prompt_tokens"], real["output_tokens"], strict=True)]))
    latency, info = folder / "latency.csv", folder / "info.csv"
    done = subprocess.run([python, "-m", "simdistserve.benchmarks.simulate_dist", *MODES[mode],
                           "--model", "facebook/opt-13b", "--arrival", "custom",
                           "--workload", str(workload), "--N", str(len(real)),
                           "--output-request-latency", str(latency),
                           "--output-request-info", str(info)],
                          cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise failed(f"simdistserve ({mode} mode)", done)
    lat, lengths = pd.read_csv(latency), pd.read_csv(info)
    if not (lengths["prefill_lens"].to_numpy() == real["prompt_tokens"].to_numpy()).all():
        raise RuntimeError("simdistserve's requests are not the run's, in its order")
    output = real["output_tokens"].to_numpy()
    decode_ms = lat["total_latency"] - lat["first_token_latency"]
    return pd.DataFrame({
        "ttft_s": lat["first_token_latency"] / 1000.0,
        "tpot_s": np.where(output > 1, decode_ms / 1000.0 / np.maximum(output - 1, 1), np.nan),
        "e2e_s": lat["total_latency"] / 1000.0})


def errors(real: pd.DataFrame, simulated: pd.DataFrame) -> dict[str, float]:
    """Relative errors at p50 and p90, named as report.py's tables name them."""
    table = compare(real, simulated)
    table = table[table["percentile"].isin((50, 90))]
    return {f"{m.removesuffix('_s')}_p{p}": e
            for m, p, e in zip(table["metric"], table["percentile"], table["rel_error"], strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True, help="a checkout of LLMServe/DistServe")
    parser.add_argument("--python", default=sys.executable, help="an interpreter with simpy")
    args = parser.parse_args()
    repo = check_checkout(args.repo, "simdistserve/benchmarks/simulate_dist.py", "LLMServe/DistServe")
    check_interpreter(args.python, ("simpy", "numpy", "pandas"))
    for mode, pattern in (("vllm", "vllm-*.csv"), ("distserve", "distserve-*.csv")):
        rows = {}
        for path in sorted(RUNS.glob(pattern)):
            real = pd.read_csv(path)
            with tempfile.TemporaryDirectory() as folder:
                rows[path.stem] = errors(real, simulate(real, mode, repo, args.python,
                                                        Path(folder)))
        frame = pd.DataFrame(rows).T[COLUMNS]
        print(f"simdistserve, {mode} mode: relative error, %")
        print((100 * frame).round(1).to_string())
        print("median |error|, six numbers:", round(100 * float(frame.abs().stack().median()), 1),
              "; TTFT and TPOT:", round(100 * float(frame[COLUMNS[:4]].abs().stack().median()), 1))


if __name__ == "__main__":
    main()
