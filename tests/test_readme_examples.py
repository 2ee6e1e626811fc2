"""Every YAML example in the README is accepted as it stands, by `orcasim validate`.

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
from typer.testing import CliRunner

from orcasim.cli import app
from orcasim.scenario import Scenario, SystemConfig

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
        blocks.append((line, paragraph, yaml.safe_load(match.group(1))))
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
    base = first_scenario() if link is None else yaml.safe_load((ROOT / link.group(1)).read_text())
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
        sweep.write_text(yaml.safe_dump(data))
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
