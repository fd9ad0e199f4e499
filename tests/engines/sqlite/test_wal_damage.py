"""A damaged or truncated WAL must not silently drop acknowledged commits (issue 13, item 3).

SQLite's WAL recovery keeps the frames before the first one whose salt or checksum is wrong
and ignores every later one without an error (https://www.sqlite.org/fileformat.html#the_write_ahead_log).
A child process enqueues messages at sync=full (each enqueue returned: acknowledged) and is
SIGKILLed, so that the WAL stays as it was; the test damages the WAL and opens the store again.
Detection covers a crash on a running machine (the same boot): see fdbqueue/engines/sqlite/walcheck.py.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import StoreError

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the first-open check needs Linux's OFD locks and boot id"
)

_CHILD = (
    "import os, signal, sys, fdbqueue\n"
    "db = fdbqueue.open(sys.argv[1])\n"
    "jobs = fdbqueue.Queue('jobs')\n"
    "for i in range(int(sys.argv[2])):\n"
    "    jobs.enqueue(db, {'i': i})\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n"
)
_HOLDER = (
    "import sys, fdbqueue\n"
    "db = fdbqueue.open(sys.argv[1])\n"
    "fdbqueue.Queue('jobs').enqueue(db, {'i': -1})\n"
    "print('open', flush=True)\n"
    "sys.stdin.readline()\n"
    "db.close()\n"
)


def enqueue_then_sigkill(url: str, n: int) -> None:
    """A real process enqueues ``n`` messages, one commit each, then dies by SIGKILL."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, url, str(n)], timeout=120)
    assert proc.returncode == -9


def valid_frames(wal: str) -> tuple[int, int]:
    """(frames carrying the WAL header's salts, from the first; page size) of a WAL file."""
    with open(wal, "rb") as f:
        data = f.read()
    assert len(data) > 32, "the WAL was checkpointed away: nothing to damage"
    page = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    n = 0
    while 32 + (n + 1) * (24 + page) <= len(data):
        at = 32 + n * (24 + page)  # a frame: page number, size after commit, salts, checksums
        if data[at + 8 : at + 16] != salts:
            break
        n += 1
    return n, page


def ready(url: str) -> int:
    db = fdbqueue.open(url)
    try:
        return fdbqueue.queue_stats(db, "jobs").ready
    finally:
        db.close()


def payloads(url: str) -> list[int]:
    db = fdbqueue.open(url)
    jobs = fdbqueue.Queue("jobs")
    try:
        out = []
        while (m := jobs.dequeue(db)) is not None:
            out.append(m.json()["i"])
        return out
    finally:
        db.close()


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, str]:
    path = str(tmp_path / "q.db")
    return f"sqlite://{path}", path


N = 120


def damage_is_refused(url: str, path: str) -> None:
    """Opening refuses, names the damage, keeps the WAL; removing it accepts the loss."""
    for _ in range(2):  # and again: refused while the damaged WAL is kept
        with pytest.raises(StoreError) as raised:
            fdbqueue.open(url)
        text = str(raised.value)
        assert "WAL" in text and path + "-wal.damaged" in text, text
        assert os.path.exists(path + "-wal.damaged")
    os.unlink(path + "-wal.damaged")
    got = payloads(url)
    assert got == list(range(len(got))), "the store holds a prefix of the commits"
    assert len(got) < N


def test_a_flipped_bit_in_the_wal_is_refused_not_silently_dropping_commits(store: tuple[str, str]) -> None:
    url, path = store
    enqueue_then_sigkill(url, N)
    frames, page = valid_frames(path + "-wal")
    assert frames > 20
    at = 32 + (frames // 2) * (24 + page) + 24 + 100
    with open(path + "-wal", "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))
    with open(path + "-wal", "rb") as f:
        before = f.read()
    with pytest.raises(StoreError, match=r"kept \d+ of the \d+ WAL frames"):
        fdbqueue.open(url)
    with open(path + "-wal.damaged", "rb") as f:
        assert f.read() == before  # the evidence, as found: every frame after the damage too
    damage_is_refused(url, path)


def test_a_wal_truncated_in_the_middle_is_refused(store: tuple[str, str]) -> None:
    url, path = store
    enqueue_then_sigkill(url, N)
    frames, page = valid_frames(path + "-wal")
    os.truncate(path + "-wal", 32 + (frames // 2) * (24 + page) + 10)
    damage_is_refused(url, path)


def test_a_wal_truncated_to_nothing_is_refused(store: tuple[str, str]) -> None:
    url, path = store
    enqueue_then_sigkill(url, N)
    valid_frames(path + "-wal")
    os.truncate(path + "-wal", 0)
    damage_is_refused(url, path)


def test_an_intact_wal_after_sigkill_opens_with_every_commit(store: tuple[str, str]) -> None:
    url, path = store
    enqueue_then_sigkill(url, N)
    assert valid_frames(path + "-wal")[0] > 20
    assert payloads(url) == list(range(N))
    assert not os.path.exists(path + "-wal.damaged")
    assert not os.path.exists(path + "-wal.at-open")


def test_repeated_sigkills_and_wal_restarts_raise_no_false_alarm(store: tuple[str, str]) -> None:
    """Enough commits that SQLite checkpoints and restarts the WAL (new salts) between kills."""
    url, _ = store
    for round_ in range(4):
        enqueue_then_sigkill(url, 400)
        assert ready(url) == 400 * (round_ + 1)


def test_sync_normal_after_sigkill_opens_with_every_commit(store: tuple[str, str]) -> None:
    url, _ = store
    url += "?sync=normal"
    enqueue_then_sigkill(url, N)
    assert payloads(url) == list(range(N))


def test_sync_normal_damage_is_refused_too(store: tuple[str, str]) -> None:
    url, path = store
    url += "?sync=normal"
    enqueue_then_sigkill(url, N)
    frames, page = valid_frames(path + "-wal")
    os.truncate(path + "-wal", 32 + (frames // 2) * (24 + page))
    damage_is_refused(url, path)


def test_clean_closes_and_reopens_raise_no_false_alarm(store: tuple[str, str]) -> None:
    url, path = store
    jobs = fdbqueue.Queue("jobs")
    for i in range(40):
        db = fdbqueue.open(url)
        try:
            jobs.enqueue(db, {"i": i})
            if i % 3 == 0:
                second = fdbqueue.open(url)  # a second handle of this process
                jobs.enqueue(second, {"i": -i})
                second.close()
        finally:
            db.close()
        assert not os.path.exists(path + "-wal")  # the last close checkpointed it away
    assert ready(url) == 40 + 14


def test_another_process_holding_the_store_open_is_no_false_alarm(store: tuple[str, str]) -> None:
    url, path = store
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        for _ in range(5):
            db = fdbqueue.open(url)
            try:
                fdbqueue.Queue("jobs").enqueue(db, {"i": 0})
            finally:
                db.close()
        assert os.path.exists(path + "-wal")  # the holder keeps it
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    assert ready(url) == 6


def test_the_record_is_read_from_the_wal_index_at_each_commit(store: tuple[str, str]) -> None:
    """The record in the lock page follows SQLite's WAL index: mxFrame grows with commits."""
    url, path = store
    db = fdbqueue.open(url)
    try:
        jobs = fdbqueue.Queue("jobs")
        jobs.enqueue(db, {"i": 0})
        first = db._store.page.wal_record()  # type: ignore[attr-defined]
        jobs.enqueue(db, {"i": 1})
        second = db._store.page.wal_record()  # type: ignore[attr-defined]
        assert first[0] == second[0] == db._store.clock_tag  # type: ignore[attr-defined]
        assert 0 < first[1] < second[1]
        with open(path + "-wal", "rb") as f:
            assert f.read(24)[16:24] == second[3]  # the WAL header's salts
    finally:
        db.close()


def test_threads_opening_the_store_at_once_after_a_sigkill(store: tuple[str, str]) -> None:
    """One of them is the first to open and checks; none is refused, none loses a commit."""
    url, _ = store
    enqueue_then_sigkill(url, N)
    errors: list[BaseException] = []

    def open_and_enqueue() -> None:
        try:
            db = fdbqueue.open(url)
            try:
                fdbqueue.Queue("jobs").enqueue(db, {"i": -1})
            finally:
                db.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_and_enqueue) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert ready(url) == N + 8
