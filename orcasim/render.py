"""`orcasim plot RESULTS_DIR`: read a results folder back and write its figures beside it."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import yaml

from orcasim import yaml_strict
from orcasim.compare import read_metrics
from orcasim.config import MAX_TIME_S, ScenarioError
from orcasim.paths import as_path, read_csv, read_parquet, read_results_csv
from orcasim.results import MARKER, mark_results, save_figure
from orcasim.slo import SLOConfig

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def load_run_frames(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run folder's request and iteration frames, each with a `system` column."""
    run_dir = as_path(run_dir, "run_dir", "a run's results folder")
    systems = list(read_metrics(run_dir / "summary.json"))
    reqs = [read_parquet(run_dir / s / "requests.parquet").assign(system=s) for s in systems]
    iters = [read_parquet(run_dir / s / "iterations.parquet").assign(system=s) for s in systems]
    return pd.concat(reqs, ignore_index=True), pd.concat(iters, ignore_index=True)


def write_plots(results_dir: Path, svg: bool = False, slo: float | None = None) -> list[Path]:
    """Write every figure of a run, sweep, scenario sweep or capacity folder as PNG (and
    SVG); return the paths."""
    from orcasim.plots import FigureInputError

    results_dir = as_path(results_dir, "results_dir", "a results folder")
    try:
        figures = _figures(results_dir, slo)
    except FigureInputError as e:  # a damaged or foreign folder: bad input, not a bug
        raise ScenarioError(f"{results_dir}: {e}") from None
    paths: list[Path] = []
    for stem, fig in figures.items():
        if (results_dir / MARKER).is_file():  # figures are orcasim's files: --force may replace
            # them. Listed before they are written, as record_file does: one written before a
            # later figure failed was left unlisted, and --force then refused the folder.
            mark_results(results_dir, [f"{stem}.png", *([f"{stem}.svg"] if svg else [])])
        paths += save_figure(fig, results_dir / f"{stem}.png", svg=svg)
    return paths


def _figures(results_dir: Path, slo: float | None) -> dict[str, Figure]:
    """The folder's figures, by file stem, from the files its kind keeps."""
    from orcasim.plots import (
        frames_figures,
        instance_keys,
        pipelined_keys,
        scenario_sweep_figures,
        sweep_figures,
    )

    if results_dir.is_file():  # 'no summary.json ...' of a summary.json itself
        raise ScenarioError(f"{results_dir} is a file; expected the results folder holding it "
                            f"({results_dir.parent})")
    if (results_dir / "sweep.parquet").is_file():
        table = read_parquet(results_dir / "sweep.parquet")
        if table.empty:
            raise ScenarioError(f"{results_dir}/sweep.parquet has no rows: every point failed")
        figures = sweep_figures(table, slo=slo)
    elif (results_dir / "sweep.csv").is_file():  # a scenario's own sweep (orcasim run)
        table = read_results_csv(results_dir / "sweep.csv")
        parameter, title = _scenario_sweep(results_dir / "scenario.yaml")
        figures = scenario_sweep_figures(table, parameter, title, slo=slo)
    elif (results_dir / "capacity.csv").is_file():
        from orcasim.capacity import capacity_figures

        _no_slo_line(slo, results_dir, "a capacity folder, whose figures draw its own SLOs")
        targets = _read_slo(results_dir / "slo.yaml")
        figures = capacity_figures(read_results_csv(results_dir / "capacity.csv"),
                                   read_results_csv(results_dir / "evaluations.csv"), targets)
    elif (results_dir / "fidelity.csv").is_file():  # it keeps no per-request frames to redraw
        raise ScenarioError(f"{results_dir}: an orcasim fidelity folder, whose CDF figures "
                            "orcasim fidelity writes (rerun it with --force to redraw them); "
                            "expected a run, sweep or capacity folder")
    elif (results_dir / "summary.json").is_file():
        _no_slo_line(slo, results_dir, "a run folder, whose figures are latency CDFs")
        summary = read_metrics(results_dir / "summary.json")
        unstable = frozenset(n for n, m in summary.items() if m.get("saturated"))
        # A cluster's run keeps its per-replica summaries, which its load figure goes with.
        tables = {n: read_csv(results_dir / n / "replicas.csv") for n in summary
                  if (results_dir / n / "replicas.csv").is_file()}
        clusters = {n: instance_keys(table) for n, table in tables.items()}
        pipelined = {n: pipelined_keys(table) for n, table in tables.items()}
        requests, iterations = load_run_frames(results_dir)
        warmup_s = _warmup_s(results_dir / "scenario.yaml")
        if "arrival_s" in requests and len(requests) and warmup_s > requests["arrival_s"].max():
            raise ScenarioError(f"{results_dir / 'scenario.yaml'}: warmup_s = {warmup_s:g} is "
                                "past the last arrival, so the figures would count no request; "
                                "expected the warm-up the run had")
        figures = frames_figures(requests, iterations, unstable, clusters, warmup_s, pipelined)
    else:
        raise FileNotFoundError(f"{results_dir}: no summary.json, sweep.parquet, sweep.csv or "
                                "capacity.csv (is it a results folder?)")
    return figures


def _no_slo_line(slo: float | None, results_dir: Path, what: str) -> None:
    if slo is not None:
        warnings.warn(f"--slo {slo:g} is not drawn: {results_dir} is {what} (the SLO line is a "
                      "sweep's, on latency against throughput)", UserWarning, stacklevel=3)


def _read_slo(path: Path) -> SLOConfig:
    """A capacity folder's slo.yaml, or a one-line error naming it."""
    from pydantic import ValidationError

    try:
        return SLOConfig.model_validate(yaml_strict.load(path.read_text(encoding="utf-8")))
    except (yaml.YAMLError, UnicodeDecodeError, ValidationError):
        raise ScenarioError(f"{path}: not the SLO block orcasim capacity writes") from None


def _warmup_s(path: Path) -> float:
    """A run folder's warm-up, from the scenario.yaml it wrote (0, said, where it has none)."""
    if not path.is_file():
        warnings.warn(f"{path.parent}: no scenario.yaml, so its warm-up is unknown: the latency "
                      "CDFs count every request", UserWarning, stacklevel=3)
        return 0.0
    try:
        data = yaml_strict.load(path.read_text(encoding="utf-8"))
        warmup_s = data.get("warmup_s", 0.0)
        if isinstance(warmup_s, bool):
            raise TypeError(warmup_s)
        warmup_s = float(warmup_s)
    except (OSError, yaml.YAMLError, UnicodeDecodeError, AttributeError, TypeError, ValueError):
        raise ScenarioError(f"{path}: not the scenario orcasim run writes beside summary.json "
                            "(its warmup_s says which requests the figures count)") from None
    # As a scenario takes it: a hand-edited -5 or NaN drew figures, 1e9 empty ones.
    if not 0 <= warmup_s <= MAX_TIME_S:
        raise ScenarioError(f"{path}: warmup_s = {warmup_s:g}: expected a number of seconds from "
                            f"0 to {MAX_TIME_S:g}, as orcasim run writes it")
    return warmup_s


def _scenario_sweep(path: Path) -> tuple[str, str]:
    """A scenario sweep folder's swept parameter and scenario name, from its scenario.yaml."""
    try:
        data = yaml_strict.load(path.read_text(encoding="utf-8"))
        return str(data["sweep"]["parameter"]), str(data["name"])
    except (OSError, yaml.YAMLError, UnicodeDecodeError, TypeError, KeyError):
        raise ScenarioError(f"{path}: not the scenario with a sweep block that orcasim run "
                            "writes beside sweep.csv") from None
