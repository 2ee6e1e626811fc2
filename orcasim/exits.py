"""How orcasim's commands end: their exit codes and the interrupt rule that `orcasim` and
`python -m calibrate` share, in one place."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

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


# Interrupts that came while held (`interrupts_held`), to raise as the outermost hold ends.
_holds = 0
_pending = False


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    global _pending
    if _holds:  # the signal reached another thread, or came just before the mask: later
        _pending = True
        return
    if _importing(frame):
        # Raised inside an import, it may become an ImportError that the importer takes for
        # a missing optional module and goes on without (matplotlib's Axes3D, pandas'
        # pyarrow): a SIGTERM'd `orcasim run` finished and exited 0 (CI, 2026-12-06), or
        # aborted at exit (-6, in matplotlib's ft2font). Taken again once the import is done.
        threading.Timer(IMPORT_RETRY_S, _signal_again, (signum,)).start()
        return
    raise Interrupted


IMPORT_RETRY_S = 0.05  # how soon an interrupt that came during an import is taken again


_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # orcasim's own modules


def _importing(frame: FrameType | None) -> bool:
    """Whether `frame` runs inside an import that another package's code asked for (the one
    to run outside importlib's frames): it may catch ImportError. orcasim's own imports do
    not, and an interrupt while they load is taken at once (exit 130, quietly)."""
    in_import = False
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith("<frozen importlib"):
            in_import = True
        elif in_import:  # the code that ran this import statement
            if not os.path.abspath(name).startswith(_OWN_DIR):
                return True
            in_import = False
        frame = frame.f_back
    return False


def _signal_again(signum: int) -> None:
    """Send `signum` to this process again, if orcasim still takes it (else it would kill a
    process that has finished its command)."""
    if signal.getsignal(signum) is _raise_interrupt:
        os.kill(os.getpid(), signum)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back in this thread meanwhile; one that arrived is raised as
    the block ends. For the few steps that must not be cut in two: a temporary folder made
    and its name kept, or a partial output removed while a second Ctrl-C arrives."""
    # The mask alone does not hold them: a process's SIGTERM (or a terminal's Ctrl-C) may reach
    # another thread (BLAS's), or have reached this one just before, and Python then runs its
    # handler in this thread at its next instruction, inside the block (a SIGTERM'd run's
    # import of matplotlib, CI 2026-12-06). So orcasim's handler defers it too.
    global _holds, _pending
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    _holds += 1
    try:
        yield
    finally:
        _holds -= 1
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if not _holds and _pending:
            _pending = False
            raise Interrupted
