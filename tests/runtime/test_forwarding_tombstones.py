"""The leased forwarder's tombstones on the source: one a removed batch (not one a message),
rewritten as its messages are published and cleared after the last; and the one-message
tombstones an earlier version wrote, still read, so that a store it left between a removal
and its publication is finished, each message once."""

from __future__ import annotations

import threading
import time

import fdbqueue
from fdbqueue import Forwarder, Queue
from fdbqueue.ops import transit
from fdbqueue.ops.txn import run_once


class Crash(Exception):
    """The forwarder dying before a step's transaction."""


def _pair(seed: int) -> tuple[fdbqueue.Database, fdbqueue.Database]:
    return fdbqueue.open(f"sim://?seed={seed}&faults=0"), fdbqueue.open(f"sim://?seed={seed + 1}&faults=0")


def _keys(db: fdbqueue.Database, tag: str) -> list[tuple[bytes, bytes]]:
    r = Queue("jobs").keys.q.range((tag,))
    return run_once(db, lambda t, _: [(kv.key, kv.value) for kv in t.get_range(r.start, r.stop, 1000)])


def _crashed_after_removal(src: fdbqueue.Database, dst: fdbqueue.Database) -> None:
    """A forwarder that removed its batch from the source and died before publishing it."""
    a = Forwarder(src, "jobs", dst, "jobs", lease_seconds=0.2)

    def crash(*args: object) -> object:
        raise Crash

    setattr(a, "_publish", crash)  # noqa: B010 (a method replaced: mypy refuses the assignment)
    try:
        a.step()
    except Crash:
        return
    raise AssertionError("the forwarder did not reach its publication")


def _ids_at(db: fdbqueue.Database) -> list[str]:
    return [m.id for m in Queue("jobs").browse(db, limit=None)]


def test_a_removed_batch_has_one_tombstone_and_is_published_once() -> None:
    src, dst = _pair(140)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(8)])
    _crashed_after_removal(src, dst)
    tombs = _keys(src, "ft")
    assert len(tombs) == 1  # the batch's, naming its eight messages (eight keys before)
    assert len(_keys(dst, "fp")) == 8 and _ids_at(dst) == []  # pending, not published
    time.sleep(0.3)  # older than a lease: another forwarder's recover finishes it
    Forwarder(src, "jobs", dst, "jobs", lease_seconds=0.2).run()
    assert _ids_at(dst) == sent  # each once, in order
    assert _keys(src, "ft") == [] and _keys(dst, "fp") == []


def test_tombstones_an_earlier_version_wrote_one_a_message_are_finished() -> None:
    src, dst = _pair(142)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(6)])
    _crashed_after_removal(src, dst)
    [(key, raw)] = _keys(src, "ft")
    tomb = transit.decode_tomb(raw, "")
    assert tomb is not None and sorted(tomb.removed) == sorted(sent)
    skeys = Queue("jobs").keys
    dest = str(skeys.q.unpack(key)[1])

    def as_an_earlier_version(t: fdbqueue.Transaction, _: bool) -> None:
        t.clear(key)  # the batch's tombstone becomes one a message: (id) -> "<receipt>|<version>"
        for mid, receipt in tomb.removed.items():
            t.set(skeys.q.pack(("ft", dest, mid)), f"{receipt}|{tomb.at}".encode())

    run_once(src, as_an_earlier_version)
    assert len(_keys(src, "ft")) == 6
    time.sleep(0.3)
    Forwarder(src, "jobs", dst, "jobs", lease_seconds=0.2).run()
    assert _ids_at(dst) == sent  # published from the old tombstones, not withdrawn: none lost
    assert _keys(src, "ft") == [] and _keys(dst, "fp") == []


def test_a_batch_published_in_parts_keeps_its_tombstone_until_the_last() -> None:
    """A batch removed whole, then published in part (the destination filled up meanwhile)
    when its run is stopped: the end of the run rewrites the batch's tombstone without what
    was published, and the next run's recover publishes the rest and clears it."""
    src, dst = _pair(144)
    fdbqueue.create_queue(dst, "jobs", max_size=5)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(5)])
    f = Forwarder(src, "jobs", dst, "jobs", batch=10, lease_seconds=0.2)
    inner = f._publish

    def crowded(*args: object) -> object:
        if Queue("jobs").size(dst) == 0:  # another producer, between the removal and this
            Queue("jobs").enqueue_many(dst, [b"x"] * 3)
        return inner(*args)  # type: ignore[arg-type]

    setattr(f, "_publish", crowded)  # noqa: B010 (as above)
    t = threading.Thread(target=f.run)
    t.start()
    deadline = time.monotonic() + 20
    while Queue("jobs").size(dst) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    f.stop()  # waiting for room: 2 of the batch published, 3 left pending
    t.join(20)
    [(_, raw)] = _keys(src, "ft")
    tomb = transit.decode_tomb(raw, "")
    assert tomb is not None and sorted(tomb.removed) == sorted(sent[2:])  # rewritten: the rest
    first = [m.id for m in (Queue("jobs").dequeue(dst) for _ in range(5)) if m is not None]
    assert len(first) == 5 and first[3:] == sent[:2]
    time.sleep(0.3)  # older than a lease: the next run's recover publishes the rest
    Forwarder(src, "jobs", dst, "jobs", lease_seconds=0.2).run()
    assert first[3:] + _ids_at(dst) == sent  # each once, in order
    assert _keys(src, "ft") == [] and _keys(dst, "fp") == []


def test_a_chunked_copy_is_cleared_with_its_chunks_when_published() -> None:
    """A published copy is cleared by its exact key, and a chunked one with its chunks: on a
    run, and on a recover after a crash between the removal and the publication."""
    src, dst = _pair(146)
    big, small = b"b" * 25_000, b"s"
    sent = Queue("jobs").enqueue_many(src, [big, small])
    _crashed_after_removal(src, dst)
    assert len(_keys(dst, "fp")) == 2 + 3  # two copies, the big one's three chunks
    time.sleep(0.3)
    Forwarder(src, "jobs", dst, "jobs", lease_seconds=0.2).run()
    sent += Queue("jobs").enqueue_many(src, [small, big])
    Forwarder(src, "jobs", dst, "jobs", lease_seconds=0.2).run()
    got = list(Queue("jobs").browse(dst, limit=None))
    assert [m.id for m in got] == sent and [m.payload for m in got] == [big, small, small, big]
    assert _keys(src, "ft") == [] and _keys(dst, "fp") == []
