"""The sweep table's answers by hand: `tidy_table`, `keeps_up` and `throughput_under_bound`
on tables written out here, each row chosen so that one rule decides it.

Mutation testing (`make mutate SCOPE=sweeps`) found these rules unpinned: the bound met
exactly, a bound of 0 accepted, a custom sustain fraction dropped, the answered share
computed from completed less rejected (or times, not over, the measured count), a row with
nothing measured read as NaN or as twice its offered load, and the table's point,
replication and seed columns renamed, all with no test failing.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from orcasim.config import ScenarioError
from orcasim.sweeps import (
    keeps_up,
    make_sweep,
    run_sweep_in_memory,
    throughput_under_bound,
    tidy_table,
)
from orcasim.sweeps.table import MEDIAN_LATENCY, THROUGHPUT
from orcasim.sweeps.task import Outcome
from tests.test_capacity_edges import MD1


def test_the_tidy_table_is_one_row_per_point_replication_and_system_in_order() -> None:
    def outcome(point: int, replication: int, seed: int) -> Outcome:
        return Outcome(id=f"p{point:04d}-r{replication:02d}", point=point, replication=replication,
                       seed=seed, params={"x": 10 * point}, ok=True,
                       systems={"b": {"m": point + 0.5}, "a": {"m": -1.0}})

    # Finished out of order: the table is sorted by point, then replication; within a
    # task, the scenario's system order (b before a), not the alphabet.
    table = tidy_table([outcome(1, 0, 7), outcome(0, 1, 9), outcome(0, 0, 7)])
    assert table.columns.tolist() == ["point", "replication", "seed", "x", "system", "m"]
    assert table.values.tolist() == [
        [0, 0, 7, 0, "b", 0.5], [0, 0, 7, 0, "a", -1.0],
        [0, 1, 9, 0, "b", 0.5], [0, 1, 9, 0, "a", -1.0],
        [1, 0, 7, 10, "b", 1.5], [1, 0, 7, 10, "a", -1.0],
    ]


def test_keeps_up_counts_only_the_answered_share_of_the_offered_load() -> None:
    # Offered 10 req/s each. Answered share = 1 - rejected / (completed + rejected), 1 with
    # nothing measured; a row keeps up when served >= 0.9 x offered x share.
    table = pd.DataFrame({
        THROUGHPUT: [9.0, 6.0, 1.0, 15.0, 1.0, 1.0],
        "offered_rps": [10.0] * 6,
        "served_rps": [9.0, 6.0, 1.0, 15.0, 1.0, 1.0],
        "requests_completed": [100, 50, 50, 0, 0, 0],
        "requests_rejected": [0, 50, 50, 0, 0, 1],
    })
    assert keeps_up(table).tolist() == [
        True,   # 9 >= 0.9 x 10
        True,   # half answered: 6 >= 0.9 x 5
        False,  # 1 < 0.9 x 5
        True,   # nothing measured: share 1, 15 >= 9
        False,  # nothing measured: share 1, 1 < 9
        True,   # the one request turned away: nothing answered is owed, 1 >= 0
    ]
    # A sustain fraction of 0.1 is the caller's: row 2 keeps up at 1 >= 0.1 x 5.
    assert keeps_up(table, sustain_fraction=0.1).tolist() == [True] * 6
    # Without the counts, every request offered counts: only row 0 and row 3 keep up.
    bare = table.drop(columns=["requests_completed", "requests_rejected"])
    assert keeps_up(bare).tolist() == [True, False, False, True, False, False]


def test_a_row_flagged_saturated_does_not_keep_up() -> None:
    # Each served 9.5 of 10 offered, within the 0.9; the second's queue grew past chance.
    table = pd.DataFrame({THROUGHPUT: [9.5] * 2, "offered_rps": [10.0] * 2, "served_rps": [9.5] * 2,
                          "saturated": [0.0, 1.0]})
    assert keeps_up(table).tolist() == [True, False]
    # A table written before the flag reads by the fraction alone.
    assert keeps_up(table.drop(columns="saturated")).tolist() == [True, True]


def md1_sweep(tmp_path: Path, rates_per_s: list[float], num_requests: int) -> pd.DataFrame:
    """An M/D/1 server of 10 req/s (tests.test_capacity_edges.MD1) swept over the rates."""
    base = tmp_path / "md1.yaml"
    base.write_text(yaml.safe_dump(MD1))
    sweep = make_sweep(base, {"workload.arrival.rate_per_s": rates_per_s},
                       overrides=[f"workload.num_requests={num_requests}"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # saturated at 11 req/s: that is the point
        return run_sweep_in_memory(sweep, workers=1).table


def test_a_row_over_capacity_fails_where_the_run_is_long_enough_to_tell(tmp_path: Path) -> None:
    """At 1.1 times the server's rate its completions while requests arrive are the server's
    10 req/s, 0.92 of the load, within the 0.9: the sweep answered the overloaded row. Over
    3,000 requests its waiting queue's growth is past chance (z 3.6), and the row fails."""
    table = md1_sweep(tmp_path, [8.5, 11.0], 3000)
    over = table.iloc[1]
    assert over["served_rps"] >= 0.9 * over["offered_rps"] and over["saturated"] == 1.0
    assert keeps_up(table).tolist() == [True, False]
    best = throughput_under_bound(table, 1e3)
    assert best["rl"] == table.iloc[0][THROUGHPUT] < 8.6


def test_a_row_at_085_of_capacity_keeps_up_in_a_short_run(tmp_path: Path) -> None:
    """300 requests at 8.5 req/s: served within a few percent of the load (0.969 at the
    lowest of 20 seeds), not saturated."""
    table = md1_sweep(tmp_path, [8.5], 300)
    assert table["saturated"].tolist() == [0.0] and keeps_up(table).tolist() == [True]


def bound_table() -> pd.DataFrame:
    return pd.DataFrame({
        "system": ["b", "b", "a", "a", "c"],
        MEDIAN_LATENCY: [0.5, 0.6, 0.1, 0.2, 0.9],
        THROUGHPUT: [4.0, 8.0, 3.0, 1.0, 5.0],
        "offered_rps": [4.0, 8.0, 4.0, 1.0, 5.0],
        "served_rps": [4.0, 8.0, 3.0, 1.0, 5.0],
    })


def test_throughput_under_a_bound_met_exactly_by_hand() -> None:
    # b: 4 req/s at exactly the bound counts, 8 req/s over it does not; a: 3 req/s falls
    # behind (3 < 0.9 x 4), 1 req/s qualifies; c never meets the bound. Systems in the
    # table's order.
    best = throughput_under_bound(bound_table(), 0.5)
    assert best.index.tolist() == ["b", "a", "c"]
    assert best.tolist()[:2] == [4.0, 1.0] and np.isnan(best["c"])
    assert best.dtype == np.float64
    # With a sustain fraction of 0.5, a's 3 req/s keeps up (3 >= 2).
    assert throughput_under_bound(bound_table(), 0.5, sustain_fraction=0.5)["a"] == 3.0


@pytest.mark.parametrize("bound_s", [0.0, -1.0, float("nan"), "0.5"])
def test_a_bound_that_is_not_a_positive_number_is_refused(bound_s: object) -> None:
    with pytest.raises(ScenarioError, match=r"bound_s = .*: expected a positive number of "
                                            r"seconds per token \(the median normalized "
                                            r"latency's bound\)$"):
        throughput_under_bound(bound_table(), bound_s)  # type: ignore[arg-type]
