"""The scheduler contract (`orcasim.schedulers.base.Scheduler`) by hand, for every kind.

What a replica and a router read of a scheduler (`has_unfinished`, `active_ids`,
`queued_ids`, `num_requests`), the base class's default hooks, a static batch's
fast-forward hooks step by step, and the fast-forward declaration rule. Each test names
one behaviour, so a bug in it fails here rather than only in a property test's long run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from orcasim import run_scenario
from orcasim.cost.base import Batch
from orcasim.requests import Requests
from orcasim.schedulers import build_scheduler
from orcasim.schedulers.base import (
    STEP_BY_STEP,
    FastForward,
    Scheduler,
    SchedulerOutput,
    StepResult,
    check_fast_forward_declared,
    empty_output,
)
from orcasim.schedulers.chunked import ChunkedConfig
from orcasim.schedulers.iteration_level import IterationLevelConfig, IterationLevelScheduler
from orcasim.schedulers.paged import PagedConfig
from orcasim.schedulers.request_level import RequestLevelConfig, RequestLevelScheduler
from tests.conftest import make_scenario

CONFIGS: dict[str, Any] = {
    "request_level": RequestLevelConfig(kind="request_level", max_batch_size=1),
    "iteration_level": IterationLevelConfig(kind="iteration_level", max_batch_size=1),
    "paged": PagedConfig(kind="paged", max_num_seqs=1, block_size_tokens=4),
    "prefill_first": PagedConfig(kind="paged", policy="prefill_first", max_num_seqs=1,
                                 block_size_tokens=4),
    "chunked": ChunkedConfig(kind="chunked", max_num_seqs=1, block_size_tokens=4,
                             chunk_size_tokens=64),
}


def _requests(prompt: list[int], output: list[int], max_tokens: int = 64) -> Requests:
    n = len(prompt)
    return Requests(np.zeros(n), np.array(prompt, dtype=np.int64),
                    np.array(output, dtype=np.int64), np.full(n, max_tokens, dtype=np.int64))


@pytest.mark.parametrize("kind", CONFIGS)
def test_what_a_replica_reads_of_a_scheduler_by_hand(kind: str) -> None:
    """One slot, two requests of two output tokens each: the second waits for the first."""
    scheduler = build_scheduler(CONFIGS[kind], _requests([8, 8], [2, 2]), 1024)
    assert not scheduler.has_unfinished() and scheduler.num_requests == 0
    scheduler.add_request(0)
    # One request waiting and none running is unfinished work.
    assert scheduler.has_unfinished()
    assert (scheduler.active_ids(), scheduler.queued_ids(), scheduler.num_requests) == ([], [0], 1)
    scheduler.add_request(1)
    seen = []
    while scheduler.has_unfinished():
        out = scheduler.schedule(0.0)
        assert not out.is_empty
        seen.append((scheduler.active_ids(), list(scheduler.queued_ids()), scheduler.num_requests))
        scheduler.update_from_output(out)
        assert len(seen) < 10
    # Each request takes two iterations (its prompt with its first token, then one decode);
    # while the second runs alone nobody waits, and it is still unfinished work.
    assert seen == [([0], [1], 2), ([0], [1], 2), ([1], [], 1), ([1], [], 1)]
    assert scheduler.num_requests == 0 and scheduler.active_ids() == []


@pytest.mark.parametrize("kind", CONFIGS)
def test_a_run_without_prefix_caching_reports_no_cache_evictions_and_integer_counts(kind: str) -> None:
    scenario = make_scenario(**{"workload.num_requests": 20,
                                "systems": [{"name": kind, "scheduler": CONFIGS[kind].model_dump()}]})
    result = run_scenario(scenario).systems[kind]
    assert result.summary["cache_evictions"] == 0.0
    frame = result.requests
    for column in ("preemptions", "cached_tokens", "prefill_saved_tokens"):
        assert frame[column].dtype == np.int64, column
        assert (frame[column] == 0).all(), column


class OneAtATime(Scheduler):
    """A minimal scheduler on the base class's defaults: one request, one token a step."""

    fast_forward = STEP_BY_STEP

    def schedule(self, now_s: float) -> SchedulerOutput:
        head = self._peek_waiting()
        if head is None:
            return empty_output(0)
        ids = np.array([head], dtype=np.int64)
        one = np.ones(1, dtype=np.int64)
        return SchedulerOutput(ids, one, Batch(one, one), 0)

    def update_from_output(self, out: SchedulerOutput) -> StepResult:
        self.generated[out.req_ids] += 1
        if self.generated[out.req_ids[0]] < self.requests.output_tokens[out.req_ids[0]]:
            return StepResult(out.req_ids)
        self._pop_waiting()
        return StepResult(out.req_ids, out.req_ids)

    def has_unfinished(self) -> bool:
        return self.num_waiting > 0

    def active_ids(self) -> list[int]:
        return []

    def kv_in_use_tokens(self) -> int:
        return 0


def test_the_base_hooks_step_one_iteration_at_a_time() -> None:
    scheduler = OneAtATime(_requests([1, 1], [1, 3], max_tokens=4), kv_capacity_tokens=4)
    scheduler.add_request(0)
    plan = scheduler.schedule(0.0)
    assert scheduler.decode_run(plan) is None and scheduler.continue_run() is None
    assert scheduler.admits_arrival(1)  # always safe
    assert scheduler.cached_prefix_tokens(1) == 0 and scheduler.cache_evictions() == 0
    assert scheduler.held_ids() == []
    first, last = scheduler.advance(plan, None, 1)  # the plan's own iteration
    assert first.finished_ids.tolist() == [0] and last.finished_ids.tolist() == []
    scheduler.add_request(1)
    plan = scheduler.schedule(0.0)
    with pytest.raises(AssertionError, match="advances one iteration"):
        scheduler.advance(plan, None, 2)
    with pytest.raises(NotImplementedError, match="only schedulers whose continue_run returns a run"):
        scheduler.advance_run(None, 1)  # type: ignore[arg-type]  # no continued run exists


@pytest.mark.parametrize("first_token_emitted", [True, False, None])
def test_a_transferred_request_arrives_with_its_prompt_computed(first_token_emitted: bool | None) -> None:
    scheduler = OneAtATime(_requests([5, 7], [3, 3], max_tokens=16), kv_capacity_tokens=16)
    if first_token_emitted is None:  # the default: DistServe's handover, first token emitted
        scheduler.mark_transferred(1)
        first_token_emitted = True
    else:
        scheduler.mark_transferred(1, first_token_emitted)
    # With its first token emitted elsewhere it only decodes; without, its first step
    # computes the last prompt token again to emit that token.
    expected = (7, 1) if first_token_emitted else (6, 0)
    assert (scheduler.computed[1], scheduler.generated[1]) == expected
    assert (scheduler.computed[0], scheduler.generated[0]) == (0, 0)


@pytest.mark.parametrize("kind", ["iteration_level", "paged", "prefill_first", "chunked"])
def test_pulled_kv_is_copied_before_the_iteration_that_admits_it(kind: str) -> None:
    """Three transferred requests, two of them pulled (0.25 s and 0.5 s of copying), and
    room for two: the first plan admits 0 and 1 and waits for both copies, one after the
    other (ends 0.25 and 0.75 s in); request 2, admitted later, is copied then."""
    config = CONFIGS[kind].model_copy(update={"max_batch_size" if kind == "iteration_level"
                                              else "max_num_seqs": 2})
    scheduler = build_scheduler(config, _requests([8, 8, 8], [2, 2, 2]), 1024)
    for req_id, pull_s in ((0, 0.25), (1, 0.5), (2, 2.0)):
        scheduler.mark_transferred(req_id, True, pull_s)
        scheduler.add_request(req_id)
    plan = scheduler.schedule(0.0)
    assert plan.req_ids.tolist() == [0, 1]
    assert plan.pulled == ((0, 0.25), (1, 0.75)) and plan.copy_time_s == 0.75
    scheduler.update_from_output(plan)  # both finish: their second token
    plan = scheduler.schedule(1.0)
    assert plan.req_ids.tolist() == [2] and plan.pulled == ((2, 2.0),)
    assert plan.copy_time_s == 2.0
    scheduler.update_from_output(plan)
    assert scheduler.take_pulled() == (0.0, ()) and not scheduler.has_unfinished()


def _step_by_step(scheduler: RequestLevelScheduler, steps: int) -> tuple[np.ndarray, np.ndarray, list]:
    finished = []
    for _ in range(steps):
        result = scheduler.update_from_output(scheduler.schedule(0.0))
        finished += result.finished_ids.tolist()
    return scheduler.computed.copy(), scheduler.generated.copy(), finished


@pytest.mark.parametrize("padding", [True, False])
@pytest.mark.parametrize("steps_before", [0, 1, 3])
def test_a_static_batch_jump_equals_its_steps(padding: bool, steps_before: int) -> None:
    """`advance(plan, run, n)`, from the batch's start or after some steps (a jump cut short
    and planned again), leaves every member's progress where n steps would, for each n the
    run allows, and only the batch's last step makes its members visible."""
    cfg = RequestLevelConfig(kind="request_level", max_batch_size=3, padding=padding)
    requests = _requests([5, 9, 2], [3, 7, 1])

    def fresh() -> RequestLevelScheduler:
        scheduler = RequestLevelScheduler(cfg, requests, 1024)
        for req_id in range(3):
            scheduler.add_request(req_id)
        _step_by_step(scheduler, steps_before)
        return scheduler

    probe = fresh()
    plan = probe.schedule(0.0)
    run = probe.decode_run(plan)
    assert run is not None
    # Padded, every member runs to the longest output (7); unpadded, the 1-token member
    # leaves the cost after the prompt step and the 3-token one after step 2: a run stops
    # there, where the batch's cost changes.
    assert run.num_steps == {(True, 0): 6, (True, 1): 5, (True, 3): 3,
                             (False, 0): 2, (False, 1): 1, (False, 3): 3}[padding, steps_before]
    for n in range(1, run.num_steps + 2):
        jumped = fresh()
        first, last = jumped.advance(jumped.schedule(0.0), run, n)
        computed, generated, finished = _step_by_step(fresh(), n)
        np.testing.assert_array_equal(jumped.computed, computed)
        np.testing.assert_array_equal(jumped.generated, generated)
        assert first.finished_ids.tolist() + last.finished_ids.tolist() == finished
    if padding:  # to the batch's end: every prompt token and every output token but the last
        np.testing.assert_array_equal(jumped.computed, [5 + 2, 9 + 6, 2 + 0])
        np.testing.assert_array_equal(jumped.generated, [3, 7, 1])
        assert sorted(finished) == [0, 1, 2]


def test_a_static_batch_admits_nobody_until_it_ends() -> None:
    cfg = RequestLevelConfig(kind="request_level", max_batch_size=2)
    scheduler = RequestLevelScheduler(cfg, _requests([4, 4, 4], [2, 2, 2]), 1024)
    assert scheduler.admits_arrival(0)  # idle: the next batch forms from it
    scheduler.add_request(0)
    out = scheduler.schedule(0.0)
    assert out.req_ids.tolist() == [0]
    assert not scheduler.admits_arrival(1)  # a batch of one, not full, still runs alone
    scheduler.update_from_output(out)
    scheduler.update_from_output(scheduler.schedule(0.0))
    assert scheduler.admits_arrival(1)


class _Mixin:
    """Sits between a scheduler and the parent whose contract it restates."""


def test_a_new_contract_may_cover_the_methods_it_overrides() -> None:
    class Greedy(IterationLevelScheduler):
        fast_forward = FastForward(("schedule", "admit_head"), "the same hooks, restated")

        def admit_head(self) -> int | None:
            return super().admit_head()

    check_fast_forward_declared(Greedy)  # accepted, as the class statement already was


def test_the_restated_contract_is_found_past_a_mixin() -> None:
    with pytest.raises(TypeError, match="overrides admit_head, which the fast-forward hooks "
                                        "of IterationLevelScheduler assume"):
        class Mixed(_Mixin, IterationLevelScheduler):
            fast_forward = IterationLevelScheduler.fast_forward

            def admit_head(self) -> int | None:
                return super().admit_head()
