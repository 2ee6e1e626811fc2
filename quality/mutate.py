"""Mutation testing, one scope at a time (`make mutate SCOPE=name`; quality/README.md).

    python quality/mutate.py --list
    python quality/mutate.py SCOPE [--max-children N] [--timeout-s S] [--tests T ...] [MUTANT ...]

A scope (quality/scopes.toml) names the modules to mutate and the tests that name their
behaviour. The run happens in a scratch copy of the working tree (`mutants-work/SCOPE`,
git-ignored) whose `[tool.mutmut]` section is rewritten for the scope, so a scope never
mutates another's modules and the checkout's own configuration stays as it is. Every
mutant's fate goes to `quality/mutmut-results-SCOPE.txt`, the survivors' diffs to
`quality/survivors-SCOPE.txt`, and the counts to stdout. Naming mutants (mutmut's names, or
globs of them) reruns only those, in the same scratch copy, and merges their new fates into
the results file: to check a new test against the survivors of a run, without the hours of
the whole scope.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCOPES_PATH = ROOT / "quality" / "scopes.toml"
COPIED = ("scenarios", "results", "tests", "README.md")  # what every scope's tests read
# (test_prefix_cache checks a figure the README quotes: without it no scope holding that
# file could collect its stats)
SKIPPED = {".venv", ".git", "mutants", "mutants-work", ".hypothesis", ".pytest_cache",
           ".ruff_cache", ".mypy_cache", "__pycache__"}


def load_scopes(path: Path = SCOPES_PATH) -> dict[str, dict]:
    return tomllib.loads(path.read_text())["scopes"]


def source_roots(scope: dict) -> list[str]:
    """The packages mutmut copies and may mutate: orcasim, and the package of every scope
    module outside it (calibrate/logs.py: `calibrate`)."""
    return sorted({"orcasim", *(module.split("/")[0] for module in scope["modules"])})


def mutmut_section(scope: dict, package_modules: list[str], timeout_s: int) -> str:
    """The `[tool.mutmut]` section for `scope`: everything but its modules left alone.
    `package_modules` lists every module of the scope's `source_roots`."""
    keep = sorted(set(package_modules) - set(scope["modules"]))
    tests = [f"tests/{name}.py" for name in scope["tests"]]
    roots = source_roots(scope)
    # A root is copied as a source path; copied again as data it would hide the mutants.
    also_copy = [c for c in [*COPIED, *scope.get("also_copy", [])] if c not in roots]
    return "\n".join([
        "[tool.mutmut]",
        f"source_paths = {_toml_list(roots)}",
        f"also_copy = {_toml_list(also_copy)}",
        f"do_not_mutate = {_toml_list(keep)}",
        f"pytest_add_cli_args = {_toml_list([f'--timeout={timeout_s}'])}",
        f"pytest_add_cli_args_test_selection = {_toml_list(tests)}",
        "",
    ])


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def with_section(pyproject_text: str, section: str) -> str:
    """`pyproject_text` with its `[tool.mutmut]` table replaced by `section`."""
    pattern = re.compile(r"^\[tool\.mutmut\]\n(?:(?!^\[).*\n?)*", re.MULTILINE)
    if not pattern.search(pyproject_text):
        return pyproject_text.rstrip("\n") + "\n\n" + section
    return pattern.sub(lambda _: section + "\n", pyproject_text, count=1)


def prepare(scope_name: str, scope: dict, timeout_s: int) -> Path:
    """The scratch copy for `scope_name`, refreshed from the working tree (mutmut's own
    `mutants/` folder inside it is kept, so a rerun of named mutants is incremental)."""
    work = ROOT / "mutants-work" / scope_name
    work.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name in SKIPPED:
            continue
        target = work / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(*SKIPPED))
        else:
            shutil.copy2(entry, target)
    modules = sorted(str(p.relative_to(ROOT)) for root in source_roots(scope)
                     for p in (ROOT / root).rglob("*.py"))
    missing = [m for m in scope["modules"] if m not in modules]
    if missing:
        raise ValueError(f"scope {scope_name!r}: modules: no module {missing[0]!r} "
                         f"(expected a file under {', '.join(source_roots(scope))}/)")
    pyproject = work / "pyproject.toml"
    pyproject.write_text(with_section(pyproject.read_text(), mutmut_section(scope, modules, timeout_s)))
    return work


def parse_fates(results_text: str) -> dict[str, str]:
    """Mutant name -> fate, from `mutmut results --all true` output."""
    out = {}
    for line in results_text.splitlines():
        if ": " in line and "__mutmut_" in line:
            name, fate = line.strip().rsplit(": ", 1)
            out[name] = fate
    return out


def function_key(mutant: str) -> str:
    """The function a mutant belongs to: its name without `__mutmut_N`."""
    return mutant.rsplit("__mutmut_", 1)[0]


def function_hashes(modules: list[str], root: Path | None = None) -> dict[str, str]:
    """A hash of each function's code (its syntax tree: comments and layout do not count), by
    the key mutmut's names give it: `pkg.mod.x_f` for a function, `pkg.mod.xǁCǁm` for a
    method of class C."""
    root = ROOT if root is None else root
    hashes = {}
    for module in modules:
        prefix = module.removesuffix(".py").replace("/", ".")
        for key, function in _functions(ast.parse((root / module).read_text())):
            hashes[f"{prefix}.{key}"] = hashlib.sha256(ast.dump(function).encode()).hexdigest()[:16]
    return hashes


FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef)


def _functions(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """A module's functions and its classes' methods, each under mutmut's key."""
    out: list[tuple[str, ast.AST]] = []
    for node in tree.body:
        if isinstance(node, FUNCTION_NODES):
            out.append((f"x_{node.name}", node))
        elif isinstance(node, ast.ClassDef):
            out += [(f"xǁ{node.name}ǁ{m.name}", m) for m in node.body if isinstance(m, FUNCTION_NODES)]
    return out


def merged(previous: dict[str, str], latest: dict[str, str],
           recorded: dict[str, str] | None = None,
           current: dict[str, str] | None = None) -> dict[str, str]:
    """The latest fates, and the previous ones of mutants this run did not check (a run of
    named mutants reports every other one as "not checked"). Given the functions' hashes
    when the previous fates were recorded and now, a previous fate is kept only where its
    function is unchanged: mutmut numbers a changed function's mutants anew, so its old
    mutant 3 is another mutation than its new one (a tester's finding)."""
    def carried(name: str, fate: str) -> str:
        if fate != "not checked" or name not in previous:
            return fate
        if recorded is not None and current is not None:
            key = function_key(name)
            if key not in recorded or recorded[key] != current.get(key):
                return fate
        return previous[name]
    return {name: carried(name, fate) for name, fate in latest.items()}


def hashes_of_fates(fates: dict[str, str], recorded: dict[str, str],
                    current: dict[str, str], checked: set[str]) -> dict[str, str]:
    """What each function's fates were recorded against: now for those this run checked,
    as before for those whose fates were carried."""
    out = {}
    for name, fate in fates.items():
        key = function_key(name)
        if fate == "not checked" or key in out:
            continue
        source = current if name in checked else recorded
        if key in source:
            out[key] = source[key]
    return out


def format_fates(fates_by_name: dict[str, str]) -> str:
    return "".join(f"    {name}: {fate}\n" for name, fate in fates_by_name.items())


def run(scope_name: str, max_children: int, timeout_s: int, names: list[str],
        tests: list[str] | None = None) -> int:
    scopes = load_scopes()
    if scope_name not in scopes:
        print(f"error: scope {scope_name!r} is not in quality/scopes.toml "
              f"(expected one of: {', '.join(scopes)})", file=sys.stderr)
        return 2
    scope = dict(scopes[scope_name])
    if tests:  # a quicker first pass; survivors are then rerun with the scope's own tests
        scope["tests"] = tests
    try:
        work = prepare(scope_name, scope, timeout_s)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    mutmut = shutil.which("mutmut") or str(Path(sys.executable).parent / "mutmut")
    done = subprocess.run([mutmut, "run", "--max-children", str(max_children), *names], cwd=work)
    if done.returncode != 0:  # mutmut exits 1 only where it could not run (a failing clean
        # test, no tests collected): its results would list every mutant "not checked", and
        # writing them emptied the committed table, exit 0 (a tester's finding)
        print(f"error: mutmut run exited {done.returncode} in {work}; "
              f"quality/mutmut-results-{scope_name}.txt is left as it was", file=sys.stderr)
        return 1
    latest = parse_fates(subprocess.run([mutmut, "results", "--all", "true"], cwd=work,
                                        capture_output=True, text=True, check=True).stdout)
    results_path = ROOT / "quality" / f"mutmut-results-{scope_name}.txt"
    hashes_path = ROOT / "quality" / f"mutmut-functions-{scope_name}.json"
    previous = parse_fates(results_path.read_text()) if results_path.exists() else {}
    current = function_hashes(scope["modules"])
    recorded = json.loads(hashes_path.read_text()) if hashes_path.exists() else None
    if names and recorded is None and previous:
        print(f"note: no {hashes_path.name}: the earlier fates are carried without checking "
              "that their functions are unchanged", file=sys.stderr)
    final = merged(previous, latest, recorded, current) if names else latest
    checked = {name for name, fate in latest.items() if fate != "not checked"}
    results_path.write_text(format_fates(final))
    hashes_path.write_text(json.dumps(
        # Without a record the carried fates were taken as they were: recorded as of now.
        hashes_of_fates(final, current if recorded is None else recorded, current, checked),
        indent=1, sort_keys=True) + "\n")
    survivors = [name for name, fate in final.items() if fate == "survived"]
    diffs = [subprocess.run([mutmut, "show", name], cwd=work, capture_output=True,
                            text=True).stdout for name in survivors]
    (ROOT / "quality" / f"survivors-{scope_name}.txt").write_text("\n".join(diffs))
    print(summary(scope_name, Counter(final.values())))
    return 0


def summary(scope_name: str, counts: Counter[str]) -> str:
    """The run's counts by fate, and what to do with the survivors."""
    total = sum(counts.values())
    lines = [f"{scope_name}: {total} mutants, "
             + ", ".join(f"{n} {fate}" for fate, n in counts.most_common())]
    if total > counts.get("no tests", 0):
        caught = counts.get("killed", 0) + counts.get("timeout", 0)
        lines.append(f"caught {caught} of {total} ({100 * caught / total:.1f}%); survivors' diffs "
                     f"in quality/survivors-{scope_name}.txt: classify each as a gap (write its "
                     "test) or equivalent (name why in quality/README.md)")
    return "\n".join(lines)

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scope", nargs="?", help="a scope of quality/scopes.toml")
    parser.add_argument("names", nargs="*", help="only these mutants (mutmut names or globs)")
    parser.add_argument("--list", action="store_true", help="list the scopes")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--tests", nargs="+", metavar="TEST_FILE",
                        help="run these test files (names as in scopes.toml) instead of the scope's")
    parser.add_argument("--timeout-s", type=int, default=60,
                        help="per-test timeout: a mutant that hangs a test is caught")
    args = parser.parse_args(argv)
    if args.list or not args.scope:
        for name, scope in load_scopes().items():
            print(f"{name:18} {scope['about']} ({len(scope['modules'])} modules, "
                  f"{len(scope['tests'])} test files)")
        return 0
    return run(args.scope, args.max_children, args.timeout_s, args.names, args.tests)


if __name__ == "__main__":
    sys.exit(main())
