"""Store-and-forward: RemoteQueue enqueues to the remote when it answers, else locally; a
forwarder drains the local queue; exactly once across unanswered remote commits, and one
producer's messages reach the remote in the order it sent them."""

from __future__ import annotations

import pytest

import fdbqueue
from fdbqueue import Queue, QueueError, RemoteQueue, testing
from fdbqueue.ops.remotededup import DEDUP_HEADER


def _pair(seed: int = 1) -> tuple[fdbqueue.Database, fdbqueue.Database]:
    return fdbqueue.open(f"sim://?seed={seed}&faults=0"), fdbqueue.open(f"sim://?seed={seed + 1}&faults=0")


def _payloads(db: fdbqueue.Database, name: str = "jobs") -> list[bytes]:
    return [m.payload for m in Queue(name).browse(db, limit=None)]  # type: ignore[misc]


def test_remote_up_goes_remote_down_goes_local_and_drains_in_order() -> None:
    remote, local = _pair()
    rq = RemoteQueue("jobs", remote=remote, local=local, timeout=0.5)
    rq.enqueue(None, b"m0")
    assert (rq.stats.remote, rq.stats.local) == (1, 0) and _payloads(remote) == [b"m0"]
    with testing.outage(remote):
        for i in range(1, 6):
            rq.enqueue(None, b"m%d" % i)
    assert rq.stats.local == 5 and _payloads(local) == [b"m%d" % i for i in range(1, 6)]
    for i in range(6, 9):  # the remote is back, but m1..m5 wait locally: these follow them
        rq.enqueue(None, b"m%d" % i)
    assert rq.stats.local == 8 and _payloads(remote) == [b"m0"]
    stats = rq.forwarder(batch=3).run()
    assert stats.forwarded == 8
    rq.enqueue(None, b"m9")  # nothing waits locally any more: straight to the remote
    assert rq.stats.remote == 2
    assert _payloads(remote) == [b"m%d" % i for i in range(10)]  # the order it sent them in
    assert Queue("jobs").size(local) == 0
    assert all(DEDUP_HEADER not in m.headers for m in Queue("jobs").browse(remote, limit=None))


def test_in_a_callers_transaction_it_is_always_local_and_aborts_with_it() -> None:
    remote, local = _pair()
    rq = RemoteQueue("jobs", remote=remote, local=local)
    tr = local.create_transaction()
    rq.enqueue(tr, b"kept")
    tr.commit()
    tr = local.create_transaction()
    rq.enqueue(tr, b"aborted")
    tr.cancel()
    assert _payloads(local) == [b"kept"] and _payloads(remote) == []
    rq.enqueue(None, b"after")  # behind the local one: local too
    assert _payloads(local) == [b"kept", b"after"]
    rq.forwarder().run()
    assert _payloads(remote) == [b"kept", b"after"]


@pytest.mark.parametrize("applied", [True, False])
def test_an_unanswered_remote_commit_is_forwarded_once_whether_it_landed_or_not(applied: bool) -> None:
    remote, local = _pair()
    rq = RemoteQueue("jobs", remote=remote, local=local, timeout=0.5)
    testing.FaultScript(remote).arm([("1031", applied)])  # the commit times out: outcome unknown
    rq.enqueue(None, b"maybe", headers={"k": "v"})
    assert rq.stats.local == 1
    assert _payloads(remote) == ([b"maybe"] if applied else [])
    rq.forwarder().run()
    got = list(Queue("jobs").browse(remote, limit=None))
    assert [m.payload for m in got] == [b"maybe"]  # once, either way
    assert dict(got[0].headers) == {"k": "v"}
    assert Queue("jobs").size(local) == 0


def test_commit_unknown_result_on_the_remote_is_settled_there() -> None:
    remote, local = _pair()
    rq = RemoteQueue("jobs", remote=remote, local=local)
    testing.FaultScript(remote).arm([("1021", True)])  # applied, reported unknown: retried
    rq.enqueue(None, b"once")
    assert (rq.stats.remote, rq.stats.local) == (1, 0)
    assert _payloads(remote) == [b"once"]


def test_bad_input() -> None:
    remote, local = _pair()
    with pytest.raises(QueueError, match="timeout"):
        RemoteQueue("jobs", remote=remote, local=local, timeout=0)
    rq = RemoteQueue("jobs", remote=remote, local=local)
    with pytest.raises(QueueError, match="transaction of the local database"):
        rq.enqueue(local, b"x")  # type: ignore[arg-type]
    with pytest.raises(QueueError, match="priority"):
        rq.enqueue(None, b"x", priority="high")
    assert _payloads(remote) == [] and _payloads(local) == []
