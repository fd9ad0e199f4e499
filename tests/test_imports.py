"""The package's import graph: no cycle beyond the allowlist, and imports go down the layers.

The graph is read from the source (``ast``), not from ``sys.modules``, so that an import made
inside a function counts as much as one at the top of a module: both run, only later. Imports
under ``if TYPE_CHECKING:`` do not count (they never run), nor do the implicit imports of
parent packages that Python makes before a submodule (``import fdbqueue.engines.sqlite``
runs ``fdbqueue/engines/__init__.py`` first, but that module is not a dependency of the
importer). ``from pkg import name`` is an edge to the submodule ``pkg.name`` when there is one,
else to ``pkg`` itself.

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
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    file: str
    line: int

    def where(self) -> str:
        return f"{self.file}:{self.line} ({short(self.source)} -> {short(self.target)})"


def short(module: str) -> str:
    """``fdbqueue.engines.sqlite`` -> ``engines.sqlite``; the package itself stays ``fdbqueue``."""
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


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _runtime_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements under ``node`` that can run: all but ``if TYPE_CHECKING:`` bodies."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:  # the else branch does run
                if isinstance(other, (ast.Import, ast.ImportFrom)):
                    yield other
                yield from _runtime_imports(other)
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _runtime_imports(child)


def _owner_package(module: str, path: Path) -> str:
    """The package a module's relative imports start from."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def import_edges(modules: dict[str, Path], root: Path = ROOT) -> list[Edge]:
    """Every runtime import from one package module to another (the module itself excluded)."""
    edges: list[Edge] = []
    for module, path in modules.items():
        rel = str(path.relative_to(root.parent))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for stmt in _runtime_imports(tree):
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
KNOWN_CYCLES: set[tuple[str, ...]] = set()


# The layers (lowest first). A module may import its own layer and those below; never above.
# Every module must be in the table, so that a new one is placed on purpose.
LAYERS: dict[str, int] = {
    # L0 leaves: shared types, errors, the key layout, clocks, budgets, the record codec.
    "errors": 0,
    "types": 0,
    "layout": 0,
    "entropy": 0,
    "clock": 0,
    "tracing": 0,  # OpenTelemetry context in headers: imports nothing of ours
    "budget": 0,
    "message": 0,
    # L1 engines: the transaction contract and the retry loop, and the engines behind it.
    "engines": 1,
    "engines.base": 1,
    "engines._url": 1,
    "engines._diskroom": 1,
    "engines._notify": 1,
    "engines._shared": 1,
    "engines._storelock": 1,
    "engines._simfaults": 1,
    "engines._simstore": 1,
    "engines._sqlitetxn": 1,
    "engines._storefiles": 1,
    "engines._walcheck": 1,
    "engines._writemap": 1,
    "engines._walsync": 1,
    "engines.fdb": 1,
    "engines.local": 1,
    "engines.sim": 1,
    "engines.sqlite": 1,
    # L2 running operations; settings.
    "txn": 2,
    "steps": 2,
    "config": 2,
    # L3 the writer of message state and what sits beside it.
    "moves": 3,
    "maintainers": 3,
    "journaling": 3,
    "workindex": 3,
    "privileges": 3,
    "receipts": 3,
    "waiting": 3,
    "views": 3,  # one definition of the states every view counts (ready, delayed, ...): reads only
    # L4 the store functions.
    "delivery": 4,
    "sweep": 4,
    "head": 4,
    "leasing": 4,
    "contention": 4,
    "browse": 4,
    "autonomous": 4,
    "enqueuing": 4,
    # L5 the API.
    "queue": 5,
    "admin": 5,
    "moving": 5,
    "redrive": 5,
    "routing": 5,
    "fairness": 5,
    "remotededup": 5,  # when the forwarder acts on a RemoteQueue copy's dedup key
    "transit": 5,  # a leased forward's pending copies and tombstones (forwarding.py)
    "outbox": 5,  # an exclusive forward's reads (forwarding.py)
    "export": 6,
    # L6 runtime.
    "worker": 6,
    "handling": 6,
    "forwarding": 6,
    "remote": 6,
    "dispatcher": 6,
    "testing": 6,
    "metrics": 6,
    "web": 6,  # the dashboard: its app, sampler and views over the API below
    "web.app": 6,
    "web.hosts": 6,  # the names the dashboard answers (DNS rebinding)
    "web.sampler": 6,
    "web.views": 6,
    "schedules": 6,
    "settling": 5,  # ack_many, nack_many and a worker's batched acks
    "aio": 6,  # asyncio: the Queue, a worker and transactional as coroutines
    # L7 surface.
    "cli": 7,
    "spark": 7,
    "sparkwrite": 7,
    "audit": 7,
    "cli_io": 7,
    "cli_journal": 7,
    "cli_ops": 7,
    "demo": 7,
    "demo_spark": 7,
    "__main__": 7,
    "fdbqueue": 7,
}

# The imports of today that go up a layer, as (importer, imported). Remove an entry when its
# import is gone (the test says which); never add one.
KNOWN_LAYER_VIOLATIONS: set[tuple[str, str]] = set()


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
    missing = sorted(short(m) for m in module_files() if short(m) not in LAYERS)
    assert not missing, f"place these modules in LAYERS (tests/test_imports.py): {missing}"


def test_no_module_imports_a_higher_layer(graph: dict[str, dict[str, Edge]]) -> None:
    found: dict[tuple[str, str], Edge] = {}
    for source, targets in graph.items():
        for target, edge in targets.items():
            a, b = short(source), short(target)
            if a in LAYERS and b in LAYERS and LAYERS[b] > LAYERS[a]:
                found[(a, b)] = edge
    new = sorted(set(found) - KNOWN_LAYER_VIOLATIONS)
    stale = sorted(KNOWN_LAYER_VIOLATIONS - set(found))
    problems = [f"{found[v].where()} imports layer {LAYERS[v[1]]} from layer {LAYERS[v[0]]}" for v in new]
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


def test_the_walk_counts_function_level_imports_and_skips_type_checking(tmp_path: Path) -> None:
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
    assert edges == {("a", "c"), ("a", "d")}


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
    "cli_io.CommandError": "the command line's exit code and message, never raised by the API",
    "engines._storefiles.NotAStore": "the embedded engine's own kind of StoreError, raised as one",
    "engines.fdb._NoBindings": "a stand-in for fdb.FDBError before the bindings are loaded",
    "demo.OrderFailed": "the demo application's own failure (a handler's), never raised by the library",
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


def test_the_errors_moved_to_errors_py_are_still_importable_from_their_old_modules() -> None:
    import importlib

    from fdbqueue import errors

    old = {
        "config": ["QueueNotFoundError", "UnsupportedLayerFormatError"],
        "delivery": ["LeaseError", "LeaseExpiredError"],
        "message": [
            "InvalidPayloadError",
            "PayloadTooLargeError",
            "HeadersTooLargeError",
            "DedupKeyTooLargeError",
            "ReasonTooLargeError",
        ],
        "budget": ["BudgetExceededError"],
        "worker": ["HandlerSignatureError"],
        "testing": ["FaultScriptError"],
    }
    for module, names in old.items():
        loaded = importlib.import_module(f"{PACKAGE}.{module}")
        for name in names:
            assert getattr(loaded, name) is getattr(errors, name), f"{module}.{name}"


def test_new_id_lives_in_layout_below_the_modules_that_make_ids() -> None:
    from fdbqueue import layout, queue

    assert queue.new_id is layout.new_id  # re-exported from its old place
    ids = [layout.new_id() for _ in range(3)]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids) and len(set(ids)) == 3


def test_types_is_a_leaf_and_its_types_keep_their_old_names(graph: dict[str, dict[str, Edge]]) -> None:
    import importlib

    from fdbqueue import types

    assert set(graph[f"{PACKAGE}.types"]) <= {f"{PACKAGE}.errors"}, graph[f"{PACKAGE}.types"]
    old = {
        "config": ["QueueState", "check_duration", "MAX_DURATION_SECONDS"],
        "message": ["ContentType", "Message"],
        "sweep": ["SweepStats"],
        "admin": ["QueueStats"],
        "browse": ["Outlook"],
        "autonomous": ["AutonomousId"],
    }
    for module, names in old.items():
        loaded = importlib.import_module(f"{PACKAGE}.{module}")
        for name in names:
            assert getattr(loaded, name) is getattr(types, name), f"{module}.{name}"
    assert importlib.import_module(f"{PACKAGE}.queue")._Item is types.Item
