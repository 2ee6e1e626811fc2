"""How orcasim's commands end: their exit codes and the interrupt rule that `orcasim` and
`python -m calibrate` share, in one place."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

EXIT_ENVIRONMENT = 1  # the machine, not the input: a full disk, a read-only folder
# A verdict, with the same code: a sweep's or capacity search's failed points, or a metric
# that `orcasim check` found moved. (An uncaught error, a bug, exits 1 too: Python's code.)
EXIT_VERDICT = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C

# Every command writes its output at the end, to a temporary file or folder renamed into place.
INTERRUPTED_TEXT = "interrupted; nothing was left half-written"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM within `sigterm_as_interrupt`. A subclass, because CPython marks an
    exactly-KeyboardInterrupt that leaves `exec` or `eval` of a string (a dataclass or named
    tuple being built as a late import runs) as unhandled, even once caught: `python -m`
    then ends by killing itself with SIGINT (exit -2) after the command said exit 130."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within it, SIGTERM unwinds like Ctrl-C (an `Interrupted`, a KeyboardInterrupt), so a
    write in progress removes its partial output; Ctrl-C raises the same. The caller's
    handlers (a test's) come back after, except where the command has since changed one (it
    ignores Ctrl-C while it exits)."""
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    # Only Python's own Ctrl-C handler is replaced: an ignored SIGINT (a background job's)
    # stays ignored, and a pool's worker keeps its own.
    takes_int = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if takes_int:
        signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        if takes_int and signal.getsignal(signal.SIGINT) is _raise_interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise Interrupted


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back in this thread meanwhile; one that arrived is raised as
    the block ends. For the few steps that must not be cut in two: a temporary folder made
    and its name kept, or a partial output removed while a second Ctrl-C arrives."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
