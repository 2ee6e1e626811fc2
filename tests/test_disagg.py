"""Prefill/decode disaggregation: hand-traced timestamps, back-pressure on both sides,
fast against reference mode, and nothing lost."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orcasim.cluster import LINKS, LinkConfig
from orcasim.config import ScenarioError
from orcasim.run import run_scenario
from orcasim.scenario import scenario_from_dict
from tests.conftest import BASE, examples, make_scenario, requests_in_both_modes
from tests.test_queueing_theory import LITTLE_REL_TOL

PAGED = {"kind": "paged", "max_num_seqs": 8, "block_size_tokens": 4, "watermark": 0.0}


def _trace(tmp_path, rows: list[tuple[float, int, int]]) -> str:  # noqa: ANN001 - a pytest path
    path = tmp_path / "trace.csv"
    lines = ["arrival_s,prompt_tokens,output_tokens"] + [f"{a},{p},{o}" for a, p, o in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _disagg(trace: str, prefill: dict | None = None, decode: dict | None = None,
            link: dict | None = None, mode: str = "fast", first_token: str | None = None,
            handoff: str | None = None) -> dict:
    extra = {key: value for key, value in (("first_token", first_token), ("handoff", handoff))
             if value is not None}
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
@pytest.mark.parametrize("decode_scheduler", [PAGED, {"kind": "iteration_level", "max_batch_size": 4},
                                              {"kind": "chunked", "chunk_size_tokens": 8}])
def test_a_request_through_both_pools_by_hand(tmp_path, mode: str, decode_scheduler: dict) -> None:  # noqa: ANN001
    """Iterations of 1 s, a transfer of 0.5 s: prefill [0, 1] (first token at 1), KV moved
    by 1.5, decodes [1.5, 2.5] and [2.5, 3.5] (tokens 2 and 3), whatever schedules the
    decode instance. A one-token request ends at its prefill, which it shares with the
    first."""
    trace = _trace(tmp_path, [(0.0, 4, 3), (0.0, 4, 1)])
    changes = _disagg(trace, mode=mode, decode={"scheduler": decode_scheduler})
    result = run_scenario(_scenario(changes)).systems["pd"]
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


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_pulled_copy_stalls_the_decode_loop_by_hand(tmp_path, mode: str) -> None:  # noqa: ANN001
    """Iterations of 1 s, copies of 0.5 s. Pushed, B's KV moves while A decodes: A [1.5,
    2.5], then both [2.5, 3.5] and [3.5, 4.5]. Pulled (DistServe), each copy runs in the
    decode loop before the iteration its request joins: A [1, 2.5]; B, prefilled by 2,
    joins at 2.5 after its copy: [2.5, 4.0] and [4.0, 5.0], A waiting for it too."""
    trace = _trace(tmp_path, [(0.0, 4, 4), (1.0, 4, 3)])
    finish, busy = {}, {}
    for handoff in ("push", "pull"):
        changes = _disagg(trace, mode=mode, handoff=handoff)
        result = run_scenario(_scenario(changes)).systems["pd"]
        finish[handoff] = result.requests["finish_s"].tolist()
        assert result.requests["first_token_s"].tolist() == [1.0, 2.0]
        assert result.requests["kv_transfer_s"].tolist() == [0.5, 0.5]
        decode = result.iterations[result.iterations["pool"] == "decode"]
        busy[handoff] = (decode["start_s"].min(), decode["duration_s"].sum(),
                         decode["num_iterations"].sum())
    assert finish == {"push": [4.5, 4.5], "pull": [5.0, 5.0]}
    # Three decode iterations either way; pulled, two copies inside the decode instance's time.
    assert busy == {"push": (1.5, 3.0, 3), "pull": (1.0, 4.0, 3)}


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_full_decode_pool_stalls_the_prefill_pool_when_it_pulls(tmp_path, mode: str) -> None:  # noqa: ANN001
    """Each pool has room for one request (3 blocks of 4 tokens); iterations of 1 s, copies
    of 0.5 s; A, B and C arrive at 0. Both ways A prefills [0, 1] and its KV has left by
    1.5, so B prefills [1.5, 2.5], and the decode instance runs A until 4.5.
    Pushed: B's KV leaves at 3.0 and waits on the decode side, so C prefills [3, 4]; B runs
    [4.5, 5.5] and C [5.5, 6.5]. Pulled: B's KV stays on the prefill instance until the
    decode instance takes B at 4.5 (copied by 5.0), so C prefills only [5, 6]; B runs
    [4.5, 6.0] and C, taken at 6, [6.0, 7.5]."""
    trace = _trace(tmp_path, [(0.0, 8, 4), (0.0, 8, 2), (0.0, 8, 2)])
    expected = {"push": ([1.0, 2.5, 4.0], [4.5, 5.5, 6.5], [0.0, 1.5, 1.0]),
                "pull": ([1.0, 2.5, 6.0], [4.5, 6.0, 7.5], [0.0, 2.0, 0.0])}
    for handoff, (first_token_s, finish_s, decode_wait_s) in expected.items():
        changes = _disagg(trace, mode=mode, prefill={"kv_capacity_tokens": 12},
                          decode={"kv_capacity_tokens": 12}, handoff=handoff)
        reqs = run_scenario(_scenario(changes)).systems["pd"].requests
        assert reqs["first_token_s"].tolist() == first_token_s, handoff
        assert reqs["finish_s"].tolist() == finish_s, handoff
        assert reqs["decode_wait_s"].tolist() == decode_wait_s, handoff


@pytest.mark.filterwarnings("ignore:pd.*can never fit")
def test_a_pulled_request_the_decode_instance_turns_away_frees_the_prefill_kv(tmp_path) -> None:  # noqa: ANN001
    """A (8 + 8 tokens) can never fit the decode instance's 3 blocks: turned away there at
    1, its first token out, and its prefill blocks freed then, so that B prefills [1, 2]
    and, pulled at 2, decodes [2, 3.5]."""
    trace = _trace(tmp_path, [(0.0, 8, 8), (0.0, 8, 2)])
    changes = _disagg(trace, prefill={"kv_capacity_tokens": 12}, decode={"kv_capacity_tokens": 12},
                      handoff="pull")
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["first_token_s"].tolist() == [1.0, 2.0]
    assert np.isnan(reqs["finish_s"][0]) and reqs["finish_s"][1] == 3.5
    assert reqs["rejected"].tolist() == [True, False]


@pytest.mark.filterwarnings("ignore:pd.*can never fit")
@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_pulled_request_turned_away_mid_run_frees_the_prefill_kv_at_once(tmp_path, mode: str) -> None:  # noqa: ANN001
    """16 blocks a side. A (40 + 20) decodes [1.5, 20.5] (its copy 0.5 s), B (30 + 2) waits
    for decode blocks, holding 8 prefill blocks. C (20 + 60) can never fit the decode
    instance: handed over at 4, turned away at the decode step's end at 4.5, which frees its
    prefill blocks then, so D (30 + 2) prefills [4.5, 5.5]. B and D join when A ends: two
    copies, then one step, [21.5, 22.5]. Fast mode used to turn C away only at its run's end,
    20.5, and prefill D after it."""
    trace = _trace(tmp_path, [(0.0, 40, 20), (0.0, 30, 2), (3.0, 20, 60), (3.0, 30, 2)])
    changes = _disagg(trace, prefill={"kv_capacity_tokens": 64}, decode={"kv_capacity_tokens": 64},
                      mode=mode, handoff="pull")
    changes["workload.max_tokens"] = 100
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["first_scheduled_s"].tolist() == [0.0, 1.5, 3.0, 4.5]
    assert reqs["rejected"].tolist() == [False, False, True, False]
    assert reqs["finish_s"].tolist()[:2] == [20.5, 22.5] and reqs["finish_s"][3] == 22.5
    # C was never copied: no transfer time (it read 0.5 s, and counted in the mean).
    assert reqs["kv_transfer_s"].isna().tolist() == [False, False, True, False]


@pytest.mark.parametrize("mode", ["fast", "reference"])
@pytest.mark.parametrize(("prefills", "decodes", "moved_s"), [
    (1, 1, [2.5, 3.5]), (1, 2, [2.5, 3.5]), (2, 1, [2.5, 3.5]), (2, 2, [2.5, 2.5])])
def test_pushes_at_once_share_an_instance_s_link(tmp_path, mode: str, prefills: int,  # noqa: ANN001
                                                 decodes: int, moved_s: list[float]) -> None:
    """Two 10-token prompts prefill [0, 1]; each KV (10 x 524,288 bytes of Llama-2-7B) holds
    a link of 5,242,880 B/s for 1 s, then 0.5 s of latency. Through one sender's link or into
    one receiver's, the second starts as the first's bytes end: moved at 2.5 and 3.5 (both
    moved at 2.5, twice the link's bandwidth). Two pairs of instances move both at once."""
    trace = _trace(tmp_path, [(0.0, 10, 3), (0.0, 10, 3)])
    changes = _disagg(trace, prefill={"count": prefills}, decode={"count": decodes}, mode=mode,
                      link={"bandwidth_bytes_per_s": 5_242_880.0, "latency_s": 0.5})
    changes["model"] = "llama2-7b"
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["first_token_s"].tolist() == [1.0, 1.0]
    assert reqs["kv_transfer_s"].tolist() == [t - 1.0 for t in moved_s]
    # Each decodes its last two tokens from its KV's arrival (B joins A's batch at 3.5).
    assert reqs["finish_s"].tolist() == [t + 2.0 for t in moved_s]


@pytest.mark.filterwarnings("ignore:.*one batch at a time passes through all stages")
@pytest.mark.parametrize(("prefill", "decode", "transfer_s"), [
    ((1, 1), (1, 1), 1.5), ((2, 1), (2, 1), 1.0), ((2, 1), (1, 1), 1.5), ((2, 2), (4, 1), 0.75)])
def test_each_gpu_moves_its_shard_of_the_kv(tmp_path, prefill: tuple[int, int],  # noqa: ANN001
                                           decode: tuple[int, int], transfer_s: float) -> None:
    """A 10-token prompt's KV (5,242,880 bytes of Llama-2-7B) over links of 5,242,880 B/s and
    0.5 s latency: each GPU (TP x PP a side) holds a shard and moves it over its own link, so
    min(GPUs a side) links carry it at once. It took 1.5 s whatever the parallelism."""
    def pool(tp_pp: tuple[int, int]) -> dict:
        return {"kv_capacity_tokens": 1000,
                "hardware": {"gpu": "a100-80gb", "tensor_parallel": tp_pp[0],
                             "pipeline_parallel": tp_pp[1]}}

    trace = _trace(tmp_path, [(0.0, 10, 3)])
    changes = _disagg(trace, prefill=pool(prefill), decode=pool(decode),
                      link={"bandwidth_bytes_per_s": 5_242_880.0, "latency_s": 0.5})
    changes["model"] = "llama2-7b"
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["kv_transfer_s"].tolist() == [transfer_s]


@pytest.mark.filterwarnings("ignore:.*one batch at a time passes through all stages")
def test_a_replicated_kv_head_moves_whole(tmp_path) -> None:  # noqa: ANN001
    """Qwen3-30B-A3B has 4 KV heads: at TP 8 each rank keeps a replica of one, as many bytes
    as at TP 4, so the transfer takes as long (it was priced over 8 lanes, twice as fast)."""
    def seconds(tp: int) -> float:
        pool = {"kv_capacity_tokens": 4000, "hardware": {"gpu": "h100-80gb", "tensor_parallel": tp}}
        changes = _disagg(_trace(tmp_path, [(0.0, 1000, 3)]), prefill=pool, decode=pool,
                          link={"bandwidth_bytes_per_s": 1e9, "latency_s": 0.0})
        changes["model"] = "qwen3-30b-a3b"
        changes["workload.max_tokens"] = 1024
        return float(run_scenario(_scenario(changes)).systems["pd"].requests["kv_transfer_s"][0])

    assert seconds(8) == seconds(4) == pytest.approx(seconds(2) / 2)


@pytest.mark.filterwarnings("ignore:pd.*can never fit")
def test_a_pushed_request_the_decode_instance_turns_away_had_moved(tmp_path) -> None:  # noqa: ANN001
    """Pushed, A's KV (8 + 8 tokens, more than the decode instance's 3 blocks) moves in
    0.5 s as its prefill ends and is turned away on arrival: the copy took place, so its
    kv_transfer_s stays (it read empty, as for a pulled request, which is never copied)."""
    trace = _trace(tmp_path, [(0.0, 8, 8), (0.0, 8, 2)])
    changes = _disagg(trace, prefill={"kv_capacity_tokens": 12}, decode={"kv_capacity_tokens": 12})
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["rejected"].tolist() == [True, False]
    assert reqs["kv_transfer_s"].tolist() == [0.5, 0.5]


@pytest.mark.filterwarnings("ignore:pd.*can never fit")
@pytest.mark.parametrize("handoff", ["push", "pull"])
def test_a_request_the_decode_instance_turns_away_has_no_latencies(tmp_path, handoff: str) -> None:  # noqa: ANN001
    """A turned away at the decode side had its first token from the prefill instance, and
    its ttft_s and queue_delay_s stood in the frame (in a TTFT CDF of the served requests,
    where the summary counts none of it), where a request turned away colocated has none.
    Its timestamps stay as they happened; its latencies are NaN, as the summary reads them."""
    trace = _trace(tmp_path, [(0.0, 8, 8), (0.0, 8, 2)])
    changes = _disagg(trace, prefill={"kv_capacity_tokens": 12}, decode={"kv_capacity_tokens": 12},
                      handoff=handoff)
    result = run_scenario(_scenario(changes)).systems["pd"]
    reqs = result.requests
    assert reqs["rejected"].tolist() == [True, False]
    turned_away, served = reqs.iloc[0], reqs.iloc[1]
    assert turned_away["first_token_s"] > 0  # the prefill instance's first token, as it was
    assert np.isnan(turned_away[["ttft_s", "queue_delay_s", "tpot_s", "e2e_s"]].to_numpy(float)).all()
    assert served["ttft_s"] > 0 and result.summary["ttft_s_mean"] == served["ttft_s"]


def test_every_instance_has_a_summary_row_an_idle_one_too(tmp_path) -> None:  # noqa: ANN001
    """One request on 2 prefill and 3 decode instances: one of each runs, prefill [0, 1],
    KV moved by 1.5, decodes [1.5, 2.5] and [2.5, 3.5]. The table has all five instances,
    and a pool's busy share is the mean over its instances (the idle ones were left out:
    decode_busy_fraction 2/3.5 over one instance, decode_replicas 1)."""
    trace = _trace(tmp_path, [(0.0, 4, 3)])
    changes = _disagg(trace, prefill={"count": 2}, decode={"count": 3})
    result = run_scenario(_scenario(changes)).systems["pd"]
    table = result.replicas
    assert table.index.tolist() == [("prefill", 0), ("prefill", 1), ("decode", 0), ("decode", 1),
                                    ("decode", 2)]
    assert table["iterations"].tolist() == [1.0, 0.0, 2.0, 0.0, 0.0]
    assert np.isnan(table["batch_size_mean"].tolist()[1])
    assert table["kv_reserved_tokens_max"].tolist()[1] == 0.0  # idle: reserved none
    assert np.isnan(table["kv_utilization_mean"].tolist()[1])
    assert result.summary["prefill_replicas"] == 2.0 and result.summary["decode_replicas"] == 3.0
    assert result.summary["prefill_busy_fraction"] == pytest.approx((1 / 3.5) / 2, rel=1e-12)
    assert result.summary["decode_busy_fraction"] == pytest.approx((2 / 3.5) / 3, rel=1e-12)


def test_each_instance_reports_its_own_kv(tmp_path) -> None:  # noqa: ANN001
    """The system's KV figures pool both pools' rows: beside a 32-token decode pool its
    kv_reserved_tokens_max reads the prefill instance's 44 (a tester's finding: 3,648 beside
    500), and no row said the decode instance's own. Each instance's row now has its KV
    figures, within its own pool (28 here), and the system's peak is the largest of them."""
    trace = _trace(tmp_path, [(0.0, 24, 3), (0.0, 20, 3)])
    changes = _disagg(trace, prefill={"kv_capacity_tokens": 64}, decode={"kv_capacity_tokens": 32})
    result = run_scenario(_scenario(changes)).systems["pd"]
    table = result.replicas
    assert table.loc[("decode", 0), "kv_reserved_tokens_max"] <= 32
    assert table.loc[("prefill", 0), "kv_reserved_tokens_max"] >= 44  # both prompts at once
    assert table["kv_reserved_tokens_max"].max() == result.summary["kv_reserved_tokens_max"]
    assert result.summary["decode_kv_reserved_tokens_max"] == table.loc[("decode", 0), "kv_reserved_tokens_max"]
    assert result.summary["prefill_kv_reserved_tokens_max"] == table.loc[("prefill", 0), "kv_reserved_tokens_max"]


def test_one_token_outputs_are_not_a_queue_on_the_decode_side(tmp_path) -> None:  # noqa: ANN001
    """A one-token output is done at its prefill and never reaches a decode instance: the
    saturation test counted it as never admitted, and a cluster a few percent busy read
    `saturated` (a tester's finding). 80 requests 5 s apart, every other one a single
    token: each is served before the next arrives."""
    trace = _trace(tmp_path, [(5.0 * i, 4, 1 + i % 2) for i in range(80)])
    result = run_scenario(_scenario(_disagg(trace))).systems["pd"]
    assert result.requests["decode_replica"].lt(0).sum() == 40
    assert result.summary["saturated"] == 0.0
    span = result.summary["saturation_arrival_rps"]
    assert result.summary["saturation_admission_rps"] == pytest.approx(span, rel=0.05)


def test_pools_that_serve_different_models_are_refused(tmp_path) -> None:  # noqa: ANN001
    trace = _trace(tmp_path, [(0.0, 4, 3)])
    changes = _disagg(trace, prefill={"model": "llama3-8b"}, decode={"model": "opt-13b"})
    with pytest.raises(ScenarioError, match=r"^scenario: systems\[0\]\.cluster\.decode\.model = 'opt-13b': "
                       r".*expected the prefill pool's \('llama3-8b'\)$"):
        _scenario(changes)
    same = _disagg(trace, prefill={"model": "opt-13b"}, decode={"model": "opt-13b"})
    _scenario(same)  # the same model, given on each pool


def test_a_link_without_a_model_warns_that_it_moves_no_bytes(tmp_path) -> None:  # noqa: ANN001
    trace = _trace(tmp_path, [(0.0, 4, 3)])
    changes = _disagg(trace, link={"kind": "ethernet", "bandwidth_bytes_per_s": 1000.0})
    with pytest.warns(UserWarning, match="link's bandwidth is not used: without a model"):
        reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["kv_transfer_s"][0] == LINKS["ethernet"][1]  # the latency alone


@pytest.mark.filterwarnings("ignore:pd.*can never fit")
@pytest.mark.parametrize("handoff", ["push", "pull"])
def test_a_closed_loop_s_client_sends_again_when_the_decode_instance_turns_it_away(
        handoff: str) -> None:
    """A decode instance of 256 tokens turns away what can never fit it, as soon as it is
    handed over (at its next step's end, mid-run in fast mode): the client sends its next
    request then, in fast and reference mode alike."""
    frames = requests_in_both_modes("pd", **{
        "seed": 2, "workload.num_requests": 40,
        "workload.arrival": {"kind": "closed_loop", "num_clients": 4,
                             "think_time": {"kind": "constant", "value_s": 0.0}},
        "workload.prompt_tokens": {"kind": "uniform", "low": 1, "high": 250},
        "workload.output_tokens": {"kind": "uniform", "low": 1, "high": 120},
        "workload.max_tokens": 400, "kv_capacity_tokens": 256,
        "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4},
        "systems": [{"name": "pd", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                     "cluster": {"prefill": {"count": 1}, "decode": {"count": 1},
                                 "link": {"latency_s": 0.001}, "handoff": handoff}}],
    })
    fast, reference = frames["fast"], frames["reference"]
    assert fast["rejected"].any() and fast["arrival_s"].notna().all()
    for column in ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s"):
        assert np.array_equal(fast[column], reference[column], equal_nan=True), column


DISTSERVE_DECODE = {**PAGED, "policy": "distserve_decode"}


@pytest.mark.parametrize("mode", ["fast", "reference"])
@pytest.mark.parametrize("policy", ["mixed", "distserve_decode"])
def test_distserve_s_decode_instance_accepts_then_joins_by_hand(tmp_path, mode: str, policy: str) -> None:  # noqa: ANN001
    """A (8 + 4 tokens) and B (8 + 2) prefill together [0, 1]; the decode instance has 6
    blocks of 4 tokens; iterations of 1 s, copies of 0.5 s. vLLM-like (mixed) it takes both
    at 1 (3 blocks each), copies both and decodes them [1, 3]: B ends at 3, A at 5.
    DistServe's: it accepts A (2 blocks), which joins (3 blocks free >= its 3); B is
    accepted only after that step, at 2.5 (its copy in [2.5, 4.0]), and cannot join while
    fewer than its own 3 blocks are free again, so it runs [5, 6], after A."""
    trace = _trace(tmp_path, [(0.0, 8, 4), (0.0, 8, 2)])
    decode = {"kv_capacity_tokens": 24, "scheduler": {**PAGED, "policy": policy}}
    changes = _disagg(trace, mode=mode, decode=decode, handoff="pull")
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["first_token_s"].tolist() == [1.0, 1.0]
    expected = {"mixed": ([5.0, 3.0], [0.0, 0.0]), "distserve_decode": ([5.0, 6.0], [0.0, 4.0])}
    assert (reqs["finish_s"].tolist(), reqs["decode_wait_s"].tolist()) == expected[policy]
    # DistServe's B is copied as it is accepted, [2.5, 3.0], inside its decode_wait_s [1, 5].
    expected_copy_s = {"mixed": [0.5, 1.0], "distserve_decode": [0.5, 0.5]}
    assert reqs["kv_transfer_s"].tolist() == expected_copy_s[policy]


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_distserve_s_decode_instance_accepts_a_request_handed_over_mid_run(tmp_path, mode: str) -> None:  # noqa: ANN001
    """A decodes alone from 1 ([1, 2.5] with its copy, then 1 s steps); B, prefilled [2, 3],
    is accepted at the next step's start, 3.5, and decodes with A after its copy: [3.5,
    5.0]. A then ends [6, 7]. Fast mode's run over A's steps must end at 3.5 for it."""
    trace = _trace(tmp_path, [(0.0, 4, 6), (2.0, 4, 2)])
    changes = _disagg(trace, mode=mode, decode={"scheduler": DISTSERVE_DECODE}, handoff="pull")
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["first_token_s"].tolist() == [1.0, 3.0]
    assert reqs["finish_s"].tolist() == [7.0, 5.0]


@pytest.mark.filterwarnings("ignore:pd.*can never fit")
@pytest.mark.parametrize("policy", ["mixed", "distserve_decode"])
def test_distserve_s_decode_instance_turns_away_what_its_double_count_never_admits(
        tmp_path, policy: str) -> None:  # noqa: ANN001
    """3 blocks of 4 tokens; A's 8 + 2 tokens peak at 3 blocks, so vLLM's rule runs it
    alone. DistServe's would hold its 2 prompt blocks and wait for 3 more: turned away on
    arrival instead, its prefill KV freed. B (4 + 2: 1 block, then 2) fits either way."""
    trace = _trace(tmp_path, [(0.0, 8, 2), (0.0, 4, 2)])
    decode = {"kv_capacity_tokens": 12, "scheduler": {**PAGED, "policy": policy}}
    changes = _disagg(trace, decode=decode, handoff="pull")
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["first_token_s"].tolist() == [1.0, 1.0]
    turned_away = policy == "distserve_decode"
    assert reqs["rejected"].tolist() == [turned_away, False]
    assert np.isnan(reqs["finish_s"]).tolist() == [turned_away, False]


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_distserve_decode_deadlock_is_one_line_not_a_hang(tmp_path, mode: str) -> None:  # noqa: ANN001
    """128 one-token blocks on the decode side. B (25 + 51) is preempted as A (60 + 44) and
    it outgrow the pool, and C (63 prompt blocks) is accepted meanwhile; when A ends, B needs
    66 blocks beside C's 63: it can never rejoin, and C, behind it, never joins. DistServe
    would wait forever; the run stops with one line saying so."""
    trace = _trace(tmp_path, [(0.0, 60, 44), (0.4, 25, 51), (0.8, 63, 46)])
    block = {**PAGED, "block_size_tokens": 1}
    changes = _disagg(trace, prefill={"kv_capacity_tokens": 1024},
                      decode={"scheduler": {**block, "policy": "distserve_decode"}},
                      link={"latency_s": 0.0}, mode=mode, handoff="pull")
    changes.update({"workload.max_tokens": 400, "kv_capacity_tokens": 128,
                    "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4},
                    "systems": [{**changes["systems"][0], "scheduler": block}]})
    with pytest.raises(ScenarioError) as err:
        run_scenario(_scenario(changes))
    message = str(err.value)
    assert "\n" not in message and "deadlocks" in message and "request 1" in message, message
    # The decode pool's own scheduler, not the system's (a paged one here).
    assert message.startswith("systems[0].cluster.decode.scheduler.policy = 'distserve_decode'")


@pytest.mark.parametrize(("where", "handoff"), [("prefill", "pull"), ("decode", "push"),
                                                 ("colocated", None)])
def test_distserve_s_decode_policy_only_on_a_pulling_decode_pool(tmp_path, where: str,  # noqa: ANN001
                                                                 handoff: str | None) -> None:
    trace = _trace(tmp_path, [(0.0, 8, 4)])
    pool = {where: {"scheduler": DISTSERVE_DECODE}} if where != "colocated" else {}
    changes = _disagg(trace, handoff=handoff, **pool)
    if where == "colocated":  # no cluster at all: the handoff above goes with it
        changes["systems"][0] = {"name": "pd", "scheduler": DISTSERVE_DECODE}
    with pytest.raises(ScenarioError) as err:
        run_scenario(_scenario(changes))
    assert "\n" not in str(err.value) and "distserve_decode" in str(err.value), str(err.value)


def test_a_pipelined_decode_pool_cannot_pull() -> None:
    scenario = make_scenario(**{
        "workload.num_requests": 10, "model": "llama2-7b",
        "hardware": {"gpu": "a100-80gb"}, "cost": {"kind": "roofline"},
        "systems": [{"name": "pd", "scheduler": {"kind": "iteration_level", "max_batch_size": 8},
                     "cluster": {"prefill": {"count": 1},
                                 "decode": {"count": 1, "hardware": {"gpu": "a100-80gb",
                                                                     "pipeline_parallel": 2}},
                                 "handoff": "pull"}}],
    })
    with pytest.raises(ScenarioError) as err:
        run_scenario(scenario)
    assert "\n" not in str(err.value) and "handoff" in str(err.value), str(err.value)
    assert "expected decode.hardware.pipeline_parallel = 1, or" in str(err.value)
    # A pool on the scenario's hardware: its key is the scenario's, which it named as the
    # pool's own, a key the file does not have (a tester's finding).
    scenario = make_scenario(**{
        "workload.num_requests": 10, "model": "llama2-7b",
        "hardware": {"gpu": "a100-80gb", "pipeline_parallel": 2}, "cost": {"kind": "roofline"},
        "systems": [{"name": "pd", "scheduler": {"kind": "iteration_level", "max_batch_size": 8},
                     "cluster": {"prefill": {"count": 1}, "decode": {"count": 1},
                                 "handoff": "pull"}}],
    })
    with pytest.raises(ScenarioError, match=r"expected hardware.pipeline_parallel = 1 \(the "
                                            r"decode pool runs on the scenario's hardware\)"):
        run_scenario(scenario)


@settings(max_examples=examples(25), deadline=None)
@given(
    prefill_count=st.integers(1, 3), decode_count=st.integers(1, 3),
    prefill_router=st.sampled_from(["round_robin", "least_outstanding", "random"]),
    decode_router=st.sampled_from(["least_kv", "least_tokens", "power_of_two"]),
    decode_kind=st.sampled_from(["paged", "iteration_level", "chunked", "distserve_decode"]),
    prefill_kind=st.sampled_from(["paged", "iteration_level"]),
    first_token=st.sampled_from(["prefill", "decode"]),
    handoff=st.sampled_from(["push", "pull"]),
    rate_per_s=st.floats(2.0, 40.0), seed=st.integers(0, 2**16),
    prefill_tp=st.sampled_from([1, 2]), decode_tp=st.sampled_from([1, 2]),
)
@pytest.mark.filterwarnings("ignore:.*its own hardware changes only its KV capacity")
def test_fast_equals_reference_and_nothing_is_lost(
    prefill_count: int, decode_count: int, prefill_router: str, decode_router: str,
    decode_kind: str, prefill_kind: str, first_token: str, handoff: str, rate_per_s: float,
    seed: int, prefill_tp: int, decode_tp: int,
) -> None:
    """Every pool size, router, scheduler and handoff, with OPT-13B's KV on a 2 GB/s link
    (a 64-token prompt's copy 26 ms at TP 1, beside 10 ms steps: copies contend for links,
    at shares below 1 where the pools' TP differ)."""
    schedulers = {"paged": {"kind": "paged", "max_num_seqs": 16},
                  "iteration_level": {"kind": "iteration_level", "max_batch_size": 16},
                  "chunked": {"kind": "chunked", "chunk_size_tokens": 256},
                  "distserve_decode": {"kind": "paged", "policy": "distserve_decode",
                                       "max_num_seqs": 16}}
    if decode_kind == "distserve_decode":
        handoff = "pull"  # DistServe's decode instance pulls the KV it accepts
    decode_scheduler, prefill_scheduler = schedulers[decode_kind], schedulers[prefill_kind]
    frames = {}
    for mode in ("fast", "reference"):
        scenario = make_scenario(**{
            "seed": seed, "workload.num_requests": 150, "engine.mode": mode,
            "workload.arrival": {"kind": "poisson", "rate_per_s": rate_per_s},
            "kv_capacity_tokens": 8000, "model": "opt-13b",
            "systems": [{"name": "pd", "scheduler": {"kind": "paged", "max_num_seqs": 16},
                         "cluster": {
                             "prefill": {"count": prefill_count, "router": {"kind": prefill_router},
                                         "scheduler": prefill_scheduler, "kv_capacity_tokens": 8000,
                                         "hardware": {"gpu": "a100-80gb",
                                                      "tensor_parallel": prefill_tp}},
                             "decode": {"count": decode_count, "router": {"kind": decode_router},
                                        "scheduler": decode_scheduler, "kv_capacity_tokens": 8000,
                                        "hardware": {"gpu": "a100-80gb",
                                                     "tensor_parallel": decode_tp}},
                             "link": {"latency_s": 0.01, "bandwidth_bytes_per_s": 2e9},
                             "first_token": first_token, "handoff": handoff}}],
        })
        frames[mode] = run_scenario(scenario).systems["pd"].requests
    fast, reference = frames["fast"], frames["reference"]
    assert fast["finish_s"].notna().all()
    assert fast["prefill_replica"].between(0, prefill_count - 1).all()
    decoded = (fast["output_tokens"] > 1) | (first_token == "decode")
    assert fast.loc[decoded, "decode_replica"].between(0, decode_count - 1).all()
    assert (fast["first_token_s"] <= fast["finish_s"]).all()
    for column in ("first_token_s", "finish_s", "prefill_replica", "decode_replica",
                   "kv_transfer_s"):
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
    ({"replicas": 2, "handoff": "pull"}, "handoff"),
    ({"prefill": {"count": 1}, "decode": {"count": 1}, "handoff": "fetch"}, "handoff"),
])
def test_bad_disaggregation_keys_are_one_line_errors(cluster: dict, needle: str) -> None:
    data = {**BASE, "systems": [{"name": "pd", "scheduler": {"kind": "paged", "max_num_seqs": 4},
                                 "cluster": cluster}]}
    with pytest.raises(ScenarioError) as err:
        scenario_from_dict(data)
    assert "\n" not in str(err.value) and needle in str(err.value), str(err.value)


def test_a_pool_inheriting_a_request_level_scheduler_is_refused() -> None:
    """A pool without a scheduler of its own takes the system's: validate passed a
    request-level one, and the run failed in an assertion."""
    data = {**BASE, "systems": [{"name": "pd", "scheduler": {"kind": "request_level", "max_batch_size": 4},
                                 "cluster": {"prefill": {"count": 1}, "decode": {"count": 2}}}]}
    with pytest.raises(ScenarioError, match=r"^scenario: systems\[0\].cluster.prefill.scheduler.kind = "
                                            r"'request_level' \(from systems\[0\].scheduler, "):
        scenario_from_dict(data)


def test_a_decode_pool_that_could_admit_nothing_is_refused_up_front() -> None:
    """Orca reserves max_tokens (64) a request: a decode pool of 48 tokens admits none. A
    colocated group was refused so; the pool ran, and turned every request away after its
    prefill."""
    data = {**BASE, "systems": [{"name": "pd", "scheduler": {"kind": "iteration_level",
                                                             "max_batch_size": 4},
                                 "cluster": {"prefill": {"count": 1},
                                             "decode": {"count": 1, "kv_capacity_tokens": 48}}}]}
    data["workload"] = {**BASE["workload"], "max_tokens": 64}
    with pytest.raises(ScenarioError, match=r"systems\[0\].cluster.decode.kv_capacity_tokens = 48 "
                                            r"is below workload.max_tokens = 64"):
        scenario_from_dict(data)


@pytest.mark.parametrize(("pools", "named"), [
    ({"prefill": {"count": 1, "scheduler": {**PAGED, "max_num_batched_tokens": 8}},
      "decode": {"count": 1}}, "systems[0].cluster.prefill.scheduler.max_num_batched_tokens = 8"),
    ({"replicas": [{"count": 1}, {"count": 1, "kv_capacity_tokens": 6}]},  # the system's scheduler
     "systems[0].cluster.replicas[1]: scheduler.block_size_tokens = 4 does not divide "
     "kv_capacity_tokens = 6"),
    ({"replicas": [{"count": 1}, {"count": 1, "scheduler": {**PAGED, "max_num_batched_tokens": 8}}]},
     "systems[0].cluster.replicas[1].scheduler.max_num_batched_tokens = 8"),
])
def test_a_group_s_or_pool_s_refusal_names_its_own_keys(tmp_path, pools: dict,  # noqa: ANN001
                                                        named: str) -> None:
    """Each read 'systems[0].scheduler...', a key the file had right."""
    from orcasim.run import naming_system

    trace = _trace(tmp_path, [(0.0, 10, 5)])
    changes = _disagg(trace)
    changes["systems"] = [{"name": "pd", "scheduler": PAGED, "cluster": pools}]
    scenario = _scenario(changes)
    with pytest.raises(ScenarioError) as err, naming_system(scenario, scenario.systems[0]):
        run_scenario(scenario)
    assert str(err.value).startswith(named), str(err.value)


def test_a_link_s_transfer_time_by_hand() -> None:
    # bytes / bandwidth + latency, from the preset or the keys that override it.
    assert LinkConfig().transfer_s(3e9) == 5e-6 + 3e9 / 300e9  # NVLink 3, one way
    assert LinkConfig(kind="infiniband").transfer_s(5e9) == 5e-6 + 0.2
    assert LinkConfig(kind="ethernet").transfer_s(25e9) == 50e-6 + 2.0
    assert LinkConfig(kind="ethernet", bandwidth_bytes_per_s=1e9).transfer_s(3e9) == 50e-6 + 3.0
    assert LinkConfig(kind="ethernet", latency_s=0.0).transfer_s(25e9) == 2.0  # 0 overrides
    assert LinkConfig(latency_s=0.25).transfer_s(0.0) == 0.25


@pytest.mark.parametrize(("gpus", "one_way_bytes_per_s"), [
    (("a100-80gb", "a100-80gb"), 300e9),  # NVLink 3: 600 GB/s both ways
    (("h100-80gb", "h100-80gb"), 450e9),  # NVLink 4: 900 GB/s
    (("b200", "b200"), 900e9),  # NVLink 5: 1.8 TB/s
    (("mi300x", "mi300x"), 64e9),  # Infinity Fabric: one of 7 links of 64 GB/s a way
    (("h100-80gb", "a100-80gb"), 300e9),  # the slower end
])
def test_an_nvlink_moves_kv_at_the_gpus_own_nvlink_speed(
        tmp_path, gpus: tuple[str, str], one_way_bytes_per_s: float) -> None:  # noqa: ANN001
    """A 1,000-token prompt of Llama-2-7B (524,288,000 bytes) over `link: {kind: nvlink}`
    moves at one direction of the GPUs' own NVLink, the catalog's, as the roofline's sends
    use it: it moved at the A100's 300 GB/s on every GPU, 1.75 ms where H100s take 1.17 ms
    and MI300X's one 64 GB/s peer link 8.2 ms (a tester's finding)."""
    def pool(gpu: str) -> dict:
        return {"kv_capacity_tokens": 4000, "hardware": {"gpu": gpu}}

    changes = _disagg(_trace(tmp_path, [(0.0, 1000, 3)]), prefill=pool(gpus[0]),
                      decode=pool(gpus[1]), link={"kind": "nvlink"})
    changes.update({"model": "llama2-7b", "workload.max_tokens": 2048})
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    expected_s = 5e-6 + 1000 * 524_288 / one_way_bytes_per_s
    assert reqs["kv_transfer_s"][0] == pytest.approx(expected_s, rel=1e-12)


@pytest.mark.parametrize(("gpu", "one_way_bytes_per_s"), [
    ("a100-80gb", 25e9),  # DGX A100: 8 x 200 Gb/s HDR
    ("h100-80gb", 50e9),  # DGX H100: 8 x 400 Gb/s NDR
])
def test_an_infiniband_moves_kv_at_the_nodes_own_network_speed(
        tmp_path, gpu: str, one_way_bytes_per_s: float) -> None:  # noqa: ANN001
    """`link: {kind: infiniband}` is the node's scale-out network, a GPU's share, the
    catalog's (the roofline's cross-node sends use it): 1,000 tokens of Llama-2-7B took HDR's
    21 ms on H100s, whose NDR moves them in 10.5 (a tester's finding)."""
    pool = {"kv_capacity_tokens": 4000, "hardware": {"gpu": gpu}}
    changes = _disagg(_trace(tmp_path, [(0.0, 1000, 3)]), prefill=pool, decode=pool,
                      link={"kind": "infiniband"})
    changes.update({"model": "llama2-7b", "workload.max_tokens": 2048})
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    expected_s = 5e-6 + 1000 * 524_288 / one_way_bytes_per_s
    assert reqs["kv_transfer_s"][0] == pytest.approx(expected_s, rel=1e-12)


@pytest.mark.parametrize(("link", "said"), [
    ({"kind": "infiniband", "bandwidth_bytes_per_s": 1e9},
     r"cluster.link.kind = 'infiniband' sets only the latency \(5e-06 s\): bandwidth_bytes_per_s = "
     r"1e\+09 is given, in place of the kind's 5e\+10 B/s; expected one of the two \(or latency_s "
     r"with the bandwidth, the kind left out\)$"),
    ({"kind": "ethernet", "bandwidth_bytes_per_s": 1e9, "latency_s": 5e-6},
     r"cluster.link.kind = 'ethernet' is not used: bandwidth_bytes_per_s = 1e\+09 is given, and "
     r"latency_s = 5e-06; expected the kind left out$"),
])
def test_a_link_kind_whose_bandwidth_is_given_is_warned_of(tmp_path, link: dict, said: str) -> None:  # noqa: ANN001
    """A bandwidth given replaces the kind's preset: nvlink and infiniband differ only there
    (both 5 us), so changing one to the other beside a bandwidth changed nothing, without a
    word (disagg_vs_colocated.yaml, 200 requests, 1e10 B/s: kv_transfer_s_mean 0.06729 under
    both, ethernet 0.067323). The transfer is the bandwidth's and the latency's all the same."""
    pool = {"kv_capacity_tokens": 4000, "hardware": {"gpu": "h100-80gb"}}
    changes = _disagg(_trace(tmp_path, [(0.0, 1000, 3)]), prefill=pool, decode=pool, link=link)
    changes.update({"model": "llama2-7b", "workload.max_tokens": 2048})
    with pytest.warns(UserWarning, match=rf"^system pd: {said}") as caught:
        reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert len([w for w in caught if "cluster.link.kind" in str(w.message)]) == 1
    assert reqs["kv_transfer_s"][0] == pytest.approx(5e-6 + 1000 * 524_288 / 1e9, rel=1e-12)
    for quiet in ({"bandwidth_bytes_per_s": 1e9, "latency_s": 5e-6}, {"kind": "ethernet", "latency_s": 1e-3},
                  {"kind": "nvlink", "bandwidth_bytes_per_s": 1e9}):
        changes["systems"][0]["cluster"]["link"] = quiet
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*cluster.link.kind")
            run_scenario(_scenario(changes))


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_the_kv_of_the_prompt_moves_at_the_link_s_speed(tmp_path, mode: str) -> None:  # noqa: ANN001
    """OPT-13B keeps 40 layers x (K and V) x 5,120 x 2 bytes = 819,200 bytes a token. A
    prompt of 1,000 tokens over a 1 GB/s link with 0.5 s of latency moves in
    0.5 + 0.8192 s; its decodes start then."""
    trace = _trace(tmp_path, [(0.0, 1000, 3)])
    changes = _disagg(trace, mode=mode, link={"bandwidth_bytes_per_s": 1e9, "latency_s": 0.5})
    changes.update({"model": "opt-13b", "workload.max_tokens": 2048,
                    "kv_capacity_tokens": 4096})
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    transfer_s = 0.5 + 1000 * 819_200 / 1e9
    assert reqs["kv_transfer_s"].tolist() == [transfer_s]
    assert reqs["first_token_s"].tolist() == [1.0]
    assert reqs["finish_s"].tolist() == [1.0 + transfer_s + 2.0]


ORCA = {"kind": "iteration_level", "max_batch_size": 4}


@pytest.mark.parametrize("capacity_tokens", [9, 16])
def test_an_orca_prefill_instance_reserves_the_prompt_and_one_token(
    tmp_path, capacity_tokens: int,  # noqa: ANN001 - a pytest path
) -> None:
    """Prompts of 8: an Orca prefill instance reserves 9 tokens a request (the prompt and
    its one token there). A pool of 9 holds one at a time, exactly; so does a pool of 16
    (two would need 18): the second prompt runs [1, 2]."""
    trace = _trace(tmp_path, [(0.0, 8, 2), (0.0, 8, 2)])
    changes = _disagg(trace, prefill={"scheduler": ORCA, "kv_capacity_tokens": capacity_tokens})
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["first_token_s"].tolist() == [1.0, 2.0]
    assert not reqs["rejected"].any()


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_prompts_prefilled_together_reach_the_decode_router_in_batch_order(tmp_path, mode: str) -> None:  # noqa: ANN001
    """Two prompts prefilled in one Orca iteration [0, 1] finish together: round robin
    over two decode instances sends them, in batch order, to 0 and 1 (the fused Orca loop
    once told them last first: 1 and 0 in fast mode)."""
    trace = _trace(tmp_path, [(0.0, 4, 3), (0.0, 4, 3)])
    changes = _disagg(trace, prefill={"scheduler": ORCA}, decode={"count": 2}, mode=mode)
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["first_token_s"].tolist() == [1.0, 1.0]
    assert reqs["decode_replica"].tolist() == [0, 1]


@pytest.mark.parametrize("mode", ["fast", "reference"])
@pytest.mark.parametrize("handoff", ["push", "pull"])
@pytest.mark.parametrize("router", ["least_outstanding", "least_tokens"])
def test_the_decode_router_counts_what_it_routed_before_it_arrives(
        tmp_path, mode: str, handoff: str, router: str) -> None:  # noqa: ANN001
    """Request 0 (20 tokens) decodes on instance 0 from t = 3.5 s. Requests 1 to 3 (30
    tokens each) are prefilled one at a time (first tokens at t = 4, 5, 6 s) and their KV
    takes 2.5 s to move: each is routed while the one before is still on its way to
    instance 1, and must see it there (a request, 29 tokens left), as a colocated router
    sees its inbox. Pushed, all three went to instance 1, seen empty: [0, 1, 1, 1]."""
    trace = _trace(tmp_path, [(0.0, 4, 20), (3.0, 4, 30), (3.0, 4, 30), (3.0, 4, 30)])
    changes = _disagg(trace, prefill={"scheduler": {**PAGED, "max_num_seqs": 1}},
                      decode={"count": 2, "router": {"kind": router}},
                      link={"latency_s": 2.5}, mode=mode, handoff=handoff)
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["first_token_s"].tolist() == [1.0, 4.0, 5.0, 6.0]
    assert reqs["decode_replica"].tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_least_tokens_counts_a_routed_request_s_output_not_its_prompt_again(
        tmp_path, mode: str) -> None:  # noqa: ANN001
    """A (20 tokens) decodes on instance 0 from 3.5 s. B (a 40-token prompt, 3 tokens out)
    is routed to instance 1 at 4 s; its KV reaches it at 6.5. C, routed at 5, sees A's 18 or
    so tokens left on 0 and B's 2 on 1 (its prompt is done: prefilled elsewhere), so goes to
    1; counted as prompt + output, B's 43 sent C to 0."""
    trace = _trace(tmp_path, [(0.0, 4, 20), (3.0, 40, 3), (3.0, 4, 30)])
    changes = _disagg(trace, prefill={"scheduler": {**PAGED, "max_num_seqs": 1}},
                      decode={"count": 2, "router": {"kind": "least_tokens"}},
                      link={"latency_s": 2.5}, mode=mode)
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["first_token_s"].tolist() == [1.0, 4.0, 5.0]
    assert reqs["decode_replica"].tolist() == [0, 1, 1]


ALL_ROUTERS = ["random", "round_robin", "least_outstanding", "least_tokens", "least_kv",
               "power_of_two", "session", "prefix_affinity"]


@pytest.mark.parametrize("router", ALL_ROUTERS)
def test_every_router_routes_both_pools(router: str) -> None:
    """Each router, in both pools at once (two instances each): fast equals reference,
    every request is prefilled and decoded once, and the load routers read each pool's
    loads at the moment they route."""
    frames = requests_in_both_modes("pd", **{
        "seed": 3, "workload.num_requests": 60,
        "workload.arrival": {"kind": "poisson", "rate_per_s": 12.0},
        "systems": [{"name": "pd", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                     "cluster": {"prefill": {"count": 2, "router": {"kind": router}},
                                 "decode": {"count": 2, "router": {"kind": router}},
                                 "link": {"latency_s": 0.01}}}],
    })
    fast, reference = frames["fast"], frames["reference"]
    for column in ("first_token_s", "finish_s", "prefill_replica", "decode_replica",
                   "kv_transfer_s"):
        assert np.array_equal(fast[column], reference[column], equal_nan=True), column
    assert fast["finish_s"].notna().all()
    assert sorted(set(fast["prefill_replica"])) == [0, 1]
    assert sorted(set(fast.loc[fast["output_tokens"] > 1, "decode_replica"])) == [0, 1]


@pytest.mark.filterwarnings("ignore:pd.*can never fit")
def test_a_closed_loop_s_clients_send_again_when_a_request_ends_at_its_prefill() -> None:
    """Closed-loop clients behind a disaggregated cluster: a one-token request ends at its
    prefill (its only token is the prefill's) and one too long for the prefill pool is
    turned away there; either way its client thinks and sends again, so every request of
    the workload is sent, in fast and reference mode alike."""
    frames = requests_in_both_modes("pd", **{
        "seed": 5, "workload.num_requests": 80,
        "workload.arrival": {"kind": "closed_loop", "num_clients": 4,
                             "think_time": {"kind": "exponential", "mean_s": 0.5}},
        "workload.prompt_tokens": {"kind": "uniform", "low": 16, "high": 160},
        "workload.output_tokens": {"kind": "uniform", "low": 1, "high": 3},
        "workload.max_tokens": 200,
        "systems": [{"name": "pd", "scheduler": {"kind": "paged", "max_num_seqs": 8},
                     "cluster": {"prefill": {"count": 1, "kv_capacity_tokens": 128},
                                 "decode": {"count": 1}, "link": {"latency_s": 0.01}}}],
    })
    fast, reference = frames["fast"], frames["reference"]
    for column in ("arrival_s", "first_token_s", "finish_s"):
        assert np.array_equal(fast[column], reference[column], equal_nan=True), column
    assert len(fast) == 80 and fast["arrival_s"].notna().all()
    one_token = fast["output_tokens"] == 1
    assert one_token.any() and fast["rejected"].any()
    assert fast.loc[one_token & ~fast["rejected"], "decode_replica"].eq(-1).all()


def test_each_pool_prices_its_iterations_with_its_own_cost(tmp_path) -> None:  # noqa: ANN001
    """Prefill iterations of 2 s (the prefill pool's cost), decodes of 1 s (the scenario's):
    prefill [0, 2], KV moved by 2.5, decodes [2.5, 3.5] and [3.5, 4.5]."""
    trace = _trace(tmp_path, [(0.0, 4, 3)])
    changes = _disagg(trace, prefill={"cost": {"kind": "linear", "base_s": 2.0}})
    result = run_scenario(_scenario(changes)).systems["pd"]
    assert result.requests["first_token_s"].tolist() == [2.0]
    assert result.requests["finish_s"].tolist() == [4.5]
    assert result.requests["first_scheduled_s"].tolist() == [0.0]
    rows = result.iterations
    assert rows.index.tolist() == list(range(len(rows)))  # one frame over both pools
    assert rows.groupby("pool")["duration_s"].sum().to_dict() == {"prefill": 2.0, "decode": 2.0}


def test_each_pool_is_priced_at_its_own_tensor_parallelism() -> None:
    """A lone request: the TP-2 prefill instance takes what a colocated TP-2 replica takes
    to its first token, and the TP-1 decode instance's steps take what a TP-1 replica's do
    (the roofline, priced per pool's deployment)."""
    def hardware(tp: int) -> dict:
        return {"gpu": "a100-80gb", "tensor_parallel": tp}

    scheduler = {"kind": "paged", "max_num_seqs": 8}
    scenario = make_scenario(**{
        "workload.num_requests": 1, "workload.prompt_tokens": {"kind": "constant", "value": 512},
        "workload.output_tokens": {"kind": "constant", "value": 8}, "workload.max_tokens": 1024,
        "model": "opt-13b", "hardware": hardware(1), "cost": {"kind": "roofline"},
        "systems": [
            {"name": "pd", "scheduler": scheduler,
             "cluster": {"prefill": {"count": 1, "hardware": hardware(2)}, "decode": {"count": 1}}},
            {"name": "tp2", "scheduler": scheduler,
             "cluster": {"replicas": [{"count": 1, "hardware": hardware(2)}]}},
            {"name": "tp1", "scheduler": scheduler},
        ],
    })
    result = run_scenario(scenario).systems
    pd_, tp2, tp1 = (result[n].requests.iloc[0] for n in ("pd", "tp2", "tp1"))
    assert pd_["first_token_s"] == tp2["first_token_s"] < tp1["first_token_s"]
    decode_s = pd_["finish_s"] - pd_["first_token_s"] - pd_["kv_transfer_s"]
    assert decode_s == pytest.approx(tp1["finish_s"] - tp1["first_token_s"], rel=1e-12)
    assert pd_["kv_transfer_s"] == pytest.approx(5e-6 + 512 * 819_200 / 300e9, rel=1e-12)


def test_a_disaggregated_run_ends_at_its_last_event(tmp_path) -> None:  # noqa: ANN001
    # The by-hand case above: the last decode ends at 3.5 s, after the one-token request.
    from orcasim.disagg import build_disaggregated
    from orcasim.run import make_requests

    scenario = _scenario(_disagg(_trace(tmp_path, [(0.0, 4, 3), (0.0, 4, 1)])))
    run = build_disaggregated(scenario, scenario.systems[0], make_requests(scenario)).run()
    assert run.end_s == 3.5
    assert run.recorder.finish_s.tolist() == [3.5, 1.0] and len(run.rejected_ids) == 0


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_prefill_instance_s_prefix_cache_finds_what_the_prompts_share(tmp_path, mode: str) -> None:  # noqa: ANN001
    """Two prompts of the same 600 tokens (Mooncake hash_ids 5, 6), the second sent at 10 s,
    after the first's KV has moved away: its blocks stay cached on the prefill instance, so
    the second starts from (600 - 1) // 4 = 149 blocks (596 tokens) and computes 4. A
    third, sharing only the first 512-token block, hits 512 tokens."""
    path = tmp_path / "trace.jsonl"
    rows = [(0, 600, [5, 6]), (10_000, 600, [5, 6]), (20_000, 600, [5, 7])]
    path.write_text("".join(f'{{"timestamp": {t}, "input_length": {n}, "output_length": 2, '
                            f'"hash_ids": {ids}}}\n' for t, n, ids in rows))
    cache = {"scheduler": {**PAGED, "enable_prefix_caching": True}}
    changes = {**_disagg(str(path), prefill=cache, mode=mode), "workload.max_tokens": 1000,
               "kv_capacity_tokens": 4000}
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["cached_tokens"].tolist() == [0, 596, 512]
    assert reqs["prefill_saved_tokens"].tolist() == [0, 596, 512]
    assert reqs["decode_replica"].tolist() == [0, 0, 0]


def _shared_prefix_trace(tmp_path, seed: int, num_requests: int) -> str:  # noqa: ANN001
    """Mooncake records whose prompts start with 0 to 4 blocks of one of four prefixes."""
    rng = np.random.default_rng(seed)
    sent_ms = np.cumsum(rng.exponential(150.0, num_requests)).astype(int)
    lines = []
    for i, t in enumerate(sent_ms.tolist()):
        blocks, prefix, share = int(rng.integers(1, 5)), int(rng.integers(0, 4)), int(rng.integers(0, 5))
        ids = [100 * prefix + j for j in range(min(share, blocks))]
        ids += [10_000 + 10 * i + j for j in range(blocks - len(ids))]
        lines.append(f'{{"timestamp": {t}, "input_length": {512 * (blocks - 1) + int(rng.integers(1, 513))}, '
                     f'"output_length": {int(rng.integers(1, 40))}, "hash_ids": {ids}}}\n')
    path = tmp_path / f"shared{seed}.jsonl"
    path.write_text("".join(lines))
    return str(path)


@pytest.mark.parametrize(("seed", "prefill_kind", "router", "counts"), [
    (0, "paged", "prefix_affinity", (2, 1)), (1, "chunked", "least_kv", (2, 2)),
    (2, "chunked", "round_robin", (1, 2)),
])
def test_a_caching_prefill_pool_runs_as_reference_mode_does(
    tmp_path, seed: int, prefill_kind: str, router: str, counts: tuple[int, int],  # noqa: ANN001
) -> None:
    """Prefix caching on the prefill side (its pool runs the generic stepper, the decode
    pool the fused loop) over prompts that share prefixes: the same hits, replicas and
    timestamps in both modes."""
    prefill = {"kind": prefill_kind, "max_num_seqs": 16, "enable_prefix_caching": True,
               **({"max_num_batched_tokens": 4096} if prefill_kind == "paged" else {"chunk_size_tokens": 512})}
    frames = requests_in_both_modes("pd", **{
        "seed": seed, "workload.num_requests": None, "workload.prompt_tokens": None,
        "workload.output_tokens": None, "workload.max_tokens": 4096, "kv_capacity_tokens": 6000,
        "workload.arrival": {"kind": "trace", "path": _shared_prefix_trace(tmp_path, seed, 80)},
        "systems": [{"name": "pd", "scheduler": {"kind": "paged", "max_num_seqs": 16, "max_num_batched_tokens": 4096},
                     "cluster": {"prefill": {"count": counts[0], "router": {"kind": router}, "scheduler": prefill},
                                 "decode": {"count": counts[1]}, "link": {"latency_s": 0.01}}}],
    })
    fast, reference = frames["fast"], frames["reference"]
    assert fast["cached_tokens"].sum() > 0 and fast["finish_s"].notna().all()
    for column in ("first_token_s", "finish_s", "prefill_replica", "decode_replica", "cached_tokens"):
        assert np.array_equal(fast[column], reference[column], equal_nan=True), column


def test_the_prefill_view_of_the_arrivals_is_the_workloads_own() -> None:
    # The prefill pool reads the workload's arrivals through this view: every question is
    # the inner source's, and only a completion means something else (a prefill done).
    from orcasim.disagg import PrefillSource
    from orcasim.sources import ArrivalSource

    inner, done = ArrivalSource(np.array([1.0, 2.0, 2.0, 5.0])), []
    view = PrefillSource(inner, lambda ids, t: done.append((ids.tolist(), t)))
    assert view.times_until(2.0).tolist() == [1.0, 2.0, 2.0]
    assert list(view.take_until(2.0)) == [0, 1, 2]
    assert view.next_index == inner.next_index == 3
    assert view.times_until(4.9).tolist() == []
    assert view.times_until(5.0).tolist() == [5.0]
    view.on_finished([2, 0], 7.5)
    assert done == [([2, 0], 7.5)]


def test_transfers_in_flight_arrive_in_ready_order_with_ids_breaking_ties() -> None:
    from orcasim.disagg import BridgeSource
    from orcasim.sources import ArrivalSource

    delivered: list[tuple[int, float]] = []
    bridge = BridgeSource(4, ArrivalSource(np.zeros(4)), lambda r, t: delivered.append((r, t)),
                          lambda pulled, t: None, lambda ids, t: None)
    for ready_s, req_id in ((3.0, 2), (1.5, 3), (3.0, 0), (4.0, 1)):
        bridge.push(ready_s, req_id)
    assert bridge.times_until(3.0).tolist() == [1.5, 3.0, 3.0]
    assert bridge.times_until(1.4).size == 0
    assert bridge.times_until(1.4).dtype == np.float64
    assert bridge.next_index == 3 and bridge.next_time_s() == 1.5
    assert bridge.take_until(3.0) == [3, 0, 2]
    assert delivered == [(3, 1.5), (0, 3.0), (2, 3.0)]
    assert bridge.times_until(10.0).tolist() == [4.0]
    assert np.isnan(bridge.arrival_s[1]) and bridge.arrival_s[2] == 3.0


def test_the_shipped_conversations_on_a_disaggregated_cluster_run() -> None:
    """scenarios/cluster/disagg_conversations.yaml, cut to 20 conversations: both systems
    finish every one; the prefill instance's cache finds each turn's history."""
    from orcasim.scenario import load_scenario

    scenario = load_scenario("scenarios/cluster/disagg_conversations.yaml",
                             ["workload.arrival.num_sessions=20", "warmup_s=0"])
    result = run_scenario(scenario).systems
    for name in ("colocated-x2", "pd-1p1d"):
        assert result[name].summary["sessions_completed"] == 20.0, name
        assert result[name].requests["finish_s"].notna().all(), name
    pd_requests = result["pd-1p1d"].requests
    assert (pd_requests.groupby("session_id")["prefill_replica"].nunique() == 1).all()
    later_turns = pd_requests[pd_requests["session_step"] > 0]
    # At least the shared 1,000-token system prompt's full 16-token blocks: 992 tokens.
    assert (later_turns["cached_tokens"] >= 1000 // 16 * 16).all()


@pytest.mark.filterwarnings("ignore:.*can never fit")
@pytest.mark.parametrize("tight", ["prefill", "decode"])
def test_a_call_either_pool_turns_away_leaves_the_session_without_its_answer(tight: str) -> None:
    """One conversation of three turns (20 user tokens, 100-token answers). Turn 2 (a
    140-token prompt) can never fit the tight pool's 128 tokens of KV (decode: with its 100
    output tokens): it is turned away, so turn 3's prompt holds turn 1's history and the two
    messages only (20 + 100 + 20 + 20 = 160 tokens), as on one colocated instance (it was
    260 when a rejection counted as an answer), and is turned away too."""
    pools = {"prefill": {"count": 1}, "decode": {"count": 1}}
    pools[tight]["kv_capacity_tokens"] = 128
    frames = {}
    for mode in ("fast", "reference"):
        result = run_scenario(make_scenario(**{
            "workload": {"max_tokens": 400, "arrival": {
                "kind": "conversations", "num_sessions": 1, "concurrent_sessions": 1,
                "turns": {"kind": "constant", "value": 3},
                "user_tokens": {"kind": "constant", "value": 20},
                "output_tokens": {"kind": "constant", "value": 100},
                "think_time": {"kind": "constant", "value_s": 0.0}, "max_context_tokens": 300}},
            "kv_capacity_tokens": 1000, "engine.mode": mode,
            "systems": [{"name": "pd", "scheduler": {"kind": "paged", "max_num_seqs": 4},
                         "cluster": {**pools, "link": {"latency_s": 0.01}}}],
        })).systems["pd"]
        frames[mode] = result.requests
        assert result.sessions["rejected_calls"].tolist() == [2], mode
    assert frames["fast"]["prompt_tokens"].tolist() == [20, 140, 160]
    assert frames["fast"]["rejected"].tolist() == [False, True, True]
    for column in ("arrival_s", "first_token_s", "finish_s"):
        assert np.array_equal(frames["fast"][column], frames["reference"][column], equal_nan=True)


@pytest.mark.parametrize("caching", [True, False])
def test_kv_a_prefill_instance_holds_for_the_decode_side_is_kv_in_use(tmp_path, caching: bool) -> None:  # noqa: ANN001
    """KV held until it moves is in use: it was left out of kv_used_tokens, and with prefix
    caching each holder's share of the cached system prompt was subtracted all the same,
    down to -46,060 tokens on a pool of 5,000 (a tester's finding)."""
    f = tmp_path / "dg.yaml"
    f.write_text(
        "name: dg\nseed: 0\nworkload:\n  num_requests: 60\n  arrival: {kind: poisson, rate_per_s: 20}\n"
        "  prompt_tokens: {kind: constant, value: 20}\n  output_tokens: {kind: constant, value: 200}\n"
        "  max_tokens: 1024\n  system_prompt: {tokens: 320}\n"
        "cost: {kind: linear, base_s: 0.01, per_token_s: 1.0e-5, per_context_token_s: 0}\n"
        "kv_capacity_tokens: 5000\nsystems:\n  - name: pd\n    scheduler: {kind: paged, max_num_seqs: 4}\n"
        "    cluster:\n      prefill: {count: 1, scheduler: {kind: chunked, chunk_size_tokens: 512, "
        f"max_num_seqs: 64, enable_prefix_caching: {str(caching).lower()}}}}}\n"
        "      decode: {count: 1}\n      handoff: pull\n")
    iterations = run_scenario(f).systems["pd"].iterations
    prefill = iterations[iterations["pool"] == "prefill"]
    assert (prefill["kv_used_tokens"] >= 0).all()
    assert (prefill["kv_used_tokens"] <= prefill["kv_reserved_tokens"]).all()
    # Requests wait for the decode side (4 at a time), so the prefill side holds many: each
    # its own 20 tokens and, cached, one copy of the 320-token system prompt for all.
    assert prefill["kv_used_tokens"].max() > (320 + 10 * 20 if caching else 10 * 340)


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_pulled_handoff_includes_the_wait_behind_another_copy_by_hand(tmp_path, mode: str) -> None:  # noqa: ANN001
    """Both prompts prefilled in [0, 1] and admitted at 1, copies of 0.5 s one after another:
    A's KV lands at 1.5, B's at 2.0, so B's handoff is 1.0 s, as a push's includes its wait
    for the link. It read 0.5 s, the copy alone, and the 0.5 s B waited behind A's copy was
    in no column (a tester's finding)."""
    trace = _trace(tmp_path, [(0.0, 4, 4), (0.0, 4, 4)])
    reqs = run_scenario(_scenario(_disagg(trace, mode=mode, handoff="pull"))).systems["pd"].requests
    assert reqs["first_token_s"].tolist() == [1.0, 1.0]
    assert reqs["kv_transfer_s"].tolist() == [0.5, 1.0]


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_distserve_s_decode_instance_swaps_in_first_out_first(tmp_path, mode: str) -> None:  # noqa: ANN001
    """DistServe appends each swapped-out request to its swapped queue and swaps in from the
    front: request 2 (5 + 76 tokens), swapped out before request 1 (39 + 77), comes back
    first. Taken oldest id first (vLLM's order), the small request 2 waited behind request
    1, which could not fit, and finished at 1.34 s with two preemptions (a tester's finding,
    read from DistServe's get_next_batch); now request 1 waits behind it."""
    trace = _trace(tmp_path, [(0.0, 19, 38), (0.0, 39, 77), (0.0, 5, 76)])
    decode = {"kv_capacity_tokens": 128, "scheduler": {
        "kind": "paged", "policy": "distserve_decode", "max_num_seqs": 16,
        "max_num_batched_tokens": 2048, "preemption": "swap", "kv_bytes_per_token": 1}}
    changes = {**_disagg(trace, mode=mode, decode=decode, prefill={"kv_capacity_tokens": 4096},
                         link={"kind": "nvlink"}, handoff="pull"),
               "workload.max_tokens": 200, "kv_capacity_tokens": 128,
               "cost": {"kind": "linear", "base_s": 0.01}}
    changes["systems"][0]["scheduler"] = {"kind": "paged", "max_num_seqs": 16, "max_num_batched_tokens": 2048}
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["preemptions"].tolist() == [0, 2, 1]
    # Steps of 10 ms and the copies' few microseconds: request 2 ends 0.35 s before request 1.
    assert reqs["finish_s"].tolist() == pytest.approx([0.38, 1.30, 0.95], abs=1e-4)


def test_a_rejection_names_the_pool_s_instance(tmp_path) -> None:  # noqa: ANN001
    """Turned away by decode instance 0 behind one prefill instance: the warning said
    'replica 1', a number its `decode_replica` column and replicas.csv never use (a tester's
    note). The request of 8 + 8 tokens can never fit the decode instance's 12."""
    trace = _trace(tmp_path, [(0.0, 8, 8), (0.0, 4, 2)])
    scenario = _scenario(_disagg(trace, decode={"kv_capacity_tokens": 12}))
    with pytest.warns(UserWarning, match=r"pd: 1 request\(s\) can never fit in the KV memory of "
                      r"the instance the router sent them to \(decode instance 0: 1\)"):
        result = run_scenario(scenario).systems["pd"]
    assert result.requests["decode_replica"].tolist() == [0, 0]
    assert result.requests["rejected"].tolist() == [True, False]


@pytest.mark.parametrize("mode", ["fast", "reference"])
@pytest.mark.parametrize("handoff", ["push", "pull"])
def test_two_decode_instances_share_the_prefill_instance_s_link_by_hand(tmp_path, mode: str,  # noqa: ANN001
                                                                        handoff: str) -> None:
    """One prefill instance, two decode instances (round robin): both prompts prefilled in
    [0, 1], each KV 0.5 s of bytes on the link, no latency. The sender's link carries one copy
    at a time, pushed or pulled: A's KV lands at 1.5, B's at 2.0. Pulled, each decode
    instance copied at the sender's full bandwidth at once, and B's read 0.5 s, as if the
    prefill instance had two links (its copy's wait behind A's was in no column)."""
    trace = _trace(tmp_path, [(0.0, 4, 4), (0.0, 4, 4)])
    kv_bytes = 4 * 819_200  # OPT-13B's whole KV for 4 tokens (no hardware: one GPU's share)
    changes = _disagg(trace, mode=mode, handoff=handoff,
                      decode={"count": 2, "router": {"kind": "round_robin"}},
                      link={"latency_s": 0.0, "bandwidth_bytes_per_s": kv_bytes / 0.5})
    changes["model"] = "opt-13b"
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["decode_replica"].tolist() == [0, 1]
    assert reqs["kv_transfer_s"].tolist() == [0.5, 1.0]
    # Pushed, B arrives when its copy ends; pulled, B's first decode waits for its copy.
    assert reqs["finish_s"].tolist() == [4.5, 5.0]


@pytest.mark.parametrize("mode", ["fast", "reference"])
@pytest.mark.parametrize("handoff", ["push", "pull"])
def test_a_copy_takes_an_idle_stretch_of_its_link_by_hand(tmp_path, mode: str,  # noqa: ANN001
                                                          handoff: str) -> None:
    """Two prefill and two decode instances (round robin), all prefilled in [0, 1]; A (16
    tokens, 2 s of KV) from prefill 0 and D (4, 0.5 s) from prefill 1 go to decode 0, B (4)
    from prefill 1 to decode 1 (C's one token ends at its prefill). Pulled, decode 0 plans
    first: A on prefill 0's link [1, 3], D on prefill 1's [3, 3.5]; B, on decode 1 at 1,
    takes prefill 1's link while it is idle, [1, 1.5], as pushed. With one next-free time
    per link B waited until 3.5 behind D, placed earlier but later in time (kv_transfer_s
    3.0 s, finished at 6.0; a tester's finding). Pushed, B goes first on prefill 1's link and
    D waits for decode 0's, which A holds until 3 (2.5 s)."""
    trace = _trace(tmp_path, [(0.0, 16, 3), (0.0, 4, 3), (0.0, 4, 1), (0.0, 4, 3)])
    kv_bytes = 4 * 819_200  # OPT-13B's whole KV for 4 tokens (no hardware: one GPU's share)
    changes = _disagg(trace, mode=mode, handoff=handoff, prefill={"count": 2},
                      decode={"count": 2, "router": {"kind": "round_robin"}},
                      link={"latency_s": 0.0, "bandwidth_bytes_per_s": kv_bytes / 0.5})
    changes["model"] = "opt-13b"
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["prefill_replica"].tolist() == [0, 1, 0, 1]
    assert reqs["decode_replica"].tolist() == [0, 1, -1, 0]
    assert reqs["kv_transfer_s"].dropna().tolist() == [2.0, 0.5, 2.5]
    # B's two decodes after its copy: [1.5, 2.5] and [2.5, 3.5] (pulled, its first
    # iteration [1, 2.5] waits for the copy).
    assert reqs["finish_s"][1] == 3.5


@pytest.mark.filterwarnings("ignore:.*its own hardware changes only its KV capacity")
@pytest.mark.parametrize("handoff", ["push", "pull"])
def test_the_wider_instance_s_gpus_each_hold_their_shard_s_share_of_its_link_by_hand(  # noqa: ANN001
        tmp_path, handoff: str) -> None:
    """A tensor-parallel-4 prefill instance sends each of two tensor-parallel-1 decode
    instances a whole KV (0.5 s on one decode GPU's link), a quarter from each of its GPUs:
    its link is held at a quarter for each, so both copies go at once (0.5 s each). A copy
    held both links whole, for the largest shard's time: they went one after the other, 0.5
    then 1.0 s (the disaggregation tester's finding)."""
    trace = _trace(tmp_path, [(0.0, 4, 3), (0.0, 4, 3)])
    kv_bytes = 4 * 819_200  # OPT-13B's whole KV for 4 tokens: one decode GPU holds it all
    hardware = {"gpu": "a100-80gb", "tensor_parallel": 4}
    changes = _disagg(trace, handoff=handoff,
                      prefill={"hardware": hardware, "kv_capacity_tokens": 1000},
                      decode={"count": 2, "router": {"kind": "round_robin"},
                              "hardware": {**hardware, "tensor_parallel": 1},
                              "kv_capacity_tokens": 1000},
                      link={"latency_s": 0.0, "bandwidth_bytes_per_s": kv_bytes / 0.5})
    changes["model"] = "opt-13b"
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["decode_replica"].tolist() == [0, 1]
    assert reqs["kv_transfer_s"].tolist() == [0.5, 0.5]


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_push_takes_an_idle_stretch_before_one_that_waits_by_hand(tmp_path, mode: str) -> None:  # noqa: ANN001
    """Two prefill and two decode instances (round robin), 1 s iterations, 0.5 s of KV per 4
    tokens. A (16 tokens) from prefill 0 holds decode 0's link [1, 3]; X from prefill 1 goes
    to decode 1 [1, 1.5]. B and W are prefilled together on prefill 1 in [1, 2] (Y and Z, one
    token each, end at prefill 0): B goes to decode 0 and waits for A's copy, [3, 3.5] on
    prefill 1's link; W goes to decode 1, whose link is free, and takes prefill 1's while it
    is idle, [2, 2.5]. With one next-free time per link W waited behind B until 3.5 (2.0 s)."""
    rows = [(0.0, 16, 3), (0.0, 4, 3), (0.5, 4, 1), (0.5, 4, 3), (0.5, 4, 1), (0.5, 4, 3)]
    trace = _trace(tmp_path, rows)
    kv_bytes = 4 * 819_200  # OPT-13B's whole KV for 4 tokens (no hardware: one GPU's share)
    changes = _disagg(trace, mode=mode, handoff="push", prefill={"count": 2},
                      decode={"count": 2, "router": {"kind": "round_robin"}},
                      link={"latency_s": 0.0, "bandwidth_bytes_per_s": kv_bytes / 0.5})
    changes["model"] = "opt-13b"
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["prefill_replica"].tolist() == [0, 1, 0, 1, 0, 1]
    assert reqs["decode_replica"].tolist() == [0, 1, -1, 0, -1, 1]
    assert reqs["kv_transfer_s"].dropna().tolist() == [2.0, 0.5, 1.5, 0.5]


SHARES = st.sampled_from([1.0, 0.5, 0.25, 1 / 3])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.dictionaries(st.integers(0, 3), SHARES, min_size=1, max_size=2),
                          st.floats(0.0, 2.0), st.floats(0.0, 3.0), st.floats(0.0, 1.5)),
                min_size=1, max_size=25))
def test_a_link_schedule_places_each_copy_in_the_earliest_free_stretch(copies) -> None:  # noqa: ANN001
    """Copies placed in the clock's order (`now` never goes back; each ready at or after it),
    each holding a share of one or two links: no link is ever held past its bandwidth, none
    starts before it is ready, and each starts at the earliest time its links all have its
    share free (no earlier candidate, its ready time or the end of a copy in the way, would
    do). Whole shares: no link holds two copies at once."""
    from orcasim.disagg import SHARE_TOL, LinkSchedule

    links, placed, now_s = LinkSchedule(4), [], 0.0
    for holds, step_s, wait_s, busy_s in copies:
        now_s += step_s
        ready_s = now_s + wait_s
        start_s = links.place(tuple(holds.items()), now_s, ready_s, busy_s)
        assert start_s >= ready_s

        def fits(t: float, holds=holds, busy_s=busy_s, placed=placed) -> bool:  # noqa: ANN001
            for k, share in holds.items():
                over = [(a, b, f) for j, a, b, f in placed if j == k and a < t + busy_s and t < b]
                for p in [t] + [a for a, _, _ in over if a > t]:
                    if share + sum(f for a, b, f in over if a <= p < b) > 1.0 + SHARE_TOL:
                        return False
            return True

        assert fits(start_s)
        earlier = [ready_s] + [b for k, _, b, _ in placed if k in holds and ready_s <= b < start_s]
        assert not any(fits(t) for t in earlier if t < start_s)
        placed = placed + [(k, start_s, start_s + busy_s, share) for k, share in holds.items()]


@pytest.mark.filterwarnings("ignore:.*its own hardware changes only its KV capacity")
@pytest.mark.parametrize("handoff", ["push", "pull"])
def test_a_data_parallel_attention_instance_s_groups_each_have_their_links_by_hand(
        tmp_path, handoff: str) -> None:  # noqa: ANN001
    """Mixtral under data-parallel attention (2 groups of one GPU) on both sides: a request's
    KV lives in one group, so a copy holds a group's links, half the instance's. One prefill
    instance sends two decode instances 0.5 s of KV each, at once; as one link, the instance
    sent them one after the other (0.5 then 1.0 s)."""
    trace = _trace(tmp_path, [(0.0, 4, 3), (0.0, 4, 3)])
    kv_bytes = 4 * 131_072  # Mixtral's whole KV for 4 tokens: one GPU holds it all
    hardware = {"gpu": "h100-80gb", "data_parallel_attention": 2, "expert_parallel": 2}
    pool = {"hardware": hardware, "kv_capacity_tokens": 2000}
    changes = _disagg(trace, handoff=handoff, prefill=pool,
                      decode={**pool, "count": 2, "router": {"kind": "round_robin"}},
                      link={"latency_s": 0.0, "bandwidth_bytes_per_s": kv_bytes / 0.5})
    changes["model"] = "mixtral-8x7b"
    reqs = run_scenario(_scenario(changes)).systems["pd"].requests
    assert reqs["decode_replica"].tolist() == [0, 1]
    assert reqs["kv_transfer_s"].tolist() == [0.5, 0.5]


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_prefill_instance_s_preemption_with_nothing_left_to_run_is_counted(tmp_path, mode: str) -> None:  # noqa: ANN001
    """A prefill instance of 6 one-token blocks, chunks of 2; a link of 1 s a token. A
    (prompt 4) prefills over [0, 2] and its 4 blocks are held until its copy ends at 6. B
    takes a chunk (2 blocks) at 2; at 3 it needs 2 more, none is free, and it preempts
    itself: nothing runs until 6, when it recomputes its 2 tokens and goes on (first token
    at 8). The step that preempted B ran nothing, so no iteration row carried its count:
    the summary said 0 preemptions beside 2 recomputed tokens and B's own 1 (a tester's
    finding). Now the next iteration that runs records it."""
    trace = _trace(tmp_path, [(0.0, 4, 2), (0.0, 4, 2)])
    chunked = {"kind": "chunked", "chunk_size_tokens": 2, "max_num_seqs": 2,
               "block_size_tokens": 1, "watermark": 0.0}
    changes = _disagg(trace, mode=mode, link={"bandwidth_bytes_per_s": 819200.0, "latency_s": 0.0})
    changes.update({"kv_capacity_tokens": 6, "model": "opt-13b"})  # 819,200 bytes a token
    changes["systems"][0]["scheduler"] = chunked
    result = run_scenario(_scenario(changes)).systems["pd"]
    reqs = result.requests
    assert reqs["first_token_s"].tolist() == [2.0, 8.0]
    assert reqs["preemptions"].tolist() == [0, 1]
    assert result.summary["preemptions"] == 1.0 and result.summary["recomputed_tokens"] == 2.0
    assert result.replicas["preemptions"].tolist() == [1.0, 0.0]  # the prefill instance's
    assert result.iterations["preemptions"].sum() == 1


def test_a_pool_s_rows_say_what_each_instance_runs(tmp_path) -> None:  # noqa: ANN001
    """replicas.csv of a disaggregated cluster: each instance's row starts with its pool and
    number, then what it runs (the decode pool's own scheduler and KV here)."""
    trace = _trace(tmp_path, [(0.0, 4, 2), (0.5, 4, 2)])
    changes = _disagg(trace, decode={"count": 2, "kv_capacity_tokens": 500,
                                     "scheduler": {"kind": "iteration_level", "max_batch_size": 4}})
    result = run_scenario(_scenario(changes)).systems["pd"]
    about = result.replicas.reset_index()[["pool", "replica", "scheduler", "kv_capacity_tokens",
                                           "tensor_parallel"]]
    assert about.values.tolist() == [["prefill", 0, "paged (mixed)", 1000, 1],
                                     ["decode", 0, "iteration_level", 500, 1],
                                     ["decode", 1, "iteration_level", 500, 1]]
