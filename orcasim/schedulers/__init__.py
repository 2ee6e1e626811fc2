"""Schedulers: pure state machines that pick each iteration's batch. One file per kind."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from orcasim.requests import Requests
from orcasim.schedulers.base import Scheduler, SchedulerOutput, StepResult
from orcasim.schedulers.chunked import ChunkedConfig, ChunkedScheduler
from orcasim.schedulers.iteration_level import IterationLevelConfig, IterationLevelScheduler
from orcasim.schedulers.paged import PagedConfig, PagedScheduler
from orcasim.schedulers.request_level import RequestLevelConfig, RequestLevelScheduler

SchedulerConfig = Annotated[
    RequestLevelConfig | IterationLevelConfig | PagedConfig | ChunkedConfig,
    Field(discriminator="kind"),
]


def build_scheduler(cfg: SchedulerConfig, requests: Requests, kv_capacity_tokens: int) -> Scheduler:
    """Explicit factory: one line per scheduler kind."""
    match cfg:
        case RequestLevelConfig():
            return RequestLevelScheduler(cfg, requests, kv_capacity_tokens)
        case IterationLevelConfig():
            return IterationLevelScheduler(cfg, requests, kv_capacity_tokens)
        case PagedConfig():
            return PagedScheduler(cfg, requests, kv_capacity_tokens)
        case ChunkedConfig():
            return ChunkedScheduler(cfg, requests, kv_capacity_tokens)
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
