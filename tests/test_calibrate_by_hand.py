"""`python -m calibrate logs`'s arithmetic by hand, without a fit: the loss's log-ratios, the
linear stage's rows and solver, the log-space bookkeeping (floors, starts, survey spans), the
leave-one-out loop and what the report says of its answers. Each test runs in milliseconds,
so the mutation scope `calibrate-logs` (quality/scopes.toml) can run it once per mutant;
tests/test_calibrate_logs.py checks the same code end to end, by fitting simulated logs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import calibrate.logs as logs
from calibrate.logs import (
    DEFAULT_START,
    MIN_RATIO,
    Fit,
    Prior,
    Schedule,
    ServingLog,
    _coefficients,
    _log_start,
    _mean_ratio,
    _not_a_coefficient,
    _robust_nnls,
    _scale,
    _spans_from_zero,
    _survey_points,
    fitted_metrics,
    floored,
    leave_one_out,
    linear_rows,
    log_errors,
    poor_fit,
    sourced_prior,
    spread_terms,
    zero_floors,
)
from orcasim.config import ScenarioError
from orcasim.scenario import scenario_from_dict

ITER, SEQ, TOK, LAT = ("overhead.per_iteration_s", "overhead.per_sequence_s",
                       "overhead.per_prefill_token_s", "overhead.request_latency_s")
SCENARIO = {
    "name": "by_hand", "kv_capacity_tokens": 4096,
    "workload": {"num_requests": 4, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                 "prompt_tokens": {"kind": "constant", "value": 16},
                 "output_tokens": {"kind": "constant", "value": 4}, "max_tokens": 64},
    "cost": {"kind": "linear", "base_s": 0.008, "per_token_s": 5e-5,
             "overhead": {"per_iteration_s": 0.002, "per_sequence_s": 0.0,
                          "per_prefill_token_s": 3e-6}},
    "systems": [{"name": "vllm", "scheduler": {"kind": "paged", "max_num_seqs": 8}}],
}


def _frame(**columns: list[float]) -> pd.DataFrame:
    return pd.DataFrame({m: columns.get(m, [np.nan] * len(next(iter(columns.values()))))
                         for m in ("ttft_s", "tpot_s", "e2e_s")})


# --- the loss: log-ratios of the mean and the percentiles --------------------------------

def test_the_metrics_fitted_are_those_measured_above_zero() -> None:
    real = _frame(ttft_s=[1.0, 2.0], tpot_s=[0.0, 0.0], e2e_s=[3.0, 4.0])
    assert logs.fitted_metrics(real) == ["ttft_s", "e2e_s"]
    assert fitted_metrics(_frame(ttft_s=[0.0, 0.0], tpot_s=[0.0, 1e-3], e2e_s=[np.nan, np.nan])) \
        == ["tpot_s"]


def test_log_errors_are_log_ratios_at_each_percentile_then_the_means() -> None:
    """TTFT simulated twice the real one, E2E exactly: five percentiles of log 2 and five of
    0, then the means' log-ratios in METRICS order; TPOT, 0 in the log, is left out."""
    real = _frame(ttft_s=[1.0, 2.0, 3.0, 4.0], tpot_s=[0.0] * 4, e2e_s=[2.0, 4.0, 6.0, 8.0])
    sim = _frame(ttft_s=[2.0, 4.0, 6.0, 8.0], tpot_s=[0.1] * 4, e2e_s=[2.0, 4.0, 6.0, 8.0])
    got = log_errors(sim, real)
    np.testing.assert_allclose(got, [math.log(2)] * 5 + [0.0] * 5 + [math.log(2), 0.0], atol=1e-15)


def test_a_simulated_zero_costs_the_floor_ratio_not_infinity() -> None:
    real = _frame(ttft_s=[1.0, 1.0], e2e_s=[2.0, 2.0])
    sim = _frame(ttft_s=[0.0, 0.0], e2e_s=[2.0, 2.0])
    got = log_errors(sim, real)
    assert got.tolist() == pytest.approx([math.log(MIN_RATIO)] * 5 + [0.0] * 5
                                         + [math.log(MIN_RATIO), 0.0])


def test_a_metric_no_request_simulated_has_no_mean_term() -> None:
    """Every request turned away: no percentile rows and no mean for it (not log of NaN)."""
    real = _frame(ttft_s=[1.0, 2.0], e2e_s=[2.0, 4.0])
    sim = _frame(ttft_s=[np.nan, np.nan], e2e_s=[4.0, 8.0])
    got = log_errors(sim, real)
    assert got.tolist() == pytest.approx([math.log(2)] * 6)


def test_the_mean_ratio_takes_the_requests_measured_on_both_sides() -> None:
    real = _frame(ttft_s=[1.0, 2.0, np.nan, 4.0])
    sim = _frame(ttft_s=[2.0, np.nan, 3.0, 4.0])
    # Requests 0 and 3 only: (2 + 4) / 2 over (1 + 4) / 2.
    assert _mean_ratio(sim, real, "ttft_s") == pytest.approx(3.0 / 2.5)


# --- the prior ------------------------------------------------------------------------

def test_the_prior_costs_its_weight_a_factor_e_and_a_term_at_zero_its_floor() -> None:
    prior = Prior(2.0, {ITER: 1e-3, SEQ: 1e-4})
    at = {ITER: 1e-3 * math.e, SEQ: 1e-4 / math.e ** 3, TOK: 5.0}
    assert prior.penalty(at, {}) == pytest.approx(2.0 * (1 + 9))
    assert prior.penalty({**at, ITER: 0.0}, {ITER: 1e-6}) == pytest.approx(
        2.0 * (math.log(1e-3) ** 2 + 9))
    # A floor below the value changes nothing.
    assert prior.penalty(at, {ITER: 1e-9}) == pytest.approx(2.0 * 10)


def test_a_sourced_prior_is_centred_on_the_scenarios_terms_above_zero() -> None:
    scenario = scenario_from_dict(SCENARIO)
    prior = sourced_prior(scenario, "vllm", (ITER, SEQ, TOK), 0.25)
    assert prior == Prior(0.25, {ITER: 0.002, TOK: 3e-6})
    assert sourced_prior(scenario, "vllm", (ITER,), 0.0) is None
    for bad in (-1e-9, float("nan"), float("inf")):
        with pytest.raises(ScenarioError, match=r"^--prior-weight = .*: expected a finite number >= 0$"):
            sourced_prior(scenario, "vllm", (ITER,), bad)


# --- floors, scales and starts in log space ----------------------------------------------

def test_a_term_under_its_floor_is_zero_and_one_at_it_is_kept() -> None:
    assert floored({"a": 0.5, "b": 0.49, "c": 2.0}, {"a": 0.5, "b": 0.5, "c": 0.5}) == \
        {"a": 0.5, "b": 0.0, "c": 2.0}


def test_a_terms_scale_is_its_start_value_or_the_scenarios() -> None:
    assert _scale(ITER, 0.5) == 1e-3
    assert _scale(SEQ, 0.0) == 1e-4
    assert _scale(TOK, 7.0) == 1e-6
    assert _scale("overhead.tensor_parallel_per_iteration_s", 7.0) == DEFAULT_START
    assert _scale("per_context_token_s", 2e-7) == 2e-7
    assert _scale("per_context_token_s", 0.0) == DEFAULT_START


def test_floors_are_a_ten_thousandth_of_each_scale() -> None:
    floors = zero_floors(scenario_from_dict(SCENARIO), "vllm", (ITER, SEQ, TOK, "base_s"))
    assert floors == pytest.approx({ITER: 1e-7, SEQ: 1e-8, TOK: 1e-10, "base_s": 8e-7},
                                   rel=1e-12)


def test_starts_in_log_space() -> None:
    start = {ITER: 0.0, SEQ: 2e-3, TOK: 1e-12, "x": 0.0, "y": 5e-8}
    floors = {TOK: 1e-10, "y": 1e-7}
    got = _log_start(start, [ITER, SEQ, TOK, "x", "y"], floors)
    # 0 without a floor: START_VALUES' (or DEFAULT_START); under a floor: a tenth of it.
    np.testing.assert_allclose(np.exp(got), [1e-3, 2e-3, 1e-11, DEFAULT_START, 1e-8], rtol=1e-12)
    # At its floor a term is kept.
    assert np.exp(_log_start({"y": 1e-7}, ["y"], floors)) == pytest.approx([1e-7])


def test_a_term_at_zero_is_surveyed_from_its_floor_over_five_decades() -> None:
    start = {ITER: 0.0, SEQ: 1e-4, TOK: 1e-7}
    floors = {ITER: 1e-7, SEQ: 1e-8, TOK: 1e-7}
    spans = _spans_from_zero(start, [ITER, SEQ, TOK], floors)
    assert list(spans) == [0]
    low, high = spans[0]
    assert (math.exp(low), math.exp(high)) == pytest.approx((1e-7, 1e-2))


def test_the_survey_is_x0_then_sobol_points_around_it_and_over_the_spans() -> None:
    from scipy.stats import qmc

    x0 = np.array([0.0, -5.0, 3.0])
    points = _survey_points(x0, [0], {1: (-10.0, -2.0)}, 8)
    assert len(points) == 9 and points[0] is x0
    unit = qmc.Sobol(2, seed=0).random(8)
    for p, u in zip(points[1:], unit, strict=True):
        assert p[0] == pytest.approx(math.log(10) * (2 * u[0] - 1))
        assert p[1] == pytest.approx(-10.0 + 8.0 * u[1])
        assert p[2] == 3.0
    assert x0.tolist() == [0.0, -5.0, 3.0]  # not moved in place
    assert _survey_points(x0, [], {}, 8) == [x0]
    assert _survey_points(x0, [0], {}, 0) == [x0]


# --- the linear stage ---------------------------------------------------------------------

def _schedule(**changes: object) -> Schedule:
    """Three iterations of 1, 2 and 3 s (0-1, 1-3, 3-6); request 0 arrives half-way through
    the first, its first token at 1 and its last at 6; request 1 arrives a quarter of the
    way through the second, its first token at 3 and its last at 6."""
    fields: dict[str, object] = dict(
        start_s=np.array([0.0, 1.0, 3.0]), end_s=np.array([1.0, 3.0, 6.0]),
        features={"gpu": np.array([0.5, 1.0, 2.0]), "host": np.array([0.5, 1.0, 1.0]),
                  "one": np.ones(3), "batch": np.array([1.0, 2.0, 1.0]),
                  "prefill": np.array([10.0, 4.0, 0.0])},
        arrival_s=np.array([0.5, 1.5]), first_token_s=np.array([1.0, 3.0]),
        finish_s=np.array([6.0, 6.0]), compared=np.array([True, True]), latency_s=0.1)
    fields.update(changes)
    return Schedule(**fields)  # type: ignore[arg-type]


# Request 0 streams (TTFT 0.6, E2E 5.5); request 1 is timed by its E2E alone (4.0).
REAL = pd.DataFrame({"ttft_s": [0.6, np.nan], "e2e_s": [5.5, 4.0]})


def test_linear_rows_by_hand() -> None:
    """Known per iteration: 1, 2, 3 less 0.2 s of the fitted per-iteration term: 0.8, 1.8,
    2.8 (cumulated 0, 0.8, 2.6, 5.4). Request 0's decode window holds iterations 2 and 3
    (4.6 s, 2 of them), its TTFT the half of iteration 1 left (0.4 s, half an iteration)
    and the request latency (fitted: a column of its own). Request 1's E2E: its decode
    (iteration 3: 2.8 s, one), and three quarters of iteration 2 (1.35 s, 0.75)."""
    known, x, measured = linear_rows(_schedule(), REAL, {ITER: 0.2}, [ITER, LAT])
    np.testing.assert_allclose(known, [4.6, 0.4, 4.15], rtol=1e-12)
    np.testing.assert_allclose(x, [[2.0, 0.0], [0.5, 1.0], [1.75, 1.0]], rtol=1e-12)
    np.testing.assert_allclose(measured, [4.9, 0.6, 4.0], rtol=1e-12)


def test_linear_rows_keep_the_request_latency_it_ran_with_when_not_fitted() -> None:
    known, x, measured = linear_rows(_schedule(), REAL, {ITER: 0.2}, [ITER])
    np.testing.assert_allclose(known, [4.6, 0.5, 4.25], rtol=1e-12)
    np.testing.assert_allclose(x, [[2.0], [0.5], [1.75]], rtol=1e-12)
    np.testing.assert_allclose(measured, [4.9, 0.6, 4.0], rtol=1e-12)


def test_linear_rows_of_the_per_request_and_per_prompt_token_terms() -> None:
    """Known less 0.1 s a sequence (batches 1, 2, 1) and 0.01 s a prompt token (10, 4, 0):
    0.8, 1.76, 2.9 (cumulated 0, 0.8, 2.56, 5.46)."""
    known, x, _ = linear_rows(_schedule(), REAL, {SEQ: 0.1, TOK: 0.01}, [SEQ, TOK])
    np.testing.assert_allclose(known, [5.46 - 0.8, 0.8 * 0.5 + 0.1,
                                       2.9 + 0.75 * 1.76 + 0.1], rtol=1e-12)
    np.testing.assert_allclose(x, [[3.0, 4.0], [0.5, 5.0], [1.0 + 1.5, 0.0 + 3.0]], rtol=1e-12)


def test_linear_rows_leave_out_requests_not_compared_or_not_served() -> None:
    before_warmup = linear_rows(_schedule(compared=np.array([False, True])), REAL, {}, [ITER])
    assert before_warmup[2].tolist() == [4.0]
    turned_away = _schedule(first_token_s=np.array([1.0, np.nan]), finish_s=np.array([6.0, np.nan]))
    assert linear_rows(turned_away, REAL, {}, [ITER])[2].tolist() == pytest.approx([4.9, 0.6])
    unfinished = _schedule(finish_s=np.array([np.inf, 6.0]))
    assert linear_rows(unfinished, REAL, {}, [ITER])[2].tolist() == [4.0]
    # A measured time of 0 (or below) has no relative error: no row.
    zero = pd.DataFrame({"ttft_s": [0.6, np.nan], "e2e_s": [0.6, 0.0]})
    assert linear_rows(_schedule(), zero, {}, [ITER])[2].tolist() == [0.6]


def test_an_arrival_at_an_iterations_end_counts_from_the_next() -> None:
    """Arriving at 1.0, as iteration 1 ends, request 1 waits all of iteration 2 (1.8 s, 1)."""
    schedule = _schedule(arrival_s=np.array([0.5, 1.0]))
    known, x, _ = linear_rows(schedule, REAL, {ITER: 0.2}, [ITER])
    assert known[2] == pytest.approx(2.8 + 1.8 + 0.1)
    assert x[2, 0] == pytest.approx(2.0)


def test_an_arrival_after_the_last_iteration_is_in_the_last() -> None:
    """An arrival past every iteration's end (a request still waiting) is clamped to the
    last iteration, which it has all gone by: its TTFT row is empty, not an index error."""
    schedule = _schedule(arrival_s=np.array([0.5, 7.0]), first_token_s=np.array([1.0, 6.0]),
                         finish_s=np.array([6.0, 6.0]))
    known, x, _ = linear_rows(schedule, REAL, {}, [ITER])
    assert known[2] == pytest.approx(0.0 + 0.1)
    assert x[2, 0] == pytest.approx(0.0)


def test_the_robust_solver_follows_the_many_rows_not_the_outlier() -> None:
    a = np.ones((5, 1))
    b = np.array([1.0, 1.0, 1.0, 1.0, 10.0])  # least squares: 2.8; least absolute: 1
    assert _robust_nnls(a, b) == pytest.approx([1.0], abs=1e-4)


def test_the_robust_solver_is_non_negative_and_scale_free() -> None:
    assert _robust_nnls(np.ones((3, 1)), np.array([-1.0, -2.0, -1.0])).tolist() == [0.0]
    a = np.array([[1e3, 0.0], [0.0, 1e-6], [1e3, 1e-6], [2e3, 1e-6]])
    c = np.array([2e-3, 5e4])
    np.testing.assert_allclose(_robust_nnls(a, a @ c), c, rtol=1e-6)


# --- the leave-one-out loop and the report's lines -----------------------------------------

def test_leave_one_out_fits_on_the_others_and_scores_the_one(monkeypatch: pytest.MonkeyPatch) -> None:
    given = [ServingLog(__import__("pathlib").Path(f"{n}.csv"), REAL) for n in "abc"]
    seen: list[tuple[list[str], float]] = []

    def fake_fit(scenario, others, system, parameters, base_dir, prior_weight=0.0):  # noqa: ANN001, ANN202
        seen.append(([log.name for log in others], prior_weight))
        return Fit({ITER: float(len(seen))}, 0.0, 1)

    scored: list[tuple[float, str]] = []

    def fake_score(fitted, log, system, base_dir):  # noqa: ANN001, ANN202
        scored.append((fitted, log.name))
        return 0.1 * len(scored)

    monkeypatch.setattr(logs, "fit", fake_fit)
    monkeypatch.setattr(logs, "scored_error", fake_score)
    monkeypatch.setattr(logs, "with_cost", lambda scenario, values, system: values[ITER])
    result = Fit({ITER: 9.0}, 0.0, 1)
    leave_one_out("scenario", given, "vllm", result, (ITER,), prior_weight=0.5)  # type: ignore[arg-type]
    assert seen == [(["b", "c"], 0.5), (["a", "c"], 0.5), (["a", "b"], 0.5)]
    assert result.left_out_parameters == {"a": {ITER: 1.0}, "b": {ITER: 2.0}, "c": {ITER: 3.0}}
    # Each held-out log scored with the fit that never saw it.
    assert scored == [(1.0, "a"), (2.0, "b"), (3.0, "c")]
    assert result.left_out_errors == pytest.approx({"a": 0.1, "b": 0.2, "c": 0.3})
    assert result.parameters == {ITER: 9.0}


def test_a_spread_of_exactly_the_factor_is_not_named() -> None:
    assert spread_terms(Fit({"a": 1.0}, 0.0, 1, left_out_parameters={"x": {"a": 2.0}})) == []
    assert spread_terms(Fit({"a": 2.0}, 0.0, 1, left_out_parameters={"x": {"a": 1.0}})) == []
    # Below: the fit on all logs is the low end.
    said = spread_terms(Fit({"a": 1.0, "b": 3.0}, 0.0, 1, left_out_parameters={
        "x": {"a": 2.5, "b": 3.0}, "y": {"a": 1.5, "b": 3.0}}))
    assert said == [
        "a is not pinned down by these logs: 1 fitted on all of them, 1.5 to 2.5 with one "
        "left out (more than 2x apart); it trades off with the other terms, so trust what the "
        "fit predicts near these logs, not this term's value alone (fit fewer terms with --fit, "
        "or add logs of other loads)"]


def test_a_term_at_zero_in_some_fits_is_named_and_at_zero_in_all_is_not() -> None:
    assert len(spread_terms(Fit({"a": 1e-3}, 0.0, 1, left_out_parameters={"x": {"a": 0.0}}))) == 1
    assert len(spread_terms(Fit({"a": 0.0}, 0.0, 1, left_out_parameters={"x": {"a": 1e-3}}))) == 1
    assert spread_terms(Fit({"a": 0.0}, 0.0, 1, left_out_parameters={"x": {"a": 0.0}})) == []
    # A left-out fit without the term (another --fit) is not counted.
    assert spread_terms(Fit({"a": 1.0}, 0.0, 1, left_out_parameters={"x": {"b": 9.0}})) == []


def test_a_poor_fit_names_its_worst_log_and_counts_the_others() -> None:
    assert poor_fit(Fit({}, 0.0, 1, fitted_errors={"a": 0.5, "b": 0.1}), "s") is None
    said = poor_fit(Fit({}, 0.0, 1, fitted_errors={"a": 0.6, "b": 0.9, "c": 0.51, "d": 0.5}), "s")
    assert said is not None and said.startswith(
        "the fit is poor: its median |error| is 90% on b and 2 other logs (more than 50%); "
        "check that the scenario's system s ")
    one = poor_fit(Fit({}, 0.0, 1, fitted_errors={"a": 0.75}), "s")
    assert one is not None and "is 75% on a (more than 50%)" in one


# --- what a fit may vary ---------------------------------------------------------------------

def test_a_costs_coefficients_are_its_real_valued_leaves() -> None:
    cost = {"kind": "linear", "base_s": 0.01, "tp": 2, "flag": True,
            "overhead": {"per_iteration_s": 1e-3, "inner": {"x": 0.5}}}
    assert _coefficients(cost) == {"base_s": 0.01, "overhead.per_iteration_s": 1e-3,
                                   "overhead.inner.x": 0.5}


def test_why_a_name_is_not_a_coefficient() -> None:
    cost = {"kind": "linear", "tp": 2, "overhead": {"per_iteration_s": 1e-3}}
    assert _not_a_coefficient(cost, "nope") == \
        "not a field of the scenario's cost (kind linear)"
    assert _not_a_coefficient(cost, "tp.x") == \
        "not a field of the scenario's cost (kind linear)"
    assert _not_a_coefficient(cost, "overhead") == \
        "the scenario's cost (kind linear) has overhead as a group of fields, not a real-valued coefficient"
    assert _not_a_coefficient(cost, "tp") == \
        "the scenario's cost (kind linear) has tp = 2, not a real-valued coefficient"


# --- found by the mutation run of calibrate-logs (quality/README.md) -----------------------

TWO_SYSTEMS = {**SCENARIO, "systems": [
    {"name": "first", "scheduler": {"kind": "paged", "max_num_seqs": 8}},
    {"name": "own", "scheduler": {"kind": "paged", "max_num_seqs": 8},
     "cost": {"kind": "linear", "base_s": 0.004, "per_token_s": 5e-5,
              "overhead": {"per_iteration_s": 0.005, "per_sequence_s": 2e-4,
                           "per_prefill_token_s": 0.0}}}]}


def test_values_floors_and_prior_are_read_from_the_named_systems_cost() -> None:
    from calibrate.logs import current_values

    scenario = scenario_from_dict(TWO_SYSTEMS)
    assert current_values(scenario, (ITER, "base_s"), "own") == {ITER: 0.005, "base_s": 0.004}
    assert current_values(scenario, (ITER, "base_s"), "first") == {ITER: 0.002, "base_s": 0.008}
    assert current_values(scenario, (ITER, "base_s")) == {ITER: 0.002, "base_s": 0.008}
    assert zero_floors(scenario, "own", ("base_s",)) == pytest.approx({"base_s": 4e-7}, rel=1e-12)
    assert sourced_prior(scenario, "own", (ITER, SEQ, TOK), 1.0) == Prior(1.0, {ITER: 0.005,
                                                                              SEQ: 2e-4})


def test_a_cost_without_overhead_offers_its_terms_at_their_defaults() -> None:
    from calibrate.logs import current_values
    from orcasim.cost.overhead import OverheadConfig

    bare = {**SCENARIO, "cost": {"kind": "linear", "base_s": 0.008, "per_token_s": 5e-5}}
    got = current_values(scenario_from_dict(bare), (ITER, SEQ, LAT))
    defaults = OverheadConfig()
    assert got == {ITER: defaults.per_iteration_s, SEQ: defaults.per_sequence_s,
                   LAT: defaults.request_latency_s}


def test_a_name_that_is_not_a_coefficient_is_one_line_listing_those_that_are() -> None:
    from calibrate.logs import current_values

    with pytest.raises(ScenarioError) as info:
        current_values(scenario_from_dict(SCENARIO), ("overhead.nope",), "vllm")
    fittable = _coefficients(scenario_from_dict(SCENARIO).cost.model_dump(mode="json",
                                                                          exclude_none=True))
    assert ITER in fittable and "base_s" in fittable
    assert str(info.value) == ("--fit overhead.nope: not a field of the scenario's cost (kind "
                               f"linear); expected one of its coefficients {', '.join(fittable)}")


def test_a_nested_field_that_is_not_real_valued_is_named_by_its_path() -> None:
    cost = {"kind": "x", "overhead": {"n": 2}}
    assert _not_a_coefficient(cost, "overhead.n") == \
        "the scenario's cost (kind x) has overhead.n = 2, not a real-valued coefficient"


def test_a_fitted_term_the_replay_ran_without_is_taken_as_zero() -> None:
    known, _, _ = linear_rows(_schedule(), REAL, {}, [ITER])
    # Known per iteration 1, 2, 3 (cumulated 0, 1, 3, 6), nothing taken off.
    np.testing.assert_allclose(known, [5.0, 0.5 + 0.1, 3.0 + 0.75 * 2.0 + 0.1], rtol=1e-12)


def _short_schedule() -> Schedule:
    """Iterations of 0.1 s each (0 to 0.4): request 0 arrives at 0.05, its first token at
    0.2 and its last at 0.3, each an iteration's end; request 1 arrives at 0.25."""
    return Schedule(
        start_s=np.array([0.0, 0.1, 0.2, 0.3]), end_s=np.array([0.1, 0.2, 0.3, 0.4]),
        features={"gpu": np.full(4, 0.05), "host": np.full(4, 0.05), "one": np.ones(4),
                  "batch": np.ones(4), "prefill": np.zeros(4)},
        arrival_s=np.array([0.05, 0.25]), first_token_s=np.array([0.2, 0.3]),
        finish_s=np.array([0.3, 0.4]), compared=np.array([True, True]), latency_s=0.0)


def test_tokens_at_an_iterations_end_are_that_iterations() -> None:
    """Request 0: decode window iteration 3 alone (its first token ends iteration 2, its
    last iteration 3): 0.1 s, one iteration; TTFT the half of iteration 1 left and all of
    iteration 2: 0.15 s, 1.5 iterations. Request 1: decode iteration 4, TTFT half of 3.
    (Both stream: no E2E rows.)"""
    real = pd.DataFrame({"ttft_s": [0.15, 0.05], "e2e_s": [0.25, 0.15]})
    known, x, measured = linear_rows(_short_schedule(), real, {}, [ITER])
    np.testing.assert_allclose(known, [0.1, 0.1, 0.15, 0.05], rtol=1e-9)
    np.testing.assert_allclose(x[:, 0], [1.0, 1.0, 1.5, 0.5], rtol=1e-9)
    np.testing.assert_allclose(measured, [0.1, 0.1, 0.15, 0.05], rtol=1e-9)


def test_an_arrival_in_an_idle_gap_waits_none_of_the_next_iteration() -> None:
    """Iterations 0-1 and 3-6 with the server idle between: a request arriving at 2 has
    none of iteration 2 gone (not -1/3 of it)."""
    schedule = _schedule(start_s=np.array([0.0, 1.0, 3.0]), end_s=np.array([1.0, 2.0, 6.0]),
                         arrival_s=np.array([0.5, 2.5]),
                         first_token_s=np.array([1.0, 6.0]), finish_s=np.array([6.0, 6.0]))
    real = pd.DataFrame({"ttft_s": [0.6, 3.0], "e2e_s": [5.5, 3.5]})
    known, x, _ = linear_rows(schedule, real, {}, [ITER])
    # Request 1's TTFT: all of iteration 3 (3 s known, one iteration) and the latency.
    assert known[3] == pytest.approx(3.0 + 0.1) and x[3, 0] == pytest.approx(1.0)


def test_a_term_at_zero_without_a_floor_starts_at_its_own_start_value() -> None:
    assert np.exp(_log_start({SEQ: 0.0, TOK: 0.0}, [SEQ, TOK], {})) == pytest.approx([1e-4, 1e-6])


def test_the_survey_moves_around_x0_not_from_zero() -> None:
    from scipy.stats import qmc

    x0 = np.array([2.0, -1.0])
    points = _survey_points(x0, [0, 1], {}, 4)
    unit = qmc.Sobol(2, seed=0).random(4)
    for p, u in zip(points[1:], unit, strict=True):
        np.testing.assert_allclose(p, x0 + math.log(10) * (2 * u - 1), rtol=1e-12)


def test_leave_one_out_passes_the_fit_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    given = [ServingLog(Path(f"{n}.csv"), REAL) for n in "ab"]
    calls: list[tuple[object, ...]] = []

    def fake_fit(scenario, others, system, parameters, base_dir, prior_weight=-1.0):  # noqa: ANN001, ANN202
        calls.append(("fit", scenario, system, parameters, base_dir, prior_weight))
        return Fit({ITER: 1.0}, 0.0, 1)

    def fake_with_cost(scenario, values, system):  # noqa: ANN001, ANN202
        calls.append(("with_cost", scenario, system))
        return "fitted"

    def fake_score(fitted, log, system, base_dir):  # noqa: ANN001, ANN202
        calls.append(("score", fitted, system, base_dir))
        return 0.0

    monkeypatch.setattr(logs, "fit", fake_fit)
    monkeypatch.setattr(logs, "with_cost", fake_with_cost)
    monkeypatch.setattr(logs, "scored_error", fake_score)
    folder = Path("scenarios")
    leave_one_out("S", given, "sys", Fit({}, 0.0, 1), (ITER, SEQ), folder)  # type: ignore[arg-type]
    one = [("fit", "S", "sys", (ITER, SEQ), folder, 0.0), ("with_cost", "S", "sys"),
           ("score", "fitted", "sys", folder)]
    assert calls == one + one


def test_a_poor_fit_of_two_logs_counts_the_other_one() -> None:
    said = poor_fit(Fit({}, 0.0, 1, fitted_errors={"a": 0.6, "b": 0.9}), "vllm")
    assert said == ("the fit is poor: its median |error| is 90% on b and 1 other logs (more "
                    "than 50%); check that the scenario's system vllm (its scheduler, model, "
                    "hardware and parallelism) is the engine that produced the logs")


def test_a_term_without_left_out_fits_does_not_hide_the_next() -> None:
    result = Fit({"a": 1.0, "b": 1.0}, 0.0, 1, left_out_parameters={"x": {"b": 5.0}})
    assert [line.split(" ")[0] for line in spread_terms(result)] == ["b"]


def test_a_lone_term_spread_is_said_to_sit_on_a_flat_or_rugged_loss() -> None:
    said = spread_terms(Fit({ITER: 1e-3}, 0.0, 1, left_out_parameters={"x": {ITER: 3e-3}}))
    assert said == [
        f"{ITER} is not pinned down by these logs: 0.001 fitted on all of them, 0.003 to 0.003 "
        "with one left out (more than 2x apart); the loss over it is flat or rugged near these "
        "logs, so trust what the fit predicts near them, not its value (add logs of other loads)"]


# --- where a fit writes its coefficients, and the record ---------------------------------

def test_cost_blocks_are_the_systems_own_and_its_groups_and_pools() -> None:
    from calibrate.logs import _cost_blocks

    top, own, pool, group, decode = {"t": 1}, {"o": 1}, {"p": 1}, {"g": 1}, {"d": 1}
    data = {"cost": top, "systems": [
        {"name": "a"},
        {"name": "b", "cost": own, "cluster": {"prefill": {"cost": pool}, "decode": {},
                                               "replicas": [{"cost": group}, {}]}},
        {"name": "c", "cluster": {"replicas": 3}},
        {"name": "d", "cluster": {"prefill": {}, "decode": {"cost": decode}}}]}
    assert _cost_blocks(data) == [top, own, pool, group, decode]
    assert _cost_blocks(data, "a") == [top]
    assert _cost_blocks(data, "b") == [own, pool, group]
    assert _cost_blocks(data, "c") == [top]
    assert _cost_blocks(data, "d") == [top, decode]
    assert all(a is b for a, b in zip(_cost_blocks(data, "b"), [own, pool, group], strict=True))


def test_with_cost_sets_the_values_in_the_systems_cost_alone() -> None:
    from calibrate.logs import current_values, with_cost

    scenario = scenario_from_dict(TWO_SYSTEMS)
    fitted = with_cost(scenario, {ITER: 0.007, "base_s": 0.001}, "own")
    assert current_values(fitted, (ITER, "base_s"), "own") == {ITER: 0.007, "base_s": 0.001}
    assert current_values(fitted, (ITER, "base_s"), "first") == {ITER: 0.002, "base_s": 0.008}
    # The overhead block's other terms stay as they were (no block of zeros over them).
    assert current_values(with_cost(scenario, {ITER: 0.007}, "first"), (ITER, TOK), "first") \
        == {ITER: 0.007, TOK: 3e-6}
    everywhere = with_cost(scenario, {ITER: 0.007})
    assert current_values(everywhere, (ITER,), "first") == {ITER: 0.007}
    assert current_values(everywhere, (ITER,), "own") == {ITER: 0.007}


def test_fitting_an_overhead_term_of_a_cost_without_overhead_zeroes_the_others() -> None:
    from calibrate.logs import current_values, no_overhead, with_cost
    from orcasim.cost.overhead import OverheadConfig

    assert no_overhead() == dict.fromkeys(OverheadConfig.model_fields, 0.0)
    bare = scenario_from_dict({**SCENARIO, "cost": {"kind": "linear", "base_s": 0.008,
                                                    "per_token_s": 5e-5}})
    fitted = with_cost(bare, {ITER: 0.003}, "vllm")
    assert current_values(fitted, (ITER, SEQ, TOK), "vllm") == {ITER: 0.003, SEQ: 0.0, TOK: 0.0}
    # Fitting a term of the cost's own leaves it without an overhead block.
    assert with_cost(bare, {"base_s": 0.002}, "vllm").cost.overhead is None


def test_a_disaggregated_systems_pools_with_their_own_cost_are_named() -> None:
    from pathlib import Path

    from calibrate.logs import linear_terms, own_cost_blocks
    from orcasim.scenario import load_scenario

    root = Path(__file__).resolve().parents[1]
    scenario = load_scenario(root / "scenarios" / "validation" / "distserve_disagg_opt13b_a100.yaml")
    name = scenario.systems[0].name
    assert own_cost_blocks(scenario, name) == ["systems[0].cluster.prefill.cost"]
    # A cluster records several schedules: every term is searched, none solved linearly.
    assert linear_terms(scenario, name, (ITER, SEQ)) == []
    plain = scenario_from_dict(SCENARIO)
    assert own_cost_blocks(plain, "vllm") == []
    assert linear_terms(plain, "vllm", (ITER, "base_s", LAT, SEQ)) == [ITER, LAT, SEQ]


def test_a_fit_outside_a_coefficients_range_names_the_calibrating_scenario() -> None:
    from calibrate.logs import with_cost

    with pytest.raises(ScenarioError, match=r"^by_hand \(calibrating\): "):
        with_cost(scenario_from_dict(SCENARIO), {"base_s": -1.0}, "vllm")


def test_the_objective_answers_a_point_seen_before_without_a_simulation() -> None:
    from calibrate.logs import Objective

    objective = Objective(scenario_from_dict(TWO_SYSTEMS), [], "own", (ITER, "base_s"), None)
    assert objective.floors == pytest.approx({ITER: 1e-7, "base_s": 4e-7})
    simulated: list[dict[str, float]] = []

    def loss(values: dict[str, float]) -> float:
        simulated.append(values)
        return float(len(simulated))

    objective._loss_of = loss  # type: ignore[method-assign]
    assert objective(np.log([1e-3, 1e-2])) == 1.0
    assert objective(np.log([1e-3, 1e-2])) == 1.0
    # Below their floors, two points are one: both terms at 0.
    assert objective(np.log([1e-9, 1e-2])) == 2.0
    assert objective(np.log([1e-8, 1e-2])) == 2.0
    assert simulated == [{ITER: pytest.approx(1e-3), "base_s": pytest.approx(1e-2)},
                         {ITER: 0.0, "base_s": pytest.approx(1e-2)}]


def test_the_loss_with_a_prior_is_the_logs_loss_plus_its_penalty() -> None:
    from calibrate.logs import Objective

    objective = Objective(scenario_from_dict(SCENARIO), [], "vllm", (ITER,), None,
                          Prior(2.0, {ITER: 1e-3}))
    objective._loss_of = lambda values: 0.5  # type: ignore[method-assign]
    assert objective(np.log([2e-3])) == pytest.approx(0.5 + 2.0 * math.log(2) ** 2)
    assert objective.data_loss_of({ITER: 2e-3}) == 0.5


def test_a_priors_centres_are_starts_in_log_space() -> None:
    from calibrate.logs import _at_centre

    x0 = np.array([0.0, 1.0, 2.0])
    got = _at_centre(x0, [ITER, SEQ, TOK], Prior(1.0, {SEQ: 1e-4, "other": 5.0}))
    np.testing.assert_allclose(got, [0.0, math.log(1e-4), 2.0])
    assert x0.tolist() == [0.0, 1.0, 2.0]


def test_the_objectives_values_are_the_exponentials_floored() -> None:
    from calibrate.logs import Objective

    objective = Objective(scenario_from_dict(SCENARIO), [], "vllm", (ITER, SEQ), None,
                          Prior(2.0, {ITER: 1e-3}))
    assert objective.floors == pytest.approx({ITER: 1e-7, SEQ: 1e-8})
    values = objective.values(np.log([2e-3, 1e-9]))
    assert values == pytest.approx({ITER: 2e-3, SEQ: 0.0})
    assert objective.penalty_of(values) == pytest.approx(2.0 * math.log(2) ** 2)
    assert Objective(scenario_from_dict(SCENARIO), [], "vllm", (ITER,), None).penalty_of(
        {ITER: 5.0}) == 0.0
    assert objective.evaluations == 0


def test_the_record_says_what_was_fitted_how_and_with_what_error() -> None:
    from pathlib import Path

    from calibrate.logs import recorded_path, report
    from orcasim.paths import PACKAGE_DATA_DIR

    real = _frame(ttft_s=[0.1, 0.2], tpot_s=[0.0, 0.0], e2e_s=[0.5, 0.6])
    given = [ServingLog(Path("/x/a.csv"), real), ServingLog(Path("/x/b.csv"), real)]
    result = Fit({ITER: 1e-3}, 0.25, 17, fitted_errors={"a": 0.1, "b": 0.2},
                 left_out_errors={"a": 0.3}, left_out_parameters={"a": {ITER: 2e-3}},
                 left_out_prior_weights={"a": 0.4},
                 prior=Prior(0.5, {ITER: 1e-3}), prior_penalty=0.01)
    doc = report(scenario_from_dict(SCENARIO), given, "vllm", result, ["seed=4"])
    assert doc == {
        "scenario": "by_hand", "system": "vllm", "logs": ["/x/a.csv", "/x/b.csv"],
        "set": ["seed=4"], "metrics": ["ttft_s", "e2e_s"], "fit_percentiles": [10, 25, 50, 75, 90],
        "loss": 0.25, "evaluations": 17,
        "prior": {"weight": 0.5, "chosen": "given", "centre": {ITER: 1e-3}, "penalty": 0.01},
        "parameters": {ITER: 1e-3}, "error_fitted": {"a": 0.1, "b": 0.2},
        "error_left_out": {"a": 0.3}, "parameters_left_out": {"a": {ITER: 2e-3}},
        "prior_weight_left_out": {"a": 0.4}}
    bare = report(scenario_from_dict(SCENARIO), given, "vllm", Fit({ITER: 1e-3}, 0.25, 17))
    assert "set" not in bare and "prior" not in bare
    shipped = PACKAGE_DATA_DIR / "traces" / "x.csv"
    assert recorded_path(shipped) == "traces/x.csv"
    assert recorded_path(Path("/elsewhere/x.csv")) == "/elsewhere/x.csv"
