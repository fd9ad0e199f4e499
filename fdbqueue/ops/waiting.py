"""Blocking without polling: watches on a queue's wake key, bounded by its next deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from fdbqueue.engines.contract import RETRY, Attempt, Database, Transaction, Verdict, Watch, retry
from fdbqueue.engines.local.watches import EventWatch
from fdbqueue.errors import CorruptMessageError, EngineError, QueueError, QueueStoppedError
from fdbqueue.ops.privileges import check_any
from fdbqueue.ops.steps import REFUSED_WATCH_RECHECK, Run, Steps, Wait, refused
from fdbqueue.ops.txn import run_once
from fdbqueue.store.clock import db_now, seconds_of
from fdbqueue.store.config import decode_config, decode_state, read_config
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import decode_record
from fdbqueue.types import check_duration


def next_due(tr: Transaction, keys: QueueKeys, now: int | None = None) -> int | None:
    """The earliest delayed due time or lease deadline (``<= now`` only, when given).

    Without ``now`` (a waiter's question) also a strict-order head's retry time. Times are
    database time (versions, ``fdbqueue.store.clock``), as ``now`` is.
    """
    due = None
    if now is None:
        head = tr.snapshot.get_range(*keys.ready_range(), limit=1)
        if head:
            due = not_before(keys, head[0].key, head[0].value) or None
    for tag in ("d", "l"):
        begin, end = keys.index_range(tag, None if now is None else now + 1)
        kvs = tr.snapshot.get_range(begin, end, 1)
        if kvs:
            t = int(keys.unpack_tail(kvs[0].key)[1])
            due = t if due is None else min(due, t)
    return due


def not_before(keys: QueueKeys, key: bytes, raw: bytes) -> int:
    """The head's retry time (``not_before``), 0 when it has none or its record is damaged:
    a damaged head is deliverable, so the dequeue that comes moves it aside
    (``delivery.move_corrupt``) rather than every waiter spinning on it."""
    try:
        return int(decode_record(raw, keys, key).extra.get("not_before", 0))
    except CorruptMessageError:
        return 0


# However long a wait may last, it looks again at least this often (seconds of database
# time: versions at ``VERSIONS_PER_SECOND``): a notification lost on the way - the embedded
# engine's notification file removed under a running process, a watch dropped by a cluster
# - then delays a waiter by at most this long instead of leaving it waiting forever.
# FoundationDB's own watches can end without a change too (``watch`` in
# fdbclient/NativeAPI.actor.cpp re-registers after errors; the documentation of watches says
# a client must re-read the key when in doubt).
LOST_WAKEUP_RECHECK = 30.0


def deliverable_now(tr: Transaction, keys: QueueKeys) -> bool:
    """Whether a dequeue at ``tr``'s read version would find a message (snapshot reads).

    The ready range is not enough under strict order: a dequeue hands out nothing while a
    lease is in flight (live: an expired one is released by the dequeue itself) or while the
    head waits out its retry delay (``not_before``). A queue whose dequeue is disabled has
    nothing deliverable either. Times are database time (versions, ``fdbqueue.store.clock``).
    """
    snap = tr.snapshot
    head = snap.get_range(*keys.ready_range(), limit=1)
    if not head:
        return False
    raw_cfg, raw_state = snap.get_many([keys.config, keys.state])
    if raw_cfg is None:
        return False
    if not decode_state(raw_state).dequeue:
        return False
    if not decode_config(raw_cfg).strict_order:
        return True
    now = db_now(tr)
    if not_before(keys, head[0].key, head[0].value) > now:
        return False
    live_from = keys.index_range("l", now + 1)[1]
    return not snap.get_range(live_from, keys.index_range("l")[1], 1)


def watch_queue(db: Database, keys: QueueKeys, strict: bool = False, *, changes_only: bool = False) -> Watch:
    """A watch on the wake key, already fired when a dequeue would find a message now (none
    missed in between: the check and the watch are one transaction).

    Whether a message is deliverable follows the queue's own settings (:func:`deliverable_now`):
    under strict order a ready message held back by a lease in flight or by its retry delay
    does not fire the watch; an ack or release of the lease (which bump the wake key) or the
    deadline the caller bounds its wait with (:func:`bounded`) ends the wait. ``strict`` is
    accepted for the callers that know the setting and no longer changes anything. With
    ``changes_only`` only a change fires it (a waiter that leaves ready messages where they
    are). A refused watch (1032) is returned as a watch that fails with 1032 when waited
    on: see ``fdbqueue.ops.steps.wait_on``.
    """
    del strict  # read from the queue's settings, in the watch's own transaction

    def step(t: Transaction, attempt: Attempt) -> tuple[Watch, bool]:
        w = t.watch(keys.wake)
        return w, not changes_only and deliverable_now(t, keys)

    def on_error(exc: EngineError, attempt: Attempt) -> tuple[Watch, bool] | Verdict:
        if exc.code == 1032:  # refused when made rather than when waited on
            refused = EventWatch(keys.wake, None)
            refused.fail(1032, "too many outstanding watches")
            return refused, False
        return RETRY

    w, ready = retry(db, step, on_error=on_error)
    if ready:
        w.cancel()
        fired = EventWatch(keys.wake, None)
        fired.fire()
        return fired
    return w


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


def blocking_steps(
    db: Database,
    keys: QueueKeys,
    timeout: float | None,
    attempt: Callable[[bool], tuple[R | None, Watch | None]],
) -> Steps[R | None]:
    """``attempt(want_watch)`` until it returns a result or ``timeout`` passes (steps:
    ``fdbqueue.ops.steps``). Between attempts, wait on the watch it returned (armed in the
    attempt's own transaction: no wake-up slips between), bounded by the queue's next
    deadline. A paused queue is waited through (resuming bumps the wake key)."""
    if timeout is not None:
        timeout = check_duration("timeout", timeout)
    deadline = None if not timeout else time.monotonic() + timeout
    while True:
        try:
            msg, watch = yield Run(partial(attempt, deadline is not None))
        except QueueStoppedError:
            if deadline is None:
                raise  # non-blocking: a clear error at once
            msg, watch = None, (yield Run(partial(watch_queue, db, keys, changes_only=True)))
        if msg is not None or deadline is None:
            return msg  # type: ignore[no-any-return]
        assert watch is not None
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            limit = yield Run(partial(bounded, db, keys, remaining))
            yield Wait([watch], min(LOST_WAKEUP_RECHECK, limit or remaining))
        finally:
            watch.cancel()


def _blocking_steps(
    db: Database,
    keys: QueueKeys,
    timeout: float | None,
    attempt: Callable[[bool], tuple[R | None, Watch | None]],
) -> Steps[R | None]:
    """:func:`blocking_steps`, saying ``QueueStoppedError`` when the wait ends on a paused queue.

    A blocking dequeue waits through a pause (resuming wakes it); if the queue is still
    paused when the wait ends, it says so as a non-blocking dequeue does, not "nothing ready".
    """
    stopped: list[QueueStoppedError] = []

    def watched(want_watch: bool) -> tuple[R | None, Watch | None]:
        stopped.clear()
        try:
            return attempt(want_watch)
        except QueueStoppedError as exc:
            stopped.append(exc)
            raise

    got = yield from blocking_steps(db, keys, timeout, watched)
    if got is None and stopped:
        raise stopped[0]
    return got


def wait_ready_steps(db: Database, keys: QueueKeys, timeout: float | None) -> Steps[bool]:
    """Until a message may be ready on the queue (True) or ``timeout`` passes (False): steps.

    A watch when the database grants one; when it refuses (1032), timed re-checks of the
    head every ``REFUSED_WATCH_RECHECK`` seconds, up to the same bound. True also when a
    deadline passes (a delayed message comes due, a lease or a strict head's retry delay
    ends): a dequeue may then find it. Without a timeout it still looks again every
    ``LOST_WAKEUP_RECHECK`` seconds, so a lost notification delays it and never hangs it.
    Needs ``dequeue``, ``browse`` or ``admin`` (whether a message is ready is for its
    consumers, its readers, and a forwarder moving it out), not ``enqueue`` alone.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    yield Run(partial(run_once, db, lambda t, _: check_any(t, keys, ("dequeue", "browse", "admin"))))
    while True:
        watch = yield Run(partial(watch_queue, db, keys))
        try:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            limit = yield Run(partial(bounded, db, keys, left))
            came_due = limit is not None and (left is None or limit < left)
            if limit is None or limit > LOST_WAKEUP_RECHECK:  # a lost notification: look again
                limit, came_due = LOST_WAKEUP_RECHECK, False
            if not refused(watch):
                if (yield Wait([watch], limit)) or came_due:
                    return True  # fired, or a deadline passed: a message may be ready now
            elif (yield Wait([watch], limit)) is False and came_due:
                return True
        finally:
            watch.cancel()
        if deadline is not None and time.monotonic() >= deadline:
            return False


class QueueWatcher:
    """Watches on several queues kept across idle waits (a worker's or a dispatcher's).

    Each queue's watch lives until it fires, fails, or the watcher is closed: an idle waiter
    whose bounded wait ends without news waits again on the same watch, without a new watch,
    transaction or relay thread. A small thread per live watch relays its firing. The
    queue's next deadline (delayed message, lease) is read when its watch is armed and again
    once that deadline has passed. A watch armed ``LOST_WAKEUP_RECHECK`` seconds ago is
    armed afresh (which looks at the queue again), and no wait outlasts that interval: a
    lost notification delays a waiter, never hangs it. Not shared between threads: one
    watcher per waiting thread.

    With ``changes_only`` a wait ends when messages are made ready after the watch was
    armed, not because some are ready already: for a waiter that leaves ready messages
    where they are (a dispatcher waiting for a queue to reach a length), which would
    otherwise wake at once, again and again.
    """

    def __init__(self, db: Database, keys: list[QueueKeys], *, changes_only: bool = False) -> None:
        self._db = db
        self._keys = keys
        self._changes_only = changes_only
        self._watches: list[Watch | None] = [None] * len(keys)
        self._due: list[float | None] = [None] * len(keys)  # monotonic time of the next deadline
        self._armed_at: list[float] = [0.0] * len(keys)  # monotonic time each watch was armed
        self._fired = threading.Event()
        self.armed = 0  # watches made so far (a measure for tests and benchmarks)

    def wait(self, timeout: float | None, stop: threading.Event) -> bool:
        """Wait until a queue may have a message ready (True), ``timeout`` passes or ``stop``
        is set (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            got = self._wait_once(end, stop)
            if got is not None:
                return got
            # The re-check interval passed first: the next round re-arms old watches.

    def _wait_once(self, end: float | None, stop: threading.Event) -> bool | None:
        """One round of :meth:`wait`; None when it ended at the lost-wake-up re-check."""
        self._fired.clear()
        now = time.monotonic()
        # However long the wait, look again after LOST_WAKEUP_RECHECK: a lost notification
        # then delays this waiter rather than leaving it waiting forever.
        recheck = now + LOST_WAKEUP_RECHECK
        limit = recheck if end is None else min(end, recheck)
        news = False
        for i, keys in enumerate(self._keys):
            w = self._watches[i]
            if w is not None and not w.is_ready() and now - self._armed_at[i] >= LOST_WAKEUP_RECHECK:
                w.cancel()  # armed long ago: its notification may have been lost, look again
                w = self._watches[i] = None
            if w is not None and w.is_ready():
                if not refused(w):
                    news = True  # fired since the last wait: re-armed at the next one
                    continue
                w.cancel()
                w = None
            if w is None:
                w = self._arm(i)
                if w.is_ready() and not refused(w):
                    news = True
                    continue
            else:
                due = self._due[i]
                if due is not None and due <= now:  # passed: what is the next one?
                    self._due[i] = self._due_at(keys)
            due = self._due[i]
            if refused(w):
                due = now + REFUSED_WATCH_RECHECK if due is None else min(due, now + REFUSED_WATCH_RECHECK)
            if due is not None:
                limit = min(limit, due)
        if news:
            self._rearm_fired()
            return True
        while not stop.is_set():
            step = min(0.25, limit - time.monotonic())
            if step <= 0:
                return None if limit == recheck and (end is None or recheck < end) else False
            if self._fired.wait(step):
                self._rearm_fired()
                return True
        return False

    def _rearm_fired(self) -> None:
        # A fired watch is spent: dropped now, so the next wait arms a fresh one.
        for i, w in enumerate(self._watches):
            if w is not None and w.is_ready() and not refused(w):
                w.cancel()
                self._watches[i] = None

    def _arm(self, i: int) -> Watch:
        keys = self._keys[i]
        w = watch_queue(self._db, keys, changes_only=self._changes_only)
        self.armed += 1
        self._watches[i] = w
        self._armed_at[i] = time.monotonic()
        self._due[i] = self._due_at(keys)
        if not w.is_ready():
            threading.Thread(target=self._relay, args=(w,), daemon=True, name="fdbqueue-watch").start()
        return w

    def _due_at(self, keys: QueueKeys) -> float | None:
        until = bounded(self._db, keys, None)
        return None if until is None else time.monotonic() + until

    def _relay(self, w: Watch) -> None:
        try:
            if w.wait(None):
                self._fired.set()
        except QueueError:
            pass  # cancelled, refused or failed: the next wait looks at it

    def close(self) -> None:
        """Cancel every watch (their relay threads then end)."""
        for i, w in enumerate(self._watches):
            if w is not None:
                w.cancel()
            self._watches[i] = None
