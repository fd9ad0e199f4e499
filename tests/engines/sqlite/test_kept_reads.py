"""Adversarial checks of the values a commit keeps for its handle's next transaction
(``Store.keep``/``take_kept``): each case is one where a wrong validity rule would answer a
read from memory with a value the store no longer holds."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import fdbqueue
from fdbqueue import EngineError
from tests.support.sqlite_files import stored as _stored

# Another process, with the store lock's takeover window shortened to 0.3 s, that takes the
# lock over from a holder that sits on it and commits new values of both keys.
_TAKEOVER = r"""
import sys
from fdbqueue.engines.sqlite import storelock
storelock.WINDOW = 0.3
import fdbqueue
db = fdbqueue.open(sys.argv[1])
tr = db.create_transaction()
tr[b"k"] = b"new"
tr[b"j"] = b"new"
tr.commit()
print("committed", flush=True)
"""


def test_a_transaction_whose_lock_was_taken_over_never_mixes_kept_values_with_newer_ones(
    tmp_path: Path,
) -> None:
    """A transaction that took its handle's kept values at its begin and then sat on the store
    lock (a write first, so its read version starts late) past the takeover window: another
    process takes the lock over and commits. Its later reads must come from one snapshot:
    the kept (old) value of one key beside the newer value of another is a read no
    FoundationDB transaction can make (its reads are at one read version)."""
    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    try:
        db[b"j"] = b"old"
        tr = db.create_transaction()
        tr[b"k"] = (tr[b"k"] or b"") + b"old"  # read, then written: kept with its write
        tr.commit()
        tr = db.create_transaction()
        tr[b"x"] = b"1"  # begins: the store lock, and the kept values taken
        child = subprocess.run(
            [sys.executable, "-c", _TAKEOVER, url], capture_output=True, text=True, timeout=60
        )
        assert child.returncode == 0, child.stderr
        try:
            k = tr[b"k"]
            j = tr[b"j"]
        except EngineError as exc:  # refusing the reads is as good as reading one snapshot
            assert exc.retryable
            return
        assert (k, j) in ((b"old", b"old"), (b"new", b"new")), (k, j)
    finally:
        db.close()


def test_every_kind_of_write_to_a_kept_key_leaves_what_the_store_holds(tmp_path: Path) -> None:
    """A key read and kept, then written by each kind of mutation (every atomic op, a
    versionstamped value, a clear, a clear of a range over it, a set): the next transaction
    of the same handle reads what the file holds, whether it came from memory or SQLite."""
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    k = b"kept"
    eight = struct.pack("<q", 5)
    stamp_template = b"v" + b"\0" * 10 + b"w" + struct.pack("<I", 1)
    writes = [
        lambda tr: tr.add(k, struct.pack("<q", 3)),
        lambda tr: tr.max(k, struct.pack("<q", 100)),
        lambda tr: tr.min(k, struct.pack("<q", 7)),
        lambda tr: tr.byte_max(k, b"\xff" * 8),
        lambda tr: tr.byte_min(k, b"\x01" * 8),
        lambda tr: tr.bit_and(k, b"\x0f" * 8),
        lambda tr: tr.bit_or(k, b"\x30" * 8),
        lambda tr: tr.bit_xor(k, b"\x55" * 8),
        lambda tr: tr.append_if_fits(k, b"tail"),
        lambda tr: tr.compare_and_clear(k, tr[k] or b""),  # clears: equal
        lambda tr: tr.set(k, eight),
        lambda tr: tr.compare_and_clear(k, b"no match"),  # leaves it
        lambda tr: tr.set_versionstamped_value(k, stamp_template),
        lambda tr: tr.set(k, eight),
        lambda tr: tr.clear(k),
        lambda tr: tr.set(k, eight),
        lambda tr: tr.clear_range(b"kep", b"kez"),
        lambda tr: tr.set(k, eight),
    ]
    try:
        db[k] = eight
        for i, write in enumerate(writes):
            tr = db.create_transaction()
            tr.get(k)  # read: the commit keeps it, with its write applied
            write(tr)
            tr.commit()
            tr = db.create_transaction()
            assert tr.get(k) == _stored(path, k), i
            tr.commit()
            tr = db.create_transaction()
            assert tr.snapshot.get(k) == _stored(path, k), i
            tr[b"other"] = b"%d" % i  # a commit that keeps the read for the next turn
            tr.commit()
    finally:
        db.close()


# Another process that commits and dies before anything after its COMMIT runs (the clock
# settled, the WAL record, the release): what a commit half-done leaves in the lock file.
_DIES_AFTER_COMMIT = r"""
import os, sys
from fdbqueue.engines.sqlite import store
store.WritableStore.after_writes = lambda self, version, bumped: os._exit(3)
import fdbqueue
db = fdbqueue.open(sys.argv[1])
tr = db.create_transaction()
tr[b"k"] = sys.argv[2].encode()
tr.commit()
"""


def test_a_commit_by_a_process_that_died_right_after_its_commit_is_never_hidden_by_kept_values(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q.db"
    url = f"sqlite://{path}"
    db = fdbqueue.open(url)
    try:
        for round_ in range(3):
            tr = db.create_transaction()
            tr[b"k"] = (tr[b"k"] or b"") + b"+"  # read and written: kept
            tr.commit()
            value = f"from the dead {round_}"
            child = subprocess.run(
                [sys.executable, "-c", _DIES_AFTER_COMMIT, url, value],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert child.returncode == 3, child.stderr
            assert _stored(path, b"k") == value.encode()  # it did commit
            tr = db.create_transaction()
            assert tr[b"k"] == value.encode()
            tr.commit()
    finally:
        db.close()


_SETS_K = r"""
import sys
import fdbqueue
db = fdbqueue.open(sys.argv[1])
db[b"k"] = sys.argv[2].encode()
"""


def test_a_watch_on_a_kept_key_fires_when_another_process_changes_it(tmp_path: Path) -> None:
    """A watch armed with a value read from what the handle kept (the same value SQLite holds)
    fires once another process writes the key, and not before."""
    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    try:
        tr = db.create_transaction()
        tr[b"k"] = (tr[b"k"] or b"") + b"mine"
        tr.commit()
        tr = db.create_transaction()
        assert tr[b"k"] == b"mine"  # from what was kept
        w = tr.watch(b"k")
        tr[b"other"] = b"1"
        tr.commit()
        assert not w.wait(0.2)
        child = subprocess.run(
            [sys.executable, "-c", _SETS_K, url, "theirs"], capture_output=True, text=True, timeout=60
        )
        assert child.returncode == 0, child.stderr
        assert w.wait(30.0)
        assert db[b"k"] == b"theirs"
    finally:
        db.close()
