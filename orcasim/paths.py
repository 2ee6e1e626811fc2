"""Where data files are found: relative to the scenario file, then in orcasim's shipped data."""

from __future__ import annotations

import contextvars
from pathlib import Path

PACKAGE_DATA_DIR = Path(__file__).parent / "data"
# The directory of the scenario file being loaded; relative data paths start there.
SCENARIO_DIR: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "SCENARIO_DIR", default=None
)


def resolve_data_path(path: str) -> Path:
    """Resolve `path`: absolute as is; else against the scenario's folder, then the package data."""
    p = Path(path).expanduser()
    if p.is_absolute():
        candidates = [p]
    else:
        base = SCENARIO_DIR.get()
        # dict.fromkeys drops the cwd when it is the scenario's folder, keeping the order.
        candidates = list(dict.fromkeys(([base / p] if base else []) + [Path.cwd() / p, PACKAGE_DATA_DIR / p]))
    for c in candidates:
        if c.is_file():
            return c
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"file '{path}' not found (looked at: {tried})")
