"""YAML for files a user writes: a key given twice in one mapping is an error, not the last wins.

PyYAML's safe loader keeps the last of duplicate keys silently, so a scenario that sets
`rate_per_s` twice runs with whichever came last. `load` refuses it, naming the key and the
line of its second appearance (`DuplicateKeyError`, a `yaml.YAMLError` whose problem and
mark the callers already report).

It also reads `5e-1`, `1e0` and `1.0e1` as numbers, as YAML 1.2 does: PyYAML follows YAML
1.1, where a float needs a dot and a signed exponent, and kept them as strings. A scenario's
fields converted them anyway, but a sweep's grid kept them as text, ordered alphabetically.

An alias (`*name`) reads as a copy of its anchor's value, not the same object: a scenario
that shares one scheduler among its systems (`scheduler: *paged`) and is then changed at one
of them (`--set systems[0].scheduler.max_num_seqs=2`) changes that system alone.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml


class DuplicateKeyError(yaml.constructor.ConstructorError):
    pass


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:  # the keys written here (a `<<` merge may be overridden)
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):  # PyYAML's own check, which `seen` would pre-empt
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found a {type(key).__name__} as a key (a key is a name or a number)",
                    key_node.start_mark)
            if key in seen:
                raise DuplicateKeyError(None, None, f"key {key!r} given twice in one mapping",
                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# Numbers as YAML 1.2 reads them. PyYAML follows YAML 1.1, where a leading zero is octal
# (`kv_capacity_tokens: 0100000` read 32768), `1:30` base 60 (90), and a float needs a dot and
# a signed exponent (`5e-1` stayed text). Here an integer is decimal (`0100000` is 100000),
# `0x` hexadecimal or `0o` octal; a float is decimal, with or without a dot or an exponent
# sign, or .inf/.nan; anything else (`1:30`, `0b101`) stays text, which a number's field refuses.
_INT = re.compile(r"^(?:[-+]?[0-9][0-9_]*|0x[0-9a-fA-F][0-9a-fA-F_]*|0o[0-7][0-7_]*)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
# YAML 1.1's timestamps are no type of YAML 1.2 either: `name: 2024-06-01` read as a date,
# and was refused as "datetime.date(2024, 6, 1): Input should be a valid string" (a tester's
# finding). Text, as YAML 1.2 reads it.
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in _NUMBER_TAGS and tag != _TIMESTAMP_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """An integer as `_INT` reads it: decimal unless it says `0x` or `0o`."""
    text = str(loader.construct_scalar(node)).replace("_", "")
    if text.startswith(("0x", "0o")):
        return int(text, 16 if text[1] == "x" else 8)
    return int(text, 10)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


class TooDeepError(yaml.YAMLError):
    """Nesting deeper than Python's recursion limit (PyYAML's reader recurses per level)."""

    problem = "nested too deeply"


class RecursiveAliasError(yaml.YAMLError):
    """An anchor whose value holds an alias of itself: no finite scenario reads that way."""

    problem = "an anchor's value contains an alias of that anchor (a value inside itself)"


class AliasBombError(yaml.YAMLError):
    """Aliases of aliases that copy into more values than any scenario holds: nine levels
    of nine (a 1 kB file) would be 387 million, read for minutes before any key is checked."""

    problem = "its aliases expand to more than a million values (aliases of aliases)"


MAX_VALUES = 1_000_000  # values a file may expand to, its aliases copied


def load(text: str) -> Any:
    """`yaml.safe_load`, refusing duplicate keys, and nesting too deep to read as a YAMLError;
    every alias a copy of its anchor's value."""
    try:
        return _unshared(yaml.load(text, Loader=_StrictLoader), (), [0])  # noqa: S506 - SafeLoader
    except RecursionError:
        raise TooDeepError("nested too deeply") from None


def _unshared(value: Any, inside: tuple[int, ...], count: list[int]) -> Any:
    """`value` with each mapping and list copied, so that no two places share one; `inside`
    holds the ids of the containers on the way down (one of them again is a cycle), `count`
    the values copied so far."""
    count[0] += 1
    if count[0] > MAX_VALUES:
        raise AliasBombError(AliasBombError.problem)
    if not isinstance(value, dict | list):
        return value
    if id(value) in inside:
        raise RecursiveAliasError(RecursiveAliasError.problem)
    inside = (*inside, id(value))
    if isinstance(value, list):
        return [_unshared(item, inside, count) for item in value]
    return {key: _unshared(item, inside, count) for key, item in value.items()}


def top_level_problem(data: Any) -> str:
    """What a file's YAML that is no mapping holds, as a refusal opens with it: an empty file
    (or /dev/null, or comments alone) read as None, and said only 'expected a mapping'."""
    return "empty (no YAML value in it); " if data is None else ""


def top_level(path: Path) -> object:
    """The file's YAML, or None where it cannot be read or parsed (left to its loader)."""
    try:
        return load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def is_sweep_file(path: Path) -> bool:
    """A sweep file names a base scenario (a key no scenario has: one missing its grid is a
    sweep file that says so); anything unreadable is left to the loader."""
    data = top_level(path)
    return isinstance(data, dict) and "base" in data


def is_scenario_file(path: Path) -> bool:
    """A scenario names its systems (a key no sweep file has)."""
    data = top_level(path)
    return isinstance(data, dict) and "systems" in data and "base" not in data
