"""Examining a queue without consuming it: peek, nth, get, size, empty, browse, and delete.

:class:`Examining` is a base of :class:`fdbqueue.api.queue.Queue`, apart from its enqueue,
dequeue and leases because none of these methods moves a message in dequeue order: they read
(``browse``'s right; ``delete`` by id needs ``admin``), and what they read is what a consumer
would be served. Each composes inside a caller's transaction or runs once in a Database's
(``fdbqueue.ops.txn.run_once``). The base declares, under ``TYPE_CHECKING``, the field of the
queue it uses (``keys``) and holds none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fdbqueue.api.redrive import delete_by_id
from fdbqueue.engines.contract import Database, KeySelector, Transaction
from fdbqueue.errors import QueueError
from fdbqueue.ops.browse import browse, nth_in_order
from fdbqueue.ops.delivery import message_elsewhere
from fdbqueue.ops.privileges import check, checked
from fdbqueue.ops.reading import locate, to_message
from fdbqueue.ops.txn import run_once
from fdbqueue.ops.views import due_unswept, ready_count
from fdbqueue.store.clock import db_now
from fdbqueue.store.record import Record, decode_record
from fdbqueue.types import Message

if TYPE_CHECKING:
    from fdbqueue.store.layout import QueueKeys


class Examining:
    """A queue's messages as they wait, read and left in place."""

    if TYPE_CHECKING:
        keys: QueueKeys  # the queue's keys (Queue.__init__)

    # -- reading messages ----------------------------------------------------------------------

    def _message(self, tr: Any, key: bytes, raw: bytes, *, delivered: bool = False) -> Message:
        return self._to_message(tr, key, decode_record(raw, self.keys, key), delivered=delivered)

    def _to_message(self, tr: Any, key: bytes, rec: Record, *, delivered: bool = False) -> Message:
        return to_message(tr, self.keys, key, rec, delivered=delivered)

    # -- examining without consuming ----------------------------------------------------------

    def peek(self, tr: Transaction | Database) -> Message | None:
        """The next message dequeue would return, left in place."""
        return self.nth(tr, 0)

    def nth(self, tr: Transaction | Database, n: int) -> Message | None:
        """The message at 0-based position ``n`` in dequeue order, or None."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise QueueError(f"n must be an int >= 0, got {n!r}")

        begin, end = self.keys.ready_range()

        def body(t: Transaction, _: bool) -> Message | None:
            # One key selector resolved by the storage servers, then one point read: not the
            # n + 1 records a range read would bring back (key selectors with an offset:
            # documentation/sphinx/source/developer-guide.rst in apple/foundationdb). While
            # expired or due messages wait for a sweep, positions are counted as browse
            # counts them (fdbqueue/ops/views.py): a walk in dequeue order.
            meta = checked(t, self.keys, "browse")
            due = due_unswept(t, self.keys, meta, db_now(t))
            if due:
                return nth_in_order(self.keys, t, n, meta, due)
            row = t.get_range(KeySelector.first_greater_or_equal(begin) + n, end, limit=1)
            return self._message(t, row[0].key, row[0].value) if row else None

        return run_once(tr, body)

    def get(self, tr: Transaction | Database, msg_id: str) -> Message | None:
        """The message with id ``msg_id`` wherever it waits (ready, leased, delayed), or None."""
        if not isinstance(msg_id, str):
            raise QueueError(f"message id must be a str, not {type(msg_id).__name__}")

        def body(t: Transaction, _: bool) -> Message | None:
            check(t, self.keys, "browse")
            where = locate(t, self.keys, msg_id)
            raw = None if where is None else t.get(where)
            if where is None or raw is None:
                return None
            if self.keys.unpack_tail(where)[0] == "r":
                return self._message(t, where, raw)
            return message_elsewhere(self.keys, t, where, raw)

        return run_once(tr, body)

    def delete(self, tr: Transaction | Database, msg_id: str) -> bool:
        """Remove message ``msg_id`` wherever it waits (ready, leased, delayed); True if it
        was there. A leased message's holder then gets LeaseError on ack. Journaled
        ``delete``; needs ``admin``; composes inside the caller's transaction."""
        return delete_by_id(tr, self.keys, msg_id)

    def size(self, tr: Transaction | Database) -> int:
        """Ready messages, by database time (fdbqueue/ops/views.py: not those past their TTL, with
        delayed ones that are due): the atomic counter, corrected by a bounded read of what
        is due and not yet swept; snapshot reads."""
        return run_once(tr, lambda t, _: ready_count(t, self.keys, checked(t, self.keys, "browse")))

    def empty(self, tr: Transaction | Database) -> bool:
        """True when no message is ready (``size() == 0``)."""
        return self.size(tr) == 0

    def browse(
        self, tr: Transaction | Database, *, limit: int | None = None, batch: int = 100
    ) -> Iterator[Message]:
        """Walk ready messages in dequeue order without consuming them (a cursor).

        Each batch is its own read (a Database) or a read in the caller's transaction.
        The cursor keeps its place across concurrent dequeues, and a higher-priority
        message that arrives behind it is still visited (the cursor moves back, as a
        browsing subscription does in Apache Qpid's queue design). Messages are classified
        by database time, as a dequeue would: an expired message is not shown, and a due
        delayed one is shown where a dequeue would make it ready, before any sweep.
        """
        return browse(self.keys, tr, limit=limit, batch=batch)


__all__ = ["Examining"]
