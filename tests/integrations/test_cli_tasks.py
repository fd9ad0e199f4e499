"""``fdbqueue worker --tasks module:app``: the app's worker in a real process; a malformed
spec exits 2 with one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.api.tasks import TaskRegistry

ROOT = Path(__file__).resolve().parents[2]


def cli(*argv: str, url: str, **environ: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FDBQUEUE_URL": url, "PYTHONPATH": str(ROOT), **environ}
    return subprocess.run(
        [sys.executable, "-m", "fdbqueue", *argv],
        capture_output=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        text=True,
    )


def test_worker_tasks_runs_the_apps_tasks_in_a_process(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'tasks.db'}"
    db = fdbqueue.open(url)
    try:
        # The same task, as the app module registers it (its name is module.qualname).
        app = TaskRegistry(db)
        double = app.task(name="tests.support.task_app.double", queue="cli-tasks", store_result=True)(
            lambda n: 2 * n
        )
        ids = [double.defer(db, n) for n in range(5)]
    finally:
        db.close()
    r = cli("worker", "--tasks", "tests.support.task_app:app", "--until-empty", "--time-limit", "10", url=url)
    assert r.returncode == 0, r.stderr
    assert "worker stopped: processed 5" in r.stdout
    db = fdbqueue.open(url)
    try:
        assert [app.result(db, mid, timeout=1.0) for mid in ids] == [0, 2, 4, 6, 8]
    finally:
        db.close()


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--tasks", "no_colon_here"], "--tasks must look like module:app"),
        (["--tasks", "tests.support.no_such_module:app"], "no such module"),
        (["--tasks", "tests.support.task_app:missing"], "has no attribute 'missing'"),
        (["--tasks", "tests.support.task_app:not_an_app"], "not an fdbqueue.Tasks app"),
        (["q", "--tasks", "tests.support.task_app:app"], "give no queue names"),
        (["q"], "--handler MODULE:FUNCTION, or --tasks MODULE:APP"),
        (["--tasks", "tests.support.task_app:app", "--mode", "exactly-once"], "leave --mode out"),
        (
            ["--tasks", "tests.support.task_app:app", "--processes", "2", "--concurrency", "4"],
            "leave concurrency at 1",
        ),
    ],
)
def test_a_malformed_tasks_spec_exits_2(tmp_path: Path, argv: list[str], fragment: str) -> None:
    r = cli("worker", *argv, url=f"sqlite://{tmp_path / 'tasks.db'}")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert fragment in r.stderr and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_worker_tasks_passes_the_pool_options_on(tmp_path: Path) -> None:
    """``--max-tasks-per-child`` reaches the app's worker (a child per call here), and without
    ``--processes`` it is refused as for ``--handler``, not silently ignored."""
    url = f"sqlite://{tmp_path / 'tasks.db'}"
    db = fdbqueue.open(url)
    try:
        app = TaskRegistry(db)
        name = "tests.support.pool_tasks.pid_times"
        pid_times = app.task(name=name, queue="pool-tasks", store_result=True)(lambda n: [0, 2 * n])
        ids = [pid_times.defer(db, n) for n in range(3)]
    finally:
        db.close()
    tasks = ["worker", "--tasks", "tests.support.pool_tasks:app", "--url", url]
    r = cli(*tasks, "--max-tasks-per-child", "1", "--until-empty", url=url)
    assert r.returncode == 2 and "need processes > 0" in r.stderr, (r.stdout, r.stderr)
    r = cli(*tasks, "--processes", "1", "--max-tasks-per-child", "1", "--until-empty", url=url)
    assert r.returncode == 0, r.stderr
    assert "1 child process" in r.stderr and "worker stopped: processed 3" in r.stdout
    db = fdbqueue.open(url)
    try:
        results = [app.result(db, mid, timeout=1.0) for mid in ids]
    finally:
        db.close()
    assert [n for _, n in results] == [0, 2, 4]
    assert len({pid for pid, _ in results}) == 3  # a fresh child for each call


def test_worker_tasks_acts_as_the_principal_given(tmp_path: Path) -> None:
    """``fdbqueue --principal P worker --tasks mod:app``: the app's own database, as P (it
    acted as the app's principal, anonymous, and was refused the owner's queue)."""
    url = f"sqlite://{tmp_path / 'tasks.db'}"
    db = fdbqueue.open(url, principal="svc-a")
    try:
        fdbqueue.create_queue(db, "cli-tasks", owner="svc-a")
        app = TaskRegistry(db)
        double = app.task(name="tests.support.task_app.double", queue="cli-tasks", store_result=True)(
            lambda n: 2 * n
        )
        mid = double.defer(db, 21)
    finally:
        db.close()
    # The app module opens $FDBQUEUE_URL, here with no principal of its own.
    env = {"FDBQUEUE_PRINCIPAL": ""}
    r = cli(
        "--principal",
        "svc-a",
        "worker",
        "--tasks",
        "tests.support.task_app:app",
        "--until-empty",
        url=url,
        **env,
    )
    assert r.returncode == 0, r.stderr
    assert "worker stopped: processed 1" in r.stdout
    db = fdbqueue.open(url, principal="svc-a")
    try:
        assert app.result(db, mid, timeout=1.0) == 42
    finally:
        db.close()


def test_the_workers_first_line_counts_its_tasks_in_good_english(tmp_path: Path) -> None:
    r = cli(
        "worker",
        "--tasks",
        "tests.support.task_app:app",
        "--until-empty",
        url=f"sqlite://{tmp_path / 'one.db'}",
    )
    assert r.returncode == 0, r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith("fdbqueue worker: 1 task of tests.support.task_app:app on "), first
