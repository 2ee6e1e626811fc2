"""The profiler: time real selective-batched iterations over a grid of batch shapes.

Each grid point is a batch given as (query_tokens, context_tokens) per request, the same
description as `orcasim.cost.base.Batch`. Timing: warm-up runs, then repeated runs with the
median kept; Python's GC is paused while timing, and on CUDA the device is synchronised
around each run. Each row also reports achieved FLOP/s and bytes/s (gpt-fast style) so one
can see how far a shape is from the hardware's roofline.
"""

from __future__ import annotations

import gc
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from calibrate.fit import DEFAULT_KNOTS_TOKENS, determined, inputs_of, rows_to_fit
from calibrate.model import ModelArgs, Sequence, Transformer
from orcasim.config import ScenarioError
from orcasim.cost.fitted import RANGE_INPUTS, batch_inputs, design_matrix, term_names
from orcasim.paths import read_csv
from orcasim.results import write_file_atomically

Shape = tuple[list[int], list[int]]  # (query_tokens, context_tokens) per request


@dataclass(frozen=True)
class Grid:
    """Axes of the profile grid; small batches are dense because serving runs there."""

    decode_batch: tuple[int, ...]
    decode_context: tuple[int, ...]
    prefill_len: tuple[int, ...]
    prompts_per_batch: tuple[int, ...]
    chunk: tuple[int, ...]
    chunk_offset: tuple[int, ...]
    mixed_decode_batch: tuple[int, ...]
    mixed_prompt: tuple[int, ...]
    repeats: int  # timed runs per shape and round
    rounds: int
    warmup: int


GRIDS = {
    "default": Grid(
        decode_batch=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
        decode_context=(8, 32, 64, 128, 256, 512, 1024),
        prefill_len=(2, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024),
        prompts_per_batch=(1, 2, 4),
        chunk=(32, 64, 128, 256),
        chunk_offset=(64, 256, 512),
        mixed_decode_batch=(1, 2, 4, 8, 16),
        mixed_prompt=(8, 32, 64, 128, 256, 512),
        repeats=5,
        rounds=3,
        warmup=2,
    ),
    "ci": Grid(
        decode_batch=(1, 2, 4, 8, 16),
        decode_context=(8, 64, 256, 384),
        prefill_len=(4, 16, 64, 128, 256, 384),
        prompts_per_batch=(1, 3),
        chunk=(32, 128),
        chunk_offset=(128,),
        mixed_decode_batch=(2, 8, 16),
        mixed_prompt=(16, 64, 128),
        repeats=3,
        rounds=2,
        warmup=1,
    ),
}


def grid_shapes(grid: Grid, max_tokens: int) -> list[tuple[str, Shape]]:
    """Every batch shape of the grid, labelled decode / prefill / chunk / mixed."""
    out: list[tuple[str, Shape]] = []
    for b in grid.decode_batch:
        for c in grid.decode_context:
            out.append(("decode", ([1] * b, [c] * b)))
    for n in grid.prompts_per_batch:
        for p in grid.prefill_len:
            out.append(("prefill", ([p] * n, [p] * n)))
    for q in grid.chunk:
        for off in grid.chunk_offset:
            out.append(("chunk", ([q], [off + q])))
    for b in grid.mixed_decode_batch:
        for p in grid.mixed_prompt:
            for c in (grid.decode_context[1], grid.decode_context[-1]):
                out.append(("mixed", ([1] * b + [p], [c] * b + [p])))
    return [(k, s) for k, s in out if max(s[1]) <= max_tokens]


def largest_context(grid: Grid, max_tokens: int) -> int:
    """The longest context of the grid's shapes up to `max_tokens`: the positions they use."""
    return max((max(s[1]) for _, s in grid_shapes(grid, max_tokens)), default=1)


def check_grid_fits(grid: Grid, max_tokens: int) -> None:
    """Refuse a grid whose shapes up to `max_tokens` cannot fit the default knots' terms (too
    few, or too alike: no prompt past a knot), before any is timed: `fit` would refuse the
    profile. The rank does not depend on the times, only on the shapes."""
    shapes = grid_shapes(grid, max_tokens)
    least = rows_to_fit(DEFAULT_KNOTS_TOKENS)
    if len(shapes) < least:
        raise ScenarioError(f"{len(shapes)} batch shape(s) within it; expected at least {least}")
    rows = pd.DataFrame([batch_inputs(np.array(q, dtype=np.int64), np.array(c, dtype=np.int64))
                         for _, (q, c) in shapes])
    knots = list(DEFAULT_KNOTS_TOKENS)
    rank, terms = determined(design_matrix(inputs_of(rows), knots), np.ones(len(rows))), len(term_names(knots))
    if rank < terms:
        raise ScenarioError(f"shapes that determine {rank} of the {terms} coefficients (too few "
                            f"tokens past the {knots[-1]}-token knot); expected all {terms}")


def make_batch(model: Transformer, shape: Shape, rng: np.random.Generator) -> list[tuple[Sequence, int]]:
    """Sequences whose caches already hold `context - query` tokens of random values."""
    # The values come from `rng` too, not torch's global generator: that one was never seeded,
    # so --seed fixed the tokens but not the caches, and each batch moved a caller's stream.
    gen = torch.Generator(device=model.lm_head.weight.device).manual_seed(int(rng.integers(2**62)))
    batch = []
    for q, c in zip(*shape, strict=True):
        seq = model.new_sequence(rng.integers(0, model.args.vocab_size, c).tolist(), c)
        # Real values: uninitialised memory may hold denormals or NaN.
        seq.cache_k.normal_(generator=gen)
        seq.cache_v.normal_(generator=gen)
        seq.num_computed = c - q
        batch.append((seq, q))
    return batch


def time_iteration(model: Transformer, batch: list[tuple[Sequence, int]],
                   grid: Grid) -> list[tuple[float, float, float]]:
    """(wall, thread CPU, device) seconds per run of one serving step on the same batch,
    warm-up runs dropped. Wall time (with synchronisation) is what serving pays, launch
    overhead included; CUDA events give the device's share (NaN on CPU). With one torch
    thread, CPU time < wall time means another process had the core."""
    starts = [seq.num_computed for seq, _ in batch]
    cuda = model.lm_head.weight.is_cuda
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else []
    times = []
    gc.disable()
    try:
        for i in range(grid.warmup + grid.repeats):
            for seq, start in zip((s for s, _ in batch), starts, strict=True):
                seq.num_computed = start
            if cuda:
                torch.cuda.synchronize()
                events[0].record()
            t0, c0 = time.perf_counter(), time.thread_time()
            model.decode_greedy(batch)  # includes the argmax and copy back, as serving does
            if cuda:
                events[1].record()
                torch.cuda.synchronize()
            wall_s, cpu_s = time.perf_counter() - t0, time.thread_time() - c0
            device_s = events[0].elapsed_time(events[1]) / 1e3 if cuda else float("nan")
            if i >= grid.warmup:
                times.append((wall_s, cpu_s, device_s))
    finally:
        gc.enable()
    return times


def flops_and_bytes(args: ModelArgs, shape: Shape, dtype_bytes: int) -> tuple[float, float]:
    """Forward FLOPs and minimum bytes moved by one iteration.

    FLOPs: 2 per weight per token for the matmuls (Kaplan et al. 2020, section 2.1), plus
    attention's QKᵀ and AV, 2·2·d per (query, key) pair and layer, plus the LM head on one
    token per request. Bytes: every weight once, plus each request's KV cache read once.
    """
    q, c = np.array(shape[0]), np.array(shape[1])
    L, d = args.n_layers, args.d_model
    weights = L * args.params_per_layer()
    pairs = float((q * c).sum())  # an upper bound for causal prompts; exact for decode
    flops = 2.0 * weights * q.sum() + 4.0 * L * d * pairs + 2.0 * d * args.vocab_size * len(q)
    kv_dim = args.kv_heads * args.head_dim
    bytes_moved = dtype_bytes * (weights + d * args.vocab_size + 2.0 * L * kv_dim * c.sum())
    return float(flops), float(bytes_moved)


def profile_rows(model: Transformer, grid: Grid, max_tokens: int, layer_scale: float,
                 rng: np.random.Generator, progress: Callable[[str], None]) -> pd.DataFrame:
    """One row per grid shape. The grid is walked `rounds` times, each in a new random order,
    so that a burst of load from another process on a shared machine hits a shape in one
    round only, and the median over all rounds' runs discards it."""
    shapes = grid_shapes(grid, max_tokens)
    times: list[list[tuple[float, float, float]]] = [[] for _ in shapes]
    heads: list[list[tuple[float, float, float]]] = [[] for _ in shapes]
    for r in range(grid.rounds):
        for i in rng.permutation(len(shapes)):
            times[i] += time_iteration(model, make_batch(model, shapes[i][1], rng), grid)
            if layer_scale != 1:
                heads[i] += _time_head(model, shapes[i][1], rng, grid)
        progress(f"round {r + 1}/{grid.rounds}: {len(shapes)} shapes")
    dtype_bytes = model.lm_head.weight.element_size()
    return pd.DataFrame([
        profile_row(model.args, kind, shape, t, layer_scale, dtype_bytes, h)
        for (kind, shape), t, h in zip(shapes, times, heads, strict=True)
    ])


def _time_head(model: Transformer, shape: Shape, rng: np.random.Generator,
               grid: Grid) -> list[tuple[float, float, float]]:
    """The step without its layers (embedding, final norm, LM head, sampling): the part that
    does not grow with depth, kept out of the scaling to the whole model. Scaled with the
    layers, GPT-3 13B's LM head (257M weights) read ten times over priced a 4-of-40-layer
    decode step ~18% over (a tester's finding)."""
    layers = model.layers
    model.layers = nn.ModuleList()
    try:
        return time_iteration(model, make_batch(model, shape, rng), grid)
    finally:
        model.layers = layers


def profile_row(args: ModelArgs, kind: str, shape: Shape, runs: list[tuple[float, float, float]],
                layer_scale: float, dtype_bytes: int,
                head_runs: list[tuple[float, float, float]] | None = None) -> dict[str, object]:
    """`time_s` is the whole model's step: the layers' share of the measured step scaled by
    `layer_scale`, plus the embedding and LM head's (`head_s`, timed alone) once."""
    times = [run[0] for run in runs]
    median_s = statistics.median(times)
    head_s = min(statistics.median(run[0] for run in head_runs), median_s) if head_runs else 0.0
    flops, bytes_moved = flops_and_bytes(args, shape, dtype_bytes)
    inputs = batch_inputs(np.array(shape[0]), np.array(shape[1]))
    return {
        "kind": kind, **{k: int(v) for k, v in inputs.items()},
        "time_s": head_s + (median_s - head_s) * layer_scale, "measured_s": median_s,
        "head_s": head_s if head_runs else float("nan"),
        "cpu_s": statistics.median(run[1] for run in runs),
        "device_s": statistics.median(run[2] for run in runs),
        "p10_s": float(np.percentile(times, 10)), "p90_s": float(np.percentile(times, 90)),
        "repeats": len(times), "flop_per_s": flops / median_s, "bytes_per_s": bytes_moved / median_s,
        "query_tokens": " ".join(map(str, shape[0])), "context_tokens": " ".join(map(str, shape[1])),
    }


def header_lines(model_name: str, args: ModelArgs, full_layers: int, device: str,
                 dtype: torch.dtype, grid_name: str) -> list[str]:
    """Provenance, written as `# key: value` lines above the CSV."""
    device_name = torch.cuda.get_device_name() if device == "cuda" else cpu_name()
    return [
        f"model: {model_name}",
        f"layers_profiled: {args.n_layers}",
        f"layers_full: {full_layers}",
        f"dtype: {str(dtype).removeprefix('torch.')}",
        f"device: {device}",
        f"device_name: {device_name}",
        "tensor_parallel: 1",  # one device: what orcasim.cost.fitted checks a deployment against
        f"torch: {torch.__version__}",
        f"threads: {torch.get_num_threads()}",
        f"grid: {grid_name}",
        f"date: {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}",
        "time_s: head_s + (median wall time - head_s) * layers_full / layers_profiled; "
        "measured_s: unscaled",
        "head_s: median wall time of the step without its layers (embedding, LM head, sampling; "
        "timed only when layers_profiled < layers_full)",
        "cpu_s: median CPU time of the timing thread (with one thread: the time without contention)",
        "device_s: median CUDA-event time of the step on the device (empty on CPU)",
    ]


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo where there is one (Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_profile(path: Path, header: list[str], rows: pd.DataFrame, force: bool = False) -> None:
    def write(tmp: Path) -> None:
        with tmp.open("w") as f:
            f.writelines(f"# {line}\n" for line in header)
            rows.to_csv(f, index=False, float_format="%.6g")

    write_file_atomically(path, write, replace=force)


def _data_line(path: Path, row: int) -> int:
    """The file line (from 1) of data row `row` of a profile: after its `#` header lines and
    its column names, blank lines skipped (as pandas reads it)."""
    with path.open() as f:
        lines = (n for n, text in enumerate(f, start=1) if text.strip() and not text.startswith("#"))
        return next((n for i, n in enumerate(lines) if i == row + 1), row + 2)


def read_profile(path: Path, target: str = "time_s",
                 knots_tokens: list[int] | None = None) -> tuple[dict[str, str], pd.DataFrame]:
    """The `# key: value` header as a dict, and the rows: refused, in one line naming the
    file, unless they hold the fit's inputs and a `target` time > 0 in every row, and enough
    rows to fit every coefficient and hold some out."""
    header: dict[str, str] = {}
    rows = read_csv(path, comment="#")  # first: it names the file of a binary or bad one
    with path.open() as f:
        for line in f:
            if not line.startswith("#"):
                break
            key, _, value = line[1:].strip().partition(": ")
            header[key] = value
    expected = "expected a profile CSV of python -m calibrate profile"
    missing = [c for c in (*RANGE_INPUTS, target) if c not in rows.columns]
    if missing:
        raise ScenarioError(f"{path}: no column {', '.join(missing)}; {expected}")
    values = rows[[*RANGE_INPUTS, target]].apply(pd.to_numeric, errors="coerce")
    if values[target].isna().all() and len(rows):
        raise ScenarioError(f"{path}: {target} is empty in every row (device_s is measured on "
                            "CUDA only); expected another --target")
    for column in (*RANGE_INPUTS, target):
        x = values[column].to_numpy(dtype=np.float64)
        bad = ~np.isfinite(x) | ((x <= 0) if column == target else (x < 0))  # a time is > 0
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            value = rows[column].iloc[row]
            value = value.item() if isinstance(value, np.generic) else value  # -0.001, not np.float64
            # An empty cell was "time_s = nan", and the row counted past the header's 14 lines
            shown = f"{column} is empty" if pd.isna(value) else f"{column} = {value!r}"
            raise ScenarioError(f"{path} line {_data_line(path, row)}: {shown}, "
                                f"expected a number {'> 0' if column == target else '>= 0'}")
    least = rows_to_fit(knots_tokens or [])
    if len(rows) < least:
        raise ScenarioError(f"{path}: {len(rows)} row(s); expected at least {least} to fit "
                            f"{least - 2} coefficients and hold some out")
    return header, rows
