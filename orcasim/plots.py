"""Figures: pure functions, DataFrame in, matplotlib Figure out. Nothing here writes files."""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib
import numpy as np
import pandas as pd

# Figures are built as plain `Figure` objects, never through pyplot, so nothing here picks
# or switches a backend: files render with Agg and notebooks show them inline.
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from orcasim.columns import KEY_COLUMNS, param_columns, param_names, point_parameters
from orcasim.config import is_number, is_whole_number
from orcasim.recorder import SUMMED_COLUMNS
from orcasim.run import RunResult
from orcasim.warmup import measured_requests

CDF_METRICS = {
    "ttft_s": "time to first token (s)",
    "tpot_s": "time per output token (s)",
    "e2e_s": "end-to-end latency (s)",
    "normalized_latency_s_per_token": "normalized latency (s/token)",
}

# Ratio of largest to smallest value beyond which a CDF's x axis is drawn in log scale.
LOG_SPAN = 100.0


SATURATED = "saturated: queue unstable"


class FigureInputError(ValueError):
    """A figure's input lacks what the figure reads: bad input where a user's results
    folder gave it (`orcasim plot` says so on one line), not a bug."""


def _checked(table: pd.DataFrame, columns: tuple[str | None, ...], what: str,
             empty_ok: bool = False, text_ok: tuple[str | None, ...] = ("system",)) -> None:
    """A figure's input has rows and the columns it reads, numbers in each but `text_ok`
    (a system's name, a swept parameter's value), or a FigureInputError naming what is
    missing (and what there is), before pandas or matplotlib fails deep inside."""
    if not isinstance(table, pd.DataFrame):  # None raised "'NoneType' has no attribute 'empty'"
        raise TypeError(f"{what} = {table!r:.80} ({type(table).__name__}): expected a pandas "
                        "DataFrame")
    if table.empty and not empty_ok:
        raise FigureInputError(f"{what} has no rows (a sweep whose every point failed?): "
                               "nothing to plot")
    missing = [c for c in columns if c is not None and c not in table.columns]
    if missing:
        raise FigureInputError(f"{what} has no column {', '.join(map(repr, missing))}; its "
                               f"columns: {', '.join(map(str, table.columns))}")
    text = next((c for c in columns if c is not None and c not in text_ok and len(table)
                 and not pd.api.types.is_numeric_dtype(table[c])), None)
    if text is not None:  # a hand-edited table: a TypeError deep in pandas or matplotlib
        raise FigureInputError(f"{what}'s column {text!r} holds text ({table[text].iloc[0]!r}); "
                               "expected numbers, as orcasim writes them")


def _one_system(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame of one system's rows (`SystemResult.requests`) drawn as a run of one system;
    anything but a frame as given, for `_checked` to refuse."""
    if isinstance(frame, pd.DataFrame) and "system" not in frame.columns:
        return frame.assign(system="this run")
    return frame


def ecdf_points(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of `values` as points that `drawstyle="steps-post"` draws exactly:
    0 up to the smallest value, then i/n from the i-th smallest up to the next. Joined by
    straight lines instead, n points put values between two samples that no request had
    (with 10 requests, half a step's fraction at every midpoint)."""
    x = np.sort(values)
    return np.concatenate([x[:1], x]), np.arange(len(x) + 1) / len(x)


def draw_ecdf(ax: Any, values: np.ndarray, **style: Any) -> None:
    """`values`' empirical CDF on `ax`, as steps (`ecdf_points`)."""
    x, y = ecdf_points(values)
    ax.plot(x, y, drawstyle="steps-post", **style)


def latency_cdfs(requests: pd.DataFrame, saturated: frozenset[str] = frozenset(),
                 warmup_s: float = 0.0) -> Figure:
    """CDFs of TTFT, TPOT, e2e and normalized latency, per `system` (a frame without that
    column is one system's), over the requests arriving at or after `warmup_s`, as the
    summary counts them. Systems in `saturated` are labelled so, and drawn dotted: their
    curves describe the run's length, not the server."""
    if not is_number(warmup_s) or math.isnan(warmup_s):
        raise ValueError(f"warmup_s = {warmup_s!r}: expected a number of seconds")
    requests = _one_system(requests)
    _checked(requests, (*CDF_METRICS, "arrival_s" if warmup_s > 0 else None), "the requests table",
             empty_ok=True)
    if warmup_s > 0:
        last_s = float(requests["arrival_s"].max()) if len(requests) else None
        requests = measured_requests(requests, warmup_s)
        if last_s is not None and requests.empty:  # four empty panels, without a word
            raise ValueError(f"warmup_s = {warmup_s:g}: no request arrives at or after it (the "
                             f"last at {last_s:g} s); expected a warm-up before the last arrival")
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    axes = fig.subplots(2, 2)
    for ax, (metric, label) in zip(axes.flat, CDF_METRICS.items(), strict=True):
        # A system's colour is its own in every panel: from the cycle, a system with no
        # values in one (TPOT of one-token answers) passed its colour to the next there.
        for i, (system, rows) in enumerate(requests.groupby("system", sort=False)):
            values = rows[metric].dropna().to_numpy()
            if len(values):
                unstable = system in saturated
                draw_ecdf(ax, values, color=f"C{i % 10}",
                          label=f"{system} ({SATURATED})" if unstable else str(system),
                          linestyle=":" if unstable else "-",
                          marker="o" if len(values) == 1 else None)  # a lone value: a visible point
        values = requests[metric].dropna().to_numpy()
        if len(values) and values.min() > 0 and values.max() / values.min() > LOG_SPAN:
            ax.set_xscale("log")  # systems decades apart: a linear axis squashes one of them
            ax.set_xlabel(f"{label}, log scale")
        else:
            ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    # Outside the panels: inside, a legend hides some curve in one of the four.
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)))
    fig.suptitle("Latency distributions per system"
                 + (f" (requests arriving after the {warmup_s:g} s warm-up)" if warmup_s > 0 else ""))
    return fig


def fidelity_cdfs(frame: pd.DataFrame, title: str) -> Figure:
    """Real against simulated CDFs of TTFT, TPOT and E2E; `frame` has a `source` column."""
    _checked(frame, ("ttft_s", "tpot_s", "e2e_s", "source"), "the real-against-simulated frame",
             empty_ok=True, text_ok=("source",))
    fig = Figure(figsize=(13, 4), layout="constrained")
    for ax, metric in zip(fig.subplots(1, 3), ("ttft_s", "tpot_s", "e2e_s"), strict=True):
        for source, rows in frame.groupby("source", sort=False):
            values = rows[metric].dropna().to_numpy()
            if len(values):
                draw_ecdf(ax, values, linestyle="-" if source == "real" else "--",
                          label=str(source))
        ax.set_xlabel(CDF_METRICS[metric])
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="lower right")
        else:  # the log does not measure it (matplotlib warns of a legend with nothing in it)
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title)
    return fig


TIMELINE_COLUMNS = {
    "batch_size": "batch size (requests)",
    "num_waiting": "queue length (requests)",
    "kv_reserved_tokens": "KV reserved (tokens)",
}


def binned_time_average(iterations: pd.DataFrame, column: str, edges_s: np.ndarray) -> np.ndarray:
    """Time average of `column` over each bin [edges_s[i], edges_s[i+1]).

    Each row holds its value for `duration_s` from `start_s`; between rows the server is
    idle, so the value is 0. The integral of a piecewise-constant signal is piecewise
    linear, so interpolating it at the bin edges is exact. (A multi-iteration row holds
    its time-weighted mean, e.g. of `kv_reserved_tokens`: exact at the row's ends, spread
    evenly inside it. A column summed over the row's iterations, e.g. `num_waiting`, is
    taken per iteration: its sum over `num_iterations`.) Rows are taken in time order, in
    whatever order the frame holds them (sorted by another column, the integral taken
    row by row drew a timeline that was not the run's).
    """
    if iterations.empty:  # idle throughout (a replica the router starved): 0, not a ValueError
        return np.zeros(len(edges_s) - 1)
    iterations = iterations.iloc[np.argsort(iterations["start_s"].to_numpy(), kind="stable")]
    start = iterations["start_s"].to_numpy(dtype=np.float64)
    end = start + iterations["duration_s"].to_numpy(dtype=np.float64)
    value = iterations[column].to_numpy(dtype=np.float64)
    if column in SUMMED_COLUMNS and "num_iterations" in iterations:  # else a row an iteration
        value = value / iterations["num_iterations"].to_numpy(dtype=np.float64)
    area = value * (end - start)
    before = np.concatenate([[0.0], np.cumsum(area)[:-1]])
    times = np.column_stack([start, end]).ravel()
    integral = np.column_stack([before, before + area]).ravel()
    at_edges = np.interp(edges_s, times, integral, left=0.0, right=integral[-1])
    return np.diff(at_edges) / np.diff(edges_s)


def check_num_bins(num_bins: int) -> None:
    """A ValueError naming a count of windows that is no whole number of at least one:
    replica_load divided by zero at 0 and drew empty axes at -1; a float or a string raised
    numpy's or Python's TypeError."""
    if not is_whole_number(num_bins) or num_bins < 1:
        raise ValueError(f"num_bins = {num_bins!r}: expected a whole number of windows, at least 1")


def time_bins(iterations: pd.DataFrame, num_bins: int,
              counted: Mapping[tuple[Any, ...], pd.DataFrame] | None = None,
              ) -> tuple[float, np.ndarray, np.ndarray]:
    """`num_bins` equal windows from 0 to the last iteration's end, or the last finish of
    the requests `counted` (a pipelined replica's last flight ends on its last stage, after
    its row): (end, edges, midpoints)."""
    end_s = float((iterations["start_s"] + iterations["duration_s"]).max()) if len(iterations) else 1.0
    for mine in (counted or {}).values():
        if mine["finish_s"].notna().any():
            end_s = max(end_s, float(mine["finish_s"].max()))
    edges_s = np.linspace(0.0, end_s, num_bins + 1)
    return end_s, edges_s, (edges_s[:-1] + edges_s[1:]) / 2


def open_time_average(starts_s: np.ndarray, ends_s: np.ndarray, edges_s: np.ndarray) -> np.ndarray:
    """How many of the intervals [starts_s[i], ends_s[i]) are open, averaged over each bin
    [edges_s[j], edges_s[j+1]); an interval with a NaN end never opened (a request turned
    away was never scheduled). Exact: the integral up to t is the sum over the opened
    intervals of (t - start) less the sum over the closed ones of (t - end)."""
    keep = ~(np.isnan(starts_s) | np.isnan(ends_s))
    starts, ends = np.sort(starts_s[keep]), np.sort(ends_s[keep])

    def integral(times: np.ndarray, at: np.ndarray) -> np.ndarray:
        k = np.searchsorted(times, at, side="right")
        before = np.concatenate([[0.0], np.cumsum(times)])[k]
        return k * at - before

    at_edges = integral(starts, edges_s) - integral(ends, edges_s)
    return np.diff(at_edges) / np.diff(edges_s)


# The intervals a pipelined replica's panels count (see `replica_load`).
_COUNTED = {"batch_size": ("first_scheduled_s", "finish_s"),
            "num_waiting": ("arrival_s", "first_scheduled_s")}


def _pipelined_requests(requests: pd.DataFrame | None, pipelined: Collection[tuple[Any, ...]],
                        ) -> dict[tuple[Any, ...], pd.DataFrame]:
    """Each pipelined replica's requests, by its key."""
    if not pipelined:
        return {}
    if requests is None:
        raise FigureInputError("a pipelined replica's load is counted from its requests; "
                               "expected the system's requests table beside its iterations")
    _checked(requests, ("replica", "arrival_s", "first_scheduled_s", "finish_s"),
             "the requests table", empty_ok=True)
    return {tuple(key): requests[requests["replica"] == key[0]] for key in pipelined}


def _counted_load(requests: pd.DataFrame, column: str, edges_s: np.ndarray) -> np.ndarray:
    start, end = _COUNTED[column]
    return open_time_average(requests[start].to_numpy(dtype=np.float64),
                             requests[end].to_numpy(dtype=np.float64), edges_s)


def fleet_time_average(iterations: pd.DataFrame, column: str, edges_s: np.ndarray) -> np.ndarray:
    """`binned_time_average`, summed over replicas when the rows carry a `replica` column
    (a cluster's replicas run at once, so their rows overlap in time)."""
    if not _has_replicas(iterations):
        return binned_time_average(iterations, column, edges_s)
    total = np.zeros(len(edges_s) - 1)
    for _, rows in iterations.groupby(_instance_keys(iterations), sort=True):
        total += binned_time_average(rows, column, edges_s)
    return total


def _has_replicas(iterations: pd.DataFrame) -> bool:
    """Whether the rows are a cluster's, whose replicas' rows overlap in time."""
    return "replica" in iterations and not iterations["replica"].isna().all()


def _instance_keys(iterations: pd.DataFrame) -> list[str]:
    """The columns that name one serving instance: a disaggregated cluster's pool too."""
    has_pool = "pool" in iterations and not iterations["pool"].isna().all()
    return ["pool", "replica"] if has_pool else ["replica"]


def _distinct_colours(count: int) -> list[Any]:
    """`count` colours no two alike: matplotlib's ten-colour cycle drew replica 10 as
    replica 0 in a 16-replica fleet. tab10 up to ten, tab20 to twenty, then a spread of
    turbo (beyond twenty lines the legend, not the colour, names them)."""
    if count <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(count)]
    if count <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(count)]
    return [matplotlib.colormaps["turbo"](x) for x in np.linspace(0.0, 1.0, count)]


def replica_load(iterations: pd.DataFrame, title: str, num_bins: int = 120,
                 instances: Sequence[tuple[Any, ...]] | None = None,
                 requests: pd.DataFrame | None = None,
                 pipelined: Collection[tuple[Any, ...]] = ()) -> Figure:
    """A cluster's load per replica over simulated time: running and waiting requests.

    `iterations` are one system's rows, with a `replica` column (and a disaggregated one's
    `pool`); each line is a time average over `num_bins` equal windows (see
    `binned_time_average`). `instances` (keys as the rows give them: (replica,) or (pool,
    replica)) are drawn whether or not they ran: a replica a router starved is a flat line
    at 0, not missing. None: those with rows.

    The `pipelined` replicas ((replica,) keys: Orca on several pipeline stages) are counted
    from `requests` (the system's, with `replica`): running from first scheduled to
    finished, waiting from arrival to first scheduled. Their rows are one micro-batch's time
    on the first stage each, so the rows' batch size counted one micro-batch of the several
    in flight, and none while only later stages worked (`orcasim.pipeline`).
    """
    check_num_bins(num_bins)
    _checked(iterations, ("start_s", "duration_s", "batch_size", "num_waiting", "replica"),
             "the iterations table", empty_ok=True)
    counted = _pipelined_requests(requests, pipelined)
    end_s, edges_s, mids_s = time_bins(iterations, num_bins, counted)
    keys = _instance_keys(iterations)
    groups = {key if isinstance(key, tuple) else (key,): rows
              for key, rows in iterations.groupby(keys, sort=True)}
    fig = Figure(figsize=(11, 6), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    columns = (("batch_size", "running (requests)"), ("num_waiting", "waiting (requests)"))
    drawn = sorted(groups) if instances is None else list(instances)
    colours = _distinct_colours(len(drawn))
    for ax, (column, label) in zip(axes, columns, strict=True):
        for key, colour in zip(drawn, colours, strict=True):
            name = " ".join(str(k) for k in key)
            rows = groups.get(tuple(key))
            if tuple(key) in counted:
                load = _counted_load(counted[tuple(key)], column, edges_s)
            else:
                load = np.zeros(len(mids_s)) if rows is None else binned_time_average(rows, column, edges_s)
            ax.plot(mids_s, load, label=f"replica {name}" if len(key) == 1 else name,
                    linewidth=1.0, color=colour)
        _counts_from_zero(ax)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(8, len(labels)))
    axes[-1].set_xlabel("simulated time (s)")
    fig.suptitle(f"{title}: load per replica, time averages over {end_s / num_bins:.3g} s windows")
    return fig


def _counts_from_zero(ax: Any) -> None:
    """A panel of counts (requests, tokens) starts at 0 and shows at least one: when nothing
    ever waited, matplotlib's own limits (-0.055 to 0.055) read as a fraction of a request
    waiting, or fewer than none."""
    _, top = ax.get_ylim()
    ax.set_ylim(0.0, max(1.0, top))


def timelines(
    iterations: pd.DataFrame, columns: tuple[str, ...] | str = tuple(TIMELINE_COLUMNS), num_bins: int = 120
) -> Figure:
    """Batch size, queue length and KV usage over simulated time, one panel each.

    Raw per-iteration steps of several systems overlap into a blur, so each line is the
    time average over `num_bins` equal windows, per `system` (a frame without that column
    is one system's).
    """
    columns = (columns,) if isinstance(columns, str) else tuple(columns)  # one alone, not its letters
    if not columns:
        raise ValueError("columns = (): expected at least one of the iterations table's columns")
    check_num_bins(num_bins)
    iterations = _one_system(iterations)
    _checked(iterations, ("start_s", "duration_s", *columns), "the iterations table", empty_ok=True)
    end_s, edges_s, mids_s = time_bins(iterations, num_bins)
    fig = Figure(figsize=(11, 1.2 + 2.4 * len(columns)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(columns), 1, sharex=True))
    for ax, column in zip(axes, columns, strict=True):
        for system, rows in iterations.groupby("system", sort=False):
            ax.plot(mids_s, fleet_time_average(rows, column, edges_s), label=str(system), linewidth=1.0)
        if column in TIMELINE_COLUMNS:  # counts of requests or tokens
            _counts_from_zero(ax)
        summed = ",\nsummed over replicas" if _has_replicas(iterations) else ""
        ax.set_ylabel(TIMELINE_COLUMNS.get(column, column) + summed)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)))
    axes[-1].set_xlabel("simulated time (s)")
    fig.suptitle(f"Time averages over {end_s / num_bins:.3g} s windows")
    return fig


def batch_size_timeline(iterations: pd.DataFrame, num_bins: int = 120) -> Figure:
    """Batch size alone over simulated time (see `timelines`)."""
    return timelines(iterations, ("batch_size",), num_bins)


SWEEP_METRICS = {
    "normalized_latency_s_per_token_p50": "median normalized latency (s/token)",
    "ttft_s_p50": "median TTFT (s)",
    "e2e_s_p90": "p90 end-to-end latency (s)",
    "throughput_rps": "achieved throughput (req/s)",
}
METRIC_LABELS = {
    **SWEEP_METRICS,
    "e2e_s_p50": "median end-to-end latency (s)",
    "tpot_s_p50": "median time per output token (s)",
    "queue_delay_s_p50": "median queueing delay (s)",
    "batch_size_mean": "mean batch size (requests)",
    "kv_reserved_tokens_mean": "mean KV reserved (tokens)",
    "kv_reserved_tokens_max": "max KV reserved (tokens)",
    "throughput_tokens_per_s": "output throughput (tokens/s)",
    "kv_utilization_mean": "mean KV utilization (used / allocated)",
    "busy_fraction": "busy fraction (utilisation)",
    "prefix_hit_rate": "prefix cache hit rate (share of prompt tokens)",
    "preemptions": "preemptions (count)",
}
# A metric without a label of its own keeps its name, with the unit its name spells.
UNITS_IN_NAMES = ((r"_s_per_token", "s/token"), (r"tokens_per_s", "tokens/s"), (r"_rps$", "req/s"),
                  (r"_s(_|$)", "s"), (r"tokens", "tokens"))
BAND_PERCENTILES = (10, 90)
# Axis labels of common swept fields, by the last part of their dotted path.
PARAMETER_LABELS = {
    "rate_per_s": "offered load (req/s)",
    "speedup": "trace speed-up (x its recorded rate)",
    "max_batch_size": "max batch size (requests)",
    "kv_capacity_tokens": "KV capacity (tokens)",
}


def metric_label(metric: str) -> str:
    """An axis label for a summary metric: its own, else its name and the unit it spells
    ('ttft_s_p99 (s)'); a name that spells none (a share, a count) is left as it is."""
    if metric in METRIC_LABELS:
        return METRIC_LABELS[metric]
    unit = metric_unit(metric)
    return f"{metric} ({unit})" if unit else metric


def metric_unit(metric: str) -> str | None:
    """The unit a metric's name spells ('s/token' for normalized latency), or None."""
    return next((u for pattern, u in UNITS_IN_NAMES if re.search(pattern, metric)), None)


LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v")
_SYSTEM_PATH = re.compile(r"^systems\[(\d+)\]")


@dataclass
class Line:
    label: str
    style: dict[str, Any]
    rows: pd.DataFrame


def sweep_lines(table: pd.DataFrame, exclude: tuple[str, ...]) -> Iterator[Line]:
    """Split a sweep table into lines: one per system and value of each other swept
    parameter. A `systems[i]...` parameter splits only the systems whose rows it changes
    (system i's); the others keep its first value, so unaffected systems are not drawn once
    per value. A parameter that moves with the others (a `zip` grid's) neither splits nor
    pins: the rest already tell its rows apart, and pinning one of its values kept one point
    of each line. Colour marks the system, line style and marker the parameter values."""
    every = param_columns(table)
    # As the figures' file names are: the last part of a path, or the whole path where two
    # last parts clash ('high=256, high=64' of prompt_tokens.high and output_tokens.high).
    names = dict(zip(every, param_names(every), strict=True))
    params = [c for c in every if c not in exclude]
    for i, system in enumerate(dict.fromkeys(table["system"])):
        rows = table[table["system"] == system]
        params_here = [c for c in params if _tells_apart(rows, c, every)]
        own = [c for c in params_here if not _SYSTEM_PATH.match(c) or _changes(rows, c, every)]
        for c in params_here:
            if c not in own:
                rows = rows[rows[c] == rows[c].iloc[0]]
        groups = rows.groupby(own, sort=False) if own else [((), rows)]
        for j, (values, sub) in enumerate(groups):
            values = values if isinstance(values, tuple) else (values,)
            label = ", ".join([str(system)] + [f"{names[k]}={v}" for k, v in zip(own, values, strict=True)])
            style = {"color": f"C{i % 10}", "linestyle": LINE_STYLES[j % len(LINE_STYLES)],
                     "marker": MARKERS[j % len(MARKERS)], "markersize": 4}
            yield Line(label, style, sub)


def _tells_apart(rows: pd.DataFrame, column: str, params: list[str]) -> bool:
    """Whether `column` is needed to tell `rows` apart: without it, two rows of one
    replication share every other parameter's value (a product grid's, not a zip's)."""
    rest = [c for c in params if c != column]
    return bool(rows.duplicated(subset=[*rest, "replication"]).any())


def _changes(rows: pd.DataFrame, column: str, params: list[str]) -> bool:
    """Whether one system's `rows` differ by `column` (a `systems[i]...` parameter): a run is
    deterministic, so a system it does not set gives the same metrics at each of its values.
    (Read from the system's place among the table's systems, a table of Orca's rows alone
    made Orca system 0 and drew one of its batch sizes.)"""
    rest = [*(c for c in params if c != column), "replication"]
    metrics = [c for c in rows.columns if c not in {*KEY_COLUMNS, *params}]
    # Within float noise alike: points run on another CPU (a Ray node) differ in last digits.
    alike = rows[metrics].apply(lambda col: col.map(_noise_free)
                                if pd.api.types.is_float_dtype(col) else col)
    keyed = pd.concat([rows[rest], alike], axis=1)
    return len(keyed.drop_duplicates()) > len(rows.drop_duplicates(rest))


def _noise_free(value: float) -> float:
    """`value` to 9 significant digits: compare's float noise (relative 1e-9) dropped."""
    return float(f"{value:.9g}")


# The last part of a parameter's path that says it sets the offered load: a rate, a trace's
# speed-up (the capacity search's knob for a trace), a closed loop's or sessions' population.
LOAD_KEYS = ("rate", "speedup", "num_clients", "concurrent_sessions")


def load_parameter(table: pd.DataFrame) -> str | None:
    """The swept parameter that sets the offered load: the first one naming a rate or
    another load knob (LOAD_KEYS); without one, every value of the load drew a point."""
    return next((c for c in param_columns(table)
                 if any(key in c.rsplit(".", 1)[-1] for key in LOAD_KEYS)), None)


def latency_vs_throughput(
    table: pd.DataFrame, metric: str = "normalized_latency_s_per_token_p50",
    slo: float | None = None, log_y: bool = True, along: str | None = None,
    title: str = "Latency against throughput",
) -> Figure:
    """The Orca figure (OSDI'22, Fig. 10): latency against achieved throughput.

    `table` is a tidy sweep table. Each point is the median over replications; one line
    per system (and per value of any swept parameter other than `along`). Each line runs
    along the swept parameter `along`, by default the load (see `load_parameter`).
    """
    _checked(table, ("system", "throughput_rps", metric, along), "the sweep table",
             text_ok=("system", along))
    if slo is not None and (not is_number(slo) or not 0 < slo < math.inf):
        # '0.05' raised "Unknown format code 'g'"; -1, 0 and NaN drew no line, unsaid.
        raise ValueError(f"slo = {slo!r}: expected a positive number, the bound on {metric} "
                         "in its unit, or None")
    load = along or load_parameter(table)
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.subplots()
    marked = False  # one legend entry for the saturation rings
    lowest = np.inf  # of the values drawn: a log axis cannot show 0 (queue delay at light load)
    for line in sweep_lines(table, (load,) if load else ()):
        # In load order: at saturation throughput stalls and sorting by it would zigzag.
        by = load or "point"
        med = line.rows.groupby(by)[["throughput_rps", metric]].median()
        med = med.sort_index() if load else med.sort_values("throughput_rps")
        ax.plot(med["throughput_rps"], med[metric], label=line.label, **line.style)
        lowest = min(lowest, float(med[metric].min()))
        if "saturated" in line.rows:  # any replication: a majority hid one of two
            unstable = line.rows.groupby(by)["saturated"].max().reindex(med.index) > 0
        if "saturated" in line.rows and unstable.any():
            ax.scatter(med.loc[unstable, "throughput_rps"], med.loc[unstable, metric],
                       s=70, facecolors="none", edgecolors="red", zorder=3,
                       label=SATURATED if not marked else None)
            marked = True
    if slo is not None:
        ax.axhline(slo, color="black", linestyle="--", linewidth=1,
                   label=f"SLO = {slo:g} {metric_unit(metric) or ''}".rstrip())
    if log_y and lowest <= 0:
        warnings.warn(f"{metric} reaches {lowest:g}, which a log axis cannot show: drawn on a "
                      "linear axis", UserWarning, stacklevel=2)
    elif log_y:
        ax.set_yscale("log")
        low, high = ax.get_ylim()
        # Down to a labelled value (1, 2 or 5 x 10^k): Orca's lines at 0.024 s/token sat
        # under the lowest label, 0.05, where only the 2x and 5x ticks are labelled.
        low = _labelled_floor(low)
        ax.set_ylim(low, high)
        _plain_log_labels(ax.yaxis, high / low)
    ax.set_xlabel(SWEEP_METRICS["throughput_rps"])
    ax.set_ylabel(metric_label(metric))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    ax.set_title(title)
    return fig


def _point_values(capacity: pd.DataFrame, point: int) -> str:
    """A configuration point's parameters as capacity.csv gives them (the columns between
    `point` and `system`), for a panel's title: ' (max_batch_size=8)'."""
    params = point_parameters(capacity)
    row = capacity[capacity["point"] == point] if params else None
    if row is None or row.empty:
        return ""
    names = param_names(params)  # whole paths where two last parts clash, as sweep_lines
    return " (" + ", ".join(f"{n}={row.iloc[0][k]}" for k, n in zip(params, names, strict=True)) + ")"


def _labelled_floor(value: float) -> float:
    """The largest 1, 2 or 5 x 10^k at or below `value` (> 0): a tick every log axis labels."""
    decade = 10.0 ** math.floor(math.log10(value))
    return max(step * decade for step in (1.0, 2.0, 5.0) if step * decade <= value * (1 + 1e-12))


def _plain_log_labels(axis: Axis, span: float) -> None:
    """A log axis's labels as numbers are written (0.04, 20), not 4x10^-2 or 2x10^1; minor
    labels help within a decade; over a few, only 2x and 5x; beyond, none."""
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(plain)
    axis.set_minor_formatter(plain if span < 10 else FuncFormatter(_two_and_five) if span < 1000
                             else NullFormatter())


def _two_and_five(value: float, _pos: int) -> str:
    leading = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if leading in (2, 5) else ""


def percentile_bands(
    table: pd.DataFrame, x: str, metrics: tuple[str, ...] | str = tuple(SWEEP_METRICS)
) -> Figure:
    """Metrics against the swept parameter `x`: the median over replications as a line and
    the 10th-90th percentile across replications as a band, one panel per metric (a name
    alone is one metric, not its letters)."""
    if isinstance(metrics, str):
        metrics = (metrics,)
    if not metrics:
        raise ValueError("metrics = (): expected at least one metric to plot")
    _checked(table, ("system", x, *metrics), "the sweep table", text_ok=("system", x))
    fig = Figure(figsize=(11, 3.2 * ((len(metrics) + 1) // 2) + 0.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots((len(metrics) + 1) // 2, 2, squeeze=False)).ravel()
    for ax, metric in zip(axes, metrics, strict=False):
        for line in sweep_lines(table, (x,)):
            q = line.rows.groupby(x)[metric].quantile([0.5, *(p / 100 for p in BAND_PERCENTILES)]).unstack()
            ax.plot(q.index, q[0.5], label=line.label, **line.style)
            ax.fill_between(q.index, q.iloc[:, 1], q.iloc[:, 2], alpha=0.15, color=line.style["color"])
        ax.set_xlabel(_parameter_label(x, param_columns(table)))
        ax.set_ylabel(metric_label(metric))
        ax.grid(alpha=0.3)
    for ax in axes[len(metrics):]:
        ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)), fontsize="small")
    lo, hi = BAND_PERCENTILES
    once = "replication" not in table or table["replication"].nunique() < 2
    fig.suptitle("One replication per point: no band across replications" if once else
                 f"Median over replications, band: p{lo}-p{hi} across replications")
    return fig


def _parameter_label(x: str, params: list[str]) -> str:
    """A swept parameter's axis label: PARAMETER_LABELS' by its last part, unless another
    parameter's path ends alike (systems[0] and systems[1]'s max_batch_size): its whole path."""
    name = dict(zip(params, param_names(params), strict=True)).get(x, x.rsplit(".", 1)[-1])
    return PARAMETER_LABELS.get(name, x)


def sweep_figures(table: pd.DataFrame, slo: float | None = None) -> dict[str, Figure]:
    """The standard figures of a sweep, by file stem."""
    _checked(table, ("system",), "the sweep table")
    figures = {"latency_vs_throughput": latency_vs_throughput(table, slo=slo)}
    params = param_columns(table)
    for x, name in zip(params, param_names(params), strict=True):  # one figure each
        figures[f"bands_{name}"] = percentile_bands(table, x)
    return figures


def scenario_sweep_figures(table: pd.DataFrame, parameter: str, title: str,
                           slo: float | None = None) -> dict[str, Figure]:
    """The figure of a scenario's own `sweep:` block (`orcasim run`): latency against
    throughput, one line per system along the swept `parameter`, named as a sweep's."""
    return {"latency_vs_throughput": latency_vs_throughput(table, slo=slo, along=parameter, title=title)}


def frames_figures(requests: pd.DataFrame, iterations: pd.DataFrame,
                   saturated: frozenset[str] = frozenset(),
                   clusters: Mapping[str, Sequence[tuple[Any, ...]]] | None = None,
                   warmup_s: float = 0.0,
                   pipelined: Mapping[str, Collection[tuple[Any, ...]]] | None = None,
                   ) -> dict[str, Figure]:
    """The standard figures of one run from its frames (each with a `system` column), and
    each cluster's per-replica load (`replicas_<system>`), for the systems in `clusters`
    (each with its instances' keys, `instance_keys`, and its pipelined replicas',
    `pipelined_keys`, in `pipelined`)."""
    figures = {"latency_cdf": latency_cdfs(requests, saturated, warmup_s),
               "timelines": timelines(iterations)}
    for name, instances in (clusters or {}).items():
        mine = iterations[iterations["system"] == name].drop(columns="system")
        if "replica" not in mine or mine["replica"].isna().any():  # a hand-edited folder
            raise FigureInputError(f"the iterations table of cluster {name} has rows without a "
                                   "'replica'; expected every row's replica, as orcasim writes it")
        # Concatenated beside a plain system's rows, the replica column turned float (NaN
        # there): 'replica 0.0' in the legend.
        if "replica" in mine:
            mine = mine.astype({"replica": np.int64})
        piped = (pipelined or {}).get(name, ())
        own = requests[requests["system"] == name] if piped else None
        figures[f"replicas_{name}"] = replica_load(mine.reset_index(drop=True), name,
                                                   instances=instances, requests=own,
                                                   pipelined=piped)
    return figures


def instance_keys(replicas: pd.DataFrame) -> list[tuple[Any, ...]]:
    """A cluster's instances, from its per-replica table (`replicas.csv`, or its frame):
    (replica,) each, or (pool, replica) for a disaggregated one."""
    table = replicas.reset_index() if "replica" not in replicas.columns else replicas
    columns = ["pool", "replica"] if "pool" in table.columns else ["replica"]
    return [tuple(row) for row in table[columns].itertuples(index=False, name=None)]


def pipelined_keys(replicas: pd.DataFrame) -> list[tuple[Any, ...]]:
    """A colocated cluster's replicas that run Orca on several pipeline stages, from its
    per-replica table: (replica,) each (their load is counted from their requests,
    `replica_load`). A disaggregated cluster's none: its requests table does not say which
    pool's instance scheduled a request when."""
    table = replicas.reset_index() if "replica" not in replicas.columns else replicas
    if "pool" in table.columns or not {"pipeline_parallel", "scheduler"} <= set(table.columns):
        return []
    piped = (table["pipeline_parallel"] > 1) & (table["scheduler"] == "iteration_level")
    return [(row,) for row in table.loc[piped, "replica"]]


def run_figures(result: RunResult) -> dict[str, Figure]:
    """The standard figures of one run, by file stem."""
    if not isinstance(result, RunResult):  # None raised "'NoneType' has no attribute 'systems'"
        raise TypeError(f"result = {result!r:.80} ({type(result).__name__}): expected a "
                        "RunResult, as orcasim.run_scenario returns")
    reqs = pd.concat([r.requests.assign(system=n) for n, r in result.systems.items()])
    iters = pd.concat([r.iterations.assign(system=n) for n, r in result.systems.items()])
    unstable = frozenset(n for n, r in result.systems.items() if r.summary.get("saturated"))
    clusters = {n: instance_keys(r.replicas) for n, r in result.systems.items()
                if r.replicas is not None}
    pipelined = {n: pipelined_keys(r.replicas) for n, r in result.systems.items()
                 if r.replicas is not None}
    return frames_figures(reqs, iters, unstable, clusters, result.scenario.warmup_s, pipelined)


def attainment_vs_rate(evaluations: pd.DataFrame, capacity: pd.DataFrame, attainment: float,
                       title: str = "SLO attainment against offered rate") -> Figure:
    """Every rate the capacity search tried: attainment per system (one panel per
    configuration point; filled where the rate passed, hollow where it failed), the
    attainment target as a line, each system's capacity as a dashed vertical line; red rings
    mark saturated runs, which fail whatever their attainment."""
    # A hand-edited folder: a KeyError deep in pandas, or text drawn as categories.
    _checked(evaluations, ("point", "rate_per_s", "passes", "slo_attainment", "saturated", "system"),
             "the evaluations table", empty_ok=True)
    _checked(capacity, ("point", "max_rate_per_s", "system"), "the capacity table", empty_ok=True)
    points = sorted(evaluations["point"].unique()) if len(evaluations) else [0]
    fig = Figure(figsize=(8, 4.5 * len(points)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(points), 1, squeeze=False)[:, 0])
    # A system's colour is its place in the scenario (the capacity table's order), as in
    # every other figure, not the order its evaluations finished in.
    order = list(dict.fromkeys([*capacity["system"], *evaluations["system"]]))
    for ax, point in zip(axes, points, strict=True):
        rows = evaluations[evaluations["point"] == point]
        for system, sub in sorted(rows.groupby("system", sort=False), key=lambda g: order.index(g[0])):
            sub = sub.sort_values("rate_per_s")
            color = f"C{order.index(system) % 10}"
            passed = sub["passes"] > 0
            ax.scatter(sub.loc[passed, "rate_per_s"], sub.loc[passed, "slo_attainment"], s=18,
                       color=color, alpha=0.8, label=f"{system} (filled: passes)")
            # Hollow: failed (SLO missed, saturated, or at or above the measured throughput).
            ax.scatter(sub.loc[~passed, "rate_per_s"], sub.loc[~passed, "slo_attainment"], s=18,
                       facecolors="none", edgecolors=color, alpha=0.8)
            unstable = sub[sub["saturated"] > 0]
            ax.scatter(unstable["rate_per_s"], unstable["slo_attainment"], s=70,
                       facecolors="none", edgecolors="red", zorder=3)
            cap = capacity[(capacity["point"] == point) & (capacity["system"] == system)]
            if len(cap) and cap["max_rate_per_s"].iloc[0] > 0:
                ax.axvline(cap["max_rate_per_s"].iloc[0], color=color, linestyle="--", linewidth=1)
        if len(rows) and (rows["saturated"] > 0).any():
            ax.scatter([], [], s=70, facecolors="none", edgecolors="red", label=SATURATED)
        ax.axhline(attainment, color="black", linestyle=":", linewidth=1,
                   label=f"attainment target {attainment:g}")
        ax.set_xscale("log")
        # A capacity planner read the rates tried, 8 to 32 req/s, off ticks at 10^1, 2x10^1
        # and 3x10^1.
        low, high = ax.get_xlim()
        _plain_log_labels(ax.xaxis, high / low)
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel("share of requests within every SLO")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize="small")
        ax.set_title(title if len(points) == 1 else f"{title}: point {point}{_point_values(capacity, point)}")
    return fig


def cost_latency_pareto(table: pd.DataFrame, front: pd.DataFrame, latency: str,
                        title: str = "Cost against latency at capacity") -> Figure:
    """Each configuration at its capacity: cost per million output tokens against a latency;
    the Pareto front joined by a line."""
    for frame, what in ((table, "the capacity table"), (front, "the Pareto front")):
        _checked(frame, ("cost_per_million_tokens", latency), what, empty_ok=True)
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.subplots()
    finite = np.isfinite(table["cost_per_million_tokens"]) & np.isfinite(table[latency])
    shown = table[finite]
    for i, (system, rows) in enumerate(shown.groupby("system", sort=False)):
        ax.scatter(rows[latency], rows["cost_per_million_tokens"], color=f"C{i % 10}", s=25,
                   label=str(system))
    ax.plot(front[latency], front["cost_per_million_tokens"], color="black", linewidth=1,
            marker="o", markerfacecolor="none", markersize=9, label="Pareto front")
    metric = latency.removesuffix("_at_capacity").removeprefix("slo_")
    unit = "s/token" if metric.startswith("normalized_latency") else "s"
    ax.set_xlabel(f"{metric} at capacity ({unit})")
    ax.set_ylabel("cost per million output tokens (USD)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(title)
    if hidden := int((~finite).sum()):  # no price, or no rate met the SLO: said, not vanished
        fig.text(0.01, 0.005, f"not shown: {hidden} of {len(table)} configurations without a "
                 "cost or a latency at capacity (see capacity.csv)", fontsize="small")
    return fig
