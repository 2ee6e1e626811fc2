"""What a script that runs another project's simulator is given (`simdistserve.py`,
`vidur.py`): a checkout and an interpreter, each checked before anything runs, with one line
naming the option, the value and what was expected (exit 2), not a traceback from inside
`subprocess`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def refuse(text: str) -> None:
    """Bad input: one line, exit 2."""
    print(f"error: {text}", file=sys.stderr)
    sys.exit(2)


def check_checkout(repo: Path, marker: str, project: str) -> Path:
    """`repo` resolved, if it holds `marker` (a file of `project`'s tree)."""
    if not (repo / marker).is_file():
        refuse(f"--repo {repo}: no {marker}; expected a checkout of {project}")
    return repo.resolve()


def check_interpreter(python: str, modules: tuple[str, ...]) -> None:
    """`python` runs and imports `modules` (the other project's own requirements)."""
    try:
        done = subprocess.run([python, "-c", f"import {', '.join(modules)}"],
                              capture_output=True, text=True)
    except OSError as e:  # no such file, or not executable
        refuse(f"--python {python}: {e.strerror}; expected an interpreter with "
               f"{', '.join(modules)}")
        return
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1]
        refuse(f"--python {python}: {last}; expected an interpreter with {', '.join(modules)}")


def failed(what: str, done: subprocess.CompletedProcess[str]) -> RuntimeError:
    """The other project failed on valid input: its own error, whole, is ours to show."""
    return RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
