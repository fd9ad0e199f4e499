"""The public surface: the names users write against exist, ``fdbqueue.__all__`` holds every public
name of the package's face once, and no module keeps a name alive for another module's sake
(a re-export shim): every import names the module that defines what it imports, but for the
public faces (``fdbqueue``, ``fdbqueue.aio``, ``fdbqueue.testing``, ``fdbqueue.errors``, and the
integrations ``fdbqueue.cli``, ``fdbqueue.web``, ``fdbqueue.spark``, ``fdbqueue.runtime.metrics``).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import types
from pathlib import Path

import fdbqueue
from fdbqueue import aio, testing

ROOT = Path(__file__).resolve().parents[2]

# The names of the package's face that its promise to users spells out (``fdbqueue.X``).
PROMISED = [
    "open",
    "transactional",
    "Queue",
    "create_queue",
    "journal",
    "history",
    "trim_journal",
    "grant",
    "revoke",
    "acl",
    "AccessDeniedError",
    "QueueError",
    "move",
    "forward",
    "Forwarder",
    "RemoteQueue",
    "PartitionedQueue",
    "set_route",
    "routes",
    "Worker",
    "redrive",
    "Retry",
    "Discard",
    "schedule",
]
PROMISED_AIO = ["AsyncQueue", "AsyncWorker"]
PROMISED_TESTING = ["FaultScript", "outage"]

# Modules whose imports from other modules are their public face (each has an ``__all__``).
PUBLIC = {"fdbqueue", "fdbqueue.aio", "fdbqueue.testing", "fdbqueue.cli", "fdbqueue.spark", "fdbqueue.web"}

# Re-exports still there, and why: each step that removes one removes its entry here.
KNOWN_REEXPORTS: set[tuple[str, str]] = set()  # none left: add none


def test_the_promised_names_exist() -> None:
    missing = [f"fdbqueue.{n}" for n in PROMISED if not hasattr(fdbqueue, n)]
    missing += [f"fdbqueue.aio.{n}" for n in PROMISED_AIO if not hasattr(aio, n)]
    missing += [f"fdbqueue.testing.{n}" for n in PROMISED_TESTING if not hasattr(testing, n)]
    assert importlib.util.find_spec("fdbqueue.spark") is not None  # fdbqueue.spark.register
    assert not missing, missing
    assert set(PROMISED) <= set(fdbqueue.__all__)


def test_every_name_the_docs_use_exists() -> None:
    """Every ``fdbqueue.X`` in README.md and docs/ is a public name or a module of the package."""
    wrong = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n in sorted(set(re.findall(r"\bfdbqueue\.([A-Za-z_]\w*)", path.read_text(encoding="utf-8")))):
            if n == "db":  # ./fdbqueue.db, the default store's file
                continue
            if not hasattr(fdbqueue, n) and importlib.util.find_spec(f"fdbqueue.{n}") is None:
                wrong.append(f"{path.name}: fdbqueue.{n}")
    assert not wrong, wrong


def test_all_lists_every_public_name_of_the_face_once() -> None:
    names = fdbqueue.__all__
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    assert all(hasattr(fdbqueue, n) for n in names)
    public = {
        n
        for n, v in vars(fdbqueue).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType) and n not in ("Any", "annotations")
    }
    assert public == set(names), public ^ set(names)


def test_all_is_grouped_by_role() -> None:
    """``__all__`` is written as groups under ``# --`` comments, each name in one group."""
    source = (ROOT / "fdbqueue" / "__init__.py").read_text(encoding="utf-8")
    body = source[source.index("__all__ = [") :]
    groups = re.findall(r"# -- ([^\n]+)", body[: body.index("\n]")])
    assert [g.split(" (")[0].split(":")[0] for g in groups] == [
        "opening a store and running transactions",
        "the queue",
        "the queue manager",
        "the journal",
        "privileges",
        "moving, forwarding and routing",
        "workers and dispatch",
        "schedules",
        "operations",
        "errors",
        "types",
    ]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _defined_and_imported() -> tuple[dict[str, set[str]], dict[str, dict[str, str]]]:
    """Per package module: the names it defines, and the names it imports (-> from where)."""
    defined: dict[str, set[str]] = {}
    imported: dict[str, dict[str, str]] = {}
    for path in sorted((ROOT / "fdbqueue").rglob("*.py")):
        mod = _module_name(path)
        d: set[str] = set()
        i: dict[str, str] = {}

        def visit(body: list[ast.stmt], d: set[str] = d, i: dict[str, str] = i) -> None:
            for node in body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    d.add(node.name)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    d.update(x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name))
                elif isinstance(node, ast.ImportFrom) and node.module:
                    i.update({a.asname or a.name: node.module for a in node.names})
                elif isinstance(node, (ast.If, ast.Try)):
                    visit(node.body)
                    visit(node.orelse)
                    for handler in getattr(node, "handlers", []):
                        visit(handler.body)

        visit(ast.parse(path.read_text(encoding="utf-8")).body)
        defined[mod], imported[mod] = d, i
    return defined, imported


def test_every_import_names_the_module_that_defines_it() -> None:
    defined, imported = _defined_and_imported()
    shims = set()
    for path in sorted(
        [*ROOT.glob("fdbqueue/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("scripts/*.py")]
    ):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.module not in defined or node.module in PUBLIC:
                continue
            for alias in node.names:
                name = alias.name
                if name in defined[node.module] or f"{node.module}.{name}" in defined:
                    continue
                if name in imported[node.module] and (node.module, name) not in KNOWN_REEXPORTS:
                    source = imported[node.module][name]
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    shims.add(f"{where}: {name} from {node.module}, defined in {source}")
    assert not shims, "import these from where they are defined:\n" + "\n".join(sorted(shims))
    for mod, name in KNOWN_REEXPORTS:
        assert name in imported[mod], f"stale KNOWN_REEXPORTS entry {(mod, name)}: remove it"


def test_no_module_declares_another_modules_names_in_its_all() -> None:
    """An ``__all__`` lists what the module defines (the public faces excepted)."""
    defined, _ = _defined_and_imported()
    borrowed = []
    for path in sorted(ROOT.glob("fdbqueue/**/*.py")):
        mod = _module_name(path)
        if mod in PUBLIC:
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                names = ast.literal_eval(node.value)
                borrowed += [f"{mod}.{n}" for n in names if n not in defined[mod]]
    assert not borrowed, borrowed
