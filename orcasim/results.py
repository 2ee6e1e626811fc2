"""The results/ layout, written atomically: a run's folder appears whole or not at all.

    results/<name>/
        summary.json            {system: {metric: value}}
        summary.csv             one row per system
        scenario.yaml           the resolved scenario (after --set overrides), data paths absolute
        <system>/requests.parquet
        <system>/sessions.parquet  a session workload's rows, one per session
        <system>/iterations.parquet
        <system>/replicas.csv   a cluster's per-replica summaries (replicas_<system>.png plots them)
        *.png                   plots

A scenario with a `sweep:` block writes sweep.csv (the tidy sweep table), scenario.yaml
and latency_vs_throughput.png instead.
"""

from __future__ import annotations

import errno
import functools
import glob
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath

import matplotlib
import pandas as pd
from matplotlib.figure import Figure

from orcasim.exits import interrupts_held, take_owed_interrupt
from orcasim.paths import check_in_a_folder
from orcasim.run import RunResult
from orcasim.scenario import Scenario, scenario_to_yaml


class ResultsExistError(FileExistsError):
    """The output folder exists and the caller did not ask to overwrite it."""


def default_results_dir(scenario_name: str, root: Path = Path("results")) -> Path:
    return root / scenario_name


def write_atomically(out_dir: Path, fill: Callable[[Path], None], force: bool = False) -> Path:
    """Let `fill` write into a fresh temporary folder, then move it to `out_dir` in one rename.

    An existing `out_dir` is replaced only with `force`; it is moved aside before the
    rename and removed after, so a crash never leaves a half-written folder behind.
    """
    # Absolute: run from inside the folder it replaces, a relative --out moved the working
    # folder aside with it, the temporary folder was then not found, and the old results
    # were lost (a tester's finding); '.' had no parent of its own.
    given, out_dir = Path(out_dir), Path(os.path.abspath(out_dir))
    check_out_dir(out_dir, force)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(out_dir)
    tmp = old = None
    try:
        # Held: an interrupt between the folder's making and its name's keeping would leak it.
        with interrupts_held():
            tmp = Path(tempfile.mkdtemp(prefix=_partial_prefix(out_dir, "tmp"), dir=out_dir.parent))
        os.chmod(tmp, _by_umask(0o777))  # as mkdir would: mkdtemp's 0700 would survive the rename
        fill(tmp)
        mark_results(tmp, files_under(tmp))
        if force and out_dir.exists():  # without --force, a folder appeared meanwhile: refused
            check_replaceable(out_dir)
            with interrupts_held():
                old = Path(tempfile.mkdtemp(prefix=_partial_prefix(out_dir, "old"),
                                            dir=out_dir.parent))
            os.replace(out_dir, old / "previous")
        take_owed_interrupt()  # one that came during an import: before the output is kept
        _claim(tmp, out_dir)
    except BaseException:
        # Held: a second Ctrl-C must not cut the clean-up short (a partial folder was left
        # behind once in CI). A replaced folder not yet succeeded goes back in place.
        with interrupts_held():
            if old is not None and (old / "previous").exists() and not out_dir.exists():
                os.replace(old / "previous", out_dir)
            for partial in (tmp, old):
                if partial is not None:
                    shutil.rmtree(partial, ignore_errors=True)
        raise
    if old is not None:
        with interrupts_held():
            shutil.rmtree(old)
    return given


def check_out_dir(out_dir: Path, force: bool, inputs: Iterable[Path] = ()) -> None:
    """Raise unless a run may write `out_dir`: absent, or with `force` a folder that
    `check_replaceable` lets it replace. Commands call it before any work is done."""
    # What --force could not replace either is said first: "pass --force" would not help.
    check_replaceable(out_dir, inputs)
    if out_dir.exists() and not force:
        raise ResultsExistError(f"{out_dir} already exists; pass --force to overwrite it")


def discard_folder(out_dir: Path) -> None:
    """Delete a folder `--force` replaces, renamed aside first in one step: deleted in place,
    an interrupt part-way left a folder without its marker (or plan), which every later
    `--force` refused as one orcasim did not write. Aside, what is left is a hidden partial
    (`dead_partial`) that the next write beside it removes."""
    remove_stale_partials(out_dir)
    with interrupts_held():
        old = Path(tempfile.mkdtemp(prefix=_partial_prefix(out_dir, "old"), dir=out_dir.parent))
        os.replace(out_dir, old / "previous")
    shutil.rmtree(old)


def _partial_prefix(out_dir: Path, kind: str) -> str:
    """Hidden siblings a write makes, named with its process id (see remove_stale_partials)."""
    return f".{out_dir.name}.{kind}-{os.getpid()}-"


def _claim(tmp: Path, out_dir: Path) -> None:
    """Rename `tmp` to `out_dir`, refusing a folder that appeared meanwhile (another run)."""
    try:
        os.rename(tmp, out_dir)  # replaces only an empty folder; a full one raises
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise ResultsExistError(f"{out_dir} was written by another run while this one ran; "
                                    "nothing was replaced") from None
        raise


def remove_stale_partials(out_dir: Path) -> None:
    """Remove hidden partial folders of earlier writes to `out_dir` whose process is gone
    (killed by SIGKILL, or a machine that stopped): a live writer's are left alone."""
    for path in out_dir.parent.glob(f".{glob.escape(out_dir.name)}.*-*-*"):
        parts = path.name[len(out_dir.name) + 2:].split("-")
        if len(parts) != 3 or parts[0] not in ("tmp", "old") or not parts[1].isdigit():
            continue
        if not _alive(int(parts[1])):
            shutil.rmtree(path, ignore_errors=True)


# A hidden partial of a write: `.NAME.tmp-PID-...` or `.NAME.old-PID-...` (see `_partial_prefix`
# and `write_file_atomically`).
_PARTIAL = re.compile(r"^\..+\.(?:tmp|old)-(\d+)-[^/]*$")


def dead_partial(name: str) -> bool:
    """Whether `name` is a partial that a write left when its process died (SIGKILL, out of
    memory, a machine that stopped): orcasim's own, to remove, not a user's file. Left in a
    results folder, `--force` refused the folder for good, saying orcasim did not write it
    (a tester's finding)."""
    match = _PARTIAL.match(name)
    return match is not None and not _alive(int(match.group(1)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no such pid can exist
        return False
    except PermissionError:
        return True  # someone else's: alive
    return True


MARKER = ".orcasim-results"  # in every folder orcasim writes: only such a folder is replaced
# The marker's first line; the files orcasim wrote follow, one relative path a line. A folder
# is replaced only while it holds nothing else: a file a user put there is never deleted.
MARKER_HEADER = "Written by orcasim; --force may replace this folder while it holds only these files:"


def mark_results(folder: Path, names: Iterable[str] = ()) -> None:
    """Mark `folder` as written by orcasim and add `names` (paths relative to it) to the
    files its marker lists, so that `--force` may replace it later."""
    listed = sorted(written_files(folder) | set(names))
    write_text_atomically(folder / MARKER, "\n".join([MARKER_HEADER, *listed]) + "\n")


def written_files(folder: Path) -> set[str]:
    """The files `folder`'s marker lists (none for an older marker, which lists nothing)."""
    marker = folder / MARKER
    lines = marker.read_text(encoding="utf-8").splitlines() if marker.is_file() else []
    return set(lines[1:]) if lines[:1] == [MARKER_HEADER] else set()


def files_under(folder: Path) -> list[str]:
    """Every file below `folder`, as a relative POSIX path (the marker's own form)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if not p.is_dir() and p.name != MARKER)


def unlisted_files(folder: Path) -> Iterator[Path]:
    """Files below a marked `folder` that its marker does not list, and what it never writes:
    a link to a folder, a folder holding none of its files (a user's, empty). A subfolder
    with its own marker (a sweep's points/<id>/) answers for itself."""
    listed = written_files(folder)
    holders = {parent.as_posix() for name in listed for parent in PurePosixPath(name).parents}
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        for d in list(dirs):
            path = here / d
            if dead_partial(d) and not path.is_symlink():  # a dead write's: replaced with the rest
                dirs.remove(d)
            elif path.is_symlink():  # os.walk lists it as a folder and does not enter it
                dirs.remove(d)
                yield path
            elif (path / MARKER).is_file():
                dirs.remove(d)
                yield from unlisted_files(path)
            elif path.relative_to(folder).as_posix() not in holders and not any(path.iterdir()):
                yield path
        for f in files:
            if f != MARKER and not dead_partial(f) and (here / f).relative_to(folder).as_posix() not in listed:
                yield here / f


def check_replaceable(out_dir: Path, inputs: Iterable[Path] = ()) -> None:
    """Raise unless `out_dir` is absent, an empty folder, or a folder orcasim wrote that holds
    only the files it wrote and none of the run's `inputs`: `--force` never deletes a file,
    the scenario's own folder or anything else it did not write."""
    if not out_dir.exists() and not out_dir.is_symlink():
        check_in_a_folder(out_dir, "results")
        return
    if out_dir.is_symlink() or not out_dir.is_dir():
        kind = "a link" if out_dir.is_symlink() else "a file"
        raise ResultsExistError(f"--out {out_dir} is {kind}, not a results folder; orcasim "
                                "replaces only folders it wrote, even with --force")
    inside = [p for p in inputs if Path(p).resolve().is_relative_to(out_dir.resolve())]
    if inside:
        raise ResultsExistError(f"--out {out_dir} holds {inside[0]}, an input of this run; "
                                "--force would delete it: use another --out")
    if not any(out_dir.iterdir()):
        return
    if not (out_dir / MARKER).is_file():
        raise ResultsExistError(f"--out {out_dir} is a folder orcasim did not write (no {MARKER}); "
                                "it replaces only its own results, even with --force")
    stranger = next(unlisted_files(out_dir), None)
    if stranger is not None:
        raise ResultsExistError(f"--out {out_dir} holds {stranger}, which orcasim did not write "
                                f"(not listed in {MARKER}); move it away or use another --out")


def record_file(out_dir: Path, name: str, write: Callable[[Path], object]) -> Path:
    """`write_file_atomically` into a results folder, listing the file in its marker first
    (a crash between the two leaves a listed file absent, which is harmless)."""
    mark_results(out_dir, [name])
    return write_file_atomically(out_dir / name, write)


def write_file_atomically(path: Path, write: Callable[[Path], object], replace: bool = True) -> Path:
    """Let `write` fill a temporary file beside `path`, then rename it into place. The
    temporary is named with this process's id, and an earlier one of a dead process
    (`dead_partial`) is removed first. `replace` False (a command without --force, which
    checked `path` was free before its work): a file that appeared there meanwhile (another
    run's) is kept, and this one refused, as `write_atomically` refuses a folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.tmp-*-*"):
        if stale.is_file() and dead_partial(stale.name):
            stale.unlink(missing_ok=True)
    name = None
    try:
        with interrupts_held():  # see write_atomically
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent)
            os.close(fd)
        write(Path(name))
        os.chmod(name, _by_umask(0o666))  # mkstemp's 0600 is for the temporary file only
        take_owed_interrupt()  # see write_atomically
        if replace:
            os.replace(name, path)
        else:
            _claim_file(Path(name), path)
    except BaseException:
        if name is not None:
            with interrupts_held():
                Path(name).unlink(missing_ok=True)
        raise
    return path


def _claim_file(tmp: Path, path: Path) -> None:
    """Link `tmp` as `path` (a link, unlike a rename, never replaces: one step, no race with
    another writer), then drop `tmp`; a file already there is refused."""
    taken = ResultsExistError(f"{path} was written by another run while this one ran; "
                              "nothing was replaced")
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise taken from None
    except OSError as e:
        # A file system without hard links: look, then rename (a race of a moment remains).
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        if os.path.lexists(path):
            raise taken from None
        os.replace(tmp, path)
        return
    tmp.unlink()


def _by_umask(mode: int) -> int:
    """`mode` less the process's umask: what a plain mkdir or open would give."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def write_text_atomically(path: Path, text: str) -> Path:
    """`text` into `path`, atomically (see write_file_atomically)."""
    return write_file_atomically(path, lambda p: p.write_text(text))


def write_run(result: RunResult, out_dir: Path, force: bool = False, plots: bool = True) -> Path:
    """Write a run's summary, frames, scenario and plots into `out_dir` atomically."""
    return write_atomically(out_dir, lambda tmp: _fill_run(result, tmp, plots), force)


def _fill_run(result: RunResult, tmp: Path, plots: bool) -> None:
    summary = {name: r.summary for name, r in result.systems.items()}
    (tmp / "summary.json").write_text(json.dumps(json_safe(summary), indent=2) + "\n")
    result.summary_frame().rename_axis("system").to_csv(tmp / "summary.csv")
    (tmp / "scenario.yaml").write_text(scenario_to_yaml(result.scenario))
    for name, r in result.systems.items():
        (tmp / name).mkdir()
        r.requests.to_parquet(tmp / name / "requests.parquet", index=False)
        r.iterations.to_parquet(tmp / name / "iterations.parquet", index=False)
        if r.replicas is not None:  # a cluster: one summary row per replica
            r.replicas.to_csv(tmp / name / "replicas.csv")
        if r.sessions is not None:  # a session workload: one row per session
            r.sessions.to_parquet(tmp / name / "sessions.parquet", index=False)
    if plots:
        from orcasim.plots import run_figures

        for stem, fig in run_figures(result).items():
            save_figure(fig, tmp / f"{stem}.png")


def write_scenario_sweep(
    table: pd.DataFrame, scenario: Scenario, out_dir: Path, force: bool = False, plots: bool = True
) -> Path:
    """A scenario's own sweep: the tidy sweep.csv, the resolved scenario.yaml and
    latency_vs_throughput.png (lines along the swept parameter), atomically."""
    assert scenario.sweep is not None, "write_scenario_sweep needs a scenario with a sweep block"
    parameter = scenario.sweep.parameter

    def fill(tmp: Path) -> None:
        table.to_csv(tmp / "sweep.csv", index=False)
        (tmp / "scenario.yaml").write_text(scenario_to_yaml(scenario))
        if plots:
            from orcasim.plots import scenario_sweep_figures

            for stem, fig in scenario_sweep_figures(table, parameter, scenario.name).items():
                save_figure(fig, tmp / f"{stem}.png")

    return write_atomically(out_dir, fill, force)


def _file_stems(keys: list[str]) -> dict[str, str]:
    """A file name for each 'run/system' key, '/' as '__', and one that meets an earlier
    one's numbered ('a/run' and 'a__run' would otherwise share a figure, the later replacing
    the earlier)."""
    stems: dict[str, str] = {}
    for key in keys:
        stem, n = key.replace("/", "__"), 1
        while (stem if n == 1 else f"{stem}-{n}") in stems.values():
            n += 1
        stems[key] = stem if n == 1 else f"{stem}-{n}"
    return stems


def write_fidelity(
    table: pd.DataFrame, frames: dict[str, pd.DataFrame], out_dir: Path, force: bool = False,
    plots: bool = True,
) -> Path:
    """`orcasim fidelity`'s folder: fidelity.csv (run, system, metric, percentile, real,
    simulated, rel_error, requests: how many it compared), summary.json (the headline error per run and system) and one
    real-against-simulated CDF figure per run and system, atomically."""
    from orcasim.fidelity import headline_error

    def fill(tmp: Path) -> None:
        table.to_csv(tmp / "fidelity.csv", index=False)
        summary = {f"{run}/{system}": headline_error(rows)
                   for (run, system), rows in table.groupby(["run", "system"], sort=False)}
        (tmp / "summary.json").write_text(json.dumps(json_safe(summary), indent=2) + "\n")
        if plots:
            from orcasim.plots import fidelity_cdfs

            for key, stem in _file_stems(list(frames)).items():
                save_figure(fidelity_cdfs(frames[key], f"{key}: real against simulated"),
                            tmp / f"{stem}_cdf.png")

    return write_atomically(out_dir, fill, force)


def save_figure(fig: Figure, path: Path, svg: bool = False) -> list[Path]:
    """Write `fig` as PNG at `path` (and beside it as SVG). Figures made without pyplot
    need no closing: they are freed with their last reference."""
    paths = [path] + ([path.with_suffix(".svg")] if svg else [])
    for p in paths:  # each whole or not at all, as every other file orcasim writes
        write_file_atomically(p, functools.partial(_save_as, fig, p.suffix[1:]))
    return paths


def _save_as(fig: Figure, kind: str, tmp: Path) -> None:
    if kind != "svg":
        fig.savefig(tmp, format=kind, dpi=110, bbox_inches="tight")  # tmp's suffix is not the kind
        return
    # An SVG's date and its ids (random unless salted) differed between two plots of one
    # run, in 600 lines of a diff; the same figure now writes the same bytes, as a PNG does.
    with matplotlib.rc_context({"svg.hashsalt": "orcasim"}):
        fig.savefig(tmp, format=kind, dpi=110, bbox_inches="tight", metadata={"Date": None})


def json_safe(obj: object) -> object:
    """NaN is not JSON: write it as null."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
