"""Blocking without polling: watches on a queue's wake key, bounded by its next deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from fdbqueue.clock import db_now, seconds_of
from fdbqueue.config import read_config
from fdbqueue.engines.base import Database, Transaction, Watch
from fdbqueue.engines.local import EventWatch
from fdbqueue.errors import EngineError, QueueStoppedError
from fdbqueue.layout import QueueKeys
from fdbqueue.message import Record
from fdbqueue.txn import run_once, seconds


def next_due(tr: Transaction, keys: QueueKeys, now: int | None = None) -> int | None:
    """The earliest delayed due time or lease deadline (``<= now`` only, when given).

    Without ``now`` (a waiter's question) also a strict-order head's retry time. Times are
    database time (versions, ``fdbqueue.clock``), as ``now`` is.
    """
    due = None
    if now is None:
        head = tr.snapshot.get_range(*keys.ready_range(), limit=1)
        if head:
            due = int(Record.decode(head[0].value).extra.get("not_before", 0)) or None
    for tag in ("d", "l"):
        begin, end = keys.index_range(tag, None if now is None else now + 1)
        kvs = tr.snapshot.get_range(begin, end, 1)
        if kvs:
            t = int(keys.unpack_tail(kvs[0].key)[1])
            due = t if due is None else min(due, t)
    return due


def watch_queue(db: Database, keys: QueueKeys, strict: bool = False) -> Watch:
    """A watch on the wake key, already fired when a message is ready (none missed in between).

    Under strict order a ready message may be held back by one in flight: then only the
    wake key (bumped by an ack or release) or a deadline ends the wait.
    """
    t = db.create_transaction()
    while True:
        try:
            w = t.watch(keys.wake)
            ready = not strict and t.snapshot.get_range(*keys.ready_range(), limit=1)
            t.commit()
            if ready:
                w.cancel()
                fired = EventWatch(keys.wake, None)
                fired.fire()
                return fired
            return w
        except EngineError as exc:
            t.on_error(exc)


def strict_of(db: Database, keys: QueueKeys) -> bool:
    cfg = run_once(db, lambda t, _: read_config(t, keys))
    return cfg is not None and cfg.strict_order


def bounded(db: Database, keys: QueueKeys, timeout: float | None) -> float | None:
    """``timeout`` cut short at the next delayed message's due time or lease deadline.

    How long until then is measured in database time (the same transaction's read version),
    converted to seconds: no client's clock takes part.
    """
    due, now = run_once(db, lambda t, _: (next_due(t, keys), db_now(t)))
    if due is None:
        return timeout
    until_due = max(0.0, seconds_of(due - now)) + 0.001
    return until_due if timeout is None else min(timeout, until_due)


R = TypeVar("R")


def blocking(
    db: Database,
    keys: QueueKeys,
    timeout: float | None,
    attempt: Callable[[bool], tuple[R | None, Watch | None]],
) -> R | None:
    """Call ``attempt(want_watch)`` until it returns a result or ``timeout`` passes.

    Between attempts, wait on the watch it returned, bounded by the queue's next deadline.
    """
    if timeout is not None:
        timeout = seconds("timeout", timeout)
    deadline = None if not timeout else time.monotonic() + timeout
    while True:
        try:
            msg, watch = attempt(deadline is not None)
        except QueueStoppedError:
            if deadline is None:
                raise  # non-blocking: a clear error at once
            # Blocking: wait for dequeue to be enabled again (which bumps the wake key).
            msg, watch = None, watch_queue(db, keys, strict=True)
        if msg is not None or deadline is None:
            return msg
        assert watch is not None
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            watch.wait(bounded(db, keys, remaining))
        finally:
            watch.cancel()
