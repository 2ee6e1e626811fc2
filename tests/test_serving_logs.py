"""Real serving logs: orcasim's CSV and vLLM's benchmark result give the same run."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orcasim.workload.traces import read_measurements, read_trace

RUN = Path(__file__).resolve().parent.parent / "orcasim/data/ground_truth/distserve_opt13b_a100/vllm-100-1.csv"


def _as_vllm_result(frame: pd.DataFrame, path: Path, failed: int | None = None) -> Path:
    """The run as `vllm bench serve --save-result --save-detailed` writes it: parallel lists,
    start times on a monotonic clock, inter-token gaps per request."""
    itls = [[t] * (n - 1) for t, n in zip(frame["tpot_s"], frame["output_tokens"], strict=True)]
    doc = {"backend": "vllm", "start_times": (frame["arrival_s"] + 353399.7).tolist(),
           "input_lens": frame["prompt_tokens"].tolist(), "output_lens": frame["output_tokens"].tolist(),
           "ttfts": frame["ttft_s"].tolist(), "itls": itls, "errors": [""] * len(frame)}
    if failed is not None:
        doc["errors"][failed], doc["output_lens"][failed] = "timeout", 0
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("name", ["result.json", "profile_export.jsonl"])
def test_a_benchmark_result_reads_as_the_csv_it_came_from(tmp_path: Path, name: str) -> None:
    """vLLM's result and AIPerf's per-request JSONL (NVIDIA's serving benchmark: arrivals
    from its epoch start times, TTFT and E2E in ms made seconds, TPOT derived as AIPerf
    defines its inter_token_latency, (request_latency - ttft) / (osl - 1)), found by content."""
    frame = pd.read_csv(RUN)
    write = _as_vllm_result if name.endswith(".json") else _as_aiperf_export
    path = write(frame, tmp_path / name)
    arrival, prompt, output = read_trace(str(path))
    np.testing.assert_allclose(arrival, frame["arrival_s"], atol=1e-9)
    assert prompt.tolist() == frame["prompt_tokens"].tolist()
    assert output.tolist() == frame["output_tokens"].tolist()
    measured = read_measurements(str(path))
    for column in ("ttft_s", "tpot_s", "e2e_s"):
        np.testing.assert_allclose(measured[column], frame[column], rtol=1e-9, err_msg=column)


def test_failed_requests_are_dropped(tmp_path: Path) -> None:
    frame = pd.read_csv(RUN)
    path = _as_vllm_result(frame, tmp_path / "result.json", failed=3)
    assert len(read_trace(str(path))[0]) == len(frame) - 1
    assert len(read_measurements(str(path))) == len(frame) - 1


def test_a_result_without_start_times_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"input_lens": [5], "output_lens": [3], "ttfts": [0.1],
                                "itls": [[0.01, 0.01]]}))
    with pytest.raises(ValueError, match="lacks start_times; save it with --save-result"):
        read_trace(str(path))


def test_the_orcasim_csv_keeps_what_it_measured(tmp_path: Path) -> None:
    path = tmp_path / "run.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,e2e_s\n0,10,5,0.1,0.5\n"
                    "0.5,10,1,0.2,0.2\n")
    measured = read_measurements(str(path))
    assert measured["tpot_s"].tolist()[0] == pytest.approx(0.1)  # (0.5 - 0.1) / 4
    assert np.isnan(measured["tpot_s"].tolist()[1])  # one token: no gap
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s\n0,10,5,-1\n")
    with pytest.raises(ValueError, match=r"bad.csv line 2: ttft_s = '-1', expected a number"):
        read_measurements(str(bad))
    # A request that ends before its first token (its TPOT would be negative).
    bad.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,e2e_s\n0,10,5,0.1,0.5\n\n"
                   "1,10,5,0.4,0.2\n")
    with pytest.raises(ValueError, match=r"^bad.csv line 4: e2e_s = 0\.2, expected a number >= "
                                         r"the request's ttft_s = 0\.4 \(a request cannot end before its "
                                         r"first token\)$"):
        read_measurements(str(bad))


@pytest.mark.parametrize(("text", "message"), [
    # Every latency in milliseconds: consistent, so no other check caught it (99.9% off, exit 0).
    ("ttft_s,e2e_s\n0,10,5,25,145\n1,10,5,30,150\n",
     r"^ms.csv: \(e2e_s - ttft_s\) / \(output_tokens - 1\)'s median = 30 s a token, expected "
     r"under 10 s \(no GPU server decodes that slowly\); seconds expected; these look like "
     r"milliseconds$"),
    ("ttft_s,tpot_s,e2e_s\n0,10,5,25,30,145\n1,10,5,30,30,150\n",
     r"^ms.csv: tpot_s's median = 30 s a token, expected under 10 s .*these look like milliseconds$"),
    ("ttft_s,e2e_s\n0,10,5,25,145\n1,10,2,30,90000\n",
     r"^ms.csv line 3: e2e_s = 90000.0, expected seconds, at most 86,400 \(a day: no benchmark "
     r"client waits that long on a request\); seconds expected; these look like milliseconds$"),
    # Not a unit at all: it was reported as a TPOT in milliseconds.
    ("ttft_s,tpot_s,e2e_s\n0,10,5,0.1,0.1,0.5\n1,10,5,0.2,0.1,1e300\n",
     r"^ms.csv line 3: e2e_s = 1e\+300, expected seconds, at most 86,400 \(a day: no benchmark "
     r"client waits that long on a request\)$"),
], ids=["derived TPOT in ms", "given TPOT in ms", "E2E in ms", "E2E of 1e300"])
def test_latencies_no_server_gives_in_seconds_are_refused(tmp_path: Path, text: str,
                                                          message: str) -> None:
    _refused(tmp_path / "ms.csv", text, message)


def test_a_median_tpot_no_gpu_decodes_at_is_said(tmp_path: Path) -> None:
    """A small model's log in ms (TTFT 48 ms, 7.6 ms a token) is under the refusal's 10 s a
    token as seconds: it read as a 48 s TTFT without a word (metricdefs tester). Above 1 s a
    token it is said; a log in seconds is read as before, without a warning."""
    path = tmp_path / "ms.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,e2e_s\n"
                    "0,10,5,48,78.4\n0.5,10,5,47,77.4\n")
    with pytest.warns(UserWarning, match=r"^ms.csv: \(e2e_s - ttft_s\) / \(output_tokens - 1\)'s "
                      r"median = 7.6 s a token, slower than a GPU decode step takes .*if the log "
                      r"is in milliseconds"):
        measured = read_measurements(str(path))
    assert measured["ttft_s"].tolist() == [48.0, 47.0]  # read as given
    path.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,e2e_s\n0,10,5,0.048,0.0784\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_measurements(str(path))


def _refused(path: Path, text: str, message: str) -> None:
    """A log of these columns and rows (after the arrival and length columns) is refused so."""
    path.write_text("arrival_s,prompt_tokens,output_tokens," + text)
    with pytest.raises(ValueError, match=message):
        read_measurements(str(path))


@pytest.mark.parametrize(("text", "message"), [
    ("ttft_s,tpot_s,e2e_s\n0,10,5,0.1,0.1,0.5\n1,10,1,0.2,0.05,0.2\n",
     r"^run.csv line 3: tpot_s = 0.05, expected empty or 0 for a request of output_tokens = 1 "
     r"\(one token leaves no gap between tokens\)$"),
    ("ttft_s,e2e_s\n0,10,5,0.1,0.5\n1,10,1,0.2,0.9\n",
     r"^run.csv line 3: e2e_s = 0.9, expected about the request's ttft_s = 0.2 for output_tokens "
     r"= 1 \(its one token is its first and its last; is output_tokens right\?\)$"),
], ids=["a TPOT", "an E2E after the TTFT"])
def test_a_one_token_request_with_a_second_token_is_refused(tmp_path: Path, text: str,
                                                            message: str) -> None:
    """Both were accepted: the TPOT dropped unread, the E2E fitted as a decode no token made."""
    path = tmp_path / "run.csv"
    _refused(path, text, message)
    # A stream's closing chunk a few ms after its one token, and a TPOT of 0, are fine.
    path.write_text("arrival_s,prompt_tokens,output_tokens,ttft_s,tpot_s,e2e_s\n"
                    "0,10,5,0.1,0.1,0.5\n1,10,1,0.2,0,0.203\n")
    assert read_measurements(str(path))["e2e_s"].tolist() == [0.5, 0.203]


def _aiperf_line(start_ns: int, isl: int, osl: int, ttft_ms: float | None, latency_ms: float,
                 error: dict[str, object] | None = None) -> str:
    """One record of AIPerf's profile_export.jsonl, as its docs show one (ai-dynamo/aiperf,
    docs/tutorials/working-with-profile-exports.md): times in ms, lengths in tokens."""
    metrics: dict[str, object] = {
        "input_sequence_length": {"value": isl, "unit": "tokens"},
        "request_latency": {"value": latency_ms, "unit": "ms"},
        "output_sequence_length": {"value": osl, "unit": "tokens"},
    }
    if ttft_ms is not None:  # streamed
        metrics["time_to_first_token"] = {"value": ttft_ms, "unit": "ms"}
        metrics["inter_token_latency"] = {"value": (latency_ms - ttft_ms) / max(osl - 1, 1),
                                          "unit": "ms"}
    if error is not None:
        metrics = {"error_isl": {"value": isl, "unit": "tokens"}}
    record = {"metadata": {"session_num": 0, "turn_index": 0, "request_start_ns": start_ns,
                           "request_end_ns": start_ns + int(latency_ms * 1e6),
                           "benchmark_phase": "profiling", "was_cancelled": False},
              "metrics": metrics, "error": error}
    return json.dumps(record)


def _as_aiperf_export(frame: pd.DataFrame, path: Path, failed: int | None = None) -> Path:
    epoch_ns = 1_759_813_207_532_900_363
    lines = [_aiperf_line(epoch_ns + round(r.arrival_s * 1e9), r.prompt_tokens, r.output_tokens,
                          r.ttft_s * 1e3, r.e2e_s * 1e3,
                          {"code": 500, "type": "ServerError", "message": "x"} if i == failed
                          else None)
             for i, r in enumerate(frame.itertuples())]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_aiperf_exports_failed_requests_are_dropped_with_a_warning(tmp_path: Path) -> None:
    frame = pd.read_csv(RUN)
    path = _as_aiperf_export(frame, tmp_path / "profile_export.jsonl", failed=3)
    with pytest.warns(UserWarning, match=r"1 of 100 requests failed"):
        assert len(read_trace(str(path))[0]) == len(frame) - 1
    with pytest.warns(UserWarning, match=r"1 of 100 requests failed"):
        assert len(read_measurements(str(path), "aiperf")) == len(frame) - 1


@pytest.mark.parametrize(("count", "which"), [(1, "its one request"), (3, "all 3 requests")])
def test_an_aiperf_export_of_failed_requests_alone_says_so(tmp_path: Path, count: int,
                                                           which: str) -> None:
    frame = pd.read_csv(RUN).iloc[:count]
    lines = [_as_aiperf_export(frame, tmp_path / "one.jsonl", failed=i).read_text().splitlines()[i]
             for i in range(count)]
    path = tmp_path / "profile_export.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"^profile_export.jsonl: {which} failed \(an error, "
                       r"a cancellation or no output\); expected at least one that finished$"):
        read_trace(str(path))


def test_aiperfs_raw_export_is_named_not_read_as_failed_requests(tmp_path: Path) -> None:
    """profile_export_raw.jsonl: the same metadata, the raw request and responses, no
    metrics. Read with --format aiperf it was 'all requests failed'; by content, Mooncake."""
    path = tmp_path / "profile_export_raw.jsonl"
    path.write_text(json.dumps({"metadata": {"session_num": 0, "request_start_ns": 10**18,
                                             "benchmark_phase": "profiling"},
                                "start_perf_ns": 1, "payload": {}, "responses": []}) + "\n")
    for fmt in ("aiperf", "auto"):
        with pytest.raises(ValueError, match=r"^profile_export_raw.jsonl line 1: not an AIPerf "
                           r"record; expected an object with a metadata and a metrics object"):
            read_trace(str(path), fmt)


def test_aiperfs_summary_is_named_not_taken_for_a_vllm_result(tmp_path: Path) -> None:
    path = tmp_path / "profile_export_aiperf.json"
    path.write_text(json.dumps({"aiperf_version": "0.5.0", "request_throughput":
                                {"unit": "requests/sec", "avg": 3.2}}, indent=2))
    with pytest.raises(ValueError, match=r"^profile_export_aiperf.json: AIPerf's aggregated "
                       r"statistics \(profile_export_aiperf.json\); expected its per-request "
                       r"records, profile_export.jsonl in the same artifacts folder$"):
        read_measurements(str(path))


def test_an_aiperf_exports_later_turns_are_warned_of(tmp_path: Path) -> None:
    """A session's second turn was sent as its first finished: replayed at its logged time,
    it is an open loop's, as a vLLM result's under --max-concurrency (warned of too)."""
    second = json.loads(_aiperf_line(10**18 + 10**9, 20, 5, 50.0, 500.0))
    second["metadata"]["turn_index"] = 1
    path = tmp_path / "profile_export.jsonl"
    path.write_text(_aiperf_line(10**18, 10, 5, 50.0, 500.0) + "\n" + json.dumps(second) + "\n")
    with pytest.warns(UserWarning, match=r"^profile_export.jsonl: 1 of 2 requests are later "
                      r"turns of multi-turn sessions \(metadata.turn_index > 0\)"):
        assert read_trace(str(path))[0].tolist() == [0.0, 1.0]


def test_a_capped_aiperf_export_keeps_the_first_requests_sent(tmp_path: Path) -> None:
    """AIPerf writes a record as its request finishes: here the long request sent first
    finishes last, after two short ones whose lines happen to be in start order."""
    path = tmp_path / "profile_export.jsonl"
    path.write_text(_aiperf_line(10**18 + 10**9, 10, 5, 50.0, 500.0) + "\n"
                    + _aiperf_line(10**18 + 3 * 10**9, 20, 5, 50.0, 500.0) + "\n"
                    + _aiperf_line(10**18, 30, 50, 50.0, 10_000.0) + "\n")
    arrival_s, prompt, _ = read_trace(str(path), "auto", max_requests=2)
    assert arrival_s.tolist() == [0.0, 1.0] and prompt.tolist() == [30, 10]


def test_an_aiperf_export_without_streaming_has_e2e_alone(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(_aiperf_line(10**18, 100, 20, None, 500.0) + "\n"
                    + _aiperf_line(10**18 + 250_000_000, 50, 10, None, 300.0) + "\n")
    measured = read_measurements(str(path))
    assert measured["e2e_s"].tolist() == [0.5, 0.3]
    assert measured["ttft_s"].isna().all() and measured["tpot_s"].isna().all()
    assert read_trace(str(path))[0].tolist() == [0.0, 0.25]


@pytest.mark.parametrize(("line", "message"), [
    ('{"metadata": {"request_start_ns": 1000000000000000000}, "metrics": {"request_latency": {"value": 3, "unit": "min"},'
     ' "input_sequence_length": {"value": 4, "unit": "tokens"}, "output_sequence_length": '
     '{"value": 2, "unit": "tokens"}}, "error": null}',
     r'^run.jsonl line 2: metrics.request_latency.unit = "min", expected one of s, sec, ms, us, ns$'),
    ('{"metadata": {"request_start_ns": "soon"}, "metrics": {}, "error": null}',
     r'^run.jsonl line 2: metadata.request_start_ns = "soon", expected the request\'s start in '
     r"integer nanoseconds since the Unix epoch \(time.time_ns\(\), 1e\+17 or more; a Unix time "
     r"in s, ms or us is smaller\)$"),
    # A Unix time in ms, read as ns, packed the arrivals a million times closer.
    ('{"metadata": {"request_start_ns": 1759813207532}, "metrics": {}, "error": null}',
     r"^run.jsonl line 2: metadata.request_start_ns = 1759813207532, expected the request's "
     r"start in integer nanoseconds since the Unix epoch"),
    ('{"metadata": {"request_start_ns": 1000000000000000000}, "metrics": {"request_latency": 3}, "error": null}',
     r"^run.jsonl line 2: metrics.request_latency = 3, expected an object with a value and a unit$"),
    ('{"metadata": {"request_start_ns": 1000000000000000000}, "metrics": {"input_sequence_length": {"value": true, '
     '"unit": "tokens"}, "output_sequence_length": {"value": 2, "unit": "tokens"}, '
     '"request_latency": {"value": 3, "unit": "ms"}}, "error": null}',
     r"^run.jsonl line 2: metrics.input_sequence_length.value = true, expected a number$"),
    ('{"metadata": {"request_start_ns": 1000000000000000000}, "metrics": {"input_sequence_length": {"value": 4, '
     '"unit": "tokens"}, "output_sequence_length": {"value": "7", "unit": "tokens"}, '
     '"request_latency": {"value": 3, "unit": "ms"}}, "error": null}',
     r'^run.jsonl line 2: metrics.output_sequence_length.value = "7", expected a number$'),
    ('{"metadata": {"request_start_ns": 1000000000000000000}, "metrics": {"output_sequence_length": '
     '{"value": 2, "unit": "tokens"}, "request_latency": {"value": 3, "unit": "ms"}}, "error": null}',
     r"^run.jsonl line 2: metrics has no input_sequence_length, expected the prompt's length in "
     r"tokens$"),
    # Accepted: a negative TTFT or E2E (the CSV and vLLM readers refuse one) was replayed.
    ('{"metadata": {"request_start_ns": 1000000000000000000}, "metrics": {"input_sequence_length": {"value": 4, '
     '"unit": "tokens"}, "output_sequence_length": {"value": 2, "unit": "tokens"}, '
     '"time_to_first_token": {"value": -5, "unit": "ms"}, "request_latency": {"value": 30, "unit": "ms"}}, '
     '"error": null}',
     r"^run.jsonl line 2: metrics.time_to_first_token.value = -5, expected a number of ms >= 0$"),
    ('{"metadata": {"request_start_ns": 1000000000000000000}, "metrics": {"input_sequence_length": {"value": 4, '
     '"unit": "tokens"}, "output_sequence_length": {"value": 2, "unit": "tokens"}, '
     '"request_latency": {"value": -0.1, "unit": "s"}}, "error": null}',
     r"^run.jsonl line 2: metrics.request_latency.value = -0.1, expected a number of s >= 0$"),
])
def test_a_bad_aiperf_record_is_a_one_line_error_naming_its_line(tmp_path: Path, line: str,
                                                                  message: str) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(_aiperf_line(10**18, 100, 20, 50.0, 500.0) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=message):
        read_measurements(str(path), "aiperf")


def test_fidelity_on_an_aiperf_export_is_fidelity_on_the_same_run(tmp_path: Path) -> None:
    """The validation scenario against one real run, as an orcasim CSV and as AIPerf's
    JSONL: the same table, number for number."""
    from orcasim.fidelity import fidelity_table
    from orcasim.scenario import load_scenario

    scenario_path = RUN.parents[4] / "scenarios/validation/vllm_opt13b_a100.yaml"
    scenario = load_scenario(scenario_path)
    export = _as_aiperf_export(pd.read_csv(RUN), tmp_path / "profile_export.jsonl")
    tables = [fidelity_table(scenario, [run], ["vllm-v0.2.3"], base_dir=scenario_path.parent)[0]
              for run in (RUN, export)]
    pd.testing.assert_frame_equal(tables[0].drop(columns="run"), tables[1].drop(columns="run"),
                                  rtol=1e-9)
