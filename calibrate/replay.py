"""The replay check: serve a scenario's workload for real, simulate it, and compare.

The real serving loop drives the real model on the wall clock with orcasim's own
iteration-level scheduler (a pure state machine, so the policy is literally the same):
requests join when their arrival time has passed, Orca admission is FCFS, every iteration
is one selective-batched `run_iteration` plus greedy sampling. It records into orcasim's
`Recorder`, so its rows have the schema of `orcasim.metrics.requests_frame`.

A measured iteration runs from just before `schedule()` to just after its tokens are
sampled, so the scheduling and the model call are inside the iterations the cost model must
explain; the bookkeeping of its output (`update_from_output`, freeing finished sequences)
runs after it, in the wall-clock gap before the next one, which the overhead fitted from
run 1's log absorbs. The real run is repeated to measure its noise: simulation error is judged against
the real-versus-real difference, never against zero.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.model import Sequence, Transformer
from orcasim.config import ScenarioError
from orcasim.cost import Batch, CostModel, build_cost_model
from orcasim.engine import Engine
from orcasim.metrics import offered_rps, requests_frame, summarize
from orcasim.recorder import Recorder
from orcasim.replica import Load, Replica, drive, scheduler_load, single
from orcasim.requests import Requests
from orcasim.run import (
    SystemResult,
    busy_fraction,
    data_dir,
    make_requests,
    run_scenario,
    scheduler_for,
)
from orcasim.scenario import Scenario, SystemConfig
from orcasim.schedulers import SchedulerOutput, StepResult
from orcasim.schedulers.iteration_level import IterationLevelConfig
from orcasim.sources import ArrivalSource
from orcasim.workload.arrivals import (
    ConstantArrival,
    GammaArrival,
    PoissonArrival,
    TraceArrival,
)

# Metrics compared: (name in the table, summary key or an iterations-frame aggregate).
COMPARED = ("e2e_s_mean", "e2e_s_p50", "e2e_s_p90", "ttft_s_mean", "ttft_s_p50", "ttft_s_p90",
            "total_iteration_s", "iterations")
SPIN_S = 0.002  # sleep until this close to an arrival, then spin: sleep overshoots by ~0.1 ms


@dataclass
class Served:
    requests: pd.DataFrame
    iterations: pd.DataFrame
    batches: list[Batch]  # what each real iteration computed, to cost it afterwards
    cpu_share: float  # CPU time / wall time over the iterations: well below 1 = contention

    @property
    def busy_fraction(self) -> float:
        """The serving loop's utilisation, as the simulation's summary reads its own
        (`orcasim.run.busy_fraction`: from the first arrival, not time 0, to the last finish)."""
        return busy_fraction(self.requests, self.iterations, 0.0)


@dataclass
class ReplayResult:
    """The fidelity report (JSON-ready), its metric table, and the per-request rows."""

    report: dict[str, object]
    table: pd.DataFrame
    real_requests: list[pd.DataFrame]
    sim_requests: pd.DataFrame


def orca_system(scenario: Scenario) -> SystemConfig:
    for system in scenario.systems:
        if isinstance(system.scheduler, IterationLevelConfig):
            return system
    raise ScenarioError(f"scenario {scenario.name!r}: replay needs a system with an iteration_level scheduler")


def wait_until(t0: float, target_s: float) -> None:
    while (left := target_s - (time.perf_counter() - t0)) > 0:
        if left > SPIN_S:
            time.sleep(left - SPIN_S)


class RealServer:
    """Serves a request table with the real model, one `step` per iteration.

    `clock="wall"` is real serving: arrivals and iterations on the wall clock. `clock="cpu"`
    runs the same real iterations but advances a virtual clock by each iteration's CPU time
    (one torch thread), jumping to the next arrival when idle: on a shared machine it
    measures the model's own cost without the time other processes held the core.
    """

    def __init__(self, model: Transformer, scenario: Scenario, system: SystemConfig,
                 requests: Requests, rng: np.random.Generator, clock: str = "wall") -> None:
        if clock not in ("wall", "cpu"):
            raise ScenarioError(f"--clock = {clock!r}: expected wall or cpu")
        self.model, self.requests, self.clock = model, requests, clock
        self.scheduler = scheduler_for(scenario, system, requests)
        self.recorder = Recorder(len(requests))
        self.prompts = [rng.integers(0, model.args.vocab_size, int(p)).tolist()
                        for p in requests.prompt_tokens]
        self.seqs: dict[int, Sequence] = {}
        self.batches: list[Batch] = []
        self.wall_s = self.cpu_s = 0.0  # totals over iterations, to expose contention

    def compute(self, plan: SchedulerOutput) -> None:
        """Run one planned iteration on the model (its tokens are sampled, not yet applied)."""
        batch = []
        for i, k in zip(plan.req_ids.tolist(), plan.num_new_tokens.tolist(), strict=True):
            if i not in self.seqs:
                self.seqs[i] = self.model.new_sequence(self.prompts[i], int(self.requests.max_tokens[i]))
            batch.append((self.seqs[i], k))
        for (seq, _), token in zip(batch, self.model.decode_greedy(batch), strict=True):
            seq.token_ids.append(token)
        self.batches.append(plan.batch)

    def apply(self, plan: SchedulerOutput) -> StepResult:
        """Feed the iteration's tokens back to the scheduler; finished sequences free their KV."""
        result = self.scheduler.update_from_output(plan)
        for i in result.finished_ids.tolist():
            del self.seqs[i]
        return result

    def run(self) -> Served:
        """Serve every request, starting now, on the replica skeleton every engine shares.
        GC is paused meanwhile, as in the profiler."""
        source = ArrivalSource(self.requests.arrival_s)
        gc.collect()
        gc.disable()
        t0 = time.perf_counter()
        stepper = _RealStepper(self, t0)
        replica = Replica(stepper, source, self.recorder)
        wait = (lambda target_s: wait_until(t0, target_s)) if self.clock == "wall" else None
        try:
            drive([replica], source, single(replica), wait)
        finally:
            gc.enable()
        assert not self.scheduler.has_unfinished()
        rec = self.recorder
        return Served(requests_frame(self.requests, rec), rec.iterations_frame(), self.batches,
                      self.cpu_s / self.wall_s)


class _RealStepper:
    """The real serving loop as a `Stepper`: each unit is one iteration run on the model.

    Under `clock="wall"` an iteration starts when the loop gets to it (the bookkeeping
    between iterations is real time too) and lasts what it measured; under `"cpu"` it
    starts at the boundary and lasts its CPU time.
    """

    plans_on_arrival = False

    def __init__(self, server: RealServer, t0: float) -> None:
        self.server, self.scheduler, self.t0 = server, server.scheduler, t0
        self.replica: Replica  # set by the replica that runs it
        self.wake_s: float | None = None
        self._pending: tuple[SchedulerOutput, float, float] | None = None

    def start(self, now_s: float) -> float | None:
        server = self.server
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        start_s = wall0 - self.t0 if server.clock == "wall" else now_s
        plan = self.scheduler.schedule(start_s)
        if plan.is_empty:
            return None
        server.compute(plan)
        result_wall_s, cpu_s = time.perf_counter() - wall0, time.thread_time() - cpu0
        server.wall_s, server.cpu_s = server.wall_s + result_wall_s, server.cpu_s + cpu_s
        end_s = start_s + (result_wall_s if server.clock == "wall" else cpu_s)
        self._pending = (plan, start_s, end_s)
        return end_s

    def ends_s(self) -> tuple[float, ...]:
        return () if self._pending is None else (self._pending[2],)

    def cut(self, num_iterations: int) -> None:
        assert num_iterations == 1, "a real iteration is one unit"

    def finish(self) -> None:
        assert self._pending is not None
        (plan, start_s, end_s), self._pending = self._pending, None
        result = self.server.apply(plan)
        recorder = self.server.recorder
        recorder.record_iteration(start_s, end_s - start_s, 1, plan, self.scheduler.num_queued)
        recorder.record_progress(plan.req_ids, start_s, result, end_s)

    def load(self) -> Load:
        return scheduler_load(self.scheduler)

    def close(self) -> None:
        """Progress is always up to date."""


def warm_up(model: Transformer, prompt_tokens: int, rounds: int = 3) -> None:
    """First calls allocate kernels and caches; keep them out of the measured run."""
    for _ in range(rounds):
        seqs = [model.new_sequence([1] * (prompt_tokens + 2), prompt_tokens + 2) for _ in range(4)]
        model.decode_greedy([(s, prompt_tokens) for s in seqs])
        model.decode_greedy([(s, 1) for s in seqs])


def metrics_of(reqs: pd.DataFrame, iters: pd.DataFrame) -> dict[str, float]:
    s = summarize(reqs, iters)
    s["total_iteration_s"] = float(iters["duration_s"].sum())
    return {k: float(s[k]) for k in COMPARED}


def capacity_rps(scenario: Scenario, system: SystemConfig, requests: Requests) -> float:
    """Saturation throughput under the fitted cost: every request arrives at time zero."""
    burst = Requests(np.zeros(len(requests)), requests.prompt_tokens, requests.output_tokens,
                     requests.max_tokens)
    scheduler = scheduler_for(scenario, system, burst)
    run = Engine(burst, scheduler, build_cost_model(scenario.system_cost(system), scenario.deployment(), scenario.hardware)).run()
    return len(requests) / run.end_s


def iteration_errors(served: list[Served], cost: CostModel) -> dict[str, float]:
    """The cost model on the real runs' own batches (no queueing feedback): relative error per
    iteration, and predicted over real total time."""
    predicted = np.array([cost.iteration_time_s(b) for s in served for b in s.batches])
    real = np.concatenate([s.iterations["duration_s"].to_numpy() for s in served])
    err = (predicted - real) / real
    return {"median": float(np.median(err)), "median_abs": float(np.median(np.abs(err))),
            "p90_abs": float(np.percentile(np.abs(err), 90)),
            "total_ratio": float(predicted.sum() / real.sum())}


def fidelity_table(real: list[dict[str, float]], sim: dict[str, float]) -> pd.DataFrame:
    """Per metric: both real runs, their mean, the simulation, and the two relative errors."""
    t = pd.DataFrame({"real_1": real[0], "real_2": real[1], "sim": sim})
    t["real_mean"] = (t["real_1"] + t["real_2"]) / 2
    t["real_vs_real"] = (t["real_1"] - t["real_2"]).abs() / t["real_mean"]
    t["sim_vs_real"] = (t["sim"] - t["real_mean"]).abs() / t["real_mean"]
    return t


# Arrival times fixed before serving starts, which the real server can replay (and --load
# rescale); a closed loop's and sessions' next requests wait for answers.
OPEN_ARRIVALS = ("poisson", "gamma", "constant", "trace")


def at_load(scenario: Scenario, requests: Requests, capacity: float, load: float) -> Scenario:
    """The scenario with its arrival rate scaled so the offered load is `load` × capacity,
    the offered rate as `orcasim.metrics.offered_rps` reads it (a capacity search's rule).

    Same seed, so the same gaps, all divided by one factor (exponential and gamma gaps
    scale with 1/rate); a trace arrival is sped up instead.
    """
    offered = offered_rps(requests.arrival_s)
    if not offered > 0 or not np.isfinite(offered):
        raise ScenarioError(f"--load {load:g}: the workload has fewer than two distinct arrival "
                            "times, so no rate to scale; expected two requests or more")
    factor = load * capacity / offered
    arrival = scenario.workload.arrival
    if isinstance(arrival, TraceArrival):
        arrival = arrival.model_copy(update={"speedup": arrival.speedup * factor})
    elif isinstance(arrival, PoissonArrival | GammaArrival | ConstantArrival):
        arrival = arrival.model_copy(update={"rate_per_s": arrival.rate_per_s * factor})
    else:
        raise ScenarioError(f"workload.arrival.kind = {arrival.kind}: --load rescales poisson, "
                            "gamma, constant or trace arrivals only")
    workload = scenario.workload.model_copy(update={"arrival": arrival})
    return scenario.model_copy(update={"workload": workload})


OVERHEAD_TERMS = ("overhead.per_iteration_s", "overhead.per_sequence_s")


def overhead_from_log(scenario: Scenario, system: SystemConfig, real: pd.DataFrame,
                      base_dir: Path) -> tuple[dict[str, float], SystemResult]:
    """The serving loop's time outside the profiled step (per iteration and per request),
    fitted to one real run's per-request log (`calibrate.logs`), and the simulation with it."""
    import tempfile

    from calibrate.logs import fit, inline_calibrated, read_logs, with_cost

    # A cost calibrated from logs holds its own overhead: fitted in that block, as
    # `calibrate logs` refits it, not as a second one beside it (refused, after the real runs).
    scenario = inline_calibrated(scenario, base_dir)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "real_1.csv"
        real.to_csv(log, index=False)
        start = dict.fromkeys(OVERHEAD_TERMS, 0.0)
        result = fit(scenario, read_logs([log]), system.name, OVERHEAD_TERMS, base_dir, start)
    calibrated = with_cost(scenario, result.parameters)
    return result.parameters, run_scenario(calibrated, base_dir=base_dir).systems[system.name]


def replay(model: Transformer, scenario: Scenario, base_dir: Path, seed: int = 0,
           load: float | None = None, clock: str = "wall") -> ReplayResult:
    """Serve twice for real, simulate once, and compare. With `load`, the arrival rate is first
    rescaled to that fraction of the capacity the fitted cost model predicts."""
    system = orca_system(scenario)
    kind = scenario.workload.arrival.kind
    if kind not in OPEN_ARRIVALS:  # the real server replays fixed times; these wait for answers
        raise ScenarioError(f"workload.arrival.kind = {kind}: replay expects poisson, gamma, "
                            "constant or trace arrivals")
    one = scenario.model_copy(update={"systems": [system]})
    with data_dir(base_dir):
        requests = make_requests(one)
        capacity = capacity_rps(one, system, requests)
        if load is not None:
            one = at_load(one, requests, capacity, load)
            requests = make_requests(one)
    warm_up(model, int(np.median(requests.prompt_tokens)))
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2)]
    served = [RealServer(model, one, system, requests, rng, clock).run() for rng in rngs]
    sim = run_scenario(one, base_dir=base_dir).systems[system.name]
    real_metrics = [metrics_of(s.requests, s.iterations) for s in served]
    table = fidelity_table(real_metrics, metrics_of(sim.requests, sim.iterations))
    overhead, calibrated = overhead_from_log(one, system, served[0].requests, base_dir)
    # The loop's own time, fitted on run 1's log, checked against run 2 (held out).
    calibrated_vs_2 = {k: abs(v - real_metrics[1][k]) / real_metrics[1][k]
                       for k, v in metrics_of(calibrated.requests, calibrated.iterations).items()}
    table["sim_calibrated_vs_real_2"] = pd.Series(calibrated_vs_2)
    with data_dir(base_dir):
        cost = build_cost_model(one.system_cost(system), one.deployment(), one.hardware)
    offered = offered_rps(requests.arrival_s)
    report = {
        "scenario": scenario.name, "system": system.name, "requests": len(requests),
        "offered_rps": offered, "capacity_rps_simulated": capacity, "load": offered / capacity,
        "cost_out_of_range": sim.summary["cost_out_of_range"],
        "real_busy_fraction": [s.busy_fraction for s in served],
        # CPU time over busy time of the serving thread; near 1 unless others held the core.
        "real_cpu_share": [s.cpu_share for s in served],
        "clock": clock,
        "iteration_rel_error": iteration_errors(served, cost),
        "overhead_from_run_1": overhead,
        "metrics": table.to_dict(orient="index"),
    }
    return ReplayResult(report, table, [s.requests for s in served], sim.requests)
