"""Time one decoder layer's token-batched operators and its attention at fixed shapes, the
way a serving engine runs them (CUDA graphs, fused attention), against which the roofline's
efficiencies can be read.

    python -m calibrate kernels --model gpt3-13b --out layer_ops.csv            # on CUDA
    python -m calibrate kernels --model llama2-70b --tensor-parallel 2 4 8 --out tp.csv
    python -m calibrate kernels --model tiny --device cpu --out /tmp/ops.csv    # the same steps

With `--tensor-parallel N` each shape is one rank's shard of the layer (a 1/N share of the
heads and of the MLP's inner width, as Megatron splits them; the all-reduces are not run).

Rows: `kind` = `token_ops` (norm, QKV, output projection, norm, MLP (GELU, or SwiGLU with
its gate and up projections fused) and the residual adds of one layer over `tokens` tokens,
with `layers` distinct copies of the weights run in turn so that none is read from L2),
`decode_attention` (`tokens` requests of one query token each against `context` cached
tokens, PyTorch's scaled_dot_product_attention) or `prefill_attention` (`tokens` prompts of
`context` tokens each, causal); `time_s` is the median time of one layer (one copy): CUDA
events around a graph replay on CUDA (`mode` graph), or with `--eager` (`mode` eager) the
wall time of launching the same kernels from Python and synchronising, as an engine without
CUDA graphs runs them; wall time on CPU.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from calibrate.model import SHAPES, ModelArgs
from orcasim.config import ScenarioError

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
DECODE = ((1, 1024), (8, 1024), (32, 1024), (64, 2048), (128, 1024), (256, 512))
PREFILL = ((1, 512), (1, 2048), (1, 8192), (4, 2048))  # (prompts, tokens each), causal
HEADER = "model,tensor_parallel,mode,kind,tokens,context,time_s"
# The weights' and inputs' values are only timed, but drawn from a generator of their own
# (torch's global one is never seeded here, and a caller's stream is left alone).
SEED = 0


def shard_shapes(shape: ModelArgs, tp: int) -> dict[str, tuple[int, int]]:
    """One rank's weight matrices (out, in) at TP `tp`, as Megatron splits a layer: the QKV
    and the MLP's up (gate and up fused, for SwiGLU) by columns, the output and down
    projections by rows; KV heads are replicated where fewer than `tp`."""
    d, hd = shape.d_model, shape.head_dim
    q_width, kv_width = shape.n_heads // tp * hd, max(1, shape.kv_heads // tp) * hd
    inner = shape.ffn_dim // tp
    return {"qkv": (q_width + 2 * kv_width, d), "out": (d, q_width),
            "up": (2 * inner if shape.gated_mlp else inner, d), "down": (d, inner)}


def token_ops_fn(shape: ModelArgs, tp: int, layers: int, device: str, dtype: torch.dtype,
                 gen: torch.Generator) -> Callable[[torch.Tensor], torch.Tensor]:
    """One rank's token ops of a layer over `layers` weight copies: a function of x (T, d)."""
    d = shape.d_model
    shapes = shard_shapes(shape, tp)
    q_width = shapes["out"][1]
    weights = [tuple(torch.randn(*shapes[name], generator=gen, device=device, dtype=dtype) * 0.02
                     for name in ("qkv", "out", "up", "down")) for _ in range(layers)]

    def mlp(h: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        if shape.gated_mlp:
            gate, value = F.linear(h, up).chunk(2, dim=-1)
            return F.linear(F.silu(gate) * value, down)
        return F.linear(F.gelu(F.linear(h, up)), down)

    def run(x: torch.Tensor) -> torch.Tensor:
        for qkv, out, up, down in weights:
            q = F.linear(F.layer_norm(x, (d,)), qkv)[:, :q_width]  # attention is timed apart
            x = x + F.linear(q, out)
            x = x + mlp(F.layer_norm(x, (d,)), up, down)
        return x

    return run


def timed_s(fn: Callable[[], object], device: str, repeats: int, eager: bool = False) -> float:
    """Median seconds of fn(), replayed as a CUDA graph on CUDA (unless `eager`: launched
    kernel by kernel from Python, as an engine without graphs runs)."""
    if device == "cuda" and eager:
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    if device == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def attention_fn(shape: ModelArgs, tp: int, n: int, queries: int, context: int, device: str,
                 dtype: torch.dtype, gen: torch.Generator) -> Callable[[], torch.Tensor]:
    """One rank's attention of `n` requests, `queries` new tokens each (causal where more
    than one), against `context` tokens; grouped-query where the model is."""
    heads, kv_heads = shape.n_heads // tp, max(1, shape.kv_heads // tp)
    q = torch.randn(n, heads, queries, shape.head_dim, generator=gen, device=device, dtype=dtype)
    k = torch.randn(n, kv_heads, context, shape.head_dim, generator=gen, device=device, dtype=dtype)
    v = torch.randn(k.shape, generator=gen, device=device, dtype=dtype)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=queries > 1,
                                                  enable_gqa=kv_heads != heads)


def dtype_on(device: str) -> torch.dtype:
    """What the kernels are timed in: bf16 on CUDA, as engines serve; fp32 on the CPU."""
    return torch.bfloat16 if device == "cuda" else torch.float32


def check_layers(model: str, tensor_parallel: list[int], layers: int, device: str,
                 memory_bytes: int) -> None:
    """`layers` copies of one rank's layer weights (the widest degree's) must fit in the
    device's `memory_bytes`: 1e9 copies of tiny's allocated for 42 s, then a RuntimeError's
    traceback under a 3 GB cap, and without one took the machine's memory. The activations
    need room besides, so a count near the bound can still run out."""
    itemsize = torch.empty((), dtype=dtype_on(device)).element_size()
    tp = min(tensor_parallel)
    copy_bytes = itemsize * sum(a * b for a, b in shard_shapes(SHAPES[model], tp).values())
    most = memory_bytes // copy_bytes
    if layers > most:
        raise ScenarioError(f"--layers {layers}: copies of {model}'s layer at TP {tp} take "
                            f"{copy_bytes / 2**20:.4g} MiB each; expected at most {most}, what "
                            f"this {device} device's {memory_bytes / 2**30:.4g} GiB holds")


def device_memory_bytes(device: str) -> int:
    """The memory the weight copies live in: the GPU's, or the machine's on the CPU."""
    if device == "cuda":
        return int(torch.cuda.get_device_properties(0).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def measure(model: str, tensor_parallel: list[int], device: str, layers: int, repeats: int,
            max_tokens: int, eager: bool) -> list[str]:
    """The CSV's lines (header first) for `model` at each TP degree."""
    shape = SHAPES[model]
    dtype = dtype_on(device)
    rows = [HEADER]
    gen = torch.Generator(device=device).manual_seed(SEED)
    with torch.inference_mode():
        for tp in tensor_parallel:
            rows += _rows_for(shape, model, tp, device, layers, repeats, max_tokens, eager, dtype, gen)
    return rows


def check_degree(model: str, tp: int) -> None:
    """A degree must split the heads and the MLP's width evenly, as Megatron's layers do, and
    split the KV heads evenly or replicate each over a whole number of ranks (vLLM's
    QKVParallelLinear asserts one or the other)."""
    shape = SHAPES[model]
    if shape.n_heads % tp or shape.ffn_dim % tp:
        raise ScenarioError(f"--tensor-parallel {tp}: expected a divisor of {model}'s "
                            f"{shape.n_heads} heads and {shape.ffn_dim} MLP width")
    if shape.kv_heads % tp and tp % shape.kv_heads:
        raise ScenarioError(f"--tensor-parallel {tp}: {model}'s {shape.kv_heads} KV heads split "
                            "over it neither evenly nor as whole replicas; expected a divisor or "
                            f"a multiple of {shape.kv_heads}")


def _rows_for(shape: ModelArgs, model: str, tp: int, device: str, layers: int, repeats: int,
              max_tokens: int, eager: bool, dtype: torch.dtype, gen: torch.Generator) -> list[str]:
    rows = []
    mode = "eager" if eager else "graph"
    run = token_ops_fn(shape, tp, layers, device, dtype, gen)
    for n in (t for t in TOKENS if t <= max_tokens):
        x = torch.randn(n, shape.d_model, generator=gen, device=device, dtype=dtype)
        seconds = timed_s(partial(run, x), device, repeats, eager) / layers
        rows.append(f"{model},{tp},{mode},token_ops,{n},0,{seconds:.6g}")
        print(rows[-1], flush=True)
    shapes = [("decode_attention", n, 1, c) for n, c in DECODE if n * c <= 64 * max_tokens]
    shapes += [("prefill_attention", n, c, c) for n, c in PREFILL if c <= max_tokens]
    for kind, n, queries, context in shapes:
        fn = attention_fn(shape, tp, n, queries, context, device, dtype, gen)
        seconds = timed_s(fn, device, repeats, eager)
        rows.append(f"{model},{tp},{mode},{kind},{n},{context},{seconds:.6g}")
        print(rows[-1], flush=True)
    return rows
