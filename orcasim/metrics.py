"""Per-request frames and the summary: pure functions over arrays and DataFrames."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from orcasim.recorder import Recorder
from orcasim.requests import Requests
from orcasim.saturation import saturation
from orcasim.warmup import counted, measured_iterations, measured_requests

LATENCY_METRICS = ("ttft_s", "tpot_s", "e2e_s", "normalized_latency_s_per_token", "queue_delay_s")
PERCENTILES = (50, 90, 99)


def requests_frame(
    requests: Requests, rec: Recorder, rejected_ids: np.ndarray | None = None
) -> pd.DataFrame:
    """One flat row per request, in the documented schema. A rejected request's latencies
    are NaN, its timestamps as they happened: one a disaggregated decode instance turned
    away had its first token from the prefill instance, and its `ttft_s` stood in the frame,
    in a latency CDF of the served requests, where the summary counts none of it."""
    rejected = np.zeros(len(requests), dtype=bool)
    if rejected_ids is not None:
        rejected[rejected_ids] = True
    output = requests.output_tokens
    e2e = rec.finish_s - requests.arrival_s
    tpot = tpot_s(rec.finish_s - rec.first_token_s, output)
    return pd.DataFrame({
        "id": np.arange(len(requests), dtype=np.int64),
        "arrival_s": requests.arrival_s,
        "first_scheduled_s": rec.first_scheduled_s,
        "first_token_s": rec.first_token_s,
        "finish_s": rec.finish_s,
        "prompt_tokens": requests.prompt_tokens,
        "output_tokens": output,
        "queue_delay_s": np.where(rejected, np.nan, rec.first_scheduled_s - requests.arrival_s),
        "ttft_s": np.where(rejected, np.nan, rec.first_token_s - requests.arrival_s),
        "tpot_s": tpot,
        "e2e_s": e2e,
        "normalized_latency_s_per_token": e2e / output,
        "rejected": rejected,
    })


def tpot_s(decode_s: ArrayLike, output_tokens: ArrayLike) -> np.ndarray:
    """TPOT, time per output token: the mean gap between output tokens after the first,
    `decode_s` (first token to last) over `output_tokens - 1`; NaN for one token or none,
    which leave no gap. The one rule for a simulated run and a real run's log alike."""
    output = np.asarray(output_tokens, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(output > 1, np.asarray(decode_s, dtype=np.float64) / (output - 1), np.nan)


def measured_window_s(reqs: pd.DataFrame, warmup_s: float = 0.0) -> tuple[float, float]:
    """The span a summary measures: from the warm-up's end, or the first arrival if later,
    to the last finish of a request arriving in it (the start twice where none finished).
    A cluster's replicas and pools are measured over their system's one window."""
    start_s = max(warmup_s, float(reqs["arrival_s"].min())) if len(reqs) else 0.0
    finish_s = measured_requests(reqs, warmup_s)["finish_s"].dropna()
    return start_s, float(finish_s.max()) if len(finish_s) else start_s


def summarize(reqs: pd.DataFrame, iters: pd.DataFrame, warmup_s: float = 0.0,
              admitted_s: np.ndarray | None = None,
              window_s: tuple[float, float] | None = None,
              little_window_s: tuple[float, float] | None = None) -> dict[str, float]:
    """Summary metrics of one system; requests arriving before `warmup_s` are dropped.
    `admitted_s`: when each request left the queue the saturation test watches (see
    `orcasim.saturation.saturation`), if not its first schedule. `window_s`: the span its
    throughput is over, if not its own `measured_window_s`; `little_window_s`: the span of
    its Little's-law check, if not its own `arrivals_window_s` (a replica's: its system's)."""
    window = measured_requests(reqs, warmup_s)
    done = window[window["finish_s"].notna()]
    it = measured_iterations(iters, warmup_s)
    start_s, last_s = window_s or measured_window_s(reqs, warmup_s)
    duration_s = last_s - start_s
    # Throughput is what completes within the window (operational analysis: X = C / T),
    # whenever it arrived: a request in service at the warm-up's end uses the window's
    # server time. Counting only those arriving after it read a saturated server of 10
    # req/s at 9.29. Without a warm-up, the window holds every completion.
    finish_s = reqs["finish_s"].to_numpy(dtype=np.float64)
    # Against the last finish itself: (f - s) + s can round below f, and the last request
    # to finish was left out (a throughput of 4 / T for 5 completions; a tester's finding).
    in_window = (finish_s >= start_s) & (finish_s <= last_s)
    out: dict[str, float] = {
        "requests_completed": float(len(done)),
        "requests_rejected": float(window["rejected"].sum())
        if "rejected" in reqs else 0.0,
        "duration_s": duration_s,
        "throughput_rps": float(in_window.sum()) / duration_s if duration_s > 0 else 0.0,
        "throughput_tokens_per_s": float(reqs["output_tokens"].to_numpy()[in_window].sum())
        / duration_s if duration_s > 0 else 0.0,
    }
    for m in LATENCY_METRICS:
        out.update(_distribution(done[m].dropna().to_numpy(), m))
    out.update(_iteration_stats(it))
    out.update(kv_memory_stats(it))
    out.update(prefix_cache_stats(done))
    out.update(littles_law(done, little_window_s))
    out.update(saturation(reqs, warmup_s, admitted_s))
    return out


def _distribution(values: np.ndarray, name: str) -> dict[str, float]:
    if len(values) == 0:
        return {f"{name}_mean": float("nan"), **{f"{name}_p{p}": float("nan") for p in PERCENTILES}}
    out = {f"{name}_mean": float(values.mean())}
    for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES), strict=True):
        out[f"{name}_p{p}"] = float(v)
    return out


def _iteration_stats(it: pd.DataFrame) -> dict[str, float]:
    """Batch size per iteration; KV reservation weighted by the time it was held, and its peak.

    A row's `kv_reserved_tokens` is its time-weighted mean, so weighting rows by their
    duration is exact; its peak is `kv_reserved_tokens_max` (frames without it hold one
    reservation a row).
    """
    return {"iterations": float(it["num_iterations"].to_numpy(dtype=np.float64).sum()),
            "batch_size_mean": batch_size_mean(it), **kv_reserved_stats(it)}


def kv_reserved_stats(it: pd.DataFrame) -> dict[str, float]:
    """KV reserved, weighted by the time it was held, and its peak, over iteration rows
    (one engine's, or several's pooled: the largest any of them reserved)."""
    dur = it["duration_s"].to_numpy()
    kv = it["kv_reserved_tokens"].to_numpy(dtype=np.float64)
    peak = it["kv_reserved_tokens_max" if "kv_reserved_tokens_max" in it else "kv_reserved_tokens"]
    total_s = dur.sum()
    return {
        "kv_reserved_tokens_mean": float((kv * dur).sum() / total_s) if total_s > 0 else 0.0,
        "kv_reserved_tokens_max": float(peak.max()) if len(peak) else 0.0,
    }


def batch_size_mean(it: pd.DataFrame) -> float:
    """Requests a batch, averaged over iterations (a row of `num_iterations` counts as that
    many). NaN where nothing ran, as a latency percentile of no requests: an idle replica
    read 0 in a cluster's summary and NaN in a disaggregated pool's, and a 0 averaged over
    replicas pulls the fleet's mean batch down."""
    n = it["num_iterations"].to_numpy(dtype=np.float64)
    total = n.sum()
    return float((it["batch_size"].to_numpy(dtype=np.float64) * n).sum() / total) if total else float("nan")


def kv_memory_stats(it: pd.DataFrame) -> dict[str, float]:
    """KV holding real tokens over KV allocated, both weighted by time; eviction totals.

    `kv_utilization_mean` is a ratio of time integrals, the share of allocated KV-seconds
    that held token state (the vLLM paper's Figure 2 measure); NaN where a scheduler does
    not report `kv_used_tokens`.
    """
    dur = it["duration_s"].to_numpy()
    used = it["kv_used_tokens"].to_numpy(dtype=np.float64) if "kv_used_tokens" in it else None
    allocated_s = float((it["kv_reserved_tokens"].to_numpy(dtype=np.float64) * dur).sum())
    tracked = used is not None and len(used) > 0 and not np.isnan(used).any() and allocated_s > 0
    return {
        "kv_utilization_mean": float((used * dur).sum()) / allocated_s if tracked else float("nan"),
        "preemptions": float(it["preemptions"].sum()) if "preemptions" in it else 0.0,
        "recomputed_tokens": float(it["recomputed_tokens"].sum()) if "recomputed_tokens" in it
        else 0.0,
    }


def prefix_cache_stats(done: pd.DataFrame) -> dict[str, float]:
    """The prefix cache's hit rate (prompt tokens found cached at first admission over all
    prompt tokens, vLLM's measure) and the prefill tokens it saved over every admission
    (a request preempted by recompute looks again); 0 where nothing was cached."""
    if "cached_tokens" not in done:
        return {"prefix_hit_rate": 0.0, "prefill_tokens_saved": 0.0}
    prompt_tokens = float(done["prompt_tokens"].sum())
    return {
        "prefix_hit_rate": float(done["cached_tokens"].sum()) / prompt_tokens if prompt_tokens else 0.0,
        "prefill_tokens_saved": float(done["prefill_saved_tokens"].sum()),
    }


def arrivals_window_s(reqs: pd.DataFrame, warmup_s: float = 0.0) -> tuple[float, float]:
    """The span Little's law is checked over: from the first to the last arrival of the
    measured requests that finished ((0, 0) where none did: nothing to check). A cluster's
    replicas are checked over their system's, so that their L and lambda W add up to its
    own."""
    window = measured_requests(reqs, warmup_s)
    arrival_s = window["arrival_s"][window["finish_s"].notna()]
    return (float(arrival_s.min()), float(arrival_s.max())) if len(arrival_s) else (0.0, 0.0)


def littles_law(done: pd.DataFrame,
                window_s: tuple[float, float] | None = None) -> dict[str, float]:
    """Little's law, L = lambda * W, over a window of arrivals: from the first to the last
    arrival of `done` (finished requests), or `window_s` (a replica's: its system's).

    L is the time-average number of requests in the system, integrated from each
    request's [arrival, finish] interval clipped to the window; lambda is the arrival
    rate in the window and W the mean sojourn time of those arrivals. Edge effects make
    the two differ by O(W / window), so long runs agree closely. Both sides are sums over
    requests divided by the span, so over one window a fleet's are its replicas' summed
    (each over its own first and last arrival, they were not: see README, Reading the
    summary).
    """
    nan = float("nan")
    a = done["arrival_s"].to_numpy()
    f = done["finish_s"].to_numpy()
    if window_s is None:
        window_s = (float(a.min()), float(a.max())) if len(a) else (0.0, 0.0)
    t0, t1 = window_s
    span = t1 - t0
    if span <= 0:
        return {"little_L": nan, "little_lambda_W": nan, "little_rel_error": nan}
    in_system_s = np.clip(np.minimum(f, t1) - np.maximum(a, t0), 0.0, None).sum()
    L = in_system_s / span
    # A replica that finished nothing in its system's window held nothing there: 0 and 0.
    lam_W = (len(a) / span) * float((f - a).mean()) if len(a) else 0.0
    # Zero sojourn times (a zero-cost model) make both sides 0: nothing to compare.
    rel_error = abs(L - lam_W) / lam_W if lam_W > 0 else nan
    return {"little_L": L, "little_lambda_W": lam_W, "little_rel_error": rel_error}


def offered_rps(arrival_s: np.ndarray, initial_sends: int = 1, warmup_s: float = 0.0) -> float:
    """The realised arrival rate of a run: arrivals per second after the first
    `initial_sends`, between the first arrival and the last; NaN where nothing came after
    them. With a warm-up, of the arrivals from `warmup_s` on, the window the throughput it
    is compared with is measured in (where the first sends, all at time 0, are left out:
    one arrival starts it): over the whole run, a trace at 8 req/s for 50 s and 1 req/s to
    150 s, with a 60 s warm-up, offered 3.33 req/s against the 1.0 served after it, and a
    server that kept up failed the sweep's keeps-up test (a tester's finding).

    An open process starts with one arrival. A closed loop's clients, or a fixed number of
    sessions, all send their first requests at the start (`initial_sends`, see
    `orcasim.workload.arrivals.initial_sends`); what the loop offers afterwards is one send
    per completion (after the think time). Counting the first sends as a rate made 128
    clients of a server completing 6.1 req/s offer 9.8 req/s in 300 requests, and a sweep's
    keeps-up test then rejected a row that could not fall behind.
    """
    if warmup_s > 0:
        arrival_s, initial_sends = arrival_s[counted(arrival_s, warmup_s)], 1
    n = len(arrival_s)
    span_s = float(arrival_s.max() - arrival_s.min()) if n > 1 else 0.0
    return (n - min(initial_sends, n)) / span_s if span_s > 0 else float("nan")


# A system sustains a load when it completes at least this share of the rate offered to it.
SUSTAIN_FRACTION = 0.9


def keeps_up_with(offered_rps: Any, served_rps: Any,
                  sustain_fraction: float = SUSTAIN_FRACTION) -> Any:
    """Whether completions while requests arrive (`served_rps`) are at least `sustain_fraction`
    of the rate offered (`offered_rps`): the keeps-up rule that a sweep's rows
    (`orcasim.sweeps.keeps_up`) and a capacity search's runs (`orcasim.capacity.evaluate`)
    both apply, on numbers or element-wise on arrays and Series. True where no rate was
    offered (NaN: every request sent at once is nothing to fall behind); False where nothing
    was served (NaN), so each caller says what stands in for a served rate a run could not
    measure."""
    offered = np.asarray(offered_rps, dtype=np.float64)
    kept = np.greater_equal(served_rps, sustain_fraction * offered) | np.isnan(offered)
    return kept if isinstance(kept, pd.Series) or np.ndim(kept) else bool(kept)


# Where a run's served rate starts: after the first requests' latency at this quantile,
# by when a server that keeps up completes as fast as requests arrive (`served_rps`).
SERVED_FILL_QUANTILE = 0.9


def served_rps(arrival_s: np.ndarray, finish_s: np.ndarray, warmup_s: float = 0.0) -> float:
    """Completions per second while requests still arrive, once the first have had their
    latency: over [first measured arrival + the measured requests' p90 e2e, last measured
    arrival], counting every finish in it (as `throughput_rps` does its window's). What a
    sweep's keeps-up test compares with `offered_rps`: `throughput_rps` runs to the last
    finish, so it holds the drain after the last arrival, a latency from the tail, and a
    short run of a server that kept up read well below its load: 8 paged replicas
    (scenarios/cluster/routers.yaml's, capacity about 50 req/s) over 400 requests at 11, 22
    and 44 req/s, not saturated, read 0.82, 0.62 and 0.41 of it, here 0.97, 0.92 and (a run
    no longer than its p90 latency) NaN; over 4,000 at 60 req/s, saturated, 0.71 and 0.84.
    NaN where the window is empty or nothing finished."""
    measured = counted(arrival_s, warmup_s)
    arrivals, finishes = arrival_s[measured], finish_s[measured]
    done = np.isfinite(finishes)
    if not done.any():
        return float("nan")
    latency_s = float(np.quantile(finishes[done] - arrivals[done], SERVED_FILL_QUANTILE))
    start_s, end_s = float(arrivals.min()) + latency_s, float(arrivals.max())
    if end_s <= start_s:
        return float("nan")
    finished = finish_s[np.isfinite(finish_s)]
    return float(np.count_nonzero((finished >= start_s) & (finished <= end_s))) / (end_s - start_s)
