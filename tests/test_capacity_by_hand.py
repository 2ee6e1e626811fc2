"""The capacity search's pure arithmetic by hand: the bracket and the bisection (every rate
it tries, in order), the measured throughput a stable rate stays below, and the interval the
answer is reported with. No simulation runs: each test takes milliseconds, so the mutation
scope `capacity` (quality/scopes.toml) can run it once per mutant (tests/test_capacity.py
and test_capacity_edges.py run the search end to end and take minutes)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import orcasim.capacity as cap
from orcasim.saturation import SATURATION_Z


def _threshold(tried: list[float], ok: object) -> object:
    def passes(rate: float) -> bool:
        tried.append(rate)
        return bool(ok(rate))  # type: ignore[operator]
    return passes


# --- bracket and bisection ----------------------------------------------------------------

def test_narrowing_tries_geometric_midpoints_until_within_the_tolerance() -> None:
    tried: list[float] = []
    low, high = cap._narrow(2.0, 8.0, _threshold(tried, lambda r: r <= 3.0), 0.1)  # type: ignore[arg-type]
    # 4 fails, sqrt(2 * 4) passes, then sqrt(2.83 * 4) and sqrt(2.83 * 3.36) fail: 3.08 / 2.83
    # = 1.09 is within 1.1.
    m1 = 4.0
    m2 = math.sqrt(2.0 * m1)
    m3 = math.sqrt(m2 * m1)
    m4 = math.sqrt(m2 * m3)
    assert tried == pytest.approx([m1, m2, m3, m4], rel=1e-15)
    assert (low, high) == pytest.approx((m2, m4), rel=1e-15)


def test_narrowing_stops_at_exactly_the_tolerance_and_without_a_bracket() -> None:
    tried: list[float] = []
    passes = _threshold(tried, lambda r: True)
    assert cap._narrow(1.0, 1.5, passes, 0.5) == (1.0, 1.5)  # type: ignore[arg-type]
    assert cap._narrow(0.0, 4.0, passes, 0.1) == (0.0, 4.0)  # type: ignore[arg-type]
    assert cap._narrow(2.0, math.inf, passes, 0.1) == (2.0, math.inf)  # type: ignore[arg-type]
    assert tried == []
    # Neighbouring floats: nothing lies between, and the loop ends.
    after = math.nextafter(1.0, 2.0)
    assert cap._narrow(1.0, after, passes, 0.0) == (1.0, after)  # type: ignore[arg-type]
    assert tried == []


def test_doubling_and_halving_by_hand() -> None:
    tried: list[float] = []
    assert cap._double(1.0, _threshold(tried, lambda r: r <= 5.0)) == (4.0, 8.0)  # type: ignore[arg-type]
    assert tried == [2.0, 4.0, 8.0]
    tried.clear()
    assert cap._double(1.0, _threshold(tried, lambda r: True)) == (1024.0, math.inf)  # type: ignore[arg-type]
    assert tried == [2.0 ** k for k in range(1, 11)]
    tried.clear()
    assert cap._halve(5.0, _threshold(tried, lambda r: r <= 1.0)) == (0.625, 1.25)  # type: ignore[arg-type]
    assert tried == [2.5, 1.25, 0.625]
    tried.clear()
    assert cap._halve(5.0, _threshold(tried, lambda r: False)) == (0.0, 5.0 / 1024)  # type: ignore[arg-type]
    assert tried == [5.0 / 2 ** k for k in range(1, 11)]


def test_the_bracket_goes_down_then_up_from_a_failing_start() -> None:
    tried: list[float] = []
    assert cap._bracket(3.0, _threshold(tried, lambda r: r <= 5.0)) == (3.0, 6.0)  # type: ignore[arg-type]
    assert tried == [3.0, 6.0]
    tried.clear()
    assert cap._bracket(5.0, _threshold(tried, lambda r: r <= 2.0)) == (1.25, 2.5)  # type: ignore[arg-type]
    assert tried == [5.0, 2.5, 1.25]
    tried.clear()
    # Nothing below 5 passes: 10, 20, 40 are tried, then doubled from 40.
    assert cap._bracket(5.0, _threshold(tried, lambda r: 40.0 <= r <= 100.0)) == (80.0, 160.0)  # type: ignore[arg-type]
    assert tried == [5.0, *(5.0 / 2 ** k for k in range(1, 11)), 10.0, 20.0, 40.0, 80.0, 160.0]
    tried.clear()
    assert cap._bracket(5.0, _threshold(tried, lambda r: False)) == (0.0, 5.0 / 1024)  # type: ignore[arg-type]
    assert tried[-1] == 5.0 * 1024 and len(tried) == 21


def test_a_passing_rate_at_the_measured_throughput_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs above 6 req/s saturate and admit 5 req/s; every run up to 6 meets the SLO. The
    search measures 5 / 1.02 as the limit, refuses what passed at or above it, and narrows
    below it to the tolerance."""
    def evaluate(job: cap.SearchJob, rate: float) -> dict[str, float]:
        saturated = rate > 6
        return {"rate_per_s": rate, "passes": float(not saturated),
                "full_load_rps": 5.0 if saturated else math.nan}

    monkeypatch.setattr(cap, "evaluate", evaluate)
    knob = cap.RateKnob("workload.arrival.rate_per_s", 1.0, 1.0)
    job = cap.SearchJob(0, "s", 0, 1, {}, {}, ".", knob, cap.SearchSettings())
    low, high, rows = cap._bisect(job)
    limit = 5.0 / 1.02
    assert [r["rate_per_s"] for r in rows[:4]] == [1.0, 2.0, 4.0, 8.0]
    assert low < limit and high <= limit and high / low <= 1.02
    assert low > limit / 1.02 ** 2
    assert all(r["passes"] == float(r["rate_per_s"] < limit) for r in rows)


# --- the measured throughput ---------------------------------------------------------------

def test_the_service_rate_is_admissions_pooled_over_the_runs_windows() -> None:
    rows = [{"rate_per_s": 10.0, "full_load_rps": 8.0}, {"rate_per_s": 20.0, "full_load_rps": 9.0},
            {"rate_per_s": 0.0, "full_load_rps": 100.0}, {"rate_per_s": 5.0, "full_load_rps": 0.0},
            {"rate_per_s": 5.0, "full_load_rps": math.nan},
            {"rate_per_s": 5.0, "full_load_rps": math.inf}]
    # (8 / 10 + 9 / 20) / (1 / 10 + 1 / 20)
    assert cap.service_rate(rows) == pytest.approx(1.25 / 0.15, rel=1e-15)
    assert cap.service_rate(rows[2:]) == math.inf
    assert cap.stable_limit(rows, 0.01) == pytest.approx(1.25 / 0.15 / 1.01, rel=1e-15)
    assert cap.stable_limit(rows, 0.3) == pytest.approx(1.25 / 0.15 / 1.02, rel=1e-15)
    assert cap.stable_limit([], 0.01) == math.inf


def test_a_run_without_full_load_reads_its_admissions_where_its_queue_grew() -> None:
    assert cap._full_load({"full_load_rps": 3.0, "saturation_admission_rps": 9.0,
                           "saturation_z": 100.0}) == 3.0
    grown = {"saturation_admission_rps": 9.0, "saturation_z": SATURATION_Z + 0.01}
    assert cap._full_load(grown) == 9.0
    assert math.isnan(cap._full_load({**grown, "saturation_z": SATURATION_Z}))
    assert math.isnan(cap._full_load({"saturation_admission_rps": 9.0}))


def test_completed_rps_is_the_highest_finite_positive_completion_rate() -> None:
    rows = [{"throughput_rps": v} for v in (math.nan, 0.0, -1.0, math.inf, 3.0, 7.0)]
    assert cap.completed_rps([*rows, {}]) == 7.0
    assert cap.completed_rps(rows[:4]) == math.inf


def test_the_full_load_of_an_equal_share_fleet_is_its_slowest_group_times_its_size() -> None:
    summary = {"saturated": 1.0, "saturation_admission_rps": 30.0}
    replicas = pd.DataFrame({"saturated": [0, 0, 1, 0], "group": ["a", "a", "b", "b"],
                             "saturation_admission_rps": [4.0, 6.0, 8.0, 9.0]})
    # Group b fell behind: 4 replicas at its mean admission rate, 8.5.
    assert cap.full_load_rps(summary, replicas, True) == 4 * 8.5
    assert cap.full_load_rps(summary, replicas, False) == 30.0
    assert cap.full_load_rps(summary, replicas.assign(saturated=0), True) == 30.0
    assert cap.full_load_rps(summary, replicas.drop(columns="saturated"), True) == 30.0
    assert cap.full_load_rps(summary, None, True) == 30.0
    assert math.isnan(cap.full_load_rps({**summary, "saturated": 0.0}, None, True))
    both = replicas.assign(saturated=[1, 0, 0, 1])
    assert cap.full_load_rps(summary, both, True) == 4 * 5.0  # the lower group's mean


def test_a_run_that_fell_behind_without_a_grown_queue_reads_its_completions() -> None:
    assert cap._full_load_or_served(math.nan, 6.75, kept=False, admitted=False) == 6.75
    assert math.isnan(cap._full_load_or_served(math.nan, 6.75, kept=True, admitted=False))
    assert cap._full_load_or_served(7.0, 6.75, kept=False, admitted=True) == 7.0
    assert math.isnan(cap._full_load_or_served(math.nan, 6.75, kept=False, admitted=True))


# --- the interval ----------------------------------------------------------------------------

def test_t_quantiles_from_the_table_and_past_it() -> None:
    assert cap.t_quantile_975(1) == 12.7062047
    assert cap.t_quantile_975(2) == 4.30265273
    n = len(cap.T_975)
    assert cap.t_quantile_975(n) == cap.T_975[-1]
    for df in (n + 1, n + 7, 200):
        # The expansion's own error is 1.75e-6 at df 31, where it takes over, and falls after.
        assert cap.t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-6), df


def test_the_interval_of_three_rates_by_hand() -> None:
    low, high = cap.t_interval(np.array([1.0, 2.0, 3.0]))  # mean 2, sd 1
    half = 4.30265273 / math.sqrt(3)
    assert (low, high) == pytest.approx((2 - half, 2 + half), rel=1e-12)
    assert cap.rate_interval(np.array([1.0, 2.0, 3.0])) == pytest.approx((0.0, 2 + half))
    assert cap.rate_interval(np.array([1.0, 2.0, 3.0]), ceiling=3.5) == pytest.approx((0.0, 3.5))
    assert cap.rate_interval(np.array([3.0, 4.0, 5.0])) == pytest.approx((4 - half, 4 + half))


def test_the_intervals_upper_end_is_the_failing_rates_where_higher() -> None:
    rates = np.array([3.0, 4.0, 5.0])
    half = 4.30265273 / math.sqrt(3)
    fails = np.array([9.0, 10.0, 11.0])
    assert cap.rate_interval(rates, fails=fails)[1] == pytest.approx(10 + half)
    assert cap.rate_interval(rates, fails=fails - 8.0)[1] == pytest.approx(4 + half)
    assert cap.rate_interval(rates, fails=np.array([9.0, math.inf, 11.0]))[1] == math.inf
    assert cap.rate_interval(rates, 20.0, np.array([9.0, math.inf, 11.0]))[1] == 20.0
    # One failing rate has no interval: the rates' own.
    assert cap.rate_interval(rates, fails=np.array([math.inf]))[1] == pytest.approx(4 + half)
    assert all(math.isnan(v) for v in cap.rate_interval(np.array([2.0])))


def test_the_measured_limit_is_the_median_of_the_searches_that_saturated() -> None:
    def outcome(*full_loads: float) -> SimpleNamespace:
        return SimpleNamespace(evaluations=[{"rate_per_s": 10.0, "full_load_rps": f}
                                            for f in full_loads])
    group: list[Any] = [outcome(5.1), outcome(), outcome(4.08), outcome(6.12)]
    assert cap.measured_limit(group, 0.02) == pytest.approx(5.1 / 1.02)
    none: list[Any] = [outcome(), outcome()]
    assert cap.measured_limit(none, 0.02) == math.inf


# --- found by the mutation run of `capacity` (quality/README.md) ---------------------------

def _server(throughput_rps: float, slo_up_to: float, saturates_above: float):  # noqa: ANN202
    """A stand-in for `evaluate`: runs above `saturates_above` saturate, admitting
    `throughput_rps`; runs up to `slo_up_to` meet the SLO. Records the job it was given."""
    jobs: list[object] = []

    def evaluate(job: cap.SearchJob, rate: float) -> dict[str, float]:
        jobs.append(job)
        saturated = rate > saturates_above
        return {"rate_per_s": rate, "passes": float(rate <= slo_up_to),
                "full_load_rps": throughput_rps if saturated else math.nan}
    return evaluate, jobs


def _job(start: float) -> cap.SearchJob:
    knob = cap.RateKnob("workload.arrival.rate_per_s", 1.0, start)
    return cap.SearchJob(0, "s", 0, 1, {}, {}, ".", knob, cap.SearchSettings())


def test_the_search_tries_the_bracket_then_narrows_below_the_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """From 1: 1, 2, 4 pass, 8 fails (saturated at 5 req/s), then sqrt(4 * 8) passes the SLO
    but lies above the measured limit 5 / 1.02, which the search refuses afterwards."""
    evaluate, jobs = _server(5.0, 6.0, 6.0)
    monkeypatch.setattr(cap, "evaluate", evaluate)
    job = _job(1.0)
    low, high, rows = cap._bisect(job)
    assert [r["rate_per_s"] for r in rows[:5]] == pytest.approx([1.0, 2.0, 4.0, 8.0, math.sqrt(32)])
    assert all(j is job for j in jobs)
    assert all(set(r) == {"rate_per_s", "passes", "full_load_rps"} for r in rows)
    assert rows[4]["passes"] == 0.0  # passed the SLO, refused as at or above the limit
    assert low < 5.0 / 1.02 and high <= 5.0 / 1.02


def test_a_search_from_far_above_halves_down_from_the_measured_throughput(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """From 1e4 req/s nothing passes down to 1e4 / 1024 (every run saturates at 5 req/s)
    nor up: the search halves again from 5 / 1.02, where 2.45 passes."""
    evaluate, _ = _server(5.0, 6.0, 6.0)
    monkeypatch.setattr(cap, "evaluate", evaluate)
    low, high, rows = cap._bisect(_job(1e4))
    tried = [r["rate_per_s"] for r in rows]
    limit = 5.0 / 1.02
    assert tried[:21] == pytest.approx([1e4, *(1e4 / 2 ** k for k in range(1, 11)),
                                        *(1e4 * 2 ** k for k in range(1, 11))])
    assert tried[21] == pytest.approx(limit / 2)
    assert limit / 1.02 <= low < limit and high <= limit and high / low <= 1.02


def test_a_search_that_never_saturates_halves_from_the_completion_rate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No run saturates (no full-load rate), none passes from 1e4 down or up; the runs
    completed at up to 3.5 req/s: halved from there, 1.75 passes and the answer is 3."""
    def evaluate(job: cap.SearchJob, rate: float) -> dict[str, float]:
        return {"rate_per_s": rate, "passes": float(rate <= 3.0),
                "throughput_rps": min(rate, 3.5)}

    monkeypatch.setattr(cap, "evaluate", evaluate)
    low, high, rows = cap._bisect(_job(1e4))
    assert rows[21]["rate_per_s"] == 1.75
    assert low <= 3.0 < high and high / low <= 1.02


def test_a_search_whose_every_pass_is_above_the_limit_halves_down_from_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The SLO holds up to 10 req/s, the server saturates above 6 at 5 req/s: from 8 the
    bracket and narrowing pass only rates at or above 5 / 1.02; refused, the search halves
    from the limit (2.45 passes) and narrows to it."""
    evaluate, _ = _server(5.0, 10.0, 6.0)
    monkeypatch.setattr(cap, "evaluate", evaluate)
    low, high, rows = cap._bisect(_job(8.0))
    limit = 5.0 / 1.02
    tried = [r["rate_per_s"] for r in rows]
    assert tried[:2] == [8.0, 16.0]
    assert limit / 2 in tried
    assert limit / 1.02 <= low < limit and high <= limit
    assert all(r["passes"] == float(r["rate_per_s"] < limit) for r in rows)


def test_rates_below_one_request_a_second_are_searched_as_any_other() -> None:
    tried: list[float] = []
    assert cap._bracket(1.0, _threshold(tried, lambda r: r <= 0.3)) == (0.25, 0.5)  # type: ignore[arg-type]
    tried.clear()
    low, high = cap._narrow(0.25, 0.5, _threshold(tried, lambda r: r <= 0.3), 0.1)  # type: ignore[arg-type]
    assert tried[0] == pytest.approx(math.sqrt(0.125)) and high / low <= 1.1
    assert cap.completed_rps([{"throughput_rps": 0.5}]) == 0.5
    rows = [{"rate_per_s": 0.5, "full_load_rps": 0.4}, {"rate_per_s": 2.0, "full_load_rps": 0.5}]
    assert cap.service_rate(rows) == pytest.approx((0.4 / 0.5 + 0.5 / 2.0) / (1 / 0.5 + 1 / 2.0))


def test_narrowing_stops_where_the_midpoint_rounds_to_the_failing_rate() -> None:
    tried: list[float] = []
    below = math.nextafter(10.0, 0.0)
    assert math.sqrt(below * 10.0) == 10.0
    assert cap._narrow(below, 10.0, _threshold(tried, lambda r: True), 0.0) == (below, 10.0)  # type: ignore[arg-type]
    assert tried == []


def test_two_replications_have_an_interval() -> None:
    low, high = cap.t_interval(np.array([1.0, 3.0]))  # mean 2, sd sqrt 2: half = t(1)
    assert (low, high) == pytest.approx((2 - 12.7062047, 2 + 12.7062047), rel=1e-12)
    low, high = cap.t_interval(np.array([2.0, 4.0, 6.0]))  # sd 2
    half = 4.30265273 * 2 / math.sqrt(3)
    assert (low, high) == pytest.approx((4 - half, 4 + half), rel=1e-12)
    # Two failing rates: their interval's upper end.
    rates = np.array([3.0, 4.0, 5.0])
    assert cap.rate_interval(rates, fails=np.array([9.0, 11.0]))[1] == pytest.approx(10 + 12.7062047)


# --- the saturation judgement and what the table reads at capacity ---------------------------

def test_a_fleet_is_judged_on_its_highest_replicas_in_system_z(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The window judged short is the judged requests': a replica's own where its z is above
    the pooled one (the fake says short for exactly two requests)."""
    seen: list[list[int]] = []

    def short(reqs: pd.DataFrame, warmup_s: float) -> bool:
        seen.append(reqs["arrival_s"].tolist())
        assert warmup_s == 1.5
        return len(reqs) == 2

    monkeypatch.setattr(cap, "in_system_window_is_short", short)
    requests = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0], "replica": [0, 1, 1]})
    replicas = pd.DataFrame({"in_system_z": [1.0, 5.0]}, index=[0, 1])
    assert cap.judged_in_system({"in_system_z": 2.0}, replicas, requests, 1.5) == (5.0, True)
    assert seen == [[1.0, 2.0]]
    # The pooled z is higher, NaN replicas, no replica column, no replicas: the pooled count.
    assert cap.judged_in_system({"in_system_z": 6.0}, replicas, requests, 1.5) == (6.0, False)
    nan_zs = replicas.assign(in_system_z=math.nan)
    assert cap.judged_in_system({"in_system_z": 2.0}, nan_zs, requests, 1.5) == (2.0, False)
    assert cap.judged_in_system({"in_system_z": 2.0}, replicas, requests.drop(columns="replica"),
                                1.5) == (2.0, False)
    assert cap.judged_in_system({"in_system_z": 2.0}, None, requests, 1.5) == (2.0, False)
    assert cap.judged_in_system({"in_system_z": 2.0}, replicas.iloc[:0], requests, 1.5) \
        == (2.0, False)
    assert cap.judged_in_system({"in_system_z": 2.0}, replicas.drop(columns="in_system_z"),
                                requests, 1.5) == (2.0, False)
    # A pooled z of NaN (too short to judge) yields to a replica's, even a lower one.
    z, was_short = cap.judged_in_system({"in_system_z": math.nan},
                                        replicas.assign(in_system_z=[math.nan, 0.5]), requests, 1.5)
    assert (z, was_short) == (0.5, True)
    # The replica is found by its index label, not its position.
    labelled = pd.DataFrame({"in_system_z": [9.0, 1.0]}, index=[1, 0])
    seen.clear()
    assert cap.judged_in_system({"in_system_z": 2.0}, labelled, requests, 1.5) == (9.0, True)
    assert seen == [[1.0, 2.0]]


def test_tokens_served_a_request_count_the_measured_and_not_the_rejected() -> None:
    reqs = pd.DataFrame({"arrival_s": [0.0, 1.0, 10.0, 11.0, 12.0],
                         "output_tokens": [100, 100, 10, 20, 30]})
    assert cap.served_tokens_per_request(reqs) == 52.0
    assert cap.served_tokens_per_request(reqs, 5.0) == 20.0
    rejected = reqs.assign(rejected=[False, False, False, True, False])
    assert cap.served_tokens_per_request(rejected, 5.0) == pytest.approx(40 / 3)


def test_the_pareto_front_keeps_rows_no_other_beats_on_both() -> None:
    table = pd.DataFrame({"cost": [3.0, 1.0, 2.0, 4.0, math.inf, 2.0, 0.5],
                          "latency": [4.0, 5.0, 3.0, 1.0, 0.0, 3.0, math.nan]})
    front = cap.pareto_front(table, "cost", "latency")
    # By cost: (1, 5), (2, 3), (2, 3) beaten by its twin, (3, 4) beaten, (4, 1).
    assert front.index.tolist() == [1, 2, 3]


def test_the_cheapest_configuration_with_and_without_a_target_rate() -> None:
    table = pd.DataFrame({"max_rate_per_s": [0.0, 2.0, 3.0, 4.0, 5.0],
                          "cost_per_million_tokens": [0.1, 5.0, 4.0, math.inf, 6.0],
                          "cost_per_hour_for_target_usd": [1.0, 9.0, 9.0, 8.0, math.inf]})
    by_target = cap.cheapest(table)
    assert by_target is not None and by_target.name == 3  # 8 $/h, whatever its token cost
    # Ties on the target's cost go to the lower cost per million tokens.
    tie = cap.cheapest(table.drop(index=3))
    assert tie is not None and tie.name == 2
    by_tokens = cap.cheapest(table.drop(columns="cost_per_hour_for_target_usd"))
    assert by_tokens is not None and by_tokens.name == 2  # rate 0 and inf left out
    assert cap.cheapest(table.iloc[:1]) is None
    assert cap.cheapest(table.iloc[:0]) is None


def test_latency_and_tokens_at_capacity_average_each_replications_answer() -> None:
    def outcome(answer: float, *runs: tuple[float, float, float, float]) -> SimpleNamespace:
        return SimpleNamespace(max_rate_per_s=answer, evaluations=[
            {"rate_per_s": r, "passes": p, "slo_met": p, "slo_e2e_p90_s": e,
             "output_tokens_mean": t} for r, p, e, t in runs])
    group: list[Any] = [
        outcome(2.0, (1.0, 1.0, 0.5, 10.0), (2.0, 1.0, 0.8, 20.0), (4.0, 0.0, 3.0, 40.0)),
        outcome(3.0, (3.0, 1.0, 1.2, 30.0), (3.0, 0.0, 9.0, 99.0)),
        outcome(0.0, (1.0, 0.0, 5.0, 50.0)),  # none passed: no run at capacity
    ]
    assert cap._at_capacity(group) == {"slo_e2e_p90_s_at_capacity": pytest.approx(1.0)}
    assert cap._mean_output_tokens(group) == pytest.approx(25.0)
    assert cap._at_capacity(group[2:]) == {}
    assert math.isnan(cap._mean_output_tokens(group[2:]))


def test_a_tie_on_the_in_system_z_is_judged_on_the_pooled_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cap, "in_system_window_is_short", lambda reqs, warmup_s: len(reqs) == 2)
    requests = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0], "replica": [0, 1, 1]})
    replicas = pd.DataFrame({"in_system_z": [1.0, 5.0]}, index=[0, 1])
    assert cap.judged_in_system({"in_system_z": 5.0}, replicas, requests, 0.0) == (5.0, False)


def test_a_replication_without_an_answer_first_does_not_hide_the_others() -> None:
    """The replications' runs at capacity are looked up one by one: one where nothing
    passed (no such run) listed first must not end the lookup."""
    import warnings

    none = SimpleNamespace(max_rate_per_s=0.0, evaluations=[
        {"rate_per_s": 1.0, "passes": 0.0, "slo_e2e_p90_s": 5.0, "output_tokens_mean": 50.0}])
    one = SimpleNamespace(max_rate_per_s=2.0, evaluations=[
        {"rate_per_s": 2.0, "passes": 1.0, "slo_e2e_p90_s": 0.8, "output_tokens_mean": 20.0}])
    group: list[Any] = [none, one]
    assert cap._at_capacity(group) == {"slo_e2e_p90_s_at_capacity": pytest.approx(0.8)}
    assert cap._mean_output_tokens(group) == pytest.approx(20.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "Mean of empty slice" where none passed
        assert math.isnan(cap._mean_output_tokens(group[:1]))


def test_the_cheapest_takes_capacities_below_one_request_a_second_and_the_first_tie() -> None:
    table = pd.DataFrame({"max_rate_per_s": [0.5, 2.0], "cost_per_million_tokens": [1.0, 2.0]})
    got = cap.cheapest(table)
    assert got is not None and got.name == 0
    # A thousand configurations at three costs: the first of the cheapest, in table order.
    costs = np.random.default_rng(0).integers(0, 3, 1000).astype(float)
    many = pd.DataFrame({"max_rate_per_s": 1.0, "cost_per_million_tokens": costs})
    got = cap.cheapest(many)
    assert got is not None and got.name == int(np.flatnonzero(costs == 0)[0])
