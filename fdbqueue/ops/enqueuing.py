"""Enqueue: new messages checked, encoded and written, ready or delayed, in one transaction.

The functions under :meth:`fdbqueue.Queue.enqueue` and ``enqueue_many``, and under the
layers that write new messages too (autonomous enqueues, forwarding, periodic jobs).
``enqueue_in`` composes inside a caller's transaction; ``enqueue_items`` runs it in its
own retried one when given a Database, exactly once across commit_unknown_result (1021):
a receipt made in the first attempt records the ids, and a retry reads them back.
"""

from __future__ import annotations

import math
import struct
import time
from functools import partial
from operator import attrgetter
from typing import Any

import tenacity

from fdbqueue.engines.contract import (
    Attempt,
    Database,
    Transaction,
    adopt,
    check_room,
    is_transaction,
    retry_loop,
)
from fdbqueue.errors import (
    PayloadTooLargeError,
    QueueError,
    QueueFullError,
    QueueStoppedError,
)
from fdbqueue.ops.items import check_batch_size, new_item, plain_item
from fdbqueue.ops.moves.arrivals import (
    CHUNK_SIZE,
    count_new,
    count_plain_enqueue,
    write_new,
    write_plain,
    write_plain_journaled,
)
from fdbqueue.ops.privileges import check, check_create
from fdbqueue.ops.receipts import maybe_clear_old_receipts, new_receipt, read_receipt
from fdbqueue.ops.tracing import inject
from fdbqueue.ops.txn import run_once
from fdbqueue.store.budget import (
    MAX_PAYLOAD_BYTES,
)
from fdbqueue.store.clock import db_now, now_us, versions
from fdbqueue.store.codec import unpack_count
from fdbqueue.store.config import QueueConfig, write_config
from fdbqueue.store.entropy import new_rand
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.meta import Meta, read_meta, read_plain
from fdbqueue.store.record import Record
from fdbqueue.types import ContentType, Item, check_duration


def enqueue_items(
    keys: QueueKeys, tr: Transaction | Database, items: list[Item], timeout: float | None
) -> list[str]:
    """Write ``items`` into the queue atomically; their ids, in order. In a caller's
    Transaction it composes (refused at once when full); given a Database it runs in its own
    retried transaction and, under the ``block`` overflow policy, waits up to ``timeout``."""
    # A receipt settles a commit_unknown_result of our own transaction (none to settle
    # in a caller's, nor on an engine whose commits are never unknown).
    tr = adopt(tr)
    if is_transaction(tr):
        if timeout is not None:
            check_duration("timeout", timeout)
        # A caller's transaction cannot wait (it must commit to see room), nor settle a receipt.
        return enqueue_in(keys, tr, items, False, None)  # type: ignore[arg-type]
    db: Database = tr  # type: ignore[assignment]
    own = getattr(db, "may_commit_unknown", True)  # engine_traits' second, without the call

    def body() -> list[str]:
        # The receipt is made in the first attempt (from its read version) and kept by
        # that call's retries; a new call after a refusal (a full queue) makes its own.
        # (run_once's loop, on the database adopted above.)
        receipt: list[bytes] | None = [] if own else None
        return retry_loop(db, partial(_attempt, keys, items, receipt), None, True)

    start = 0.0
    if timeout is not None:
        timeout = check_duration("timeout", timeout)
        if timeout == 0:
            return body()
        start = time.monotonic()  # (no clock read where nothing is timed: most calls)
    try:
        # body(), without its frame: there is room, no retry machinery built (most calls)
        return retry_loop(db, partial(_attempt, keys, items, [] if own else None), None, True)
    except QueueFullError as exc:
        if not exc.block:
            raise
    # overflow="block": wait for room, up to ``timeout`` or (None) until there is room.
    # Room comes from dequeues, acks and sweeps elsewhere; polled with a backoff of at
    # most 0.25 s. The sleep is interruptible (KeyboardInterrupt, a signal handler).
    try:
        for attempt in tenacity.Retrying(
            stop=tenacity.stop_never
            if timeout is None
            else tenacity.stop_after_delay(max(0.0, timeout - (time.monotonic() - start))),
            wait=tenacity.wait_exponential(multiplier=0.005, max=0.25),
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, QueueFullError) and e.block),
            reraise=True,
        ):
            with attempt:
                return body()
    except QueueFullError as exc:
        if not exc.block or timeout is None:
            raise  # refused without waiting ("reject", or a batch that can never fit)
        raise QueueFullError(f"{exc}; waited {timeout} s for room", block=exc.block) from None
    raise AssertionError("unreachable")  # pragma: no cover


def enqueue_one(keys: QueueKeys, tr: Transaction | Database, payload: bytes, priority: int) -> str:
    """:meth:`fdbqueue.Queue.enqueue` of the common call: ``payload`` bytes, ``priority`` an int
    of 32 bits (the caller checked both), no other option. Its id; what
    ``enqueue_items(keys, tr, [new_item(payload, priority, None, 0.0, None, None)], None)``
    does, which it is where the short way below does not apply.

    The short way: given a Database of an engine where nothing conflicts and no commit is
    unknown (``engine_traits`` both false: the embedded engine) and no trace to carry, its own
    retried transaction runs :func:`_plain_step` - no Item, no receipt (none to settle), the
    steps of ``_attempt`` this message needs and no more."""
    short = _short_kinds.get(tr.__class__)
    if short is None:
        short = _short_kinds[tr.__class__] = _short_kind(tr)
    if short and not tr.may_conflict and not tr.may_commit_unknown and inject(None) is None:  # type: ignore[union-attr]
        step = partial(_plain_step, keys, payload, priority, new_rand())
        try:
            return retry_loop(tr, step, None, True)  # type: ignore[arg-type]
        except QueueFullError as exc:
            if not exc.block:
                raise
            # overflow="block": enqueue_items' wait for room (no timeout: until there is room)
    return enqueue_items(keys, tr, [new_item(payload, priority, None, 0.0, None, None)], None)[0]


# Per type: whether it is an engine's Database (adopt's and is_transaction's answer, asked once).
_short_kinds: dict[type, bool] = {}


def _short_kind(obj: object) -> bool:
    try:
        return adopt(obj) is obj and not is_transaction(obj) and hasattr(obj, "may_conflict")
    except QueueError:  # not a database at all: the long way says so
        return False


_I64_UNPACK = struct.Struct("<q").unpack
_I64_PACK = struct.Struct("<q").pack
_BYTES_VALUE = ContentType.BYTES._value_


def _plain_step(
    keys: QueueKeys, payload: bytes, priority: int, rand: bytes, tr: Transaction, at: Attempt
) -> str:
    """One attempt of :func:`enqueue_one`'s short way, as the step of its retry loop.

    The settings come from ``read_plain`` (those this process last found, when still the
    queue's at the metadata version read and needing none of the enqueue's checks: the queue
    exists, is open to every principal and admits enqueues, no max_size, TTL nor volatile
    flag); else the attempt is ``_attempt``'s, which checks and refreshes them. Then the
    steps of ``_attempt`` for this message: the room check, ``_write_new``'s short way (and on
    a journaled queue its entry), and ``count_new`` given what was read: the wake counter set
    to what was read of it plus one (``count_known``: nothing conflicts, so an ``add`` would
    resolve against the same value) and nothing else counted - the ready count is ready -
    taken + (wake - counted) (``layout.ready_count``): one counter row, not two -, the work
    index marked unless its entry says marked, a new priority's marker."""
    found = read_plain(tr, keys, len(payload)) if len(payload) <= CHUNK_SIZE else None
    if found is None:
        return _attempt(keys, [plain_item(payload, priority, rand)], None, tr, at)[0]
    check_room(tr.db)
    values, settings, read = found
    _, ready, wake, work, counted = values  # (the metadata version: read_plain compared it)
    if priority in settings.priorities and work == b"":
        # count_new's common case, without its call: the priority's marker and the work
        # index's entry there already, the wake counter a plain 8-byte one (absent:
        # count_new's), set to what was read plus one (count_known's arithmetic: an add would
        # leave the same); the ready counter left as it is where the counted counter is
        # there (every other writer of wake keeps it in step: moves.count_made_ready). A
        # queue without one (a store made before it) gets it here, once: the ready counter
        # counts this message, counted = wake from here on. Another length, or past 64 bits
        # (count_new wraps them as an add does), raises struct.error: count_new's then.
        try:
            index = _I64_UNPACK(wake)[0] + 1  # type: ignore[arg-type]  # (None: TypeError)
            made = _I64_PACK(index)
            first = None if counted is not None else _I64_PACK(_I64_UNPACK(ready)[0] + 1)  # type: ignore[arg-type]
        except (struct.error, TypeError):  # (TypeError: a counter absent)
            pass
        else:
            key, msg_id = keys.home(priority, index, rand)
            _write_plain(tr, keys, key, msg_id, payload, priority, settings.config.journal)  # type: ignore[union-attr]
            count_plain_enqueue(tr, read[2], made, read[1], read[4], first)  # (counted in wake alone)
            return msg_id
    # read_meta's made_ready, + 1
    index = 1 if wake is None else _I64_UNPACK(wake)[0] + 1 if len(wake) == 8 else unpack_count(wake) + 1
    key, msg_id = keys.home(priority, index, rand)
    _write_plain(tr, keys, key, msg_id, payload, priority, settings.config.journal)  # type: ignore[union-attr]
    fresh = _NO_PRIORITIES if priority in settings.priorities else {priority}
    count_new(tr, keys, 1, 0, fresh, work, conflicts=False, seen=values, counted=counted)
    return msg_id


def _write_plain(
    tr: Transaction, keys: QueueKeys, key: bytes, msg_id: str, payload: bytes, priority: int, journal: bool
) -> None:
    """_plain_step's record (``_write_new``'s short way), and on a journaled queue its entry."""
    t_us = now_us()  # the wall clock: enqueued_at, for people only
    if journal:
        write_plain_journaled(tr, keys, key, msg_id, t_us, _BYTES_VALUE, payload, priority, t_us)
    else:
        write_plain(tr, key, msg_id, t_us, _BYTES_VALUE, payload)


def enqueue_in(
    keys: QueueKeys, tr: Transaction, items: list[Item], unknown: bool, receipt: list[bytes] | None
) -> list[str]:
    """One attempt of :func:`enqueue_items` in ``tr``: the queue's checks (right, state, payload
    size, room), dedup matches, then the writes. ``receipt``: this call's receipt key, made in
    the first attempt; after a commit_unknown_result (``unknown``) it finds the ids written."""
    if not unknown:
        return _attempt(keys, items, receipt, tr, _FIRST)
    at = Attempt()
    at.unknown = True
    return _attempt(keys, items, receipt, tr, at)


_FIRST = Attempt()  # a first attempt's (read only)


def _attempt(
    keys: QueueKeys, items: list[Item], receipt: list[bytes] | None, tr: Transaction, at: Attempt
) -> list[str]:
    """:func:`enqueue_in` as the step of :func:`enqueue_items`' retry loop (no frame between)."""
    # A single message (most calls) without the generators' frames.
    one = items[0] if len(items) == 1 else None
    admitted = one.admitted if one is not None else all(map(_ADMITTED, items))  # an autonomous write
    if not admitted:
        # Below the embedded engine's free-space reserve a producer is refused before it
        # writes, so that consumers can still drain the disk (engines/sqlite/diskroom.py). An
        # admitted autonomous write was checked when its caller enqueued it.
        check_room(tr.db)
    if receipt is not None and not receipt:
        receipt.append(new_receipt(tr, keys, items[0].rand))
    if receipt and at.unknown:
        landed = read_receipt(tr, keys, receipt[0])
        if landed is not None:  # the attempt that ended in commit_unknown_result committed
            return landed.decode().split(",")
    meta = read_meta(tr, keys, enqueue=True)
    if meta.owner is not None:  # privileges.checked, inline: an open queue admits every principal
        check(tr, keys, "enqueue", meta)
    cfg = meta.config
    if cfg is None:
        check_create(tr, keys)  # an owned queue's error queue is its owner's to make
        cfg = QueueConfig()
        write_config(tr, keys, cfg)
    if not meta.state.enqueue and not admitted:
        raise QueueStoppedError(f"enqueue is disabled on queue {keys.name!r}")
    if cfg.journal and len(items) > 1:
        check_batch_size(keys, items, journaled=True)
    limit = min(cfg.max_payload, MAX_PAYLOAD_BYTES)  # what one transaction can move (budget.py)
    longest = len(one.payload) if one is not None else max(map(len, map(_PAYLOAD, items)))
    if longest > limit:
        raise PayloadTooLargeError(
            f"payload of {longest} bytes exceeds the max_payload of queue {keys.name!r} ({limit} bytes)"
        )
    t_us = now_us()  # the wall clock: enqueued_at, for people only
    if one is not None and one.dedup_key is None:
        # One message without a dedup key (most calls): the steps below for it alone, and
        # database time read only where it decides something (a due time, an expiry); a
        # ready message's key is ordered by the index, not by time.
        now = db_now(tr) if one.delay > 0 or one.ttl is not None or cfg.ttl is not None else 0
        if cfg.max_size is not None and not admitted:
            _check_fits(keys, meta, cfg, 1)
        msg_id = _write_new(keys, tr, cfg, one, meta.made_ready + 1, t_us, now)
        if receipt:
            tr.set(receipt[0], msg_id.encode())  # ids are made here: a retry reads them back
            maybe_clear_old_receipts(tr, keys)
        is_ready = one.delay <= 0
        fresh_p = _NO_PRIORITIES if one.priority in meta.priorities else {one.priority}
        count_new(
            tr,
            keys,
            int(is_ready),
            int(not is_ready),
            fresh_p,
            meta.work,
            conflicts=meta.cluster,
            seen=meta.raw,
        )
        return [msg_id]
    now = db_now(tr)  # database time: due times, expiry, the dedup window
    every = items
    known: dict[str, str] = {}  # dedup key -> the id its first message has
    deduped = (one.dedup_key is not None) if one is not None else any(map(_DEDUP_KEY, items))  # never ""
    if deduped:
        known = _seen(keys, tr, cfg, items, now)
        fresh: dict[str, None] = {}
        items = []
        for it in every:
            if it.dedup_key is None or (it.dedup_key not in known and it.dedup_key not in fresh):
                items.append(it)
                if it.dedup_key is not None:
                    fresh[it.dedup_key] = None
        if not items:
            return [known[it.dedup_key] for it in every if it.dedup_key is not None]
    if cfg.max_size is not None and not admitted:
        _check_fits(keys, meta, cfg, len(items))
    base = meta.made_ready + 1
    ids = [_write_new(keys, tr, cfg, it, base + i, t_us, now) for i, it in enumerate(items)]
    priorities = set(map(_PRIORITY, items))
    ready = len(items) - sum(map(_POSITIVE, map(_DELAY, items)))  # those with no delay (delay <= 0)
    if deduped:
        for it, msg_id in zip(items, ids, strict=True):
            if it.dedup_key is not None:
                tr.set(keys.dedup_key(it.dedup_key), f"{msg_id}|{now}".encode())
                tr.set(keys.dedup_time_key(now, it.dedup_key), b"")
                known[it.dedup_key] = msg_id
    if len(every) > len(items):  # the ids of the whole batch, in order
        written, kept = iter(ids), {id(it) for it in items}
        ids = [next(written) if id(it) in kept else known[str(it.dedup_key)] for it in every]
    if receipt:
        tr.set(receipt[0], ",".join(ids).encode())  # ids are made here: a retry reads them back
        maybe_clear_old_receipts(tr, keys)
    fresh_ps = priorities - meta.priorities
    count_new(tr, keys, ready, len(items) - ready, fresh_ps, meta.work, conflicts=meta.cluster, seen=meta.raw)
    return ids


_NO_PRIORITIES: frozenset[int] = frozenset()
# The fields of a batch's items, read by C code (map) instead of a generator's frame per item.
_ADMITTED = attrgetter("admitted")
_PAYLOAD = attrgetter("payload")
_DEDUP_KEY = attrgetter("dedup_key")
_PRIORITY = attrgetter("priority")
_DELAY = attrgetter("delay")
_POSITIVE = (0.0).__lt__  # 0.0 < delay: a delayed item (delays are checked numbers, never NaN)


def _check_fits(keys: QueueKeys, meta: Meta, cfg: QueueConfig, n: int) -> None:
    """QueueFullError unless ``n`` more messages fit the queue's max_size: a batch is atomic,
    all of it fits or none of it is written."""
    assert cfg.max_size is not None
    held = meta.count("ready") + meta.count("inflight") + meta.count("delayed")
    if n > cfg.max_size:
        raise QueueFullError(  # no wait can help: refused at once, whatever the policy
            f"a batch of {n} messages can never fit in queue {keys.name!r} (max_size "
            f"{cfg.max_size}); nothing was enqueued: split it"
        )
    if held + n > cfg.max_size:
        room = f"is full ({held}" if held >= cfg.max_size else f"has room for {cfg.max_size - held} ({held}"
        batch = f": a batch of {n} does not fit" if n > 1 else ""
        raise QueueFullError(
            f"queue {keys.name!r} {room} of max_size {cfg.max_size} held){batch}; nothing was enqueued",
            block=cfg.overflow == "block",
        )


def _seen(keys: QueueKeys, tr: Transaction, cfg: QueueConfig, items: list[Item], now: int) -> dict[str, str]:
    """The dedup keys of ``items`` the queue has seen within its window, with the ids of
    their first messages: one read (one key) or one batched read."""
    wanted = list(dict.fromkeys(it.dedup_key for it in items if it.dedup_key is not None))
    if len(wanted) == 1:
        found = [tr.get(keys.dedup_key(wanted[0]))]
    else:
        found = tr.get_many([keys.dedup_key(k) for k in wanted])
    out = {}
    for key, seen in zip(wanted, found, strict=True):
        first_id = first_of(seen, cfg, now)
        if first_id is not None:
            out[key] = first_id
    return out


def first_of(seen: bytes | None, cfg: QueueConfig, now: int) -> str | None:
    """The first message's id a dedup entry (``"<id>|<version>"``, written by
    :func:`enqueue_in`) names while ``now`` is within the queue's dedup window of it, else
    None. Database time both."""
    if seen is None:
        return None
    first_id, at = seen.decode().split("|")
    return first_id if now - int(at) < versions(cfg.dedup_window) else None


def _write_new(
    keys: QueueKeys, tr: Transaction, cfg: QueueConfig, it: Item, index: int, t_us: int, now: int
) -> str:
    """Write one new message, ready or delayed; returns its id.

    ``t_us``: the wall clock (enqueued_at); ``now``: database time (due, expiry).

    A ready message's id names its home key (no id entry); a delayed one, or one whose
    id had to be known before its place (``fixed_id``), keeps the id made for it.
    """
    if (
        it.delay <= 0
        and not it.fixed_id
        and it.ttl is None
        and cfg.ttl is None
        and not it.headers
        and len(it.payload) <= CHUNK_SIZE
        and (not cfg.journal or it.origin is None)
    ):
        # The common message (ready, its id its home key's, no TTL, headers nor chunks; not
        # forwarded into a journaled queue): write_new's one write, its record encoded
        # directly (record.encode_plain), and on a journaled queue its entry.
        key, msg_id = keys.home(it.priority, index, it.rand)
        at = t_us if it.enqueued_us is None else int(it.enqueued_us)
        ctype = it.content_type._value_
        if cfg.journal:
            write_plain_journaled(tr, keys, key, msg_id, at, ctype, it.payload, it.priority, t_us)
        else:
            write_plain(tr, key, msg_id, at, ctype, it.payload)
        return msg_id
    home = it.delay <= 0 and not it.fixed_id
    ready_key = keys.ready_key(it.priority, index, it.rand) if it.delay <= 0 else b""
    msg_id = keys.id_of_home(ready_key) if home else it.id
    ttl = it.ttl if it.ttl is not None else cfg.ttl
    expires = None if ttl is None else now + versions(ttl)
    payload, chunks = it.payload, 0
    if len(payload) > CHUNK_SIZE:
        chunks = math.ceil(len(payload) / CHUNK_SIZE)
        payload = b""
    at_us = t_us if it.enqueued_us is None else it.enqueued_us  # a forwarded message keeps its own
    rec = Record(msg_id, at_us, it.content_type._value_, it.headers, 0, expires, chunks, {}, payload)
    if it.delay > 0:
        key = keys.delayed_key(now + versions(it.delay), msg_id)
        rec = rec.with_(extra={"priority": it.priority})
    else:
        key = ready_key
    details: dict[str, Any] | None = None
    if cfg.journal and (it.delay > 0 or it.priority):
        details = {"delay": it.delay} if it.delay > 0 else {}
        if it.priority:
            details["priority"] = it.priority
    write_new(
        tr,
        keys,
        key,
        rec,
        home=home,
        payload=it.payload if chunks else None,
        journaled=cfg.journal,
        details=details,
        origin=it.origin,
    )
    return msg_id


def deduplicated(keys: QueueKeys, tr: Transaction | Database, dedup_key: str) -> str | None:
    """The id an enqueue with ``dedup_key`` would return now without writing, or None.

    That is the first message's id while the key is within the queue's dedup window
    (database time). Needs the ``enqueue`` right: it answers what such an enqueue would.
    Read-only; composes inside a caller's transaction, where it and a
    following ``enqueue(tr, ..., dedup_key=...)`` see the same state.
    """

    def body(t: Transaction, _: bool) -> str | None:
        # What an enqueue with that key would answer: the enqueue right (docs/security.md).
        (seen,) = check(t, keys, "enqueue", also=[keys.dedup_key(dedup_key)])
        if seen is None:
            return None  # no settings to read
        return first_of(seen, read_meta(t, keys).config or QueueConfig(), db_now(t))

    return run_once(tr, body)
