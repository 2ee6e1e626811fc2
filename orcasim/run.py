"""The public entry point: run every system of a scenario on the same requests."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import pandas as pd

from orcasim.closed_loop import arrival_source
from orcasim.config import MAX_TIME_S, ScenarioError, errors_under, naming_under, past_the_clock
from orcasim.cost import CostModel, build_cost_model, request_latency_s
from orcasim.cost.catalog import attention_groups
from orcasim.engine import Engine, EngineRun
from orcasim.fleet import ReplicaSpec, build_fleet, describe
from orcasim.metrics import (
    arrivals_window_s,
    batch_size_mean,
    kv_memory_stats,
    kv_reserved_stats,
    measured_window_s,
    requests_frame,
    summarize,
)
from orcasim.paths import SCENARIO_DIR, as_path
from orcasim.pipeline import pipeline_engine
from orcasim.replica import Replica
from orcasim.requests import Requests, WayIn
from orcasim.saturation import grew, in_system_text, saturation_text, session_saturation
from orcasim.scenario import (
    Scenario,
    SystemConfig,
    apply_override,
    load_scenario,
    one_or_more,
    own_sweep_points,
    scenario_from_dict,
)
from orcasim.schedulers import Scheduler, build_scheduler
from orcasim.session_metrics import (
    ended_sessions,
    session_columns,
    sessions_frame,
    sessions_summary,
)
from orcasim.sessions import SessionSource
from orcasim.slo import held_by_share, slo_summary
from orcasim.sources import ArrivalSource
from orcasim.warmup import closed_loop_start_text, measured_iterations, measured_requests
from orcasim.workload import generate_requests


@dataclass
class SystemResult:
    """Everything one system produced: flat frames and its summary.

    A colocated cluster adds a `replica` column to both frames and one summary row per
    replica; a disaggregated one `prefill_replica` and `decode_replica` to its requests.
    """

    name: str
    requests: pd.DataFrame
    iterations: pd.DataFrame
    summary: dict[str, float]
    replicas: pd.DataFrame | None = None
    sessions: pd.DataFrame | None = None  # a session workload: one row per session


@dataclass
class RunResult:
    """What `run_scenario` returns: the scenario it ran and each system's `SystemResult`, by
    the system's name, in the scenario's order. The summaries are computed once, at the run:
    editing a system's frames afterwards does not change them."""

    scenario: Scenario
    systems: dict[str, SystemResult] = field(default_factory=dict)

    def summary_frame(self) -> pd.DataFrame:
        """One row per system, one column per metric."""
        return pd.DataFrame({n: r.summary for n, r in self.systems.items()}).T


@contextlib.contextmanager
def data_dir(base: Path | None) -> Iterator[None]:
    """Resolve relative data paths against `base` (the scenario file's folder) meanwhile."""
    token = SCENARIO_DIR.set(base)
    try:
        yield
    finally:
        SCENARIO_DIR.reset(token)


def make_requests(scenario: Scenario) -> Requests:
    """The scenario's requests. Workload draws use their own stream of the scenario's seed."""
    workload_seed, _ = np.random.SeedSequence(scenario.seed).spawn(2)
    return generate_requests(scenario.workload, np.random.default_rng(workload_seed))


def scheduler_for(scenario: Scenario, system: SystemConfig, requests: Requests) -> Scheduler:
    """`system`'s scheduler over `requests`, with the scenario's KV capacity and deployment."""
    assert scenario.kv_capacity_tokens is not None
    deployment = scenario.deployment()
    kv_bytes = None if deployment is None else deployment.kv_bytes_per_token_per_gpu
    return build_scheduler(system.scheduler, requests, scenario.kv_capacity_tokens, kv_bytes,
                           attention_groups(scenario.hardware))


def at_the_engine(requests: Requests, latency_s: float) -> Requests:
    """`requests` as the engine sees them: `latency_s` after each was sent (see
    `OverheadConfig.request_latency_s`); the same table when there is none. A closed loop's
    (a run's own table, `Requests.for_run`) gets arrival times of its own, which its
    arrival source writes beside the send times in `requests.arrival_s` (`WayIn`)."""
    if latency_s == 0:
        return requests
    if requests.closed_loop:
        return dataclasses.replace(requests, arrival_s=np.full(len(requests), np.nan),
                                   way_in=WayIn(latency_s, requests.arrival_s))
    return dataclasses.replace(requests, arrival_s=requests.arrival_s + latency_s)


def naming_system(scenario: Scenario, system: SystemConfig) -> contextlib.AbstractContextManager[None]:
    """A scheduler's or a cluster's refusal (or warning), built for one system, names that
    system's keys: 'scheduler.block_size_tokens = ...' becomes 'systems[2].scheduler....'."""
    return naming_under(f"systems[{scenario.systems.index(system)}].", opening=("scheduler.", "cluster."))


def check_system(scenario: Scenario, system: SystemConfig, requests: Requests) -> list[list[Scheduler]]:
    """Build what `run_system` would run, without running it: its cost models read their
    files, its fleet checks its pools (`orcasim validate`). Its schedulers, by pool (one
    server's alone; a fleet's replicas; a disaggregated one's prefill, then decode instances),
    each with its own KV capacity, as `check_some_fit` reads them."""
    cost_cfg = scenario.system_cost(system)
    engine_requests = at_the_engine(requests.for_run(), request_latency_s(cost_cfg))
    if system.cluster is not None and system.cluster.disaggregated:
        from orcasim.disagg import build_disaggregated

        fleet = build_disaggregated(scenario, system, engine_requests)
        return [[r.scheduler for r in fleet.prefill], [r.scheduler for r in fleet.decode]]
    if system.cluster is not None:
        return [[r.scheduler for r in build_fleet(scenario, system, engine_requests).replicas]]
    scheduler = scheduler_for(scenario, system, requests)  # its settings refused first
    build_cost_model(cost_cfg, scenario.deployment(), scenario.hardware)
    return [[scheduler]]


def run_system(
    scenario: Scenario, system: SystemConfig, requests: Requests, cost: CostModel | None = None
) -> SystemResult:
    """One system over `requests`; `cost` replaces the model its config builds (the log
    calibration passes one that records what it prices)."""
    result = _served(scenario, system, requests, cost)
    result.summary.update(kv_capacity_summary(scenario, result.replicas))
    return result


def kv_capacity_summary(scenario: Scenario, replicas: pd.DataFrame | None) -> dict[str, float]:
    """The KV tokens a system had, the figure its preemptions and saturation turn on:
    `kv_capacity_total_tokens`, the scenario's kv_capacity_tokens for one server, the sum of
    its replicas' (`replicas`, replicas.csv's rows: both pools' instances of a disaggregated
    one) for a cluster; and `kv_capacity_derived_share`, the share of those tokens derived from
    a model and hardware, as `orcasim model --gpu` derives them (1), not given as
    kv_capacity_tokens (0). Not named kv_capacity_tokens: a sweep of that key has a column of
    its own, which a metric of the same name would overwrite."""
    if replicas is None:
        assert scenario.kv_capacity_tokens is not None
        return {"kv_capacity_total_tokens": float(scenario.kv_capacity_tokens),
                "kv_capacity_derived_share": float(scenario.kv_capacity_derived)}
    tokens = replicas["kv_capacity_tokens"].to_numpy(dtype=np.float64)
    derived = replicas["kv_capacity_derived"].to_numpy(dtype=bool)
    return {"kv_capacity_total_tokens": float(tokens.sum()),
            "kv_capacity_derived_share": float(tokens[derived].sum() / tokens.sum())}


def _served(scenario: Scenario, system: SystemConfig, requests: Requests,
            cost: CostModel | None) -> SystemResult:
    """`run_system`'s run, before the KV capacity is added to its summary."""
    cost_cfg = scenario.system_cost(system)
    requests = requests.for_run()  # a closed loop's arrival times are this system's own
    latency_s = request_latency_s(cost_cfg)
    engine_requests = at_the_engine(requests, latency_s)
    if system.cluster is not None and system.cluster.disaggregated:
        return run_disaggregated(scenario, system, requests, engine_requests)
    if system.cluster is not None:
        return run_cluster(scenario, system, requests, engine_requests)
    cost = cost or build_cost_model(cost_cfg, scenario.deployment(), scenario.hardware)
    # Orca's pipelining (several batches in flight) needs its own loop; see orcasim.pipeline.
    engine = pipeline_engine(scenario, system, engine_requests, cost) or Engine(
        engine_requests, scheduler_for(scenario, system, engine_requests), cost,
        scenario.engine.mode, row_breaks_s=(scenario.warmup_s,),
        arrivals=arrival_source(engine_requests),
    )
    run = engine.run()
    warn_rejected(system.name, run.rejected_ids)
    reqs = requests_frame(requests, run.recorder, run.rejected_ids)
    add_scheduler_columns(reqs, [engine.scheduler])
    iters = run.recorder.iterations_frame()
    summary = measured_summary(scenario, system.name, reqs, iters)
    summary["cost_out_of_range"] = float(cost.out_of_range_count())
    summary["cache_evictions"] = float(engine.scheduler.cache_evictions())
    summary["busy_fraction"] = busy_fraction(reqs, iters, scenario.warmup_s)
    return with_sessions(SystemResult(system.name, reqs, iters, summary), engine.arrivals,
                         scenario.warmup_s)


def with_sessions(result: SystemResult, source: ArrivalSource, warmup_s: float) -> SystemResult:
    """`result` with its per-session rows and summary, where the workload is sessions."""
    if not isinstance(source, SessionSource):
        return result
    reqs = session_columns(result.requests, source)
    sessions = sessions_frame(reqs, source)
    summary = {**result.summary, **sessions_summary(sessions, source, warmup_s)}
    summary.update(session_saturation(sessions["start_s"].to_numpy(), sessions["end_s"].to_numpy(),
                                      warmup_s))
    if not summary["sessions_completed"] and not summary["sessions_failed"]:
        warnings.warn(f"{result.name}: no session that started at or after warmup_s = {warmup_s:g} "
                      "completed: the session metrics (tasks_per_hour, task_time_*) are empty; "
                      "expected a warm-up below the last session's start", stacklevel=2)
    warn_turned_away_sessions(result.name, sessions, warmup_s)
    if summary["session_saturated"] and not summary["saturated"]:
        summary["saturated"] = 1.0
        warnings.warn(
            f"{result.name}: saturated: sessions in progress grew by "
            f"{summary['session_saturation_growth_sessions']:.0f} over the starts from a p90 "
            "task time after the first (or half-way, if sooner) to the last (z = "
            f"{summary['session_saturation_z']:.1f}; its calls' own queue drains between steps); "
            "its task times grow with the run's length (in a run of fewer than two p90 task "
            "times a server that keeps up can read so: more sessions tell)", stacklevel=2)
    return dataclasses.replace(result, requests=reqs, summary=summary, sessions=sessions)


def warn_turned_away_sessions(system_name: str, sessions: pd.DataFrame, warmup_s: float) -> None:
    """Say where sessions measured had calls turned away: they went on without those
    answers, and the task metrics leave them out (`sessions_failed` counts them). Counted as
    completed tasks, the react agents on a 2,000-token pool, 490 of their 534 calls turned
    away, read 1,161 tasks an hour at a task time p50 of 34 s, where an 8,000-token pool
    that served every call read 224 and 222 s (a tester's finding)."""
    measured = ended_sessions(sessions, warmup_s)
    failed = measured[measured["rejected_calls"] > 0]
    if len(failed):
        warnings.warn(
            f"{system_name}: {len(failed)} of the {len(measured)} sessions measured had calls "
            f"turned away ({int(failed['rejected_calls'].sum())} in all) and went on without "
            "their answers; they are sessions_failed, not completed tasks: sessions_completed, "
            "tasks_per_hour and task_time_* leave them out (sessions.parquet's rejected_calls "
            "names them); expected KV memory that holds every call", stacklevel=3)


def check_runs(scenario: Scenario, base_dir: Path | None = None) -> int:
    """What running `scenario` checks before any work, without running it: every point of its
    own `sweep:` block, as `orcasim run` builds and names them ('sweep point p0001-r00
    (warmup_s=100000): ...'), then the scenario itself (`check_run`). `orcasim validate` and
    `run_scenario` share it. The number of requests."""
    with data_dir(base_dir or scenario.source_dir):
        points = own_sweep_points(scenario)
    for name, point in points:
        check_run(point, base_dir, f"sweep {name}: ")
    return check_run(scenario, base_dir)


def check_run(scenario: Scenario, base_dir: Path | None = None, where: str = "") -> int:
    """What a run checks once it has its requests (the warm-up against the last arrival, that
    some request fits each system's KV memory, each system's settings and data files), without
    running it; a refusal starts with `where`. The number of requests."""
    try:
        with data_dir(base_dir or scenario.source_dir):
            requests = make_requests(scenario)
            check_warmup(scenario, requests)
            for system in scenario.systems:  # constructors check settings against the requests
                with naming_system(scenario, system):
                    # and the cost files, a fleet's pools
                    pools = check_system(scenario, system, requests)
                    check_some_fit(system.name, pools, len(requests))
    except ScenarioError as e:
        if not where:
            raise
        raise ScenarioError(f"{where}{e}") from None
    return len(requests)


def check_some_fit(system_name: str, pools: list[list[Scheduler]], num_requests: int) -> None:
    """A system that can run none of the requests is refused before the run. A request can
    run where each pool (`check_system`'s) has an instance whose own KV memory holds it: a
    fleet's group may have a capacity of its own, larger than the scenario's."""
    if num_requests and not any(all(any(not s.never_fits(i) for s in pool) for pool in pools)
                                for i in range(num_requests)):
        raise ScenarioError(f"{system_name}: every request is too large for its KV memory, so "
                            "none would run; expected a larger kv_capacity_tokens or shorter requests")


def check_warmup(scenario: Scenario, requests: Requests) -> None:
    """A warm-up past the last arrival measures nothing: refused before any work where the
    arrivals are known in advance (not a closed loop's or sessions', which a run makes). A
    closed loop measured from its start, whose first sends lift the throughput, is warned of."""
    if requests.clients is not None:
        said = closed_loop_start_text(requests.clients.num_clients, len(requests), scenario.warmup_s)
        if said:
            warnings.warn(said, UserWarning, stacklevel=2)
    if requests.clients is not None or requests.sessions is not None or not len(requests):
        return
    last_s = float(np.max(requests.arrival_s))
    if scenario.warmup_s > last_s:
        warmup, last = apart(scenario.warmup_s, last_s)
        raise ScenarioError(f"warmup_s = {warmup} is past the last arrival ({last} s): "
                            "expected warmup_s below it, or no request is measured")


def apart(a: float, b: float) -> tuple[str, str]:
    """`a` and `b` written in the fewest significant digits, six at least (`:g`'s), that
    tell them apart: a warm-up just past the last arrival read 'warmup_s = 87.8114 is past
    the last arrival (87.8114 s)'."""
    for digits in range(6, 18):
        a_text, b_text = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if a_text != b_text:
            break
    return a_text, b_text


def measured_summary(scenario: Scenario, system_name: str, reqs: pd.DataFrame,
                     iters: pd.DataFrame, admitted_s: np.ndarray | None = None) -> dict[str, float]:
    """`summarize` after the scenario's warm-up, with its SLO attainment when it names SLOs;
    refuses a summary with nothing in it (every metric would be NaN) and warns when the
    queue was unstable (`orcasim.saturation`; `admitted_s` as there)."""
    warmup_s = scenario.warmup_s
    summary = summarize(reqs, iters, warmup_s, admitted_s)
    if summary["requests_completed"] == 0:
        last_s = float(reqs["arrival_s"].max()) if len(reqs) else 0.0
        rejected = int(reqs["rejected"].sum()) if "rejected" in reqs else 0
        window = measured_requests(reqs, warmup_s)  # the requests the summary counts
        turned_away = int(window["rejected"].sum()) if "rejected" in window else 0
        if len(window) and turned_away:  # the warm-up left some: memory turned them away
            after = f" arriving after warmup_s = {warmup_s:g}" if warmup_s > 0 else ""
            raise ScenarioError(
                f"{system_name}: no request{after} completed: {turned_away} of {len(window)} "
                "rejected as too large for KV memory; expected a kv_capacity_tokens (of each "
                "replica or pool a request can reach, or of one data-parallel attention group "
                "of it, where a request's KV lives) that holds a request's tokens")
        raise ScenarioError(
            f"{system_name}: no request completed after warmup_s = {warmup_s:g} (the last "
            f"arrives at {last_s:g} s; {rejected} rejected as too large for KV memory): "
            "expected warmup_s below the last arrival and requests that fit")
    check_times(system_name, reqs)
    check_resolution(system_name, reqs, streams=not answers_whole(scenario, system_name))
    if scenario.slo is not None:
        summary.update(slo_summary(reqs, scenario.slo, warmup_s))
    warn_saturated(system_name, summary)
    return summary


def check_times(system_name: str, reqs: pd.DataFrame) -> None:
    """A ScenarioError if the run's timestamps overflowed or reach past MAX_TIME_S."""
    last_s = float(np.nanmax(reqs[["arrival_s", "finish_s"]].to_numpy(dtype=np.float64)))
    if not np.isfinite(last_s) or last_s > MAX_TIME_S:
        raise ScenarioError(f"{system_name}: {past_the_clock(last_s)}")


# A latency the clock measures, and its time per token, must span this many of the clock's
# steps (np.spacing of the time it ends at): each iteration adds a rounding of up to half a
# spacing, so one is then right to about 0.05% of itself. Late in a long run a float keeps
# 1.5e-8 s (1e8 s), and a step that short (1e-9 s, a linear cost's floor) left the clock
# where it was: a request of 50 one-nanosecond steps at 1e8 s read a TTFT, TPOT and E2E of 0.
CLOCK_SPACINGS_MIN = 1000


def answers_whole(scenario: Scenario, system_name: str) -> bool:
    """Whether any replica of the system batches whole requests (`request_level`), which
    sends every token at the batch's end: a TPOT of 0 by design."""
    system = next(s for s in scenario.systems if s.name == system_name)
    groups = [] if system.cluster is None else [g for _, g in system.cluster.given_groups()]
    kinds = [system.scheduler.kind] + [g.scheduler.kind for g in groups if g.scheduler is not None]
    return "request_level" in kinds


def check_resolution(system_name: str, reqs: pd.DataFrame, streams: bool = True) -> None:
    """A ScenarioError if a served request's TTFT, E2E, TPOT or E2E per output token spans
    fewer than CLOCK_SPACINGS_MIN of the clock's steps at its finish: too short for the
    clock to time there. A TPOT of 0 passes where the system does not `stream`
    (request-level batching sends every token at once). Read from the requests alone, the
    same in fast and reference mode."""
    served = reqs[reqs["finish_s"].notna() & ~reqs["rejected"].to_numpy(dtype=bool)]
    spacing_s = np.spacing(served["finish_s"].to_numpy(dtype=np.float64))
    # E2E per output token too: each token takes a step at least, and every step adds its
    # rounding, so an E2E of many steps too short for the clock may still span enough.
    for metric in ("ttft_s", "e2e_s", "tpot_s", "normalized_latency_s_per_token"):
        values = served[metric].to_numpy(dtype=np.float64)
        coarse = values < CLOCK_SPACINGS_MIN * spacing_s  # NaN (one token) compares False
        if metric == "tpot_s" and not streams:
            coarse &= values > 0
        if coarse.any():
            i = int(np.argmax(coarse))
            raise ScenarioError(
                f"{system_name}: request {int(served['id'].iloc[i])}'s {metric} = "
                f"{values[i]:.3g} s{' a token' if metric.endswith('_per_token') else ''} ends at t = {served['finish_s'].iloc[i]:.3g} s, where float "
                f"timestamps keep only {spacing_s[i]:.2g} s of precision: too short to time "
                f"there; expected latencies of at least {CLOCK_SPACINGS_MIN} times that "
                "(iterations that take longer, or a run that ends earlier: are costs in "
                "seconds?)")


def warn_saturated(system_name: str, summary: dict[str, float]) -> None:
    """A warning naming the saturation test that fired (`orcasim.saturation`), if one did:
    the waiting queue's (the `saturated` flag), or the requests in the system's alone, which
    says what else grows that count."""
    text, in_system = saturation_text(summary), in_system_text(summary)
    if text is not None:
        also = f"; and {in_system}" if in_system is not None else ""
        warnings.warn(f"{system_name}: saturated: {text}{also}; its latencies grow with the "
                      "run's length", stacklevel=3)
    elif in_system is not None:
        warnings.warn(f"{system_name}: {in_system}, with no waiting queue: a server whose running "
                      "set holds the backlog does this as it falls behind, but so do a rising "
                      "arrival rate, a long tail of latencies and a short run's start-up; not "
                      "flagged saturated (a run twice as long tells: its latencies grow if it "
                      "falls behind; orcasim capacity fails the rate)", stacklevel=3)


def warn_rejected(system_name: str, rejected: np.ndarray,
                  replicas: Sequence[Replica] = (), num_prefill: int | None = None) -> None:
    """Requests turned away as too large, said once per system; on a fleet, by the replicas
    that turned them away (the router chose them: another replica may have held them). A
    disaggregated fleet (`num_prefill` instances first) names each pool's instance as its
    `prefill_replica` and `decode_replica` columns and replicas.csv number it: decode instance
    0 was called 'replica 1' behind one prefill instance (a tester's note)."""
    if not len(rejected):
        return
    where = "KV memory"
    counts = {r.index: len(r.scheduler.rejected_ids) for r in replicas if r.scheduler.rejected_ids}

    def name(i: int) -> str:
        if num_prefill is None:
            return f"replica {i}"
        return f"prefill instance {i}" if i < num_prefill else f"decode instance {i - num_prefill}"

    if len(replicas) > 1:
        what = "replica" if num_prefill is None else "instance"
        where = (f"the KV memory of the {what} the router sent them to ("
                 + ", ".join(f"{name(i)}: {n}" for i, n in counts.items()) + ")")
    warnings.warn(f"{system_name}: {len(rejected)} request(s) can never fit in {where} "
                  f"and were rejected (first: request {int(rejected[0])})", stacklevel=3)


def fleet_requests(system_name: str, requests: Requests, run: EngineRun,
                   replicas: list[Replica], num_prefill: int | None = None) -> pd.DataFrame:
    """The per-request frame of a fleet's run, with each request's evictions (wherever);
    `num_prefill`: a disaggregated fleet's prefill instances, which come first."""
    warn_rejected(system_name, run.rejected_ids, replicas, num_prefill)
    reqs = requests_frame(requests, run.recorder, run.rejected_ids)
    add_scheduler_columns(reqs, [r.scheduler for r in replicas])
    return reqs


def add_scheduler_columns(reqs: pd.DataFrame, schedulers: list[Scheduler]) -> None:
    """Per-request counts the schedulers keep (wherever the request ran): evictions, and
    the prefix cache's hit at first admission and prefill tokens saved over all admissions."""
    for column, name in (("preemptions", "preemptions_per_request"),
                         ("cached_tokens", "cached_tokens"),
                         ("prefill_saved_tokens", "prefill_saved_tokens")):
        # Once each: a pool's replicas of one kind hold one array
        # (`Scheduler.share_per_request_state`).
        arrays = {id(a): a for a in (getattr(s, name) for s in schedulers)}
        reqs[column] = sum(arrays.values())


def run_cluster(
    scenario: Scenario, system: SystemConfig, requests: Requests, engine_requests: Requests
) -> SystemResult:
    """`system`'s cluster over `requests` (as sent) and `engine_requests` (as they reach it)."""
    assert system.cluster is not None
    fleet = build_fleet(scenario, system, engine_requests)
    reqs = fleet_requests(system.name, requests, fleet.run(), fleet.replicas)
    reqs["replica"] = fleet.assigned
    iters = fleet.iterations_frame()
    summary = measured_summary(scenario, system.name, reqs, iters)
    summary["replicas"] = float(len(fleet.replicas))
    summary["cost_out_of_range"] = float(sum(c.out_of_range_count() for c in fleet.costs))
    summary["cache_evictions"] = float(sum(r.scheduler.cache_evictions() for r in fleet.replicas))
    per_replica = replica_summaries(reqs, iters, scenario.warmup_s, len(fleet.replicas))
    # Each replica's own prefix cache: the summary's evictions, replica by replica.
    per_replica["cache_evictions"] = [float(r.scheduler.cache_evictions()) for r in fleet.replicas]
    per_replica = described(per_replica, fleet.specs, group=fleet.groups)
    summary["busy_fraction"] = float(per_replica["busy_fraction"].mean())
    flag_saturated_replicas(system.name, summary, per_replica)
    return with_sessions(SystemResult(system.name, reqs, iters, summary, per_replica),
                         fleet.source, scenario.warmup_s)


def described(per_replica: pd.DataFrame, specs: list[ReplicaSpec],
              group: list[int] | None = None) -> pd.DataFrame:
    """`per_replica` (rows in the fleet's order) with what each replica runs in front
    (`orcasim.fleet.describe`), after a colocated fleet's `group`."""
    about = describe(specs).set_index(per_replica.index)
    if group is not None:
        about.insert(0, "group", group)
    return pd.concat([about, per_replica], axis=1)


def flag_saturated_replicas(system_name: str, summary: dict[str, float],
                            per_replica: pd.DataFrame) -> None:
    """A fleet is saturated where any of its replicas is: the pooled queue's growth is read
    in units of the whole fleet's arrivals, so one replica falling behind is diluted by the
    others (one slow replica of 8 behind round robin, its queue 87 requests up, z 5.2, read
    z 1.9 on the fleet, `saturated` 0 and no warning; a tester's finding). The fleet's own
    evidence (`saturation_z` ...) is kept; the flag and a warning name the replicas."""
    if summary.get("saturated") or "saturated" not in per_replica:
        return
    flagged = per_replica[per_replica["saturated"] == 1]
    if flagged.empty:
        _warn_replicas_in_system(system_name, summary, per_replica)
        return
    summary["saturated"] = 1.0
    worst = flagged["saturation_z"].astype(float).idxmax()
    text = saturation_text(flagged.loc[worst].to_dict())
    fleet_z = summary.get("saturation_z", float("nan"))
    warnings.warn(f"{system_name}: saturated: {len(flagged)} of {len(per_replica)} replicas "
                  f"({', '.join(str(i) for i in flagged.index)}) fell behind, though the "
                  f"fleet's pooled queue did not show it (z = {fleet_z:.1f}); "
                  f"replica {worst}: {text}; their latencies grow with the run's length "
                  f"({system_name}/replicas.csv)", stacklevel=3)


def run_disaggregated(
    scenario: Scenario, system: SystemConfig, requests: Requests, engine_requests: Requests
) -> SystemResult:
    """`system`'s prefill and decode pools over `requests` (see `orcasim.disagg`)."""
    from orcasim.disagg import build_disaggregated

    fleet = build_disaggregated(scenario, system, engine_requests)
    with _naming_decode_pool(system):
        done = fleet.run()
    reqs = fleet_requests(system.name, requests, done, fleet.replicas, len(fleet.prefill))
    reqs["prefill_replica"] = fleet.prefill_replica
    reqs["decode_replica"] = fleet.decode_replica
    reqs["kv_transfer_s"] = fleet.kv_transfer_s
    # Transferred to a decode instance until it first ran there: decode-side queueing.
    decode_first_s = fleet.decode_first_scheduled_s()
    reqs["decode_wait_s"] = decode_first_s - fleet.bridge.arrival_s
    iters = fleet.iterations_frame()
    # A request queues until its decode instance takes it: an overloaded decode pool leaves
    # the prefill side's schedules on time while its own queue grows. A one-token output is
    # done at its prefill and never waits for a decode instance (read as never admitted, a
    # server 4% busy was flagged saturated).
    prefill_only = reqs["decode_replica"].lt(0).to_numpy() & reqs["finish_s"].notna().to_numpy()
    admitted_s = np.where(prefill_only, reqs["first_scheduled_s"].to_numpy(dtype=np.float64),
                          decode_first_s)
    summary = measured_summary(scenario, system.name, reqs, iters, admitted_s)
    window = measured_requests(reqs, scenario.warmup_s)
    done = window[window["decode_replica"].ge(0)]
    for column in ("kv_transfer_s", "decode_wait_s"):
        values = done[column].dropna()
        summary[f"{column}_mean"] = float(values.mean()) if len(values) else float("nan")
        summary[f"{column}_p90"] = float(values.quantile(0.9)) if len(values) else float("nan")
    per_replica = pool_summaries(iters, busy_window_s(reqs, scenario.warmup_s), scenario.warmup_s,
                                 {"prefill": len(fleet.prefill), "decode": len(fleet.decode)})
    # In pool order (prefill, then decode), as fleet.replicas lists them.
    per_replica["cache_evictions"] = [float(r.scheduler.cache_evictions()) for r in fleet.replicas]
    per_replica = described(per_replica, fleet.specs)
    for pool, rows in per_replica.groupby("pool"):
        summary[f"{pool}_busy_fraction"] = float(rows["busy_fraction"].mean())
        summary[f"{pool}_replicas"] = float(len(rows))
        # The system's kv_reserved_tokens_max is the largest of both pools' instances (a
        # prefill instance's beside a smaller decode pool): each pool's own, too.
        summary[f"{pool}_kv_reserved_tokens_max"] = float(rows["kv_reserved_tokens_max"].max())
    summary["cost_out_of_range"] = float(sum(c.out_of_range_count() for c in fleet.costs))
    summary["cache_evictions"] = float(sum(r.scheduler.cache_evictions() for r in fleet.replicas))
    return with_sessions(SystemResult(system.name, reqs, iters, summary, per_replica),
                         fleet.source, scenario.warmup_s)


def _naming_decode_pool(system: SystemConfig) -> contextlib.AbstractContextManager[None]:
    """distserve_decode, which runs only in a decode pool, refuses mid-run when it deadlocks:
    where the pool gives its own scheduler, that is the key to name (`naming_system` puts
    'systems[j].' in front), not the system's."""
    assert system.cluster is not None and system.cluster.decode is not None
    if system.cluster.decode.scheduler is None:
        return contextlib.nullcontext()
    return errors_under("cluster.decode.", opening=("scheduler.policy = 'distserve_decode'",))


def pool_summaries(iters: pd.DataFrame, window_s: tuple[float, float], warmup_s: float,
                   pool_sizes: dict[str, int]) -> pd.DataFrame:
    """One row per instance of a disaggregated cluster (`pool_sizes[pool]` in each pool, an
    idle one too): its pool, iterations, busy share of the system's `busy_window_s`, and its
    own KV figures (the system's summary pools both pools' rows: the prefill instance's peak
    read as the system's beside a smaller decode pool)."""
    rows = []
    for pool, size in pool_sizes.items():
        mine = iters[iters["pool"] == pool]
        for replica in range(size):
            it = measured_iterations(mine[mine["replica"] == replica], warmup_s)
            busy_s, count = float(it["duration_s"].sum()), float(it["num_iterations"].sum())
            kv = kv_memory_stats(it)
            rows.append({"pool": pool, "replica": replica, "iterations": count,
                         "busy_fraction": _busy_share(busy_s, window_s),
                         "batch_size_mean": batch_size_mean(it), **kv_reserved_stats(it),
                         "kv_utilization_mean": kv["kv_utilization_mean"],
                         "preemptions": kv["preemptions"]})
    return pd.DataFrame(rows).set_index(["pool", "replica"])


def busy_window_s(reqs: pd.DataFrame, warmup_s: float) -> tuple[float, float]:
    """The span a replica's busy share is of: from the warm-up's end or the first arrival,
    as the summary measures, to the last finish of any request, since the iterations counted
    (those starting after the warm-up) serve requests that arrived before it too: ending at
    the measured requests' last finish read busy shares of 12 (a tester's finding)."""
    start_s, _ = measured_window_s(reqs, warmup_s)
    finish_s = reqs["finish_s"].dropna()
    return start_s, max(start_s, float(finish_s.max())) if len(finish_s) else start_s


def busy_fraction(reqs: pd.DataFrame, iters: pd.DataFrame, warmup_s: float,
                  window_s: tuple[float, float] | None = None) -> float:
    """One server's utilisation: the seconds its iterations starting after the warm-up
    took, over `busy_window_s` (`window_s`, if given: a fleet's, which its replicas share).
    Of a pipelined replica, its first stage's (its rows time a batch there)."""
    busy_s = float(measured_iterations(iters, warmup_s)["duration_s"].sum())
    return _busy_share(busy_s, window_s or busy_window_s(reqs, warmup_s))


# How far a never-idle server's busy share may pass 1 by float rounding alone: the sums of
# its durations and its clock differ by ulps, many orders below this.
BUSY_ROUNDING_REL = 1e-9


def _busy_share(busy_s: float, window_s: tuple[float, float]) -> float:
    """Busy seconds over `busy_window_s`: counted from time 0, a replica busy throughout
    arrivals from 10 to 60 s read 0.83 (a tester's finding). NaN for an empty window.
    A server never idle read 1.0000000000000002: its iterations' durations, summed, and the
    clock that added them one by one round apart, so a share over 1 by rounding is 1."""
    start_s, end_s = window_s
    if end_s <= start_s:
        return float("nan")
    share = busy_s / (end_s - start_s)
    # Only a rounding's overshoot: a real one (an accounting error) stays visible.
    return 1.0 if 1.0 < share <= 1.0 + BUSY_ROUNDING_REL else share


def _warn_replicas_in_system(system_name: str, summary: dict[str, float],
                             per_replica: pd.DataFrame) -> None:
    """The in-system test's evidence, as `warn_saturated` gives a lone server's, where a
    replica's fired and the fleet's pooled count did not: one slow replica of 8 whose running
    set (max_num_seqs 1,024) held its backlog, e2e p50 10.3 s against 0.8 s, in-system z 8.4,
    read z 2.8 on the fleet, and the run said nothing (a tester's finding)."""
    if grew(summary.get("in_system_z", float("nan"))) or "in_system_z" not in per_replica:
        return  # the fleet's own warning says it
    growing = per_replica[per_replica["in_system_z"].astype(float).map(grew)]
    if growing.empty:
        return
    worst = growing["in_system_z"].astype(float).idxmax()
    fleet_z = summary.get("in_system_z", float("nan"))
    warnings.warn(f"{system_name}: {len(growing)} of {len(per_replica)} replicas "
                  f"({', '.join(str(i) for i in growing.index)}): replica {worst}: "
                  f"{in_system_text(growing.loc[worst].to_dict())}, with no waiting queue, though "
                  f"the fleet's pooled count did not show it (z = {fleet_z:.1f}): a "
                  "replica whose running set holds the backlog does this as it falls behind, but "
                  "so do a rising arrival rate, a long tail of latencies and a short run's "
                  "start-up; not flagged saturated (a run twice as long tells; "
                  f"{system_name}/replicas.csv)", stacklevel=4)


def replica_summaries(reqs: pd.DataFrame, iters: pd.DataFrame, warmup_s: float,
                      num_replicas: int) -> pd.DataFrame:
    """One summary row per replica (index `replica`), with its busy share of the window."""
    rows = {}
    window_s, busy_s_window = measured_window_s(reqs, warmup_s), busy_window_s(reqs, warmup_s)
    little_s = arrivals_window_s(reqs, warmup_s)
    for i in range(num_replicas):
        mine, rows_i = reqs[reqs["replica"] == i], iters[iters["replica"] == i]
        # Over the system's windows: each replica's own read 1.99 req/s for one that served
        # two requests in its first half second of 10.5 (a tester's finding), and its
        # Little's L did not add up to the system's.
        summary = summarize(mine, rows_i, warmup_s, window_s=window_s, little_window_s=little_s)
        summary["busy_fraction"] = busy_fraction(mine, rows_i, warmup_s, busy_s_window)
        summary["requests_routed"] = float(len(mine))
        rows[i] = summary
    return pd.DataFrame(rows).T.rename_axis("replica")


def run_scenario(
    scenario: Scenario | dict[str, Any] | str | Path, overrides: list[str] | tuple[str, ...] | str = (),
    base_dir: Path | None = None,
) -> RunResult:
    """Run a scenario (an object, a mapping of its keys, or a YAML path) and return
    per-system frames and summaries. `overrides` are `key=value` strings (one may be given
    alone), checked as a file's are: on an object they make a new one from its keys (a
    pydantic `model_copy(update=...)` would skip the checks). Data paths resolve from
    `base_dir`, by default the scenario file's folder. A `sweep:` block is not run here: its
    points are `orcasim.sweeps.run_scenario_sweep`'s, as `orcasim run` runs them."""
    overrides = one_or_more(overrides)
    if not isinstance(scenario, Scenario | dict | str | PurePath):  # os.fspath's TypeError else
        raise ScenarioError(f"scenario = {scenario!r:.80}: expected a Scenario, a mapping of its "
                            "keys or a YAML file's path")
    if base_dir == "":  # falsy, it meant the default, as None does (Path("") is truthy)
        base_dir = None
    if base_dir is not None:  # an int raised '/' of int and PosixPath at the first data file
        base_dir = as_path(base_dir, "base_dir", "the folder its data paths resolve from")
    if isinstance(scenario, Scenario) and overrides:
        base_dir = base_dir or scenario.source_dir
        scenario = scenario.given_data()  # an override of the hardware derives its own KV capacity
    if isinstance(scenario, dict):
        data = copy.deepcopy(scenario)
        for item in overrides:
            apply_override(data, item)
        scenario = scenario_from_dict(data)
    elif not isinstance(scenario, Scenario):
        base_dir = base_dir or Path(scenario).resolve().parent
        scenario = load_scenario(scenario, overrides)
    for line in held_by_share(scenario.slo) if scenario.slo is not None else []:
        warnings.warn(line, UserWarning, stacklevel=2)
    if scenario.sweep is not None:  # refused here as `orcasim run` refuses it, though not run
        check_runs(scenario, base_dir)
    with data_dir(base_dir or scenario.source_dir):
        requests = make_requests(scenario)
        check_warmup(scenario, requests)
        result = RunResult(scenario)
        for system in scenario.systems:
            with naming_system(scenario, system):
                result.systems[system.name] = run_system(scenario, system, requests)
    return result
