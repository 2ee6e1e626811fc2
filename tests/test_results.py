"""Atomic results: a folder appears whole or not at all, and is never silently replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from orcasim.results import ResultsExistError, write_atomically


def test_failure_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "r"

    def broken(tmp: Path) -> None:
        (tmp / "half.json").write_text("{")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomically(out, broken)
    assert list(tmp_path.iterdir()) == []


def test_overwrite_needs_force_and_keeps_old_on_failure(tmp_path: Path) -> None:
    out = tmp_path / "r"
    write_atomically(out, lambda t: (t / "a.txt").write_text("1"))
    with pytest.raises(ResultsExistError):
        write_atomically(out, lambda t: (t / "a.txt").write_text("2"))

    def broken(tmp: Path) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_atomically(out, broken, force=True)
    assert (out / "a.txt").read_text() == "1"
    write_atomically(out, lambda t: (t / "b.txt").write_text("2"), force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    assert sorted(p.name for p in out.iterdir()) == [".orcasim-results", "b.txt"]


def test_force_replaces_only_what_orcasim_wrote(tmp_path: Path) -> None:
    """--force never deletes a file, a folder holding the user's own files, or a folder
    orcasim did not write; it does replace an empty folder and its own results."""
    from orcasim.results import MARKER

    def fill(folder: Path) -> None:
        (folder / "summary.csv").write_text("x\n")

    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(ResultsExistError, match="is a file"):
        write_atomically(a_file, fill, force=True)
    assert a_file.read_text() == "mine"
    theirs = tmp_path / "scenarios"
    theirs.mkdir()
    (theirs / "run.yaml").write_text("name: x\n")
    with pytest.raises(ResultsExistError, match="did not write"):
        write_atomically(theirs, fill, force=True)
    assert (theirs / "run.yaml").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (write_atomically(empty, fill, force=True) / MARKER).is_file()
    again = write_atomically(empty, fill, force=True)  # its own results: replaced
    assert (again / "summary.csv").is_file()


def test_force_keeps_a_file_put_into_orcasim_s_folder(tmp_path: Path) -> None:
    """A file the user added to a results folder, at the top or in a system's subfolder,
    or a file the run reads, makes --force refuse: nothing is deleted."""
    from orcasim.results import check_replaceable

    def fill(folder: Path) -> None:
        (folder / "orca").mkdir()
        (folder / "orca" / "a.parquet").write_text("1")

    out = write_atomically(tmp_path / "r", fill)
    check_replaceable(out)  # only its own files: replaceable
    for extra in (out / "mine.yaml", out / "orca" / "notes.txt"):
        extra.write_text("mine")
        with pytest.raises(ResultsExistError, match=f"holds {extra}, which orcasim did not write"):
            write_atomically(out, lambda t: (t / "b.txt").write_text("2"), force=True)
        assert extra.read_text() == "mine"
        extra.unlink()
    with pytest.raises(ResultsExistError, match="an input of this run"):
        check_replaceable(out, [out / "orca" / "a.parquet"])


def test_force_keeps_a_link_or_a_folder_put_into_orcasim_s_folder(tmp_path: Path) -> None:
    """A link to a folder (os.walk lists it among the folders and does not enter it) and an
    empty folder the user made were deleted with the results; both now make --force refuse.
    A folder of orcasim's own files is still its own."""
    from orcasim.results import check_replaceable

    def fill(folder: Path) -> None:
        (folder / "orca").mkdir()
        (folder / "orca" / "a.parquet").write_text("1")

    out = write_atomically(tmp_path / "r", fill)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    for extra, make in ((out / "link", lambda p: p.symlink_to(elsewhere)),
                        (out / "mine", lambda p: p.mkdir()),
                        (out / "orca" / "deeper", lambda p: p.mkdir())):
        make(extra)
        with pytest.raises(ResultsExistError, match=f"holds {extra}, which orcasim did not write"):
            check_replaceable(out)
        extra.unlink() if extra.is_symlink() else extra.rmdir()
    check_replaceable(out)
    assert (elsewhere / "keep.txt").read_text() == "mine"


def test_folders_follow_the_umask_as_mkdir_does(tmp_path: Path) -> None:
    """A run's folder is as readable as a sweep's: mkdtemp's 0700 does not leak out."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        out = write_atomically(tmp_path / "r", lambda t: (t / "a.txt").write_text("1"))
        (tmp_path / "plain").mkdir()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(out).st_mode) == stat.S_IMODE(os.stat(tmp_path / "plain").st_mode) == 0o755


def test_a_folder_written_meanwhile_is_not_replaced(tmp_path: Path) -> None:
    """Two runs into one --out without --force: the later rename refuses, and leaves nothing."""
    out = tmp_path / "r"

    def fill_while_another_run_finishes(folder: Path) -> None:
        (folder / "mine.txt").write_text("2")
        out.mkdir()
        (out / "theirs.txt").write_text("1")

    with pytest.raises(ResultsExistError, match="another run"):
        write_atomically(out, fill_while_another_run_finishes)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    assert [p.name for p in out.iterdir()] == ["theirs.txt"]


def test_partial_folders_of_dead_writes_are_swept(tmp_path: Path) -> None:
    import os

    dead = tmp_path / ".r.tmp-999999999-abc123"  # no such process
    alive = tmp_path / f".r.tmp-{os.getpid()}-def456"  # a write still going on
    other = tmp_path / ".s.tmp-999999999-abc123"  # another folder's
    for folder in (dead, alive, other):
        folder.mkdir()
    write_atomically(tmp_path / "r", lambda t: (t / "a.txt").write_text("1"))
    assert not dead.exists() and alive.exists() and other.exists()


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (Linux: /proc/PID/status, SigCgt)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (signum - 1) & 1)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_sigterm_during_a_run_leaves_no_partial_folder(tmp_path: Path) -> None:
    """And says so, exit 130 (typer turned the interrupt into a silent 130)."""
    import signal
    import subprocess
    import sys
    import time

    scenario = tmp_path / "long.yaml"
    scenario.write_text(
        "name: long\nworkload: {num_requests: 400000, arrival: {kind: poisson, rate_per_s: 50},"
        " prompt_tokens: {kind: uniform, low: 8, high: 64}, output_tokens: {kind: uniform, low: 1,"
        " high: 64}, max_tokens: 128}\ncost: {kind: linear, base_s: 0.01}\n"
        "kv_capacity_tokens: 4000\nsystems: [{name: s, scheduler: {kind: paged, max_num_seqs: 8}}]\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "orcasim.cli", "run", str(scenario), "--out",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Not a fixed sleep: on a busy machine the imports alone took over 2 s, and SIGTERM then
    # ended the process before orcasim could catch it (exit -15).
    deadline_s = time.monotonic() + 60
    while not _catches(proc.pid, signal.SIGTERM):
        assert proc.poll() is None and time.monotonic() < deadline_s, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.5)  # into the simulation
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and b"Traceback" not in err, err
    assert err.decode().endswith("interrupted; nothing was left half-written\n"), err
    assert list(tmp_path.iterdir()) == [scenario]


def test_without_force_a_folder_force_could_not_replace_says_so_first(tmp_path: Path) -> None:
    """'already exists; pass --force' sent the user to --force, which then refused too."""
    from orcasim.results import check_out_dir

    afile, foreign = tmp_path / "afile", tmp_path / "foreign"
    afile.write_text("")
    (foreign / "notes").mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(foreign)
    for out, phrase in ((afile, "is a file, not a results folder"), (link, "is a link, not a"),
                        (foreign, "is a folder orcasim did not write")):
        with pytest.raises(ResultsExistError, match=phrase):
            check_out_dir(out, force=False)
    mine = write_atomically(tmp_path / "mine", lambda t: (t / "a.txt").write_text("1"))
    with pytest.raises(ResultsExistError, match="already exists; pass --force"):
        check_out_dir(mine, force=False)


def test_a_second_ctrl_c_during_the_clean_up_still_removes_the_partial_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C twice on a sweep left a point's hidden temporary folder (once in CI): the second
    press landed in the clean-up of the first. It is held back until the folder is gone."""
    import shutil
    import signal

    from orcasim import results

    real_rmtree = shutil.rmtree

    def second_press_then_rmtree(path: Path, *args: object, **kwargs: object) -> None:
        signal.raise_signal(signal.SIGINT)  # the second Ctrl-C, as the clean-up starts
        real_rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

    def first_press(tmp: Path) -> None:
        (tmp / "outcome.json").write_text("{")
        raise KeyboardInterrupt

    monkeypatch.setattr(results.shutil, "rmtree", second_press_then_rmtree)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            write_atomically(tmp_path / "p0000", first_press)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_as_the_temporary_folder_is_made_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between mkdtemp's mkdir and the name's return the folder was nobody's to remove."""
    import os
    import signal

    real_mkdir = os.mkdir

    def mkdir_then_ctrl_c(path: str, *args: object, **kwargs: object) -> None:
        real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]
        if ".tmp-" in os.fspath(path):
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(os, "mkdir", mkdir_then_ctrl_c)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            write_atomically(tmp_path / "r", lambda t: (t / "a.txt").write_text("1"))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert list(tmp_path.iterdir()) == []


def test_replacing_the_folder_one_stands_in_keeps_its_results(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--out ../r --force run from inside r: the relative path moved the working folder aside
    with r, the temporary folder was no longer found, nothing was restored, and the next run
    swept the old results away (a tester's finding). '.' had no parent of its own."""
    out = tmp_path / "r"
    write_atomically(out, lambda t: (t / "a.txt").write_text("1"))
    monkeypatch.chdir(out)
    write_atomically(Path("../r"), lambda t: (t / "a.txt").write_text("2"), force=True)
    assert (out / "a.txt").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    write_atomically(Path("."), lambda t: (t / "b.txt").write_text("3"), force=True)
    assert (tmp_path / "here" / "b.txt").read_text() == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here", "r"]


def test_a_dead_writes_partial_file_neither_blocks_force_nor_stays(tmp_path: Path) -> None:
    """A SIGKILL during a single file's write left `.sweep.parquet.tmp-...` in the results
    folder; `--force` then refused the folder for good, saying orcasim did not write it, and
    `--resume` left it there (a tester's finding). A dead process's partial (file, or a
    point's folder) is orcasim's own; the next write of that file removes it."""
    import os

    from orcasim.results import check_replaceable, mark_results, record_file

    out = tmp_path / "out"
    out.mkdir()
    mark_results(out)
    record_file(out, "sweep.csv", lambda p: p.write_text("a\n"))
    dead_file = out / ".sweep.csv.tmp-999999999-abc123"  # no such process
    dead_file.write_text("partial")
    (out / "points").mkdir()
    (out / "points" / ".p0001-r00.tmp-999999999-xyz").mkdir()
    (out / "points" / ".p0001-r00.tmp-999999999-xyz" / "outcome.json").write_text("{")
    check_replaceable(out)
    live = out / f".sweep.csv.tmp-{os.getpid()}-def456"  # a write still going on
    live.write_text("partial")
    with pytest.raises(ResultsExistError, match="which orcasim did not write"):
        check_replaceable(out)
    live.unlink()
    record_file(out, "sweep.csv", lambda p: p.write_text("b\n"))
    assert not dead_file.exists() and (out / "sweep.csv").read_text() == "b\n"
    assert [p.name for p in out.glob(".sweep.csv.tmp-*")] == []


def test_an_interrupt_that_reaches_a_hold_is_raised_as_it_ends() -> None:
    """pthread_sigmask holds a signal back from this thread only: a process's SIGTERM that
    another thread (BLAS's) takes, or one taken just before the mask, runs orcasim's handler
    here inside the block. The handler defers it to the outermost hold's end."""
    import signal

    from orcasim import exits

    reached = []
    with pytest.raises(exits.Interrupted):
        with exits.interrupts_held():
            with exits.interrupts_held():
                exits._raise_interrupt(signal.SIGTERM, None)  # as Python runs it in the block
                reached.append("inner")
            reached.append("outer")  # the inner hold's end does not raise: the outer holds
    assert reached == ["inner", "outer"]
    with exits.interrupts_held():  # nothing pending is left behind
        pass


def test_an_interrupt_during_an_import_is_taken_again_after_it() -> None:
    """Raised inside an import, an interrupt could become an ImportError that the importer
    took for a missing optional module (matplotlib's Axes3D warned and went on): a SIGTERM'd
    run exited 0 having finished (CI, 2026-12-06). orcasim's handler sends it again once the
    import is done, so the command ends interrupted (exit 130) and the import is whole."""
    import subprocess
    import sys

    probe = (
        "import os, signal, sys, time\n"
        "from orcasim import exits\n"
        "class Spy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'json':  # an import under way: the signal comes now\n"
        "            try:  # as a C extension's start-up turns any error into an ImportError\n"
        "                os.kill(os.getpid(), signal.SIGTERM)\n"
        "                for _ in range(1000): pass  # Python runs the handler here\n"
        "            except BaseException as e:\n"
        "                raise ImportError('initialization failed') from e\n"
        "        return None\n"
        "sys.meta_path.insert(0, Spy())\n"
        "sys.modules.pop('json', None)\n"
        "with exits.sigterm_as_interrupt():\n"
        "    try:\n"
        "        try:  # an optional module, as matplotlib imports Axes3D\n"
        "            import json\n"
        "        except ImportError:\n"
        "            json = None\n"
        "        assert json is not None and json.dumps is not None  # whole\n"
        "        time.sleep(5)  # the interrupt comes again meanwhile\n"
        "        print('finished')\n"
        "    except exits.Interrupted:\n"
        "        print('interrupted after the import')\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "interrupted after the import\n", done
