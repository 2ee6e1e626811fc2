"""Running a sweep into a results folder that survives interruption.

    results/<sweep>/
        sweep.yaml                  the sweep spec as run
        plan.json                   every task (id, point, replication, seed, parameters)
        code.json                   the orcasim that ran it: version, SHA-256 of its files
        points/<task id>/outcome.json   written atomically as each task finishes
        sweep.parquet, sweep.csv    the tidy table: one row per (point, system, replication)
        failures.csv                the failed tasks and their errors, if any

`--resume` keeps the finished tasks and runs the rest (failed ones included); it refuses a
folder whose plan differs from the sweep being run, or that other orcasim code began.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from orcasim.config import ScenarioError
from orcasim.paths import as_path, code_record, input_digests
from orcasim.results import (
    ResultsExistError,
    check_replaceable,
    discard_folder,
    mark_results,
    record_file,
    write_atomically,
    write_text_atomically,
)
from orcasim.scenario import Scenario
from orcasim.sweeps.backends import Backend, check_backend, execute, joined
from orcasim.sweeps.spec import Sweep, Task, scenario_sweep
from orcasim.sweeps.table import tidy_table
from orcasim.sweeps.task import Outcome, show_warnings

OUTCOME_FILE = "outcome.json"
CODE_FILE = "code.json"  # the orcasim that ran the finished points (`paths.code_record`)


@dataclass
class SweepResult:
    """A sweep's outcome: `table`, the tidy table (one row per point, replication and
    system, as sweep.csv holds it); `failed`, the tasks that failed, each with its error;
    `ran` and `skipped`, the tasks run now and those a resumed sweep found done."""

    table: pd.DataFrame
    failed: list[Outcome]
    ran: int
    skipped: int


def run_sweep(
    sweep: Sweep, out_dir: Path, backend: Backend = "local", workers: int | None = None,
    address: str | None = None, resume: bool = False, force: bool = False, progress: bool = True,
) -> SweepResult:
    """Run every unfinished task of `sweep`, writing each outcome as it arrives."""
    out_dir = as_path(out_dir, "out_dir", "the folder to write the sweep to")
    check_backend(backend, workers, address)
    tasks = sweep.tasks()
    with joined(backend, workers, address):
        _prepare(sweep, tasks, out_dir, resume, force)
        sweep.warn_alike_replications()
        todo = [t for t in tasks if not _finished(out_dir, t)]
        shown = set(sweep.said)  # said as its points were checked
        for outcome in _with_progress(execute(todo, backend, workers, address), len(todo),
                                      progress):
            write_outcome(out_dir, outcome.id, outcome.to_json())
            show_warnings(outcome, shown)
    outcomes = [read_outcome(out_dir, t) for t in tasks]
    failed = [o for o in outcomes if not o.ok]
    table = tidy_table([o for o in outcomes if o.ok])
    _write_tables(out_dir, table, failed)
    return SweepResult(table, failed, ran=len(todo), skipped=len(tasks) - len(todo))


def run_sweep_in_memory(
    sweep: Sweep, backend: Backend = "local", workers: int | None = None,
    address: str | None = None,
) -> SweepResult:
    """Run every task and return the tidy table without writing anything (for notebooks)."""
    if not isinstance(sweep, Sweep):  # None raised "... no attribute 'warn_alike_replications'"
        raise ScenarioError(f"sweep = {sweep!r:.80}: expected a Sweep, e.g. "
                            "orcasim.sweeps.make_sweep(...) or load_sweep(path)")
    check_backend(backend, workers, address)
    sweep.warn_alike_replications()
    outcomes = list(execute(sweep.tasks(), backend, workers, address))
    shown = set(sweep.said)  # said as its points were checked
    for outcome in outcomes:
        show_warnings(outcome, shown)
    ok = [o for o in outcomes if o.ok]
    return SweepResult(tidy_table(ok), [o for o in outcomes if not o.ok], len(outcomes), 0)


def run_scenario_sweep(scenario: Scenario, base_dir: Path) -> pd.DataFrame:
    """Run a scenario's own `sweep:` block point after point in this process (`orcasim run`);
    the tidy table. A failed point fails the whole run, as it would fail a plain run."""
    result = run_sweep_in_memory(scenario_sweep(scenario, base_dir), workers=1)
    if result.failed:
        first = result.failed[0]
        where = ", ".join(f"{path}={value}" for path, value in first.params.items())
        raise ScenarioError(f"{scenario.name}: point {first.id} ({where}): {first.error}")
    return result.table


def _plan(tasks: list[Task], digests: dict[str, str]) -> str:
    """The work list, and the data files' digests where the points read any (see
    `paths.input_digests`): a plan that differs is not resumed."""
    rows = [{"id": t.id, "point": t.point, "replication": t.replication, "seed": t.seed,
             "params": t.params} for t in tasks]
    plan: dict[str, object] = {"base": tasks[0].base, "tasks": rows}
    if digests:
        plan["inputs"] = digests
    return json.dumps(plan, indent=1) + "\n"


def _prepare(sweep: Sweep, tasks: list[Task], out_dir: Path, resume: bool, force: bool) -> None:
    spec_yaml = yaml.safe_dump(sweep.spec.model_dump(mode="json"), sort_keys=False)
    plan = _plan(tasks, input_digests(sweep.data_inputs()))
    prepare_resumable(out_dir, plan, {"sweep.yaml": spec_yaml}, resume, force)


def prepare_resumable(out_dir: Path, plan: str, files: dict[str, str], resume: bool,
                      force: bool, inputs: Sequence[Path] = ()) -> None:
    """Make `out_dir` ready for a resumable run whose work list is `plan` (plan.json):
    with `resume`, keep a folder holding the same plan begun by the same code (code.json);
    with `force`, replace a folder
    orcasim wrote (and that holds none of the run's `inputs`); otherwise refuse a folder
    that is not empty, naming only what will work. `files` are written beside the plan."""
    plan_file = out_dir / "plan.json"
    code = json.dumps(code_record(), indent=1) + "\n"
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ResultsExistError(f"--out {out_dir} is a file, not a results folder; use "
                                    "another --out")
        held = _held_text(plan_file)
        held_code = _held_text(out_dir / CODE_FILE)
        if resume and held == plan and (held_code == code or not force):
            _check_code(out_dir, held_code, code, inputs)
            return
        # --resume --force on other code starts over, as its refusal offers (with the same
        # plan --force was ignored, and the refusal said --force again), as it does where
        # the plan differs.
        if force:
            check_replaceable(out_dir, inputs)
            discard_folder(out_dir)
        elif any(out_dir.iterdir()):
            _refuse(out_dir, held, plan, resume, inputs)
    written = {**files, plan_file.name: plan, CODE_FILE: code}
    mark_results(out_dir, list(written))  # first: a crash leaves a folder --force takes
    for name, text in written.items():
        write_text_atomically(out_dir / name, text)


def _refuse(out_dir: Path, held: str | None, plan: str, resume: bool,
            inputs: Sequence[Path]) -> None:
    """Why a run cannot use `out_dir`, suggesting --resume only where it would continue
    this run and --force only where `check_replaceable` lets it replace the folder."""
    force_too = _force_remedy(out_dir, inputs)
    # Without its plan a folder's points cannot be told apart from another run's. Resuming
    # is spoken of only where it was asked for.
    if held is None:
        why = ("holds no plan.json, so its points cannot be matched to this run" if resume
               else "holds no plan.json: not a folder of this run")
        raise ScenarioError(f"{out_dir} already exists and {why}; use another --out{force_too}")
    if held != plan:
        why = ", so this run cannot resume it" if resume else ""
        raise ScenarioError(f"{out_dir} holds a different run (plan.json differs){why}"
                            f"{plan_change(held, plan)}; use another --out{force_too}")
    assert not resume  # resume with the same plan keeps the folder
    raise ResultsExistError(f"{out_dir} already exists; pass --resume to continue it"
                            f"{force_too or ', or use another --out'}")


def _force_remedy(out_dir: Path, inputs: Sequence[Path]) -> str:
    """', or --force to start over' where `check_replaceable` lets --force replace the
    folder; '' where it would refuse."""
    try:
        check_replaceable(out_dir, inputs)
    except ResultsExistError:
        return ""
    return ", or --force to start over"


def _held_text(file: Path) -> str | None:
    """A folder's plan.json or code.json as text; None where it has none. Not UTF-8
    (damaged): a text that differs, not a UnicodeDecodeError's traceback."""
    return file.read_bytes().decode("utf-8", errors="replace") if file.is_file() else None


def _check_code(out_dir: Path, held: str | None, code: str, inputs: Sequence[Path]) -> None:
    """Refuse to resume a folder whose finished points another orcasim computed (`held`,
    its code.json; `paths.code_record`): the table would mix two codes' results."""
    if held == code:
        return
    try:
        there = json.loads(held) if held is not None else None
    except json.JSONDecodeError:
        there = None
    here = json.loads(code)
    if not isinstance(there, dict):
        why = (f"records no orcasim code (its {CODE_FILE} is missing or unreadable: begun "
               "before orcasim recorded its code, or damaged)")
    elif there.get("version") != here["version"]:
        why = f"was run by orcasim {there.get('version')}, this is {here['version']}"
    else:
        why = f"was run by other orcasim code (orcasim {here['version']}, but its files' " \
              "SHA-256 differs: an edit or a reinstall since)"
    raise ScenarioError(f"{out_dir} {why}, so this run cannot resume it: its finished points "
                        f"would mix with this code's; use another --out"
                        f"{_force_remedy(out_dir, inputs)}")


def plan_change(held: str, plan: str) -> str:
    """Where this run's plan first departs from the one a folder holds, for its refusal:
    ': base.workload.num_requests is 40 there, 41 here'. Told only 'plan.json differs', a
    user who resumed without the `--set` the run was started with, or after an edit of the
    base scenario, had to diff the JSON to find out (a tester's finding)."""
    try:
        where = _first_difference(json.loads(held), json.loads(plan), "")
    except json.JSONDecodeError:
        return ""
    return f": {where}" if where else ""


def _first_difference(there: object, here: object, path: str) -> str:
    if path == "inputs" and isinstance(there, dict) and isinstance(here, dict):
        # The data files' SHA-256 digests (`_plan`), by path: a digest says nothing to read.
        for file in [*there, *(f for f in here if f not in there)]:
            if there.get(file) != here.get(file):
                return (f"data file {file} " + ("changed since (its SHA-256 differs)"
                        if file in there and file in here else
                        "was not read there" if file in here else "is not read here"))
        return ""
    if isinstance(there, dict) and isinstance(here, dict):
        for key in [*there, *(k for k in here if k not in there)]:
            at = f"{path}.{key}" if path else str(key)
            if key not in here or key not in there:
                return f"{at} is {'only there' if key in there else 'only here'}"
            found = _first_difference(there[key], here[key], at)
            if found:
                return found
        return ""
    if isinstance(there, list) and isinstance(here, list):
        for i, (a, b) in enumerate(zip(there, here, strict=False)):
            found = _first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        if len(there) != len(here):
            return f"{path}: {len(there)} items there, {len(here)} here"
        return ""
    if there == here and type(there) is type(here):
        return ""
    return f"{path} is {_short(there)} there, {_short(here)} here"


def _short(value: object, max_chars: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def write_outcome(out_dir: Path, job_id: str, text: str) -> None:
    """One finished job's outcome, as points/<id>/outcome.json, appearing whole or not at all."""
    def fill(tmp: Path) -> None:
        (tmp / OUTCOME_FILE).write_text(text)

    write_atomically(out_dir / "points" / job_id, fill, force=True)


def _finished(out_dir: Path, task: Task) -> bool:
    path = out_dir / "points" / task.id / OUTCOME_FILE
    return path.exists() and Outcome.read(path).ok


def read_outcome(out_dir: Path, task: Task) -> Outcome:
    path = out_dir / "points" / task.id / OUTCOME_FILE
    if not path.exists():
        return Outcome.failed(task, "did not run")
    return Outcome.read(path)


def _write_tables(out_dir: Path, table: pd.DataFrame, failed: list[Outcome]) -> None:
    record_file(out_dir, "sweep.parquet", lambda p: table.to_parquet(p, index=False))
    record_file(out_dir, "sweep.csv", lambda p: table.to_csv(p, index=False))
    failures = out_dir / "failures.csv"
    if failed:
        frame = pd.DataFrame([{"id": o.id, "point": o.point, "replication": o.replication,
                               "error": o.error} for o in failed])
        record_file(out_dir, failures.name, lambda p: frame.to_csv(p, index=False))
    else:
        failures.unlink(missing_ok=True)


def _with_progress(outcomes: Iterator[Outcome], total: int, show: bool) -> Iterator[Outcome]:
    """Pass outcomes through while a bar shows tasks done, failures and the ETA."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("[red]{task.fields[failed]} failed"), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), disable=not show) as bar:
        task_id = bar.add_task("sweep", total=total, failed=0)
        failed = 0
        for outcome in outcomes:
            failed += not outcome.ok
            bar.update(task_id, advance=1, failed=failed)
            yield outcome
