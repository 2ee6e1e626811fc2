"""The `orcasim` command (and `python -m orcasim`): Ctrl-C or SIGTERM during its first
second, while the simulator's modules load, ends it as quietly as later (exit 130), not with
a traceback from inside an import."""

from __future__ import annotations

import sys

from orcasim.exits import EXIT_INTERRUPTED, INTERRUPTED_TEXT, sigterm_as_interrupt


def main() -> None:
    try:
        with sigterm_as_interrupt():
            from orcasim.cli import process_main as cli_main
    except KeyboardInterrupt:
        print(INTERRUPTED_TEXT, file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    cli_main()


if __name__ == "__main__":
    main()
