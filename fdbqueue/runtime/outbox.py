"""The exclusive forwarder (``forwarding.py``): no leases, the forwarder being the source
queue's only consumer (an outbox). Its steps, as the :class:`Outbox` part of ``Forwarder``
(its reads are ``ops/outbox.py``):
install the messages themselves on the destination, each with a marker; remove them from the
source. docs/forwarding.md, "The exclusive forwarder", has the reasoning."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.ops import transit
from fdbqueue.ops.enqueuing import enqueue_in
from fdbqueue.ops.moves.core import Note
from fdbqueue.ops.moves.departures import count_sent, send_away
from fdbqueue.ops.outbox import Ready, peek
from fdbqueue.ops.privileges import check
from fdbqueue.ops.receipts import run_once_confirmed
from fdbqueue.ops.remotededup import DEDUP_HEADER, already_there, carry, layer_keys
from fdbqueue.ops.txn import run_once
from fdbqueue.store.clock import db_now, versions
from fdbqueue.store.entropy import new_rand
from fdbqueue.store.layout import forward_marker, forward_marker_range
from fdbqueue.store.meta import read_meta
from fdbqueue.types import ForwardStats, Item, Message

log = logging.getLogger("fdbqueue.runtime.forwarding")

MARKER_TTL = 7 * 86400.0  # a marker older than this whose message left the source: cleared


class Outbox:
    """The exclusive path of a ``Forwarder`` (and what both paths share: the limit's count,
    the acknowledgements). The attributes are the Forwarder's."""

    src_db: Database | Transaction
    dst_db: Database | Transaction
    _src_db: Database
    src: Queue
    dst: Queue
    ack: Queue | None
    where: Mapping[str, Any] | None
    batch: int
    origin: str
    stats: ForwardStats
    _stop: threading.Event
    _cap: int | None
    _pending: list[Ready] | None
    _removed: list[str]
    _too_large: dict[str, str]  # of the batch installed: dead letters, by id (their reasons)

    # -- the exclusive path: no leases ---------------------------------------------------------

    def _peek(self, t: Transaction, taken: int = 0) -> list[Ready]:
        """Exclusive step 1: a batch, or what is left of ``run``'s limit once ``taken`` more
        leave the source."""
        n = self.batch if self._cap is None else min(self.batch, self._cap - taken)
        return peek(t, self.src.keys, n, self.where) if n > 0 else []

    def _send_away(self, batch: list[Ready]) -> tuple[list[Message], list[Ready]]:
        """Exclusive step 3, with the next batch's step 1: one source transaction removes
        what the destination now holds and reads the next batch."""
        skeys = self.src.keys
        note = Note("forward_out", None, {"to": self.dst.name})

        def body(t: Transaction) -> tuple[list[Message], list[Ready]]:
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
                reason = self._too_large.get(r.message.id)
                if reason is not None and meta.config is not None:
                    transit.dead_letter_ready(t, skeys, meta.config, r.key, r.rec, reason)
                    continue
                send_away(t, skeys, r.key, r.rec, journaled=journaled, note=note)
                done.append(r.message)
            count_sent(t, skeys, len(done))
            self._acknowledge(t, done)
            return done, self._peek(t, len(done))

        return run_once_confirmed(self.src_db, skeys, body)

    def _install_marked(self, batch: list[Message]) -> tuple[int, int]:
        """Exclusive step 2: one destination transaction installs the messages themselves, each
        with a marker; one already marked is skipped (an earlier attempt's). As many as the
        queue has room for, in order: returns how many of the batch are there now, and how
        many of those it wrote."""
        dkeys = self.dst.keys
        layer = layer_keys(self._src_db, self.src.keys, batch)  # dedup keys the source confirms

        def body(t: Transaction) -> tuple[int, int]:
            now = db_now(t)
            meta = read_meta(t, dkeys)
            room = transit.room_of(meta)
            # Too large for the destination: taken as handled, and dead-lettered on the source
            # by the removal (_send_away) instead of sent away.
            self._too_large = transit.too_large(dkeys, meta, batch)
            marks = t.get_many([forward_marker(dkeys, self.origin, m.id) for m in batch])
            # A RemoteQueue's message that may have reached the destination directly (its
            # enqueue there ended without an answer): skipped only as the stores confirm it.
            there = already_there(t, dkeys, batch, layer, now)
            fit, items = 0, list[Item]()
            for m, mark in zip(batch, marks, strict=True):
                if mark is None and m.id not in there and m.id not in self._too_large:
                    if room is not None and len(items) >= room:
                        break  # the rest when there is room: the destination's max_size holds
                    items.append(Item(m.id, new_rand(), m.payload, m.content_type, m.priority,
                                      {k: v for k, v in m.headers.items() if k != DEDUP_HEADER}, 0.0,
                                      _ttl_left(m), None, fixed_id=True, origin=self.origin,
                                      enqueued_us=transit.enqueued_us(m)))  # fmt: skip
                fit += 1
            if items:
                enqueue_in(dkeys, t, items, False, None)
            for m, mark in zip(batch[:fit], marks, strict=False):
                if mark is None and m.id not in self._too_large:
                    t.set(forward_marker(dkeys, self.origin, m.id), str(now).encode())
                    if m.id in layer and m.id not in there:
                        # The producer's key: a direct enqueue with it finds this message, and
                        # the unanswered remote one, landing late, conflicts (it read the key).
                        carry(t, dkeys, layer[m.id], m.id, now)
            for mid in self._removed:  # the last batch's: gone from the source, so done with
                t.clear(forward_marker(dkeys, self.origin, mid))
            return fit, len(items) + len([m for m in batch[:fit] if m.id in self._too_large])

        return run_once_confirmed(self.dst_db, dkeys, body)

    def _step_exclusive(self) -> int:
        batch = self._pending
        if batch is None:
            batch = run_once(self.src_db, lambda t, _: self._peek(t))
        elif self._cap is not None:
            batch = batch[: self._cap]  # read under another run's limit
        if not batch:
            self._pending = None
            return 0
        pause = 0.01
        while True:
            fit, new = self._install_marked([r.message for r in batch])
            if fit:
                break
            if self._stop.wait(pause):  # the destination is full: wait for room, or stop()
                self._pending = None
                return 0
            pause = min(1.0, pause * 2)
        self._removed = []
        done, self._pending = self._send_away(batch[:fit])
        self._removed = [m.id for m in done]
        self._took(len(done))
        self.stats.forwarded += len(done)
        self.stats.skipped += fit - new
        self.stats.lag = max(0.0, time.time() - batch[fit - 1].message.enqueued_at)
        return len(done) or fit  # a batch all dead-lettered (too large) is no empty source

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

    def _took(self, n: int) -> None:
        if self._cap is not None:
            self._cap = max(0, self._cap - n)

    def _clear_markers(self, ids: list[str]) -> None:
        dkeys = self.dst.keys

        def body(t: Transaction, _: bool) -> None:
            for mid in ids:
                t.clear(forward_marker(dkeys, self.origin, mid))

        run_once(self.dst_db, body)


def _ttl_left(m: Message) -> float | None:
    """The seconds of its TTL a message has left (None: none), as the destination's TTL."""
    if m.expires_at is None:
        return None
    return max(0.001, m.expires_at - time.time())
