"""YAML for files a user writes: a key given twice in one mapping is an error, not the last wins.

PyYAML's safe loader keeps the last of duplicate keys silently, so a scenario that sets
`rate_per_s` twice runs with whichever came last. `load` refuses it, naming the key and the
line of its second appearance (`DuplicateKeyError`, a `yaml.YAMLError` whose problem and
mark the callers already report).
"""

from __future__ import annotations

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


def load(text: str) -> Any:
    """`yaml.safe_load`, refusing duplicate keys."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
