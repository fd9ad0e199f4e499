"""Forwarding between two databases, exactly once: ``forward`` and ``Forwarder``.

Between two systems no transaction spans both, so the queue manager's forwarding (Bernstein &
Newcomer) is done in three steps, each one transaction, any of which a crash may interrupt:

1. **Lease** a batch on the source (``lease_many``): the messages are hidden from others while
   the forwarder works, and come back by themselves if it dies.
2. **Install** them on the destination, each with a marker ``("fw", source, id)`` written in
   the same transaction; a message whose marker is there already was installed by an earlier
   attempt and is skipped. The destination keeps each message's id.
3. **Remove** them from the source: ack each lease (journaled ``forward_out``), and put one
   acknowledgement on ``ack_queue`` per message in the same transaction.

A crash before 2 commits: the leases expire, the messages are leased again and installed then.
Between 2 and 3: leased again, found marked, skipped at 2, removed at 3. In 3: its receipt
settles a commit_unknown_result; a lease that expired meanwhile makes that message go round
again, skipped at 2. So every message is installed once and removed once, and its ack sent
once (3 runs once per message). A batch's markers are cleared by the next batch's step 2 (no
transaction of their own); those a crash or the end of a run leaves are cleared by
``prune_markers`` once older than ``MARKER_TTL``, when their message is gone from the source
(``run`` prunes a bounded batch when it starts and when it ends).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, NamedTuple

import tenacity

from fdbqueue.clock import db_now, versions
from fdbqueue.config import QueueNotFoundError, read_meta
from fdbqueue.delivery import ack_many_in, to_message
from fdbqueue.engines.base import Database, Transaction, adopt, is_transaction
from fdbqueue.enqueuing import enqueue_items
from fdbqueue.errors import ClusterUnavailableError, CorruptMessageError, EngineError, QueueError, StoreError
from fdbqueue.layout import DEFAULT_ROOT, forward_marker, forward_marker_range, new_rand
from fdbqueue.message import Record, decode_record
from fdbqueue.moves import Note, count_sent, send_away
from fdbqueue.privileges import check
from fdbqueue.queue import Queue
from fdbqueue.receipts import settled
from fdbqueue.txn import run_once
from fdbqueue.types import Item, Message, check_flag, check_where, headers_match

log = logging.getLogger("fdbqueue.forwarding")

LEASE_SECONDS = 60.0  # a batch's lease on the source: long enough for a slow destination
MARKER_TTL = 7 * 86400.0  # a marker older than this whose message left the source: cleared
# The header of a RemoteQueue's message kept locally after its remote enqueue ended without an
# answer: the dedup key that enqueue used on the destination (taken off on install).
DEDUP_HEADER = "fdbqueue-remote-dedup"


@dataclass
class ForwardStats:
    """What a forward did: messages forwarded, found installed already (an earlier attempt's),
    attempts retried after a failure of either side, and the lag: seconds from a message's
    enqueue to its arrival, for the last one forwarded."""

    forwarded: int = 0
    skipped: int = 0
    retried: int = 0
    lag: float | None = None


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (ClusterUnavailableError, StoreError)) or (
        isinstance(exc, EngineError) and exc.retryable
    )


class Forwarder:
    """Forwards queue ``src`` of ``src_db`` to queue ``dst`` of ``dst_db``, exactly once (see
    the module's docstring); ``run(follow=True)`` keeps going as messages arrive."""

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
    ) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 1000:
            raise QueueError(f"batch must be an int from 1 to 1000, got {batch!r}")
        self.src_db, self.dst_db = adopt(src_db), adopt(dst_db)
        if is_transaction(self.src_db) or is_transaction(self.dst_db):
            raise QueueError("forward takes two Databases: each step is a transaction of its own")
        self._src_db: Database = self.src_db  # type: ignore[assignment]
        self.src, self.dst = Queue(src, root=root), Queue(dst, root=dst_root or root)
        self.ack = None if ack_queue is None else Queue(ack_queue, root=root)
        self.where = check_where(where)
        self.exclusive = check_flag("exclusive", exclusive)
        self._pending: list[_Ready] | None = None  # exclusive: the next batch, read with the last removal
        self.batch = batch
        self.stats = ForwardStats()
        self.retry_seconds = retry_seconds
        self.lease_seconds = lease_seconds
        # The source as the destination's markers name it: its queue (the store is the
        # forwarder's to choose: one forwarder a source queue and destination).
        self.origin = src
        self._stop = threading.Event()
        self._removed: list[str] = []  # the last batch removed from the source: markers to clear

    def stop(self) -> None:
        """Stop after the batch in hand (from another thread or a signal handler)."""
        self._stop.set()

    # -- the three steps -------------------------------------------------------------------------

    def _lease(self) -> list[Message]:
        return self.src.lease_many(self.src_db, self.batch, self.lease_seconds, where=self.where)

    def _install(self, batch: list[Message]) -> int:
        """Step 2: one destination transaction; returns how many were new."""
        dkeys = self.dst.keys

        def body(t: Transaction) -> int:
            now = db_now(t)
            marks = t.get_many([forward_marker(dkeys, self.origin, m.id) for m in batch])
            # A RemoteQueue's message that may have reached the destination directly (its
            # enqueue there ended without an answer) names the dedup key it used there.
            dedup = {m.id: m.headers[DEDUP_HEADER] for m in batch if DEDUP_HEADER in m.headers}
            there = dict(zip(dedup, t.get_many([dkeys.dedup_key(k) for k in dedup.values()]), strict=True))
            items = [
                Item(m.id, new_rand(), m.payload, m.content_type, m.priority,
                     {k: v for k, v in m.headers.items() if k != DEDUP_HEADER}, 0.0,
                     _ttl_left(m), None, fixed_id=True, origin=self.origin)
                for m, mark in zip(batch, marks, strict=True)
                if mark is None and there.get(m.id) is None
            ]  # fmt: skip
            if items:
                enqueue_items(self.dst.keys, t, items, 0)
            for m, mark in zip(batch, marks, strict=True):
                if mark is None:
                    t.set(forward_marker(dkeys, self.origin, m.id), str(now).encode())
                    key = dedup.get(m.id)
                    if key is not None and there.get(m.id) is None:
                        # The key the unanswered remote enqueue used: were it to land late,
                        # its commit now conflicts (it read this key) instead of adding a copy.
                        t.set(dkeys.dedup_key(key), f"{m.id}|{now}".encode())
                        t.set(dkeys.dedup_time_key(now, key), b"")
            for mid in self._removed:  # the last batch's: gone from the source, so done with
                t.clear(forward_marker(dkeys, self.origin, mid))
            return len(items)

        return settled(self.dst_db, dkeys, body)

    # -- the exclusive path: no leases ---------------------------------------------------------

    def _peek(self, t: Transaction) -> list[_Ready]:
        """Up to ``batch`` ready messages from the head (snapshot reads, nothing written); the
        expired and damaged ones are left to the sweep and to consumers' dequeues."""
        keys = self.src.keys
        now = db_now(t)
        out: list[_Ready] = []
        begin, end = keys.ready_range()
        while len(out) < self.batch:
            want = self.batch - len(out) + 8
            kvs = t.snapshot.get_range(begin, end, want)
            for key, raw in kvs:
                try:
                    rec = decode_record(raw, keys, key)
                except CorruptMessageError:
                    continue
                if rec.expires_us is not None and rec.expires_us <= now:
                    continue
                if self.where is not None and not headers_match(rec.headers, self.where):
                    continue
                out.append(_Ready(key, raw, rec, to_message(t, keys, key, rec)))
                if len(out) == self.batch:
                    break
            if len(kvs) < want or (self.where is None and len(out) == self.batch):
                break
            begin = kvs[-1].key + b"\x00"
        return out

    def _send_away(self, batch: list[_Ready]) -> tuple[list[Message], list[_Ready]]:
        """Exclusive step 3, with the next batch's step 1: one source transaction removes
        what the destination now holds and reads the next batch."""
        skeys = self.src.keys
        note = Note("forward_out", None, {"to": self.dst.name})

        def body(t: Transaction) -> tuple[list[Message], list[_Ready]]:
            meta = read_meta(t, skeys)
            check(t, skeys, "dequeue", meta)
            journaled = meta.config is not None and meta.config.journal
            done = []
            raws = t.get_many([r.key for r in batch])  # serializable: a change meanwhile conflicts
            for r, raw in zip(batch, raws, strict=True):
                if raw != r.raw:
                    log.warning(
                        "exclusive forward of %r: message %s changed or was taken by another consumer "
                        "after it was installed on %r (the forwarder must be the queue's only consumer)",
                        self.src.name,
                        r.message.id,
                        self.dst.name,
                    )
                    continue
                send_away(t, skeys, r.key, r.rec, journaled=journaled, note=note)
                done.append(r.message)
            count_sent(t, skeys, len(done))
            self._acknowledge(t, done)
            return done, self._peek(t)

        return settled(self.src_db, skeys, body)

    def _step_exclusive(self) -> int:
        batch = self._pending
        if batch is None:
            batch = run_once(self.src_db, lambda t, _: self._peek(t))
        if not batch:
            self._pending = None
            return 0
        new = self._install([r.message for r in batch])
        self._removed = []
        done, self._pending = self._send_away(batch)
        self._removed = [m.id for m in done]
        self.stats.forwarded += len(done)
        self.stats.skipped += len(batch) - new
        self.stats.lag = max(0.0, time.time() - batch[-1].message.enqueued_at)
        return len(done)

    # -- step 3 --------------------------------------------------------------------------------

    def _remove(self, batch: list[Message]) -> list[Message]:
        """Step 3: one source transaction; returns the messages it removed (a lease that
        expired meanwhile leaves its message to go round again)."""
        skeys = self.src.keys
        note = Note("forward_out", None, {"to": self.dst.name})

        def body(t: Transaction) -> list[Message]:
            done = ack_many_in(skeys, t, batch, db_now(t), note)
            self._acknowledge(t, done)
            return done

        return settled(self.src_db, skeys, body)

    def _acknowledge(self, t: Transaction, done: list[Message]) -> None:
        """One acknowledgement on ``ack_queue`` per message removed, in the removing transaction."""
        if self.ack is not None and done:
            acks = [json.dumps({"id": m.id, "queue": self.src.name, "to": self.dst.name}) for m in done]
            self.ack.enqueue_many(t, acks)

    def prune_markers(self, limit: int = 1000) -> int:
        """Clear markers older than MARKER_TTL (database time of the destination) whose
        message the source no longer holds: what a crash, or the end of a run that could not
        reach the destination, left behind."""
        dkeys = self.dst.keys

        def old(t: Transaction, _: bool) -> list[tuple[bytes, str]]:
            cut = db_now(t) - versions(MARKER_TTL)
            out = []
            for kv in t.get_range(*forward_marker_range(dkeys, self.origin), limit):
                if int(kv.value) < cut:
                    out.append((kv.key, str(dkeys.root.unpack(kv.key)[-1])))
            return out

        found = run_once(self.dst_db, old)
        gone = [key for key, mid in found if self.src.get(self.src_db, mid) is None]

        def clear(t: Transaction, _: bool) -> None:
            for key in gone:
                t.clear(key)

        if gone:
            run_once(self.dst_db, clear)
        return len(gone)

    # -- running ---------------------------------------------------------------------------------

    def step(self) -> int:
        """Forward one batch through the three steps; returns how many messages it moved
        (0: nothing ready). Exceptions of either side propagate (``run`` retries them)."""
        if self.exclusive:
            try:
                return self._step_exclusive()
            except BaseException:
                self._pending = None  # read again by the next step: it may be out of date
                raise
        batch = self._lease()
        if not batch:
            return 0
        new = self._install(batch)
        self._removed = []
        done = self._remove(batch)
        self._removed = [m.id for m in done]
        self.stats.forwarded += len(done)
        self.stats.skipped += len(batch) - new
        self.stats.lag = max(0.0, time.time() - batch[-1].enqueued_at)
        return len(done)

    def run(
        self,
        *,
        follow: bool = False,
        limit: int | None = None,
        install_signals: bool = False,
        idle_timeout: float | None = None,
        progress: Callable[[ForwardStats], object] | None = None,
    ) -> ForwardStats:
        """Forward until the source is empty (or, with ``follow``, until ``stop()``, SIGTERM or
        SIGINT with ``install_signals``, or ``idle_timeout`` seconds without a message),
        retrying with a backoff while either side is down (tenacity); ``progress`` is called
        with the statistics after each batch."""
        restore = self._signals() if install_signals else None
        with contextlib.suppress(EngineError, QueueError):  # best effort: a side may be down
            self.prune_markers()
        try:
            while not self._stop.is_set() and (limit is None or self.stats.forwarded < limit):
                n = self._retrying(self.step)
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
        finally:
            if restore is not None:
                restore()
            if self._removed:
                with contextlib.suppress(EngineError, QueueError):
                    self._clear_markers(self._removed)
                self._removed = []
        return self.stats

    def _clear_markers(self, ids: list[str]) -> None:
        dkeys = self.dst.keys

        def body(t: Transaction, _: bool) -> None:
            for mid in ids:
                t.clear(forward_marker(dkeys, self.origin, mid))

        run_once(self.dst_db, body)

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


class _Ready(NamedTuple):
    """A ready message an exclusive forwarder read: where, its bytes, decoded, as a Message."""

    key: bytes
    raw: bytes
    rec: Record
    message: Message


def _ttl_left(m: Message) -> float | None:
    """The seconds of its TTL a message has left (None: none), as the destination's TTL."""
    if m.expires_at is None:
        return None
    return max(0.001, m.expires_at - time.time())


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
) -> ForwardStats:
    """Forward queue ``src`` of ``src_db`` to queue ``dst`` of ``dst_db`` exactly once (see the
    module's docstring) until the source is empty (``follow``: until stopped); resumable: a
    forward after a crash finishes what the crashed one began. ``where``: only the messages
    whose headers match. ``progress``: a status line on stderr after each batch. Returns its
    statistics. ``exclusive``: the forwarder is the source queue's only consumer (an outbox):
    no leases (see :class:`Forwarder`). An unknown source queue is QueueNotFoundError, not
    "0 forwarded"; with ``follow`` it is awaited (a RemoteQueue's outbox appears on first use)."""
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
    )
    if not follow and run_once(f._src_db, lambda t, _: read_meta(t, f.src.keys).config) is None:
        raise QueueNotFoundError(f"no queue named {src!r} to forward")
    return f.run(follow=follow, limit=limit, progress=_status_line if progress else None)


def _status_line(stats: ForwardStats) -> None:
    lag = "" if stats.lag is None else f", lag {stats.lag:.1f} s"
    sys.stderr.write(f"\rforwarded {stats.forwarded}, skipped {stats.skipped}, retried {stats.retried}{lag}")
    sys.stderr.flush()
