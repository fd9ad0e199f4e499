"""The package's import graph: no cycle beyond the allowlist, and imports go down the layers.

The graph is read from the source (``ast``), not from ``sys.modules``, so that an import made
inside a function counts as much as one at the top of a module: both run, only later. Imports
under ``if TYPE_CHECKING:`` count too (a dependency of the types is a dependency). The implicit
imports of parent packages that Python makes before a submodule do not (``import
fdbqueue.engines.sqlite.database`` runs ``fdbqueue/engines/__init__.py`` first, but that module
is not a dependency of the importer). ``from pkg import name`` is an edge to the submodule
``pkg.name`` when there is one, else to ``pkg`` itself.

Both checks hold an allowlist of what is there today (``KNOWN_CYCLES``, ``KNOWN_LAYER_VIOLATIONS``):
the test fails on anything new, and also on an allowlisted entry that is gone, so the lists only
shrink, and each change to the import graph is seen in review.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "fdbqueue"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    file: str
    line: int

    def where(self) -> str:
        return f"{self.file}:{self.line} ({short(self.source)} -> {short(self.target)})"


def short(module: str) -> str:
    """``fdbqueue.engines.sqlite.database`` -> ``engines.sqlite``; the package itself stays ``fdbqueue``."""
    return module[len(PACKAGE) + 1 :] if module.startswith(PACKAGE + ".") else module


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _all_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node``: at the top, inside functions, and under ``if
    TYPE_CHECKING:`` too. A type-checking import runs only in the type checker, but it is a
    dependency all the same: a module that names another's class in its signatures needs to
    know it, and a circle of them is a circle of ideas (the architecture issue)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _all_imports(child)


def _owner_package(module: str, path: Path) -> str:
    """The package a module's relative imports start from."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def import_edges(modules: dict[str, Path], root: Path = ROOT) -> list[Edge]:
    """Every import from one package module to another (the module itself excluded)."""
    edges: list[Edge] = []
    for module, path in modules.items():
        rel = str(path.relative_to(root.parent))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for stmt in _all_imports(tree):
            targets: list[str] = []
            if isinstance(stmt, ast.Import):
                targets = [alias.name for alias in stmt.names]
            else:
                if stmt.level:
                    base = _owner_package(module, path)
                    for _ in range(stmt.level - 1):
                        base = base.rpartition(".")[0]
                    origin = f"{base}.{stmt.module}" if stmt.module else base
                else:
                    origin = stmt.module or ""
                for alias in stmt.names:
                    sub = f"{origin}.{alias.name}"
                    targets.append(sub if sub in modules else origin)
            for target in targets:
                if target in modules and target != module:
                    edges.append(Edge(module, target, rel, stmt.lineno))
    return edges


def _graph(edges: list[Edge]) -> dict[str, dict[str, Edge]]:
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        graph.setdefault(e.source, {}).setdefault(e.target, e)  # the first line that imports it
        graph.setdefault(e.target, {})
    return graph


def strongly_connected(graph: dict[str, dict[str, Edge]]) -> list[list[str]]:
    """Tarjan's algorithm: the components with more than one module (a cycle each)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def elementary_cycles(graph: dict[str, dict[str, Edge]]) -> set[tuple[str, ...]]:
    """Every elementary cycle, each once, as a tuple of short names starting at its least one.

    A cycle is found from its least module only (nodes less than the start are skipped), so a
    plain depth-first search enumerates each exactly once; the graph is small.
    """
    cycles: set[tuple[str, ...]] = set()
    for component in strongly_connected(graph):
        for start in component:
            _cycles_from(graph, set(component), [start], cycles)
    return cycles


def _cycles_from(
    graph: dict[str, dict[str, Edge]], members: set[str], path: list[str], cycles: set[tuple[str, ...]]
) -> None:
    start = path[0]
    for w in sorted(graph[path[-1]]):
        if w not in members or w < start:
            continue
        if w == start:
            cycles.add(tuple(short(m) for m in path))
        elif w not in path:
            path.append(w)
            _cycles_from(graph, members, path, cycles)
            path.pop()


def cycle_edges(graph: dict[str, dict[str, Edge]], cycle: tuple[str, ...]) -> list[Edge]:
    full = [m if m == PACKAGE else f"{PACKAGE}.{m}" for m in cycle]
    return [graph[a][b] for a, b in zip(full, full[1:] + full[:1], strict=True)]


# The cycles of today, each as its modules in import order from the least name. Remove an entry
# when its cycle is broken (the test says which); never add one.
KNOWN_CYCLES: set[tuple[str, ...]] = set()  # none left: add none


# The layers, lowest first: a module's layer is that of the longest prefix of its dotted name
# (below the package) in the table, so that the tree says what the layers are and a new module
# is placed by the folder it is put in. A module may import its own layer and those below, never
# above; inside one layer, imports go one way too (no cycle).
LAYERS: dict[str, int] = {
    "errors": 0,  # every exception: imports nothing of the package
    "types": 0,  # the leaf types shared by every layer
    "engines": 1,  # FoundationDB's transaction contract and the engines behind it
    "store": 2,  # what is stored: keyspace, records, settings, database time, budgets
    "ops": 3,  # operations inside one transaction: the one writer and its maintainers
    "api": 4,  # the public operations: Queue, the queue manager, moves, routing, schedules
    "runtime": 5,  # what runs: workers, dispatcher, fairness, forwarding, metrics
    "aio": 6,  # asyncio faces of the API and the worker
    "testing": 6,  # faults and measures on the sim engine, for application tests
    "tasks": 6,  # the task registry's face: its worker is a Worker or an AsyncWorker
    "": 7,  # the package's face (fdbqueue/__init__.py)
    "web": 8,  # the dashboard (the web extra)
    "spark": 8,  # the Spark data source, audit and demo step (the spark extra)
    "cli": 9,  # the command line
    "__main__": 10,
}


def layer_of(module: str) -> int:
    """The layer of ``module``: its longest prefix in :data:`LAYERS`."""
    name = short(module) if module != PACKAGE else ""
    parts = name.split(".") if name else []
    for n in range(len(parts), -1, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return LAYERS[key]
    raise KeyError(module)


# The imports of today that go up a layer, as (importer, imported). Remove an entry when its
# import is gone (the test says which); never add one.
KNOWN_LAYER_VIOLATIONS: set[tuple[str, str]] = set()  # none left: add none


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, Edge]]:
    return _graph(import_edges(module_files()))


def test_no_import_cycle_beyond_the_known_ones(graph: dict[str, dict[str, Edge]]) -> None:
    cycles = elementary_cycles(graph)
    new = sorted(cycles - KNOWN_CYCLES)
    stale = sorted(KNOWN_CYCLES - cycles)
    problems = [
        f"new import cycle {' -> '.join(c)}:\n    " + "\n    ".join(e.where() for e in cycle_edges(graph, c))
        for c in new
    ]
    problems += [f"stale KNOWN_CYCLES entry {c}: that cycle is gone, remove it from the list" for c in stale]
    assert not problems, "\n".join(problems)


def test_every_module_has_a_layer() -> None:
    missing = []
    for m in module_files():
        try:
            layer_of(m)
        except KeyError:
            missing.append(short(m))
    assert not missing, (
        f"place these modules in a folder of LAYERS (tests/architecture/test_imports.py): {missing}"
    )


def test_no_module_imports_a_higher_layer(graph: dict[str, dict[str, Edge]]) -> None:
    found: dict[tuple[str, str], Edge] = {}
    for source, targets in graph.items():
        for target, edge in targets.items():
            if layer_of(target) > layer_of(source):
                found[(short(source), short(target))] = edge
    new = sorted(set(found) - KNOWN_LAYER_VIOLATIONS)
    stale = sorted(KNOWN_LAYER_VIOLATIONS - set(found))
    problems = [
        f"{found[v].where()} imports layer {layer_of(PACKAGE + '.' + v[1])} from layer "
        f"{layer_of(PACKAGE + '.' + v[0])}"
        for v in new
    ]
    problems += [f"stale KNOWN_LAYER_VIOLATIONS entry {v}: that import is gone, remove it" for v in stale]
    assert not problems, "\n".join(problems)


# The walker itself, on small packages written for each rule: a check that cannot see an
# import would pass on anything.


def _edges_of(tmp_path: Path, files: dict[str, str]) -> set[tuple[str, str]]:
    pkg = tmp_path / PACKAGE
    for name, text in files.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {(short(e.source), short(e.target)) for e in import_edges(module_files(pkg), pkg)}


def test_the_walk_counts_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    edges = _edges_of(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from fdbqueue.b import X\n"
                "else:\n    import fdbqueue.d\n"
                "def f():\n    from fdbqueue.c import Y\n"
            ),
            "b.py": "",
            "c.py": "",
            "d.py": "",
        },
    )
    assert edges == {("a", "b"), ("a", "c"), ("a", "d")}


def test_the_walk_resolves_submodules_relative_imports_and_package_names(tmp_path: Path) -> None:
    edges = _edges_of(
        tmp_path,
        {
            "__init__.py": "from fdbqueue.x import X\n",
            "x.py": "from fdbqueue import engines\nfrom fdbqueue import X\nfrom . import y\n",
            "y.py": "",
            "engines/__init__.py": "from .base import B\n",
            "engines/base.py": "from .. import y\nfrom fdbqueue.engines import helper\n",
            "engines/helper.py": "",
            "engines/sqlite.py": "import fdbqueue.engines.base\n",
        },
    )
    assert edges == {
        ("fdbqueue", "x"),
        ("x", "engines"),
        ("x", "fdbqueue"),
        ("x", "y"),
        ("engines", "engines.base"),
        ("engines.base", "y"),
        ("engines.base", "engines.helper"),
        ("engines.sqlite", "engines.base"),
    }


def test_cycles_are_found_each_once_with_their_import_lines() -> None:
    def e(a: str, b: str) -> Edge:
        return Edge(f"{PACKAGE}.{a}", f"{PACKAGE}.{b}", f"{a}.py", 1)

    g = _graph([e("a", "b"), e("b", "a"), e("b", "c"), e("c", "a"), e("c", "d")])
    assert elementary_cycles(g) == {("a", "b"), ("a", "b", "c")}
    assert [x.where() for x in cycle_edges(g, ("a", "b", "c"))] == [
        "a.py:1 (a -> b)",
        "b.py:1 (b -> c)",
        "c.py:1 (c -> a)",
    ]
    assert strongly_connected(g) == [[f"{PACKAGE}.a", f"{PACKAGE}.b", f"{PACKAGE}.c"]]


# Exception classes that stay where they are, and why.
ERRORS_ELSEWHERE = {
    "cli.console.CommandError": "the command line's exit code and message, never raised by the API",
    "engines.sqlite.files.NotAStore": "the embedded engine's own kind of StoreError, raised as one",
    "engines.fdb._NoBindings": "a stand-in for fdb.FDBError before the bindings are loaded",
    "cli.demo.OrderFailed": "the demo application's own failure (a handler's), never raised by the library",
}


def test_every_error_is_defined_in_errors_py() -> None:
    """An exception class defined elsewhere makes its raisers import that module (and its
    imports); errors.py imports nothing of the package."""
    elsewhere = []
    for module, path in module_files().items():
        if module == f"{PACKAGE}.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ClassDef)
                and (
                    node.name.endswith(("Error", "Exception"))
                    or any(
                        isinstance(b, ast.Name) and b.id.endswith(("Error", "Exception")) for b in node.bases
                    )
                )
                and f"{short(module)}.{node.name}" not in ERRORS_ELSEWHERE
            ):
                elsewhere.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}")
    assert not elsewhere, "define these in fdbqueue/errors.py (re-export them here):\n" + "\n".join(elsewhere)


def test_new_id_lives_in_store_below_the_modules_that_make_ids() -> None:
    from fdbqueue.store import entropy

    ids = [entropy.new_id() for _ in range(3)]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids) and len(set(ids)) == 3


def test_types_is_a_leaf(graph: dict[str, dict[str, Edge]]) -> None:
    assert set(graph[f"{PACKAGE}.types"]) <= {f"{PACKAGE}.errors"}, graph[f"{PACKAGE}.types"]
