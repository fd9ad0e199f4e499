"""A leased forward's pending copies on the destination (``runtime/leased.py``; the protocol in
``transit.py`` and docs/forwarding.md): written (:func:`install`, :func:`install_parts`), read
(:func:`read_pending`, :func:`pendings`), published as messages (:func:`as_item`; the common
batch by :func:`read_plain` and :func:`publish_plain`) and cleared (:meth:`Pending.drop`).

A leased batch's copies live in parts under ``("fp", source token, None, lease, part)``, each
under the value limit (:func:`encode_part`: each copy's fields as JSON, the inline payloads,
a CRC-32 of it all; or, for the common batch, each copy as the record its publication writes:
"the records' format" below; a payload over ``CHUNK_SIZE`` in chunks ``("fp", source token,
id, receipt, n)``); a batch installed by a transaction of its own (and every batch an earlier
version installed) has one key a message, ``("fp", source token, id, receipt)`` -> a Record.
The keys are built in ``store/layout.py``. A copy is not a message: not counted, never
delivered, left alone by purges; every reader reads both forms.

Every function composes inside the caller's transaction.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Mapping
from itertools import accumulate, repeat
from operator import attrgetter, itemgetter, setitem
from typing import Any, NamedTuple

from fdbqueue.engines.contract import KeyValue, Transaction, check_room
from fdbqueue.engines.limits import VALUE_SIZE_LIMIT
from fdbqueue.errors import CorruptMessageError, QueueError
from fdbqueue.ops.moves.arrivals import CHUNK_SIZE, count_new
from fdbqueue.ops.remotededup import DEDUP_HEADER, header_key
from fdbqueue.ops.transit import Entry, batch_of, enqueued_us, leases_of
from fdbqueue.store.budget import MAX_PAYLOAD_BYTES
from fdbqueue.store.entropy import new_rand
from fdbqueue.store.layout import (
    QueueKeys,
    part_key,
    part_number,
    part_range,
    pending_chunk_key,
    pending_key,
    pending_keys,
    pending_range,
    unpack_pending,
)
from fdbqueue.store.meta import Meta
from fdbqueue.store.record import Record, decode_record, encode_plain, join_chunks, seal_chunk
from fdbqueue.types import ContentType, Item, Message

_first, _second = itemgetter(0), itemgetter(1)
_ID, _RECEIPT, _PRIORITY = attrgetter("id"), attrgetter("receipt"), attrgetter("priority")
_PAYLOAD, _HEADERS = attrgetter("payload"), attrgetter("headers")


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
            t.set(pending_chunk_key(dst, source, m.id, str(m.receipt), n), seal_chunk(
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
            part = part_number(dst, kv.key) + 1
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
                t.set(pending_chunk_key(dst, source, m.id, receipt, n), seal_chunk(
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
    joined = "".join(ids)
    if joined.isascii() and joined.isalnum() and "".join(receipts).isascii() and not any(map(_UNTIL, msgs)):
        # (no TTL, ids of ours: the records' format, unless its encoding passes the value
        # limit after all - then the rows below, which _put_part halves)
        raw = _encode_records(ids, receipts, msgs, payloads, now)
        if len(raw) <= VALUE_SIZE_LIMIT:
            t.set(part_key(dst, source, lease, part), raw)
            return True
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
    if fmt == RECORDS_FORMAT:
        return _copies_of(raw, keys, key)
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
_UNTIL = attrgetter("expires_at")
_COPY_FIELDS = len(Copy._fields)


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
    t: Transaction,
    dst: QueueKeys,
    source: str,
    entries: list[Entry],
    *,
    payloads: bool = True,
    read: list[KeyValue] | None = None,
) -> Pending:
    """The pending copies of ``entries`` (id, receipt), in a batch's parts (one range read a
    batch) or each under a key of its own (one ``get_many`` for those the parts do not hold):
    payloads joined (``payloads=False``: chunked ones left unread). ``read``: the parts of
    the entries' one lease as ``t`` read them already (:func:`read_plain`)."""
    found: dict[Entry, Copy] = {}
    parts: dict[bytes, list[Copy]] = {}
    leases = leases_of(map(_second, entries))
    for lease in leases:
        kvs = read if read is not None and len(leases) == 1 else None
        for kv in kvs if kvs is not None else t.get_range(*part_range(dst, source, lease), 10_000):
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


# -- the records' format: a batch of plain copies as the records their publication writes ------
#
# A run's batch of copies without headers, TTL or chunks, with ids of ours (ASCII letters and
# digits), installed in the publication of the one before it (``_put_plain``): each copy is
# kept as the very record its publication writes (``record.encode_plain``: its id, enqueue
# time, content type and payload; no deliveries), beside its receipt and priority. The
# common publication (:func:`read_plain`, :func:`publish_plain`) then writes those bytes
# as they are, with the message's id entry: no copy decoded, no Item, no record encoded.
# A part's value: ``_RECORDS_HEAD`` (format 2, copies, the version they were installed
# at), a ``_RECORDS_ROW`` a copy (its id's and receipt's lengths, priority, record's
# length), the ids, the receipts, the records, a CRC-32 of it all. Every other reader
# decodes it into :class:`Copy`s (:func:`decode_part`), as a part of format 1.
RECORDS_FORMAT = 2
_RECORDS_HEAD = struct.Struct("<BIq")
_RECORDS_ROW = struct.Struct("<HHqI")


def _encode_records(
    ids: list[str], receipts: list[str], msgs: list[Message], payloads: list[bytes], now: int
) -> bytes:
    # (round(...): enqueued_us(m), without the call; ._value_: the enum's value without its
    # property's Python-level call)
    recs = [encode_plain(mid, round(m.enqueued_at * 1e6), m.content_type._value_, payload)
            for mid, m, payload in zip(ids, msgs, payloads, strict=True)]  # fmt: skip
    rows = map(_RECORDS_ROW.pack, map(len, ids), map(len, receipts), map(_PRIORITY, msgs), map(len, recs))
    body = b"".join([_RECORDS_HEAD.pack(RECORDS_FORMAT, len(msgs), now), *rows,
                     "".join(ids).encode(), "".join(receipts).encode(), *recs])  # fmt: skip
    return body + _CRC.pack(zlib.crc32(body))


def _records_of(
    raw: bytes, keys: QueueKeys, key: bytes
) -> tuple[list[str], list[str], list[int], list[bytes], int]:
    """A part of the records' format: its ids, receipts, priorities, records and when it was
    installed; :class:`CorruptMessageError` naming ``key`` when its checksum does not match
    (or its lengths do not add up)."""
    end = len(raw) - _CRC.size
    if end < _RECORDS_HEAD.size or _CRC.unpack_from(raw, end)[0] != zlib.crc32(memoryview(raw)[:end]):
        raise CorruptMessageError("pending copies: checksum mismatch", queue=keys.name, key=key)
    _, n, at = _RECORDS_HEAD.unpack_from(raw)
    start = _RECORDS_HEAD.size + n * _RECORDS_ROW.size
    if not n or start > end:
        raise CorruptMessageError("pending copies: no copy in a part", queue=keys.name, key=key)
    id_lens, receipt_lens, priorities, rec_lens = zip(
        *_RECORDS_ROW.iter_unpack(raw[_RECORDS_HEAD.size : start]), strict=True
    )
    mid = start + sum(id_lens)
    last = mid + sum(receipt_lens)
    if last + sum(rec_lens) != end:
        raise CorruptMessageError("pending copies: lengths do not add up", queue=keys.name, key=key)
    return (
        _cut(raw[start:mid].decode(), id_lens, 0), _cut(raw[mid:last].decode(), receipt_lens, 0),
        list(priorities), _cut(raw, rec_lens, last), at,
    )  # fmt: skip


def _cut(seq: Any, lens: tuple[int, ...], start: int) -> list[Any]:
    """``seq`` cut in pieces of ``lens`` from ``start`` (loops in C)."""
    ends = list(accumulate(lens, initial=start))
    return list(map(seq.__getitem__, map(slice, ends, ends[1:])))


def _copies_of(raw: bytes, keys: QueueKeys, key: bytes) -> list[Copy]:
    """A part of the records' format as :class:`Copy`s (for every reader but the common
    publication)."""
    ids, receipts, priorities, recs, at = _records_of(raw, keys, key)
    out = []
    for mid, receipt, priority, raw_rec in zip(ids, receipts, priorities, recs, strict=True):
        rec = decode_record(raw_rec, keys, key, mid)
        out.append(Copy(mid, receipt, rec.enqueued_us, rec.content_type, rec.headers, priority, None, None,
                        False, 0, rec.payload, at))  # fmt: skip
    return out


class Plain(NamedTuple):
    """A batch's copies as the common publication reads them (:func:`read_plain`)."""

    parts: list[bytes]  # the keys of the batch's parts, each read
    ids: list[str]
    priorities: list[int]
    records: list[bytes]


def plain_queue(meta: Meta) -> bool:
    """Whether an enqueue into the queue ``meta`` describes writes a plain copy's record as it
    is (``enqueuing._write_new``'s general path for a ready message given its id): settings
    made, enqueues open, no journal, no queue TTL, a ``max_payload`` every inline payload
    fits (a payload over ``CHUNK_SIZE`` has chunks: never a plain copy)."""
    cfg = meta.config
    return (
        cfg is not None and meta.state.enqueue and not cfg.journal and cfg.ttl is None
        and min(cfg.max_payload, MAX_PAYLOAD_BYTES) >= CHUNK_SIZE
    )  # fmt: skip


def read_plain(
    t: Transaction, dst: QueueKeys, source: str, entries: list[Entry]
) -> tuple[Plain | None, list[KeyValue] | None]:
    """The copies of ``entries`` when they are the common publication's case: one lease's
    batch, every part of it in the records' format, holding exactly ``entries``, in order
    (none published, withdrawn or held back since). Else None, with the parts as read (for
    :func:`read_pending`: one range read either way; None when not one lease, nothing read).
    The range read is not a snapshot read: a part rewritten meanwhile conflicts."""
    leases = leases_of(map(_second, entries))
    if len(leases) != 1:
        return None, None
    kvs = t.get_range(*part_range(dst, source, leases[0]), 10_000)
    if not kvs or any(kv.value[0] != RECORDS_FORMAT for kv in kvs):
        return None, kvs
    ids: list[str] = []
    receipts: list[str] = []
    priorities: list[int] = []
    records: list[bytes] = []
    for kv in kvs:
        i, r, p, c, _ = _records_of(kv.value, dst, kv.key)
        ids += i
        receipts += r
        priorities += p
        records += c
    if len(ids) != len(entries) or list(zip(ids, receipts, strict=True)) != entries:
        return None, kvs
    return Plain([kv.key for kv in kvs], ids, priorities, records), kvs


def publish_plain(t: Transaction, dst: QueueKeys, meta: Meta, plain: Plain) -> int:
    """Publish ``plain`` in ``t`` (the destination's settings ``meta``, read by ``t``, said
    :func:`plain_queue`; the caller checked the right and the room, and that no copy is held
    by the destination already): what ``enqueuing.enqueue_in`` writes for their Items - each
    record at the next ready key with its id entry (a forwarded message keeps its id), the
    batch counted once - then the parts cleared. Returns how many."""
    check_room(t.db)  # below the disk's free-space reserve a producer is refused, as enqueue_in
    base = meta.made_ready + 1
    ready_key, id_key, tset = dst.ready_key, dst.id_key, t.set
    at = [ready_key(p, base + i, new_rand()) for i, p in enumerate(plain.priorities)]
    for key, mid, rec in zip(at, plain.ids, plain.records, strict=True):
        tset(key, rec)
        tset(id_key(mid), key)
    fresh = set(plain.priorities) - meta.priorities
    count_new(t, dst, len(at), 0, fresh, meta.work, conflicts=meta.cluster, seen=meta.raw)
    for key in plain.parts:
        t.clear(key)
    return len(at)


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
        parts = unpack_pending(dst, kv.key)
        if len(parts) == 5 and parts[2] is None:  # a batch's part
            out += [(c.id, c.receipt) for c in decode_part(kv.value, dst, kv.key) if c.at < before]
        elif len(parts) == 4:  # a copy of its own (else a chunk)
            rec = decode_record(kv.value, dst, kv.key, str(parts[2]))
            if int(rec.extra.get("at", 0)) < before:
                out.append((str(parts[2]), str(parts[3])))
        if len(out) >= limit:
            return out[:limit]
    return out
