"""Trace readers: orcasim CSV, the Azure LLM inference trace, Mooncake JSONL, and two
serving benchmarks' per-request results (vLLM's `bench serve` JSON, NVIDIA AIPerf's JSONL).

Every reader returns (arrival_s, prompt_tokens, output_tokens), arrivals relative to the
first request and sorted. A bad row is an error that names its line.

Mooncake's `hash_ids` also say which prompts share prefixes (`read_trace_with_content`):
id j of a request names its tokens [512 j, 512 (j + 1)), and the ids are prefix hashes, so
equal ids mean equal prompts up to that block's end (in the conversation trace every one
of its 182,790 ids sits at one position after one predecessor, as a prefix hash must).
They become the content segments of `orcasim.requests.PromptContent`, one per 512-token
block, the last one as long as the prompt has left; outputs are content of their own.
"""

from __future__ import annotations

import decimal
import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orcasim.config import ScenarioError
from orcasim.metrics import tpot_s
from orcasim.paths import (
    as_path,
    csv_data_line,
    data_suffix,
    decompressing,
    open_text,
    read_csv,
    read_json,
    read_once,
    resolve_data_path,
    shown_columns,
)
from orcasim.requests import PromptContent
from orcasim.workload.lengths import LENGTH_EXPECTED, bad_lengths

ORCASIM_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

Trace = tuple[np.ndarray, np.ndarray, np.ndarray]
MOONCAKE_BLOCK_TOKENS = 512  # the block size of Mooncake's hash_ids (FAST'25 traces README)
# Content ids are hashed as Python hashes ints, modulo 2**61 - 1 (`orcasim.prefix`), and the
# outputs' ids follow the largest block id: below this bound none of them wraps onto another
# (2**62 let id 7 + 2**61 - 1 read as a cache hit of id 7; a tester's finding). Mooncake's
# own ids count up from 0.
MAX_HASH_ID = 2**60


MEASURED_COLUMNS = ("ttft_s", "tpot_s", "e2e_s")
# Each format's prompt and output lengths, under the names its files give them, so that an
# error names a column the user can find in the file.
LENGTH_COLUMNS = {
    "orcasim": ("prompt_tokens", "output_tokens"),
    "azure": ("ContextTokens", "GeneratedTokens"),
    "mooncake": ("input_length", "output_length"),
    "vllm": ("input_lens", "output_lens"),
    "aiperf": ("input_sequence_length", "output_sequence_length"),
}


# Why a file of a format gave no requests: "a header alone" was said of an empty JSON-lines
# file, which has no header (a tester's finding).
NO_REQUESTS = {"orcasim": "a header alone", "azure": "a header alone",
               "mooncake": "no record, only blank lines or none",
               "vllm": "empty lists",
               "aiperf": "no record, only blank lines or none"}


def read_trace(path: str, fmt: str = "auto", max_requests: int | None = None) -> Trace:
    return read_trace_with_content(path, fmt, max_requests)[0]


def read_trace_with_content(
    path: str, fmt: str = "auto", max_requests: int | None = None
) -> tuple[Trace, PromptContent | None]:
    """The trace and, where its format says (Mooncake's hash_ids), what its prompts share."""
    resolved = resolve_data_path(str(as_path(path, "path", "a trace file's path")))
    return read_once(resolved, ("trace", fmt, max_requests),
                     lambda: _read_trace_with_content(resolved, fmt, max_requests), _own_copy)


def _own_copy(read: tuple[Trace, PromptContent | None]) -> tuple[Trace, PromptContent | None]:
    """The caller's own arrays; a prompt's segments are tuples, shared as they are (a deep
    copy of 200,000 Mooncake prompts took 0.7 s a read)."""
    (arrival_s, prompt, output), content = read
    copied = None if content is None else PromptContent(list(content.prompts), content.output_ids.copy())
    return (arrival_s.copy(), prompt.copy(), output.copy()), copied


def _first_to_arrive(resolved: Path, fmt: str,
                     max_requests: int | None) -> tuple[pd.DataFrame, np.ndarray, int]:
    """`_read_rows`, capped to the first `max_requests` to arrive, in the file's order."""
    # AIPerf writes each record as its request finishes, so its first lines are the first to
    # finish even where they happen to be in start order (a cap of 2 kept the requests sent
    # at 1 s and 3 s, not the long one sent at 0 s that finished third): read it whole.
    in_finish_order = fmt == "aiperf"
    rows, arrival_s, offset = _read_rows(resolved, fmt, None if in_finish_order else max_requests)
    if max_requests is not None and in_finish_order:
        first = np.sort(np.argsort(arrival_s, kind="stable")[:max_requests])
        return rows.iloc[first], arrival_s[first], offset
    if max_requests is not None and len(arrival_s) == max_requests and np.any(np.diff(arrival_s) < 0):
        # Not in arrival order (a log written as requests finished): the first requests to
        # arrive may lie further down, and the first lines would be the quickest ones (a
        # tester's note). Read it whole and keep the first to arrive, in the file's order.
        rows, arrival_s, offset = _read_rows(resolved, fmt, None)
        first = np.sort(np.argsort(arrival_s, kind="stable")[:max_requests])
        rows, arrival_s = rows.iloc[first], arrival_s[first]
    return rows, arrival_s, offset


def _read_trace_with_content(
    resolved: Path, fmt: str, max_requests: int | None
) -> tuple[Trace, PromptContent | None]:
    fmt = _detect_format(resolved) if fmt == "auto" else fmt
    rows, arrival_s, offset = _first_to_arrive(resolved, fmt, max_requests)
    prompt_column, output_column = LENGTH_COLUMNS[fmt]
    prompt = _token_counts(rows, prompt_column, resolved, offset)
    output = _token_counts(rows, output_column, resolved, offset)
    if len(arrival_s) == 0:
        raise ScenarioError(f"{resolved.name}: no requests ({NO_REQUESTS[fmt]}); expected at "
                            "least one")
    trace = _sorted_from_zero(arrival_s, prompt, output)
    if fmt != "mooncake":
        return trace, None
    hash_ids = rows["hash_ids"].tolist()
    if all(ids is None for ids in hash_ids):  # lengths alone: nothing said about sharing
        return trace, None
    order = np.argsort(arrival_s, kind="stable")
    content = _mooncake_content(hash_ids, prompt, resolved, rows.index.tolist())
    prompts = [content.prompts[i] for i in order.tolist()]
    return trace, PromptContent(prompts, content.output_ids[order])


def _mooncake_content(
    hash_ids: list[object], prompt: np.ndarray, path: Path, lines: list[int]
) -> PromptContent:
    """One segment per 512-token block, named by its hash id; each output its own id."""
    prompts: list[tuple[int, ...]] = []
    largest = -1
    for row, (ids, tokens) in enumerate(zip(hash_ids, prompt.tolist(), strict=True)):
        blocks = -(-tokens // MOONCAKE_BLOCK_TOKENS)
        if not (isinstance(ids, list) and len(ids) == blocks
                and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_HASH_ID
                        for i in ids)):
            raise ScenarioError(
                f"{path.name} line {lines[row]}: hash_ids = {str(ids)[:60]}, expected "
                f"{blocks} integer id(s) from 0 to below 2**60, one per {MOONCAKE_BLOCK_TOKENS} "
                f"tokens of input_length = {tokens}")
        last = tokens - MOONCAKE_BLOCK_TOKENS * (blocks - 1)
        segments: list[int] = []
        for j, block_id in enumerate(ids):
            segments += [block_id, MOONCAKE_BLOCK_TOKENS if j < blocks - 1 else last]
        prompts.append(tuple(segments))
        largest = max(largest, *ids)
    output_ids = np.arange(len(prompts), dtype=np.int64) + largest + 1  # after every block id
    return PromptContent(prompts, output_ids)


def read_measurements(path: str, fmt: str = "auto") -> pd.DataFrame:
    """A real run's measured `ttft_s`, `tpot_s`, `e2e_s` (seconds), in the order `read_trace`
    gives its requests; a metric the log lacks is NaN. TPOT is the mean gap between output
    tokens after the first; missing, it is derived from TTFT and E2E where both exist."""
    resolved = resolve_data_path(str(as_path(path, "path", "a serving log's path")))
    fmt = _detect_format(resolved) if fmt == "auto" else fmt
    rows, arrival_s, offset = _read_rows(resolved, fmt, None)
    if len(rows) == 0:  # as read_trace says it: an empty .jsonl, detected as Mooncake, was
        # "format 'mooncake' holds no measured latencies", and a header alone "no ttft_s above 0"
        raise ScenarioError(f"{resolved.name}: no requests ({NO_REQUESTS[fmt]}); expected at "
                            "least one")
    if fmt in ("vllm", "aiperf"):
        frame = rows[list(MEASURED_COLUMNS)].astype(np.float64)
    elif fmt == "orcasim":
        frame = _measured_columns(resolved)
    else:
        raise ScenarioError(f"{resolved.name}: format '{fmt}' holds no measured latencies; "
                         "expected an orcasim CSV with ttft_s, tpot_s or e2e_s, a vLLM "
                         "benchmark result or an AIPerf profile_export.jsonl")
    output = _token_counts(rows, LENGTH_COLUMNS[fmt][1], resolved, offset)
    names = DERIVED_NAMES.get(fmt, {c: c for c in MEASURED_COLUMNS})
    _refuse_impossible_seconds(frame, resolved, offset, names)
    _refuse_ending_before_first_token(frame, resolved, offset)
    _refuse_second_token(frame, output, LENGTH_COLUMNS[fmt][1], resolved, offset, names)
    derived = pd.Series(tpot_s(frame["e2e_s"] - frame["ttft_s"], output), index=frame.index)
    _check_tpot_units(frame["tpot_s"], derived.to_numpy(), resolved, offset)
    _check_tpot_definition(frame["tpot_s"].to_numpy(dtype=np.float64), derived.to_numpy(), resolved)
    given = names["tpot_s"] if frame["tpot_s"].notna().any() else "(e2e_s - ttft_s) / (output_tokens - 1)"
    frame["tpot_s"] = frame["tpot_s"].fillna(derived)
    frame.loc[output <= 1, "tpot_s"] = np.nan  # no gap after a single token, given or not
    _refuse_tpot_in_ms(frame["tpot_s"].to_numpy(dtype=np.float64), given, resolved)
    order = np.argsort(arrival_s, kind="stable")
    return frame.iloc[order].reset_index(drop=True)


# A vLLM result's latencies as its own fields make them, for errors: the frame's ttft_s,
# tpot_s and e2e_s were named in errors about a file that has none of them.
VLLM_DERIVED = {"ttft_s": "ttfts", "tpot_s": "sum(itls) / (output_lens - 1)",
                "e2e_s": "ttfts + sum(itls)"}
AIPERF_DERIVED = {"ttft_s": "time_to_first_token", "e2e_s": "request_latency",
                  "tpot_s": "(request_latency - time_to_first_token) / (output_sequence_length - 1)"}
DERIVED_NAMES = {"vllm": VLLM_DERIVED, "aiperf": AIPERF_DERIVED}


# A latency no serving benchmark records in seconds: a day. vLLM's benchmark client gives
# up on a request after 6 hours (AIOHTTP_TIMEOUT); more is another unit, or no time at all.
MAX_LATENCY_S = 86_400.0
# A median TPOT no GPU server decodes at: a decode step reads the weights once from GPU
# memory, at 1 TB/s or more, and all of an 8 x 80 GB node's memory read by one GPU takes
# 0.64 s. Ten times that is no engine of orcasim's but a log in milliseconds, where the
# usual 10 to 100 ms a token read as 10 to 100 s (a preempted request's own gaps may be
# long; the median request's are not).
MAX_MEDIAN_TPOT_S = 10.0
# Above that 0.64 s, but under the refusal: a log of a small model in ms (its 1 to 10 ms a
# token read as 1 to 10 s; 7.6 ms on an H100 passed without a word, a TTFT of 48 ms read as
# 48 s), or a server preempting most of its requests. Said, not refused.
WARN_MEDIAN_TPOT_S = 1.0
MS_HINT = "seconds expected; these look like milliseconds"


def _refuse_impossible_seconds(frame: pd.DataFrame, path: Path, offset: int,
                               names: dict[str, str]) -> None:
    """Refuse a latency above a day: milliseconds where it is below a day's worth of them
    (an E2E of 1e300 was reported as a TPOT in the wrong unit)."""
    for column in MEASURED_COLUMNS:
        values = frame[column]
        bad = (values > MAX_LATENCY_S).to_numpy()
        if bad.any():
            hint = f"; {MS_HINT}" if values[bad].max() <= MAX_LATENCY_S * 1e3 else ""
            _raise_on_bad(bad, values, names[column], path, offset,
                          f"seconds, at most {MAX_LATENCY_S:,.0f} (a day: no benchmark client "
                          f"waits that long on a request){hint}")


def _refuse_tpot_in_ms(tpot: np.ndarray, column: str, path: Path) -> None:
    """Refuse a log whose median TPOT no GPU server decodes at: every latency in ms, which
    the other checks take for consistent seconds (a fit to it read 99.9% off, exit 0)."""
    if not np.isfinite(tpot).any():
        return
    median_s = float(np.nanmedian(tpot))
    if median_s > MAX_MEDIAN_TPOT_S:
        raise ScenarioError(f"{path.name}: {column}'s median = {median_s:.4g} s a token, expected "
                            f"under {MAX_MEDIAN_TPOT_S:g} s (no GPU server decodes that slowly); "
                            f"{MS_HINT}")
    if median_s > WARN_MEDIAN_TPOT_S:
        warnings.warn(f"{path.name}: {column}'s median = {median_s:.4g} s a token, slower than a "
                      "GPU decode step takes (a node's whole memory read once is 0.64 s): if "
                      "the log is in milliseconds, its latencies read 1,000 times too long",
                      UserWarning, stacklevel=2)


def _refuse_ending_before_first_token(frame: pd.DataFrame, path: Path, offset: int) -> None:
    """A request cannot end before its first token: such a log would give negative TPOTs.
    The ttft_s is said beside the e2e_s, as either may be the wrong one (TTFT in ms)."""
    bad = (frame["e2e_s"] < frame["ttft_s"]).to_numpy()
    if bad.any():
        ttft_s = float(frame["ttft_s"].to_numpy()[np.flatnonzero(bad)[0]])
        _raise_on_bad(bad, frame["e2e_s"], "e2e_s", path, offset,
                      f"a number >= the request's ttft_s = {ttft_s:.6g} (a request cannot end "
                      "before its first token)")


# How far a one-token request's E2E may trail its TTFT: the stream's closing chunk and the
# client's bookkeeping after its one token (ms), not a decode step (10 to 100 ms).
ONE_TOKEN_TAIL_ATOL_S = 0.01
ONE_TOKEN_TAIL_RTOL = 0.03


def _refuse_second_token(frame: pd.DataFrame, output: np.ndarray, output_column: str,
                         path: Path, offset: int, names: dict[str, str]) -> None:
    """Refuse a one-token request measured as if it had more: a TPOT above 0 (it was dropped
    unread), or an E2E well after its TTFT (it was fitted as a decode no token made)."""
    one = output == 1
    tpot = frame["tpot_s"]
    _raise_on_bad(one & (tpot > 0).to_numpy(), tpot, names["tpot_s"], path, offset,
                  f"empty or 0 for a request of {output_column} = 1 (one token leaves no gap "
                  "between tokens)")
    ttft, e2e = frame["ttft_s"].to_numpy(), frame["e2e_s"].to_numpy()
    bad = one & (e2e - ttft > ONE_TOKEN_TAIL_RTOL * ttft + ONE_TOKEN_TAIL_ATOL_S)
    if bad.any():
        ttft_s = float(ttft[np.flatnonzero(bad)[0]])
        _raise_on_bad(bad, frame["e2e_s"], names["e2e_s"], path, offset,
                      f"about the request's {names['ttft_s']} = {ttft_s:.6g} for {output_column} = 1 (its "
                      f"one token is its first and its last; is {output_column} right?)")


# How far a log's TPOT may stray from the gaps its TTFT and E2E leave, (e2e - ttft) / (n - 1),
# either way: definitions differ by the first token at most (a mean over all n tokens), so a
# factor of 10 is no definition but a unit (TPOT in ms beside seconds reads as 1000).
TPOT_UNITS_FACTOR = 10.0


def _check_tpot_units(tpot_s: pd.Series, gaps_s: np.ndarray, path: Path, offset: int) -> None:
    """Refuse a row whose tpot_s cannot be the gap its ttft_s and e2e_s leave (mixed units)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = tpot_s.to_numpy(dtype=np.float64) / gaps_s
    bad = (gaps_s > 0) & np.isfinite(ratio) & ((ratio > TPOT_UNITS_FACTOR)
                                               | (ratio < 1 / TPOT_UNITS_FACTOR))
    if bad.any():
        gap = float(gaps_s[np.flatnonzero(bad)[0]])
        _raise_on_bad(bad, tpot_s, "tpot_s", path, offset,
                      f"about (e2e_s - ttft_s) / (output_tokens - 1) = {gap:.3g} s: every "
                      "latency in seconds (is tpot_s in ms?)")


# How far the log's own TPOT percentiles may stray from those of the gaps its TTFT and E2E
# leave: 3% plus half a millisecond (a log rounding its times to the ms). Rounding and a
# client's jitter moved them 1.2% at most on the shipped runs, rounded or jittered by 2 ms;
# TPOT written as e2e_s / output_tokens moved them 3.2 to 24%.
TPOT_DEFINITION_RTOL = 0.03
TPOT_DEFINITION_ATOL_S = 0.5e-3
TPOT_CHECKED_PERCENTILES = (50, 90)  # the headline's: p99 is a log's few largest gaps


def _check_tpot_definition(tpot_s: np.ndarray, gaps_s: np.ndarray, path: Path) -> None:
    """Refuse a log whose tpot_s is another TPOT than the one the simulation measures (the
    mean gap after the first token), as its TTFT and E2E show: `fidelity` and `calibrate
    logs` would compare the two as one metric (TPOT as e2e_s / output_tokens, +8.6% at p90
    on vllm-100-1, read -12.6%)."""
    both = np.isfinite(tpot_s) & np.isfinite(gaps_s)
    if not both.any():
        return
    for q in TPOT_CHECKED_PERCENTILES:
        given, gap = float(np.percentile(tpot_s[both], q)), float(np.percentile(gaps_s[both], q))
        if abs(given - gap) > TPOT_DEFINITION_RTOL * gap + TPOT_DEFINITION_ATOL_S:
            raise ScenarioError(
                f"{path.name}: tpot_s's p{q} = {given:.4g} s, expected about the p{q} of "
                f"(e2e_s - ttft_s) / (output_tokens - 1), {gap:.4g} s, over the same "
                f"{int(both.sum())} requests (TPOT: the mean gap between output tokens after "
                "the first, not e2e_s / output_tokens); drop the tpot_s column to derive it")


# A measured latency under another unit's name: refused where its seconds column is absent,
# as it would go uncompared (`_refuse_other_units`).
# Unit suffixes a latency column may carry, and how many of each make a second; seconds
# under another name are here too, as the column would go unread all the same.
OTHER_UNITS = {"ms": 1e3, "msec": 1e3, "millis": 1e3, "milliseconds": 1e3,
               "us": 1e6, "usec": 1e6, "micros": 1e6, "microseconds": 1e6,
               "ns": 1e9, "nsec": 1e9, "nanos": 1e9, "nanoseconds": 1e9,
               "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0}


def _measured_columns(path: Path) -> pd.DataFrame:
    header = [str(c) for c in read_csv(path, nrows=0).columns]
    _refuse_other_units(header, path)
    present = [c for c in MEASURED_COLUMNS if c in header]
    if not present:
        raise ScenarioError(f"{path.name}: no measured column; expected any of "
                         f"{', '.join(MEASURED_COLUMNS)}")
    # Only an empty cell is "not measured": pandas' own NA words ('NaN', 'null', 'NA') would
    # pass for it, where a log that wrote them meant something else (or nothing at all).
    measured = read_csv(path, usecols=present, dtype=str, keep_default_na=False, na_values=[""])
    return pd.DataFrame({c: _seconds(measured, c, path) if c in present else np.nan
                         for c in MEASURED_COLUMNS})


# A measured latency under another benchmark's name: vLLM's `e2el`, AIPerf's
# `request_latency`, `time_to_first_token` and `inter_token_latency` (orcasim's TPOT, as
# AIPerf defines it). In a CSV of orcasim's columns they went unread: `e2el_ms` beside
# `ttft_s` compared TTFT alone, and its E2E and TPOT went uncompared without a word.
OTHER_NAMES = {"e2el": "e2e", "e2e_latency": "e2e", "request_latency": "e2e", "latency": "e2e",
               "time_to_first_token": "ttft", "inter_token_latency": "tpot"}


def _latency_name(column: str) -> tuple[str, str, str | None] | None:
    """The measured metric a column names (`ttft`, `tpot`, `e2e`), its name and its unit
    suffix (None where it has none), or None for a column of orcasim's or of no latency."""
    lower = column.lower()
    stem, _, unit = lower.rpartition("_")
    if unit in OTHER_UNITS or unit == "s":
        if f"{stem}_s" in MEASURED_COLUMNS:
            return stem, stem, unit
        if stem in OTHER_NAMES:
            return OTHER_NAMES[stem], stem, unit
    return (OTHER_NAMES[lower], lower, None) if lower in OTHER_NAMES else None


def _refuse_other_units(header: list[str], path: Path) -> None:
    """A column such as `ttft_ms` (or `e2el_ms`, vLLM's name) where the log has no `ttft_s`
    (`e2e_s`): the metric would go uncompared without a word (a tester's finding), so it is
    named, with the division. A TPOT in other units or names beside ttft_s and e2e_s is not:
    TPOT is derived from those, as it was."""
    derived = {"ttft_s", "e2e_s"} <= set(header)
    for column in header:
        named = _latency_name(column)
        if named is None:
            continue
        metric, name, unit = named
        if (metric == "tpot" and derived) or f"{metric}_s" in header:
            continue
        factor = OTHER_UNITS.get(unit or "", 1.0)
        how = ("unit not said" if unit is None else "only the name differs" if factor == 1.0
               else f"{unit} / {factor:,.0f}")
        called = f"{name} is {metric}_s by another name; " if name != metric else ""
        raise ScenarioError(f"{path.name}: column '{column}' is not read: expected {metric}_s, "
                            f"in seconds ({called}its {how})")


def _seconds(rows: pd.DataFrame, column: str, path: Path) -> np.ndarray:
    """A measured latency column: a number >= 0, or empty (not measured for that request)."""
    values = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = (rows[column].notna().to_numpy() & ~np.isfinite(values)) | (values < 0)
    _raise_on_bad(bad, rows[column], column, path, 2, "a number of seconds >= 0 or empty")
    return values


def _read_rows(path: Path, fmt: str, max_requests: int | None) -> tuple[pd.DataFrame, np.ndarray, int]:
    """The rows, with the lengths under the format's LENGTH_COLUMNS, the arrival times, and
    the line number of the first row (for errors; JSON_LISTS or JSON_LINES where the rows'
    index says where each is)."""
    match fmt:
        case "orcasim":
            _refuse_json(path, fmt)
            rows = _read_csv(path, ORCASIM_COLUMNS, max_requests)
            arrival_s = _numbers(rows, "arrival_s", path, line_offset=2)
            _raise_on_bad(arrival_s >= UNIX_MS_S, rows["arrival_s"], "arrival_s", path, 2,
                          f"seconds, below {UNIX_MS_S:g} (a Unix time in seconds is read from "
                          "the first request on; this one is in ms, us or ns)")
            return rows, _from_earliest_text(rows["arrival_s"], arrival_s), 2
        case "azure":
            _refuse_json(path, fmt)
            rows = _read_csv(path, AZURE_COLUMNS, max_requests)
            return rows, _azure_seconds(rows, path), 2
        case "mooncake":
            rows = _read_mooncake(path, max_requests)
            timestamp_ms = _numbers(rows, "timestamp", path, JSON_LINES)
            # The earliest taken off before the ms become seconds: 1.7e12 ms (a Unix time)
            # divided first was rounded to 2.4e-7 s, and a 1 ms gap read as 0.99993 ms.
            earliest_ms = timestamp_ms.min() if len(timestamp_ms) else 0.0
            return rows, (timestamp_ms - earliest_ms) / 1000.0, JSON_LINES
        case "vllm":
            rows = _read_vllm_result(path).iloc[:max_requests]
            return rows, rows["arrival_s"].to_numpy(dtype=np.float64), JSON_LISTS
        case "aiperf":  # capped by `_first_to_arrive`, which reads it whole (finish order)
            assert max_requests is None, "an AIPerf log's first lines are not its first requests"
            rows = _read_aiperf(path)
            return rows, rows["arrival_s"].to_numpy(dtype=np.float64), JSON_LINES
    raise ScenarioError(f"unknown trace format '{fmt}'; expected auto, orcasim, azure, mooncake, "
                        "vllm or aiperf")


def _from_earliest_text(text: pd.Series, arrival_s: np.ndarray) -> np.ndarray:
    """Arrival times less the earliest, taken from their text exactly and rounded once.

    A float holds a Unix time (1.7e9 s) only to 2.4e-7 s, so rounding each time before the
    earliest was taken off moved it by up to 1.2e-7 s: arrivals 1e-7 s apart tied, and a
    log in Unix seconds replayed differently from the same log counted from 0 (a request
    admitted an iteration early; `orcasim fidelity`'s simulated percentiles of the four
    shipped vLLM runs moved by up to 2.9e-7 to 4.0e-7 of their value; a tester's finding). A file counted from 0 is read as it was, as floats (the cells'
    text has passed `_numbers`, so it is a finite number for Decimal too)."""
    if not len(arrival_s) or float(arrival_s.min()) == 0.0:
        return arrival_s
    with decimal.localcontext() as exact:
        exact.prec = 60  # above a cell's digits: the subtraction is exact
        times = [decimal.Decimal(cell) for cell in text.tolist()]
        earliest = min(times)
        return np.array([float(t - earliest) for t in times], dtype=np.float64)


# An arrival_s this large is no time in seconds (3,170 years) but a Unix time in ms (1.7e12
# in 2023), us or ns: made relative, ms stretched the run 1000 times and its replay looked
# plausible (a tester's finding); us and ns passed MAX_TIME_S, ms did not.
UNIX_MS_S = 1e11


# The "line offset" of a vLLM result's rows: they are positions in its per-request lists
# (the frame's index), not lines of the file. A Mooncake file's rows are indexed by their
# line, as blank lines are skipped.
JSON_LISTS = 0
JSON_LINES = -1
VLLM_FIELDS = ("start_times", "input_lens", "output_lens", "ttfts", "itls")


def _is_vllm_result(path: Path) -> bool:
    try:
        doc = read_json(path)
    except (OSError, ScenarioError):  # not one JSON document: JSON lines (Mooncake)
        return False
    return isinstance(doc, dict) and any(key in doc for key in VLLM_SIGNS)


# Fields every vLLM benchmark result has, with or without --save-detailed's lists: a result
# saved without them is named as one and told how to save them, not read as Mooncake's.
VLLM_SIGNS = ("input_lens", "completed", "mean_ttft_ms", "request_throughput")


def _read_vllm_result(path: Path) -> pd.DataFrame:
    """vLLM's serving benchmark result (`vllm bench serve --save-result --save-detailed`):
    parallel per-request lists. `start_times` (a monotonic clock, seconds) are when each
    request was sent; failed requests (an error, or no output) are dropped. E2E is TTFT plus
    the inter-token gaps (`itls`); TPOT their mean over output - 1 tokens."""
    try:
        doc = read_json(path)
    except ScenarioError as e:  # a CSV given as vllm: say which format reads it
        raise ScenarioError(f"{e}; format vllm reads a vLLM benchmark result's JSON (a CSV is "
                            "format orcasim or azure, or auto)") from None
    if not isinstance(doc, dict):
        raise ScenarioError(f"{path.name}: a JSON {type(doc).__name__}; expected an object with "
                            f"the lists {', '.join(VLLM_FIELDS)} (a vLLM benchmark result)")
    if isinstance(doc.get("request_throughput"), dict):  # vLLM's is a number
        # AIPerf's summary shares vLLM's request_throughput key, and was told to save a vLLM
        # result with --save-detailed.
        raise ScenarioError(f"{path.name}: AIPerf's aggregated statistics "
                            "(profile_export_aiperf.json); expected its per-request records, "
                            "profile_export.jsonl in the same artifacts folder")
    missing = [f for f in VLLM_FIELDS if f not in doc]
    if missing:
        raise ScenarioError(f"{path.name}: a vLLM benchmark result lacks {', '.join(missing)}; save "
                         "it with --save-result --save-detailed (vLLM 0.15 or newer records "
                         "start_times)")
    errors = _checked_vllm_lists(doc, path)
    if isinstance(doc.get("max_concurrency"), int) and not isinstance(doc["max_concurrency"], bool):
        # vLLM stamps start_times inside its --max-concurrency semaphore: each send waited
        # for a finish, so the times are a closed loop's, which a replay sends regardless.
        warnings.warn(f"{path.name}: run with --max-concurrency {doc['max_concurrency']}, so its "
                      "send times waited on earlier requests; they are replayed as given (an "
                      "open loop), which a slower simulated server would not have seen",
                      UserWarning, stacklevel=2)
    ok = np.array([not error and length > 0 for error, length in zip(errors, doc["output_lens"],
                                                                      strict=True)], dtype=bool)
    if len(ok) and not ok.any():  # as AIPerf's: a warning of "the others" sent alone, then
        # an error naming ttft_s, tpot_s and e2e_s, which the file has none of (calibrate logs)
        which = "its one request" if len(ok) == 1 else f"all {len(ok)} requests"
        raise ScenarioError(f"{path.name}: {which} failed (an error or no output); expected "
                            "at least one that finished")
    if not ok.all():
        _warn_of_failed(path, int((~ok).sum()), len(ok), "an error or no output")
    decode_s = np.array([float(sum(g)) for g in doc["itls"]])
    start_s = np.array(doc["start_times"], dtype=np.float64)
    output = np.array(doc["output_lens"], dtype=np.float64)
    ttft_s = np.array(doc["ttfts"], dtype=np.float64)
    frame = pd.DataFrame({
        "arrival_s": start_s - start_s[ok].min() if ok.any() else start_s,
        "input_lens": doc["input_lens"], "output_lens": doc["output_lens"],
        "ttft_s": ttft_s, "e2e_s": ttft_s + decode_s,
        "tpot_s": tpot_s(decode_s, output),
    })
    # The index stays each request's position in the result's lists, which errors name. A
    # boolean array: an empty list would pick columns, and lose them all.
    return frame[ok]


def _warn_of_failed(path: Path, failed: int, total: int, how: str) -> None:
    """Say how many of a benchmark's requests failed and are dropped, as the replay leaves
    their load out: requests fail as an overloaded server times them out, where a lighter
    replay reads faster than the real run."""
    warnings.warn(f"{path.name}: {failed} of {total} requests failed ({how}) and are dropped: "
                  "the replay sends the others alone, without the load the failed ones put on "
                  "the server", UserWarning, stacklevel=4)


def _checked_vllm_lists(doc: dict[str, Any], path: Path) -> list[Any]:
    """Refuse a result whose per-request lists are not lists of one number (or, for `itls`,
    one list of numbers) per request; the `errors` list, or no errors when it is absent.
    Checked up front because the lists are zipped and summed before the rows are read."""
    for field in (*VLLM_FIELDS, "errors"):
        values = doc.get(field)
        if not isinstance(values, list) and not (field == "errors" and values is None):
            raise ScenarioError(f"{path.name}: {field} = {str(values)[:60]}, expected a list "
                                "with one entry per request")
    n = len(doc["input_lens"])
    if any(len(doc[f]) != n for f in VLLM_FIELDS):
        raise ScenarioError(f"{path.name}: the per-request lists {', '.join(VLLM_FIELDS)} differ in length")
    errors = doc.get("errors") or [""] * n
    if len(errors) != n:
        raise ScenarioError(f"{path.name}: errors has {len(errors)} entries, expected one per "
                            f"request ({n}, as input_lens)")
    for field in ("start_times", "input_lens"):  # a prompt's length is checked as a length next
        _raise_on_bad(np.array([not _is_number(v) for v in doc[field]], dtype=bool),
                      pd.Series(doc[field], dtype=object), field, path, JSON_LISTS, "a number")
    # vLLM writes 0 for a failed request (dropped); a negative count was dropped as one too.
    _raise_on_bad(np.array([not (_is_number(v) and v >= 0) for v in doc["output_lens"]], dtype=bool),
                  pd.Series(doc["output_lens"], dtype=object), "output_lens", path, JSON_LISTS,
                  "a token count >= 0")
    _raise_on_bad(np.array([not (_is_number(v) and v >= 0) for v in doc["ttfts"]], dtype=bool),
                  pd.Series(doc["ttfts"], dtype=object), "ttfts", path, JSON_LISTS,
                  "a number of seconds >= 0")
    # Fewer gaps than output tokens - 1 is fine: a streamed chunk may carry several tokens.
    _raise_on_bad(np.array([not (isinstance(g, list) and all(_is_number(t) and t >= 0 for t in g))
                            for g in doc["itls"]], dtype=bool),
                  pd.Series(doc["itls"], dtype=object), "itls", path, JSON_LISTS,
                  "a list of numbers >= 0 (seconds between output tokens)")
    return list(errors)


def _is_number(value: object) -> bool:
    """A finite JSON number; not a boolean (Python's bool is an int), null or string."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond any float
        return False


def _detect_format(path: Path) -> str:
    suffix = data_suffix(path)
    if suffix == ".json" and _is_vllm_result(path):
        return "vllm"
    if suffix in (".jsonl", ".json"):
        return "aiperf" if _is_aiperf_export(path) else "mooncake"
    header = read_csv(path, nrows=0).columns
    if set(ORCASIM_COLUMNS) <= set(header):
        return "orcasim"
    if set(AZURE_COLUMNS) <= set(header):
        return "azure"
    raise ScenarioError(
        f"{path.name}: cannot tell the trace format from columns {shown_columns(list(header))}; expected "
        f"{', '.join(ORCASIM_COLUMNS)} (orcasim) or {', '.join(AZURE_COLUMNS)} (azure); a vLLM "
        "benchmark result is read by its .json name or --format vllm"
    )


def _refuse_json(path: Path, fmt: str) -> None:
    """A JSON document forced as a CSV format: read as CSV, a vLLM result was refused as a
    column ' 13' named twice (a tester's finding). By content: a CSV named .json is read."""
    if data_suffix(path) in (".json", ".jsonl") and _is_json_document(path):
        raise ScenarioError(f"{path.name}: a JSON file, where format {fmt} reads a CSV; expected "
                            "format vllm (a vLLM benchmark result), mooncake (JSON lines) or auto")


def _is_json_document(path: Path) -> bool:
    try:
        return isinstance(read_json(path), dict | list)
    except (OSError, ScenarioError):
        return False


def _read_csv(path: Path, columns: tuple[str, ...], max_requests: int | None) -> pd.DataFrame:
    header = read_csv(path, nrows=0).columns
    missing = [c for c in columns if c not in header]
    if missing:
        raise ScenarioError(f"{path.name}: missing column(s) {', '.join(missing)}")
    # Only an empty cell is empty: pandas' NA words ('NaN', 'NA', 'null') are quoted as
    # written in an error, not read as nothing (a tester's finding; as _measured_columns).
    return read_csv(path, usecols=list(columns), nrows=max_requests, dtype=str,
                    keep_default_na=False, na_values=[""])


def _read_mooncake(path: Path, max_requests: int | None) -> pd.DataFrame:
    """One record per non-blank line, indexed by its line (files joined by `cat` often end
    in a blank one)."""
    records: list[tuple[object, object, object, object]] = []
    lines: list[int] = []
    try:
        with decompressing(path), open_text(path) as f:
            for line_no, line in enumerate(f, start=1):
                if max_requests is not None and len(records) >= max_requests:
                    break
                if line.strip():
                    records.append(_mooncake_record(line, line_no, path))
                    lines.append(line_no)
    except UnicodeDecodeError:
        raise ScenarioError(f"{path.name}: not UTF-8 text; expected JSON lines") from None
    return pd.DataFrame(records, index=lines,
                        columns=["timestamp", *LENGTH_COLUMNS["mooncake"], "hash_ids"])


def _mooncake_record(line: str, line_no: int, path: Path) -> tuple[object, object, object, object]:
    try:
        obj = json.loads(line)
        record = (obj["timestamp"], obj["input_length"], obj["output_length"], obj.get("hash_ids"))
    except json.JSONDecodeError as e:
        raise _bad_mooncake(path, line_no, f"not JSON: {e.msg} at column {e.colno}") from None
    except (KeyError, TypeError) as e:
        what = f"no key {e}" if isinstance(e, KeyError) else "not a JSON object"
        if isinstance(obj, dict) and any(key in obj for key in VLLM_SIGNS):  # read as lines:
            # a format forced on one result, or several results appended to one file
            raise ScenarioError(
                f"{path.name} line {line_no}: a vLLM benchmark result, not a Mooncake record; "
                "expected format: vllm (or auto) and one result a file (--append-result "
                "writes several to one)") from None
        raise _bad_mooncake(path, line_no, what) from None
    for key, value in zip(("timestamp", *LENGTH_COLUMNS["mooncake"]), record, strict=False):
        if isinstance(value, bool):  # JSON true is not a length of 1
            raise ScenarioError(f"{path.name} line {line_no}: {key} = {json.dumps(value)}, "
                                "expected a number")
    return record


def _bad_mooncake(path: Path, line_no: int, what: str) -> ScenarioError:
    # A .json file is a vLLM benchmark result when it parses as one document.
    also = ("; nor is the file one JSON document with input_lens (a vLLM benchmark result)"
            if data_suffix(path) == ".json" else "")
    return ScenarioError(f"{path.name} line {line_no}: bad Mooncake record ({what}){also}")


# NVIDIA AIPerf's per-request records (`aiperf profile`, artifacts/<run>/profile_export.jsonl;
# docs/tutorials/working-with-profile-exports.md and docs/metrics_reference.md in
# ai-dynamo/aiperf): one JSON object a line, {"metadata": {...}, "metrics": {name: {"value",
# "unit"}}, "error": null | {...}}. Its inter_token_latency is (request_latency - ttft) /
# (output_sequence_length - 1), orcasim's TPOT, so TPOT is derived from the two, as it is
# from an orcasim CSV without tpot_s.
AIPERF_START_KEYS = ("request_start_ns", "timestamp_ns")  # newer, older exports
AIPERF_SECONDS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
# AIPerf stamps a request's start with time.time_ns(): 1.7e18 in 2024. Below 1e17 (1973) is
# no such time but a Unix time in us (1.7e15), ms or s, read as ns it packed a run's
# arrivals 1000 times closer or more, silently.
AIPERF_EPOCH_NS_MIN = 10**17
AIPERF_COLUMNS = ("start_ns", *LENGTH_COLUMNS["aiperf"], "ttft_s", "e2e_s", "later_turn")


def _is_aiperf_export(path: Path) -> bool:
    """Whether the first non-blank line is an AIPerf record: an object with a metadata
    object, which no Mooncake record has (AIPerf's raw export, without metrics, is named
    by the AIPerf reader, where Mooncake's said "no key 'timestamp'")."""
    try:
        with decompressing(path), open_text(path) as f:
            for line in f:
                if line.strip():
                    obj = json.loads(line)
                    return isinstance(obj, dict) and isinstance(obj.get("metadata"), dict)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return False


def _read_aiperf(path: Path) -> pd.DataFrame:
    """The successful records, indexed by their line: `arrival_s` (seconds after the first
    kept request's start), the lengths, `ttft_s` (NaN where the run did not stream), `e2e_s`
    and `tpot_s` (NaN: derived). A failed or cancelled record is dropped, with a warning
    saying how many, as vLLM's failed requests are."""
    kept: list[tuple[object, ...]] = []
    lines: list[int] = []
    failed = total = 0
    try:
        with decompressing(path), open_text(path) as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                total += 1
                record = _aiperf_record(line, line_no, path)
                if record is None:
                    failed += 1
                else:
                    kept.append(record)
                    lines.append(line_no)
    except UnicodeDecodeError:
        raise ScenarioError(f"{path.name}: not UTF-8 text; expected JSON lines") from None
    if failed and failed == total:  # said here: the warning is lost with the error it precedes
        which = "its one request" if total == 1 else f"all {total} requests"
        raise ScenarioError(f"{path.name}: {which} failed (an error, a cancellation or no "
                            "output); expected at least one that finished")
    if failed:
        _warn_of_failed(path, failed, total, "an error, a cancellation or no output")
    rows = pd.DataFrame(kept, index=lines, columns=list(AIPERF_COLUMNS))
    _warn_of_later_turns(int(rows["later_turn"].sum()), len(rows), path)
    start_ns = rows["start_ns"].to_numpy(dtype=np.int64)
    # Relative in integer nanoseconds: epoch times as floats keep only about 0.2 us.
    rows["arrival_s"] = (start_ns - (start_ns.min() if len(rows) else 0)) / 1e9
    rows["tpot_s"] = np.nan
    return rows.drop(columns=["start_ns", "later_turn"])


def _warn_of_later_turns(later: int, kept: int, path: Path) -> None:
    """Say that a multi-turn run's later turns are replayed at their logged times: AIPerf
    sends a session's next turn as its previous one finishes, so those times waited on the
    real server, as vLLM's under --max-concurrency did (which is warned of too)."""
    if later:
        warnings.warn(f"{path.name}: {later} of {kept} requests are later turns of multi-turn "
                      "sessions (metadata.turn_index > 0), each sent as its previous turn "
                      "finished; they are replayed as given (an open loop), which a slower "
                      "simulated server would not have seen", UserWarning, stacklevel=3)


def _aiperf_record(line: str, line_no: int, path: Path) -> tuple[object, ...] | None:
    """A successful record's start time (ns), lengths and latencies; None for a failed one."""
    where = f"{path.name} line {line_no}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ScenarioError(f"{where}: not JSON ({e.msg} at column {e.colno}); expected an "
                            "AIPerf record") from None
    # Every record has its metrics object, {} for a failed one: a record without it is no
    # such record (profile_export_raw.jsonl's raw requests read as all failed).
    if not (isinstance(obj, dict) and isinstance(obj.get("metadata"), dict)
            and isinstance(obj.get("metrics"), dict)):
        raise ScenarioError(f"{where}: not an AIPerf record; expected an object with a "
                            "metadata and a metrics object (profile_export.jsonl's records, "
                            "not profile_export_raw.jsonl's)")
    meta, metrics = obj["metadata"], obj["metrics"]
    if obj.get("error") is not None or meta.get("was_cancelled") is True:
        return None
    start = next((meta[k] for k in AIPERF_START_KEYS if meta.get(k) is not None), None)
    if not (isinstance(start, int) and not isinstance(start, bool) and start >= AIPERF_EPOCH_NS_MIN):
        raise ScenarioError(f"{where}: metadata.request_start_ns = {json.dumps(start)}, "
                            "expected the request's start in integer nanoseconds since the Unix "
                            f"epoch (time.time_ns(), {AIPERF_EPOCH_NS_MIN:.0e} or more; a Unix "
                            "time in s, ms or us is smaller)")
    turn = meta.get("turn_index")
    record = (start, _aiperf_value(metrics, "input_sequence_length", where, None),
              _aiperf_value(metrics, "output_sequence_length", where, None),
              _aiperf_value(metrics, "time_to_first_token", where, AIPERF_SECONDS),
              _aiperf_value(metrics, "request_latency", where, AIPERF_SECONDS),
              isinstance(turn, int) and not isinstance(turn, bool) and turn > 0)
    # No output, or no end: failed, as vLLM's benchmark counts a request without output.
    if record[2] in (None, 0) or record[4] is None:
        return None
    if record[1] is None:  # named, where the length check said "input_sequence_length = nan"
        raise ScenarioError(f"{where}: metrics has no input_sequence_length, expected the "
                            "prompt's length in tokens")
    return record


def _aiperf_value(metrics: dict[str, Any], name: str, where: str,
                  seconds: dict[str, float] | None) -> float | None:
    """A metric's value, a number, in seconds where `seconds` gives its unit's size; None if
    absent. Lengths are checked as lengths, and latencies as latencies, downstream."""
    metric = metrics.get(name)
    if metric is None:
        return None
    if not isinstance(metric, dict) or "value" not in metric:
        raise ScenarioError(f"{where}: metrics.{name} = {json.dumps(metric)[:60]}, expected "
                            "an object with a value and a unit")
    value = metric["value"]
    # Before the lengths are returned: pandas reads true as 1 token and "7" as 7 (JSON true
    # is no length; Mooncake's reader refuses it too).
    if not _is_number(value):
        raise ScenarioError(f"{where}: metrics.{name}.value = {json.dumps(value)[:60]}, "
                            "expected a number")
    if seconds is None:
        return value
    unit = metric.get("unit")
    if unit not in seconds:
        raise ScenarioError(f"{where}: metrics.{name}.unit = {json.dumps(unit)}, expected one "
                            f"of {', '.join(seconds)}")
    # A negative latency, as the CSV and vLLM readers refuse one: it was read, and a
    # negative TTFT fell out of the fit's log-ratios and into the fidelity table silently.
    if value < 0:
        raise ScenarioError(f"{where}: metrics.{name}.value = {json.dumps(value)}, expected a "
                            f"number of {unit} >= 0")
    return float(value) * seconds[unit]


def _numbers(rows: pd.DataFrame, column: str, path: Path, line_offset: int) -> np.ndarray:
    values = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values < 0)
    _raise_on_bad(bad, rows[column], column, path, line_offset, "a number >= 0")
    return values


def _token_counts(rows: pd.DataFrame, column: str, path: Path, line_offset: int) -> np.ndarray:
    values = pd.to_numeric(rows[column], errors="coerce").to_numpy(dtype=np.float64)
    _raise_on_bad(bad_lengths(values), rows[column], column, path, line_offset, LENGTH_EXPECTED)
    return values.astype(np.int64)


# A time alone, a spreadsheet's display of a timestamp (17:03.9, minutes and seconds; or
# 11:59:59 PM; or ISO's T18:17:03), which pandas would read as today: a trace crossing
# midnight would be reordered. Any form with a date is pandas' to read.
_TIME_ALONE = (r"(?i)^\s*T?\d{1,2}:\d{1,2}(?::\d{1,2})?(?:\.\d*)?\s*(?:[AP]\.?M\.?)?"
               r"\s*(?:Z|[+-]\d{2}(?::?\d{2})?|UTC|GMT)?\s*$")


def _azure_seconds(rows: pd.DataFrame, path: Path) -> np.ndarray:
    text = rows["TIMESTAMP"]
    _raise_on_bad(text.str.match(_TIME_ALONE, na=False).to_numpy(),
                  text, "TIMESTAMP", path, 2,
                  "a date and time, as 2023-11-16 18:17:03.9799600 (a spreadsheet may show and "
                  "save the time alone)")
    day_first = _day_first(text, path)
    try:
        stamps = pd.to_datetime(text, errors="coerce", format="mixed", dayfirst=day_first)
    except ValueError:  # pandas refuses timestamps of different UTC offsets in one column
        stamps = _utc_instants(text, path, day_first)
    _raise_on_bad(stamps.isna().to_numpy(), rows["TIMESTAMP"], "TIMESTAMP", path, 2, "a timestamp")
    # By unit, not by assuming nanoseconds: pandas infers the resolution from the text
    # (seconds, ms, us or ns), and the Azure 2024 trace's six fractional digits give
    # microseconds, which read as nanoseconds would replay 1000x too fast.
    return (stamps - stamps.min()).dt.total_seconds().to_numpy(dtype=np.float64)


# A date written with its year last (12/05/2024, 12.05.2024): day or month first.
_YEAR_LAST = r"^\s*(\d{1,2})[/.-](\d{1,2})[/.-]\d{2,4}\b"


def _day_first(text: pd.Series, path: Path) -> bool:
    """Whether the year-last dates of a column put the day first, decided for the column:
    pandas' mixed format guesses per cell, so 12/05 (read as 5 December) then 13/05 (13
    May) were swapped and months apart. A day over 12 in either place settles it; both
    places is refused, and so is a column whose dates differ and none of which settles it."""
    parts = text.str.extract(_YEAR_LAST).apply(pd.to_numeric)  # NaN where not year-last
    over_first, over_second = (parts[0] > 12).to_numpy(), (parts[1] > 12).to_numpy()
    if over_first.any() and over_second.any():
        _raise_on_bad(over_second, text, "TIMESTAMP", path, 2,
                      f"the day first, as {text.iloc[over_first.argmax()]!r} has it (one order "
                      "of day and month for the file; ISO dates, 2024-05-13, have one)")
    if not over_first.any() and not over_second.any() and len(parts.dropna().drop_duplicates()) > 1:
        raise ScenarioError(
            f"{path.name}: TIMESTAMP dates such as {text[parts[0].notna()].iloc[0]!r} read as "
            "day/month or month/day, and no day over 12 tells which; expected ISO dates (2024-05-13)")
    return bool(over_first.any())


def _utc_instants(raw: pd.Series, path: Path, day_first: bool) -> pd.Series:
    """Timestamps with different UTC offsets, as UTC instants (each names one moment, so
    their gaps are real). One without an offset among them is ambiguous: refused, as
    reading it as UTC would shift its arrival silently by hours."""
    naive = np.array([_is_naive(text) for text in raw], dtype=bool)
    _raise_on_bad(naive, raw, "TIMESTAMP", path, 2,
                  "a UTC offset, as other timestamps of the file have (without one, the time is ambiguous)")
    return pd.to_datetime(raw, errors="coerce", format="mixed", utc=True, dayfirst=day_first)


def _is_naive(text: object) -> bool:
    """Whether `text` reads as a timestamp without a UTC offset (not one: named later)."""
    try:
        stamp = pd.Timestamp(text)
    except (TypeError, ValueError):
        return False
    return not pd.isna(stamp) and stamp.tzinfo is None


def _raise_on_bad(
    bad: np.ndarray, raw: pd.Series, column: str, path: Path, line_offset: int, expected: str
) -> None:
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        where = (f"request {raw.index[row]}" if line_offset == JSON_LISTS
                 else f"line {_line_of(path, raw, row, line_offset)}")
        value = raw.iloc[row]
        value = value.item() if isinstance(value, np.generic) else value  # 0, not np.int64(0)
        if line_offset == 2 and pd.isna(value):  # CSV cells are read as text: NaN is empty
            raise ScenarioError(f"{path.name} {where}: {column} is empty, expected {expected}")
        raise ScenarioError(f"{path.name} {where}: {column} = {value!r}, expected {expected}")


def _line_of(path: Path, raw: pd.Series, row: int, line_offset: int) -> int:
    """The file line of data row `row` (a position in `raw`): JSON lines' rows are indexed by
    their line; a CSV's by their data row (a header, then data), blank lines counted back in.
    By the index, not the position: a capped log not in arrival order keeps some of its rows
    (the first to arrive), and the position named the wrong line (a tester's finding)."""
    return int(raw.index[row]) if line_offset == JSON_LINES else csv_data_line(path, int(raw.index[row]))


# What each format's arrival times are, for an error about their span: a Mooncake trace was
# told to give its times in seconds, which it would read as milliseconds (a tester's finding).
TIMES_EXPECTED = {"orcasim": "arrival times in seconds (are they in ms or us?)",
                  "azure": "TIMESTAMP dates of one period (is a year wrong?)",
                  "mooncake": "timestamp in milliseconds (are they in us or ns?)",
                  "vllm": "start_times in seconds (are they in ms or us?)",
                  "aiperf": "metadata.request_start_ns of one run"}


def times_expected(path: str, fmt: str) -> str:
    """What the arrival times of `path` (read as `fmt`, or as detected) are expected to be."""
    resolved = resolve_data_path(path)
    return TIMES_EXPECTED[_detect_format(resolved) if fmt == "auto" else fmt]


def where_in_trace(path: str, fmt: str, max_requests: int | None, request: int) -> str:
    """Where request `request` (its id: its rank by arrival time) sits in its trace file, for
    an error found after the trace was sorted: 'trace.csv line 5', or 'result.json request 3'
    for a JSON file of lists."""
    resolved = resolve_data_path(path)
    fmt = _detect_format(resolved) if fmt == "auto" else fmt
    rows, arrival_s, offset = _first_to_arrive(resolved, fmt, max_requests)
    row = int(np.argsort(arrival_s, kind="stable")[request])
    if offset == JSON_LISTS:
        return f"{resolved.name} request {rows.index[row]}"
    return f"{resolved.name} line {_line_of(resolved, rows.iloc[:, 0], row, offset)}"


def _sorted_from_zero(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> Trace:
    if len(arrival_s) == 0:
        raise ScenarioError("trace has no requests")
    order = np.argsort(arrival_s, kind="stable")
    arrival_s = arrival_s[order]
    return arrival_s - arrival_s[0], prompt[order], output[order]
