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
    assert [p.name for p in out.iterdir()] == ["b.txt"]
