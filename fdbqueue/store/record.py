"""The record stored for each message (its codec, payload chunks and checks); the public
:class:`~fdbqueue.types.Message` it becomes is in types.py."""

from __future__ import annotations

import json
import math
import re
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from fdbqueue.errors import (
    CorruptMessageError,
    DedupKeyTooLargeError,
    HeadersTooLargeError,
    InvalidPayloadError,
    InvalidTextError,
    QueueError,
    ReasonTooLargeError,
)
from fdbqueue.store.budget import MAX_DEDUP_KEY_BYTES, MAX_HEADERS_BYTES, MAX_REASON_BYTES, encoded_len
from fdbqueue.store.codec import utf8
from fdbqueue.store.layout import QueueKeys
from fdbqueue.types import ContentType

# 2: the record ends with a CRC-32 of everything before it (layer format 2.0; records of
# format 1 were never released, so are not read).
RECORD_FORMAT = 2
_HEAD = struct.Struct("<BI")
_CRC = struct.Struct("<I")
CRC_BYTES = _CRC.size
_crc32 = zlib.crc32
# zlib.crc32 of a body followed by its own CRC-32 (little-endian, as _CRC packs it) is this
# constant, whatever the body: CRC-32/ISO-HDLC's (zlib's) residue, 0xDEBB20E3, after its final
# XOR with 0xFFFFFFFF (the CRC RevEng catalogue, https://reveng.sourceforge.io/crc-catalogue/,
# "CRC-32/ISO-HDLC", "residue"). Four appended bytes map one-to-one onto the CRC of the whole,
# so a record's stored checksum is its body's exactly when the CRC-32 of all its bytes is this:
# one C call over the record, no slice of the body nor unpack of the stored checksum.
_RESIDUE = 0x2144DF1C


def coerce_payload(payload: object) -> tuple[bytes, ContentType]:
    """bytes-like stay bytes; str is UTF-8 text; anything else must be JSON-serialisable."""
    if isinstance(payload, bytes):
        return payload, ContentType.BYTES
    if isinstance(payload, (bytearray, memoryview)):
        return bytes(payload), ContentType.BYTES
    if isinstance(payload, str):
        try:
            return utf8(payload, "the payload str"), ContentType.TEXT
        except InvalidTextError as exc:
            raise InvalidPayloadError(f"{exc}: pass bytes, or text without lone surrogates") from None
    try:
        return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode(), ContentType.JSON
    except (TypeError, ValueError) as exc:
        raise InvalidPayloadError(
            f"payload must be bytes, str or JSON-serialisable; {type(payload).__name__}: {exc}"
        ) from None
    except RecursionError:
        # The encoder recurses once a level: past the interpreter's limit (about 1,000) it
        # cannot be encoded here, nor decoded by a consumer.
        raise InvalidPayloadError(
            f"payload {type(payload).__name__} is nested too deeply to encode as JSON; "
            "pass it encoded (bytes or str) if it must be"
        ) from None


def payload_list(payloads: object) -> Iterable[object]:
    """``enqueue_many``'s payloads: any iterable of them but a str, bytes-like or mapping,
    each of which iterates (into characters, ints or keys) yet is surely one payload, or a
    batch passed by mistake: QueueError, not a message a character."""
    if isinstance(payloads, (str, bytes, bytearray, memoryview, Mapping)):
        raise QueueError(
            f"enqueue_many takes an iterable of payloads, not a {type(payloads).__name__}: "
            "wrap one payload in a list ([payload]), or use enqueue"
        )
    if not isinstance(payloads, Iterable):
        raise QueueError(f"enqueue_many takes an iterable of payloads, not {type(payloads).__name__}")
    return payloads


def check_headers(headers: object) -> dict[str, Any]:
    """Headers as stored: names must be str (an int name would become a str in JSON and
    could collide with one: refused, not merged), values str, int, float, bool or None.

    What JSON in UTF-8 cannot carry is refused too (InvalidTextError or QueueError): a str,
    name or value, with a lone surrogate, and a float NaN or infinity. The record would
    store either (escaped), but every reader that speaks JSON - the dashboard, a forwarder's
    peer, a consumer in another language - would fail on it."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise QueueError(f"headers must be a mapping of str to JSON values, not {type(headers).__name__}")
    out: dict[str, Any] = {}
    for k, v in headers.items():
        if not isinstance(k, str):
            raise QueueError(f"header names must be str, got {k!r}")
        utf8(k, "a header name")
        if isinstance(v, str):
            utf8(v, f"header {k!r}")
        elif isinstance(v, float) and not math.isfinite(v):
            raise QueueError(f"header {k!r} is {v!r}, which JSON cannot carry: pass a finite number or a str")
        elif v is not None and not isinstance(v, (int, float, bool)):
            raise QueueError(f"header {k!r} must be str, int, float, bool or None, not {type(v).__name__}")
        out[k] = v
    try:
        size = encoded_len(out)
    except ValueError:  # an int past Python's int-to-str digit limit (sys.get_int_max_str_digits)
        big = next(k for k, v in out.items() if isinstance(v, int) and _too_long(v))
        raise QueueError(f"header {big!r} holds an int too long to store as decimal digits") from None
    if size > MAX_HEADERS_BYTES:
        # Headroom for every later state of the record (leased, nacked, dead-lettered, a
        # staged result) under the value limit: see fdbqueue/store/budget.py.
        raise HeadersTooLargeError(
            f"headers of {size} bytes (as stored) exceed the limit of {MAX_HEADERS_BYTES} bytes "
            "(MAX_HEADERS_BYTES)"
        )
    return out


def json_safe(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, scalars) with what strict JSON in UTF-8 cannot carry
    made visible text, for a reader (the dashboard, ``--json`` output) of whatever a store
    holds - written by a version before :func:`check_headers` refused it, or raw: a str's
    lone surrogates as ``\\udXXX`` escapes, a NaN or infinite float as ``"NaN"``,
    ``"Infinity"`` or ``"-Infinity"``."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _too_long(n: int) -> bool:
    try:
        str(n)
    except ValueError:
        return True
    return False


def check_dedup_key(dedup_key: str) -> None:
    """Refuse a dedup key past MAX_DEDUP_KEY_BYTES: it is part of two keys (key limit 10,000),
    and one UTF-8 cannot encode (InvalidTextError)."""
    n = len(utf8(dedup_key, "dedup_key"))
    if n > MAX_DEDUP_KEY_BYTES:
        raise DedupKeyTooLargeError(
            f"dedup_key of {n} bytes exceeds the limit of {MAX_DEDUP_KEY_BYTES} bytes (MAX_DEDUP_KEY_BYTES)"
        )


def fit_reason(text: str) -> str:
    """``text`` shortened to fit MAX_REASON_BYTES as stored (for reasons made of exception text)."""
    while encoded_len(text) > MAX_REASON_BYTES:
        text = text[: len(text) * 3 // 4]
    return text


def check_reason(reason: str) -> None:
    """Refuse a reason past MAX_REASON_BYTES as the record stores it (JSON)."""
    n = encoded_len(reason)
    if n > MAX_REASON_BYTES:
        raise ReasonTooLargeError(
            f"reason of {n} bytes (as stored) exceeds the limit of {MAX_REASON_BYTES} bytes "
            "(MAX_REASON_BYTES)"
        )


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one encoder: json.dumps makes one a call
_DECODER = json.JSONDecoder()
_DECODE = _DECODER.decode
# The decoder's scanner itself (``json.decoder.JSONDecoder.raw_decode`` calls it): a record's
# fields as written (no whitespace around them) without decode's two Python frames; any other
# text (or none that scans) goes to decode, which answers or raises as ever.
_SCAN: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]


class Record(NamedTuple):
    """What is stored for a message, wherever it is (ready, leased, delayed, error queue).

    A named tuple, not a dataclass: one is built or decoded for every message moved.
    """

    id: str
    enqueued_us: int
    content_type: str
    headers: dict[str, Any]
    deliveries: int = 0
    expires_us: int | None = None
    chunks: int = 0  # > 0: the payload is in that many chunk keys, not inline
    extra: dict[str, Any] = {}  # origin, reason, lease ... (never mutated: copied to change)
    payload: bytes = b""

    def encode(self) -> bytes:
        ct = self.content_type
        plain = type(ct) is str and ct.isascii() and ct.isalnum()
        if plain and not self.headers and not self.extra and self.id.isascii() and self.id.isalnum():
            # The common record (no headers, nothing extra, an id of ours: hex digits)
            # written directly: what the encoder below writes, at a quarter of its cost.
            expires = "null" if self.expires_us is None else int(self.expires_us)
            meta = (
                f'["{self.id}",{int(self.enqueued_us)},"{ct}",{{}},'
                f"{int(self.deliveries)},{expires},{int(self.chunks)},{{}}]"
            ).encode()
        else:
            meta = _ENCODER.encode(self[:8]).encode()  # the fields but the payload, as a JSON list
        body = _HEAD.pack(RECORD_FORMAT, len(meta)) + meta + self.payload
        return body + _CRC.pack(_crc32(body))

    @classmethod
    def decode(cls, raw: bytes) -> Record:
        """The record stored as ``raw``; :class:`CorruptMessageError` when its checksum does
        not match or its bytes do not decode (use :func:`decode_record` to name where it is).

        The checksum is a CRC-32 (``zlib.crc32``) of every byte but its own four: it detects
        every burst error of up to 32 bits, so every flipped bit or damaged byte.
        """
        body_end = len(raw) - CRC_BYTES
        if body_end < _HEAD.size:
            raise CorruptMessageError(f"record of {len(raw)} bytes is too short")
        if _crc32(raw) != _RESIDUE:  # the stored checksum is the body's (_RESIDUE)
            raise CorruptMessageError("record checksum mismatch")
        fmt, n = _HEAD.unpack_from(raw)
        if fmt != RECORD_FORMAT:
            raise QueueError(f"message record of unknown format {fmt}: written by a newer fdbqueue?")
        end = _HEAD.size + n
        try:
            text = raw[_HEAD.size : end].decode()
            try:
                fields, stop = _SCAN(text, 0)
            except StopIteration:
                stop = -1
            if stop != len(text) or type(fields) is not list:
                fields = _DECODE(text)
            fields.append(raw[end:body_end])
            return _make_record(fields)
        except (
            ValueError,
            TypeError,
            AttributeError,
        ) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise CorruptMessageError(f"record does not decode: {exc}") from None

    def expired(self, now: int) -> bool:
        """Whether its TTL has passed at database time ``now`` (a version, as ``db_now``)."""
        return self.expires_us is not None and self.expires_us <= now

    def with_(self, **changes: Any) -> Record:
        return self._replace(**changes)


_make_record = Record._make


def decode_fields(raw: bytes) -> list[Any] | None:
    """The fields of the record stored as ``raw`` as :meth:`Record.decode` finds them (a list
    in the Record's order, the payload last), for a reader that uses them as they are (a
    dequeue of the head: ``ops/head.py`` ``take_short``): the same checks, no Record built.
    None for anything Record.decode would not answer with a Record of nine fields from the
    scanner alone (damaged, another format, other spacing, too few or many fields): the
    caller goes to :func:`decode_record`, which answers or raises as ever."""
    if len(raw) < _MIN_RECORD or _crc32(raw) != _RESIDUE:
        return None
    fmt, n = _HEAD.unpack_from(raw)
    end = _HEAD_SIZE + n
    if fmt != RECORD_FORMAT or end > len(raw) - CRC_BYTES:
        return None
    try:
        text = raw[_HEAD_SIZE:end].decode()
        fields, stop = _SCAN(text, 0)
    except (ValueError, StopIteration):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    if stop != len(text) or type(fields) is not list or len(fields) != 8:
        return None
    fields.append(raw[end:-CRC_BYTES])
    return fields


_HEAD_SIZE = _HEAD.size
_MIN_RECORD = _HEAD_SIZE + CRC_BYTES


def encode_plain(msg_id: str, enqueued_us: int, content_type: str, payload: bytes) -> bytes:
    """``Record(msg_id, enqueued_us, content_type, {}, 0, None, 0, {}, payload).encode()``, the
    record of a new message in the common shape (no headers, TTL, chunks nor extra fields),
    for an id of ours (ASCII letters and digits) and a :class:`ContentType` value: the same
    bytes, without building the record to encode it (tests/layer/test_message.py compares)."""
    meta = f'["{msg_id}",{enqueued_us},"{content_type}",{{}},0,null,0,{{}}]'.encode()
    body = _HEAD.pack(RECORD_FORMAT, len(meta)) + meta + payload
    return body + _CRC.pack(_crc32(body))


# ASCII letters and digits, at least one (str.isascii() and str.isalnum() in one C call); a
# receipt's may have dots too. What encode_leased writes between quotes unescaped.
_ALNUM = re.compile("[0-9A-Za-z]+").fullmatch
_RECEIPT_CHARS = re.compile("[0-9A-Za-z.]*[0-9A-Za-z][0-9A-Za-z.]*").fullmatch


def encode_leased(
    rec: Record, key_hex: str, receipt: str, deadline: int, until: int, journaled: bool = False
) -> bytes | None:
    """``rec`` (a ready record) leased: ``rec.with_(deliveries=rec.deliveries + 1,
    extra={"key": key_hex, "receipt": receipt, "deadline": deadline, "until": until}).encode()``
    written directly for the common shape (no headers, nothing extra, a plain content type,
    an id of ours, a receipt of letters, digits and dots): the same bytes at a fraction of the
    encoder's cost (tests/layer/test_consume_statements.py compares). ``journaled``: the extra
    ends with the journal's mark too (``"j": 1``, ``ops/moves/core.py`` JOURNALED), as the lease
    of a journaled queue writes it. None for any other shape: the caller encodes the record."""
    ct = rec.content_type
    if (
        rec.headers
        or rec.extra
        or type(ct) is not str
        or not _ALNUM(ct)
        or not _ALNUM(rec.id)
        or not _RECEIPT_CHARS(receipt)
    ):
        return None  # key_hex needs no check: bytes.hex() gives hex digits only
    expires = "null" if rec.expires_us is None else int(rec.expires_us)
    meta = (
        f'["{rec.id}",{int(rec.enqueued_us)},"{ct}",{{}},{int(rec.deliveries) + 1},{expires},'
        f'{int(rec.chunks)},{{"key":"{key_hex}","receipt":"{receipt}","deadline":{int(deadline)},'
        f'"until":{int(until)}{_JOURNAL_MARK if journaled else ""}}}]'
    ).encode()
    body = _HEAD.pack(RECORD_FORMAT, len(meta)) + meta + rec.payload
    return body + _CRC.pack(_crc32(body))


_JOURNAL_MARK = ',"j":1'  # encode_leased's journaled extra: ops/moves/core.py's JOURNALED, set to 1
_JOURNAL_MARK_BYTES = _JOURNAL_MARK.encode()  # lease_plain's

# The fields of a ready record in the common shape, as encode_plain (and the general encoder,
# for the same record) writes them: an id of ours, JSON integers as json.dumps writes them, no
# headers, TTL, chunks nor extra fields.
_PLAIN_FIELDS = re.compile(
    rb'\["([0-9A-Za-z]+)",(0|-?[1-9][0-9]*),"([0-9A-Za-z]+)",\{\},(0|[1-9][0-9]*),null,0,\{\}\]'
)


def lease_plain(
    raw: bytes, key_hex: bytes, receipt: bytes, deadline: int, until: int, journaled: bool = False
) -> tuple[str, int, str, int, bytes, bytes] | None:
    """A ready record in the common shape (no headers, TTL, chunks nor extra fields; an id of
    ours, a plain content type) read and leased in one pass, for a lease of one message
    (``ops/leasing.py`` ``lease_short``): its id, enqueued time, content type, deliveries (as
    stored), payload, and the leased record's bytes - ``encode_leased``'s for the record
    :meth:`Record.decode` reads from ``raw`` (tests/layer/test_lease_short_step.py compares). The
    same checksum and format checks as :func:`decode_fields`; None for any record it does not
    match: the caller goes the long way, which decodes and encodes (or reports the damage) as
    ever. ``key_hex`` (the ready key's hex digits) and ``receipt`` as ASCII bytes; the receipt
    is the caller's own, letters, digits and dots (``bytes.hex()`` and ``.0``: what
    ``encode_leased`` checks with ``_RECEIPT_CHARS``), written as it is. ``journaled``: the
    extra ends with the journal's mark, as ``encode_leased``'s."""
    if len(raw) < _MIN_RECORD or _crc32(raw) != _RESIDUE:  # decode_fields' checksum check
        return None
    body_end = len(raw) - CRC_BYTES
    fmt, n = _HEAD.unpack_from(raw)
    end = _HEAD.size + n
    if fmt != RECORD_FORMAT or end > body_end:
        return None
    found = _PLAIN_FIELDS.fullmatch(raw, _HEAD.size, end)
    if found is None:
        return None
    msg_id, enqueued, ct, delivered = found.groups()
    deliveries = int(delivered)
    meta = b'["%s",%s,"%s",{},%d,null,0,{"key":"%s","receipt":"%s","deadline":%d,"until":%d%s}]' % (
        msg_id,
        enqueued,
        ct,
        deliveries + 1,
        key_hex,
        receipt,
        deadline,
        until,
        _JOURNAL_MARK_BYTES if journaled else b"",
    )
    payload = raw[end:body_end]
    head = _HEAD.pack(RECORD_FORMAT, len(meta)) + meta
    crc = _CRC.pack(_crc32(payload, _crc32(head)))
    return msg_id.decode(), int(enqueued), ct.decode(), deliveries, payload, b"".join((head, payload, crc))


def decode_record(raw: bytes, keys: QueueKeys, key: bytes, msg_id: str | None = None) -> Record:
    """:meth:`Record.decode` of the record at ``key`` in the queue of ``keys``: every read of
    a stored record goes through here, so a corrupt one is reported with its queue, key and
    id (``msg_id`` when the caller knows it, else the id the key names)."""
    try:
        return Record.decode(raw)
    except CorruptMessageError as exc:
        mid = msg_id if msg_id is not None else keys.id_at(key)
        raise CorruptMessageError(exc.detail, queue=keys.name, key=key, msg_id=mid) from None


def seal_chunk(data: bytes) -> bytes:
    """A payload chunk as stored: its bytes and their CRC-32."""
    return data + _CRC.pack(_crc32(data))


def join_chunks(values: Sequence[bytes | None], count: int, queue: str, msg_id: str) -> bytes:
    """The payload held in ``values`` (its chunks in order, as stored), each checked against
    its CRC-32; :class:`CorruptMessageError` naming the message when one is missing or damaged."""
    if len(values) != count:
        raise CorruptMessageError(f"{len(values)} payload chunks of {count}", queue=queue, msg_id=msg_id)
    parts = []
    for n, v in enumerate(values):
        if v is None or len(v) < CRC_BYTES:
            raise CorruptMessageError(f"payload chunk {n} missing", queue=queue, msg_id=msg_id)
        data = v[:-CRC_BYTES]
        if _CRC.unpack_from(v, len(data))[0] != _crc32(data):
            raise CorruptMessageError(f"payload chunk {n} checksum mismatch", queue=queue, msg_id=msg_id)
        parts.append(data)
    return b"".join(parts)
