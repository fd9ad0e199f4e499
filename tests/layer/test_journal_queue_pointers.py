"""A consuming operation's history pointer inside its queue's keys (issue 30, seventh pass).

On the embedded engine (one writer at a time) a journaled operation other than a message's
arrival writes its history pointer at ``Q + ("eh", message_id, stamp)``, beside the queue's
leased records, counters and ready head that the same commit writes, where it dirtied a leaf
page of its own under ``("h", ...)`` before. Every reader still sees the same facts: a
message's history in commit order across queues (also after its queue is destroyed, also for a
message that reached its queue before the journal was turned on), the journal and a follower,
a trim that leaves no pointer behind; and a store written before the change (by the tree of
main ``0478719``, run in a subprocess) opens, its journal reads in full, is followed, and its
messages' histories join what the new code adds.

Since issue 30's eighth pass an arrival's pointer on the embedded engine goes into its queue's
keys too, at ``Q + ("ra", inverted id, stamp)``, right after the ready range whose tail the
enqueue writes (newest first): a store written by main ``e3bc553`` (its arrivals' pointers
under ``("h", ...)``) reads, follows and continues alike.

Since issue 30's ninth pass a consuming operation's pointer is at ``Q + ("mh", message_id,
stamp)``, right after the queue's counters (its entry and bell just before them,
``test_journal_queue_entries.py``); those written at ``"eh"`` are read, kept and trimmed alike.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.store.layout import DEFAULT_ROOT, QUEUE_SHARD, JournalKeys
from tests.support.old_code import JOURNALED_WORK, run_old, store_rows

JK = JournalKeys.make(DEFAULT_ROOT)
REPO = Path(__file__).resolve().parents[2]
OLD = "0478719"  # main before the pointers moved: every pointer under ("h", ...)
OLD_ARRIVALS = "e3bc553"  # main before the arrivals' pointers moved: theirs under ("h", ...)


def _root_pointers(db: Any) -> dict[bytes, bytes]:
    r = JK.root.range(("h",))
    return store_rows(db, r.start, r.stop)


def _arrival_pointers(db: Any, queue: str = "jobs") -> dict[bytes, bytes]:
    return store_rows(db, *JK.arrival_range(queue))


def test_a_consuming_operations_pointer_lives_in_its_queue_and_an_arrivals_after_its_ready_range(
    tmp_path: Path,
) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    mid = q.enqueue(db, b"a")
    assert _root_pointers(db) == {}
    ((arrival, value),) = _arrival_pointers(db).items()
    assert arrival == JK.arrival_key("jobs", mid, fdbqueue.history(db, mid)[0].version)
    assert value == bytes((QUEUE_SHARD,))  # the entry's shard: the queue's own range on this engine
    # Where it sorts: right after the ready range (the newest ready record), a newer id first.
    sub = JK.root["q"]["jobs"]
    assert q.keys.ready_range()[1] < arrival < sub.pack(("rc", ""))
    newer = q.enqueue(db, b"b")
    assert q.keys.ready_range()[1] < JK.arrival_key("jobs", newer, b"\xff" * 12) < arrival
    assert store_rows(db, *JK.queue_history_range("jobs")) == {}
    before = _root_pointers(db)
    m = q.lease(db, 30)
    assert m is not None and m.id == mid
    q.ack(db, m)
    assert _root_pointers(db) == before  # no pointer under ("h", ...) for the lease or the ack
    local = store_rows(db, *JK.queue_history_range("jobs", mid))
    history = fdbqueue.history(db, mid)
    assert [e.op for e in history] == ["enqueue", "lease", "ack"]
    assert {JK.history_version(k) for k in local} == {e.version for e in history[1:]}
    assert set(local.values()) == {bytes((QUEUE_SHARD,))}  # the entry's shard: the queue's own range
    # Where the pointer sorts (since issue 30's ninth pass): right after the counters ("m"),
    # before the staged requests and the ready range (before it, after the delayed range).
    sub = JK.root["q"]["jobs"]
    assert sub.range(("m",)).stop <= min(local) and max(local) < sub.pack(("pop", 0))
    assert store_rows(db, *JK.earlier_history_range("jobs")) == {}
    db.close()


def test_history_keeps_a_destroyed_queues_consuming_entries(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    first, second = q.enqueue_many(db, [b"a", b"b"])
    m = q.lease(db, 30)
    assert m is not None
    q.ack(db, m)
    q.dequeue(db)
    fdbqueue.destroy_queue(db, "jobs")
    assert [e.op for e in fdbqueue.history(db, first)] == ["enqueue", "lease", "ack"]
    assert [e.op for e in fdbqueue.history(db, second)] == ["enqueue", "dequeue"]
    # The queue's other keys are gone; the same name made again starts empty.
    fdbqueue.create_queue(db, "jobs", journal=True)
    assert q.size(db) == 0 and q.dequeue(db) is None
    db.close()


def test_a_message_enqueued_before_the_journal_was_on_has_its_consuming_entries(tmp_path: Path) -> None:
    """No arrival pointer names its queue: history finds the queue's own pointers anyway."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs")
    q = Queue("jobs")
    early, late = q.enqueue_many(db, [b"a", b"b"])
    fdbqueue.create_queue(db, "jobs", journal=True)  # turned on: the registry names it
    got = q.dequeue(db)
    assert got is not None and got.id == early
    m = q.lease(db, 30)
    assert m is not None and m.id == late
    q.nack(db, m)
    assert [e.op for e in fdbqueue.history(db, early)] == ["dequeue"]
    assert [e.op for e in fdbqueue.history(db, late)] == ["lease", "nack"]
    db.close()


def test_a_moved_message_has_one_history_over_both_queues_in_commit_order(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "b", journal=True)
    fdbqueue.create_queue(db, "a", journal=True, max_deliveries=1, retry_delay=0.0, error_queue="b")
    mid = Queue("a").enqueue(db, b"x")
    m = Queue("a").lease(db, 30)
    assert m is not None
    Queue("a").nack(db, m)  # its only delivery: dead-lettered
    history = fdbqueue.history(db, mid)
    assert [e.version for e in history] == sorted(e.version for e in history)
    every = [e for e in fdbqueue.journal(db, None) if e.message_id == mid]
    assert history == every
    assert [(e.queue, e.op) for e in history][:3] == [("a", "enqueue"), ("a", "lease"), ("a", "dead")]
    assert len({e.queue for e in history}) == 2, history  # dead-lettered into the other queue
    db.close()


def test_a_trim_removes_the_queues_pointers_with_their_entries(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    ids = q.enqueue_many(db, [b"a", b"b", b"c"])
    for _ in range(2):
        m = q.lease(db, 30)
        assert m is not None
        q.ack(db, m)
    every = list(fdbqueue.journal(db, "jobs"))
    keep = every[-1].version  # the last ack stays
    assert fdbqueue.trim_journal(db, "jobs", before=keep) == len(every) - 1
    left = store_rows(db, *JK.queue_history_range("jobs"))
    assert [JK.history_version(k) for k in left] == [keep]
    assert [e.op for e in fdbqueue.history(db, ids[1])] == ["ack"]
    assert fdbqueue.history(db, ids[0]) == fdbqueue.history(db, ids[2]) == [] and _root_pointers(db) == {}
    assert _arrival_pointers(db) == {}
    db.close()


# -- a store written by the code before the change ---------------------------------------------


@pytest.mark.parametrize("commit", [OLD, OLD_ARRIVALS])
def test_a_store_written_before_the_change_reads_follows_and_continues(tmp_path: Path, commit: str) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}"
    made = json.loads(run_old(tmp_path, commit, JOURNALED_WORK, url))
    ids: list[str] = made["ids"]

    db = fdbqueue.open(url)
    q = Queue("jobs")
    old_entries = list(fdbqueue.journal(db, "jobs"))
    assert [e.op for e in old_entries] == made["ops"]
    assert made["ops"][-7:] == ["enqueue"] * 4 + ["dequeue", "lease", "ack"]
    assert [e.op for e in fdbqueue.history(db, ids[0])] == ["enqueue", "dequeue"]
    assert [e.op for e in fdbqueue.history(db, ids[1])] == ["enqueue", "lease", "ack"]

    # A follower from the old store's last entry, while this code consumes the rest.
    followed: list[fdbqueue.JournalEntry] = []
    since = old_entries[-1].version

    def follow() -> None:
        followed.extend(fdbqueue.journal(db, "jobs", since=since, follow=True, timeout=30, limit=4))

    follower = threading.Thread(target=follow)
    follower.start()
    held = q.lease(db, 30)
    assert held is not None and held.id == ids[2]
    q.ack(db, held)
    last = q.dequeue(db)
    assert last is not None and last.id == ids[3]
    q.enqueue(db, b"e")
    follower.join(timeout=60)
    assert not follower.is_alive()
    every = list(fdbqueue.journal(db, "jobs"))
    assert every[: len(old_entries)] == old_entries
    assert followed == every[len(old_entries) :]
    assert [e.op for e in followed] == ["lease", "ack", "dequeue", "enqueue"]
    # Each message's history: the old pointers under ("h", ...) and the new in the queue, merged.
    assert [e.op for e in fdbqueue.history(db, ids[2])] == ["enqueue", "lease", "ack"]
    assert [e.op for e in fdbqueue.history(db, ids[3])] == ["enqueue", "dequeue"]
    for mid in ids:
        assert fdbqueue.history(db, mid) == [e for e in every if e.message_id == mid]
    # A trim over both layouts leaves nothing of either.
    assert fdbqueue.trim_journal(db, "jobs", before=b"\xff" * 12) == len(every)
    assert _root_pointers(db) == {} and store_rows(db, *JK.queue_history_range("jobs")) == {}
    assert store_rows(db, *JK.earlier_history_range("jobs")) == {}
    assert _arrival_pointers(db) == {}
    db.close()
