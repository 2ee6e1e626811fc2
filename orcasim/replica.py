"""One serving instance (a replica) as an event-driven state machine, and the clock loop.

A replica runs one scheduler over one cost model and has no clock of its own. The loop
(`drive`: one event heap for any number of replicas) asks each replica for its next
event, lets it take that step, and hands it each request at the request's arrival time.
Every engine variant (plain, fused Orca, pipelined, the real server of `calibrate/`)
is a `Stepper` under this one skeleton:

    END   t: apply the unit that ends at t (progress, rows; completions go to the source)
    PLAN  t: admit the inbox up to t, then plan the next unit (`Stepper.start`) or go idle

A unit is one iteration or, in fast mode, a jump over a decode run (see `orcasim.engine`).
It is planned at its start and applied at its end; while it is pending nothing of it is
visible. Events at one time go arrivals first, then END, then PLAN (ties: replica index):
a request arriving exactly at a boundary joins there, as "admit every arrival at or before
now, then schedule" does, and a closed loop's follow-up sent at a completion is in the
inbox before the next plan.

Exactness. Cutting a jump at any boundary changes nothing but the grouping of its rows
(the fast-forward contract), so the replica may cut wherever it must look:

* a request delivered during a pending jump is queued in the inbox, and if the scheduler
  could admit it (`Scheduler.admits_arrival`) the jump is cut at the first boundary at or
  after its arrival, where the reference loop would admit it;
* `load(t)` first applies the part of a pending jump that ended before t (`split`), so a
  router reads the state the reference loop has at t, never a jump's future.

A single replica driven by `drive` therefore gives the per-request timestamps of the loop
that steps one iteration at a time (tests/test_replica.py): bit for bit where the cost
prices a run of decode steps as its steps' own sum (linear costs); within float rounding
otherwise (about 1e-15 s with the roofline, whose run of steps is summed another way).

Why a heap loop rather than SimPy: a replica has no process of its own to suspend (its
step is a plain method), the tie order above must be explicit, and the loop is twenty
lines; SimPy's generators cost a round trip per event and hid the order in its queue.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from orcasim.config import ScenarioError, past_the_clock
from orcasim.recorder import Recorder
from orcasim.requests import Requests
from orcasim.schedulers.base import Scheduler
from orcasim.sources import ArrivalSource

# Event priorities at equal times (see the module docstring).
ARRIVAL, END, PLAN = 0, 1, 2


# Iteration end times: a list or a numpy array, ascending.
Times = Sequence[float] | np.ndarray

@dataclass(frozen=True, slots=True)
class Load:
    """What a replica reports to a router, as vLLM's engine reports its scheduler stats.

    The state after the replica's last scheduling decision at or before the moment asked:
    the iteration in flight is still outstanding. `waiting` counts requests routed to it
    and not yet running (including preempted ones); `outstanding_tokens` the prompt tokens
    still to prefill plus the output tokens still to emit, over all of its requests.
    """

    running: int
    waiting: int
    waiting_prompt_tokens: int  # of the waiting requests, those still to compute
    outstanding_tokens: int
    kv_used_tokens: int
    kv_capacity_tokens: int

    @property
    def requests(self) -> int:
        return self.running + self.waiting


class Stepper(Protocol):
    """An engine variant: plans and applies units of work on one replica's scheduler."""

    @property
    def scheduler(self) -> Scheduler: ...  # read-only, so a variant may narrow its type

    replica: Replica  # set by the replica that runs it
    wake_s: float | None  # set by `start` when nothing runs but the scheduler wants a look
    plans_on_arrival: bool  # an arrival while a unit is pending asks for a plan at once

    def start(self, now_s: float) -> float | None:
        """Plan at boundary `now_s`; the end of the pending unit, or None if none."""

    def ends_s(self) -> Times:
        """Iteration ends of the pending unit (ascending); empty if none is pending."""

    def cut(self, num_iterations: int) -> None:
        """Keep only the pending unit's first `num_iterations` iterations."""

    def finish(self) -> None:
        """Apply the pending unit, which ended at its last end."""

    def load(self) -> Load:
        """The scheduler's load (the inbox is the replica's to add)."""

    def close(self) -> None:
        """The run is over: write back any progress kept implicitly."""


def tokens_left(scheduler: Scheduler, ids: np.ndarray | list[int]) -> tuple[int, int]:
    """The prompt tokens still to compute and the output tokens still to emit of requests
    `ids`, by the scheduler's progress (a prompt prefilled elsewhere has none left)."""
    prompt = scheduler.requests.prompt_tokens[ids]
    prompt_left = int((prompt - np.minimum(scheduler.computed[ids], prompt)).sum())
    return prompt_left, int((scheduler.requests.output_tokens[ids] - scheduler.generated[ids]).sum())


def scheduler_load(scheduler: Scheduler) -> Load:
    """`Load` of a scheduler whose per-request progress is up to date. The waiting prompt
    tokens are those still to compute, as `Replica.load` counts its inbox's: a decode
    instance's queued request, its prompt computed on the prefill side, has none."""
    active = np.array(scheduler.active_ids(), dtype=np.int64)
    queued = np.array(scheduler.queued_ids(), dtype=np.int64)
    waiting_prompt, waiting_output = tokens_left(scheduler, queued)
    active_prompt, active_output = tokens_left(scheduler, active)
    return Load(len(active), len(queued), waiting_prompt,
                waiting_prompt + waiting_output + active_prompt + active_output,
                scheduler.kv_in_use_tokens(), scheduler.kv_capacity_tokens)


class Replica:
    """One serving instance: a `Stepper` under the END/PLAN skeleton, with an inbox.

    `source` is where its requests come from: the replica reads their arrival times,
    whether arrivals depend on completions, and, when it gets every arrival (`sole`), the
    next one (where a jump will be cut, so the fused loop stops pricing there); it tells
    the source of completions and rejections.
    """

    def __init__(self, stepper: Stepper, source: ArrivalSource, recorder: Recorder,
                 row_breaks_s: Sequence[float] = (), index: int = 0) -> None:
        self.stepper, self.scheduler = stepper, stepper.scheduler
        stepper.replica = self
        self.source, self.recorder, self.index = source, recorder, index
        self._breaks_s = sorted(row_breaks_s, reverse=True)  # warm-up breaks to come, next last
        self.now_s = 0.0  # the last boundary this replica processed
        self.inbox: list[int] = []  # delivered, not yet admitted, in arrival order
        # Routed here, not yet delivered: a disaggregated decode instance's requests whose KV
        # is on its way (push) or whose prefill batch is still being handed out (pull).
        self.promised: list[int] = []
        self.unit_end_s: float | None = None
        self.plan_at_s: float | None = None
        self._blocked = False  # an arrival during the pending unit could not join (FCFS)
        self.arrived = False  # whether the last PLAN admitted a request that was due
        self.version = 0  # moves on whenever the next event may have changed (see `drive`)
        # Where a fleet's loop collects the replicas whose version moved (see `drive`), and
        # the event it is taking (what a router's look at that time may see: `split`).
        self.moved: list[Replica] | None = None
        self.order: EventOrder | None = None
        # Whether every arrival of `source` comes here (no router in between): only then
        # does the next arrival say where a jump will be cut (`cut_s`).
        self.sole = True
        # Whether it shares a router with other replicas: an arrival it will turn away then
        # cuts its pending unit (`_maybe_cut`). Kept when a fleet runs its replicas apart,
        # each `sole` over its own arrivals, so their rows group as on one clock.
        self.routed = False

    # The clock loop's side.

    def _touch(self) -> None:
        """The next event may have changed: a new version, told to the fleet's loop."""
        self.version += 1
        if self.moved is not None:
            self.moved.append(self)

    def next_event(self) -> tuple[float, int] | None:
        """(time, priority) of this replica's next step, or None while it waits for work."""
        if self.plan_at_s is not None and (self.unit_end_s is None or self.plan_at_s < self.unit_end_s):
            return self.plan_at_s, PLAN
        if self.unit_end_s is not None:
            return self.unit_end_s, END
        return None

    def step(self) -> None:
        """Take the next event (see `next_event`)."""
        event = self.next_event()
        assert event is not None, "a replica without an event was stepped"
        self.take(event)

    def take(self, event: tuple[float, int]) -> None:
        """Take `event`, which `next_event` gave just now (a loop that asked already)."""
        time_s, kind = event
        self._touch()
        self.now_s = time_s
        if kind == END:
            self._end()
        else:
            self._plan()

    def promise(self, req_id: int) -> None:
        """`req_id` is routed here and will be delivered later (`add_request`): a router
        sees it waiting here from now on, as a colocated router sees its inbox."""
        self.promised.append(req_id)

    def add_request(self, req_id: int, time_s: float) -> None:
        """A request routed here at its arrival time `time_s` (the loop's now)."""
        self._touch()
        if self.promised:
            self.promised.remove(req_id)
        self.inbox.append(req_id)
        if self.unit_end_s is None or self.stepper.plans_on_arrival:
            if self.plan_at_s is None or time_s < self.plan_at_s:
                self.plan_at_s = time_s
            return
        self._maybe_cut(req_id, time_s)

    def wake(self, time_s: float) -> None:
        """Something outside changed what the scheduler could do at `time_s` (KV it held
        moved away): look again there, as the reference loop would at its next boundary."""
        self._touch()
        if self.unit_end_s is None:
            if self.plan_at_s is None or time_s < self.plan_at_s:
                self.plan_at_s = time_s
            return
        self._cut_at(time_s)

    def load(self, time_s: float) -> Load:
        """The load at `time_s`, with any part of a pending jump that ended before it applied;
        the inbox and the promised requests wait, with what is left of their prompts (none
        of a prompt prefilled elsewhere) and outputs."""
        self.split(time_s)
        base = self.stepper.load()
        queued = self.inbox + self.promised
        if not queued:
            return base
        prompt_left, output_left = tokens_left(self.scheduler, queued)
        return Load(base.running, base.waiting + len(queued),
                    base.waiting_prompt_tokens + prompt_left,
                    base.outstanding_tokens + prompt_left + output_left, base.kv_used_tokens,
                    base.kv_capacity_tokens)

    def advance(self, until_s: float) -> None:
        """Take every event before `until_s`, then apply the part of a pending jump that
        ended before it: the state at `until_s`, never past it. For a replica driven on its
        own (requests given with `add_request` at their times); `drive` steps a fleet's
        replicas in its own order."""
        while (event := self.next_event()) is not None and event[0] < until_s:
            self.step()
        self.split(until_s)

    def num_requests(self, time_s: float) -> int:
        """Running and waiting requests, the inbox and the promised included: what
        `load(time_s).requests` says, read without applying a pending jump (the scheduler's
        count is fixed within a run), less the inbox's requests turned away by then."""
        count = self.scheduler.num_requests + len(self.inbox) + len(self.promised)
        if self.routed or not self.inbox or self.unit_end_s is None:
            return count  # a routed replica cut its unit where it turned one away
        return count - self._turned_away_by(time_s)

    def _turned_away_by(self, time_s: float) -> int:
        """How many of the inbox's requests the reference loop has turned away by `time_s`,
        inside the pending unit: one that never fits goes at the first of its boundaries at
        or after its arrival. A lone replica (not `routed`) arriving behind a blocked FCFS
        head does not cut there (`_maybe_cut`), and a count of its inbox alone read one
        request too many behind a `least_outstanding` router until the unit ended (a
        reviewer's finding). The inbox holds only what was delivered during the unit."""
        ends_s, arrival_s = self.stepper.ends_s(), self.source.arrival_s
        turned_away = 0
        for req_id in self.inbox:  # in arrival order, so their boundaries ascend
            k = bisect.bisect_left(ends_s, arrival_s[req_id])
            if k >= len(ends_s) - 1:  # the unit's own end: its PLAN is still to come
                break
            boundary_s = ends_s[k]
            if boundary_s > time_s or (boundary_s == time_s and not self._went_before(PLAN, time_s)):
                break
            turned_away += self.scheduler.never_fits(req_id)
        return turned_away

    def split(self, time_s: float) -> None:
        """Apply the iterations of a pending jump that ended before `time_s`, and replan.

        One that ends at `time_s` itself is applied where the reference loop would have
        taken that END (and the PLAN after it) before the fleet's event at `time_s` that
        asks (`EventOrder`): a router's look after a lower-numbered replica's END there."""
        ends_s = self.stepper.ends_s()
        k = bisect.bisect_left(ends_s, time_s)
        plan = True
        if k < len(ends_s) - 1 and ends_s[k] == time_s and self._went_before(END, time_s):
            k += 1
            plan = self._went_before(PLAN, time_s)
        if k == 0 or k >= len(ends_s):
            return
        self._touch()
        self.stepper.cut(k)
        self.now_s = float(ends_s[k - 1])
        self._end()
        if plan:
            self._plan()

    def _went_before(self, priority: int, time_s: float) -> bool:
        """Whether this replica's event (`time_s`, `priority`), one of a pending jump's
        boundaries, was taken already by the reference loop at the fleet's present time
        (`EventOrder`)."""
        order = self.order
        return (order is not None and order.time_s == time_s
                and (priority, self.index) < (order.priority, order.index))

    # The skeleton.

    def _end(self) -> None:
        self.stepper.finish()
        self.unit_end_s = None
        self.plan_at_s = self.now_s

    def _plan(self) -> None:
        self.plan_at_s = None
        self.arrived = False
        if self.inbox:  # about half of a run's boundaries have no delivery waiting
            self.arrived = self.inbox_due()
            self._admit_inbox()
        self._blocked = False
        self.unit_end_s = self.stepper.start(self.now_s)
        if self.unit_end_s is None:
            self.plan_at_s = self.stepper.wake_s
            if self.plan_at_s is None and not self.inbox:  # waits for work, or for held KV to move
                assert not self.scheduler.has_unfinished() or self.scheduler.held_ids(), \
                    "replica idle with unfinished requests"
            return
        arrival_s = self.source.arrival_s
        for req_id in self.inbox:  # delivered after this boundary (a split replans in the past)
            self._maybe_cut(req_id, float(arrival_s[req_id]))

    def _admit_inbox(self) -> None:
        """Give the scheduler every delivered request that arrived by now."""
        inbox, arrival_s, now_s = self.inbox, self.source.arrival_s, self.now_s
        k = 0
        while k < len(inbox) and arrival_s[inbox[k]] <= now_s:
            k += 1
        if not k:
            return
        rejected = self.scheduler.rejected_ids
        before = len(rejected)
        for req_id in inbox[:k]:
            self.scheduler.add_request(req_id)
        del inbox[:k]
        if len(rejected) > before:  # turned away: answered at once
            self.source.on_rejected(np.array(rejected[before:], dtype=np.int64), now_s)

    def inbox_due(self) -> bool:
        """Whether a delivered request waits to be admitted at this boundary."""
        return bool(self.inbox) and self.source.arrival_s[self.inbox[0]] <= self.now_s

    def _maybe_cut(self, req_id: int, time_s: float) -> None:
        """Cut the pending unit where the reference loop would admit `req_id` (or turn it
        away, where that is visible: to a closed loop, or to a router that counts)."""
        ends_s = self.stepper.ends_s()
        if len(ends_s) < 2 or time_s > ends_s[-2]:
            return
        if (self.source.closed_loop or self.routed) and self.scheduler.never_fits(req_id):
            # Turned away at the boundary: visible to a closed loop's client, and to a
            # router that counts this replica's requests (`num_requests`, read between
            # cuts), even while the head is blocked.
            self._cut_at(time_s)
            return
        if self._blocked:
            return
        if not self.scheduler.admits_arrival(req_id):
            self._blocked = True  # FCFS: a later arrival cannot join before this one
            return
        self._cut_at(time_s)

    def _cut_at(self, time_s: float) -> None:
        """End the pending unit at its first boundary at or after `time_s` whose PLAN the
        reference loop has not taken yet, if one is inside. A boundary at `time_s` itself
        may have planned already: a closed loop's follow-up sent at `time_s` by a rejection
        at a higher-numbered replica's PLAN comes after a lower-numbered replica's PLAN
        there, and waits for that replica's next boundary (fast mode admitted it one
        iteration early; a tester's finding)."""
        ends_s = self.stepper.ends_s()
        if len(ends_s) < 2 or time_s > ends_s[-2]:
            return
        k = bisect.bisect_left(ends_s, time_s)
        if ends_s[k] == time_s and self._went_before(PLAN, time_s):
            k += 1
        if k < len(ends_s) - 1:
            self.stepper.cut(k + 1)
            self.unit_end_s = float(self.stepper.ends_s()[-1])

    # What steppers ask of the skeleton.

    def cut_s(self, start_s: float, until_s: float = math.inf) -> float:
        """Where a jump from `start_s` will be cut, as far as is known at its start, or inf.

        The first warm-up break after the start, or, for a replica that gets every arrival
        (`sole`), the next arrival if it could join, or in a closed loop the first that will
        be turned away. A replica behind a router cannot know which arrival comes to it: a
        delivery cuts its jump (`add_request`), and guessing here would cut every replica's
        jump at every arrival of the fleet. (Behind a router that reads no replica, the fleet
        routes first and gives each replica its own arrivals: `orcasim.fleet.Fleet.run`.)
        """
        break_s = self._next_break_s(start_s)
        cut_s = break_s if break_s <= until_s else math.inf
        source = self.source
        if self.sole and source.pending():
            t = source.next_time_s()
            if t <= until_s and t < cut_s:
                if self.scheduler.admits_arrival(source.next_index):
                    cut_s = t
                elif source.closed_loop:
                    cut_s = min(cut_s, self._rejection_s(min(cut_s, until_s)))
        return cut_s

    def cut_bound_s(self, start_s: float) -> float:
        """A time no later than `cut_s(start_s)`, found without asking the scheduler: the
        next warm-up break, or for a sole replica the next arrival if sooner. A fused loop
        steps up to it and asks `cut_s` only if its steps reach it: about half of a paged
        run's next arrivals come after the run's natural end, where the admission check
        that `cut_s` makes would be wasted."""
        break_s, source = self._next_break_s(start_s), self.source
        if self.sole and source.pending():
            return min(break_s, source.next_time_s())
        return break_s

    def _next_break_s(self, start_s: float) -> float:
        """The first warm-up break after `start_s`, or inf (those before it are dropped)."""
        breaks_s = self._breaks_s
        while breaks_s and breaks_s[-1] <= start_s:
            breaks_s.pop()
        return breaks_s[-1] if breaks_s else math.inf

    def _rejection_s(self, until_s: float) -> float:
        for t, req_id in self.source.upcoming(until_s):
            if self.scheduler.never_fits(req_id):
                return t
        return math.inf

    def late_waiting(self, ends_s: Times, n: int) -> int:
        """Waiting count summed over a unit's later iterations, for deliveries inside it.

        The reference loop would have queued each at the first boundary at or after its
        arrival; they are queued when the unit ends, and counted here as if on time. One
        that will be turned away never waits.
        """
        if n == 1 or not self.inbox:
            return 0
        last_s = float(ends_s[n - 2])
        arrival_s = self.source.arrival_s
        if arrival_s[self.inbox[0]] > last_s:  # the usual case: all came in the last iteration
            return 0
        times = [float(arrival_s[r]) for r in self.inbox
                 if arrival_s[r] <= last_s and not self.scheduler.never_fits(r)]
        if not times:
            return 0
        boundary = np.searchsorted(np.asarray(ends_s[: n - 1]), times, side="left")
        return int((n - 1 - boundary).sum())


Router = Callable[[int, float], Replica]


def share_a_router(replicas: Sequence[Replica]) -> None:
    """`replicas` sit behind one router: each gets every arrival (`sole`) only when alone,
    and counts as routed (`routed`: it cuts where it turns one away) when it has company.
    A colocated fleet's replicas, or one pool of a disaggregated cluster."""
    for replica in replicas:
        replica.sole, replica.routed = len(replicas) == 1, len(replicas) > 1


@dataclass(slots=True)
class EventOrder:
    """What a fleet's loop has taken at its present time: the greatest (priority, replica
    index) of the replica events taken at `time_s`. Not the last one: an event pushed at
    that time after a greater one was taken (a replica given a request by a rejection's
    follow-up there) is taken after it, so the heap's pops at one time are not in key
    order. A jumping replica's boundary at `time_s` is an event the reference loop had
    from before that time, so it went before iff its key is below the greatest taken."""

    time_s: float = -math.inf
    priority: int = PLAN
    index: int = -1

    def take(self, time_s: float, priority: int, index: int) -> None:
        if time_s != self.time_s or (priority, index) > (self.priority, self.index):
            self.time_s, self.priority, self.index = time_s, priority, index


def drive(replicas: Sequence[Replica], source: ArrivalSource, route: Router,
          wait_until: Callable[[float], None] | None = None,
          bridges: Sequence[tuple[ArrivalSource, Router]] = ()) -> float:
    """Run every replica until all requests are done; the time of the last event.

    One heap keyed by (time, priority, replica index, version): a replica's entry is
    stale once its version moved on (it stepped, was given a request, or a router's look
    split its pending jump); every replica whose version moved is pushed again.
    `bridges` are further sources with their routers (a disaggregated cluster's transfers
    to its decode pool); at equal times `source` goes first, then the bridges in order.
    `wait_until(t)`, if given, is called before each event at t: a real server on the
    wall clock sleeps there (calibrate/replay.py); a simulation never waits.
    """
    if len(replicas) == 1 and not bridges:
        return _drive_one(replicas[0], source, route, wait_until)
    inputs = [(source, route), *bridges]
    heap: list[tuple[float, int, int, int]] = []
    pushed = [-1] * len(replicas)  # the version of each replica's live entry
    moved: list[Replica] = []  # replicas whose version moved since the last push
    order = EventOrder()

    def push(replica: Replica) -> None:
        pushed[replica.index] = replica.version
        event = replica.next_event()
        if event is not None:
            heapq.heappush(heap, (event[0], event[1], replica.index, replica.version))

    for index, replica in enumerate(replicas):
        assert replica.index == index, "replicas must be numbered by their position"
        replica.moved, replica.order = moved, order
        push(replica)
    end_s = 0.0
    try:
        while True:
            while heap and heap[0][3] != replicas[heap[0][2]].version:
                heapq.heappop(heap)
            if bridges:
                arrival_s, k = min((s.next_time_s() if s.pending() else math.inf, k)
                                   for k, (s, _) in enumerate(inputs))
            else:
                arrival_s, k = source.next_time_s() if source.pending() else math.inf, 0
            if heap and (heap[0][0], heap[0][1]) < (arrival_s, ARRIVAL):
                if wait_until is not None:
                    wait_until(heap[0][0])
                time_s, priority, index, _ = heapq.heappop(heap)
                order.take(time_s, priority, index)
                replica = replicas[index]
                replica.step()
                end_s = max(end_s, replica.now_s)
            elif arrival_s < math.inf:
                if wait_until is not None:
                    wait_until(arrival_s)
                source_k, route_k = inputs[k]
                for req_id in source_k.take_until(arrival_s):
                    route_k(req_id, arrival_s).add_request(req_id, arrival_s)
            else:
                if heap or any(s.pending() for s, _ in inputs):
                    raise ScenarioError(past_the_clock(math.inf))  # a step or a move overflowed
                return end_s
            # A step or a delivery may move others (completions, KV, a router's look).
            for replica in moved:
                if replica.version != pushed[replica.index]:
                    push(replica)
            moved.clear()
    finally:
        for replica in replicas:
            replica.moved, replica.order = None, None


def _drive_one(replica: Replica, source: ArrivalSource, route: Router,
               wait_until: Callable[[float], None] | None) -> float:
    """`drive` for one replica: the same order of events, without the heap."""
    end_s = 0.0
    while True:
        event = replica.next_event()
        arrival_s = source.next_time_s() if source.pending() else math.inf
        if event is not None and event < (arrival_s, ARRIVAL):  # (time, priority) each
            if wait_until is not None:
                wait_until(event[0])
            replica.take(event)
            if replica.now_s > end_s:  # max's value, without its call
                end_s = replica.now_s
            if event[1] == END and not (source.pending() and source.next_time_s() <= end_s):
                replica.step()  # its PLAN at the same time: nothing can arrive in between
        elif arrival_s < math.inf:
            if wait_until is not None:
                wait_until(arrival_s)
            for req_id in source.take_until(arrival_s):
                route(req_id, arrival_s).add_request(req_id, arrival_s)
        else:
            if event is not None or source.pending():  # a step's end overflowed to inf
                raise ScenarioError(past_the_clock(math.inf))
            return end_s


def single(replica: Replica) -> Router:
    """The router of a one-replica loop."""
    return lambda _req_id, _time_s: replica


def shared_recorder(requests: Requests, base: Recorder | None) -> Recorder:
    """A recorder of its own rows over `base`'s per-request arrays (one set per run)."""
    recorder = Recorder(0 if base is not None else len(requests))
    if base is not None:
        recorder.first_scheduled_s = base.first_scheduled_s
        recorder.first_token_s = base.first_token_s
        recorder.finish_s = base.finish_s
    return recorder
