"""An enqueue's ready and wake counters (``moves.count_new``): where nothing conflicts (the
embedded engine: one writer holds the store lock from its first read to its commit) they are
set to the value read in the same transaction plus the messages written, which is what an
atomic add leaves there. Each test tries a case where it would not be: another writer between
two enqueues, several moves in one transaction, a counter not 8 bytes long, one at the edge
of 64 bits (an add wraps)."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.store.layout import READY_PARTS, QueueKeys, ready_count

_OTHER = r"""
import sys, fdbqueue
db = fdbqueue.open(sys.argv[1])
q = fdbqueue.Queue("jobs")
q.enqueue(db, b"from another process")
q.enqueue_many(db, [b"many 1", b"many 2"])
db.close()
"""


def _counters(db: object) -> tuple[int, int]:
    """The ready count (ready - taken + wake - counted: store/layout.py) and the wake counter."""
    keys = QueueKeys.make("jobs")
    tr = db.create_transaction()  # type: ignore[attr-defined]
    ready = ready_count(*(tr[keys.counter(c)] for c in READY_PARTS))
    wake = struct.unpack("<q", tr[keys.wake])[0]
    tr.cancel()
    return ready, wake


def test_counters_count_every_writer_and_every_move_of_a_transaction(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}"
    db, other = fdbqueue.open(url), fdbqueue.open(url)
    q = Queue("jobs")
    q.enqueue(db, b"1")
    q.enqueue(db, b"2")  # the settings cached, the reads kept
    q.enqueue(other, b"3")  # another handle commits between two of db's
    q.enqueue(db, b"4")
    done = subprocess.run([sys.executable, "-c", _OTHER, url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    q.enqueue(db, b"5")
    tr = db.create_transaction()  # several moves in one transaction
    q.enqueue(tr, b"6")
    assert q.dequeue(tr) is not None
    q.enqueue(tr, b"7")
    q.enqueue_many(tr, [b"8", b"9"])
    q.enqueue(tr, b"10", delay=60.0)
    tr.commit()
    held = [m.payload for m in q.browse(db)]
    assert held == [
        b"2",
        b"3",
        b"4",
        b"from another process",
        b"many 1",
        b"many 2",
        b"5",
        b"6",
        b"7",
        b"8",
        b"9",
    ]
    assert _counters(db) == (len(held), 12)  # ready; wake: every message made ready, in order
    assert q.size(db) == len(held)  # (the delayed one is not ready)
    other.close()
    db.close()


@pytest.mark.parametrize(
    ("stored", "wanted"),
    [
        (b"\x05\x00\x00\x00", struct.pack("<q", 6)),  # shorter: zero-extended, as an add does
        (struct.pack("<q", 2**63 - 1), struct.pack("<q", -(2**63))),  # an add wraps
        (b"\x01" * 12, (int.from_bytes(b"\x01" * 8, "little") + 1).to_bytes(8, "little")),  # longer
    ],
)
def test_a_counter_of_any_length_or_at_the_edge_ends_as_an_add_leaves_it(
    tmp_path: Path, stored: bytes, wanted: bytes
) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    q = Queue("jobs")
    q.enqueue(db, b"first")
    keys = QueueKeys.make("jobs")
    db[keys.counter("ready")] = stored  # type: ignore[index]
    db[keys.wake] = stored  # type: ignore[index]
    q.enqueue(db, b"second")
    assert db[keys.counter("ready")] == wanted == db[keys.wake]  # type: ignore[index]
    q.enqueue(db, b"third")  # and again, from what that commit kept
    after = struct.unpack("<q", wanted[:8])[0] + 1
    want = struct.pack("<q", (after + 2**63) % 2**64 - 2**63)
    assert db[keys.counter("ready")] == want == db[keys.wake]  # type: ignore[index]
    db.close()
