"""Forwarding between two databases, exactly once: ``forward`` and ``Forwarder``.

Between two systems no transaction spans both, so the queue manager's forwarding (Bernstein &
Newcomer) is done in steps, each one transaction of one side, any of which a crash or a stall
of any length may interrupt (``transit.py`` has the keys; docs/forwarding.md the reasoning):

1. **Lease** a batch on the source (``lease_many``): hidden from others while the forwarder
   works; back by themselves if it dies or stalls past the lease.
2. **Install** a *pending* copy of each on the destination, named by the message's id and the
   lease's receipt: hidden, not a message yet.
3. **Remove** them from the source, each only while its lease is still ours (``ack``, journaled
   ``forward_out``), writing a *tombstone* (id, receipt) and the ``ack_queue`` acknowledgement
   in the same transaction. A message whose lease was lost meanwhile (a stall: another
   forwarder or a consumer has it) is not removed, and its pending copy is withdrawn.
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
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import tenacity

from fdbqueue.api.queue import Queue
from fdbqueue.api.transfer import check_limit
from fdbqueue.engines.contract import Database, Transaction, adopt, is_transaction
from fdbqueue.errors import (
    ClusterUnavailableError,
    EngineError,
    QueueError,
    QueueNotFoundError,
    StoreError,
)
from fdbqueue.ops import transit
from fdbqueue.ops.delivery import ack_many_in, check_lease_seconds
from fdbqueue.ops.enqueuing import enqueue_in
from fdbqueue.ops.moves import Note
from fdbqueue.ops.outbox import Ready
from fdbqueue.ops.privileges import check
from fdbqueue.ops.receipts import run_once_confirmed
from fdbqueue.ops.remotededup import carry, layer_keys, there_named
from fdbqueue.ops.txn import run_once
from fdbqueue.runtime.outbox import Outbox
from fdbqueue.store.clock import db_now, versions
from fdbqueue.store.config import Meta, read_meta
from fdbqueue.store.layout import DEFAULT_ROOT, forward_marker
from fdbqueue.types import ForwardStats, Item, Message, check_duration, check_flag, check_where

log = logging.getLogger("fdbqueue.runtime.forwarding")

LEASE_SECONDS = 60.0  # a batch's lease on the source: long enough for a slow destination
# DEDUP_HEADER: a RemoteQueue's message kept locally names the dedup key of its remote attempt
# (taken off on install); remotededup.py says when the forwarder acts on it.


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (ClusterUnavailableError, StoreError)) or (
        isinstance(exc, EngineError) and exc.retryable
    )


class Forwarder(Outbox):
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
        self._hand: _Hand | None = None  # the leased batch in hand, through its steps
        self._published: list[str] = []  # ids whose tombstones the next removal clears
        self._recovered_at = 0.0

    def stop(self) -> None:
        """Stop after the batch in hand (from another thread or a signal handler)."""
        self._stop.set()

    # -- before the first step: one store or two, tokens, room -------------------------------------

    def _prepare(self) -> None:
        """Refuse a queue forwarded into itself, whatever the handles or URLs name it: a probe
        written on the source is looked for on the destination (the same store and queue see
        it; a copy of the store made before does not). Learns the tokens and the room."""
        if self._tokens is not None:
            return
        tokens, self._room = transit.prepare(self._src_db, self.src.keys, self._dst_db, self.dst.keys)
        if tokens is None:
            raise QueueError(_ITSELF.format(self.src.name))
        self._tokens = tokens

    # -- the leased path: lease, install, remove, publish --------------------------------------

    def _lease(self, n: int) -> tuple[list[Message], transit.Record_ | None]:
        """Step 1; named: the batch recorded under the name in the leasing transaction."""
        if self.name is None:
            return self.src.lease_many(self.src_db, n, self.lease_seconds, where=self.where), None
        return run_once_confirmed(self.src_db, self.src.keys, lambda t: self._lease_in(t, n))

    def _lease_in(self, t: Transaction, n: int) -> tuple[list[Message], transit.Record_ | None]:
        """Step 1 in the source's transaction ``t``."""
        batch = self.src.lease_many(t, n, self.lease_seconds, where=self.where)
        if self.name is None or not batch:
            return batch, None
        dest = self._token_pair()[1]
        return batch, transit.record_hand(t, self.src.keys, dest, self.name, batch, db_now(t))

    def _take_over(self) -> _Hand | None:
        """A named forwarder's first steps: the oldest batch its namesakes left recorded, taken
        over (``transit.take_over``), as the batch in hand; None when none is left."""
        skeys, (_, dest), name = self.src.keys, self._token_pair(), str(self.name)

        def body(t: Transaction) -> transit.Handover | None:
            check(t, skeys, "dequeue", read_meta(t, skeys))
            return transit.take_over(t, skeys, dest, name, self.lease_seconds, db_now(t), self._cursor)

        got = run_once_confirmed(self.src_db, skeys, body)
        if got is None:
            return None
        self._cursor = got.key
        return _Hand(got.live, lost=list(got.dead), removed=got.removed, record=got.record)

    def _install(self, batch: list[Message]) -> int:
        """Step 2: one destination transaction writes the pending copies; returns how many (the
        exclusive path: installs the messages themselves, see ``_install_marked``)."""
        if self.exclusive:
            return self._install_marked(batch)[1]
        dkeys = self.dst.keys
        layer = layer_keys(self._src_db, self.src.keys, batch)  # dedup keys the source confirms
        big = run_once_confirmed(self.dst_db, dkeys, lambda t: self._install_in(t, batch, layer, None))
        return self._dead_letter(batch, big)

    def _install_in(
        self, t: Transaction, batch: list[Message], layer: Mapping[str, str], meta: Meta | None
    ) -> dict[str, str]:
        """Step 2 in the destination's transaction ``t`` (``meta``: its settings, when read
        already); returns the messages too large for it, by id (their reasons)."""
        dkeys, (source, _) = self.dst.keys, self._token_pair()
        if meta is None:
            meta = read_meta(t, dkeys)
            check(t, dkeys, "enqueue", meta)
        big = transit.admissible(dkeys, meta, batch)  # too large for it: dead letters
        transit.install(t, dkeys, source, [m for m in batch if m.id not in big], db_now(t), layer)
        return big

    def _dead_letter(self, batch: list[Message], big: dict[str, str]) -> int:
        if big:  # their leases end there: step 3 finds them gone (lost), with no copy to withdraw
            transit.dead_letter_leased(self._src_db, self.src.keys, batch, big)
        return len(batch) - len(big)

    def _remove(
        self, batch: list[Message], ahead: int = 0
    ) -> tuple[list[Message], list[Message], transit.Record_ | None]:
        """Step 3: one source transaction removes each message whose lease is still ours, with
        its tombstone and acknowledgement; returns those removed, by this call or an earlier
        one that failed without an answer (their tombstones say so). Clears the tombstones of
        the messages published since the last removal. ``ahead``: the same transaction leases
        up to that many more, the next batch (step 1 of it; named: recorded), returned with
        its record: a run's steady state is one source transaction a batch."""
        skeys, (_, dest) = self.src.keys, self._token_pair()
        note = Note("forward_out", None, {"to": self.dst.name})
        published, records = list(self._published), list(self._records)

        def body(t: Transaction) -> tuple[list[Message], list[Message], transit.Record_ | None]:
            now = db_now(t)
            tombs = t.get_many([transit.tomb_key(skeys, dest, m.id) for m in batch])
            earlier = {
                m.id for m, raw in zip(batch, tombs, strict=True) if transit.tomb_receipt(raw) == m.receipt
            }
            rest = [m for m in batch if m.id not in earlier]
            done = ack_many_in(skeys, t, rest, now, note) if rest else []
            for m in done:
                t.set(transit.tomb_key(skeys, dest, m.id), f"{m.receipt}|{now}".encode())
            self._acknowledge(t, done)
            for mid in published:
                t.clear(transit.tomb_key(skeys, dest, mid))
            for record in records:  # named: batches published, nothing left to take over
                transit.clear_record(t, record)
            removed = earlier | {m.id for m in done}
            nxt, hand = self._lease_in(t, ahead) if ahead else ([], None)
            return [m for m in batch if m.id in removed], nxt, hand

        out = run_once_confirmed(self.src_db, skeys, body)
        self._published = self._published[len(published) :]
        self._records = self._records[len(records) :]
        return out

    def _withdraw(self, entries: list[transit.Entry]) -> None:
        """Clear pending copies whose lease ended without a removal: never to be published."""
        dkeys, (source, _) = self.dst.keys, self._token_pair()

        def body(t: Transaction, _: bool) -> None:
            for mid, receipt in entries:
                transit.drop_pending(t, dkeys, source, mid, receipt)

        run_once(self.dst_db, body)

    def _publish(
        self, entries: list[transit.Entry], ahead: _Hand | None = None
    ) -> tuple[int, list[transit.Entry]]:
        """Step 4: one destination transaction makes the pending copies of ``entries`` (removed
        from the source) messages, in order, as many as the queue's ``max_size`` has room for;
        returns how many it wrote, and the entries left waiting for room. A copy no longer
        there was published already (by ``recover``); one the destination holds already (an
        exclusive forwarder's marker, a RemoteQueue's enqueue that landed) is dropped.
        ``ahead``: the next batch, leased with this one's removal, installed (step 2) in the
        same transaction while the queue takes enqueues (else by a step of its own, which
        raises why not): a run's steady state is one destination transaction a batch."""
        dkeys, (source, _) = self.dst.keys, self._token_pair()
        layer_ahead = {} if ahead is None else layer_keys(self._src_db, self.src.keys, ahead.batch)

        def body(t: Transaction) -> tuple[int, list[transit.Entry], int | None, dict[str, str] | None]:
            meta = read_meta(t, dkeys)
            check(t, dkeys, "enqueue", meta)
            now = db_now(t)
            recs = transit.read_pending(t, dkeys, source, entries)
            marks = t.get_many([forward_marker(dkeys, self.origin, mid) for mid, _ in entries])
            # A RemoteQueue's message that may have reached the destination directly (its
            # enqueue there ended without an answer): skipped only as the stores confirm it.
            named = [(rec.id, str(rec.extra["dk"])) for rec in recs if rec is not None and "dk" in rec.extra]
            layer = {rec.id: str(rec.extra["dk"]) for rec in recs if rec is not None and rec.extra.get("dkl")}
            there = there_named(t, dkeys, named, layer, now)
            room = transit.room_of(meta)
            items: list[Item] = []
            left: list[transit.Entry] = []
            handled: list[str] = []
            for entry, rec, mark in zip(entries, recs, marks, strict=True):
                if left or (rec is not None and mark is None and rec.id not in there and room == 0):
                    left.append(entry)  # waits for room, and so do those after it (order)
                    continue
                handled.append(entry[0])
                if rec is None or mark is not None or rec.id in there:
                    continue
                items.append(transit.as_item(rec, self.origin))
                room = None if room is None else room - 1
            if items:
                enqueue_in(dkeys, t, items, False, None)
            for it in items:
                if it.id in layer:
                    # The producer's key: a direct enqueue with it finds this message, and
                    # the unanswered remote one, landing late, conflicts (it read the key).
                    carry(t, dkeys, layer[it.id], it.id, now)
            for mid in handled:
                transit.drop_pending(t, dkeys, source, mid)  # and any stale copy of another lease
            big = None
            if ahead is not None and meta.state.enqueue:
                big = self._install_in(t, ahead.batch, layer_ahead, meta)
            return len(items), left, room, big

        wrote, left, self._room, big = run_once_confirmed(self.dst_db, dkeys, body)
        if ahead is not None and big is not None:
            ahead.installed = True
            self._dead_letter(ahead.batch, big)
        done = {mid for mid, _ in left}
        self._published += [mid for mid, _ in entries if mid not in done]
        return wrote, left

    def _publish_all(
        self, entries: list[transit.Entry], *, wait: bool = True, ahead: _Hand | None = None
    ) -> tuple[int, int]:
        """Publish ``entries``, waiting for room (a backoff up to 1 s; ``stop()`` ends the
        wait: what is left stays pending, for ``recover`` to publish); the first transaction
        installs ``ahead`` (see ``_publish``). Returns how many it wrote, and how many are left."""
        wrote, pause = 0, 0.01
        while entries or (ahead is not None and not ahead.installed):
            n, entries = self._publish(entries, ahead)
            ahead = None
            wrote += n
            if entries and (not wait or self._stop.wait(pause)):
                break
            pause = min(1.0, pause * 2)
        return wrote, len(entries)

    def _wait_for_room(self) -> int:
        """How many messages to lease: a batch, or what the destination has room for; while it
        has none, wait (a backoff up to 1 s) until it has, or ``stop()`` (then 0)."""
        pause = 0.01
        while self._room is not None and self._room <= 0:
            if self._stop.wait(pause):
                return 0
            pause = min(1.0, pause * 2)
            self._room = run_once(self.dst_db, lambda t, _: transit.room_of(read_meta(t, self.dst.keys)))
        want = self.batch if self._room is None else min(self.batch, self._room)
        return want if self._cap is None else min(want, self._cap)

    def _token_pair(self) -> tuple[str, str]:
        if self._tokens is None:
            self._prepare()
        assert self._tokens is not None
        return self._tokens

    def recover(self, limit: int = 100) -> int:
        """Finish what a crashed or stalled forwarder left, older than a lease: publish the
        pending copies whose tombstone is on the source (and clear it), withdraw those whose
        lease ended without one (``transit.fates`` decides, on the source, for good). Returns
        how many copies it published or withdrew."""
        (source, dest), skeys, dkeys = self._token_pair(), self.src.keys, self.dst.keys
        age = versions(self.lease_seconds)
        found = run_once(self.src_db, lambda t, _: transit.tombs(t, skeys, dest, limit, db_now(t) - age))
        pend = run_once(self.dst_db, lambda t, _: transit.pendings(t, dkeys, source, limit, db_now(t) - age))

        def fates(t: Transaction) -> list[str]:
            check(t, skeys, "dequeue", read_meta(t, skeys))
            return transit.fates(t, skeys, dest, pend, db_now(t))

        verdicts = run_once_confirmed(self.src_db, skeys, fates) if pend else []
        dead = [e for e, v in zip(pend, verdicts, strict=True) if v == transit.DEAD]
        removed = [e for e, v in zip(pend, verdicts, strict=True) if v == transit.REMOVED]
        if dead:
            self._withdraw(dead)
        todo = list(dict.fromkeys(found + removed))
        n = self._publish_all(todo, wait=False)[0] if todo else 0
        self._recovered_at = time.monotonic()
        return n + len(dead)

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
        moved = 0
        while not self._stop.is_set() or self._hand is not None:
            if self._hand is None and not self._resumed:
                self._hand = self._take_over()  # a namesake's batch first
                self._resumed = self._hand is None
            if self._hand is None:
                want = self._wait_for_room()
                batch, record = self._lease(want) if want else ([], None)
                if not batch:
                    return moved
                self._hand = _Hand(batch, record=record)
            h = self._hand  # resumed where it stopped when a step is retried (run)
            if not h.installed:
                if h.batch:
                    self._install(h.batch)
                h.installed = True
            if h.done is None:
                want = self._want_ahead(len(h.batch)) if ahead and h.batch else 0
                h.done, nxt, record = self._remove(h.batch, want) if h.batch else ([], [], None)
                if nxt:
                    h.ahead = _Hand(nxt, record=record)
                kept = {m.id for m in h.done}
                h.lost += [(m.id, str(m.receipt)) for m in h.batch if m.id not in kept]
            if h.lost:  # leases lost to a stall: another forwarder or a consumer has them
                self._withdraw(h.lost)
                h.lost = []
            entries = h.removed + [(m.id, str(m.receipt)) for m in h.done]
            wrote, left = self._publish_all(entries, ahead=h.ahead)
            self._hand = h.ahead  # leased and (unless the destination refused it) installed
            if h.record is not None and not left:
                self._records.append(h.record)  # cleared by the next removal, or at the end
            self.stats.forwarded += wrote
            self.stats.skipped += len(entries) - wrote - left
            self._took(len(entries))
            if h.done:
                self.stats.lag = max(0.0, time.time() - h.done[-1].enqueued_at)
            moved += len(entries)
            if moved and not (self._hand is not None and self._stop.is_set()):
                return moved
        return moved

    def _want_ahead(self, in_hand: int) -> int:
        """How many to lease ahead with the removal of a batch of ``in_hand``: a batch, within
        the room the destination has left once that batch is in and what is left of ``run``'s
        limit; none once stopping (the run ends with nothing in hand)."""
        if self._stop.is_set():
            return 0
        want = self.batch if self._room is None else min(self.batch, self._room - in_hand)
        return max(0, want if self._cap is None else min(want, self._cap - in_hand))

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


_ITSELF = "forwarding queue {!r} into itself (one store, one queue): it would delete every message"


@dataclass
class _Hand:
    """A leased batch through the steps: installed, then removed (``done``: those whose lease
    was still ours; ``lost``: pending copies of the others, to withdraw), then published.
    Taken over from a namesake: ``removed`` left the source already, published first;
    ``record``: the batch's record under the forwarder's name."""

    batch: list[Message]
    installed: bool = False
    done: list[Message] | None = None
    lost: list[transit.Entry] = field(default_factory=list)
    removed: list[transit.Entry] = field(default_factory=list)
    record: transit.Record_ | None = None
    ahead: _Hand | None = None  # a run's next batch, leased with this one's removal


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
