"""Selective batching is exact: a batched iteration's logits equal each request run alone."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from calibrate.model import Transformer, build_model, model_args  # noqa: E402
from calibrate.profile import make_batch  # noqa: E402
from tests.conftest import examples  # noqa: E402

# calibrate/gpu_check.sh runs this file on CUDA too (still fp32, so the bound means the same).
DEVICE = os.environ.get("CALIBRATE_TEST_DEVICE", "cpu")
# fp32: batching changes only the summation order (matmul tiling, attention kernels).
ATOL = 1e-5 if DEVICE == "cpu" else 1e-4
RTOL = 1e-4
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def model() -> Transformer:
    return build_model(model_args("tiny"), DEVICE, seed=0, max_positions=MAX_TOKENS,
                       dtype=torch.float32)


def prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1024, (n,), generator=g).tolist()  # token ids, not tensors on DEVICE


def alone(model: Transformer, tokens: list[int]) -> torch.Tensor:
    """Logits of every position of `tokens`, computed as one whole prompt of one request."""
    seq = model.new_sequence(tokens, MAX_TOKENS)
    return model.run_iteration([(seq, len(tokens))], all_logits=True)


def run_chunks(model: Transformer, prompts: list[list[int]], chunks: list[list[int]]) -> list[torch.Tensor]:
    """Feed request i its chunks[i] sizes; iteration j batches every request's j-th chunk."""
    seqs = [model.new_sequence(p, MAX_TOKENS) for p in prompts]
    got: list[list[torch.Tensor]] = [[] for _ in prompts]
    for j in range(max(len(c) for c in chunks)):
        members = [i for i, c in enumerate(chunks) if j < len(c)]
        logits = model.run_iteration([(seqs[i], chunks[i][j]) for i in members], all_logits=True)
        for i, part in zip(members, logits.split([chunks[i][j] for i in members]), strict=True):
            got[i].append(part)
    return [torch.cat(g) for g in got]


def assert_matches_alone(model: Transformer, prompts: list[list[int]], chunks: list[list[int]]) -> None:
    for p, got in zip(prompts, run_chunks(model, prompts, chunks), strict=True):
        torch.testing.assert_close(got, alone(model, p), atol=ATOL, rtol=RTOL)


def test_prefill_batch(model: Transformer) -> None:
    prompts = [prompt(1, 5), prompt(2, 9), prompt(3, 3)]
    assert_matches_alone(model, prompts, [[len(p)] for p in prompts])


def test_decode_batch(model: Transformer) -> None:
    # Prompts first (one iteration), then three decode iterations of one token each.
    prompts = [prompt(4, 6), prompt(5, 4), prompt(6, 11)]
    assert_matches_alone(model, prompts, [[len(p) - 3, 1, 1, 1] for p in prompts])


def test_chunked_prefill(model: Transformer) -> None:
    prompts = [prompt(7, 12), prompt(8, 7)]
    assert_matches_alone(model, prompts, [[5, 4, 3], [2, 5]])


def test_mixed_batch(model: Transformer) -> None:
    # Iteration 1: prompt of r0, first chunk of r1. Iteration 2: decode of r0, second chunk
    # of r1, whole prompt of r2. Iteration 3: decodes of r0 and r2, last chunk of r1.
    prompts = [prompt(9, 6), prompt(10, 15), prompt(11, 8)]
    seqs = [model.new_sequence(p, MAX_TOKENS) for p in prompts]
    plan = [[(0, 4), (1, 6)], [(0, 1), (1, 6), (2, 7)], [(0, 1), (2, 1), (1, 3)]]
    got: list[list[torch.Tensor]] = [[], [], []]
    for step in plan:
        logits = model.run_iteration([(seqs[i], n) for i, n in step], all_logits=True)
        for (i, _n), part in zip(step, logits.split([n for _, n in step]), strict=True):
            got[i].append(part)
    for p, g in zip(prompts, got, strict=True):
        torch.testing.assert_close(torch.cat(g), alone(model, p)[: sum(len(x) for x in g)],
                                   atol=ATOL, rtol=RTOL)


def test_last_token_logits_are_rows_of_all_logits(model: Transformer) -> None:
    prompts = [prompt(12, 4), prompt(13, 7)]
    last = model.run_iteration([(model.new_sequence(p, MAX_TOKENS), len(p)) for p in prompts])
    full = [alone(model, p)[-1] for p in prompts]
    torch.testing.assert_close(last, torch.stack(full), atol=ATOL, rtol=RTOL)


@settings(max_examples=examples(15), deadline=None)
@given(st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=4), min_size=1, max_size=4))
def test_any_chunking_matches_alone(model: Transformer, chunks: list[list[int]]) -> None:
    prompts = [prompt(100 + i, sum(c)) for i, c in enumerate(chunks)]
    assert_matches_alone(model, prompts, chunks)


def test_a_profile_batch_is_drawn_from_its_generator_alone(model: Transformer) -> None:
    # The caches' values came from torch's global generator, never seeded: two profiles with
    # one --seed timed different caches, and each batch moved a caller's torch stream.
    shape = ([1, 3], [5, 8])  # (queries, contexts) of two requests
    torch.manual_seed(1)
    before = torch.get_rng_state()
    first = make_batch(model, shape, np.random.default_rng(7))
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(2)  # another global stream: the same batch
    again = make_batch(model, shape, np.random.default_rng(7))
    for (a, qa), (b, qb) in zip(first, again, strict=True):
        assert (a.token_ids, a.num_computed, qa) == (b.token_ids, b.num_computed, qb)
        assert torch.equal(a.cache_k, b.cache_k) and torch.equal(a.cache_v, b.cache_v)
