"""High-contention dequeue: the staged dequeue-request set (FoundationDB's high-contention queue).

A dequeuer registers a request ``("pop", time, rand)``; whichever waiter runs next pairs
waiting requests with ready messages in batches, using snapshot range reads plus exact
point reads of each paired request and message, so two fulfillers conflict only when
they touch the same one; each pairing writes the message to ``("res", rand)``, and its
requester collects it. Throughput holds up as dequeuers are added, where plain
dequeues all collide on the first key.

It cannot join a caller's transaction: the request must be committed (visible) before
anyone can fulfil it, and the result is collected in a later transaction, so a staged
dequeue spans several transactions of its own. In a caller's transaction use the plain
dequeue: it conflicts under contention and the caller's retry loop runs it again.
"""

from __future__ import annotations

import os
import random
import struct
import time
from typing import TYPE_CHECKING

from fdbqueue.clock import now_us
from fdbqueue.config import QueueConfig, due_entries, read_meta
from fdbqueue.delivery import HEAD_SKIP_LIMIT, expire, remove_message
from fdbqueue.engines.base import Database, KeyValue, Transaction
from fdbqueue.errors import EngineError
from fdbqueue.layout import QueueKeys, pack_count
from fdbqueue.message import Message, Record

if TYPE_CHECKING:
    from fdbqueue.queue import Queue

BATCH = 100
STALE_REQUEST_US = 30_000_000  # a request this old lost its waiter: clear it, pair nothing
_PENDING = object()
_RESULT_HEAD = struct.Struct("<qH")


def encode_result(made_us: int, key: bytes, record: bytes) -> bytes:
    """A fulfilled request: when, the message's ready key (its place), its record."""
    return _RESULT_HEAD.pack(made_us, len(key)) + key + record


def decode_result(raw: bytes) -> tuple[int, bytes, bytes]:
    made_us, n = _RESULT_HEAD.unpack_from(raw)
    start = _RESULT_HEAD.size
    return made_us, raw[start : start + n], raw[start + n :]


def _live_items(queue: Queue, t: Transaction, cfg: QueueConfig, n: int, now: int) -> list[KeyValue]:
    """Up to ``n`` ready messages from the head, moving aside the expired ones met on the way."""
    begin, end = queue.keys.ready_range()
    out: list[KeyValue] = []
    scanned = 0
    while len(out) < n and scanned < n + HEAD_SKIP_LIMIT:
        batch = t.snapshot.get_range(begin, end, limit=n - len(out) + 8)
        for kv in batch:
            rec = Record.decode(kv.value)
            if rec.expires_us is not None and rec.expires_us <= now:
                t.add_read_conflict_key(kv.key)  # as for a pairing: only a true collision conflicts
                expire(queue, t, cfg, kv.key, rec)
            elif len(out) < n:
                out.append(kv)
        scanned += len(batch)
        if len(batch) < n - len(out) + 8 or not batch:
            break
        begin = batch[-1].key + b"\x00"
    return out


def waiting_requests(tr: Transaction, keys: QueueKeys) -> bool:
    """True when staged requests wait (a snapshot read: no conflict)."""
    return bool(tr.snapshot.get_range(*keys.pop_range(), limit=1))


def staged_dequeue(db: Database, queue: Queue) -> Message | None:
    """Dequeue through the request set; None when the queue was empty at fulfilment."""
    from fdbqueue.queue import run_once

    keys = queue.keys
    rand = os.urandom(8)  # made outside every retry loop: the request's identity
    req_key = keys.pop_key(now_us(), rand)
    res_key = keys.result_key(rand)

    def register(t: Transaction, unknown: bool) -> bool:
        if unknown and any(v is not None for v in t.get_many([res_key, req_key])):
            # The attempt that ended in commit_unknown_result did register, and another
            # waiter may already have paired it: registering again could pair it twice.
            return True
        meta = read_meta(t, keys)
        if meta.config is None:
            return False
        if not meta.state.dequeue:
            from fdbqueue.queue import QueueStoppedError

            raise QueueStoppedError(f"dequeue is disabled on queue {queue.name!r}")
        t.set(req_key, b"")  # the same key on every attempt: idempotent
        return True

    if not run_once(db, register):
        return None
    delay = 0.0005
    while True:
        # Our own request first: with many dequeuers another's fulfil has usually paired it
        # already, and then this fulfil stops at its first read (see ``mine``) instead of
        # pairing others' requests and colliding with their fulfils.
        fulfil(db, queue, mine=req_key)
        got = _collect(db, queue, req_key, res_key)
        if got is not _PENDING:
            return got  # type: ignore[return-value]
        time.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, 0.05)


def _collect(db: Database, queue: Queue, req_key: bytes, res_key: bytes) -> object:
    from fdbqueue.queue import run_once

    keys = queue.keys
    taken: list[Message] = []

    def body(t: Transaction, unknown: bool) -> object:
        request, raw = t.get_many([req_key, res_key])  # one round trip for both
        if unknown and taken and raw is None:
            return taken[0]  # the attempt that ended in commit_unknown_result committed
        if request is not None:
            return _PENDING
        if raw is None:
            return None
        _made, key, record = decode_result(raw)
        msg = queue._message(t, key, record, delivered=True)
        t.clear(res_key)
        if Record.decode(record).chunks:
            t.clear_range(*keys.chunk_range(msg.id))
        taken[:] = [msg]
        return msg

    return run_once(db, body)


def _done(mine: bytes, reqs: list[KeyValue]) -> bool:
    """True when request ``mine`` is not among ``reqs``, the first waiting requests in order,
    though it would be: it was paired (or cleared) already."""
    if len(reqs) == BATCH and mine > reqs[-1].key:
        return False  # beyond this batch: it may still wait
    return all(kv.key != mine for kv in reqs)


def fulfil(db: Database, queue: Queue, *, mine: bytes | None = None) -> int:
    """Pair waiting requests with ready messages, a batch per transaction; returns pairs made.

    ``mine``: the caller's own request key. When the first read shows it no longer waits
    (another waiter paired it), nothing is paired: the caller collects its result at once.
    """
    keys = queue.keys
    made = 0
    t = db.create_transaction()
    try:
        while True:
            try:
                # A constant number of round trips per batch, none per pair: the requests
                # and messages come from snapshot range reads, each one paired gets a read
                # conflict key of its own (FoundationDB's high-contention queue recipe: two
                # fulfillers conflict only when they touch the same request or message), and
                # the requests' result keys are read together in one get_many.
                reqs = t.snapshot.get_range(*keys.pop_range(), limit=BATCH)
                if not reqs:
                    return made
                if mine is not None and _done(mine, reqs):
                    return made
                now = now_us()
                meta = read_meta(t, keys)
                cfg = meta.config
                if cfg is not None and due_entries(t, keys, meta, now):
                    from fdbqueue.sweep import sweep_step

                    sweep_step(queue, t, cfg, now, 16)  # due delays and expired leases first
                stale_before = now - STALE_REQUEST_US
                live = []
                for req in reqs:
                    if keys.unpack_tail(req.key)[1] < stale_before:
                        t.add_read_conflict_key(req.key)
                        t.clear(req.key)
                    else:
                        live.append(req)
                items = _live_items(queue, t, cfg, len(live), now) if cfg is not None else []
                paired = live[: len(items)]
                results = [keys.result_key(keys.unpack_tail(req.key)[2]) for req in paired]
                existing = t.get_many(results) if results else []
                handed = 0
                for req, item, res, seen in zip(paired, items, results, existing, strict=True):
                    # Conflict keys, not reads: without them two fulfillers could hand out
                    # one message twice, and the snapshot reads already gave the values.
                    t.add_read_conflict_key(req.key)
                    t.add_read_conflict_key(item.key)
                    if seen is not None:
                        t.clear(req.key)  # already paired (see register): never pair twice
                        continue
                    t.set(res, encode_result(now, item.key, item.value))
                    rec = Record.decode(item.value)
                    remove_message(t, keys, item.key, rec, chunks=False)  # its requester reads them
                    handed += 1
                    t.clear(req.key)
                if handed:  # one atomic add per counter for the batch, not one per pair
                    t.add(keys.counter("ready"), pack_count(-handed))
                    t.add(keys.counter("done"), pack_count(handed))
                for req in live[len(items) :]:
                    t.add_read_conflict_key(req.key)
                    t.clear(req.key)  # nothing to pair: its requester gets None
                t.commit()
                made += min(len(live), len(items))
                if len(reqs) < BATCH:
                    return made
                t.reset()
            except EngineError as exc:
                if exc.code == 1020:
                    return made  # another waiter fulfilled these
                t.on_error(exc)
    finally:
        t.cancel()
