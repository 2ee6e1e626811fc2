"""Each router's choice, by hand, on replicas whose loads are set directly.

The cluster tests (tests/test_cluster.py) check routers through what they do to a run:
queueing theory, the join-the-shortest-queue ordering, nothing lost. Those would not
notice a router that reads the wrong field of a load, breaks ties the wrong way, or
compares at the wrong side of a threshold. Here every router picks among stand-in
replicas that report fixed loads, and the pick is worked out by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from orcasim.cluster import (
    LeastKvRouter,
    LeastKvRouterConfig,
    LeastOutstandingRouter,
    LeastOutstandingRouterConfig,
    LeastTokensRouter,
    LeastTokensRouterConfig,
    PowerOfTwoRouter,
    PowerOfTwoRouterConfig,
    PrefixAffinityRouter,
    PrefixAffinityRouterConfig,
    RandomRouter,
    RandomRouterConfig,
    RoundRobinRouter,
    RoundRobinRouterConfig,
    RoutedRouter,
    SessionRouter,
    SessionRouterConfig,
    build_router,
)
from orcasim.replica import Load

PROMPT_TOKENS = 100  # every request's prompt, for the prefix-affinity thresholds


@dataclass
class _Requests:
    prompt_tokens: np.ndarray = field(default_factory=lambda: np.full(8, PROMPT_TOKENS))


@dataclass
class _Scheduler:
    cached_tokens: int = 0
    requests: _Requests = field(default_factory=_Requests)

    def cached_prefix_tokens(self, req_id: int) -> int:
        return self.cached_tokens


@dataclass
class _Replica:
    """Reports a fixed load; notes the times it was asked at."""

    index: int
    running: int = 0
    waiting: int = 0
    outstanding_tokens: int = 0
    kv_used_tokens: int = 0
    kv_capacity_tokens: int = 1000
    scheduler: _Scheduler = field(default_factory=_Scheduler)
    asked_at_s: list[float] = field(default_factory=list)

    def load(self, time_s: float) -> Load:
        self.asked_at_s.append(time_s)
        return Load(self.running, self.waiting, 0, self.outstanding_tokens,
                    self.kv_used_tokens, self.kv_capacity_tokens)

    def num_requests(self, time_s: float) -> int:
        self.asked_at_s.append(time_s)
        return self.running + self.waiting


def _fleet(n: int, **columns: list[int]) -> list[_Replica]:
    return [_Replica(i, **{k: v[i] for k, v in columns.items()}) for i in range(n)]


class _Choices:
    """A stand-in generator whose `choice` returns given pairs (power of two)."""

    def __init__(self, pairs: list[tuple[int, int]]) -> None:
        self.pairs, self.calls = list(pairs), []

    def choice(self, n: int, size: int, replace: bool) -> np.ndarray:
        self.calls.append((n, size, replace))
        return np.array(self.pairs.pop(0))


def _picks(router, num: int, time_s: float = 1.0) -> list[int]:  # noqa: ANN001 - any router
    return [router(r, time_s).index for r in range(num)]


def test_round_robin_goes_in_turn() -> None:
    assert _picks(RoundRobinRouter(_fleet(3), np.random.default_rng(0)), 7) == [0, 1, 2, 0, 1, 2, 0]


def test_random_draws_uniformly_from_the_run_s_generator() -> None:
    picks = _picks(RandomRouter(_fleet(5), np.random.default_rng(7)), 50)
    rng = np.random.default_rng(7)
    assert picks == [int(rng.integers(5)) for _ in range(50)]
    assert set(picks) == set(range(5))  # every replica, the last included


def test_an_idle_fleet_is_filled_in_turn() -> None:
    # Every load equal: ties go to the first replica after the one chosen last.
    for cls in (LeastOutstandingRouter, LeastTokensRouter, LeastKvRouter):
        assert _picks(cls(_fleet(3), np.random.default_rng(0)), 5) == [0, 1, 2, 0, 1]


def test_a_tie_goes_to_the_first_after_the_last_chosen() -> None:
    fleet = _fleet(4, running=[1, 0, 3, 0])
    router = LeastOutstandingRouter(fleet, np.random.default_rng(0))
    router.last = 1  # 1 and 3 tie at 0: 3 comes first after 1
    assert router(0, 1.0).index == 3
    router.last = 3  # after 3 the search wraps to 0 (1 request), then 1 (0): 1
    assert router(0, 1.0).index == 1
    router.last = 0  # 1 is the first after 0, and a later tie does not displace it
    assert router(0, 1.0).index == 1


def test_least_outstanding_counts_running_and_waiting() -> None:
    # 0: 2 running; 1: 1 running + 2 waiting; 2: 3 waiting; 3: 1 running + 1 waiting.
    fleet = _fleet(4, running=[2, 1, 0, 1], waiting=[0, 2, 3, 1])
    router = LeastOutstandingRouter(fleet, np.random.default_rng(0))
    router.last = 3  # so that a tie would go to 0 first: 0 has 2, 3 has 2; 0 is first after 3
    assert router(0, 1.0).index == 0
    fleet[0].waiting = 1  # now 3 alone has the fewest
    assert router(1, 1.5).index == 3
    assert all(r.asked_at_s == [1.0, 1.5] for r in fleet)  # each asked at the arrival time


def test_least_tokens_reads_outstanding_tokens_not_requests() -> None:
    # Replica 0 has fewer requests but more tokens outstanding.
    fleet = _fleet(3, running=[1, 4, 4], outstanding_tokens=[900, 300, 500])
    router = LeastTokensRouter(fleet, np.random.default_rng(0))
    assert router(0, 2.5).index == 1
    assert all(r.asked_at_s == [2.5] for r in fleet)  # each asked at the arrival time


def test_least_kv_reads_kv_in_use_as_a_share_of_each_pool() -> None:
    # As vLLM reports kv_cache_usage: 100 of 300 (33%) is less used than 400 of 1000 (40%),
    # though replica 1 has more tokens free (600 against 200). By free tokens, a mixed
    # fleet's larger replicas took every request (a tester's run of the README's example).
    fleet = _fleet(3, kv_used_tokens=[100, 400, 500], kv_capacity_tokens=[300, 1000, 1000])
    router = LeastKvRouter(fleet, np.random.default_rng(0))
    assert router(0, 3.0).index == 0
    assert all(r.asked_at_s == [3.0] for r in fleet)
    # The share, not the tokens in use weighed by the pool: 300 of 1,000 (30%) is less used
    # than 100 of 200 (50%), though 300 x 1,000 is more than 100 x 200 (a mutant's reading).
    fleet = _fleet(2, kv_used_tokens=[100, 300], kv_capacity_tokens=[200, 1000])
    assert LeastKvRouter(fleet, np.random.default_rng(0))(0, 3.0).index == 1


def test_power_of_two_takes_the_less_loaded_of_two_distinct_draws() -> None:
    fleet = _fleet(4, running=[5, 1, 3, 1])
    rng = _Choices([(0, 2), (2, 0), (1, 3), (3, 1), (2, 1)])
    router = PowerOfTwoRouter(fleet, rng)  # type: ignore[arg-type]  # a stand-in generator
    # Fewer requests wins either way round; a tie stays with the first drawn.
    assert _picks(router, 5) == [2, 2, 1, 3, 1]
    assert rng.calls == [(4, 2, False)] * 5


def test_power_of_two_on_one_replica_draws_nothing() -> None:
    rng = _Choices([])
    assert _picks(PowerOfTwoRouter(_fleet(1), rng), 3) == [0, 0, 0]  # type: ignore[arg-type]
    assert rng.calls == []


def test_power_of_two_with_a_real_generator_never_draws_one_replica_twice() -> None:
    # Two replicas: the draw is always both, so the less loaded one always wins.
    fleet = _fleet(2, running=[3, 0])
    router = PowerOfTwoRouter(fleet, np.random.default_rng(1))
    assert _picks(router, 20) == [1] * 20


def _affinity(cached: list[int], requests: list[int], **cfg: float) -> PrefixAffinityRouter:
    fleet = _fleet(len(cached), running=requests)
    for replica, tokens in zip(fleet, cached, strict=True):
        replica.scheduler.cached_tokens = tokens
    config = PrefixAffinityRouterConfig(kind="prefix_affinity", **cfg)
    return PrefixAffinityRouter(fleet, np.random.default_rng(0), config)


def test_prefix_affinity_goes_to_the_longest_cached_prefix() -> None:
    # Replica 2 holds 80 of the 100 prompt tokens, more than half: it wins though busier.
    assert _affinity([10, 60, 80], [0, 1, 5])(0, 1.0).index == 2


def test_prefix_affinity_on_one_replica_picks_it() -> None:
    assert _affinity([80], [3])(0, 1.0).index == 0
    assert _affinity([0], [3])(0, 1.0).index == 0


def test_prefix_affinity_ties_on_the_prefix_go_to_the_less_loaded() -> None:
    assert _affinity([80, 30, 80, 80], [6, 0, 2, 4])(0, 1.0).index == 2


def test_prefix_affinity_below_the_cache_threshold_goes_to_the_least_loaded() -> None:
    # 50 of 100 tokens is not more than half: the least loaded (replica 0) wins.
    assert _affinity([0, 50, 20], [1, 3, 2])(0, 1.0).index == 0
    # Just over half is enough.
    assert _affinity([0, 51, 20], [1, 3, 2])(0, 1.0).index == 1
    # Nothing cached anywhere, even at a threshold of 0: the least loaded.
    assert _affinity([0, 0, 0], [4, 3, 5], cache_threshold=0.0)(0, 1.0).index == 1
    # A threshold of 0 lets any cached prefix win.
    assert _affinity([0, 1, 0], [0, 9, 0], cache_threshold=0.0)(0, 1.0).index == 1


def test_prefix_affinity_out_of_balance_goes_to_the_least_loaded() -> None:
    # Loads 40 and 5 differ by 35 > 32 requests and by a ratio 8 > 1.0001: balance first,
    # though replica 0 holds the whole prompt.
    assert _affinity([100, 0], [40, 5])(0, 1.0).index == 1
    # A difference of exactly 32 is not more than the threshold: the cache decides.
    assert _affinity([100, 0], [37, 5])(0, 1.0).index == 0
    # Both conditions must hold: 35 apart but a ratio of 1.5 under a relative threshold of 2.
    assert _affinity([100, 0], [105, 70], balance_rel_threshold=2.0)(0, 1.0).index == 0
    # A ratio exactly at the threshold is not above it.
    assert _affinity([100, 0], [80, 40], balance_abs_threshold=10,
                     balance_rel_threshold=2.0)(0, 1.0).index == 0
    assert _affinity([100, 0], [81, 40], balance_abs_threshold=10,
                     balance_rel_threshold=2.0)(0, 1.0).index == 1


def test_prefix_affinity_thresholds_default_to_sglang_s() -> None:
    cfg = PrefixAffinityRouterConfig(kind="prefix_affinity")
    assert (cfg.cache_threshold, cfg.balance_abs_threshold, cfg.balance_rel_threshold) == (
        0.5, 32, 1.0001)


def test_prefix_affinity_asks_every_replica_at_the_arrival_time() -> None:
    router = _affinity([0, 80], [0, 0])
    router(0, 4.5)
    assert all(r.asked_at_s == [4.5] for r in router.replicas)  # type: ignore[attr-defined]


def test_session_keeps_a_session_where_its_first_request_went() -> None:
    fleet = _fleet(3)
    fallback = LeastOutstandingRouter(fleet, np.random.default_rng(0))
    sessions = np.array([7, 8, 7, 9, 8, 7])
    router = SessionRouter(fleet, np.random.default_rng(0), fallback, sessions)
    picks = []
    for req in range(6):
        replica = router(req, 1.0)
        replica.running += 1  # it is busier now
        picks.append(replica.index)
    # Sessions 7, 8 and 9 start on 0, 1, 2 (least loaded, ties in turn); the rest follow.
    assert picks == [0, 1, 0, 2, 1, 0]
    assert router.home == {7: 0, 8: 1, 9: 2}


def test_session_placement_moves_the_fallback_s_turn() -> None:
    # A new session placed by round robin: the fallback's turn advances only on new sessions.
    fleet = _fleet(3)
    fallback = RoundRobinRouter(fleet, np.random.default_rng(0))
    router = SessionRouter(fleet, np.random.default_rng(0), fallback, np.array([1, 1, 2, 2, 3]))
    assert _picks(router, 5) == [0, 0, 1, 1, 2]


def test_requests_without_sessions_are_routed_one_by_one() -> None:
    fleet = _fleet(3)
    router = SessionRouter(fleet, np.random.default_rng(0),
                           RoundRobinRouter(fleet, np.random.default_rng(0)), None)
    assert _picks(router, 4) == [0, 1, 2, 0]


def test_a_routed_router_notes_each_request_s_replica() -> None:
    assigned = np.full(4, -1, dtype=np.int64)
    routed = RoutedRouter(RoundRobinRouter(_fleet(3), np.random.default_rng(0)), assigned)
    for req in (2, 0, 3):
        routed(req, 1.0)
    assert assigned.tolist() == [1, -1, 0, 2]


@pytest.mark.parametrize(("config", "cls"), [
    (RandomRouterConfig(kind="random"), RandomRouter),
    (RoundRobinRouterConfig(kind="round_robin"), RoundRobinRouter),
    (LeastOutstandingRouterConfig(kind="least_outstanding"), LeastOutstandingRouter),
    (LeastTokensRouterConfig(kind="least_tokens"), LeastTokensRouter),
    (LeastKvRouterConfig(kind="least_kv"), LeastKvRouter),
    (PowerOfTwoRouterConfig(kind="power_of_two"), PowerOfTwoRouter),
    (PrefixAffinityRouterConfig(kind="prefix_affinity"), PrefixAffinityRouter),
])
def test_each_config_builds_its_router(config, cls) -> None:  # noqa: ANN001 - any config
    fleet, rng = _fleet(2), np.random.default_rng(0)
    router = build_router(config, fleet, rng)
    assert type(router) is cls and router.replicas == fleet and router.rng is rng


def test_a_session_config_builds_its_fallback() -> None:
    fleet, sessions = _fleet(2), np.array([0, 1])
    router = build_router(SessionRouterConfig(kind="session", fallback="least_kv"), fleet,
                          np.random.default_rng(0), sessions)
    assert type(router) is SessionRouter and type(router.fallback) is LeastKvRouter
    assert router.session_ids is sessions and router.fallback.replicas == fleet
    rng = np.random.default_rng(0)
    drawn = build_router(SessionRouterConfig(kind="session", fallback="random"), fleet, rng)
    assert drawn.fallback.rng is rng  # type: ignore[attr-defined]  # the run's generator
    default = build_router(SessionRouterConfig(kind="session"), fleet, np.random.default_rng(0))
    assert type(default.fallback) is LeastOutstandingRouter  # type: ignore[attr-defined]
