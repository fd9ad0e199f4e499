"""What consuming a message asks of the embedded engine, statement by statement.

An operation pays for its statements, not its rows (``scripts/count_instructions.py``): the
counters an ack or a dequeue adds to are read at snapshot isolation in the round trip the
operation makes anyway, so that the engine, which resolves an atomic add under its store
lock when it is made, asks SQLite nothing more for them; and every guarantee still holds
(the counters stay exact, a foreign or expired lease is still refused).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.errors import CorruptMessageError, LeaseError, LeaseExpiredError
from fdbqueue.ops.settling import Settler, lease_settling
from scripts.txncost import CountingDatabase
from tests.support.sqlite_files import traced


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Database]:
    database = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    yield database
    database.close()


def verbs_of(db: Database, call: Callable[[], Any]) -> tuple[list[str], Any]:
    """The SQL verbs ``call()`` runs on ``db``'s connection (each DELETE stepped counts)."""
    statements, got = traced(db, call)
    return [s.split()[0] for s in statements], got


def warmed(db: Database, n: int = 5) -> Queue:
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(n)])
    q.enqueue(db, b"warm")  # the settings cached at the metadata version the batch wrote
    return q


def test_a_dequeue_in_a_callers_transaction_reads_its_counters_with_its_metadata(embedded: Database) -> None:
    """BEGIN, the metadata with every counter it adds to, the head, one INSERT for the
    counters, the DELETE of the message, COMMIT (the done counter was a SELECT of its own)."""
    q = warmed(embedded)
    before = fdbqueue.queue_stats(embedded, "jobs")

    @fdbqueue.transactional
    def take(tr: Transaction) -> fdbqueue.Message | None:
        return q.dequeue(tr)

    verbs, m = verbs_of(embedded, lambda: take(embedded))
    assert verbs == ["BEGIN", "SELECT", "SELECT", "INSERT", "DELETE", "COMMIT"], verbs
    assert m is not None and m.payload == b"m0" and m.deliveries == 1
    after = fdbqueue.queue_stats(embedded, "jobs")
    assert (after.ready, after.done) == (before.ready - 1, before.done + 1)


def test_a_lease_runs_six_statements(embedded: Database) -> None:
    q = warmed(embedded)
    verbs, m = verbs_of(embedded, lambda: q.lease(embedded))
    assert verbs == ["BEGIN", "SELECT", "SELECT", "INSERT", "DELETE", "COMMIT"], verbs
    assert m is not None and m.payload == b"m0"
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight) == (5, 1)


def test_an_ack_reads_its_lease_the_guard_and_its_counters_in_one_statement(embedded: Database) -> None:
    """BEGIN, one SELECT (the queue's guard, the leased record, the in-flight and done
    counters), the counters written, the record and its lease entry cleared, COMMIT."""
    q = warmed(embedded)
    m = q.lease(embedded)
    assert m is not None
    verbs, _ = verbs_of(embedded, lambda: q.ack(embedded, m))
    assert verbs == ["BEGIN", "SELECT", "INSERT", "DELETE", "DELETE", "COMMIT"], verbs
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight, st.done) == (5, 0, 1)
    with pytest.raises(LeaseError):
        q.ack(embedded, m)  # acked already: its receipt is gone
    assert fdbqueue.queue_stats(embedded, "jobs").done == 1


def test_an_ack_after_its_own_lease_and_ack_before_it_asks_sqlite_nothing(embedded: Database) -> None:
    """A consumer's turn after turn: the leased record the ack reads is what this handle's
    last commit (the lease) wrote, and the guard and counters what the one before read: no
    SELECT. Another handle's commit in between, and the ack reads the record again."""
    q = warmed(embedded)
    first = q.lease(embedded)
    assert first is not None
    q.ack(embedded, first)
    m = q.lease(embedded)
    assert m is not None
    verbs, _ = verbs_of(embedded, lambda: q.ack(embedded, m))
    assert verbs == ["BEGIN", "INSERT", "DELETE", "DELETE", "COMMIT"], verbs
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight, st.done) == (4, 0, 2)
    m = q.lease(embedded)
    assert m is not None
    other = fdbqueue.open(embedded.url)  # type: ignore[attr-defined]
    try:
        Queue("other").enqueue(other, b"x")
        verbs, _ = verbs_of(embedded, lambda: q.ack(embedded, m))
    finally:
        other.close()
    assert verbs.count("SELECT") == 1, verbs
    with pytest.raises(LeaseError):
        q.ack(embedded, m)  # acked already: its record is gone, and read so
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight, st.done) == (3, 0, 3)


def test_ack_many_reads_every_lease_and_the_counters_in_one_statement(embedded: Database) -> None:
    q = warmed(embedded)
    msgs = q.lease_many(embedded, 3)
    verbs, acked = verbs_of(embedded, lambda: q.ack_many(embedded, msgs))
    assert verbs.count("SELECT") == 1, verbs
    assert [m.id for m in acked] == [m.id for m in msgs]
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight, st.done) == (3, 0, 3)


def test_an_ack_of_an_expired_lease_is_refused_and_counts_nothing(embedded: Database) -> None:
    q = warmed(embedded)
    m = q.lease(embedded, lease_seconds=0.05)
    assert m is not None
    time.sleep(0.1)
    with pytest.raises(LeaseExpiredError):
        q.ack(embedded, m)
    assert fdbqueue.queue_stats(embedded, "jobs").done == 0
    again = q.lease(embedded)  # the expired lease is taken back first: delivered again
    assert again is not None and (again.id, again.deliveries) == (m.id, 2)


def test_an_ack_of_a_lease_taken_over_by_another_consumer_is_refused(embedded: Database) -> None:
    """Its lease expired and the message was leased again: the first holder's receipt is
    stale, whatever the bytes of its record were when it leased it."""
    q = Queue("jobs")
    q.enqueue(embedded, b"only")
    first = q.lease(embedded, lease_seconds=0.05)
    assert first is not None
    time.sleep(0.1)
    second = q.lease(embedded)
    assert second is not None and second.id == first.id and second.receipt != first.receipt
    with pytest.raises(LeaseError):
        q.ack(embedded, first)
    q.ack(embedded, second)
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.inflight, st.done) == (0, 1)


def test_a_workers_batch_settles_and_leases_without_reading_a_counter_on_its_own(embedded: Database) -> None:
    """One transaction acks the batch handled and leases the next: the counters it adds to
    come with the reads it makes anyway (no ``SELECT v FROM kv WHERE k = ?`` of one key)."""
    q = warmed(embedded, 20)
    settled: list[int] = []
    settler: Settler[Queue] = Settler(embedded, 10.0, 256, lambda _q, acked, _lost: settled.append(acked))
    first = lease_settling(embedded, settler, q, 4, None)
    for m in first:
        settler.add(q, m)
    conn = embedded._store.conn  # type: ignore[attr-defined]
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        second = lease_settling(embedded, settler, q, 4, None)
    finally:
        conn.set_trace_callback(None)
    settler.close()
    assert not [s for s in statements if s.startswith("SELECT v FROM")], statements
    assert settled == [4] and len(second) == 4
    assert {m.id for m in first}.isdisjoint(m.id for m in second)
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight, st.done) == (13, 4, 4)


def test_an_ack_of_a_record_damaged_since_it_was_leased_is_refused(embedded: Database) -> None:
    """The ack takes the record it wrote at the lease from memory only when the very same
    bytes are read back: a record changed since (a flipped bit here) is decoded, and found
    damaged, as ever; the message is not counted done."""
    q = warmed(embedded)
    m = q.lease(embedded)
    assert m is not None
    fkey = q.keys.inflight_key(m.id)
    raw = bytearray(embedded[fkey])  # type: ignore[index]
    raw[len(raw) // 2] ^= 0x01
    embedded[fkey] = bytes(raw)  # type: ignore[index]
    with pytest.raises(CorruptMessageError):
        q.ack(embedded, m)
    assert fdbqueue.queue_stats(embedded, "jobs").done == 0


def test_ack_many_adds_to_each_counter_once_for_the_batch() -> None:
    """A Worker's settlement acks a batch: one atomic add to the in-flight and done counters
    for the whole batch (as a lease batch counts its leases), not one per message."""
    sim = fdbqueue.open("sim://?seed=5&faults=0")
    try:
        q = Queue("jobs")
        q.enqueue_many(sim, [f"m{i}".encode() for i in range(20)])
        msgs = q.lease_many(sim, 20)
        db = CountingDatabase(sim)
        acked = q.ack_many(db, msgs)
        assert len(acked) == 20
        (cost,) = [c for c in db.take() if c.committed]
        for name in ("inflight", "done"):
            assert sum(b == q.keys.counter(name) for b, _ in cost.write_ranges) == 1, name
        st = fdbqueue.queue_stats(sim, "jobs")
        assert (st.ready, st.inflight, st.done) == (0, 0, 20)
    finally:
        sim.close()


def test_a_dequeue_in_a_callers_transaction_moves_expired_and_damaged_heads_aside(embedded: Database) -> None:
    """Past its first record the head scan keeps its budget as before: expired messages to
    the error queue, a damaged record moved aside, the first live message taken."""
    q = Queue("jobs")
    for i in range(3):
        q.enqueue(embedded, f"old{i}".encode(), ttl=0.01)
    q.enqueue(embedded, b"live")
    time.sleep(0.05)
    head = next(iter(embedded.get_range(*q.keys.ready_range(), limit=1)))  # type: ignore[attr-defined]
    embedded[head.key] = head.value[:-1] + bytes([head.value[-1] ^ 1])  # type: ignore[index]

    @fdbqueue.transactional
    def take(tr: Transaction) -> fdbqueue.Message | None:
        return q.dequeue(tr)

    m = take(embedded)
    assert m is not None and m.payload == b"live"
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.done, st.expired, st.corrupt) == (0, 1, 2, 1)
    assert take(embedded) is None


def test_a_leased_record_in_its_common_shape_is_the_bytes_the_general_encoder_writes() -> None:
    """``encode_leased``: a ready record of the common shape (no headers, nothing extra, an id
    of ours) leased, written directly, byte for byte what ``Record.encode`` writes for it;
    any other shape, or a receipt that JSON would escape, is left to the general path (None)."""
    from fdbqueue.store.record import Record, encode_leased

    for ct in ("application/octet-stream", "text/plain", "bytes", "json"):
        for expires in (None, 1_700_000_000_123_456):
            for deliveries in (0, 1, 41):
                rec = Record("0123abcdef", 1_699_999_999_000_001, ct, {}, deliveries, expires, 0, {}, b"p7")
                extra = {"key": "02ff00", "receipt": "9f8e.0", "deadline": 2**40 + 3, "until": 17}
                general = rec.with_(deliveries=deliveries + 1, extra=extra).encode()
                got = encode_leased(rec, "02ff00", "9f8e.0", 2**40 + 3, 17)
                if ct.isascii() and ct.isalnum():
                    assert got == general
                    assert Record.decode(got) == rec.with_(deliveries=deliveries + 1, extra=extra)
                else:
                    assert got is None or got == general
                # A journaled queue's lease: the journal's mark ends the extra, as lease_in puts it.
                marked = rec.with_(deliveries=deliveries + 1, extra={**extra, "j": 1})
                got = encode_leased(rec, "02ff00", "9f8e.0", 2**40 + 3, 17, True)
                if ct.isascii() and ct.isalnum():
                    assert got == marked.encode()
                    assert Record.decode(got) == marked
                else:
                    assert got is None
    plain = Record("0123abcdef", 1, "bytes", {}, 0, None, 0, {}, b"")
    assert encode_leased(plain, "00", 'a"b', 1, 1) is None  # JSON would escape it
    assert encode_leased(plain.with_(headers={"h": 1}), "00", "r.0", 1, 1) is None
    assert encode_leased(plain.with_(extra={"last_error": "x"}), "00", "r.0", 1, 1) is None
    assert encode_leased(plain.with_(id="é1"), "00", "r.0", 1, 1) is None


def test_an_ack_of_a_message_with_a_receipt_but_another_id_or_queue_acks_nothing(embedded: Database) -> None:
    """The keys a lease made are handed to its ack only for that very message of that queue:
    a Message carrying the receipt with another id, or acked through another queue, is refused
    and the leased message stays in flight."""
    import dataclasses

    q = warmed(embedded)
    m = q.lease(embedded)
    other = q.lease(embedded)
    assert m is not None and other is not None
    forged = dataclasses.replace(m, id=other.id)
    with pytest.raises(LeaseError):
        q.ack(embedded, forged)
    with pytest.raises(LeaseError):
        Queue("elsewhere").ack(embedded, m)
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.inflight, st.done) == (2, 0)
    q.ack(embedded, m)
    q.ack(embedded, other)
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight, st.done) == (4, 0, 2)


class _AddsCounted(CountingDatabase):
    """The embedded database, with the counter keys its transactions add to noted."""

    added: list[bytes]

    def create_transaction(self) -> Any:
        tr = super().create_transaction()
        added = self.added
        add = tr.add

        def counted(key: bytes, param: bytes) -> None:
            added.append(key)
            add(key, param)

        tr.add = counted  # type: ignore[method-assign]
        return tr


def test_a_journaled_lease_and_ack_write_what_the_general_path_writes_and_count_exactly(
    embedded: Database,
) -> None:
    """A journaled queue's lease writes its record directly (``encode_leased`` with the
    journal's mark: the bytes the general encoder writes), and its ack writes the in-flight
    and done counters as the values read (no atomic add), as an unjournaled ack and a
    journaled ``ack_many`` do: the journal's entry is no counter. Counters exact, every entry
    in the journal, through a nack, a lease taken over by another handle, and an ack refused."""
    from fdbqueue.ops.journaling import history
    from fdbqueue.store.record import Record

    fdbqueue.create_queue(embedded, "jobs", journal=True, retry_delay=0.0)
    q = warmed(embedded, 6)
    db = _AddsCounted(embedded)
    db.added = []
    m = q.lease(db)
    assert m is not None and m.payload == b"m0"
    stored = embedded[q.keys.inflight_key(m.id)]  # type: ignore[index]
    rec = Record.decode(stored)
    assert rec.extra == {
        "key": m.key.hex(),
        "receipt": m.receipt,
        "deadline": rec.extra["deadline"],
        "until": rec.extra["until"],
        "j": 1,
    }
    assert stored == rec.encode()
    db.added.clear()
    q.ack(db, m)
    counters = {q.keys.counter("inflight"), q.keys.counter("done")}
    assert not counters & set(db.added), db.added
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight, st.done) == (6, 0, 1)
    assert [e.op for e in history(embedded, m.id)] == ["enqueue", "lease", "ack"]
    # A nack back to the ready set, the lease again and its ack; then a lease taken over by
    # another handle once expired: the first ack refused, counting nothing.
    n = q.lease(db)
    assert n is not None
    assert q.nack(db, n) == "ready"
    again = q.lease(db)
    assert again is not None and again.id == n.id and again.deliveries == 2
    q.ack(db, again)
    short = q.lease(db, lease_seconds=0.05)
    assert short is not None
    time.sleep(0.1)
    other = fdbqueue.open(embedded.url)  # type: ignore[attr-defined]
    try:
        taken = q.lease(other)
        assert taken is not None and taken.id == short.id
        with pytest.raises(LeaseError):
            q.ack(db, short)
        q.ack(other, taken)
    finally:
        other.close()
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight, st.done) == (4, 0, 3)
    assert [e.op for e in history(embedded, n.id)] == ["enqueue", "lease", "nack", "lease", "ack"]
    ops = [e.op for e in history(embedded, short.id)]
    assert ops == ["enqueue", "lease", "lease_expired", "lease", "ack"]


def test_meta_waiting_is_count_of_delayed_or_inflight_for_every_read_and_value(embedded: Database) -> None:
    """``Meta.waiting()`` (whether a take must first look for due messages) says what
    ``count("delayed") or count("inflight")`` says: for each read of the metadata, with the
    counters absent, zero, positive, negative and of odd lengths (an ADD zero-extends)."""
    from fdbqueue.store.layout import HOT_COUNTERS
    from fdbqueue.store.meta import LEASE_COUNTERS, TAKE_COUNTERS, read_meta, read_meta_for

    q = warmed(embedded)
    q.enqueue(embedded, b"later", delay=60)
    m = q.lease(embedded)
    assert m is not None
    values: list[bytes | None] = [
        None,
        b"\x00" * 8,
        (1).to_bytes(8, "little"),
        (-3).to_bytes(8, "little", signed=True),
        b"\x02",
        b"\x00\x01\x00",
    ]
    seen = set()
    for delayed in values:
        for inflight in values:
            for name, value in (("delayed", delayed), ("inflight", inflight)):
                if value is None:
                    del embedded[q.keys.counter(name)]  # type: ignore[attr-defined]
                else:
                    embedded[q.keys.counter(name)] = value  # type: ignore[index]

            @fdbqueue.transactional
            def check(tr: Transaction) -> None:
                for meta in (
                    read_meta(tr, q.keys),
                    read_meta_for(tr, q.keys, TAKE_COUNTERS),
                    read_meta_for(tr, q.keys, LEASE_COUNTERS),
                    read_meta_for(tr, q.keys, ("ready",)),
                ):
                    want = bool(meta.count("delayed") or meta.count("inflight"))
                    assert meta.waiting() is want, meta.raw
                    seen.add(want)

            check(embedded)
    assert seen == {True, False} and "delayed" in HOT_COUNTERS
