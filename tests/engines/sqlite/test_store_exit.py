"""The last process to leave an embedded store leaves only the store's files behind.

A process that had waited on a watch (a blocking dequeue, an idle worker) and exited without
``db.close()`` left a 4.5 MB ``-wal``, the ``-shm`` and ``-notify/``: its watch thread kept
the store's read connection open, so SQLite's last close never ran. Each process now closes
its handles at interpreter exit; the last one's close checkpoints and removes the WAL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fdbqueue.engines.sqlite.notify import notify_dir_for
from tests.support import ROOT

KEPT = ["q.db", "q.db-lock"]  # what a closed store is (README: "A store is the file ...")

BLOCKING_DEQUEUE = """
import sys, fdbqueue
db = fdbqueue.open("sqlite://" + sys.argv[1])
q = fdbqueue.Queue("jobs")
q.enqueue(db, b"x")
assert q.dequeue(db, timeout=0.2) is not None
assert q.dequeue(db, timeout=0.3) is None  # waits on the queue's watch
"""

IDLE_WORKER = """
import sys, fdbqueue
db = fdbqueue.open("sqlite://" + sys.argv[1])
fdbqueue.Queue("jobs").enqueue_many(db, [b"a", b"b", b"c"])
stats = fdbqueue.Worker(db, "jobs", lambda m: None, concurrency=2, idle_timeout=0.05).run(until_empty=True)
assert stats.processed == 3
"""

WAIT_FOR_FILE = """
import os, sys, time, fdbqueue
db = fdbqueue.open("sqlite://" + sys.argv[1])
fdbqueue.Queue("jobs").dequeue(db, timeout=0.1)  # a watch: the notify folder exists
open(sys.argv[2] + ".ready", "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.02)
"""


def run(script: str, *args: str) -> None:
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args], cwd=ROOT, capture_output=True, timeout=60
    )
    assert r.returncode == 0, r.stderr.decode()


def files(folder: Path) -> list[str]:
    """The store's files, its notify folder included (in the temp dir for a long path)."""
    notify = Path(notify_dir_for(os.path.realpath(folder / "q.db")))
    return sorted([p.name for p in folder.iterdir()] + (["q.db-notify"] if notify.exists() else []))


def test_a_process_that_waited_on_a_watch_leaves_only_the_store(tmp_path: Path) -> None:
    run(BLOCKING_DEQUEUE, str(tmp_path / "q.db"))
    assert files(tmp_path) == KEPT


def test_a_worker_process_that_exits_without_close_leaves_only_the_store(tmp_path: Path) -> None:
    run(IDLE_WORKER, str(tmp_path / "q.db"))
    assert files(tmp_path) == KEPT


def test_the_last_of_two_processes_removes_what_the_open_store_needed(tmp_path: Path) -> None:
    store, go = tmp_path / "q.db", tmp_path / "go"
    other = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WAIT_FOR_FILE), str(store), str(go)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        ready = tmp_path / "go.ready"
        for _ in range(1500):
            if ready.exists() or other.poll() is not None:
                break
            subprocess.run(["sleep", "0.02"])
        assert ready.exists()
        ready.unlink()
        run(BLOCKING_DEQUEUE, str(store))  # exits while the other still has the store open
        left = files(tmp_path)
        assert "q.db-wal" in left and "q.db-notify" in left  # still in use: kept
        go.touch()
        assert other.wait(30) == 0, other.stderr.read().decode() if other.stderr else ""
    finally:
        if other.poll() is None:
            other.kill()
    go.unlink()
    assert files(tmp_path) == KEPT


# A daemon thread of the program's still waits on the store when the interpreter exits. The
# close at exit woke its watch with operation_cancelled (1101), which the thread's code let
# escape: a full traceback as the program ended. Python stops daemon threads where they
# stand at exit, and so does the store: the thread stays where it waits, and nothing prints.
DAEMON_WAITERS = {
    "a blocking dequeue": "q.dequeue(db, timeout=5.0)",
    "a dequeue without timeout": "q.dequeue(db)",
    "dequeues in a loop": "while True: q.dequeue(db, timeout=0.01)",
    "an idle worker": "fdbqueue.Worker(db, 'jobs', lambda m: None, idle_timeout=0.01).run()",
}
DAEMON_WAITING = """
import sys, threading, time, fdbqueue
db = fdbqueue.open("sqlite://" + sys.argv[1])
q = fdbqueue.Queue("jobs")
def consume():
    {code}
threading.Thread(target=consume, daemon=True).start()
time.sleep(0.3)
print("exiting")
"""


@pytest.mark.parametrize("waiter", DAEMON_WAITERS.values(), ids=list(DAEMON_WAITERS))
def test_a_daemon_thread_waiting_at_exit_ends_quietly(tmp_path: Path, waiter: str) -> None:
    for _ in range(2):  # the thread runs in the window between the close and the end: twice
        r = subprocess.run(
            [sys.executable, "-c", DAEMON_WAITING.format(code=waiter), str(tmp_path / "q.db")],
            cwd=ROOT,
            capture_output=True,
            timeout=60,
        )
        assert (r.returncode, r.stdout, r.stderr.decode()) == (0, b"exiting\n", "")
    assert files(tmp_path) == KEPT  # and the store was closed at exit all the same
