"""Is the queue stable? A run whose arrivals outpace what the server admits is flagged.

A finite run at an overloaded rate ends before its queue does: its latencies describe how
long the run was, not the server, and can look fine when the run is short. The test reads
the number of requests *waiting* (arrived, never yet scheduled; those that arrived before the
warm-up too, the queue the later ones join) over the arrival window after warm-up, less its
first quarter (where a queue that starts empty fills to its level):

- a stable queue's waiting count fluctuates around a level, whatever that level (a paged
  server running 200 requests at once has few waiting);
- an unstable one grows by (arrival rate - service rate) per second.

The growth over that span is the least-squares slope of the waiting count against time (in
continuous time, exactly) times the span's length. On the span as x from 0 to 1, the slope of
a step function w is 12 * integral of (x - 1/2) w(x) dx, and a step of +1 at u adds u (1 - u) / 2
to that integral: so the growth is 6 * (sum of u (1 - u) over arrivals - the same over first
schedulings), each u clipped to [0, 1]. Unlike a sampled count it moves continuously with every
timestamp, so runs whose timestamps agree to rounding (fast and reference mode) agree on it.
Its noise scale is the Poisson spread of the span's arrival count, sqrt(n): arrivals alone
could outrun a server that keeps up on average by about that much. The run is saturated when the growth
exceeds `SATURATION_Z` of those (three: a one-sided 0.1% chance for Poisson noise). A burst
that overloads the server for a while and drains before the arrivals end leaves a flat or
falling count and is not flagged; a load that rises through the run and outgrows the
server is, which is what happened.

The test's power grows with the run: at rho = 1.2 the expected growth over the window's
0.75 n arrivals is 0.75 n (1 - 1/rho), so z is about (1 - 1/rho) sqrt(0.75 n) = 0.14 sqrt(n);
1,000 requests give z near 4.6, 300 only 2.5 (too short to tell an overload of 20% from
Poisson noise; an M/D/1 server read 4.24 and 2.25 on the mean of 20 seeds). Runs with fewer than `MIN_ARRIVALS` in the span are too
short to judge: NaN evidence, not flagged.

A second test reads the requests *in the system* (arrived, not yet finished: waiting and
running). A server with no effective limit on its running set (a paged server of 1,024
sequences and KV far beyond the load) admits every arrival at once: its waiting count stays
flat while the running set grows and each iteration slows, and the first test calls it stable
(a tester's server of about 107 req/s read z 0.2 at 117.6 offered). A stable server's count in
the system levels off at the arrival rate times the mean latency (Little's law), but only once
its last early requests finish: before that it rises at any load, so this test's window
starts no earlier than the 90th percentile of latency after the first arrival (or half-way
through the arrivals, if that is sooner: an overloaded server's latency can outgrow the run),
and its growth is in units of the noise
of both counts, sqrt(arrivals + finishes in the window) (see `in_system_saturation`). That
count also grows on servers that keep up (a rising arrival rate, a long latency tail, a
short run's start-up), so a run is `saturated` when the waiting test fires, and
`orcasim run` says so when only the second does, without the flag; the capacity search, whose
runs are of one constant-rate workload, fails a rate on either.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from orcasim.warmup import counted

SATURATION_Z = 3.0
MIN_ARRIVALS = 20
SKIP_FRACTION = 0.25  # of the arrival window, left out at its start
# The in-system test's window starts at this quantile of latency after the first arrival,
# where a stable server's count has nearly levelled off, but no later than `MAX_RAMP_FRACTION`
# of the arrival window: an overloaded server without a limit on its running set slows every
# request as the run goes on, so its latency outgrew the window and left nothing to judge
# (`in_system_saturation`).
RAMP_QUANTILE = 0.9
MAX_RAMP_FRACTION = 0.5
WAITING_EVIDENCE = ("saturation_z", "saturation_growth_requests", "saturation_arrival_rps",
                    "saturation_admission_rps")
IN_SYSTEM_EVIDENCE = ("in_system_z", "in_system_growth_requests", "in_system_arrival_rps",
                      "in_system_finish_rps")


def waiting_count(arrival_s: np.ndarray, scheduled_s: np.ndarray, t_s: np.ndarray) -> np.ndarray:
    """Requests arrived and not yet first scheduled at each time of `t_s` (never scheduled: +inf)."""
    arrived = np.searchsorted(np.sort(arrival_s), t_s, side="right")
    started = np.searchsorted(np.sort(scheduled_s), t_s, side="right")
    return arrived - started


@dataclass(frozen=True)
class Growth:
    """How much a count of things entered and not yet left grew over a window (see the
    module docstring): `growth`, `z` in units of sqrt(`entered`), over [`from_s`, `from_s` +
    `span_s` = `end_s`]: the last three quarters of the entries, or from a later start
    (`growth_over_entries`' `not_before_s`)."""

    growth: float
    z: float
    from_s: float
    end_s: float
    entered: int

    @property
    def span_s(self) -> float:
        return self.end_s - self.from_s


def growth_over_entries(entered_s: np.ndarray, left_s: np.ndarray,
                        not_before_s: float = -np.inf) -> Growth | None:
    """The `Growth` of the things entered at `entered_s` and left at `left_s` (inf: never)
    over the window from `SKIP_FRACTION` of the entries' span (or `not_before_s`, if later)
    to the last entry; None where fewer than `MIN_ARRIVALS` entered in it, too few to judge."""
    if len(entered_s) < 2:
        return None
    start_s, end_s = float(entered_s.min()), float(entered_s.max())
    from_s = max(start_s + SKIP_FRACTION * (end_s - start_s), not_before_s)
    span_s = end_s - from_s
    entered = int(((entered_s >= from_s) & (entered_s <= end_s)).sum())
    if entered < MIN_ARRIVALS or span_s <= 0:
        return None
    # On the span's fraction (0 to 1), so the slope is the growth over the span whatever the
    # time scale.
    growth = 6.0 * (_steps_moment(entered_s, from_s, span_s) - _steps_moment(left_s, from_s, span_s))
    return Growth(growth, float(growth / np.sqrt(entered)), from_s, end_s, entered)


def judged_requests(reqs: pd.DataFrame, warmup_s: float) -> np.ndarray:
    """Which rows of a request table a saturation test judges (a boolean mask): those that
    arrived after the warm-up and were not turned away as never fitting."""
    keep = counted(reqs["arrival_s"].to_numpy(dtype=np.float64), warmup_s)
    if "rejected" in reqs:
        keep &= ~reqs["rejected"].to_numpy(dtype=bool)
    return keep


def grew(z: float) -> bool:
    """Whether a growth of `z` (in units of its noise) is past chance: the saturation rule,
    False for NaN (too short to judge)."""
    return bool(z > SATURATION_Z)


def saturation(reqs: pd.DataFrame, warmup_s: float = 0.0,
               admitted_s: np.ndarray | None = None) -> dict[str, float]:
    """`saturated` (1.0 or 0.0): the waiting queue (`waiting_saturation`, which `admitted_s`
    is for) grew past chance (`grew`); with its evidence and the requests in the system's
    (`in_system_saturation`), which is evidence, not the flag: a stable server's count in the
    system also grows under a rising arrival rate (Little's law), a long tail of latencies
    or a run shorter than its start-up (a tester's probes: in-system z 3.4 to 9.7 on servers
    that kept up). After a warm-up both tests count every request, those that arrived
    before it too, over the window of those that arrived after it (`occupancy_growth`). The capacity search,
    which compares runs of one constant-rate workload, counts both (`orcasim.capacity`)."""
    out = {**waiting_saturation(reqs, warmup_s, admitted_s), **in_system_saturation(reqs, warmup_s)}
    return {"saturated": float(grew(out["saturation_z"])), **out}


def waiting_saturation(reqs: pd.DataFrame, warmup_s: float = 0.0,
                       admitted_s: np.ndarray | None = None) -> dict[str, float]:
    """The waiting queue's growth over the last three quarters of the arrival window
    (requests), that span's arrival and admission rates (req/s) and the growth in units of
    its noise (`saturation_z`); NaN where too short to judge. A request waits until it is
    first scheduled, or until `admitted_s` (per row of `reqs`; NaN: never) where that is the
    stage that queues: a disaggregated cluster's decode admission.

    The window is the judged arrivals' (`judged_requests`: after the warm-up), but the
    count is of every request waiting in it, those that arrived before the warm-up too:
    they are the queue the judged ones join. Counting the judged alone, the count started
    from zero at the warm-up and filled to the queue's level, which read as growth where
    the wait is long against the window: 64 clients with no think time on a server busy
    throughout (X = 1 / D, e2e flat at 64 D) read z 5.6 over 87 requests after a warm-up
    and were flagged saturated (a tester's finding)."""
    present = judged_requests(reqs, -np.inf)  # not turned away
    keep = judged_requests(reqs, warmup_s)
    arrival = reqs["arrival_s"].to_numpy(dtype=np.float64)
    if admitted_s is None:
        admitted_s = reqs["first_scheduled_s"].to_numpy(dtype=np.float64)
    scheduled = np.nan_to_num(np.asarray(admitted_s, dtype=np.float64), nan=np.inf)
    if keep.sum() < 2:
        return dict.fromkeys(WAITING_EVIDENCE, float("nan"))
    g = growth_over_entries(arrival[present], scheduled[present],
                            not_before_s=_skipped_s(arrival[keep]))
    if g is None:
        return dict.fromkeys(WAITING_EVIDENCE, float("nan"))
    admitted = int(((scheduled[present] >= g.from_s) & (scheduled[present] <= g.end_s)).sum())
    return {"saturation_z": g.z, "saturation_growth_requests": g.growth,
            "saturation_arrival_rps": g.entered / g.span_s,
            "saturation_admission_rps": admitted / g.span_s}


def in_system_saturation(reqs: pd.DataFrame, warmup_s: float = 0.0) -> dict[str, float]:
    """The requests in the system (arrived, not finished; never: inf): their growth
    (requests) over the arrivals from the 90th percentile of latency (`RAMP_QUANTILE`) after
    the first to the last, that window's arrival and finish rates (req/s) and the growth in
    units of the noise of both counts (`in_system_z`); NaN where too short to judge.

    A stable server's count rises until its slowest early requests finish. From the usual
    quarter a server of 20 s latency over a 50 s window read that ramp as growth (z 4.2, where
    20,000 requests read -0.1; a review's finding). From a median latency in, a server of
    latencies spread from 2 to 38 s at 120 req/s, far below its limit, read z 3.9 to 5.0 over
    6 seeds of 9,000 requests: its count rose until its 38 s requests finished. From the 90th
    percentile it reads 0.0 to 2.0.

    The window starts no later than `MAX_RAMP_FRACTION` of the arrival window: a server with
    no limit on its running set, at 1.8 times what it serves over 1,000 requests, slows every
    request as the run goes on, and its median latency (5.7 s) outgrew the arrival window
    (5.6 s): nothing was judged, and the capacity search passed 200 req/s for a server of
    about 105. A stable server whose latency is past half the run has not reached its level
    by then either, so it reads growth too: the warning names a short run's start-up, and the
    capacity search says where a rate failed on such runs (`in_system_window_is_short`)."""
    occupancy = occupancy_growth(*_in_system_times(reqs, warmup_s))
    if occupancy is None:
        return dict.fromkeys(IN_SYSTEM_EVIDENCE, float("nan"))
    g, left = occupancy
    return {"in_system_z": g.z, "in_system_growth_requests": g.growth,
            "in_system_arrival_rps": g.entered / g.span_s, "in_system_finish_rps": left / g.span_s}


def occupancy_growth(entered_s: np.ndarray, left_s: np.ndarray,
                     judged: np.ndarray | None = None) -> tuple[Growth, int] | None:
    """The growth of a count of things that stay a while (requests in the system, sessions
    in progress) over the entries from the `RAMP_QUANTILE` of their stays after the first
    (no later than `MAX_RAMP_FRACTION` of the entries' span) to the last, its z in units of
    the noise of both the entries and the leavings in that window, and those leavings; None
    where too short to judge (see `in_system_saturation`).

    `judged` (a mask over the entries; all by default) are those after a warm-up: the
    window lies in their last three quarters, as the waiting test's, and the count is of
    every thing in progress in it, the others too. Counting the judged alone, the count
    filled from zero at the warm-up and its latency tail read as growth: a stable server
    of latencies spread from 2 to 38 s at 40 req/s over 3,000 requests read z 0.7 at most
    over 6 seeds without a warm-up and up to 3.8 (three of six past 3) with 25 s of it."""
    judged = np.ones(len(entered_s), dtype=bool) if judged is None else judged
    if judged.sum() < 2:
        return None
    ramp_s, _ = _ramp_s(entered_s, left_s)
    not_before_s = max(_skipped_s(entered_s[judged]), float(entered_s.min()) + ramp_s)
    g = growth_over_entries(entered_s, left_s, not_before_s=not_before_s)
    if g is None:
        return None
    # The leavings in the window are of entries a stay earlier, as noisy as the entries and,
    # with a stay past the window, not correlated with them (sqrt(entered) alone read a
    # stable server of 20 s latency at z 3.3 on one seed).
    left = int(((left_s >= g.from_s) & (left_s <= g.end_s)).sum())
    return dataclasses.replace(g, z=float(g.growth / np.sqrt(g.entered + left))), left


def in_system_window_is_short(reqs: pd.DataFrame, warmup_s: float = 0.0) -> bool:
    """Whether the in-system test's window started half-way through the arrivals because
    their span is under two 90th percentiles of latency (`RAMP_QUANTILE`,
    `MAX_RAMP_FRACTION`): there the count of a server that keeps up is still rising to its
    level, so a growth read is the run's start-up as much as a backlog (a stable server of
    20 s latency at 40 req/s read z 12 to 16 over 1,000 requests, -1.2 to 2.4 over 2,000,
    seeds 0 to 11). False where nothing was judged (NaN evidence: a short window is said of
    a growth read, not of none)."""
    arrival, finish, judged = _in_system_times(reqs, warmup_s)
    return occupancy_growth(arrival, finish, judged) is not None and _ramp_s(arrival, finish)[1]


def _in_system_times(reqs: pd.DataFrame,
                     warmup_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The arrivals and finishes (never: inf) of the requests not turned away, and which
    of them are judged (`judged_requests`)."""
    present = judged_requests(reqs, -np.inf)
    arrival = reqs["arrival_s"].to_numpy(dtype=np.float64)[present]
    finish = np.nan_to_num(reqs["finish_s"].to_numpy(dtype=np.float64)[present], nan=np.inf)
    return arrival, finish, judged_requests(reqs, warmup_s)[present]


def _skipped_s(judged_s: np.ndarray) -> float:
    """Where a test's window starts at the earliest: `SKIP_FRACTION` of the judged entries'
    span after the first (two at least)."""
    first_s, last_s = float(judged_s.min()), float(judged_s.max())
    return first_s + SKIP_FRACTION * (last_s - first_s)


def _ramp_s(arrival: np.ndarray, finish: np.ndarray) -> tuple[float, bool]:
    """How long after the first arrival the in-system window starts: the `RAMP_QUANTILE` of
    latency (inf where that many never finish), but no later than `MAX_RAMP_FRACTION` of the
    arrival window (see `in_system_saturation`); and whether that bound set it."""
    # A sample, not an interpolation: inf (never finished) must stay inf, not NaN.
    latency_s = float(np.quantile(finish - arrival, RAMP_QUANTILE, method="inverted_cdf"))
    bound_s = MAX_RAMP_FRACTION * float(arrival.max() - arrival.min())
    return min(latency_s, bound_s), latency_s > bound_s


def judged(summary: dict[str, float]) -> bool:
    """Whether any saturation test had enough arrivals to judge (`MIN_ARRIVALS` in its
    window): a `saturated` of 0 says "no" only then. 25 requests at three times what an
    M/D/1 server serves (e2e 2.5 s at the start, 15 s at the end) judged nothing and read
    as not saturated (a tester's finding)."""
    keys = ("saturation_z", "in_system_z", "session_saturation_z")
    return any(not np.isnan(summary.get(k, np.nan)) for k in keys)


def behind_at_constant_rate(summary: dict[str, float]) -> bool:
    """Whether a run of one constant-rate workload fell behind: its `saturated` flag, or the
    requests in the system grew, which at a constant rate (no ramp to explain it) is a
    running set holding the backlog. The rule the capacity search and the models report
    read their runs by."""
    return bool(summary["saturated"]) or grew(summary["in_system_z"])


def saturation_text(summary: dict[str, float]) -> str | None:
    """The waiting-queue test's evidence in words where it fired (the `saturated` flag);
    None where it did not."""
    if not grew(summary.get("saturation_z", float("nan"))):
        return None
    return (f"the waiting queue grew by {summary['saturation_growth_requests']:.0f} requests over "
            f"the last three quarters of the arrivals ({summary['saturation_arrival_rps']:.3g} "
            f"req/s arrived, {summary['saturation_admission_rps']:.3g} req/s admitted; "
            f"z = {summary['saturation_z']:.1f})")


def in_system_text(summary: dict[str, float]) -> str | None:
    """The in-system test's evidence in words where it fired; None where it did not."""
    if not grew(summary.get("in_system_z", float("nan"))):
        return None
    return (f"the requests in the system (waiting and running) grew by "
            f"{summary['in_system_growth_requests']:.0f} over the arrivals from a p90 latency "
            f"after the first (or half-way, if sooner) to the last "
            f"({summary['in_system_arrival_rps']:.3g} req/s arrived, "
            f"{summary['in_system_finish_rps']:.3g} req/s finished; z = {summary['in_system_z']:.1f})")


def _steps_moment(times_s: np.ndarray, from_s: float, span_s: float) -> float:
    """Sum of u (1 - u) over `times_s` as fractions u of the span, clipped to [0, 1] (a step
    before the span or after it, or never, adds nothing to the slope)."""
    u = np.clip((times_s - from_s) / span_s, 0.0, 1.0)
    return float(np.sum(u * (1.0 - u)))


def session_saturation(start_s: np.ndarray, end_s: np.ndarray, warmup_s: float = 0.0) -> dict[str, float]:
    """The sessions started and not yet ended (NaN: never) after warm-up: their growth
    (`occupancy_growth`, as the requests in the system's). A session's calls arrive only as
    its earlier answers return, so the calls' own queue drains once starts stop, however far
    behind the server fell: too many sessions started at a rate pile up as sessions in
    progress, not as waiting calls (a tester's find: a request-level server of about 200
    tasks an hour offered 540 read z = -3.3 on its calls, task p50 growing with the run).

    A session lasts as long as its tool calls and steps, however fast the server: the count
    rises for a session's length at any load. From the usual quarter of the starts, 2,000
    agents started at 10 a second, each 3 to 6 steps with 20 s of tools between them, on a
    server that answered every call in 0.2 s (task time flat over the run, p90 101 s) read
    z 4.3 to 4.9 on three seeds and were flagged saturated; the window now starts at the
    90th percentile of task time, as the in-system test's does at latency's.
    `session_saturated` and its evidence; NaN evidence where too short to judge."""
    start = np.asarray(start_s, dtype=np.float64)
    started = ~np.isnan(start)
    start = start[started]
    end = np.nan_to_num(np.asarray(end_s, dtype=np.float64)[started], nan=np.inf)
    occupancy = occupancy_growth(start, end, counted(start, warmup_s))
    if occupancy is None:
        nan = float("nan")
        return {"session_saturated": 0.0, "session_saturation_z": nan,
                "session_saturation_growth_sessions": nan}
    g, _ = occupancy
    return {"session_saturated": float(grew(g.z)), "session_saturation_z": g.z,
            "session_saturation_growth_sessions": g.growth}
