"""Every ```python block of README.md and docs/*.md runs exactly as written.

Each block runs on its own, as a reader would paste it: a fresh Python process in a fresh
temporary directory (so a relative ``sqlite://queues.db`` is a fresh embedded store), without
``$FDBQUEUE_URL`` or ``$FDBQUEUE_PRINCIPAL``. The exceptions are marked in the Markdown, on the
line before the block, so that whoever writes the docs sees the rule:

    <!-- snippet: skip REASON -->   not run (a FoundationDB cluster, a server that runs until
                                    stopped, a listing of signatures); it must still parse
    <!-- snippet: spark -->         runs in this process on the tests' local Spark session,
                                    where pyspark and Java are (as tests/integrations/test_spark.py)
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.processes import real_clock  # noqa: F401 - a fixture: Spark's workers share the store

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"^<!--\s*snippet:\s*(?P<kind>skip|spark)\b\s*(?P<reason>.*?)\s*-->$")
MAX_SKIPPED = 14  # a skip is an exception: raise this only for a block that cannot run here


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence, 1-based
    code: str
    kind: str  # "run", "skip" or "spark"
    reason: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def snippets() -> list[Snippet]:
    """The ```python blocks of the docs, each with the mark on the line before it, if any."""
    out = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            if lines[i].strip() != "```python":
                i += 1
                continue
            start = i
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                i += 1
            code = "\n".join(lines[start + 1 : i]) + "\n"
            before = lines[start - 1].strip() if start else ""
            found = MARK.match(before)
            kind, reason = (found["kind"], found["reason"]) if found else ("run", "")
            out.append(Snippet(path, start + 1, code, kind, reason))
            i += 1
    return out


SNIPPETS = snippets()


def _parse(s: Snippet) -> None:
    """Compile the block (top-level ``await`` allowed, as ``python -m asyncio`` runs it)."""
    compile(s.code, s.name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)


def test_the_docs_have_snippets_and_few_are_skipped() -> None:
    assert len(SNIPPETS) >= 20, [s.name for s in SNIPPETS]
    skipped = [s for s in SNIPPETS if s.kind == "skip"]
    assert len(skipped) <= MAX_SKIPPED, [s.name for s in skipped]
    assert all(s.reason for s in skipped), [s.name for s in skipped if not s.reason]
    for s in SNIPPETS:  # every block is Python, skipped or not
        _parse(s)


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if s.kind == "run"], ids=lambda s: s.name)
def test_snippet_runs_as_written(snippet: Snippet, tmp_path: Path) -> None:
    _run(snippet, tmp_path)


def _run(snippet: Snippet, cwd: Path) -> None:
    """Run ``snippet`` as its own process in ``cwd``, as a reader would paste it."""
    env = {k: v for k, v in os.environ.items() if k not in ("FDBQUEUE_URL", "FDBQUEUE_PRINCIPAL")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    r = subprocess.run(
        [sys.executable, "-c", snippet.code],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0, f"{snippet.name} failed:\n{snippet.code}\n{r.stderr.decode()[-3000:]}"


def test_the_readme_runs_in_order_in_one_directory(tmp_path: Path) -> None:
    """A reader follows the README's walk-through: each runnable block in turn, as its own
    process, in one directory, so one ``queues.db`` (what one block leaves, such as an owned
    queue, is there for the next)."""
    readme = [s for s in SNIPPETS if s.path.name == "README.md" and s.kind == "run"]
    assert len(readme) >= 4, [s.name for s in readme]
    for s in readme:
        _run(s, tmp_path)


INDEX_INSTALL = re.compile(r"pip install\s+['\"]?fdbqueue\b")


def test_no_doc_installs_fdbqueue_from_a_package_index() -> None:
    """No index serves fdbqueue: the docs install from a checkout (``pip install .``,
    ``pip install '.[spark]'``), as docs/operations.md says."""
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in DOCS
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if INDEX_INSTALL.search(line)
    ]
    assert not found, found


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    if not os.environ.get("FDBQUEUE_REQUIRE_SPARK"):
        pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")
    from fdbqueue.spark import local_session

    # The tests' session (tests/integrations/test_spark.py makes the same): a block's own local_session()
    # is then this one, as getOrCreate returns the active session.
    yield local_session("fdbqueue-tests", cores=2, retries=2)


@pytest.mark.usefixtures("real_clock")
@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if s.kind == "spark"], ids=lambda s: s.name)
def test_spark_snippet_runs_as_written(
    snippet: Snippet, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FDBQUEUE_URL", raising=False)
    monkeypatch.delenv("FDBQUEUE_PRINCIPAL", raising=False)
    exec(compile(snippet.code, snippet.name, "exec", dont_inherit=True), {"__name__": "__main__"})
