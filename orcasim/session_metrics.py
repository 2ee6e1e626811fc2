"""Per-session rows and their summary, for session workloads (`orcasim.sessions`).

A session's task time runs from its first step's send to its last step's end (when the
calls that step waits for are done). It splits exactly into time at the server (each
step, from its send to its end) and time in tools or thinking (from a step's end to the
next send). `queued_s` is the part at the server before any call of a step was first
scheduled (a call turned away counts as queued until it is answered). Step latency
(`step_latency_*`) is over the steps that got an answer: a step whose required calls were
all turned away is done at once, unanswered, and would read as a fast step (as request
latencies leave rejected requests out).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from orcasim.sessions import SessionSource
from orcasim.warmup import counted

SECONDS_PER_HOUR = 3600.0
TASK_PERCENTILES = (50, 90, 99)


def session_columns(reqs: pd.DataFrame, source: SessionSource) -> pd.DataFrame:
    """The per-request frame with each call's session, step (within it) and branch."""
    plan = source.plan
    session = source.session_ids.copy()
    step = source.call_step - plan.step_start[session]
    return reqs.assign(session_id=session, session_step=step, branch=source.call_branch)


def sessions_frame(reqs: pd.DataFrame, source: SessionSource) -> pd.DataFrame:
    """One flat row per session (the requests frame must have `session_columns`)."""
    plan, num = source.plan, source.plan.num_sessions
    steps = _step_rows(reqs, source).groupby(np.repeat(np.arange(num), np.diff(plan.step_start)))
    calls = reqs.groupby("session_id")
    start_s = source.step_sent_s[plan.step_start[:-1]]
    end_s = source.step_done_s[plan.step_start[1:] - 1]
    server_s = steps["latency_s"].sum().to_numpy()
    # Summed gap by gap, not task time less server time: a leftover of rounding would read
    # as tool time (negative, even) where the next send follows a step's end at once.
    tool_s = np.where(np.isnan(end_s), np.nan, steps["gap_s"].sum().to_numpy())
    return pd.DataFrame({
        "session_id": np.arange(num, dtype=np.int64),
        "start_s": start_s,
        "end_s": end_s,
        "task_time_s": end_s - start_s,
        "steps": np.diff(plan.step_start),
        "calls": _per_session(calls, "id", num, "size"),
        "server_s": server_s,
        "tool_s": tool_s,
        "queued_s": steps["queued_s"].sum().to_numpy(),
        "step_latency_mean_s": steps["answered_latency_s"].mean().to_numpy(),
        "step_latency_max_s": steps["answered_latency_s"].max().to_numpy(),
        "prompt_tokens": _per_session(calls, "prompt_tokens", num),
        "output_tokens": _per_session(calls, "output_tokens", num),
        "rejected_calls": _per_session(calls, "rejected", num),
    })


def _per_session(calls: pd.api.typing.DataFrameGroupBy, column: str, num: int,
                 how: str = "sum") -> np.ndarray:
    totals = calls[column].agg(how)
    return totals.reindex(range(num), fill_value=0).to_numpy().astype(np.int64)


def _step_rows(reqs: pd.DataFrame, source: SessionSource) -> pd.DataFrame:
    """Per global step: its latency at the server, the part before its first schedule, and
    the time since its session's previous step ended (tools or thinking)."""
    sent_s, done_s = source.step_sent_s, source.step_done_s
    first_s = np.full(len(sent_s), np.nan)
    scheduled = reqs["first_scheduled_s"].to_numpy()
    # The earliest schedule among a step's calls (fmin skips NaN, never-scheduled calls;
    # it is a min, so the calls' order does not matter).
    np.fmin.at(first_s, source.call_step, scheduled)
    latency_s = done_s - sent_s
    queued_s = np.where(np.isnan(first_s), latency_s, np.minimum(first_s, done_s) - sent_s)
    gap_s = np.zeros(len(sent_s))  # from the previous step's end to this send; none first
    gap_s[1:] = sent_s[1:] - done_s[:-1]
    gap_s[source.plan.step_start[:-1]] = 0.0
    answered_latency_s = np.where(source.step_answered, latency_s, np.nan)
    return pd.DataFrame({"latency_s": latency_s, "answered_latency_s": answered_latency_s,
                         "queued_s": queued_s, "gap_s": gap_s})


def tasks_per_hour(sessions: pd.DataFrame, ended: pd.DataFrame, warmup_s: float) -> float:
    """Tasks completed per hour over the window the request throughput is over (X = C / T,
    `orcasim.metrics.summarize`): from the warm-up's end, or the first start if later, to
    the last end of a session started in it (`ended`, failed ones too: the server's time
    went to them); a session in progress when the warm-up ends counts where it ends, and a
    session with calls turned away not at all. Counting only those started after the warm-up
    read a server busy throughout at 36,000 tasks an hour (64 one-call sessions at a time,
    0.1 s a call) at 33,477 with a warm-up of 10 s and 31,455 with 50 s (a tester's
    finding). NaN where no session started after the warm-up ended."""
    if not len(ended):
        return float("nan")
    start_s = max(warmup_s, float(sessions["start_s"].min()))
    last_s = float(ended["end_s"].max())
    completed = int((sessions["end_s"].between(start_s, last_s)  # NaN: never ended
                     & (sessions["rejected_calls"] == 0)).sum())
    return completed * SECONDS_PER_HOUR / (last_s - start_s) if last_s > start_s else float("nan")


def ended_sessions(sessions: pd.DataFrame, warmup_s: float) -> pd.DataFrame:
    """The sessions a summary measures: started at or after `warmup_s`, and ended (failed
    ones too: `sessions_summary` tells them apart)."""
    return sessions[counted(sessions["start_s"], warmup_s) & sessions["end_s"].notna()]


def sessions_summary(sessions: pd.DataFrame, source: SessionSource,
                     warmup_s: float = 0.0) -> dict[str, float]:
    """Tasks completed per hour (`tasks_per_hour`), task time and step latency percentiles,
    and where task time went, over the sessions that start at or after `warmup_s`; step
    latency over the answered steps sent at or after it.

    A session that had calls turned away goes on without their answers and ends sooner: it
    is counted apart (`sessions_failed`), not as a completed task. Counted as one, react
    agents on a 2,000-token pool that turned away 490 of their 534 calls read 1,161 tasks an
    hour at a task p50 of 34 s, where a pool that served every call read 224 and 222 s (the
    prefix tester's finding)."""
    ended = ended_sessions(sessions, warmup_s)
    done = ended[ended["rejected_calls"] == 0]
    nan = float("nan")
    total_s = float(done["task_time_s"].sum())
    out = {
        "sessions_completed": float(len(done)),
        "sessions_failed": float(len(ended) - len(done)),
        "tasks_per_hour": tasks_per_hour(sessions, ended, warmup_s),
        "task_time_mean_s": float(done["task_time_s"].mean()) if len(done) else nan,
        "task_queued_share": float(done["queued_s"].sum()) / total_s if total_s > 0 else nan,
        "task_server_share": float(done["server_s"].sum()) / total_s if total_s > 0 else nan,
        "task_tool_share": float(done["tool_s"].sum()) / total_s if total_s > 0 else nan,
        "steps_per_task_mean": float(done["steps"].mean()) if len(done) else nan,
    }
    sent_s = source.step_sent_s
    latency_s = (source.step_done_s - sent_s)[counted(sent_s, warmup_s) & source.step_answered]
    latency_s = latency_s[~np.isnan(latency_s)]
    times_s = done["task_time_s"].to_numpy()
    for p in TASK_PERCENTILES:
        out[f"task_time_p{p}_s"] = float(np.percentile(times_s, p)) if len(times_s) else nan
        out[f"step_latency_p{p}_s"] = float(np.percentile(latency_s, p)) if len(latency_s) else nan
    return out
