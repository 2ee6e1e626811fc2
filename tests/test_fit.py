"""The fitter recovers known coefficients from noise-free timings, independent of hardware."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calibrate.fit import fit_profile, wls
from orcasim.config import ScenarioError
from orcasim.cost.fitted import batch_inputs, term_names

RECOVERY_RTOL = 1e-6
KNOTS = [64, 256]
TRUE_S = dict(zip(term_names(KNOTS), [3e-4, 2e-5, 1.5e-4, 4e-8, 2e-9, 1e-5, -6e-6], strict=True))


def synthetic_rows(rng: np.random.Generator, n: int = 300) -> pd.DataFrame:
    """Random decode, prefill and mixed batches, timed exactly by TRUE_S."""
    rows = []
    for _ in range(n):
        b = int(rng.integers(1, 24))
        query = np.ones(b, dtype=np.int64)
        context = rng.integers(8, 1024, b)
        if rng.random() < 0.5:
            p = int(rng.integers(2, 700))
            query, context = np.append(query, p), np.append(context, p + int(rng.integers(0, 2)) * 64)
        rows.append(batch_inputs(query, context))
    frame = pd.DataFrame(rows)
    x = np.column_stack([np.ones(len(frame))] + [frame[t] for t in ("tokens", "num_requests",
                        "sum_context_decode", "sum_prefill_sq")]
                        + [np.maximum(0, frame["tokens"] - k) for k in KNOTS])
    frame["time_s"] = x @ np.array(list(TRUE_S.values()))
    return frame


def test_noise_free_recovery() -> None:
    doc = fit_profile(synthetic_rows(np.random.default_rng(1)), KNOTS)
    got = doc["coefficients_s"]
    for name, true in TRUE_S.items():
        assert abs(got[name] - true) <= RECOVERY_RTOL * abs(true), (name, got[name], true)


def test_noise_free_quality_is_perfect() -> None:
    q = fit_profile(synthetic_rows(np.random.default_rng(2)), KNOTS)["quality"]
    assert q["heldout_r2"] > 1 - 1e-9
    assert q["p90_rel_error"] < RECOVERY_RTOL


def test_range_covers_rows() -> None:
    rows = synthetic_rows(np.random.default_rng(3), n=50)
    rng_ = fit_profile(rows, KNOTS)["range"]
    assert rng_["tokens"] == [float(rows["tokens"].min()), float(rows["tokens"].max())]
    assert rng_["max_context"][1] == float(rows["max_context"].max())


def test_wls_minimises_relative_error() -> None:
    # y = 2x, except one large outlier in absolute terms only: relative weights ignore scale.
    x = np.column_stack([np.arange(1.0, 6.0)])
    y = 2.0 * x[:, 0]
    assert np.allclose(wls(x, y), [2.0])
    y_scaled = y * np.array([1, 1, 1, 1, 1.1])  # 10% off on the largest point
    beta = wls(x, y_scaled)[0]
    assert 2.0 < beta < 2.0 * 1.1 / 5 + 2.0  # pulled by a fifth of the 10%, not by its size


def test_rows_that_cannot_tell_the_coefficients_apart_are_refused() -> None:
    """Decodes alone (tokens = requests, no prompt terms) or two distinct rows repeated:
    lstsq answered one of many solutions and the held-out R² read 1.0."""
    rows = synthetic_rows(np.random.default_rng(3))
    decodes = rows[rows["sum_prefill_sq"] == 0]
    with pytest.raises(ScenarioError, match=r"^the rows determine 3 of the 5 coefficients \(const, "):
        fit_profile(decodes, KNOTS)
    repeated = pd.concat([rows.iloc[:2]] * 10, ignore_index=True)
    with pytest.raises(ScenarioError, match="determine 2 of the 5"):
        fit_profile(repeated, KNOTS)


def test_a_knot_past_the_largest_batch_is_named() -> None:
    """A knot no row's tokens pass gives its term a column of zeros: it read as rows whose
    prompts and batches do not vary apart (a tester's finding)."""
    rows = synthetic_rows(np.random.default_rng(3))
    most = int(rows["tokens"].max())
    with pytest.raises(ScenarioError, match=rf"^knot {most + 10} tokens: no row has more tokens "
                                            rf"\(the most is {most}\); expected knots below "):
        fit_profile(rows, [64, most + 10])


def test_equal_times_have_no_held_out_r2() -> None:
    """Every row 10 ms (the constant alone): R² was -10.8, rounding's 1e-36 of spread in
    the held-out times taken for variance."""
    rows = synthetic_rows(np.random.default_rng(4), n=150)  # 38 held out: their mean rounds
    rows["time_s"] = 0.01
    q = fit_profile(rows, KNOTS)["quality"]
    assert np.isnan(q["heldout_r2"]) and q["p90_rel_error"] < RECOVERY_RTOL


def test_writing_leaves_a_users_tmp_file_alone(tmp_path) -> None:  # noqa: ANN001
    """The YAML and the profile were written through `<out stem>.tmp`, replacing a user's
    file of that name."""
    from calibrate.fit import write_cost_model
    from calibrate.profile import write_profile

    (tmp_path / "cost.tmp").write_text("mine")
    doc = fit_profile(synthetic_rows(np.random.default_rng(5)), KNOTS)
    write_cost_model(tmp_path / "cost.yaml", doc, tmp_path / "p.csv", {}, "time_s")
    write_profile(tmp_path / "cost.csv", ["model: x"], synthetic_rows(np.random.default_rng(6), 12))
    assert (tmp_path / "cost.tmp").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cost.csv", "cost.tmp", "cost.yaml"]


@pytest.mark.parametrize("target", ["cpu_s", "device_s", "measured_s"])
def test_a_target_of_the_profiled_layers_alone_says_so(tmp_path, target: str) -> None:  # noqa: ANN001
    """The profiler scales time_s alone to the whole model: cpu_s, device_s and measured_s
    are the profiled layers' times (which a replay with --layers runs). Fitted on the
    committed H200 profile (4 of GPT-3 13B's 40 layers), --target device_s gave a cost 10
    times cheap for the model with nothing said; the fit now says whose cost it is."""
    import yaml

    from calibrate.__main__ import main
    from calibrate.profile import write_profile

    rows = synthetic_rows(np.random.default_rng(7), 60)
    rows = rows.assign(max_context=1024.0, measured_s=rows["time_s"] / 10,
                       cpu_s=rows["time_s"] / 10, device_s=rows["time_s"] / 10)
    profile = tmp_path / "p.csv"
    write_profile(profile, ["model: x", "layers_profiled: 4", "layers_full: 40"], rows)
    with pytest.warns(UserWarning, match=rf"{target} is the time of the 4 of 40 layers "
                                         r"profiled \(time_s alone is scaled to all 40\)"):
        assert main(["fit", str(profile), "--out", str(tmp_path / "t.yaml"), "--target", target]) == 0
    provenance = yaml.safe_load((tmp_path / "t.yaml").read_text())["provenance"]
    assert provenance["fitted_layers"].startswith("4 of 40")
    assert main(["fit", str(profile), "--out", str(tmp_path / "w.yaml")]) == 0  # time_s: quiet
    assert "fitted_layers" not in yaml.safe_load((tmp_path / "w.yaml").read_text())["provenance"]


def test_a_profile_of_some_layers_scales_the_layers_alone(monkeypatch) -> None:  # noqa: ANN001
    """`--layers 4` of 40 multiplied the whole step by 10, embedding and LM head included: for
    GPT-3 13B's decode on the H200 (LM head 257M weights, a layer 315M) that priced a decode
    step ~18% over the 40 layers it stands for (a tester's finding). A step here costs 1 ms
    of embedding and head plus 2 ms a layer: the whole model's is 1 + 40·2 = 81 ms."""
    pytest.importorskip("torch")
    import calibrate.profile as profile
    from calibrate.model import build_model, model_args

    def fake(model, batch, grid):  # noqa: ANN001, ANN202
        step_s = 1e-3 + 2e-3 * len(model.layers)
        return [(step_s, step_s, float("nan"))] * grid.repeats

    monkeypatch.setattr(profile, "time_iteration", fake)
    full, shape = model_args("tiny"), model_args("tiny", 1)
    model = build_model(shape, "cpu", max_positions=65)
    grid = profile.GRIDS["ci"]
    rows = profile.profile_rows(model, grid, 64, 40 / shape.n_layers, np.random.default_rng(0),
                                lambda m: None)
    assert full.n_layers == 2 and len(model.layers) == 1  # the fake counts the layers it sees
    assert rows["measured_s"].to_numpy() == pytest.approx(3e-3)
    assert rows["time_s"].to_numpy() == pytest.approx(81e-3)


def test_fit_of_a_path_that_is_no_regular_file_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """/dev/null is there: 'not found' sent the user looking for it."""
    from calibrate.__main__ import main

    assert main(["fit", "/dev/null", "--out", "/nonexistent/t.yaml"]) == 2
    assert capsys.readouterr().err.strip() == ("error: profile '/dev/null' is not a regular file; "
                                               "expected a CSV of python -m calibrate profile")


@pytest.mark.parametrize("force", [False, True])
def test_a_file_written_at_the_out_path_while_fit_ran_is_kept_without_force(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        force: bool) -> None:  # noqa: ANN001
    """`--out` is checked free before the work, and the file was then renamed into place
    whatever had appeared there meanwhile: another run's file at that path was replaced
    without --force (calibrate logs runs for minutes). A file written meanwhile is now kept
    and this run refused in one line, exit 2, as `orcasim run` refuses a folder; --force
    still replaces it."""
    import calibrate.fit
    from calibrate.__main__ import main
    from calibrate.profile import write_profile

    profile, out = tmp_path / "p.csv", tmp_path / "cost.yaml"
    write_profile(profile, ["model: x"], synthetic_rows(np.random.default_rng(8), 60))
    real_fit = calibrate.fit.fit_profile

    def fit_while_another_run_writes(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out.write_text("another run's cost\n")
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(calibrate.fit, "fit_profile", fit_while_another_run_writes)
    code = main(["fit", str(profile), "--out", str(out), *(["--force"] if force else [])])
    if force:
        assert code == 0 and "format: orcasim-fitted-cost/v1" in out.read_text()
    else:
        assert code == 2 and out.read_text() == "another run's cost\n"
        assert "was written by another run while this one ran; nothing was replaced" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cost.yaml", "p.csv"]  # no temporary left


# --- by hand: the weights, the held-out quality and the document (the mutation scope
# calibrate-logs found these unpinned: R² read as 1 + resid / total, relative errors as
# |error| * time, and in-sample splits all passed the noise-free tests above) -------------

def test_wls_weighs_each_row_by_one_over_its_time() -> None:
    """One coefficient and rows of 1 and 2 s: min (b - 1)^2 + ((b - 2) / 2)^2 is at
    b = (1 + 1/2) / (1 + 1/4) = 1.2 (plain least squares: 1.5)."""
    assert wls(np.ones((2, 1)), np.array([1.0, 2.0])) == pytest.approx([1.2], rel=1e-12)


class _Splits:
    """A stand-in for the generator: hands out the given permutations in turn."""

    def __init__(self, perms: list[list[int]]) -> None:
        self.perms, self.k = perms, 0

    def permutation(self, n: int) -> np.ndarray:
        perm = self.perms[self.k % len(self.perms)]
        self.k += 1
        assert sorted(perm) == list(range(n))
        return np.array(perm)


def _intercept_fit(y: np.ndarray) -> float:
    """The relative-error fit of a constant: sum(1/y) / sum(1/y^2)."""
    return float(np.sum(1 / y) / np.sum(1 / y ** 2))


def test_held_out_quality_by_hand() -> None:
    """Eight rows, two held out a split (a quarter). Split A holds out the rows of 1 and
    4 s and fits 8/3 on the others: R² = 1 - (25/9 + 16/9) / 4.5, relative errors 5/3 and
    1/3. The twenty splits alternate A and B: R² is their mean, the errors are pooled."""
    from calibrate.fit import SPLITS, heldout_quality

    y = np.array([1.0, 2.0, 2.0, 4.0, 4.0, 4.0, 8.0, 8.0])
    x = np.ones((8, 1))
    perm_a = [0, 3, 1, 2, 4, 5, 6, 7]
    perm_b = [6, 1, 0, 2, 3, 4, 5, 7]
    fit_a = _intercept_fit(y[[1, 2, 4, 5, 6, 7]])
    assert fit_a == pytest.approx(8 / 3)
    r2_a = 1 - (25 / 9 + 16 / 9) / 4.5
    fit_b = _intercept_fit(y[[0, 2, 3, 4, 5, 7]])
    r2_b = 1 - ((8 - fit_b) ** 2 + (2 - fit_b) ** 2) / 18.0
    q = heldout_quality(x, y, _Splits([perm_a, perm_b]))  # type: ignore[arg-type]
    assert q.heldout_r2 == pytest.approx((r2_a + r2_b) / 2, rel=1e-12)
    errors = np.array([5 / 3, 1 / 3, abs(fit_b - 8) / 8, abs(fit_b - 2) / 2] * (SPLITS // 2))
    assert q.median_rel_error == pytest.approx(float(np.median(errors)), rel=1e-12)
    assert q.p90_rel_error == pytest.approx(float(np.percentile(errors, 90)), rel=1e-12)


def test_held_out_errors_reach_their_90th_percentile_between_values() -> None:
    """Twenty distinct splits (the first twenty pairs of rows): forty held-out errors, the
    90th percentile interpolated between two of them."""
    import itertools

    from calibrate.fit import heldout_quality

    y = np.array([1.0, 1.5, 2.0, 3.0, 5.0, 7.0, 11.0, 13.0])
    pairs = list(itertools.combinations(range(8), 2))[:20]
    perms = [[i, j, *(k for k in range(8) if k not in (i, j))] for i, j in pairs]
    errors = []
    for i, j in pairs:
        b = _intercept_fit(np.delete(y, [i, j]))
        errors += [abs(b - y[i]) / y[i], abs(b - y[j]) / y[j]]
    q = heldout_quality(np.ones((8, 1)), y, _Splits(perms))  # type: ignore[arg-type]
    assert q.p90_rel_error == pytest.approx(float(np.percentile(errors, 90)), rel=1e-12)
    assert q.median_rel_error == pytest.approx(float(np.median(errors)), rel=1e-12)


def test_four_rows_hold_out_one_a_split_which_has_no_r2() -> None:
    """A quarter of 4 rows is one: one held-out time has no spread, so no R², and its
    relative errors are still pooled."""
    import warnings

    from calibrate.fit import heldout_quality

    y = np.array([1.0, 2.0, 4.0, 8.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Mean of empty slice" is not the user's to read
        q = heldout_quality(np.ones((4, 1)), y, _Splits([[0, 1, 2, 3]]))  # type: ignore[arg-type]
    assert np.isnan(q.heldout_r2)
    assert q.median_rel_error == pytest.approx(abs(_intercept_fit(y[1:]) - 1.0))


@pytest.mark.parametrize(("times_s", "has_r2"), [
    # Held-out times 1.4e-10 s apart at 1 ms: spread 1e-20 s^2 against 2e-26 (1e-20 of their
    # squares): an R².
    ([1e-3, 1e-3 + 1.4e-10], True),
    # 4.5e-14 s apart: 1e-27 s^2, under 2e-26: none.
    ([1e-3, 1e-3 + 4.5e-14], False),
    # At 1000 s, 1e-8 s apart: 5e-17 s^2 against 2e-14: none.
    ([1e3, 1e3 + 1e-8], False),
])
def test_an_r2_needs_a_held_out_spread_of_1e_20_of_the_squares(times_s: list[float],
                                                                has_r2: bool) -> None:
    from calibrate.fit import heldout_quality

    y = np.array([*times_s, *[times_s[0]] * 6])
    q = heldout_quality(np.ones((8, 1)), y, _Splits([list(range(8))]))  # type: ignore[arg-type]
    assert np.isnan(q.heldout_r2) != has_r2


def test_the_default_seed_is_zero_and_the_quality_repeats() -> None:
    rows = synthetic_rows(np.random.default_rng(7), n=60)
    rows["time_s"] *= np.random.default_rng(8).uniform(0.9, 1.1, len(rows))
    once = fit_profile(rows, KNOTS)["quality"]
    assert once == fit_profile(rows, KNOTS, seed=0)["quality"]
    assert once != fit_profile(rows, KNOTS, seed=1)["quality"]


def test_the_document_says_what_it_holds() -> None:
    from calibrate.fit import SPLITS, TEST_FRACTION
    from orcasim.cost.fitted import FORMAT

    rows = synthetic_rows(np.random.default_rng(9), n=40)
    doc = fit_profile(rows, KNOTS)
    assert list(doc) == ["format", "formula", "knots_tokens", "coefficients_s", "range", "quality"]
    assert doc["format"] == FORMAT and doc["knots_tokens"] == KNOTS
    assert doc["formula"] == "time_s = Σ coefficients_s[term] · term (terms: see orcasim.cost.fitted)"
    assert list(doc["coefficients_s"]) == term_names(KNOTS)
    assert list(doc["quality"]) == ["heldout_r2", "median_rel_error", "p90_rel_error", "splits",
                                    "test_fraction", "rows"]
    assert (doc["quality"]["splits"], doc["quality"]["test_fraction"], doc["quality"]["rows"]) \
        == (SPLITS, TEST_FRACTION, 40)


def test_the_fewest_rows_are_a_coefficient_each_and_two_held_out() -> None:
    from calibrate.fit import rows_to_fit

    assert rows_to_fit([]) == 5 + 2 and rows_to_fit((64, 256)) == 7 + 2


def test_a_knot_at_the_largest_batch_is_named() -> None:
    rows = synthetic_rows(np.random.default_rng(10), n=80)
    most = int(rows["tokens"].max())
    with pytest.raises(ScenarioError, match=rf"^knot {most} tokens: no row has more tokens \(the "
                       rf"most is {most}\); expected knots below the profile's largest batch$"):
        fit_profile(rows, [64, most])


def test_rows_that_determine_too_few_coefficients_say_which_in_full() -> None:
    rows = synthetic_rows(np.random.default_rng(11), n=30).iloc[[0] * 12]
    with pytest.raises(ScenarioError) as info:
        fit_profile(rows, KNOTS)
    assert str(info.value) == (
        f"the rows determine 1 of the 5 coefficients ({', '.join(term_names([]))}); expected "
        "rows whose prompt tokens, decode batch sizes and contexts vary apart, as python -m "
        "calibrate profile's grid does")


def test_the_written_cost_model_keeps_its_provenance_and_refuses_to_replace(
        tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The YAML: its comment line, the document in its order with Σ as written, and the
    provenance (profile, target, header, the UTC time, whatever the local zone)."""
    import time
    from datetime import UTC, datetime

    import yaml

    from calibrate.fit import write_cost_model

    monkeypatch.setenv("TZ", "Etc/GMT-9")
    time.tzset()
    try:
        doc = fit_profile(synthetic_rows(np.random.default_rng(12), n=40), KNOTS)
        out = tmp_path / "cost.yaml"
        write_cost_model(out, doc, tmp_path / "p.csv", {"gpu": "H100"}, "device_s")
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    text = out.read_text()
    assert text.startswith("# Written by `python -m calibrate fit`; loaded by "
                           "`cost: {kind: fitted, path: ...}`.\nformat: ")
    assert "formula: 'time_s = Σ coefficients_s[term]" in text
    written = yaml.safe_load(text)
    assert list(written) == [*doc, "provenance"]
    provenance = written["provenance"]
    fitted_at = datetime.strptime(provenance.pop("fitted_at"), "%Y-%m-%dT%H:%M:%SZ")
    assert abs((datetime.now(UTC).replace(tzinfo=None) - fitted_at).total_seconds()) < 60
    assert provenance == {"profile": str(tmp_path / "p.csv"), "target_column": "device_s",
                          "gpu": "H100"}
    with pytest.raises(FileExistsError):
        write_cost_model(out, doc, tmp_path / "p.csv", {}, "time_s")
