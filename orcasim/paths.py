"""Where data files are found: relative to the scenario file, then in orcasim's shipped data."""

from __future__ import annotations

import bz2
import contextlib
import contextvars
import copy
import csv
import functools
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from pathlib import Path, PurePath
from typing import IO, Annotated, Any, TypeVar

import pandas as pd

from orcasim.config import ScenarioError

PACKAGE_DATA_DIR = Path(__file__).parent / "data"
# The directory of the scenario file being loaded; relative data paths start there.
SCENARIO_DIR: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "SCENARIO_DIR", default=None
)


def as_path(path: object, what: str = "path", expected: str = "a YAML file's path") -> Path:
    """`path` (a str or a Path) as a Path; anything else, None included, is a ScenarioError
    naming the argument `what`, not os.fspath's TypeError from inside pathlib."""
    if not isinstance(path, str | PurePath):
        raise ScenarioError(f"{what} = {path!r:.80}: expected {expected} (str or Path)")
    return Path(path)


# Marks a scenario field that names a data file or folder (see portable_data_path).
DATA_PATH = "orcasim data path"
DataPath = Annotated[str, DATA_PATH]
OptionalDataPath = Annotated[str | None, DATA_PATH]


def input_digests(paths: Iterable[Path]) -> dict[str, str]:
    """Each data file a run reads (a folder's files, in order), by path: the SHA-256 of its
    bytes. A resumable run's plan records them, so that a file changed between an
    interruption and `--resume` is not half read one way and half the other."""
    digests: dict[str, str] = {}
    for path in sorted({Path(p) for p in paths}):
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        for file in files:
            if file.is_file():
                digests[str(file)] = hashlib.sha256(file.read_bytes()).hexdigest()
    return digests


@functools.cache
def code_record() -> dict[str, str]:
    """orcasim's version and the SHA-256 of its own files (code and shipped data, by path),
    as a resumable run records them: a sweep resumed after an upgrade or an edit of orcasim
    ran its remaining points with other code, and its table mixed the two with nothing said.
    The version alone cannot tell, as a checkout's stays the same across edits."""
    from orcasim import __version__

    package = Path(__file__).parent
    digest = hashlib.sha256()
    # Its modules and shipped data, not whatever else lies in the folder (an editor's swap
    # file beside a module would refuse every resume).
    for file in sorted(f for f in package.rglob("*") if f.is_file()
                       and "__pycache__" not in f.parts
                       and (f.suffix == ".py" or f.relative_to(package).parts[0] == "data")):
        digest.update(file.relative_to(package).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return {"version": __version__, "sha256": digest.hexdigest()}


def check_in_a_folder(path: Path, what: str) -> None:
    """Refuse an output path below a file (`--out notes.txt/sub`), which no write could
    make, in one line naming the file; checked before any work."""
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ScenarioError(f"--out {path}: {parent} is a file, not a folder; expected a path "
                            f"in a folder for the {what}")


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


def resolve_data_path(path: str, inside: str | None = None) -> Path:
    """Resolve `path`: absolute as is; else against the scenario's folder, then the package
    data. With `inside`, a folder stands for its file of that name (a model's config.json)."""
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
        if inside is not None and (c / inside).is_file():
            return c / inside
    folders = [c for c in candidates if c.is_dir()]
    if folders:  # it exists, but not as a file: "not found" would send the user looking
        also = f", or a folder holding {inside}" if inside else ""
        raise FileNotFoundError(f"'{path}' is a folder ({folders[0]}); expected a file{also}")
    others = [c for c in candidates if c.exists()]
    if others:  # /dev/null, a pipe: there, and "not found" said otherwise
        raise FileNotFoundError(f"'{path}' is not a regular file ({others[0]}: a device, pipe or "
                                "socket); expected a file")
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(f"file '{path}' not found (looked at: {tried})")


T = TypeVar("T")
# A calibration's search (python -m calibrate logs) runs a scenario hundreds of times, and
# each run read its trace and its cost file again: a third of the search's time.
_FILE_MEMO: OrderedDict[tuple[Hashable, ...], Any] = OrderedDict()
FILE_MEMO_ENTRIES = 16


def read_once(path: Path, key: Hashable, read: Callable[[], T],
              copy_out: Callable[[T], T] = copy.deepcopy) -> T:
    """`read()`, or a copy (`copy_out`) of what it gave for the same `key` while the file
    stayed the same (its device, inode, size, and modification and change times in ns): the
    caller owns what it gets. The warnings the read gave are given again to every caller. An
    error is not kept, so a file that fails is read (and fails) again."""
    info = Path(path).stat()
    memo_key = (str(Path(path).resolve()), info.st_dev, info.st_ino, info.st_size,
                info.st_mtime_ns, info.st_ctime_ns, key)
    if memo_key not in _FILE_MEMO:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = read()
        _FILE_MEMO[memo_key] = (value, [(w.message, w.category) for w in caught])
        while len(_FILE_MEMO) > FILE_MEMO_ENTRIES:
            _FILE_MEMO.popitem(last=False)
    _FILE_MEMO.move_to_end(memo_key)
    value, said = _FILE_MEMO[memo_key]
    for message, category in said:
        warnings.warn(message, category, stacklevel=3)  # as the read itself said it
    return copy_out(value)


# Readers of users' files: any file that cannot be parsed is a one-line ScenarioError that
# names it, never a decoder's traceback.

def read_json(path: Path) -> Any:
    try:
        with decompressing(path), open_text(path) as f:
            return json.loads(f.read())
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not UTF-8 text; expected a JSON file") from None
    except json.JSONDecodeError as e:
        raise ScenarioError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:  # the decoder recurses per level of nesting
        raise ScenarioError(f"{path}: not valid JSON (nested too deeply)") from None


def read_problem(error: BaseException) -> str:
    """Why a file could not be read or parsed, on one line (YAML's and JSON's messages run
    over several, pointing at the place)."""
    mark, problem = getattr(error, "problem_mark", None), getattr(error, "problem", None)
    if mark is not None:  # yaml.MarkedYAMLError
        return f"{problem or 'not YAML'} at line {mark.line + 1}, column {mark.column + 1}"
    if problem:  # a YAML error with no place (nested too deeply)
        return str(problem)
    if isinstance(error, UnicodeDecodeError):
        return "not UTF-8 text"
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if not isinstance(error, ValueError) else text


# The compressions pandas infers from a name's last suffix; the readers that are not pandas'
# open them the same way, so a .csv.gz that pandas reads is one whose errors can name a line.
_OPENERS: dict[str, Callable[..., IO[str]]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def compression_suffix(path: Path) -> str:
    """`.gz`, `.bz2`, `.xz` or `.zip` where the name ends so, else ''."""
    suffix = Path(path).suffix.lower()
    return suffix if suffix in (*_OPENERS, ".zip") else ""


def data_suffix(path: Path) -> str:
    """The suffix that says a file's format, under any compression: `.jsonl` for a.jsonl.gz;
    for a zip, its one file's (run.zip of profile_export.jsonl was read as a CSV, and refused
    as a column '"unit": "tokens"}' named twice; a tester's finding)."""
    path = Path(path)
    member = _zip_member(path) if compression_suffix(path) == ".zip" else None
    if member is not None and Path(member).suffix:
        return Path(member).suffix.lower()
    return (path.with_suffix("") if compression_suffix(path) else path).suffix.lower()


def _zip_member(path: Path) -> str | None:
    """The name of a zip's one file (folders' entries aside), as `open_text` reads it; None
    where it holds another number or cannot be read (the reader says why)."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = [name for name in archive.namelist() if not name.endswith("/")]
    except (OSError, zipfile.BadZipFile):
        return None
    return members[0] if len(members) == 1 else None


def data_stem(path: Path) -> str:
    """A data file's name without its format's suffix or its compression's: `run` for
    run.csv and run.csv.gz alike."""
    path = Path(path)
    return (path.with_suffix("") if compression_suffix(path) else path).stem


# What a damaged or misnamed archive raises as it is read; bz2's is a plain OSError, told
# from a missing or unreadable file by its type.
CORRUPT_ARCHIVE = (gzip.BadGzipFile, zipfile.BadZipFile, lzma.LZMAError, EOFError)
_NOT_THE_CONTENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


@contextlib.contextmanager
def decompressing(path: Path) -> Iterator[None]:
    """Reading `path`: a damaged or misnamed archive is a one-line error naming it."""
    try:
        yield
    except CORRUPT_ARCHIVE as e:
        raise not_decompressible(path, e) from None
    except OSError as e:
        if compression_suffix(path) and not isinstance(e, _NOT_THE_CONTENT):
            raise not_decompressible(path, e) from None
        raise


def not_decompressible(path: Path, error: BaseException) -> ScenarioError:
    return ScenarioError(f"{path}: not a readable {compression_suffix(path) or 'compressed'} "
                         f"file ({error}); expected one compressed as its name says")


def open_text(path: Path) -> IO[str]:
    """A user's text file, decompressed as pandas would (by suffix), as UTF-8 with or without
    a byte-order mark (spreadsheets write one)."""
    path = Path(path)
    suffix = compression_suffix(path)
    if suffix == ".zip":
        archive = zipfile.ZipFile(path)
        members = [name for name in archive.namelist() if not name.endswith("/")]
        if len(members) != 1:
            archive.close()
            raise ScenarioError(f"{path.name}: a zip archive of {len(members)} files; expected "
                                "exactly one")
        member = archive.open(members[0])
        archive.close()  # the member keeps the file open until it is closed itself
        return io.TextIOWrapper(member, encoding="utf-8-sig")
    if suffix:
        return _OPENERS[suffix](path, "rt", encoding="utf-8-sig")
    return path.open(encoding="utf-8-sig")


def read_csv(path: Path, **kwargs: Any) -> pd.DataFrame:
    """A user's CSV, every row checked against the header; `usecols` is applied after
    reading, since pandas given it stops counting a row's fields (a row `0.5,1,500,30`,
    an unquoted 1,500, read as prompt 1 and output 500). The caller checks that the
    columns are present."""
    columns = kwargs.pop("usecols", None)
    try:
        with decompressing(path):
            if compression_suffix(Path(path)) == ".zip":  # its one file, as open_text finds it
                with open_text(Path(path)) as f:  # (pandas counted a folder's entry, `zip -r`)
                    frame = pd.read_csv(f, **kwargs)
            else:
                frame = pd.read_csv(path, **kwargs)
        if kwargs.get("nrows") is None:
            _check_last_row(Path(path), kwargs.get("comment"))
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not UTF-8 text (compressed or binary?); expected a CSV "
                            "file") from None
    except pd.errors.EmptyDataError:
        raise ScenarioError(f"{path}: empty; expected a CSV file with a header row") from None
    except pd.errors.ParserError as e:
        raise ScenarioError(f"{path}: malformed CSV ({str(e).strip().splitlines()[-1]})") from None
    except ScenarioError:
        raise
    except ValueError as e:
        raise ScenarioError(f"{path}: {e}") from None
    _refuse_twice_named(Path(path), frame.columns, kwargs.get("comment"))
    if not isinstance(frame.index, pd.RangeIndex):  # pandas took the extra field for an index
        raise ScenarioError(f"{path} line {csv_data_line(Path(path), 0)}: more fields than the "
                            f"header's {len(frame.columns)}; expected one value per column "
                            "(an unquoted comma inside a value?)")
    return frame if columns is None else frame[list(columns)]


def read_results_csv(path: Path) -> pd.DataFrame:
    """A table orcasim wrote (sweep.csv, capacity.csv, evaluations.csv), its `system` column
    read as the names it holds: systems named '1' and '1.0' both read as 1.0, and compare
    and plot merged them into one ('08' read as 8)."""
    return read_csv(path, dtype={"system": str})


def shown_columns(columns: list[str], most: int = 8, joined: bool = False) -> str:
    """Columns for a message, as a list (or `joined` by commas): the first `most` of them (a
    JSON file read as CSV has thousands)."""
    text = ", ".join(columns[:most]) if joined else str(columns[:most])
    return text if len(columns) <= most else f"{text} and {len(columns) - most} more"


LAST_ROW_BYTES = 1 << 16  # a CSV's last row is looked for in its last 64 KiB


def _refuse_twice_named(path: Path, columns: pd.Index, comment: str | None) -> None:
    """pandas reads a second column `x` as `x.1`, so the first was read without a word (a
    tester's finding): refused, naming both. Only where a name could be such a renaming is
    the header read as written (a column named `a.1` beside `a` may be the file's own)."""
    names = [str(c) for c in columns]
    if not any(re.fullmatch(r"(.+)\.\d+", n) and n.rsplit(".", 1)[0] in names for n in names):
        return
    with open_text(path) as f:
        lines = (line.lstrip("\ufeff") for line in f)
        first = next((line for line in lines if line.strip()
                      and not (comment and line.startswith(comment))), "")
    header = next(csv.reader([first]), [])
    seen: dict[str, int] = {}
    for i, name in enumerate(header, start=1):
        if name in seen:
            raise ScenarioError(f"{path}: column '{name}' is named twice (columns {seen[name]} "
                                f"and {i}); expected each column once")
        seen[name] = i


def _check_last_row(path: Path, comment: str | None) -> None:
    """A file cut off mid-row (a copy that stopped, a download that failed) ends in a row
    with fewer fields than its header and than the row before it, which pandas fills with
    NaN: refused. (A file whose rows all leave trailing empty fields out is whole.) The last
    row only (where a cut falls; a short row inside is left to the columns' own checks), of
    a plain file (a compressed one cannot be read from its end), read whole (`read_csv`
    skips this for `nrows`)."""
    if compression_suffix(path):
        return

    def is_row(line: str) -> bool:
        return bool(line.strip()) and not (comment and line.startswith(comment))

    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        start = max(0, f.tell() - LAST_ROW_BYTES)
        f.seek(start)
        raw = f.read()
    # From the start, as open_text reads it (a byte-order mark is not the header's).
    tail = raw.decode("utf-8-sig" if start == 0 else "utf-8", errors="replace").splitlines()
    if start > 0:
        tail = tail[1:]  # it began mid-line
    with open_text(path) as text:
        header = next((line for line in text if is_row(line)), None)
    rows = [line for line in tail if is_row(line)]
    if header is None or not rows or rows[-1] == header.rstrip("\r\n") or '"' in rows[-1]:
        return  # (a quoted field may span lines: its last line is not a row)
    fields = len(next(csv.reader([rows[-1]])))
    expected = len(next(csv.reader([header])))
    # The row before it: a row shorter than both was cut; after the header alone, the header.
    before = len(next(csv.reader([rows[-2]]))) if len(rows) > 1 else expected
    if fields < expected and fields < before:
        after = len(tail) - max(i for i, line in enumerate(tail) if is_row(line)) - 1
        raise ScenarioError(f"{path} line {_last_row_line(path, raw, after)}: {fields} of the "
                            f"header's {expected} fields ({rows[-1][:60]!r}); expected a complete "
                            "row (was the file cut off?)")


def _last_row_line(path: Path, raw: bytes, after: int) -> int:
    """The line number (from 1) of the line `after` lines (blank or comments) before the end
    of `path`, whose last bytes are `raw`. Only for an error: it reads the whole file."""
    with path.open("rb") as f:
        newlines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return newlines + (0 if raw.endswith(b"\n") else 1) - after


def csv_data_line(path: Path, row: int) -> int:
    """The file line (from 1) of data row `row` of a CSV with one header line, as an error
    names it: pandas skips blank lines, so they are counted back in."""
    with open_text(path) as f:
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
