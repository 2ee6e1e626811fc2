"""The fused paged loop (orcasim.paged_fast) must equal the engine's generic fast loop bit for bit.

Both are fast mode; test_fast_engine.py checks fast mode (fused where it applies, the
default) against reference mode. Here the comparison is exact, as for the fused Orca loop
(test_orca_fast.py): the same timestamps, rows, scheduler state and free-block order, on
random paged scenarios (preemptions by recompute and swap, watermarks, tight budgets,
warm-up breaks, closed loops) with every cost kind, and on a cluster behind a router that
reads each replica's load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from test_fast_engine import NARROW_FIT, cost_model, scenarios
from test_orca_fast import assert_same_runs
from test_steps_priced_too_short import NEGATIVE_CONTEXT, outcomes

from orcasim import engine, fleet
from orcasim.closed_loop import arrival_source
from orcasim.cost.fitted import FittedCostConfig
from orcasim.cost.linear import LinearCost, LinearCostConfig
from orcasim.engine import Engine
from orcasim.generic_stepper import GenericStepper
from orcasim.paged_fast import PagedFusedStepper, applies
from orcasim.replica import Load, Replica
from orcasim.requests import Requests
from orcasim.run import run_scenario
from orcasim.scenario import scenario_from_dict
from orcasim.schedulers import build_scheduler
from orcasim.schedulers.chunked import ChunkedConfig
from orcasim.schedulers.paged import PagedConfig
from tests.conftest import examples

STATE = ("computed", "generated", "peak_computed", "preemptions_per_request", "cpu_blocks")


def run_both(case: dict) -> list[tuple[Engine, object]]:
    out = []
    for fused in (True, False):
        requests = case["requests"].for_run()  # a closed loop's own arrival times
        scheduler = build_scheduler(case["scheduler"], requests, case["kv_capacity_tokens"])
        engine = Engine(requests, scheduler, cost_model(case), "fast",
                        (case["warmup_s"],), fused=fused, arrivals=arrival_source(requests))
        assert engine.fused is (fused and applies(scheduler))
        out.append((engine, engine.run()))
    return out


def assert_identical(runs: list[tuple[Engine, object]]) -> None:
    assert_same_runs(runs)
    (fused, _), (generic, _) = runs
    for state in STATE:
        assert np.array_equal(getattr(fused.scheduler, state), getattr(generic.scheduler, state)), state
    for total in ("preemptions_total", "recomputed_tokens_total", "swapped_blocks"):
        assert getattr(fused.scheduler, total) == getattr(generic.scheduler, total), total
    assert fused.scheduler.allocator.free_pool() == generic.scheduler.allocator.free_pool()
    # Decode steps priced outside a cost's range count only where they ran: a run cut by an
    # arrival counts its first steps alone, in both loops.
    assert fused.cost.out_of_range_count() == generic.cost.out_of_range_count()


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(kinds=("paged", "chunked")))
def test_fused_paged_loop_equals_generic_loop(case: dict) -> None:
    assert_identical(run_both(case))


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(closed_loop=True, kinds=("paged", "chunked")))
def test_fused_paged_loop_equals_generic_loop_in_a_closed_loop(case: dict) -> None:
    assert_identical(run_both(case))


def checking_members(patch: pytest.MonkeyPatch) -> None:
    """From now on every fused paged stepper audits its members (`check_members`) after
    each plan and each unit's end."""
    start, finish = PagedFusedStepper.start, PagedFusedStepper.finish

    def checked_start(stepper: PagedFusedStepper, now_s: float) -> float | None:
        end_s = start(stepper, now_s)
        stepper.check_members()
        return end_s

    def checked_finish(stepper: PagedFusedStepper) -> None:
        finish(stepper)
        stepper.check_members()

    patch.setattr(PagedFusedStepper, "start", checked_start)
    patch.setattr(PagedFusedStepper, "finish", checked_finish)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(kinds=("paged", "chunked")))
def test_the_members_by_residue_never_go_stale(case: dict) -> None:
    """`by_residue` (the members grouped by base mod the block size, which a run's takers
    are read from) agrees with the members' lists at every plan and every unit's end, in
    runs with preemptions, chunks, prompt iterations and generic units."""
    with pytest.MonkeyPatch.context() as patch:
        checking_members(patch)
        run_both(case)


def test_the_members_by_residue_keep_batch_order_when_a_swapped_request_rejoins(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefill-first keeps `running` by id; here (hypothesis's shrunk find) request 13,
    swapped out while younger ones ran, rejoins among them, and its residue's list (blocks
    of 5) must take it before its younger members there, not last."""
    checking_members(monkeypatch)
    prompt = [1] * 12 + [31, 60, 1, 1, 5, 1, 1, 1, 3, 1, 1, 1, 5, 1, 1, 1, 1, 1, 9, 1]
    output = [1, 8, 1, 1, 6, 1, 1, 1, 1, 6, 6, 1, 6, 6] + [1] * 15 + [5, 3, 1]
    n = len(prompt)
    requests = Requests(np.zeros(n), np.array(prompt, dtype=np.int64),
                        np.array(output, dtype=np.int64), np.full(n, 81, dtype=np.int64))
    cfg = PagedConfig(kind="paged", policy="prefill_first", max_num_seqs=8, block_size_tokens=5,
                      preemption="swap", swap_space_bytes=64, kv_bytes_per_token=1,
                      swap_bandwidth_bytes_per_s=1e6)
    fused, _ = fused_small_run(requests, cfg, 0.01, kv_capacity_tokens=135)
    assert fused.scheduler.preemptions_total > 0


def test_fused_paged_loop_is_used_for_every_paged_policy_and_chunked_without_caching() -> None:
    requests = Requests(np.zeros(2), np.ones(2, dtype=np.int64), np.ones(2, dtype=np.int64),
                        np.full(2, 4, dtype=np.int64))
    plain = PagedConfig(kind="paged", block_size_tokens=2)
    assert applies(build_scheduler(plain, requests, 16))
    caching = PagedConfig(kind="paged", block_size_tokens=2, enable_prefix_caching=True)
    assert not applies(build_scheduler(caching, requests, 16))
    v0 = PagedConfig(kind="paged", block_size_tokens=2, policy="prefill_first")
    assert applies(build_scheduler(v0, requests, 16))
    chunked = ChunkedConfig(kind="chunked", block_size_tokens=2)
    assert applies(build_scheduler(chunked, requests, 16))
    chunked_caching = ChunkedConfig(kind="chunked", block_size_tokens=2, enable_prefix_caching=True)
    assert not applies(build_scheduler(chunked_caching, requests, 16))


def generic_fleets(monkeypatch: pytest.MonkeyPatch) -> list[type]:
    """From now on every replica's stepper is the generic one; the kinds made, in order."""
    kinds: list[type] = []

    def generic(scheduler, cost, recorder, mode, fused=True):  # type: ignore[no-untyped-def]
        stepper = engine.stepper_for(scheduler, cost, recorder, mode, False)
        kinds.append(type(stepper))
        return stepper

    monkeypatch.setattr(fleet, "stepper_for", generic)
    return kinds


CLUSTER = {
    "name": "fleet", "seed": 3,
    "workload": {"num_requests": 400, "arrival": {"kind": "poisson", "rate_per_s": 12.0},
                 "prompt_tokens": {"kind": "uniform", "low": 1, "high": 300},
                 "output_tokens": {"kind": "uniform", "low": 1, "high": 200},
                 "max_tokens": 500},
    "kv_capacity_tokens": 1024,
    "cost": {"kind": "linear", "base_s": 0.01, "per_token_s": 1e-4, "per_context_token_s": 1e-6},
}


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "least_kv",
                                    "least_tokens"])
@pytest.mark.parametrize("policy", ["mixed", "prefill_first"])
def test_a_fleet_of_fused_paged_replicas_equals_the_generic_fleet(
    router: str, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Routers read each replica's load between its units and inside them (a fused replica
    writes its implicit progress back first, and reports a continued run's first blocks as
    taken): every load read is the generic fleet's, and so are the runs. A pool of 1,024
    tokens preempts often, so units of the generic stepper are cut by deliveries too."""
    data = {**CLUSTER, "systems": [{
        "name": "vllm", "scheduler": {"kind": "paged", "max_num_seqs": 16, "policy": policy,
                                      "max_num_batched_tokens": 600, "block_size_tokens": 16},
        "cluster": {"replicas": 4, "router": {"kind": router}}}]}
    looks: dict[bool, list[tuple[int, float, Load]]] = {True: [], False: []}
    read = Replica.load

    def recorded(fused: bool):  # type: ignore[no-untyped-def]
        def load(replica: Replica, time_s: float) -> Load:
            seen = read(replica, time_s)
            looks[fused].append((replica.index, time_s, seen))
            return seen
        return load

    monkeypatch.setattr(Replica, "load", recorded(True))
    fused = run_scenario(scenario_from_dict(data)).systems["vllm"]
    kinds = generic_fleets(monkeypatch)
    monkeypatch.setattr(Replica, "load", recorded(False))
    unfused = run_scenario(scenario_from_dict(data)).systems["vllm"]
    assert kinds == [GenericStepper] * 4
    assert looks[True] == looks[False]
    assert fused.summary["preemptions"] > 0
    pd.testing.assert_frame_equal(fused.requests, unfused.requests, check_exact=True)
    pd.testing.assert_frame_equal(fused.iterations, unfused.iterations, check_exact=True)


def fused_small_run(requests: Requests, scheduler: PagedConfig | ChunkedConfig,
                    base_s: float, kv_capacity_tokens: int = 64) -> tuple[Engine, object]:
    """A hand-made case at `base_s` an iteration: both loops run it and must agree; the
    fused loop's engine and run."""
    case = {"requests": requests, "scheduler": scheduler, "kv_capacity_tokens": kv_capacity_tokens,
            "warmup_s": 0.0, "cost": LinearCostConfig(kind="linear", base_s=base_s)}
    runs = run_both(case)
    assert_identical(runs)
    return runs[0]


def test_a_request_finishing_in_a_lone_plan_iteration_finishes() -> None:
    """A plan with no decode run after it (the next request could join the next iteration:
    a budget of 10 takes one 6-token prompt now and the other next), whose one member emits
    its only token there: it finishes at that iteration's end, as in the generic loop."""
    requests = Requests(np.zeros(2), np.array([6, 6]), np.array([1, 3]), np.array([9, 9]))
    scheduler = PagedConfig(kind="paged", block_size_tokens=2, watermark=0.0,
                            max_num_batched_tokens=10, max_num_seqs=10)
    _, fused_run = fused_small_run(requests, scheduler, 0.5)
    assert fused_run.recorder.finish_s.tolist() == [0.5, 2.0]
    assert fused_run.recorder.iterations_frame()["num_iterations"].tolist()[0] == 1


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_a_preempting_step_is_the_generic_steppers_and_the_fused_loop_resumes(
    preemption: str,
) -> None:
    """4 blocks of 2 tokens; A (prompt 3) and B (prompt 2) both decode 4 tokens. At step 2 A
    needs a third block: B is preempted, in a unit the generic stepper runs on the state the
    fused loop wrote back; B comes back after A finishes, under the fused loop again."""
    requests = Requests(np.zeros(2), np.array([3, 2]), np.array([4, 4]), np.array([7, 7]))
    scheduler = PagedConfig(kind="paged", block_size_tokens=2, watermark=0.0,
                            preemption=preemption, swap_space_bytes=100, kv_bytes_per_token=1,
                            swap_bandwidth_bytes_per_s=1e3)
    case = {"requests": requests, "scheduler": scheduler, "kv_capacity_tokens": 8,
            "warmup_s": 0.0, "cost": LinearCostConfig(kind="linear", base_s=0.01,
                                                      per_token_s=1e-3)}
    runs = run_both(case)
    assert_identical(runs)
    (fused, fused_run), _ = runs
    assert fused.scheduler.preemptions_per_request.tolist() == [0, 1]
    assert fused_run.recorder.iterations_frame()["preemptions"].sum() == 1


@pytest.mark.parametrize("kind", ["mixed", "prefill_first", "chunked"])
def test_steps_outside_a_fitted_range_count_where_they_ran_in_both_loops(
    kind: str, tmp_path: Path
) -> None:
    """A fitted cost whose range 8 decodes leave within a run, and arrivals every 25 ms:
    runs (continued ones too) are priced ahead and cut by arrivals, and only the steps that
    ran count as outside the range, in the fused loop as in the generic one."""
    path = tmp_path / "narrow.yaml"
    path.write_text(yaml.safe_dump(NARROW_FIT))
    rng = np.random.default_rng(1)
    n = 60
    requests = Requests(np.cumsum(rng.exponential(1 / 40.0, n)), rng.integers(1, 61, n),
                        rng.integers(20, 121, n), np.full(n, 200, dtype=np.int64))
    scheduler = (ChunkedConfig(kind="chunked", max_num_seqs=8) if kind == "chunked" else
                 PagedConfig(kind="paged", policy=kind, max_num_seqs=8))
    case = {"requests": requests, "scheduler": scheduler, "kv_capacity_tokens": 4000,
            "warmup_s": 0.0, "cost": FittedCostConfig(kind="fitted", path=str(path))}
    runs = run_both(case)
    assert_identical(runs)  # the counts too
    assert runs[0][0].cost.out_of_range_count() > 0


@pytest.mark.parametrize("policy", ["mixed", "prefill_first"])
def test_a_batch_that_fills_the_token_budget_exactly_decodes_in_runs(policy: str) -> None:
    """Nine one-token prompts under a budget of nine tokens (the longest request's prompt +
    output - 1, as a recompute would prefill it): all join at once (under prefill-first in
    a prompt iteration of their own, nobody decoding beside them), and their decodes, nine
    tokens a step, fit the budget exactly, so they run as jumps in both loops."""
    outputs = np.array([5, 6, 7, 8, 9, 9, 9, 9, 9])
    requests = Requests(np.zeros(9), np.ones(9, dtype=np.int64), outputs, np.full(9, 10))
    scheduler = PagedConfig(kind="paged", block_size_tokens=4, watermark=0.0, policy=policy,
                            max_num_batched_tokens=9, max_num_seqs=9)
    case = {"requests": requests, "scheduler": scheduler, "kv_capacity_tokens": 128,
            "warmup_s": 0.0, "cost": LinearCostConfig(kind="linear", base_s=0.5)}
    runs = run_both(case)
    assert_identical(runs)
    (_, fused_run), _ = runs
    rows = fused_run.recorder.iterations_frame()
    # The plan and 4 decodes to the first completion, then a step to each next one.
    assert rows["num_iterations"].tolist() == [5, 1, 1, 1, 1]
    assert rows["batch_size"].tolist() == [9, 8, 7, 6, 5]


@pytest.mark.parametrize("fused", [True, False])
def test_a_jump_row_holds_the_reservations_of_its_steps_over_several_block_periods(
    fused: bool,
) -> None:
    """One request (prompt 1, 12 tokens) and a second (prompt 3, 12 tokens) on blocks of 2:
    a jump spans several block periods. Its row's mean reservation (time-weighted) and
    maximum are those of the reference mode's one-iteration rows over the same span; both
    loops share `BlockGrowth.reserved_tokens`, so only reference mode can check it."""
    requests = Requests(np.zeros(2), np.array([1, 3]), np.array([12, 12]), np.full(2, 16))
    scheduler = PagedConfig(kind="paged", block_size_tokens=2, watermark=0.0)
    cost = LinearCost(LinearCostConfig(kind="linear", base_s=0.5, per_context_token_s=0.01))
    rows = {}
    for mode in ("fast", "reference"):
        run_requests = requests.for_run()
        sched = build_scheduler(scheduler, run_requests, 64)
        engine = Engine(run_requests, sched, cost, mode, fused=fused)
        rows[mode] = engine.run().recorder.iterations_frame()
    fast, ref = rows["fast"], rows["reference"]
    assert fast["num_iterations"].tolist() == [12] and len(ref) == 12
    held_s = float((ref["kv_reserved_tokens"] * ref["duration_s"]).sum())
    assert fast["kv_reserved_tokens"].iloc[0] == pytest.approx(held_s / ref["duration_s"].sum())
    # Blocks of 2 tokens: the prefill holds 1 + 2 blocks (1 and 3 tokens), the last step
    # 6 + 7 (12 and 14 tokens computed: prompt + output - 1).
    assert ref["kv_reserved_tokens"].tolist()[0] == 2 * (1 + 2)
    assert fast["kv_reserved_tokens_max"].iloc[0] == ref["kv_reserved_tokens_max"].max() == 26


def test_a_chunked_prefill_instance_equals_the_generic_loop(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disaggregated prefill instance holds finished prompts' KV until it has moved, so the
    fused stepper hands every unit to the generic one; with 16-token chunks of prompts up to
    90 tokens, most end with a prompt half done, which the fused lists never take up (they
    stay empty): the same requests and rows as the generic loop."""
    data = {**CLUSTER, "workload": {**CLUSTER["workload"], "num_requests": 120,
                                    "prompt_tokens": {"kind": "uniform", "low": 20, "high": 90},
                                    "output_tokens": {"kind": "uniform", "low": 1, "high": 20}},
            "systems": [{"name": "pd", "scheduler": {"kind": "paged", "max_num_seqs": 16},
                         "cluster": {
                             "prefill": {"count": 1, "scheduler": {
                                 "kind": "chunked", "chunk_size_tokens": 16, "max_num_seqs": 4}},
                             "decode": {"count": 1}, "link": {"latency_s": 0.05}}}]}
    steppers: list[PagedFusedStepper] = []
    made = PagedFusedStepper.__init__

    def keep(stepper: PagedFusedStepper, *args) -> None:  # type: ignore[no-untyped-def]
        made(stepper, *args)
        steppers.append(stepper)

    monkeypatch.setattr(PagedFusedStepper, "__init__", keep)
    fused = run_scenario(scenario_from_dict(data)).systems["pd"]
    prefill = [st for st in steppers if st.scheduler.holds_finished]
    assert len(prefill) == 1 and prefill[0].base == [] and prefill[0].partial is None
    kinds = generic_fleets(monkeypatch)
    unfused = run_scenario(scenario_from_dict(data)).systems["pd"]
    assert kinds == [GenericStepper] * 2
    pd.testing.assert_frame_equal(fused.requests, unfused.requests, check_exact=True)
    pd.testing.assert_frame_equal(fused.iterations, unfused.iterations, check_exact=True)


def test_a_prompt_chunked_over_plans_emits_its_first_token_at_the_last_chunk() -> None:
    """Chunks of 4 tokens: A (prompt 1, 10 tokens) decodes one token an iteration and B
    (prompt 7, 3 tokens) takes what is left: 3, 3, then its last prompt token, one short
    of its known tokens after the second chunk but with nothing emitted yet. B's first
    token comes at the third iteration's end (1 s each), its last two after it, A's at 10 s.
    No decode run follows a plan that leaves a chunk; the third plan's does."""
    requests = Requests(np.zeros(2), np.array([1, 7]), np.array([10, 3]), np.array([11, 10]))
    scheduler = ChunkedConfig(kind="chunked", block_size_tokens=2, watermark=0.0,
                              chunk_size_tokens=4)
    engine_fused, fused_run = fused_small_run(requests, scheduler, 1.0)
    assert fused_run.recorder.first_token_s.tolist() == [1.0, 3.0]
    assert fused_run.recorder.finish_s.tolist() == [10.0, 5.0]
    rows = fused_run.recorder.iterations_frame()
    assert rows["num_iterations"].tolist() == [1, 1, 3, 5]
    assert rows["tokens"].tolist() == [1 + 3, 1 + 3, 1 + 1 + 2 * 2, 5]
    assert engine_fused.scheduler.computed.tolist() == [10, 9]


def test_a_chunk_whose_blocks_do_not_fit_is_preempted_by_the_generic_stepper() -> None:
    """Six blocks of 2 tokens, chunks of 4: A (prompt 1, 8 tokens) decodes while B (prompt 9)
    takes 3 tokens a plan. At the third plan A's decode takes a fifth block and B's chunk
    would need two more: B, the newest, is preempted (recompute) in a unit the generic
    stepper runs, and prefills again from the start under the fused loop; A's growing table
    preempts it twice more, and it finishes after A (1 s an iteration)."""
    requests = Requests(np.zeros(2), np.array([1, 9]), np.array([8, 2]), np.array([9, 11]))
    scheduler = ChunkedConfig(kind="chunked", block_size_tokens=2, watermark=0.0,
                              chunk_size_tokens=4)
    engine_fused, fused_run = fused_small_run(requests, scheduler, 1.0, kv_capacity_tokens=12)
    assert engine_fused.scheduler.preemptions_per_request.tolist() == [0, 3]
    rows = fused_run.recorder.iterations_frame()
    assert rows["preemptions"].tolist() == [0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0]
    assert rows["tokens"].tolist()[:4] == [1 + 3, 1 + 3, 1, 1 + 3]  # the third: A alone
    assert rows["recomputed_tokens"].sum() == engine_fused.scheduler.recomputed_tokens_total > 0
    assert fused_run.recorder.first_token_s.tolist() == [1.0, 11.0]
    assert fused_run.recorder.finish_s.tolist() == [8.0, 12.0]


def test_a_prefill_first_prompt_iteration_leaves_the_decodes_waiting() -> None:
    """vLLM v0's policy, prompts padded to the longest: A (prompt 2, 4 tokens) runs alone
    until B (prompt 3, 2 tokens) and C (prompt 5, 1 token) arrive at 1.5 s; at the next
    boundary (2.3 s) their prompts run alone, padded to 2 x 5 tokens (1 s + 0.1 s a token:
    2 s), while A's decode waits; then A and B decode together. The prompt row counts the
    padded tokens and A's waiting KV (3 tokens) with the prompts' 8."""
    requests = Requests(np.array([0.0, 1.5, 1.5]), np.array([2, 3, 5]), np.array([4, 2, 1]),
                        np.array([6, 6, 6]))
    scheduler = PagedConfig(kind="paged", policy="prefill_first", pad_prompts=True,
                            block_size_tokens=2, watermark=0.0, max_num_batched_tokens=16,
                            max_num_seqs=8)
    case = {"requests": requests, "scheduler": scheduler, "kv_capacity_tokens": 64,
            "warmup_s": 0.0, "cost": LinearCostConfig(kind="linear", base_s=1.0, per_token_s=0.1)}
    runs = run_both(case)
    assert_identical(runs)
    (_, fused_run), _ = runs
    assert fused_run.recorder.first_token_s.tolist() == pytest.approx([1.2, 4.3, 4.3])
    assert fused_run.recorder.finish_s.tolist() == pytest.approx([6.6, 5.5, 4.3])
    rows = fused_run.recorder.iterations_frame()
    assert rows["num_iterations"].tolist() == [2, 1, 1, 1]
    prompt_row = rows.iloc[1]
    assert prompt_row["batch_size"] == 2 and prompt_row["tokens"] == 10
    assert prompt_row["kv_used_tokens"] == 3 + 8


def test_a_router_reads_a_prompt_iteration_of_an_idle_replica_as_not_yet_computed(
    tmp_path, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001 - a pytest path
) -> None:
    """Prefill-first, two replicas, `least_tokens`: A (prompt 100) starts a prompt iteration
    alone on replica 0 at 0 s and C (prompt 60) on replica 1; B, at 0.5 s while both run,
    goes where fewer tokens are outstanding: replica 1 (70 against A's 110, none of A's
    prompt computed until its iteration ends), in both loops."""
    path = tmp_path / "trace.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,100,10\n0.0,60,10\n0.5,50,10\n")
    data = {"name": "fleet", "seed": 0,
            "workload": {"arrival": {"kind": "trace", "path": str(path)}, "max_tokens": 200},
            "kv_capacity_tokens": 4096,
            "cost": {"kind": "linear", "base_s": 1.0, "per_token_s": 0.01},
            "systems": [{"name": "v0", "scheduler": {
                "kind": "paged", "policy": "prefill_first", "max_num_seqs": 8,
                "max_num_batched_tokens": 512},
                "cluster": {"replicas": 2, "router": {"kind": "least_tokens"}}}]}
    fused = run_scenario(scenario_from_dict(data)).systems["v0"].requests
    assert fused["replica"].tolist() == [0, 1, 1]
    generic_fleets(monkeypatch)
    unfused = run_scenario(scenario_from_dict(data)).systems["v0"].requests
    pd.testing.assert_frame_equal(fused, unfused, check_exact=True)


@pytest.mark.parametrize("policy", ["mixed", "prefill_first"])
def test_a_continued_runs_first_step_priced_too_short_is_refused_as_in_reference_mode(
    policy: str
) -> None:
    """Request 1 (2 tokens of prompt) finishes after 5 decodes beside request 0 (1,150), and
    request 0 decodes on alone in a continued run, whose first step the fit prices under
    zero (1 ms + 10 ms a request - 10 us a KV token read by decodes). The continued run
    prices no step, so the fused loop plans as reference mode does and refuses that
    iteration in its words; a continued unit with no ends failed on its last end."""
    requests = Requests(np.zeros(2), np.array([1150, 2]), np.array([50, 5]), np.array([1200, 7]))
    cfg = PagedConfig(kind="paged", policy=policy, max_num_seqs=8)
    got = outcomes(requests, cfg, 100_000, NEGATIVE_CONTEXT)
    assert isinstance(got[0], str) and "priced a batch of 1 requests" in got[0], got[0]
    assert got == [got[0]] * 3
