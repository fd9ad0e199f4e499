"""A leased forward's keys (store/layout.py's transit section): the bytes earlier versions wrote,
and fdb.tuple's for any names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fdbqueue.store.layout import (
    QueueKeys,
    forward_marker,
    forward_marker_range,
    forward_probe_key,
    forward_token_key,
    hand_key,
    hands_range,
    part_key,
    part_number,
    part_range,
    pending_chunk_key,
    pending_key,
    pending_keys,
    pending_range,
    tomb_key,
    tomb_name,
    tombs_range,
    unpack_pending,
)

# A leased forward's keys, byte for byte as the stores written so far hold them (main 0478719
# built them in ops/transit.py): a store a forward left mid-batch is finished by this code.
Q = b"\x02app\x00\x15\x01\x02q\x00\x02jobs\x00"  # QueueKeys.make("jobs", ("app", 1)).q
S = Q + b"\x02fp\x00\x02src\x00"  # ("fp", "src")
FORWARD_KEYS: dict[str, object] = {
    "token": Q + b"\x02fk\x00",
    "probe": Q + b"\x02fn\x00\x02n0\x00",
    "pending": S + b"\x02m1\x00\x02l.3\x00",
    "pending_keys": [S + b"\x02m1\x00\x02l.3\x00", S + b"\x02m2\x00\x02l\x00"],
    "chunk": S + b"\x02m1\x00\x02l.3\x00\x15\x02",
    "pending_range": (S + b"\x02m1\x00\x02l.3\x00\x00", S + b"\x02m1\x00\x02l.3\x00\xff"),
    "pending_range_src": (S + b"\x00", S + b"\xff"),
    "pending_range_all": (Q + b"\x02fp\x00\x00", Q + b"\x02fp\x00\xff"),
    "part": S + b"\x00\x02l\x00\x15\x04",
    "part_range": (S + b"\x00\x02l\x00\x00", S + b"\x00\x02l\x00\xff"),
    "tomb": Q + b"\x02ft\x00\x02dst\x00\x02l\x00",
    "tombs_range": (Q + b"\x02ft\x00\x02dst\x00\x00", Q + b"\x02ft\x00\x02dst\x00\xff"),
    "tombs_range_all": (Q + b"\x02ft\x00\x00", Q + b"\x02ft\x00\xff"),
    "hand": Q + b"\x02fh\x00\x02dst\x00\x02w\x00\x18\x07[\xcd\x15\x02l.0\x00",
    "hands_range": (Q + b"\x02fh\x00\x02dst\x00\x02w\x00\x00", Q + b"\x02fh\x00\x02dst\x00\x02w\x00\xff"),
    "marker": Q + b"\x02fw\x00\x02src\x00\x02m1\x00",
    "marker_range": (Q + b"\x02fw\x00\x02src\x00\x00", Q + b"\x02fw\x00\x02src\x00\xff"),
}


def test_forward_keys_are_the_bytes_earlier_versions_wrote() -> None:
    k = QueueKeys.make("jobs", ("app", 1))
    assert k.q.key() == Q
    built: dict[str, object] = {
        "token": forward_token_key(k),
        "probe": forward_probe_key(k, "n0"),
        "pending": pending_key(k, "src", "m1", "l.3"),
        "pending_keys": pending_keys(k, "src", [("m1", "l.3"), ("m2", "l")]),
        "chunk": pending_chunk_key(k, "src", "m1", "l.3", 2),
        "pending_range": pending_range(k, "src", "m1", "l.3"),
        "pending_range_src": pending_range(k, "src"),
        "pending_range_all": pending_range(k),
        "part": part_key(k, "src", "l", 4),
        "part_range": part_range(k, "src", "l"),
        "tomb": tomb_key(k, "dst", "l"),
        "tombs_range": tombs_range(k, "dst"),
        "tombs_range_all": tombs_range(k),
        "hand": hand_key(k, "dst", "w", 123456789, "l.0"),
        "hands_range": hands_range(k, "dst", "w"),
        "marker": forward_marker(k, "src", "m1"),
        "marker_range": forward_marker_range(k, "src"),
    }
    assert built == FORWARD_KEYS
    # and read back: what the readers take from a key
    assert part_number(k, part_key(k, "src", "l", 4)) == 4
    assert tomb_name(k, tomb_key(k, "dst", "l")) == "l"
    assert unpack_pending(k, part_key(k, "src", "l", 4)) == ("fp", "src", None, "l", 4)
    assert unpack_pending(k, pending_chunk_key(k, "src", "m1", "l.3", 2)) == ("fp", "src", "m1", "l.3", 2)


NAMES = st.text(max_size=12)


@given(NAMES, NAMES, NAMES, NAMES, st.integers(0, 2**63), st.sampled_from([("fdbq",), ("app", 7, b"\x00x")]))
def test_forward_keys_match_the_tuple_layer(
    source: str, mid: str, receipt: str, nonce: str, n: int, root: tuple[object, ...]
) -> None:
    """Whatever the names: the tuple layer's keys (the builders skip its general packer)."""
    k = QueueKeys.make("jobs", root)
    q = k.q
    assert forward_token_key(k) == q.pack(("fk",))
    assert forward_probe_key(k, nonce) == q.pack(("fn", nonce))
    assert pending_key(k, source, mid, receipt) == q.pack(("fp", source, mid, receipt))
    assert pending_keys(k, source, [(mid, receipt)]) == [q.pack(("fp", source, mid, receipt))]
    assert pending_chunk_key(k, source, mid, receipt, n) == q.pack(("fp", source, mid, receipt, n))
    for rest in ((), (source,), (source, mid), (source, mid, receipt)):
        r = q.range(("fp", *rest))
        assert pending_range(k, *rest) == (r.start, r.stop)
    assert part_key(k, source, receipt, n) == q.pack(("fp", source, None, receipt, n))
    r = q.range(("fp", source, None, receipt))
    assert part_range(k, source, receipt) == (r.start, r.stop)
    assert tomb_key(k, source, mid) == q.pack(("ft", source, mid))
    for rest in ((), (source,)):
        r = q.range(("ft", *rest))
        assert tombs_range(k, *rest) == (r.start, r.stop)
    assert hand_key(k, source, nonce, n, receipt) == q.pack(("fh", source, nonce, n, receipt))
    r = q.range(("fh", source, nonce))
    assert hands_range(k, source, nonce) == (r.start, r.stop)
