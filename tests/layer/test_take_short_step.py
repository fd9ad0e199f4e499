"""The common dequeue's own step (issue 30, sixth pass: ``ops/head.py`` ``take_short``): what it
still guarantees.

On the embedded engine a ``dequeue(tr)`` in a caller's transaction whose head is the first
record of the run the last take kept runs a step of its own: the settings this process last
found for the queue, when still the queue's at the metadata version read and needing none of
the dequeue's checks (``meta.read_take``); the counters read with that version; the record's
fields as decoded; three writes and one callback. Each test here changes what the step leans
on - from another process, another handle, or this one - and checks that the next dequeue acts
on the change as the long way (``Queue._take``) would: the same message, the same counts, the
same refusals.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import AccessDeniedError, Queue
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.errors import QueueStoppedError
from fdbqueue.store.codec import unpack_count
from fdbqueue.store.meta import read_take

OTHER = textwrap.dedent(
    """
    import sys
    import fdbqueue
    from fdbqueue.api.admin import create_queue, set_state
    db = fdbqueue.open(sys.argv[1])
    what = sys.argv[2]
    q = fdbqueue.Queue("jobs")
    if what == "pause":
        set_state(db, "jobs", dequeue=False)
    elif what == "delay":
        q.enqueue(db, b"due", priority=5, delay=0.5)
    elif what == "remade":
        fdbqueue.destroy_queue(db, "jobs")
        q.enqueue_many(db, [b"new0", b"new1"])
    elif what == "take":
        @fdbqueue.transactional
        def take(tr):
            return q.dequeue(tr)
        print(take(db).payload.decode())
    elif what == "journal":
        create_queue(db, "jobs", journal=True)
    db.close()
    """
)


def other_process(url: str, what: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", OTHER, url, what], check=True, timeout=60, capture_output=True, text=True
    )
    return done.stdout.strip()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'q.db'}?sync=normal"


@pytest.fixture
def db(url: str) -> Iterator[Database]:
    database = fdbqueue.open(url)
    yield database
    database.close()


@fdbqueue.transactional
def take(tr: Transaction, q: Queue) -> fdbqueue.Message | None:
    return q.dequeue(tr)


def filled(db: Database, n: int = 20, **options: Any) -> Queue:
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(n)], **options)
    return q


def payloads(ms: list[fdbqueue.Message | None]) -> list[bytes]:
    return [m.payload for m in ms if m is not None]


def counts(db: Database) -> tuple[int, int, int]:
    st = fdbqueue.queue_stats(db, "jobs")
    return st.ready, st.inflight, st.done


def long_way_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the long way fail loudly: a take that must be the short step's."""

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the long way ran")

    monkeypatch.setattr(Queue, "_take", refused)


def test_the_common_dequeue_is_the_short_steps_and_hands_out_what_the_long_way_would(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer alone: after the first take (the long way, which keeps the run), the takes of
    the run are the short step's; every message once, in order, with the long way's fields."""
    q = Queue("jobs")
    q.enqueue(db, b"m0")
    q.enqueue(db, "text", headers={"h": 1})
    q.enqueue(db, {"json": [1]}, priority=0)
    q.enqueue(db, b"m3")
    first = take(db, q)
    with monkeypatch.context() as m:
        long_way_refused(m)
        short = [take(db, q) for _ in range(3)]
    assert first is not None and first.payload == b"m0"
    assert [m.payload for m in short if m is not None] == [b"text", b'{"json":[1]}', b"m3"]
    text = short[0]
    assert text is not None
    assert text.content_type == fdbqueue.ContentType.TEXT and text.text() == "text"
    assert dict(text.headers) == {"h": 1} and dict(text.extra) == {}
    assert text.deliveries == 1 and text.priority == 0 and text.expires_at is None
    assert text.queue == "jobs" and text.receipt is None and text.lease_deadline is None
    assert take(db, q) is None
    assert counts(db) == (0, 0, 4)


def test_the_short_step_gives_the_message_and_store_the_long_way_gives(tmp_path: Path) -> None:
    """Two stores, the same messages: one taken by the short step, the other by the long way
    (dequeue with a filter that matches everything has no short step; here the long way is
    forced by taking each message as the first of a fresh handle, which keeps no run). The
    messages are equal but for their ids and keys, the stores hold the same counters."""
    results = []
    for name, fresh in (("a", False), ("b", True)):
        url = f"sqlite://{tmp_path / name}.db?sync=normal"
        d = fdbqueue.open(url)
        q = Queue("jobs")
        q.enqueue_many(d, [b"x", b"y", b"z"], headers={"k": "v"})
        got = []
        for _ in range(3):
            if fresh:
                d.close()
                d = fdbqueue.open(url)
            got.append(take(d, q))
        results.append((got, counts(d)))
        d.close()
    (short, short_counts), (long, long_counts) = results
    assert short_counts == long_counts == (0, 0, 3)

    def fields(m: fdbqueue.Message | None) -> dict[str, Any]:
        assert m is not None
        out = dict(m.__dict__)
        for varying in ("id", "key", "enqueued_at"):
            out.pop(varying)
        return out

    assert [fields(m) for m in short] == [fields(m) for m in long]


def test_a_pause_by_another_process_refuses_the_next_dequeue_and_takes_nothing(
    url: str, db: Database
) -> None:
    q = filled(db, 10)
    assert payloads([take(db, q), take(db, q)]) == [b"m0", b"m1"]
    other_process(url, "pause")
    with pytest.raises(QueueStoppedError):
        take(db, q)
    assert counts(db) == (8, 0, 2)


def test_settings_changed_by_another_process_are_not_the_cached_ones(url: str, db: Database) -> None:
    """read_take answers only while the settings this process holds are those at the metadata
    version read: after another process changes them, it reads and says no (the long way
    refreshes them), and the journal they now set is written by the next take."""
    q = filled(db, 10)
    assert payloads([take(db, q), take(db, q)]) == [b"m0", b"m1"]
    assert run_transaction(db, lambda tr: read_take(tr, q.keys)) is not None
    other_process(url, "journal")
    assert run_transaction(db, lambda tr: read_take(tr, q.keys)) is None
    got = [take(db, q), take(db, q)]
    assert payloads(got) == [b"m2", b"m3"]
    taken = [(e.message_id, e.deliveries) for e in fdbqueue.journal(db, "jobs") if e.op == "dequeue"]
    assert taken == [(m.id, 1) for m in got if m is not None]


def test_a_queue_destroyed_and_made_again_by_another_process_is_taken_from_its_new_start(
    url: str, db: Database
) -> None:
    q = filled(db, 10)
    assert payloads([take(db, q), take(db, q)]) == [b"m0", b"m1"]
    other_process(url, "remade")
    assert payloads([take(db, q), take(db, q), take(db, q)]) == [b"new0", b"new1"]
    assert counts(db) == (0, 0, 2)


def test_a_message_taken_by_another_process_is_not_handed_out_again(url: str, db: Database) -> None:
    q = filled(db, 10)
    assert payloads([take(db, q), take(db, q)]) == [b"m0", b"m1"]
    assert other_process(url, "take") == "m2"
    assert payloads([take(db, q), take(db, q)]) == [b"m3", b"m4"]
    assert counts(db) == (5, 0, 5)


def test_a_delay_enqueued_by_another_process_comes_first_once_due(url: str, db: Database) -> None:
    """The delayed counter is the step's only sign of it: the kept run's counters and the
    metadata version are as they were (the priority's marker is there already)."""
    q = Queue("jobs")
    q.enqueue(db, b"first", priority=5)
    q.enqueue_many(db, [f"m{i}".encode() for i in range(10)])
    assert payloads([take(db, q), take(db, q), take(db, q)]) == [b"first", b"m0", b"m1"]
    other_process(url, "delay")
    time.sleep(0.6)
    assert payloads([take(db, q), take(db, q)]) == [b"due", b"m2"]


def test_an_expired_lease_comes_back_before_the_kept_run(db: Database) -> None:
    """A lease in flight (the inflight counter) may expire with no commit: the next dequeue
    makes it ready first."""
    q = filled(db, 10)
    held = q.lease(db, 0.5)
    assert held is not None and held.payload == b"m0"
    assert payloads([take(db, q), take(db, q)]) == [b"m1", b"m2"]
    time.sleep(0.6)
    back = take(db, q)
    assert back is not None and back.payload == b"m0" and back.deliveries == 2
    assert payloads([take(db, q)]) == [b"m3"]
    assert counts(db) == (6, 0, 4)


def test_an_owned_queue_checks_the_principal_of_every_take(db: Database) -> None:
    """The handle's principal can change between takes (``Database.principal``): the short step
    does not serve an owned queue, whose every take checks it."""
    fdbqueue.create_queue(db, "jobs", owner="svc-a")
    db.principal = "svc-a"  # type: ignore[misc]
    q = filled(db, 10)
    assert payloads([take(db, q), take(db, q)]) == [b"m0", b"m1"]
    db.principal = "svc-b"  # type: ignore[misc]
    with pytest.raises(AccessDeniedError):
        take(db, q)
    db.principal = "svc-a"  # type: ignore[misc]
    assert payloads([take(db, q)]) == [b"m2"]


def test_a_counter_at_its_limit_or_not_of_eight_bytes_is_counted_as_an_add_would(db: Database) -> None:
    """The step counts a take in the taken counter alone, written as read plus one; at 2**63 - 1
    (an add would wrap) or at a value of another length (an add would zero-extend it) it leaves
    the take to the long way, which counts it in the ready and done counters as adds do and
    leaves taken as it is."""
    q = filled(db, 10)
    assert payloads([take(db, q), take(db, q)]) == [b"m0", b"m1"]
    ready, done, taken = (q.keys.counter(c) for c in ("ready", "done", "taken"))

    def stored() -> tuple[int, int, bytes | None]:
        got = run_transaction(db, lambda tr: (tr.get(ready), tr.get(done), tr.get(taken)))
        return unpack_count(got[0]), unpack_count(got[1]), got[2]

    before = stored()
    assert payloads([take(db, q)]) == [b"m2"]  # the step: taken + 1, ready and done as they were
    assert stored() == (before[0], before[1], struct.pack("<q", unpack_count(before[2]) + 1))

    @fdbqueue.transactional
    def set_taken_then_take(tr: Transaction, value: bytes) -> fdbqueue.Message | None:
        tr.set(taken, value)
        return q.dequeue(tr)

    before = stored()
    assert payloads([set_taken_then_take(db, struct.pack("<q", 2**63 - 1))]) == [b"m3"]
    assert stored() == (before[0] - 1, before[1] + 1, struct.pack("<q", 2**63 - 1))
    assert payloads([set_taken_then_take(db, b"\x05\x00\x00\x00")]) == [b"m4"]
    assert stored() == (before[0] - 2, before[1] + 2, b"\x05\x00\x00\x00")


def test_an_aborted_short_take_counts_the_failed_delivery_and_keeps_no_run(db: Database) -> None:
    """The caller's transaction aborts: the message is back at the head, its delivery counted
    as failed, and the run the take would have kept is not kept (the next take reads again)."""
    q = filled(db, 10)
    assert payloads([take(db, q), take(db, q)]) == [b"m0", b"m1"]

    class Boom(Exception):
        pass

    @fdbqueue.transactional
    def failing(tr: Transaction) -> None:
        m = q.dequeue(tr)
        assert m is not None and m.payload == b"m2"
        raise Boom

    with pytest.raises(Boom):
        failing(db)
    again = take(db, q)
    assert again is not None and again.payload == b"m2" and again.deliveries == 2
    assert payloads([take(db, q), take(db, q)]) == [b"m3", b"m4"]
    assert counts(db) == (5, 0, 5)


def test_two_takes_in_one_transaction_and_an_enqueue_between(db: Database) -> None:
    q = filled(db, 10)
    assert payloads([take(db, q)]) == [b"m0"]

    @fdbqueue.transactional
    def mixed(tr: Transaction) -> list[fdbqueue.Message | None]:
        got = [q.dequeue(tr), q.dequeue(tr)]
        q.enqueue(tr, b"urgent", priority=2)
        got.append(q.dequeue(tr))
        return got

    assert payloads(mixed(db)) == [b"m1", b"m2", b"urgent"]
    assert payloads([take(db, q), take(db, q)]) == [b"m3", b"m4"]
    assert counts(db) == (5, 0, 6)


def test_a_ttl_a_retry_delay_or_chunks_take_the_long_way(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record with a TTL (expiry to check and an entry to clear), chunks, or extra fields (a
    retry delay) is the long way's: taken as it takes it."""
    q = Queue("jobs")
    q.enqueue(db, b"m0")
    q.enqueue(db, b"ttl", ttl=60.0)
    q.enqueue(db, b"big" * 40_000)
    q.enqueue(db, b"m3")
    calls: list[int] = []
    real = Queue._take

    def counted(self: Queue, *args: Any, **kwargs: Any) -> fdbqueue.Message | None:
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Queue, "_take", counted)
    got = [take(db, q) for _ in range(5)]
    assert [len(m.payload) for m in got if m is not None] == [2, 3, 120_000, 2]
    assert got[1] is not None and got[1].expires_at is not None
    assert len(calls) == 4  # m0 (no run kept yet), ttl, big, and the empty queue; m3 the step's
    assert counts(db) == (0, 0, 4)


def test_a_volatile_queues_takes_still_skip_the_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A volatile queue's take declares its prefix (the long way's read_meta_for does): its
    commit skips the engine's fdatasync, take after take (``tests/layer/test_volatile.py``)."""
    import os

    import fdbqueue.engines.sqlite.walsync as walsync

    calls: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(walsync.os, "fdatasync", counted)
    d = fdbqueue.open(f"sqlite:///{tmp_path / 'q.db'}")  # sync=full: a durable commit syncs
    try:
        fdbqueue.create_queue(d, "jobs", volatile=True)
        q = filled(d, 10)
        before = len(calls)
        assert payloads([take(d, q) for _ in range(5)]) == [f"m{i}".encode() for i in range(5)]
        assert len(calls) == before
    finally:
        d.close()


def test_a_strict_queue_hands_out_nothing_while_a_delivery_is_in_flight(db: Database) -> None:
    """Strict order: one delivery in flight at a time. (The step serves no strict queue; the
    inflight counter a lease leaves would send it the long way too.)"""
    fdbqueue.create_queue(db, "jobs", strict_order=True)
    q = filled(db, 10)
    assert payloads([take(db, q), take(db, q)]) == [b"m0", b"m1"]
    held = q.lease(db)
    assert held is not None and held.payload == b"m2"
    assert take(db, q) is None
    q.ack(db, held)
    assert payloads([take(db, q), take(db, q)]) == [b"m3", b"m4"]


def test_a_message_away_from_home_leaves_no_id_entry_behind(db: Database) -> None:
    """An autonomous enqueue's id is made before its place (an id entry points at it): its take
    clears that entry with the record, as the long way's remove_message does."""
    q = Queue("jobs")

    @fdbqueue.transactional
    def autonomous(tr: Transaction, payload: bytes) -> str:
        return q.enqueue(tr, payload, autonomous=True)

    ids = [autonomous(db, f"a{i}".encode()) for i in range(4)]
    assert all(run_transaction(db, lambda tr, i=i: tr.get(q.keys.id_key(i))) is not None for i in ids)  # type: ignore[misc]
    got = [take(db, q) for _ in range(4)]
    assert [m.id for m in got if m is not None] == ids
    assert [run_transaction(db, lambda tr, i=i: tr.get(q.keys.id_key(i))) for i in ids] == [None] * 4  # type: ignore[misc]
    assert q.get(db, ids[3]) is None


def test_threads_taking_from_one_handle_take_every_message_once(db: Database) -> None:
    """Threads share a handle and its kept run: a take that finds the run taken by another
    thread's take (whose transaction ended, its callback not yet run) goes the long way."""
    import threading

    q = filled(db, 400)
    got: list[bytes] = []
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            while (m := take(db, q)) is not None:
                got.append(m.payload)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(400))
    assert counts(db) == (0, 0, 400)


def test_decode_fields_is_record_decode_or_none_for_every_shape() -> None:
    """The step's decode answers with Record.decode's fields or not at all (the long way then
    decodes or reports the damage): plain, headers, extra, TTL, chunks; a flipped byte, another
    spacing, a list of seven fields, an object, bad text, too short."""
    import json
    import zlib

    from fdbqueue.errors import CorruptMessageError
    from fdbqueue.store.record import Record, decode_fields

    def sealed(meta: bytes, payload: bytes = b"p") -> bytes:
        body = struct.pack("<BI", 2, len(meta)) + meta + payload
        return body + struct.pack("<I", zlib.crc32(body))

    good = [
        Record("rab12", 1, "b", {}, 0, None, 0, {}, b"x" * 200).encode(),
        Record("rab12", 1, "t", {"h": [1, {"a": None}]}, 3, None, 0, {}, b"text").encode(),
        Record("rab12", 1, "j", {}, 0, 10**15, 2, {"origin": "q"}, b"").encode(),
    ]
    for raw in good:
        assert decode_fields(raw) == list(Record.decode(raw))
    spaced = sealed(json.dumps(["r1", 1, "b", {}, 0, None, 0, {}]).encode())  # ", " between fields
    assert decode_fields(spaced) == list(Record.decode(spaced))
    trailing = sealed(b'["r1",1,"b",{},0,null,0,{}] ')  # Record.decode's decode() answers
    assert decode_fields(trailing) is None and Record.decode(trailing).id == "r1"
    flipped = bytearray(good[0])
    flipped[10] ^= 1
    damaged = [
        bytes(flipped),
        sealed(b'["r1",1,"b",{},0,null,0]'),
        sealed(b'{"id":"r1"}'),
        sealed(b"\xff\xfe"),
        b"\x02\x00",
    ]
    for raw in damaged:
        assert decode_fields(raw) is None
        with pytest.raises(CorruptMessageError):
            Record.decode(raw)


def test_a_dequeue_in_its_own_transaction_takes_the_short_step_and_survives_a_refused_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dequeue(db)`` on the embedded engine (no staged set, no receipt) tries the step too. A
    commit SQLite refuses (a trigger on the store file) takes nothing and keeps no run: the
    next dequeue hands out the same message, its delivery not counted (the engine's failure,
    not the message's), and every message once, the counts exact."""
    import sqlite3

    from fdbqueue.errors import StoreError

    d = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        q = filled(d, 10)
        assert payloads([q.dequeue(d)]) == [b"m0"]
        with monkeypatch.context() as m:
            long_way_refused(m)
            assert payloads([q.dequeue(d), q.dequeue(d)]) == [b"m1", b"m2"]
        head = next(iter(q.browse(d)))
        assert head.payload == b"m3"
        conn = sqlite3.connect(tmp_path / "q.db")
        conn.execute(
            f"CREATE TRIGGER refuse BEFORE DELETE ON kv WHEN OLD.k = x'{head.key.hex()}' "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        conn.commit()
        with pytest.raises(StoreError):
            q.dequeue(d)
        conn.execute("DROP TRIGGER refuse")
        conn.commit()
        conn.close()
        again = q.dequeue(d)
        assert again is not None and again.payload == b"m3" and again.deliveries == 1
        assert payloads([q.dequeue(d) for _ in range(7)]) == [f"m{i}".encode() for i in range(4, 10)]
        assert counts(d) == (0, 0, 10)
    finally:
        d.close()


# -- issue 30, seventh pass: the step's own lookups, each tried against the long way ------------


def test_a_take_the_step_leaves_finds_the_kept_run_as_it_was(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step takes the kept run out first and puts it back when the case is another (a
    delayed message waiting, a TTL at the head): the long way then takes from the run without
    reading the ready range, as when the step never looked (failed with the put-back removed)."""
    from fdbqueue.ops import head

    q = filled(db, 6)
    assert take(db, q) is not None  # the long way: reads the head, keeps the run
    q.enqueue(db, b"later", delay=600.0)  # the delayed counter: the step's case no more
    with monkeypatch.context() as m:

        def no_scan(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("the ready range was read")

        m.setattr(head, "_head", no_scan)
        got = [take(db, q) for _ in range(2)]
    assert payloads(got) == [b"m1", b"m2"]
    assert counts(db)[2] == 3


def test_a_head_with_a_ttl_is_the_long_ways_from_the_kept_run(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fdbqueue.ops import head

    q = Queue("jobs")
    q.enqueue(db, b"m0")
    q.enqueue(db, b"ttl", ttl=600.0)
    q.enqueue(db, b"m2")
    assert take(db, q) is not None
    with monkeypatch.context() as m:

        def no_scan(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("the ready range was read")

        m.setattr(head, "_head", no_scan)
        got = [take(db, q) for _ in range(2)]
    assert payloads(got) == [b"ttl", b"m2"]
    assert got[0] is not None and got[0].expires_at is not None


def test_a_run_across_priorities_names_each_messages_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step keeps the last priority it decoded with its key prefix; a run that crosses
    priorities (the highest, 0, negative, the 32-bit edges) gives each message the priority
    the long way gives it, and the same Message field for field."""
    from fdbqueue.ops import head

    prios = [2**31 - 1, 2**31 - 1, 5, 5, 0, 0, 1, -7, -(2**31), -(2**31)]

    def drained(name: str, short: bool) -> list[fdbqueue.Message]:
        database = fdbqueue.open(f"sqlite://{tmp_path / name}?sync=normal")
        try:
            q = Queue("jobs")
            for i, p in enumerate(prios):
                q.enqueue(database, f"m{i}".encode(), priority=p)
            with monkeypatch.context() as m:
                if not short:
                    m.setattr("fdbqueue.api.queue.take_short", lambda *a, **k: None)
                out = [take(database, q) for _ in prios]
            assert take(database, q) is None
            return [x for x in out if x is not None]
        finally:
            database.close()

    calls: list[int] = []
    real = head.take_short

    def counted(*args: Any, **kwargs: Any) -> fdbqueue.Message | None:
        got = real(*args, **kwargs)
        calls.append(got is not None)
        return got

    monkeypatch.setattr("fdbqueue.api.queue.take_short", counted)
    short = drained("short.db", True)
    assert sum(calls) == len(prios) - 1  # every take but the first was the step's
    monkeypatch.setattr("fdbqueue.api.queue.take_short", real)
    long = drained("long.db", False)
    assert [m.priority for m in short] == sorted(prios, reverse=True)
    fields = ("priority", "payload", "deliveries", "headers", "content_type", "expires_at", "extra")
    assert [[getattr(m, f) for f in fields] for m in short] == [[getattr(m, f) for f in fields] for m in long]


def test_the_checksum_refuses_every_damaged_byte_and_length() -> None:
    """A record is whole when the CRC-32 of all its bytes is CRC-32's residue (record.py
    _RESIDUE): every flipped bit anywhere (the checksum's own bytes too), every shorter record,
    the checksum stored big-endian, and another body's checksum are refused by both decoders;
    the record itself is accepted."""
    import zlib

    from fdbqueue.errors import CorruptMessageError
    from fdbqueue.store.record import Record, decode_fields

    raw = Record("rab12", 1, "b", {"h": "v"}, 0, None, 0, {}, bytes(range(256))).encode()
    assert decode_fields(raw) == list(Record.decode(raw))
    body, crc = raw[:-4], raw[-4:]
    wrong = [body + crc[::-1], body + struct.pack("<I", zlib.crc32(body + b"x"))]
    for i in range(len(raw)):
        for bit in range(8):
            flipped = bytearray(raw)
            flipped[i] ^= 1 << bit
            wrong.append(bytes(flipped))
    wrong += [raw[:n] for n in range(len(raw))]
    for bad in wrong:
        assert decode_fields(bad) is None
        with pytest.raises(CorruptMessageError):
            Record.decode(bad)


def test_the_lease_step_refuses_every_damaged_byte_and_length_as_the_decoders_do() -> None:
    """record.lease_plain checks a record as decode_fields does (CRC-32's residue over all its
    bytes): a plain record is leased; every flipped bit, every shorter record and the checksum
    stored big-endian are refused (the lease then goes the long way, which reports the damage)."""
    from fdbqueue.store.record import Record, lease_plain

    raw = Record("rab12", 1, "b", {}, 0, None, 0, {}, bytes(range(64))).encode()
    assert lease_plain(raw, b"0a", b"ab.0", 7, 9) is not None
    wrong = [raw[:-4] + raw[-4:][::-1]]
    for i in range(len(raw)):
        for bit in range(8):
            flipped = bytearray(raw)
            flipped[i] ^= 1 << bit
            wrong.append(bytes(flipped))
    wrong += [raw[:n] for n in range(len(raw))]
    for bad in wrong:
        assert lease_plain(bad, b"0a", b"ab.0", 7, 9) is None
