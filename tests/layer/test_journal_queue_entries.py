"""On the embedded engine (one writer at a time), since issue 30's ninth pass, a queue's journal
entries are in its own keys, ``Q + ("ej", stamp)``, beside the counters every operation writes,
and its bell at ``Q + ("lj",)``: a journaled commit no longer dirties a page of the journal's
range of its own. Every reader reads them (``journal``, a follower, ``history``, ``trim_journal``,
the export's plan, pieces and head, a destroy that keeps them) and what a store written before
the change holds (entries under ``("j", queue, 0)``, the bell under ``("jn", queue)``): the
same entries as a journal of the other layout."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import fdb.tuple

import fdbqueue
from fdbqueue import Queue
from fdbqueue.api.export import journal_head, journal_plan, read_journal_piece
from fdbqueue.store.layout import DEFAULT_ROOT, JOURNAL_SHARDS, QUEUE_SHARD, JournalKeys
from tests.support.old_code import JOURNALED_WORK, run_old, store_rows

JK = JournalKeys.make(DEFAULT_ROOT)
BEFORE = "6f745c8"  # main before the entries moved: under ("j", queue, 0), the bell ("jn", queue)


def _old_entries(db: Any, queue: str = "jobs") -> dict[bytes, bytes]:
    """The queue's entries where they were before (every shard of ``("j", queue)``)."""
    r = JK.root.range(("j", queue))
    return store_rows(db, r.start, r.stop)


def _work(q: Queue, db: Any) -> list[str]:
    """Every kind of journaled commit of a queue: enqueues, a dequeue, a lease and ack (the
    short steps), a nack, a release."""
    ids = q.enqueue_many(db, [b"a", b"b", b"c", b"d"])
    q.enqueue(db, b"e")
    q.dequeue(db)
    m = q.lease(db, 30)
    assert m is not None
    q.ack(db, m)
    m = q.lease(db, 30)
    assert m is not None
    q.nack(db, m)
    m = q.lease(db, 30)
    assert m is not None
    q.release(db, m)
    return ids


def _export(db: Any, queue: str = "jobs") -> list[tuple[Any, ...]]:
    return [row for piece in journal_plan(db, queue) for row in read_journal_piece(db, piece)]


def test_a_journaled_commit_writes_its_entry_and_bell_in_its_queues_keys(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", journal=True, retry_delay=0.0)
    q = Queue("jobs")
    _work(q, db)
    every = list(fdbqueue.journal(db, "jobs"))
    consumed = ["dequeue", "lease", "ack", "lease", "nack", "lease", "release"]
    assert [e.op for e in every][-12:] == ["enqueue"] * 5 + consumed
    assert any(e.message_id is None for e in every)  # the queue's own entry (create): no pointer
    # Nothing under ("j", ...) nor at ("jn", "jobs"): every entry, the queue's own too, in the queue.
    assert _old_entries(db) == {}
    assert db[JK.bell("jobs")] is None  # type: ignore[index]
    local = store_rows(db, *JK.entry_range("jobs", QUEUE_SHARD, None))
    assert [JK.entry_version(k) for k in local] == [e.version for e in every]
    assert list(local) == [JK.entry_key("jobs", QUEUE_SHARD, e.version) for e in every]
    assert db[JK.queue_bell_of("jobs")] == every[-1].version[:10]  # type: ignore[index]
    # Where they sort: the entries after the earlier consuming operations' pointers ("eh") and
    # before the leased records ("f"); the bell after the lease deadlines ("l"), before the
    # counters ("m"), and the consuming operations' pointers ("mh") right after those.
    sub = JK.root["q"]["jobs"]
    assert JK.earlier_history_range("jobs")[1] <= min(local) and max(local) < sub.pack(("f", ""))
    pointers = store_rows(db, *JK.queue_history_range("jobs"))
    assert len(pointers) == 7 and sub.range(("m",)).stop <= min(pointers)
    assert max(pointers) < sub.pack(("pop", 0)) and max(pointers) < q.keys.ready_range()[0]
    bell = JK.queue_bell_of("jobs")
    assert sub.pack(("l", 2**60, "~")) < bell < sub.pack(("m",))
    assert bell == JK.queue_bell(q.keys)
    # The other readers read them: history, the export's pieces and head.
    for e in every:
        if e.message_id is not None:
            assert e in fdbqueue.history(db, e.message_id)
    rows = _export(db)
    assert [r[0] for r in rows] == [e.version for e in every]
    assert [r[2] for r in rows] == [e.op for e in every]
    assert journal_head(db, ["jobs"]) == every[-1].version
    db.close()


def test_the_same_work_journals_the_same_entries_on_a_spread_engine(tmp_path: Path) -> None:
    """The layout differs, the entries do not: ops, ids' roles, deliveries, reasons, details."""
    got = []
    for url in ("memory://", f"sqlite://{tmp_path / 'q.db'}"):
        db = fdbqueue.open(url)
        fdbqueue.create_queue(db, "jobs", journal=True, retry_delay=0.0)
        ids = _work(Queue("jobs"), db)
        where = {mid: i for i, mid in enumerate(ids)}
        got.append(
            [
                (e.op, where.get(e.message_id or "", e.message_id is None), e.deliveries, e.reason, e.details)
                for e in fdbqueue.journal(db, "jobs")
                if e.message_id is None or e.message_id in where
            ]
        )
        db.close()
    assert got[0] == got[1] and len(got[0]) >= 10


def test_a_follower_is_woken_by_the_queues_own_bell(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", journal=True)
    fdbqueue.create_queue(db, "other", journal=True)
    q = Queue("jobs")
    since = list(fdbqueue.journal(db, None))[-1].version
    seen: dict[str, list[str]] = {"one": [], "every": []}

    def follow(name: str, queue: str | None) -> None:
        for e in fdbqueue.journal(db, queue, since=since, follow=True, timeout=30, limit=3):
            seen[name].append(e.op)

    threads = [threading.Thread(target=follow, args=a) for a in (("one", "jobs"), ("every", None))]
    for t in threads:
        t.start()
    mid = q.enqueue(db, b"a")
    m = q.lease(db, 30)
    assert m is not None and m.id == mid
    q.ack(db, m)
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    assert seen == {"one": ["enqueue", "lease", "ack"], "every": ["enqueue", "lease", "ack"]}
    db.close()


def test_a_destroy_keeps_the_queues_entries_and_a_trim_clears_them(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    first, _ = q.enqueue_many(db, [b"a", b"b"])
    q.dequeue(db)
    before = list(fdbqueue.journal(db, "jobs"))
    fdbqueue.destroy_queue(db, "jobs")
    after = list(fdbqueue.journal(db, "jobs"))
    assert after[: len(before)] == before and [e.op for e in after[len(before) :]] == ["destroy"]
    assert [e.op for e in fdbqueue.history(db, first)] == ["enqueue", "dequeue"]
    assert db[JK.queue_bell_of("jobs")] == after[-1].version[:10]  # type: ignore[index]
    # The same name again: empty, journaling after what was kept.
    fdbqueue.create_queue(db, "jobs", journal=True)
    assert q.size(db) == 0 and q.dequeue(db) is None
    q.enqueue(db, b"c")
    again = list(fdbqueue.journal(db, "jobs"))
    assert again[: len(after)] == after and again[-1].op == "enqueue"
    assert fdbqueue.trim_journal(db, "jobs", before=b"\xff" * 12) == len(again)
    assert store_rows(db, *JK.entry_range("jobs", QUEUE_SHARD, None)) == {}
    assert fdbqueue.history(db, first) == []
    db.close()


def test_a_store_written_before_the_entries_moved_reads_follows_exports_and_continues(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}"
    made = json.loads(run_old(tmp_path, BEFORE, JOURNALED_WORK, url))
    ids: list[str] = made["ids"]
    db = fdbqueue.open(url)
    q = Queue("jobs")
    old = list(fdbqueue.journal(db, "jobs"))
    assert [e.op for e in old] == made["ops"] and len(_old_entries(db)) == len(old)
    assert store_rows(db, *JK.entry_range("jobs", QUEUE_SHARD, None)) == {}
    assert [r[0] for r in _export(db)] == [e.version for e in old]

    followed: list[fdbqueue.JournalEntry] = []

    def follow() -> None:
        followed.extend(fdbqueue.journal(db, "jobs", since=old[-1].version, follow=True, timeout=30, limit=4))

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
    assert every[: len(old)] == old and followed == every[len(old) :]
    assert [e.op for e in followed] == ["lease", "ack", "dequeue", "enqueue"]
    # The new entries in the queue, the old where they were; every reader reads both.
    assert len(_old_entries(db)) == len(old)
    assert len(store_rows(db, *JK.entry_range("jobs", QUEUE_SHARD, None))) == 4
    for mid in ids:
        assert fdbqueue.history(db, mid) == [e for e in every if e.message_id == mid]
    assert [r[0] for r in _export(db)] == [e.version for e in every]
    assert journal_head(db, ["jobs"]) == every[-1].version
    assert fdbqueue.trim_journal(db, "jobs", before=b"\xff" * 12) == len(every)
    assert _old_entries(db) == {} and store_rows(db, *JK.entry_range("jobs", QUEUE_SHARD, None)) == {}
    db.close()


def test_the_shards_a_reader_reads() -> None:
    assert JK.shards(False) == tuple(range(JOURNAL_SHARDS))
    assert JK.shards(True) == (*range(JOURNAL_SHARDS), QUEUE_SHARD)
    sub = JK.root["q"]["jobs"]
    stamp = fdb.tuple.Versionstamp(b"\x01" * 10, 0x0101)
    assert JK.entry_key("jobs", QUEUE_SHARD, b"\x01" * 12) == sub.pack(("ej", stamp))
    assert JK.queue_entry_prefix(Queue("jobs").keys) + b"\x01" * 12 == sub.pack(("ej", stamp))
