"""Metric deltas between two result folders (runs, sweeps or baselines): pure functions."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pandas as pd

from orcasim.columns import KEY_COLUMNS, param_columns, param_names
from orcasim.config import ScenarioError
from orcasim.paths import as_path, read_json, read_parquet, read_results_csv

# Summary of a folder: {label: {metric: value}}; a label is a system, or point/system in a sweep.
Metrics = dict[str, dict[str, float]]


def load_metrics(path: Path) -> Metrics:
    """The metrics of a run folder or baseline file, a sweep folder, or a folder of
    baselines (labels <baseline>/<system>); see `metrics_kind`."""
    path = as_path(path, "path", "a results folder or baseline file's path")
    match metrics_kind(path):
        case "run":
            return read_metrics(path if path.is_file() else path / "summary.json")
        case "sweep":
            return _sweep_metrics(read_sweep_table(path))
        case _:  # other JSON beside the baselines (a package.json) is not one: check skips it too
            return {f"{f.stem}/{system}": m for f in _baseline_files(path)
                    for system, m in read_metrics(f).items()}


def load_pair(path_a: Path, path_b: Path) -> tuple[Metrics, Metrics]:
    """Both sides' metrics, of one kind. Two sweeps must sweep the same parameters: a label
    names a parameter by the last part of its path, so `systems[0]...max_batch_size` and
    `systems[1]...max_batch_size` would pair point by point as if one."""
    path_a = as_path(path_a, "path_a", "a results folder or baseline file's path")
    path_b = as_path(path_b, "path_b", "a results folder or baseline file's path")
    kinds = metrics_kind(path_a), metrics_kind(path_b)
    if kinds[0] != kinds[1]:
        raise ScenarioError(f"{path_a} is a {kinds[0]} and {path_b} a {kinds[1]}: different kinds; "
                            "expected two runs (or baseline files), two sweeps or two baselines folders")
    if kinds[0] != "sweep":
        return load_metrics(path_a), load_metrics(path_b)
    table_a, table_b = read_sweep_table(path_a), read_sweep_table(path_b)
    params_a, params_b = param_columns(table_a), param_columns(table_b)
    if sorted(params_a) != sorted(params_b):
        raise ScenarioError(
            f"{path_a} sweeps {', '.join(params_a) or 'no parameter'} and {path_b} sweeps "
            f"{', '.join(params_b) or 'no parameter'}: expected sweeps of the same parameters, "
            "so that their points pair up")
    _warn_other_seeds(path_a, table_a, path_b, table_b)
    return _sweep_metrics(table_a), _sweep_metrics(table_b)


def _warn_other_seeds(path_a: Path, table_a: pd.DataFrame, path_b: Path,
                      table_b: pd.DataFrame) -> None:
    """Rows pair by replication, not by seed: where a replication ran on other seeds (a
    scenario's own sweep against a sweep file of its grid), its random draws differ too
    (not a trace's arrivals), and every metric may read as moved."""
    seeds_a = dict(zip(table_a["replication"], table_a["seed"], strict=True))
    seeds_b = dict(zip(table_b["replication"], table_b["seed"], strict=True))
    other = next((r for r in seeds_a if r in seeds_b and seeds_a[r] != seeds_b[r]), None)
    if other is not None:
        warnings.warn(f"replication {other} ran on seed {seeds_a[other]} in {path_a} against "
                      f"{seeds_b[other]} in {path_b}: its requests may differ, so its changes need "
                      "not be the parameters' or the code's", UserWarning, stacklevel=3)


def read_sweep_table(path: Path) -> pd.DataFrame:
    """A sweep folder's (or file's) table: sweep.parquet, or a scenario sweep's sweep.csv
    (`orcasim run` writes only that); one that is not a sweep table is a one-line error."""
    path = as_path(path, "path", "a sweep folder or table's path")
    table_path = path if path.is_file() else path / "sweep.parquet"
    if not table_path.exists():
        table_path = path / "sweep.csv"
    table = read_parquet(table_path) if table_path.suffix == ".parquet" else read_results_csv(table_path)
    missing = [c for c in KEY_COLUMNS if c not in table.columns]
    if missing or list(table.columns).index("seed") > list(table.columns).index("system"):
        raise ScenarioError(f"{table_path}: not a sweep table (no {', '.join(missing) or 'seed before system'}"
                            f"); expected the columns {', '.join(KEY_COLUMNS)}, as orcasim writes them")
    skip = {*KEY_COLUMNS, *param_columns(table)}
    text = next((c for c in table.columns if c not in skip
                 and not pd.api.types.is_numeric_dtype(table[c])), None)
    if text is not None:
        raise ScenarioError(f"{table_path}: column {text!r} holds text ({table[text].iloc[0]!r}); "
                            "expected numbers in every metric column, as orcasim writes them")
    return table


def _baseline_files(folder: Path) -> list[Path]:
    """The folder's baselines. Other JSON (a package.json) is skipped, but a file that is
    not JSON at all (a merge conflict left in a baseline) is refused: skipped, its every
    metric would read as removed."""
    files = []
    for f in sorted(folder.glob("*.json")):
        if is_baseline(f):
            files.append(f)
        elif f.is_file():
            try:
                read_json(f)
            except ScenarioError as e:
                raise ScenarioError(f"{e} (in the baselines folder {folder})") from None
    if not files:  # a sweep's point folder (outcome.json): two compared as '0 of 0', exit 0
        names = ", ".join(f.name for f in sorted(folder.glob("*.json")))
        raise ScenarioError(f"{folder}: none of its JSON files ({names}) is a baseline "
                            "({system: {metric: number}}); expected a run, a sweep or a "
                            "baselines folder")
    return files


SWEEP_TABLES = ("sweep.parquet", "sweep.csv")  # a sweep's table, given as a file


def metrics_kind(path: Path) -> str:
    """What `path` holds: "run" (a run's folder, its summary.json or a baseline file, all
    {system: {metric: value}}), "sweep" (a folder or file of sweep.parquet, or of a scenario
    sweep's sweep.csv) or "baselines folder" (a folder of baseline
    files, as results/baselines/). Only two of one kind compare label by label."""
    path = as_path(path, "path", "a results folder or baseline file's path")
    _refuse_fidelity(path.parent if path.is_file() and path.name == "summary.json" else path)
    if path.is_file():
        return "sweep" if path.name in SWEEP_TABLES else "run"
    if (path / "summary.json").exists():
        return "run"
    if (path / "sweep.parquet").exists() or (path / "sweep.csv").exists():
        return "sweep"
    if (path / "capacity.csv").exists():  # its plan.json made it read as baselines
        raise ScenarioError(f"{path}: a capacity folder, which compare does not read; expected "
                            "a run, a sweep or a baselines folder (compare capacity.csv files "
                            "with a table tool)")
    if (path / "plan.json").exists():  # a sweep's or a capacity search's work list: no baselines
        raise ScenarioError(f"{path}: a sweep or capacity search with no table yet (stopped "
                            "before its tables were written); expected a finished one: run it "
                            "again with --resume")
    if any(path.glob("*.json")):
        return "baselines folder"
    raise FileNotFoundError(f"{path}: no summary.json, sweep.parquet or baseline .json files "
                            "(is it a results folder?)")


def _refuse_fidelity(folder: Path) -> None:
    """An `orcasim fidelity` folder's summary.json holds one headline error per run and
    system, not a run's metrics: read as a run's, it was refused as not what orcasim writes."""
    if (folder / "fidelity.csv").is_file():
        raise ScenarioError(f"{folder}: an orcasim fidelity folder, which compare does not read; "
                            "expected a run, a sweep or a baselines folder (compare fidelity.csv "
                            "files with a table tool)")


def _sweep_metrics(table: pd.DataFrame) -> Metrics:
    """A row's label is its parameter values (by name, numbers written alike: 2 and 2.0 are
    '2'), replication and system ('rate_per_s=2 r00/orca'), not its point number: two sweeps
    of the same points in another order, or with the grid's keys in another order, pair up."""
    params = param_columns(table)
    names = param_names(params)
    skip = {"point", "replication", "seed", "system", *params}
    metrics = [c for c in table.columns if c not in skip]
    named = sorted(zip(names, params, strict=True))

    def label(r: dict) -> str:
        point = " ".join(f"{n}={_value_text(r[p])}" for n, p in named)
        point = point or f"p{int(r['point']):04d}"
        return f"{point} r{int(r['replication']):02d}/{r['system']}"

    return {label(r): {m: float(r[m]) for m in metrics} for r in table.to_dict("records")}


def _value_text(value: object) -> str:
    """A parameter value as a label shows it: a whole number without its '.0'."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def read_metrics(path: Path) -> Metrics:
    """A summary or baseline file, {system: {metric: number or null}}; anything else is a
    one-line error naming the file."""
    data = read_json(as_path(path, "path", "a summary or baseline file's path"))
    ok = isinstance(data, dict) and all(
        isinstance(m, dict) and all(map(_is_metric, m.values())) for m in data.values())
    if not ok:
        raise ScenarioError(f"{path}: expected {{system: {{metric: number}}}} with finite numbers "
                            "(null where undefined), as orcasim writes it")
    if not data:
        raise ScenarioError(f"{path}: expected {{system: {{metric: number}}}}, as orcasim writes "
                            "it; it holds no system")
    return {s: {k: math.nan if v is None else float(v) for k, v in m.items()} for s, m in data.items()}


def _is_metric(value: object) -> bool:
    """null, or a finite number a float holds: orcasim writes nothing else. Python's json
    reads `Infinity` and `NaN`, against which any value compared as unmoved."""
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an integer past float's range
        return False


# Relative tolerance: only float summation noise across numpy builds and platforms.
DEFAULT_REL_TOL = 1e-9
# Counts must match exactly (the README's promise; they are integers, so float noise cannot
# move them): every count a summary reports.
TOLERANCES: dict[str, float] = dict.fromkeys(
    ("requests_completed", "iterations", "cost_out_of_range", "preemptions", "requests_rejected",
     "recomputed_tokens", "cache_evictions", "prefill_tokens_saved", "kv_reserved_tokens_max",
     "prefill_kv_reserved_tokens_max", "decode_kv_reserved_tokens_max",
     "replicas", "prefill_replicas", "decode_replicas", "sessions_completed", "sessions_failed",
     "kv_capacity_total_tokens"),
    0.0)
# Absolute floor, so that metrics whose baseline is 0 may carry rounding noise.
ABS_TOL = 1e-12


def tolerance(metric: str) -> float:
    """The relative change `metric` may make and still read as unmoved (0: a count), for
    `orcasim check` and `compare` alike."""
    return TOLERANCES.get(metric, DEFAULT_REL_TOL)


def moved(before: float, after: float, rel_tol: float = DEFAULT_REL_TOL) -> bool:
    """Whether a metric changed by more than float noise (`rel_tol` 0: by anything)."""
    if same_value(before, after):
        return False
    if not (math.isfinite(before) and math.isfinite(after)):  # inf against anything: inf > inf
        return True
    return abs(after - before) > rel_tol * abs(before) + (ABS_TOL if rel_tol else 0.0)


def relative_change(before: float, after: float) -> float:
    """(after - before) / |before|; 0 when both agree (NaN == NaN), inf from a zero baseline."""
    if same_value(before, after):
        return 0.0
    if before == 0 or math.isnan(before) or math.isnan(after):
        return math.inf
    return (after - before) / abs(before)


def same_value(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def checked_metrics(metrics: object, what: str) -> Metrics:
    """`metrics` as the comparisons take them, {label: {metric: value}}; anything else (None
    raised "'NoneType' object is not iterable" from inside) is a ScenarioError naming `what`."""
    if not isinstance(metrics, dict) or not all(isinstance(m, dict) for m in metrics.values()):
        raise ScenarioError(f"{what} = {metrics!r:.80}: expected metrics by label, "
                            "{label: {metric: value}}, as load_metrics returns them")
    return metrics


def deltas(a: Metrics, b: Metrics) -> pd.DataFrame:
    """One row per (label, metric) present in either side: a, b, delta and relative change."""
    a, b = checked_metrics(a, "a"), checked_metrics(b, "b")
    rows = []
    for label in list(a) + [x for x in b if x not in a]:
        ma, mb = a.get(label, {}), b.get(label, {})
        for metric in list(ma) + [x for x in mb if x not in ma]:
            va, vb = ma.get(metric, math.nan), mb.get(metric, math.nan)
            # A metric on one side only is a change, null (NaN) on the other or not.
            note = "" if (metric in ma) == (metric in mb) else "only in A" if metric in ma \
                else "only in B"
            rows.append({"label": label, "metric": metric, "a": va, "b": vb,
                         "delta": vb - va, "rel_change": relative_change(va, vb), "note": note})
    return pd.DataFrame(rows, columns=DELTA_COLUMNS)


DELTA_COLUMNS = ["label", "metric", "a", "b", "delta", "rel_change", "note"]


def changed_rows(frame: pd.DataFrame) -> pd.Series:
    """Which rows of `deltas` moved by more than their metric's `tolerance` (float noise;
    a count by anything), or are on one side only."""
    if not isinstance(frame, pd.DataFrame):  # None: "'NoneType' object is not subscriptable"
        raise ScenarioError(f"frame = {frame!r:.80}: expected the table `deltas` returns")
    return pd.Series([bool(n) or moved(a, b, tolerance(m)) for a, b, m, n in
                      zip(frame["a"], frame["b"], frame["metric"], frame["note"], strict=True)],
                     index=frame.index, dtype=bool)


def is_baseline(path: Path) -> bool:
    """Whether `path` holds a baseline ({system: {metric: number}}, neither empty): only such a
    file counts as one without a scenario, or is removed by an update (a folder may hold
    other JSON, a package.json, that is none of the check's business)."""
    path = as_path(path, "path", "a baseline file's path")  # None is no file: said, not False
    try:
        metrics = read_metrics(path)
    except (ScenarioError, OSError):  # not JSON, or no file at all (a folder, a dead link)
        return False
    return bool(metrics) and all(metrics.values())
