"""``Worker(processes=N)``: handlers in real child processes, the parent leases and settles.

Each message's handler (tests/support/pool_handlers.py) writes ``start``/``done`` lines with
its process id to a log file named in the payload, so the tests see which child ran what.
Children are SIGKILLed mid-task, run past their time limit, replaced after a number of calls
or past a memory limit, and drained by SIGTERM: nothing is lost, and a message runs twice
only when its first child died (or was killed) before it answered.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue, Worker
from fdbqueue.cli.commands import main
from fdbqueue.errors import HandlerSignatureError, PoolStartError, QueueError
from tests.support import ROOT
from tests.support.pool_handlers import Unloadable, act
from tests.support.processes import assert_nothing_left, held, real_clock

pytestmark = pytest.mark.usefixtures(real_clock.__name__)


@pytest.fixture(params=["sqlite", "sim"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The embedded engine (a file the children could share), and the simulation: the
    children never touch the database, so an in-process engine serves a pool too."""
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal" if request.param == "sqlite" else "sim://?seed=7"
    d = fdbqueue.open(url)
    yield d
    d.close()


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Any]:
    d = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    yield d
    d.close()


def entries(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def done(log: Path) -> Counter[str]:
    """How many times each message's handler finished."""
    return Counter(e[2] for e in entries(log) if e[0] == "done")


def pids(log: Path) -> set[int]:
    return {int(e[1]) for e in entries(log)}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): a child the pool reaped is gone; a stray one is not.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_two_children_handle_every_message_exactly_once(db: Any, tmp_path: Path) -> None:
    log = tmp_path / "log"
    q = Queue("jobs")
    ids = q.enqueue_many(db, [{"log": str(log), "sleep": 0.01} for _ in range(30)])
    stats = Worker(db, "jobs", act, processes=2).run(until_empty=True)
    assert stats.processed == 30 and stats.failed == 0
    assert done(log) == Counter({i: 1 for i in ids})
    children = pids(log)
    assert os.getpid() not in children and 1 <= len(children) <= 2
    assert not any(alive(p) for p in children)  # ended with run()
    assert_nothing_left(db, "jobs")


def test_retry_discard_and_errors_cross_the_process_boundary(db: Any, tmp_path: Path) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=3, retry_delay=0)
    log = str(tmp_path / "log")
    q = Queue("jobs")
    retried, discarded, failing = q.enqueue_many(
        db, [{"log": log, "fail": "retry"}, {"log": log, "fail": "discard"}, {"log": log, "fail": "error"}]
    )
    stats = Worker(db, "jobs", act, processes=2, sweep_interval=0.1, idle_timeout=0.05).run(until_empty=True)
    assert done(tmp_path / "log") == Counter({retried: 1})
    assert (stats.processed, stats.retried, stats.discarded, stats.failed) == (1, 1, 1, 1 + 1 + 3)
    dead = {m.id: m for m in Queue("jobs.error").browse(db)}
    assert set(dead) == {discarded, failing}
    assert dead[discarded].reason == "no use" and dead[discarded].extra["deliveries"] == 1
    # The child's exception keeps its own type's name, as it does in a thread.
    assert dead[failing].reason == f"ValueError: cannot handle {failing}"
    assert dead[failing].extra["deliveries"] == 3


def test_the_store_failing_under_a_child_s_handler_is_not_the_message_s_fault(
    db: Any, tmp_path: Path
) -> None:
    """The handler's own use of a failing store (judged in the child): the message goes back
    uncounted and the worker backs off, as with a handler in a thread."""
    log = tmp_path / "log"
    mid = Queue("jobs").enqueue(db, {"log": str(log), "store_fails_once": str(tmp_path / "failed")})
    stats = Worker(db, "jobs", act, processes=1, idle_timeout=0.05).run(until_empty=True)
    assert (stats.processed, stats.failed, stats.released) == (1, 0, 1) and stats.backoffs >= 1
    assert [e[3] for e in entries(log) if e[0] == "start"] == ["1", "1"]  # not counted
    assert done(log) == Counter({mid: 1})


def test_a_child_killed_mid_task_loses_nothing(db: Any, tmp_path: Path) -> None:
    """SIGKILL the child running a message: the message is a failed delivery, handled again
    by the replacement, and every other message exactly once."""
    fdbqueue.create_queue(db, "jobs", retry_delay=0)
    log, gate = tmp_path / "log", tmp_path / "gate"
    q = Queue("jobs")
    victim = q.enqueue(db, {"log": str(log), "gate": str(gate)})  # waits for the gate (1st delivery)
    others = q.enqueue_many(db, [{"log": str(log), "sleep": 0.01} for _ in range(20)])
    killed: list[int] = []

    def killer() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for e in entries(log):
                if e[0] == "start" and e[2] == victim:
                    os.kill(int(e[1]), signal.SIGKILL)
                    killed.append(int(e[1]))
                    gate.touch()
                    return
            time.sleep(0.01)

    t = threading.Thread(target=killer)
    t.start()
    stats = Worker(db, "jobs", act, processes=2, sweep_interval=0.1, idle_timeout=0.05).run(until_empty=True)
    t.join()
    assert killed, "the victim never started"
    assert done(log) == Counter({i: 1 for i in [victim, *others]})
    victim_runs = [e for e in entries(log) if e[0] == "start" and e[2] == victim]
    assert int(victim_runs[0][1]) == killed[0] and len(victim_runs) == 2
    assert victim_runs[1][3] == "2"  # the death counted as a delivery
    assert int(victim_runs[1][1]) != killed[0]
    assert (stats.processed, stats.failed) == (21, 1)
    assert_nothing_left(db, "jobs")


def test_a_child_that_dies_without_a_time_limit_is_a_child_died_delivery(db: Any, tmp_path: Path) -> None:
    """A child killed holding a message, with no time limit set: the reason says the child
    died (its death seen on the pipe before its exit status is known is no time limit's)."""
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    log = tmp_path / "log"
    victims = Queue("jobs").enqueue_many(db, [{"log": str(log), "die": True} for _ in range(4)])
    stats = Worker(db, "jobs", act, processes=2).run(until_empty=True)
    assert (stats.failed, stats.timed_out) == (4, 0)
    dead = {m.id: m.reason or "" for m in Queue("jobs.error").browse(db)}
    assert set(dead) == set(victims)
    assert all(r.startswith("ChildDied: the worker's child process") for r in dead.values()), dead


def test_time_limit_kills_the_child_then_dead_letters(db: Any, tmp_path: Path) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=2, retry_delay=0)
    log = tmp_path / "log"
    q = Queue("jobs")
    hung = q.enqueue(db, {"log": str(log), "hang": True})
    quick = q.enqueue_many(db, [{"log": str(log)} for _ in range(4)])
    w = Worker(db, "jobs", act, processes=2, time_limit=1.0, sweep_interval=0.1, idle_timeout=0.05)
    stats = w.run(until_empty=True)
    assert (stats.processed, stats.failed, stats.timed_out) == (4, 2, 2)
    assert done(log) == Counter({i: 1 for i in quick})
    hung_pids = [int(e[1]) for e in entries(log) if e[0] == "start" and e[2] == hung]
    assert len(hung_pids) == 2 and not any(alive(p) for p in hung_pids)  # killed, not abandoned
    dead = list(Queue("jobs.error").browse(db))
    assert [m.id for m in dead] == [hung]
    assert dead[0].reason == "time_limit: the handler ran past 1 s" and dead[0].extra["deliveries"] == 2


def test_max_tasks_per_child_replaces_children(sqlite_db: Any, tmp_path: Path) -> None:
    log = tmp_path / "log"
    ids = Queue("jobs").enqueue_many(sqlite_db, [{"log": str(log)} for _ in range(9)])
    stats = Worker(sqlite_db, "jobs", act, processes=2, max_tasks_per_child=2).run(until_empty=True)
    assert stats.processed == 9 and done(log) == Counter({i: 1 for i in ids})
    per_child = Counter(int(e[1]) for e in entries(log) if e[0] == "done")
    assert max(per_child.values()) <= 2 and len(per_child) >= 5


def test_max_memory_per_child_replaces_a_child_past_it(sqlite_db: Any, tmp_path: Path) -> None:
    log = tmp_path / "log"
    q = Queue("jobs")
    small = q.enqueue_many(sqlite_db, [{"log": str(log)} for _ in range(3)])
    big = q.enqueue(sqlite_db, {"log": str(log), "ballast": 200})  # kept alive in the child
    more = q.enqueue_many(sqlite_db, [{"log": str(log)} for _ in range(3)])
    w = Worker(sqlite_db, "jobs", act, processes=1, max_memory_per_child="150MiB")
    assert w.run(until_empty=True).processed == 7
    ran = [(int(e[1]), e[2]) for e in entries(log) if e[0] == "done"]
    assert [i for _, i in ran] == [*small, big, *more]  # one child: in order
    assert len({p for p, _ in ran[:4]}) == 1  # the same child until the big one
    assert ran[4][0] != ran[3][0] and len({p for p, _ in ran[4:]}) == 1  # then a new one, kept


def test_a_handler_the_children_cannot_load_stops_run_before_any_lease(sqlite_db: Any) -> None:
    q = Queue("jobs")
    mid = q.enqueue(sqlite_db, "x")
    with pytest.raises(PoolStartError, match="cannot load the handler: RuntimeError: not in a child"):
        Worker(sqlite_db, "jobs", Unloadable(), processes=2).run(until_empty=True)
    assert [m.id for m in q.browse(sqlite_db)] == [mid] and held(sqlite_db, q) == (1, 0, 0)


def test_bad_pool_settings_are_refused_at_construction(sqlite_db: Any) -> None:
    with pytest.raises(HandlerSignatureError, match=r"must be picklable.*<lambda>"):
        Worker(sqlite_db, "jobs", lambda m: None, processes=2)

    def local(m: Any) -> None: ...

    with pytest.raises(HandlerSignatureError, match="must be picklable"):
        Worker(sqlite_db, "jobs", local, processes=1)
    with pytest.raises(QueueError, match="cannot join the worker's transaction"):
        Worker(sqlite_db, "jobs", lambda tr, m: None, mode="exactly_once", processes=2)
    for bad in (-1, "2", True, 1.5):
        with pytest.raises(QueueError, match="processes must be an int >= 0"):
            Worker(sqlite_db, "jobs", act, processes=bad)  # type: ignore[arg-type]
    with pytest.raises(QueueError, match="leave concurrency at 1"):
        Worker(sqlite_db, "jobs", act, processes=2, concurrency=3)
    with pytest.raises(QueueError, match="max_tasks_per_child must be an int >= 1"):
        Worker(sqlite_db, "jobs", act, processes=2, max_tasks_per_child=0)
    for memory in ("lots", "12 parsecs", 0, -5, 1.5):
        with pytest.raises(QueueError, match="max_memory_per_child"):
            Worker(sqlite_db, "jobs", act, processes=2, max_memory_per_child=memory)  # type: ignore[arg-type]
    with pytest.raises(QueueError, match="need processes > 0"):
        Worker(sqlite_db, "jobs", act, max_tasks_per_child=5)
    w = Worker(sqlite_db, "jobs", act, processes=2, max_memory_per_child="1.5GiB", max_tasks_per_child=10)
    assert w.concurrency == 2 and w._pool_settings is not None
    assert w._pool_settings.max_memory == 1.5 * 2**30


# -- the command line, in real worker processes ---------------------------------------------


def cli(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "fdbqueue", "--url", url, "worker", "jobs", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_cli_processes_runs_the_handler_in_children(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    log = tmp_path / "log"
    ids = Queue("jobs").enqueue_many(db, [json.dumps({"log": str(log)}) for _ in range(10)])
    db.close()
    handler = "tests.support.pool_handlers:record"
    proc = subprocess.Popen(
        cli(url, "--handler", handler, "--processes", "2", "--until-empty", "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "2 child processes" in err and json.loads(out)["processed"] == 10
    seen = [line.split() for line in log.read_text().splitlines()]
    assert sorted(i for _, i in seen) == sorted(ids)
    children = {int(p) for p, _ in seen}
    assert proc.pid not in children and 1 <= len(children) <= 2


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (["--processes", "-1"], "--processes: expected a whole number >= 0"),
        (["--processes", "two"], "--processes: expected a whole number >= 0"),
        (["--max-tasks-per-child", "0"], "--max-tasks-per-child: expected a whole number >= 1"),
        (["--max-memory-per-child", "lots"], "--max-memory-per-child: expected bytes or a size"),
        (["--time-limit", "0", "--processes", "2"], "time_limit must be > 0"),
        (["--max-tasks-per-child", "3"], "need processes > 0"),
        (["--processes", "2", "--concurrency", "4"], "leave concurrency at 1"),
        (
            [
                "--mode",
                "exactly-once",
                "--handler",
                "tests.support.cli_handlers:in_transaction",
                "--processes",
                "2",
            ],
            "cannot join the worker's transaction",
        ),
    ],
)
def test_cli_refuses_malformed_pool_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: list[str], said: str
) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}"
    args = ["--url", url, "worker", "jobs", "--handler", "tests.support.pool_handlers:record", *bad]
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # the command sets up the worker's logging
    try:
        assert main(args) == 2
    finally:
        root.handlers[:], root.level = handlers, level
    assert said in capsys.readouterr().err


def test_sigterm_drains_a_worker_with_children(tmp_path: Path) -> None:
    """SIGTERM: leasing stops, the messages in the children finish and are acked, the rest
    go back (not counted), the children end; nothing is lost or left leased."""
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    log = tmp_path / "log"
    q = Queue("jobs")
    ids = q.enqueue_many(db, [{"log": str(log), "sleep": 1.5} for _ in range(8)])
    proc = subprocess.Popen(
        cli(url, "--handler", "tests.support.pool_handlers:act", "--processes", "2", "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while sum(e[0] == "start" for e in entries(log)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        started = {e[2] for e in entries(log) if e[0] == "start"}
        assert len(started) == 2, proc.stderr.read() if proc.poll() is not None else "no start"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    finished = done(log)
    assert set(finished) == {e[2] for e in entries(log) if e[0] == "start"} >= started
    assert all(n == 1 for n in finished.values())
    assert json.loads(out)["processed"] == len(finished)
    assert not any(alive(p) for p in pids(log))
    assert held(db, q) == (len(ids) - len(finished), 0, 0)  # the rest ready, none leased
    assert {m.id for m in q.browse(db)} == set(ids) - set(finished)
    assert all(m.deliveries == 0 for m in q.browse(db))  # released, not counted
    db.close()


def test_children_end_when_their_worker_is_killed(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    log = tmp_path / "log"
    Queue("jobs").enqueue_many(db, [{"log": str(log), "hang": True} for _ in range(2)])
    db.close()
    proc = subprocess.Popen(
        cli(url, "--handler", "tests.support.pool_handlers:act", "--processes", "2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env(),
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while len(pids(log)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        children = pids(log)
        assert len(children) == 2 and all(alive(p) for p in children)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while any(alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in children)


@pytest.mark.parametrize(
    "slots",
    [["--processes", "2"], ["--processes", "1"], ["--concurrency", "2"]],
    ids=["processes", "one-process", "threads"],
)
def test_past_the_shutdown_timeout_children_are_killed_and_messages_released(
    tmp_path: Path, slots: list[str]
) -> None:
    """Stopped at once (the grace after SIGTERM ran out): the children running hung handlers
    are killed and their messages go back uncounted, and so do the prefetched ones (threads
    too: a stop at once while the worker waited for its handlers left those leased); the
    worker exits cleanly."""
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    log = tmp_path / "log"
    q = Queue("jobs")
    ids = q.enqueue_many(db, [{"log": str(log), "hang": True} for _ in range(4)])
    proc = subprocess.Popen(
        cli(url, "--handler", "tests.support.pool_handlers:act", *slots, "--shutdown-timeout", "0.5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        running = int(slots[1])  # handlers in hand at once
        while len(entries(log)) < running and time.monotonic() < deadline:
            time.sleep(0.02)
        children = pids(log)
        assert len(entries(log)) == running, proc.stderr.read() if proc.poll() is not None else "no start"
        time.sleep(0.2)  # the others prefetched meanwhile
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "stopped at once" in err, err
    assert not any(alive(p) for p in children)
    assert done(log) == Counter()
    assert held(db, q) == (4, 0, 0), err
    assert {m.id: m.deliveries for m in q.browse(db)} == dict.fromkeys(ids, 0)
    db.close()


SCRIPT_TASKS = """
import os, sys, fdbqueue
app = fdbqueue.Tasks(sys.argv[1])

@app.task(store_result=True)
def pid_times(n):
    return [os.getpid(), 2 * n]

if __name__ == "__main__":
    ids = [pid_times.defer(app.db, n) for n in range(3)]
    app.worker(processes=2).run(until_empty=True)
    results = [app.result(app.db, mid, timeout=10) for mid in ids]
    assert [n for _, n in results] == [0, 2, 4], results
    assert os.getpid() not in {p for p, _ in results}, results
    print("ok")
"""


def test_a_scripts_own_tasks_run_in_a_process_pool(tmp_path: Path) -> None:
    """Tasks of a script with the ``__main__`` guard, as for a Worker's handler: a child
    imports the script as ``__mp_main__``, and its tasks keep their ``__main__`` names (every
    one was dead-lettered as an unknown task)."""
    script = tmp_path / "script_tasks.py"
    script.write_text(SCRIPT_TASKS)
    r = subprocess.run(
        [sys.executable, str(script), f"sqlite://{tmp_path / 'q.db'}?sync=normal"],
        capture_output=True,
        env=env(),
        timeout=120,
        text=True,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
