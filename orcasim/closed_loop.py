"""The arrival source of a closed-loop workload: completions make the next arrivals.

Every client sends its first request at time 0. When a request finishes (or is turned
away), its client sends the next `think_s[id]` later. Clients are alike, so only the
pending send times matter: they are kept in a heap, and the k-th arrival in time order
gets id k. Ids therefore stay FCFS order, and the k-th request to arrive gets the k-th
pre-drawn lengths, on every system alike.

With a way in (`Requests.way_in`: requests reach the engine `latency_s` after they are
sent) the heap holds send times and the engine sees each `latency_s` later; the send times
go into the clients' table, the arrival times into the engine's.

Fast mode stays exact: the engine reports completions at the boundary where they become
visible, and a follow-up is sent at or after it, so it is in the heap before the loop
next looks (see `orcasim.engine`). Requests with equal send times are interchangeable,
so the order in which completions are reported cannot change the run.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import numpy as np

from orcasim.requests import Requests
from orcasim.sources import ArrivalSource


class ClosedLoopSource(ArrivalSource):
    """Arrivals made as the run goes; writes each one's time into `requests.arrival_s`.

    `requests` must be a run's own table (`Requests.for_run`), since the times it gets
    belong to one system's run.
    """

    closed_loop = True

    def __init__(self, requests: Requests) -> None:
        assert requests.clients is not None, "a closed-loop source needs the workload's clients"
        self.arrival_s = requests.arrival_s  # this run's times: NaN until each arrives
        way_in = requests.way_in
        # Send times, where the engine sees requests later than they are sent.
        self._sent_s = None if way_in is None else way_in.sent_s
        self._latency_s = 0.0 if way_in is None else way_in.latency_s
        self._think_s = requests.clients.think_s.tolist()
        self._num_requests = len(requests)
        self._send_s = [0.0] * min(requests.clients.num_clients, self._num_requests)  # a heap
        self.next_index = 0

    def pending(self) -> bool:
        return self.next_index < self._num_requests and bool(self._send_s)

    def next_time_s(self) -> float:
        return self._send_s[0] + self._latency_s

    def take_until(self, now_s: float) -> range:
        """Ids for the requests at the engine by `now_s`, in time order; their arrival
        times are recorded (and their send times, with a way in)."""
        send_s, i, latency_s, sent_s = self._send_s, self.next_index, self._latency_s, self._sent_s
        while i < self._num_requests and send_s and send_s[0] + latency_s <= now_s:
            sent = heapq.heappop(send_s)
            self.arrival_s[i] = sent + latency_s  # exact for a latency of 0
            if sent_s is not None:
                sent_s[i] = sent
            i += 1
        taken = range(self.next_index, i)
        self.next_index = i
        return taken

    def times_until(self, time_s: float) -> np.ndarray:
        latency_s = self._latency_s
        due_s = sorted(t + latency_s for t in self._send_s if t + latency_s <= time_s)
        return np.array(due_s[: self._num_requests - self.next_index], dtype=np.float64)

    def on_finished(self, req_ids: Iterable[int], time_s: float) -> None:
        """Each request done at `time_s` frees its client, who sends again after thinking."""
        for req_id in req_ids:
            heapq.heappush(self._send_s, time_s + self._think_s[req_id])


def arrival_source(requests: Requests) -> ArrivalSource:
    """The source a run of `requests` (a run's own table, see `Requests.for_run`) uses."""
    if requests.sessions is not None:
        from orcasim.sessions import SessionSource  # it imports the workload's modules

        return SessionSource(requests)
    if requests.clients is None:
        return ArrivalSource(requests.arrival_s)
    return ClosedLoopSource(requests)
