"""Issue 26, findings 2 and 4: header names the layer reserves are refused on every public
enqueue path, and a dedup header cannot make the forwarder drop a message whatever way it
reached the store; one dedup key through a RemoteQueue is one message at the remote, with one
id, whichever side each attempt took."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Database, NewMessage, PartitionedQueue, Queue, QueueError, RemoteQueue, aio, testing
from fdbqueue.ops.enqueuing import enqueue_items
from fdbqueue.ops.items import new_item
from fdbqueue.ops.remotededup import DEDUP_HEADER
from fdbqueue.runtime.forwarding import Forwarder


def _pair(seed: int = 1) -> tuple[Database, Database]:
    return fdbqueue.open(f"sim://?seed={seed}&faults=0"), fdbqueue.open(f"sim://?seed={seed + 1}&faults=0")


def _all(db: Database, name: str = "jobs") -> list[fdbqueue.Message]:
    return list(Queue(name).browse(db, limit=None))


# -- reserved header names --------------------------------------------------------------------


def _paths(db: Database, remote: Database, h: dict[str, str]) -> dict[str, Callable[[], object]]:
    jobs = Queue("jobs")

    def autonomous() -> object:
        tr = db.create_transaction()
        try:
            return jobs.enqueue(tr, b"x", headers=h, autonomous=True)
        finally:
            tr.cancel()

    def remote_in_tr() -> object:
        tr = db.create_transaction()
        try:
            return RemoteQueue("jobs", remote=remote, local=db).enqueue(tr, b"x", headers=h)
        finally:
            tr.cancel()

    return {
        "enqueue": lambda: jobs.enqueue(db, b"x", headers=h),
        "enqueue_many": lambda: jobs.enqueue_many(db, [b"x", b"y"], headers=h),
        "enqueue_many NewMessage": lambda: jobs.enqueue_many(db, [b"x", NewMessage(b"y", headers=h)]),
        "autonomous": autonomous,
        "PartitionedQueue": lambda: PartitionedQueue("jobs", partitions=2, key="c").enqueue(
            db, b"x", headers={"c": "1", **h}
        ),
        "RemoteQueue": lambda: RemoteQueue("jobs", remote=remote, local=db).enqueue(None, b"x", headers=h),
        "RemoteQueue down": lambda: _during_outage(remote, db, h),
        "RemoteQueue in a transaction": remote_in_tr,
        "schedule": lambda: fdbqueue.schedule(db, "jobs", "* * * * *", b"x", name="s", headers=h),
        "aio enqueue": lambda: asyncio.run(aio.AsyncQueue("jobs").enqueue(db, b"x", headers=h)),
        "aio enqueue_many": lambda: asyncio.run(aio.AsyncQueue("jobs").enqueue_many(db, [b"x"], headers=h)),
    }


def _during_outage(remote: Database, local: Database, h: dict[str, str]) -> object:
    with testing.outage(remote):
        return RemoteQueue("jobs", remote=remote, local=local, timeout=0.2).enqueue(None, b"x", headers=h)


@pytest.mark.parametrize(
    "name", [DEDUP_HEADER, "FDBQueue-Remote-Dedup", "fdbqueue-schedule", "fdbqueue-tick"]
)
def test_reserved_header_names_are_refused_on_every_public_enqueue_path(name: str) -> None:
    remote, local = _pair()
    for path, call in _paths(local, remote, {name: "k", "ok": "v"}).items():
        with pytest.raises(QueueError, match="reserved"):
            call()
            pytest.fail(f"{path} accepted the header {name!r}")
    assert _all(local) == [] and _all(remote) == [] and fdbqueue.schedules(local) == []
    assert Queue("jobs").enqueue(
        local, b"x", headers={"fdbqueue": "v", "my-fdbqueue-x": "v"}
    )  # not the prefix


def test_a_spark_write_refuses_reserved_headers(tmp_path: Path) -> None:
    types = pytest.importorskip("pyspark.sql.types")
    from fdbqueue.spark.write import Writer

    url = f"sqlite://{tmp_path / 'q.db'}"
    schema = types.StructType(
        [
            types.StructField("payload", types.StringType()),
            types.StructField("headers", types.MapType(types.StringType(), types.StringType())),
        ]
    )
    writer = Writer({"url": url, "queue": "jobs"}, schema)
    with pytest.raises(QueueError, match="reserved"):
        writer.write(iter([("x", {DEDUP_HEADER: "k"})]))
    db = fdbqueue.open(url)
    assert _all(db) == []
    db.close()


def test_the_layers_own_paths_still_write_their_headers() -> None:
    remote, local = _pair()
    fdbqueue.schedule(local, "reports", "* * * * *", b"r", name="r", headers={"mine": "1"})
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=3)
    assert fdbqueue.run_schedules(local, now=later) == 1
    (m,) = _all(local, "reports")
    assert m.headers["fdbqueue-schedule"] == "r" and "fdbqueue-tick" in m.headers and m.headers["mine"] == "1"
    rq = RemoteQueue("jobs", remote=remote, local=local, timeout=0.2)
    with testing.outage(remote):
        rq.enqueue(None, b"x", headers={"mine": "1"})
    (m,) = _all(local)
    assert DEDUP_HEADER in m.headers  # the key of the unanswered remote attempt, carried locally


# -- the forwarder and a dedup header it did not write ------------------------------------------


def _raw(db: Database, headers: dict[str, object], dedup_key: str | None = None) -> str:
    """A message written past the enqueue checks (an older version, a raw write)."""
    item = new_item(b"precious", 0, None, 0.0, None, dedup_key)._replace(headers=headers)
    return enqueue_items(Queue("jobs").keys, db, [item], None)[0]


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize(
    "forged",
    [
        {DEDUP_HEADER: "k"},  # the destination has seen k: before, the message was removed unsent
        {DEDUP_HEADER: "k", "also": "source entry"},  # with a source dedup entry for another message
        {DEDUP_HEADER: 7},  # not a str
        {DEDUP_HEADER: "x" * 20_000},  # no valid dedup key
    ],
)
def test_a_dedup_header_the_layer_did_not_write_cannot_make_a_message_vanish(
    forged: dict[str, object], exclusive: bool
) -> None:
    src, dst = _pair()
    first = Queue("jobs").enqueue(dst, b"direct", dedup_key="k")
    if "also" in forged:
        Queue("jobs").enqueue(src, b"other", dedup_key="k")  # the source's entry for k names that one
        Queue("jobs").dequeue(src)
    mid = _raw(src, forged)
    stats = Forwarder(src, "jobs", dst, "jobs", exclusive=exclusive).run()
    assert (stats.forwarded, stats.skipped) == (1, 0)
    got = {m.id: m for m in _all(dst)}
    assert set(got) == {first, mid} and got[mid].payload == b"precious"  # installed, not dropped
    assert DEDUP_HEADER not in got[mid].headers  # taken off on install
    assert Queue("jobs").deduplicated(dst, "k") == first  # and the destination's entry is untouched
    assert _all(src) == []


@pytest.mark.parametrize("consumed", [True, False])
def test_a_message_the_destination_has_already_is_skipped_even_without_the_source_entry(
    consumed: bool,
) -> None:
    """A remote commit that landed unanswered, same id as the local copy: skipped even when the
    source's dedup entry is gone (past its window, swept): by the destination's dedup entry,
    which names this very message, or, that gone too, by the message itself, still there."""
    src, dst = _pair()
    rq = RemoteQueue("jobs", remote=dst, local=src, timeout=0.5)
    with testing.FaultScript(dst) as script:
        script.arm([("1031", True)])  # landed, unanswered
        mid = rq.enqueue(None, b"once")
    (m,) = _all(src)
    key = m.headers[DEDUP_HEADER]
    _clear(src, Queue("jobs").keys.dedup_key(key))  # the source's entry is gone
    if consumed:
        Queue("jobs").dequeue(dst)  # consumed at the remote meanwhile: only its dedup entry is left
    else:
        _clear(dst, Queue("jobs").keys.dedup_key(key))  # its entry gone, the message still there
    stats = rq.forwarder().run()
    assert (stats.forwarded, stats.skipped, m.id) == (1, 1, mid)
    assert [x.id for x in _all(dst)] == ([] if consumed else [mid]) and _all(src) == []


def _clear(db: Database, key: bytes) -> None:
    tr = db.create_transaction()
    tr.clear(key)
    tr.commit()


# -- one dedup key through RemoteQueue: one message, one id --------------------------------------


def _attempt(rq: RemoteQueue, remote: Database, side: str, key: str = "k") -> str:
    if side == "local":
        with testing.outage(remote):
            mid = rq.enqueue(None, b"order-1", dedup_key=key)
        return mid
    if side == "remote":
        return rq.enqueue(None, b"order-1", dedup_key=key)
    with testing.FaultScript(remote) as script:  # the commit lands, but the producer never hears
        script.arm([("1031", True)])
        return rq.enqueue(None, b"order-1", dedup_key=key)  # (no remote commit: an earlier id found)


@pytest.mark.parametrize(
    "sides",
    [
        ("local", "local"),
        ("local", "remote"),
        ("remote", "local"),
        ("unanswered", "local"),
        ("unanswered", "remote"),
        ("local", "unanswered"),
        ("local", "remote", "local"),
    ],
)
@pytest.mark.parametrize("fresh", [False, True])  # each retry from a new handle (a restarted producer)
def test_one_dedup_key_through_remote_queue_is_one_message_with_one_id(
    sides: tuple[str, ...], fresh: bool
) -> None:
    remote, local = _pair()
    rq = RemoteQueue("jobs", remote=remote, local=local, timeout=0.5)
    ids = []
    for side in sides:
        if fresh:
            rq = RemoteQueue("jobs", remote=remote, local=local, timeout=0.5)
        ids.append(_attempt(rq, remote, side))
    assert len(set(ids)) == 1, ids
    rq.forwarder().run()
    ids.append(_attempt(rq, remote, "remote"))  # after the forward, too
    got = _all(remote)
    assert [m.payload for m in got] == [b"order-1"] and got[0].id == ids[0], (got, ids)
    assert len(set(ids)) == 1, ids
    assert _all(local) == []


def test_the_forwarder_carries_the_dedup_key_to_the_remote() -> None:
    remote, local = _pair()
    rq = RemoteQueue("jobs", remote=remote, local=local, timeout=0.5)
    tr = local.create_transaction()
    in_tr = rq.enqueue(tr, b"a", dedup_key="ka")  # inside the caller's transaction: local
    tr.commit()
    with testing.outage(remote):
        down = rq.enqueue(None, b"b", dedup_key="kb")
    assert rq.forwarder().run().forwarded == 2
    # A direct enqueue at the remote with the same key (another producer, or this one without
    # its outbox) finds the forwarded message, as the key's first message.
    assert Queue("jobs").enqueue(remote, b"a", dedup_key="ka") == in_tr
    assert Queue("jobs").enqueue(remote, b"b", dedup_key="kb") == down
    assert [m.payload for m in _all(remote)] == [b"a", b"b"]
    assert rq.enqueue(None, b"a", dedup_key="ka") == in_tr  # and the handle answers the same


def test_an_unanswered_remote_commit_gives_the_producer_the_id_the_remote_holds() -> None:
    remote, local = _pair()
    rq = RemoteQueue("jobs", remote=remote, local=local, timeout=0.5)
    testing.FaultScript(remote).arm([("1031", True)])
    mid = rq.enqueue(None, b"maybe")
    assert [m.id for m in _all(remote)] == [mid] and [m.id for m in _all(local)] == [mid]
    rq.forwarder().run()
    assert [m.id for m in _all(remote)] == [mid] and _all(local) == []
