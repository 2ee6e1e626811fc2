"""The `orcasim` command. Bad input is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import math
import os
import re
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

try:  # typer from 0.2x carries its own click, whose errors are not click's
    from typer._click.exceptions import BadParameter, ClickException, UsageError
except ImportError:  # older typer: click itself
    from click.exceptions import (  # type: ignore[assignment]
        BadParameter,
        ClickException,
        UsageError,
    )

from orcasim.config import MAX_REQUESTS, MAX_TIME_S, ScenarioError, format_field_error
from orcasim.exits import (
    EXIT_BAD_INPUT,
    EXIT_ENVIRONMENT,
    EXIT_INTERRUPTED,
    EXIT_VERDICT,
    INTERRUPTED_TEXT,
    ignore_interrupts,
    sigterm_as_interrupt,
    take_owed_interrupt,
)
from orcasim.yaml_strict import is_scenario_file, is_sweep_file

if TYPE_CHECKING:
    import pandas as pd

    from orcasim.capacity import CapacityResult
    from orcasim.scenario import Scenario
    from orcasim.slo import SLOConfig
    from orcasim.sweeps import Sweep

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Discrete-event simulator of LLM serving: request-level vs iteration-level (Orca).",
)
# Piped into a CI log, rich would draw at 80 columns and cut metric names to "saturation_…";
# a log has no width to keep to, so tables get room unless COLUMNS says otherwise.
LOG_WIDTH = 200
# Below this a moved metric's table has no room for its names (COLUMNS=0 printed nothing).
MIN_WIDTH = 80


def _console_width() -> int | None:
    """COLUMNS if given (at least MIN_WIDTH), the terminal's, or LOG_WIDTH in a log."""
    columns = os.environ.get("COLUMNS")
    if columns is not None:
        try:
            return max(int(columns), MIN_WIDTH)
        except ValueError:
            return LOG_WIDTH
    return None if sys.stdout.isatty() else LOG_WIDTH


# No markup: what it prints holds the user's paths and names, and rich read `--out run[bold]`
# as 'run' in bold.
console = Console(width=_console_width(), markup=False)


def _print_version(value: bool) -> None:
    if value:
        from orcasim import __version__

        typer.echo(f"orcasim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Discrete-event simulator of LLM serving: request-level vs iteration-level (Orca)."""


# The error boundary: bad input is a ScenarioError (raised where input is validated) or a
# missing or existing path; it is one line and exit 2. Anything else is an internal error and
# shows its traceback, except a failing disk or filesystem (OSError) or memory running out
# (MemoryError), one line and exit 1.
USER_ERRORS = (ScenarioError, FileNotFoundError, FileExistsError)

TABLE_METRICS = {
    # Named: a bare `req/s` of 12.89 beside a run at 13.55 req/s read as the rate offered
    # (a capacity planner's session); it is the completions over the window, drain included.
    "throughput_rps": "throughput (req/s)",
    "ttft_s_p50": "TTFT p50 (s)",
    "e2e_s_p50": "e2e p50 (s)",
    "e2e_s_p90": "e2e p90 (s)",
    "normalized_latency_s_per_token_p50": "norm. lat. p50 (s/tok)",
    "normalized_latency_s_per_token_p90": "norm. lat. p90 (s/tok)",
    "queue_delay_s_p50": "queue p50 (s)",
    "batch_size_mean": "batch mean",
}
# A session workload's rows (orcasim.session_metrics), shown when its summary has them.
SESSION_TABLE_METRICS = {
    "tasks_per_hour": "tasks/hour",
    "task_time_p50_s": "task p50 (s)",
    "task_time_p99_s": "task p99 (s)",
    "task_queued_share": "task queued share",
}

ScenarioArg = Annotated[Path, typer.Argument(help="Scenario YAML file.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a field: --set workload.arrival.rate_per_s=4"),
]
# A replay's workload is the log's (`check_replay_overrides`): its example is one it takes.
ReplaySetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a field but the workload's arrivals and lengths: "
                               "--set cost.overhead.per_iteration_s=0.002"),
]


def fail(message: str) -> None:
    """Report a user error on one line and exit with code 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _check_address(backend: str, address: str | None) -> None:
    """--address names a Ray cluster: with the local pool it would be ignored."""
    if address is not None and backend != "ray":
        fail(f"--address {address} applies to --backend ray; expected no --address with "
             f"--backend {backend}")


_told_interrupted = False  # `interrupted` said how to resume; main adds nothing
# Set by the `orcasim` process's entry point (`process_main`) alone: only a process that ends
# with its command may ignore Ctrl-C until it does. Run in a caller's process (`main` from
# Python, typer's CliRunner), a command that ignored it left it ignored for the rest of a test
# session or notebook.
_ends_the_process = False


def _ignore_ctrl_c() -> None:
    """From here to the process's end, a second Ctrl-C or a SIGTERM must not cut the exit
    short (see `_written`); in the `orcasim` process only: a caller's own handlers stay."""
    if _ends_the_process:
        ignore_interrupts()


def interrupted(resume_command: str) -> None:
    """Ctrl-C (or SIGTERM) during a resumable run: say how to continue, exit 130."""
    global _told_interrupted
    _ignore_ctrl_c()
    typer.echo(f"interrupted; finished points are kept. Resume with: {resume_command}", err=True)
    _told_interrupted = True
    raise typer.Exit(EXIT_INTERRUPTED)


def _written() -> None:
    """The command's results are whole on disk: Ctrl-C is ignored from here on. Pressed
    while the table printed or the interpreter tore down pandas and matplotlib (about 0.8 s
    after 'results written'), it ended the command with exit 130 and 'nothing was left
    half-written', or killed it (exit -2), its results complete (3 of 3 presses right after
    'results written'; an outputs tester's finding). CLI only: a notebook keeps its Ctrl-C."""
    _ignore_ctrl_c()


def _tell_interrupted() -> None:
    """Ctrl-C (or SIGTERM) elsewhere: results are written whole or not at all."""
    _ignore_ctrl_c()
    typer.echo(INTERRUPTED_TEXT, err=True)


def error_text(e: Exception) -> str:
    if isinstance(e, FileNotFoundError | FileExistsError) and e.filename and e.strerror:
        return f"{e.filename}: {e.strerror.lower()}"
    return str(e)


def share_text(share: float) -> str:
    """A share to three decimals, rounded down: rounded to nearest, 17,993 of 20,000 (0.89965)
    printed 0.900 beside a 0.9 target it had not met. The 1e-9 absorbs a product a rounding
    below its thousandth (a share k / n with n under 1e7 is never that close below one)."""
    if math.isnan(share):
        return "nan"
    return f"{math.floor(share * 1000 + 1e-9) / 1000:.3f}"


def summary_table(summary: dict[str, dict[str, float]], title: str) -> Table:
    """Metrics as rows and systems as columns, so that many systems still fit a terminal."""
    from orcasim.saturation import judged
    table = Table(title=title)
    table.add_column("metric", style="bold")
    for system in summary:
        table.add_column(system, justify="right")
    sessions = any("tasks_per_hour" in m for m in summary.values())
    for key, label in (TABLE_METRICS | (SESSION_TABLE_METRICS if sessions else {})).items():
        table.add_row(label, *(f"{m.get(key, float('nan')):.4g}" for m in summary.values()))
    # Sessions with calls turned away are left out of the task rows above: say how many.
    if any(m.get("sessions_failed", 0.0) > 0 for m in summary.values()):
        table.add_row("sessions failed", *(f"{m.get('sessions_failed', 0.0):.0f}"
                                           for m in summary.values()))
    if any("slo_attainment" in m for m in summary.values()):
        table.add_row("SLO attainment", *(share_text(m.get("slo_attainment", float("nan")))
                                          + (" (met)" if m.get("slo_met") else "")
                                          for m in summary.values()))
    if all("kv_capacity_total_tokens" in m for m in summary.values()):
        table.add_row("KV capacity (tokens)", *(kv_capacity_text(m) for m in summary.values()))
    table.add_row("saturated", *(Text("yes", style="red") if m.get("saturated")
                                 else "no" if judged(m) else "not judged (too short)"
                                 for m in summary.values()))
    return table


def kv_capacity_text(summary: dict[str, float]) -> str:
    """A system's KV tokens and where the figure came from: '100,000 given', '149,040 derived'
    (from its model and hardware, as `orcasim model --gpu` derives it)."""
    derived = summary["kv_capacity_derived_share"]
    source = "derived" if derived == 1 else "given" if derived == 0 else f"{derived:.0%} derived"
    return f"{summary['kv_capacity_total_tokens']:,.0f} {source}"


@app.command()
def run(
    scenario: ScenarioArg,
    out: Annotated[Path | None, typer.Option(help="Results folder (default results/<name>).")] = None,
    set_: SetOpt = None,
    force: Annotated[bool, typer.Option(help="Overwrite existing results.")] = False,
    plots: Annotated[bool, typer.Option(help="Write PNG plots.")] = True,
) -> None:
    """Run every system of SCENARIO on the same requests and write results/<name>/."""
    from orcasim.results import check_out_dir, default_results_dir, write_run
    from orcasim.run import run_scenario
    from orcasim.scenario import data_inputs, load_scenario

    if is_sweep_file(scenario):
        fail(f"{scenario} is a sweep file (it names a base scenario), not a scenario; run it with "
             f"`orcasim sweep {scenario}`")
    try:
        sc = load_scenario(scenario, set_ or [])
        _refuse_overrides_of_the_swept(sc, set_ or [])
        out_dir = out or default_results_dir(sc.name)
        check_out_dir(out_dir, force, [scenario, *data_inputs(sc)])
        if sc.sweep is not None:
            return _run_sweep(sc, scenario, out_dir, force, plots)
        result = run_scenario(sc, base_dir=scenario.resolve().parent)
        write_run(result, out_dir, force=force, plots=plots)
        _written()
    except USER_ERRORS as e:
        fail_naming_overrides(scenario, set_ or [], e)
    summary = {n: r.summary for n, r in result.systems.items()}
    console.print(summary_table(summary, f"{sc.name}: {len(result.systems)} systems"))
    typer.echo(f"results written to {out_dir}/")


def _run_sweep(sc: Scenario, path: Path, out_dir: Path, force: bool, plots: bool) -> None:
    """A scenario with `sweep:` runs every point and writes sweep.csv and the figure."""
    from orcasim.results import write_scenario_sweep
    from orcasim.sweeps import run_scenario_sweep
    from orcasim.sweeps.table import MEDIAN_LATENCY, THROUGHPUT

    assert sc.sweep is not None
    frame = run_scenario_sweep(sc, base_dir=path.resolve().parent)
    write_scenario_sweep(frame, sc, out_dir, force=force, plots=plots)
    _written()
    typer.echo(frame[["system", sc.sweep.parameter, THROUGHPUT, MEDIAN_LATENCY]].to_string(index=False))
    typer.echo(f"sweep of {len(frame)} rows written to {out_dir}/")


@app.command()
def validate(scenario: ScenarioArg, set_: SetOpt = None) -> None:
    """Check SCENARIO (and the files it names) without running it."""
    from orcasim.scenario import load_scenario

    if is_sweep_file(scenario):
        return _validate_sweep(scenario, set_ or [])
    try:
        sc = load_scenario(scenario, set_ or [])
        _refuse_overrides_of_the_swept(sc, set_ or [])
        num_requests = _check_scenario(sc, scenario.resolve().parent)
    except USER_ERRORS as e:
        fail_naming_overrides(scenario, set_ or [], e)
    n = len(sc.systems)
    # Its own sweep block said nothing: 'ok (300 requests, 4 systems)' of a run of 14 points.
    points = (f"; sweep: {len(sc.sweep.values)} points of {sc.sweep.parameter}"
              if sc.sweep is not None else "")
    typer.echo(f"{scenario}: ok ({num_requests} requests, {n} system{'s' if n > 1 else ''}{points})")


def _refuse_overrides_of_the_swept(sc: Scenario, overrides: list[str]) -> None:
    """`run` and `validate` of a scenario with a `sweep:` block: an override of its swept key
    is refused, as a sweep file's grid refuses one (`fidelity` replays the base values, where
    it is the value replayed)."""
    from orcasim.sweeps.spec import refuse_swept_override

    swept = [sc.sweep.parameter] if sc.sweep is not None else []
    for given in overrides:
        refuse_swept_override(given, "--set", swept, "its sweep block",
                              alone=" (with --set sweep=null, the value given runs alone)")


def fail_naming_overrides(path: Path, overrides: list[str], e: Exception) -> None:
    """`fail` with `e`'s text; a refusal raised as the run is built, which validate's checks
    reproduce, is named with the overrides that bring it, as `validate` names it (a refusal
    they do not reproduce, such as an existing --out, is said as it is)."""
    text = error_text(e)
    named = text.startswith("--set ")  # a refusal of the override itself names it already
    if overrides and not named and not is_sweep_file(path) and not _passes(path, overrides):
        text = _brought_by(path, overrides, text)
    fail(text)


def _brought_by(path: Path, overrides: list[str], text: str) -> str:
    """`text`, naming the overrides that bring it where the file alone passes what `validate`
    checks: a refusal raised as the run is built (a profile table for another TP degree)
    read as the file's own ('cost.attention_csv: ... expected 4'), where `load_scenario`
    names them for what it validates itself. Those whose removal alone lets it pass are
    named (all of them where none is)."""
    if not overrides or text.startswith(f"{path} with ") or not _passes(path, []):
        return text  # the file has a problem of its own: the overrides may not be the cause
    culprits = [o for i, o in enumerate(overrides) if _passes(path, overrides[:i] + overrides[i + 1:])]
    given = " ".join(f"--set {item}" for item in culprits or overrides)
    return f"{path} with {given}: {text}"


def _passes(path: Path, overrides: list[str]) -> bool:
    """Whether `path` with `overrides` passes `validate`'s checks (quietly: its warnings were
    said of the scenario as the user gave it)."""
    from orcasim.scenario import load_scenario

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _check_scenario(load_scenario(path, overrides), path.resolve().parent)
    except USER_ERRORS:
        return False
    return True


def _check_scenario(sc: Scenario, base_dir: Path) -> int:
    """`validate`'s checks of a loaded scenario (`orcasim.run.check_runs`): its own sweep's
    every point, as `run` would build it, and the scenario itself. The number of requests."""
    from orcasim.run import check_runs

    return check_runs(sc, base_dir)


def _resume_command(head: list[str], out_dir: Path | None, sets: list[str], backend: str,
                    address: str | None) -> str:
    """The command that resumes this one: its file, folder, overrides and backend (the plan
    it resumes was made with them), quoted for a shell."""
    import shlex

    args = [*head, *(["--out", str(out_dir)] if out_dir else [])]
    args += [a for item in sets for a in ("--set", item)]
    if backend != "local":
        args += ["--backend", backend, *(["--address", address] if address else [])]
    return shlex.join([*args, "--resume"])


def _check_sweep_runs(sw: Sweep) -> None:
    """What a run of each task checks (its data files too), before any work starts: every
    replication, as its seed draws the requests a check reads (the last arrival)."""
    from orcasim.run import check_run
    from orcasim.sweeps.spec import point_name

    for task in sw.tasks():
        with sw.naming(task):
            check_run(task.scenario(), Path(task.base_dir), f"{point_name(task.id, task.params)}: ")


def _validate_sweep(path: Path, overrides: list[str]) -> None:
    from orcasim.sweeps import load_sweep

    try:
        sw = load_sweep(path, overrides)  # validates the base scenario and every point
        _check_sweep_runs(sw)
        sw.warn_alike_replications()  # as `sweep` would
    except USER_ERRORS as e:
        fail(error_text(e))
    typer.echo(f"{path}: ok (sweep: {len(sw.points())} points x {sw.spec.replications} replications)")


def frame_table(frame: pd.DataFrame, title: str) -> Table:
    """A DataFrame as a rich table; floats in 4 significant digits."""
    import pandas as pd  # the command's own modules load it already; --help need not

    table = Table(title=title)
    for column in frame.columns:
        # A cell too wide folds onto more lines: a cut name no longer says which metric moved.
        numeric = pd.api.types.is_numeric_dtype(frame[column])  # pandas 3 text is not `object`
        table.add_column(str(column), justify="right" if numeric else "left", overflow="fold")
    for row in frame.itertuples(index=False):
        table.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row))
    return table


@app.command()
def sweep(
    spec: Annotated[Path, typer.Argument(help="Sweep YAML file (base scenario + grid).")],
    out: Annotated[Path | None, typer.Option(help="Results folder (default results/<name>).")] = None,
    backend: Annotated[str, typer.Option(help="local (process pool) or ray.")] = "local",
    workers: Annotated[int | None, typer.Option(help="Parallel tasks (default: core count).")] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster address, e.g. auto.")] = None,
    resume: Annotated[bool, typer.Option(help="Keep finished points, run the rest.")] = False,
    force: Annotated[bool, typer.Option(help="Delete existing results first.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    set_: SetOpt = None,
) -> None:
    """Run every point of a sweep; write sweep.parquet/csv, one row per (point, system, replication)."""
    from orcasim.paths import check_in_a_folder
    from orcasim.results import check_replaceable, default_results_dir
    from orcasim.sweeps import load_sweep, run_sweep

    out_dir = out
    if is_scenario_file(spec):
        fail(f"{spec} is a scenario (it names systems, no base scenario), not a sweep file; run "
             f"it with `orcasim run {spec}` (a `sweep:` block in it sweeps one parameter)")
    try:
        _check_address(backend, address)
        sw = load_sweep(spec, set_ or [])  # --set after the file's own set:, as validate takes it
        _check_sweep_runs(sw)  # a missing data file, before the pool starts (exit 2)
        out_dir = out or default_results_dir(sw.spec.name)
        check_in_a_folder(out_dir, "results")
        if force:  # before any work, and with the files this sweep reads
            check_replaceable(out_dir, [spec, spec.parent / sw.spec.base, *sw.data_inputs()])
        result = run_sweep(sw, out_dir, backend, workers, address, resume, force, progress)  # type: ignore[arg-type]
        _written()
    except USER_ERRORS as e:
        fail(error_text(e))
    except KeyboardInterrupt:
        interrupted(_resume_command(["orcasim", "sweep", str(spec)], out_dir, set_ or [],
                                    backend, address))
    console.print(f"{result.ran} tasks run, {result.skipped} already done; "
                  f"{len(result.table)} rows in {out_dir}/sweep.parquet")
    if result.failed:
        typer.echo(f"{len(result.failed)} failed points (see {out_dir}/failures.csv):", err=True)
        for o in result.failed:
            typer.echo(f"  {o.id} {o.params}: {o.error}", err=True)
        raise typer.Exit(EXIT_VERDICT)


@app.command()
def compare(
    run_a: Annotated[Path, typer.Argument(help="Run or sweep folder, baseline file or baselines folder A.")],
    run_b: Annotated[Path, typer.Argument(help="B, of the same kind as A.")],
    all_: Annotated[bool, typer.Option("--all", help="Show unchanged metrics too.")] = False,
) -> None:
    """Print metric deltas from RUN_A to RUN_B; changes within float noise count as none."""
    from orcasim.compare import changed_rows, deltas, load_pair

    try:
        a, b = load_pair(run_a, run_b)
        frame = deltas(a, b)
    except USER_ERRORS as e:
        fail(error_text(e))
    if a and b and not set(a) & set(b):  # every row would read as removed or added
        typer.echo(f"warning: {run_a} and {run_b} share no system (or point) to compare: "
                   f"{', '.join(sorted(a)[:3])} against {', '.join(sorted(b)[:3])}", err=True)
    changed = changed_rows(frame)
    shown = frame if all_ else frame[changed]
    # The count changed, whatever is shown: with --all the rows shown read '98 of 98 metrics'
    # for two identical runs, as if every metric had moved.
    title = f"{run_a} -> {run_b}: {int(changed.sum())} of {len(frame)} metrics changed"
    console.print(frame_table(shown, title))


@app.command()
def plot(
    results_dir: Annotated[Path, typer.Argument(help="A run, sweep or capacity results folder.")],
    svg: Annotated[bool, typer.Option(help="Also write SVG.")] = False,
    slo: Annotated[float | None, typer.Option(help="SLO line on a sweep's latency figure.")] = None,
) -> None:
    """Write every figure of RESULTS_DIR into it as PNG (and SVG)."""
    from orcasim.render import write_plots

    # A log axis draws no line at 0 or inf, and overflows past the clock's range (1e308).
    if slo is not None and not 0 < slo <= MAX_TIME_S:
        fail(f"--slo {slo:g}: expected a positive number of seconds per token, at most "
             f"{MAX_TIME_S:g}")
    try:
        paths = write_plots(results_dir, svg=svg, slo=slo)
    except USER_ERRORS as e:
        fail(error_text(e))
    if not paths:  # a capacity folder whose searches all failed: nothing was evaluated
        typer.echo(f"warning: {results_dir} holds nothing to draw (no rate was evaluated); "
                   "no figure written", err=True)
    for p in paths:
        typer.echo(str(p))


@app.command()
def fidelity(
    scenario: ScenarioArg,
    real: Annotated[list[Path], typer.Option(help="A real run's per-request log (repeatable).")],
    system: Annotated[list[str] | None, typer.Option(help="System(s) to compare (default all).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="Log format: auto, orcasim, vllm or aiperf.")] = "auto",
    out: Annotated[Path | None, typer.Option(help="Folder (default results/fidelity/<name>).")] = None,
    set_: ReplaySetOpt = None,
    force: Annotated[bool, typer.Option(help="Overwrite existing results.")] = False,
    plots: Annotated[bool, typer.Option(help="Write real-against-simulated CDF plots.")] = True,
) -> None:
    """Replay each real run's arrivals and lengths through SCENARIO; compare the percentiles."""
    from orcasim.fidelity import (
        check_format,
        check_replay_overrides,
        check_systems,
        fidelity_table,
        headline_title,
    )
    from orcasim.results import check_out_dir, default_results_dir, write_fidelity
    from orcasim.scenario import data_inputs, load_scenario

    try:
        check_format(fmt, "--format")
        check_replay_overrides(set_ or [])
        # A replay runs the base values: the own sweep's points are not built (replay_of).
        sc = load_scenario(scenario, set_ or [], own_sweep=False)
        names = system or [s.name for s in sc.systems]
        check_systems(sc, names, "--system")
        out_dir = out or default_results_dir(sc.name, Path("results") / "fidelity")
        check_out_dir(out_dir, force, [scenario, *real, *data_inputs(sc)])
        table, frames = fidelity_table(sc, real, names, fmt, scenario.resolve().parent)
        write_fidelity(table, frames, out_dir, force=force, plots=plots)
        _written()
    except USER_ERRORS as e:
        fail_naming_overrides(scenario, set_ or [], e)
    for (run, name), rows in table.groupby(["run", "system"], sort=False):
        title = f"{run} / {name}: {headline_title(rows)}"
        console.print(frame_table(rows.drop(columns=["run", "system"]), title))
    typer.echo(f"results written to {out_dir}/")


@app.command()
def check(
    update: Annotated[bool, typer.Option(help="Rewrite the baselines from this run.")] = False,
    scenarios: Annotated[Path, typer.Option(help="Regression scenarios.")] = Path("scenarios/regression"),
    baselines: Annotated[Path, typer.Option(help="Baseline metrics.")] = Path("results/baselines"),
) -> None:
    """Rerun the regression scenarios; exit 1 if any metric moved from its baseline."""
    from orcasim.regression import check as run_check

    try:
        moved = run_check(scenarios, baselines, update)
    except USER_ERRORS as e:
        fail(error_text(e))
    if len(moved):
        # Every digit: at 4 a value that moved past float noise reads as its baseline.
        shown = moved.assign(**{c: moved[c].map(repr) for c in ("baseline", "now")})
        what = "rewritten in" if update else "moved from"
        console.print(frame_table(shown, f"{len(moved)} metric{'' if len(moved) == 1 else 's'} {what} {baselines}/"))
    if update:
        typer.echo(f"baselines rewritten in {baselines}/" + ("" if len(moved) else " (no metric moved)"))
    elif len(moved):
        new = sorted(moved.loc[moved["metric"] == "(no baseline)", "scenario"])
        if new:
            folders = "".join(f" --{flag} {given}" for flag, given, default in (
                ("scenarios", scenarios, Path("scenarios/regression")),
                ("baselines", baselines, Path("results/baselines"))) if given != default)
            typer.echo(f"no baseline yet for {', '.join(new)}: write it with orcasim check "
                       f"--update{folders} (which rewrites them all) once the others match")
        raise typer.Exit(EXIT_VERDICT)
    else:
        typer.echo(f"all regression metrics match {baselines}/")


def _as_flags(message: str, fields: dict[str, object]) -> str:
    """A hardware error in the words of `orcasim model`'s options: the command has flags, not
    the scenario's `hardware:` keys, so `hardware.pipeline_parallel = 2000` reads
    `--pipeline-parallel = 2000`, and every other key the message names reads as its flag too
    (`with --tensor-parallel = 1`), so one line never mixes the two vocabularies."""
    message = re.sub(r"hardware(?::\s*|\.)(?=\w+ = )", "", message)
    message = message.replace("model.weight_dtype", "weight_dtype")  # the flag, not a key path
    for key in [*fields, "weight_dtype"]:
        # A bare word like "gpu" is also prose ("unknown gpu 'nope'"): only `gpu = ` is the key;
        # one inside a dotted path is not this command's (it read 'model.--weight-dtype').
        name = rf"(?<![\w.-]){key}\b" if "_" in key else rf"(?<![\w.-]){key}(?= = )"
        message = re.sub(name, "--" + key.replace("_", "-"), message)
    return message


@app.command()
def model(
    spec: Annotated[str, typer.Argument(help="A catalog name (llama3-70b), a Hugging Face "
                                             "config.json path, or a model folder holding one.")],
    gpu: Annotated[str | None, typer.Option(help="A GPU from the catalog, for per-GPU figures.")] = None,
    tensor_parallel: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 1,
    pipeline_parallel: Annotated[int, typer.Option(help="Pipeline-parallel degree.")] = 1,
    data_parallel_attention: Annotated[int, typer.Option(
        help="Data-parallel attention groups (a MoE model's).")] = 1,
    expert_parallel: Annotated[int, typer.Option(
        help="Expert-parallel degree: 1, or tensor-parallel x data-parallel attention.")] = 1,
    weight_dtype: Annotated[str | None, typer.Option(
        help="Weight precision (fp32, bf16, fp16, fp8, int8, int4, mxfp4), overriding the "
             "model's; the KV cache keeps its own (a scenario's model.kv_cache_dtype).")] = None,
) -> None:
    """Parameters (total and active), weight and KV bytes, FLOPs per token, and with --gpu
    the per-GPU weights and KV capacity of a deployment."""
    from orcasim.cost.catalog import (
        HardwareConfig,
        check_deployment,
        model_figures,
        model_from_argument,
    )

    degrees = {"--tensor-parallel": tensor_parallel, "--pipeline-parallel": pipeline_parallel,
               "--data-parallel-attention": data_parallel_attention,
               "--expert-parallel": expert_parallel}
    for option, d in degrees.items():
        if d < 1:
            fail(f"{option} = {d}: expected a positive integer")
    split = next(((option, d) for option, d in degrees.items() if d != 1), None)
    if gpu is None and split is not None:
        fail(f"{split[0]} = {split[1]} needs --gpu: the degrees split a deployment's per-GPU "
             "figures, and without a GPU the figures are the whole model's")
    fields: dict[str, object] = {
        "gpu": gpu, "tensor_parallel": tensor_parallel, "pipeline_parallel": pipeline_parallel,
        "data_parallel_attention": data_parallel_attention, "expert_parallel": expert_parallel}
    try:
        spec_model = model_from_argument(spec, weight_dtype)
        moe_only = ("--data-parallel-attention", "--expert-parallel")
        dense_split = next(((o, degrees[o]) for o in moe_only if degrees[o] != 1), None)
        if spec_model.moe is None and dense_split is not None:
            fail(f"{dense_split[0]} = {dense_split[1]}: expected 1 for {spec_model.name}, a dense "
                 "model (data-parallel attention and expert parallelism split a mixture of experts)")
        hw = None
        if gpu is not None:
            try:
                hw = HardwareConfig.model_validate(fields)
            except ValidationError as e:  # --tensor-parallel 0, an unknown GPU, an EP that cannot be
                fail(_as_flags(format_field_error(e, "hardware", fields), fields))
            check_deployment(spec_model, hw, 1)
        figures = model_figures(spec_model, hw)
    except USER_ERRORS as e:
        fail(_as_flags(error_text(e), fields))
    table = Table(title=f"{spec_model.name}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        table.add_row(key, f"{value:,.0f}" if value >= 100 else f"{value:g}")
    console.print(table)
    if hw is not None:
        # kv_capacity_tokens alone did not say what it assumed, so a planner could not redo
        # it by hand, nor for a vLLM run at another utilisation (a capacity planner's session).
        typer.echo(f"kv_capacity_tokens: {hw.gpu.memory_bytes / 2**30:.2f} GiB a GPU x "
                   f"gpu_memory_utilization {hw.gpu_memory_utilization:g}, less "
                   f"activation_reserve_gib {hw.activation_reserve_gib:g} and the weights, "
                   "over KV bytes a token (set both in a scenario's hardware)")


@app.command()
def capacity(
    spec: Annotated[Path, typer.Argument(help="Scenario YAML, or a sweep file whose grid "
                                               "lists configurations to search.")],
    slo: Annotated[list[str] | None, typer.Option(
        help="A target METRIC_pNN=SECONDS (repeatable), e.g. ttft_p90=0.2; default: the "
             "scenario's slo block.")] = None,
    attainment: Annotated[float | None, typer.Option(
        help="Share of requests that must meet every target (default 0.9, or the scenario's).")] = None,
    out: Annotated[Path | None, typer.Option(help="Folder (default results/capacity/<name>).")] = None,
    system: Annotated[list[str] | None, typer.Option(help="System(s) to search (default all).")] = None,
    replications: Annotated[int, typer.Option(help="Independent searches per system.")] = 3,
    requests: Annotated[int, typer.Option(help="Requests per evaluated rate (0: the scenario's).")] = 2000,
    rel_tol: Annotated[float, typer.Option(help="Stop when the bracket is this narrow (relative).")] = 0.02,
    price_per_gpu_hour: Annotated[float | None, typer.Option(
        help="USD per GPU-hour for every GPU (default: the GPU catalog's).")] = None,
    target_rate: Annotated[float | None, typer.Option(
        help="Traffic to serve (req/s): how many copies of each configuration it needs.")] = None,
    backend: Annotated[str, typer.Option(help="local (process pool) or ray.")] = "local",
    workers: Annotated[int | None, typer.Option(help="Parallel searches (default: core count).")] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster address, e.g. auto.")] = None,
    resume: Annotated[bool, typer.Option(help="Keep finished searches, run the rest.")] = False,
    force: Annotated[bool, typer.Option(help="Delete existing results first.")] = False,
    plots: Annotated[bool, typer.Option(help="Write the attainment and Pareto figures.")] = True,
    set_: SetOpt = None,
) -> None:
    """The highest arrival rate each system (and configuration) sustains within the SLOs,
    with goodput per GPU and cost per million output tokens; see orcasim.capacity."""
    from orcasim import capacity as cap
    from orcasim.paths import check_in_a_folder
    from orcasim.results import check_replaceable, default_results_dir
    from orcasim.slo import held_by_share

    out_dir = out
    try:
        _check_address(backend, address)
        if attainment is not None and not 0 < attainment <= 1:
            fail(f"--attainment = {attainment:g}: expected a share in (0, 1]")
        scenario, base_dir, points, seed, name = _capacity_input(spec, set_ or [])
        slo_cfg = _capacity_slo(scenario, slo, attainment)
        for line in held_by_share(slo_cfg):
            typer.echo(f"warning: {line}", err=True)
        _check_capacity_numbers(replications, rel_tol, requests)
        if requests:
            _refuse_counts_the_search_sets(spec, set_ or [], requests)
        _check_positive_numbers(price_per_gpu_hour, target_rate)  # after --set's, as ever
        settings = cap.SearchSettings(rel_tol, requests or None)
        jobs = cap.search_jobs(scenario, base_dir, slo_cfg, replications, settings, system,
                               points, seed)
        searched = list(dict(sorted({job.point: job.params for job in jobs}.items())).values())
        out_dir = out or default_results_dir(name, Path("results") / "capacity")
        check_in_a_folder(out_dir, "results")
        data = cap.search_data_inputs(jobs)
        inputs = [spec, *data]
        if force:  # before any search, and with the files it reads
            check_replaceable(out_dir, inputs)
        result = cap.run_capacity(jobs, out_dir, backend, workers, address, resume, force,
                                  price_per_gpu_hour, target_rate, inputs=inputs, data=data)
        cap.write_capacity(result, out_dir, slo_cfg, plots)
        _written()
    except USER_ERRORS as e:
        fail_naming_overrides(spec, set_ or [], e)
    except KeyboardInterrupt:
        given = [*(a for t in slo or [] for a in ("--slo", t)),
                 *(a for s in system or [] for a in ("--system", s)),
                 *(["--attainment", f"{attainment!r}"] if attainment is not None else []),
                 "--replications", str(replications), "--requests", str(requests),
                 "--rel-tol", repr(rel_tol),
                 *(["--price-per-gpu-hour", repr(price_per_gpu_hour)] if price_per_gpu_hour else []),
                 *(["--target-rate", repr(target_rate)] if target_rate else []),
                 *([] if plots else ["--no-plots"])]
        # Each option that shapes the plan (or the table): 'orcasim capacity SPEC --out DIR
        # --resume (with the same options)' was no command to paste, as a sweep's is.
        interrupted(_resume_command(["orcasim", "capacity", str(spec), *given], out_dir,
                                    set_ or [], backend, address))
    run_requests = requests or getattr(scenario.workload, "num_requests", None)
    _print_capacity(result, searched, name, slo_cfg, run_requests, target_rate)
    typer.echo(f"{result.ran} searches run, {result.skipped} already done; written to {out_dir}/")
    if result.failed:
        for o in result.failed:
            typer.echo(f"  failed {o.id}: {o.error}", err=True)
        raise typer.Exit(EXIT_VERDICT)


def _check_capacity_numbers(replications: int, rel_tol: float, requests: int) -> None:
    """`orcasim capacity`'s search options, each checked alone: one check named all three,
    whichever was wrong."""
    from orcasim import capacity as cap

    if replications < 1:
        fail(f"--replications = {replications}: expected at least 1")
    if not cap.MIN_REL_TOL <= rel_tol < 1:
        # Below a float's resolution the bisection never ends (1 + 1e-300 is 1).
        fail(f"--rel-tol = {rel_tol:g}: expected {cap.MIN_REL_TOL:g} <= rel-tol < 1")
    if requests > MAX_REQUESTS:  # else refused by the first search as its workload's key
        fail(f"--requests {requests}: expected at most {MAX_REQUESTS:,}, as "
             "workload.num_requests")
    if requests < 0 or 0 < requests < cap.MIN_SEARCH_REQUESTS:
        fail(f"--requests {requests}: expected 0 (the scenario's) or at least "
             f"{cap.MIN_SEARCH_REQUESTS}, enough arrivals for the saturation test to judge "
             "a run (fewer pass at any rate)")


def _check_positive_numbers(price_per_gpu_hour: float | None, target_rate: float | None) -> None:
    """`orcasim capacity`'s --price-per-gpu-hour and --target-rate, where given."""
    for flag, value in (("--price-per-gpu-hour", price_per_gpu_hour), ("--target-rate", target_rate)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            fail(f"{flag} = {value:g}: expected a positive finite number")


def _print_capacity(result: CapacityResult, searched: list[dict[str, Any]], name: str, slo_cfg: SLOConfig,
                    run_requests: int | None, target_rate: float | None) -> None:
    """The capacity table, its warnings and the cheapest configuration within the SLOs."""
    from orcasim import capacity as cap

    console.print(frame_table(*capacity_view(result.table, searched, name, slo_cfg)))
    for line in [*cap.capacity_warnings(result, slo_cfg, target_rate),
                 *cap.tail_warnings(slo_cfg, run_requests)]:
        typer.echo(f"warning: {line}", err=True)
    best = cap.cheapest(result.table)
    if best is not None and (len(searched) > 1 or len(result.table) > 1):
        where = ", ".join(f"{k}={best[k]}" for k in searched[0]) or "the scenario"
        cost = (f"${best['cost_per_hour_for_target_usd']:.4g} an hour for {target_rate:g} req/s "
                f"({(n := int(best['copies_for_target']))} cop{'y' if n == 1 else 'ies'})" if target_rate is not None
                else f"${best['cost_per_million_tokens']:.4g} per million output tokens")
        typer.echo(f"cheapest within the SLOs: {best['system']} at {where}: {cost}, "
                   f"{best['max_rate_per_s']:.4g} req/s each")


# The printed capacity table's headers, with their units: `goodput_per_gpu 13.55` did not
# say req/s or tokens/s, nor `ci_low` its confidence, nor `cost_per_million_tokens` its
# currency or which tokens (a capacity planner's finding). capacity.csv keeps the bare names.
CAPACITY_HEADERS = {"max_rate_per_s": "max_rate_per_s", "ci_low": "ci_low (95%, req/s)",
                    "ci_high": "ci_high (95%, req/s)", "goodput_per_gpu": "goodput_per_gpu (req/s)",
                    "cost_per_million_tokens": "cost_per_million_tokens ($/M output)",
                    "copies_for_target": "copies_for_target",
                    "cost_per_hour_for_target_usd": "cost_per_hour_for_target_usd"}


def capacity_view(table: pd.DataFrame, searched: list[dict[str, Any]], name: str,
                  slo_cfg: SLOConfig) -> tuple[pd.DataFrame, str]:
    """What `orcasim capacity` prints: the table's main columns under headers with units, and
    a title naming each SLO target with its bound (`ttft_p90 <= 0.5 s`), not its name alone."""
    shown = [c for c in ("point", *(k for p in searched for k in p), "system", *CAPACITY_HEADERS)
             if c in table]
    frame = table[list(dict.fromkeys(shown))].rename(columns=CAPACITY_HEADERS)
    targets = ", ".join(t.text for t in slo_cfg.targets)
    return frame, f"{name}: highest rate within {targets} at {slo_cfg.attainment:g} attainment"


# The keys that count a run's requests, which a capacity search with --requests sets at every run.
_REQUEST_COUNTS = ("workload.num_requests", "workload.arrival.max_requests")


def _refuse_counts_the_search_sets(path: Path, overrides: list[str], requests: int) -> None:
    """A count of requests given with --set is replaced by --requests (2,000 unless given) at
    every run of the search: `--set workload.num_requests=500` ran 2,000 without a word (a
    tester's finding). Refused, as a --set of a key a sweep sets is; a sweep file's own
    `set:` (written for `orcasim sweep`) is warned of, as its replications are."""
    for given in overrides:
        if given.split("=", 1)[0].strip() in _REQUEST_COUNTS:
            fail(f"--set {given}: the search runs --requests {requests} requests at every rate, "
                 "so this value would never be used; expected --requests N (or --requests 0: "
                 "the scenario's own count)")
    if is_sweep_file(path):
        from orcasim.sweeps import load_sweep

        for given in load_sweep(path).spec.set:
            if given.split("=", 1)[0].strip() in _REQUEST_COUNTS:
                typer.echo(f"warning: {path.name}'s set: {given} is not used: the search runs "
                           f"--requests {requests} requests at every rate (--requests 0: the "
                           "scenario's own count)", err=True)


def _capacity_input(path: Path, overrides: list[str]) -> tuple[
        Scenario, Path, list[dict[str, Any]] | None, int | None, str]:
    """A scenario (its points are its own `sweep:`'s, `capacity.search_jobs`) or a sweep
    file (its grid's points, its seed)."""
    from orcasim.scenario import load_scenario, scenario_from_dict
    from orcasim.sweeps import load_sweep

    if is_sweep_file(path):
        sw = load_sweep(path, overrides)  # after the file's own set:, as sweep takes them
        if "replications" in sw.spec.model_fields_set:
            typer.echo(f"warning: {path.name}'s replications: {sw.spec.replications} is not "
                       "used: --replications sets the independent searches", err=True)
        # From the keys as given (`Sweep.given`): the base's dump holds every default, and a
        # point that changes a `kind` would keep the old kind's (`apply_params`).
        scenario = scenario_from_dict(dict(sw.given), str(path))
        return scenario, sw.base_dir, sw.points(), sw.spec.seed, sw.spec.name
    scenario = load_scenario(path, overrides)
    return scenario, path.resolve().parent, None, None, scenario.name


def _capacity_slo(scenario: Scenario, targets: list[str] | None,
                  attainment: float | None) -> SLOConfig:
    """The command line's targets (with the scenario's attainment unless given), else the
    scenario's `slo:` block."""
    from orcasim.slo import DEFAULT_ATTAINMENT, SLOConfig, slo_from_strings

    if targets:
        default = scenario.slo.attainment if scenario.slo else DEFAULT_ATTAINMENT
        return slo_from_strings(targets, attainment if attainment is not None else default)
    if scenario.slo is None:
        fail("no SLO: pass --slo METRIC_pNN=SECONDS (e.g. --slo ttft_p90=0.2) or give the "
             "scenario an 'slo:' block")
    assert scenario.slo is not None
    if attainment is None:
        return scenario.slo
    return SLOConfig(targets=scenario.slo.targets, attainment=attainment)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: object = None, line: str | None = None) -> None:
    # A user reads "warning: <what happened>", not the line of orcasim that noticed it, and
    # reads it once: a command's checks may draw the same requests for several systems (a
    # short trace's warning was printed once per system by `capacity`; a tester's finding).
    from orcasim.config import warning_text

    text = f"warning: {warning_text(message)}"
    if text not in _SHOWN:
        _SHOWN.add(text)
        typer.echo(text, err=True)


_SHOWN: set[str] = set()  # the warnings the running command has shown


def usage_error_text(e: UsageError) -> str:
    """A command line that does not parse, on one line: the command, click's reason, and
    where the options are listed (click's own form is a usage line and a boxed message)."""
    where = e.ctx.command_path if e.ctx is not None else "orcasim"
    reason = _bad_value_text(e) or " ".join(e.format_message().split())
    return f"{where}: {reason} (see {where} --help)"


def _bad_value_text(e: UsageError) -> str | None:
    """An option's value that is no number, as `--requests = '1e21': expected an integer`:
    typer checks it with pydantic, whose 'Invalid value for '--requests': Input should be a
    valid integer, unable to parse string as an integer' named no value. None where the
    error is not of that kind (older typer's click names the value itself)."""
    problems: list[dict[str, Any]] = getattr(e.__cause__, "errors", lambda: [])()
    if not isinstance(e, BadParameter) or e.param is None or not problems:
        return None
    kind, value = problems[0]["type"], problems[0].get("input")
    expected = ("an integer, in digits" if kind.startswith("int_")
                else "a number" if kind.startswith("float_") else problems[0]["msg"])
    flag = next((o for o in e.param.opts if o.startswith("--")), None) or str(e.param.name)
    return f"{flag} = {value!r}: expected {expected}"


def main() -> None:
    """The `orcasim` command on `sys.argv`, in this process (tests, notebooks): it ends in
    SystemExit with the command's exit code, and leaves the caller's SIGINT and SIGTERM
    handlers as it found them (see `_ignore_ctrl_c`), and `warnings.showwarning`, which it
    sets to print one line a warning meanwhile."""
    shown = warnings.showwarning
    try:
        _run_command()
    finally:
        warnings.showwarning = shown


def process_main() -> None:
    """The `orcasim` process's entry point: `main`, but the process ends with it, so Ctrl-C
    and SIGTERM stay ignored once the command is done or interrupted, through the
    interpreter's teardown (a SIGTERM there killed a finished `orcasim validate`, exit -15)."""
    global _ends_the_process
    _ends_the_process = True
    with sigterm_as_interrupt():  # no gap between the command's end and the ignoring
        try:
            try:
                _run_command()
            finally:  # one that came during an import and has not been taken: taken now
                take_owed_interrupt()
        except KeyboardInterrupt:  # or one landing after the command's `except`, before its exit
            _tell_interrupted()
            sys.exit(EXIT_INTERRUPTED)
        finally:
            ignore_interrupts()


def _run_command() -> None:
    global _told_interrupted
    # A command of its own: a sweep interrupted by an earlier call in this process (a test,
    # a notebook) left it set, and a later run's Ctrl-C exited 130 without a word.
    _told_interrupted = False
    _SHOWN.clear()  # once a command: a notebook's second command hid the first's warnings
    warnings.showwarning = _show_warning
    try:
        # Not standalone: click's errors come back as values to print on one line; --help and
        # typer.Exit come back as the exit code.
        with sigterm_as_interrupt():
            code = app(standalone_mode=False)
    except UsageError as e:
        typer.echo(f"error: {usage_error_text(e)}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except ClickException as e:
        typer.echo(f"error: {' '.join(e.format_message().split())}", err=True)
        sys.exit(e.exit_code)
    except typer.Abort as e:  # click's form of Ctrl-C (older typer), or end of input
        if isinstance(e.__context__, KeyboardInterrupt):
            _tell_interrupted()
            sys.exit(EXIT_INTERRUPTED)
        typer.echo("aborted", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        _tell_interrupted()
        sys.exit(EXIT_INTERRUPTED)
    except OSError as e:  # the machine, not the input: a full disk, a read-only folder
        where = f" ({e.filename})" if e.filename else ""
        typer.echo(f"error: {e.strerror or e}{where}; nothing was left half-written", err=True)
        sys.exit(EXIT_ENVIRONMENT)
    except MemoryError:  # the machine too: a valid run larger than its memory (or a ulimit)
        typer.echo("error: out of memory: the run needs more memory than this process may take "
                   "(1M requests peak at about 1 GB); run fewer requests or give it more memory; "
                   "nothing was left half-written", err=True)
        sys.exit(EXIT_ENVIRONMENT)
    if code == EXIT_INTERRUPTED and not _told_interrupted:  # typer's form of Ctrl-C
        _tell_interrupted()
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    process_main()
