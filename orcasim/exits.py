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
    ignores both while the process exits: `ignore_interrupts`)."""
    global _owed
    if signal.getsignal(signal.SIGTERM) is not _raise_interrupt:  # the outermost: none owed yet
        _owed = False
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    # Only Python's own Ctrl-C handler is replaced: an ignored SIGINT (a background job's)
    # stays ignored, and a pool's worker keeps its own.
    takes_int = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if takes_int:
        signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is _raise_interrupt:
            signal.signal(signal.SIGTERM, previous_term)
        if takes_int and signal.getsignal(signal.SIGINT) is _raise_interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def ignore_interrupts() -> None:
    """Ctrl-C and SIGTERM are ignored from here to the process's end: for a process whose
    command has its outcome (its output whole, or its interruption said), which the
    interpreter's teardown must not turn into a kill (exit -15 or -2 after `orcasim validate`
    printed 'ok': 12 of 120 runs interrupted at random) or a second message. Ignored, not
    handled: Python resets its own handlers to the default early in its teardown."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


# Interrupts that came while held (`interrupts_held`), to raise as the outermost hold ends.
_holds = 0
_pending = False
# An interrupt that came during an import, to be taken again (`_signal_again`), and not yet
# taken: a command that ends (or commits its output) first takes it then.
_owed = False


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    global _pending, _owed
    if _holds:  # the signal reached another thread, or came just before the mask: later
        _pending = True
        return
    if _importing(frame):
        # Raised inside an import, it may become an ImportError that the importer takes for
        # a missing optional module (matplotlib's Axes3D, pandas' pyarrow): a SIGTERM'd
        # `orcasim run` finished and exited 0 (CI, 2026-12-06), or aborted at exit (-6, in
        # matplotlib's ft2font). orcasim's own modules are no exception: pydantic-core, building
        # a model's validator as the module loads, calls back into Python, and made the
        # interrupt a SchemaError traceback (exit 1, 5 of 120 SIGTERM'd runs) or dropped it
        # (the run went on to exit 0). Taken again once the import is done.
        _owed = True
        threading.Timer(IMPORT_RETRY_S, _signal_again, (signum,)).start()
        return
    _owed = False
    raise Interrupted


def take_owed_interrupt() -> None:
    """Raise the interrupt that came during an import and has not been taken since (`_owed`):
    called where a command commits its output, and as it ends. A short command that is mostly
    imports (`orcasim validate`) otherwise finished before the interrupt came again, and
    exited 0 (69 of 120 runs interrupted at random, 0 to 1.5 s in)."""
    global _owed
    if _owed:
        _owed = False
        raise Interrupted


IMPORT_RETRY_S = 0.05  # how soon an interrupt that came during an import is taken again


def _importing(frame: FrameType | None) -> bool:
    """Whether `frame` runs inside an import, whoever asked for it: code run as a module
    loads (a C extension's start-up, pydantic building a model's validator) may catch the
    interrupt, or turn it into another error."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
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
