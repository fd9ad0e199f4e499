"""A message larger than the destination's ``max_payload`` no longer blocks a forward.

It was refused at install (``PayloadTooLargeError``) and stayed leased on the source, where
the next forward passed it by: neither delivered nor dead-lettered. It is now moved to the
source queue's error queue with the reason, journaled as ``dead`` and counted, and the
forward goes on with the rest, on the leased and the exclusive forwarder alike.
"""

from __future__ import annotations

import pytest

import fdbqueue
from fdbqueue import Queue

MiB = 1024 * 1024


@pytest.mark.parametrize("exclusive", [False, True], ids=["leased", "exclusive"])
@pytest.mark.parametrize(
    ("size", "limit"),
    [(5000, 1000), (2 * MiB, MiB)],  # inline; in chunks, alone in its batch (budget.py)
    ids=["inline", "chunked"],
)
def test_a_message_too_large_for_the_destination_is_dead_lettered_on_the_source(
    exclusive: bool, size: int, limit: int
) -> None:
    src, dst = fdbqueue.open("memory://"), fdbqueue.open("memory://")
    fdbqueue.create_queue(src, "jobs", journal=True, max_payload=4 * MiB)
    fdbqueue.create_queue(dst, "jobs", max_payload=limit)
    q = Queue("jobs")
    a = q.enqueue(src, b"a")
    big = q.enqueue(src, b"x" * size, headers={"k": "v"})
    b = q.enqueue(src, b"b")

    stats = fdbqueue.forward(src, "jobs", dst, "jobs", exclusive=exclusive)

    assert stats.forwarded == 2
    assert [m.id for m in q.browse(dst)] == [a, b]  # the others went on, in order
    st = fdbqueue.queue_stats(src, "jobs")
    assert (st.ready, st.inflight, st.delayed, st.dead) == (0, 0, 0, 1), st
    (dead,) = Queue("jobs.error").browse(src)
    assert dead.id == big and dead.payload == b"x" * size and dead.headers == {"k": "v"}
    assert dead.origin == "jobs"
    assert dead.reason == f"too large for destination 'jobs' (max_payload {limit}): {size} bytes"
    entries = [e for e in fdbqueue.journal(src, "jobs") if e.message_id == big]
    assert [e.op for e in entries] == ["enqueue", "lease", "dead"] if not exclusive else ["enqueue", "dead"]
    assert entries[-1].reason == dead.reason and entries[-1].details == {"to": "jobs.error"}
    assert fdbqueue.forward(src, "jobs", dst, "jobs", exclusive=exclusive).forwarded == 0
