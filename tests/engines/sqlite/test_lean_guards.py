"""The store's per-transaction guards in fewer steps (issue 30, eighth pass), and the cases that
would break them:

- the begin trusts what this handle's last commit kept by comparing two words of the lock
  file's page (the version clock's last version, the store id's first eight bytes) with what
  that commit left (``WritableStore.begin``), where it read and unpacked the whole clock: a
  page that names the same version under another store's id, a commit of another process
  left pending by its death, another process's commits between;
- the version clock's trusted page checked inline at a commit: a process whose monotonic clock
  is an hour ahead still takes the store's time at its first use;
- the WAL record read straight into its bytes.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import fdbqueue
from fdbqueue.engines.sqlite import page as _page
from fdbqueue.engines.versions import VERSIONS_PER_SECOND

ONE = struct.pack("<q", 1)


def _raw_set(path: Path, key: bytes, value: bytes) -> None:
    """Write ``key`` past fdbqueue (no clock moved): only a read of SQLite can see it."""
    raw = sqlite3.connect(path)
    try:
        with raw:
            raw.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", (key, value))
    finally:
        raw.close()


@fdbqueue.transactional
def _read_and_write(tr: fdbqueue.Transaction, key: bytes, value: bytes) -> bytes | None:
    found = tr[key]
    tr[key] = value
    return found


@fdbqueue.transactional
def _read(tr: fdbqueue.Transaction, key: bytes) -> bytes | None:
    return tr[key]


def test_kept_values_are_trusted_only_while_the_page_names_this_commit_of_this_store(tmp_path: Path) -> None:
    """A write past fdbqueue (which moves no clock) shows whether a read came from the kept
    values or from SQLite. Kept values are used while the page names this handle's last commit
    (the control: the read misses the write), and dropped once the page names the same version
    under another store's id."""
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}?sync=normal")
    try:
        page = db._store.page  # type: ignore[attr-defined]
        _read_and_write(db, b"k", b"1")  # read and written: kept for the next transaction
        _raw_set(path, b"k", b"past")
        assert _read(db, b"k") == b"1"  # the control: kept, so the write past it is not seen
        _read_and_write(db, b"k", b"2")  # kept again (the store now holds 2)
        _raw_set(path, b"k", b"past")
        tag, last, meta, pending, base = page.clock()
        other = tag[:16] + bytes(b ^ 0xFF for b in tag[16:24]) + tag[24:]
        page.pack_clock(other, last, meta, pending, base)  # the same version, another store's
        assert _read(db, b"k") == b"past"  # not trusted: read from SQLite
    finally:
        db.close()


# Another process that commits a value of ``k`` raising the version reservation (so the page
# is marked pending) and dies before anything after its COMMIT runs (after_writes: the flag
# cleared, the WAL record): what a half-done commit of that kind leaves in the lock file.
_DIES_PENDING = r"""
import os, sys
from fdbqueue.engines.sqlite import store
store.WritableStore.after_writes = lambda self, version, bumped: os._exit(3 if bumped else 4)
import fdbqueue
db = fdbqueue.open(sys.argv[1])
page = db._store.page
tag, last, _, _, base = page.clock()
page.pack_clock(tag, last, last, 0, base)  # the reservation reached: this commit raises it
tr = db.create_transaction()
tr[b"k"] = sys.argv[2].encode()
tr.commit()
"""


def test_a_commit_left_pending_by_its_death_is_never_hidden_by_kept_values(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    url = f"sqlite://{path}?sync=normal"
    db = fdbqueue.open(url)
    try:
        for round_ in range(2):
            _read_and_write(db, b"k", b"mine %d" % round_)  # kept
            value = f"from the dead {round_}"
            child = subprocess.run(
                [sys.executable, "-c", _DIES_PENDING, url, value], capture_output=True, text=True, timeout=60
            )
            assert child.returncode == 3, child.stderr  # it raised the reservation, then died
            assert db._store.page.clock()[3] == _page.PENDING  # type: ignore[attr-defined]
            assert _read(db, b"k") == value.encode()
    finally:
        db.close()


_COMMITS = r"""
import sys
import fdbqueue
db = fdbqueue.open(sys.argv[1])
for i in range(3):
    db[b"k"] = b"other %d" % i
"""


def test_kept_values_after_another_processs_commits_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    url = f"sqlite://{path}?sync=normal"
    db = fdbqueue.open(url)
    try:
        for _ in range(3):
            _read_and_write(db, b"k", b"mine")  # kept
            subprocess.run([sys.executable, "-c", _COMMITS, url], check=True, timeout=60)
            # A transaction that only reads (no commit-time check behind it) reads theirs.
            assert _read(db, b"k") == b"other 2"
    finally:
        db.close()


# A process whose engine clock is an hour ahead of the others' (as a time namespace or
# libfaketime would make it): its first commit's version, printed.
_AHEAD = r"""
import sys
import fdbqueue
import fdbqueue.engines.versions as versions
versions._ahead_us = 3_600_000_000
db = fdbqueue.open(sys.argv[1])
tr = db.create_transaction()
tr[b"ahead"] = b"1"
tr.commit()
print(tr.get_committed_version())
"""


def test_a_process_an_hour_ahead_commits_at_the_stores_time_after_inline_clock_commits(
    tmp_path: Path,
) -> None:
    """Commits on the inline clock path (next_version without _trusted_now's call) leave the
    page's clock and stamp as a whole write would: a process whose monotonic clock is an hour
    ahead, opening the store afterwards, commits at the store's time."""
    path = tmp_path / "q.db"
    url = f"sqlite://{path}?sync=normal"
    db = fdbqueue.open(url)
    try:
        last = 0
        for _ in range(20):
            tr = db.create_transaction()
            tr.add(b"n", ONE)
            tr.commit()
            assert tr.get_committed_version() > last
            last = tr.get_committed_version()
        child = subprocess.run(
            [sys.executable, "-c", _AHEAD, url], capture_output=True, text=True, timeout=60
        )
        assert child.returncode == 0, child.stderr
        ahead = int(child.stdout.split()[-1])
        tr = db.create_transaction()
        tr.add(b"n", ONE)
        tr.commit()
        after = tr.get_committed_version()
        # At the store's time: within seconds of this process's commits, not an hour ahead.
        assert last < ahead < after, (last, ahead, after)
        assert after - last < 60 * VERSIONS_PER_SECOND
    finally:
        db.close()


def test_the_wal_record_holds_what_the_wal_index_header_says_after_each_commit(tmp_path: Path) -> None:
    """The record is read with one ``preadv`` straight into its bytes: after each commit it is
    (this store's tag, mxFrame, nBackfill, the salts) as the header in ``-shm`` says them,
    through a checkpoint that restarts the WAL (new salts, nBackfill back to 0)."""
    from fdbqueue.engines.sqlite import walcheck

    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}?sync=normal")
    try:
        store = db._store  # type: ignore[attr-defined]
        shm = store._walheld.shm
        seen = set()
        for i in range(30):
            db[b"k%d" % i] = b"v" * 3000
            if i == 15:
                store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the WAL restarts
            if i % 5 == 0:
                db[b"after"] = b"%d" % i
            frames, salts, backfilled = walcheck.HEADER.unpack(os.pread(shm, walcheck.HEADER_BYTES, 0))
            assert store.page.wal_record() == (store.clock_tag, frames, backfilled, salts), i
            seen.add(salts)
        assert len(seen) >= 2  # the salts changed at the restart: the fields are not stale
    finally:
        db.close()
