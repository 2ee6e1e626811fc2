"""The fast-forward contract: every scheduler class states what its hooks assume."""

from __future__ import annotations

import pytest
from hypothesis import Phase, find, settings
from test_fast_engine import KINDS, ORCA, _case, scenarios

from orcasim.cost.linear import LinearCost
from orcasim.engine import Engine
from orcasim.metrics import requests_frame
from orcasim.schedulers import build_scheduler
from orcasim.schedulers.base import STEP_BY_STEP, FastForward
from orcasim.schedulers.iteration_level import IterationLevelScheduler
from orcasim.schedulers.paged import PagedConfig


def test_a_subclass_must_restate_the_contract() -> None:
    with pytest.raises(TypeError, match="must declare `fast_forward`"):
        class Silent(IterationLevelScheduler):
            pass


def test_keeping_the_parent_hooks_while_overriding_what_they_assume_is_refused() -> None:
    with pytest.raises(TypeError, match="overrides admit_head"):
        class FirstFit(IterationLevelScheduler):
            fast_forward = IterationLevelScheduler.fast_forward

            def admit_head(self) -> int | None:
                return super().admit_head()


class FirstFit(IterationLevelScheduler):
    """The issue's case: admit the first waiting request that fits, not only the head."""

    fast_forward = STEP_BY_STEP

    def admit_head(self) -> int | None:
        for k in range(self._waiting_head, len(self.waiting)):
            req = self.waiting[k]
            need = int(self.reservation_tokens[req])
            if self.reserved_tokens + need <= self.kv_capacity_tokens:
                del self.waiting[k]
                self.reserved_tokens += need
                self.running.append(req)
                return req
        return None


def _first_fit_run(case: dict, mode: str):
    requests = case["requests"]
    scheduler = FirstFit(ORCA, requests, case["kv_capacity_tokens"])
    engine = Engine(requests, scheduler, LinearCost(case["cost"]), mode)
    return requests_frame(requests, engine.run().recorder)


def test_a_subclass_that_steps_is_exact_in_fast_mode() -> None:
    # Request 0 reserves 80 of 100 tokens; 1 (needs 60) waits; 2 (needs 20) skips ahead.
    case = _case([0.0, 0.1, 0.2], [40, 40, 10], [10, 2, 2], ORCA)
    case["requests"].max_tokens[:] = [80, 60, 20]
    case["kv_capacity_tokens"] = 100
    fast, ref = _first_fit_run(case, "fast"), _first_fit_run(case, "reference")
    assert fast["finish_s"].tolist() == ref["finish_s"].tolist()
    assert ref["first_scheduled_s"].tolist() == [0.0, 10.0, 1.0]  # 2 went ahead of 1


# Any drawn case will do: the first, without shrinking it to the smallest.
FIRST_DRAWN = settings(phases=[Phase.generate], max_examples=1, database=None)


def test_every_kind_declares_a_contract() -> None:
    for kind in KINDS:
        case = find(scenarios(kinds=(kind,)), lambda c: True, settings=FIRST_DRAWN)
        requests = case["requests"].for_run()
        scheduler = build_scheduler(case["scheduler"], requests, case["kv_capacity_tokens"], 1.0)
        declared = type(scheduler).__dict__["fast_forward"]
        assert isinstance(declared, FastForward) and declared.enabled, kind
        assert all(hasattr(scheduler, name) for name in declared.assumes), kind


def test_prefill_first_declares_its_own_contract() -> None:
    cfg = PagedConfig(kind="paged", policy="prefill_first", max_num_seqs=8)
    requests = _case([0.0], [4], [4], cfg)["requests"]
    scheduler = build_scheduler(cfg, requests, 1024)
    assert type(scheduler).fast_forward is not IterationLevelScheduler.fast_forward
    assert "_swap_in" in type(scheduler).fast_forward.assumes
