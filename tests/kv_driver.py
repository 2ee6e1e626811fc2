"""Drive a scheduler in plain Python (no SimPy), as vLLM's scheduler tests do.

Request i is added once `step >= arrival_s[i]` (arrival times read as step numbers).
After every plan, `check` sees the scheduler and the plan, so tests assert invariants
at each step; the driver itself checks what every scheduler owes: requests finish once,
emit exactly their output tokens, and the loop terminates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from orcasim.memory import blocks_for
from orcasim.requests import Requests
from orcasim.schedulers.base import Scheduler, SchedulerOutput

MAX_STEPS = 200_000


@dataclass
class Trace:
    plans: list[SchedulerOutput] = field(default_factory=list)
    first_token_step: dict[int, int] = field(default_factory=dict)
    finish_step: dict[int, int] = field(default_factory=dict)
    emitted_tokens: np.ndarray | None = None  # per request, counted from the plans


def make_requests(prompts: list[int], outputs: list[int], arrivals: list[float] | None = None,
                  max_tokens: int | None = None) -> Requests:
    n = len(prompts)
    total = np.array(prompts) + np.array(outputs)
    cap = max_tokens if max_tokens is not None else int(total.max())
    return Requests(
        np.array(arrivals if arrivals is not None else [0.0] * n, dtype=np.float64),
        np.array(prompts, dtype=np.int64), np.array(outputs, dtype=np.int64),
        np.full(n, cap, dtype=np.int64),
    )


def drive(sched: Scheduler, reqs: Requests,
          check: Callable[[Scheduler, SchedulerOutput], None] = lambda s, o: None) -> Trace:
    trace = Trace(emitted_tokens=np.zeros(len(reqs), dtype=np.int64))
    added, step = 0, 0
    while added < len(reqs) or sched.has_unfinished():
        while added < len(reqs) and reqs.arrival_s[added] <= step:
            sched.add_request(added)
            added += 1
        out = sched.schedule(float(step))
        check(sched, out)
        if out.is_empty:
            if added == len(reqs):
                assert not sched.has_unfinished(), "idle with unfinished requests, no arrivals"
                break
            step = max(step + 1, int(np.ceil(reqs.arrival_s[added])))
            continue
        generated_before = sched.generated.copy()
        res = sched.update_from_output(out)
        trace.emitted_tokens += sched.generated - generated_before
        trace.plans.append(out)
        for r in res.first_token_ids.tolist():
            assert r not in trace.first_token_step, f"request {r} got two first tokens"
            trace.first_token_step[r] = step
        for r in res.finished_ids.tolist():
            assert r not in trace.finish_step, f"request {r} finished twice"
            trace.finish_step[r] = step
        step += 1
        assert step < MAX_STEPS, "scheduler did not terminate"
    return trace


def planned_tokens(trace: Trace) -> list[dict[int, int]]:
    """Each plan as {request id: tokens it computes}, for exact-trace assertions."""
    return [dict(zip(p.req_ids.tolist(), p.num_new_tokens.tolist(), strict=True)) for p in trace.plans]


def assert_all_served(sched: Scheduler, reqs: Requests, trace: Trace) -> None:
    """Every request not rejected finished once with exactly its output tokens."""
    rejected = set(sched.rejected_ids)
    served = [i for i in range(len(reqs)) if i not in rejected]
    assert sorted(trace.finish_step) == served
    assert trace.emitted_tokens is not None
    assert np.array_equal(trace.emitted_tokens[served], reqs.output_tokens[served])
    assert np.all(trace.emitted_tokens[sorted(rejected)] == 0)


def check_paged_step(sched, out: SchedulerOutput) -> None:
    """Invariants every paged plan keeps (the scheduler is in its pre-update state)."""
    alloc = sched.allocator
    alloc.check_invariants()
    ids = out.req_ids.tolist()
    assert len(ids) == len(set(ids)) and len(ids) <= sched.cfg.max_num_seqs
    assert int(out.num_new_tokens.sum()) <= sched.token_budget
    assert out.kv_used_tokens is not None
    assert out.kv_used_tokens <= out.kv_reserved_tokens == alloc.allocated_tokens
    assert alloc.allocated_tokens <= sched.kv_capacity_tokens
    assert sched.swapped_blocks <= sched.swap_capacity_blocks
    for req, new in zip(ids, out.num_new_tokens.tolist(), strict=True):
        holds = alloc.num_blocks_of(req) * alloc.block_size_tokens
        assert holds >= sched.computed[req] + new, f"request {req} computes into KV it lacks"
    # Exactly the blocks its tokens need, no spare (the fast-forward hooks rely on it).
    planned = dict(zip(ids, out.num_new_tokens.tolist(), strict=True))
    for req in sched.running:
        tokens = int(sched.computed[req]) + planned.get(req, 0)
        assert alloc.num_blocks_of(req) == blocks_for(tokens, alloc.block_size_tokens)


def assert_paged_end_state(sched, reqs: Requests, trace: Trace) -> None:
    """All blocks back, nothing left in CPU, and every recomputed token accounted for."""
    assert_all_served(sched, reqs, trace)
    assert sched.allocator.num_free_blocks == sched.allocator.num_blocks
    assert not sched.allocator.tables and sched.swapped_blocks == 0
    assert sched.preemptions_per_request.sum() == sched.preemptions_total
    assert sum(p.preemptions for p in trace.plans) == sched.preemptions_total
    served = [i for i in range(len(reqs)) if i not in set(sched.rejected_ids)]
    # Each step either makes new progress or redoes tokens lost to a recompute preemption.
    useful = int((reqs.prompt_tokens[served] + reqs.output_tokens[served] - 1).sum())
    computed = sum(int(p.num_new_tokens.sum()) for p in trace.plans)
    assert computed == useful + sched.recomputed_tokens_total
    assert sum(p.recomputed_tokens for p in trace.plans) == sched.recomputed_tokens_total
