"""What each side of a leased forward keeps between its transactions (``forwarding.py``).

A message on its way from a source queue to a destination queue of another database is, in
turn: leased on the source; **pending** on the destination (a hidden copy, named by the
source's lease receipt); removed from the source with a **tombstone** naming that receipt
(one source transaction: the lease must still be ours); **published** on the destination
(one destination transaction: the pending copy becomes a message, only while the source's
tombstone is known). Keys, under each queue's subspace (built in ``store/layout.py``'s transit
section; the pending copies are ``pending.py``'s):

* destination ``("fp", source token, None, lease, part)`` -> the pending copies of one leased
  batch (``lease``: :func:`batch_of` their receipts), in parts each under the value limit
  (``pending.encode_part``: each copy's id, receipt, fields and payload; a payload over
  ``CHUNK_SIZE`` in chunks ``("fp", source token, id, receipt, n)``, as before), written where
  a run installs a batch in the transaction that publishes the one before it; or
  ``("fp", source token, id, receipt)`` -> one message's pending copy (a Record, its chunks
  under it), as a batch installed by a transaction of its own writes them (and as an earlier
  version wrote them all). Either is not a message: not counted, never delivered, left alone
  by purges; every reader reads both (``pending.read_pending``, ``pending.pendings``).
* source ``("ft", destination token, lease)`` -> ``[version, [[id, receipt], ...]]``: these
  messages of one leased batch (``lease``: their receipts' common part, :func:`batch_of`)
  left the source under those receipts for that destination, their pending copies to be
  published: one key a batch, rewritten as its messages are published, cleared after the
  last. (An earlier version wrote one a message, ``("ft", destination token, id)`` ->
  ``"<receipt>|<version>"``: still read, so that a store it left mid-batch is finished.)
* each queue ``("fk",)`` -> its forwarding token, made on first use (random): which store's
  queue a pending copy or a tombstone belongs to (two stores may hold queues of one name).
* source ``("fn", nonce)``: a forwarder's probe, read on the destination: the same store.
* source ``("fh", destination token, name, version, first receipt)`` -> ``[[id, receipt], ...]``:
  a batch a forwarder given ``name`` has in hand, written in the transaction that leases it,
  cleared once it is published: what a successor of that name takes over (:func:`take_over`).

Every function composes inside the caller's transaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import NamedTuple

from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.errors import EngineError, LeaseError, QueueError, QueueStoppedError
from fdbqueue.ops.delivery import expire_lease, lease_until, message_elsewhere, nack_in
from fdbqueue.ops.moves.core import remove_message
from fdbqueue.ops.moves.leases import renew_lease
from fdbqueue.ops.moves.places import dead_letter
from fdbqueue.ops.privileges import check
from fdbqueue.ops.txn import run_once
from fdbqueue.store.budget import MAX_PAYLOAD_BYTES
from fdbqueue.store.clock import db_now, versions
from fdbqueue.store.config import QueueConfig, read_config
from fdbqueue.store.entropy import new_rand
from fdbqueue.store.layout import (
    QueueKeys,
    forward_probe_key,
    forward_token_key,
    hand_key,
    hands_range,
    tomb_key,
    tomb_name,
    tombs_range,
)
from fdbqueue.store.meta import Meta, read_meta
from fdbqueue.store.record import Record, decode_record, fit_reason
from fdbqueue.types import Message

# What the source says of a pending copy (:func:`fates`).
REMOVED, LIVE, DEAD = "removed", "live", "dead"
Entry = tuple[str, str]  # (message id, lease receipt)


def token(t: Transaction, keys: QueueKeys) -> str:
    """The queue's forwarding token, made (and written) the first time it is asked for."""
    key = forward_token_key(keys)
    raw = t.get(key)
    if raw is None:
        raw = new_rand().hex().encode()
        t.set(key, raw)
    return raw.decode()


def prepare(
    src_db: Database, skeys: QueueKeys, dst_db: Database, dkeys: QueueKeys
) -> tuple[tuple[str, str] | None, int | None]:
    """Before a forward: the two queues' tokens, None when they are one queue of one store (a
    probe written on the source is found on the destination, whatever handles or URLs name
    them: a copy of the store made before does not hold it); and the destination's room.
    Three transactions: the probe written, looked for, cleared (best effort)."""
    nonce = new_rand().hex()

    def probe(t: Transaction, _: bool) -> str:
        check(t, skeys, "admin")  # forwarding out is the source's admin's: nothing written before
        t.set(forward_probe_key(skeys, nonce), b"")
        return token(t, skeys)

    def look(t: Transaction, _: bool) -> tuple[str, int | None] | None:
        if t.get(forward_probe_key(dkeys, nonce)) is not None:
            return None
        meta = read_meta(t, dkeys)
        check(t, dkeys, "enqueue", meta)  # before the destination's token is written
        return token(t, dkeys), room_of(meta)

    def unprobe(t: Transaction, _: bool) -> None:
        t.clear(forward_probe_key(skeys, nonce))

    source = run_once(src_db, probe)
    try:
        seen = run_once(dst_db, look)
    finally:
        with contextlib.suppress(EngineError, QueueError):
            run_once(src_db, unprobe)
    return (None, None) if seen is None else ((source, seen[0]), seen[1])


def batch_of(receipt: str) -> str:
    """The lease a receipt belongs to: ``lease_many`` gives the messages of one call the
    receipts ``<lease>.<i>`` (a takeover too), so one tombstone names a removed batch."""
    return receipt.rpartition(".")[0] or receipt


def leases_of(receipts: Iterable[str]) -> list[str]:
    """:func:`batch_of` of each receipt, each lease once, in order of first appearance: loops
    in C (a forward names a batch's hundred receipts in several of its steps)."""
    rs = receipts if isinstance(receipts, list) else list(receipts)
    heads = dict.fromkeys(map(_first, map(str.rpartition, rs, repeat("."))))
    if "" in heads:  # a receipt without a dot is a lease of its own
        return list(dict.fromkeys(batch_of(r) for r in rs))
    return list(heads)


def entries_of(batch: list[Message]) -> list[Entry]:
    """(id, receipt) of each leased message of ``batch``, in order (loops in C)."""
    return list(zip(map(_ID, batch), map(str, map(_RECEIPT, batch)), strict=True))


_first, _second = itemgetter(0), itemgetter(1)
_ID, _RECEIPT = attrgetter("id"), attrgetter("receipt")
_PAYLOAD = attrgetter("payload")


class Tomb(NamedTuple):
    """A batch's tombstone: the messages removed under it (id -> receipt), and when."""

    removed: dict[str, str]
    at: int


def encode_tomb(removed: Mapping[str, str], at: int) -> bytes:
    return json.dumps([at, list(removed.items())], separators=(",", ":")).encode()


def decode_tomb(raw: bytes | None, name: str) -> Tomb | None:
    """A tombstone's value; one an earlier version wrote for one message (``"<receipt>|<at>"``
    under its id, ``name``) reads as a batch of it."""
    if raw is None:
        return None
    if raw[:1] == b"[":
        at, pairs = json.loads(raw)
        return Tomb({str(mid): str(receipt) for mid, receipt in pairs}, int(at))
    receipt, at = raw.decode().split("|")
    return Tomb({name: receipt}, int(at))


def read_tombs(t: Transaction, src: QueueKeys, dest: str, entries: list[Entry]) -> set[Entry]:
    """Of ``entries`` (id, receipt), those a tombstone says left the source under that
    receipt: one read of each batch's tombstone."""
    found: set[Entry] = set()
    for _, tomb in _batch_tombs(t, src, dest, entries):
        found.update(tomb.removed.items())
    return found


def _batch_tombs(
    t: Transaction, src: QueueKeys, dest: str, entries: list[Entry]
) -> Iterator[tuple[str, Tomb]]:
    """The tombstones of the batches ``entries`` (id, receipt) belong to, each batch's read
    once (in one ``get_many``), with its batch's name: those there are."""
    names = leases_of(map(_second, entries))
    for name, raw in zip(names, t.get_many([tomb_key(src, dest, n) for n in names]), strict=True):
        tomb = decode_tomb(raw, name)
        if tomb is not None:
            yield name, tomb


def read_tombs_legacy(t: Transaction, src: QueueKeys, dest: str, entries: list[Entry]) -> set[Entry]:
    """:func:`read_tombs`, and the one-message tombstones an earlier version wrote (under each
    id): what ``recover`` and a takeover must see whichever version removed the message."""
    found = read_tombs(t, src, dest, entries)
    rest = [e for e in entries if e not in found]
    raws = t.get_many([tomb_key(src, dest, mid) for mid, _ in rest])
    for (mid, receipt), raw in zip(rest, raws, strict=True):
        tomb = decode_tomb(raw, mid)
        if tomb is not None and tomb.removed.get(mid) == receipt:
            found.add((mid, receipt))
    return found


def write_tombs(
    t: Transaction, src: QueueKeys, dest: str, removed: list[Entry], earlier: set[Entry], now: int
) -> None:
    """The tombstones of ``removed`` (just removed under those receipts), one a batch, beside
    what ``earlier`` (read by :func:`read_tombs` in ``t``) says of the same batches."""
    names = leases_of(map(_second, removed))
    if len(names) == 1 and not earlier:  # the common case: one batch, removed in one go
        t.set(tomb_key(src, dest, names[0]), encode_tomb(dict(removed), now))
        return
    by: dict[str, dict[str, str]] = {}
    for mid, receipt in [*earlier, *removed]:
        by.setdefault(receipt.rpartition(".")[0] or receipt, {})[mid] = receipt  # batch_of, inline
    for name in names:
        t.set(tomb_key(src, dest, name), encode_tomb(by[name], now))


def clear_tombs(t: Transaction, src: QueueKeys, dest: str, published: list[Entry]) -> None:
    """The tombstones of ``published`` (published on the destination) no longer needed: each
    batch's tombstone rewritten without them, cleared once none of it is left; a tombstone
    an earlier version wrote for one message (looked for only when its batch's does not
    name it), cleared. Read first: a batch another forwarder's ``recover`` published
    meanwhile is cleared once."""
    done = set(published)
    named: set[Entry] = set()
    for name, tomb in _batch_tombs(t, src, dest, published):
        named.update(tomb.removed.items())
        _rewrite(t, tomb_key(src, dest, name), tomb, done)
    rest = [] if named.issuperset(published) else [mid for mid, r in published if (mid, r) not in named]
    for mid, raw in zip(rest, t.get_many([tomb_key(src, dest, mid) for mid in rest]), strict=True):
        one = decode_tomb(raw, mid)
        if one is not None and raw is not None and raw[:1] != b"[":
            _rewrite(t, tomb_key(src, dest, mid), one, done)


def _rewrite(t: Transaction, key: bytes, tomb: Tomb, done: set[Entry]) -> None:
    if done.issuperset(tomb.removed.items()):  # all of it published (compared in C)
        t.clear(key)
        return
    left = {mid: r for mid, r in tomb.removed.items() if (mid, r) not in done}
    if len(left) == len(tomb.removed):
        return
    if left:
        t.set(key, encode_tomb(left, tomb.at))
    else:
        t.clear(key)


# -- the destination --------------------------------------------------------------------------


def room_of(meta: Meta) -> int | None:
    """How many more messages the queue's ``max_size`` admits (None: no bound)."""
    cfg = meta.config
    if cfg is None or cfg.max_size is None:
        return None
    return max(0, cfg.max_size - meta.count("ready") - meta.count("inflight") - meta.count("delayed"))


def admissible(keys: QueueKeys, meta: Meta, batch: list[Message]) -> dict[str, str]:
    """What an enqueue of ``batch`` would refuse whatever the wait: the right (checked by the
    caller), enqueue disabled (raised). Checked at install, while each message is still on
    the source. Returns :func:`too_large`: those messages go to the source's error queue."""
    if not meta.state.enqueue:
        raise QueueStoppedError(f"enqueue is disabled on queue {keys.name!r}")
    return too_large(keys, meta, batch)


def too_large(keys: QueueKeys, meta: Meta, batch: list[Message]) -> dict[str, str]:
    """The messages of ``batch`` whose payload the destination queue's ``max_payload`` refuses,
    by id, with the reason their dead letter on the source gives. Waiting changes nothing for
    them, so they are not left leased (each forward would pass them by, for good)."""
    cfg = meta.config or QueueConfig()
    limit = min(cfg.max_payload, MAX_PAYLOAD_BYTES)
    if not batch or max(map(len, map(_PAYLOAD, batch))) <= limit:  # the common case, in C
        return {}
    return {
        m.id: f"too large for destination {keys.name!r} (max_payload {limit}): {len(m.payload)} bytes"
        for m in batch
        if len(m.payload) > limit
    }


def dead_letter_leased(
    src_db: Database, src: QueueKeys, batch: list[Message], big: Mapping[str, str]
) -> None:
    """One source transaction: each leased message of ``batch`` named in ``big`` to the source
    queue's error queue with its reason (journaled ``dead``, counted); one whose lease is no
    longer ours (an earlier attempt's, or lost to a stall) is left as it is."""

    def body(t: Transaction, _: bool) -> None:
        cfg = read_config(t, src) or QueueConfig()
        now = db_now(t)
        for m in batch:
            if m.id in big:
                with contextlib.suppress(LeaseError):
                    nack_in(src, t, cfg, m, None, fit_reason(big[m.id]), now, discard=True)

    run_once(src_db, body)


def dead_letter_ready(
    t: Transaction, src: QueueKeys, cfg: QueueConfig, key: bytes, rec: Record, reason: str
) -> None:
    """The exclusive forwarder's: the ready message at ``key`` to the source queue's error
    queue with ``reason`` (journaled ``dead``, counted), in the caller's transaction."""
    remove_message(t, src, key, rec, chunks=False, count="ready")
    dead_letter(src, t, cfg, rec, fit_reason(reason))


def enqueued_us(m: Message) -> int:
    """The message's enqueue time as stored (``Message.enqueued_at`` is it divided by 1e6:
    rounding gives it back exactly), kept by a forward as by a move."""
    return round(m.enqueued_at * 1e6)


# -- the source ---------------------------------------------------------------------------------


def tombs(t: Transaction, src: QueueKeys, dest: str, limit: int, before: int) -> list[Entry]:
    """The messages of up to ``limit`` tombstones for ``dest`` written before version ``before``."""
    out: list[Entry] = []
    for kv in t.snapshot.get_range(*tombs_range(src, dest), limit):
        tomb = decode_tomb(kv.value, tomb_name(src, kv.key))
        if tomb is not None and tomb.at < before:
            out += tomb.removed.items()
    return out


def fates(t: Transaction, src: QueueKeys, dest: str, entries: list[Entry], now: int) -> list[str]:
    """What became of the lease each pending copy names, decided for good in this transaction:
    REMOVED (its tombstone is there: publish it), LIVE (still leased under it: its forwarder
    is at work) or DEAD (the lease ended without a removal, and none can follow: withdraw it).

    A lease past its deadline that nobody released yet is released here (as a sweep would):
    that write makes a removal under it still in flight, read before, conflict."""
    removed = read_tombs_legacy(t, src, dest, entries)
    fkeys = [src.inflight_key(mid) for mid, _ in entries]
    found = t.get_many(fkeys)
    out = []
    meta = None
    for i, (mid, receipt) in enumerate(entries):
        if (mid, receipt) in removed:
            out.append(REMOVED)
            continue
        raw = found[i]
        rec = None if raw is None else decode_record(raw, src, fkeys[i], mid)
        if rec is None or rec.extra.get("receipt") != receipt:
            out.append(DEAD)  # acked, released or leased again under another receipt: for good
            continue
        deadline = int(rec.extra["deadline"])
        if deadline > now:
            out.append(LIVE)
            continue
        meta = meta or read_meta(t, src)
        if meta.config is not None:
            expire_lease(src, t, meta.config, src.lease_key(deadline, mid), now)
        out.append(DEAD)
    return out


# -- a named forwarder's batches (the source) -----------------------------------------------------


def record_hand(
    t: Transaction, src: QueueKeys, dest: str, name: str, batch: list[Message], now: int
) -> Record_:
    """Record the batch a forwarder named ``name`` has just leased in ``t`` (the ids and
    receipts a successor of that name takes over); returns the record (key, value)."""
    key = hand_key(src, dest, name, now, str(batch[0].receipt))
    value = json.dumps([[m.id, m.receipt] for m in batch]).encode()
    t.set(key, value)
    return key, value


def clear_record(t: Transaction, record: Record_) -> None:
    """Clear a batch's record once published, unless a namesake took it over meanwhile
    (rewrote it: then it is the namesake's to clear; the read makes a takeover conflict)."""
    if t.get(record[0]) == record[1]:
        t.clear(record[0])


Record_ = tuple[bytes, bytes]  # a named forwarder's batch record: (key, value)


class Handover(NamedTuple):
    """One batch taken over from a forwarder of the same name (:func:`take_over`)."""

    key: bytes  # where its record is (the next takeover reads after it)
    record: Record_ | None  # its record, naming it now (cleared once published; None: nothing left)
    removed: list[Entry]  # removed from the source under the recorded lease: to publish
    dead: list[Entry]  # pending copies never to be published: to withdraw
    live: list[Message]  # still leased: leased again under new receipts, to forward


def take_over(
    t: Transaction, src: QueueKeys, dest: str, name: str, seconds: float, now: int, after: bytes | None
) -> Handover | None:
    """Take over the oldest batch a forwarder named ``name`` recorded for ``dest`` (a crashed
    predecessor's, or a live namesake's) after the record ``after``; None when there is none.

    What each message of it became is decided as :func:`fates` decides it, for good. One
    still leased under its recorded receipt is leased again, in this transaction, under a new
    receipt for ``seconds``: the old receipt can then never remove it (a removal under it
    reads the lease, and conflicts or finds it changed), so its pending copies under the old
    receipt are dead, and each receipt keeps a single owner - the reason a namesake still at
    work cannot double what is taken over. The record then names the new receipts (and the
    removed ones, until published)."""
    start, stop = hands_range(src, dest, name)
    begin = start if after is None else max(start, after + b"\x00")
    found = t.get_range(begin, stop, 1)  # read, not snapshot: a namesake's lease conflicts
    if not found:
        return None
    key, raw = found[0]
    entries: list[Entry] = [(str(mid), str(receipt)) for mid, receipt in json.loads(raw)]
    removed: list[Entry] = []
    dead: list[Entry] = []
    live: list[Message] = []
    fresh = new_rand().hex()
    deadline, until = now + versions(seconds), lease_until(seconds)
    for i, (entry, fate) in enumerate(zip(entries, fates(t, src, dest, entries, now), strict=True)):
        if fate == REMOVED:
            removed.append(entry)
            continue
        dead.append(entry)  # dead, or about to be: its lease changes hands below
        if fate == LIVE:
            ikey = src.inflight_key(entry[0])
            rec = decode_record(t.get(ikey) or b"", src, ikey, entry[0])
            receipt = f"{fresh}.{i}"
            moved = rec.with_(extra={**rec.extra, "receipt": receipt, "deadline": deadline, "until": until})
            renew_lease(t, src, rec, moved, deadline, receipt)
            m = message_elsewhere(src, t, ikey, moved.encode())
            assert m is not None  # a leased record
            live.append(dataclasses.replace(m, receipt=receipt, lease_deadline=until / 1e6))
    if not removed and not live:
        t.clear(key)
        return Handover(key, None, removed, dead, live)
    value = json.dumps([list(e) for e in removed] + [[m.id, m.receipt] for m in live]).encode()
    t.set(key, value)
    return Handover(key, (key, value), removed, dead, live)
