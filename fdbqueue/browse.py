"""Browsing: a cursor over ready messages in dequeue order that consumes nothing.

The cursor remembers the last key it walked past and the queue's index high-water
mark when it started. A message that arrives later in a higher priority than the
cursor's sorts *behind* the cursor; such late arrivals are found by their index (above
the mark) in each higher priority, and visited first: the cursor moves back, as
seed 000's subscriptions do. Dequeues by others never move the cursor.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from fdbqueue.engines.base import Database, KeyValue, Transaction
from fdbqueue.errors import QueueError
from fdbqueue.layout import unpack_count
from fdbqueue.message import Message

if TYPE_CHECKING:
    from fdbqueue.queue import Queue


def browse(queue: Queue, tr: Transaction | Database, *, limit: int | None, batch: int) -> Iterator[Message]:
    from fdbqueue.queue import run_once

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise QueueError(f"limit must be an int >= 0 or None, got {limit!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise QueueError(f"batch must be an int >= 1, got {batch!r}")
    keys = queue.keys
    begin, end = keys.ready_range()
    pos: bytes | None = None  # the last key of the forward walk
    mark: int | None = None  # index high-water mark when the walk started
    seen_upto: dict[int, int] = {}  # priority -> highest index visited there

    def page(t: Transaction, _: bool) -> list[Message]:
        nonlocal pos, mark
        if mark is None:
            mark = unpack_count(t.snapshot.get(keys.wake))
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
        out = []
        for kv in chosen:
            p, index, _r = keys.parse_ready(kv.key)
            seen_upto[p] = max(seen_upto.get(p, 0), index)
            out.append(queue._message(t, kv.key, kv.value))
        return out

    yielded = 0
    while limit is None or yielded < limit:
        messages = run_once(tr, page)
        if not messages:
            return
        for m in messages:
            yield m
            yielded += 1
            if limit is not None and yielded >= limit:
                return
