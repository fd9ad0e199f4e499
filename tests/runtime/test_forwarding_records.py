"""A run's batch of plain copies kept as the records their publication writes (the records'
format of a pending part, ``pending.RECORDS_FORMAT``) and published by the common publication
(``pending.read_plain``, ``pending.publish_plain``): the destination ends with what the general
path (``enqueue_in`` of the copies' Items) writes, byte for byte; every other reader decodes the
part as before; a damaged part publishes nothing; a part an earlier version wrote (format 1) is
still published, from a store that version's code left between a removal and its publication.
The stalls, kills at each step and second forwarders of the other forwarding tests run through
this path too (their batches are plain)."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Forwarder, Queue
from fdbqueue.ops import pending, transit
from fdbqueue.ops.txn import run_once
from fdbqueue.store.record import Record
from tests.support.old_code import run_old

OLD = "e3bc553"  # main before the records' format: its parts are all of format 1
ROOT = Path(__file__).resolve().parents[2]


class Crash(Exception):
    """The forwarder dying before a step's transaction."""


def _keys(db: fdbqueue.Database, tag: str) -> list[tuple[bytes, bytes]]:
    r = Queue("jobs").keys.q.range((tag,))
    return run_once(db, lambda t, _: [(kv.key, kv.value) for kv in t.get_range(r.start, r.stop, 10_000)])


def _in_transit(src: fdbqueue.Database, dst: fdbqueue.Database) -> int:
    return len(_keys(dst, "fp")) + len(_keys(src, "ft")) + len(_keys(src, "fh"))


def _crashed_at_publication(src: fdbqueue.Database, dst: fdbqueue.Database, batch: int, at: int) -> None:
    """A run that died before its ``at``-th publication (the batch before it installed this
    one's copies in its own publication)."""
    a = Forwarder(src, "jobs", dst, "jobs", batch=batch, lease_seconds=0.2)
    inner, calls = a._publish, []

    def crash(*args: object) -> object:
        calls.append(1)
        if len(calls) == at:
            raise Crash
        return inner(*args)  # type: ignore[arg-type]

    setattr(a, "_publish", crash)  # noqa: B010 (a method replaced: mypy refuses the assignment)
    with pytest.raises(Crash):
        a.run()


def _stored(db: fdbqueue.Database, sent: dict[str, int]) -> tuple[list[tuple[object, ...]], int, list[int]]:
    """The destination as stored, but for what differs between two runs (ids, times): its
    ready records in order (each field but id and enqueue time; each forwarded one's id and
    time the source's, ``sent``), how many id entries (each naming its record's key), and the
    queue's counts (ready, in flight, delayed)."""
    keys = Queue("jobs").keys
    ready = dict(_keys(db, "r"))
    records = []
    for raw in ready.values():
        rec = Record.decode(raw)
        assert rec.id not in sent or sent[rec.id] == rec.enqueued_us
        records.append((rec.id in sent, *rec[2:]))
    entries = _keys(db, "id")
    for k, v in entries:
        assert Record.decode(ready[v]).id == keys.q.unpack(k)[-1]
    st = fdbqueue.queue_stats(db, "jobs")
    return records, len(entries), [st.ready, st.inflight, st.delayed]


@pytest.mark.parametrize("engine", ["sim", "sqlite"])
def test_a_run_publishes_plain_copies_as_the_general_path_writes_them(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of the same messages (priorities, content types, empty and 10,000-byte
    payloads, a destination that already holds messages), one through the common publication
    and one with it off: the same records in the same order, the same id entries, the same
    counts; and the parts in between were of the records' format."""
    payloads: list[object] = [b"", b"x" * 10_000]
    payloads += [b"m%d" % i if i % 3 == 0 else f"t{i}" if i % 3 == 1 else {"n": i} for i in range(28)]

    def forward(tag: str) -> tuple[list[tuple[object, ...]], int, list[int], list[int]]:
        if engine == "sim":
            src, dst = fdbqueue.open("sim://?seed=5&faults=0"), fdbqueue.open("sim://?seed=6&faults=0")
        else:
            src = fdbqueue.open(f"sqlite://{tmp_path / (tag + 'src.db')}?sync=normal")
            dst = fdbqueue.open(f"sqlite://{tmp_path / (tag + 'dst.db')}?sync=normal")
        Queue("jobs").enqueue(dst, b"there before")
        q = Queue("jobs")
        for i, p in enumerate(payloads):
            q.enqueue(src, p, priority=i % 3)
        sent = {m.id: round(m.enqueued_at * 1e6) for m in q.browse(src, limit=None)}
        formats: list[int] = []
        inner = pending.publish_plain

        def seen(t: fdbqueue.Transaction, *args: object) -> int:
            formats.extend(raw[0] for _, raw in _keys_in(t))
            return inner(t, *args)  # type: ignore[arg-type]

        monkeypatch.setattr("fdbqueue.runtime.leased.publish_plain", seen)
        Forwarder(src, "jobs", dst, "jobs", batch=7).run()
        assert _in_transit(src, dst) == 0
        got = {(m.content_type, m.payload) for m in Queue("jobs").browse(dst, limit=None)}
        assert len(got) == 31 and {ct for ct, _ in got} == set(fdbqueue.ContentType)
        return (*_stored(dst, sent), formats)

    def _keys_in(t: fdbqueue.Transaction) -> list[tuple[bytes, bytes]]:
        r = Queue("jobs").keys.q.range(("fp",))
        return [(kv.key, kv.value) for kv in t.get_range(r.start, r.stop, 10_000)]

    fast = forward("a")
    assert fast[3] and set(fast[3]) == {pending.RECORDS_FORMAT}  # published the common way
    monkeypatch.setattr("fdbqueue.runtime.leased.plain_queue", lambda meta: False)
    general = forward("b")
    assert not general[3]  # (the general path: never the common publication)
    assert fast[:3] == general[:3]
    assert fast[1] == 30 and sum(forwarded for forwarded, *_ in fast[0]) == 30


def test_a_part_of_records_reads_as_the_same_copies_as_a_part_of_rows() -> None:
    """Every reader but the common publication (recover, withdrawal, ``pendings``, a takeover)
    decodes a part of the records' format into the Copies a part of format 1 gives."""
    src, dst = fdbqueue.open("sim://?seed=7&faults=0"), fdbqueue.open("sim://?seed=8&faults=0")
    Queue("jobs").enqueue(src, {"first": 1}, priority=2)
    Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(9)])
    batch = Queue("jobs").lease_many(src, 10, 60)
    keys = Queue("jobs").keys
    run_once(dst, lambda t, _: pending.install_parts(t, keys, "s", batch, 12345, {}))
    [(key, raw)] = _keys(dst, "fp")
    assert raw[0] == pending.RECORDS_FORMAT
    copies = pending.decode_part(raw, keys, key)
    assert copies == pending.decode_part(pending.encode_part(copies), keys, key)
    assert [(c.id, c.receipt, c.payload, c.priority, c.at) for c in copies] == [
        (m.id, m.receipt, m.payload, m.priority, 12345) for m in batch
    ]
    assert copies[0].content_type == "j" and copies[0].enqueued_us == round(batch[0].enqueued_at * 1e6)


@pytest.mark.parametrize("where", ["head", "rows", "ids", "records", "checksum"])
def test_a_damaged_part_of_records_publishes_nothing_and_names_its_key(where: str) -> None:
    """A flipped bit anywhere in a part of the records' format: the publication that reads it
    (a new forwarder's recover, by the common publication's read) raises CorruptMessageError
    with the part's key, and neither publishes nor clears any of it."""
    src, dst = fdbqueue.open("sim://?seed=9&faults=0"), fdbqueue.open("sim://?seed=10&faults=0")
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(20)])
    _crashed_at_publication(src, dst, 10, 2)
    [(key, raw)] = _keys(dst, "fp")
    assert raw[0] == pending.RECORDS_FORMAT
    rows_at = 13 + 10 * 16
    at = {"head": 5, "rows": 20, "ids": rows_at + 3, "records": len(raw) - 30, "checksum": len(raw) - 2}[
        where
    ]
    bad = raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :]
    run_once(dst, lambda t, _: t.set(key, bad))
    time.sleep(0.3)
    with pytest.raises(fdbqueue.CorruptMessageError) as got:
        Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.2).recover()
    assert got.value.key == key
    assert [m.id for m in Queue("jobs").browse(dst, limit=None)] == sent[:10]
    assert _keys(dst, "fp") == [(key, bad)]


def test_a_plain_batch_published_in_part_for_lack_of_room_keeps_the_rest_once() -> None:
    """Room for part of a batch of records: the general path publishes what fits and rewrites
    the part (format 1) without it; the rest arrives once, in order, when room comes."""
    src, dst = fdbqueue.open("sim://?seed=11&faults=0"), fdbqueue.open("sim://?seed=12&faults=0")
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(20)])
    _crashed_at_publication(src, dst, 10, 2)
    fdbqueue.create_queue(dst, "jobs", max_size=14)
    time.sleep(0.3)
    f = Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.2)
    assert f.recover() == 4
    [(_, raw)] = _keys(dst, "fp")
    assert raw[0] == pending.PART_FORMAT
    got = [m.id for m in (Queue("jobs").dequeue(dst) for _ in range(14)) if m is not None]
    f.recover()
    f.run()
    got += [m.id for m in Queue("jobs").browse(dst, limit=None)]
    assert got == sent
    assert _in_transit(src, dst) == 0


_OLD_WRITER = textwrap.dedent(
    """
    import os, sys
    import fdbqueue
    from fdbqueue import Forwarder, Queue

    src, dst = fdbqueue.open(sys.argv[1]), fdbqueue.open(sys.argv[2])
    Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(30)])
    f = Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.5, name="outbox-1")
    inner, calls = f._publish, []

    def killed(*args):
        calls.append(1)
        if len(calls) == 2:  # killed before its second publication: a batch removed, pending
            os._exit(0)
        return inner(*args)

    f._publish = killed
    f.run()
    """
)


@pytest.mark.parametrize("name", [None, "outbox-1"])
def test_a_store_an_earlier_version_left_mid_batch_is_finished_once(tmp_path: Path, name: str | None) -> None:
    """main ``e3bc553``'s forwarder (its own code, in a process of its own) killed between a
    removal and its publication: the pending part it left is of format 1. This version's
    forwarder (a namesake taking over, or an unnamed one's recover) publishes it and forwards
    the rest: each message once, in order, nothing left in transit."""
    urls = [f"sqlite://{tmp_path / 'src.db'}?sync=normal", f"sqlite://{tmp_path / 'dst.db'}?sync=normal"]
    run_old(tmp_path, OLD, _OLD_WRITER, *urls)
    src, dst = fdbqueue.open(urls[0]), fdbqueue.open(urls[1])
    assert len(list(Queue("jobs").browse(dst, limit=None))) == 10
    [(_, raw)] = _keys(dst, "fp")
    assert raw[0] == pending.PART_FORMAT  # the earlier version's part
    time.sleep(0.6)  # older than a lease: an unnamed forwarder's recover may finish it too
    Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.5, name=name).run()
    got = [m.payload for m in Queue("jobs").browse(dst, limit=None)]
    assert got == [b"m%d" % i for i in range(30)]
    assert len(_keys(dst, "fp")) + len(_keys(src, "ft")) == 0
    st = fdbqueue.queue_stats(src, "jobs")
    assert (st.ready, st.inflight) == (0, 0)


def test_a_removal_after_part_of_its_batch_was_published_names_just_the_rest() -> None:
    """A batch removed again after part of it was published (never in a run; a retried step
    could): the removal clears the published part of the tombstone before it reads it, so
    the tombstone then names just what is left, and a recover publishes that, once."""
    src, dst = fdbqueue.open("sim://?seed=13&faults=0"), fdbqueue.open("sim://?seed=14&faults=0")
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(10)])
    f = Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.2)
    f._prepare()
    batch, _ = f._lease(10)
    f._install(batch)
    removed, _, _ = f._remove(batch)
    assert [m.id for m in removed] == sent
    entries = [(m.id, str(m.receipt)) for m in batch]
    assert f._publish(entries[:4]) == (4, [])
    again, _, _ = f._remove(batch)  # one tombstone names what was published and this batch
    assert [m.id for m in again] == sent[4:]  # the tombstone's (the others are published)
    [(_, raw)] = _keys(src, "ft")
    tomb = transit.decode_tomb(raw, "x")
    assert tomb is not None and sorted(tomb.removed.items()) == sorted(entries[4:])
    time.sleep(0.3)
    f.recover()
    f.run()
    assert [m.id for m in Queue("jobs").browse(dst, limit=None)] == sent
    assert _in_transit(src, dst) == 0


def test_a_run_killed_after_a_removal_leaves_each_tombstone_once_and_a_namesake_finishes() -> None:
    """A named run killed before its third publication (two batches published, their
    tombstones cleared by the removals after them, the third removed): the source holds the
    third batch's tombstone alone, and a namesake forwards everything once, in order."""
    src, dst = fdbqueue.open("sim://?seed=15&faults=0"), fdbqueue.open("sim://?seed=16&faults=0")
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(40)])
    a = Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.2, name="outbox-1")
    inner, calls = a._publish, []

    def crash(*args: object) -> object:
        calls.append(1)
        if len(calls) == 3:
            raise Crash
        return inner(*args)  # type: ignore[arg-type]

    setattr(a, "_publish", crash)  # noqa: B010 (a method replaced: mypy refuses the assignment)
    with pytest.raises(Crash):
        a.run()
    assert [m.id for m in Queue("jobs").browse(dst, limit=None)] == sent[:20]
    assert len(_keys(src, "ft")) == 1
    Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.2, name="outbox-1").run()
    assert [m.id for m in Queue("jobs").browse(dst, limit=None)] == sent
    assert _in_transit(src, dst) == 0
