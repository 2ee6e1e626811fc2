"""Figures: pure functions of frames; every axis labelled; `orcasim plot` writes them all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.figure import Figure
from sweep_files import TINY_SCENARIO
from typer.testing import CliRunner

from orcasim.cli import app
from orcasim.columns import param_columns
from orcasim.plots import (
    binned_time_average,
    latency_cdfs,
    latency_vs_throughput,
    percentile_bands,
    sweep_figures,
    sweep_lines,
    timelines,
)
from orcasim.render import write_plots
from orcasim.sweeps import load_sweep, run_sweep_in_memory
from tests.conftest import examples

EXACT = 1e-12


def iterations(rows: list[tuple[float, float, int]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["start_s", "duration_s", "batch_size"]).assign(system="s")


def test_binned_time_average_is_exact() -> None:
    # batch 2 on [0, 1), idle on [1, 2), batch 4 on [2, 4): bins of 2 s average 1 and 4.
    frame = iterations([(0.0, 1.0, 2), (2.0, 2.0, 4)])
    got = binned_time_average(frame, "batch_size", np.array([0.0, 2.0, 4.0]))
    np.testing.assert_allclose(got, [1.0, 4.0], atol=EXACT)
    # A row spanning a bin edge is split between the bins.
    got = binned_time_average(iterations([(0.0, 3.0, 6)]), "batch_size", np.array([0.0, 2.0, 4.0]))
    np.testing.assert_allclose(got, [6.0, 3.0], atol=EXACT)


def test_binned_time_average_of_no_rows_is_idle() -> None:
    # No rows: idle in every bin, as between rows. It raised a ValueError from column_stack
    # on, say, `iters[iters["replica"] == 3]` of a replica the router never used.
    frame = iterations([(0.0, 1.0, 2)]).iloc[:0]
    got = binned_time_average(frame, "batch_size", np.array([0.0, 1.0, 2.0]))
    np.testing.assert_array_equal(got, [0.0, 0.0])


def test_binned_time_average_does_not_depend_on_the_rows_order() -> None:
    # A frame sorted by another column (a notebook's `iters.sort_values("batch_size")`)
    # holds the same timeline: the integral was taken in row order, and np.interp on
    # times out of order gave [12.4, 0, ...] where the timeline averages 1 to 2.
    frame = iterations([(0.0, 1.0, 2), (2.0, 2.0, 4), (5.0, 1.0, 1)])
    edges = np.array([0.0, 2.0, 4.0, 6.0])
    expected = binned_time_average(frame, "batch_size", edges)
    np.testing.assert_allclose(expected, [1.0, 4.0, 0.5], atol=EXACT)
    for order in ([2, 1, 0], [1, 0, 2], [0, 2, 1]):
        got = binned_time_average(frame.iloc[order], "batch_size", edges)
        np.testing.assert_allclose(got, expected, atol=EXACT)


def test_a_summed_column_is_averaged_per_iteration_by_hand() -> None:
    # A fast-mode row of 4 iterations over [0, 4) with 3 waiting in each holds 12: the
    # queue's time average is 3 there, not 12; idle [4, 6) halves the second bin's.
    frame = iterations([(0.0, 4.0, 2)]).assign(num_iterations=4, num_waiting=12)
    got = binned_time_average(frame, "num_waiting", np.array([0.0, 2.0, 6.0]))
    np.testing.assert_allclose(got, [3.0, 1.5], atol=EXACT)


@pytest.mark.parametrize("scheduler", [{"kind": "request_level", "max_batch_size": 4},
                                       {"kind": "paged", "max_num_seqs": 4}])
def test_the_queue_over_time_is_the_same_in_fast_and_reference_mode(scheduler: dict) -> None:
    """Fast mode's rows cover whole jumps; the time-averaged queue must not depend on it
    (it was the sum over each jump's iterations, about 100 times too high)."""
    from orcasim.run import run_scenario
    from tests.conftest import make_scenario

    averages = {}
    for mode in ("fast", "reference"):
        scenario = make_scenario(**{"seed": 1, "workload.num_requests": 200, "engine.mode": mode,
                                    "workload.arrival.rate_per_s": 30.0,
                                    "systems": [{"name": "s", "scheduler": scheduler}]})
        rows = run_scenario(scenario).systems["s"].iterations
        edges = np.linspace(0.0, float((rows["start_s"] + rows["duration_s"]).max()), 11)
        averages[mode] = binned_time_average(rows, "num_waiting", edges)
    assert averages["reference"].max() > 0.5
    np.testing.assert_allclose(averages["fast"], averages["reference"], rtol=0.05, atol=0.05)


def assert_labelled(fig: Figure) -> None:
    for ax in fig.axes:
        if ax.get_visible():
            assert ax.get_xlabel() and ax.get_ylabel()


def test_timelines_have_three_labelled_panels() -> None:
    frame = iterations([(0.0, 1.0, 2), (2.0, 2.0, 4)]).assign(num_waiting=1, kv_reserved_tokens=100)
    fig = timelines(frame)
    assert [ax.get_ylabel() for ax in fig.axes] == [
        "batch size (requests)", "queue length (requests)", "KV reserved (tokens)"]
    assert fig.axes[-1].get_xlabel() == "simulated time (s)"


def test_a_clusters_timeline_says_its_lines_are_summed_over_replicas() -> None:
    """A cluster's panels sum its replicas (two replicas of batch 2 at once read 4), under
    the label 'batch size (requests)', a batch no replica ran (a tester's note)."""
    frame = iterations([(0.0, 1.0, 2), (0.0, 1.0, 2)]).assign(
        num_waiting=1, kv_reserved_tokens=100, replica=[0, 1])
    fig = timelines(frame, num_bins=1)
    assert fig.axes[0].lines[0].get_ydata()[0] == pytest.approx(4.0)
    assert [ax.get_ylabel() for ax in fig.axes] == [
        "batch size (requests),\nsummed over replicas", "queue length (requests),\nsummed over "
        "replicas", "KV reserved (tokens),\nsummed over replicas"]


@pytest.fixture(scope="module")
def sweep_table(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    folder = tmp_path_factory.mktemp("sweep")
    (folder / "tiny.yaml").write_text(TINY_SCENARIO)
    (folder / "s.yaml").write_text(
        "name: s\nbase: tiny.yaml\nreplications: 2\ngrid:\n  parameters:\n"
        "    workload.arrival.rate_per_s: [1.0, 4.0]\n    systems[1].scheduler.max_batch_size: [2, 8]\n")
    return run_sweep_in_memory(load_sweep(folder / "s.yaml"), workers=1).table


def test_sweep_lines_do_not_repeat_unaffected_systems(sweep_table: pd.DataFrame) -> None:
    labels = [line.label for line in sweep_lines(sweep_table, ("workload.arrival.rate_per_s",))]
    assert labels == ["request-level", "orca, max_batch_size=2", "orca, max_batch_size=8"]


def test_a_table_of_some_systems_splits_each_by_what_changes_it(sweep_table: pd.DataFrame) -> None:
    """A system's index was read from its place among the table's systems: Orca's rows alone
    (a notebook's filter) made it system 0, so systems[1]'s batch size was another system's,
    and one line labelled 'orca' drew batch size 2's points alone (a tester's finding)."""
    rate = ("workload.arrival.rate_per_s",)
    orca = sweep_table[sweep_table["system"] == "orca"]
    assert [line.label for line in sweep_lines(orca, rate)] == [
        "orca, max_batch_size=2", "orca, max_batch_size=8"]
    assert len(latency_vs_throughput(orca).axes[0].get_lines()) == 2
    request_level = sweep_table[sweep_table["system"] == "request-level"]
    assert [line.label for line in sweep_lines(request_level, rate)] == ["request-level"]
    # Points run on another CPU (a Ray node) may differ in a float's last digits: no change.
    noisy = sweep_table.copy()
    other = (noisy["system"] == "request-level") & (noisy["systems[1].scheduler.max_batch_size"] == 8)
    noisy.loc[other, "throughput_rps"] *= 1 + 1e-13
    assert [line.label for line in sweep_lines(noisy, rate)][0] == "request-level"


def test_a_zip_grid_draws_each_system_through_all_its_points() -> None:
    """A zip grid moves systems[1]'s batch size with the rate: request-level kept the rows of
    the batch size's first value (one point of three) and orca split into three one-point
    lines (a tester's finding); a product grid still pins and splits (above)."""
    rate, batch = "workload.arrival.rate_per_s", "systems[1].scheduler.max_batch_size"
    table = pd.DataFrame({
        "point": [0, 0, 1, 1, 2, 2], "replication": 0, "seed": 0,
        rate: [1.0, 1.0, 3.0, 3.0, 6.0, 6.0], batch: [4, 4, 8, 8, 16, 16],
        "system": ["request-level", "orca"] * 3, "throughput_rps": [1.0, 1.0, 2.9, 3.0, 4.0, 5.9],
        "normalized_latency_s_per_token_p50": [0.1, 0.05, 0.2, 0.06, 0.9, 0.08]})
    lines = list(sweep_lines(table, (rate,)))
    assert [(line.label, len(line.rows)) for line in lines] == [("request-level", 3), ("orca", 3)]
    assert len(latency_vs_throughput(table).axes[0].get_lines()) == 2
    both = table.rename(columns={rate: "systems[0].scheduler.max_batch_size"})
    lines = list(sweep_lines(both, ("systems[0].scheduler.max_batch_size",)))
    assert [(line.label, len(line.rows)) for line in lines] == [("request-level", 3), ("orca", 3)]


def test_latency_vs_throughput_draws_one_line_per_system_and_slo(sweep_table: pd.DataFrame) -> None:
    fig = latency_vs_throughput(sweep_table, slo=0.05)
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 3 + 1
    assert ax.get_xlabel() == "achieved throughput (req/s)"
    assert "normalized latency" in ax.get_ylabel()
    xs = ax.get_lines()[0].get_xdata()
    assert list(xs) == sorted(xs)
    # The SLO line names its unit: 'SLO = 0.05' did not say s/token.
    assert ax.get_lines()[-1].get_label() == "SLO = 0.05 s/token"


def test_a_metric_at_zero_is_drawn_on_a_linear_axis_with_a_warning(sweep_table: pd.DataFrame) -> None:
    """A log axis silently drops a point at 0: queue delay at light load went missing."""
    table = sweep_table.copy()
    light = (table["system"] == "request-level") & (table["workload.arrival.rate_per_s"] == 1.0)
    table.loc[light, "normalized_latency_s_per_token_p50"] = 0.0  # every replication's
    with pytest.warns(UserWarning, match="reaches 0, which a log axis cannot show"):
        fig = latency_vs_throughput(table)
    assert fig.axes[0].get_yscale() == "linear"
    assert latency_vs_throughput(sweep_table).axes[0].get_yscale() == "log"


def test_a_log_latency_axis_starts_at_a_labelled_value(sweep_table: pd.DataFrame) -> None:
    """Over a span of 10x to 1000x only 1, 2 and 5 x 10^k are labelled, and the axis began
    just under the lowest line: Orca's lines at 0.024 s/token sat under the lowest label,
    0.05, in the README's Orca figure. The axis now starts at such a value."""
    table = sweep_table.copy()
    table["normalized_latency_s_per_token_p50"] = np.where(
        table["system"] == "request-level", 2.0, 0.024 + table["workload.arrival.rate_per_s"] * 1e-3)
    ax = latency_vs_throughput(table).axes[0]
    low, _ = ax.get_ylim()
    assert low == pytest.approx(0.02)
    assert ax.yaxis.get_minor_formatter()(low, 0) == "0.02"


def test_latency_vs_throughput_runs_lines_along_a_chosen_parameter(sweep_table: pd.DataFrame) -> None:
    # Along the batch size, each line is one rate, with a point per batch size.
    fig = latency_vs_throughput(sweep_table, along="systems[1].scheduler.max_batch_size", title="by batch")
    ax = fig.axes[0]
    assert ax.get_title() == "by batch"
    assert [line.get_label() for line in ax.get_lines()] == [
        "request-level, rate_per_s=1.0", "request-level, rate_per_s=4.0", "orca, rate_per_s=1.0", "orca, rate_per_s=4.0"]
    assert all(len(line.get_xdata()) == 2 for line in ax.get_lines())


def test_percentile_bands_span_replications(sweep_table: pd.DataFrame) -> None:
    fig = percentile_bands(sweep_table, "workload.arrival.rate_per_s")
    assert_labelled(fig)
    assert len(fig.axes[0].collections) == 3  # one band per line


def test_each_swept_parameter_gets_its_own_bands_figure(sweep_table: pd.DataFrame) -> None:
    """Two parameters ending alike (`high`) drew one figure over the other, as one name."""
    table = sweep_table.rename(columns={"workload.arrival.rate_per_s": "workload.prompt_tokens.high"})
    seed_at = list(table.columns).index("seed") + 1
    table.insert(seed_at, "workload.output_tokens.high", 64)
    figures = sweep_figures(table)
    assert {"bands_workload.output_tokens.high", "bands_workload.prompt_tokens.high"} <= set(figures)
    assert len(figures) == len(param_columns(table)) + 1
    assert "bands_rate_per_s" in sweep_figures(sweep_table)  # short where nothing clashes


def test_plot_command_writes_png_and_svg(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO)
    out = tmp_path / "run"
    assert CliRunner().invoke(app, ["run", str(scenario), "--out", str(out), "--no-plots"]).exit_code == 0
    res = CliRunner().invoke(app, ["plot", str(out), "--svg"])
    assert res.exit_code == 0, res.output
    names = sorted(p.name for p in out.glob("*.*g"))
    assert names == ["latency_cdf.png", "latency_cdf.svg", "timelines.png", "timelines.svg"]
    with pytest.warns(UserWarning, match="--slo 0.5 is not drawn: .* is a run folder"):
        write_plots(out, slo=0.5)


def test_plot_redraws_a_cluster_s_per_replica_figure_as_run_draws_it(tmp_path: Path) -> None:
    # The README lists replicas_<system>.png among the figures plot (re)writes; it drew only
    # the CDFs and timelines (a tester's find).
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO.replace(
        "max_batch_size: 4}}\n", "max_batch_size: 4}, cluster: {replicas: 2}}\n", 1))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", str(scenario), "--out", str(out)])
    assert res.exit_code == 0, res.output
    drawn = sorted(p.name for p in out.glob("*.png"))
    assert "replicas_request-level.png" in drawn
    for path in out.glob("*.png"):
        path.unlink()
    assert CliRunner().invoke(app, ["plot", str(out)]).exit_code == 0
    assert sorted(p.name for p in out.glob("*.png")) == drawn


def test_a_plot_that_fails_midway_leaves_a_folder_force_replaces(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The figure written before a failing one was left unlisted in the folder's marker, and
    `run --force` then refused the folder as holding a file orcasim did not write."""
    import orcasim.results as results

    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO)
    out = tmp_path / "run"
    assert CliRunner().invoke(app, ["run", str(scenario), "--out", str(out), "--no-plots"]).exit_code == 0
    real = results._save_as

    def second_fails(fig: Figure, kind: str, tmp: Path) -> None:
        if "timelines" in tmp.name:
            raise OSError(28, "No space left on device")
        real(fig, kind, tmp)

    monkeypatch.setattr(results, "_save_as", second_fails)
    with pytest.raises(OSError):
        write_plots(out, svg=True)
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]  # nothing half-written
    assert next(results.unlisted_files(out), None) is None
    results.check_replaceable(out)


def test_a_figure_plotted_twice_is_the_same_file(tmp_path: Path) -> None:
    # An SVG held its date and random ids: two plots of one run differed in 600 lines.
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO)
    out = tmp_path / "run"
    assert CliRunner().invoke(app, ["run", str(scenario), "--out", str(out), "--no-plots"]).exit_code == 0
    first = {p.name: p.read_bytes() for p in write_plots(out, svg=True)}
    again = {p.name: p.read_bytes() for p in write_plots(out, svg=True)}
    assert any(name.endswith(".svg") for name in first) and first == again


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.01, 3.0), st.integers(0, 32)),
                min_size=1, max_size=20),
       st.integers(1, 50))
def test_binned_time_average_preserves_the_integral(
    rows: list[tuple[float, float, int]], num_bins: int
) -> None:
    # Rows back to back after their gaps, as the engine records them.
    start, table = 0.0, []
    for gap_s, duration_s, batch in rows:
        start += gap_s
        table.append((start, duration_s, batch))
        start += duration_s
    frame = iterations(table)
    edges = np.linspace(0.0, start, num_bins + 1)
    avg = binned_time_average(frame, "batch_size", edges)
    area = float((frame["batch_size"] * frame["duration_s"]).sum())
    assert float((avg * np.diff(edges)).sum()) == pytest.approx(area, rel=1e-9)


def test_saturated_points_are_ringed_and_cdfs_labelled(sweep_table: pd.DataFrame) -> None:
    from orcasim.plots import SATURATED, latency_cdfs

    table = sweep_table.assign(saturated=0.0)
    assert SATURATED not in latency_vs_throughput(table).axes[0].get_legend_handles_labels()[1]
    last = table.iloc[-1]
    same_point = (table["system"] == last["system"]) & (table["point"] == last["point"])
    table.loc[same_point, "saturated"] = 1.0  # every replication of one point
    labels = latency_vs_throughput(table).axes[0].get_legend_handles_labels()[1]
    assert labels.count(SATURATED) == 1
    reqs = pd.DataFrame({"system": ["a", "a", "b", "b"], "ttft_s": [0.1, 0.2, 0.1, 0.3],
                         "tpot_s": [0.01] * 4, "e2e_s": [1.0, 2.0, 1.0, 3.0],
                         "normalized_latency_s_per_token": [0.1] * 4})
    fig = latency_cdfs(reqs, frozenset({"b"}))
    lines = {line.get_label(): line.get_linestyle() for line in fig.axes[0].get_lines()}
    assert lines == {"a": "-", f"b ({SATURATED})": ":"}


def test_capacity_figures() -> None:
    from orcasim.plots import attainment_vs_rate, cost_latency_pareto

    evaluations = pd.DataFrame({
        "point": 0, "system": ["s"] * 4, "rate_per_s": [1.0, 2.0, 4.0, 3.0],
        "slo_attainment": [1.0, 0.95, 0.2, 0.6], "saturated": [0.0, 0.0, 1.0, 0.0],
        "passes": [1.0, 1.0, 0.0, 0.0]})
    capacity = pd.DataFrame({"point": [0], "system": ["s"], "max_rate_per_s": [2.0]})
    fig = attainment_vs_rate(evaluations, capacity, 0.9)
    assert_labelled(fig)
    ax = fig.axes[0]
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [2.0, 0.0]  # capacity, target
    assert ax.get_lines()[1].get_ydata()[0] == 0.9
    table = pd.DataFrame({"system": ["s", "s", "s"], "cost_per_million_tokens": [1.0, 2.0, 3.0],
                          "lat": [3.0, 1.0, 2.0]})
    fig = cost_latency_pareto(table, table.iloc[[0, 1]], "lat")
    assert_labelled(fig)
    assert fig.axes[0].get_lines()[0].get_xdata().tolist() == [3.0, 1.0]


def test_figures_refuse_what_they_cannot_draw_by_name() -> None:
    """A sweep whose every point failed has an empty table (pandas' KeyError: 'system'
    before); a metric or a parameter the table lacks is named; no window, no figure."""
    with pytest.raises(ValueError, match=r"^the sweep table has no rows \(a sweep whose every "
                                         r"point failed\?\): nothing to plot$"):
        sweep_figures(pd.DataFrame())
    table = pd.DataFrame({"system": ["a"], "throughput_rps": [1.0], "e2e_s_p50": [0.5],
                          "workload.arrival.rate_per_s": [1.0]})
    with pytest.raises(ValueError, match=r"^the sweep table has no column 'e2e_p50'; its "
                                         r"columns: system, throughput_rps, "):
        latency_vs_throughput(table, metric="e2e_p50")
    with pytest.raises(ValueError, match="no column 'rate_per_s'"):
        percentile_bands(table, "rate_per_s")
    with pytest.raises(ValueError, match="num_bins = 0"):
        timelines(iterations([(0.0, 1.0, 1)]), num_bins=0)


def test_a_metric_named_alone_and_a_fidelity_frame_without_its_columns_are_one_line() -> None:
    """`percentile_bands(table, x, "ttft_s_p50")` drew that metric, where its letters were
    taken for metrics ("no column 't', 't', 'f', ..."); a frame missing what fidelity_cdfs
    reads was a bare KeyError."""
    from orcasim.plots import fidelity_cdfs

    table = pd.DataFrame({"point": [0, 1], "replication": [0, 0], "seed": [1, 2], "system": ["a", "a"],
                          "e2e_s_p50": [0.5, 0.7], "workload.arrival.rate_per_s": [1.0, 2.0]})
    fig = percentile_bands(table, "workload.arrival.rate_per_s", "e2e_s_p50")
    assert [ax.get_ylabel() for ax in fig.axes if ax.get_visible()] == [
        "median end-to-end latency (s)"]
    frame = pd.DataFrame({"ttft_s": [0.1], "e2e_s": [0.5], "source": ["real"]})
    with pytest.raises(ValueError, match=r"^the real-against-simulated frame has no column "
                                         r"'tpot_s'; its columns: ttft_s, e2e_s, source$"):
        fidelity_cdfs(frame, "x")
    with pytest.raises(ValueError, match="has no column 'source'"):
        fidelity_cdfs(frame.drop(columns="source").assign(tpot_s=0.01), "x")


def test_one_systems_frames_and_a_lone_request_draw() -> None:
    """A frame of one system (`SystemResult.requests`, no `system` column) is drawn as one
    system; a single request's CDF is a visible point, not a line of one point."""
    one = pd.DataFrame({"ttft_s": [0.1], "tpot_s": [0.02], "e2e_s": [0.5],
                        "normalized_latency_s_per_token": [0.05]})
    fig = latency_cdfs(one)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 1 and lines[0].get_marker() == "o" and lines[0].get_label() == "this run"
    frame = iterations([(0.0, 1.0, 2), (1.0, 1.0, 3)]).drop(columns="system", errors="ignore")
    assert isinstance(timelines(frame, columns=("batch_size",)), Figure)


def test_a_trace_s_speedup_is_the_load_its_lines_run_along(sweep_table: pd.DataFrame) -> None:
    """A sweep over a trace's speed-up drew one loose point per (system, value): no line
    named a rate, so each load value was a line of its own."""
    from orcasim.plots import load_parameter

    table = sweep_table.rename(columns={"workload.arrival.rate_per_s": "workload.arrival.speedup"})
    assert load_parameter(table) == "workload.arrival.speedup"
    lines = latency_vs_throughput(table).axes[0].get_lines()
    assert [len(line.get_xdata()) for line in lines] == [2, 2, 2]  # two loads, three lines


def test_a_point_saturated_in_one_replication_of_two_is_ringed(sweep_table: pd.DataFrame) -> None:
    """Ringed where any replication saturated: a majority rule left one of two unmarked."""
    from orcasim.plots import SATURATED

    table = sweep_table.assign(saturated=0.0)
    table.loc[table.index[-1], "saturated"] = 1.0  # one replication of one point
    assert SATURATED in latency_vs_throughput(table).axes[0].get_legend_handles_labels()[1]


def test_the_cdfs_count_the_requests_the_summary_counts() -> None:
    """After the warm-up only: the figure counted every request, the summary the later."""
    from orcasim.plots import latency_cdfs

    reqs = pd.DataFrame({"system": ["a"] * 4, "arrival_s": [0.0, 1.0, 2.0, 3.0],
                         "ttft_s": [9.0, 9.0, 0.1, 0.3], "tpot_s": [0.01] * 4,
                         "e2e_s": [9.0, 9.0, 1.0, 3.0], "normalized_latency_s_per_token": [0.1] * 4})
    fig = latency_cdfs(reqs, warmup_s=2.0)
    assert fig.axes[0].get_lines()[0].get_xdata().tolist() == [0.1, 0.1, 0.3]  # steps from 0
    assert "after the 2 s warm-up" in fig._suptitle.get_text()
    # A warm-up past every arrival drew four empty panels without a word (a tester's note).
    with pytest.raises(ValueError, match=r"^warmup_s = 5: no request arrives at or after it "
                                         r"\(the last at 3 s\); expected a warm-up before the "
                                         r"last arrival$"):
        latency_cdfs(reqs, warmup_s=5.0)


def test_plot_refuses_a_damaged_run_folder_and_a_meaningless_slo_on_one_line(
        tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO)
    out = tmp_path / "run"
    assert CliRunner().invoke(app, ["run", str(scenario), "--out", str(out), "--no-plots"]).exit_code == 0
    # -1, 0, inf: exit 0, a legend entry and no line; 1e308: numpy's overflow warning
    for value in ("-1", "0", "inf", "1e308"):
        res = CliRunner().invoke(app, ["plot", str(out), f"--slo={value}"])
        assert res.exit_code == 2, res.output
        assert "expected a positive number of seconds per token, at most 1e+09" in res.output
    for system in ("request-level", "orca"):  # a KeyError traceback
        path = out / system / "requests.parquet"
        pd.read_parquet(path).drop(columns="ttft_s").to_parquet(path)
    res = CliRunner().invoke(app, ["plot", str(out)])
    assert res.exit_code == 2, res.output
    assert "the requests table has no column 'ttft_s'" in res.output and "\n" == res.output[-1]
    assert res.output.count("\n") == 1


def test_a_cluster_beside_a_plain_system_names_its_replicas_as_integers(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO.replace(
        "max_batch_size: 4}}\n", "max_batch_size: 4}, cluster: {replicas: 2}}\n", 1))
    from orcasim.plots import run_figures
    from orcasim.run import run_scenario

    result = run_scenario(str(scenario))  # request-level is the cluster, orca plain
    fig = run_figures(result)["replicas_request-level"]
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["replica 0", "replica 1"], labels  # 'replica 0.0' beside a plain system


def test_plot_redraws_a_run_s_cdfs_after_its_warm_up_as_run_drew_them(tmp_path: Path) -> None:
    """The warm-up comes from the scenario.yaml the run wrote: the same figure, byte for byte
    (plot drew every request); without that file, every request, said so."""
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO + "warmup_s: 5.0\n")
    out = tmp_path / "run"
    assert CliRunner().invoke(app, ["run", str(scenario), "--out", str(out)]).exit_code == 0
    drawn = (out / "latency_cdf.png").read_bytes()
    write_plots(out)
    assert (out / "latency_cdf.png").read_bytes() == drawn
    (out / "scenario.yaml").unlink()
    with pytest.warns(UserWarning, match="no scenario.yaml, so its warm-up is unknown"):
        write_plots(out)
    assert (out / "latency_cdf.png").read_bytes() != drawn


def test_plot_refuses_a_hand_edited_warm_up_it_cannot_draw(tmp_path: Path) -> None:
    """-5 and NaN drew figures and 1e9 empty CDFs, where a scenario refuses each (a
    tester's finding)."""
    from orcasim.config import ScenarioError

    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO)
    out = tmp_path / "run"
    assert CliRunner().invoke(app, ["run", str(scenario), "--out", str(out), "--no-plots"]).exit_code == 0
    text = "\n".join(line for line in (out / "scenario.yaml").read_text().splitlines()
                     if not line.startswith("warmup_s:")) + "\n"
    for edited, phrase in (("-5", "warmup_s = -5: expected a number of seconds from 0"),
                          (".nan", "warmup_s = nan: expected"),
                          ("true", "not the scenario orcasim run writes"),
                          ("1.0e+8", r"warmup_s = 1e\+08 is past the last arrival")):
        (out / "scenario.yaml").write_text(text + f"warmup_s: {edited}\n")
        with pytest.raises(ScenarioError, match=phrase):
            write_plots(out)
        res = CliRunner().invoke(app, ["plot", str(out)])
        assert res.exit_code == 2 and len(res.output.splitlines()) == 1, res.output


def test_the_load_figure_draws_every_replica_an_idle_one_too(tmp_path: Path) -> None:
    """2 requests on 4 replicas behind round_robin: replicas 2 and 3 never run. The figure
    drew replicas 0 and 1 alone (it grouped the iteration rows), so a router that starves a
    replica hid it; they are flat lines at 0 now, from a run and from `orcasim plot` alike."""
    import orcasim
    from orcasim.plots import instance_keys, run_figures
    from orcasim.render import write_plots
    from orcasim.results import write_run
    from tests.conftest import BASE

    data = {**BASE, "workload": {**BASE["workload"], "num_requests": 2},
            "systems": [{"name": "fleet", "scheduler": {"kind": "iteration_level", "max_batch_size": 4},
                         "cluster": {"replicas": 4, "router": {"kind": "round_robin"}}}]}
    result = orcasim.run_scenario(data)
    fig = run_figures(result)["replicas_fleet"]
    want = [f"replica {i}" for i in range(4)]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == want
    write_run(result, tmp_path / "r", plots=False)
    assert instance_keys(pd.read_csv(tmp_path / "r" / "fleet" / "replicas.csv")) == [(i,) for i in range(4)]
    assert tmp_path / "r" / "replicas_fleet.png" in write_plots(tmp_path / "r")


def test_a_pareto_front_of_normalized_latency_is_in_seconds_per_token() -> None:
    from orcasim.plots import cost_latency_pareto

    table = pd.DataFrame({"point": [0, 1], "system": ["a", "a"], "cost_per_million_tokens": [1.0, 2.0],
                          "slo_normalized_latency_p90_at_capacity": [0.02, 0.01]})
    fig = cost_latency_pareto(table, table, "slo_normalized_latency_p90_at_capacity")
    assert fig.axes[0].get_xlabel() == "normalized_latency_p90 at capacity (s/token)"


def test_a_pareto_figure_says_which_configurations_it_leaves_out() -> None:
    """A configuration without a price (a GPU the catalog does not price) or without a rate
    that met the SLO has no point: it vanished from the figure without a word."""
    from orcasim.plots import cost_latency_pareto

    table = pd.DataFrame({"point": [0, 1, 2], "system": ["a", "a", "b"],
                          "cost_per_million_tokens": [1.0, np.nan, 2.0],
                          "ttft_p90_at_capacity": [0.2, 0.1, np.nan]})
    fig = cost_latency_pareto(table, table.iloc[[0]], "ttft_p90_at_capacity")
    assert [t.get_text() for t in fig.texts] == [
        "not shown: 2 of 3 configurations without a cost or a latency at capacity "
        "(see capacity.csv)"]
    assert not cost_latency_pareto(table.iloc[[0]], table.iloc[[0]], "ttft_p90_at_capacity").texts


def test_each_configuration_panel_names_its_parameters() -> None:
    """Panels read 'point 0', 'point 1' without the configuration each searched."""
    from orcasim.plots import attainment_vs_rate

    evaluations = pd.DataFrame({
        "point": [0, 0, 1, 1], "system": ["s"] * 4, "rate_per_s": [1.0, 2.0, 1.0, 2.0],
        "slo_attainment": [1.0, 0.2, 1.0, 0.9], "saturated": [0.0] * 4,
        "passes": [1.0, 0.0, 1.0, 1.0]})
    capacity = pd.DataFrame({"point": [0, 1], "systems[0].scheduler.max_batch_size": [2, 8],
                             "system": ["s", "s"], "max_rate_per_s": [1.0, 2.0]})
    fig = attainment_vs_rate(evaluations, capacity, 0.9, title="t")
    assert [ax.get_title() for ax in fig.axes] == ["t: point 0 (max_batch_size=2)",
                                                   "t: point 1 (max_batch_size=8)"]


def test_attainment_colours_systems_in_the_scenarios_order() -> None:
    """Evaluations listed the second system first: orca was blue and request-level orange,
    the reverse of every other figure (a tester's finding)."""
    from matplotlib.colors import to_hex

    from orcasim.plots import attainment_vs_rate

    evaluations = pd.DataFrame({
        "point": 0, "system": ["orca", "orca", "request-level"], "rate_per_s": [1.0, 2.0, 1.0],
        "slo_attainment": [1.0, 0.95, 0.9], "saturated": 0.0, "passes": 1.0})
    capacity = pd.DataFrame({"point": [0, 0], "system": ["request-level", "orca"],
                             "max_rate_per_s": [1.0, 2.0]})
    ax = attainment_vs_rate(evaluations, capacity, 0.9).axes[0]
    capacity_colours = {line.get_xdata()[0]: to_hex(line.get_color()) for line in ax.get_lines()
                        if line.get_linestyle() == "--"}
    handles, labels = ax.get_legend_handles_labels()
    assert labels[:2] == ["request-level (filled: passes)", "orca (filled: passes)"]
    assert [to_hex(h.get_facecolor()[0]) for h in handles[:2]] == [to_hex("C0"), to_hex("C1")]
    assert capacity_colours == {1.0: to_hex("C0"), 2.0: to_hex("C1")}


def test_a_table_whose_metric_was_edited_to_text_is_one_line(tmp_path: Path) -> None:
    """A TypeError deep in matplotlib (a tester's finding): the column is named."""
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY_SCENARIO)
    out = tmp_path / "run"
    assert CliRunner().invoke(app, ["run", str(scenario), "--out", str(out), "--no-plots"]).exit_code == 0
    path = out / "orca" / "requests.parquet"
    frame = pd.read_parquet(path)
    frame.assign(ttft_s=frame["ttft_s"].map(lambda v: f"{v} s")).to_parquet(path, index=False)
    res = CliRunner().invoke(app, ["plot", str(out)])
    assert res.exit_code == 2 and len(res.output.splitlines()) == 1, res.output
    assert "column 'ttft_s' holds text" in res.output, res.output


def test_plot_draws_systems_named_as_numbers_apart(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`orcasim plot` of a scenario sweep read sweep.csv's system names as numbers: systems
    '1' and '1.0' were drawn as one line labelled '1.0', through the medians of both."""
    import orcasim.plots

    folder = tmp_path / "sw"
    folder.mkdir()
    (folder / "sweep.csv").write_text(
        "point,replication,seed,workload.arrival.rate_per_s,system,throughput_rps,"
        "normalized_latency_s_per_token_p50\n0,0,0,1,1,1.0,0.02\n0,0,0,1,1.0,1.0,0.01\n"
        "1,0,0,2,1,2.0,0.03\n1,0,0,2,1.0,2.0,0.01\n")
    (folder / "scenario.yaml").write_text(
        "name: sw\nsweep: {parameter: workload.arrival.rate_per_s, values: [1, 2]}\n")
    drawn: list[list[str]] = []
    real = orcasim.plots.scenario_sweep_figures

    def recording(table: pd.DataFrame, *args: object, **kwargs: object) -> dict[str, Figure]:
        drawn.append(list(dict.fromkeys(table["system"])))
        return real(table, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(orcasim.plots, "scenario_sweep_figures", recording)
    write_plots(folder)
    assert drawn == [["1", "1.0"]]


def test_plot_of_a_results_file_names_it_as_a_file(tmp_path: Path) -> None:
    """Given a run's summary.json, plot said 'summary.json: no summary.json, sweep.parquet,
    sweep.csv or capacity.csv (is it a results folder?)' of the summary itself."""
    (tmp_path / "summary.json").write_text('{"orca": {"e2e_s_p50": 1.0}}')
    res = CliRunner().invoke(app, ["plot", str(tmp_path / "summary.json")])
    assert res.exit_code == 2, res.output
    assert f"{tmp_path / 'summary.json'} is a file; expected the results folder holding it" \
        in res.output


def test_a_system_without_a_metric_keeps_the_others_colours() -> None:
    """Each panel took colours from matplotlib's cycle as it drew: a system with no TPOT
    (one-token answers) left its colour to the next system in that panel, whose curve then
    wore the legend's colour of the first."""
    requests = pd.DataFrame({
        "system": ["a", "a", "b", "b"], "ttft_s": [0.1, 0.2, 0.3, 0.4],
        "tpot_s": [np.nan, np.nan, 0.01, 0.02], "e2e_s": [0.1, 0.2, 0.5, 0.6],
        "normalized_latency_s_per_token": [0.1, 0.2, 0.1, 0.2]})
    ttft, tpot = latency_cdfs(requests).axes[:2]
    colours = {line.get_label(): line.get_color() for line in ttft.get_lines()}
    assert [line.get_color() for line in tpot.get_lines()] == [colours["b"]]


def _capacity_frames() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    evaluations = pd.DataFrame({
        "point": 0, "system": ["s"] * 4, "rate_per_s": [1.0, 2.0, 4.0, 3.0],
        "slo_attainment": [1.0, 0.95, 0.2, 0.6], "saturated": [0.0, 0.0, 1.0, 0.0],
        "passes": [1.0, 1.0, 0.0, 0.0]})
    capacity = pd.DataFrame({"point": [0], "system": ["s"], "max_rate_per_s": [2.0]})
    table = pd.DataFrame({"system": ["s", "s", "s"], "cost_per_million_tokens": [1.0, 2.0, 3.0],
                          "lat": [3.0, 1.0, 2.0]})
    return evaluations, capacity, table


def test_no_figure_changes_the_frames_it_draws(sweep_table: pd.DataFrame) -> None:
    """Figures are pure: each frame reads the same after its figure is drawn (values, dtypes,
    index, order), so a notebook can draw one frame many ways."""
    from orcasim.plots import (
        attainment_vs_rate,
        cost_latency_pareto,
        fidelity_cdfs,
        frames_figures,
        replica_load,
    )

    evaluations, capacity, pareto = _capacity_frames()
    requests = pd.DataFrame({
        "system": ["b", "a", "a"], "arrival_s": [2.0, 0.0, 1.0], "ttft_s": [0.3, 0.1, 0.2],
        "tpot_s": [np.nan, 0.01, 0.02], "e2e_s": [0.5, 0.1, 0.2],
        "normalized_latency_s_per_token": [0.1, 0.2, 0.1]}, index=[7, 3, 5])
    steps = iterations([(1.0, 1.0, 2), (0.0, 1.0, 1)]).assign(
        num_waiting=[1, 0], kv_reserved_tokens=[10, 5], replica=[1, 0], num_iterations=[2, 1])
    fidelity = requests.assign(source=["real", "sim", "real"])
    draws = [
        lambda: frames_figures(requests, steps, clusters={"s": [(0,), (1,)]}, warmup_s=0.5),
        lambda: replica_load(steps, "s"),
        lambda: fidelity_cdfs(fidelity, "t"),
        lambda: sweep_figures(sweep_table, slo=1.0),
        lambda: latency_vs_throughput(sweep_table, along="workload.arrival.rate_per_s"),
        lambda: attainment_vs_rate(evaluations, capacity, 0.9),
        lambda: cost_latency_pareto(pareto, pareto.iloc[[0, 1]], "lat"),
    ]
    frames = [requests, steps, fidelity, sweep_table, evaluations, capacity, pareto]
    before = [f.copy(deep=True) for f in frames]
    for draw in draws:
        draw()
        for frame, copy in zip(frames, before, strict=True):
            pd.testing.assert_frame_equal(frame, copy)


def test_a_capacity_table_without_a_column_or_with_text_is_one_line() -> None:
    """A hand-edited capacity folder drew from a bare KeyError deep in pandas (evaluations
    without 'saturated', capacity without 'max_rate_per_s'), and an attainment edited to text
    drew without a word, as matplotlib's categories on an axis of shares."""
    from orcasim.plots import FigureInputError, attainment_vs_rate, cost_latency_pareto

    evaluations, capacity, pareto = _capacity_frames()
    with pytest.raises(FigureInputError, match=r"^the evaluations table has no column 'saturated'"):
        attainment_vs_rate(evaluations.drop(columns="saturated"), capacity, 0.9)
    with pytest.raises(FigureInputError, match=r"^the capacity table has no column 'max_rate_per_s'"):
        attainment_vs_rate(evaluations, capacity.drop(columns="max_rate_per_s"), 0.9)
    text = evaluations.assign(slo_attainment=evaluations["slo_attainment"].map(str))
    with pytest.raises(FigureInputError, match=r"column 'slo_attainment' holds text"):
        attainment_vs_rate(text, capacity, 0.9)
    with pytest.raises(FigureInputError, match=r"^the capacity table has no column 'lat'"):
        cost_latency_pareto(pareto.drop(columns="lat"), pareto, "lat")


def test_plot_of_a_capacity_folder_missing_a_column_is_one_line(tmp_path: Path) -> None:
    """`orcasim plot` of such a folder printed pandas' traceback (exit 1)."""
    evaluations, capacity, _ = _capacity_frames()
    evaluations.drop(columns="saturated").to_csv(tmp_path / "evaluations.csv", index=False)
    capacity.to_csv(tmp_path / "capacity.csv", index=False)
    (tmp_path / "slo.yaml").write_text("targets: [ttft_p90 <= 2]\nattainment: 0.9\n")
    res = CliRunner().invoke(app, ["plot", str(tmp_path)])
    assert res.exit_code == 2 and len(res.output.splitlines()) == 1, res.output
    assert "the evaluations table has no column 'saturated'" in res.output, res.output


def test_every_axis_of_the_memory_notebook_s_bands_has_a_unit() -> None:
    """notebooks/03_memory.ipynb drew 'workload.arrival.speedup', 'kv_utilization_mean' and
    'preemptions' as bare names; a metric without a label keeps its name and the unit it
    spells."""
    table = pd.DataFrame({"point": [0, 1], "replication": 0, "seed": 1,
                          "workload.arrival.speedup": [0.5, 2.0], "system": "vllm",
                          "kv_utilization_mean": [0.5, 0.9],
                          "preemptions": [0.0, 3.0], "ttft_s_p99": [0.1, 0.2]})
    fig = percentile_bands(table, "workload.arrival.speedup",
                           ("kv_utilization_mean", "preemptions", "ttft_s_p99"))
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert {ax.get_xlabel() for ax in shown} == {"trace speed-up (x its recorded rate)"}
    assert [ax.get_ylabel() for ax in shown] == [
        "mean KV utilization (used / allocated)", "preemptions (count)", "ttft_s_p99 (s)"]
    from orcasim.plots import metric_label

    assert [metric_label(m) for m in ("normalized_latency_s_per_token_p99", "task_time_p50_s",
                                      "throughput_tokens_per_s", "prefill_tokens_saved",
                                      "little_rel_error")] == [
        "normalized_latency_s_per_token_p99 (s/token)", "task_time_p50_s (s)",
        "output throughput (tokens/s)", "prefill_tokens_saved (tokens)", "little_rel_error"]


def test_a_cluster_s_iterations_without_their_replicas_are_one_line(tmp_path: Path) -> None:
    """A cluster run folder whose iterations lost their 'replica' column printed pandas'
    IntCastingNaNError from `orcasim plot` (exit 1); the load figure alone, a KeyError."""
    from orcasim.plots import FigureInputError, replica_load

    steps = iterations([(0.0, 1.0, 2)]).drop(columns="system").assign(num_waiting=0)
    with pytest.raises(FigureInputError, match=r"^the iterations table has no column 'replica'"):
        replica_load(steps, "c")
    out = tmp_path / "run"
    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "regression" / "cluster.yaml"
    res = CliRunner().invoke(app, ["run", str(scenario), "--out", str(out), "--no-plots",
                                   "--set", "workload.num_requests=40"])
    assert res.exit_code == 0, res.output
    path = out / "round-robin" / "iterations.parquet"
    pd.read_parquet(path).drop(columns="replica").to_parquet(path, index=False)
    res = CliRunner().invoke(app, ["plot", str(out)])
    assert res.exit_code == 2 and len(res.output.splitlines()) == 1, res.output
    assert "the iterations table of cluster round-robin has rows without a 'replica'" in res.output


def test_bands_of_one_replication_say_they_have_none(sweep_table: pd.DataFrame) -> None:
    """A sweep of one replication (the notebooks' small runs, notebook 03's every run) was
    titled 'Median over replications, band: p10-p90 across replications' over bands of
    width 0."""
    once = sweep_table[sweep_table["replication"] == 0]
    title = percentile_bands(once, "workload.arrival.rate_per_s").get_suptitle()
    assert title == "One replication per point: no band across replications"
    title = percentile_bands(sweep_table, "workload.arrival.rate_per_s").get_suptitle()
    assert title == "Median over replications, band: p10-p90 across replications"


@pytest.mark.parametrize("num_replicas", [1, 16])
def test_each_replica_s_load_line_has_its_own_colour(num_replicas: int) -> None:
    """Sixteen replicas were drawn in matplotlib's ten-colour cycle: replica 0 and replica 10
    (and 1 and 11, ...) shared a colour, so the legend could not tell them apart."""
    from matplotlib.colors import to_hex

    from orcasim.plots import replica_load

    steps = pd.concat([iterations([(0.1 * i, 1.0, 2)]).drop(columns="system")
                       .assign(num_waiting=0, replica=i) for i in range(num_replicas)])
    fig = replica_load(steps, "c")
    for ax in fig.axes:
        colours = [to_hex(line.get_color()) for line in ax.get_lines()]
        assert len(colours) == num_replicas and len(set(colours)) == num_replicas, colours


def test_replica_load_counts_start_at_zero_and_show_a_whole_request() -> None:
    """Where nothing ever waited, the 'waiting' panel read -0.055 to 0.055 requests
    (matplotlib's limits for a flat line at 0): fewer than none, or a twentieth waiting.
    Both panels now start at 0 and reach at least 1; a busier one keeps its own top."""
    from orcasim.plots import replica_load

    steps = pd.concat([iterations([(0.0, 1.0, 2), (1.0, 1.0, 3)]).drop(columns="system")
                       .assign(num_waiting=0, replica=i) for i in range(2)])
    running, waiting = replica_load(steps, "c").axes[:2]
    assert waiting.get_ylim() == (0.0, 1.0)
    assert running.get_ylim()[0] == 0.0 and running.get_ylim()[1] >= 3.0


def test_timelines_counts_start_at_zero() -> None:
    """The same for a lone server's timelines: an empty queue read -0.055 to 0.055."""
    fig = timelines(iterations([(0.0, 1.0, 2), (1.0, 1.0, 3)]).assign(num_waiting=0,
                                                                      kv_reserved_tokens=64))
    batch, queue, kv = fig.axes[:3]
    assert queue.get_ylim() == (0.0, 1.0)
    assert batch.get_ylim()[0] == 0.0 and kv.get_ylim()[0] == 0.0 and kv.get_ylim()[1] >= 64


def test_parameters_whose_paths_end_alike_are_named_apart_in_the_legend_and_axis() -> None:
    """prompt_tokens.high and output_tokens.high both read 'high=256, high=64' in a line's
    label, and systems[0] and systems[1]'s max_batch_size both 'max batch size (requests)'
    on a band's axis: named by their whole paths, as the figures' file names are."""
    from orcasim.plots import PARAMETER_LABELS, percentile_bands

    rows = [{"point": 0, "replication": 0, "seed": 0, "workload.arrival.rate_per_s": rate,
             "workload.prompt_tokens.high": prompt, "workload.output_tokens.high": output,
             "system": "orca", "throughput_rps": rate, "ttft_s_p50": prompt / 1e3 + output / 1e2,
             "normalized_latency_s_per_token_p50": rate / 10 + output / 1e3}
            for prompt in (256, 512) for output in (64, 128) for rate in (1.0, 2.0)]
    fig = latency_vs_throughput(pd.DataFrame(rows))
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert "orca, workload.prompt_tokens.high=256, workload.output_tokens.high=64" in labels
    assert len(set(labels)) == 4
    batch = [{"point": 0, "replication": 0, "seed": 0, "systems[0].scheduler.max_batch_size": a,
              "systems[1].scheduler.max_batch_size": b, "system": system, "ttft_s_p50": 1.0}
             for a in (4, 8) for b in (4, 8) for system in ("x", "y")]
    fig = percentile_bands(pd.DataFrame(batch), "systems[1].scheduler.max_batch_size", "ttft_s_p50")
    assert fig.axes[0].get_xlabel() == "systems[1].scheduler.max_batch_size"
    assert PARAMETER_LABELS["max_batch_size"] == percentile_bands(
        pd.DataFrame(batch).drop(columns="systems[0].scheduler.max_batch_size"),
        "systems[1].scheduler.max_batch_size", "ttft_s_p50").axes[0].get_xlabel()


def test_cdfs_are_steps_from_zero() -> None:
    """An empirical CDF is a step function: drawn as straight lines between its points,
    10 requests of 1..10 s read 0.15 at 1.5 s, which no request has (0.1 is right), and the
    curve began at 0.1, not 0."""
    from orcasim.plots import ecdf_points

    values = np.arange(10.0, 0.0, -1.0)
    x, y = ecdf_points(values)
    assert x[0] == 1.0 and y[0] == 0.0 and y[-1] == 1.0
    reqs = pd.DataFrame({"ttft_s": values, "tpot_s": values, "e2e_s": values,
                         "normalized_latency_s_per_token": values})
    for fig in (latency_cdfs(reqs), fidelity_cdfs_of(reqs)):
        line = fig.axes[0].get_lines()[0]
        assert line.get_drawstyle() == "steps-post"
        xs, ys = line.get_xdata(), line.get_ydata()
        # steps-post holds each y up to the next x: the value drawn at 1.5 s is y at 1 s.
        assert ys[np.searchsorted(xs, 1.5, side="right") - 1] == pytest.approx(0.1)
        assert ys[0] == 0.0


def fidelity_cdfs_of(requests: pd.DataFrame) -> Figure:
    from orcasim.plots import fidelity_cdfs

    return fidelity_cdfs(requests.assign(source="real"), "t")


def _hand_time_average(starts_s: np.ndarray, ends_s: np.ndarray, edges_s: np.ndarray) -> np.ndarray:
    """How many intervals [start, end) are open, averaged over each bin, interval by interval."""
    total = np.zeros(len(edges_s) - 1)
    for start, end in zip(starts_s, ends_s, strict=True):
        total += np.clip(np.minimum(end, edges_s[1:]) - np.maximum(start, edges_s[:-1]), 0.0, None)
    return total / np.diff(edges_s)


def test_a_pipelined_replica_s_load_counts_every_batch_in_flight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two Orca replicas on two pipeline stages each, behind least_outstanding: a row is one
    micro-batch's time on the first stage, so the load figure's 'running' (rows' batch size)
    drew about one micro-batch (2.99 and 2.94 requests over the run) where the requests'
    own times (first scheduled to finished) say 6.16 and 6.05 were running, and nothing at
    all while only the last stage worked. Both panels now count the requests by hand, as
    written to a results folder and redrawn by `orcasim plot` alike."""
    import orcasim
    import orcasim.plots
    from orcasim.results import write_run
    from tests.conftest import BASE

    drawn: list[Figure] = []  # what `orcasim plot` draws from the folder
    frames_figures = orcasim.plots.frames_figures
    monkeypatch.setattr(orcasim.plots, "frames_figures", lambda *a, **k: drawn.append(
        (figures := frames_figures(*a, **k))["replicas_c"]) or figures)
    data = {**BASE, "workload": {**BASE["workload"], "num_requests": 300,
                                 "arrival": {"kind": "poisson", "rate_per_s": 40.0}},
            "hardware": {"gpu": "a100-40gb", "pipeline_parallel": 2},
            "cost": {"kind": "linear", "base_s": 0.02, "per_token_s": 1e-4},
            "systems": [{"name": "c", "scheduler": {"kind": "iteration_level", "max_batch_size": 4},
                         "cluster": {"replicas": 2, "router": {"kind": "least_outstanding"}}}]}
    result = orcasim.run_scenario(data)
    write_run(result, tmp_path / "r", plots=False)
    write_plots(tmp_path / "r")
    req = result.systems["c"].requests
    assert len(drawn) == 1
    for fig in (orcasim.plots.run_figures(result)["replicas_c"], drawn[0]):
        running, waiting = fig.axes[:2]
        for replica in (0, 1):
            mine = req[req["replica"] == replica]
            lines = [ax.get_lines()[replica] for ax in (running, waiting)]
            mids_s = lines[0].get_xdata()
            width_s = mids_s[1] - mids_s[0]
            edges_s = np.append(mids_s - width_s / 2, mids_s[-1] + width_s / 2)
            assert edges_s[-1] >= req["finish_s"].max() - 1e-9  # the last flight is drawn
            for line, (start, end) in zip(lines, (("first_scheduled_s", "finish_s"),
                                                  ("arrival_s", "first_scheduled_s")), strict=True):
                want = _hand_time_average(mine[start].to_numpy(), mine[end].to_numpy(), edges_s)
                np.testing.assert_allclose(line.get_ydata(), want, rtol=1e-9, atol=1e-9)


def test_a_count_of_windows_a_column_or_a_warm_up_of_the_wrong_kind_is_one_line() -> None:
    """From a notebook: replica_load(num_bins=0) raised ZeroDivisionError and num_bins=-1
    drew empty axes; num_bins=2.5 or "10" raised numpy's or Python's TypeError in either
    figure; timelines(frame, "batch_size") read each letter as a column ("no column 'b',
    'a', 't', ..."); latency_cdfs(warmup_s="5") "'>' not supported between 'str' and 'int'"
    (found testing the plot API)."""
    from orcasim.plots import replica_load

    steps = iterations([(0.0, 1.0, 2), (1.0, 1.0, 4)]).assign(num_waiting=0, replica=0)
    for bins in (0, -1, 2.5, "10"):
        for draw in (lambda: replica_load(steps, "c", num_bins=bins),  # noqa: B023
                     lambda: timelines(steps, ("batch_size",), num_bins=bins)):  # noqa: B023
            with pytest.raises(ValueError, match=r"^num_bins = .*: expected a whole number of "
                                                 r"windows, at least 1$"):
                draw()
    one = timelines(steps, "batch_size", num_bins=2)
    assert len(one.axes) == 1 and one.axes[0].get_lines()[0].get_ydata().tolist() == [2.0, 4.0]
    reqs = pd.DataFrame({"system": ["a"], "arrival_s": [0.0], "ttft_s": [0.1], "tpot_s": [0.01],
                         "e2e_s": [1.0], "normalized_latency_s_per_token": [0.1]})
    with pytest.raises(ValueError, match=r"^warmup_s = '5': expected a number of seconds$"):
        latency_cdfs(reqs, warmup_s="5")  # type: ignore[arg-type]


@pytest.mark.parametrize("slo", ["0.05", -1.0, 0.0, float("nan"), float("inf")])
def test_an_slo_line_that_cannot_be_drawn_is_one_line(slo: object) -> None:
    """latency_vs_throughput(table, slo="0.05") raised "Unknown format code 'g' for object
    of type 'str'", and -1, 0 or NaN drew no line without a word, where `orcasim plot --slo`
    refuses them (found testing the plot API from Python)."""
    table = pd.DataFrame({"system": ["a", "a"], "throughput_rps": [1.0, 2.0],
                          "normalized_latency_s_per_token_p50": [0.1, 0.2],
                          "workload.arrival.rate_per_s": [1.0, 2.0], "point": [0, 1],
                          "replication": 0, "seed": 0})
    with pytest.raises(ValueError, match=r"^slo = .*: expected a positive number, the bound on "
                                         r"normalized_latency_s_per_token_p50 in its unit, or None$"):
        latency_vs_throughput(table, slo=slo)  # type: ignore[arg-type]
    assert "SLO = 0.15 s/token" in latency_vs_throughput(table, slo=0.15).axes[0].get_legend_handles_labels()[1]


def test_the_attainment_figure_labels_rates_as_numbers() -> None:
    """Rates tried from 8 to 32 req/s were labelled 10^1, 2x10^1 and 3x10^1 on the log axis
    (a capacity planner's session); they now read 10, 20 and 30, and 8 and 9 between."""
    from orcasim.plots import attainment_vs_rate

    evaluations = pd.DataFrame({
        "point": 0, "system": "tp1", "rate_per_s": [8.0, 16.0, 32.0, 13.5],
        "slo_attainment": [1.0, 0.1, 0.0, 0.91], "saturated": [0.0, 0.0, 1.0, 0.0],
        "passes": [1.0, 0.0, 0.0, 1.0]})
    capacity = pd.DataFrame({"point": [0], "system": ["tp1"], "max_rate_per_s": [13.5]})
    ax = attainment_vs_rate(evaluations, capacity, 0.9).axes[0]
    assert ax.xaxis.get_major_formatter()(10.0, 0) == "10"
    assert [ax.xaxis.get_minor_formatter()(v, 0) for v in (8.0, 20.0, 30.0)] == ["8", "20", "30"]
