"""``ack_many`` clears each message's leased record and lease entry where they are, whether
it takes their keys from what this process's lease made (the record read back is the one it
wrote) or makes them from the record read (a lease extended since, or leased elsewhere):
nothing is left in flight, and a sweep brings nothing back (a leased forwarder's removal
acks its batches so)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fdbqueue
from fdbqueue import Database, Queue, queue_stats
from fdbqueue.ops.txn import run_once


def _left(db: Database, tag: str) -> int:
    r = Queue("jobs").keys.q.range((tag,))
    return int(run_once(db, lambda t, _: len(t.get_range(r.start, r.stop, 1000))))


def test_ack_many_clears_every_lease_entry_also_of_a_lease_extended_since(db: Database) -> None:
    q = Queue("jobs")
    ids = q.enqueue_many(db, [f"m{i}" for i in range(5)])
    ms = q.lease_many(db, 5, 30)
    ms[1] = q.extend(db, ms[1], 120)  # its record and lease entry rewritten: a later deadline
    ms[3] = q.extend(db, ms[3], 5)  # an earlier one
    assert sorted(m.id for m in q.ack_many(db, ms)) == sorted(ids)
    assert (_left(db, "f"), _left(db, "l")) == (0, 0)  # no leased record, no lease entry left
    st = queue_stats(db, "jobs")
    assert (st.ready, st.inflight, st.done) == (0, 0, 5)
    q.sweep(db)
    assert q.lease(db) is None  # nothing comes back


def test_ack_many_of_messages_leased_by_another_handle(db: Database) -> None:
    q = Queue("jobs")
    ids = q.enqueue_many(db, [f"m{i}" for i in range(3)])
    ms = Queue("jobs").lease_many(db, 3, 30)  # another Queue object: its own keys
    assert sorted(m.id for m in q.ack_many(db, ms)) == sorted(ids)
    assert (_left(db, "f"), _left(db, "l")) == (0, 0)


_EXTEND = """
import sys
import fdbqueue
from fdbqueue import ContentType, Message, Queue
db = fdbqueue.open(sys.argv[1])
m = Message(sys.argv[2], b"", "jobs", 0, 0.0, 1, {}, ContentType.TEXT, receipt=sys.argv[3])
Queue("jobs").extend(db, m, 120)
"""


def test_ack_many_after_another_process_extended_a_lease_clears_its_new_entry(tmp_path: Path) -> None:
    """The lease this process took, extended by another process (a new deadline: its record
    and lease entry rewritten under the same receipt): the record read back is not the one
    this process wrote, so its keys are made from it, and the new lease entry is cleared."""
    url = f"sqlite:///{tmp_path}/q.db"
    db = fdbqueue.open(url)
    q = Queue("jobs")
    ids = q.enqueue_many(db, ["a", "b", "c"])
    ms = q.lease_many(db, 3, 30)
    other = [sys.executable, "-c", _EXTEND, url, ms[1].id, str(ms[1].receipt)]
    subprocess.run(other, check=True, timeout=120)
    assert sorted(m.id for m in q.ack_many(db, ms)) == sorted(ids)
    assert (_left(db, "f"), _left(db, "l")) == (0, 0)
    assert queue_stats(db, "jobs").inflight == 0
