"""Bad input is a one-line error naming the key or file, exit 2, never a silent wrong answer.

One row per case: the scenario's changes (dotted paths over tests/conftest.py's BASE) and a
file the case writes, the phrase the message must contain. Each runs `orcasim run` and
expects exit 2, one line, no traceback, and no results folder.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from orcasim.cli import app
from orcasim.scenario import set_dotted
from tests.conftest import BASE

TRACE = "arrival_s,prompt_tokens,output_tokens\n"
CASES: list[tuple[str, dict[str, Any], str | None, str]] = [
    # (case, changes, a trace file's body (workload.arrival.path), phrase)
    ("infinite rate", {"workload.arrival.rate_per_s": float("inf")}, None, "finite number"),
    ("NaN cost", {"cost.base_s": float("nan")}, None, "finite number"),
    ("infinite overhead", {"cost.overhead": {"per_iteration_s": float("inf")}}, None,
     "finite number"),
    ("huge max_tokens", {"workload.max_tokens": 10**30}, None, "max_tokens"),
    ("huge constant length", {"workload.prompt_tokens": {"kind": "constant", "value": 10**12}},
     None, "prompt_tokens.value"),
    ("huge length in a trace", {"workload.max_tokens": 100}, TRACE + "0,1e30,3\n",
     "expected an integer from 1 to 1,000,000,000"),
    ("warm-up past the last arrival", {"warmup_s": 1e6}, None, "no request completed after"),
    ("a cost that takes no time", {"cost": {"kind": "linear", "base_s": 0.0}}, None,
     "would take no time"),
    ("a system named like a result file",
     {"systems": [{"name": "summary.json", "scheduler": {"kind": "paged"}}]}, None,
     "is a file of the results folder"),
    ("every request too large", {"kv_capacity_tokens": 32,
                                 "workload.prompt_tokens": {"kind": "constant", "value": 60},
                                 "systems": [{"name": "v", "scheduler": {"kind": "paged"}}]},
     None, "no request completed"),
]


def _write(tmp_path: Path, changes: dict[str, Any], trace: str | None) -> Path:
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        set_dotted(data, path, value)
    if trace is not None:
        (tmp_path / "trace.csv").write_text(trace)
        data["workload"] = {"arrival": {"kind": "trace", "path": "trace.csv"},
                            "max_tokens": data["workload"]["max_tokens"]}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_scenario_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    for command in (["validate", str(path)], ["run", str(path), "--out", str(tmp_path / "o")]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2 and "not UTF-8 text" in result.output, result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize(("case", "changes", "trace", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, case: str, changes: dict[str, Any],
                                          trace: str | None, phrase: str) -> None:
    scenario = _write(tmp_path, changes, trace)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(scenario), "--out", str(out), "--no-plots"])
    assert result.exit_code == 2, (case, result.output)
    message = result.output.strip()
    assert "Traceback" not in message and phrase in message, (case, message)
    assert len([line for line in message.splitlines() if line.startswith("error")]) == 1
    assert not out.exists()
