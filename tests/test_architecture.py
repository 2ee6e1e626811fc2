"""The library's shape, read from its source with `ast`: no import cycle among its modules,
at import time or through imports deferred into functions, and no module reaching into
another's private names.

A module-level cycle makes import order matter (a name is missing half-way through one
module's import). An import moved into a function to break one hides the loop without
removing it: two modules that each need the other are one module, or share a third below
both, so deferred imports count too. Only those under `if TYPE_CHECKING:` never run and
are left out. A private name used from elsewhere is a contract nobody wrote down.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orcasim", "calibrate")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_modules() -> dict[str, Path]:
    """Every module of the library, by dotted name (a package by its own name)."""
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_time_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: not those inside a function (or a
    class's method), nor under `if TYPE_CHECKING:` (its `else` does run)."""
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            yield stmt
        elif isinstance(stmt, ast.If) and _is_type_checking(stmt.test):
            yield from import_time_imports(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *(h.body for h in stmt.handlers)):
                yield from import_time_imports(block)
        else:  # if, with, for, while, class bodies: all run at import
            for field in ("body", "orelse"):
                block = getattr(stmt, field, None)
                if isinstance(block, list):
                    yield from import_time_imports(block)


def every_import(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that ever runs: those inside functions too, not those under
    `if TYPE_CHECKING:` (its `else` does run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skipped:
            yield node


def imported_modules(node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    """The library modules an import statement needs. `from pkg import name` needs `pkg`;
    `from pkg import sub` loads the submodule `pkg.sub` and needs `pkg` too: it binds what
    `pkg` holds under `sub`, and inside `pkg` whose body imports this module that is a loop
    through `__init__`, which only Python's fallback to the submodule keeps working
    (`import pkg.sub as sub` names the submodule alone)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    assert node.level == 0, "the library uses absolute imports"  # relative ones: resolve here
    base = node.module or ""
    found = {base}
    for alias in node.names:
        found.add(f"{base}.{alias.name}")
    return found & modules.keys()


def with_packages(name: str, targets: set[str], modules: dict[str, Path]) -> set[str]:
    """`targets` and the packages above them that importing them runs first (`orcasim.sweeps`
    for `orcasim.sweeps.table`), but not those enclosing `name`: a package's own modules
    run inside its import, and its body importing them is no cycle."""
    found = set(targets)
    for target in targets:
        parts = target.split(".")
        for package in (".".join(parts[:i]) for i in range(1, len(parts))):
            if package in modules and not (name == package or name.startswith(package + ".")):
                found.add(package)
    return found


def import_graph(modules: dict[str, Path], deferred: bool = False) -> dict[str, set[str]]:
    """Each library module's imports run at import time (`deferred`: or ever, inside
    functions too), as library modules."""
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        imports = every_import(tree) if deferred else import_time_imports(tree.body)
        targets = {t for node in imports for t in imported_modules(node, modules)}
        graph[name] = with_packages(name, targets, modules) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that returns to its start, or None (depth-first, with
    an explicit stack: the graph's depth is no concern of Python's recursion limit)."""
    done: set[str] = set()
    for root in sorted(graph):
        if root in done:
            continue
        path, on_path = [root], {root}
        stack = [iter(sorted(graph[root]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                on_path.discard(path[-1])
                done.add(path.pop())
                stack.pop()
            elif nxt in on_path:
                return [*path[path.index(nxt):], nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def test_find_cycle_finds_one_and_none() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_import_rules_on_a_hand_made_module() -> None:
    modules = {"orcasim": Path(), "orcasim.a": Path(), "orcasim.pkg": Path(), "orcasim.pkg.sub": Path()}
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "from orcasim.pkg import sub, helper\n"
        "import orcasim.a\n"
        "if TYPE_CHECKING:\n    from orcasim import b\n"
        "def f():\n    from orcasim import c\n")
    found = {t for node in import_time_imports(tree.body) for t in imported_modules(node, modules)}
    assert found == {"orcasim.pkg.sub", "orcasim.pkg", "orcasim.a"}
    assert with_packages("orcasim.a", {"orcasim.pkg.sub"}, modules) == {"orcasim.pkg.sub", "orcasim.pkg"}
    assert with_packages("orcasim.pkg.x", {"orcasim.pkg.sub"}, modules) == {"orcasim.pkg.sub"}
    ever = {t for node in every_import(tree) for t in imported_modules(node, modules)}
    assert ever == {"orcasim.pkg.sub", "orcasim.pkg", "orcasim.a", "orcasim"}  # c: orcasim's


def test_a_deferred_import_that_closes_a_loop_is_a_cycle() -> None:
    """`b` importing `a` inside a function still needs `a`, which needs `b`: a cycle, found."""
    sources = {"orcasim.a": "from orcasim import b\n",
               "orcasim.b": "def f():\n    from orcasim import a\n",
               "orcasim.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from orcasim import a\n"}
    modules = {"orcasim": Path(), **{name: Path() for name in sources}}
    graph = {name: {t for node in every_import(ast.parse(text)) for t in imported_modules(node, modules)}
             for name, text in sources.items()}
    assert find_cycle(graph) == ["orcasim.a", "orcasim.b", "orcasim.a"]
    assert graph["orcasim.c"] == set()


def test_a_module_importing_its_sibling_from_the_package_that_imports_it_is_a_cycle() -> None:
    """`orcasim.schedulers.paged` wrote `from orcasim.schedulers import paged_runs` while the
    package's body imports `paged`: a loop through `__init__` the graph did not see."""
    sources = {"orcasim.pkg": "from orcasim.pkg.x import X\n",
               "orcasim.pkg.x": "from orcasim.pkg import y\n",
               "orcasim.pkg.y": ""}
    modules = {"orcasim": Path(), **{name: Path() for name in sources}}

    def graph_of(texts: dict[str, str]) -> dict[str, set[str]]:
        return {name: with_packages(name, {t for node in import_time_imports(ast.parse(text).body)
                                           for t in imported_modules(node, modules)}, modules) - {name}
                for name, text in texts.items()}

    assert find_cycle(graph_of(sources)) == ["orcasim.pkg", "orcasim.pkg.x", "orcasim.pkg"]
    direct = {**sources, "orcasim.pkg.x": "import orcasim.pkg.y as y\n"}
    assert find_cycle(graph_of(direct)) is None


def test_every_orcasim_module_imports() -> None:
    """Each module imports on its own (calibrate's need torch: their tests import them)."""
    for name in library_modules():
        if name.split(".")[0] == "orcasim":
            importlib.import_module(name)


def test_no_import_cycle_at_module_level() -> None:
    cycle = find_cycle(import_graph(library_modules()))
    assert cycle is None, "import cycle at module level: " + " -> ".join(cycle or ())


def test_no_import_cycle_through_imports_inside_functions() -> None:
    cycle = find_cycle(import_graph(library_modules(), deferred=True))
    assert cycle is None, ("import cycle through an import inside a function (move what both "
                           "need below both): " + " -> ".join(cycle or ()))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(name: str, tree: ast.Module, modules: dict[str, Path]) -> list[str]:
    """Another library module's private names that `tree` (module `name`) uses: imported
    (`from orcasim.x import _y`) or read off an imported module (`x._y`, `orcasim.x._y`)."""
    found, bound = [], {}  # bound: a local name -> the library module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in modules:
            for a in node.names:
                if _private(a.name) and node.module != name:
                    found.append(f"line {node.lineno}: from {node.module} import {a.name}")
                if f"{node.module}.{a.name}" in modules:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in PACKAGES:
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in bound:
            target = ".".join([bound[value.id], *reversed(chain)])
            if target in modules and target != name:
                found.append(f"line {node.lineno}: {target}.{node.attr}")
    return found


def test_private_uses_on_a_hand_made_module() -> None:
    modules = {"orcasim": Path(), "orcasim.x": Path(), "orcasim.pkg": Path(), "orcasim.pkg.y": Path()}
    tree = ast.parse("from orcasim.x import _a, b\nfrom orcasim.pkg import y\nimport orcasim.x\n"
                     "import orcasim.pkg.y as z\n"
                     "y._c\norcasim.x._d\nz._e\nself._f\nb._g\norcasim.x.__name__\n")
    assert [u.split(": ")[1] for u in private_uses("orcasim.w", tree, modules)] == [
        "from orcasim.x import _a", "orcasim.pkg.y._c", "orcasim.x._d", "orcasim.pkg.y._e"]
    assert private_uses("orcasim.x", ast.parse("import orcasim.x\norcasim.x._own\n"), modules) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_uses_another_modules_private_names(package: str) -> None:
    modules = library_modules()
    uses = [f"{path.relative_to(ROOT)} {use}" for name, path in modules.items()
            if name.split(".")[0] == package
            for use in private_uses(name, ast.parse(path.read_text()), modules)]
    assert not uses, "private names used across modules (give them a public name):\n" + "\n".join(uses)


def _undocumented(module: object) -> list[str]:
    """The names in `module.__all__` without a docstring of their own: a dataclass's
    generated one (its signature) counts as none, a type alias (a `Literal`) has none to give."""
    missing = []
    for name in getattr(module, "__all__", ()):
        obj = getattr(module, name)
        if getattr(obj, "__module__", None) == "typing":
            continue
        doc = (obj.__doc__ or "").strip()
        if not doc or doc.startswith(f"{name}("):
            missing.append(name)
    return missing


@pytest.mark.parametrize("name", ["orcasim", "orcasim.sweeps"])
def test_every_exported_name_has_a_docstring(name: str) -> None:
    """What a notebook imports answers `help()`: `orcasim.Scenario` had no docstring and
    `RunResult`'s, `SweepResult`'s and `Sweep`'s were their generated signatures."""
    module = importlib.import_module(name)
    assert [n for n in module.__all__ if not hasattr(module, n)] == []
    assert _undocumented(module) == []


def test_dir_lists_each_public_name_once_loaded_or_not() -> None:
    """dir(orcasim) listed 'RunResult', 'RunResult', ... once the names were loaded (in
    globals and in the lazy table both; found testing the API as a notebook would)."""
    import subprocess
    import sys

    code = ("import orcasim; before = dir(orcasim); orcasim.run_scenario; orcasim.Scenario; "
            "after = dir(orcasim); print(len(after) - len(set(after)), "
            "set(orcasim.__all__) <= set(before))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "True"]
