"""Where data files are found: relative to the scenario file, then in orcasim's shipped data."""

from __future__ import annotations

import contextvars
import json
from pathlib import Path
from typing import Annotated, Any

import pandas as pd

from orcasim.config import ScenarioError

PACKAGE_DATA_DIR = Path(__file__).parent / "data"
# The directory of the scenario file being loaded; relative data paths start there.
SCENARIO_DIR: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "SCENARIO_DIR", default=None
)


# Marks a scenario field that names a data file or folder (see portable_data_path).
DATA_PATH = "orcasim data path"
DataPath = Annotated[str, DATA_PATH]
OptionalDataPath = Annotated[str | None, DATA_PATH]


def portable_data_path(path: str, base: Path | None) -> str:
    """`path` as a copy of the scenario saved in another folder still finds it: a file or
    folder found beside the scenario (`base`) or under the working folder becomes absolute.
    Absolute paths, names of orcasim's shipped data (found from anywhere) and paths found
    nowhere stay as written."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return path
    for c in ([base / p] if base else []) + [Path.cwd() / p]:  # resolve_data_path's order
        if c.exists():
            return str(c.resolve())
    return path


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


# Readers of users' files: any file that cannot be parsed is a one-line ScenarioError that
# names it, never a decoder's traceback.

def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not UTF-8 text; expected a JSON file") from None
    except json.JSONDecodeError as e:
        raise ScenarioError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


def read_csv(path: Path, **kwargs: Any) -> pd.DataFrame:
    try:
        return pd.read_csv(path, **kwargs)
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not UTF-8 text (compressed or binary?); expected a CSV "
                            "file") from None
    except pd.errors.EmptyDataError:
        raise ScenarioError(f"{path}: empty; expected a CSV file with a header row") from None
    except pd.errors.ParserError as e:
        raise ScenarioError(f"{path}: malformed CSV ({str(e).strip().splitlines()[-1]})") from None
    except ValueError as e:  # e.g. a column asked for is absent
        raise ScenarioError(f"{path}: {e}") from None


def csv_data_line(path: Path, row: int) -> int:
    """The file line (from 1) of data row `row` of a CSV with one header line, as an error
    names it: pandas skips blank lines, so they are counted back in."""
    with Path(path).open(encoding="utf-8") as f:
        non_blank = (number for number, text in enumerate(f, start=1) if text.strip())
        for index, number in enumerate(non_blank):
            if index == row + 1:  # the header is non-blank line 0
                return number
    return row + 2


def read_parquet(path: Path) -> pd.DataFrame:
    if not Path(path).is_file():
        raise FileNotFoundError(2, "no such file", str(path))
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise ScenarioError(f"{path}: not a readable Parquet file ({e})") from None
