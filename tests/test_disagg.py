"""Prefill/decode disaggregation: hand-traced timestamps, back-pressure on both sides,
fast against reference mode, and nothing lost."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orcasim.config import ScenarioError
from orcasim.run import run_scenario
from orcasim.scenario import scenario_from_dict
from tests.conftest import BASE, examples, make_scenario
from tests.test_queueing_theory import LITTLE_REL_TOL

PAGED = {"kind": "paged", "max_num_seqs": 8, "block_size_tokens": 4, "watermark": 0.0}


def _trace(tmp_path, rows: list[tuple[float, int, int]]) -> str:  # noqa: ANN001 - a pytest path
    path = tmp_path / "trace.csv"
    lines = ["arrival_s,prompt_tokens,output_tokens"] + [f"{a},{p},{o}" for a, p, o in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _disagg(trace: str, prefill: dict | None = None, decode: dict | None = None,
            link: dict | None = None, mode: str = "fast", first_token: str | None = None) -> dict:
    extra = {} if first_token is None else {"first_token": first_token}
    return {
        "workload.arrival": {"kind": "trace", "path": trace},
        "workload.num_requests": None, "workload.prompt_tokens": None,
        "workload.output_tokens": None, "workload.max_tokens": 64,
        "kv_capacity_tokens": 1000, "engine.mode": mode,
        "cost": {"kind": "linear", "base_s": 1.0},
        "systems": [{"name": "pd", "scheduler": PAGED, "cluster": {
            "prefill": {"count": 1, **(prefill or {})},
            "decode": {"count": 1, **(decode or {})},
            "link": link or {"latency_s": 0.5}, **extra,
        }}],
    }


def _scenario(changes: dict):  # noqa: ANN202 - a Scenario
    data = copy.deepcopy(BASE)
    from orcasim.scenario import set_dotted

    for path, value in changes.items():
        if value is None:
            node = data
            *head, last = path.split(".")
            for key in head:
                node = node[key]
            node.pop(last, None)
        else:
            set_dotted(data, path, value)
    return scenario_from_dict(data)


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_request_through_both_pools_by_hand(tmp_path, mode: str) -> None:  # noqa: ANN001
    """Iterations of 1 s, a transfer of 0.5 s: prefill [0, 1] (first token at 1), KV moved
    by 1.5, decodes [1.5, 2.5] and [2.5, 3.5] (tokens 2 and 3). A one-token request ends
    at its prefill, which it shares with the first."""
    trace = _trace(tmp_path, [(0.0, 4, 3), (0.0, 4, 1)])
    result = run_scenario(_scenario(_disagg(trace, mode=mode))).systems["pd"]
    reqs = result.requests
    assert reqs["first_token_s"].tolist() == [1.0, 1.0]
    assert reqs["finish_s"].tolist() == [3.5, 1.0]
    assert reqs["kv_transfer_s"].tolist()[0] == 0.5 and np.isnan(reqs["kv_transfer_s"][1])
    assert reqs["decode_replica"].tolist() == [0, -1]
    assert reqs["decode_wait_s"].tolist()[0] == 0.0
    pools = result.iterations.groupby("pool")["num_iterations"].sum().to_dict()
    assert pools == {"prefill": 1, "decode": 2}


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_the_first_token_from_the_decode_instance_by_hand(tmp_path, mode: str) -> None:  # noqa: ANN001
    """vLLM's disaggregated prefill: the prefill's token is dropped; after the transfer
    (1.5) the decode instance computes the last prompt token again and emits the first
    token at 2.5, then tokens 2 and 3. The one-token request goes the same way."""
    trace = _trace(tmp_path, [(0.0, 4, 3), (0.0, 4, 1)])
    changes = _disagg(trace, mode=mode, first_token="decode")
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["first_token_s"].tolist() == [2.5, 2.5]
    assert reqs["finish_s"].tolist() == [4.5, 2.5]
    assert reqs["decode_replica"].tolist() == [0, 0]


def test_the_prefill_instance_holds_kv_until_it_has_moved(tmp_path) -> None:  # noqa: ANN001
    """The prefill instance has room for one prompt's blocks: the second prompt waits
    until the first's KV has moved (1 + 5 s), then prefills [6, 7]."""
    trace = _trace(tmp_path, [(0.0, 8, 2), (0.0, 8, 2)])
    changes = _disagg(trace, prefill={"kv_capacity_tokens": 12}, link={"latency_s": 5.0})
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["first_token_s"].tolist() == [1.0, 7.0]


def test_decode_admission_waits_for_decode_kv(tmp_path) -> None:  # noqa: ANN001
    """The decode instance has room for one request: the second, moved at 2.5, runs when
    the first finishes (1.5 + 3 decodes = 4.5)."""
    trace = _trace(tmp_path, [(0.0, 8, 4), (1.0, 8, 4)])
    changes = _disagg(trace, decode={"kv_capacity_tokens": 12})
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["finish_s"].tolist() == [4.5, 7.5]
    assert reqs["decode_wait_s"].tolist() == [0.0, 2.0]


@settings(max_examples=examples(25), deadline=None)
@given(
    prefill_count=st.integers(1, 3), decode_count=st.integers(1, 3),
    prefill_router=st.sampled_from(["round_robin", "least_outstanding", "random"]),
    decode_router=st.sampled_from(["least_kv", "least_tokens", "power_of_two"]),
    decode_kind=st.sampled_from(["paged", "iteration_level", "chunked"]),
    first_token=st.sampled_from(["prefill", "decode"]),
    rate_per_s=st.floats(2.0, 40.0), seed=st.integers(0, 2**16),
)
def test_fast_equals_reference_and_nothing_is_lost(
    prefill_count: int, decode_count: int, prefill_router: str, decode_router: str,
    decode_kind: str, first_token: str, rate_per_s: float, seed: int,
) -> None:
    decode_scheduler = {"paged": {"kind": "paged", "max_num_seqs": 16},
                        "iteration_level": {"kind": "iteration_level", "max_batch_size": 16},
                        "chunked": {"kind": "chunked", "chunk_size_tokens": 256}}[decode_kind]
    frames = {}
    for mode in ("fast", "reference"):
        scenario = make_scenario(**{
            "seed": seed, "workload.num_requests": 150, "engine.mode": mode,
            "workload.arrival": {"kind": "poisson", "rate_per_s": rate_per_s},
            "kv_capacity_tokens": 8000,
            "systems": [{"name": "pd", "scheduler": {"kind": "paged", "max_num_seqs": 16},
                         "cluster": {
                             "prefill": {"count": prefill_count, "router": {"kind": prefill_router}},
                             "decode": {"count": decode_count, "router": {"kind": decode_router},
                                        "scheduler": decode_scheduler},
                             "link": {"latency_s": 0.01}, "first_token": first_token}}],
        })
        frames[mode] = run_scenario(scenario).systems["pd"].requests
    fast, reference = frames["fast"], frames["reference"]
    assert fast["finish_s"].notna().all()
    assert fast["prefill_replica"].between(0, prefill_count - 1).all()
    decoded = (fast["output_tokens"] > 1) | (first_token == "decode")
    assert fast.loc[decoded, "decode_replica"].between(0, decode_count - 1).all()
    assert (fast["first_token_s"] <= fast["finish_s"]).all()
    for column in ("first_token_s", "finish_s", "prefill_replica", "decode_replica"):
        assert np.array_equal(fast[column], reference[column], equal_nan=True), column


def test_littles_law_holds_for_a_disaggregated_cluster() -> None:
    scenario = make_scenario(**{
        "workload.num_requests": 3000,
        "systems": [{"name": "pd", "scheduler": {"kind": "paged", "max_num_seqs": 16},
                     "cluster": {"prefill": {"count": 1}, "decode": {"count": 2}}}],
    })
    result = run_scenario(scenario).systems["pd"]
    assert result.summary["little_rel_error"] < LITTLE_REL_TOL, result.summary
    assert result.summary["decode_replicas"] == 2 and result.summary["prefill_replicas"] == 1
    assert 0 < result.summary["decode_busy_fraction"] <= 1


@pytest.mark.parametrize(("cluster", "needle"), [
    ({"prefill": {"count": 1}}, "'decode' is missing"),
    ({"prefill": {"count": 1}, "decode": {"count": 1}, "replicas": 2}, "replicas"),
    ({"prefill": {"count": 1}, "decode": {"count": 1}, "router": {"kind": "random"}}, "router"),
    ({"prefill": {"count": 1, "scheduler": {"kind": "request_level", "max_batch_size": 2}},
      "decode": {"count": 1}}, "request_level"),
    ({"prefill": {"count": 1}, "decode": {"count": 1}, "link": {"kind": "pigeon"}}, "link"),
    ({"replicas": 2, "first_token": "decode"}, "first_token"),
])
def test_bad_disaggregation_keys_are_one_line_errors(cluster: dict, needle: str) -> None:
    data = {**BASE, "systems": [{"name": "pd", "scheduler": {"kind": "paged", "max_num_seqs": 4},
                                 "cluster": cluster}]}
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(data)
    assert "\n" not in str(err.value) and needle in str(err.value), str(err.value)
