"""A journaled operation's rows: whatever the way the journal hands them to the engine (one
``set_journal_entry`` call since issue 30's sixth pass, three versionstamped templates
before), each operation leaves exactly the rows the templates name - the entry at
``JournalKeys.entry_to_stamp``'s key, its history pointer at ``history_to_stamp``'s (on the
embedded engine, since issue 30's seventh pass, a pointer of an operation other than an
arrival in its queue's keys, ``queue_history_key``; since the eighth, an arrival's there too,
``arrival_key``; since the ninth, the entry and the bell there too, ``entry_key`` of
``QUEUE_SHARD`` and ``queue_bell_of``), the queue's bell - with the commit's own
stamp, on every engine; the journal, a message's history
and a follower in another process read them as before; a failed commit and its retry leave
one entry."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.contract import Database
from fdbqueue.engines.local.mutations import fill_versionstamp
from fdbqueue.errors import QueueError
from fdbqueue.ops.journaling import ARRIVALS
from fdbqueue.store.layout import DEFAULT_ROOT, QUEUE_SHARD, JournalKeys
from fdbqueue.testing import FaultScript

JK = JournalKeys.make(DEFAULT_ROOT)


def _journal_rows(db: Database) -> dict[bytes, bytes]:
    """Every row of the journal's keyspace: entries, history pointers (those in the journaled
    queues' keys too), bells, the registry."""
    root = JK.root.key()
    tr: Any = db.create_transaction()
    got = {}
    for kind in ("j", "h", "jn", "jq"):
        r = JK.root.range((kind,))
        got.update({kv.key: kv.value for kv in tr.get_range(r.start, r.stop)})
    got.update({kv.key: kv.value for kv in tr.get_range(root + b"\x02jn\x00", root + b"\x02jn\x01")})
    for reg in tr.get_range(*JK.registry_range()):
        q = JK.registry_name(reg.key)
        for begin, end in (*JK.queue_kept_ranges(q), JK.entry_range(q, QUEUE_SHARD, None)):
            got.update({kv.key: kv.value for kv in tr.get_range(begin, end)})
    tr.cancel()
    return got


def _check(
    db: Database, stamp: bytes, entries: list[fdbqueue.JournalEntry], rows: dict[bytes, bytes]
) -> None:
    """``rows`` (what one commit added or changed) are the rows the templates name for
    ``entries`` (its entries, in their order) and its bell, each entry's value ``json.dumps``
    of its fields."""
    spread = getattr(db, "may_conflict", True)
    want = {}
    for order, e in enumerate(entries):
        assert e.version == stamp + order.to_bytes(2, "big")
        shard = JK.shard(e.message_id) if spread else QUEUE_SHARD  # one writer: in the queue
        key = (
            fill_versionstamp(JK.entry_to_stamp(e.queue, shard, order), stamp)
            if spread
            else JK.entry_key(e.queue, shard, e.version)
        )
        raw = rows.get(key, b"null")
        fields = json.loads(raw)
        assert fields[:7] == [1, e.op, e.message_id, e.principal, e.deliveries, e.reason, e.details]
        assert fields[7] / 1e6 == e.at
        assert raw == json.dumps(fields, separators=(",", ":")).encode()
        want[key] = raw
        if e.message_id is not None and spread:
            want[fill_versionstamp(JK.history_to_stamp(e.message_id, order), stamp)] = (
                e.queue.encode() + b"\x00" + bytes((shard,))
            )
        elif e.message_id is not None and e.op in ARRIVALS:  # one writer: after the ready range
            want[JK.arrival_key(e.queue, e.message_id, e.version)] = bytes((shard,))
        elif e.message_id is not None:  # one writer at a time: in the queue, beside its head
            want[JK.queue_history_key(e.queue, e.message_id, e.version)] = bytes((shard,))
    for q in {e.queue for e in entries}:
        want[JK.bell(q) if spread else JK.queue_bell_of(q)] = stamp
    assert rows == want


def _committed(db: Database, body: Callable[[Any], object]) -> tuple[object, bytes, dict[bytes, bytes]]:
    """``body`` in one transaction: what it returned, the commit's stamp, the journal rows it
    added or changed."""
    before = _journal_rows(db)
    tr: Any = db.create_transaction()
    out = body(tr)
    stamp = tr.get_versionstamp()
    tr.commit()
    after = _journal_rows(db)
    return out, stamp.wait(), {k: v for k, v in after.items() if before.get(k) != v}


def test_each_journaled_operation_leaves_the_rows_its_templates_name(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True, retry_delay=0.0)
    q = Queue("jobs")
    ids = q.enqueue_many(db, [b"a", b"b", b"c", b"d", b"e"])
    seen = len(list(fdbqueue.journal(db, "jobs")))
    steps: list[tuple[str, Callable[[Any], object]]] = [
        ("enqueue", lambda tr: q.enqueue(tr, b"f")),
        ("enqueue", lambda tr: q.enqueue(tr, b"g", priority=3, headers={"h": "1"})),
        ("dequeue", lambda tr: q.dequeue(tr)),
        ("lease", lambda tr: q.lease(tr, 30)),
    ]
    leased: list[fdbqueue.Message] = []
    for op, body in steps:
        out, stamp, rows = _committed(db, body)
        if op == "lease":
            assert isinstance(out, fdbqueue.Message)
            leased.append(out)
        entries = list(fdbqueue.journal(db, "jobs"))[seen:]
        seen += len(entries)
        assert [e.op for e in entries] == [op]
        _check(db, stamp, entries, rows)
    for op, settle in [
        ("nack", lambda tr: q.nack(tr, leased[-1])),
        ("lease", lambda tr: leased.append(q.lease(tr, 30))),  # type: ignore[func-returns-value]
        ("ack", lambda tr: q.ack(tr, leased[-1])),
        ("lease", lambda tr: leased.append(q.lease(tr, 30))),  # type: ignore[func-returns-value]
        ("release", lambda tr: q.release(tr, leased[-1])),
        ("delete", lambda tr: q.delete(tr, ids[-1])),
    ]:
        _, stamp, rows = _committed(db, settle)
        entries = list(fdbqueue.journal(db, "jobs"))[seen:]
        seen += len(entries)
        assert [e.op for e in entries] == [op]
        _check(db, stamp, entries, rows)
    # Every message's history: its entries, in commit order, through its pointers.
    every = list(fdbqueue.journal(db, "jobs"))
    for mid in {e.message_id for e in every if e.message_id is not None}:
        assert fdbqueue.history(db, mid) == [e for e in every if e.message_id == mid]


def test_several_entries_of_one_transaction_take_their_orders_and_one_bell(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True)
    fdbqueue.create_queue(db, "other", journal=True)
    q, other = Queue("jobs"), Queue("other")
    q.enqueue_many(db, [b"a", b"b"])
    before = len(list(fdbqueue.journal(db, None)))

    def body(tr: Any) -> None:
        q.dequeue(tr)
        other.enqueue(tr, b"x")
        q.dequeue(tr)
        q.enqueue(tr, b"c")

    _, stamp, rows = _committed(db, body)
    entries = sorted(list(fdbqueue.journal(db, None))[before:], key=lambda e: e.version)
    assert [(e.queue, e.op) for e in entries] == [
        ("jobs", "dequeue"), ("other", "enqueue"), ("jobs", "dequeue"), ("jobs", "enqueue"),
    ]  # fmt: skip
    _check(db, stamp, entries, rows)


def test_a_queues_own_entry_has_no_pointer(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True)
    _, stamp, rows = _committed(db, lambda tr: fdbqueue.set_state(tr, "jobs", dequeue=False))
    (entry,) = [e for e in fdbqueue.journal(db, "jobs") if e.op == "state"]
    _check(db, stamp, [entry], rows)


@pytest.mark.parametrize("fault", [1020, 1007, ("1021", False), ("1021", True)])
@pytest.mark.parametrize("op", ["dequeue", "lease", "ack", "nack"])
def test_a_failed_or_unknown_commit_of_a_consuming_operation_leaves_one_entry(fault: object, op: str) -> None:
    """A journaled dequeue, lease, ack or nack whose commit fails (a conflict, too old, an
    unknown result that did or did not land) and is retried: one entry, one history pointer,
    and the bell at the entry's stamp."""
    db = fdbqueue.open("sim://?seed=7&faults=0")
    fdbqueue.create_queue(db, "jobs", journal=True, retry_delay=0.0)
    q = Queue("jobs")
    first, second = q.enqueue_many(db, [b"a", b"b"])
    m = q.lease(db, 30) if op in ("ack", "nack") else None
    script = FaultScript(db)
    script.arm([fault])
    if op == "dequeue":
        assert q.dequeue(db) is not None
    elif op == "lease":
        assert q.lease(db, 30) is not None
    elif op == "ack":
        assert m is not None
        q.ack(db, m)
    else:
        assert m is not None
        q.nack(db, m)
    entries = [e for e in fdbqueue.journal(db, "jobs") if e.op == op]
    assert len(entries) == 1 and entries[0].message_id == first
    assert [e.op for e in fdbqueue.history(db, first)] == ["enqueue", *(["lease"] if m else []), op]
    assert [e.op for e in fdbqueue.history(db, second)] == ["enqueue"]
    assert db[JK.bell("jobs")] == entries[0].version[:10]  # type: ignore[index]


def test_a_commit_sqlite_refuses_leaves_no_row_and_its_retry_one_each(tmp_path: Path) -> None:
    """The embedded engine's statement refused (a trigger refusing a history pointer's row,
    once: the dequeue's, in the queue's keys): neither the dequeue nor any of its journal rows
    lands; the retried dequeue writes its entry, pointer and bell once."""
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    mid = q.enqueue(db, b"a")
    rows = _journal_rows(db)
    conn = sqlite3.connect(path)
    pointers = JK.queue_history_range("jobs", mid)[0][:-1]  # the range begins with a NUL after it
    conn.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON kv "
        f"WHEN substr(NEW.k, 1, {len(pointers)}) = x'{pointers.hex()}' "
        "BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    conn.commit()
    tr: Any = db.create_transaction()
    assert q.dequeue(tr) is not None
    with pytest.raises(QueueError):
        tr.commit()
    assert _journal_rows(db) == rows and q.size(db) == 1
    conn.execute("DROP TRIGGER refuse")
    conn.commit()
    conn.close()
    _, stamp, added = _committed(db, lambda t: q.dequeue(t))
    entries = [e for e in fdbqueue.journal(db, "jobs") if e.op == "dequeue"]
    assert [e.message_id for e in entries] == [mid]
    _check(db, stamp, entries, added)
    assert [e.op for e in fdbqueue.history(db, mid)] == ["enqueue", "dequeue"]
    db.close()


_FOLLOWER = r"""
import sys, fdbqueue
db = fdbqueue.open(sys.argv[1])
since = bytes.fromhex(sys.argv[2])
for e in fdbqueue.journal(db, "jobs", since=since, follow=True, timeout=30, limit=int(sys.argv[3])):
    print(e.op, e.message_id, e.version.hex(), flush=True)
print("history", *(e.op for e in fdbqueue.history(db, sys.argv[4])), flush=True)
db.close()
"""


def test_a_follower_in_another_process_is_woken_by_each_consuming_operation(tmp_path: Path) -> None:
    """Another process follows the journal (waiting on the queue's bell between entries) while
    this one dequeues, leases, nacks and acks: it sees every entry as it commits, and the
    message's history as this process wrote it."""
    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, "jobs", journal=True, retry_delay=0.0)
    q = Queue("jobs")
    first, second = q.enqueue_many(db, [b"a", b"b"])
    since = list(fdbqueue.journal(db, "jobs"))[-1].version
    follower = subprocess.Popen(
        [sys.executable, "-c", _FOLLOWER, url, since.hex(), "5", second],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    leased: list[Any] = []
    try:
        steps: list[Callable[[], object]] = [
            lambda: q.dequeue(db),
            lambda: leased.append(q.lease(db, 30)),  # type: ignore[func-returns-value]
            lambda: q.nack(db, leased[-1]),
            lambda: leased.append(q.lease(db, 30)),  # type: ignore[func-returns-value]
            lambda: q.ack(db, leased[-1]),
        ]
        lines = []
        for step in steps:
            time.sleep(0.2)  # the follower back on its watch (not a timed assertion: it only waits)
            step()
            lines.append(follower.stdout.readline().split())
        lines.append(follower.stdout.readline().split())
        assert follower.wait(timeout=60) == 0
    finally:
        follower.kill()
    entries = list(fdbqueue.journal(db, "jobs", since=since))
    assert [line[:3] for line in lines[:-1]] == [[e.op, e.message_id, e.version.hex()] for e in entries]
    assert [e.op for e in entries] == ["dequeue", "lease", "nack", "lease", "ack"]
    assert [e.message_id for e in entries] == [first, second, second, second, second]
    assert lines[-1] == ["history", "enqueue", "lease", "nack", "lease", "ack"]
    db.close()
