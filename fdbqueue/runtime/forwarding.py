"""Forwarding between two databases, exactly once: ``forward`` and ``Forwarder``.

Between two systems no transaction spans both, so the queue manager's forwarding (Bernstein &
Newcomer) is done in steps, each one transaction of one side, any of which a crash or a stall
of any length may interrupt (``ops/transit.py`` and ``ops/pending.py`` keep what is between
them, their keys in ``store/layout.py``; docs/forwarding.md the reasoning):

1. **Lease** a batch on the source (``lease_many``): hidden from others while the forwarder
   works; back by themselves if it dies or stalls past the lease.
2. **Install** a *pending* copy of each on the destination, named by the message's id and the
   lease's receipt: hidden, not a message yet.
3. **Remove** them from the source, each only while its lease is still ours (``ack``, journaled
   ``forward_out``), writing the batch's *tombstone* (each id and receipt removed; one key a
   batch) and the ``ack_queue`` acknowledgement in the same transaction. A message whose
   lease was lost meanwhile (a stall: another forwarder or a consumer has it) is not
   removed, and its pending copy is withdrawn.
4. **Publish** the pending copies of the removed ones on the destination: each becomes a
   message there (journaled ``forward_in``) in the transaction that clears its pending copy.
   The tombstones are cleared by the next batch's step 3, once published.

A copy is published only once its tombstone exists, and a tombstone only under a lease that
was still ours: so a stalled forwarder's copy, whose lease others took, never becomes visible.
``recover`` finishes what a crash left: a tombstone without publication is published; a
pending copy whose lease ended without a tombstone is withdrawn - after the source, in one
transaction, made sure no removal under that lease can still commit (``transit.fates``).

A forwarder given a ``name`` records each batch it leases, in the leasing transaction, under
its name on the source; a successor of that name takes those batches over at once (their
leases pass to it under new receipts: ``transit.take_over``) instead of waiting for them.

The exclusive forwarder (no leases: the queue's only consumer) installs directly with a marker
``("fw", source, id)`` instead, and removes at step 3 what is unchanged since it was read.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

import tenacity

from fdbqueue.api.queue import Queue
from fdbqueue.api.transfer import check_limit
from fdbqueue.engines.contract import Database, adopt, is_transaction
from fdbqueue.errors import (
    ClusterUnavailableError,
    EngineError,
    QueueError,
    QueueNotFoundError,
    StoreError,
)
from fdbqueue.ops import transit
from fdbqueue.ops.delivery import check_lease_seconds
from fdbqueue.ops.outbox import Ready
from fdbqueue.ops.txn import run_once
from fdbqueue.runtime.leased import _ITSELF, Leased
from fdbqueue.store.layout import DEFAULT_ROOT
from fdbqueue.store.meta import read_meta
from fdbqueue.types import ForwardStats, check_duration, check_flag, check_where

log = logging.getLogger("fdbqueue.runtime.forwarding")

LEASE_SECONDS = 60.0  # a batch's lease on the source: long enough for a slow destination
# DEDUP_HEADER: a RemoteQueue's message kept locally names the dedup key of its remote attempt
# (taken off on install); remotededup.py says when the forwarder acts on it.


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (ClusterUnavailableError, StoreError)) or (
        isinstance(exc, EngineError) and exc.retryable
    )


class Forwarder(Leased):
    """Forwards queue ``src`` of ``src_db`` to queue ``dst`` of ``dst_db``, exactly once (see
    the module's docstring); ``run(follow=True)`` keeps going as messages arrive. ``name``: a
    forwarder of the same name, started after this one dies, takes over its leased batches at
    once (without one they wait for their leases to end); two of one name at once double
    nothing. Each message keeps its id, payload, headers, priority, enqueue time and TTL left."""

    def __init__(
        self,
        src_db: Database,
        src: str,
        dst_db: Database,
        dst: str,
        *,
        batch: int = 100,
        ack_queue: str | None = None,
        root: tuple[Any, ...] = DEFAULT_ROOT,
        dst_root: tuple[Any, ...] | None = None,
        retry_seconds: float = 30.0,
        lease_seconds: float = LEASE_SECONDS,
        where: Mapping[str, Any] | None = None,
        exclusive: bool = False,
        name: str | None = None,
    ) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 1000:
            raise QueueError(f"batch must be an int from 1 to 1000, got {batch!r}")
        # Every argument checked here, before any I/O: a bad one would otherwise surface as a
        # raw error from deep inside run(), after the forwarder began.
        retry_seconds = check_duration("retry_seconds", retry_seconds)
        lease_seconds = check_lease_seconds(lease_seconds)
        _check_root("root", root)
        if dst_root is not None:
            _check_root("dst_root", dst_root)
        self.src_db, self.dst_db = adopt(src_db), adopt(dst_db)
        if is_transaction(self.src_db) or is_transaction(self.dst_db):
            raise QueueError("forward takes two Databases: each step is a transaction of its own")
        self._src_db: Database = self.src_db  # type: ignore[assignment]
        self._dst_db: Database = self.dst_db  # type: ignore[assignment]
        self.src, self.dst = Queue(src, root=root), Queue(dst, root=dst_root or root)
        if self.src_db is self.dst_db and self.src.keys == self.dst.keys:
            raise QueueError(_ITSELF.format(src))
        self.ack = None if ack_queue is None else Queue(ack_queue, root=root)
        self.where = check_where(where)
        self.exclusive = check_flag("exclusive", exclusive)
        self.name = _check_name(name, self.exclusive)
        self._resumed = name is None  # a named forwarder takes its namesakes' batches over first
        self._cursor: bytes | None = None  # named: the last record taken over
        self._records: list[transit.Record_] = []  # named: records of published batches, to clear
        self._cap: int | None = None  # run(limit=): how many more messages it may take
        self._pending: list[Ready] | None = None  # exclusive: the next batch, read with the last removal
        self._too_large: dict[str, str] = {}  # exclusive: of the batch installed, dead letters (reasons)
        self.batch = batch
        self.stats = ForwardStats()
        self.retry_seconds = retry_seconds
        self.lease_seconds = lease_seconds
        # The source queue, as the journal's forward_in and the exclusive path's markers name it.
        self.origin = src
        self._stop = threading.Event()
        self._removed: list[str] = []  # exclusive: the last batch removed from the source: markers to clear
        # Learned before the first step (_prepare): each queue's forwarding token (which
        # store's queue a pending copy or a tombstone names), and the destination's room.
        self._tokens: tuple[str, str] | None = None
        self._room: int | None = None  # None: no max_size
        self._hand = None  # the leased batch in hand, through its steps
        # Published (id, receipt): the tombstones the next removal clears.
        self._published: list[transit.Entry] = []
        self._recovered_at = 0.0

    def stop(self) -> None:
        """Stop after the batch in hand (from another thread or a signal handler)."""
        self._stop.set()

    # -- running ---------------------------------------------------------------------------------

    def step(self) -> int:
        """Forward one batch through the three steps; returns how many messages it moved
        (0: nothing ready). Exceptions of either side propagate (``run`` retries them)."""
        return self._step(False)

    def _step(self, ahead: bool) -> int:
        """``step``; ``ahead`` (a run): the removal of a batch leases the next one, and its
        publication installs it, so that each side commits once a batch (the next batch is
        then in hand between two calls; finished before a ``stop()`` returns)."""
        if self._tokens is None:
            self._prepare()
        if self.exclusive:
            try:
                return self._step_exclusive()
            except BaseException:
                self._pending = None  # read again by the next step: it may be out of date
                raise
        return self._step_leased(ahead)

    def run(
        self,
        *,
        follow: bool = False,
        limit: int | None = None,
        install_signals: bool = False,
        idle_timeout: float | None = None,
        progress: Callable[[ForwardStats], object] | None = None,
    ) -> ForwardStats:
        """Forward until the source is empty, or ``limit`` messages (exactly: it leases no more
        than is left of it; a batch taken over from a namesake is finished whole, and counts),
        or, with ``follow``, until ``stop()``, SIGTERM or
        SIGINT with ``install_signals``, or ``idle_timeout`` seconds without a message,
        retrying with a backoff while either side is down (tenacity); ``progress`` is called
        with the statistics after each batch."""
        _check_run(follow=follow, limit=limit, install_signals=install_signals, idle_timeout=idle_timeout)
        if progress is not None and not callable(progress):
            raise QueueError(f"progress must be a function of the statistics or None, got {progress!r}")
        self._retrying(self._prepare)  # a queue forwarded into itself: refused here
        self._cap = limit
        restore = self._signals() if install_signals else None
        with contextlib.suppress(EngineError, QueueError):  # best effort: a side may be down
            self.prune_markers()
        try:
            while not self._stop.is_set() and (self._cap is None or self._cap > 0):
                if not self.exclusive and time.monotonic() - self._recovered_at >= max(
                    1.0, self.lease_seconds
                ):
                    with contextlib.suppress(EngineError, QueueError):  # what crashes and stalls left
                        self.recover()
                n = self._retrying(lambda: self._step(True))
                if n:
                    if progress is not None:
                        progress(self.stats)
                    continue
                if self.exclusive:  # no dequeue makes due messages ready here: a sweep does
                    with contextlib.suppress(EngineError, QueueError):
                        if self.src.sweep(self._src_db).total():
                            continue
                if not follow:
                    break
                woke = self._retrying(lambda: self.src.wait(self._src_db, idle_timeout or 1.0))
                if not woke and idle_timeout is not None:
                    break
            if self._hand is not None:  # the batch leased ahead when stop() came: finished
                self._retrying(lambda: self._step(False))
                if progress is not None:
                    progress(self.stats)
        finally:
            if restore is not None:
                restore()
            if self._removed:
                with contextlib.suppress(EngineError, QueueError):
                    self._clear_markers(self._removed)
                self._removed = []
            self._cap = None
            if self._published or self._records:  # else cleared by the next run's first removal
                with contextlib.suppress(EngineError, QueueError):
                    self._remove([])
        return self.stats

    def _retrying(self, call: Any) -> Any:
        def count(state: tenacity.RetryCallState) -> None:
            self.stats.retried += 1

        for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception(_transient),
            wait=tenacity.wait_exponential(multiplier=0.05, max=2.0),
            stop=tenacity.stop_after_delay(self.retry_seconds),
            before_sleep=count,
            reraise=True,
        ):
            with attempt:
                return call()
        raise AssertionError("unreachable")  # pragma: no cover

    def _signals(self) -> Any:
        def handler(signum: int, frame: FrameType | None) -> None:
            self.stop()

        old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)

        return restore


def _check_name(name: object, exclusive: bool) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not 1 <= len(name) <= 256:
        raise QueueError(f"a forwarder's name must be a str of 1 to 256 characters, got {name!r}")
    if exclusive:
        raise QueueError("name= resumes a leased forwarder's batches; an exclusive one needs none")
    return name


def forward(
    src_db: Database,
    src: str,
    dst_db: Database,
    dst: str,
    *,
    batch: int = 100,
    limit: int | None = None,
    where: Mapping[str, Any] | None = None,
    follow: bool = False,
    ack_queue: str | None = None,
    progress: bool = False,
    exclusive: bool = False,
    root: tuple[Any, ...] = DEFAULT_ROOT,
    name: str | None = None,
) -> ForwardStats:
    """Forward queue ``src`` of ``src_db`` to queue ``dst`` of ``dst_db`` exactly once (see the
    module's docstring) until the source is empty (``follow``: until stopped); resumable: a
    forward after a crash finishes what the crashed one began. ``where``: only the messages
    whose headers match. ``progress``: a status line on stderr after each batch. Returns its
    statistics. ``limit``: at most that many messages, exactly. ``name``: see
    :class:`Forwarder`. ``exclusive``: the forwarder is the source queue's only consumer (an
    outbox): no leases. An unknown source queue is QueueNotFoundError, not
    "0 forwarded"; with ``follow`` it is awaited (a RemoteQueue's outbox appears on first use)."""
    _check_run(follow=follow, limit=limit)
    check_flag("progress", progress)
    f = Forwarder(
        src_db,
        src,
        dst_db,
        dst,
        batch=batch,
        ack_queue=ack_queue,
        root=root,
        where=where,
        exclusive=exclusive,
        name=name,
    )
    if not follow and run_once(f._src_db, lambda t, _: read_meta(t, f.src.keys).config) is None:
        raise QueueNotFoundError(f"no queue named {src!r} to forward")
    return f.run(follow=follow, limit=limit, progress=_status_line if progress else None)


def _check_root(what: str, root: object) -> None:
    """A key root: a non-empty tuple (or list) of tuple-layer elements, as ``DEFAULT_ROOT``."""
    if not isinstance(root, (tuple, list)) or not root:
        raise QueueError(f"{what} must be a non-empty tuple such as {DEFAULT_ROOT!r}, got {root!r}")


def _check_run(
    *, follow: object, limit: object, install_signals: object = False, idle_timeout: object = None
) -> None:
    """The arguments of a run (Forwarder.run, forward), before it begins."""
    check_flag("follow", follow)
    check_flag("install_signals", install_signals)
    check_limit(limit)
    if idle_timeout is not None:
        check_duration("idle_timeout", idle_timeout, positive=True)


def _status_line(stats: ForwardStats) -> None:
    lag = "" if stats.lag is None else f", lag {stats.lag:.1f} s"
    sys.stderr.write(f"\rforwarded {stats.forwarded}, skipped {stats.skipped}, retried {stats.retried}{lag}")
    sys.stderr.flush()
