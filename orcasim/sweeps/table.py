"""The tidy sweep table: one row per (point, system, replication)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from orcasim.columns import param_columns
from orcasim.config import ScenarioError, is_number
from orcasim.metrics import SUSTAIN_FRACTION, keeps_up_with
from orcasim.sweeps.task import Outcome

THROUGHPUT = "throughput_rps"
SERVED = "served_rps"  # orcasim.metrics.served_rps: what the keeps-up test compares
SATURATED = "saturated"  # the run's queue-growth flag (orcasim.saturation), also read there
MEDIAN_LATENCY = "normalized_latency_s_per_token_p50"


def tidy_table(outcomes: list[Outcome]) -> pd.DataFrame:
    """Parameters (by dotted path) and summary metrics as columns, sorted by point,
    replication, then the scenario's system order, so that it never depends on which
    task finished first."""
    rows = []
    for o in sorted(outcomes, key=lambda o: (o.point, o.replication)):
        for system, summary in o.systems.items():
            rows.append({"point": o.point, "replication": o.replication, "seed": o.seed,
                         **o.params, "system": system, **summary})
    return pd.DataFrame(rows)


def throughput_under_bound(
    table: pd.DataFrame, bound_s: float, sustain_fraction: float = SUSTAIN_FRACTION
) -> pd.Series:
    """Per system, the highest throughput it sustains with median normalized latency within the bound.

    A row counts when its median meets the bound and the system keeps up with the load
    (`keeps_up`: its completions while requests arrive, `served_rps`, at least
    sustain_fraction x the realised arrival rate, `offered_rps`, and not `saturated`): a
    finite run of an overloaded system can keep a low median for a while, but it does not
    sustain that load. Where a run is too short to
    say (`served_rps` NaN), or the table has no such column, its throughput stands in. A
    measured row, not an interpolation: the sweep's grid sets the resolution (with
    replications, each one counts on its own). NaN when no row qualifies.
    """
    _check_sweep_table(table, ("system", MEDIAN_LATENCY, THROUGHPUT, "offered_rps"))
    if not is_number(bound_s) or not bound_s > 0:
        raise ScenarioError(f"bound_s = {bound_s!r}: expected a positive number of seconds per "
                            "token (the median normalized latency's bound)")
    _warn_mixed_configurations(table)
    ok = table[(table[MEDIAN_LATENCY] <= bound_s) & keeps_up(table, sustain_fraction)]
    best = ok.groupby("system", sort=False)[THROUGHPUT].max()
    return best.reindex(table["system"].unique()).astype(np.float64)


def keeps_up(table: pd.DataFrame, sustain_fraction: float = SUSTAIN_FRACTION) -> pd.Series:
    """Per row, whether the system kept up with the load it was offered: its completions
    while requests arrived (`served_rps`; its throughput where that is NaN or the table has
    none) at least `sustain_fraction` of the realised arrival rate (`offered_rps`), and the
    run not flagged `saturated` (where the table has the flag). The one rule that
    `throughput_under_bound` and any report of a sweep's grid read.

    A server past its full-load rate completes at that rate, so the fraction alone passes a
    load up to 1 / 0.9 = 1.11 times it, however long the run: an M/D/1 server of 10 req/s
    at 11 req/s passed in 16 of 20 runs of 3,000 requests, where at 9.5 req/s none read
    below 0.987 of its load. The waiting queue's growth test (orcasim.saturation) tells an
    overload of 1 - 1/rho > 3 / sqrt(0.75 n) over n requests, finer than the fraction's 0.1
    past 1,200 requests, and flagged 14 of those 16. In shorter runs neither tells: over 300
    requests a paged server at 0.85 of its full-load rate read down to 0.86 of its load,
    and at 1.1 times it up to 0.98 (README, Sweeps), so the 0.9 serves short runs."""
    _check_sweep_table(table, (THROUGHPUT, "offered_rps"))
    # No rate offered (every request sent at once at the start: a closed loop with as many
    # clients as requests) is nothing to fall behind.
    offered = table["offered_rps"] * answered_share(table)
    served = table[SERVED].fillna(table[THROUGHPUT]) if SERVED in table else table[THROUGHPUT]
    kept = keeps_up_with(offered, served, sustain_fraction)
    # The capacity search fails a saturated run too (orcasim.saturation.behind_at_constant_rate);
    # a table from before the flag was written reads as before.
    return kept & ~(table[SATURATED] > 0) if SATURATED in table else kept


def _check_sweep_table(table: pd.DataFrame, columns: tuple[str, ...]) -> None:
    """A ScenarioError for a table without the sweep columns read: a run's `summary_frame()`
    (its systems in the index, no `offered_rps`) raised KeyError 'offered_rps' inside."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ScenarioError(f"table: no column {', '.join(map(repr, missing))}; expected a sweep's "
                            "tidy table (sweep.csv, or run_sweep_in_memory(...).table), not a "
                            "run's summary_frame()")


def answered_share(table: pd.DataFrame) -> pd.Series | float:
    """Per row, the share of its measured requests not turned away as never fitting (1
    without the counts): a rejected request is no load a server falls behind on, and counted
    as offered, a paged server at 2 req/s that rejected 130 of 400 completed 0.67 of its
    arrival rate and failed the keeps-up test at any load."""
    if not {"requests_completed", "requests_rejected"} <= set(table.columns):
        return 1.0
    measured = table["requests_completed"] + table["requests_rejected"]
    return (1.0 - table["requests_rejected"] / measured).where(measured > 0, 1.0)


def _warn_mixed_configurations(table: pd.DataFrame) -> None:
    """A grid of the load and another parameter (rate x batch size) gives each system its
    best over every configuration, without saying which: orca's 5.86 req/s on rate_x_batch
    was batch 16's, beside 3.82 and 5.70 at 4 and 8 (a tester's finding)."""
    params = param_columns(table) if {"seed", "system"} <= set(table.columns) else []
    varying = [p for p in params if table[p].astype(str).nunique() > 1]
    if len(varying) > 1:
        warnings.warn(f"throughput_under_bound: the table varies {', '.join(varying)}: each "
                      "system's answer is its best over every configuration of them; pass the "
                      "rows of one configuration to read its own", UserWarning, stacklevel=3)
