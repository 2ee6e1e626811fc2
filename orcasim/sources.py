"""Where requests come from: a replay of fixed arrival times, polled by the clock loop.

`orcasim.closed_loop` adds the source whose arrivals depend on completions.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence

import numpy as np


class ArrivalSource:
    """The requests not yet given to the scheduler, in arrival (= id) order.

    An open-loop source replays fixed times. `on_finished` is how the engine reports
    completions, for a source whose arrivals depend on them (`orcasim.closed_loop`).
    """

    closed_loop = False  # whether completions and rejections make arrivals

    def __init__(self, arrival_s: np.ndarray) -> None:
        self.arrival_s = arrival_s
        self._times = arrival_s.tolist()  # Python floats: cheap scalar reads in the loop
        self.next_index = 0

    def pending(self) -> bool:
        return self.next_index < len(self._times)

    def next_time_s(self) -> float:
        return self._times[self.next_index]

    def take_until(self, now_s: float) -> range:
        """Ids that arrived by `now_s`."""
        times, i = self._times, self.next_index
        while i < len(times) and times[i] <= now_s:
            i += 1
        taken = range(self.next_index, i)
        self.next_index = i
        return taken

    def times_until(self, time_s: float) -> np.ndarray:
        """Times of the pending arrivals at or before `time_s`, in order (float64)."""
        stop = int(np.searchsorted(self.arrival_s, time_s, side="right"))
        return self.arrival_s[self.next_index : stop]

    def upcoming(self, time_s: float) -> list[tuple[float, int]]:
        """The pending arrivals at or before `time_s` as (time, id), in delivery order."""
        return list(zip(self.times_until(time_s).tolist(), itertools.count(self.next_index),
                        strict=False))

    def on_finished(self, req_ids: Iterable[int], time_s: float) -> None:
        """Requests done (or turned away) at `time_s`: nothing follows in an open loop."""

    def on_pulled(self, pulled: Sequence[tuple[int, float]],
                  time_s: float) -> tuple[tuple[int, float], ...]:
        """KV pulled in by an iteration that starts at `time_s`: each request with the
        seconds after it at which its copy ends, one after another on an idle link. Returns
        the same copies placed on the links as they are (a sender's link moves one copy at a
        time), which the iteration waits for. Only a disaggregated cluster's decode instances
        pull (`orcasim.disagg.BridgeSource`); an arrival elsewhere has its KV."""
        raise NotImplementedError(f"{type(self).__name__} delivers no KV to pull")

    def on_rejected(self, req_ids: Iterable[int], time_s: float) -> None:
        """Requests turned away at `time_s` (never fit): as done, unless a source tells
        them apart (a session's call that got no answer, `orcasim.sessions`)."""
        self.on_finished(req_ids, time_s)


class RoutedSource(ArrivalSource):
    """The arrivals a router sent to one replica, as that replica's own source: `ids`
    ascending (arrival order), their times read from the workload's `arrival_s`.

    For a router whose choices read nothing the replicas do (round robin, random), where
    the whole routing is fixed by the arrivals and each replica can run on its own with
    every arrival it will get in sight (`orcasim.fleet.Fleet.run`).
    """

    def __init__(self, arrival_s: np.ndarray, ids: list[int]) -> None:
        self.arrival_s = arrival_s
        self._ids = ids
        self._times = arrival_s[ids].tolist()
        self._position = 0

    @property
    def next_index(self) -> int:  # type: ignore[override]  # the next request's id
        return self._ids[self._position]

    def pending(self) -> bool:
        return self._position < len(self._times)

    def next_time_s(self) -> float:
        return self._times[self._position]

    def take_until(self, now_s: float) -> list[int]:  # type: ignore[override]
        times, i = self._times, self._position
        while i < len(times) and times[i] <= now_s:
            i += 1
        taken = self._ids[self._position : i]
        self._position = i
        return taken

    def _stop(self, time_s: float) -> int:
        return bisect.bisect_right(self._times, time_s, lo=self._position)

    def times_until(self, time_s: float) -> np.ndarray:
        return np.array(self._times[self._position : self._stop(time_s)], dtype=np.float64)

    def upcoming(self, time_s: float) -> list[tuple[float, int]]:
        stop = self._stop(time_s)
        return list(zip(self._times[self._position : stop], self._ids[self._position : stop],
                        strict=True))
