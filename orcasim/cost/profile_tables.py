"""Readers for measured tables: Vidur's CSVs and aiconfigurator's parquet files.

Each reader selects the rows that describe the deployment (model shape, TP degree, GPU
placement), refuses a table measured for another shape with a one-line error, and returns
interpolators in seconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from orcasim.config import ScenarioError
from orcasim.cost.catalog import HardwareConfig, ModelSpec
from orcasim.cost.flops import heads_per_rank
from orcasim.cost.interp import SlicedTable2D, Table1D
from orcasim.paths import (
    PACKAGE_DATA_DIR,
    SCENARIO_DIR,
    csv_data_line,
    read_csv,
    resolve_data_path,
)

MS = 1e-3
# Vidur's token-batched operators of one layer and how many times each runs per layer.
VIDUR_LAYER_OPS = {
    "input_layernorm": 1,
    "attn_pre_proj": 1,
    "attn_rope": 1,
    "attn_post_proj": 1,
    "post_attention_layernorm": 1,
    "mlp_up_proj": 1,
    "mlp_act": 1,
    "mlp_down_proj": 1,
    "add": 2,  # Vidur times one residual add; a layer has two
}


# The columns each Vidur table is read by (shape columns are checked only when present).
MLP_COLUMNS = ("num_tensor_parallel_workers", "num_tokens")
ATTENTION_COLUMNS = ("is_prefill", "batch_size", "kv_cache_size", "prefill_chunk_size",
                     "time_stats.attn_decode.median", "time_stats.attn_prefill.median")
NETWORK_COLUMNS = ("num_workers", "devices_per_node", "size")


def read_table(path: str, columns: tuple[str, ...]) -> pd.DataFrame:
    """A profile CSV that has every one of `columns`, or a one-line error naming those missing."""
    try:
        df = read_csv(resolve_data_path(path))
    except FileNotFoundError as e:
        raise ScenarioError(f"cost: {e}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ScenarioError(f"cost: {path}: missing column(s) {', '.join(missing)}; expected "
                            f"columns {', '.join(columns)} (as Vidur's profiler writes them)")
    return df


def _times_s(rows: pd.DataFrame, column: str, path: str) -> np.ndarray:
    """A timing column (Vidur's milliseconds) in seconds. A value that is not a finite time
    >= 0 is an error naming its line: a NaN passed validate and ran to a clock 'overflowing
    to infinity' that named no file, and a negative time took time off every layer without
    a word (a tester's finding)."""
    ms = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(ms) | (ms < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        line = csv_data_line(resolve_data_path(path), int(rows.index[i]))
        raise ScenarioError(f"cost: {path} line {line}: {column} = {rows[column].iloc[i]}, "
                            "expected a finite time in milliseconds >= 0")
    return ms * MS


def _check_shape(df: pd.DataFrame, path: str, expected: dict[str, float]) -> None:
    """Every present shape column must hold the model's value (a table of another model is an error)."""
    for column, value in expected.items():
        if column in df.columns and not np.all(df[column].to_numpy() == value):
            found = sorted(set(df[column].tolist()))
            raise ScenarioError(f"cost: {path}: column '{column}' = {found}, expected {value} for this model")


def _rows_for_tp(df: pd.DataFrame, path: str, column: str, tp: int) -> pd.DataFrame:
    rows = df[df[column] == tp]
    if rows.empty:
        raise ScenarioError(
            f"cost: {path} has no rows for {column} = {tp}; measured: {sorted(set(df[column].tolist()))}"
        )
    return rows


def mlp_table(path: str, model: ModelSpec, tp: int) -> tuple[Table1D, Table1D]:
    """Per-layer token-batched time and embedding time against num_tokens (Vidur mlp.csv)."""
    df = read_table(path, MLP_COLUMNS)
    _check_shape(df, path, {
        "n_embd": model.hidden_size, "n_head": model.num_heads,
        "n_kv_head": model.kv_heads, "n_expanded_embd": model.ffn_size,
    })
    missing = [op for op in VIDUR_LAYER_OPS if f"time_stats.{op}.median" not in df.columns]
    # Else the layer would cost nothing, silently; or, one operator missing (a table cut to
    # the MLP's), that operator nothing: its time was left out of every layer without a word.
    if len(missing) == len(VIDUR_LAYER_OPS):
        raise ScenarioError(
            f"cost: {path}: no operator times; expected columns time_stats.<op>.median for "
            f"each of {', '.join(VIDUR_LAYER_OPS)} (as Vidur's profiler writes them)")
    if missing:
        raise ScenarioError(
            f"cost: {path}: no time for operator(s) {', '.join(missing)}; expected a column "
            "time_stats.<op>.median for each of a layer's operators "
            f"({', '.join(VIDUR_LAYER_OPS)}), as Vidur's profiler writes them")
    rows = _rows_for_tp(df, path, "num_tensor_parallel_workers", tp)
    per_layer_s = sum((count * _times_s(rows, f"time_stats.{op}.median", path)
                       for op, count in VIDUR_LAYER_OPS.items()), np.zeros(len(rows)))
    tokens = rows["num_tokens"].to_numpy()
    emb_s = _times_s(rows, "time_stats.emb.median", path) if "time_stats.emb.median" in rows \
        else np.zeros(len(rows))
    return Table1D.from_points(tokens, per_layer_s), Table1D.from_points(tokens, emb_s)


def vidur_attention(path: str, model: ModelSpec, tp: int) -> tuple[SlicedTable2D, SlicedTable2D]:
    """Decode: batch size x mean KV length. Prefill: cached KV x chunk size (Vidur's keys)."""
    df = read_table(path, ATTENTION_COLUMNS)
    _check_shape(df, path, {
        "n_embd": model.hidden_size, "n_q_head": model.num_heads,
        "n_kv_head": model.kv_heads, "num_tensor_parallel_workers": tp,
    })
    decode = df[~df["is_prefill"].astype(bool)]
    prefill = df[df["is_prefill"].astype(bool)]
    decode_table = SlicedTable2D.from_points(
        decode["batch_size"], decode["kv_cache_size"],
        _times_s(decode, "time_stats.attn_decode.median", path))
    prefill_table = SlicedTable2D.from_points(
        prefill["kv_cache_size"], prefill["prefill_chunk_size"],
        _times_s(prefill, "time_stats.attn_prefill.median", path))
    return decode_table, prefill_table


def _parquet(directory: str, name: str) -> pd.DataFrame:
    found = sorted(_data_dir(directory).rglob(f"{name}.parquet"))
    if not found:
        raise ScenarioError(f"cost: aiconfigurator_dir '{directory}' holds no {name}.parquet")
    return pd.read_parquet(found[0])


def _data_dir(directory: str) -> Path:
    """A folder: as given, else beside the scenario file, else in orcasim's data."""
    base = SCENARIO_DIR.get()
    for candidate in (Path(directory), *( [base / directory] if base else []), PACKAGE_DATA_DIR / directory):
        if candidate.is_dir():
            return candidate
    raise ScenarioError(f"cost: aiconfigurator_dir '{directory}' is not a folder")


def _select_heads(df: pd.DataFrame, model: ModelSpec, tp: int, what: str) -> pd.DataFrame:
    q_heads, kv_heads = heads_per_rank(model, tp)
    keep = (df["num_heads"] == q_heads) & (df["num_key_value_heads"] == kv_heads) & (df["head_dim"] == model.head_dim)
    for column, value in (("kv_cache_dtype", "bfloat16"), ("window_size", 0)):
        if column in df.columns:
            keep &= df[column] == value
    rows = df[keep]
    if rows.empty:
        shapes = sorted(set(zip(df["num_heads"], df["num_key_value_heads"], df["head_dim"], strict=True)))
        raise ScenarioError(
            f"cost: no {what} rows for {q_heads:g} query heads, {kv_heads:g} KV heads, head_dim "
            f"{model.head_dim} per rank; measured (heads, kv_heads, head_dim): {shapes[:12]}"
        )
    # One kernel, chosen deterministically, so that two kernels' timings never mix.
    return rows[rows["kernel_source"] == sorted(set(rows["kernel_source"]))[0]]


def aiconfigurator_attention(directory: str, model: ModelSpec, tp: int) -> tuple[SlicedTable2D, SlicedTable2D]:
    """Decode: batch size x KV length (`step`). Prefill: a single slice at zero cached KV."""
    gen = _select_heads(_parquet(directory, "generation_attention_perf"), model, tp, "generation attention")
    ctx = _select_heads(_parquet(directory, "context_attention_perf"), model, tp, "context attention")
    ctx = ctx[ctx["batch_size"] == ctx["batch_size"].min()]
    decode = SlicedTable2D.from_points(gen["batch_size"], gen["step"], gen["latency"] * MS)
    prefill = SlicedTable2D.from_points(np.zeros(len(ctx)), ctx["isl"], ctx["latency"] / ctx["batch_size"] * MS)
    return decode, prefill


def network_table(
    path: str, collective: str, num_workers: int, hw: HardwareConfig, crosses_nodes: bool = False
) -> Table1D:
    """Collective time against message bytes, for `num_workers` placed as the deployment places them."""
    df = read_table(path, (*NETWORK_COLUMNS, f"time_stats.{collective}.median"))
    rows = _rows_for_tp(df, path, "num_workers", num_workers)
    per_node = 1 if crosses_nodes else min(num_workers, hw.gpu.gpus_per_node)
    placed = rows[rows["devices_per_node"] == per_node]
    if placed.empty:
        raise ScenarioError(
            f"cost: {path} has no rows for {num_workers} workers with {per_node} per node; "
            f"measured: {sorted(set(rows['devices_per_node'].tolist()))}"
        )
    return Table1D.from_points(placed["size"], _times_s(placed, f"time_stats.{collective}.median", path))
