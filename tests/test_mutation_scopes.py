"""`make mutate`'s scopes (quality/scopes.toml) and its runner (quality/mutate.py).

The scopes rot silently when a module or a test file is renamed, and a module that no scope
lists is never mutated: these checks keep the mutation score's coverage honest.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _runner():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("quality_mutate", ROOT / "quality" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["quality_mutate"] = module
    spec.loader.exec_module(module)
    return module


mutate = _runner()
SCOPES = mutate.load_scopes()

# What issue 17 lists (schedulers, memory, engine, fused loops, recorder, metrics, cost
# models): each must be in exactly one scope.
LISTED = [*(str(p.relative_to(ROOT)) for p in sorted((ROOT / "orcasim" / "schedulers").glob("*.py"))
            if p.name != "__init__.py"),
          *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "orcasim" / "cost").glob("*.py"))
            if p.name != "__init__.py"),
          "orcasim/memory.py", "orcasim/engine.py", "orcasim/replica.py",
          "orcasim/generic_stepper.py", "orcasim/pipeline.py", "orcasim/orca_fast.py",
          "orcasim/paged_fast.py", "orcasim/recorder.py", "orcasim/metrics.py"]


def test_every_scope_names_modules_and_tests_that_exist() -> None:
    for name, scope in SCOPES.items():
        assert scope["about"], name
        for module in scope["modules"]:
            assert (ROOT / module).is_file(), f"{name}: {module}"
        for test in scope["tests"]:
            assert (ROOT / "tests" / f"{test}.py").is_file(), f"{name}: {test}"


def test_every_listed_module_is_in_exactly_one_scope() -> None:
    owners: dict[str, list[str]] = {}
    for name, scope in SCOPES.items():
        for module in scope["modules"]:
            owners.setdefault(module, []).append(name)
    for module in LISTED:
        assert len(owners.get(module, [])) == 1, f"{module}: in scopes {owners.get(module, [])}"


def test_a_scopes_section_mutates_its_modules_only() -> None:
    """The section leaves every other package module alone, selects the scope's tests and
    sets the per-test timeout; it replaces the old section and keeps what follows it."""
    modules = ["orcasim/a.py", "orcasim/b.py", "orcasim/c.py"]
    scope = {"modules": ["orcasim/b.py"], "tests": ["test_b"], "also_copy": ["calibrate"]}
    section = mutate.mutmut_section(scope, modules, 60)
    text = ('[tool.ruff]\nline-length = 100\n\n[tool.mutmut]\nsource_paths = ["x"]\n'
            'do_not_mutate = [\n  "y",\n]\n\n[tool.mypy]\nfiles = ["orcasim"]\n')
    config = tomllib.loads(mutate.with_section(text, section))
    mutmut = config["tool"]["mutmut"]
    assert mutmut["do_not_mutate"] == ["orcasim/a.py", "orcasim/c.py"]
    assert mutmut["pytest_add_cli_args_test_selection"] == ["tests/test_b.py"]
    assert mutmut["pytest_add_cli_args"] == ["--timeout=60"]
    assert mutmut["also_copy"] == ["scenarios", "results", "tests", "README.md", "calibrate"]
    assert config["tool"]["ruff"] == {"line-length": 100}
    assert config["tool"]["mypy"] == {"files": ["orcasim"]}
    appended = tomllib.loads(mutate.with_section('[tool.ruff]\nline-length = 100\n', section))
    assert appended["tool"]["mutmut"]["source_paths"] == ["orcasim"]


def test_a_scope_outside_orcasim_mutates_its_package_too() -> None:
    """calibrate/logs.py's scope copies and mutates `calibrate` beside orcasim (its section
    said `source_paths = ["orcasim"]`, so no module outside orcasim could be mutated), and
    does not copy it again as data over its mutants."""
    scope = {"modules": ["calibrate/logs.py"], "tests": ["test_x"], "also_copy": ["calibrate"]}
    assert mutate.source_roots(scope) == ["calibrate", "orcasim"]
    section = mutate.mutmut_section(scope, ["calibrate/fit.py", "calibrate/logs.py",
                                            "orcasim/a.py"], 60)
    mutmut = tomllib.loads(section)["tool"]["mutmut"]
    assert mutmut["source_paths"] == ["calibrate", "orcasim"]
    assert mutmut["do_not_mutate"] == ["calibrate/fit.py", "orcasim/a.py"]
    assert mutmut["also_copy"] == ["scenarios", "results", "tests", "README.md"]


def test_fates_are_read_from_mutmuts_results() -> None:
    text = ("    orcasim.x.x_f__mutmut_1: killed\n    orcasim.x.x_f__mutmut_2: survived\n"
            "    orcasim.x.x_g__mutmut_1: killed\n    orcasim.x.x_g__mutmut_2: no tests\n"
            "some other line\n")
    assert mutate.parse_fates(text) == {"orcasim.x.x_f__mutmut_1": "killed",
                                        "orcasim.x.x_f__mutmut_2": "survived",
                                        "orcasim.x.x_g__mutmut_1": "killed",
                                        "orcasim.x.x_g__mutmut_2": "no tests"}


def test_an_unknown_scope_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert mutate.main(["nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "scope 'nosuch' is not in quality/scopes.toml" in err
    assert "core" in err


def test_a_rerun_of_named_mutants_keeps_the_others_fates() -> None:
    """mutmut reports every mutant a named run skipped as "not checked": the results file
    keeps their earlier fates, and takes the rerun's for the others."""
    previous = {"m.x_f__mutmut_1": "killed", "m.x_f__mutmut_2": "survived",
                "m.x_f__mutmut_3": "survived"}
    latest = {"m.x_f__mutmut_1": "not checked", "m.x_f__mutmut_2": "killed",
              "m.x_f__mutmut_3": "survived", "m.x_f__mutmut_4": "not checked"}
    assert mutate.merged(previous, latest) == {
        "m.x_f__mutmut_1": "killed", "m.x_f__mutmut_2": "killed",
        "m.x_f__mutmut_3": "survived", "m.x_f__mutmut_4": "not checked"}
    text = mutate.format_fates(mutate.merged(previous, latest))
    assert mutate.parse_fates(text) == mutate.merged(previous, latest)


def test_a_changed_functions_earlier_fates_are_not_carried() -> None:
    """mutmut numbers a changed function's mutants anew, so a named rerun carried old fates
    onto other mutations (a tester's finding): a fate is carried only where its function's
    recorded hash is today's; the record then follows what each fate was checked against."""
    previous = {"m.x_f__mutmut_1": "killed", "m.x_g__mutmut_1": "killed",
                "m.xǁCǁh__mutmut_1": "survived"}
    latest = {"m.x_f__mutmut_1": "not checked", "m.x_g__mutmut_1": "not checked",
              "m.xǁCǁh__mutmut_1": "killed", "m.x_new__mutmut_1": "not checked"}
    recorded = {"m.x_f": "aaa", "m.x_g": "bbb", "m.xǁCǁh": "ccc"}
    current = {"m.x_f": "aaa", "m.x_g": "changed", "m.xǁCǁh": "ddd", "m.x_new": "eee"}
    final = mutate.merged(previous, latest, recorded, current)
    assert final == {"m.x_f__mutmut_1": "killed", "m.x_g__mutmut_1": "not checked",
                     "m.xǁCǁh__mutmut_1": "killed", "m.x_new__mutmut_1": "not checked"}
    assert mutate.hashes_of_fates(final, recorded, current, {"m.xǁCǁh__mutmut_1"}) == {
        "m.x_f": "aaa", "m.xǁCǁh": "ddd"}


def test_functions_are_hashed_by_code_under_mutmuts_keys(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    module = tmp_path / "pkg" / "mod.py"
    module.write_text("def f(x):\n    return x + 1\n\n\nclass C:\n    def m(self):\n        return 2\n")
    before = mutate.function_hashes(["pkg/mod.py"], tmp_path)
    assert set(before) == {"pkg.mod.x_f", "pkg.mod.xǁCǁm"}
    module.write_text("def f(x):\n    # a comment\n    return x + 1\n\n\nclass C:\n    def m(self):\n        return 3\n")
    after = mutate.function_hashes(["pkg/mod.py"], tmp_path)
    assert after["pkg.mod.x_f"] == before["pkg.mod.x_f"]  # a comment is no change
    assert after["pkg.mod.xǁCǁm"] != before["pkg.mod.xǁCǁm"]


def test_the_summary_counts_caught_mutants_and_points_at_the_survivors() -> None:
    from collections import Counter

    text = mutate.summary("core", Counter({"killed": 6, "timeout": 1, "survived": 2, "no tests": 1}))
    first, second = text.split("\n")
    assert first == "core: 10 mutants, 6 killed, 2 survived, 1 timeout, 1 no tests"
    assert second.startswith("caught 7 of 10 (70.0%); survivors' diffs in quality/survivors-core.txt")
    assert mutate.summary("core", Counter({"no tests": 3})) == "core: 3 mutants, 3 no tests"


def test_a_mutmut_run_that_fails_leaves_the_results_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """mutmut exits 1 where it cannot run (a failing clean test): its results then list every
    mutant "not checked", and the runner wrote them over the committed table, exit 0 (a
    tester's finding). It now stops, exit 1, the table as it was."""
    fake = tmp_path / "mutmut"
    fake.write_text("#!/bin/sh\n[ \"$1\" = run ] && exit 1\necho '    m.x_f__mutmut_1: not checked'\n")
    fake.chmod(0o755)
    (tmp_path / "quality").mkdir()
    table = tmp_path / "quality" / "mutmut-results-core.txt"
    table.write_text("    m.x_f__mutmut_1: killed\n")
    monkeypatch.setattr(mutate, "ROOT", tmp_path)
    monkeypatch.setattr(mutate, "prepare", lambda *_: tmp_path)
    monkeypatch.setattr(mutate.shutil, "which", lambda _: str(fake))
    assert mutate.run("core", 1, 60, []) == 1
    assert table.read_text() == "    m.x_f__mutmut_1: killed\n"
    assert "mutmut run exited 1" in capsys.readouterr().err


def test_a_named_run_writes_the_functions_its_fates_were_checked_against(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of named mutants: the unchanged function's earlier fate is kept, the changed
    one's is not, and the record names what each fate was checked against."""
    fake = tmp_path / "mutmut"
    fake.write_text("#!/bin/sh\n[ \"$1\" = run ] && exit 0\n[ \"$1\" = show ] && exit 0\n"
                    "echo '    pkg.mod.x_f__mutmut_1: not checked'\n"
                    "echo '    pkg.mod.x_g__mutmut_1: survived'\n")
    fake.chmod(0o755)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n")
    (tmp_path / "quality").mkdir()
    hashes = mutate.function_hashes(["pkg/mod.py"], tmp_path)
    (tmp_path / "quality" / "mutmut-results-core.txt").write_text(
        "    pkg.mod.x_f__mutmut_1: killed\n    pkg.mod.x_g__mutmut_1: killed\n")
    (tmp_path / "quality" / "mutmut-functions-core.json").write_text(
        json.dumps({"pkg.mod.x_f": hashes["pkg.mod.x_f"], "pkg.mod.x_g": "old"}))
    monkeypatch.setattr(mutate, "ROOT", tmp_path)
    monkeypatch.setattr(mutate, "prepare", lambda *_: tmp_path)
    monkeypatch.setattr(mutate.shutil, "which", lambda _: str(fake))
    monkeypatch.setattr(mutate, "load_scopes", lambda: {"core": {"modules": ["pkg/mod.py"], "tests": []}})
    assert mutate.run("core", 1, 60, ["pkg.mod.x_g*"]) == 0
    results = mutate.parse_fates((tmp_path / "quality" / "mutmut-results-core.txt").read_text())
    assert results == {"pkg.mod.x_f__mutmut_1": "killed", "pkg.mod.x_g__mutmut_1": "survived"}
    record = json.loads((tmp_path / "quality" / "mutmut-functions-core.json").read_text())
    assert record == hashes
