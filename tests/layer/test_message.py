"""The stored record: its fast encoding is the general JSON encoding, and it round-trips."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fdbqueue.store.record import _ENCODER, Record
from fdbqueue.types import ContentType, Message

IDS = st.one_of(st.text(alphabet="0123456789abcdefr", min_size=1, max_size=40), st.text(max_size=20))
JSONABLE = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), st.text(max_size=10))


@given(
    IDS,
    st.integers(0, 2**62),
    st.sampled_from([ct.value for ct in ContentType] + ['x"y']),
    st.dictionaries(st.text(max_size=8), JSONABLE, max_size=3),
    st.integers(0, 1000),
    st.one_of(st.none(), st.integers(0, 2**62)),
    st.integers(0, 100),
    st.dictionaries(st.text(max_size=8), JSONABLE, max_size=3),
    st.binary(max_size=50),
)
def test_record_encoding_is_the_general_json_and_round_trips(
    msg_id: str,
    enqueued: int,
    ctype: str,
    headers: dict[str, object],
    deliveries: int,
    expires: int | None,
    chunks: int,
    extra: dict[str, object],
    payload: bytes,
) -> None:
    rec = Record(msg_id, enqueued, ctype, headers, deliveries, expires, chunks, extra, payload)
    raw = rec.encode()
    assert raw[5:-4] == _ENCODER.encode(list(rec[:8])).encode() + payload
    assert int.from_bytes(raw[-4:], "little") == zlib.crc32(raw[:-4])  # the record's checksum
    assert Record.decode(raw) == rec


def test_message_from_record_is_a_complete_message() -> None:
    rec = Record("r0a", 2_000_000, "t", {"k": 1}, 1, None, 0, {"reason": "x"}, b"hi")
    m = Message.from_record(rec, "jobs", 3, b"key", b"hi", delivered=True, receipt="rc")
    direct = Message(
        id="r0a",
        payload=b"hi",
        queue="jobs",
        priority=3,
        enqueued_at=2.0,
        deliveries=2,
        headers={"k": 1},
        content_type=ContentType.TEXT,
        key=b"key",
        receipt="rc",
        extra={"reason": "x"},
    )
    assert m == direct and m.text() == "hi" and m.reason == "x"
    assert list(vars(m)) == list(vars(direct))  # every field, in the declared order


def _stored(meta: bytes, payload: bytes = b"p") -> bytes:
    """A record's bytes with ``meta`` as its fields' JSON, checksummed as the layer writes it."""
    from fdbqueue.store.record import _CRC, _HEAD, RECORD_FORMAT

    body = _HEAD.pack(RECORD_FORMAT, len(meta)) + meta + payload
    return body + _CRC.pack(zlib.crc32(body))


def test_a_record_decodes_alike_with_whitespace_around_its_fields_and_refuses_what_is_not_one() -> None:
    """Record.decode scans the fields with the JSON scanner itself; JSON it did not write
    (whitespace around, a trailing value, not a list) decodes as json.loads would or is
    refused as corrupt, as before."""
    import pytest

    from fdbqueue.errors import CorruptMessageError

    plain = b'["r1",5,"b",{},0,null,0,{}]'
    want = Record("r1", 5, "b", {}, 0, None, 0, {}, b"p")
    for meta in (plain, b" " + plain, plain + b" ", b"\n" + plain + b"\t"):
        assert Record.decode(_stored(meta)) == want
    for bad in (plain + b"[]", b"", b"{}", b"[1,2", b'"r1"', b"nul", plain[:-1] + b",]"):
        with pytest.raises(CorruptMessageError):
            Record.decode(_stored(bad))


_TEXT = st.text(alphabet=st.sampled_from('aZ09.-_é "\\'), max_size=6)


@given(ct=_TEXT, mid=_TEXT, receipt=_TEXT)
def test_encode_leased_writes_the_encoders_bytes_or_leaves_the_shape_to_it(
    ct: str, mid: str, receipt: str
) -> None:
    """The common shape's check (ASCII letters and digits; a receipt's dots) in one C call a
    field: encode_leased answers where the old checks let it, with the encoder's bytes."""
    from fdbqueue.store.record import encode_leased

    rec = Record(mid, 7, ct, {}, 1, None, 0, {}, b"pay")
    got = encode_leased(rec, "ab12", receipt, 5, 9)
    plain = (
        ct.isascii() and ct.isalnum() and mid.isascii() and mid.isalnum()
        and receipt.isascii() and receipt.replace(".", "").isalnum()
    )  # fmt: skip
    assert (got is not None) == plain
    if got is not None:
        extra = {"key": "ab12", "receipt": receipt, "deadline": 5, "until": 9}
        assert got == rec.with_(deliveries=2, extra=extra).encode()


def test_a_message_without_headers_or_extra_is_complete_and_read_only() -> None:
    """``from_record`` hands every message without headers (or extra fields) one read-only
    empty view: equal to an empty dict, unchangeable, and a field the same as ``Message(...)``
    builds; the TTL as stored when the caller gives no estimate, the caller's when it does."""
    rec = Record("r0b", 3_000_000, "b", {}, 0, 9_000_000, 0, {}, b"p")
    a = Message.from_record(rec, "jobs", 0, b"k", b"p")
    b = Message.from_record(rec, "jobs", 0, b"k", b"p", expires_at=None, delivered=True)
    direct = Message(
        id="r0b",
        payload=b"p",
        queue="jobs",
        priority=0,
        enqueued_at=3.0,
        deliveries=0,
        headers={},
        content_type=ContentType.BYTES,
        expires_at=9.0,
        key=b"k",
    )
    assert a == direct and list(vars(a)) == list(vars(direct))
    assert b.expires_at is None and b.deliveries == 1 and b.headers == {} and b.extra == {}
    for view in (a.headers, a.extra):
        with pytest.raises(TypeError):
            view["x"] = 1  # type: ignore[index]
    assert a.headers == {} and b.headers == {}


def test_a_record_decodes_as_the_json_decoder_reads_it_whatever_its_spacing() -> None:
    """``Record.decode`` scans the fields as written (no spaces) without the decoder's frames;
    any other text goes to the decoder: spaces around and inside decode the same, and text
    that is not one JSON list of the fields (trailing data, an object, bad JSON) is damaged."""
    from fdbqueue.errors import CorruptMessageError
    from fdbqueue.store.record import _CRC, _HEAD, RECORD_FORMAT

    def stored(meta: str, payload: bytes = b"pl") -> bytes:
        body = _HEAD.pack(RECORD_FORMAT, len(meta.encode())) + meta.encode() + payload
        return body + _CRC.pack(zlib.crc32(body))

    rec = Record("r0c", 5, "b", {"h": [1, 2]}, 3, None, 0, {"k": "v"}, b"pl")
    for meta in (
        '["r0c",5,"b",{"h":[1,2]},3,null,0,{"k":"v"}]',
        ' ["r0c", 5, "b", {"h": [1, 2]}, 3, null, 0, {"k": "v"}] ',
        '["r0c",5,"b",{"h":[1,2]},3,null,0,{"k":"v"}]\n',
    ):
        assert Record.decode(stored(meta)) == rec, meta
    for meta in (
        '["r0c",5,"b",{},3,null,0,{}]x',
        '["r0c",5,"b",{},3,null,0,{}][]',
        '{"id":"r0c"}',
        '["r0c",5,"b",{},3,nul,0,{}]',
        "",
    ):
        with pytest.raises(CorruptMessageError):
            Record.decode(stored(meta))
