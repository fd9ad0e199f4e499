"""What each side of a leased forward keeps between its transactions (``forwarding.py``).

A message on its way from a source queue to a destination queue of another database is, in
turn: leased on the source; **pending** on the destination (a hidden copy, named by the
source's lease receipt); removed from the source with a **tombstone** naming that receipt
(one source transaction: the lease must still be ours); **published** on the destination
(one destination transaction: the pending copy becomes a message, only while the source's
tombstone is known). Keys, under each queue's subspace:

* destination ``("fp", source token, None, lease, part)`` -> the pending copies of one leased
  batch (``lease``: :func:`batch_of` their receipts), in parts each under the value limit
  (:func:`encode_part`: each copy's id, receipt, fields and payload; a payload over
  ``CHUNK_SIZE`` in chunks ``("fp", source token, id, receipt, n)``, as before), written where
  a run installs a batch in the transaction that publishes the one before it; or
  ``("fp", source token, id, receipt)`` -> one message's pending copy (a Record, its chunks
  under it), as a batch installed by a transaction of its own writes them (and as an earlier
  version wrote them all). Either is not a message: not counted, never delivered, left alone
  by purges; every reader reads both (:func:`read_pending`, :func:`pendings`).
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
import struct
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping
from itertools import accumulate, repeat
from operator import attrgetter, itemgetter, setitem
from typing import Any, NamedTuple

from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.engines.limits import VALUE_SIZE_LIMIT
from fdbqueue.errors import CorruptMessageError, EngineError, LeaseError, QueueError, QueueStoppedError
from fdbqueue.ops.delivery import expire_lease, lease_until, message_elsewhere, nack_in
from fdbqueue.ops.moves import CHUNK_SIZE, dead_letter, remove_message, renew_lease
from fdbqueue.ops.privileges import check
from fdbqueue.ops.remotededup import DEDUP_HEADER, header_key
from fdbqueue.ops.txn import run_once
from fdbqueue.store.budget import MAX_PAYLOAD_BYTES
from fdbqueue.store.clock import db_now, versions
from fdbqueue.store.codec import enc_str
from fdbqueue.store.config import Meta, QueueConfig, read_config, read_meta
from fdbqueue.store.entropy import new_rand
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import Record, decode_record, fit_reason, join_chunks, seal_chunk
from fdbqueue.types import ContentType, Item, Message

# What the source says of a pending copy (:func:`fates`).
REMOVED, LIVE, DEAD = "removed", "live", "dead"
Entry = tuple[str, str]  # (message id, lease receipt)


def token(t: Transaction, keys: QueueKeys) -> str:
    """The queue's forwarding token, made (and written) the first time it is asked for."""
    key = keys.q.pack(("fk",))
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
        t.set(probe_key(skeys, nonce), b"")
        return token(t, skeys)

    def look(t: Transaction, _: bool) -> tuple[str, int | None] | None:
        if t.get(probe_key(dkeys, nonce)) is not None:
            return None
        meta = read_meta(t, dkeys)
        check(t, dkeys, "enqueue", meta)  # before the destination's token is written
        return token(t, dkeys), room_of(meta)

    def unprobe(t: Transaction, _: bool) -> None:
        t.clear(probe_key(skeys, nonce))

    source = run_once(src_db, probe)
    try:
        seen = run_once(dst_db, look)
    finally:
        with contextlib.suppress(EngineError, QueueError):
            run_once(src_db, unprobe)
    return (None, None) if seen is None else ((source, seen[0]), seen[1])


def probe_key(keys: QueueKeys, nonce: str) -> bytes:
    return bytes(keys.q.pack(("fn", nonce)))


def pending_key(dst: QueueKeys, source: str, mid: str, receipt: str) -> bytes:
    # fdb.tuple.pack's bytes, from the queue's prefix and encoded elements: a forward packs
    # several of these keys a message, and the tuple layer's general packer is the slow part.
    return _fp_prefix(dst, source) + enc_str(mid) + enc_str(receipt)


def pending_keys(dst: QueueKeys, source: str, entries: list[Entry]) -> list[bytes]:
    """:func:`pending_key` of each entry (id, receipt): one prefix for them all."""
    prefix = _fp_prefix(dst, source)
    return [prefix + enc_str(mid) + enc_str(receipt) for mid, receipt in entries]


def _fp_prefix(dst: QueueKeys, source: str) -> bytes:
    """``dst.q.pack(("fp", source))``, kept by (queue prefix, source token): a forwarder
    builds keys under one prefix all its run."""
    at: bytes = dst.q.key()
    got = _FP_PREFIXES.get((at, source))
    if got is None:
        if len(_FP_PREFIXES) > 256:
            _FP_PREFIXES.clear()
        got = _FP_PREFIXES[(at, source)] = at + _FP + enc_str(source)
    return got


_FP_PREFIXES: dict[tuple[bytes, str], bytes] = {}


def pending_range(dst: QueueKeys, source: str, *rest: str) -> tuple[bytes, bytes]:
    """``dst.q.range(("fp", source, *rest))``: the keys under that tuple (not its own)."""
    prefix: bytes = dst.q.key()
    prefix += _FP + enc_str(source) + b"".join(enc_str(x) for x in rest)
    return prefix + b"\x00", prefix + b"\xff"


def tomb_key(src: QueueKeys, dest: str, name: str) -> bytes:
    """``src.q.pack(("ft", dest, name))``: a batch's tombstone (``name``: the batch's lease,
    :func:`batch_of`), or a message's as an earlier version wrote them (``name``: its id)."""
    prefix: bytes = src.q.key()
    return prefix + _FT + enc_str(dest) + enc_str(name)


_FP, _FT = enc_str("fp"), enc_str("ft")


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
_PAYLOAD, _HEADERS = attrgetter("payload"), attrgetter("headers")


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


def install(
    t: Transaction, dst: QueueKeys, source: str, batch: list[Message], now: int, layer: Mapping[str, str]
) -> None:
    """Write a pending copy of each message of ``batch`` not written yet (each is read first:
    a late landing of an earlier attempt conflicts instead of writing one again after it was
    published). A RemoteQueue's dedup key (its header) is kept aside for publication, marked
    as the layer's where the source confirmed it (``layer``: ``remotededup.layer_keys``)."""
    keys = pending_keys(dst, source, [(m.id, str(m.receipt)) for m in batch])
    for m, key, raw in zip(batch, keys, t.get_many(keys), strict=True):
        if raw is not None:
            continue
        extra: dict[str, Any] = {"p": m.priority, "at": now}
        if m.expires_at is not None:
            extra["until"] = m.expires_at  # wall clock: the TTL left is taken at publication
        dedup_key = header_key(m)
        if dedup_key is not None:
            extra["dk"] = dedup_key
            if m.id in layer:
                extra["dkl"] = True
        headers = {k: v for k, v in m.headers.items() if k != DEDUP_HEADER}
        chunks = -(-len(m.payload) // CHUNK_SIZE) if len(m.payload) > CHUNK_SIZE else 0
        inline = b"" if chunks else m.payload
        rec = Record(m.id, enqueued_us(m), m.content_type.value, headers, 0, None, chunks, extra, inline)
        t.set(key, rec.encode())
        for n in range(chunks):
            t.set(dst.q.pack(("fp", source, m.id, str(m.receipt), n)), seal_chunk(
                m.payload[n * CHUNK_SIZE : (n + 1) * CHUNK_SIZE]))  # fmt: skip


def install_parts(
    t: Transaction, dst: QueueKeys, source: str, batch: list[Message], now: int, layer: Mapping[str, str]
) -> None:
    """:func:`install`, one key a leased batch instead of one a message: the copies of the
    messages of one lease (:func:`batch_of` their receipts) in parts under
    ``("fp", source, None, lease, n)``, each under the value limit (:data:`PART_BYTES`); a
    payload over ``CHUNK_SIZE`` in chunks as :func:`install` writes them. The batch's parts
    are read first (a range read: a late landing of an earlier attempt conflicts instead of
    writing them again after they were published), and a copy they hold already is not
    written again. A batch is installed in one form by one transaction (retried as it is):
    a run's batch installed in the publication of the one before it, in parts; one installed
    by a transaction of its own, one key a message (:func:`install`)."""
    by: dict[str, list[Message]] = {}
    receipts = list(map(str, map(_RECEIPT, batch)))
    names = leases_of(receipts)
    if len(names) == 1:  # a run's batch: one lease
        by[names[0]] = batch
    else:
        for m, r in zip(batch, receipts, strict=True):
            by.setdefault(batch_of(r), []).append(m)
    for lease, msgs in by.items():
        have: set[Entry] = set()
        part = 0
        for kv in t.get_range(*part_range(dst, source, lease), 10_000):
            have.update((c.id, c.receipt) for c in decode_part(kv.value, dst, kv.key))
            part = int(dst.q.unpack(kv.key)[-1]) + 1
        if not have and _put_plain(t, dst, source, lease, part, msgs, now):
            continue
        rows: list[list[Any]] = []
        payloads: list[bytes] = []
        size = 0
        for m in msgs:
            receipt = str(m.receipt)
            if have and (m.id, receipt) in have:
                continue  # an earlier attempt's
            payload = m.payload
            inline, chunks = payload, 0
            cost = _ROW_BYTES + len(payload) + len(m.id) + len(receipt)  # a content type: 1 byte
            if len(payload) > CHUNK_SIZE:
                inline, chunks = b"", -(-len(payload) // CHUNK_SIZE)
                cost -= len(payload)
            headers: dict[str, Any] = {}
            dk, dkl = None, False
            if m.headers:
                dk = header_key(m)
                dkl = dk is not None and m.id in layer
                headers = {k: v for k, v in m.headers.items() if k != DEDUP_HEADER}
                cost += len(json.dumps(headers)) + len(json.dumps(dk))
            ct = m.content_type._value_  # not .value: the enum's property is a Python-level call
            if rows and size + cost > PART_BYTES:
                part = _put_part(t, dst, source, lease, part, rows, payloads)
                rows, payloads, size = [], [], 0
            # (round(...): enqueued_us(m), without the call)
            rows.append([m.id, receipt, round(m.enqueued_at * 1e6), ct, headers, m.priority,
                         m.expires_at, dk, dkl, chunks, len(inline), now])  # fmt: skip
            payloads.append(inline)
            size += cost
            for n in range(chunks):
                t.set(dst.q.pack(("fp", source, m.id, receipt, n)), seal_chunk(
                    payload[n * CHUNK_SIZE : (n + 1) * CHUNK_SIZE]))  # fmt: skip
        if rows:
            _put_part(t, dst, source, lease, part, rows, payloads)


def _put_plain(
    t: Transaction, dst: QueueKeys, source: str, lease: str, part: int, msgs: list[Message], now: int
) -> bool:
    """:func:`install_parts`' common case, written at once: copies none of which is there yet,
    without headers, each payload inline, all in one part by the estimate (the rows are those
    the general loop writes). False, writing nothing, when the batch is not that case."""
    payloads = list(map(_PAYLOAD, msgs))
    sizes = list(map(len, payloads))
    if any(map(_HEADERS, msgs)) or max(sizes) > CHUNK_SIZE:
        return False
    ids, receipts = list(map(_ID, msgs)), list(map(str, map(_RECEIPT, msgs)))
    cost = _ROW_BYTES * len(msgs) + sum(sizes) + sum(map(len, ids)) + sum(map(len, receipts))
    if cost > PART_BYTES:
        return False
    # (round(...): enqueued_us(m), without the call; ._value_: the enum's value, without its
    # property's Python-level call)
    rows = [[mid, r, round(m.enqueued_at * 1e6), m.content_type._value_, {}, m.priority, m.expires_at,
             None, False, 0, size, now]
            for mid, r, m, size in zip(ids, receipts, msgs, sizes, strict=True)]  # fmt: skip
    _put_part(t, dst, source, lease, part, rows, payloads)
    return True


def _put_part(
    t: Transaction,
    dst: QueueKeys,
    source: str,
    lease: str,
    part: int,
    rows: list[list[Any]],
    payloads: list[bytes],
) -> int:
    """Write ``rows`` as part ``part`` of the batch ``lease``'s copies, in two halves (and so
    on) when their encoding passes the value limit after all (the estimate counted a copy's
    fields short: strings the JSON escapes); returns the next part's number."""
    raw = _encode_rows(rows, payloads)
    if len(raw) <= VALUE_SIZE_LIMIT or len(rows) == 1:
        t.set(part_key(dst, source, lease, part), raw)
        return part + 1
    half = len(rows) // 2
    part = _put_part(t, dst, source, lease, part, rows[:half], payloads[:half])
    return _put_part(t, dst, source, lease, part, rows[half:], payloads[half:])


class Copy(NamedTuple):
    """A pending copy as read (from a batch's part or a key of its own): what its
    publication writes. ``payload``: inline, or joined from its ``chunks`` once read."""

    id: str
    receipt: str
    enqueued_us: int
    content_type: str
    headers: dict[str, Any]
    priority: int
    until: float | None  # wall clock: when its TTL ends (the TTL left is taken at publication)
    dk: str | None  # a RemoteQueue's dedup key, kept aside from its headers
    dkl: bool  # that key confirmed as the layer's by the source
    chunks: int
    payload: bytes
    at: int  # the version it was installed at


# A batch's part: under FoundationDB's value limit (engines/limits.py, VALUE_SIZE_LIMIT
# 100,000) with room to spare; a copy's fields beside its payload are counted as
# _ROW_BYTES more than its strings (ints, nulls and the JSON's punctuation).
PART_BYTES = 90_000
_ROW_BYTES = 128
PART_FORMAT = 1
_PART_HEAD = struct.Struct("<BI")
_CRC = struct.Struct("<I")


def _encode_rows(rows: list[list[Any]], payloads: list[bytes]) -> bytes:
    meta = json.dumps(rows, separators=(",", ":")).encode()
    body = _PART_HEAD.pack(PART_FORMAT, len(meta)) + meta + b"".join(payloads)
    return body + _CRC.pack(zlib.crc32(body))


def encode_part(copies: list[Copy]) -> bytes:
    """A part's value: its copies' fields (JSON), their inline payloads, a CRC-32 of it all."""
    rows, payloads = [], []
    for c in copies:
        inline = b"" if c.chunks else c.payload
        rows.append([*c[:10], len(inline), c.at])
        payloads.append(inline)
    return _encode_rows(rows, payloads)


def decode_part(raw: bytes, keys: QueueKeys, key: bytes) -> list[Copy]:
    """The copies a part at ``key`` holds (a chunked one's payload not read: b"");
    :class:`CorruptMessageError` naming where it is when its checksum does not match."""
    end = len(raw) - _CRC.size
    if end < _PART_HEAD.size or _CRC.unpack_from(raw, end)[0] != zlib.crc32(memoryview(raw)[:end]):
        raise CorruptMessageError("pending copies: checksum mismatch", queue=keys.name, key=key)
    fmt, n = _PART_HEAD.unpack_from(raw)
    if fmt != PART_FORMAT:
        raise QueueError(f"pending copies of unknown format {fmt}: written by a newer fdbqueue?")
    at = _PART_HEAD.size + n
    rows = json.loads(raw[_PART_HEAD.size : at])
    odd = set(map(len, rows)) - {_COPY_FIELDS}
    if odd:
        raise QueueError(f"a pending copy of {min(odd)} fields: written by a newer fdbqueue?")
    # Each row's payload (its size in field 10) cut from after the rows, in order; then each
    # row made a Copy (Copy._make, less its Python frame: the length is known). Loops in C.
    ends = list(accumulate(map(_SIZE, rows), initial=at))
    cuts = map(raw.__getitem__, map(slice, ends, ends[1:]))
    for _ in map(setitem, rows, repeat(10), cuts):
        pass
    return list(map(_new_copy, repeat(Copy), rows))


_new_copy = _new_item = tuple.__new__
_SIZE, _CHUNKS = itemgetter(10), itemgetter(9)
_COPY_FIELDS = len(Copy._fields)


def part_key(dst: QueueKeys, source: str, lease: str, part: int) -> bytes:
    return bytes(dst.q.pack(("fp", source, None, lease, part)))


def part_range(dst: QueueKeys, source: str, lease: str) -> tuple[bytes, bytes]:
    """The keys of the parts of the batch ``lease``'s copies."""
    r = dst.q.range(("fp", source, None, lease))
    return r.start, r.stop


class Pending:
    """The pending copies of some entries as one transaction read them (:func:`read_pending`):
    ``copies``, one an entry (None: not there, published or withdrawn already)."""

    __slots__ = ("_own", "_parts", "copies")

    def __init__(
        self, copies: list[Copy | None], parts: dict[bytes, list[Copy]], own: dict[Entry, tuple[bytes, bool]]
    ) -> None:
        self.copies = copies
        self._parts = parts  # each batch part read: its key -> its copies
        self._own = own  # each copy of a key of its own: (id, receipt) -> (key, chunked)

    def drop(self, t: Transaction, dst: QueueKeys, source: str, done: set[Entry]) -> None:
        """Clear the copies of ``done`` (published or withdrawn), in ``t``: a copy of its own
        by its key (and its chunks); a part rewritten without them, or cleared when none of
        it is left, and their chunks cleared."""
        if self._own:
            for entry in done:
                own = self._own.get(entry)
                if own is not None:
                    drop_pending_at(t, own[0], chunked=own[1])
        for key, copies in self._parts.items():
            if done.issuperset(zip(map(_first, copies), map(_second, copies), strict=True)):  # all of it
                for c in filter(_CHUNKS, copies):
                    t.clear_range(*pending_range(dst, source, c.id, c.receipt))
                t.clear(key)
                continue
            left = [c for c in copies if (c.id, c.receipt) not in done]
            if len(left) == len(copies):
                continue
            for c in copies:
                if c.chunks and (c.id, c.receipt) in done:
                    t.clear_range(*pending_range(dst, source, c.id, c.receipt))
            if left:
                t.set(key, encode_part(left))
            else:
                t.clear(key)


def read_pending(
    t: Transaction, dst: QueueKeys, source: str, entries: list[Entry], *, payloads: bool = True
) -> Pending:
    """The pending copies of ``entries`` (id, receipt), in a batch's parts (one range read a
    batch) or each under a key of its own (one ``get_many`` for those the parts do not hold):
    payloads joined (``payloads=False``: chunked ones left unread)."""
    found: dict[Entry, Copy] = {}
    parts: dict[bytes, list[Copy]] = {}
    for lease in leases_of(map(_second, entries)):
        for kv in t.get_range(*part_range(dst, source, lease), 10_000):
            copies = parts[kv.key] = decode_part(kv.value, dst, kv.key)
            for c in copies:
                found[(c.id, c.receipt)] = c
    own: dict[Entry, tuple[bytes, bool]] = {}
    rest = entries
    if found:
        rest = [] if all(map(found.__contains__, entries)) else [e for e in entries if e not in found]
    if rest:
        keys = pending_keys(dst, source, rest)
        for (mid, receipt), key, raw in zip(rest, keys, t.get_many(keys), strict=True):
            if raw is not None:
                rec = decode_record(raw, dst, key, mid)
                found[(mid, receipt)] = copy_of(rec, receipt)
                own[(mid, receipt)] = key, rec.chunks > 0
    out: list[Copy | None] = list(map(found.get, entries))
    if payloads and any(map(_CHUNKS, filter(None, out))):  # chunked payloads: joined
        for i, ((mid, receipt), got) in enumerate(zip(entries, out, strict=True)):
            if got is not None and got.chunks:
                at = pending_key(dst, source, mid, receipt)
                vals = [kv.value for kv in t.get_range(at + b"\x00", at + b"\xff", got.chunks + 1)]
                out[i] = got._replace(payload=join_chunks(vals, got.chunks, dst.name, mid))
    return Pending(out, parts, own)


def copy_of(rec: Record, receipt: str) -> Copy:
    """A pending copy written under a key of its own (:func:`install`), as a :class:`Copy`."""
    extra = rec.extra
    dk = extra.get("dk")
    return Copy(
        rec.id, receipt, rec.enqueued_us, rec.content_type, rec.headers, int(extra.get("p", 0)),
        extra.get("until"), None if dk is None else str(dk), bool(extra.get("dkl")), rec.chunks,
        rec.payload, int(extra.get("at", 0)),
    )  # fmt: skip


def as_item(c: Copy, origin: str) -> Item:
    """A pending copy as the message to write: its id, headers, priority and the TTL left."""
    ttl = None if c.until is None else max(0.001, float(c.until) - time.time())
    ct = _CONTENT_TYPES.get(c.content_type) or ContentType(c.content_type)
    # Item(id, rand, payload, content_type, priority, headers, delay, ttl, dedup_key,
    # fixed_id=True, admitted=False, origin=, enqueued_us=), every field given: without the
    # NamedTuple's Python-level __new__ (a publication makes one a message)
    return _new_item(Item, (c.id, new_rand(), c.payload, ct, c.priority, c.headers, 0.0, ttl, None,
                            True, False, origin, c.enqueued_us))  # fmt: skip


# ContentType by its value, without the enum's call (a Python-level lookup each time).
_CONTENT_TYPES = {c.value: c for c in ContentType}


def enqueued_us(m: Message) -> int:
    """The message's enqueue time as stored (``Message.enqueued_at`` is it divided by 1e6:
    rounding gives it back exactly), kept by a forward as by a move."""
    return round(m.enqueued_at * 1e6)


def drop_pending_at(t: Transaction, key: bytes, *, chunked: bool = True) -> None:
    """Clear the copy at ``key`` (a :func:`pending_key`); ``chunked=False``: the copy is known
    to have no chunks (its payload was inline), so its one key is cleared, without a range (a
    range clear is a statement of its own)."""
    t.clear(key)  # a tuple's range holds the keys under it, not its own key
    if chunked:
        t.clear_range(key + b"\x00", key + b"\xff")  # its chunks: pending_range(..., mid, receipt)


def pendings(t: Transaction, dst: QueueKeys, source: str, limit: int, before: int) -> list[Entry]:
    """Up to ``limit`` pending copies from ``source`` written before version ``before``: in a
    batch's parts, or each under a key of its own."""
    out: list[Entry] = []
    for kv in t.snapshot.get_range(*pending_range(dst, source), limit * 4):
        parts = dst.q.unpack(kv.key)
        if len(parts) == 5 and parts[2] is None:  # a batch's part
            out += [(c.id, c.receipt) for c in decode_part(kv.value, dst, kv.key) if c.at < before]
        elif len(parts) == 4:  # a copy of its own (else a chunk)
            rec = decode_record(kv.value, dst, kv.key, str(parts[2]))
            if int(rec.extra.get("at", 0)) < before:
                out.append((str(parts[2]), str(parts[3])))
        if len(out) >= limit:
            return out[:limit]
    return out


# -- the source ---------------------------------------------------------------------------------


def tombs(t: Transaction, src: QueueKeys, dest: str, limit: int, before: int) -> list[Entry]:
    """The messages of up to ``limit`` tombstones for ``dest`` written before version ``before``."""
    r = src.q.range(("ft", dest))
    out: list[Entry] = []
    for kv in t.snapshot.get_range(r.start, r.stop, limit):
        tomb = decode_tomb(kv.value, str(src.q.unpack(kv.key)[-1]))
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
    key = bytes(src.q.pack(("fh", dest, name, now, str(batch[0].receipt))))
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
    r = src.q.range(("fh", dest, name))
    begin = r.start if after is None else max(r.start, after + b"\x00")
    found = t.get_range(begin, r.stop, 1)  # read, not snapshot: a namesake's lease conflicts
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
