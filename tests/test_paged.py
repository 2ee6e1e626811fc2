"""The paged (vLLM) scheduler, driven in plain Python with hand-made steps."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_driver import (
    assert_paged_end_state,
    check_paged_step,
    drive,
    make_requests,
    planned_tokens,
)

from orcasim.config import ScenarioError
from orcasim.run import run_scenario
from orcasim.scenario import scenario_from_dict
from orcasim.schedulers.base import STEP_BY_STEP
from orcasim.schedulers.chunked import ChunkedConfig, ChunkedScheduler
from orcasim.schedulers.paged import PagedConfig, PagedScheduler, num_blocks_for_capacity
from orcasim.schedulers.prefill_first import PrefillFirstScheduler
from tests.conftest import examples

EXAMPLES = 60


def _paged(reqs, capacity: int, **kw) -> PagedScheduler:
    cfg = PagedConfig.model_validate({"kind": "paged", "watermark": 0.0, **kw})
    return PagedScheduler(cfg, reqs, capacity)


def test_recompute_preempts_the_newest_and_redoes_prompt_plus_generated():
    # 4 blocks of 2 tokens. A = 0 (prompt 3, 4 outputs), B = 1 (prompt 2, 4 outputs).
    reqs = make_requests([3, 2], [4, 4])
    sched = _paged(reqs, capacity=8, block_size_tokens=2)
    trace = drive(sched, reqs, check_paged_step)
    # Step 2: A needs a third block, none is free, so B (newest) loses its KV; after A
    # finishes, B recomputes prompt 2 + generated 2 = 4 tokens at once.
    assert planned_tokens(trace) == [{0: 3, 1: 2}, {0: 1, 1: 1}, {0: 1}, {0: 1}, {1: 4}, {1: 1}]
    assert [p.preemptions for p in trace.plans] == [0, 0, 1, 0, 0, 0]
    assert [p.recomputed_tokens for p in trace.plans] == [0, 0, 0, 0, 3, 0]
    assert trace.first_token_step == {0: 0, 1: 0}
    assert trace.finish_step == {0: 3, 1: 5}
    assert sched.preemptions_per_request.tolist() == [0, 1]
    assert_paged_end_state(sched, reqs, trace)


def test_swap_keeps_kv_and_charges_pcie_copies():
    reqs = make_requests([3, 2], [4, 4])
    # One byte per token at one byte per second: a block of 2 tokens costs 2 s to copy.
    sched = _paged(reqs, capacity=8, block_size_tokens=2, preemption="swap",
                   swap_space_bytes=100, kv_bytes_per_token=1, swap_bandwidth_bytes_per_s=1.0)
    trace = drive(sched, reqs, check_paged_step)
    assert planned_tokens(trace) == [{0: 3, 1: 2}, {0: 1, 1: 1}, {0: 1}, {0: 1}, {1: 1}, {1: 1}]
    # Out at step 2 and back in at step 4: B's 2 blocks, 4 tokens, each way.
    assert [p.copy_time_s for p in trace.plans] == [0.0, 0.0, 4.0, 0.0, 4.0, 0.0]
    assert sched.recomputed_tokens_total == 0
    assert_paged_end_state(sched, reqs, trace)


def test_swap_accounting_across_several_victims_in_one_step():
    """Blocks of 2 tokens, 4 of them. A (prompt 3, 3 outputs) holds 2 blocks, B and C (prompt
    1, 4 outputs each) one each. At step 2 A needs a third block: C (newest) is swapped out,
    then B needs its second block and, with nobody newer left, goes out itself. Both come
    back, oldest first, when A has finished; every copy is 2 tokens x 1 byte at 1 byte/s."""
    reqs = make_requests([3, 1, 1], [3, 4, 4])
    sched = _paged(reqs, capacity=8, block_size_tokens=2, preemption="swap",
                   swap_space_bytes=100, kv_bytes_per_token=1, swap_bandwidth_bytes_per_s=1.0)
    held: list[tuple[int, list[int], list[int]]] = []

    def check(s, out) -> None:
        check_paged_step(s, out)
        held.append((s.swapped_blocks, s.cpu_blocks.tolist(), sorted(s.swapped)))

    trace = drive(sched, reqs, check)
    assert planned_tokens(trace) == [{0: 3, 1: 1, 2: 1}, {0: 1, 1: 1, 2: 1}, {0: 1},
                                     {1: 1, 2: 1}, {1: 1, 2: 1}]
    assert [p.preemptions for p in trace.plans] == [0, 0, 2, 0, 0]
    assert [p.copy_time_s for p in trace.plans] == [0.0, 0.0, 4.0, 4.0, 0.0]  # out 2 blocks, in 2
    assert held[2] == (2, [0, 1, 1], [1, 2])  # after step 2's plan: both victims on the CPU
    assert held[3] == (0, [0, 0, 0], [])  # step 3 brought both back
    assert sched.preemptions_per_request.tolist() == [0, 1, 1]
    assert sched.recomputed_tokens_total == 0
    assert_paged_end_state(sched, reqs, trace)


def test_swap_falls_back_to_recompute_when_cpu_space_is_full():
    reqs = make_requests([3, 2], [4, 4])
    sched = _paged(reqs, capacity=8, block_size_tokens=2, preemption="swap",
                   swap_space_bytes=3, kv_bytes_per_token=1)  # room for 1 block; B holds 2
    trace = drive(sched, reqs, check_paged_step)
    assert sched.swap_capacity_blocks == 1 and sched.recomputed_tokens_total == 3
    assert_paged_end_state(sched, reqs, trace)



@pytest.mark.parametrize(("swap_blocks", "swapped"), [(2, True), (1, False)])
def test_swap_space_may_fill_exactly(swap_blocks: int, swapped: bool):
    """The victim B holds 2 blocks: CPU space for exactly 2 takes it (and a copy of 4
    tokens x 3 bytes at 2 bytes/s costs 6 s each way); space for 1 falls back to recompute."""
    reqs = make_requests([3, 2], [4, 4])
    sched = _paged(reqs, capacity=8, block_size_tokens=2, preemption="swap",
                   swap_space_bytes=swap_blocks * 2 * 3, kv_bytes_per_token=3,
                   swap_bandwidth_bytes_per_s=2.0)
    trace = drive(sched, reqs, check_paged_step)
    assert sched.swap_capacity_blocks == swap_blocks
    copies = [p.copy_time_s for p in trace.plans]
    assert copies == ([0.0, 0.0, 6.0, 0.0, 6.0, 0.0] if swapped else [0.0] * 6)
    assert sched.recomputed_tokens_total == (0 if swapped else 3)
    assert_paged_end_state(sched, reqs, trace)


def test_watermark_holds_back_admission_but_not_a_lone_request():
    reqs = make_requests([10, 8], [5, 1])
    held = _paged(reqs, capacity=20, block_size_tokens=1, watermark=0.25)  # 5 blocks kept free
    free = _paged(reqs, capacity=20, block_size_tokens=1, watermark=0.0)
    for s in (held, free):
        s.add_request(0)
        s.add_request(1)
    assert held.schedule(0.0).req_ids.tolist() == [0]
    assert free.schedule(0.0).req_ids.tolist() == [0, 1]
    lone = _paged(make_requests([19], [2]), capacity=20, block_size_tokens=1, watermark=0.5)
    lone.add_request(0)
    assert lone.schedule(0.0).req_ids.tolist() == [0]


def test_budget_and_max_num_seqs_limit_each_step():
    reqs = make_requests([4] * 6, [3] * 6)
    sched = _paged(reqs, capacity=1024, max_num_seqs=4, max_num_batched_tokens=10)
    trace = drive(sched, reqs, check_paged_step)
    assert planned_tokens(trace)[0] == {0: 4, 1: 4}  # a third prompt would exceed 10 tokens
    assert max(len(s) for s in planned_tokens(trace)) == 4
    assert_paged_end_state(sched, reqs, trace)



@pytest.mark.parametrize(("second_prompt", "joins"), [(5, True), (6, False)])
def test_an_admission_may_leave_exactly_the_watermark_free(second_prompt: int, joins: bool):
    """20 blocks of a token, 5 kept free: with 10 taken, a 5-token prompt leaves exactly 5."""
    reqs = make_requests([10, second_prompt], [5, 1])
    sched = _paged(reqs, capacity=20, block_size_tokens=1, watermark=0.25)
    sched.add_request(0)
    sched.add_request(1)
    assert sched.schedule(0.0).req_ids.tolist() == ([0, 1] if joins else [0])


@pytest.mark.parametrize(("second_prompt", "joins"), [(4, True), (5, False)])
def test_prompts_may_fill_the_token_budget_exactly(second_prompt: int, joins: bool):
    reqs = make_requests([4, second_prompt], [2, 2])
    sched = _paged(reqs, capacity=64, max_num_batched_tokens=8, max_num_seqs=8)
    sched.add_request(0)
    sched.add_request(1)
    assert sched.schedule(0.0).num_new_tokens.tolist() == ([4, second_prompt] if joins else [4])



def test_a_pool_may_lose_exactly_one_percent_to_whole_blocks():
    """1,600 tokens in blocks of 48: 33 blocks and 16 tokens (1%) unused, accepted; 1,601
    would lose 17 (over 1%), an error naming the key."""
    assert num_blocks_for_capacity(1600, 48) == 33
    with pytest.raises(ScenarioError, match="block_size_tokens = 48 does not divide"):
        num_blocks_for_capacity(1601, 48)


def test_swap_without_the_bytes_of_a_token_is_an_error_naming_what_to_give():
    reqs = make_requests([3, 2], [4, 4])
    cfg = PagedConfig(kind="paged", preemption="swap")
    with pytest.raises(ScenarioError, match=r"scheduler.preemption = 'swap' needs the bytes of "
                       r"a token's KV: give scheduler.kv_bytes_per_token, or the scenario keys "
                       r"'model' and 'hardware'"):
        PagedScheduler(cfg, reqs, 64)
    assert PagedScheduler(PagedConfig(kind="paged"), reqs, 64).swap_capacity_blocks == 0


def test_block_size_that_does_not_divide_capacity_is_an_error():
    with pytest.raises(ValueError, match=r"block_size_tokens = 16 does not divide "
                                         r"kv_capacity_tokens = 100 \(whole blocks would lose 4 "
                                         r"tokens\); expected .* 96 or 112"):
        _paged(make_requests([4], [4]), capacity=100)
    with pytest.raises(ValueError, match="at least 16"):
        _paged(make_requests([4], [4]), capacity=8)
    # A derived capacity loses a sliver (12 of 15,004 tokens) to whole blocks: accepted.
    assert _paged(make_requests([4], [4]), capacity=15_004).allocator.num_blocks == 937


def test_budget_below_the_longest_prefill_is_an_error():
    with pytest.raises(ValueError, match=r"^scheduler.max_num_batched_tokens = 64 is below request 1's "
                                         r"prompt \+ output - 1 = 109 tokens, which it must prefill in one "
                                         r"step without chunking; expected >= 109 \(or use kind: chunked\)$"):
        _paged(make_requests([10, 100], [5, 10]), capacity=1024, max_num_batched_tokens=64,
               max_num_seqs=64)


def test_a_request_that_never_fits_is_rejected_not_hung():
    reqs = make_requests([10, 200, 10], [5, 5, 5])  # request 1 needs 204 tokens of KV
    sched = _paged(reqs, capacity=128, max_num_batched_tokens=32, max_num_seqs=32)
    trace = drive(sched, reqs, check_paged_step)
    assert sched.rejected_ids == [1]
    assert_paged_end_state(sched, reqs, trace)


def test_rejections_are_counted_in_the_summary():
    data = {
        "name": "tiny", "seed": 0, "kv_capacity_tokens": 256,
        "workload": {"num_requests": 50, "arrival": {"kind": "poisson", "rate_per_s": 5.0},
                     "prompt_tokens": {"kind": "uniform", "low": 1, "high": 400},
                     "output_tokens": {"kind": "constant", "value": 8}, "max_tokens": 408},
        "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4},
        "systems": [{"name": "vllm", "scheduler": {"kind": "paged", "max_num_batched_tokens": 512}}],
    }
    scenario = scenario_from_dict(data)
    with pytest.warns(UserWarning, match="can never fit in KV memory"):
        result = run_scenario(scenario)
    res = result.systems["vllm"]
    expected = int((res.requests["prompt_tokens"] + 8 - 1 > 256).sum())
    assert expected > 0
    assert res.summary["requests_rejected"] == expected
    assert res.summary["requests_completed"] == 50 - expected
    assert int(res.requests["rejected"].sum()) == expected


@st.composite
def paged_cases(draw, chunked: bool = False):
    n = draw(st.integers(1, 20))
    prompts = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    arrivals = sorted(draw(st.lists(st.integers(0, 30), min_size=n, max_size=n)))
    block = draw(st.sampled_from([1, 2, 4, 8]))
    blocks = draw(st.integers(2, 30))
    cfg = {
        "block_size_tokens": block,
        "max_num_seqs": draw(st.integers(1, 6)),
        "preemption": draw(st.sampled_from(["recompute", "swap"])),
        "watermark": draw(st.sampled_from([0.0, 0.05, 0.2])),
        "swap_space_bytes": draw(st.integers(0, 12)) * block,
        "kv_bytes_per_token": 1,
    }
    reqs = make_requests(prompts, outputs, [float(a) for a in arrivals])
    if chunked:
        cfg["chunk_size_tokens"] = draw(st.integers(1, 48))
    else:
        cfg["max_num_batched_tokens"] = int((reqs.total_tokens - 1).max()) + draw(st.integers(0, 30))
    return reqs, block * blocks, cfg


@given(paged_cases())
@settings(max_examples=examples(EXAMPLES * 2), deadline=None)
def test_paged_invariants_hold_and_every_request_completes(case):
    reqs, capacity, cfg = case
    sched = _paged(reqs, capacity, **cfg)
    trace = drive(sched, reqs, check_paged_step)
    assert_paged_end_state(sched, reqs, trace)
    fits = [i for i in range(len(reqs)) if i not in set(sched.rejected_ids)]
    assert np.all(reqs.total_tokens[sched.rejected_ids] - 1 > capacity)
    assert np.all(reqs.total_tokens[fits] - 1 <= capacity)


ISSUE_SYSTEMS_YAML = """
- {name: orca-pow2, scheduler: {kind: iteration_level, max_batch_size: 128, kv_reservation: pow2}}
- {name: vllm, scheduler: {kind: paged, max_num_seqs: 256, max_num_batched_tokens: 4096, block_size_tokens: 16, preemption: recompute, watermark: 0.01}}
- {name: sarathi, scheduler: {kind: chunked, max_num_seqs: 256, block_size_tokens: 16, chunk_size_tokens: 512, preemption: recompute}}
"""


def test_memory_schedulers_are_selectable_in_yaml_and_run():
    import yaml

    data = {
        "name": "yaml", "seed": 2, "kv_capacity_tokens": 2048,
        "workload": {"num_requests": 40, "arrival": {"kind": "poisson", "rate_per_s": 20.0},
                     "prompt_tokens": {"kind": "uniform", "low": 16, "high": 300},
                     "output_tokens": {"kind": "uniform", "low": 1, "high": 200}, "max_tokens": 500},
        "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4},
        "systems": yaml.safe_load(ISSUE_SYSTEMS_YAML),
    }
    result = run_scenario(scenario_from_dict(data))
    summary = result.summary_frame()
    assert summary["requests_completed"].tolist() == [40.0, 40.0, 40.0]
    assert (summary["kv_utilization_mean"] <= 1.0).all()
    for res in result.systems.values():  # per-request counts add up to the per-step ones
        assert res.requests["preemptions"].sum() == res.summary["preemptions"]
    assert summary.loc["vllm", "preemptions"] > 0  # 2,048 tokens of KV: this load must evict


def test_unknown_reservation_policy_is_a_one_line_error():
    from orcasim.config import ScenarioError

    data = {
        "name": "bad", "kv_capacity_tokens": 2048,
        "workload": {"num_requests": 1, "arrival": {"kind": "constant", "rate_per_s": 1.0},
                     "prompt_tokens": {"kind": "constant", "value": 1},
                     "output_tokens": {"kind": "constant", "value": 1}, "max_tokens": 2},
        "cost": {"kind": "linear", "base_s": 0.01},
        "systems": [{"name": "o", "scheduler": {"kind": "iteration_level", "max_batch_size": 4,
                                                "kv_reservation": "pow3"}}],
    }
    with pytest.raises(ScenarioError, match=r"kv_reservation = 'pow3'.*'max', 'pow2' or 'oracle'"):
        scenario_from_dict(data)


@pytest.mark.parametrize("override,message", [
    ("systems[3].scheduler.block_size_tokens=4096", "block_size_tokens = 4096 does not divide"),
    ("systems[3].scheduler.max_num_batched_tokens=1024", "max_num_batched_tokens = 1024 is below"),
])
def test_memory_settings_are_checked_by_validate(override: str, message: str) -> None:
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "orcasim.cli", "validate", "scenarios/memory/opt13b_a100_sharegpt.yaml",
         "--set", override], capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def _loop_only(cls: type[PagedScheduler]) -> type[PagedScheduler]:
    """`cls` with `_schedule_running`'s per-request loop alone (no `_decode_all`)."""

    class LoopOnly(cls):  # type: ignore[valid-type, misc]
        fast_forward = STEP_BY_STEP

        def _decode_all(self, plan) -> bool:  # type: ignore[no-untyped-def]
            return False

    return LoopOnly


def _steps(sched: PagedScheduler, reqs) -> list[tuple]:
    """Every plan and the KV state after it: what `schedule` decided, block by block."""
    seen: list[tuple] = []

    def look(s, out) -> None:  # type: ignore[no-untyped-def]
        tables = tuple(sorted((r, tuple(t)) for r, t in s.allocator.tables.items()))
        seen.append((out.req_ids.tolist(), out.num_new_tokens.tolist(), out.preemptions,
                     out.recomputed_tokens, out.copy_time_s, out.kv_reserved_tokens,
                     out.kv_used_tokens, s.allocator.free_pool(), tables, list(s.running)))

    drive(sched, reqs, look)
    return seen


@given(paged_cases(), st.sampled_from(["paged", "prefill_first", "chunked"]), st.integers(1, 12))
@settings(max_examples=examples(EXAMPLES * 2), deadline=None)
def test_decoding_everyone_at_once_plans_what_the_loop_plans(case, kind: str, chunk: int) -> None:
    """`_decode_all` is a shortcut of the per-request loop: the same plans, preemptions and
    blocks at every step, for every paged policy (reference mode runs it too, so the
    fast-against-reference tests cannot see a difference between the two)."""
    reqs, capacity, cfg = case
    if kind == "chunked":
        cfg = {**{k: v for k, v in cfg.items() if k != "max_num_batched_tokens"},
               "kind": "chunked", "chunk_size_tokens": chunk}
        config = ChunkedConfig.model_validate(cfg)
        classes: tuple[type[PagedScheduler], ...] = (ChunkedScheduler, _loop_only(ChunkedScheduler))
    else:
        config = PagedConfig.model_validate({
            **cfg, "kind": "paged", "policy": "mixed" if kind == "paged" else "prefill_first",
            "max_num_batched_tokens": max(cfg["max_num_batched_tokens"], cfg["max_num_seqs"])})
        cls = PagedScheduler if kind == "paged" else PrefillFirstScheduler
        classes = (cls, _loop_only(cls))
    shortcut, loop = (_steps(c(config, reqs, capacity), reqs) for c in classes)  # type: ignore[arg-type]
    assert shortcut == loop



@pytest.mark.parametrize(("policy", "watermark"), [("mixed", 0.0), ("prefill_first", 0.01),
                                                   ("distserve_decode", 0.0)])
def test_each_policy_keeps_its_engines_watermark_unless_given(policy: str, watermark: float) -> None:
    """vLLM v1's allocate_slots keeps no blocks back (v0.8.5; a later argument defaults to
    0), vLLM v0's BlockSpaceManager 1%, DistServe's decode instance none; a given one holds.
    A tester's case: 100 blocks, A and B needing 50 each for life; under v1 both start at
    once, and the v0 default kept 1% back, so B waited for A to finish."""
    assert PagedConfig(kind="paged", policy=policy).watermark_fraction() == watermark
    assert PagedConfig(kind="paged", policy=policy, watermark=0.2).watermark_fraction() == 0.2
    reqs = make_requests([792, 790], [8, 4])
    trace = drive(PagedScheduler(PagedConfig(kind="paged", max_num_batched_tokens=2048), reqs, 1600), reqs)
    assert trace.first_token_step == {0: 0, 1: 0}


def test_a_policy_set_after_loading_gets_its_own_watermark(tmp_path) -> None:  # noqa: ANN001
    """The default was written into the config when it was read: a sweep over the policy,
    or an override of a saved scenario, gave prefill_first the mixed policy's 0 (a
    reviewer's find). It is resolved where the scheduler is built."""
    from orcasim.scenario import load_scenario, scenario_from_dict
    from tests.conftest import make_scenario

    sc = make_scenario(**{"systems": [{"name": "v", "scheduler": {"kind": "paged"}}]})
    saved = sc.model_dump(mode="json", exclude_none=True)  # as results/<run>/scenario.yaml
    assert "watermark" not in saved["systems"][0]["scheduler"]
    saved["systems"][0]["scheduler"]["policy"] = "prefill_first"
    assert scenario_from_dict(saved).systems[0].scheduler.watermark_fraction() == 0.01
    path = tmp_path / "s.yaml"
    import yaml
    path.write_text(yaml.safe_dump(saved))
    from orcasim.sweeps.spec import scenario_sweep

    swept = load_scenario(path, ["sweep={parameter: 'systems[0].scheduler.policy', "
                                 "values: [mixed, prefill_first]}"])
    points = [t.scenario().systems[0].scheduler for t in scenario_sweep(swept, tmp_path).tasks()]
    assert [(c.policy, c.watermark_fraction()) for c in points] == [("mixed", 0.0),
                                                                    ("prefill_first", 0.01)]



@pytest.mark.parametrize("policy", ["mixed", "prefill_first"])
def test_a_token_budget_below_max_num_seqs_is_refused_as_vllm_refuses_it(policy: str) -> None:
    """vLLM's SchedulerConfig._verify_args (v0 and v1): max_num_batched_tokens >= max_num_seqs.
    Each running request takes a token of the budget a step, so `mixed` with a budget of 128
    and the default 256 sequences quietly ran at most 128 (a tester's find)."""
    with pytest.raises(ValueError, match=r"max_num_batched_tokens = 128 is below max_num_seqs = "
                                            r"256; expected >= max_num_seqs, as vLLM requires"):
        PagedConfig(kind="paged", policy=policy, max_num_batched_tokens=128)
    assert PagedConfig(kind="paged", policy=policy, max_num_batched_tokens=128, max_num_seqs=128)
    # DistServe's decode instance has its own limits and no such rule.
    assert PagedConfig(kind="paged", policy="distserve_decode", max_num_batched_tokens=128)


def test_a_chunk_below_max_num_seqs_warns_that_it_caps_the_batch() -> None:
    """Eight one-token prompts of 10 outputs under a 4-token chunk: at most four run, as
    every running request takes a token of the chunk a step; said, not silent."""
    reqs = make_requests([1] * 8, [10] * 8)
    with pytest.warns(UserWarning, match=r"chunk_size_tokens = 4 is below max_num_seqs = 8: at "
                                         r"most 4 requests run at once"):
        sched = ChunkedScheduler(ChunkedConfig(kind="chunked", chunk_size_tokens=4, max_num_seqs=8),
                                 reqs, 64)
    trace = drive(sched, reqs, check_paged_step)
    assert max(len(p.req_ids) for p in trace.plans) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ChunkedScheduler(ChunkedConfig(kind="chunked", chunk_size_tokens=8, max_num_seqs=8), reqs, 64)
