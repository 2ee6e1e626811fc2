"""Scheduler invariants, driven in plain Python with no SimPy and no clock.

A random stream of requests is fed in over time; after every step we check the batch
bound, the KV bound, FCFS admission, exactly-once completion and (request-level) that
no member of a static batch finishes before the batch's last iteration.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orcasim.requests import Requests
from orcasim.schedulers import build_scheduler
from orcasim.schedulers.iteration_level import IterationLevelConfig
from orcasim.schedulers.request_level import RequestLevelConfig
from tests.conftest import examples

MAX_STEPS = 20_000


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Requests, int, list[int]]:
    n = draw(st.integers(1, 25))
    prompt = np.array(draw(st.lists(st.integers(1, 40), min_size=n, max_size=n)), dtype=np.int64)
    output = np.array(draw(st.lists(st.integers(1, 20), min_size=n, max_size=n)), dtype=np.int64)
    max_tokens = int((prompt + output).max()) + draw(st.integers(0, 20))
    capacity = max_tokens * draw(st.integers(1, 6))
    # How many new requests arrive before each step (arrival order is id order).
    arrivals = draw(st.lists(st.integers(0, 3), min_size=1, max_size=60))
    reqs = Requests(np.arange(n, dtype=np.float64), prompt, output,
                    np.full(n, max_tokens, dtype=np.int64))
    return reqs, capacity, arrivals


def drive(scheduler, reqs: Requests, arrivals: list[int], check) -> dict[int, int]:  # noqa: ANN001
    """Run the scheduler to completion; returns request id -> step at which it finished."""
    added, finished_at, step = 0, {}, 0
    while step < MAX_STEPS:
        burst = arrivals[step] if step < len(arrivals) else len(reqs)
        for _ in range(min(burst, len(reqs) - added)):
            scheduler.add_request(added)
            added += 1
        out = scheduler.schedule(now_s=float(step))
        check(scheduler, out)
        if not out.is_empty:
            result = scheduler.update_from_output(out)
            for r in result.finished_ids.tolist():
                assert r not in finished_at, f"request {r} finished twice"
                finished_at[r] = step
        elif added == len(reqs) and not scheduler.has_unfinished():
            break
        step += 1
    assert len(finished_at) == len(reqs), "some requests never finished"
    np.testing.assert_array_equal(scheduler.generated, reqs.output_tokens)
    return finished_at


def common_checks(max_batch_size: int, capacity: int):  # noqa: ANN201
    admitted_order: list[int] = []

    def check(scheduler, out) -> None:  # noqa: ANN001
        assert len(out.req_ids) <= max_batch_size
        assert out.kv_reserved_tokens <= capacity
        for r in out.req_ids.tolist():
            if r not in admitted_order:
                admitted_order.append(r)
        assert admitted_order == sorted(admitted_order), "admission is not FCFS"

    return check


@settings(max_examples=examples(150), deadline=None)
@given(workloads(), st.integers(1, 8))
def test_iteration_level_invariants(w, max_batch_size: int) -> None:  # noqa: ANN001
    reqs, capacity, arrivals = w
    cfg = IterationLevelConfig(kind="iteration_level", max_batch_size=max_batch_size)
    sched = build_scheduler(cfg, reqs, capacity)
    drive(sched, reqs, arrivals, common_checks(max_batch_size, capacity))
    assert sched.reserved_tokens == 0


@settings(max_examples=examples(150), deadline=None)
@given(workloads(), st.integers(1, 8), st.booleans())
def test_request_level_invariants(w, max_batch_size: int, padding: bool) -> None:  # noqa: ANN001
    reqs, capacity, arrivals = w
    cfg = RequestLevelConfig(kind="request_level", max_batch_size=max_batch_size, padding=padding)
    sched = build_scheduler(cfg, reqs, capacity)
    batches: list[tuple[int, list[int]]] = []  # (first step, members)
    base_check = common_checks(max_batch_size, capacity)

    def check(s, out) -> None:  # noqa: ANN001
        base_check(s, out)
        if not out.is_empty and (not batches or batches[-1][1] != out.req_ids.tolist()):
            batches.append((len(batches), out.req_ids.tolist()))

    finished_at = drive(sched, reqs, arrivals, check)
    for _, members in batches:
        steps = {finished_at[m] for m in members}
        assert len(steps) == 1, "a static batch's members finished at different iterations"


def test_orca_selective_batching_mixes_prefill_and_decode() -> None:
    reqs = Requests(np.array([0.0, 1.0]), np.array([5, 7]), np.array([3, 2]), np.array([20, 20]))
    sched = build_scheduler(IterationLevelConfig(kind="iteration_level", max_batch_size=2), reqs, 100)
    sched.add_request(0)
    out = sched.schedule(0.0)
    assert out.num_new_tokens.tolist() == [5] and out.batch.context_tokens.tolist() == [5]
    sched.update_from_output(out)
    sched.add_request(1)
    out = sched.schedule(1.0)
    # Request 0 decodes one token while request 1's whole prompt joins the same iteration.
    assert out.req_ids.tolist() == [0, 1]
    assert out.num_new_tokens.tolist() == [1, 7]
    assert out.batch.context_tokens.tolist() == [6, 7]
    assert out.kv_reserved_tokens == 40


def test_orca_admission_stops_at_first_request_that_does_not_fit() -> None:
    reqs = Requests(np.zeros(3), np.array([4, 4, 4]), np.array([2, 2, 2]), np.array([10, 30, 10]))
    sched = build_scheduler(IterationLevelConfig(kind="iteration_level", max_batch_size=3), reqs, 35)
    for i in range(3):
        sched.add_request(i)
    out = sched.schedule(0.0)
    assert out.req_ids.tolist() == [0]  # request 1 needs 30 > 25 free; request 2 may not skip it



def _orca_with(max_tokens: list[int], max_batch_size: int, capacity: int):  # noqa: ANN202
    n = len(max_tokens)
    reqs = Requests(np.zeros(n), np.full(n, 4), np.full(n, 2), np.array(max_tokens))
    cfg = IterationLevelConfig(kind="iteration_level", max_batch_size=max_batch_size)
    return build_scheduler(cfg, reqs, capacity)


def test_orca_admits_an_arrival_that_fits_exactly_and_nothing_past_the_kv() -> None:
    """`admits_arrival` (where a fast-mode jump must be cut) says what `schedule` would do:
    an exact fit of the free KV joins, one token more does not; one larger than the whole
    cache is turned away, so it is a yes (a later arrival might join)."""
    sched = _orca_with([20, 40, 60, 41, 61], max_batch_size=4, capacity=60)
    assert sched.admits_arrival(2)  # 60 of 60, nothing reserved
    assert sched.admits_arrival(4)  # 61 > 60: never fits
    sched.add_request(0)
    sched.update_from_output(sched.schedule(0.0))  # 0 runs, 20 reserved
    assert sched.admits_arrival(1)  # 20 + 40 = 60: exact fit
    assert not sched.admits_arrival(3)  # 20 + 41 = 61
    assert not sched.admits_arrival(2)  # the whole cache, but 20 are taken


def test_orca_admits_no_arrival_into_a_full_batch_or_behind_a_waiting_head() -> None:
    full = _orca_with([10, 10, 10], max_batch_size=2, capacity=100)
    for i in range(2):
        full.add_request(i)
    full.update_from_output(full.schedule(0.0))
    assert len(full.running) == 2 and not full.admits_arrival(2)  # KV has room; the batch has none
    fcfs = _orca_with([20, 41, 10], max_batch_size=4, capacity=60)
    fcfs.add_request(0)
    fcfs.update_from_output(fcfs.schedule(0.0))
    fcfs.add_request(1)  # 20 + 41 > 60: it waits at the head
    fcfs.update_from_output(fcfs.schedule(1.0))
    assert fcfs.num_waiting == 1
    assert not fcfs.admits_arrival(2)  # 10 would fit, but FCFS never skips the head


def test_request_level_waits_for_max_queue_delay() -> None:
    reqs = Requests(np.array([0.0, 0.1]), np.array([4, 4]), np.array([2, 2]), np.array([10, 10]))
    cfg = RequestLevelConfig(kind="request_level", max_batch_size=4, max_queue_delay_s=0.5)
    sched = build_scheduler(cfg, reqs, 100)
    sched.add_request(0)
    out = sched.schedule(0.0)
    assert out.is_empty and out.wake_at_s == 0.5
    sched.add_request(1)
    out = sched.schedule(0.5)
    assert out.req_ids.tolist() == [0, 1]


def test_request_level_padding_costs_the_longest_member() -> None:
    reqs = Requests(np.zeros(2), np.array([3, 9]), np.array([1, 4]), np.array([20, 20]))
    sched = build_scheduler(RequestLevelConfig(kind="request_level", max_batch_size=2), reqs, 100)
    sched.add_request(0)
    sched.add_request(1)
    out = sched.schedule(0.0)
    assert out.batch.query_tokens.tolist() == [9, 9]
    steps = 0
    while not out.is_empty:
        result = sched.update_from_output(out)
        steps += 1
        out = sched.schedule(0.0)
    assert steps == 4 and result.finished_ids.tolist() == [0, 1]


def _static_steps(padding: bool) -> tuple[list[tuple[list[int], ...]], object]:
    """Every plan of a static batch of prompts [3, 9] and outputs [2, 4], and the scheduler."""
    reqs = Requests(np.zeros(2), np.array([3, 9]), np.array([2, 4]), np.array([20, 20]))
    cfg = RequestLevelConfig(kind="request_level", max_batch_size=2, padding=padding,
                             max_queue_delay_s=10.0)
    sched = build_scheduler(cfg, reqs, 100)
    assert sched.schedule(0.0).kv_reserved_tokens == 0  # idle: nothing reserved
    sched.add_request(0)
    sched.add_request(1)
    steps, out = [], sched.schedule(0.0)  # a full batch forms at once, before the delay
    results = []
    while not out.is_empty:
        assert out.kv_reserved_tokens == 40  # both reservations (max_tokens), held throughout
        steps.append((out.num_new_tokens.tolist(), out.batch.query_tokens.tolist(),
                      out.batch.context_tokens.tolist()))
        results.append(sched.update_from_output(out))
        out = sched.schedule(0.0)
    assert [r.finished_ids.tolist() for r in results] == [[], [], [], [0, 1]]
    assert results[-1].first_token_ids.tolist() == [0, 1]  # tokens reach users at the end
    assert sched.computed.tolist() == [4, 12] and sched.generated.tolist() == [2, 4]
    return steps, sched


def test_a_static_batch_by_hand_unpadded() -> None:
    """Request 0 (2 tokens) stops computing after step 1 and leaves the cost; request 1 runs on."""
    steps, _ = _static_steps(padding=False)
    assert steps == [([3, 9], [3, 9], [3, 9]), ([1, 1], [1, 1], [4, 10]),
                     ([0, 1], [1], [11]), ([0, 1], [1], [12])]


def test_a_static_batch_by_hand_padded() -> None:
    """Padded, both members cost as the longest prompt for the longest output."""
    steps, _ = _static_steps(padding=True)
    assert steps == [([3, 9], [9, 9], [9, 9]), ([1, 1], [1, 1], [10, 10]),
                     ([0, 1], [1, 1], [11, 11]), ([0, 1], [1, 1], [12, 12])]


def test_a_padded_static_batch_fits_its_padded_length_in_kv() -> None:
    """Prompts 10 and 500, outputs 500 and 10, max_tokens 510 each on a 1,020-token cache:
    their reservations fit, but padded, each runs at 1,000 positions (2,000 in all), so
    they go in two batches; unpadded, in one."""
    reqs = Requests(np.zeros(2), np.array([10, 500]), np.array([500, 10]), np.array([510, 510]))
    for padding, batches in ((True, [[0], [1]]), (False, [[0, 1]])):
        sched = build_scheduler(RequestLevelConfig(kind="request_level", max_batch_size=2,
                                                   padding=padding), reqs, 1020)
        sched.add_request(0)
        sched.add_request(1)
        formed, out = [], sched.schedule(0.0)
        while not out.is_empty:
            if not formed or formed[-1] != out.req_ids.tolist():
                formed.append(out.req_ids.tolist())
            assert out.batch.total_context_tokens <= 1020, padding
            sched.update_from_output(out)
            out = sched.schedule(0.0)
        assert formed == batches, padding
