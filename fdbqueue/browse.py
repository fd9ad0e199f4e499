"""Reading a queue as a dequeue would see it now: a browsing cursor, and the due outlook.

The cursor walks ready messages in dequeue order and consumes nothing. It remembers the
last key it walked past and the queue's index high-water mark when it started. A message
that arrives later in a higher priority than the cursor's sorts *behind* the cursor; such
late arrivals are found by their index (above the mark) in each higher priority, and
visited first: the cursor moves back, as a browsing subscription does in Apache Qpid's
queue design (a browser sees every message, including ones enqueued after it started).
Dequeues by others never move the cursor.

Reads classify by database time, as a dequeue would, without writing anything: a ready
message whose TTL has passed is not shown (a dequeue moves it to the error queue, or drops
it), and a delayed message that is due is shown where a dequeue would place it (it is made
ready first). Nothing here waits for a sweep.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fdbqueue.clock import db_now
from fdbqueue.delivery import read_payload, to_message
from fdbqueue.engines.base import Database, KeyValue, Transaction
from fdbqueue.errors import QueueError
from fdbqueue.layout import QueueKeys, unpack_count
from fdbqueue.message import Message, Record, decode_record
from fdbqueue.privileges import check
from fdbqueue.txn import run_once
from fdbqueue.types import Outlook as Outlook  # re-export

if TYPE_CHECKING:
    from fdbqueue.queue import Queue

DUE_LIMIT = 1000  # due delayed / expired entries looked at per read (a bounded snapshot read)

# Where a message sorts in dequeue order: (-priority, index, tie-break). A due delayed
# message returning to its own place (a retry) keeps its ready key's index; a new one is
# made ready at the end of its priority, in due order.
Order = tuple[float, float, int]


def _due_delayed(tr: Transaction, keys: QueueKeys, now: int) -> tuple[list[tuple[bytes, Record]], bool]:
    """Due delayed entries (key, record) in due order, at most DUE_LIMIT; and whether that was all."""
    begin, end = keys.index_range("d", now + 1)
    rows = tr.snapshot.get_range(begin, end, DUE_LIMIT + 1)
    return [(kv.key, decode_record(kv.value, keys, kv.key)) for kv in rows[:DUE_LIMIT]], len(
        rows
    ) <= DUE_LIMIT


def outlook(tr: Transaction | Database, queue: Queue) -> Outlook:
    """The :class:`Outlook` of ``queue`` at database time; composes inside a caller's transaction."""

    keys = queue.keys

    def body(t: Transaction, _: bool) -> Outlook:
        check(t, keys, "browse")
        now = db_now(t)
        snap = t.snapshot
        due, complete = _due_delayed(t, keys, now)
        due_expired = sum(1 for _, rec in due if rec.expires_us is not None and rec.expires_us <= now)
        begin, end = keys.index_range("x", now + 1)
        entries = snap.get_range(begin, end, DUE_LIMIT + 1)
        complete = complete and len(entries) <= DUE_LIMIT
        expired_ready = 0
        for kv in entries[:DUE_LIMIT]:
            msg_id = str(keys.unpack_tail(kv.key)[2])
            home = keys.home_key(msg_id)
            if home is not None and snap.get(home) is not None:
                expired_ready += 1
                continue
            where = snap.get(keys.id_key(msg_id))  # ready away from home, or delayed
            if where is not None and keys.unpack_tail(where)[0] == "r" and snap.get(where) is not None:
                expired_ready += 1
        return Outlook(expired_ready, len(due) - due_expired, due_expired, complete)

    return run_once(tr, body)


def browse(queue: Queue, tr: Transaction | Database, *, limit: int | None, batch: int) -> Iterator[Message]:

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise QueueError(f"limit must be an int >= 0 or None, got {limit!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise QueueError(f"batch must be an int >= 1, got {batch!r}")
    keys = queue.keys
    begin, end = keys.ready_range()
    pos: bytes | None = None  # the last key of the forward walk
    mark: int | None = None  # index high-water mark when the walk started
    seen_upto: dict[int, int] = {}  # priority -> highest index visited there
    due: list[tuple[Order, Message]] | None = None  # due delayed messages, by where they go

    def ready_order(key: bytes) -> Order:
        p, index, _r = keys.parse_ready(key)
        return (-p, index, 0)

    def page(t: Transaction, _: bool) -> list[tuple[Order, Message | None]]:
        nonlocal pos, mark, due
        check(t, keys, "browse")
        now = db_now(t)
        if mark is None:
            mark = unpack_count(t.snapshot.get(keys.wake))
        if due is None:
            due = []
            for n, (dkey, rec) in enumerate(_due_delayed(t, keys, now)[0]):
                if rec.expires_us is not None and rec.expires_us <= now:
                    continue  # a dequeue would expire it, not deliver it
                extra: dict[str, Any] = dict(rec.extra)
                p = int(extra.pop("priority", 0))
                target = extra.pop("key", None)
                order = ready_order(bytes.fromhex(target)) if target else (-p, math.inf, n)
                m = Message.from_record(rec, queue.name, p, dkey, read_payload(t, keys, rec))
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
        for kv in chosen:
            p, index, _r = keys.parse_ready(kv.key)
            seen_upto[p] = max(seen_upto.get(p, 0), index)
            rec = decode_record(kv.value, queue.keys, kv.key)
            if rec.expires_us is not None and rec.expires_us <= now:
                continue  # expired: a dequeue would move it aside, not deliver it
            out.append((ready_order(kv.key), to_message(t, keys, kv.key, rec)))
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
