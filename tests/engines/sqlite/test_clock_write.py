"""What a commit writes of the lock file's version clock. On the common path (the page trusted
as read under the pin, the reservation not raised) it writes the last version alone, the
rest of the clock holding its bytes already; every other case writes the whole clock. Each
test here is a case where writing less would leave the page saying something else than a
whole write would: the next commit, of this process or another, would then take a wrong
version, or trust values it should not."""

from __future__ import annotations

import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import fdbqueue
from fdbqueue.engines.sqlite import page as _page

ONE = struct.pack("<q", 1)
_CLOCK = _page.CLOCK.layout


def _reserved(path: Path) -> int:
    raw = sqlite3.connect(path)
    try:
        return int(raw.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()[0])
    finally:
        raw.close()


@fdbqueue.transactional
def _add(tr: fdbqueue.Transaction) -> None:
    tr.add(b"n", ONE)


@fdbqueue.transactional
def _read_and_add(tr: fdbqueue.Transaction) -> int:
    found = tr[b"n"]
    tr.add(b"n", ONE)
    return 0 if found is None else int(struct.unpack("<q", found)[0])


def test_a_common_commit_leaves_the_clock_a_whole_write_would(tmp_path: Path) -> None:
    """The bytes of the clock after commits on the common path are the layout of (tag, the
    commit's version, the reservation, not pending, the base): what pack_clock writes."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        page = db._store.page  # type: ignore[attr-defined]
        for _ in range(3):
            _read_and_add(db)  # kept values: the clock read once, at the commit's check
            _add(db)
        tr = db.create_transaction()
        tr.add(b"n", ONE)
        tr.commit()
        version = tr.get_committed_version()
        tag, last, meta, pending, base = page.clock()
        assert (tag, last, pending) == (db._store.clock_tag, version, 0)  # type: ignore[attr-defined]
        assert bytes(page.buffer[: _CLOCK.size]) == _CLOCK.pack(tag, version, meta, 0, base)
        assert version <= meta <= _reserved(tmp_path / "q.db")
    finally:
        db.close()


def test_a_commit_that_raises_the_reservation_writes_the_whole_clock(tmp_path: Path) -> None:
    """The page's reservation lowered to the last version (as a store whose reservation was
    just reached): the next commit raises it, in meta and on the page, and leaves the
    page not pending, the same reservation in both."""
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}?sync=normal")
    try:
        _add(db)
        page = db._store.page  # type: ignore[attr-defined]
        tag, last, _, _, base = page.clock()
        page.pack_clock(tag, last, last, 0, base)
        _read_and_add(db)
        tag2, last2, meta2, pending2, base2 = page.clock()
        assert (tag2, pending2, base2) == (tag, 0, base)
        assert last < last2 < meta2 == _reserved(path)
        _add(db)  # and the common path after it
        assert page.clock()[1] > last2 and page.clock()[2] == meta2
    finally:
        db.close()


_OTHER = """
import struct, sys
import fdbqueue
db = fdbqueue.open(sys.argv[1])
page = db._store.page
for i in range(int(sys.argv[2])):
    tr = db.create_transaction()
    tr.add(b"n", struct.pack("<q", 1))
    tr.commit()
    if i == 0:  # the reservation lowered: this process's next commit raises it
        tag, last, _, _, base = page.clock()
        page.pack_clock(tag, last, last, 0, base)
db.close()
"""


def test_commits_of_two_processes_between_each_other_keep_versions_rising(tmp_path: Path) -> None:
    """Another process commits (one of them raising the reservation) between this handle's
    commits, which keep values and so read the clock once at their commit: every commit
    lands once, the versions rise, and the page's reservation is meta's."""
    path = tmp_path / "q.db"
    url = f"sqlite://{path}?sync=normal"
    db = fdbqueue.open(url)
    try:
        versions = []
        for _ in range(3):
            for _ in range(2):
                tr = db.create_transaction()
                assert tr[b"n"] is not None or not versions  # read: the commit keeps it
                tr.add(b"n", ONE)
                tr.commit()
                versions.append(tr.get_committed_version())
            subprocess.run([sys.executable, "-c", _OTHER, url, "3"], check=True, timeout=60)
            last = db._store.page.clock()[1]  # type: ignore[attr-defined]
            assert last > versions[-1]
            versions.append(last)
        assert versions == sorted(set(versions))
        assert _read_and_add(db) == 15
        _, last, meta, pending, _ = db._store.page.clock()  # type: ignore[attr-defined]
        assert pending == 0 and last <= meta == _reserved(path)
    finally:
        db.close()
