"""`orcasim capacity`: the highest arrival rate a system sustains within its SLOs, and at what cost.

The search, per system and replication (one job each, run in parallel on the sweep backends):

1. Evaluate the scenario's own rate. A rate *passes* when the run meets the SLO
   (`orcasim.slo`: attainment, and every named percentile above the attainment share) and
   it is not saturated (`orcasim.saturation`: neither the waiting requests, the summary's
   `saturated`, nor those in the system, its `in_system_z`, grow) and it keeps up (its
   completions while requests arrive at least 0.9 of their rate, as a sweep's row must:
   `orcasim.sweeps.keeps_up`): a short run at an overloaded rate can meet
   an SLO only because it ended before its queue did, and is rejected.
2. Double the rate until one fails (or halve it until one passes): a bracket [pass, fail].
3. Bisect the bracket geometrically until its ends are within `rel_tol` (2%) of each other;
   the replication's answer is the highest rate that passed.
4. Just above the stability limit a finite run's queue grows too slowly for the saturation
   test to see (with 2,000 requests, up to about 8% over: see `orcasim.saturation` on its
   power) and a median SLO can still be met. But every saturated run of the search measured
   the server's throughput at full load (the rate it admitted requests), and a stable queue
   needs an arrival rate below it. So a rate at or above that measured throughput fails, and
   if the answer of step 3 was such a rate the search bisects again below it (halving down
   from it first where no rate that passed is left below).

Replication r draws its requests from its own seed at every rate, and a generated arrival
process scales exactly with the rate (exponential and gamma gaps are a unit draw times
1/rate; a trace is sped up), so the rates of one replication differ by the load alone
(common random numbers): attainment is then nearly monotone in the rate, which bisection
needs. The estimate is the mean over replications; its interval is Student's t at 95% over
the replications' answers (each of which lies within `rel_tol` below its own threshold).

Per configuration: goodput per GPU (the rate over the GPUs it occupies) and the cost per
million output tokens at that rate, from a price per GPU-hour (the GPU catalog's, or one
given). A warm-up given in seconds is scaled with the rate, so that it always drops the same
requests. A configuration search is a sweep file's grid over deployment and scheduler keys:
every point is searched, and the Pareto front of cost against latency at capacity is kept
(as Vidur-Search does), with the cheapest point.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from matplotlib.figure import Figure

from orcasim.cluster import SessionRouterConfig
from orcasim.columns import point_parameters
from orcasim.config import ScenarioError, errors_under
from orcasim.metrics import keeps_up_with, offered_rps, served_rps
from orcasim.paths import input_digests
from orcasim.saturation import behind_at_constant_rate, grew, in_system_window_is_short
from orcasim.scenario import (
    Scenario,
    SystemConfig,
    apply_params,
    data_inputs,
    scenario_from_dict,
    set_dotted,
    sweep_base_data,
)
from orcasim.slo import SLOConfig, number_text
from orcasim.sweeps.spec import MAX_REPLICATIONS, MAX_TASKS, point_name, replication_seeds
from orcasim.sweeps.task import JsonRecord, first_line
from orcasim.warmup import counted, measured_requests

DEFAULT_REL_TOL = 0.02
DEFAULT_REPLICATIONS = 3
DEFAULT_REQUESTS = 2000
# The finest search: a factor-2 bracket narrows to it in about 20 runs; below float64's
# resolution (1 + 1e-16 is 1) the bisection would never end.
MIN_REL_TOL = 1e-6
# The most the measured throughput is lowered by (`stable_limit`): its noise, a count over a
# finite window, is well within it (0.2% in runs of 500 requests).
MAX_THROUGHPUT_MARGIN = 0.02
MAX_BRACKET_STEPS = 10  # doublings or halvings: a factor of about a thousand either way
# The fewest requests a run of the search may have. The saturation test reads the last three
# quarters of the arrival window, in time, and judges only with MIN_ARRIVALS (20) in it:
# Poisson arrivals leave fewer there in 44% of runs of 27 requests, 0.8% of 35 and 0.02% of
# 40 (100,000 draws each), and an unjudged run passes however loaded.
MIN_SEARCH_REQUESTS = 40
TRACE_KNOB = "workload.arrival.speedup"  # the rate knob of a trace (`rate_knob`)
CAPACITY_COLUMNS = ["point", "system", "max_rate_per_s", "ci_low", "ci_high", "gpus",
                    "goodput_per_gpu", "cost_per_hour_usd", "cost_per_million_tokens"]


@dataclass(frozen=True)
class SearchSettings:
    rel_tol: float = DEFAULT_REL_TOL
    num_requests: int | None = DEFAULT_REQUESTS  # None: the scenario's own count


@dataclass(frozen=True)
class RateKnob:
    """How the offered rate is set: a dotted path and the rate one unit of it gives."""

    path: str
    rate_per_unit: float  # 1 for `rate_per_s`; a trace's own rate for `speedup`
    start_rate_per_s: float

    def value(self, rate_per_s: float) -> float:
        return rate_per_s / self.rate_per_unit


@dataclass(frozen=True)
class SearchJob:
    """One system of one configuration under one replication: picklable, for any backend."""

    point: int
    system: str
    replication: int
    seed: int
    params: dict[str, Any]
    base: dict[str, Any]  # scenario data: the point's parameters are applied on top
    base_dir: str
    knob: RateKnob
    settings: SearchSettings
    # The base's keys as given: a point that changes a `kind` starts its object again from
    # these (`apply_params`), as a sweep's point does.
    given: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"p{self.point:04d}-{self.system}-r{self.replication:02d}"


@dataclass
class SearchOutcome(JsonRecord):
    id: str
    point: int
    system: str
    replication: int
    seed: int
    params: dict[str, Any]
    ok: bool
    max_rate_per_s: float = float("nan")  # highest rate that passed (0: none did)
    fail_rate_per_s: float = float("nan")  # lowest rate above it that failed (inf: none)
    evaluations: list[dict[str, float]] = field(default_factory=list)
    error: str = ""
    wall_s: float = 0.0

    @classmethod
    def failed(cls, job: SearchJob, error: BaseException | str, wall_s: float = 0.0) -> SearchOutcome:
        return cls(job.id, job.point, job.system, job.replication, job.seed, job.params, False,
                   error=first_line(error), wall_s=wall_s)


# ---- the rate knob ------------------------------------------------------------------------

def rate_knob(scenario: Scenario, base_dir: Path | None = None,
              num_requests: int | None = None) -> RateKnob:
    """The knob that sets `scenario`'s offered rate, or a ScenarioError for a closed loop. A
    trace's own rate is that of the requests the search replays (its first `num_requests`)."""
    from orcasim.run import data_dir, make_requests

    arrival = scenario.workload.arrival
    kind = arrival.kind
    if kind in ("poisson", "gamma", "constant"):
        rate = float(arrival.rate_per_s)  # type: ignore[union-attr]
        return RateKnob("workload.arrival.rate_per_s", 1.0, rate)
    if kind == "trace":
        if num_requests is not None:
            data = scenario.model_dump(mode="json", exclude_none=True)
            cap_requests(data, num_requests)
            scenario = scenario_from_dict(data, scenario.name)
        with data_dir(base_dir), warnings.catch_warnings():
            # Silent here: each job's check draws the same requests and says what they warn
            # (said here too, a short trace's warning was printed twice; a tester's finding).
            warnings.simplefilter("ignore")
            arrival_s = make_requests(scenario).arrival_s
        speedup = float(arrival.speedup)  # type: ignore[union-attr]
        own_rate = offered_rps(arrival_s) / speedup
        if not math.isfinite(own_rate) or own_rate <= 0:
            raise ScenarioError("workload.arrival: the trace has fewer than two distinct arrival "
                                "times; expected a trace with a rate to scale")
        return RateKnob(TRACE_KNOB, own_rate, own_rate * speedup)
    raise ScenarioError(f"workload.arrival.kind = '{kind}': a capacity search scales an open "
                        "arrival process (poisson, gamma, constant or trace); a closed loop "
                        "sets its own rate, and a session's calls follow its answers")


# ---- one search ---------------------------------------------------------------------------

def point_scenario(job: SearchJob, rate_per_s: float) -> Scenario:
    """The job's configuration with only its system, at `rate_per_s`, on its seed."""
    data = copy.deepcopy(job.base)
    apply_params(data, job.params, job.given)
    data["seed"] = job.seed
    data["systems"] = [s for s in data["systems"] if s["name"] == job.system]
    set_dotted(data, job.knob.path, job.knob.value(rate_per_s))
    # A warm-up in seconds drops the same requests at every rate.
    data["warmup_s"] = float(data.get("warmup_s", 0.0)) * job.knob.start_rate_per_s / rate_per_s
    if job.settings.num_requests is not None:
        cap_requests(data, job.settings.num_requests)
    return scenario_from_dict(data, f"{job.id} at {rate_per_s:.6g} req/s")


def search_data_inputs(jobs: Sequence[SearchJob]) -> list[Path]:
    """The data files the search reads, every point's (a grid over the trace names its own, as
    a sweep's point may: `Sweep.data_inputs`): the base's alone were digested, and a resumed
    search kept a point's answer from a trace since changed (115.3 req/s, 0 afresh)."""
    paths: set[Path] = set()
    for job in {job.point: job for job in jobs}.values():
        paths.update(data_inputs(point_scenario(job, job.knob.start_rate_per_s), Path(job.base_dir)))
    return sorted(paths)


def cap_requests(data: dict[str, Any], num_requests: int) -> None:
    """Make a scenario's data run `num_requests` requests: a trace replays its first ones
    (`max_requests`, in place of the `num_requests` that may have capped it), anything else
    draws that many."""
    if data["workload"]["arrival"]["kind"] == "trace":
        data["workload"].pop("num_requests", None)
        set_dotted(data, "workload.arrival.max_requests", num_requests)
    else:
        set_dotted(data, "workload.num_requests", num_requests)


def evaluate(job: SearchJob, rate_per_s: float) -> dict[str, float]:
    """One run of the job's system at `rate_per_s`: whether it passes, and why."""
    from orcasim.run import run_scenario

    scenario = point_scenario(job, rate_per_s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # saturation is read from the summary
        result = run_scenario(scenario, base_dir=Path(job.base_dir))
    system = result.systems[job.system]
    z, short = judged_in_system(system.summary, system.replicas, system.requests, scenario.warmup_s)
    s = {**system.summary, "in_system_z": z}
    offered, served = offered_and_served_rps(system.requests, scenario.warmup_s)
    # A run no longer than its latency (served NaN) is left to the saturation tests: the
    # throughput a sweep reads in its place holds the drain, and fails any such run.
    kept = math.isnan(served) or keeps_up_with(offered, served)
    passes = bool(s["slo_met"]) and not behind_at_constant_rate(s) and kept
    row = {"rate_per_s": rate_per_s, "passes": float(passes), "slo_met": s["slo_met"],
           "offered_rps": offered, "served_rps": served,
           # NaN where the run measured no served rate: not judged on it, not kept up.
           "kept_up": float("nan") if math.isnan(served) else float(kept),
           "saturated": s["saturated"], "saturation_z": s["saturation_z"],
           "in_system_z": s["in_system_z"], "in_system_short": float(short),
           "saturation_admission_rps": s["saturation_admission_rps"],
           "full_load_rps": _full_load_or_served(full_load_rps(s, system.replicas,
                                                               equal_shares(scenario.systems[0])),
                                                 served, kept, admissions_kept_up(s)),
           "slo_attainment": s["slo_attainment"], "throughput_rps": s["throughput_rps"],
           "output_tokens_mean": served_tokens_per_request(system.requests, scenario.warmup_s)}
    row.update({k: v for k, v in s.items() if k.startswith("slo_") and k not in row})
    return row


def offered_and_served_rps(requests: pd.DataFrame, warmup_s: float) -> tuple[float, float]:
    """What the keeps-up test of a sweep's rows (`orcasim.sweeps.keeps_up`) compares, for a
    run of the search: the realised arrival rate of the requests it answers (a request turned
    away as never fitting is no load it falls behind on) and its completions while requests
    arrive (`served_rps`). The saturation tests need a queue to grow for long enough to see:
    an M/D/1 server of 10 req/s passed 14.9 req/s with --requests 40 (its queue's z 1.6 at 20
    req/s; at 15 req/s such runs completed a median 0.69 of their arrivals while they came,
    over 12 seeds), and the search answered that; a system that sustains a rate completes at
    it."""
    measured = measured_requests(requests, warmup_s)
    arrival_s = requests["arrival_s"].to_numpy(dtype=np.float64)
    answered = 1.0 - float(measured["rejected"].mean()) if "rejected" in measured else 1.0
    return (offered_rps(arrival_s, 1, warmup_s) * answered,
            served_rps(arrival_s, requests["finish_s"].to_numpy(dtype=np.float64), warmup_s))


def _full_load_or_served(full_load: float, served: float, kept: bool, admitted: bool) -> float:
    """A run's throughput at full load: its admission rate where its waiting queue grew
    (`full_load_rps`), else its completions while requests arrived where it did not keep up
    with them and its admissions fell behind its arrivals too (`admitted` False: the server
    was busy throughout). Failed on that test alone, a run measured nothing, and the search,
    never saturating a queue, answered above the server's throughput: GPT-3 175B orca-bs16
    over --requests 300 failed 8.0 req/s on it (6.75 served), then passed 7.42, where its
    saturated runs admit 6.7 to 7.1. A server that admits every arrival at once (a running
    set without a limit that binds) completes behind its arrivals by its latency while the
    set fills, not by its throughput: its served rate is no full-load figure. Counted as one,
    a paged server of about 100 req/s (`max_num_seqs: 16384`, 2,000 requests, seed 0) read
    35.7 at 141 req/s (it admitted 0.97 of its arrivals) and the search answered 73.7, below
    rates that kept up (a tester's finding)."""
    return served if math.isnan(full_load) and not kept and not admitted else full_load


def admissions_kept_up(summary: dict[str, float]) -> bool:
    """Whether a run admitted its requests about as fast as they came (the keeps-up rule on
    the waiting queue's admissions against its arrivals, over the saturation test's window);
    False where that window measured nothing (NaN): not shown to keep up, the run's served
    rate counts as before this test."""
    arrived, admitted = summary["saturation_arrival_rps"], summary["saturation_admission_rps"]
    if math.isnan(arrived) or math.isnan(admitted):
        return False
    return bool(keeps_up_with(arrived, admitted))


def judged_in_system(summary: dict[str, float], replicas: pd.DataFrame | None,
                     requests: pd.DataFrame, warmup_s: float) -> tuple[float, bool]:
    """The in-system test's z that a rate is judged on, and whether its window was short
    (`in_system_window_is_short`) on the requests it read: a fleet's highest replica's,
    where above its pooled count's. One replica of eight, 3x slower per token, whose running
    set held its backlog (its in-system z 8.4, e2e p50 10.3 s against 0.8 s) read z 2.8 on
    the pooled count, diluted by the others' arrivals, and the rate passed (a tester's
    finding). A fleet's waiting queue is judged the same way by its `saturated` flag
    (orcasim.run). The window is the judged replica's: the pooled latency's p90 is the
    quick replicas', and said a slow one's half-way window was not short."""
    z = float(summary["in_system_z"])
    if (replicas is not None and "in_system_z" in replicas and len(replicas)
            and "replica" in requests):
        zs = replicas["in_system_z"].to_numpy(dtype=np.float64)
        if not np.isnan(zs).all():
            i = int(np.nanargmax(zs))
            if zs[i] > z or math.isnan(z):
                mine = requests[requests["replica"] == replicas.index[i]]
                return float(zs[i]), in_system_window_is_short(mine, warmup_s)
    return z, in_system_window_is_short(requests, warmup_s)


def equal_shares(system: SystemConfig) -> bool:
    """Whether a colocated fleet's router sends every replica the same share of the arrivals
    whatever their load (`random`, `round_robin`, or `session` falling back to one): then the
    fleet falls behind where a replica does. Not a lone server, a disaggregated cluster or a
    load-aware router, whose fleet serves its replicas' pooled rate."""
    cluster = system.cluster
    if cluster is None or cluster.prefill is not None or cluster.decode is not None:
        return False
    router = cluster.colocated_router
    kind = router.fallback if isinstance(router, SessionRouterConfig) else router.kind  # type: ignore[attr-defined]
    return kind in ("random", "round_robin")


def full_load_rps(summary: dict[str, float], replicas: pd.DataFrame | None,
                  shares_equal: bool) -> float:
    """The offered rate a run whose waiting queue grew says the system serves at full load
    (`service_rate`), NaN where none grew: its admission rate, pooled over a fleet. Behind a
    router that gives each of N replicas 1/N of the arrivals (`equal_shares`), the fleet
    stops where its slowest group does: N times the admission rate of the replicas of a
    group where any fell behind (averaged over the group, as the same server on the same
    share; groups as replicas.csv gives them). The pooled rate counted the other
    replicas' admissions at their own, lower arrival rates: a fleet of a 10 and a 3.33 req/s
    server behind round robin (its limit 6.67) read 7.0 to 7.6, and the search answered
    7.44 (a tester's finding). A run counts where any replica's queue grew (`saturated`),
    the pooled one's or not: it admitted no more than the fleet serves at that load, an
    upper bound on its capacity whatever the router (counted only where the pooled queue
    grew, a least_kv fleet falling behind near 8.7 req/s answered up to 9.47)."""
    pooled = summary["saturation_admission_rps"] if summary["saturated"] else math.nan
    if not shares_equal or replicas is None or "saturated" not in replicas:
        return pooled
    behind = replicas[replicas["saturated"] == 1]
    if behind.empty:
        return pooled
    # Every replica of a group that fell behind: the same server on the same share. Those
    # flagged alone are the ones whose requests ran slowest: of two A100s behind round robin
    # at 40 req/s (2,000 requests), the flagged one admitted 10.74 req/s, its twin 11.80, and
    # the search refused 32.2 req/s and above (3 x 10.74), where 33.5 keeps up over 12,000.
    fell = replicas[replicas["group"].isin(behind["group"])]
    admitted = fell.groupby("group")["saturation_admission_rps"].mean()
    return len(replicas) * float(admitted.min())


def served_tokens_per_request(reqs: pd.DataFrame, warmup_s: float = 0.0) -> float:
    """Output tokens served per request offered, over the requests a measurement counts
    (from `warmup_s` on, as the throughput it multiplies): a rejected request serves none
    (its tokens counted, long requests being the ones rejected, cost per million tokens
    read 6% low)."""
    reqs = measured_requests(reqs, warmup_s)
    tokens = reqs["output_tokens"].to_numpy(dtype=np.float64)
    if "rejected" in reqs:
        tokens = np.where(reqs["rejected"].to_numpy(dtype=bool), 0.0, tokens)
    return float(tokens.mean())


def search(job: SearchJob) -> SearchOutcome:
    """Bracket then bisect the highest passing rate of one job; errors become a failed outcome."""
    start = time.perf_counter()
    try:
        low, high, rows = _bisect(job)
    except Exception as e:  # noqa: BLE001 - recorded per job, reported at the end
        return SearchOutcome.failed(job, e, time.perf_counter() - start)
    return SearchOutcome(job.id, job.point, job.system, job.replication, job.seed, job.params,
                         True, low, high, rows, wall_s=time.perf_counter() - start)


def _bisect(job: SearchJob) -> tuple[float, float, list[dict[str, float]]]:
    rows: list[dict[str, float]] = []
    limit = math.inf  # the server's throughput, once a saturated run has measured it

    def passes(rate: float) -> bool:
        rows.append(evaluate(job, rate))
        rows[-1]["passes"] = float(bool(rows[-1]["passes"]) and rate < limit)
        return bool(rows[-1]["passes"])

    low, high = _bracket(job.knob.start_rate_per_s, passes)
    measured = stable_limit(rows, job.settings.rel_tol)
    if low == 0.0 and measured == math.inf:
        measured = completed_rps(rows)
    if low == 0.0 and measured < high:
        # Halving from a start far above the server's throughput ran out of steps (from 1e6
        # req/s it stopped at 977): start again below the throughput it measured.
        low, high = _halve(measured, passes)
    for _ in range(MAX_BRACKET_STEPS):
        low, high = _narrow(low, high, passes, job.settings.rel_tol)
        limit = stable_limit(rows, job.settings.rel_tol)
        if low < limit:
            break
        # A rate at or above what the server can serve passed only because its run ended
        # before its queue grew enough to show: search again below the measured throughput.
        for row in rows:
            if row["rate_per_s"] >= limit:
                row["passes"] = 0.0
        low = max((r["rate_per_s"] for r in rows if r["passes"]), default=0.0)
        high = min(high, limit)
        if low == 0.0:  # every rate that passed was at or above the limit: halve down from it
            low, high = _halve(high, passes)
    return low, high, rows


def completed_rps(rows: list[dict[str, float]]) -> float:
    """The highest rate any run completed its requests at (`throughput_rps`), inf if none:
    where to halve down from when no rate passed and no run admitted a request within its
    arrival window (`service_rate` inf). From 1e7 req/s, MD1's server (10 req/s) over
    --requests 100 had 10 ms of arrivals at 9,766 req/s after ten halvings, admitted none
    of them in it, and the search answered 0, 'no rate tried met the SLOs', where 8.8 req/s
    meets e2e_p90 <= 1; every such run completed its requests at 10.0 req/s."""
    done = [r.get("throughput_rps", math.nan) for r in rows]
    return max((d for d in done if math.isfinite(d) and d > 0), default=math.inf)


def stable_limit(rows: list[dict[str, float]], rel_tol: float) -> float:
    """The rate every stable arrival rate stays below: the measured throughput
    (`service_rate`) less the search's tolerance, at most `MAX_THROUGHPUT_MARGIN`. The
    throughput is a count over a finite window: an M/D/1 server of 10 req/s read 10.006 and
    10.017 in runs of 500 requests, and 10.0, its ceiling, passed. A rate within the search's
    tolerance of it is the ceiling at the search's resolution; a coarser tolerance is the
    bisection's, which narrows below this limit to it again: divided by both, a D/D/1 server
    of 10 req/s answered 6.20 at --rel-tol 0.3 (a tester's finding)."""
    return service_rate(rows) / (1 + min(rel_tol, MAX_THROUGHPUT_MARGIN))


def service_rate(rows: list[dict[str, float]]) -> float:
    """The rate at which the server admitted requests in the runs so far whose waiting queue
    grew (`full_load_rps`: a fleet's, where its router splits by share): its throughput at
    full load, which a stable arrival rate must stay below; inf if none. A run saturated
    only in the system (its running set held the backlog) admitted every arrival at once,
    at the offered rate: it measured nothing.

    Pooled over the runs' windows, admissions over time (sum of a / r over sum of 1 / r,
    a run's admission rate a and offered rate r): each run's window, its requests' arrival
    span, is inversely proportional to its rate (the warm-up is scaled alike). A heavily
    overloaded run's window is milliseconds long, one iteration or none: its rate read 6.64
    req/s at 10,000 offered and 13.3 at 625 for a server of 11.3, and a median of such runs
    made the search refuse rates that pass (a tester's finding).

    A run that admitted no request in its window (shorter than one admission: 10 ms at
    9,766 req/s of a 10 req/s server) bounds the rate from above only, and is left out: a
    zero among the runs pulled the pool to 6.9 req/s for that server (its one run that
    admitted any read 13.1) and the search from 1e6 req/s answered 7.04 over --requests 100
    against 9.44 from 5 req/s."""
    saturated = [r for r in rows if r["rate_per_s"] > 0 and math.isfinite(_full_load(r))
                 and _full_load(r) > 0]
    weights = np.array([1.0 / r["rate_per_s"] for r in saturated])
    admitted = np.array([_full_load(r) for r in saturated])
    return float(np.sum(admitted * weights) / np.sum(weights)) if saturated else math.inf


def _full_load(row: dict[str, float]) -> float:
    """A run's `full_load_rps`; of a run recorded without it (a search resumed from an
    older outcome), its admission rate where its waiting queue grew."""
    if "full_load_rps" in row:
        return row["full_load_rps"]
    return row["saturation_admission_rps"] if grew(row.get("saturation_z", math.nan)) else math.nan


def _narrow(low: float, high: float, passes: Callable[[float], bool],
            rel_tol: float) -> tuple[float, float]:
    """Bisect [low passes, high fails] geometrically until high / low <= 1 + rel_tol."""
    while high != math.inf and low > 0 and high / low > 1 + rel_tol:
        middle = math.sqrt(low * high)
        if not low < middle < high:  # neighbouring floats: nothing lies between
            break
        if passes(middle):
            low = middle
        else:
            high = middle
    return low, high


def _bracket(rate: float, passes: Callable[[float], bool]) -> tuple[float, float]:
    """[highest passing, lowest failing] rates around `rate`, by doubling or halving:
    (0, lowest tried) when none passes, (highest tried, inf) when all do.

    Where nothing below a failing start passes, the rates above it are tried too: a server
    that holds a batch for more requests (a request-level batch's `max_queue_delay_s`, as
    Triton's dynamic batcher waits) answers a slow stream late and a fast one in time, so
    its SLO may hold only at higher rates (a tester's search answered 0 from 5 req/s where
    40 to 150 pass)."""
    if passes(rate):
        return _double(rate, passes)
    low, high = _halve(rate, passes)
    if low > 0:
        return low, high
    up = rate
    for _ in range(MAX_BRACKET_STEPS):
        up *= 2
        if passes(up):
            return _double(up, passes)
    return 0.0, high


def _double(passing: float, passes: Callable[[float], bool]) -> tuple[float, float]:
    """[highest passing, lowest failing] above a rate that passes, by doubling; (highest
    tried, inf) when every one does."""
    for _ in range(MAX_BRACKET_STEPS):
        if not passes(passing * 2):
            return passing, passing * 2
        passing *= 2
    return passing, math.inf


def _halve(failing: float, passes: Callable[[float], bool]) -> tuple[float, float]:
    """[highest passing, lowest failing] below a rate that fails, by halving; (0, lowest
    tried) when none passes."""
    for _ in range(MAX_BRACKET_STEPS):
        if passes(failing / 2):
            return failing / 2, failing
        failing /= 2
    return 0.0, failing


# ---- planning and summarising -------------------------------------------------------------

def search_jobs(scenario: Scenario, base_dir: Path, slo: SLOConfig, replications: int,
                settings: SearchSettings, systems: list[str] | None = None,
                points: list[dict[str, Any]] | None = None, seed: int | None = None) -> list[SearchJob]:
    """One job per (point, system, replication). Replication seeds are spawned from `seed`
    (the scenario's by default) and shared by every point and system: common random numbers.
    `points` None: the scenario's own `sweep:`, one point per value (it was dropped without
    a word: one search of the base values; a tester's finding), unless it sweeps the rate the
    search sets, which the search replaces."""
    base, given = sweep_base_data(scenario)  # each point derives its own KV capacity
    base["slo"] = slo.model_dump(mode="json")
    names = [s.name for s in scenario.systems]
    chosen = list(dict.fromkeys(systems or names))  # a system named twice is one search
    unknown = [n for n in chosen if n not in names]
    if unknown:
        raise ScenarioError(f"--system = {unknown[0]!r}: expected one of {', '.join(names)}")
    knob = rate_knob(scenario, base_dir, settings.num_requests)
    drawn = {knob.path} | ({"workload.num_requests", "workload.arrival.max_requests"}
                           if settings.num_requests is not None else set())
    if points is None:
        points = _own_points(scenario, drawn)
    swept = next((path for params in points or [] for path in params if path in drawn), None)
    if swept is not None:  # every point would be the same search
        raise ScenarioError(f"grid.parameters.{swept}: the search sets it at every run "
                            f"({'the rate it searches' if swept == knob.path else '--requests'}); "
                            "expected a grid over other keys")
    _check_search_count(replications, len(points or [{}]) * len(chosen))
    what = scenario.workload.draws_nothing()
    if replications > 1 and what is not None:
        warnings.warn(f"{what}: every replication replays the same "
                      f"requests, so the {replications} replications differ only where a system "
                      "draws at random (a random or power_of_two router); an interval of zero "
                      "width is one sample of the trace, not a certain answer", stacklevel=2)
    seeds = replication_seeds(scenario.seed if seed is None else seed, replications)
    jobs = [SearchJob(p, name, r, s, params, base, str(base_dir),
                      _point_knob(knob, base, params, base_dir, settings.num_requests, given),
                      settings, given)
            for p, params in enumerate(points or [{}])
            for name in chosen for r, s in enumerate(seeds)]
    for job in jobs:  # every point, system and replication is checked before any runs
        if job.replication == 0 or job.system == chosen[0]:
            with _naming_point(job):
                _check_job(job, names.index(job.system), first_system=job.system == chosen[0])
    return jobs


def _check_search_count(replications: int, points_x_systems: int) -> None:
    """A sweep's bounds: every search gets a seed and a job, checked before any runs, so
    --replications 1e9 built them until memory ran out."""
    if replications > MAX_REPLICATIONS:
        raise ScenarioError(f"--replications = {replications}: expected at most "
                            f"{MAX_REPLICATIONS:,} independent searches per system")
    if points_x_systems * replications > MAX_TASKS:
        raise ScenarioError(f"--replications = {replications} over {points_x_systems} points x "
                            f"systems: {points_x_systems * replications:.3g} searches, beyond the "
                            f"{MAX_TASKS:,} a capacity run may plan (each is built and checked "
                            "before any runs); expected fewer points, systems or replications")


@contextlib.contextmanager
def _naming_point(job: SearchJob) -> Iterator[None]:
    """A configuration point's refusal names the point, as `orcasim sweep` and `validate` do:
    `workload.max_tokens = 1 is below ...` alone named a value the scenario file does not hold."""
    try:
        yield
    except ScenarioError as e:
        if not job.params:
            raise
        raise ScenarioError(f"{point_name(job.id, job.params)}: {e}") from None


def _own_points(scenario: Scenario, drawn: set[str]) -> list[dict[str, Any]] | None:
    """The scenario's own `sweep:` as points, one per value; None (the base alone) without
    one, or where it sweeps what the search sets, which the search replaces (said)."""
    own = scenario.sweep
    if own is None:
        return None
    if own.parameter in drawn:
        warnings.warn(f"sweep.parameter = {own.parameter!r}: the search sets it, so its "
                      "values are not run", UserWarning, stacklevel=3)
        return None
    return [{own.parameter: value} for value in own.values]


def _check_job(job: SearchJob, index: int, first_system: bool) -> None:
    """What `orcasim validate` checks, for one search: its system's cost files and fleet
    (once a point), and each replication's requests (drawn from its own seed: a warm-up may
    leave one too few where another has enough). Else the search fails alike at every run."""
    from orcasim.run import check_system, check_warmup, data_dir, make_requests

    first = point_scenario(job, job.knob.start_rate_per_s)
    with data_dir(Path(job.base_dir)), _counted_by_the_search(job.settings.num_requests):
        requests = make_requests(first)  # lengths against max_tokens, trace files
        if job.replication == 0:
            with errors_under(f"systems[{index}].", opening=("scheduler.", "cluster.")):
                check_system(first, first.systems[0], requests)
    if first_system:
        with _drawn_by_the_search(job.settings.num_requests):
            check_warmup(first, requests)
            _check_measured(first, requests)


def _point_knob(knob: RateKnob, base: dict[str, Any], params: dict[str, Any],
                base_dir: Path, num_requests: int | None, given: dict[str, Any]) -> RateKnob:
    """A point's own knob: a trace's rate is the point's trace's (a grid over the trace's
    path, its max_requests or the count shared the first point's: every other point's rates
    were off by the ratio of the traces' rates; a tester's finding)."""
    if knob.path != TRACE_KNOB or not params:
        return knob
    data = copy.deepcopy(base)
    apply_params(data, params, given)
    return rate_knob(scenario_from_dict(data, "a point of the search"), base_dir, num_requests)


def _check_measured(scenario: Scenario, requests: Any) -> None:
    """Each run must measure enough requests for the saturation test to judge it (fewer pass
    at any rate: 25 requests gave 5 times an M/D/1 server's capacity). The warm-up, scaled
    with the rate, drops the same requests at every rate. A closed loop's or sessions'
    arrivals are made by the run: not known here."""
    if requests.clients is not None or requests.sessions is not None:
        return
    measured = int(np.count_nonzero(counted(requests.arrival_s, scenario.warmup_s)))
    if measured < MIN_SEARCH_REQUESTS:
        raise ScenarioError(f"each run of the search measures {measured} requests (after "
                            f"warmup_s); expected at least {MIN_SEARCH_REQUESTS}, enough for the "
                            "saturation test to judge a run (fewer pass at any rate): more "
                            "requests, or a shorter warm-up")


@contextlib.contextmanager
def _counted_by_the_search(num_requests: int | None) -> Iterator[None]:
    """A short trace's warning names the count the search set (--requests), not the key it
    set it by: 'workload.arrival.max_requests = 2000, but t.csv holds 300 requests' named a
    key the user never wrote (a tester's finding)."""
    if num_requests is None:
        yield
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    key = f"workload.arrival.max_requests = {num_requests}, "
    for w in caught:
        text = str(w.message)
        text = f"--requests {num_requests}, " + text.removeprefix(key) if text.startswith(key) \
            else text
        warnings.warn_explicit(text, w.category, w.filename, w.lineno)


@contextlib.contextmanager
def _drawn_by_the_search(num_requests: int | None) -> Iterator[None]:
    """Says, in an error about the requests, that the search draws its own number of them."""
    try:
        yield
    except ScenarioError as e:
        if num_requests is None:
            raise
        raise ScenarioError(f"{e} (in the {num_requests} requests of each run of the search: "
                            "--requests)") from None


# Student's t 97.5% quantiles for 1 to 30 degrees of freedom (a two-sided 95% interval),
# to 9 digits; beyond 30 the Cornish-Fisher expansion below is within 1e-5. Kept here so that
# capacity needs no scipy (tests check the table against scipy.stats where it is installed).
T_975 = (12.7062047, 4.30265273, 3.18244631, 2.77644511, 2.57058184, 2.44691185, 2.36462425,
         2.30600414, 2.26215716, 2.22813885, 2.20098516, 2.17881283, 2.16036866, 2.14478669,
         2.13144955, 2.11990530, 2.10981558, 2.10092204, 2.09302405, 2.08596345, 2.07961384,
         2.07387307, 2.06865761, 2.06389856, 2.05953855, 2.05552944, 2.05183052, 2.04840714,
         2.04522964, 2.04227246)
Z_975 = 1.959963985


def t_quantile_975(df: int) -> float:
    """Student's t 0.975 quantile with `df` degrees of freedom."""
    if df <= len(T_975):
        return T_975[df - 1]
    z = Z_975
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def t_interval(values: np.ndarray) -> tuple[float, float]:
    """Student's t 95% interval for the mean of `values` (NaN with fewer than two)."""
    if len(values) < 2:
        return float("nan"), float("nan")
    half = t_quantile_975(len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return float(values.mean() - half), float(values.mean() + half)


def rate_interval(rates: np.ndarray, ceiling: float = math.inf,
                  fails: np.ndarray | None = None) -> tuple[float, float]:
    """`t_interval` of the replications' rates, stopped at 0 (a rate is never negative) and
    at `ceiling`, the rate the search let no stable rate reach (an M/D/1 server of 10 req/s
    had an interval up to 10.5). With `fails`, each search's lowest failing rate, the upper
    end is theirs: a replication's threshold lies between its two rates, and replications
    that bisected onto the same grid point gave an interval of zero width."""
    low, high = t_interval(rates)
    if fails is not None and len(fails) > 1:
        high = math.inf if not np.isfinite(fails).all() else max(high, t_interval(fails)[1])
    return (low if math.isnan(low) else max(low, 0.0)), min(high, ceiling)


def measured_limit(group: Sequence[SearchOutcome], rel_tol: float) -> float:
    """The median over the replications of each search's `stable_limit`; inf where none
    saturated."""
    measured = [r for r in (stable_limit(o.evaluations, rel_tol) for o in group) if r != math.inf]
    return float(np.median(measured)) if measured else math.inf


def gpus_and_price(scenario: Scenario, system_name: str,
                   price_per_gpu_hour: float | None) -> tuple[int, float]:
    """GPUs the system occupies and its price per hour (NaN if a GPU has no catalog price
    and none was given); a replica without hardware counts as one GPU."""
    from orcasim.fleet import system_hardware

    system = next(s for s in scenario.systems if s.name == system_name)
    gpus, per_hour = 0, 0.0
    for hardware in system_hardware(scenario, system):
        n = hardware.num_gpus if hardware is not None else 1
        price = price_per_gpu_hour
        if price is None and hardware is not None:
            price = hardware.gpu.price_per_hour_usd
        gpus += n
        per_hour += n * (price if price is not None else float("nan"))
    return gpus, per_hour


def capacity_table(outcomes: list[SearchOutcome], jobs: list[SearchJob],
                   price_per_gpu_hour: float | None = None,
                   target_rate_per_s: float | None = None) -> pd.DataFrame:
    """One row per (point, system): the mean highest rate, its t interval, goodput per GPU,
    cost per million output tokens, and the replicas a target rate would need."""
    by_key = {(j.point, j.system): j for j in jobs}
    rows = []
    done = [o for o in outcomes if o.ok]
    order = {key: i for i, key in enumerate(by_key)}  # points, then the scenario's system order
    for (point, system), group in sorted(_groups(done), key=lambda g: order[g[0]]):
        job = by_key[(point, system)]
        rates = np.array([o.max_rate_per_s for o in group])
        fails = np.array([o.fail_rate_per_s for o in group])
        # Never below an answer a replication gave: one that never saturated has no limit
        # of its own, and the others' median excluded the mean (a tester's finding).
        ceiling = max(measured_limit(group, job.settings.rel_tol), float(rates.max()))
        low, high = rate_interval(rates, ceiling, fails)
        scenario = point_scenario(job, job.knob.start_rate_per_s)
        gpus, per_hour = gpus_and_price(scenario, system, price_per_gpu_hour)
        rate = float(rates.mean())
        tokens = _mean_output_tokens(group)
        # A number only where it is defined: with no rate within the SLOs no tokens are
        # served and no number of copies meets a target (NaN, an empty cell, not inf); an
        # unknown price leaves every cost NaN.
        row = {"point": point, **job.params, "system": system, "max_rate_per_s": rate,
               "ci_low": low, "ci_high": high, "gpus": gpus,
               "goodput_per_gpu": rate / gpus,
               "cost_per_hour_usd": per_hour,
               "cost_per_million_tokens": per_hour / (rate * tokens * 3600) * 1e6 if rate > 0
               else math.nan,
               "replications": len(group),
               "capped": float(any(o.fail_rate_per_s == math.inf for o in group)),
               "evaluations": sum(len(o.evaluations) for o in group)}
        row.update(_at_capacity(group))
        if target_rate_per_s is not None:
            copies = math.ceil(target_rate_per_s / rate) if rate > 0 else math.nan
            row["copies_for_target"] = copies
            row["cost_per_hour_for_target_usd"] = copies * per_hour
        rows.append(row)
    return pd.DataFrame(rows, columns=None if rows else CAPACITY_COLUMNS)


def _groups(outcomes: list[SearchOutcome]) -> list[tuple[tuple[int, str], list[SearchOutcome]]]:
    groups: dict[tuple[int, str], list[SearchOutcome]] = {}
    for o in sorted(outcomes, key=lambda o: (o.point, o.system, o.replication)):
        groups.setdefault((o.point, o.system), []).append(o)
    return list(groups.items())


def _capacity_run(outcome: SearchOutcome) -> dict[str, float] | None:
    """The run of a replication's answer: its highest passing rate (None where none passed)."""
    return next((e for e in outcome.evaluations
                 if e["passes"] and e["rate_per_s"] == outcome.max_rate_per_s), None)


def _mean_output_tokens(group: list[SearchOutcome]) -> float:
    """Output tokens served per request offered at each replication's capacity, averaged: where
    rejections depend on the load (a fleet whose load-aware router sends long requests to a
    replica too small for them), the scenario's own rate served other tokens (51.7 a request
    against 60.2 at capacity, and the cost per million tokens read 16% high; a tester's finding)."""
    rows = [row for row in map(_capacity_run, group) if row is not None]
    return float(np.mean([r["output_tokens_mean"] for r in rows])) if rows else math.nan


def _at_capacity(group: list[SearchOutcome]) -> dict[str, float]:
    """Each SLO metric at each replication's highest passing rate, averaged (latency at capacity)."""
    rows = [row for row in map(_capacity_run, group) if row is not None]
    if not rows:
        return {}
    keys = [k for k in rows[0] if k.startswith("slo_") and k != "slo_met"]
    return {f"{k}_at_capacity": float(np.mean([r[k] for r in rows])) for k in keys}


def cheapest(table: pd.DataFrame) -> pd.Series | None:
    """The configuration that meets the SLOs at the lowest cost: the lowest cost per hour of
    serving the target rate when one was given (ties, which whole copies make common, to the
    lowest cost per million output tokens), else the lowest cost per million output tokens;
    None when no configuration has a finite cost with a positive capacity."""
    if table.empty:  # every search failed
        return None
    columns = ["cost_per_million_tokens"]
    if "cost_per_hour_for_target_usd" in table:
        columns.insert(0, "cost_per_hour_for_target_usd")
    usable = table[(table["max_rate_per_s"] > 0) & np.isfinite(table[columns[0]])]
    return None if usable.empty else usable.sort_values(columns, kind="stable").iloc[0]


def evaluations_table(outcomes: list[SearchOutcome]) -> pd.DataFrame:
    """Every rate tried: one row per (point, system, replication, rate), in search order."""
    rows = [{"point": o.point, **o.params, "system": o.system, "replication": o.replication,
             "step": i, **e}
            for o in sorted(outcomes, key=lambda o: (o.point, o.system, o.replication))
            for i, e in enumerate(o.evaluations)]
    if rows:
        return pd.DataFrame(rows)
    # Every search failed: the header alone, which `orcasim plot` reads as nothing to draw
    # (a frame without columns was written as an empty line, and plot failed on it).
    params = list(dict.fromkeys(k for o in outcomes for k in o.params))
    return pd.DataFrame(columns=["point", *params, "system", "replication", "step", "rate_per_s",
                                 "passes"])


def pareto_front(table: pd.DataFrame, cost: str, latency: str) -> pd.DataFrame:
    """The rows no other row beats on both `cost` and `latency` (lower is better), by cost."""
    finite = table[np.isfinite(table[cost]) & np.isfinite(table[latency])]
    ordered = finite.sort_values([cost, latency])
    keep, best = [], math.inf
    for index, value in zip(ordered.index, ordered[latency], strict=True):
        if value < best:
            keep.append(index)
            best = value
    return ordered.loc[keep]


# ---- running into a folder ----------------------------------------------------------------

@dataclass
class CapacityResult:
    table: pd.DataFrame  # capacity.csv
    evaluations: pd.DataFrame  # evaluations.csv
    failed: list[SearchOutcome]
    ran: int
    skipped: int
    traced: bool = False  # a trace's arrivals, sped up: not of one constant rate


def run_capacity(jobs: list[SearchJob], out_dir: Path | None = None, backend: str = "local",
                 workers: int | None = None, address: str | None = None, resume: bool = False,
                 force: bool = False, price_per_gpu_hour: float | None = None,
                 target_rate_per_s: float | None = None,
                 inputs: Sequence[Path] = (), data: Sequence[Path] = ()) -> CapacityResult:
    """Run every job (those already finished in `out_dir` are kept with `resume`), writing
    each outcome as it arrives; `out_dir=None` runs in memory. `inputs` are the files the
    run reads, which `--force` must not delete; `data`, those of them the runs read data
    from, whose contents the plan records (a change is not resumed)."""
    from orcasim.sweeps.backends import check_backend, execute_jobs, joined
    from orcasim.sweeps.runner import prepare_resumable, write_outcome

    check_backend(backend, workers, address)
    todo = jobs
    fresh = {}
    with joined(backend, workers, address):  # type: ignore[arg-type]  # checked just now
        if out_dir is not None:
            prepare_resumable(out_dir, _plan(jobs, input_digests(data)), {}, resume, force,
                              inputs)
            todo = [j for j in jobs if _read(out_dir, j) is None]
        for outcome in execute_jobs(todo, search, SearchOutcome.failed, backend, workers, address):  # type: ignore[arg-type]
            fresh[outcome.id] = outcome
            if out_dir is not None:
                write_outcome(out_dir, outcome.id, outcome.to_json())
    outcomes = [fresh.get(j.id) or (_read(out_dir, j) if out_dir else None)
                or SearchOutcome.failed(j, "did not run") for j in jobs]
    table = capacity_table(outcomes, jobs, price_per_gpu_hour, target_rate_per_s)
    return CapacityResult(table, evaluations_table([o for o in outcomes if o.ok]),
                          [o for o in outcomes if not o.ok], len(todo), len(jobs) - len(todo),
                          any(j.knob.path == TRACE_KNOB for j in jobs))


def _save_png(fig: Figure, path: Path) -> None:
    # The temporary file has no .png suffix to infer the format from.
    fig.savefig(path, format="png", dpi=110, bbox_inches="tight")


def _plan(jobs: list[SearchJob], digests: dict[str, str]) -> str:
    """The jobs, and the data files' digests where they read any (`paths.input_digests`)."""
    listed = [asdict(j) for j in jobs]
    return json.dumps({"jobs": listed, "inputs": digests} if digests else listed, indent=1,
                      default=str) + "\n"


def _read(out_dir: Path, job: SearchJob) -> SearchOutcome | None:
    """A finished job's outcome from `out_dir`, or None (absent or failed: run it again)."""
    from orcasim.sweeps.runner import OUTCOME_FILE

    path = out_dir / "points" / job.id / OUTCOME_FILE
    if not path.exists():
        return None
    outcome = SearchOutcome.read(path)
    return outcome if outcome.ok else None


def latency_at_capacity(slo: SLOConfig) -> str:
    """The Pareto front's latency column: the first target's percentile at capacity."""
    return f"slo_{slo.targets[0].name}_at_capacity"


def search_front(table: pd.DataFrame, slo: SLOConfig) -> pd.DataFrame | None:
    """A configuration search's Pareto front of cost against latency at capacity (pareto.csv),
    or None: one point only, or no point with both (`no_front_reason` says why)."""
    latency = latency_at_capacity(slo)
    if table["point"].nunique() < 2 or latency not in table:
        return None
    front = pareto_front(table, "cost_per_million_tokens", latency)
    return None if front.empty else front


def no_front_reason(table: pd.DataFrame, slo: SLOConfig) -> str | None:
    """Why a configuration search of several points has no Pareto front; None if it has one
    or is a single point."""
    if table["point"].nunique() < 2 or search_front(table, slo) is not None:
        return None
    met = table[table["max_rate_per_s"] > 0]
    if met.empty:
        why = "no configuration met the SLOs at any rate tried"
    elif not np.isfinite(met["cost_per_million_tokens"]).any():
        why = "no configuration has a price per GPU-hour (pass --price-per-gpu-hour)"
    else:
        why = "no configuration has both a cost and a latency at capacity"
    return f"{why}, so there is no Pareto front (no pareto.csv or pareto.png)"


def capacity_warnings(result: CapacityResult, slo: SLOConfig,
                      target_rate_per_s: float | None = None) -> list[str]:
    """One line per (point, system) no rate tried passed at (its max_rate_per_s is 0, which
    alone reads like an answer) or every rate did (a lower bound, which alone reads as
    certain) or a rate failed only on a run too short to tell (`_short_run_warnings`) or, of
    a trace, on the requests in the system alone (`_trace_ramp_warnings`), and one if a
    configuration search has no Pareto front."""
    table, tried = result.table, result.evaluations
    params = point_parameters(table) if len(table) else []
    lines = []
    for _, row in table[table["max_rate_per_s"] == 0].iterrows():
        mine = tried[(tried["point"] == row["point"]) & (tried["system"] == row["system"])]
        target = (f"; no number of copies serves --target-rate {target_rate_per_s:g}"
                  if target_rate_per_s is not None else "")
        lines.append(f"{_which(row, params)}: no rate tried met the SLOs "
                     f"(the lowest, {mine['rate_per_s'].min():.3g} req/s, failed too), so "
                     f"max_rate_per_s is 0{target}")
    lines += _partial_warnings(table[table["max_rate_per_s"] > 0], tried, params)
    lines += _rising_warnings(table, tried, params)
    lines += _short_run_warnings(table, tried, params)
    if result.traced:
        lines += _trace_ramp_warnings(table, tried, params)
    for _, row in table[table.get("capped", pd.Series(0.0, index=table.index)) == 1].iterrows():
        target = (f"; copies_for_target is at most {row['copies_for_target']:g}"
                  if target_rate_per_s is not None else "")
        lines.append(f"{_which(row, params)}: every rate tried met the SLOs, up to "
                     f"{row['max_rate_per_s']:.4g} req/s after {MAX_BRACKET_STEPS} doublings, so "
                     f"max_rate_per_s is a lower bound, not the capacity{target}")
    reason = no_front_reason(table, slo)
    return lines if reason is None else [*lines, reason]


def _which(row: pd.Series, params: list[str]) -> str:
    """A capacity row's system, and its configuration where a search has several."""
    at = ", ".join(f"{k}={row[k]}" for k in params)
    return f"{row['system']} at {at}" if at else str(row["system"])


def _partial_warnings(table: pd.DataFrame, tried: pd.DataFrame, params: list[str]) -> list[str]:
    """A (point, system) some of whose replications found no rate within the SLOs: its mean
    averages zeros with the others' answers (and its interval is wide)."""
    if tried.empty:
        return []
    found = tried.groupby(["point", "system", "replication"])["passes"].max()
    lines = []
    for _, row in table.iterrows():
        mine = found.loc[(row["point"], row["system"])]
        if (mine == 0).any():
            lines.append(f"{_which(row, params)}: {int((mine == 0).sum())} of "
                         f"{len(mine)} replications found no rate within the SLOs; "
                         f"max_rate_per_s {row['max_rate_per_s']:.3g} averages them in")
    return lines


def _rising_warnings(table: pd.DataFrame, tried: pd.DataFrame, params: list[str]) -> list[str]:
    """A (point, system) where a rate failed at under half of a rate that passed, in one
    replication: its attainment does not fall with the load, which the bisection assumes."""
    if tried.empty:
        return []
    lines = []
    for _, row in table.iterrows():
        mine = tried[(tried["point"] == row["point"]) & (tried["system"] == row["system"])]
        for _, runs in mine.groupby("replication"):
            passed = runs.loc[runs["passes"] == 1, "rate_per_s"]
            failed = runs.loc[(runs["passes"] == 0) & (runs["rate_per_s"] < passed.max() / 2),
                              "rate_per_s"] if len(passed) else passed
            if len(failed):
                lines.append(f"{_which(row, params)}: {failed.max():.3g} req/s failed the SLOs "
                             f"and {passed.max():.3g} req/s met them: attainment rises with the "
                             "load here (a batch held for more requests?), so max_rate_per_s "
                             "is the highest rate found, and lower rates may fail")
                break
    return lines


def _failed_in_system_alone(tried: pd.DataFrame, short: bool) -> pd.DataFrame:
    """The runs that met the SLOs with a flat waiting queue and failed on the requests in the
    system alone, in runs shorter than twice their p90 latency (`short`) or not."""
    return tried[(tried["passes"] == 0) & (tried["slo_met"] == 1)
                 & (tried["in_system_short"] == float(short))
                 & ~tried["saturation_z"].map(grew) & tried["in_system_z"].map(grew)]


def _in_system_warnings(table: pd.DataFrame, tried: pd.DataFrame, params: list[str],
                        short: bool, why: str) -> list[str]:
    """A line per (point, system) with a run `_failed_in_system_alone` picks: its lowest rate, `why`."""
    if tried.empty or "in_system_short" not in tried:
        return []
    failed = _failed_in_system_alone(tried, short)
    lines = []
    for _, row in table.iterrows():
        mine = failed[(failed["point"] == row["point"]) & (failed["system"] == row["system"])]
        if len(mine):
            lines.append(f"{_which(row, params)}: {mine['rate_per_s'].min():.4g} req/s met the "
                         f"SLOs and failed only because the requests in the system grew, {why}")
    return lines


# Fewer requests than this above an SLO's percentile in a run, and its tail is judged on a
# handful: over --requests 300 (3 above a p99), an M/D/1 server of 10 req/s with e2e_p99 <= 2
# (8.856 req/s by Erlang's formula) answered 9.5 on one seed from every start, where runs of
# 300 at 8.856 read a median p99 of 0.98 s; at p90 over 300 (30 above) and p99 over 2,000
# (20 above) every answer's interval held the truth (capadv, 2026-12-06).
TAIL_REQUESTS_MIN = 10


def tail_warnings(slo: SLOConfig, num_requests: int | None) -> list[str]:
    """One line per SLO target whose percentile leaves fewer than `TAIL_REQUESTS_MIN` of a
    run's `num_requests` above it (None: not known, no line): a run that starts empty reads
    its tail better than the steady state, and so do few samples of it."""
    lines: list[str] = []
    if not num_requests:
        return lines
    for t in slo.targets:
        share = (100 - t.percentile) / 100  # from 100 - p: 1 - 0.9 is 0.0999...
        above = num_requests * share
        if share > 0 and above < TAIL_REQUESTS_MIN * (1 - 1e-9):
            needed = math.ceil(TAIL_REQUESTS_MIN / share * (1 - 1e-9))
            lines.append(f"{t.name} is judged on {num_requests:,} requests a run, about "
                         f"{above:.3g} of them above its percentile (fewer after a warm-up): a "
                         "short run that starts empty reads its tail better than the steady "
                         f"state, so max_rate_per_s may be high; --requests {needed:,} or more "
                         f"put {TAIL_REQUESTS_MIN} above it")
    return lines


def _short_run_warnings(table: pd.DataFrame, tried: pd.DataFrame, params: list[str]) -> list[str]:
    """A (point, system) where a rate met the SLOs with a flat waiting queue and failed on the
    requests in the system alone, in runs shorter than twice their p90 latency: a server that
    keeps up is still filling there, so the rate may be one it serves (a stable server of
    about 48 req/s answered 30.2 with 1,000 requests, 47.6 with 2,000)."""
    return _in_system_warnings(table, tried, params, True,
                               "in runs shorter than twice their p90 latency, where a server "
                               "that keeps up is still filling: max_rate_per_s may be low; more "
                               "--requests tell")


def _trace_ramp_warnings(table: pd.DataFrame, tried: pd.DataFrame, params: list[str]) -> list[str]:
    """The same in a long enough run of a trace: a trace's arrival rate may change over its
    span, and at a constant latency the requests in the system follow it (Little's law), which
    the test cannot tell from a server falling behind. A trace rising from 2 to 20 req/s,
    served at a flat e2e p90 of 31 to 33 s within 120 and a flat waiting queue, failed its own
    rate of 11.1 req/s and answered 7.99 without a word (a tester's finding)."""
    return _in_system_warnings(table, tried, params, False,
                               "which a trace whose arrival rate rises over its span does at a "
                               "constant latency (Little's law), as a server falling behind does: "
                               "max_rate_per_s may be low")


def capacity_figures(table: pd.DataFrame, evaluations: pd.DataFrame,
                     slo: SLOConfig) -> dict[str, Figure]:
    """Attainment against rate, and with several configuration points the Pareto front."""
    from orcasim.plots import attainment_vs_rate, cost_latency_pareto

    figures = {}
    if len(evaluations):
        figures["attainment"] = attainment_vs_rate(evaluations, table, slo.attainment)
    front = search_front(table, slo)
    if front is not None:
        figures["pareto"] = cost_latency_pareto(table, front, latency_at_capacity(slo))
    return figures


def slo_text(slo: SLOConfig) -> str:
    """The SLO as the `slo:` block of a scenario (slo.yaml in a capacity folder)."""
    data = {"targets": [f"{t.name} <= {number_text(t.bound_s)}" for t in slo.targets],
            "attainment": slo.attainment}
    return yaml.safe_dump(data, sort_keys=False)


def write_capacity(result: CapacityResult, out_dir: Path, slo: SLOConfig,
                   plots: bool = True) -> list[Path]:
    """capacity.csv, evaluations.csv, slo.yaml, failures.csv (if any), and with several
    configuration points pareto.csv (the front of cost against latency at capacity); the
    figures."""
    from orcasim.results import record_file

    def csv(name: str, frame: pd.DataFrame) -> Path:
        return record_file(out_dir, name, lambda p: frame.to_csv(p, index=False))

    paths = [csv("capacity.csv", result.table), csv("evaluations.csv", result.evaluations),
             record_file(out_dir, "slo.yaml", lambda p: p.write_text(slo_text(slo)))]
    if result.failed:
        paths.append(csv("failures.csv", pd.DataFrame(
            [{"id": o.id, "point": o.point, "system": o.system, "replication": o.replication,
              "error": o.error} for o in result.failed])))
    front = search_front(result.table, slo)
    if front is not None:
        paths.append(csv("pareto.csv", front))
    if plots:
        for stem, fig in capacity_figures(result.table, result.evaluations, slo).items():
            paths.append(record_file(out_dir, f"{stem}.png", functools.partial(_save_png, fig)))
    # A resumed search rewrites the folder: what this answer has no part of goes (an earlier
    # run's failures, or its front at a price this one was not given).
    for stale in ("failures.csv", "pareto.csv", "pareto.png"):
        if out_dir / stale not in paths:
            (out_dir / stale).unlink(missing_ok=True)
    return paths
