"""Trace readers by hand: tiny files, each format's rows, orders and errors computed in the test.

Every file is written into `tmp_path`; every expected number and message is worked out from
the file's few lines (the real traces' tests cannot see a shifted line number or block).
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from orcasim.config import ScenarioError
from orcasim.workload.traces import read_measurements, read_trace, read_trace_with_content

ORCASIM_HEADER = "arrival_s,prompt_tokens,output_tokens"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
LENGTH_EXPECTED = r"an integer from 1 to 1,000,000,000"


def _write(tmp_path: Path, name: str, text: str) -> str:
    f = tmp_path / name
    f.write_text(text)
    return str(f)


def _mooncake(tmp_path: Path, records: list[dict[str, object]], name: str = "m.jsonl") -> str:
    return _write(tmp_path, name, "".join(json.dumps(r) + "\n" for r in records))


def _record(timestamp: object, tokens: object, ids: object, output: object = 2) -> dict[str, object]:
    return {"timestamp": timestamp, "input_length": tokens, "output_length": output, "hash_ids": ids}


def _vllm(tmp_path: Path, name: str = "r.json", **fields: object) -> str:
    return _write(tmp_path, name, json.dumps(fields))


# Ties: 60 requests, even rows at 1 s and odd rows at 0 s. Numpy's default (unstable) sort
# shuffles ties this many; the readers must keep the file's order among them.
TIES = 60
TIE_ARRIVALS = [1 if i % 2 == 0 else 0 for i in range(TIES)]
TIE_ORDER = [i for i in range(TIES) if i % 2] + [i for i in range(TIES) if i % 2 == 0]


# orcasim CSV and the checks every format shares.


def test_an_orcasim_trace_is_sorted_and_counted_from_its_first_arrival(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", f"{ORCASIM_HEADER},note\n3,10,2,a\n1,20,4,b\n")
    arrival_s, prompt, output = read_trace(path)
    assert arrival_s.tolist() == [0.0, 2.0] and prompt.tolist() == [20, 10]
    assert output.tolist() == [4, 2]
    # Whole seconds in the file are still seconds as floats; token counts are integers.
    assert arrival_s.dtype == np.float64 and prompt.dtype == output.dtype == np.int64


def test_requests_that_arrive_together_keep_their_file_order(tmp_path: Path) -> None:
    rows = "".join(f"{a},{i + 1},1\n" for i, a in enumerate(TIE_ARRIVALS))
    _, prompt, _ = read_trace(_write(tmp_path, "t.csv", f"{ORCASIM_HEADER}\n{rows}"))
    assert prompt.tolist() == [i + 1 for i in TIE_ORDER]


def test_an_empty_trace_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"^t\.csv: no requests \(a header alone\); "
                                            r"expected at least one$"):
        read_trace(_write(tmp_path, "t.csv", f"{ORCASIM_HEADER}\n"))


def test_an_unknown_format_is_named_with_the_known_ones(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", f"{ORCASIM_HEADER}\n0,1,1\n")
    with pytest.raises(ScenarioError, match=r"^unknown trace format 'csv'; expected auto, orcasim, "
                                            r"azure, mooncake, vllm or aiperf$"):
        read_trace(path, "csv")


def test_a_file_of_unknown_columns_names_what_each_format_expects(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"^bad\.csv: cannot tell the trace format from columns "
                                            r"\['a', 'b'\]; expected arrival_s, prompt_tokens, "
                                            r"output_tokens \(orcasim\) or TIMESTAMP, ContextTokens, "
                                            r"GeneratedTokens \(azure\); a vLLM benchmark result is "
                                            r"read by its \.json name or --format vllm$"):
        read_trace(_write(tmp_path, "bad.csv", "a,b\n1,2\n"))
    # A vLLM result under another name reads as a CSV of thousands of columns: the message
    # listed every one (120 KB on one line).
    wide = _write(tmp_path, "res.txt", ",".join(f"c{i}" for i in range(3000)) + "\n")
    with pytest.raises(ScenarioError, match=r"columns \['c0', .*'c7'\] and 2992 more; expected"):
        read_trace(wide)


def test_a_format_forced_on_a_file_without_its_columns_names_the_missing_ones(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", f"{ORCASIM_HEADER},ttft_s\n0,1,1,0.1\n")
    message = r"^t\.csv: missing column\(s\) TIMESTAMP, ContextTokens, GeneratedTokens$"
    with pytest.raises(ScenarioError, match=message):
        read_trace(path, "azure")  # the format asked for, not the one the columns suggest
    with pytest.raises(ScenarioError, match=message):
        read_measurements(path, "azure")


def test_an_explicit_format_overrides_the_file_suffix(tmp_path: Path) -> None:
    path = _mooncake(tmp_path, [_record(0, 5, [0]), _record(2000, 6, [1])], name="trace.log")
    arrival_s, prompt, _ = read_trace(path, "mooncake")  # auto would read it as a CSV
    assert arrival_s.tolist() == [0.0, 2.0] and prompt.tolist() == [5, 6]


def test_max_requests_reads_only_the_first_rows_of_each_format(tmp_path: Path) -> None:
    orcasim = _write(tmp_path, "t.csv", f"{ORCASIM_HEADER}\n0,1,1\n1,2,1\n2,3,1\n")
    azure = _write(tmp_path, "a.csv", f"{AZURE_HEADER}\n2024-05-10 00:00:00,1,1\n"
                                      "2024-05-10 00:00:01,2,1\n2024-05-10 00:00:02,3,1\n")
    vllm = _vllm(tmp_path, start_times=[0.0, 1.0, 2.0], input_lens=[1, 2, 3], output_lens=[1, 1, 1],
                 ttfts=[0.1, 0.1, 0.1], itls=[[], [], []])
    for path in (orcasim, azure, vllm):
        assert read_trace(path, max_requests=2)[1].tolist() == [1, 2], path
    # Mooncake stops before the line past the cap: its bad third record is never read.
    mooncake = _write(tmp_path, "m.jsonl", json.dumps(_record(0, 1, [0])) + "\n"
                      + json.dumps(_record(1, 2, [1])) + "\nnot json\n")
    assert read_trace(mooncake, max_requests=2)[1].tolist() == [1, 2]


def test_a_bad_orcasim_value_is_quoted_as_written_with_its_line(tmp_path: Path) -> None:
    # Blank lines count: the bad row is the file's fifth line.
    path = _write(tmp_path, "bad.csv", f"{ORCASIM_HEADER}\n\n0,1,1\n\n-1,1,1\n")
    with pytest.raises(ScenarioError, match=r"^bad\.csv line 5: arrival_s = '-1', "
                                            r"expected a number >= 0$"):
        read_trace(path)
    path = _write(tmp_path, "bad.csv", f"{ORCASIM_HEADER}\n0,1,1\nsoon,1,1\n")
    with pytest.raises(ScenarioError, match=r"^bad\.csv line 3: arrival_s = 'soon', "
                                            r"expected a number >= 0$"):
        read_trace(path)


# Azure: timestamps to seconds; its token columns take orcasim's names.


def test_azure_timestamps_with_and_without_a_fraction_mix_in_one_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", f"{AZURE_HEADER}\n2023-11-16 18:15:46,10,2\n"
                                     "2023-11-16 18:15:46.5,20,3\n")
    arrival_s, prompt, output = read_trace(path)
    assert arrival_s.tolist() == [0.0, 0.5]
    assert prompt.tolist() == [10, 20] and output.tolist() == [2, 3]


def test_azure_timestamps_of_different_utc_offsets_are_compared_as_instants(tmp_path: Path) -> None:
    # 18:15:47+05:00 is 13:15:47 UTC: five hours less one second before the first row.
    path = _write(tmp_path, "a.csv", f"{AZURE_HEADER}\n2023-11-16 18:15:46+00:00,10,2\n"
                                     "2023-11-16 18:15:47+05:00,20,3\n")
    arrival_s, prompt, _ = read_trace(path)
    assert arrival_s.tolist() == [0.0, 5 * 3600 - 1]
    assert prompt.tolist() == [20, 10]


def test_an_azure_timestamp_without_an_offset_among_offsets_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", f"{AZURE_HEADER}\n2023-11-16 18:15:46+00:00,10,2\n"
                                     "2023-11-16 18:15:47+05:00,20,3\n2023-11-16 18:15:48,30,4\n")
    with pytest.raises(ScenarioError, match=r"^a\.csv line 4: TIMESTAMP = '2023-11-16 18:15:48', "
                                            r"expected a UTC offset, as other timestamps of the file "
                                            r"have \(without one, the time is ambiguous\)$"):
        read_trace(path)


@pytest.mark.parametrize("second_row,message", [
    ("yesterday,20,3", r"TIMESTAMP = 'yesterday', expected a timestamp"),
    ("2024-05-10 99:00:01,20,3", r"TIMESTAMP = '2024-05-10 99:00:01', expected a timestamp"),
    # A token count is named by the file's own column, which a user can find in it.
    ("2024-05-10 00:00:01,x,3", rf"ContextTokens = 'x', expected {LENGTH_EXPECTED}"),
])
def test_a_bad_azure_row_names_its_line_and_column(tmp_path: Path, second_row: str, message: str) -> None:
    path = _write(tmp_path, "a.csv", f"{AZURE_HEADER}\n2024-05-10 00:00:00,10,2\n{second_row}\n")
    with pytest.raises(ScenarioError, match=rf"^a\.csv line 3: {message}$"):
        read_trace(path)


# Mooncake: milliseconds, and hash_ids as one content segment per 512-token block.


def test_mooncake_timestamps_are_milliseconds(tmp_path: Path) -> None:
    path = _mooncake(tmp_path, [_record(2750, 5, [0]), _record(1500, 6, [1])])
    arrival_s, prompt, _ = read_trace(path)
    assert arrival_s.tolist() == [0.0, 1.25] and prompt.tolist() == [6, 5]


def test_mooncake_timestamps_in_unix_ms_keep_their_millisecond_gaps(tmp_path: Path) -> None:
    """1.7e12 ms divided by 1000 before the first was taken off was rounded to 2.4e-7 s: a
    1 ms gap read as 0.9999275 ms and a 3 ms one as 3.0000210 ms (a tester's finding)."""
    path = _mooncake(tmp_path, [_record(1_700_000_000_000 + ms, 5, [0]) for ms in (3, 0, 1)])
    assert read_trace(path)[0].tolist() == [0.0, 0.001, 0.003]


@pytest.mark.parametrize("record,message", [
    (_record("soon", 5, [1]), r"timestamp = 'soon', expected a number >= 0"),
    (_record(1, "five", [1]), rf"input_length = 'five', expected {LENGTH_EXPECTED}"),
])
def test_a_bad_mooncake_record_names_its_line(tmp_path: Path, record: dict[str, object],
                                              message: str) -> None:
    path = _mooncake(tmp_path, [_record(0, 5, [0]), record])
    with pytest.raises(ScenarioError, match=rf"^m\.jsonl line 2: {message}$"):
        read_trace(path)


def test_a_mooncake_prompt_is_cut_into_512_token_blocks_with_a_short_last_one(tmp_path: Path) -> None:
    # 1100 = 512 + 512 + 76; 512 is one full block; 1 token is one short block.
    path = _mooncake(tmp_path, [_record(0, 1100, [7, 8, 9]), _record(10, 512, [3]),
                                _record(5, 1, [0])])
    (_, prompt, _), content = read_trace_with_content(path)
    assert content is not None
    assert content.prompts == [(7, 512, 8, 512, 9, 76), (0, 1), (3, 512)]  # in arrival order
    # Outputs are named after the largest block id (9, of the first record): 10, 11, 12 by
    # file row, then put in arrival order like the prompts.
    assert content.output_ids.tolist() == [10, 12, 11]
    content.check(prompt)


def test_a_mooncake_trace_without_hash_ids_gives_lengths_and_says_nothing_of_sharing(tmp_path: Path) -> None:
    """Lengths-only JSON lines (a trace of other origin in Mooncake's fields) read as a trace
    without content, as a CSV does; a trace that names some rows' blocks must name all."""
    plain = [{"timestamp": t, "input_length": n, "output_length": 3} for t, n in ((0, 600), (500, 7))]
    (arrival_s, prompt, output), content = read_trace_with_content(_mooncake(tmp_path, plain))
    assert (arrival_s.tolist(), prompt.tolist(), output.tolist(), content) == ([0.0, 0.5], [600, 7], [3, 3], None)
    mixed = _mooncake(tmp_path, [_record(0, 5, [0]), plain[1]], name="mixed.jsonl")
    with pytest.raises(ScenarioError, match=r"^mixed\.jsonl line 2: hash_ids = None, expected 1 integer"):
        read_trace(mixed)


def test_a_truncated_json_file_is_named_as_neither_format(tmp_path: Path) -> None:
    path = _write(tmp_path, "bench.json", '{"backend": "vllm", "input_lens": [10, 20')
    with pytest.raises(ScenarioError, match=r"^bench\.json line 1: bad Mooncake record \(.*\); nor is the "
                                            r"file one JSON document with input_lens \(a vLLM benchmark result\)$"):
        read_trace(path)


def test_output_ids_follow_the_largest_block_id_even_when_it_is_zero(tmp_path: Path) -> None:
    path = _mooncake(tmp_path, [_record(0, 5, [0]), _record(1, 7, [0])])
    _, content = read_trace_with_content(path)
    assert content is not None and content.output_ids.tolist() == [1, 2]


def test_only_a_mooncake_trace_says_what_its_prompts_share(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", f"{ORCASIM_HEADER}\n0,1,1\n")
    assert read_trace_with_content(path)[1] is None


def test_mooncake_content_keeps_the_file_order_among_simultaneous_arrivals(tmp_path: Path) -> None:
    path = _mooncake(tmp_path, [_record(1000 * a, i + 1, [i]) for i, a in enumerate(TIE_ARRIVALS)])
    (_, prompt, _), content = read_trace_with_content(path)
    assert content is not None
    assert content.prompts == [(i, i + 1) for i in TIE_ORDER]
    assert content.output_ids.tolist() == [TIES + i for i in TIE_ORDER]  # largest id is 59
    content.check(prompt)  # the content lines up with the trace's own order


@pytest.mark.parametrize(("ids", "tokens", "shown", "blocks"), [
    ([1, 2], 5, r"\[1, 2\]", 1),    # one too many
    ([4], 600, r"\[4\]", 2),        # one too few: 600 tokens are two blocks
    (None, 600, "None", 2),         # no hash_ids at all
    ([-1], 5, r"\[-1\]", 1),
    ([True], 5, r"\[True\]", 1),    # a JSON boolean is no id
    ([1.5], 5, r"\[1\.5\]", 1),
    ([2**64 - 1], 5, rf"\[{2**64 - 1}\]", 1),  # beyond int64: numpy's OverflowError before
    ([2**63 - 1], 5, rf"\[{2**63 - 1}\]", 1),  # the outputs' ids after it wrapped below 0
])
def test_hash_ids_must_be_one_integer_id_below_2_60_per_block(
        tmp_path: Path, ids: object, tokens: int, shown: str, blocks: int) -> None:
    path = _mooncake(tmp_path, [_record(0, 5, [0]), _record(1, tokens, ids)])
    with pytest.raises(ScenarioError, match=rf"^m\.jsonl line 2: hash_ids = {shown}, expected "
                                            rf"{blocks} integer id\(s\) from 0 to below 2\*\*60, one "
                                            rf"per 512 tokens of input_length = {tokens}$"):
        read_trace_with_content(path)


def test_a_long_hash_ids_list_is_cut_to_60_characters_in_the_error(tmp_path: Path) -> None:
    path = _mooncake(tmp_path, [_record(0, 5, list(range(30)))])
    shown = r"\[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 1"  # 60 characters
    with pytest.raises(ScenarioError, match=rf"^m\.jsonl line 1: hash_ids = {shown}, expected 1 "):
        read_trace(path)


def test_a_one_record_json_file_is_mooncake_unless_it_holds_input_lens(tmp_path: Path) -> None:
    path = _mooncake(tmp_path, [_record(0, 5, [0])], name="one.json")
    assert read_trace(path)[1].tolist() == [5]
    # Any other JSON is a Mooncake record too, and a bad one is named by its line.
    path = _write(tmp_path, "five.json", "5\n")
    with pytest.raises(ScenarioError, match=r"^five\.json line 1: bad Mooncake record "
                                            r"\(not a JSON object\); nor is the file one "
                                            r"JSON document with input_lens"):
        read_trace(path)


# vLLM benchmark results: parallel lists; failed requests dropped.


def test_a_vllm_result_drops_failed_and_empty_requests_but_keeps_one_token_ones(tmp_path: Path) -> None:
    path = _vllm(tmp_path, start_times=[100.0, 99.0, 98.0, 101.5], input_lens=[5, 6, 7, 8],
                 output_lens=[3, 2, 0, 1], ttfts=[0.1] * 4, itls=[[0.1, 0.1], [0.1], [], []],
                 errors=["", "timeout", "", ""])
    # Said: the replay leaves the failed requests' load out (it was silent).
    with pytest.warns(UserWarning, match=r"^r\.json: 2 of 4 requests failed \(an error or no "
                                         r"output\) and are dropped"):
        arrival_s, prompt, output = read_trace(path)
    # Kept: request 0 and request 3 (one token). Dropped: an error, and no output.
    assert arrival_s.tolist() == [0.0, 1.5]
    assert prompt.tolist() == [5, 8] and output.tolist() == [3, 1]


def test_a_vllm_results_bad_latency_is_named_by_the_fields_it_has(tmp_path: Path) -> None:
    # The latencies are made from ttfts and itls: errors named ttft_s, tpot_s and e2e_s,
    # which a vLLM result does not have.
    fields = dict(start_times=[0.0, 1.0], input_lens=[5, 6], output_lens=[3, 1])
    cases = [
        (dict(ttfts=[1e6, 0.1], itls=[[0.1, 0.1], []]),
         r"^r\.json request 0: ttfts = 1000000\.0, expected seconds, at most 86,400"),
        (dict(ttfts=[0.1, 0.1], itls=[[2e5, 0.0], []]),
         r"^r\.json request 0: sum\(itls\) / \(output_lens - 1\) = 100000\.0, expected seconds"),
        (dict(ttfts=[0.1, 0.25], itls=[[0.1, 0.1], [0.5]]),
         r"^r\.json request 1: ttfts \+ sum\(itls\) = 0\.75, expected about the request's "
         r"ttfts = 0\.25 for output_lens = 1"),
        (dict(ttfts=[0.1, 0.1], itls=[[50.0, 50.0], []]),
         r"^r\.json: sum\(itls\) / \(output_lens - 1\)'s median = 50 s a token"),
    ]
    for latencies, message in cases:
        with pytest.raises(ScenarioError, match=message):
            read_measurements(_vllm(tmp_path, **fields, **latencies))


def test_a_vllm_result_without_an_errors_list_keeps_every_request(tmp_path: Path) -> None:
    path = _vllm(tmp_path, start_times=[5.0, 6.0], input_lens=[5, 6], output_lens=[2, 3],
                 ttfts=[0.1, 0.1], itls=[[0.1], [0.1, 0.1]])
    assert read_trace(path)[1].tolist() == [5, 6]


def test_a_vllm_result_in_which_every_request_failed_says_so(tmp_path: Path) -> None:
    """As AIPerf's: read for its latencies (calibrate logs, fidelity) it warned that the
    others were sent alone, then named ttft_s, tpot_s and e2e_s, which it has none of."""
    path = _vllm(tmp_path, start_times=[5.0, 6.0], input_lens=[5, 6], output_lens=[2, 3],
                 ttfts=[0.1, 0.1], itls=[[0.1], [0.1, 0.1]], errors=["timeout", "reset"])
    for read in (read_trace, read_measurements):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning of the others: there are none
            with pytest.raises(ScenarioError, match=r"^r\.json: all 2 requests failed \(an "
                               r"error or no output\); expected at least one that finished$"):
                read(path)


def test_a_vllm_result_lacking_fields_names_them_all(tmp_path: Path) -> None:
    path = _vllm(tmp_path, name="old.json", input_lens=[5], output_lens=[3], ttfts=[0.1])
    with pytest.raises(ScenarioError, match=r"^old\.json: a vLLM benchmark result lacks start_times, "
                                            r"itls; save it with --save-result --save-detailed "
                                            r"\(vLLM 0\.15 or newer records start_times\)$"):
        read_trace(path)


def test_a_cap_on_a_log_in_finishing_order_keeps_the_first_to_arrive(tmp_path: Path) -> None:
    """A log written as requests finished: its first lines are the quickest requests, not
    the first to arrive (max_requests took them, a tester's note). Arrivals 5, 0, 3, 1, 2,
    4 (prompt 10 + arrival): a cap of 3 replays those at 0, 1 and 2."""
    path = tmp_path / "finished.csv"
    arrivals = [5, 0, 3, 1, 2, 4]
    path.write_text("arrival_s,prompt_tokens,output_tokens\n"
                    + "".join(f"{a}.0,{10 + a},3\n" for a in arrivals))
    arrival_s, prompt, output = read_trace(str(path), max_requests=3)
    assert arrival_s.tolist() == [0.0, 1.0, 2.0] and prompt.tolist() == [10, 11, 12]
    assert read_trace(str(path), max_requests=6)[1].tolist() == [10, 11, 12, 13, 14, 15]


def test_a_capped_log_in_finishing_order_names_a_bad_rows_own_line(tmp_path: Path) -> None:
    """A cap on a log not in arrival order keeps the first to arrive, in the file's order;
    an error in one of them names its line in the file, not its place among those kept
    (arrivals 5, 3, 1, 4 capped at 3 keep lines 3, 4 and 5: the bad prompt on line 5 was
    named as line 4, and a request too long for max_tokens on line 4 as line 3)."""
    from orcasim.workload.traces import where_in_trace

    path = tmp_path / "finished.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n5,10,5\n3,10,5\n1,10,5\n4,abc,5\n")
    with pytest.raises(ScenarioError, match=r"^finished\.csv line 5: prompt_tokens = 'abc'"):
        read_trace(str(path), max_requests=3)
    path.write_text("arrival_s,prompt_tokens,output_tokens\n5,10,5\n3,10,5\n4,10,500\n1,10,5\n")
    # Kept: 1 (line 5), 3 (line 3), 4 (line 4); request 2 by arrival is the one at 4.
    assert where_in_trace(str(path), "auto", 3, 2) == "finished.csv line 4"
    assert where_in_trace(str(path), "auto", 3, 0) == "finished.csv line 5"


def test_a_csv_read_as_a_vllm_result_names_the_formats(tmp_path: Path) -> None:
    """`format: vllm` on an orcasim CSV said only 'not valid JSON' (a tester's note)."""
    path = tmp_path / "run.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,5,3\n")
    with pytest.raises(ScenarioError, match=r"run\.csv: not valid JSON .*; format vllm reads a "
                                            r"vLLM benchmark result's JSON \(a CSV is format "
                                            r"orcasim or azure, or auto\)$"):
        read_trace(str(path), "vllm")


def test_vllm_lists_of_different_lengths_are_an_error(tmp_path: Path) -> None:
    path = _vllm(tmp_path, start_times=[0.0, 1.0], input_lens=[5], output_lens=[3], ttfts=[0.1],
                 itls=[[0.1, 0.1]])
    with pytest.raises(ScenarioError, match=r"^r\.json: the per-request lists start_times, "
                                            r"input_lens, output_lens, ttfts, itls differ in length$"):
        read_trace(path)


VLLM_GOOD = {"start_times": [0.0, 1.0], "input_lens": [5, 5], "output_lens": [2, 3],
             "ttfts": [0.1, 0.1], "itls": [[0.1], [0.1, 0.1]]}


@pytest.mark.parametrize(("change", "message"), [
    ({"errors": [""]}, r"r\.json: errors has 1 entries, expected one per request \(2, as input_lens\)"),
    ({"output_lens": ["x", 3]}, r"r\.json request 0: output_lens = 'x', expected a token count >= 0"),
    ({"output_lens": [2, True]}, r"r\.json request 1: output_lens = True, expected a token count"),
    # vLLM writes 0 for a failed request (dropped); a negative count was dropped as one too.
    ({"output_lens": [2, -5]}, r"r\.json request 1: output_lens = -5, expected a token count >= 0$"),
    ({"itls": [None, [0.1, 0.1]]}, r"r\.json request 0: itls = None, expected a list of numbers "
                                   r">= 0 \(seconds between output tokens\)"),
    ({"itls": [[0.1], [0.1, -0.1]]}, r"r\.json request 1: itls = \[0\.1, -0\.1\], expected a list "
                                     r"of numbers >= 0"),
    ({"ttfts": [-1.0, 0.1]}, r"r\.json request 0: ttfts = -1\.0, expected a number of seconds >= 0"),
    ({"itls": [[0.1], [0.1, "a"]]}, r"r\.json request 1: itls = \[0\.1, 'a'\], expected a list"),
    ({"input_lens": 5}, r"r\.json: input_lens = 5, expected a list with one entry per request"),
    ({"ttfts": [0.1, None]}, r"r\.json request 1: ttfts = None, expected a number"),
])
def test_a_malformed_vllm_result_is_one_line_naming_the_field(
    tmp_path: Path, change: dict[str, object], message: str,
) -> None:
    path = _vllm(tmp_path, **{**VLLM_GOOD, **change})
    for read in (read_trace, read_measurements):
        with pytest.raises(ScenarioError, match=f"^{message}") as caught:
            read(path)
        assert "\n" not in str(caught.value)


def test_a_vllm_result_that_is_not_an_object_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "r.json", "[1, 2]")
    with pytest.raises(ScenarioError, match=r"^r\.json: a JSON list; expected an object with the "
                                            r"lists start_times, .*\(a vLLM benchmark result\)$"):
        read_trace(path, "vllm")


def test_vllm_measurements_are_ttft_plus_the_gaps_and_their_mean(tmp_path: Path) -> None:
    # Binary fractions, so every sum is exact: E2E = TTFT + sum(itls), TPOT = mean(itls).
    path = _vllm(tmp_path, start_times=[10.0, 10.5, 11.0], input_lens=[5, 6, 7],
                 output_lens=[3, 1, 2], ttfts=[0.25, 0.5, 0.125], itls=[[0.5, 0.25], [], [0.75]])
    measured = read_measurements(path)
    assert measured.columns.tolist() == ["ttft_s", "tpot_s", "e2e_s"]
    assert measured["ttft_s"].tolist() == [0.25, 0.5, 0.125]
    assert measured["e2e_s"].tolist() == [1.0, 0.5, 0.875]  # 0.25 + 0.5 + 0.25
    tpot = measured["tpot_s"].tolist()
    assert tpot[0] == 0.375 and np.isnan(tpot[1]) and tpot[2] == 0.75  # one token: no gap


# read_measurements on orcasim logs.


def test_a_missing_tpot_is_derived_from_ttft_and_e2e_over_the_gaps(tmp_path: Path) -> None:
    path = _write(tmp_path, "run.csv", f"{ORCASIM_HEADER},ttft_s,e2e_s\n0,10,2,0.25,0.75\n"
                                       "1,10,5,0.5,1.5\n2,10,1,0.125,0.125\n")
    measured = read_measurements(path)
    assert measured.columns.tolist() == ["ttft_s", "tpot_s", "e2e_s"]
    assert (measured.dtypes == np.float64).all()
    tpot = measured["tpot_s"].tolist()
    # Two tokens: one gap of 0.5; five tokens: four gaps of 0.25; one token: none.
    assert tpot[0] == 0.5 and tpot[1] == 0.25 and np.isnan(tpot[2])


def test_a_tpot_in_other_units_than_ttft_and_e2e_is_refused(tmp_path: Path) -> None:
    """TPOT in ms beside TTFT and E2E in s was scored as is (-99.9%; a tester's finding). A
    row within a factor of 10 of its gap is no unit's error (the percentiles are checked
    next)."""
    from orcasim.workload.traces import TPOT_UNITS_FACTOR

    header = f"{ORCASIM_HEADER},ttft_s,tpot_s,e2e_s\n"
    rows = "".join(f"{i},10,5,0.5,{0.9 if i == 11 else 0.25},1.5\n" for i in range(12))
    ok = _write(tmp_path, "ok.csv", header + rows)  # one row 3.6 times its gap of 0.25
    assert read_measurements(ok)["tpot_s"].tolist() == [0.25] * 11 + [0.9]  # as given
    ms = _write(tmp_path, "ms.csv", header + "0,10,5,0.5,0.25,1.5\n1,10,5,0.5,250,1.5\n")
    with pytest.raises(ScenarioError, match=r"^ms.csv line 3: tpot_s = 250.0, expected about "
                                            r"\(e2e_s - ttft_s\) / \(output_tokens - 1\) = 0.25 s"):
        read_measurements(ms)
    assert TPOT_UNITS_FACTOR == 10.0


def test_a_request_ending_before_its_first_token_names_both_times(tmp_path: Path) -> None:
    """TTFT in ms beside E2E in s was refused as `e2e_s = 1.5, expected a number >= the
    request's ttft_s`, without the ttft_s that is wrong (a tester's finding): both are said."""
    header = f"{ORCASIM_HEADER},ttft_s,e2e_s\n"
    ms = _write(tmp_path, "ms.csv", header + "0,10,5,0.5,1.5\n1,10,5,500,1.5\n")
    with pytest.raises(ScenarioError, match=r"^ms.csv line 3: e2e_s = 1.5, expected a number >= "
                                            r"the request's ttft_s = 500 \(a request cannot end "
                                            r"before its first token\)$"):
        read_measurements(ms)


@pytest.mark.parametrize("fmt", ["orcasim", "azure"])
def test_a_json_file_given_a_csv_format_is_named_as_json(tmp_path: Path, fmt: str) -> None:
    """A vLLM result given --format orcasim was read as a CSV and refused as "column ' 13' is
    named twice (columns 54 and 65)" (a tester's finding): the file is named as JSON."""
    result = _write(tmp_path, "result.json", json.dumps({"input_lens": [13, 13], "ttfts": [0.1, 0.2]}))
    with pytest.raises(ScenarioError, match=rf"^result\.json: a JSON file, where format {fmt} "
                                            r"reads a CSV; expected format vllm \(a vLLM "):
        read_trace(result, fmt)


def test_a_tpot_of_another_definition_than_the_gaps_is_refused(tmp_path: Path) -> None:
    """TPOT written as e2e_s / output_tokens (the first token's wait spread over all of them)
    was compared with the simulation's mean gap after the first token as one metric: on
    vllm-100-1 the TPOT p90 error read -12.6% where it is +8.6% (a tester's finding). Within
    3% + 0.5 ms of the gaps' percentiles a log passes: rounding to the ms, a client's jitter."""
    header = f"{ORCASIM_HEADER},ttft_s,tpot_s,e2e_s\n"
    # Four gaps of 0.25 s after a first token at 1 s: e2e 2 s; e2e / 5 tokens = 0.4 s.
    other = _write(tmp_path, "other.csv", header + "0,10,5,1,0.4,2\n1,10,5,1,0.4,2\n")
    with pytest.raises(ScenarioError, match=r"^other\.csv: tpot_s's p50 = 0\.4 s, expected about "
                                            r"the p50 of \(e2e_s - ttft_s\) / \(output_tokens - 1\), "
                                            r"0\.25 s, over the same 2 requests \(TPOT: the mean "
                                            r"gap between output tokens after the first"):
        read_measurements(other)
    rounded = _write(tmp_path, "rounded.csv", header + "0,10,5,1,0.257,2\n1,10,5,1,0.257,2\n")
    assert read_measurements(rounded)["tpot_s"].tolist() == [0.257, 0.257]  # 2.8%: as given


def test_a_one_token_request_has_no_tpot_even_when_the_log_gives_one(tmp_path: Path) -> None:
    path = _write(tmp_path, "run.csv", f"{ORCASIM_HEADER},tpot_s,e2e_s\n0,10,3,1,3\n1,10,1,0,1\n")
    measured = read_measurements(path)
    assert measured.columns.tolist() == ["ttft_s", "tpot_s", "e2e_s"]
    assert (measured.dtypes == np.float64).all()  # whole seconds in the file are still floats
    assert measured["tpot_s"].tolist()[0] == 1.0 and np.isnan(measured["tpot_s"].tolist()[1])
    assert measured["e2e_s"].tolist() == [3.0, 1.0]
    assert measured["ttft_s"].isna().all()  # not in the log


def test_a_zero_latency_is_measured_and_an_empty_one_is_not(tmp_path: Path) -> None:
    path = _write(tmp_path, "run.csv", f"{ORCASIM_HEADER},ttft_s\n0,10,3,0\n1,10,3,\n")
    ttft = read_measurements(path)["ttft_s"].tolist()
    assert ttft[0] == 0.0 and np.isnan(ttft[1])
    bad = _write(tmp_path, "bad.csv", f"{ORCASIM_HEADER},ttft_s\n0,10,3,0\n1,10,3,x\n")
    with pytest.raises(ScenarioError, match=r"^bad\.csv line 3: ttft_s = 'x', "
                                            r"expected a number of seconds >= 0 or empty$"):
        read_measurements(bad)


def test_measurements_keep_the_trace_order_among_simultaneous_arrivals(tmp_path: Path) -> None:
    rows = "".join(f"{a},10,2,{i}\n" for i, a in enumerate(TIE_ARRIVALS))
    measured = read_measurements(_write(tmp_path, "run.csv", f"{ORCASIM_HEADER},ttft_s\n{rows}"))
    assert measured["ttft_s"].tolist() == [float(i) for i in TIE_ORDER]


def test_a_bad_output_count_in_a_log_names_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "run.csv", f"{ORCASIM_HEADER},ttft_s\n0,10,3,0.1\n1,10,x,0.1\n")
    with pytest.raises(ScenarioError, match=rf"^run\.csv line 3: output_tokens = 'x', "
                                            rf"expected {LENGTH_EXPECTED}$"):
        read_measurements(path)


def test_a_log_without_measured_columns_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "run.csv", f"{ORCASIM_HEADER}\n0,10,3\n")
    with pytest.raises(ScenarioError, match=r"^run\.csv: no measured column; expected any of "
                                            r"ttft_s, tpot_s, e2e_s$"):
        read_measurements(path)


@pytest.mark.parametrize("header", ["ttft_ms", "e2e_s,TTFT_ms", "tpot_us,e2e_s"])
def test_a_latency_in_other_units_is_named_not_skipped(tmp_path: Path, header: str) -> None:
    """A column `ttft_ms` beside `e2e_s` was not read, and TTFT went uncompared without a
    word (a tester's finding); alone, the log read as having no measured column."""
    cells = ",".join("0.1" for _ in header.split(","))
    path = _write(tmp_path, "run.csv", f"{ORCASIM_HEADER},{header}\n0,10,3,{cells}\n")
    other = next(c for c in header.split(",") if not c.endswith("_s"))
    stem, unit = other.lower().rsplit("_", 1)
    with pytest.raises(ScenarioError, match=rf"^run\.csv: column '{other}' is not read: expected "
                                            rf"{stem}_s, in seconds \(its {unit} / "):
        read_measurements(path)
    both = _write(tmp_path, "both.csv", f"{ORCASIM_HEADER},{stem}_s,{other}\n0,10,3,0.1,100\n")
    assert read_measurements(both)[f"{stem}_s"].tolist() == [0.1]  # the seconds are read


@pytest.mark.parametrize(("column", "unit"), [("ttft_sec", "sec"), ("E2E_seconds", "seconds"),
                                             ("ttft_msec", "msec"), ("tpot_usec", "usec")])
def test_a_latency_under_a_longer_unit_name_is_named_not_skipped(
        tmp_path: Path, column: str, unit: str) -> None:
    """`ttft_sec` or `ttft_msec` beside `e2e_s` went uncompared without a word: only `_ms`,
    `_us` and `_ns` were caught (a left-alone note of the last session)."""
    stem = column.lower().rsplit("_", 1)[0]
    other = "ttft_s" if stem == "e2e" else "e2e_s"
    path = _write(tmp_path, "run.csv", f"{ORCASIM_HEADER},{column},{other}\n0,10,3,0.1,0.2\n")
    with pytest.raises(ScenarioError, match=rf"^run\.csv: column '{column}' is not read: expected "
                                            rf"{stem}_s, in seconds \(its (only the name differs|{unit} / )"):
        read_measurements(path)


@pytest.mark.parametrize(("column", "expected"), [
    ("e2el_ms", "expected e2e_s, in seconds (e2el is e2e_s by another name; its ms / 1,000)"),
    ("request_latency", "expected e2e_s, in seconds (request_latency is e2e_s by another name; "
                        "its unit not said)"),
    ("Latency_s", "expected e2e_s, in seconds (latency is e2e_s by another name; its only the "
                  "name differs)"),
    ("TTFT_s", "expected ttft_s, in seconds (its only the name differs)")])
def test_a_latency_under_another_benchmarks_name_is_named_not_skipped(
        tmp_path: Path, column: str, expected: str) -> None:
    """vLLM's `e2el` and AIPerf's `request_latency` beside `ttft_s` went unread: TTFT alone
    was compared, and E2E and the TPOT derived from it went uncompared without a word."""
    other = "e2e_s" if column.lower().startswith("ttft") else "ttft_s"
    path = _write(tmp_path, "run.csv", f"{ORCASIM_HEADER},{other},{column}\n0,10,3,0.1,300\n")
    with pytest.raises(ScenarioError) as caught:
        read_measurements(path)
    assert str(caught.value) == f"run.csv: column '{column}' is not read: {expected}"
    # Beside orcasim's own column it is another column, as a `ttft_ms` beside `ttft_s` is.
    both = _write(tmp_path, "both.csv", f"{ORCASIM_HEADER},ttft_s,e2e_s,{column}\n0,10,3,0.1,0.3,7\n")
    assert read_measurements(both)["e2e_s"].tolist() == [0.3]


def test_a_tpot_in_other_units_beside_ttft_and_e2e_is_derived_not_refused(tmp_path: Path) -> None:
    """`tpot_ms` beside `ttft_s` and `e2e_s` goes uncompared by nobody: TPOT is derived from
    those (as before the refusal of other units, which refused this log)."""
    path = _write(tmp_path, "run.csv", f"{ORCASIM_HEADER},ttft_s,e2e_s,tpot_ms\n0,10,3,0.1,0.5,200\n")
    assert read_measurements(path)["tpot_s"].tolist() == pytest.approx([0.2])


def test_a_trace_format_without_latencies_has_no_measurements(tmp_path: Path) -> None:
    azure = _write(tmp_path, "a.csv", f"{AZURE_HEADER}\n2024-05-10 00:00:00,10,2\n")
    mooncake = _mooncake(tmp_path, [_record(0, 5, [0])])
    for path, name, fmt in ((azure, r"a\.csv", "azure"), (mooncake, r"m\.jsonl", "mooncake")):
        with pytest.raises(ScenarioError, match=rf"^{name}: format '{fmt}' holds no measured "
                                                r"latencies; expected an orcasim CSV with ttft_s, "
                                                r"tpot_s or e2e_s, a vLLM benchmark result or "
                                                r"an AIPerf profile_export.jsonl$"):
            read_measurements(path)


def test_a_mooncake_trace_saved_as_json_lines_under_a_json_name_reads(tmp_path: Path) -> None:
    # Two records: not one JSON document, so not a vLLM result; Mooncake's JSON lines.
    path = _mooncake(tmp_path, [_record(0, 5, [0]), _record(1000, 600, [0, 1])], name="two.json")
    arrival_s, prompt, _ = read_trace(path)
    assert arrival_s.tolist() == [0.0, 1.0] and prompt.tolist() == [5, 600]


def test_a_bad_vllm_length_is_named_by_its_request_in_the_result(tmp_path: Path) -> None:
    # Request 1 failed and is dropped; request 3's prompt length is 0: the error names its
    # position in the result's lists, and the value as JSON has it.
    path = _vllm(tmp_path, start_times=[1.0, 2.0, 3.0, 4.0], input_lens=[5, 6, 7, 0],
                 output_lens=[2, 2, 2, 2], ttfts=[0.1] * 4, itls=[[0.1]] * 4,
                 errors=["", "timeout", "", ""])
    with pytest.raises(ScenarioError, match=r"^r\.json request 3: input_lens = 0, expected "
                                            + LENGTH_EXPECTED + "$"):
        read_trace(path)


# Files as users bring them: compressed, with a byte-order mark, joined by cat (a tester's
# reading of the real formats).


def test_a_compressed_trace_with_a_bad_row_names_its_line(tmp_path: Path) -> None:
    import gzip
    import zipfile
    text = f"{AZURE_HEADER}\n2023-11-16 18:17:03.9799600,4808,10\n\n2023-11-16 18:17:04.0319600,-5,8\n"
    gz = tmp_path / "a.csv.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    with zipfile.ZipFile(tmp_path / "a.csv.zip", "w") as archive:
        archive.writestr("a.csv", text)
    for path in (gz, tmp_path / "a.csv.zip"):
        # Line 4: the blank line is counted, as in the uncompressed file.
        with pytest.raises(ScenarioError, match=rf"^{path.name} line 4: ContextTokens = '-5'"):
            read_trace(str(path))
    good = tmp_path / "m.jsonl.gz"
    good.write_bytes(gzip.compress((json.dumps(_record(1500, 6, [1])) + "\n").encode()))
    assert read_trace(str(good))[1].tolist() == [6]  # a .jsonl.gz is Mooncake's


@pytest.mark.parametrize("name", ["a.csv.gz", "a.csv.bz2", "a.csv.xz", "a.csv.zip", "m.jsonl.bz2",
                                  "r.json.gz"])
def test_a_damaged_archive_is_one_line(tmp_path: Path, name: str) -> None:
    # Named as compressed, not compressed. bz2's error is a plain OSError, which read as a
    # machine's failure (exit 1, no file named; a reviewer's find).
    path = _write(tmp_path, name, f"{AZURE_HEADER}\n")
    suffix = Path(name).suffix
    with pytest.raises(ScenarioError, match=rf"{name.replace('.', '[.]')}: not a readable "
                                            rf"[.]{suffix[1:]} file"):
        read_trace(path)


def test_a_byte_order_mark_is_read_past_in_json_and_json_lines(tmp_path: Path) -> None:
    mark = "\ufeff"
    path = _write(tmp_path, "m.jsonl", mark + json.dumps(_record(0, 5, [0])) + "\n")
    assert read_trace(path)[1].tolist() == [5]
    path = _vllm(tmp_path, start_times=[1.0], input_lens=[7], output_lens=[2], ttfts=[0.1],
                 itls=[[0.1]])
    Path(path).write_text(mark + Path(path).read_text())
    assert read_trace(path)[1].tolist() == [7]


def test_blank_lines_in_json_lines_are_skipped_and_lines_still_named(tmp_path: Path) -> None:
    good, bad = json.dumps(_record(0, 5, [0])), json.dumps(_record(10, 0, []))
    path = _write(tmp_path, "m.jsonl", f"{good}\n\n{good}\n\n")
    assert read_trace(path)[1].tolist() == [5, 5]
    path = _write(tmp_path, "n.jsonl", f"{good}\n\n{bad}\n")
    with pytest.raises(ScenarioError, match=r"^n\.jsonl line 3: input_length = 0"):
        read_trace(path)
    path = _write(tmp_path, "j.jsonl", f"{good}\n\n{{oops\n")
    with pytest.raises(ScenarioError, match=r"^j\.jsonl line 3: bad Mooncake record \(not JSON: "
                                            r"Expecting property name enclosed in double quotes "
                                            r"at column 2\)$"):
        read_trace(path)


def test_a_json_boolean_is_not_a_length(tmp_path: Path) -> None:
    path = _mooncake(tmp_path, [_record(0, 5, [0], output=True)])
    with pytest.raises(ScenarioError, match=r"^m\.jsonl line 1: output_length = true, expected a number$"):
        read_trace(path)


def test_a_vllm_result_without_its_lists_is_told_how_to_save_them(tmp_path: Path) -> None:
    # vLLM's default: --save-result without --save-detailed keeps the summary alone.
    path = _vllm(tmp_path, completed=10, mean_ttft_ms=52.1, request_throughput=2.0)
    with pytest.raises(ScenarioError, match=r"lacks start_times, input_lens, .*--save-detailed"):
        read_trace(path)
    # --append-result: one result per line; named as such, not as a bad Mooncake record.
    path = _write(tmp_path, "two.jsonl", json.dumps({"completed": 1}) + "\n")
    with pytest.raises(ScenarioError, match=r"two\.jsonl line 1: a vLLM benchmark result, not a "
                                            r"Mooncake record; expected format: vllm .* one result a "
                                            r"file \(--append-result writes several to one\)$"):
        read_trace(path)
    # One result forced as Mooncake: neither 'one of several' nor 'nor is the file one JSON
    # document with input_lens', both of which it is not (a tester's finding).
    one = _vllm(tmp_path, "one.json", input_lens=[5], output_lens=[2], start_times=[0.0],
                completed=1)
    with pytest.raises(ScenarioError, match=r"^one\.json line 1: a vLLM benchmark result, not a "
                                            r"Mooncake record; expected format: vllm"):
        read_trace(one, "mooncake")


def test_an_azure_time_without_a_date_is_refused(tmp_path: Path) -> None:
    # A spreadsheet shows (and may save) 18:17:03.98 as 17:03.9: pandas would read it as
    # today at 17:03:54, 6 s between rows 0.1 s apart.
    path = _write(tmp_path, "a.csv", f"{AZURE_HEADER}\n17:03.9,10,2\n17:04.0,10,2\n")
    with pytest.raises(ScenarioError, match=r"^a\.csv line 2: TIMESTAMP = '17:03\.9', expected a "
                                            r"date and time"):
        read_trace(path)
    # A time alone in other forms: a trace from 11:59:59 PM to 12:00:01 AM was read as today,
    # its two rows reordered 86,398 s apart.
    for alone in ("11:59:59 PM", "11:59:59 p.m.", "T18:17:03", "18:17:03Z", "18:17:03+01:00",
                  "18:17:03-05", "18:17:03 UTC", "18:17:03.5 GMT", "18:17:03z"):
        bare = _write(tmp_path, "b.csv", f"{AZURE_HEADER}\n{alone},10,2\n")
        with pytest.raises(ScenarioError, match=rf"^b\.csv line 2: TIMESTAMP = '{re.escape(alone)}'"):
            read_trace(bare)
    # Every form with a date is read as before (a reviewer's list of those a first check refused).
    for first, second in [("16.11.2023 18:17:03", "16.11.2023 18:17:05"),
                          ("20231116 18:17:03", "20231116 18:17:05"),
                          ("Nov 16 2023 18:17:03", "Nov 16 2023 18:17:05"),
                          ("2023-11-16T18:17:03Z", "2023-11-16T18:17:05Z")]:
        dated = _write(tmp_path, "d.csv", f"{AZURE_HEADER}\n{first},10,2\n{second},10,2\n")
        assert read_trace(dated)[0].tolist() == [0.0, 2.0], first
    path = _write(tmp_path, "b.csv", f"{AZURE_HEADER}\n2023-11-16 18:17:03,10,2\n,10,2\n")
    with pytest.raises(ScenarioError, match=r"^b\.csv line 3: TIMESTAMP is empty, expected a timestamp$"):
        read_trace(path)


def test_a_trace_read_again_is_the_file_as_it_is_now_and_the_callers_own(tmp_path: Path) -> None:
    # A calibration reads one trace hundreds of times: it is read once while the file stays
    # the same; a changed file is read again, and what a caller changes is its own copy.
    import os
    path = _write(tmp_path, "t.csv", f"{ORCASIM_HEADER}\n0,10,3\n1,20,4\n")
    arrival_s, prompt, _ = read_trace(path)
    prompt[0] = 999
    assert read_trace(path)[1].tolist() == [10, 20]
    Path(path).write_text(f"{ORCASIM_HEADER}\n0,11,3\n1,20,4\n")  # the same size
    os.utime(path, ns=(10**18, 10**18))
    assert read_trace(path)[1].tolist() == [11, 20]
    Path(path).write_text(f"{ORCASIM_HEADER}\n0,-1,3\n")
    for _ in range(2):  # an error is not kept: each read fails as the file says
        with pytest.raises(ScenarioError, match="line 2: prompt_tokens = '-1'"):
            read_trace(path)


def test_a_vllm_result_of_a_capped_concurrency_says_its_times_were_a_closed_loops(tmp_path: Path) -> None:
    # vLLM stamps start_times inside its --max-concurrency semaphore (a helper read serve.py).
    fields = dict(start_times=[1.0, 2.0], input_lens=[5, 6], output_lens=[2, 2], ttfts=[0.1] * 2,
                  itls=[[0.1]] * 2)
    capped = _vllm(tmp_path, max_concurrency=4, **fields)
    for _ in range(2):  # a second reader, served from read_once's memo, is told too
        with pytest.warns(UserWarning, match=r"r\.json: run with --max-concurrency 4, so its send times"):
            read_trace(capped)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_trace(_vllm(tmp_path, "s.json", max_concurrency=None, **fields))  # vLLM's default


def test_a_year_last_date_order_is_decided_for_the_whole_column(tmp_path: Path) -> None:
    # 12 May 23:59:59 then 13 May 00:00:01, day first (a European spreadsheet's save). Read
    # cell by cell, 12/05 was 5 December and 13/05 13 May: swapped, 17,884,798 s apart.
    day_first = _write(tmp_path, "d.csv", f"{AZURE_HEADER}\n12/05/2024 23:59:59,10,5\n"
                                          "13/05/2024 00:00:01,20,6\n")
    month_first = _write(tmp_path, "m.csv", f"{AZURE_HEADER}\n05/12/2024 23:59:59,10,5\n"
                                            "05/13/2024 00:00:01,20,6\n")
    for path in (day_first, month_first):
        arrival_s, prompt, _ = read_trace(path)
        assert arrival_s.tolist() == [0.0, 2.0] and prompt.tolist() == [10, 20]
    one_day = _write(tmp_path, "o.csv", f"{AZURE_HEADER}\n01/02/2024 10:00:00,10,5\n"
                                        "01/02/2024 10:00:02,20,6\n")  # the same date: either way
    assert read_trace(one_day)[0].tolist() == [0.0, 2.0]


def test_a_date_order_that_nothing_settles_or_that_changes_is_refused(tmp_path: Path) -> None:
    both = _write(tmp_path, "b.csv", f"{AZURE_HEADER}\n13/05/2024 00:00:01,10,5\n"
                                     "05/14/2024 00:00:01,20,6\n")
    with pytest.raises(ScenarioError, match=r"b.csv line 3: TIMESTAMP = '05/14/2024 00:00:01', "
                                            r"expected the day first, as '13/05/2024 00:00:01'"):
        read_trace(both)
    unsettled = _write(tmp_path, "u.csv", f"{AZURE_HEADER}\n01/02/2024 10:00:00,10,5\n"
                                          "02/02/2024 10:00:00,20,6\n")
    with pytest.raises(ScenarioError, match=r"no day over 12 tells which; expected ISO dates"):
        read_trace(unsettled)


def test_a_row_with_more_fields_than_the_header_is_refused(tmp_path: Path) -> None:
    # An unquoted thousands separator (prompt 1,500). Read for its three columns alone,
    # the row was prompt 1 and output 500, the fourth field dropped.
    later = _write(tmp_path, "l.csv", f"{ORCASIM_HEADER}\n0,10,5\n0.5,1,500,30\n")
    with pytest.raises(ScenarioError, match=r"Expected 3 fields in line 3, saw 4"):
        read_trace(later)
    first = _write(tmp_path, "f.csv", f"{ORCASIM_HEADER}\n\n0.5,1,500,30\n1,2,3\n")
    with pytest.raises(ScenarioError, match=r"f.csv line 3: more fields than the header's 3"):
        read_trace(first)


@pytest.mark.parametrize("name, text, read", [
    ("t.csv", b"arrival_s,prompt_tokens,output_tokens,note\n0,10,5,caf\xe9\n1,20,6,x\n", "trace"),
    ("log.csv", b"arrival_s,prompt_tokens,output_tokens,ttft_s,tpot_s,e2e_s\n0,10,5,0.1,\xff,0.2\n",
     "measurements"),
])
def test_a_byte_that_is_not_utf8_anywhere_is_a_one_line_error(
    tmp_path: Path, name: str, text: bytes, read: str
) -> None:
    # In a column orcasim does not read, the byte escaped as a traceback from the check of
    # the file's last row.
    f = tmp_path / name
    f.write_bytes(text)
    with pytest.raises(ScenarioError, match=r"not UTF-8 text"):
        (read_trace if read == "trace" else read_measurements)(str(f))


def test_a_date_order_refused_names_the_files_line(tmp_path: Path) -> None:
    # An ISO row first: the row that breaks the order is the file's line 4, not the third
    # year-last date's place among the year-last dates.
    mixed = _write(tmp_path, "i.csv", f"{AZURE_HEADER}\n2024-05-12 23:59:59,10,5\n"
                                      "13/05/2024 00:00:01,20,6\n05/14/2024 00:00:01,30,7\n")
    with pytest.raises(ScenarioError, match=r"i.csv line 4: TIMESTAMP = '05/14/2024 00:00:01'"):
        read_trace(mixed)


@pytest.mark.parametrize("fmt", ["orcasim", "mooncake"])
def test_a_request_longer_than_max_tokens_is_named_where_the_file_has_it(
        tmp_path: Path, fmt: str) -> None:
    """Its id is its rank by arrival: in an unsorted file, 'request 1' is nowhere near the
    file's second request. The line the user edits is said beside it (a blank line too)."""
    from orcasim.workload import WorkloadConfig, generate_requests

    if fmt == "orcasim":
        path = _write(tmp_path, "t.csv", f"{ORCASIM_HEADER}\n5,10,2\n\n1,20,4\n3,10,2\n2,90,20\n")
        where = "t.csv line 6"
    else:
        path = _mooncake(tmp_path, [_record(5000, 10, [0]), _record(1000, 20, [1]),
                                    _record(2000, 90, [2], 20), _record(3000, 10, [3])])
        where = "m.jsonl line 3"
    cfg = WorkloadConfig(arrival={"kind": "trace", "path": path}, max_tokens=100)
    with pytest.raises(ScenarioError, match=re.escape(
            f"workload.max_tokens = 100 is below request 1's ({where}) prompt + output = 110")):
        generate_requests(cfg, np.random.default_rng(0))


@pytest.mark.parametrize("word", ["NaN", "NA", "null"])
def test_a_na_word_in_a_trace_is_quoted_not_called_empty(tmp_path: Path, word: str) -> None:
    """pandas read 'NaN' as a missing value, and the error said the cell 'is empty' (a
    tester's finding); an empty cell still is."""
    path = _write(tmp_path, "t.csv", f"{ORCASIM_HEADER}\n0,10,2\n{word},10,2\n,10,2\n")
    with pytest.raises(ScenarioError, match=rf"^t\.csv line 3: arrival_s = '{word}', expected a number"):
        read_trace(path)
    path = _write(tmp_path, "e.csv", f"{ORCASIM_HEADER}\n0,10,2\n,10,2\n")
    with pytest.raises(ScenarioError, match=r"^e\.csv line 3: arrival_s is empty"):
        read_trace(path)


def test_a_zip_made_with_its_folder_reads_its_one_csv(tmp_path: Path) -> None:
    """`zip -r` stores the folder as an entry beside the file: a JSON-lines trace read it,
    a CSV trace was refused ('Multiple files found in ZIP file'; a tester's finding)."""
    import zipfile

    path = tmp_path / "t.csv.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("sub/", "")
        archive.writestr("sub/a.csv", f"{ORCASIM_HEADER}\n1,10,2\n0,20,4\n")
    arrival_s, prompt, _ = read_trace(str(path))
    assert arrival_s.tolist() == [0.0, 1.0] and prompt.tolist() == [20, 10]


def test_mooncake_hash_ids_that_python_would_hash_alike_are_refused(tmp_path: Path) -> None:
    """Python hashes ints modulo 2**61 - 1, so ids 7 and 7 + 2**61 - 1 (both below the old
    bound, 2**62) read as the same block: a false cache hit of 512 tokens (a tester's finding)."""
    fine = _mooncake(tmp_path, [_record(0, 5, [2**60 - 1])], name="fine.jsonl")
    read_trace_with_content(fine, "mooncake")
    wraps = _mooncake(tmp_path, [_record(0, 5, [7 + 2**61 - 1])], name="wraps.jsonl")
    with pytest.raises(ScenarioError, match=r"hash_ids = \[2305843009213693958\], expected 1 "
                                            r"integer id\(s\) from 0 to below 2\*\*60"):
        read_trace_with_content(wraps, "mooncake")


def test_arrivals_as_a_unix_time_in_ms_are_refused_and_in_seconds_are_read(tmp_path: Path) -> None:
    """A Unix time in ms, made relative, stretched a 1 req/s run 1000 times and its replay
    compared plausibly (TPOT p90 -37% where it is +9%; a tester's finding); us and ns passed
    MAX_TIME_S's span check, ms did not. One in seconds is read from the first request on."""
    seconds = _write(tmp_path, "s.csv", f"{ORCASIM_HEADER}\n1700000000.5,10,2\n1700000002,10,2\n")
    assert read_trace(seconds)[0].tolist() == [0.0, 1.5]
    ms = _write(tmp_path, "ms.csv", f"{ORCASIM_HEADER}\n1700000000500,10,2\n1700000002000,10,2\n")
    with pytest.raises(ScenarioError, match=r"^ms\.csv line 2: arrival_s = '1700000000500', "
                                            r"expected seconds, below 1e\+11 .* in ms, us or ns\)$"):
        read_trace(ms)


def test_arrivals_in_unix_seconds_are_made_relative_from_their_text(tmp_path: Path) -> None:
    """A float holds 1.7e9 s only to 2.4e-7 s, so an epoch time rounded before the first
    arrival was taken off moved each arrival by up to 1.2e-7 s: rows 1e-7 s apart tied (and
    kept the file's order, here the later one first), and a replay of a log in Unix seconds
    differed from the same log counted from 0. Made relative from the text, exactly, then
    rounded once: the times and the order are those of the log counted from 0."""
    epoch = _write(tmp_path, "epoch.csv", f"{ORCASIM_HEADER}\n1700000000.3000001,4,2\n"
                   "1700000000.0000001,2,2\n1700000000,1,2\n1700000000.1,3,2\n")
    arrival_s, prompt, _ = read_trace(epoch)
    assert arrival_s.tolist() == [0.0, 1e-7, 0.1, 0.3000001] and prompt.tolist() == [1, 2, 3, 4]
    counted_from_0 = _write(tmp_path, "zero.csv", f"{ORCASIM_HEADER}\n0.3000001,4,2\n"
                            "0.0000001,2,2\n0,1,2\n0.1,3,2\n")
    assert read_trace(counted_from_0)[0].tolist() == arrival_s.tolist()


def test_a_zip_of_json_is_read_by_the_name_of_the_file_it_holds(tmp_path: Path) -> None:
    """A zip named without its file's suffix (run.zip of profile_export.jsonl) is told by the
    file inside: read as a CSV, an AIPerf export was refused as a column named twice and a
    vLLM result or a Mooncake trace as a format with no columns to tell (a tester's finding)."""
    import zipfile

    start_ns = 1_700_000_000_000_000_000
    aiperf = {"metadata": {"request_start_ns": start_ns}, "error": None,
              "metrics": {"input_sequence_length": {"value": 7, "unit": "tokens"},
                          "output_sequence_length": {"value": 3, "unit": "tokens"},
                          "request_latency": {"value": 50.0, "unit": "ms"}}}
    vllm = {"start_times": [2.0, 1.5], "input_lens": [8, 9], "output_lens": [2, 2],
            "ttfts": [0.1, 0.1], "itls": [[0.01], [0.01]], "errors": ["", ""]}
    files = {"profile_export.jsonl": json.dumps(aiperf) + "\n",
             "result.json": json.dumps(vllm),
             "trace.jsonl": json.dumps(_record(1500, 6, [1])) + "\n" + json.dumps(_record(500, 5, [2])) + "\n"}
    read = {}
    for member, text in files.items():
        path = tmp_path / f"{Path(member).stem}_run.zip"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(member, text)
        arrival_s, prompt, _ = read_trace(str(path))
        read[member] = (arrival_s.tolist(), prompt.tolist())
    assert read == {"profile_export.jsonl": ([0.0], [7]), "result.json": ([0.0, 0.5], [9, 8]),
                    "trace.jsonl": ([0.0, 1.0], [5, 6])}


@pytest.mark.parametrize("fmt", ["auto", "mooncake", "aiperf"])
def test_an_empty_json_lines_file_is_not_called_a_header_alone(tmp_path: Path, fmt: str) -> None:
    """A JSON-lines file has no header: an empty one (or one of blank lines) was said to be
    'a header alone' (a tester's finding)."""
    path = _write(tmp_path, "e.jsonl", "\n\n")
    with pytest.raises(ScenarioError, match=r"^e\.jsonl: no requests \(no record, only blank "
                                            r"lines or none\); expected at least one$"):
        read_trace(path, fmt)


@pytest.mark.parametrize(("name", "text", "fmt", "why"), [
    ("e.jsonl", "", "auto", "no record, only blank lines or none"),
    ("e.json", "\n", "auto", "no record, only blank lines or none"),
    ("e.jsonl", "\n\n", "aiperf", "no record, only blank lines or none"),
    ("e.csv", "arrival_s,prompt_tokens,output_tokens,ttft_s\n", "auto", "a header alone"),
])
def test_a_log_of_no_requests_is_read_for_its_latencies_as_none(tmp_path: Path, name: str, text: str,
                                                                fmt: str, why: str) -> None:
    """Read for its latencies (calibrate logs, fidelity), an empty .jsonl was "format
    'mooncake' holds no measured latencies", and a header alone "no ttft_s ... above 0"."""
    path = _write(tmp_path, name, text)
    with pytest.raises(ScenarioError, match=rf"^{re.escape(name)}: no requests \({why}\); "
                                            r"expected at least one$"):
        read_measurements(path, fmt)
