"""Every YAML example in the README is accepted as it stands, by `orcasim validate`, and
every default the README states for a block's key is the code's.

A block is one of three things, told by its top-level keys:
- a whole scenario (`name`, `workload`, `cost`, `systems`): validated as written;
- a sweep file (`base`, `grid`): validated beside a copy of the scenario its `base` names;
- a fragment: merged onto the scenario its paragraph links (`[...](scenarios/x.yaml)`), else
  onto the README's first whole scenario, then validated. A fragment of a system's keys
  (`cluster:` indented under a system) becomes that scenario's one system.
A block that is none of these fails here, so a new example is checked too.
"""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from orcasim import yaml_strict
from orcasim.cli import app
from orcasim.config import Strict
from orcasim.cost.catalog import HardwareConfig
from orcasim.cost.overhead import OverheadConfig
from orcasim.scenario import Scenario, SystemConfig
from orcasim.schedulers.paged import PagedMemoryConfig

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SCENARIO_KEYS = {"name", "workload", "cost", "systems"}
SWEEP_KEYS = {"base", "grid"}
_BLOCK = re.compile(r"^```yaml\n(.*?)^```$", re.S | re.M)
_SCENARIO_LINK = re.compile(r"\]\((scenarios/[^)\s]+\.yaml)\)")


def yaml_blocks() -> list[tuple[int, str, dict[str, Any]]]:
    """(line, the paragraph before it, its data) of every ```yaml block of the README."""
    text = README.read_text()
    blocks = []
    for match in _BLOCK.finditer(text):
        before = text[: match.start()].rstrip("\n")
        paragraph = before[before.rfind("\n\n") + 2:]
        line = text.count("\n", 0, match.start()) + 1
        blocks.append((line, paragraph, yaml_strict.load(match.group(1))))
    return blocks


def merged(base: Any, change: Any) -> Any:
    """`change` laid over `base`: mappings key by key, unless `change` names another `kind`
    (a kind changed starts from its own defaults, as `--set ...kind=` does); lists replace."""
    if not isinstance(base, dict) or not isinstance(change, dict):
        return copy.deepcopy(change)
    if "kind" in change and change["kind"] != base.get("kind"):
        return copy.deepcopy(change)
    out = copy.deepcopy(base)
    for key, value in change.items():
        out[key] = merged(out[key], value) if key in out else copy.deepcopy(value)
    return out


def first_scenario() -> dict[str, Any]:
    return next(data for _, _, data in yaml_blocks() if SCENARIO_KEYS <= set(data))


def completed(paragraph: str, fragment: dict[str, Any]) -> dict[str, Any]:
    """A fragment merged onto the scenario its paragraph links, else the README's first."""
    link = _SCENARIO_LINK.search(paragraph)
    base = first_scenario() if link is None else yaml_strict.load((ROOT / link.group(1)).read_text())
    if set(fragment) <= set(SystemConfig.model_fields) - set(Scenario.model_fields):
        system = {"name": "readme", "scheduler": base["systems"][-1]["scheduler"], **fragment}
        fragment = {"systems": [system]}
    assert set(fragment) <= set(Scenario.model_fields), (
        f"keys {sorted(set(fragment) - set(Scenario.model_fields))} are neither a scenario's "
        "nor a system's: say in this test how to check this block")
    return merged(base, fragment)


def validate(path: Path) -> str:
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    return result.output


BLOCKS = yaml_blocks()


def test_the_readme_has_its_examples() -> None:
    # A changed fence (```yml) would leave every example unchecked without a word.
    assert len(BLOCKS) >= 7
    kinds = [SCENARIO_KEYS <= set(d) or SWEEP_KEYS <= set(d) for _, _, d in BLOCKS]
    assert kinds.count(True) >= 2  # the quickstart scenario and the sweep file


@pytest.mark.parametrize(("line", "paragraph", "data"), BLOCKS,
                         ids=[f"line{line}" for line, _, _ in BLOCKS])
def test_a_readme_example_validates(line: int, paragraph: str, data: dict[str, Any],
                                    tmp_path: Path) -> None:
    if SWEEP_KEYS <= set(data):
        # Its base is relative to the sweep file: a copy of that scenario where it points.
        sweep = tmp_path / "sweeps" / "readme_sweep.yaml"
        sweep.parent.mkdir()
        shutil.copy(ROOT / "scenarios" / "sweeps" / data["base"], sweep.parent / data["base"])
        sweep.write_text(yaml.safe_dump(data, sort_keys=False))
        assert "ok (sweep:" in validate(sweep)
        return
    # (A data path relative to a linked scenario would not resolve from tmp_path; those
    # linked now name none, and orcasim/data's paths resolve anywhere.)
    scenario = data if SCENARIO_KEYS <= set(data) else completed(paragraph, data)
    path = tmp_path / "readme_example.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    assert ": ok (" in validate(path)


def test_a_fragment_is_checked_in_place() -> None:
    """The merge keeps what the fragment gives: the agents block's arrival replaces the
    linked scenario's, and a cluster block becomes the one system's cluster."""
    by_first_key = {next(iter(d)): (p, d) for _, p, d in BLOCKS if not SCENARIO_KEYS <= set(d)}
    paragraph, cluster = by_first_key["cluster"]
    scenario = completed(paragraph, cluster)
    assert scenario["systems"][0]["cluster"] == cluster["cluster"]
    assert len(scenario["systems"]) == 1


# `kind {key: default, key, ...}` as the README writes a block of one kind (`paged {...}`);
# `{gpu: ..., tensor_parallel: 1, ...}` for the hardware block, which has no kind.
_KIND_BLOCK = re.compile(r"\b([a-z_]+) \{([^{}`]*)\}")
_HARDWARE_BLOCK = re.compile(r"`\{(gpu: [^`]*)\}`")
_PAIR = re.compile(r"\b([a-z_0-9]+): ([^,]+)")


def blocks_by_kind() -> dict[str, list[type[BaseModel]]]:
    """Every configuration block with a `kind`, by that kind (`constant` names three)."""
    found: dict[str, list[type[BaseModel]]] = {}
    todo: list[type[Strict]] = [Strict]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        kind = cls.model_fields.get("kind")
        if kind is not None:
            for name in getattr(kind.annotation, "__args__", ()):
                found.setdefault(name, []).append(cls)
    return found


def stated_defaults() -> list[tuple[str, type[BaseModel], str, str]]:
    """(where, block, key, the default's text) of every `key: value` in a kind's block."""
    text, kinds = README.read_text(), blocks_by_kind()
    out = []
    for match in _KIND_BLOCK.finditer(text):
        for key, value in _PAIR.findall(match.group(2)):
            owners = [c for c in kinds.get(match.group(1), []) if key in c.model_fields]
            out += [(match.group(0)[:40], owners[0], key, value)] if len(owners) == 1 else []
    for match in _HARDWARE_BLOCK.finditer(text):
        out += [("hardware", HardwareConfig, key, value) for key, value in _PAIR.findall(match.group(1))
                if key in HardwareConfig.model_fields and key != "gpu"]
    return out


def value_of(text: str) -> Any:
    """A stated default as YAML reads it: the first of `a\\|b` choices, the first word."""
    return yaml_strict.load(text.split("\\|")[0].split()[0])


def default_of(cls: type[BaseModel], key: str) -> Any:
    """A key's default as a run resolves it: a paged block's watermark, None in the field,
    is its engine's (`watermark_fraction`)."""
    block = cls.model_construct()
    if key == "watermark" and isinstance(block, PagedMemoryConfig):
        return block.watermark_fraction()
    return getattr(block, key)


def test_every_default_the_readme_states_is_the_codes() -> None:
    stated = stated_defaults()
    # The trace, linear, roofline, four schedulers', prefix_affinity and hardware blocks.
    assert len({cls for _, cls, _, _ in stated}) >= 9, stated
    wrong = [f"{where}...: {key}: {value} (the code's {default_of(cls, key)!r})"
             for where, cls, key, value in stated if value_of(value) != default_of(cls, key)]
    assert wrong == []


def test_the_overhead_defaults_the_readme_tabulates_are_the_codes() -> None:
    section = README.read_text().split("Where the defaults of `overhead: {}` come from:", 1)[1]
    rows = re.findall(r"^\| (`[^|]*`) \| ([0-9.]+)( ms)? \|", section, re.M)
    assert len(rows) == 5
    for keys, value, ms in rows:
        for key in re.findall(r"`([a-z_]+)`", keys):
            stated_s = float(value) / (1e3 if ms else 1)
            assert OverheadConfig.model_fields[key].default == pytest.approx(stated_s, rel=1e-12), key
    named = {k for keys, _, _ in rows for k in re.findall(r"`([a-z_]+)`", keys)}
    assert named == set(OverheadConfig.model_fields)


def test_the_readme_python_blocks_run_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's Python blocks run in a fresh namespace from the repository root, with
    warnings as errors, as pasted into a notebook would: none was run by any test. The
    quickstart one leaves `result` with both systems and the frame it names."""
    import warnings

    blocks = re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.S | re.M)
    assert blocks
    monkeypatch.chdir(ROOT)
    for block in blocks:
        namespace: dict[str, Any] = {"__name__": "readme"}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
    assert list(namespace["result"].systems) == ["request-level", "orca"]
    assert len(namespace["result"].systems["orca"].requests) == 2000
