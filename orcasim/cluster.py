"""A serving cluster: replicas behind a router, on the one clock loop of `orcasim.replica`.

A system with a `cluster:` section runs `replicas` copies (or a list of groups, each with
its own model, hardware, scheduler and cost, for a heterogeneous fleet) and routes every
request, at its arrival time, to the replica its router picks. A router sees only what
each replica reports at that moment (`Replica.load`): the state after its last
scheduling decision, never a jump's future.

Routers (ties go to the first replica after the last one chosen, so an idle fleet is
filled in turn, deterministically; `power_of_two`'s go to the first of its two draws):

* `random`: uniform, from the run's own generator;
* `round_robin`: in turn;
* `least_outstanding`: fewest running + waiting requests (join the shortest queue);
* `least_tokens`: fewest outstanding prefill + decode tokens;
* `least_kv`: the least KV in use as a share of the replica's pool (vLLM's kv_cache_usage);
* `power_of_two`: two distinct random replicas, the one with fewer requests;
* `session`: a session's first request goes where `fallback` says, the rest follow it
  (a request without a session is its own);
* `prefix_affinity`: the replica whose prefix cache holds most of the request's prompt,
  unless the fleet is out of balance. SGLang's cache-aware policy (sgl-router,
  `CacheAwarePolicy`, with its defaults): when the most and least loaded replicas differ
  by more than `balance_abs_threshold` requests and by a ratio above
  `balance_rel_threshold`, the least loaded; otherwise the replica with the longest cached
  prefix if it covers more than `cache_threshold` of the prompt (the least loaded of any
  tied), else the least loaded. Where SGLang's router keeps its own approximate tree of
  what it sent where, this one reads the replicas' real caches at the arrival, as a router
  fed by the engines' KV events (Dynamo's, or sgl-router's event-driven mode) does; so on
  a miss it takes the least loaded, as that mode falls back, not the approximate tree's
  smallest tree (the replica caching least).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal, Self

import numpy as np
from pydantic import (
    Field,
    NonNegativeInt,
    PositiveInt,
    model_validator,
)

from orcasim.config import MAX_TIME_S, ScenarioError, Strict
from orcasim.cost import CostConfig
from orcasim.cost.catalog import GpuSpec, HardwareConfig, ModelRef
from orcasim.cost.parallel import nvlink_one_way_bytes_per_s
from orcasim.replica import Load, Replica
from orcasim.schedulers import SchedulerConfig


class _RouterBase(Strict):
    pass


class RandomRouterConfig(_RouterBase):
    kind: Literal["random"]


class RoundRobinRouterConfig(_RouterBase):
    kind: Literal["round_robin"]


class LeastOutstandingRouterConfig(_RouterBase):
    kind: Literal["least_outstanding"]


class LeastTokensRouterConfig(_RouterBase):
    kind: Literal["least_tokens"]


class LeastKvRouterConfig(_RouterBase):
    kind: Literal["least_kv"]


class PowerOfTwoRouterConfig(_RouterBase):
    kind: Literal["power_of_two"]


LoadRouterKind = Literal["random", "round_robin", "least_outstanding", "least_tokens",
                         "least_kv", "power_of_two"]


class PrefixAffinityRouterConfig(_RouterBase):
    kind: Literal["prefix_affinity"]
    cache_threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    balance_abs_threshold: NonNegativeInt = 32
    balance_rel_threshold: float = Field(default=1.0001, ge=1.0)


class SessionRouterConfig(_RouterBase):
    kind: Literal["session"]
    fallback: LoadRouterKind = "least_outstanding"


RouterConfig = Annotated[
    RandomRouterConfig | RoundRobinRouterConfig | LeastOutstandingRouterConfig
    | LeastTokensRouterConfig | LeastKvRouterConfig | PowerOfTwoRouterConfig
    | SessionRouterConfig | PrefixAffinityRouterConfig,
    Field(discriminator="kind"),
]


class ReplicaGroup(Strict):
    """`count` identical replicas; a key left out is the system's (or the scenario's)."""

    MISPLACED: ClassVar[dict[str, str]] = {
        key: f"expected it in the system's cluster block (cluster.{key}), which its groups share"
        for key in ("router", "replicas", "link", "handoff", "first_token")}
    count: PositiveInt = 1
    model: ModelRef | None = None
    hardware: HardwareConfig | None = None
    kv_capacity_tokens: PositiveInt | None = None
    scheduler: SchedulerConfig | None = None
    cost: CostConfig | None = None


# Links that carry KV from a prefill instance to a decode instance: one GPU's per-direction
# bandwidth (each GPU moves its shard over its own: orcasim.disagg) and a per-transfer
# latency, nominal figures from the vendors' specifications.
LINKS: dict[str, tuple[float, float]] = {
    # NVLink 3 (A100 SXM): 600 GB/s over 12 links in both directions = 300 GB/s one way.
    # Where the pools' GPUs are known, their own NVLink's (`LinkConfig.one_way_bytes_per_s`).
    "nvlink": (300e9, 5e-6),
    # InfiniBand HDR: 200 Gb/s per port = 25 GB/s; RDMA latency of a few microseconds.
    # Where the pools' GPUs are known, their node's network (the catalog's, a GPU's share).
    "infiniband": (25e9, 5e-6),
    # 100 Gb Ethernet (RoCE or TCP): 12.5 GB/s; tens of microseconds through the stack.
    "ethernet": (12.5e9, 50e-6),
}


class LinkConfig(Strict):
    """How long a request's KV takes to move over one GPU's link: `bytes / bandwidth + latency`.

    `kind` picks a preset (`LINKS`); `bandwidth_bytes_per_s` or `latency_s` override it.
    """

    kind: Literal["nvlink", "infiniband", "ethernet"] = "nvlink"
    # Bounds, not physics: below 1 B/s, or a latency past the run's clock (MAX_TIME_S), a
    # transfer overflowed the clock and the run's error named no key (a tester's finding).
    bandwidth_bytes_per_s: float | None = Field(default=None, ge=1.0)
    latency_s: float | None = Field(default=None, ge=0.0, le=MAX_TIME_S)

    def transfer_s(self, num_bytes: float, gpus: Sequence[GpuSpec] = ()) -> float:
        """Moving `num_bytes` over an idle link between `gpus`: its latency, then the bytes."""
        latency = LINKS[self.kind][1] if self.latency_s is None else self.latency_s
        return latency + self.busy_s(num_bytes, gpus)

    def busy_s(self, num_bytes: float, gpus: Sequence[GpuSpec] = ()) -> float:
        """How long `num_bytes` hold the link (its bandwidth's share; the latency overlaps)."""
        return num_bytes / self.one_way_bytes_per_s(gpus)

    def one_way_bytes_per_s(self, gpus: Sequence[GpuSpec] = ()) -> float:
        """The bandwidth given, else that of the GPUs at the link's ends (`gpus`, where
        known; the slower's), as the roofline's sends take it: an NVLink's to one peer (an
        H100's 450 GB/s, one 64 GB/s link of MI300X's mesh), InfiniBand's the node
        network's share (NDR's 50 GB/s on an H100); else the preset's. Every GPU's moved at
        the A100's NVLink and HDR (a tester's finding)."""
        if self.bandwidth_bytes_per_s is not None:
            return self.bandwidth_bytes_per_s
        if self.kind == "nvlink" and gpus:
            return min(nvlink_one_way_bytes_per_s(gpu, peers=1) for gpu in gpus)
        if self.kind == "infiniband" and gpus:
            return min(gpu.node_network_bytes_per_s for gpu in gpus)
        return LINKS[self.kind][0]

    def unused_kind(self, gpus: Sequence[GpuSpec] = ()) -> str | None:
        """What a `kind` other than the default no longer sets where `bandwidth_bytes_per_s`
        is given (a sweep over nvlink and infiniband with a bandwidth ran identical points:
        their presets differ only in bandwidth), or None. The default `nvlink` is not said:
        a saved scenario's dump writes it whether given or not."""
        if self.kind == "nvlink" or self.bandwidth_bytes_per_s is None:
            return None
        preset = LinkConfig(kind=self.kind)
        given = f"bandwidth_bytes_per_s = {self.bandwidth_bytes_per_s:g} is given"
        if self.latency_s is not None:
            return (f"cluster.link.kind = {self.kind!r} is not used: {given}, and latency_s = "
                    f"{self.latency_s:g}; expected the kind left out")
        return (f"cluster.link.kind = {self.kind!r} sets only the latency ({LINKS[self.kind][1]:g} "
                f"s): {given}, in place of the kind's {preset.one_way_bytes_per_s(gpus):g} B/s; "
                "expected one of the two (or latency_s with the bandwidth, the kind left out)")


class PoolConfig(ReplicaGroup):
    """One pool of a disaggregated cluster: `count` instances and the router into them."""

    router: RouterConfig = RoundRobinRouterConfig(kind="round_robin")
    MISPLACED: ClassVar[dict[str, str]] = {
        **{key: f"expected it in the system's cluster block (cluster.{key}), which both pools share"
           for key in ("link", "handoff", "first_token")},
        "replicas": "a pool's instances are its 'count'"}


# Each replica keeps per-request arrays of the whole workload (its scheduler's progress
# and its recorder's times), so memory grows with replicas times requests: a bound far
# above any fleet simulated here, and far below one that exhausts memory while building it.
MAX_REPLICAS = 10_000


class ClusterConfig(Strict):
    """Colocated: `replicas` (a count of the system's own replica, or a list of groups)
    behind `router`. Disaggregated: a `prefill` pool and a `decode` pool joined by `link`."""

    replicas: PositiveInt | list[ReplicaGroup] | None = None  # colocated; None: 1
    router: RouterConfig | None = None  # colocated; None: round_robin
    prefill: PoolConfig | None = None
    decode: PoolConfig | None = None
    link: LinkConfig = LinkConfig()
    # Disaggregated: which instance streams the first token (see orcasim.disagg).
    first_token: Literal["prefill", "decode"] | None = None
    # Disaggregated: when the KV moves (see orcasim.disagg). push: as the prefill ends, to
    # wait on the decode side; pull: when the decode instance admits the request (DistServe).
    handoff: Literal["push", "pull"] | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> Self:
        pools = (self.prefill is None, self.decode is None)
        if pools[0] != pools[1]:
            missing = "decode" if self.decode is None else "prefill"
            raise ScenarioError(f"a disaggregated cluster needs both pools; '{missing}' is missing")
        if self.replicas == []:
            raise ScenarioError("replicas = []: expected a count of at least 1 or a list of "
                                "at least one group")
        if self.num_replicas > MAX_REPLICAS:
            raise ScenarioError(f"{self.num_replicas:,} replicas in all: expected at most "
                                f"{MAX_REPLICAS:,} (each keeps arrays of every request)")
        if self.disaggregated and self.replicas is not None:
            raise ScenarioError("'replicas' is for a colocated cluster; a disaggregated one sizes "
                             "its pools with prefill.count and decode.count")
        for key in ("first_token", "handoff"):
            if not self.disaggregated and getattr(self, key) is not None:
                raise ScenarioError(f"'{key}' is for a disaggregated cluster (prefill and decode pools)")
        if self.disaggregated and self.router is not None:
            raise ScenarioError("'router' is for a colocated cluster; give each pool its own "
                             "(prefill.router, decode.router)")
        for name, pool in (("prefill", self.prefill), ("decode", self.decode)):
            kind = getattr(pool.scheduler if pool else None, "kind", None)
            if kind == "request_level":
                raise ScenarioError(f"{name}.scheduler.kind = 'request_level': a disaggregated pool "
                                 "needs iteration_level, paged or chunked")
        return self

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None

    @property
    def first_token_from_decode(self) -> bool:
        return self.first_token == "decode"

    @property
    def pulls_kv(self) -> bool:
        return self.handoff == "pull"

    def given_groups(self) -> list[tuple[str, ReplicaGroup]]:
        """The groups and pools the file gives, each with its key under `cluster.`: `prefill`,
        `decode`, `replicas[i]` (a count of replicas gives none)."""
        named: list[tuple[str, ReplicaGroup | None]] = [("prefill", self.prefill),
                                                         ("decode", self.decode)]
        if isinstance(self.replicas, list):
            named += [(f"replicas[{i}]", g) for i, g in enumerate(self.replicas)]
        return [(where, g) for where, g in named if g is not None]

    def groups(self) -> list[ReplicaGroup]:
        if self.replicas is None or isinstance(self.replicas, int):
            return [ReplicaGroup(count=self.replicas or 1)]
        return list(self.replicas)

    @property
    def colocated_router(self) -> _RouterBase:
        return self.router or RoundRobinRouterConfig(kind="round_robin")

    @property
    def num_replicas(self) -> int:
        if self.prefill is not None and self.decode is not None:
            return self.prefill.count + self.decode.count
        return sum(g.count for g in self.groups())


class Router(ABC):
    """Picks a replica for each request at its arrival time."""

    # Whether a choice reads the replicas (their load, their cache). One that does not is
    # fixed by the arrivals alone, so the replicas can run apart (`orcasim.fleet.Fleet.run`).
    reads_replicas = True

    def __init__(self, replicas: Sequence[Replica], rng: np.random.Generator) -> None:
        self.replicas, self.rng = list(replicas), rng
        self.last = -1  # the replica chosen last: ties go to the next one after it

    @abstractmethod
    def pick(self, req_id: int, time_s: float) -> int:
        """The index of the replica `req_id` goes to."""

    def __call__(self, req_id: int, time_s: float) -> Replica:
        self.last = self.pick(req_id, time_s)
        return self.replicas[self.last]

    def _least(self, key: list[float]) -> int:
        """The index with the smallest key; ties to the first after the last chosen."""
        n = len(key)
        best = (self.last + 1) % n
        for k in range(1, n):
            i = (self.last + 1 + k) % n
            if key[i] < key[best]:
                best = i
        return best

    def _loads(self, time_s: float) -> list[Load]:
        return [r.load(time_s) for r in self.replicas]


class RandomRouter(Router):
    reads_replicas = False

    def pick(self, req_id: int, time_s: float) -> int:
        return int(self.rng.integers(len(self.replicas)))


class RoundRobinRouter(Router):
    reads_replicas = False

    def pick(self, req_id: int, time_s: float) -> int:
        return (self.last + 1) % len(self.replicas)


class LeastOutstandingRouter(Router):
    def pick(self, req_id: int, time_s: float) -> int:
        return self._least([r.num_requests(time_s) for r in self.replicas])


class LeastTokensRouter(Router):
    def pick(self, req_id: int, time_s: float) -> int:
        return self._least([load.outstanding_tokens for load in self._loads(time_s)])


class LeastKvRouter(Router):
    """The least KV in use as a share of the replica's pool, as vLLM reports its KV usage
    (kv_cache_usage): free tokens alone sent everything to the larger replicas of a mixed
    fleet (two H100 TP-2 replicas took every request, two A100s none; a tester's run)."""

    def pick(self, req_id: int, time_s: float) -> int:
        return self._least([load.kv_used_tokens / load.kv_capacity_tokens
                            for load in self._loads(time_s)])


class PowerOfTwoRouter(Router):
    def pick(self, req_id: int, time_s: float) -> int:
        n = len(self.replicas)
        if n == 1:
            return 0
        a, b = (int(i) for i in self.rng.choice(n, size=2, replace=False))
        return b if self.replicas[b].num_requests(time_s) < self.replicas[a].num_requests(time_s) else a


class PrefixAffinityRouter(Router):
    """See `prefix_affinity` in the module docstring."""

    def __init__(self, replicas: Sequence[Replica], rng: np.random.Generator,
                 cfg: PrefixAffinityRouterConfig) -> None:
        super().__init__(replicas, rng)
        self.cfg = cfg

    def pick(self, req_id: int, time_s: float) -> int:
        loads = [load.requests for load in self._loads(time_s)]  # applies pending jumps
        most, least = max(loads), min(loads)
        if most - least > self.cfg.balance_abs_threshold and most > least * self.cfg.balance_rel_threshold:
            return self._least([float(x) for x in loads])
        cached = [r.scheduler.cached_prefix_tokens(req_id) for r in self.replicas]
        best = max(cached)
        prompt_tokens = int(self.replicas[0].scheduler.requests.prompt_tokens[req_id])
        if best == 0 or best <= self.cfg.cache_threshold * prompt_tokens:
            return self._least([float(x) for x in loads])
        # The least loaded of the replicas holding the longest prefix.
        return self._least([float(x) if c == best else float("inf") for x, c in zip(loads, cached, strict=True)])


class SessionRouter(Router):
    """A session's requests on one replica: the first placed by `fallback`."""

    def __init__(self, replicas: Sequence[Replica], rng: np.random.Generator,
                 fallback: Router, session_ids: np.ndarray | None) -> None:
        super().__init__(replicas, rng)
        self.fallback, self.session_ids = fallback, session_ids
        self.home: dict[int, int] = {}
        self.reads_replicas = fallback.reads_replicas

    def pick(self, req_id: int, time_s: float) -> int:
        session = None if self.session_ids is None else int(self.session_ids[req_id])
        if session in self.home:
            return self.home[session]
        home = self.fallback.pick(req_id, time_s)
        # The fallback's turn moves with its own choices only (round robin's next, the
        # replica ties go after), as if it had routed the placed requests alone.
        self.fallback.last = home
        if session is not None:
            self.home[session] = home
        return home


def build_router(cfg: _RouterBase, replicas: Sequence[Replica], rng: np.random.Generator,
                 session_ids: np.ndarray | None = None, where: str = "router") -> Router:
    """Explicit factory: one line per router kind. `where` names the router in a warning
    (the system and key: a run of several systems said only 'router session')."""
    match cfg:
        case RandomRouterConfig():
            return RandomRouter(replicas, rng)
        case RoundRobinRouterConfig():
            return RoundRobinRouter(replicas, rng)
        case LeastOutstandingRouterConfig():
            return LeastOutstandingRouter(replicas, rng)
        case LeastTokensRouterConfig():
            return LeastTokensRouter(replicas, rng)
        case LeastKvRouterConfig():
            return LeastKvRouter(replicas, rng)
        case PowerOfTwoRouterConfig():
            return PowerOfTwoRouter(replicas, rng)
        case PrefixAffinityRouterConfig():
            if not any(getattr(r.scheduler, "caching", False) for r in replicas):
                warnings.warn(f"{where} prefix_affinity: no replica keeps a prefix cache "
                              "(enable_prefix_caching), so it routes by load alone",
                              UserWarning, stacklevel=2)
            return PrefixAffinityRouter(replicas, rng, cfg)
        case SessionRouterConfig(fallback=fallback):
            if session_ids is None:
                warnings.warn(f"{where} session: the workload has no sessions (conversations, "
                              f"agents), so every request is routed by its fallback, {fallback}",
                              UserWarning, stacklevel=2)
            inner = build_router(_ROUTER_CONFIGS[fallback].model_validate({"kind": fallback}),
                                 replicas, rng)
            return SessionRouter(replicas, rng, inner, session_ids)
    raise AssertionError(f"unhandled router config {cfg!r}")


_ROUTER_CONFIGS: dict[str, type[_RouterBase]] = {
    "random": RandomRouterConfig, "round_robin": RoundRobinRouterConfig,
    "least_outstanding": LeastOutstandingRouterConfig, "least_tokens": LeastTokensRouterConfig,
    "least_kv": LeastKvRouterConfig, "power_of_two": PowerOfTwoRouterConfig,
}


@dataclass
class RoutedRouter:
    """A router that also notes where each request went (the `replica` column)."""

    router: Router
    assigned: np.ndarray  # int64 (n,): replica index per request, -1 until routed

    def __call__(self, req_id: int, time_s: float) -> Replica:
        replica = self.router(req_id, time_s)
        self.assigned[req_id] = replica.index
        return replica
