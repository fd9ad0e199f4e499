"""The core without its extras: ``pip install fdbqueue`` imports and runs, and each integration
whose extra is missing says, in one line, what to install (pyproject.toml's extras).

A missing package is simulated in a child process by ``sys.modules[name] = None``, which makes
every import of it raise ImportError as if it were not installed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# What each extra installs that the package imports (pyproject.toml).
EXTRAS = {
    "cli": ("rich",),
    "web": ("starlette", "uvicorn"),
    "metrics": ("prometheus_client",),
    "spark": ("pyspark", "pyarrow", "matplotlib"),
}
EVERY_EXTRA = (*(name for names in EXTRAS.values() for name in names), "opentelemetry")


def run_without(missing: tuple[str, ...], code: str, *args: str) -> subprocess.CompletedProcess[str]:
    hide = "".join(f"sys.modules[{name!r}] = None\n" for name in missing)
    return subprocess.run(
        [sys.executable, "-c", "import sys\n" + hide + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_core_needs_no_extra() -> None:
    p = run_without(
        EVERY_EXTRA,
        """
        import fdbqueue, fdbqueue.aio, fdbqueue.errors, fdbqueue.testing, fdbqueue.cli
        db = fdbqueue.open("memory://")
        q = fdbqueue.Queue("jobs")
        q.enqueue(db, {"n": 1})
        assert q.dequeue(db).json() == {"n": 1}
        fdbqueue.schedule(db, "jobs", "*/5 * * * *", b"tick", name="five")  # cronsim: core
        print("ok")
        """,
    )
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [
        ("fdbqueue.web", "starlette", "web"),
        ("fdbqueue.web", "uvicorn", "web"),
        ("fdbqueue.web.app", "starlette", "web"),
        ("fdbqueue.runtime.metrics", "prometheus_client", "metrics"),
        ("fdbqueue.spark", "pyspark", "spark"),
        ("fdbqueue.engines.sim.cluster", "greenlet", "model"),
    ],
)
def test_an_integration_without_its_extra_says_what_to_install(module: str, missing: str, extra: str) -> None:
    p = run_without(
        (missing,),
        f"""
        import fdbqueue
        from fdbqueue.errors import MissingExtraError
        try:
            import {module}
        except MissingExtraError as exc:
            assert isinstance(exc, ImportError) and isinstance(exc, fdbqueue.QueueError)
            print(exc)
        """,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == (
        f"{module.split('.app')[0] if extra == 'web' else module}"
        + (" (pyspark >= 4.0, pyarrow)" if extra == "spark" else "")
        + f" needs the {extra!r} extra: pip install '.[{extra}]' in a checkout of fdbqueue"
        + f" ({missing} is not installed)"
    )


@pytest.mark.parametrize(
    ("command", "extra", "missing"),
    [
        (["web", "--port", "0"], "web", "starlette"),
        (["metrics", "--port", "0"], "metrics", "prometheus_client"),
        (["audit", "--out", "audit"], "spark", "pyspark"),
    ],
)
def test_a_command_without_its_extra_is_one_line_not_a_traceback(
    command: list[str], extra: str, missing: str
) -> None:
    p = run_without(
        EVERY_EXTRA,
        f"""
        import fdbqueue
        from fdbqueue.cli import main
        sys.exit(main(["--url", "memory://", *{command!r}]))
        """,
    )
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fdbqueue: error: "), p.stderr
    assert f"pip install '.[{extra}]'" in lines[0] and f"({missing} is not installed)" in lines[0]


def test_the_command_without_rich_prints_plain_columns(tmp_path: Path) -> None:
    p = run_without(
        EXTRAS["cli"],
        """
        import fdbqueue
        from fdbqueue.cli import main
        url = sys.argv[1]
        with fdbqueue.open(url) as db:
            fdbqueue.Queue("jobs").enqueue(db, "x" * 100, headers={"k": "v"})
        for argv in (["list"], ["stats", "jobs"], ["browse", "jobs"], ["acl", "jobs"]):
            assert main(["--url", url, *argv]) == 0, argv
        """,
        f"sqlite://{tmp_path / 'q.db'}",
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert "Traceback" not in p.stderr and "rich" not in p.stderr
    header = next(line for line in out if line.startswith("name"))
    assert header.split() == ["name", "ready", "in", "flight", "delayed", "errors", "state"]
    assert out[out.index(header) + 1].startswith("----")
    assert any(line.split()[:2] == ["jobs", "1"] for line in out), out
    assert any(line.endswith("\u2026") and "xxxx" in line for line in out), out  # payload cut at 60


def test_a_worker_serving_metrics_without_the_extra_says_what_to_install() -> None:
    p = run_without(
        EXTRAS["metrics"],
        """
        import fdbqueue
        db = fdbqueue.open("memory://")
        try:
            fdbqueue.Worker(db, "jobs", lambda m: None, metrics_port=0).run(until_empty=True)
        except fdbqueue.QueueError as exc:
            print(exc)
        """,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == (
        "fdbqueue.runtime.metrics needs the 'metrics' extra: pip install '.[metrics]' in a checkout"
        " of fdbqueue (prometheus_client is not installed)"
    )


def test_the_demo_runs_without_spark_and_says_how_to_get_its_spark_step(tmp_path: Path) -> None:
    """The README's first command installs the cli extra only: the demo must run without pyspark
    (its Spark step says how to get it), not stop at an import of the spark package."""
    p = run_without(
        EXTRAS["spark"],
        f"""
        import os
        os.chdir({str(tmp_path)!r})
        from fdbqueue.cli import main
        raise SystemExit(main(["demo", "--messages", "20", "--producers", "1", "--workers", "1"]))
        """,
    )
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "pip install '.[spark]'" in p.stdout, p.stdout
