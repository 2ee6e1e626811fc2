"""Trace readers: orcasim CSV, the Azure LLM inference trace, and Mooncake JSONL.

Every reader returns (arrival_s, prompt_tokens, output_tokens), arrivals relative to the
first request and sorted. A bad row is an error that names its line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from orcasim.paths import resolve_data_path

ORCASIM_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

Trace = tuple[np.ndarray, np.ndarray, np.ndarray]


def read_trace(path: str, fmt: str = "auto", max_requests: int | None = None) -> Trace:
    resolved = resolve_data_path(path)
    if fmt == "auto":
        fmt = _detect_format(resolved)
    match fmt:
        case "orcasim":
            rows = _read_csv(resolved, ORCASIM_COLUMNS, max_requests)
            arrival_s = _numbers(rows, "arrival_s", resolved, line_offset=2)
        case "azure":
            rows = _read_csv(resolved, AZURE_COLUMNS, max_requests)
            arrival_s = _azure_seconds(rows, resolved)
            rows = rows.rename(
                columns={"ContextTokens": "prompt_tokens", "GeneratedTokens": "output_tokens"}
            )
        case "mooncake":
            rows = _read_mooncake(resolved, max_requests)
            arrival_s = _numbers(rows, "timestamp", resolved, line_offset=1) / 1000.0
        case _:
            raise ValueError(f"unknown trace format '{fmt}'; expected auto, orcasim, azure or mooncake")
    offset = 2 if fmt != "mooncake" else 1
    prompt = _token_counts(rows, "prompt_tokens", resolved, offset)
    output = _token_counts(rows, "output_tokens", resolved, offset)
    return _sorted_from_zero(arrival_s, prompt, output)


def _detect_format(path: Path) -> str:
    if path.suffix in (".jsonl", ".json"):
        return "mooncake"
    header = pd.read_csv(path, nrows=0).columns
    if set(ORCASIM_COLUMNS) <= set(header):
        return "orcasim"
    if set(AZURE_COLUMNS) <= set(header):
        return "azure"
    raise ValueError(
        f"{path.name}: cannot tell the trace format from columns {list(header)}; expected "
        f"{', '.join(ORCASIM_COLUMNS)} (orcasim) or {', '.join(AZURE_COLUMNS)} (azure)"
    )


def _read_csv(path: Path, columns: tuple[str, ...], max_requests: int | None) -> pd.DataFrame:
    header = pd.read_csv(path, nrows=0).columns
    missing = [c for c in columns if c not in header]
    if missing:
        raise ValueError(f"{path.name}: missing column(s) {', '.join(missing)}")
    return pd.read_csv(path, usecols=list(columns), nrows=max_requests, dtype=str)


def _read_mooncake(path: Path, max_requests: int | None) -> pd.DataFrame:
    records = []
    with path.open() as f:
        for line_no, line in enumerate(f, start=1):
            if max_requests is not None and len(records) >= max_requests:
                break
            try:
                obj = json.loads(line)
                records.append(
                    (obj["timestamp"], obj["input_length"], obj["output_length"])
                )
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path.name} line {line_no}: bad Mooncake record ({e})") from None
    return pd.DataFrame(records, columns=["timestamp", "prompt_tokens", "output_tokens"])


def _numbers(rows: pd.DataFrame, column: str, path: Path, line_offset: int) -> np.ndarray:
    values = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values < 0)
    _raise_on_bad(bad, rows[column], column, path, line_offset, "a number >= 0")
    return values


def _token_counts(rows: pd.DataFrame, column: str, path: Path, line_offset: int) -> np.ndarray:
    values = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values < 1) | (values != np.floor(values))
    _raise_on_bad(bad, rows[column], column, path, line_offset, "an integer >= 1")
    return values.astype(np.int64)


def _azure_seconds(rows: pd.DataFrame, path: Path) -> np.ndarray:
    stamps = pd.to_datetime(rows["TIMESTAMP"], errors="coerce", format="mixed")
    _raise_on_bad(stamps.isna().to_numpy(), rows["TIMESTAMP"], "TIMESTAMP", path, 2, "a timestamp")
    ns = stamps.astype("int64").to_numpy()
    return (ns - ns.min()) / 1e9


def _raise_on_bad(
    bad: np.ndarray, raw: pd.Series, column: str, path: Path, line_offset: int, expected: str
) -> None:
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{path.name} line {row + line_offset}: {column} = {raw.iloc[row]!r}, expected {expected}"
        )


def _sorted_from_zero(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> Trace:
    if len(arrival_s) == 0:
        raise ValueError("trace has no requests")
    order = np.argsort(arrival_s, kind="stable")
    arrival_s = arrival_s[order]
    return arrival_s - arrival_s[0], prompt[order], output[order]
