"""Prefill/decode disaggregation: a prefill pool hands each request's KV to a decode pool.

The shape of DistServe (OSDI'24), Splitwise and vLLM's and SGLang's disaggregated modes:

1. A request arrives at a prefill instance (the prefill pool's router picks it). The
   prefill instance sees it as a request of one output token: it computes the prompt
   (whole or in chunks, by its own scheduler) and emits the first token. With
   `first_token: prefill` (the default) that is the request's TTFT, as in DistServe and
   Splitwise, whose prompt instance streams the first token itself. With `first_token:
   decode` it is dropped, as vLLM's disaggregated prefill does behind its proxy (the
   prefill request asks for one token and discards it): the decode instance computes
   the last prompt token again and streams every token, so TTFT includes the transfer
   and the decode side's wait.
2. At that moment the decode pool's router picks a decode instance, and the KV moves over
   `link`: prompt tokens x the model's KV bytes per token, in `bytes / bandwidth +
   latency` (`LinkConfig`). The prefill instance holds the request's blocks until the
   transfer ends (its admissions feel that back-pressure). When it moves is `handoff`:
   - `push` (the default; Splitwise, Mooncake): at once. The decode instance gets the
     request when the transfer ends and queues it with its KV, which it admits FCFS when
     its own KV allows (decode-side back-pressure; the waiting KV is counted nowhere).
   - `pull` (DistServe; vLLM's disaggregated prefill, whose decode instance receives the
     KV inside its own step): the decode instance gets the request at once and admits it
     FCFS when it has blocks for it; only then is the KV copied in, one request after
     another, and the iteration it joins waits for the copies (DistServe's
     `DecodingStageFCFSScheduler.post_process` awaits each `migrate_blocks` in the decode
     loop, `distserve/decoding_stage_scheduler.py` at 82831f1). Until then the prefill
     instance holds the KV, so a full decode pool stalls the prefill pool's admissions.
3. The decode instance runs the request (prompt computed, one token emitted,
   `Scheduler.mark_transferred`) and emits the remaining tokens; TPOT covers the transfer
   and the wait for the decode side's KV.

With `handoff: pull` a decode pool's `paged` scheduler may follow DistServe's decode
instance further (`policy: distserve_decode`, `orcasim.schedulers.distserve_decode`):
accepted (and copied in) first, then taken into the batch by its own rule. Not modelled:
DistServe's stages poll for work every 3 ms when idle (`SLEEP_WHEN_*_NO_REQUEST`), and a
copy takes the link's `bytes / bandwidth + latency`, not a measured `migrate_blocks`.

Everything runs on the one clock loop (`orcasim.replica.drive`): arrivals into the
prefill pool, transfers (`BridgeSource`) into the decode pool. The prefill side reads
the requests through `prefill_view`: with their content (a prefix cache there finds what
prompts share) and, for a session workload, the rows its source writes as calls are sent
(a step's calls go out when the last step's answers are done on the decode side).
"""

from __future__ import annotations

import bisect
import heapq
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from orcasim.closed_loop import arrival_source
from orcasim.cluster import build_router
from orcasim.config import ScenarioError
from orcasim.cost import CostModel
from orcasim.cost.catalog import attention_groups, kv_bytes_per_token_per_gpu
from orcasim.engine import EngineRun, finished_run
from orcasim.fleet import (
    BuiltCosts,
    ReplicaSpec,
    SchedulersByKind,
    built_models,
    cost_models,
    naming_group,
    pool_specs,
    replica_for,
)
from orcasim.generic_stepper import GenericStepper
from orcasim.recorder import Recorder
from orcasim.replica import Replica, Router, drive, share_a_router, shared_recorder
from orcasim.requests import Requests
from orcasim.scenario import Scenario, SystemConfig
from orcasim.schedulers.paged import PagedScheduler
from orcasim.sessions import SessionSource
from orcasim.sources import ArrivalSource


class PrefillSource(ArrivalSource):
    """The prefill pool's view of the arrivals: a completion there is a prefill done."""

    def __init__(self, inner: ArrivalSource, on_prefilled: Callable[[np.ndarray, float], None]):
        self.inner, self.on_prefilled = inner, on_prefilled
        self.closed_loop = inner.closed_loop

    @property
    def arrival_s(self) -> np.ndarray:  # type: ignore[override]
        return self.inner.arrival_s

    @property
    def next_index(self) -> int:  # type: ignore[override]
        return self.inner.next_index

    def pending(self) -> bool:
        return self.inner.pending()

    def next_time_s(self) -> float:
        return self.inner.next_time_s()

    def take_until(self, now_s: float) -> range:
        return self.inner.take_until(now_s)

    def times_until(self, time_s: float) -> np.ndarray:
        return self.inner.times_until(time_s)

    def on_finished(self, req_ids: Iterable[int], time_s: float) -> None:
        self.on_prefilled(np.asarray(list(req_ids), dtype=np.int64), time_s)

    def on_rejected(self, req_ids: Iterable[int], time_s: float) -> None:
        """Turned away by the prefill instance: never answered (a session's context does
        not grow by an answer), and nothing moves to a decode instance."""
        self.inner.on_rejected(req_ids, time_s)


class BridgeSource(ArrivalSource):
    """Transfers in flight to the decode pool: each request arrives when its KV has moved.

    `arrival_s[id]` is written at delivery (NaN before). Completions on the decode side
    are the requests' own: they go to the workload's source (a closed loop's clients).
    """

    def __init__(self, num_requests: int, inner: ArrivalSource,
                 on_delivered: Callable[[int, float], None],
                 on_copied: Callable[[Sequence[tuple[int, float]], float],
                                     tuple[tuple[int, float], ...]],
                 on_turned_away: Callable[[list[int], float], None],
                 frees_on_rejection: bool = False) -> None:
        self.arrival_s = np.full(num_requests, np.nan)
        self.inner, self.on_delivered = inner, on_delivered
        self.on_copied, self.on_turned_away = on_copied, on_turned_away
        self._heap: list[tuple[float, int]] = []  # (ready time, id): ids break ties
        # Whether a decode instance's rejection makes arrivals: a closed loop's next request,
        # or (pulled) a prompt let in by the prefill KV it frees. Then the decode instance's
        # fast mode must stop where it turns one away.
        self.closed_loop = inner.closed_loop or frees_on_rejection

    def push(self, ready_s: float, req_id: int) -> None:
        heapq.heappush(self._heap, (ready_s, req_id))

    @property
    def next_index(self) -> int:  # type: ignore[override]
        return self._heap[0][1]

    def pending(self) -> bool:
        return bool(self._heap)

    def next_time_s(self) -> float:
        return self._heap[0][0]

    def take_until(self, now_s: float) -> list[int]:  # type: ignore[override]
        taken = []
        while self._heap and self._heap[0][0] <= now_s:
            ready_s, req_id = heapq.heappop(self._heap)
            self.arrival_s[req_id] = ready_s
            self.on_delivered(req_id, ready_s)
            taken.append(req_id)
        return taken

    def times_until(self, time_s: float) -> np.ndarray:
        return np.array([t for t, _ in self.upcoming(time_s)], dtype=np.float64)

    def upcoming(self, time_s: float) -> list[tuple[float, int]]:
        return sorted(entry for entry in self._heap if entry[0] <= time_s)

    def on_finished(self, req_ids: Iterable[int], time_s: float) -> None:
        self.inner.on_finished(req_ids, time_s)

    def on_rejected(self, req_ids: Iterable[int], time_s: float) -> None:
        ids = list(req_ids)
        self.on_turned_away(ids, time_s)  # a pulled request's KV is freed on the prefill side
        self.inner.on_rejected(ids, time_s)  # not answered: as colocated

    def on_pulled(self, pulled: Sequence[tuple[int, float]],
                  time_s: float) -> tuple[tuple[int, float], ...]:
        return self.on_copied(pulled, time_s)


class KvReleases(ArrivalSource):
    """Pulled copies in flight (`handoff: pull`): at each one's end the prefill instance
    frees the request's blocks. An input of the clock loop that delivers no request."""

    closed_loop = False

    def __init__(self, release: Callable[[int, float], None]) -> None:
        self.release = release
        self._heap: list[tuple[float, int]] = []  # (copy's end, id): ids break ties

    def push(self, end_s: float, req_id: int) -> None:
        heapq.heappush(self._heap, (end_s, req_id))

    def pending(self) -> bool:
        return bool(self._heap)

    def next_time_s(self) -> float:
        return self._heap[0][0]

    def take_until(self, now_s: float) -> list[int]:  # type: ignore[override]
        while self._heap and self._heap[0][0] <= now_s:
            end_s, req_id = heapq.heappop(self._heap)
            self.release(req_id, end_s)
        return []


# Shares of a link's bandwidth that add up past 1 by rounding alone (a quarter four times).
SHARE_TOL = 1e-12


class LinkSchedule:
    """When each instance's link is busy: the copies placed on it so far, each with the share
    of its bandwidth the copy takes, as intervals.

    A copy moves for as long as its largest shard takes (`link_busy_s`); an instance's GPUs
    each carry their own shard, so the wider instance's link is held only at the share its
    GPUs' shards are of the largest: a tensor-parallel-4 prefill instance sends a
    tensor-parallel-1 decode instance a quarter from each GPU, and four such copies go at
    once (each held its link whole: they went one after another, 0.5 then 1.0 s; the
    disaggregation tester's finding). A copy takes the earliest time at or after it is ready
    at which every link it holds has its share free throughout, gaps between copies placed
    earlier included (with one next-free time per link, a copy ready at 1 s waited behind
    another placed at [3, 3.5] on an idle link; the same tester's). Copies are placed in the
    clock's order, so intervals that end by the time of a placement are dropped."""

    def __init__(self, num_links: int) -> None:
        self.busy: list[list[tuple[float, float, float]]] = [[] for _ in range(num_links)]

    def place(self, holds: tuple[tuple[int, float], ...], now_s: float, ready_s: float,
              busy_s: float) -> float:
        """At `now_s`, reserve `busy_s` seconds of each (link, share) in `holds` from the
        earliest start at or after `ready_s` (not before `now_s`) at which each link has its
        share free throughout; that start. Where nothing is in the way, `ready_s` itself,
        bit for bit."""
        for k, _ in holds:  # not by ready_s: a copy placed later may be ready sooner
            self.busy[k] = [entry for entry in self.busy[k] if entry[1] > now_s]
        # A link's load only falls where a copy ends: the earliest start is the ready time
        # or such an end.
        ends = sorted({end_s for k, _ in holds for _, end_s, _ in self.busy[k] if end_s > ready_s})
        start_s = next(t for t in (ready_s, *ends)
                       if all(self._fits(k, share, t, busy_s) for k, share in holds))
        for k, share in holds:
            bisect.insort(self.busy[k], (start_s, start_s + busy_s, share))
        return start_s

    def _fits(self, link: int, share: float, start_s: float, busy_s: float) -> bool:
        """Whether `share` more of `link` is free throughout [start_s, start_s + busy_s)."""
        over = [(a, b, f) for a, b, f in self.busy[link] if a < start_s + busy_s and start_s < b]
        points = [start_s] + [a for a, _, _ in over if a > start_s]  # where its load rises
        return all(share + sum(f for a, b, f in over if a <= t < b) <= 1.0 + SHARE_TOL
                   for t in points)


def prefill_view(requests: Requests, source: ArrivalSource) -> Requests:
    """The requests as a prefill instance sees them: the prompt, then one token. Their
    content goes with them: a prefix cache on the prefill side finds what prompts share.

    A session workload's `source` writes each row as it arrives (`orcasim.sessions`): the
    view shares the written columns and keeps its own limit, prompt + 1, in step."""
    ones = np.ones(len(requests), dtype=np.int64)
    sessions = None if requests.sessions is None else replace(requests.sessions, prefill_only=True)
    view = Requests(requests.arrival_s, requests.prompt_tokens, ones,
                    requests.prompt_tokens + 1, session_ids=requests.session_ids,
                    content=requests.content, sessions=sessions)
    if isinstance(source, SessionSource):
        prompt, limit = requests.prompt_tokens, view.max_tokens

        def written(req_id: int) -> None:
            limit[req_id] = prompt[req_id] + 1

        source.row_written.append(written)
    return view


@dataclass
class DisaggregatedFleet:
    """A prefill pool and a decode pool on one clock, joined by transfers."""

    prefill: list[Replica]
    decode: list[Replica]
    costs: list[CostModel]
    requests: Requests
    source: ArrivalSource
    prefill_router: Router
    decode_router: Router
    transfer_s: Callable[[int], float]  # a request's KV transfer time, on an idle link
    link_busy_s: Callable[[int], float]  # the part of it that holds the link: bytes / bandwidth
    first_token_from_decode: bool = False
    pull: bool = False  # handoff: pull (see the module docstring)
    # The share of its link each side's GPUs hold during a copy (prefill, decode): their
    # shard of the largest, which sets how long the copy takes (`LinkSchedule`).
    link_shares: tuple[float, float] = (1.0, 1.0)
    specs: list[ReplicaSpec] = field(default_factory=list)  # each instance's, in pool order

    def __post_init__(self) -> None:
        n = len(self.requests)
        self.prefill_replica = np.full(n, -1, dtype=np.int64)
        self.decode_replica = np.full(n, -1, dtype=np.int64)
        self.kv_transfer_s = np.full(n, np.nan)
        # Each instance's link (by `Replica.index`): a copy holds the sender's and the
        # receiver's for its bytes; the latency overlaps.
        self.links = LinkSchedule(len(self.prefill) + len(self.decode))
        self.bridge = BridgeSource(n, self.source, self._delivered, self._copying,
                                   self._turned_away, frees_on_rejection=self.pull)
        self.releases = KvReleases(self._copied)
        for replica in self.prefill:
            replica.source = PrefillSource(self.source, self._prefilled)
        for replica in self.decode:
            replica.source = self.bridge

    @property
    def replicas(self) -> list[Replica]:
        return self.prefill + self.decode

    def _route_prefill(self, req_id: int, time_s: float) -> Replica:
        replica = self.prefill_router(req_id, time_s)
        self.prefill_replica[req_id] = replica.index
        return replica

    def _prefilled(self, req_ids: np.ndarray, time_s: float) -> None:
        """Prefills done at `time_s` (or requests turned away): hand each to a decode instance."""
        first_token_s = self.prefill[0].recorder.first_token_s
        done, moving = [], []
        for req_id in req_ids.tolist():
            ends_here = not self.first_token_from_decode and self.requests.output_tokens[req_id] == 1
            if math.isnan(first_token_s[req_id]) or ends_here:
                done.append(req_id)  # turned away, or its only token is out: it ends here
            else:
                moving.append(req_id)
        for req_id in done:
            self._release_prefill(req_id, time_s, wake=False)
        if done:
            self.source.on_finished(done, time_s)
        for req_id in moving:
            decode = self.decode_router(req_id, time_s)
            decode.promise(req_id)  # the next one routed sees it there
            self.decode_replica[req_id] = decode.index - len(self.prefill)
            transfer_s = self.transfer_s(req_id)
            first_token_emitted = not self.first_token_from_decode
            if self.pull:  # delivered now; the KV moves when the decode instance admits it
                decode.scheduler.mark_transferred(req_id, first_token_emitted, transfer_s)
                self.bridge.push(time_s, req_id)
            else:
                start_s = self._link_start_s(req_id, decode, time_s)
                moved_s = start_s + transfer_s
                # Its handoff, the wait for the link included (on a free link, transfer_s's bits).
                self.kv_transfer_s[req_id] = transfer_s if start_s == time_s else moved_s - time_s
                decode.scheduler.mark_transferred(req_id, first_token_emitted)
                self.bridge.push(moved_s, req_id)

    def _link_start_s(self, req_id: int, decode: Replica, time_s: float) -> float:
        """When a push from `req_id`'s prefill instance to `decode`, ready at `time_s`,
        starts: once both instances' links are free for its bytes (pushes at once share
        them, one after another, in the order the prefills ended)."""
        sender, receiver = int(self.prefill_replica[req_id]), decode.index
        return self.links.place(self._holds(sender, receiver), time_s, time_s, self.link_busy_s(req_id))

    def _holds(self, sender: int, receiver: int) -> tuple[tuple[int, float], ...]:
        """The links a copy between these instances holds, each with its share."""
        sender_share, receiver_share = self.link_shares
        return ((sender, sender_share), (receiver, receiver_share))

    def _delivered(self, req_id: int, time_s: float) -> None:
        if not self.pull:  # pushed: the KV has moved
            self._release_prefill(req_id, time_s, wake=True)

    def _copying(self, pulled: Sequence[tuple[int, float]],
                 start_s: float) -> tuple[tuple[int, float], ...]:
        """A decode iteration starting at `start_s`, where they were admitted, pulls these
        requests' KV in, one copy after another, each when its links are free
        (`LinkSchedule`): a prefill instance's link moves one copy at a time, whichever
        decode instance pulls, as a push holds it (two decode instances pulling from one
        prefill instance at once each had its whole bandwidth). Returns each copy's end,
        seconds after `start_s`: `pulled`'s own where no copy waits for a link, bit for bit.

        Each one's handoff is from its admission to its copy's end, the waits behind the
        copies before it and for the link included, as a push's includes its wait for the
        link (it was the copy alone: a request that waited 0.15 s behind another's copy lost
        those seconds from every column; a tester's finding)."""
        placed, end_offset_s = [], 0.0
        for req_id, _ in pulled:
            holds = self._holds(int(self.prefill_replica[req_id]),
                                self.decode[int(self.decode_replica[req_id])].index)
            ready_s = start_s + end_offset_s
            link_start_s = self.links.place(holds, start_s, ready_s, self.link_busy_s(req_id))
            # In offsets from start_s, so that copies that never wait add up as take_pulled's.
            if link_start_s != ready_s:
                end_offset_s = link_start_s - start_s
            end_offset_s += self.transfer_s(req_id)
            placed.append((req_id, end_offset_s))
            self.kv_transfer_s[req_id] = end_offset_s
            self.releases.push(start_s + end_offset_s, req_id)
        return tuple(placed)

    def _copied(self, req_id: int, time_s: float) -> None:
        self._release_prefill(req_id, time_s, wake=True)

    def _turned_away(self, req_ids: list[int], time_s: float) -> None:
        """Turned away by a decode instance (it can never fit there). Pulled, nothing will
        pull it, so no transfer took place; pushed, its KV had already moved."""
        for req_id in req_ids:
            if self.pull:
                self.kv_transfer_s[req_id] = math.nan
            self._release_prefill(req_id, time_s, wake=True)

    def _release_prefill(self, req_id: int, time_s: float, wake: bool) -> None:
        replica = self.prefill[int(self.prefill_replica[req_id])]
        scheduler = replica.scheduler
        if isinstance(scheduler, PagedScheduler) and req_id in scheduler.held:
            scheduler.release_held(req_id)
            if wake:
                replica.wake(time_s)

    def _route_decode(self, req_id: int, time_s: float) -> Replica:
        return self.decode[int(self.decode_replica[req_id])]

    def run(self) -> EngineRun:
        bridges: list[tuple[ArrivalSource, Router]] = [(self.bridge, self._route_decode)]
        if self.pull:
            bridges.append((self.releases, self._route_decode))  # delivers no request
        end_s = drive(self.replicas, self.source, self._route_prefill, bridges=bridges)
        for replica in self.replicas:
            replica.stepper.close()
        assert not any(r.scheduler.held_ids() for r in self.prefill), "KV never moved"
        return finished_run(self.merged_recorder(), end_s, [r.scheduler for r in self.replicas])

    def merged_recorder(self) -> Recorder:
        """Per-request times as a user sees them: scheduled on the prefill side, the first
        token where it is streamed from, finished on the decode side (or on the prefill
        side, for a one-token request whose token the prefill streams)."""
        p, d = self.prefill[0].recorder, self.decode[0].recorder
        merged = Recorder(len(self.requests))
        merged.first_scheduled_s[:] = p.first_scheduled_s
        if self.first_token_from_decode:
            merged.first_token_s[:] = d.first_token_s
            merged.finish_s[:] = d.finish_s
            return merged
        merged.first_token_s[:] = p.first_token_s
        one_token = self.requests.output_tokens == 1
        merged.finish_s[:] = np.where(one_token, p.finish_s, d.finish_s)
        # Turned away on the decode side: never finished, though its first token came out.
        return merged

    def iterations_frame(self) -> pd.DataFrame:
        frames = []
        for pool, replicas, offset in (("prefill", self.prefill, 0),
                                       ("decode", self.decode, len(self.prefill))):
            for replica in replicas:
                frame = replica.recorder.iterations_frame()
                frame["pool"] = pool
                frame["replica"] = replica.index - offset
                frames.append(frame)
        return pd.concat(frames, ignore_index=True)

    def decode_first_scheduled_s(self) -> np.ndarray:
        return self.decode[0].recorder.first_scheduled_s


def build_disaggregated(scenario: Scenario, system: SystemConfig,
                        requests: Requests) -> DisaggregatedFleet:
    """`system`'s disaggregated cluster over `requests` (a run's own table, as they reach it)."""
    cluster = system.cluster
    assert cluster is not None and cluster.prefill is not None and cluster.decode is not None
    source = arrival_source(requests)
    prefill_requests = prefill_view(requests, source)
    pools: list[list[Replica]] = [[], []]
    built: BuiltCosts = {}
    index = 0
    all_specs: list[ReplicaSpec] = []
    for k, (pool, view) in enumerate(((cluster.prefill, prefill_requests),
                                      (cluster.decode, requests))):
        base = Recorder(len(requests))
        kinds: SchedulersByKind = {}  # each pool its own: a request runs on one of each
        with naming_group(f"cluster.{('prefill', 'decode')[k]}", pool):
            specs = pool_specs(scenario, system, pool)
            all_specs += specs
            for spec, cost in zip(specs, cost_models(specs, built), strict=True):
                replica = replica_for(spec, view, cost, source, shared_recorder(view, base),
                                      scenario.engine.mode, (scenario.warmup_s,), index,
                                      fused=k == 0, pool=kinds)
                if k == 0:
                    _hold_finished(replica)
                pools[k].append(replica)
                index += 1
    prefill, decode = pools
    for instances in pools:
        share_a_router(instances)
    # Each GPU of an instance holds its shard of a request's KV (TP its heads, PP its layers)
    # and moves it over its own link, all at once, as vLLM's disaggregated prefill moves each
    # TP rank's KV to its peer: a transfer takes as long as the largest shard a GPU of either
    # side sends or receives (a whole KV head where a rank replicates one, GQA; MLA's whole
    # latent on every rank).
    ends = [pool_specs(scenario, system, pool)[0] for pool in (cluster.prefill, cluster.decode)]
    shard_bytes_per_token = [_kv_bytes_per_gpu(spec) for spec in ends]
    kv_bytes_per_token = max(shard_bytes_per_token)
    # Each side's GPUs hold their link at their shard's share of the largest (LinkSchedule);
    # under data-parallel attention a request's KV lives in one group, whose GPUs' links are
    # a 1 / groups share of the instance's.
    shares = tuple((b / kv_bytes_per_token if kv_bytes_per_token else 1.0)
                   / attention_groups(spec.hardware)
                   for b, spec in zip(shard_bytes_per_token, ends, strict=True))
    gpus = [spec.hardware.gpu for spec in ends if spec.hardware is not None]
    if not kv_bytes_per_token and cluster.link.model_fields_set & {"kind", "bandwidth_bytes_per_s"}:
        warnings.warn(f"system {system.name}: cluster.link's bandwidth is not used: without a "
                      "model a transfer moves no bytes and takes the link's latency alone; "
                      "give `model` to size the KV", UserWarning, stacklevel=2)
    unused = cluster.link.unused_kind(gpus) if kv_bytes_per_token else None
    if unused:
        warnings.warn(f"system {system.name}: {unused}", UserWarning, stacklevel=2)
    prompt = requests.prompt_tokens

    def transfer_s(req_id: int) -> float:
        return cluster.link.transfer_s(float(prompt[req_id]) * kv_bytes_per_token, gpus)

    def link_busy_s(req_id: int) -> float:
        return cluster.link.busy_s(float(prompt[req_id]) * kv_bytes_per_token, gpus)

    seeds = np.random.SeedSequence(scenario.seed).spawn(4)
    prefill_router = build_router(cluster.prefill.router, prefill, np.random.default_rng(seeds[2]),
                                  requests.session_ids, f"system {system.name}: cluster.prefill.router")
    decode_router = build_router(cluster.decode.router, decode, np.random.default_rng(seeds[3]),
                                 requests.session_ids, f"system {system.name}: cluster.decode.router")
    _check_pulls(decode, cluster.pulls_kv, own_hardware=cluster.decode.hardware is not None)
    return DisaggregatedFleet(prefill, decode, built_models(built), requests, source,
                              prefill_router, decode_router, transfer_s, link_busy_s,
                              cluster.first_token_from_decode, cluster.pulls_kv,
                              (shares[0], shares[1]), all_specs)


def _check_pulls(decode: list[Replica], pulls: bool, own_hardware: bool) -> None:
    """A pulled handoff's copies are announced by the generic stepper (`take_pulled`);
    a pipelined decode instance plans its own way. (Where DistServe's decode policy may
    run is a scenario rule: `Scenario._check_distserve_placement`.) The refusal names the
    key the pool's pipeline degree comes from: its own hardware, or the scenario's."""
    key = "decode.hardware.pipeline_parallel = 1" if own_hardware else \
        "hardware.pipeline_parallel = 1 (the decode pool runs on the scenario's hardware)"
    for replica in decode:
        if pulls and not isinstance(replica.stepper, GenericStepper):
            raise ScenarioError(
                "cluster.handoff = 'pull' needs decode instances that run one batch at a "
                f"time; expected {key}, or handoff: push"
            )


def _hold_finished(replica: Replica) -> None:
    scheduler = replica.scheduler
    if not isinstance(scheduler, PagedScheduler):
        return  # an Orca reservation is freed at once (its KV is counted, not placed)
    scheduler.holds_finished = True


def _kv_bytes_per_gpu(spec: ReplicaSpec) -> float:
    """KV bytes one GPU of an instance holds per token (its share over TP x PP, a replica of
    a head or of MLA's latent where it keeps one), the model's whole KV without hardware,
    or 0 without a model (a scenario with a plain cost model moves KV for free)."""
    if spec.model is None:
        return 0.0
    if spec.hardware is None:
        return float(spec.model.kv_bytes_per_token())
    return kv_bytes_per_token_per_gpu(spec.model, spec.hardware)
