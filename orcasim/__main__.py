"""The `orcasim` command (and `python -m orcasim`): Ctrl-C or SIGTERM at any moment once
this module runs ends it as quietly as later (exit 130), never with a traceback from inside
an import, nor killed (exit -2 or -15)."""

from __future__ import annotations

import sys

from orcasim.exits import (
    EXIT_INTERRUPTED,
    INTERRUPTED_TEXT,
    ignore_interrupts,
    interrupts_held,
    sigterm_as_interrupt,
)


def main() -> None:
    # One hold from here to the process's end: a second, the command's own, handed the
    # signals back to Python's defaults between the two, where an interrupt killed the
    # process, or was dropped as it came back from an import (`exits._signal_again`).
    with sigterm_as_interrupt():
        try:
            # Held while the CLI loads, and taken as the load ends: raised inside it, an
            # interrupt could land in another package's code run by the import, which may
            # catch it or turn it into another error.
            with interrupts_held():
                from orcasim.cli import process_main
            process_main()
        except KeyboardInterrupt:
            ignore_interrupts()
            print(INTERRUPTED_TEXT, file=sys.stderr)
            sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
