"""The embedded engine on a full disk, made for real: a small tmpfs mounted for the test.

Each test runs a fresh interpreter inside ``unshare --mount`` with a tmpfs of a few MB
mounted on a folder of ``tmp_path`` (skipped, with the reason, where no such mount can be
made). The program prints one line of JSON as its last line: what it saw. A step that could
kill its process (SIGBUS) runs in a grandchild of its own, whose exit status is reported.

Every test but the reserve's own opens the store with ``reserve=0`` (the free-space reserve
off): they fill the disk to where SQLite itself fails, which the reserve would otherwise
stop producers short of.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT

# Shared by the programs below: fill the file system until `left` bytes stay free.
PRELUDE = r"""
import json, os, subprocess, sys

DIR = sys.argv[1]
URL = "sqlite://" + os.path.join(DIR, "q.db")


def free():
    st = os.statvfs(DIR)
    return st.f_bavail * st.f_frsize


def fill(left, name="filler"):
    # Fill in pages, then give back what `left` asks for.
    path = os.path.join(DIR, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    chunk = bytes(4096)
    try:
        while os.write(fd, chunk) > 0:
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    size = os.path.getsize(path)
    os.truncate(path, max(0, size - left))
    return path


def run(code, *args):
    # A step that may die of a signal: its exit status and stderr's last line.
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    lines = done.stderr.strip().splitlines()
    return {"rc": done.returncode, "out": done.stdout.strip(), "err": lines[-1] if lines else ""}
"""


OPEN_AND_WRITE = r"""
import sys, fdbqueue
try:
    db = fdbqueue.open(sys.argv[1])
    fdbqueue.create_queue(db, "jobs")
    fdbqueue.Queue("jobs").enqueue(db, b"x")
    db.close()
except fdbqueue.QueueError as exc:
    print(type(exc).__name__, exc, file=sys.stderr)
    sys.exit(3)
print("ok")
"""


def on_tmpfs(tmp_path: Path, size: str, program: str) -> dict[str, Any]:
    """Run ``PRELUDE + program`` with a tmpfs of ``size`` mounted at ``tmp_path/m``."""
    mount = tmp_path / "m"
    mount.mkdir()
    shell = f'mount -t tmpfs -o size={size} tmpfs "$1" && shift && exec "$@"'
    prefix = ["unshare", "--mount", "sh", "-c", shell, "sh", str(mount)]
    try:
        probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    except OSError as exc:
        pytest.skip(f"cannot run unshare here: {exc}")
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root, or a user namespace): {probe.stderr.strip()}")
    done = subprocess.run(
        [
            *prefix,
            sys.executable,
            "-c",
            f"{PRELUDE}\nOPEN_AND_WRITE = {OPEN_AND_WRITE!r}\n{program}",
            str(mount),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_missing_lock_file_on_a_full_disk_is_a_clear_error_not_a_sigbus(tmp_path: Path) -> None:
    """The lock page is mapped and written by every process: on a file system with no page
    left for it, a write into the mapping is SIGBUS. It is allocated before it is mapped."""
    result = on_tmpfs(
        tmp_path,
        "3m",
        r"""
import fdbqueue
db = fdbqueue.open(URL + "?sync=normal&reserve=0")
fdbqueue.create_queue(db, "jobs")
db.close()
os.unlink(os.path.join(DIR, "q.db-lock"))
filler = fill(0)
full = run(OPEN_AND_WRITE, URL + "?sync=normal&reserve=0")
full_again = run(OPEN_AND_WRITE, URL + "?sync=normal&reserve=0")
os.unlink(filler)
freed = run(OPEN_AND_WRITE, URL + "?sync=normal&reserve=0")
print(json.dumps({"full": full, "full_again": full_again, "freed": freed}))
""",
    )
    for step in ("full", "full_again"):
        seen = result[step]
        assert seen["rc"] == 3, seen  # a StoreError, not a signal (SIGBUS: -7)
        assert seen["err"].startswith("StoreError"), seen
        assert "no space left on the device holding" in seen["err"] and "q.db-lock" in seen["err"], seen
    assert result["freed"] == {"rc": 0, "out": "ok", "err": ""}, result["freed"]


def test_a_missing_lock_file_with_40_kb_free_opens(tmp_path: Path) -> None:
    """What the user met: ~40 kB free, no lock file. The open must not spend the page the
    lock file needs (nor die writing into it), run after run."""
    result = on_tmpfs(
        tmp_path,
        "8m",
        r"""
import fdbqueue
db = fdbqueue.open(URL + "?reserve=0")
fdbqueue.create_queue(db, "jobs")
db.close()
os.unlink(os.path.join(DIR, "q.db-lock"))
filler = fill(40 * 1024)
runs = [run(OPEN_AND_WRITE, URL + "?reserve=0") for _ in range(3)]
os.unlink(filler)
print(json.dumps({"runs": runs}))
""",
    )
    for seen in result["runs"]:
        assert seen["rc"] in (0, 3), seen  # enqueued, or a clear StoreError: never a signal
        assert seen["rc"] == 0 or "StoreError" in seen["err"], seen


def test_opening_a_store_leaves_room_on_a_nearly_full_disk(tmp_path: Path) -> None:
    """The sync=full WAL is zero-filled to its working size (~4.5 MB) at open, a speed-up
    only: with 2 MB free it is skipped, and the open works."""
    result = on_tmpfs(
        tmp_path,
        "16m",
        r"""
import fdbqueue
db = fdbqueue.open(URL + "?reserve=0")
fdbqueue.create_queue(db, "jobs")
db.close()
fill(2 * 1024 * 1024)
before = free()
db = fdbqueue.open(URL + "?reserve=0")
after = free()
fdbqueue.Queue("jobs").enqueue(db, b"x")
db.close()
print(json.dumps({"before": before, "after": after}))
""",
    )
    assert result["after"] >= result["before"] - 256 * 1024, result  # not the zero-fill's 4.5 MB


def test_a_full_disk_refuses_writes_clearly_and_loses_nothing(tmp_path: Path) -> None:
    """Producers fill the disk until an enqueue fails; then consumers dequeue, lease and
    ack while it is full. Every step either works or raises a StoreError naming the full
    disk (never another error, never a crash); once space is freed, the store passes
    SQLite's integrity check, every acknowledged enqueue is delivered exactly once, and
    producers and consumers work again."""
    result = on_tmpfs(
        tmp_path,
        "32m",
        r"""
import sqlite3, fdbqueue
from fdbqueue import Queue, StoreError
db = fdbqueue.open(URL + "?reserve=0")
fdbqueue.create_queue(db, "jobs")
q = Queue("jobs")
for k in range(2000):  # some history: pages freed inside the database
    q.enqueue(db, b"old%06d" % k + bytes(1000))
for k in range(1500):
    q.dequeue(db)
filler = fill(512 * 1024)
acked, errors, other = [], [], []
i = 0
while len(errors) < 5:
    try:
        q.enqueue(db, b"new%06d" % i + bytes(1000))
        acked.append(i)
    except StoreError as exc:
        errors.append(str(exc))
    except Exception as exc:
        other.append(repr(exc))
        break
    i += 1
got, drained, refused = [], 0, []
for j in range(200):
    try:
        m = q.dequeue(db)
        if m is None:
            break
        got.append(m.payload[:9].decode())
        drained += 1
    except StoreError as exc:
        refused.append(str(exc))
    except Exception as exc:
        other.append(repr(exc))
for j in range(20):
    try:
        m = q.lease(db, 60)
        if m is None:
            break
        q.ack(db, m)
        got.append(m.payload[:9].decode())
    except StoreError as exc:
        refused.append(str(exc))
    except Exception as exc:
        other.append(repr(exc))
os.unlink(filler)
q.enqueue(db, b"after")
while True:
    m = q.dequeue(db)
    if m is None:
        break
    got.append(m.payload[:9].decode())
db.close()
conn = sqlite3.connect(os.path.join(DIR, "q.db"))
check = conn.execute("PRAGMA integrity_check").fetchall()
conn.close()
print(json.dumps({
    "acked": len(acked), "errors": errors[:2], "other": other, "refused": refused[:2],
    "drained": drained, "check": check,
    "want": ["old%06d" % k for k in range(1500, 2000)] + ["new%06d" % k for k in acked] + ["after"],
    "got": got,
}))
""",
    )
    assert result["other"] == [], result["other"]
    assert result["acked"] > 0 and len(result["errors"]) > 0
    for message in result["errors"] + result["refused"]:
        assert "no space left on the device holding" in message and "q.db" in message, message
        assert "not committed" in message, message
    assert result["check"] == [["ok"]], result["check"]
    assert sorted(result["got"]) == sorted(result["want"])  # nothing lost, nothing twice


def test_below_the_reserve_producers_are_refused_and_consumers_drain_without_error(tmp_path: Path) -> None:
    """Issue 13 item 5: consumers must be able to drain a full disk. Another program fills
    the disk until less than the reserve (the default, 16 MB) stays free: every producer is
    refused before it writes, with a StoreFullError naming the reserve, while exactly-once
    dequeues, lease + ack, and nack then redelivery drain every message with no error at
    all; once space is freed producers work again. Nothing lost, nothing twice, and SQLite's
    integrity check passes."""
    result = on_tmpfs(
        tmp_path,
        "48m",
        r"""
import sqlite3, fdbqueue
from fdbqueue import Queue, QueueError, StoreFullError
db = fdbqueue.open(URL)
fdbqueue.create_queue(db, "jobs")
q = Queue("jobs")
for k in range(600):
    q.enqueue(db, b"old%06d" % k + bytes(1000))
filler = fill(6 * 1024 * 1024)  # 6 MB free: below the reserve, far from empty
free_before = free()
refused, other = [], []
producers = [
    lambda: q.enqueue(db, b"new" + bytes(1000)),
    lambda: q.enqueue_many(db, [b"new" + bytes(1000)] * 3),
    lambda: q.enqueue(db, b"new", timeout=1),
    lambda: fdbqueue.transactional(lambda tr: q.enqueue(tr, b"new", autonomous=True))(db),
]
for produce in producers:
    try:
        produce()
        other.append("an enqueue was not refused")
    except StoreFullError as exc:
        refused.append(str(exc))
    except Exception as exc:
        other.append(repr(exc))
size_after_refusals = q.size(db)
got, errors = [], []
try:
    for j in range(200):
        m = q.dequeue(db)
        got.append(m.payload[:9].decode())
    for j in range(200):
        m = q.lease(db, 60)
        q.ack(db, m)
        got.append(m.payload[:9].decode())
    for j in range(50):  # nack, then the same message is delivered again
        m = q.lease(db, 60)
        q.nack(db, m, delay=0)
        again = q.lease(db, 60)
        if again.id != m.id:
            errors.append("not redelivered: %s" % m.id)
        q.ack(db, again)
        got.append(again.payload[:9].decode())
    while (m := q.lease(db, 60)) is not None:
        q.ack(db, m)
        got.append(m.payload[:9].decode())
    q.sweep(db)
except Exception as exc:
    errors.append(repr(exc))
os.unlink(filler)
q.enqueue(db, b"after")
got.append(q.dequeue(db).payload.decode())
db.close()
conn = sqlite3.connect(os.path.join(DIR, "q.db"))
check = conn.execute("PRAGMA integrity_check").fetchall()
conn.close()
print(json.dumps({
    "free_before": free_before, "refused": refused, "other": other,
    "size_after_refusals": size_after_refusals, "errors": errors, "check": check,
    "want": ["old%06d" % k for k in range(600)] + ["after"], "got": got,
}))
""",
    )
    assert 0 < result["free_before"] < 16 * 1024 * 1024, result["free_before"]
    assert result["other"] == [], result["other"]
    assert len(result["refused"]) == 4
    for message in result["refused"]:
        assert "q.db" in message and "MB free, below the reserve of 16 MB" in message, message
        assert "nothing was enqueued" in message and "reserve=" in message, message
    assert result["size_after_refusals"] == 600  # the refusals wrote nothing
    assert result["errors"] == [], result["errors"]  # every consumer drained, no error at all
    assert result["check"] == [["ok"]], result["check"]
    assert sorted(result["got"]) == sorted(result["want"])  # nothing lost, nothing twice


def test_producers_that_fill_the_disk_stop_at_the_reserve_and_consumers_drain_it_all(tmp_path: Path) -> None:
    """The issue's own scenario: producers fill the disk until an enqueue is refused. With
    the reserve, that refusal is a StoreFullError while the reserve's space is still free,
    and consumers then drain every message - exactly-once and lease + ack - with no error."""
    result = on_tmpfs(
        tmp_path,
        "48m",
        r"""
import sqlite3, fdbqueue
from fdbqueue import Queue, StoreFullError
db = fdbqueue.open(URL)
fdbqueue.create_queue(db, "jobs")
q = Queue("jobs")
filler = fill(20 * 1024 * 1024)  # 20 MB free: producers have ~4 MB before the reserve
acked, other, refused = [], [], []
i = 0
while not refused:
    try:
        q.enqueue(db, b"new%06d" % i + bytes(1000))
        acked.append(i)
    except StoreFullError as exc:
        refused.append(str(exc))
    except Exception as exc:
        other.append(repr(exc))
        break
    i += 1
free_at_refusal = free()
got, errors = [], []
try:
    while (m := q.dequeue(db)) is not None:
        got.append(m.payload[:9].decode())
        if (m := q.lease(db, 60)) is not None:
            q.ack(db, m)
            got.append(m.payload[:9].decode())
except Exception as exc:
    errors.append(repr(exc))
free_drained = free()
os.unlink(filler)
db.close()
conn = sqlite3.connect(os.path.join(DIR, "q.db"))
check = conn.execute("PRAGMA integrity_check").fetchall()
conn.close()
print(json.dumps({
    "acked": len(acked), "refused": refused, "other": other, "errors": errors,
    "free_at_refusal": free_at_refusal, "free_drained": free_drained, "check": check,
    "want": ["new%06d" % k for k in acked], "got": got,
}))
""",
    )
    assert result["other"] == [], result["other"]
    assert result["acked"] > 100 and len(result["refused"]) == 1, result["acked"]
    assert "below the reserve of 16 MB" in result["refused"][0], result["refused"]
    assert 15 * 1024 * 1024 < result["free_at_refusal"] < 16 * 1024 * 1024, result["free_at_refusal"]
    assert result["errors"] == [], result["errors"]  # the consumers drained it all
    assert result["free_drained"] > 0
    assert result["check"] == [["ok"]], result["check"]
    assert sorted(result["got"]) == sorted(result["want"])  # nothing lost, nothing twice
