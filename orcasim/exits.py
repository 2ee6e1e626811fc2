"""How orcasim's commands end: their exit codes and the interrupt rule that `orcasim` and
`python -m calibrate` share, in one place."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

EXIT_ENVIRONMENT = 1  # the machine, not the input: a full disk, a read-only folder
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C

# Every command writes its output at the end, to a temporary file or folder renamed into place.
INTERRUPTED_TEXT = "interrupted; nothing was left half-written"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within it, SIGTERM unwinds like Ctrl-C (a KeyboardInterrupt), so a write in progress
    removes its partial output; the caller's handler (a test's) comes back after."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
