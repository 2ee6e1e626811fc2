"""Deterministic checks, each on a case small enough to compute by hand (issue 17).

Property tests and golden baselines catch a moved number by chance or say only that
something moved; these say what is wrong: TPOT's divisor, Little's L clipped to its window,
the regression check's default tolerance, an exact KV fit at a jump boundary, an arrival on
an iteration boundary under the paged scheduler, and LIFO reuse of freed blocks.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from orcasim.compare import DEFAULT_REL_TOL, moved, tolerance
from orcasim.cost.linear import LinearCost, LinearCostConfig
from orcasim.cost.overhead import OverheadConfig, OverheadCost
from orcasim.engine import Engine
from orcasim.memory import PagedAllocator
from orcasim.metrics import arrivals_window_s, littles_law, requests_frame
from orcasim.recorder import Recorder
from orcasim.requests import Requests
from orcasim.schedulers import build_scheduler
from orcasim.schedulers.iteration_level import IterationLevelConfig
from orcasim.schedulers.paged import PagedConfig

ONE_SECOND = LinearCostConfig(kind="linear", base_s=1.0)


def test_tpot_divides_by_the_tokens_after_the_first() -> None:
    """Arrives at 0, first token at 2, fifth (last) at 10: four gaps of 2 s."""
    requests = Requests(np.array([0.0, 0.0]), np.array([3, 3]), np.array([5, 1]), np.array([9, 9]))
    rec = Recorder(2)
    rec.first_scheduled_s[:] = [0.5, 0.5]
    rec.first_token_s[:] = [2.0, 2.0]
    rec.finish_s[:] = [10.0, 2.0]
    frame = requests_frame(requests, rec)
    assert frame["tpot_s"][0] == 2.0 and np.isnan(frame["tpot_s"][1])  # one token: no TPOT
    assert frame["ttft_s"].tolist() == [2.0, 2.0] and frame["e2e_s"].tolist() == [10.0, 2.0]
    assert frame["queue_delay_s"].tolist() == [0.5, 0.5]


def test_littles_l_is_clipped_to_the_window() -> None:
    """Window [0, 10] (first to last arrival). Request A is in the system over [0, 5],
    B over [10, 30], of which nothing falls inside: L = 5 / 10. Arrivals 2 / 10 s, mean
    sojourn (5 + 20) / 2: lambda W = 2.5."""
    frame = pd.DataFrame({"arrival_s": [0.0, 10.0], "finish_s": [5.0, 30.0]})
    law = littles_law(frame)
    assert law["little_L"] == 0.5
    assert law["little_lambda_W"] == 2.5
    assert law["little_rel_error"] == pytest.approx(0.8)


def test_a_replicas_little_window_is_its_systems() -> None:
    """The system of `test_littles_l_is_clipped_to_the_window` (window [0, 10]) with A on
    replica 0 and B on replica 1. Over the system's window, replica 0 holds A for 5 of 10 s
    and replica 1 holds B for none of it: L 0.5 and 0, lambda W 0.5 and 2.0, adding up to
    the system's 0.5 and 2.5. Each over its own window of one arrival measured nothing
    (NaN). A replica that finished nothing there held nothing: 0 and 0."""
    frame = pd.DataFrame({"arrival_s": [0.0, 10.0], "finish_s": [5.0, 30.0],
                          "replica": [0, 1]})
    window_s = arrivals_window_s(frame)
    assert window_s == (0.0, 10.0)
    laws = [littles_law(frame[frame["replica"] == i], window_s) for i in range(3)]
    assert [law["little_L"] for law in laws] == [0.5, 0.0, 0.0]
    assert [law["little_lambda_W"] for law in laws] == [0.5, 2.0, 0.0]
    assert laws[0]["little_rel_error"] == 0.0 and laws[1]["little_rel_error"] == 1.0
    assert np.isnan(laws[2]["little_rel_error"])
    assert np.isnan(littles_law(frame[frame["replica"] == 0])["little_L"])


def test_the_regression_checks_default_tolerance() -> None:
    """1e-9 relative: a latency 1e-8 off moves, 1e-10 off does not; counts must be exact."""
    assert DEFAULT_REL_TOL == 1e-9 and tolerance("ttft_s_p50") == DEFAULT_REL_TOL
    assert moved(1.0, 1.0 + 1e-8, tolerance("ttft_s_p50"))
    assert not moved(1.0, 1.0 + 1e-10, tolerance("ttft_s_p50"))
    assert moved(100.0, 101.0, tolerance("requests_completed"))
    assert not moved(100.0, 100.0, tolerance("requests_completed"))


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_an_exact_kv_fit_is_admitted_at_the_jump_boundary(mode: str) -> None:
    """KV for 20 tokens; Orca reserves max_tokens (10) each. Request 0 and 1 fill it
    exactly; request 2 (arriving at 0.5) fits exactly when request 0 finishes at 3 s,
    and joins there, the boundary where its reservation first fits."""
    requests = Requests(np.array([0.0, 0.0, 0.5]), np.array([2, 2, 2]), np.array([3, 6, 2]),
                        np.array([10, 10, 10]))
    cfg = IterationLevelConfig(kind="iteration_level", max_batch_size=8)
    for fused in (True, False):
        scheduler = build_scheduler(cfg, requests, 20)
        run = Engine(requests, scheduler, LinearCost(ONE_SECOND), mode, fused=fused).run()
        assert run.recorder.first_scheduled_s.tolist() == [0.0, 0.0, 3.0], (mode, fused)
        assert run.recorder.finish_s.tolist() == [3.0, 6.0, 5.0], (mode, fused)


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_an_arrival_that_fits_exactly_cuts_the_jump(mode: str) -> None:
    """KV for 20 tokens, request 0 reserving 10 decodes until 6 s; request 1 (10 more)
    arrives at 0.5 s and fits exactly: it joins at the next boundary, 1 s, so fast mode
    must cut its jump there (`admits_arrival` on an exact fit)."""
    requests = Requests(np.array([0.0, 0.5]), np.array([2, 2]), np.array([6, 2]),
                        np.array([10, 10]))
    cfg = IterationLevelConfig(kind="iteration_level", max_batch_size=8)
    for fused in (True, False):
        scheduler = build_scheduler(cfg, requests, 20)
        run = Engine(requests, scheduler, LinearCost(ONE_SECOND), mode, fused=fused).run()
        assert run.recorder.first_scheduled_s.tolist() == [0.0, 1.0], (mode, fused)
        assert run.recorder.finish_s.tolist() == [6.0, 3.0], (mode, fused)


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_a_paged_arrival_on_a_boundary_joins_there(mode: str) -> None:
    """Iterations of 1 s under the paged scheduler: request 1 arrives exactly at the end of
    the second iteration and joins the third; request 2 arrives just after and waits for
    the fourth."""
    requests = Requests(np.array([0.0, 2.0, 2.25]), np.array([4, 4, 4]), np.array([6, 2, 2]),
                        np.array([16, 16, 16]))
    cfg = PagedConfig(kind="paged", max_num_seqs=8, block_size_tokens=4)
    for fused in (True, False):  # the fused paged loop and the generic stepper's cut
        scheduler = build_scheduler(cfg, requests, 64)
        run = Engine(requests, scheduler, LinearCost(ONE_SECOND), mode, fused=fused).run()
        assert run.recorder.first_scheduled_s.tolist() == [0.0, 2.0, 3.0], (mode, fused)
        assert run.recorder.finish_s.tolist() == [6.0, 4.0, 5.0], (mode, fused)



@pytest.mark.parametrize("kind", ["iteration_level", "paged"])
@pytest.mark.parametrize(("arrival_s", "waiting_sum"), [((0.5, 2.0), 9), ((5.0, 5.5), 1)])
def test_a_blocked_arrival_on_a_boundary_waits_from_that_boundary(
    kind: str, arrival_s: tuple[float, float], waiting_sum: int
) -> None:
    """Iterations of 1 s, a batch of one: request 0 decodes until 6 s; two more arrive and
    cannot join, so neither cuts the jump. The reference loop counts one waiting in each
    iteration that starts at or after its arrival: at 0.5 and exactly 2 s, 0 + 1 + 2 + 2 +
    2 + 2 = 9 over the first six; exactly at the last inner boundary, 5 s, (and 5.5) 1.
    Fast mode's one row says the same."""
    requests = Requests(np.array([0.0, *arrival_s]), np.array([2, 2, 2]), np.array([6, 1, 1]),
                        np.array([8, 8, 8]))
    cfg = (IterationLevelConfig(kind="iteration_level", max_batch_size=1) if kind == "iteration_level"
           else PagedConfig(kind="paged", max_num_seqs=1, block_size_tokens=2))
    waiting = {}
    for mode in ("fast", "reference"):
        scheduler = build_scheduler(cfg, requests, 64)
        rows = Engine(requests, scheduler, LinearCost(ONE_SECOND), mode).run().recorder \
            .iterations_frame()
        first = rows[rows["start_s"] < 6.0]
        assert first["num_iterations"].sum() == 6, mode
        waiting[mode] = int(first["num_waiting"].sum())
    assert waiting == {"fast": waiting_sum, "reference": waiting_sum}



class _NoLine(LinearCost):
    """The linear cost without its decode line: the fused loops price each step instead."""

    def decode_line(self, size: int, context_total: int) -> None:
        return None


def _one_second_with_overhead(cfg: LinearCostConfig) -> OverheadCost:
    """Iterations of 1 s, half of it the engine's own (a line with a host term on top)."""
    host = OverheadConfig(per_iteration_s=0.25, per_sequence_s=0.25,
                          tensor_parallel_per_iteration_s=0.0)
    return OverheadCost(LinearCost(cfg.model_copy(update={"base_s": 0.5})), host, None, 1)


@pytest.mark.parametrize("kind", ["iteration_level", "paged"])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("cost", [LinearCost, _NoLine, _one_second_with_overhead])
@pytest.mark.parametrize("break_s", [1.0, 2.0])
def test_no_row_straddles_a_warm_up_break_on_an_iteration_boundary(
    kind: str, fused: bool, cost: type[LinearCost], break_s: float
) -> None:
    """Iterations of 1 s, one request decoding until 6 s, the warm-up ending exactly at
    the prompt's end (1 s) or a decode step's (2 s): fast mode's jump is cut there, so a
    row starts at the break (the rows before it are the warm-up's), in the fused loop
    (priced as a line, a line with an engine's overhead, or step by step) and the generic
    stepper alike."""
    requests = Requests(np.array([0.0]), np.array([2]), np.array([6]), np.array([8]))
    cfg = (IterationLevelConfig(kind="iteration_level", max_batch_size=1) if kind == "iteration_level"
           else PagedConfig(kind="paged", max_num_seqs=1, block_size_tokens=2))
    scheduler = build_scheduler(cfg, requests, 64)
    rows = Engine(requests, scheduler, cost(ONE_SECOND), "fast", row_breaks_s=(break_s,),
                  fused=fused).run().recorder.iterations_frame()
    assert rows["start_s"].tolist() == [0.0, break_s]
    assert rows["num_iterations"].tolist() == [break_s, 6 - break_s]
    assert rows["duration_s"].sum() == 6.0


def test_freed_blocks_are_reused_last_in_first_out() -> None:
    """vLLM's free-block queue: the blocks freed last are handed out first, in the order
    the freed table held them; never-used blocks come after, lowest first."""
    pool = PagedAllocator(10, 4)
    assert pool.allocate(1, 2) == [0, 1] and pool.allocate(2, 3) == [2, 3, 4]
    pool.free(1)
    pool.free(2)
    assert pool.free_pool() == ((1, 0, 4, 3, 2), 5)  # popped from the end
    assert pool.allocate(3, 4) == [2, 3, 4, 0]  # request 2's table first, then request 1's
    assert pool.allocate(4, 2) == [1, 5]  # the last freed block, then the first never used
    pool.check_invariants()


def test_a_paged_run_that_fills_the_pool_exactly_runs_whole() -> None:
    """Blocks of 4 tokens, a pool of 3: prompt 2 and 10 output tokens hold 11 tokens at the
    end, the third block taken by the step computing token 8, which leaves the pool empty.
    No step needs a block it cannot have, so fast mode jumps over the whole request: one row
    of 10 iterations (a run cut where the pool fills would split it, 9 + 1)."""
    requests = Requests(np.array([0.0]), np.array([2]), np.array([10]), np.array([16]))
    cfg = PagedConfig(kind="paged", max_num_seqs=4, block_size_tokens=4, watermark=0.0)
    rows = {}
    for mode in ("fast", "reference"):
        scheduler = build_scheduler(cfg, requests, 12)
        run = Engine(requests, scheduler, LinearCost(ONE_SECOND), mode).run()
        assert run.recorder.finish_s.tolist() == [10.0], mode
        rows[mode] = run.recorder.iterations_frame()
    assert rows["fast"]["num_iterations"].tolist() == [10]
    assert rows["reference"]["num_iterations"].tolist() == [1] * 10
    assert rows["fast"]["kv_reserved_tokens_max"].tolist() == [12]


TIME_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "queue_delay_s",
                "ttft_s", "tpot_s", "e2e_s", "normalized_latency_s_per_token")


def summary_frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Four requests and three iteration rows, every summary field worked out by hand below.

    Request 0 arrives before the 1 s warm-up; 1 and 2 finish; 3 was rejected (never ran).
    Row A starts before the warm-up; B (two iterations) starts exactly at it.
    """
    nan = float("nan")
    arrival = np.array([0.0, 1.0, 2.0, 3.0])
    scheduled = np.array([0.0, 1.5, 2.0, nan])
    first = np.array([0.5, 2.0, 2.5, nan])
    finish = np.array([2.0, 4.0, 3.0, nan])
    output = np.array([2, 3, 2, 4])
    reqs = pd.DataFrame({
        "arrival_s": arrival, "first_scheduled_s": scheduled, "first_token_s": first,
        "finish_s": finish, "prompt_tokens": 10, "output_tokens": output,
        "queue_delay_s": scheduled - arrival, "ttft_s": first - arrival,
        "tpot_s": (finish - first) / (output - 1), "e2e_s": finish - arrival,
        "normalized_latency_s_per_token": (finish - arrival) / output,
        "rejected": [False, False, False, True]})
    iters = pd.DataFrame({
        "start_s": [0.5, 1.0, 2.0], "duration_s": [0.5, 1.0, 2.0], "num_iterations": [1, 2, 1],
        "batch_size": [1, 2, 4], "kv_reserved_tokens": [10.0, 20.0, 40.0],
        "kv_reserved_tokens_max": [10, 50, 40], "kv_used_tokens": [5.0, 10.0, 20.0],
        "preemptions": [3, 1, 0], "recomputed_tokens": [7, 5, 0]})
    return reqs, iters


def test_the_summary_by_hand() -> None:
    from orcasim.metrics import summarize

    reqs, iters = summary_frames()
    s = summarize(reqs, iters, warmup_s=1.0)
    expected = {
        "requests_completed": 2.0, "requests_rejected": 1.0,
        "duration_s": 3.0,  # from the warm-up (later than the first arrival) to the last finish
        # What completes within [1, 4]: request 0 too, which arrived before the warm-up but
        # used the window's server time (operational analysis: X = C / T).
        "throughput_rps": 3 / 3, "throughput_tokens_per_s": (2 + 3 + 2) / 3,
        "ttft_s_mean": 0.75, "ttft_s_p50": 0.75, "ttft_s_p90": 0.95, "ttft_s_p99": 0.995,
        "tpot_s_mean": 0.75, "e2e_s_mean": 2.0, "e2e_s_p90": 2.8, "queue_delay_s_mean": 0.25,
        "normalized_latency_s_per_token_mean": 0.75,
        "iterations": 3.0, "batch_size_mean": 8 / 3,  # (2 x 2 + 4 x 1) / 3 iterations
        "kv_reserved_tokens_mean": 100 / 3,  # (20 x 1 s + 40 x 2 s) / 3 s
        "kv_reserved_tokens_max": 50.0, "kv_utilization_mean": 0.5,  # (10 + 40) / (20 + 80)
        "preemptions": 1.0, "recomputed_tokens": 5.0,
        # Arrivals at 1 and 2 s: a 1 s window, request 1 in it throughout, request 2 at its end.
        "little_L": 1.0, "little_lambda_W": 4.0, "little_rel_error": 0.75,
        "saturated": 0.0,
    }
    for key, value in expected.items():
        assert s[key] == pytest.approx(value, abs=1e-12), key
    assert np.isnan(s["saturation_z"])  # two arrivals: too few to judge
    whole = summarize(reqs, iters)  # no warm-up by default: request 0 and row A count
    assert (whole["requests_completed"], whole["iterations"], whole["duration_s"]) == (3.0, 4.0, 4.0)
    assert whole["preemptions"] == 4.0 and whole["kv_reserved_tokens_max"] == 50.0
    # A rejected request arriving exactly at the warm-up is counted.
    assert summarize(reqs, iters, warmup_s=3.0)["requests_rejected"] == 1.0
    # The same run a tenth as long: rates ten times, time averages and counts unchanged.
    fast = summarize(reqs.assign(**{c: reqs[c] / 10 for c in TIME_COLUMNS}),
                     iters.assign(start_s=iters["start_s"] / 10,
                                  duration_s=iters["duration_s"] / 10), warmup_s=0.1)
    assert fast["duration_s"] == pytest.approx(0.3) and fast["throughput_rps"] == pytest.approx(30 / 3)
    assert fast["throughput_tokens_per_s"] == pytest.approx(70 / 3)
    assert fast["kv_reserved_tokens_mean"] == pytest.approx(100 / 3)
    assert fast["kv_utilization_mean"] == pytest.approx(0.5)


def test_empty_and_untracked_frames() -> None:
    from orcasim.metrics import kv_memory_stats, summarize

    reqs, iters = summary_frames()
    untracked = iters.drop(columns=["kv_used_tokens", "kv_reserved_tokens_max", "preemptions",
                                    "recomputed_tokens"])
    stats = kv_memory_stats(untracked)
    assert np.isnan(stats["kv_utilization_mean"]) and stats["preemptions"] == 0.0
    assert stats["recomputed_tokens"] == 0.0
    assert kv_memory_stats(iters.iloc[[1]])["kv_utilization_mean"] == 0.5  # one row: 10 of 20
    tiny = iters.iloc[[1]].assign(kv_reserved_tokens=1.0, kv_used_tokens=0.5, duration_s=0.5)
    assert kv_memory_stats(tiny)["kv_utilization_mean"] == 0.5  # under one token-second held
    nothing_held = iters.assign(kv_reserved_tokens=0.0, kv_used_tokens=0.0)
    assert np.isnan(kv_memory_stats(nothing_held)["kv_utilization_mean"])  # 0 of 0: undefined
    s = summarize(reqs.drop(columns=["rejected"]), untracked, warmup_s=1.0)
    assert s["requests_rejected"] == 0.0 and s["kv_reserved_tokens_max"] == 40.0  # the plain column
    none = summarize(reqs.iloc[:0], iters.iloc[:0])
    assert none["requests_completed"] == 0.0 and none["duration_s"] == 0.0
    assert none["throughput_rps"] == 0.0 and np.isnan(none["batch_size_mean"])  # no iterations
    assert none["throughput_tokens_per_s"] == 0.0 and none["kv_reserved_tokens_max"] == 0.0
    assert np.isnan(none["ttft_s_p50"]) and none["kv_reserved_tokens_mean"] == 0.0


def test_the_request_frame_by_hand() -> None:
    """Lengths 1, 2 and 4 tokens: TPOT is undefined for one token; ids, signs and types."""
    requests = Requests(np.array([0.0, 1.0, 2.0]), np.array([5, 5, 5]), np.array([1, 2, 4]),
                        np.full(3, 20))
    rec = Recorder(3)
    rec.first_scheduled_s[:] = [0.5, 1.0, np.nan]
    rec.first_token_s[:] = [1.0, 2.0, np.nan]
    rec.finish_s[:] = [1.0, 3.0, np.nan]
    frame = requests_frame(requests, rec, np.array([2]))
    assert frame["id"].tolist() == [0, 1, 2] and frame["id"].dtype == np.int64
    assert frame["rejected"].tolist() == [False, False, True] and frame["rejected"].dtype == bool
    assert frame["ttft_s"].tolist()[:2] == [1.0, 1.0]
    assert np.isnan(frame["tpot_s"][0]) and frame["tpot_s"][1] == 1.0  # (3 - 2) / (2 - 1)
    assert frame["normalized_latency_s_per_token"].tolist()[:2] == [1.0, 1.0]  # e2e / tokens
    assert frame["queue_delay_s"].tolist()[:2] == [0.5, 0.0]
    assert not requests_frame(requests, rec)["rejected"].any()


def test_littles_law_edges_and_offered_rate() -> None:
    from orcasim.metrics import offered_rps

    one = pd.DataFrame({"arrival_s": [1.0], "finish_s": [2.0]})
    out = littles_law(one)
    assert set(out) == {"little_L", "little_lambda_W", "little_rel_error"}
    assert all(np.isnan(v) for v in out.values())
    instant = pd.DataFrame({"arrival_s": [0.0, 1.0], "finish_s": [0.0, 1.0]})  # zero sojourns
    out = littles_law(instant)
    assert out["little_L"] == 0.0 and out["little_lambda_W"] == 0.0
    assert np.isnan(out["little_rel_error"])
    assert offered_rps(np.array([0.0, 1.0, 3.0])) == pytest.approx(2 / 3)
    assert offered_rps(np.array([0.0, 2.0])) == 0.5 and offered_rps(np.array([0.0, 0.25])) == 4.0
    assert np.isnan(offered_rps(np.array([5.0]))) and np.isnan(offered_rps(np.array([2.0, 2.0])))
    # A closed loop of 3 clients sends 3 at time 0, then 2 more by t = 4: 0.5 req/s.
    assert offered_rps(np.array([0.0, 0.0, 0.0, 1.0, 4.0]), initial_sends=3) == 0.5
    assert np.isnan(offered_rps(np.array([0.0, 0.0]), initial_sends=3))


def test_the_summary_judges_saturation_after_the_warm_up() -> None:
    """300 requests at t = 0 drain by t = 300 s, then one a second is served at once: after a
    300 s warm-up the queue is flat; counted from t = 0 it would read as shrinking."""
    from orcasim.metrics import summarize

    arrival = np.concatenate([np.zeros(300), np.arange(300.0, 700.0)])
    scheduled = np.concatenate([np.arange(300.0), np.arange(300.0, 700.0)])
    reqs = pd.DataFrame({"arrival_s": arrival, "first_scheduled_s": scheduled,
                         "first_token_s": scheduled + 0.5, "finish_s": scheduled + 0.5,
                         "output_tokens": 1, "queue_delay_s": scheduled - arrival,
                         "ttft_s": scheduled + 0.5 - arrival, "tpot_s": np.nan,
                         "e2e_s": scheduled + 0.5 - arrival,
                         "normalized_latency_s_per_token": scheduled + 0.5 - arrival})
    _, iters = summary_frames()
    after = summarize(reqs, iters, warmup_s=300.0)
    assert after["saturation_growth_requests"] == pytest.approx(0.0, abs=1e-9)
    assert summarize(reqs, iters)["saturation_growth_requests"] < -50


@pytest.mark.parametrize("fused", [True, False])
def test_every_row_break_cuts_the_jumps_in_time_order(fused: bool) -> None:
    """Breaks at 4 s and 2 s (given in any order): one request decoding until 6 s has rows
    starting at 0, 2 and 4."""
    requests = Requests(np.array([0.0]), np.array([2]), np.array([6]), np.array([8]))
    scheduler = build_scheduler(IterationLevelConfig(kind="iteration_level", max_batch_size=1),
                                requests, 64)
    rows = Engine(requests, scheduler, LinearCost(ONE_SECOND), "fast", row_breaks_s=(4.0, 2.0),
                  fused=fused).run().recorder.iterations_frame()
    assert rows["start_s"].tolist() == [0.0, 2.0, 4.0]
    assert rows["num_iterations"].tolist() == [2, 2, 2]


def test_throughput_counts_the_last_request_to_finish() -> None:
    """(f - s) + s rounds below f at this run's first arrival and last finish: the window's
    end read just short of the last finish, which was left out (4 / T for 5 completions, and
    34% of the output tokens per second; a tester's finding, 8 of 1,350 random scenarios)."""
    import orcasim
    from orcasim.scenario import scenario_from_dict

    result = orcasim.run_scenario(scenario_from_dict({
        "name": "thr", "seed": 266, "kv_capacity_tokens": 4000,
        "workload": {"num_requests": 5, "arrival": {"kind": "poisson", "rate_per_s": 100},
                     "prompt_tokens": {"kind": "constant", "value": 1},
                     "output_tokens": {"kind": "uniform", "low": 1, "high": 60}, "max_tokens": 61},
        "cost": {"kind": "linear", "base_s": 0.001, "per_token_s": 0.0001},
        "systems": [{"name": "orca", "scheduler": {"kind": "iteration_level", "max_batch_size": 8}}]}))
    reqs, summary = result.systems["orca"].requests, result.systems["orca"].summary
    start_s, last_s = float(reqs["arrival_s"].min()), float(reqs["finish_s"].max())
    assert (last_s - start_s) + start_s < last_s  # the rounding that dropped it
    assert summary["throughput_rps"] == 5 / (last_s - start_s)
    assert summary["throughput_tokens_per_s"] == reqs["output_tokens"].sum() / (last_s - start_s)
