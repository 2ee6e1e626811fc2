"""Every random component matches its theoretical mean; traces parse and reject bad rows."""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orcasim.config import ScenarioError
from orcasim.workload import (
    SystemPromptConfig,
    WorkloadConfig,
    arrivals,
    generate_requests,
    lengths,
    sessions,
)
from orcasim.workload.closed_loop import ClosedLoopArrival, ConstantThink, ExponentialThink
from orcasim.workload.traces import read_trace

SAMPLES = 200_000
MEAN_SIGMAS = 5.0  # sample mean within 5 standard errors of the theoretical mean

LENGTHS = [
    lengths.ConstantLength(kind="constant", value=17),
    lengths.UniformLength(kind="uniform", low=32, high=512),
    lengths.LognormalLength(kind="lognormal", mean=200.0, sigma=1.0, max=2048),
    lengths.LognormalLength(kind="lognormal", mean=50.0, sigma=2.0, max=400),  # heavy clipping
    lengths.EmpiricalLength(kind="empirical", path="traces/sharegpt_lengths_llama2.csv",
                            column="num_decode_tokens"),
]
ARRIVALS = [
    arrivals.PoissonArrival(kind="poisson", rate_per_s=3.0),
    arrivals.GammaArrival(kind="gamma", rate_per_s=3.0, cv=3.0),
    arrivals.GammaArrival(kind="gamma", rate_per_s=0.5, cv=0.5),
    arrivals.ConstantArrival(kind="constant", rate_per_s=2.0),
]


def within_standard_errors(samples: np.ndarray, mean: float) -> bool:
    se = samples.std() / np.sqrt(len(samples))
    return abs(samples.mean() - mean) <= MEAN_SIGMAS * se + 1e-12 * abs(mean)


@pytest.mark.parametrize("dist", LENGTHS, ids=lambda d: d.kind)
def test_length_sample_mean_matches_theory(dist: lengths.LengthDist) -> None:
    x = dist.sample(np.random.default_rng(1), SAMPLES)
    assert x.dtype == np.int64 and x.min() >= 1
    assert within_standard_errors(x.astype(float), dist.mean_tokens())


@pytest.mark.parametrize("proc", ARRIVALS, ids=lambda a: f"{a.kind}")
def test_arrival_rate_matches_theory(proc: arrivals.GeneratedArrival) -> None:
    gaps = proc.gaps_s(np.random.default_rng(2), SAMPLES)
    assert within_standard_errors(gaps, 1.0 / proc.mean_rate_per_s())


def test_gamma_gaps_have_the_requested_cv() -> None:
    gaps = arrivals.GammaArrival(kind="gamma", rate_per_s=1.0, cv=2.0).gaps_s(
        np.random.default_rng(3), SAMPLES)
    assert abs(gaps.std() / gaps.mean() - 2.0) < 0.05


def test_uniform_is_inclusive_at_both_ends() -> None:
    x = lengths.UniformLength(kind="uniform", low=3, high=5).sample(np.random.default_rng(0), 1000)
    assert set(np.unique(x).tolist()) == {3, 4, 5}


_TRACE_WORKLOAD = WorkloadConfig.model_validate({
    "arrival": {"kind": "trace", "path": "traces/azure_conv_2023_first2000.csv", "max_requests": 5},
    "max_tokens": 100_000})
# Every sampler a user can call with a generator: each length, gap and think-time draw, a
# closed loop's, the paired lengths, a system prompt's, the sessions' and the workload's.
SAMPLERS = {
    **{f"length {d.kind}": d.sample for d in LENGTHS},
    "empirical rows": LENGTHS[-1].sample_rows,
    **{f"gaps {a.kind}": a.gaps_s for a in ARRIVALS},
    "constant times": arrivals.ConstantArrival(kind="constant", rate_per_s=2.0).times_s,
    "think exponential": ExponentialThink(kind="exponential", mean_s=1.0).sample,
    "think constant": ConstantThink(kind="constant", value_s=1.0).sample,
    "closed loop": ClosedLoopArrival(kind="closed_loop", num_clients=2, think_time={
        "kind": "constant", "value_s": 1.0}).think_times_s,
    "paired lengths": lambda rng, n: lengths.sample_prompt_and_output(LENGTHS[0], LENGTHS[1], rng, n),
    "system prompt": lambda rng, n: SystemPromptConfig(tokens=5).content(rng, np.ones(n, dtype=np.int64)),
    "sessions": lambda rng, _n: sessions.draw_plan(_conversations(concurrent_sessions=2), 2000, rng),
    "trace workload": lambda rng, _n: generate_requests(_TRACE_WORKLOAD, rng),
}


@pytest.mark.parametrize("rng", [7, np.random.RandomState(0), None], ids=["int", "RandomState", "None"])
@pytest.mark.parametrize("name", SAMPLERS)
def test_a_sampler_given_no_generator_says_what_it_expects(name: str, rng: object) -> None:
    """An int seed, a legacy RandomState or None is refused in one line that names the
    argument, the value's type and what it takes: an int raised "'int' object has no
    attribute 'integers'" from inside (and RandomState the same, or drew from its own
    stream where its method names happen to match); a constant or a trace drew nothing,
    so took it, and failed only where the distribution changed."""
    with pytest.raises(TypeError) as caught:
        SAMPLERS[name](rng, 3)
    message = str(caught.value)
    assert "\n" not in message
    assert re.fullmatch(rf"rng = .* \({type(rng).__name__}\): expected a numpy Generator, "
                        r"e\.g\. np\.random\.default_rng\(seed\)", message), message


@pytest.mark.parametrize("path,fmt,n", [
    ("traces/azure_conv_2023_first2000.csv", "azure", 2000),
    ("traces/azure_code_2023_first2000.csv", "auto", 2000),
    ("traces/mooncake_conversation_first1000.jsonl", "auto", 1000),
])
def test_real_traces_parse(path: str, fmt: str, n: int) -> None:
    arrival_s, prompt, output = read_trace(path, fmt)
    assert len(arrival_s) == len(prompt) == len(output) == n
    assert arrival_s[0] == 0 and np.all(np.diff(arrival_s) >= 0)
    assert prompt.min() >= 1 and output.min() >= 1


def test_azure_timestamps_are_seconds() -> None:
    arrival_s, prompt, output = read_trace("traces/azure_conv_2023_first2000.csv", max_requests=2)
    # The first two rows are 18:15:46.6805900 and 18:15:50.9951690.
    assert arrival_s[1] == pytest.approx(4.314579, abs=1e-6)
    assert prompt.tolist() == [374, 396] and output.tolist() == [44, 109]


@pytest.mark.parametrize(("first", "second"), [
    ("2024-05-10 00:00:00+00:00", "2024-05-10 00:00:10+00:00"),                # seconds
    ("2024-05-10 00:00:00.000+00:00", "2024-05-10 00:00:10.000+00:00"),        # ms
    ("2024-05-10 00:00:00.054012+00:00", "2024-05-10 00:00:10.054012+00:00"),  # us (Azure 2024)
    ("2024-05-10 00:00:00.054012000+00:00", "2024-05-10 00:00:10.054012000+00:00"),  # ns
    ("2024-05-10 00:00:00.0540120", "2024-05-10 00:00:10.0540120"),            # 2023, no zone
])
def test_azure_timestamps_are_seconds_at_every_resolution(tmp_path: Path, first: str,
                                                          second: str) -> None:
    f = tmp_path / "azure.csv"
    f.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n{first},10,2\n{second},20,3\n")
    arrival_s, _, _ = read_trace(str(f), "azure")
    assert arrival_s.tolist() == [0.0, 10.0]


def test_a_trace_path_that_is_no_path_is_named() -> None:
    """read_trace(None) and read_measurements(None) raised pathlib's "expected str, bytes or
    os.PathLike object, not NoneType" from inside (found calling them from Python)."""
    from orcasim.workload.traces import read_measurements

    with pytest.raises(ScenarioError, match=r"^path = None: expected a trace file's path \(str or Path\)$"):
        read_trace(None)  # type: ignore[arg-type]
    with pytest.raises(ScenarioError, match=r"^path = 3: expected a serving log's path \(str or Path\)$"):
        read_measurements(3)  # type: ignore[arg-type]


def test_orcasim_trace_and_max_requests(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0.5,10,3\n0.1,20,4\n2.0,5,1\n")
    arrival_s, prompt, output = read_trace(str(f))
    assert arrival_s.tolist() == [0.0, 0.4, 1.9]  # sorted, relative to the first arrival
    assert prompt.tolist() == [20, 10, 5]
    assert len(read_trace(str(f), max_requests=2)[0]) == 2


@pytest.mark.parametrize("body,message", [
    ("arrival_s,prompt_tokens,output_tokens\n0.5,10,3\n0.7,x,4\n", "line 3: prompt_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n0.5,10,0\n", "line 2: output_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,10,2\n", "line 2: arrival_s"),
    ("a,b\n1,2\n", "cannot tell the trace format"),
])
def test_bad_trace_rows_name_the_line(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(body)
    with pytest.raises(ValueError, match=message):
        read_trace(str(f))


def test_bad_mooncake_line_is_named(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_trace(str(f))


def test_a_lognormal_clipped_far_from_its_mean_warns_with_the_real_one() -> None:
    from orcasim.workload import WorkloadConfig
    from orcasim.workload.lengths import LognormalLength

    far = LognormalLength(kind="lognormal", mean=100, sigma=3, max=4000)
    assert far.clipped_mean_tokens() == pytest.approx(far.mean_tokens(), abs=0.5)  # the theory
    keys = {"num_requests": 10, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
            "output_tokens": {"kind": "constant", "value": 4}, "max_tokens": 5000}
    with pytest.warns(UserWarning, match=r"prompt_tokens: lognormal mean 100, sigma 3, "
                                         r"rounded and clipped to \[1, 4000\], has a mean of about 52\.4"):
        WorkloadConfig.model_validate({**keys, "prompt_tokens": far.model_dump()})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 700, sigma 1, max 3072: 659, within 10%: silent
        WorkloadConfig.model_validate({**keys, "prompt_tokens": {
            "kind": "lognormal", "mean": 700, "sigma": 1.0, "max": 3072}})


@pytest.mark.parametrize("mean,sigma,realised", [(1.4, 0.1, 1.23), (1.45, 0.05, 1.24)])
def test_a_lognormal_rounded_far_from_its_mean_warns_with_the_real_one(mean: float, sigma: float,
                                                                       realised: float) -> None:
    """Short lengths round far from `mean` (1.4 rounds to 1 but for its upper tail), where
    the clip alone moves nothing: the warning took the clipped mean before rounding and
    stayed silent while the lengths averaged 12% below the mean asked for."""
    dist = lengths.LognormalLength(kind="lognormal", mean=mean, sigma=sigma, max=100)
    assert within_standard_errors(dist.sample(np.random.default_rng(0), SAMPLES), dist.mean_tokens())
    assert dist.mean_tokens() == pytest.approx(realised, abs=0.005)
    with pytest.warns(UserWarning, match=rf"lognormal mean {mean:g}, sigma {sigma:g}, rounded "
                                         rf"and clipped to \[1, 100\], has a mean of about {realised:.1f}"):
        WorkloadConfig.model_validate({"num_requests": 10, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                                       "prompt_tokens": dist.model_dump(), "max_tokens": 200,
                                       "output_tokens": {"kind": "constant", "value": 4}})


# By hand: each rule of the generators and the workload table, on cases small enough to
# compute in the test (the sample-mean tests above cannot see a shift of a token or two).


def _normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def test_a_lognormal_length_is_rounded_then_clipped_to_its_support() -> None:
    """P(k) is the mass the lognormal puts within half a token of k; 1 and `max` also take
    the tails below 1.5 and above max - 0.5. The sample and the theory both follow it."""
    dist = lengths.LognormalLength(kind="lognormal", mean=3.0, sigma=0.8, max=6)
    mu = math.log(3.0) - 0.8**2 / 2
    cdf = [_normal_cdf((math.log(k + 0.5) - mu) / 0.8) for k in range(1, 6)]
    pmf = np.diff([0.0, *cdf, 1.0])  # P(1) .. P(6)
    assert dist.mean_tokens() == pytest.approx(float(np.dot(np.arange(1, 7), pmf)), rel=1e-12)
    x = dist.sample(np.random.default_rng(5), SAMPLES)
    counts = np.bincount(x, minlength=8)[1:7]
    assert counts.sum() == SAMPLES  # nothing below 1 or above max
    se = np.sqrt(pmf * (1 - pmf) / SAMPLES)
    assert np.all(np.abs(counts / SAMPLES - pmf) <= MEAN_SIGMAS * se), (counts / SAMPLES, pmf)


@pytest.mark.parametrize("mean,sigma,limit", [(3.0, 1.5, 50), (100.0, 3.0, 4000), (700.0, 1.0, 3072)])
def test_the_clipped_mean_is_the_integral_of_the_clipped_lognormal(mean: float, sigma: float,
                                                                    limit: int) -> None:
    dist = lengths.LognormalLength(kind="lognormal", mean=mean, sigma=sigma, max=limit)
    mu = math.log(mean) - sigma**2 / 2
    # E[min(max(X, 1), M)] over the normal density of ln X, by the trapezoid rule.
    z = np.linspace(-12.0, 12.0, 400_001)
    x = np.exp(mu + sigma * z)
    density = np.exp(-z**2 / 2) / math.sqrt(2 * math.pi)
    integral = float(np.trapezoid(np.clip(x, 1, limit) * density, z))
    assert dist.clipped_mean_tokens() == pytest.approx(integral, rel=1e-7)


def test_length_bounds_are_inclusive() -> None:
    values = np.array([1, 10**9, 0, 10**9 + 1, 2.5, np.nan, np.inf, -3], dtype=np.float64)
    assert lengths.bad_lengths(values).tolist() == [False, False, True, True, True, True, True, True]


def _trace_workload(tmp_path: Path, **keys: object) -> WorkloadConfig:
    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,3\n1,20,4\n3,5,1\n4,7,2\n")
    arrival = {"kind": "trace", "path": str(f), **keys.pop("arrival", {})}  # type: ignore[dict-item]
    return WorkloadConfig.model_validate({"arrival": arrival, "max_tokens": 64, **keys})


def test_a_trace_is_sped_up_and_capped(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    fast = generate_requests(_trace_workload(tmp_path, arrival={"speedup": 2.0}), rng)
    assert fast.arrival_s.tolist() == [0.0, 0.5, 1.5, 2.0]  # speedup divides the times
    assert generate_requests(_trace_workload(tmp_path, num_requests=2), rng).prompt_tokens.tolist() == [10, 20]
    both = _trace_workload(tmp_path, num_requests=3, arrival={"max_requests": 3})
    assert len(generate_requests(both, rng)) == 3
    assert len(generate_requests(_trace_workload(tmp_path), rng)) == 4


def test_a_trace_capped_twice_or_beyond_its_length_says_so(tmp_path: Path) -> None:
    """Two different caps: which one was meant? One beyond the trace's requests: all of
    them are replayed, and the run says so (the cap silently read as fewer)."""
    with pytest.raises(ValueError, match=r"workload.num_requests = 2 and workload.arrival."
                                         r"max_requests = 3: expected one of them"):
        _trace_workload(tmp_path, num_requests=2, arrival={"max_requests": 3})
    for keys, key in (({"num_requests": 10}, "num_requests"),
                      ({"arrival": {"max_requests": 10}}, "arrival.max_requests")):
        with pytest.warns(UserWarning, match=rf"^workload\.{key} = 10, but t\.csv holds 4 "
                                             r"requests: all 4 are replayed$"):
            assert len(generate_requests(_trace_workload(tmp_path, **keys),
                                         np.random.default_rng(0))) == 4


def test_a_request_longer_than_max_tokens_is_named(tmp_path: Path) -> None:
    cfg = _trace_workload(tmp_path, max_tokens=13)  # 13, 24, 6, 9: one over
    with pytest.raises(ScenarioError, match=r"workload.max_tokens = 13 is below request 1's \(t\.csv "
                                            r"line 3\) prompt "
                                            r"\+ output = 24 tokens \(1 request\(s\) exceed it\); "
                                            r"expected max_tokens >= 24$"):
        generate_requests(cfg, np.random.default_rng(0))
    cfg = _trace_workload(tmp_path, max_tokens=9)  # 13, 24, 6, 9: two over
    with pytest.raises(ScenarioError, match=r"request 0's \(t\.csv line 2\) prompt \+ output = 13 "
                                            r"tokens \(2 request"):
        generate_requests(cfg, np.random.default_rng(0))
    generate_requests(_trace_workload(tmp_path, max_tokens=24), np.random.default_rng(0))  # exact fit


def test_a_request_over_max_tokens_by_its_system_prompt_says_so() -> None:
    """prompt_tokens up to 512 and output_tokens up to 128 under max_tokens 640, with a
    system prompt of 64 tokens: 'request 96's prompt + output = 657 tokens' said nothing of
    the 64 tokens put before the prompts drawn (a tester's finding)."""
    cfg = WorkloadConfig.model_validate({
        "num_requests": 500, "arrival": {"kind": "poisson", "rate_per_s": 2.0},
        "prompt_tokens": {"kind": "uniform", "low": 32, "high": 512},
        "output_tokens": {"kind": "uniform", "low": 1, "high": 128}, "max_tokens": 640,
        "system_prompt": {"tokens": 64, "fraction": 0.5}})
    with pytest.raises(ScenarioError, match=r"prompt \(with workload\.system_prompt's 64 tokens\) "
                                            r"\+ output = \d+ tokens"):
        generate_requests(cfg, np.random.default_rng(0))


def test_a_system_prompt_names_its_segments_apart_from_the_requests_own() -> None:
    cfg = SystemPromptConfig(tokens=5, variants=2)  # every request carries one of two
    content = cfg.content(np.random.default_rng(0), np.array([3, 4, 1, 6], dtype=np.int64))
    # (system id, 5, own id, own tokens): system ids 0-1, own text 2-5, outputs 6-9.
    for i, segments in enumerate(content.prompts):
        assert segments[0] in (0, 1) and segments[1:] == (5, 2 + i, [3, 4, 1, 6][i])
    assert content.output_ids.tolist() == [6, 7, 8, 9]
    none = SystemPromptConfig(tokens=5, fraction=0.0).content(np.random.default_rng(0),
                                                              np.array([3, 4], dtype=np.int64))
    assert none.prompts == [(1, 3), (2, 4)] and none.output_ids.tolist() == [3, 4]


def test_which_requests_carry_a_system_prompt_stays_across_output_distributions() -> None:
    """Common random numbers: drawn from the lengths' stream after the outputs, a change of
    the output distribution's kind redrew which requests carry a system prompt (half the
    prompts differed; a tester's finding). Arrivals and prompts now stay."""
    base = {"num_requests": 2000, "arrival": {"kind": "poisson", "rate_per_s": 2.0},
            "prompt_tokens": {"kind": "uniform", "low": 32, "high": 512},
            "max_tokens": 4096, "system_prompt": {"tokens": 700, "fraction": 0.5, "variants": 4}}
    drawn = []
    for output in ({"kind": "uniform", "low": 1, "high": 128}, {"kind": "constant", "value": 64},
                   {"kind": "lognormal", "mean": 100, "sigma": 1.0, "max": 1000}):
        cfg = WorkloadConfig.model_validate({**base, "output_tokens": output})
        drawn.append(generate_requests(cfg, np.random.default_rng(3)))
    for other in drawn[1:]:
        assert np.array_equal(other.arrival_s, drawn[0].arrival_s)
        assert np.array_equal(other.prompt_tokens, drawn[0].prompt_tokens)
        assert other.content.prompts == drawn[0].content.prompts
    assert 0.4 < np.mean(drawn[0].prompt_tokens > 512) < 0.6  # half carry one


def test_a_system_prompt_is_refused_on_a_trace_that_says_what_prompts_share(tmp_path: Path) -> None:
    f = tmp_path / "m.jsonl"  # a Mooncake trace, its format detected
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [0]}\n')
    cfg = WorkloadConfig.model_validate({"arrival": {"kind": "trace", "path": str(f)},
                                         "max_tokens": 64, "system_prompt": {"tokens": 4}})
    with pytest.raises(ScenarioError, match=r"^workload.system_prompt must not be set with a trace "
                                            r"whose hash_ids already say what the prompts share "
                                            r"\(mooncake\)$"):
        generate_requests(cfg, np.random.default_rng(0))


def test_an_empirical_length_column_is_read_and_checked(tmp_path: Path) -> None:
    f = tmp_path / "lens.csv"
    f.write_text("a,prompt\n1,7\n2,3\n3,7\n")
    dist = lengths.EmpiricalLength(kind="empirical", path=str(f), column="prompt")
    assert dist.values().tolist() == [7, 3, 7] and dist.values().dtype == np.int64
    assert dist.mean_tokens() == pytest.approx(17 / 3)
    assert set(dist.sample(np.random.default_rng(0), 100).tolist()) == {3, 7}
    missing = lengths.EmpiricalLength(kind="empirical", path=str(f), column="output")
    with pytest.raises(ScenarioError, match=r"^.*lens\.csv: no column 'output'; columns are a, prompt$"):
        missing.values()
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt\n5\n6\n0\n2.5\n")  # the header is line 1: the first bad value is line 4
    with pytest.raises(ScenarioError, match=r"^bad\.csv line 4: column 'prompt' = '0', "
                                            r"expected an integer from 1 to 1,000,000,000$"):
        lengths.load_length_column(str(bad), "prompt")


def test_an_empirical_files_error_names_the_key_that_gave_it(tmp_path: Path) -> None:
    """'e.csv: no column 'x'; columns are p, o' named neither the key nor which of the
    workload's length distributions gave it (both name one file); a session's alike."""
    f = tmp_path / "e.csv"
    f.write_text("p,o\n10,5\n0,6\n")
    cfg = WorkloadConfig.model_validate({
        "num_requests": 5, "arrival": {"kind": "poisson", "rate_per_s": 1.0}, "max_tokens": 64,
        "prompt_tokens": {"kind": "constant", "value": 3},
        "output_tokens": {"kind": "empirical", "path": str(f), "column": "x"}})
    with pytest.raises(ScenarioError, match=r"^workload\.output_tokens: \S*e\.csv: no column 'x'; "
                                            r"columns are p, o$"):
        generate_requests(cfg, np.random.default_rng(0))
    arrival = {"kind": "conversations", "num_sessions": 2, "concurrent_sessions": 1,
               "turns": {"kind": "constant", "value": 2},
               "user_tokens": {"kind": "empirical", "path": str(f), "column": "p"},
               "output_tokens": {"kind": "constant", "value": 3},
               "think_time": {"kind": "constant", "value_s": 0}, "max_context_tokens": 64}
    cfg = WorkloadConfig.model_validate({"max_tokens": 128, "arrival": arrival})
    with pytest.raises(ScenarioError, match=r"^workload\.arrival\.user_tokens: e\.csv line 3: "
                                            r"column 'p' = '0', expected an integer from 1"):
        generate_requests(cfg, np.random.default_rng(0))


def test_prompt_and_output_from_one_file_keep_their_rows_together(tmp_path: Path) -> None:
    """Two empirical columns of one file are drawn as rows, as the conversations they
    measured paired them: drawn apart, ShareGPT's prompt and answer lengths lost their
    pairing (a tester's finding). Each row here has output = 1000 + prompt. The prompts are
    the draws they were (`sample`'s), so a prompt-only change keeps its common numbers."""
    f = tmp_path / "pairs.csv"
    f.write_text("prompt,output\n" + "".join(f"{p},{1000 + p}\n" for p in range(1, 200)))
    cfg = WorkloadConfig.model_validate({
        "num_requests": 500, "arrival": {"kind": "poisson", "rate_per_s": 1.0}, "max_tokens": 2000,
        "prompt_tokens": {"kind": "empirical", "path": str(f), "column": "prompt"},
        "output_tokens": {"kind": "empirical", "path": str(f), "column": "output"}})
    reqs = generate_requests(cfg, np.random.default_rng(3))
    assert (reqs.output_tokens == reqs.prompt_tokens + 1000).all()
    rng = np.random.default_rng(3)
    np.cumsum(cfg.arrival.gaps_s(rng, 500))
    assert reqs.prompt_tokens.tolist() == cfg.prompt_tokens.sample(rng, 500).tolist()
    # Another file (or another kind) for the outputs: drawn on their own, as before.
    g = tmp_path / "other.csv"
    g.write_text(f.read_text())
    apart = cfg.model_copy(update={"output_tokens": lengths.EmpiricalLength(
        kind="empirical", path=str(g), column="output")})
    reqs = generate_requests(apart, np.random.default_rng(3))
    assert (reqs.output_tokens != reqs.prompt_tokens + 1000).mean() > 0.9


def test_one_file_spelled_two_ways_pairs_and_one_column_for_both_does_not(tmp_path: Path) -> None:
    """The pairing asks for one file, not one spelling: 'sub/../pairs.csv' beside 'pairs.csv'
    (or a link to it) was drawn apart. One column for both lengths is no pair: drawn as rows,
    every output equalled its prompt (independent draws before the pairing)."""
    (tmp_path / "sub").mkdir()
    f = tmp_path / "pairs.csv"
    f.write_text("prompt,output\n" + "".join(f"{p},{1000 + p}\n" for p in range(1, 200)))
    (tmp_path / "link.csv").symlink_to(f)

    def drawn(prompt: tuple[str, str], output: tuple[str, str]) -> Any:
        cfg = WorkloadConfig.model_validate({
            "num_requests": 500, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
            "max_tokens": 2000,
            "prompt_tokens": {"kind": "empirical", "path": prompt[0], "column": prompt[1]},
            "output_tokens": {"kind": "empirical", "path": output[0], "column": output[1]}})
        return generate_requests(cfg, np.random.default_rng(3))

    for other in (str(tmp_path / "sub" / ".." / "pairs.csv"), str(tmp_path / "link.csv")):
        reqs = drawn((str(f), "prompt"), (other, "output"))
        assert (reqs.output_tokens == reqs.prompt_tokens + 1000).all(), other
    reqs = drawn((str(f), "prompt"), (str(f), "prompt"))
    assert (reqs.output_tokens != reqs.prompt_tokens).mean() > 0.9


@pytest.mark.parametrize(("body", "message"), [
    ("len\n10\nabc\n", r"^e\.csv line 3: column 'len' = 'abc', expected an integer from 1 to "),
    ("a,len\n1,10\n2,\n", r"^e\.csv line 3: column 'len' = \(empty\), expected an integer"),
    ("len\n10\n\n\n11\nabc\n", r"^e\.csv line 6: column 'len' = 'abc'"),  # blank lines count
    ("len\n", r"^.*e\.csv: column 'len' has no rows; expected at least one length, an integer "),
])
def test_an_empirical_column_of_no_numbers_or_no_rows_is_one_line(
    tmp_path: Path, body: str, message: str,
) -> None:
    f = tmp_path / "e.csv"
    f.write_text(body)
    with pytest.raises(ScenarioError, match=message) as caught:
        lengths.load_length_column(str(f), "len")
    assert "\n" not in str(caught.value)


def _conversations(**keys: object) -> sessions.SessionShape:
    data = {"kind": "conversations", "num_sessions": 4, "turns": {"kind": "uniform", "low": 1, "high": 4},
            "user_tokens": {"kind": "constant", "value": 5},
            "output_tokens": {"kind": "constant", "value": 3},
            "think_time": {"kind": "exponential", "mean_s": 2.0}, "max_context_tokens": 1000, **keys}
    return sessions.ConversationArrival.model_validate(data).shape()


def test_sessions_start_as_a_poisson_process_at_their_rate() -> None:
    plan = sessions.draw_plan(_conversations(num_sessions=SAMPLES // 10, session_rate_per_s=4.0),
                              2000, np.random.default_rng(0))
    assert plan.start_s is not None and np.all(np.diff(plan.start_s) >= 0)
    assert within_standard_errors(np.diff(plan.start_s, prepend=0.0), 0.25)
    at_once = sessions.draw_plan(_conversations(concurrent_sessions=2), 2000, np.random.default_rng(0))
    assert at_once.start_s is None and at_once.concurrent == 2


def test_no_pause_follows_a_sessions_last_step() -> None:
    plan = sessions.draw_plan(_conversations(concurrent_sessions=1), 2000, np.random.default_rng(3))
    last = plan.step_start[1:] - 1
    assert np.all(plan.pause_s[last] == 0.0)
    assert np.all(np.delete(plan.pause_s, last) > 0.0)  # exponential think times elsewhere
    assert len(plan.step_start) == 5 and len(set(np.diff(plan.step_start).tolist())) > 1


def _plan(wait_for: int, max_context_tokens: int, num_sessions: int = 2) -> sessions.SessionPlan:
    """Session 0 (system prompt of 10) takes steps 0 and 1, session 1 (none) step 2; two
    branches a step."""
    steps = [0, 2, 3][: num_sessions + 1]
    total = steps[-1]
    return sessions.SessionPlan(
        None, 1, np.array([0, -1][:num_sessions], dtype=np.int64), 10, np.array(steps, dtype=np.int64),
        np.arange(total, dtype=np.int64), np.array([5, 7, 3][:total], dtype=np.int64),
        np.arange(2 * total, dtype=np.int64).reshape(total, 2),
        np.array([[4, 9], [2, 6], [8, 1]][:total], dtype=np.int64).reshape(total, 2),
        np.zeros(total), wait_for, max_context_tokens, 4096)


@pytest.mark.parametrize("wait_for,limit,expected", [
    # The context keeps each step's longest answer: step 1's prompt is 10 + 5 + 9 + 7 = 31;
    # each bound adds the step's longest answer less its last token.
    (1, 100, [10 + 5 + 9 - 1, 10 + 5 + 9 + 7 + 6 - 1, 3 + 8 - 1]),
    (2, 100, [10 + 5 + 9 - 1, 10 + 5 + 4 + 9 + 7 + 6 - 1, 3 + 8 - 1]),  # both answers kept
    (1, 20, [10 + 5 + 9 - 1, 20 + 6 - 1, 3 + 8 - 1]),  # the prompt is capped at the limit
])
def test_a_session_steps_peak_bound_by_hand(wait_for: int, limit: int, expected: list[int]) -> None:
    assert _plan(wait_for, limit).peak_bound_tokens().tolist() == expected
    empty = _plan(wait_for, limit, num_sessions=0).peak_bound_tokens()
    assert empty.dtype == np.int64 and empty.tolist() == []


def test_every_piece_of_session_text_has_its_own_id() -> None:
    """Own system prompts (shared_fraction 0) take ids 1..S, after the shared one (0);
    messages and answers follow: no two texts share an id, or a prefix cache would match them."""
    plan = sessions.draw_plan(_conversations(concurrent_sessions=1, system_prompt={
        "tokens": 4, "shared_fraction": 0.0}), 2000, np.random.default_rng(0))
    assert plan.system_ids.tolist() == [1, 2, 3, 4]
    ids = np.concatenate([plan.system_ids, plan.message_ids, plan.output_ids.ravel()])
    assert len(np.unique(ids)) == len(ids) and ids.min() == 1


@pytest.mark.parametrize("system", [None, {"tokens": 4}])
def test_the_context_limit_may_hold_exactly_the_system_prompt_and_the_longest_message(
        system: dict | None) -> None:
    need = 5 + (4 if system else 0)
    shape = _conversations(concurrent_sessions=1, system_prompt=system, max_context_tokens=need)
    sessions.draw_plan(shape, 2000, np.random.default_rng(0))  # fits exactly
    shape = _conversations(concurrent_sessions=1, system_prompt=system, max_context_tokens=need - 1)
    with pytest.raises(ScenarioError, match=rf"^workload.arrival.max_context_tokens = {need - 1} is "
                                            rf"below the system prompt plus the longest message = "
                                            rf"{need} tokens, which truncation cannot drop; "
                                            rf"expected max_context_tokens >= {need}$"):
        sessions.draw_plan(shape, 2000, np.random.default_rng(0))


@pytest.mark.parametrize(("arrival", "key"), [
    ({"kind": "poisson", "rate_per_s": 1e-309}, "rate_per_s"),
    ({"kind": "poisson", "rate_per_s": 1e-307}, "rate_per_s"),  # finite gaps, an infinite sum
    ({"kind": "gamma", "rate_per_s": 1e-320, "cv": 2.0}, "rate_per_s"),
    ({"kind": "constant", "rate_per_s": 1e-308}, "rate_per_s"),
])
def test_a_rate_whose_times_overflow_is_refused_by_its_key(arrival: dict, key: str) -> None:
    """1 / 1e-309 is inf: every arrival at infinity, and the engine stopped on an assertion
    (a traceback) before the run's own check of its times. One line: numpy's own overflow
    warning came first."""
    cfg = WorkloadConfig.model_validate({"num_requests": 50, "arrival": arrival, "max_tokens": 64,
                                         "prompt_tokens": {"kind": "constant", "value": 8},
                                         "output_tokens": {"kind": "constant", "value": 4}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ScenarioError, match=rf"^workload.arrival.{key} = .*: the arrival times "
                                                "overflow to infinity"):
            generate_requests(cfg, np.random.default_rng(0))


@pytest.mark.parametrize("rate", [1e-8, 2.5e-7])
def test_a_rate_whose_times_pass_the_clock_s_range_is_refused_before_any_run(rate: float) -> None:
    """Finite arrival times beyond MAX_TIME_S (1e9 s): `validate` said ok and a sweep ran
    the point, and only the run refused it after simulating, under a system's name (a
    tester's finding). Refused with the arrivals, by the key."""
    from typer.testing import CliRunner

    from orcasim.cli import app

    result = CliRunner().invoke(app, ["validate", "scenarios/quickstart.yaml", "--set",
                                      f"workload.arrival.rate_per_s={rate}"])
    assert result.exit_code == 2
    assert re.search(rf"workload.arrival.rate_per_s = {rate:g}: the arrival times reach .* beyond "
                     "1e\\+09 s", result.output), result.output
    ok = CliRunner().invoke(app, ["validate", "scenarios/quickstart.yaml", "--set",
                                  "workload.arrival.rate_per_s=1e-5"])  # 2e8 s: within range
    assert ok.exit_code == 0, ok.output


def test_a_trace_speedup_whose_times_overflow_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,8,4\n1,8,4\n")
    cfg = WorkloadConfig.model_validate({"arrival": {"kind": "trace", "path": str(tmp_path / "t.csv"),
                                                     "speedup": 1e-309}, "max_tokens": 64})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warning came first, on a line of its own
        with pytest.raises(ScenarioError, match=r"^workload.arrival.speedup = .*: the arrival times "
                                                "overflow"):
            generate_requests(cfg, np.random.default_rng(0))


def test_a_trace_in_another_unit_is_named_by_its_file_not_a_speedup(tmp_path: Path) -> None:
    """Times in microseconds read as seconds reach 8.6e10 s: the error blamed
    'workload.arrival.speedup = 1' (never set) and asked for a rate (a tester's finding)."""
    (tmp_path / "us.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n86400000000,10,2\n")
    trace = {"kind": "trace", "path": str(tmp_path / "us.csv")}
    cfg = WorkloadConfig.model_validate({"arrival": trace, "max_tokens": 64})
    with pytest.raises(ScenarioError, match=r"^workload.arrival.path = .*us.csv': its arrivals span "
                                            r"8.64e\+10 s, .* expected arrival times in seconds"):
        generate_requests(cfg, np.random.default_rng(0))
    (tmp_path / "s.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n864,10,2\n")
    slow = WorkloadConfig.model_validate({"arrival": {**trace, "path": str(tmp_path / "s.csv"),
                                                      "speedup": 1e-7}, "max_tokens": 64})
    with pytest.raises(ScenarioError, match=r"^workload.arrival.speedup = 1e-07: .* expected a "
                                            r"speedup that keeps them below 1e\+09 s$"):
        generate_requests(slow, np.random.default_rng(0))


def test_a_mooncake_trace_in_another_unit_is_told_its_own_unit(tmp_path: Path) -> None:
    """Mooncake's timestamps are milliseconds: a trace in microseconds spanning 12 days was
    told 'expected arrival times in seconds', which it would read as milliseconds, 1000
    times too fast (a tester's finding)."""
    lines = [{"timestamp": t, "input_length": 10, "output_length": 2} for t in (0, 1.2e12)]
    (tmp_path / "us.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    trace = {"kind": "trace", "path": str(tmp_path / "us.jsonl")}
    cfg = WorkloadConfig.model_validate({"arrival": trace, "max_tokens": 64})
    with pytest.raises(ScenarioError, match=r"its arrivals span 1.2e\+09 s, .* expected timestamp "
                                            r"in milliseconds \(are they in us or ns\?\)$"):
        generate_requests(cfg, np.random.default_rng(0))


def test_a_lognormal_mean_over_a_huge_support_is_quick() -> None:
    """The exact mean summed over every token up to `max`: 10^9 tokens took minutes and tens
    of GB (a session's step count bounded so). Past exp(mu + 9 sigma) the mass is negligible."""
    import time

    start = time.perf_counter()
    small = lengths.LognormalLength(kind="lognormal", mean=8, sigma=0.5, max=50)
    huge = lengths.LognormalLength(kind="lognormal", mean=8, sigma=0.5, max=10**9)
    wide = lengths.LognormalLength(kind="lognormal", mean=100, sigma=3, max=10**9)
    assert huge.mean_tokens() == pytest.approx(huge.clipped_mean_tokens(), abs=0.5)
    assert wide.mean_tokens() == wide.clipped_mean_tokens()  # the closed form past 10^6 tokens
    assert small.mean_tokens() == pytest.approx(7.999713547843641, rel=1e-15)  # as before
    assert time.perf_counter() - start < 5.0


def test_an_empirical_column_is_read_again_when_its_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("n\n5\n6\n")
    assert lengths.load_length_column(str(path), "n").tolist() == [5, 6]
    path.write_text("n\n500\n600\n700\n")  # a cache by path alone served [5, 6]
    assert lengths.load_length_column(str(path), "n").tolist() == [500, 600, 700]


def test_a_session_rate_whose_starts_overflow_is_refused() -> None:
    for rate in (1e-310, 1e-307):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(ScenarioError, match=rf"^workload.arrival.session_rate_per_s = {rate:g}: "
                                                    "the arrival times overflow to infinity"):
                sessions.draw_plan(_conversations(num_sessions=50, session_rate_per_s=rate), 2000,
                                   np.random.default_rng(0))


@pytest.mark.parametrize("cv,n,warned", [(30.0, 1000, True), (10.0, 1000, True),
                                         (4.0, 1000, False), (2.0, 100, False)])
def test_gamma_arrivals_too_bursty_for_the_run_are_warned(cv: float, n: int, warned: bool) -> None:
    """The span of n gamma gaps has a cv of cv/sqrt(n): above GAMMA_SPAN_CV_LIMIT a run's
    realised rate is far from rate_per_s on many seeds (cv 30, 1,000 requests: 0.22 to 106
    times it over 20 draws of 1,000 gaps), which went without a word."""
    cfg = WorkloadConfig.model_validate({
        "num_requests": n, "arrival": {"kind": "gamma", "rate_per_s": 1.0, "cv": cv},
        "prompt_tokens": {"kind": "constant", "value": 8},
        "output_tokens": {"kind": "constant", "value": 4}, "max_tokens": 64})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generate_requests(cfg, np.random.default_rng(0))
    said = [str(w.message) for w in caught if "workload.arrival.cv" in str(w.message)]
    assert bool(said) == warned
    if warned:
        assert f"{n:,} requests" in said[0] and f"{int(np.ceil(16 * cv * cv)):,} requests" in said[0]


def _same_at_two_seeds(cfg: WorkloadConfig) -> bool:
    """Whether seeds 0 and 1 draw the same requests (a session workload: the same plan)."""
    a, b = (generate_requests(cfg, np.random.default_rng(seed)) for seed in (0, 1))
    if a.sessions is not None and b.sessions is not None:
        pairs = zip(vars(a.sessions).values(), vars(b.sessions).values(), strict=True)
    else:
        pairs = zip([a.arrival_s, a.prompt_tokens, a.output_tokens, a.clients and a.clients.think_s],
                    [b.arrival_s, b.prompt_tokens, b.output_tokens, b.clients and b.clients.think_s],
                    strict=True)
    return all(_equal(x, y) for x, y in pairs)


def _equal(x: Any, y: Any) -> bool:
    if x is None or y is None:
        return x is y
    return np.array_equal(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64),
                          equal_nan=True)


_CONSTANT = {"kind": "constant", "value": 3}
_CLOSED_LOOP = {"num_requests": 50, "prompt_tokens": _CONSTANT, "output_tokens": _CONSTANT,
                "max_tokens": 100, "arrival": {"kind": "closed_loop", "num_clients": 4,
                                               "think_time": {"kind": "constant", "value_s": 1.0}}}
_AGENTS = {"max_tokens": 1000, "arrival": {
    "kind": "agents", "num_sessions": 6, "concurrent_sessions": 2, "steps": _CONSTANT,
    "observation_tokens": _CONSTANT, "output_tokens": _CONSTANT,
    "tool_time": {"kind": "constant", "value_s": 1.0}, "max_context_tokens": 500,
    "system_prompt": {"tokens": 5, "shared_fraction": 1.0}}}


@pytest.mark.parametrize("changes,alike", [
    ({}, True),
    ({"arrival.think_time": {"kind": "exponential", "mean_s": 1.0}}, False),
    ({"prompt_tokens": {"kind": "uniform", "low": 1, "high": 3}}, False),
])
def test_a_closed_loop_that_draws_nothing_says_so(changes: dict, alike: bool) -> None:
    """A closed loop of constant think times and lengths draws the same requests at every
    seed: a sweep's three replications ran alike without a word (their throughputs equal to
    the last digit), where constant open arrivals said so."""
    data = _with(_CLOSED_LOOP, changes)
    cfg = WorkloadConfig.model_validate(data)
    assert _same_at_two_seeds(cfg) == alike
    assert (cfg.draws_nothing() == "a closed loop of constant think times and constant lengths") == alike


@pytest.mark.parametrize("changes,alike", [
    ({}, True),
    ({"arrival.system_prompt": {"tokens": 5, "shared_fraction": 0.0}}, True),
    ({"arrival.system_prompt": {"tokens": 5, "shared_fraction": 0.5}}, False),
    ({"arrival.steps": {"kind": "uniform", "low": 1, "high": 3}}, False),
    ({"arrival.tool_time": {"kind": "exponential", "mean_s": 1.0}}, False),
    ({"arrival.concurrent_sessions": None, "arrival.session_rate_per_s": 1.0}, False),
])
def test_sessions_that_draw_nothing_say_so(changes: dict, alike: bool) -> None:
    cfg = WorkloadConfig.model_validate(_with(_AGENTS, changes))
    assert _same_at_two_seeds(cfg) == alike
    said = "agents of constant lengths and pauses at a fixed concurrency"
    assert (cfg.draws_nothing() == said) == alike


def _with(data: dict, changes: dict) -> dict:
    """`data` with dotted keys (one level below the top at most) replaced."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for key, value in changes.items():
        top, _, inner = key.partition(".")
        if inner:
            out[top][inner] = value
        else:
            out[top] = value
    return out
