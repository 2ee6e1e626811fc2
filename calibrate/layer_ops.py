"""Time one decoder layer's token-batched operators and its attention at fixed shapes, the
way a serving engine runs them (CUDA graphs, fused attention), against which the roofline's
efficiencies can be read.

    python -m calibrate.layer_ops --model gpt3-13b --out layer_ops.csv          # on CUDA
    python -m calibrate.layer_ops --model tiny --device cpu --out /tmp/ops.csv  # the same steps

Rows: `kind` = `token_ops` (LayerNorm, QKV, output projection, LayerNorm, FC1, GELU, FC2 and
the residual adds of one layer over `tokens` tokens, with `layers` distinct copies of the
weights run in turn so that none is read from L2) or `decode_attention` (`tokens` requests of
one query token each against `context` cached tokens, PyTorch's scaled_dot_product_attention)
or `prefill_attention` (`tokens` prompts of `context` tokens each, causal);
`time_s` is the median time of one layer (one copy), CUDA events around a graph replay on
CUDA, wall time on CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from calibrate.model import SHAPES

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
DECODE = ((1, 1024), (8, 1024), (32, 1024), (64, 2048), (128, 1024), (256, 512))
PREFILL = ((1, 512), (1, 2048), (1, 8192), (4, 2048))  # (prompts, tokens each), causal


def token_ops_fn(d_model: int, ffn_dim: int, layers: int, device: str, dtype: torch.dtype):
    """One layer's token ops over `layers` weight copies: a function of the input x (T, d)."""
    weights = [(torch.randn(3 * d_model, d_model, device=device, dtype=dtype) * 0.02,
                torch.randn(d_model, d_model, device=device, dtype=dtype) * 0.02,
                torch.randn(ffn_dim, d_model, device=device, dtype=dtype) * 0.02,
                torch.randn(d_model, ffn_dim, device=device, dtype=dtype) * 0.02)
               for _ in range(layers)]

    def run(x: torch.Tensor) -> torch.Tensor:
        for qkv, out, fc1, fc2 in weights:
            h = F.layer_norm(x, (d_model,))
            q = F.linear(h, qkv)[:, :d_model]  # attention itself is timed apart
            x = x + F.linear(q, out)
            h = F.layer_norm(x, (d_model,))
            x = x + F.linear(F.gelu(F.linear(h, fc1)), fc2)
        return x

    return run


def timed_s(fn, device: str, repeats: int) -> float:
    """Median seconds of fn(), replayed as a CUDA graph on CUDA."""
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m calibrate.layer_ops", description=__doc__)
    p.add_argument("--model", default="gpt3-13b", choices=list(SHAPES))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--layers", type=int, default=8, help="weight copies run in turn")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=max(TOKENS))
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    shape = SHAPES[args.model]
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    d, heads = shape.d_model, shape.n_heads
    run = token_ops_fn(d, shape.ffn_dim, args.layers, args.device, dtype)
    rows = ["kind,tokens,context,time_s"]
    with torch.inference_mode():
        for n in (t for t in TOKENS if t <= args.max_tokens):
            x = torch.randn(n, d, device=args.device, dtype=dtype)
            seconds = timed_s(lambda x=x: run(x), args.device, args.repeats) / args.layers
            rows.append(f"token_ops,{n},0,{seconds:.6g}")
            print(rows[-1], flush=True)
        for batch, context in DECODE:
            if batch * context > 64 * args.max_tokens:
                continue
            q = torch.randn(batch, heads, 1, d // heads, device=args.device, dtype=dtype)
            k = torch.randn(batch, heads, context, d // heads, device=args.device, dtype=dtype)
            v = torch.randn_like(k)
            seconds = timed_s(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v),
                              args.device, args.repeats)
            rows.append(f"decode_attention,{batch},{context},{seconds:.6g}")
            print(rows[-1], flush=True)
        for prompts, length in PREFILL:
            if length > args.max_tokens:
                continue
            q, k, v = (torch.randn(prompts, heads, length, d // heads, device=args.device,
                                   dtype=dtype) for _ in range(3))
            seconds = timed_s(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                q, k, v, is_causal=True), args.device, args.repeats)
            rows.append(f"prefill_attention,{prompts},{length},{seconds:.6g}")
            print(rows[-1], flush=True)
    args.out.write_text("\n".join(rows) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
