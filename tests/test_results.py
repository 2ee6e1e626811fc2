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
