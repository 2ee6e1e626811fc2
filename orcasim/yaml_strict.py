"""YAML for files a user writes: a key given twice in one mapping is an error, not the last wins.

PyYAML's safe loader keeps the last of duplicate keys silently, so a scenario that sets
`rate_per_s` twice runs with whichever came last. `load` refuses it, naming the key and the
line of its second appearance (`DuplicateKeyError`, a `yaml.YAMLError` whose problem and
mark the callers already report).

It also reads `5e-1`, `1e0` and `1.0e1` as numbers, as YAML 1.2 does: PyYAML follows YAML
1.1, where a float needs a dot and a signed exponent, and kept them as strings. A scenario's
fields converted them anyway, but a sweep's grid kept them as text, ordered alphabetically.
"""

from __future__ import annotations

import re
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
            if key in seen:
                raise DuplicateKeyError(None, None, f"key {key!r} given twice in one mapping",
                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's float in exponent form (with or without a dot or an exponent sign), beside 1.1's.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


class TooDeepError(yaml.YAMLError):
    """Nesting deeper than Python's recursion limit (PyYAML's reader recurses per level)."""

    problem = "nested too deeply"


def load(text: str) -> Any:
    """`yaml.safe_load`, refusing duplicate keys, and nesting too deep to read as a YAMLError."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise TooDeepError("nested too deeply") from None
