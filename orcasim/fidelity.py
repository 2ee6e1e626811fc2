"""A simulation against a real serving run: the run's own arrivals and lengths, replayed.

A real run is a per-request log (`orcasim.workload.traces` reads its arrivals and lengths,
`read_real_run` its measurements): TTFT, TPOT (the mean gap between output tokens after
the first, (e2e - ttft) / (output - 1)) and end-to-end latency, any of which may be absent.
`replay_of` gives the scenario that replays it; `compare` puts the percentiles side by
side, and `headline_error` is the figure the validation suite reports: the median
|relative error| over TTFT, TPOT and E2E at p50 and p90.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from orcasim.config import ScenarioError
from orcasim.paths import as_path, data_stem, resolve_data_path
from orcasim.run import run_scenario
from orcasim.scenario import Scenario, load_scenario, scenario_from_dict
from orcasim.slo import number_text
from orcasim.warmup import counted
from orcasim.workload.traces import read_measurements, read_trace

METRICS = ("ttft_s", "tpot_s", "e2e_s")
PERCENTILES = (50, 90, 99)
SCORED_PERCENTILES = (50, 90)  # the headline error's, as DistServe scores its simulator
# `requests`: how many requests a row compared (those measured on both sides)
COLUMNS = ("metric", "percentile", "real", "simulated", "rel_error", "requests")
MEASURED_FORMATS = ("auto", "orcasim", "vllm", "aiperf")  # the log formats that hold latencies


def read_real_run(path: Path, fmt: str = "auto") -> pd.DataFrame:
    """The measured `ttft_s`, `tpot_s` and `e2e_s` of a run's requests, in arrival order
    (the order the simulation gives them ids); NaN where the log lacks a metric."""
    # As str, None read as the file 'None' ("file 'None' not found"): refused by its name.
    return read_measurements(str(as_path(path, "path", "a serving log's path")), fmt)


def check_replay_overrides(overrides: list[str]) -> None:
    """A replay takes its workload from the log but for `workload.max_tokens`: any other
    `--set workload.*` would be dropped unread (a speedup, a request cap, a system prompt)."""
    for override in overrides:
        key = override.split("=", 1)[0].strip()
        if (key == "workload" or key.startswith("workload.")) and key != "workload.max_tokens":
            raise ScenarioError(f"--set {override}: each log gives the workload (its arrivals and "
                                "lengths); expected --set on workload.max_tokens, the cost, the "
                                "scheduler or the hardware")


def replay_of(scenario: Scenario, run_path: Path, fmt: str = "auto") -> Scenario:
    """`scenario` with its workload replaced by the run's arrivals and lengths."""
    data = scenario.model_dump(mode="json", exclude_none=True)
    if data.pop("sweep", None) is not None:  # said, not dropped silently (a tester's finding)
        warnings.warn(f"{scenario.name}'s own sweep over {scenario.sweep.parameter} is not "  # type: ignore[union-attr]
                      "replayed: a replay runs the scenario's base values (--set the "
                      "parameter to replay another)",
                      UserWarning, stacklevel=2)
    # Found where the log reader finds it (the scenario's folder, the working folder, the
    # package's data): a shipped run's name replays it from any folder.
    data["workload"] = {
        "arrival": {"kind": "trace", "path": str(resolve_data_path(str(run_path))), "format": fmt},
        "max_tokens": data["workload"]["max_tokens"],
    }
    return scenario_from_dict(data, f"{scenario.name} replaying {Path(run_path).name}")


def measured_on_both(real: pd.DataFrame, simulated: pd.DataFrame, metric: str) -> np.ndarray:
    """The requests that have `metric` on both sides (the log measured it; the simulation
    served the request): what the table's percentiles and the figures' curves count."""
    return real[metric].notna().to_numpy() & simulated[metric].notna().to_numpy()


def compare(
    real: pd.DataFrame, simulated: pd.DataFrame, percentiles: tuple[int, ...] = PERCENTILES
) -> pd.DataFrame:
    """Per metric the real run measured and per percentile: real, simulated, relative error.

    Both frames hold the run's requests in the same order (arrival order: the replay's
    ids). Each metric is compared over the requests that have it on both sides: one the
    log left unmeasured, or the simulation turned away, is left out of both."""
    if len(real) != len(simulated):
        raise RuntimeError(f"internal error: {len(real)} real requests against {len(simulated)} "
                         "simulated; a replay simulates each request of its run")
    rows = []
    for metric in METRICS:
        both = measured_on_both(real, simulated, metric)
        real_values = real[metric].to_numpy()[both]
        sim_values = simulated[metric].to_numpy()[both]
        if len(real_values) == 0:
            continue  # the log does not measure it (or no simulated request has it)
        for q in percentiles:
            r, s = float(np.percentile(real_values, q)), float(np.percentile(sim_values, q))
            # A real 0 has no relative error, unless the simulation says 0 too.
            rows.append((metric, q, r, s, s / r - 1.0 if r > 0 else 0.0 if s == 0 else np.nan,
                         len(real_values)))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def headline_error(table: pd.DataFrame, percentiles: tuple[int, ...] = SCORED_PERCENTILES) -> float:
    """Median |relative error| over the table's metrics at `percentiles` (those with one:
    see `headline_title`)."""
    _check_fidelity_table(table)
    scored = table[table["percentile"].isin(percentiles)]["rel_error"].abs()
    return float(scored.median()) if len(scored) else float("nan")


def headline_title(table: pd.DataFrame) -> str:
    """The headline as a table's title says it, with how many numbers it leaves out (a real
    value of 0, a TPOT where the server returns whole answers, has no relative error)."""
    _check_fidelity_table(table)
    scored = table[table["percentile"].isin(SCORED_PERCENTILES)]["rel_error"]
    if scored.notna().sum() == 0:
        return "median |error| at p50 and p90: none to take (a real value of 0 has no relative error)"
    text = f"median |error| at p50 and p90 = {headline_error(table):.1%}"
    if scored.isna().any():
        text += (f" (over {int(scored.notna().sum())} of {len(scored)} numbers: a real value of 0 "
                 "has no relative error)")
    return text


def _check_fidelity_table(table: object) -> None:
    """A ScenarioError for a table without the columns the headline reads: a sweep table (or
    anything else) raised KeyError 'percentile' from inside."""
    columns = list(table.columns) if isinstance(table, pd.DataFrame) else []
    missing = [c for c in ("percentile", "rel_error") if c not in columns]
    if missing:
        given = "" if isinstance(table, pd.DataFrame) else f" ({type(table).__name__}, not a DataFrame)"
        raise ScenarioError(f"table{given}: no column {', '.join(map(repr, missing))}; expected a "
                            "fidelity table (compare(...), fidelity_table(...)[0] or fidelity.csv), "
                            f"with the columns {', '.join(COLUMNS)}")


def check_format(fmt: str, given_as: str = "fmt") -> None:
    """A ScenarioError for a log format that holds no measured latencies (or none at all)."""
    if fmt not in MEASURED_FORMATS:
        raise ScenarioError(f"{given_as} = {fmt!r}: expected {', '.join(MEASURED_FORMATS[:-1])} "
                            f"or {MEASURED_FORMATS[-1]}")


def check_systems(scenario: Scenario, systems: list[str], given_as: str = "systems") -> None:
    """A ScenarioError for a list of systems to compare that is empty, names one twice (each
    row would be written twice) or names one the scenario does not run."""
    if not systems:
        raise ScenarioError(f"{given_as} = []: expected at least one of the scenario's systems "
                            f"({', '.join(s.name for s in scenario.systems)})")
    twice = next((n for i, n in enumerate(systems) if n in systems[:i]), None)
    if twice is not None:
        raise ScenarioError(f"{given_as} = {twice!r}: given twice; expected each system once")
    unknown = [n for n in systems if n not in {s.name for s in scenario.systems}]
    if unknown:
        raise ScenarioError(f"{given_as} = {unknown[0]!r}: expected one of "
                            f"{', '.join(s.name for s in scenario.systems)}")


def fidelity_table(
    scenario: Scenario | str | Path, runs: list[Path] | list[str] | Path | str,
    systems: list[str] | str, fmt: str = "auto", base_dir: Path | None = None,
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """Every run against every named system: the long table (with `run` and `system`
    columns) and the frames for the figures, keyed `run/system`. `scenario` may be a path;
    its data paths resolve from `base_dir`, by default the scenario file's folder, as
    `run_scenario` resolves them. One run or one system may be given alone; a system the scenario does not run, or an
    empty list, is a ScenarioError before any run is replayed."""
    if not isinstance(scenario, Scenario):  # its own sweep is not replayed (`replay_of`)
        scenario = load_scenario(scenario, own_sweep=False)
    # The replay is a new scenario, without the loaded one's folder: its data paths (a
    # fitted cost's file) were looked for in the working folder.
    base_dir = base_dir or scenario.source_dir
    # None raised "'NoneType' object is not iterable" from the list comprehension.
    if not isinstance(runs, str | Path | list | tuple):
        raise ScenarioError(f"runs = {runs!r:.80}: expected a real run's log path, or a list of them")
    if not isinstance(systems, str | list | tuple):
        raise ScenarioError(f"systems = {systems!r:.80}: expected a system's name, or a list of them")
    runs = [Path(runs)] if isinstance(runs, str | Path) else [
        as_path(p, f"runs[{i}]", "a real run's log path") for i, p in enumerate(runs)]
    systems = [systems] if isinstance(systems, str) else list(systems)
    if not runs:
        raise ScenarioError("runs = []: expected at least one real run's per-request log")
    check_systems(scenario, systems)
    check_format(fmt)
    tables, frames = [], {}
    for path, label in zip(runs, run_labels(runs), strict=True):
        with warnings.catch_warnings():  # the replay reads the same file and says them once
            warnings.simplefilter("ignore")
            real = read_real_run(path, fmt)
        if len(real) and not any(real[m].notna().any() for m in METRICS):  # an empty table, exit 0
            raise ScenarioError(f"--real {path}: no request has a {', '.join(METRICS[:-1])} or "
                                f"{METRICS[-1]}; expected measured latencies to compare")
        check_measured_after_warmup(path, real, fmt, scenario.warmup_s)
        try:  # a run the scenario cannot replay (a request beyond max_tokens): say which
            result = run_scenario(replay_of(scenario, path, fmt), base_dir=base_dir)
        except ScenarioError as e:  # said of the replay, not blamed on the log (the file
            # named once where the message names it already)
            text = str(e)
            raise ScenarioError(f"--real {text}" if text.startswith(f"{Path(path).name}:")
                                else f"{text} (replaying --real {path})") from None
        for system in systems:
            simulated = result.systems[system].requests
            measured = after_warmup(real, simulated, scenario.warmup_s)
            table = compare(*measured)
            tables.append(table.assign(run=label, system=system))
            frames[f"{label}/{system}"] = paired_frames(*measured)
    order = ["run", "system", *COLUMNS]
    return pd.concat(tables, ignore_index=True)[order], frames


def check_measured_after_warmup(path: Path | str, real: pd.DataFrame, fmt: str, warmup_s: float,
                                given_as: str = "--real") -> None:
    """A ScenarioError for a log whose requests from `warmup_s` on (counted from its first
    request, as a replay's arrivals are) measured no latency, where earlier ones did: every
    comparison counts only those (`after_warmup`). `fidelity` printed nothing, wrote an empty
    fidelity.csv and exited 0, and `calibrate logs` said the system "simulates none of the
    latencies the logs measure". A warm-up past the last arrival is the run's to refuse."""
    with warnings.catch_warnings():  # said where the log is read as a replay's workload
        warnings.simplefilter("ignore")
        arrival_s = read_trace(str(path), fmt)[0]
    kept = counted(arrival_s, warmup_s)
    measured = real[list(METRICS)].notna().any(axis=1).to_numpy()
    if not kept.any() or (kept & measured).any() or not measured.any():
        return
    # In full: ':g' rounded 1.2345678 s up to 1.23457, a warm-up this check refuses again.
    last = number_text(float(arrival_s[measured].max()))
    raise ScenarioError(
        f"{given_as} {path}: no request arriving from warmup_s = {number_text(warmup_s)} s on "
        f"(counted from its first request) has a {', '.join(METRICS[:-1])} or {METRICS[-1]}; "
        f"the last measured one arrives at {last} s: expected warmup_s at most {last}")


def after_warmup(real: pd.DataFrame, simulated: pd.DataFrame,
                 warmup_s: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The requests a comparison of a replay with its log counts: those arriving from the
    scenario's warm-up on, as its summary counts them (the same requests on both sides: the
    replay's arrivals are the log's). `fidelity` and `calibrate logs` both compare these."""
    kept = counted(simulated["arrival_s"].to_numpy(), warmup_s)
    return real[kept], simulated[kept]


def paired_frames(real: pd.DataFrame, simulated: pd.DataFrame) -> pd.DataFrame:
    """Both sides for the figures, each metric kept where both have it, as `compare` takes
    its percentiles (the curves drew each side over its own requests: a rejected or an
    unmeasured request counted on one side only)."""
    real, simulated = real[list(METRICS)].copy(), simulated[list(METRICS)].copy()
    for metric in METRICS:
        both = measured_on_both(real, simulated, metric)
        real.loc[~both, metric] = np.nan
        simulated.loc[~both, metric] = np.nan
    return pd.concat([real.assign(source="real"), simulated.assign(source="simulated")])


def _found(path: Path) -> Path:
    """The file a log's path names, as it is read (`resolve_data_path`: a shipped log by its
    data name is the same file as by its absolute path); as given where it is not found."""
    try:
        return resolve_data_path(str(path)).resolve()
    except FileNotFoundError:
        return Path(path).resolve()


def run_labels(runs: list[Path], given_as: str = "--real") -> list[str]:
    """Each run's name in the table, summary and figures: its file's stem, with as many of
    its folders in front (a/run, b/run) as tell apart logs of the same stem, or its whole
    path. The same log given twice is a ScenarioError naming it as `given_as` does."""
    paths = [_found(p) for p in runs]
    twice = next((runs[i] for i, p in enumerate(paths) if p in paths[:i]), None)
    if twice is not None:
        raise ScenarioError(f"{given_as} {twice}: given twice; expected each run once")
    depth = [0] * len(paths)
    stems = [data_stem(p) for p in paths]  # run.csv.gz is 'run', as run.csv is
    labels = list(stems)
    while clashing := [i for i, label in enumerate(labels) if labels.count(label) > 1]:
        for i in clashing:
            depth[i] += 1
            parents = paths[i].parent.parts[1:]  # the root "/" adds nothing
            labels[i] = ("/".join([*parents[len(parents) - depth[i]:], stems[i]])
                         if depth[i] <= len(parents) else paths[i].as_posix())
    return labels
