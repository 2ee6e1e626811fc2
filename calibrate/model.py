"""A decoder-only transformer with Orca's selective batching, in one file (gpt-fast style).

Weights are random: calibration measures time, not text. Every request owns its KV cache.
One iteration (`Transformer.run_iteration`) takes a list of `(sequence, n_new_tokens)`
pairs that may mix whole prompts, prompt chunks and single decode tokens, and does
selective batching (Yu et al., Orca, OSDI 2022, section 4.2):

    token-wise operators (norms, QKV, output projection, MLP, residuals) run once on the
    flattened [T, d] tensor of all new tokens;
    attention is split per request and runs against that request's own cache
    (causal for a prompt, offset-causal for a chunk, unmasked for one decode token);
    the per-request outputs are concatenated back into [T, d].
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from orcasim.config import ScenarioError


@dataclass(frozen=True)
class ModelArgs:
    """Layer shape of a decoder. `n_kv_heads` < `n_heads` is grouped-query attention."""

    n_layers: int
    d_model: int
    n_heads: int
    ffn_dim: int
    vocab_size: int
    n_kv_heads: int | None = None
    gated_mlp: bool = False  # SwiGLU (Llama) instead of GELU (GPT)
    rope_base: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    def params_per_layer(self) -> int:
        attn = self.d_model * (self.d_model + 2 * self.kv_heads * self.head_dim) + self.d_model**2
        mlp = (3 if self.gated_mlp else 2) * self.d_model * self.ffn_dim
        return attn + mlp


# Named shapes. The big ones are meant to be profiled with fewer layers (`with_layers`).
SHAPES: dict[str, ModelArgs] = {
    "tiny": ModelArgs(n_layers=2, d_model=256, n_heads=4, ffn_dim=1024, vocab_size=1024),
    "gpt2-small": ModelArgs(n_layers=12, d_model=768, n_heads=12, ffn_dim=3072, vocab_size=50257),
    # GPT-3 13B (Brown et al. 2020, table 2.1), the model of Orca's evaluation.
    "gpt3-13b": ModelArgs(n_layers=40, d_model=5120, n_heads=40, ffn_dim=20480, vocab_size=50257),
    "gpt3-175b": ModelArgs(n_layers=96, d_model=12288, n_heads=96, ffn_dim=49152, vocab_size=50257),
    "llama2-7b": ModelArgs(
        n_layers=32, d_model=4096, n_heads=32, ffn_dim=11008, vocab_size=32000, gated_mlp=True
    ),
    # Llama 2 70B (Touvron et al. 2023, table 1; GQA with 8 KV heads), splitwise's model.
    "llama2-70b": ModelArgs(
        n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672, vocab_size=32000,
        gated_mlp=True,
    ),
    "llama3-8b": ModelArgs(
        n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256,
        gated_mlp=True, rope_base=500000.0,
    ),
}


def model_args(name: str, n_layers: int | None = None) -> ModelArgs:
    if name not in SHAPES:
        raise ScenarioError(f"--model = {name!r}: expected one of {', '.join(SHAPES)}")
    args = SHAPES[name]
    if n_layers is None:
        return args
    if not 1 <= n_layers <= args.n_layers:
        raise ScenarioError(f"--layers = {n_layers}: {name} has {args.n_layers} layers; expected "
                            f"1 to {args.n_layers}")
    return replace(args, n_layers=n_layers)


class Sequence:
    """One request inside the model: its tokens so far and its own KV cache.

    `cache_k/cache_v` are (n_layers, kv_heads, max_tokens, head_dim); the first
    `num_computed` positions are filled. `torch.empty` skips zeroing: only filled
    positions are ever read.
    """

    def __init__(self, token_ids: list[int], max_tokens: int, args: ModelArgs,
                 device: torch.device, dtype: torch.dtype) -> None:
        shape = (args.n_layers, args.kv_heads, max_tokens, args.head_dim)
        self.token_ids = list(token_ids)
        self.num_computed = 0
        self.cache_k = torch.empty(shape, device=device, dtype=dtype)
        self.cache_v = torch.empty(shape, device=device, dtype=dtype)


class Block(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        kv_dim = args.kv_heads * args.head_dim
        self.attn_norm = nn.LayerNorm(args.d_model)
        self.wqkv = nn.Linear(args.d_model, args.d_model + 2 * kv_dim, bias=False)
        self.wo = nn.Linear(args.d_model, args.d_model, bias=False)
        self.mlp_norm = nn.LayerNorm(args.d_model)
        up_dim = 2 * args.ffn_dim if args.gated_mlp else args.ffn_dim
        self.w_up = nn.Linear(args.d_model, up_dim, bias=False)
        self.w_down = nn.Linear(args.ffn_dim, args.d_model, bias=False)

    def forward(self, x: Tensor, rope: Tensor, parts: list[tuple[Sequence, int]], layer: int) -> Tensor:
        x = x + self.wo(self._attention(self.attn_norm(x), rope, parts, layer))  # (T, d)
        return x + self._mlp(self.mlp_norm(x))

    def _mlp(self, x: Tensor) -> Tensor:
        up = self.w_up(x)
        if self.args.gated_mlp:
            gate, up = up.chunk(2, dim=-1)
            return self.w_down(F.silu(gate) * up)
        return self.w_down(F.gelu(up))

    def _attention(self, x: Tensor, rope: Tensor, parts: list[tuple[Sequence, int]], layer: int) -> Tensor:
        a = self.args
        kv_dim = a.kv_heads * a.head_dim
        q, k, v = self.wqkv(x).split([a.d_model, kv_dim, kv_dim], dim=-1)
        q = apply_rope(q.view(-1, a.n_heads, a.head_dim), rope)  # (T, nh, hs)
        k = apply_rope(k.view(-1, a.kv_heads, a.head_dim), rope)  # (T, nkv, hs)
        v = v.view(-1, a.kv_heads, a.head_dim)
        sizes = [n for _, n in parts]
        outs = [
            attend_one(seq, n, qi, ki, vi, layer, a)
            for (seq, n), qi, ki, vi in zip(parts, q.split(sizes), k.split(sizes), v.split(sizes),
                                            strict=True)
        ]
        return torch.cat(outs).reshape(-1, a.d_model)  # (T, d)


def attend_one(seq: Sequence, n: int, q: Tensor, k: Tensor, v: Tensor, layer: int,
               a: ModelArgs) -> Tensor:
    """Attention of one request's n new tokens against its cache (offset-causal)."""
    start = seq.num_computed
    end = start + n
    seq.cache_k[layer, :, start:end] = k.transpose(0, 1)
    seq.cache_v[layer, :, start:end] = v.transpose(0, 1)
    keys = seq.cache_k[layer, :, :end]  # (nkv, S, hs)
    values = seq.cache_v[layer, :, :end]
    if a.kv_heads != a.n_heads:
        keys = keys.repeat_interleave(a.n_heads // a.kv_heads, dim=0)
        values = values.repeat_interleave(a.n_heads // a.kv_heads, dim=0)
    mask = None
    if n > 1:
        # Query i sits at position start + i and sees keys 0..start + i.
        rows = torch.arange(start, end, device=q.device).unsqueeze(1)
        mask = torch.arange(end, device=q.device).unsqueeze(0) <= rows  # (n, S)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=mask)
    return out.transpose(0, 1)  # (n, nh, hs)


def rope_table(args: ModelArgs, max_positions: int, device: torch.device) -> Tensor:
    """Rotary embedding angles (Su et al. 2021): cos and sin, (P, hs/2, 2), in fp32."""
    half = args.head_dim // 2
    freqs = 1.0 / args.rope_base ** (torch.arange(half, device=device, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(max_positions, device=device, dtype=torch.float32), freqs)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x: Tensor, rope: Tensor) -> Tensor:
    """Rotate pairs of x (T, h, hs) by per-token angles rope (T, hs/2, 2)."""
    xf = x.float().reshape(*x.shape[:-1], -1, 2)  # (T, h, hs/2, 2)
    cos, sin = rope[:, None, :, 0], rope[:, None, :, 1]
    out = torch.stack(
        [xf[..., 0] * cos - xf[..., 1] * sin, xf[..., 1] * cos + xf[..., 0] * sin], dim=-1
    )
    return out.flatten(-2).type_as(x)


class Transformer(nn.Module):
    """The whole decoder. `run_iteration` is one selective-batched iteration."""

    rope: Tensor  # a buffer (register_buffer): typed here, as nn.Module's __getattr__ is not

    def __init__(self, args: ModelArgs, max_positions: int = 4096) -> None:
        super().__init__()
        self.args = args
        self.embed = nn.Embedding(args.vocab_size, args.d_model)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = nn.LayerNorm(args.d_model)
        self.lm_head = nn.Linear(args.d_model, args.vocab_size, bias=False)
        self.register_buffer("rope", rope_table(args, max_positions, self.embed.weight.device),
                             persistent=False)

    def new_sequence(self, token_ids: list[int], max_tokens: int) -> Sequence:
        p = self.lm_head.weight
        return Sequence(token_ids, max_tokens, self.args, p.device, p.dtype)

    @torch.inference_mode()
    def run_iteration(self, batch: list[tuple[Sequence, int]], all_logits: bool = False) -> Tensor:
        """Process each sequence's next n tokens; returns logits (B, V) of each one's last new
        token, or (T, V) of every new token with `all_logits`. Advances `num_computed`."""
        assert all(1 <= n <= len(s.token_ids) - s.num_computed for s, n in batch), "bad n_new"
        positions = torch.cat([
            torch.arange(s.num_computed, s.num_computed + n) for s, n in batch
        ]).to(self.rope.device)
        tokens = torch.tensor(
            [t for s, n in batch for t in s.token_ids[s.num_computed:s.num_computed + n]],
            device=self.rope.device,
        )
        x = self.embed(tokens)  # (T, d)
        rope = self.rope[positions]
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, batch, i)
        for seq, n in batch:
            seq.num_computed += n
        if not all_logits:
            last = torch.tensor([n for _, n in batch], device=x.device).cumsum(0) - 1
            x = x[last]  # (B, d): only each request's last token samples the next one
        return self.lm_head(self.norm(x)).float()

    def decode_greedy(self, batch: list[tuple[Sequence, int]]) -> list[int]:
        """One serving step: run the iteration and pick each request's next token (argmax)."""
        return self.run_iteration(batch).argmax(dim=-1).tolist()


def build_model(args: ModelArgs, device: str, seed: int = 0, max_positions: int = 4096,
                dtype: torch.dtype | None = None) -> Transformer:
    """Random weights (std 0.02, as GPT-2); fp32 on CPU and bf16 on CUDA unless `dtype` says."""
    with torch.device(device):  # build in place: a 13B-wide layer stack is slow to init on a CPU
        model = Transformer(args, max_positions)
    gen = torch.Generator(device=device).manual_seed(seed)
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.normal_(p, std=0.02, generator=gen)
    dtype = dtype or (torch.float32 if device == "cpu" else torch.bfloat16)
    model = model.to(dtype=dtype).eval()
    model.rope = model.rope.float()  # angles stay fp32 whatever the weights' dtype
    return model
