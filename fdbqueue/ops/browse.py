"""Reading a queue as a dequeue would see it now: a browsing cursor, and the due outlook.

The cursor walks ready messages in dequeue order and consumes nothing. It remembers the
last key it walked past and the queue's index high-water mark when it started. A message
that arrives later in a higher priority than the cursor's sorts *behind* the cursor; such
late arrivals are found by their index (above the mark) in each higher priority, and
visited first: the cursor moves back, as a browsing subscription does in Apache Qpid's
queue design (a browser sees every message, including ones enqueued after it started).
Dequeues by others never move the cursor.

Reads classify by database time, as every view does (``fdbqueue/ops/views.py``) and as a
dequeue would, without writing anything: a ready
message whose TTL has passed is not shown (a dequeue moves it to the error queue, or drops
it), and a delayed message that is due is shown where a dequeue would place it (it is made
ready first). Nothing here waits for a sweep.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

from fdbqueue.engines.contract import Database, KeyValue, Transaction
from fdbqueue.errors import QueueError
from fdbqueue.ops.privileges import checked
from fdbqueue.ops.reading import read_payload, to_message
from fdbqueue.ops.scan import RAISE, SKIP, ReadyScan
from fdbqueue.ops.txn import run_once
from fdbqueue.ops.views import VIEW_SCAN_LIMIT, pending
from fdbqueue.store.clock import db_now
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.meta import Meta
from fdbqueue.types import Message, Outlook

DUE_LIMIT = VIEW_SCAN_LIMIT  # due delayed / expired entries looked at per read (a bounded snapshot read)

# Where a message sorts in dequeue order: (-priority, index, tie-break). A due delayed
# message returning to its own place (a retry) keeps its ready key's index; a new one is
# made ready at the end of its priority, in due order.
Order = tuple[float, float, int]


def outlook(tr: Transaction | Database, keys: QueueKeys) -> Outlook:
    """The :class:`Outlook` of ``keys``' queue at database time (``fdbqueue/ops/views.py``);
    composes inside a caller's transaction."""

    def body(t: Transaction, _: bool) -> Outlook:
        p = pending(t, keys, checked(t, keys, "browse"), db_now(t), leases=False)
        return Outlook(len(p.expired_ready), len(p.due), p.due_expired, p.exact)

    return run_once(tr, body)


def nth_in_order(keys: QueueKeys, tr: Transaction, n: int, meta: Meta, due: int) -> Message | None:
    """The message at position ``n`` of dequeue order as :func:`browse` walks it, in ``tr``
    whose principal may browse (``meta``: the queue's, read in ``tr``; ``due``: how many
    expired or due entries the walk may meet, so that its first read covers them)."""
    walk = browse(keys, tr, limit=n + 1, batch=min(n + 1 + due, 1000), meta=meta)
    return next(itertools.islice(walk, n, None), None)


def browse(
    keys: QueueKeys, tr: Transaction | Database, *, limit: int | None, batch: int, meta: Meta | None = None
) -> Iterator[Message]:
    """:meth:`Queue.browse`; ``meta``: the queue's, already read and checked in ``tr``."""

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise QueueError(f"limit must be an int >= 0 or None, got {limit!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise QueueError(f"batch must be an int >= 1, got {batch!r}")
    begin, end = keys.ready_range()
    pos: bytes | None = None  # the last key of the forward walk
    mark: int | None = None  # index high-water mark when the walk started
    seen_upto: dict[int, int] = {}  # priority -> highest index visited there
    due: list[tuple[Order, Message]] | None = None  # due delayed messages, by where they go

    def ready_order(key: bytes) -> Order:
        p, index, _r = keys.parse_ready(key)
        return (-p, index, 0)

    def page(t: Transaction, _: bool) -> list[tuple[Order, Message | None]]:
        nonlocal pos, mark, due, meta
        m_ = checked(t, keys, "browse") if meta is None else meta
        meta = None  # read by the caller for the first page only
        now = db_now(t)
        if mark is None:
            mark = m_.made_ready
        if due is None:
            due = []
            for n, (dkey, rec) in enumerate(pending(t, keys, m_, now, leases=False, ttl=False).due):
                extra: dict[str, Any] = dict(rec.extra)
                p = int(extra.pop("priority", 0))
                target = extra.pop("key", None)
                order = ready_order(bytes.fromhex(target)) if target else (-p, math.inf, n)
                m = Message.from_record(rec, keys.name, p, dkey, read_payload(t, keys, rec))
                due.append((order, m))
            due.sort(key=lambda om: om[0])
        late: list[KeyValue] = []
        if pos is not None:
            cur = keys.parse_ready(pos)[0]
            for marker in t.snapshot.get_range(*keys.priority_marker_range()):
                p = keys.parse_marker(marker.key)
                if p <= cur:
                    break  # markers sort by -priority: the rest are not behind the cursor
                start = max(seen_upto.get(p, mark), mark) + 1
                late.extend(t.get_range(*keys.priority_range(p, start), limit=batch))
        if late:
            late.sort()
            chosen = late[:batch]
        else:
            chosen = t.get_range(begin if pos is None else pos + b"\x00", end, limit=batch)
            if chosen:
                pos = chosen[-1].key
        out: list[tuple[Order, Message | None]] = []
        # Read-only: a damaged record is raised, an expired one not shown (a dequeue would
        # move it aside, not deliver it).
        judge = ReadyScan(t, keys, now, damaged=RAISE, expired=SKIP).judge
        for kv in chosen:
            p, index, _r = keys.parse_ready(kv.key)
            seen_upto[p] = max(seen_upto.get(p, 0), index)
            live = judge(kv.key, kv.value)
            if live is None:
                continue
            out.append((ready_order(kv.key), to_message(t, keys, kv.key, live)))
        if not chosen:
            out.append(((math.inf, math.inf, 0), None))  # the end: the due messages left go last
        return out

    yielded = 0
    shown: set[str] = set()  # due messages shown: one a sweep made ready meanwhile is shown once
    while limit is None or yielded < limit:
        entries = run_once(tr, page)
        assert due is not None
        due_ids = {d.id for _, d in due}
        for order, m in entries:
            while due and due[0][0] < order:
                _, d = due.pop(0)
                if d.id not in shown:
                    shown.add(d.id)
                    yield d
                    yielded += 1
                    if limit is not None and yielded >= limit:
                        return
            if m is None:
                return
            if m.id in due_ids or m.id in shown:
                if m.id in shown:
                    continue
                shown.add(m.id)
            yield m
            yielded += 1
            if limit is not None and yielded >= limit:
                return
