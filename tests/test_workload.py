"""Every random component matches its theoretical mean; traces parse and reject bad rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orcasim.workload import arrivals, lengths
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
                                         r"clipped to \[1, 4000\], has a mean of about 52\.4"):
        WorkloadConfig.model_validate({**keys, "prompt_tokens": far.model_dump()})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 700, sigma 1, max 3072: 659, within 10%: silent
        WorkloadConfig.model_validate({**keys, "prompt_tokens": {
            "kind": "lognormal", "mean": 700, "sigma": 1.0, "max": 3072}})
