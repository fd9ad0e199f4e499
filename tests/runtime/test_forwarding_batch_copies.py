"""The leased forwarder's pending copies written one key a batch (in parts under the value
limit) where a run installs a batch in the publication's transaction of the one before it,
and the copies a step installs one a message, as before: each read, published, withdrawn in
part and recovered so that every message arrives once, in order, and nothing stays in transit."""

from __future__ import annotations

import dataclasses
import time

import pytest

import fdbqueue
from fdbqueue import Forwarder, Queue
from fdbqueue.ops import pending
from fdbqueue.ops.txn import run_once


class Crash(Exception):
    """The forwarder dying before a step's transaction."""


def _pair(seed: int) -> tuple[fdbqueue.Database, fdbqueue.Database]:
    return fdbqueue.open(f"sim://?seed={seed}&faults=0"), fdbqueue.open(f"sim://?seed={seed + 1}&faults=0")


def _keys(db: fdbqueue.Database, tag: str) -> list[tuple[bytes, bytes]]:
    r = Queue("jobs").keys.q.range((tag,))
    return run_once(db, lambda t, _: [(kv.key, kv.value) for kv in t.get_range(r.start, r.stop, 10_000)])


def _parts(db: fdbqueue.Database) -> list[list[pending.Copy]]:
    """The batch copies' parts under ``("fp",)``: each one's copies."""
    keys = Queue("jobs").keys
    return [
        pending.decode_part(raw, keys, key)
        for key, raw in _keys(db, "fp")
        if len(keys.q.unpack(key)) == 5 and keys.q.unpack(key)[2] is None
    ]


def _ids_at(db: fdbqueue.Database) -> list[str]:
    return [m.id for m in Queue("jobs").browse(db, limit=None)]


def _in_transit(src: fdbqueue.Database, dst: fdbqueue.Database) -> int:
    return len(_keys(dst, "fp")) + len(_keys(src, "ft")) + len(_keys(src, "fh"))


def _crashed_at_second_publication(
    src: fdbqueue.Database, dst: fdbqueue.Database, batch: int, name: str | None = None
) -> None:
    """A run that published its first batch (installing the second in that transaction),
    removed the second (leasing the third) and died before publishing it."""
    a = Forwarder(src, "jobs", dst, "jobs", batch=batch, lease_seconds=0.2, name=name)
    inner, calls = a._publish, []

    def crash(*args: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise Crash
        return inner(*args)  # type: ignore[arg-type]

    setattr(a, "_publish", crash)  # noqa: B010 (a method replaced: mypy refuses the assignment)
    with pytest.raises(Crash):
        a.run()


@pytest.mark.parametrize("name", [None, "outbox-1"])
def test_a_batch_installed_ahead_is_one_key_and_is_published_once(name: str | None) -> None:
    src, dst = _pair(160)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(30)])
    _crashed_at_second_publication(src, dst, 10, name)
    assert _ids_at(dst) == sent[:10]
    # The second batch, removed from the source, pending: one key, not ten (the third batch
    # is leased, not installed: it would have been in the publication that did not happen).
    assert len(_keys(dst, "fp")) == 1
    [part] = _parts(dst)
    assert [c.id for c in part] == sent[10:20]
    assert len(_keys(src, "ft")) == 1
    time.sleep(0.3)  # older than a lease: another forwarder's recover (or a namesake) finishes it
    Forwarder(src, "jobs", dst, "jobs", lease_seconds=0.2, name=name).run()
    assert _ids_at(dst) == sent  # each once, in order
    assert _in_transit(src, dst) == 0
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (0, 0)


def test_a_batch_copy_published_in_part_keeps_the_rest_until_room() -> None:
    """A batch copy published a few at a time as the destination's room allows: the part is
    rewritten without what was published, and each message still arrives once, in order."""
    src, dst = _pair(162)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(20)])
    _crashed_at_second_publication(src, dst, 10)
    assert _ids_at(dst) == sent[:10]
    fdbqueue.create_queue(dst, "jobs", max_size=13)  # the destination's bound lowered meanwhile
    time.sleep(0.3)
    f = Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.2)
    assert f.recover() == 3  # room for three: the part keeps the other seven
    [part] = _parts(dst)
    assert [c.id for c in part] == sent[13:20]
    got = [m.id for m in (Queue("jobs").dequeue(dst) for _ in range(13)) if m is not None]
    assert got == sent[:13]
    f.recover()
    f.run()  # its end clears the tombstone of what was published
    assert _ids_at(dst) == sent[13:]
    assert _in_transit(src, dst) == 0


def test_large_batch_copies_go_in_parts_under_the_value_limit_with_their_chunks() -> None:
    """Payloads of 9,000 bytes (inline) and 25,000 (in chunks): a batch's copy in several
    parts, each under FoundationDB's value limit, every payload back intact, once."""
    src, dst = _pair(164)
    payloads = [(b"%d" % i) * 3000 for i in range(10, 40)]
    payloads[14] = b"c" * 25_000
    sent = Queue("jobs").enqueue_many(src, payloads)
    _crashed_at_second_publication(src, dst, 15)
    parts = _parts(dst)
    assert len(parts) >= 2 and sum(len(p) for p in parts) == 15
    assert all(len(raw) <= 100_000 for _, raw in _keys(dst, "fp"))
    time.sleep(0.3)
    Forwarder(src, "jobs", dst, "jobs", batch=15, lease_seconds=0.2).run()
    got = list(Queue("jobs").browse(dst, limit=None))
    assert [m.id for m in got] == sent and [m.payload for m in got] == payloads
    assert _in_transit(src, dst) == 0


def test_withdrawing_part_of_a_batch_copy_leaves_the_rest_publishable_once() -> None:
    """Copies withdrawn from a part (their lease ended without a removal) are gone for good;
    the others are still read, listed by ``pendings`` and published once."""
    src, dst = _pair(166)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(20)])
    _crashed_at_second_publication(src, dst, 10)
    f = Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.2)
    [part] = _parts(dst)
    entries = [(c.id, c.receipt) for c in part]
    f._withdraw(entries[:4])
    [part] = _parts(dst)
    assert [(c.id, c.receipt) for c in part] == entries[4:]
    keys, source = Queue("jobs").keys, f._token_pair()[0]
    listed = run_once(dst, lambda t, _: pending.pendings(t, keys, source, 100, 2**62))
    assert listed == entries[4:]
    assert f._publish(entries)[0] == 6  # the withdrawn ones are not there to publish
    assert _ids_at(dst) == sent[:10] + sent[14:20]
    assert _keys(dst, "fp") == []
    assert f._publish(entries)[0] == 0  # and a second publication finds nothing: none doubled
    assert _ids_at(dst) == sent[:10] + sent[14:20]


def test_messages_an_exclusive_forwarder_installed_are_not_published_again() -> None:
    """An exclusive forwarder that installed its batch (marked) and died before removing it
    from the source: a leased forwarder then forwards the same messages and publishes none
    of them twice (the markers it reads, however few there are)."""
    src, dst = _pair(168)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(25)])
    x = Forwarder(src, "jobs", dst, "jobs", batch=5, exclusive=True)

    def crash(*args: object) -> object:
        raise Crash

    setattr(x, "_send_away", crash)  # noqa: B010 (as above)
    with pytest.raises(Crash):
        x.run()
    assert _ids_at(dst) == sent[:5]  # installed and marked, still on the source
    Forwarder(src, "jobs", dst, "jobs", batch=10).run()
    assert _ids_at(dst) == sent  # each once
    assert _keys(dst, "fp") == [] and _keys(src, "ft") == []


@pytest.mark.parametrize("estimate", [pending.PART_BYTES, 10**9])
def test_a_batch_of_many_small_messages_goes_in_parts_each_under_the_value_limit(
    estimate: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty payloads: a part is all the copies' fields. Every part stays under FoundationDB's
    value limit (100,000 bytes), by the estimate or, where it falls short (here: none made),
    by halving a part whose encoding passes it; every copy is read back once."""
    monkeypatch.setattr(pending, "PART_BYTES", estimate)
    src, dst = _pair(170)
    Queue("jobs").enqueue_many(src, [b""] * 1000)
    ms: list[fdbqueue.Message] = []
    while len(ms) < 1000:  # a lease takes what one transaction's budget allows: a few
        ms += Queue("jobs").lease_many(src, 1000 - len(ms), 60)
    ms = [dataclasses.replace(m, receipt=f"{'ab' * 16}.{i}") for i, m in enumerate(ms)]  # one lease
    keys = Queue("jobs").keys
    run_once(dst, lambda t, _: pending.install_parts(t, keys, "s", ms, 1, {}))
    assert len(_parts(dst)) >= 2 and all(len(raw) <= 100_000 for _, raw in _keys(dst, "fp"))
    entries = [(m.id, str(m.receipt)) for m in ms]
    got = run_once(dst, lambda t, _: pending.read_pending(t, keys, "s", entries).copies)
    assert [None if c is None else (c.id, c.receipt) for c in got] == entries


def test_a_damaged_part_is_reported_with_its_key_and_nothing_is_published() -> None:
    src, dst = _pair(172)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(20)])
    _crashed_at_second_publication(src, dst, 10)
    [(key, raw)] = _keys(dst, "fp")
    run_once(dst, lambda t, _: t.set(key, raw[:40] + bytes([raw[40] ^ 1]) + raw[41:]))
    time.sleep(0.3)
    f = Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.2)
    with pytest.raises(fdbqueue.CorruptMessageError) as got:
        f.recover()
    assert got.value.key == key
    assert _ids_at(dst) == sent[:10]  # none of the damaged batch published
    assert _keys(dst, "fp") == [(key, raw[:40] + bytes([raw[40] ^ 1]) + raw[41:])]  # nor cleared


@pytest.mark.parametrize("name", [None, "outbox-1"])
def test_a_batch_copy_whose_batch_was_never_removed_is_withdrawn_whole(name: str | None) -> None:
    """A run that died at its second removal: the second batch's copies are pending in one
    part under a lease that ends without a removal. Another forwarder's recover (or, named,
    the namesake's takeover, which leases the batch again under receipts of its own) withdraws
    the part, and every message arrives once, in order."""
    src, dst = _pair(174)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(30)])
    a = Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.2, name=name)
    inner, calls = a._remove, []

    def crash(*args: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise Crash
        return inner(*args)  # type: ignore[arg-type]

    setattr(a, "_remove", crash)  # noqa: B010 (as above)
    with pytest.raises(Crash):
        a.run()
    assert _ids_at(dst) == sent[:10]
    [part] = _parts(dst)
    assert [c.id for c in part] == sent[10:20]
    time.sleep(0.3)  # past the lease
    Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.2, name=name).run()
    assert _ids_at(dst) == sent  # each once, in order
    assert _in_transit(src, dst) == 0
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (0, 0)
