"""A cost model read from a file may price a step under MIN_ITERATION_S (a fit with a negative
coefficient, used beyond its data). Fast mode prices a decode run ahead, past where an arrival
will cut it: a step it priced but never runs must not refuse the run, and one that runs must be
refused as reference mode refuses it (`orcasim.cost.base.runnable_steps`)."""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orcasim.config import ScenarioError
from orcasim.cost.base import CostModel
from orcasim.cost.fitted import FORMAT, FittedCost, term_names
from orcasim.cost.overhead import OverheadConfig, OverheadCost
from orcasim.engine import Engine, EngineMode
from orcasim.requests import Requests
from orcasim.schedulers import build_scheduler
from orcasim.schedulers.chunked import ChunkedConfig
from orcasim.schedulers.iteration_level import IterationLevelConfig
from orcasim.schedulers.paged import PagedConfig
from tests.conftest import examples

ORCA = IterationLevelConfig(kind="iteration_level", max_batch_size=8)
PAGED = PagedConfig(kind="paged", max_num_seqs=8)
HOST = OverheadConfig(per_iteration_s=1e-3, per_sequence_s=0.0, tensor_parallel_per_iteration_s=0.0)
# 1 ms + 10 ms a request - 10 us a KV token read by decodes: one request's step takes no
# time past 1,100 tokens, two requests' past 2,100.
NEGATIVE_CONTEXT = dict(zip(term_names([]), [1e-3, 0.0, 1e-2, -1e-5, 0.0], strict=True))
# What a run gives: (first scheduled, first token, finish) per request and the count of
# evaluations outside the fit's range, or the refusal's message.
Outcome = tuple[list[float], list[float], list[float], int] | str
LOOPS: tuple[tuple[EngineMode, bool], ...] = (("reference", False), ("fast", True), ("fast", False))


def fit(coef: dict[str, float], ranges: dict[str, list[float]] | None = None,
        overhead: OverheadConfig | None = None) -> CostModel:
    """A fit read from `neg.yaml`, checked where `build_cost_model` checks it: under an
    engine's overhead, on the GPU part."""
    cost: CostModel = FittedCost({"format": FORMAT, "coefficients_s": coef, "range": ranges or {}},
                                 "neg.yaml")
    if overhead is None:
        return cost
    checked, cost.checked_source = cost.checked_source, None
    return OverheadCost(cost, overhead, None, 1, checked_source=checked)


def outcomes(requests: Requests, cfg: Any, capacity_tokens: int, coef: dict[str, float],
             ranges: dict[str, list[float]] | None = None,
             overhead: OverheadConfig | None = None) -> list[Outcome]:
    """Reference mode, the fused fast loop and the generic one, each on a fresh cost model."""
    got: list[Outcome] = []
    for mode, fused in LOOPS:
        cost, scheduler = fit(coef, ranges, overhead), build_scheduler(cfg, requests, capacity_tokens)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # out of the fit's range: counted below
                rec = Engine(requests, scheduler, cost, mode, fused=fused).run().recorder
        except ScenarioError as e:
            got.append(str(e))
            continue
        got.append((rec.first_scheduled_s.tolist(), rec.first_token_s.tolist(),
                    rec.finish_s.tolist(), cost.out_of_range_count()))
    return got


def same(a: Outcome, b: Outcome) -> bool:
    """Equal, bit for bit, a request never run (NaN) equal to itself."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return (np.array_equal(np.array(a[:3]), np.array(b[:3]), equal_nan=True)
            and a[3] == b[3])


@pytest.mark.parametrize("overhead", [None, HOST], ids=["bare", "overhead"])
@pytest.mark.parametrize("cfg", [ORCA, PAGED], ids=["orca", "paged"])
def test_a_step_priced_too_short_beyond_a_cut_does_not_refuse_the_run(cfg: Any, overhead: Any) -> None:
    """Request 0 decodes alone up to 1,200 KV tokens; request 1 joins at 4.2 s (request 0
    near 500) and outlasts it, so every step that runs takes time. Fast mode priced request
    0's run to its end, past the cut at 4.2 s, and refused the run reference mode completes:
    'neg.yaml: priced a decode step of 1 requests at -0.00099 s' (0 s under the overhead)."""
    requests = Requests(np.array([0.0, 4.2]), np.array([10, 10]), np.array([1190, 800]),
                        np.array([1200, 900]))
    ahead_s, _ = fit(NEGATIVE_CONTEXT, overhead=overhead).decode_steps_outside(np.array([11]), 1189)
    assert len(ahead_s) == 1089  # the run priced ahead stops before context 1,100
    reference, fused, generic = outcomes(requests, cfg, 100_000, NEGATIVE_CONTEXT, overhead=overhead)
    assert not isinstance(reference, str), reference
    assert reference[2][0] > 10.0  # request 0 ran on with request 1 well past 4.2 s
    assert same(fused, reference) and same(generic, reference)


@pytest.mark.parametrize("overhead", [None, HOST], ids=["bare", "overhead"])
@pytest.mark.parametrize("cfg", [ORCA, PAGED], ids=["orca", "paged"])
def test_a_step_priced_too_short_that_runs_is_refused_alike(cfg: Any, overhead: Any) -> None:
    """Request 0 alone reaches 1,100 KV tokens: every mode refuses the step there, in
    reference mode's words (its batch, at its price). Fast mode named another step ('a
    decode step of 1 requests at -0.00099 s', the last of the run it priced ahead)."""
    requests = Requests(np.array([0.0]), np.array([10]), np.array([1190]), np.array([1200]))
    got = outcomes(requests, cfg, 100_000, NEGATIVE_CONTEXT, overhead=overhead)
    price = r"0" if overhead is not None else r"-?\d\.\d+e-\d+"  # 0.011 - 1,100 x 1e-5: rounding
    assert re.fullmatch(rf"neg\.yaml: priced a batch of 1 requests at {price} s; expected "
                        r">= 1e-09 s \(.*\)", str(got[0])), got[0]
    assert got == [got[0]] * 3


@st.composite
def joining_cases(draw: st.DrawFn) -> dict[str, Any]:
    """One long request alone, then others join it, on a fit whose decode steps lose time
    with context and gain it with requests: its runs priced ahead often turn non-positive
    past the next arrival, and some steps that run do too."""
    n = draw(st.integers(2, 5))
    arrival = [0.0, *sorted(draw(st.lists(st.floats(0.5, 8.0), min_size=n - 1, max_size=n - 1)))]
    prompt = draw(st.lists(st.integers(2, 40), min_size=n, max_size=n))
    output = [draw(st.integers(500, 1500)), *draw(st.lists(st.integers(100, 1500), min_size=n - 1,
                                                           max_size=n - 1))]
    coef = dict(zip(term_names([]), [draw(st.floats(0.0, 2e-3)), 0.0, draw(st.floats(5e-3, 2e-2)),
                                     -draw(st.floats(5e-6, 2e-5)), 0.0], strict=True))
    block = draw(st.sampled_from([1, 4, 16]))
    cfg = draw(st.sampled_from([
        IterationLevelConfig(kind="iteration_level", max_batch_size=draw(st.integers(1, 5))),
        PagedConfig(kind="paged", max_num_seqs=draw(st.integers(1, 5)), block_size_tokens=block),
        PagedConfig(kind="paged", policy="prefill_first", max_num_seqs=4, block_size_tokens=block),
        ChunkedConfig(kind="chunked", max_num_seqs=4, block_size_tokens=block, chunk_size_tokens=16),
    ]))
    lengths = np.array(prompt) + np.array(output)
    return {"requests": Requests(np.array(arrival), np.array(prompt), np.array(output), lengths),
            "cfg": cfg, "capacity_tokens": 16 * (int(lengths.sum()) * draw(st.sampled_from([1, 4])) // 32 + 1),
            "coef": coef, "ranges": {"sum_context_decode": [0.0, draw(st.floats(500, 3000))]},
            "overhead": draw(st.sampled_from([None, HOST]))}


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(joining_cases())
def test_fast_mode_runs_or_refuses_as_reference_mode_does(case: dict[str, Any]) -> None:
    """Every fast loop completes where reference mode does, with its timestamps and its count
    of evaluations out of the fit's range, and refuses where it does, with its message."""
    reference, *fast = outcomes(**case)
    assert all(same(got, reference) for got in fast), (reference, fast)
