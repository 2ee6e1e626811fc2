"""Score Vidur's execution-time predictor on splitwise's whole iterations, as orcasim is scored.

    python scenarios/validation/vidur.py --repo VIDUR_CHECKOUT --python PYTHON [--grid one]

`VIDUR_CHECKOUT` is a checkout of microsoft/vidur (the figures in
results/validation/README.md are of commit 7d47513); `PYTHON` is an interpreter with what
its predictor imports (numpy, pandas, scikit-learn, fasteners), kept apart from orcasim's
environment. `vidur_predict.py` runs there, in the checkout: Vidur's default random-forest
predictor for Llama-2-70B on A100 with its DGX network profile, trained on the checkout's
CSVs, prices each of the 38 points `orcasim.validation.read_splitwise` reads (one prefill of
`batch_size` prompts of `prompt_size` tokens; the mean of the 127 decode iterations that
follow, contexts prompt + 1 .. prompt + 127, as `iteration_table` builds them). The errors
are `iteration_table`'s (simulated / measured - 1) and the medians `median_errors`'s.

Vidur's compute profile stops at 4,096 tokens an iteration (its vLLM scheduler's default cap
on a batch); a longer prefill is priced by the forest's flat extrapolation, so the prefill is
also scored over the points within the profile, with orcasim's figure over the same
points. A checkout without the model's `attention.csv` is priced without attention
(said in the output) unless one is given for its degree: by default the TP-2 rows of Vidur's
Llama-2-70B A100 attention profile that orcasim ships
(`profiles/vidur/compute/a100/attention_llama2_70b_tp2.csv`, Vidur's commit e2d00e9) stand in
at TP 2, marked with Vidur's default block size (16), which its rows do not carry.
report.py holds the figures printed, since Vidur is not part of orcasim and the report runs
without it.
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

from orcasim.paths import read_csv, resolve_data_path  # noqa: E402
from orcasim.scenario import load_scenario  # noqa: E402
from orcasim.validation import iteration_table, median_errors, read_splitwise  # noqa: E402
from scenarios.validation.outside import check_checkout, check_interpreter, failed  # noqa: E402

DRIVER = Path(__file__).with_name("vidur_predict.py")
SCENARIO = Path(__file__).with_name("splitwise_llama2_70b_a100.yaml")
POINT_KEYS = ["tensor_parallel", "prompt_size", "batch_size"]
# Vidur's attention rows for Llama-2-70B on A100 that orcasim ships: TP 2's only.
ATTENTION_SLICES = {2: "profiles/vidur/compute/a100/attention_llama2_70b_tp2.csv"}
BLOCK_SIZE = 16  # Vidur's default (`BaseReplicaSchedulerConfig.block_size`), which it filters on


def attention_files(folder: Path) -> dict[str, str]:
    """The shipped attention slices in Vidur's format (a `block_size` column), by degree."""
    files = {}
    for tp, path in ATTENTION_SLICES.items():
        target = folder / f"attention_tp{tp}.csv"
        read_csv(resolve_data_path(path)).assign(block_size=BLOCK_SIZE).to_csv(target, index=False)
        files[str(tp)] = str(target)
    return files


def predict(points: pd.DataFrame, repo: Path, python: str, cache_dir: Path,
            grid: str = "default", slices: bool = True) -> pd.DataFrame:
    """`points` with Vidur's `prompt_sim_s`, `token_sim_s` (s), whether it priced attention
    and the most tokens an iteration its compute profile holds. With `slices`, a degree whose
    attention profile the checkout lacks takes orcasim's shipped one, if any."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        asked, answered = folder / "request.json", folder / "vidur.json"
        own = repo / "data/profiling/compute/a100/meta-llama/Llama-2-70b-hf/attention.csv"
        stand_ins = attention_files(folder) if slices and not own.exists() else {}
        asked.write_text(json.dumps({
            "points": [{k: int(row[k]) for k in POINT_KEYS} for _, row in points.iterrows()],
            "grid": grid, "attention_csv": stand_ins}))
        done = subprocess.run([python, str(DRIVER), str(asked), str(answered), str(cache_dir)],
                              cwd=repo, capture_output=True, text=True)
        if done.returncode != 0:
            raise failed("vidur_predict.py", done)
        vidur = pd.DataFrame(json.loads(answered.read_text()))
    table = points.merge(vidur, on=POINT_KEYS, how="left", validate="one_to_one")
    if table["prompt_sim_s"].isna().any():
        raise RuntimeError("Vidur priced other points than those asked")
    return table


def score(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with `iteration_table`'s relative errors."""
    table = table.copy()
    table["prompt_error"] = table["prompt_sim_s"] / table["prompt_s"] - 1.0
    table["token_error"] = table["token_sim_s"] / table["token_s"] - 1.0
    return table


def in_profile(table: pd.DataFrame) -> pd.Series:
    """The points whose prefill Vidur's compute profile covers (no more tokens than it holds)."""
    return table["prompt_size"] * table["batch_size"] <= table["profiled_tokens"]


def medians(table: pd.DataFrame, orcasim: pd.DataFrame) -> pd.DataFrame:
    """Median |error| per TP and over all, as report.py's splitwise table: Vidur's prefill
    and decode over every point, and Vidur's and orcasim's prefill over the points within
    Vidur's compute profile (`orcasim`: `iteration_table`'s, row for row)."""
    covered = in_profile(table).to_numpy()
    groups = {f"TP {tp}": table["tensor_parallel"].to_numpy() == tp
              for tp in sorted(table["tensor_parallel"].unique())}
    groups["all"] = np.ones(len(table), dtype=bool)
    rows = {}
    for name, rows_in in groups.items():
        every, inside = median_errors(table[rows_in]), rows_in & covered
        rows[name] = {"prefill": every["prefill"], "decode": every["decode"],
                      "prefill in profile": median_errors(table[inside])["prefill"],
                      "orcasim prefill in profile": median_errors(orcasim[inside])["prefill"]}
    return pd.DataFrame(rows).T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True, help="a checkout of microsoft/vidur")
    parser.add_argument("--python", default=sys.executable,
                        help="an interpreter with numpy, pandas, scikit-learn and fasteners")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where Vidur keeps its trained forests (default: a temporary one)")
    parser.add_argument("--grid", choices=("default", "one"), default="default",
                        help="Vidur's own hyperparameter grid for each forest, or one point "
                        "of it (vidur_predict.ONE; some fifty times faster)")
    parser.add_argument("--no-attention-slice", action="store_true",
                        help="price TP 2 without attention too, where the checkout lacks it")
    args = parser.parse_args()
    repo = check_checkout(args.repo, "vidur/execution_time_predictor/"
                          "random_forrest_execution_time_predictor.py", "microsoft/vidur")
    check_interpreter(args.python, ("numpy", "pandas", "sklearn", "fasteners"))
    points = read_splitwise()
    with tempfile.TemporaryDirectory() as folder:
        cache_dir = args.cache_dir.resolve() if args.cache_dir else Path(folder)
        table = score(predict(points, repo, args.python, cache_dir, args.grid,
                              not args.no_attention_slice))
    orcasim = iteration_table(load_scenario(SCENARIO), points)
    covered = in_profile(table)
    with_attention = [int(tp) for tp in table.loc[table["attention"], "tensor_parallel"].unique()]
    print(f"Vidur ({args.grid} grid) on {len(table)} splitwise points; attention priced at TP "
          f"{with_attention or 'none'}, zero elsewhere (no profile); its compute profile holds "
          f"up to {table['profiled_tokens'].min():,} tokens an iteration")
    for index, row in table.iterrows():
        print(f"TP {row['tensor_parallel']} {row['prompt_size']:>5} x {row['batch_size']:>2}: "
              f"prefill {1e3 * row['prompt_sim_s']:9.1f} ms ({row['prompt_error']:+.1%}), "
              f"decode {1e3 * row['token_sim_s']:6.2f} ms ({row['token_error']:+.1%})"
              + ("" if covered[index] else "  [prefill beyond its profile]"))
    print(f"median |relative error|, %; 'in profile': the {int(covered.sum())} points of no more "
          "tokens than its profile holds")
    print((100 * medians(table, orcasim)).round(1).to_string())

if __name__ == "__main__":
    main()
