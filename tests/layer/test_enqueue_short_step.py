"""The common enqueue's own step (issue 30, fifth pass: ``enqueuing.enqueue_one``): what it
still guarantees.

On the embedded engine an enqueue of bytes without options runs a step of its own: the
settings this process last found for the queue, when still the queue's at the metadata
version read and needing none of the enqueue's checks (``meta.read_plain``); the record,
its journal entry, and the wake counter set to what was read plus one (the ready count is
ready - taken + wake - counted: store/layout.py). Each test
here changes what the step leans on - from another process, another handle, or this one -
and checks the next enqueue acts on the change as the long way would.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import AccessDeniedError, Queue
from fdbqueue.engines.contract import Database
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.errors import QueueStoppedError, StoreError
from fdbqueue.store.meta import read_plain
from fdbqueue.store.record import decode_record

OTHER = textwrap.dedent(
    """
    import sys
    import fdbqueue
    from fdbqueue.api.admin import create_queue
    db = fdbqueue.open(sys.argv[1])
    what = sys.argv[2]
    if what == "owner":
        create_queue(db, "jobs", owner="svc-a")
    elif what == "ttl":
        create_queue(db, "jobs", ttl=60.0)
    elif what == "volatile":
        create_queue(db, "jobs", volatile=True)
    elif what == "journal":
        create_queue(db, "jobs", journal=True, volatile=False)
    elif what == "remade":
        fdbqueue.destroy_queue(db, "jobs")
        create_queue(db, "jobs", journal=True)
        fdbqueue.Queue("jobs").enqueue(db, b"theirs")
    db.close()
    """
)


def other_process(url: str, what: str) -> None:
    subprocess.run([sys.executable, "-c", OTHER, url, what], check=True, timeout=60)


def url_of(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'q.db'}?sync=normal"


def warm(q: Queue, db: Database, n: int = 3) -> None:
    for _ in range(n):  # the first writes the priority marker (a metadata change): warm after it
        q.enqueue(db, b"warm")


def records(db: Database, q: Queue) -> list[tuple[bytes, object]]:
    def body(tr: object) -> list[tuple[bytes, object]]:
        return [(k, decode_record(v, q.keys, k)) for k, v in tr.get_range(*q.keys.ready_range())]  # type: ignore[attr-defined]

    return run_transaction(db, body)


def test_an_owner_set_by_another_process_is_checked_by_the_next_enqueue(tmp_path: Path) -> None:
    url = url_of(tmp_path)
    db = fdbqueue.open(url, principal="svc-b")
    q = Queue("jobs")
    warm(q, db)
    other_process(url, "owner")
    with pytest.raises(AccessDeniedError):
        q.enqueue(db, b"refused")
    owner = fdbqueue.open(url, principal="svc-a")
    assert q.size(owner) == 3
    q.enqueue(owner, b"the owner's")  # the owner may (the long way checks, then the short)
    q.enqueue(owner, b"the owner's")
    assert q.size(owner) == 5
    with pytest.raises(AccessDeniedError):  # the cached settings are the owner's handle's
        q.enqueue(db, b"refused")
    owner.close()
    db.close()


def test_a_ttl_set_by_another_process_is_stamped_on_the_next_message(tmp_path: Path) -> None:
    url = url_of(tmp_path)
    db = fdbqueue.open(url)
    q = Queue("jobs")
    warm(q, db)
    other_process(url, "ttl")
    mid = q.enqueue(db, b"expiring")
    got = q.get(db, mid)
    assert got is not None and got.expires_at is not None
    db.close()


def test_a_volatile_flag_or_a_journal_set_by_another_process_leaves_the_short_read(tmp_path: Path) -> None:
    """read_plain answers from the cached settings only at their metadata version, and only
    for settings that need none of the enqueue's checks."""
    url = url_of(tmp_path)
    db = fdbqueue.open(url)
    q = Queue("jobs")
    keys = q.keys
    warm(q, db)
    assert run_transaction(db, lambda tr: read_plain(tr, keys, 10)) is not None
    other_process(url, "volatile")
    assert run_transaction(db, lambda tr: read_plain(tr, keys, 10)) is None  # another version
    q.enqueue(db, b"volatile")  # the long way: the settings found again
    assert run_transaction(db, lambda tr: read_plain(tr, keys, 10)) is None  # volatile: never
    other_process(url, "journal")  # and volatile off again
    q.enqueue(db, b"journaled")
    found = run_transaction(db, lambda tr: read_plain(tr, keys, 10))
    assert found is not None and found[1].config is not None and found[1].config.journal
    mid = q.enqueue(db, b"short and journaled")
    assert [e.op for e in fdbqueue.history(db, mid)] == ["enqueue"]
    db.close()


def test_a_queue_destroyed_and_made_again_by_another_process_counts_from_its_new_start(
    tmp_path: Path,
) -> None:
    url = url_of(tmp_path)
    db = fdbqueue.open(url)
    q = Queue("jobs")
    warm(q, db, 5)
    other_process(url, "remade")  # its counters start again: one message, the wake counter 1
    mid = q.enqueue(db, b"mine")
    assert q.size(db) == 2
    assert [m.payload for m in q.browse(db)] == [b"theirs", b"mine"]
    assert [e.op for e in fdbqueue.history(db, mid)] == ["enqueue"]  # the journal it was made with
    assert [q.dequeue(db).payload for _ in range(2)] == [b"theirs", b"mine"]  # type: ignore[union-attr]
    assert q.dequeue(db) is None and q.size(db) == 0
    db.close()


def test_a_new_priority_is_marked_and_dequeued_first(tmp_path: Path) -> None:
    db = fdbqueue.open(url_of(tmp_path))
    q = Queue("jobs")
    warm(q, db)
    q.enqueue(db, b"high", priority=7)  # a new marker: a new metadata version
    q.enqueue(db, b"low", priority=-1)
    q.enqueue(db, b"high 2", priority=7)  # the short way again, with the marker cached
    assert q.size(db) == 6
    got = [q.dequeue(db).payload for _ in range(6)]  # type: ignore[union-attr]
    assert got == [b"high", b"high 2", b"warm", b"warm", b"warm", b"low"]
    db.close()


def test_a_pause_in_this_process_is_seen_and_nothing_is_written(tmp_path: Path) -> None:
    db = fdbqueue.open(url_of(tmp_path))
    q = Queue("jobs")
    warm(q, db)
    fdbqueue.set_state(db, "jobs", enqueue=False)
    with pytest.raises(QueueStoppedError):
        q.enqueue(db, b"refused")
    fdbqueue.set_state(db, "jobs", enqueue=True)
    q.enqueue(db, b"after")
    assert [m.payload for m in q.browse(db)] == [b"warm"] * 3 + [b"after"]
    db.close()


def test_a_commit_refused_by_sqlite_writes_nothing_and_the_next_counts_right(tmp_path: Path) -> None:
    """A real failure of the commit's statement (a trigger on the store file refusing one
    record): no message, no counter moved; the handle's next enqueues are counted from what
    the store holds, not from what the failed attempt set."""
    db = fdbqueue.open(url_of(tmp_path))
    q = Queue("jobs")
    warm(q, db)
    conn = sqlite3.connect(tmp_path / "q.db")
    conn.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON kv WHEN instr(NEW.v, x'726566757365') > 0 "
        "BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    conn.commit()
    conn.close()
    with pytest.raises(StoreError):
        q.enqueue(db, b"refuse me")
    q.enqueue(db, b"after")
    q.enqueue(db, b"after 2")
    assert q.size(db) == 5
    assert [m.payload for m in q.browse(db)] == [b"warm"] * 3 + [b"after", b"after 2"]
    assert [q.dequeue(db).payload for _ in range(5)] == [b"warm"] * 3 + [b"after", b"after 2"]  # type: ignore[union-attr]
    assert q.dequeue(db) is None and q.size(db) == 0
    db.close()


def test_an_attempt_that_loses_to_another_writer_is_retried_and_counted_once(tmp_path: Path) -> None:
    """The step's first commit finds the store lock no longer its own (the pin fails, as for a
    holder stalled past its lease whose lock another writer took over: 1007): the attempt is
    retried from fresh reads, one message lands, counted once. (The pins are the attempts: a
    commit pins once; an earlier version of this test counted clock reads, two an attempt.)"""
    db = fdbqueue.open(url_of(tmp_path))
    q = Queue("jobs")
    warm(q, db)
    store = db._store  # type: ignore[attr-defined]
    pin = store.pin
    pins = []

    def losing_once() -> bool:
        pins.append(1)
        return False if len(pins) == 1 else bool(pin())

    store.pin = losing_once
    try:
        mid = q.enqueue(db, b"raced")
    finally:
        store.pin = pin
    assert len(pins) == 2  # the first attempt lost, the second landed
    assert q.size(db) == 4
    assert [m.payload for m in q.browse(db)] == [b"warm"] * 3 + [b"raced"]
    assert [m.id for m in q.browse(db)][-1] == mid
    q.enqueue(db, b"next")
    assert [q.dequeue(db).payload for _ in range(5)] == [b"warm"] * 3 + [b"raced", b"next"]  # type: ignore[union-attr]
    assert q.size(db) == 0
    db.close()


def test_the_short_way_stores_the_long_ways_record_and_counters(tmp_path: Path) -> None:
    """Two stores side by side: one enqueues through Queue.enqueue (the short way), the other
    through a caller's transaction (the long way): the same records but for ids and times,
    the same counters."""
    a = fdbqueue.open(f"sqlite://{tmp_path / 'a.db'}?sync=normal")
    b = fdbqueue.open(f"sqlite://{tmp_path / 'b.db'}?sync=normal")
    q = Queue("jobs")
    for i in range(5):
        q.enqueue(a, b"x%d" % i, priority=i % 2)
        run_transaction(b, lambda tr, i=i: q.enqueue(tr, b"x%d" % i, priority=i % 2))
    ra, rb = records(a, q), records(b, q)
    assert len(ra) == len(rb) == 5
    for (_, va), (_, vb) in zip(ra, rb, strict=True):  # in key order: priority, then index
        assert (va.payload, va.headers, va.expires_us, va.deliveries, va.content_type, va.chunks) == (  # type: ignore[attr-defined]
            vb.payload,  # type: ignore[attr-defined]
            vb.headers,  # type: ignore[attr-defined]
            vb.expires_us,  # type: ignore[attr-defined]
            vb.deliveries,  # type: ignore[attr-defined]
            vb.content_type,  # type: ignore[attr-defined]
            vb.chunks,  # type: ignore[attr-defined]
        )
    keys = q.keys
    counters = keys.meta_read()[1:3]
    assert run_transaction(a, lambda tr: tr.get_many(counters)) == run_transaction(
        b, lambda tr: tr.get_many(counters)
    )
    a.close()
    b.close()


def test_a_journaled_short_enqueue_writes_records_entry_byte_for_byte(tmp_path: Path) -> None:
    """journaling.record_enqueue (the short step's entry) against record's: a named principal
    with characters JSON escapes, priorities 0, negative and positive; each value is
    ``json.dumps`` of its fields, with its history pointer, and the bell rung."""
    import json

    from fdbqueue.store.layout import DEFAULT_ROOT, QUEUE_SHARD, JournalKeys

    db = fdbqueue.open(url_of(tmp_path), principal='svc "a" é')
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    warm(q, db, 2)
    ids = [q.enqueue(db, b"x", priority=p) for p in (0, -5, 2**31 - 1)]
    entries = {e.message_id: e for e in fdbqueue.journal(db, "jobs") if e.op == "enqueue"}
    jk = JournalKeys.make(DEFAULT_ROOT)
    tr = db.create_transaction()
    for mid, details in zip(ids, ({}, {"priority": -5}, {"priority": 2**31 - 1}), strict=True):
        e = entries[mid]
        assert (e.principal, e.details) == ('svc "a" é', details)
        raw = tr.get(jk.entry_key("jobs", QUEUE_SHARD, e.version))  # (in the queue: the embedded engine)
        want = [1, "enqueue", mid, 'svc "a" é', 0, None, details, round(e.at * 1e6)]
        assert raw == json.dumps(want, separators=(",", ":")).encode()
        assert [h.version for h in fdbqueue.history(tr, mid)] == [e.version]
    tr.cancel()
    db.close()


def test_a_new_priority_gets_its_marker_and_a_new_metadata_version(tmp_path: Path) -> None:
    """The short step counts a message of a priority the queue has a marker for; one of a new
    priority goes through count_new, which writes the marker and a new metadata version."""
    db = fdbqueue.open(url_of(tmp_path))
    q = Queue("jobs")
    warm(q, db)

    def marker_and_version(p: int) -> tuple[object, object]:
        return run_transaction(
            db, lambda tr: (tr.get(q.keys.priority_marker(p)), tr.get(q.keys.metadata_version))
        )

    before = marker_and_version(7)
    assert before[0] is None
    q.enqueue(db, b"high", priority=7)
    after = marker_and_version(7)
    assert after[0] == b"" and after[1] != before[1]
    q.enqueue(db, b"high 2", priority=7)
    assert marker_and_version(7) == after  # known now: no new version
    db.close()


def test_counters_at_their_limit_or_of_another_length_are_counted_as_an_add_would(tmp_path: Path) -> None:
    """The short step sets the wake counter to what it read plus one (the ready count is ready -
    taken + wake - counted: the ready counter is left as it is); a wake counter at 2**63 - 1
    wraps as FoundationDB's ADD does, and one of four bytes is widened as the add's operand:
    both are left to count_new, which counts as an add, the counted counter with it."""
    import struct

    db = fdbqueue.open(url_of(tmp_path))
    q = Queue("jobs")
    warm(q, db)
    ready, wake, counted = (q.keys.counter(c) for c in ("ready", "wake", "counted"))

    def get(key: bytes) -> bytes | None:
        return run_transaction(db, lambda tr: tr.get(key))

    def set_wake(value: bytes) -> None:
        run_transaction(db, lambda tr: tr.set(wake, value))

    before = get(ready), get(counted)
    q.enqueue(db, b"short")
    assert (get(ready), get(counted)) == before and get(wake) == struct.pack("<q", 4)
    set_wake(struct.pack("<q", 2**63 - 1))
    q.enqueue(db, b"wraps")
    assert get(wake) == struct.pack("<q", -(2**63))
    assert get(ready) == struct.pack("<q", unpack(before[0]) + 1)  # count_new's: ready, counted
    assert get(counted) == struct.pack("<q", unpack(before[1]) + 1)
    set_wake(b"\x05\x00\x00\x00")
    q.enqueue(db, b"widens")
    assert get(wake) == struct.pack("<q", 6)
    db.close()


def unpack(raw: bytes | None) -> int:
    import struct

    assert raw is not None
    return int(struct.unpack("<q", raw)[0])
