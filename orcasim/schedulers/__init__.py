"""Schedulers: pure state machines that pick each iteration's batch. One file per kind."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from orcasim.requests import Requests
from orcasim.schedulers.base import Scheduler, SchedulerOutput, StepResult
from orcasim.schedulers.chunked import ChunkedConfig, ChunkedScheduler
from orcasim.schedulers.distserve_decode import DistServeDecodeScheduler
from orcasim.schedulers.iteration_level import IterationLevelConfig, IterationLevelScheduler
from orcasim.schedulers.paged import PagedConfig, PagedScheduler
from orcasim.schedulers.prefill_first import PrefillFirstScheduler
from orcasim.schedulers.request_level import RequestLevelConfig, RequestLevelScheduler

SchedulerConfig = Annotated[
    RequestLevelConfig | IterationLevelConfig | PagedConfig | ChunkedConfig,
    Field(discriminator="kind"),
]


def build_scheduler(
    cfg: SchedulerConfig, requests: Requests, kv_capacity_tokens: int,
    kv_bytes_per_token: float | None = None, kv_groups: int = 1,
) -> Scheduler:
    """Explicit factory: one line per scheduler kind (and paged policy).

    `kv_bytes_per_token`: one GPU's share of a token's KV, from the deployment when the
    scenario has one; paged schedulers copy it when they swap. `kv_groups`: the
    data-parallel attention groups the pool is split over (a request fits in one).
    """
    kv, groups = kv_capacity_tokens, kv_groups
    match cfg:
        case RequestLevelConfig():
            return RequestLevelScheduler(cfg, requests, kv, groups)
        case IterationLevelConfig():
            return IterationLevelScheduler(cfg, requests, kv, groups)
        case PagedConfig(policy="prefill_first"):
            return PrefillFirstScheduler(cfg, requests, kv, kv_bytes_per_token, groups)
        case PagedConfig(policy="distserve_decode"):
            return DistServeDecodeScheduler(cfg, requests, kv, kv_bytes_per_token, groups)
        case PagedConfig():
            return PagedScheduler(cfg, requests, kv, kv_bytes_per_token, groups)
        case ChunkedConfig():
            return ChunkedScheduler(cfg, requests, kv, kv_bytes_per_token, groups)
    raise AssertionError(f"unhandled scheduler config {cfg!r}")


def reserves_max_tokens(cfg: SchedulerConfig) -> bool:
    """True if the scheduler reserves each request's `max_tokens` of KV at admission."""
    match cfg:
        case RequestLevelConfig():
            return True
        case IterationLevelConfig():
            return cfg.kv_reservation == "max"
    return False


__all__ = ["Scheduler", "SchedulerConfig", "SchedulerOutput", "StepResult", "build_scheduler",
           "reserves_max_tokens"]
