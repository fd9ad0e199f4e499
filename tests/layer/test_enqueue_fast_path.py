"""The common enqueue (bytes, no options, one message) done with less: what it still guarantees.

Its shortcuts (issue 30, docs/performance.md): the item made without the general checks' calls,
the settings taken from a one-entry-per-queue cache keyed by the metadata version and the
database, the counters decoded only when a max_size needs them, database time read only where
it decides something, the record encoded directly, the work index's read conflict left out
where nothing conflicts. Each test here shows one of them keeps what the long way kept.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.api.admin import create_queue, queue_stats, set_state
from fdbqueue.engines.contract import Database
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.errors import PayloadTooLargeError, QueueError, QueueFullError, QueueStoppedError
from fdbqueue.ops.items import new_item
from fdbqueue.store.clock import fake_clock
from fdbqueue.store.record import Record, decode_record, encode_plain
from fdbqueue.types import ContentType

# Another process changes the queue: it never shares this one's caches.
OTHER = textwrap.dedent(
    """
    import sys
    import fdbqueue
    from fdbqueue.api.admin import create_queue, set_state
    db = fdbqueue.open(sys.argv[1])
    what = sys.argv[2]
    if what == "pause":
        set_state(db, "jobs", enqueue=False)
    elif what == "resume":
        set_state(db, "jobs", enqueue=True)
    elif what == "small":
        create_queue(db, "jobs", max_payload=10)
    elif what == "bounded":
        create_queue(db, "jobs", max_payload=10, max_size=4)
    db.close()
    """
)


def other_process(url: str, what: str) -> None:
    subprocess.run([sys.executable, "-c", OTHER, url, what], check=True, timeout=60)


Two = tuple[Database, Database]


@pytest.fixture
def two(tmp_path: Path) -> Iterator[Two]:
    """Two embedded stores, each on its own file, open in this process."""
    a = fdbqueue.open(f"sqlite://{tmp_path / 'a.db'}?sync=normal")
    b = fdbqueue.open(f"sqlite://{tmp_path / 'b.db'}?sync=normal")
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def warm(q: Queue, db: Database, n: int = 3) -> None:
    for _ in range(n):  # the first writes the priority marker (a metadata change): warm after it
        q.enqueue(db, b"warm")


def test_a_change_made_by_another_process_is_seen_by_the_next_enqueue(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    try:
        q = Queue("jobs")
        warm(q, db)
        other_process(url, "pause")
        with pytest.raises(QueueStoppedError):  # refused at once: nothing written
            q.enqueue(db, b"refused")
        assert queue_stats(db, "jobs").ready == 3
        other_process(url, "resume")
        q.enqueue(db, b"taken again")
        other_process(url, "small")
        with pytest.raises(PayloadTooLargeError):
            q.enqueue(db, b"longer than ten bytes")
        q.enqueue(db, b"short")
        assert queue_stats(db, "jobs").ready == 5
    finally:
        db.close()


def test_a_bound_set_by_another_process_counts_what_the_queue_holds(tmp_path: Path) -> None:
    """An enqueue into a queue without a max_size reads neither the inflight nor the delayed
    counter; a bound set meanwhile by another process is seen with the settings, and both read."""
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    try:
        q = Queue("jobs")
        warm(q, db, 2)
        assert q.lease(db) is not None  # one in flight
        q.enqueue(db, b"later", delay=3600.0)  # one delayed
        q.enqueue(db, b"ready")  # held: 2 ready, 1 in flight, 1 delayed
        other_process(url, "bounded")  # max_size 4: full
        with pytest.raises(QueueFullError, match=r"is full \(4 of max_size 4"):
            q.enqueue(db, b"fifth")  # (the bound seen with the settings: the counters read then)
        with pytest.raises(QueueFullError, match=r"is full \(4 of max_size 4"):
            q.enqueue(db, b"fifth")  # (the bound known before the read)
        m = q.dequeue(db)
        assert m is not None and m.payload == b"warm"
        q.enqueue(db, b"fifth")  # the counters are read again by each enqueue, not cached
    finally:
        db.close()


def test_the_settings_of_one_store_never_answer_for_another(two: Two) -> None:
    """One Queue object used on two stores in turn: each enqueue gets its own store's settings
    (the one-entry cache is keyed by the database too)."""
    a, b = two
    q = Queue("jobs")
    create_queue(a, "jobs", max_payload=10)
    warm(q, a)
    warm(q, b)
    for _ in range(3):
        with pytest.raises(PayloadTooLargeError):
            q.enqueue(a, b"longer than ten bytes")
        q.enqueue(b, b"longer than ten bytes")
    set_state(b, "jobs", enqueue=False)
    q.enqueue(a, b"short")
    with pytest.raises(QueueStoppedError):
        q.enqueue(b, b"short")


def test_a_cached_entry_answers_only_for_the_database_it_was_read_from(two: Two) -> None:
    """Two stores whose queue shows the same metadata version value (a copied file, here made
    by hand): the cache keyed by the version alone would answer for both."""
    a, b = two
    q = Queue("jobs")
    create_queue(a, "jobs", max_payload=10)
    create_queue(b, "jobs", max_payload=1000)
    warm(q, a)
    warm(q, b)
    version = run_transaction(a, lambda tr: tr.get(q.keys.metadata_version))  # type: ignore[attr-defined]
    run_transaction(b, lambda tr: tr.set(q.keys.metadata_version, version))  # type: ignore[attr-defined]
    with pytest.raises(PayloadTooLargeError):
        q.enqueue(a, b"longer than ten bytes")  # a's settings cached, at that version
    q.enqueue(b, b"longer than ten bytes")  # b's own, read from b
    with pytest.raises(PayloadTooLargeError):
        q.enqueue(a, b"longer than ten bytes")


def test_a_queue_paused_in_the_same_process_refuses_the_next_enqueue(db: Database) -> None:
    q = Queue("jobs")
    warm(q, db)
    set_state(db, "jobs", enqueue=False)
    with pytest.raises(QueueStoppedError):
        q.enqueue(db, b"x")
    with pytest.raises(QueueStoppedError):
        q.enqueue_many(db, [b"x", b"y"])
    set_state(db, "jobs", enqueue=True)
    assert q.enqueue(db, b"x")


def test_the_common_record_is_encoded_as_the_general_encoder_does() -> None:
    for msg_id in ("r15146b1f00d2ab3c", "0190ab12cd34ef56789a0b1c2d3e4f50", "r" + "ab" * 20):
        for ct in ContentType:
            for at in (0, 1_700_000_000_123_456):
                for payload in (b"", b"x" * 200, bytes(range(256))):
                    general = Record(msg_id, at, ct.value, {}, 0, None, 0, {}, payload).encode()
                    assert encode_plain(msg_id, at, ct.value, payload) == general
                    assert Record.decode(general) == Record(msg_id, at, ct.value, {}, 0, None, 0, {}, payload)


def test_a_fast_enqueue_stores_what_the_long_way_stores(db: Database) -> None:
    """The same message, enqueued the short way (bytes, no options) and the long way (a header
    and a str payload take it): every field but the id, time and payload's type alike."""
    q = Queue("jobs")
    fast = q.enqueue(db, b"payload")
    slow = q.enqueue(db, "payload", headers={"h": 1})
    got = [q.dequeue(db), q.dequeue(db)]
    assert [m.id for m in got if m is not None] == [fast, slow]
    a, b = got
    assert a is not None and b is not None
    assert (a.payload, a.content_type, a.headers, a.priority) == (b"payload", ContentType.BYTES, {}, 0)
    assert (b.payload, b.content_type, b.headers, b.priority) == (b"payload", ContentType.TEXT, {"h": 1}, 0)
    assert a.deliveries == b.deliveries and a.enqueued_at <= b.enqueued_at

    def raw(tr: object) -> list[Record]:
        rows = tr.get_range(*q.keys.ready_range())  # type: ignore[attr-defined]
        return [decode_record(kv.value, q.keys, kv.key) for kv in rows]

    q.enqueue(db, b"stored")
    (rec,) = run_transaction(db, raw)  # type: ignore[arg-type]
    assert (rec.headers, rec.extra, rec.chunks, rec.expires_us, rec.payload) == ({}, {}, 0, None, b"stored")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"priority": True}, "priority must be an int"),
        ({"priority": 2**31}, "priority must fit in 32 bits"),
        ({"priority": -(2**31) - 1}, "priority must fit in 32 bits"),
        ({"delay": float("nan")}, "delay must be a number"),
        ({"delay": -0.5}, "delay must be >= 0"),
        ({"ttl": 0.0}, "ttl must be"),
    ],
)
def test_what_the_short_way_lets_through_the_checks_would_have(kwargs: dict[str, object], error: str) -> None:
    args: dict[str, object] = {"priority": 0, "headers": None, "delay": 0.0, "ttl": None, "dedup_key": None}
    args.update(kwargs)
    with pytest.raises(QueueError, match=error):
        new_item(b"x", **args)  # type: ignore[arg-type]


def test_the_short_way_makes_the_item_the_long_way_makes() -> None:
    fast = new_item(b"x", 7, None, 0.0, None, None)
    slow = new_item(bytearray(b"x"), 7, None, 0, None, None)  # not the common call: the checks
    assert fast._replace(rand=b"") == slow._replace(rand=b"")
    assert type(fast.delay) is float and type(fast.headers) is dict and fast.headers == {}


def test_a_queue_ttl_applies_to_a_message_enqueued_without_reading_database_time(db: Database) -> None:
    """The common enqueue reads no database time, but the queue's TTL is one: it reads it."""
    q = Queue("jobs")
    create_queue(db, "jobs", ttl=5.0)
    with fake_clock() as clock:
        q.enqueue(db, b"short-lived")
        q.enqueue(db, b"also")
        clock.advance(10)
        assert q.dequeue(db) is None


def test_a_plain_batch_mixed_with_other_payloads_keeps_each_ones_fields(db: Database) -> None:
    q = Queue("jobs")
    ids = q.enqueue_many(db, [b"a", "b", fdbqueue.NewMessage(b"c", priority=5, headers={"k": "v"}), b"d"])
    got = [q.dequeue(db) for _ in range(4)]
    assert [(m.payload, m.priority, m.headers) for m in got if m is not None] == [
        (b"c", 5, {"k": "v"}),
        (b"a", 0, {}),
        (b"b", 0, {}),
        (b"d", 0, {}),
    ]
    assert [m.id for m in got if m is not None] == [ids[2], ids[0], ids[1], ids[3]]
    assert q.enqueue_many(db, (p for p in [b"e", b"f"])) and q.dequeue(db) is not None  # a generator


def test_a_plain_batch_costs_what_write_cost_says_each_message_costs() -> None:
    from fdbqueue.ops.items import batch_items, check_batch_size, write_cost
    from fdbqueue.store.budget import USER_TXN_LIMIT
    from fdbqueue.store.layout import QueueKeys

    keys = QueueKeys.make("jobs")
    payloads = [b"x" * n for n in (0, 1, 200, 9_999, 10_000, 10_001)]
    items = batch_items(keys, payloads, 0, None, 0.0, None)
    each = sum(write_cost(keys, it) for it in items)
    # Just within the limit, and just past it: refused exactly where the general count refuses.
    fill = USER_TXN_LIMIT - each
    filler = batch_items(keys, [b"y" * 9_000], 0, None, 0.0, None)
    n_fill = fill // write_cost(keys, filler[0])
    ok = items + filler * n_fill
    check_batch_size(keys, ok, journaled=False)
    room = USER_TXN_LIMIT - sum(write_cost(keys, it) for it in ok)
    base = write_cost(keys, batch_items(keys, [b""], 0, None, 0.0, None)[0])
    last = batch_items(keys, [b"z" * (room - base)], 0, None, 0.0, None)
    check_batch_size(keys, ok + last, journaled=False)  # exactly at the limit
    over = batch_items(keys, [b"z" * (room - base + 1)], 0, None, 0.0, None)
    with pytest.raises(fdbqueue.BudgetExceededError):
        check_batch_size(keys, ok + over, journaled=False)
