"""The keyspace's fast key builders produce exactly what fdb.tuple produces."""

from __future__ import annotations

import zlib

import fdb.tuple
from fdb.subspace_impl import Subspace
from hypothesis import given
from hypothesis import strategies as st

from fdbqueue.engines.checks import journal_templates
from fdbqueue.errors import QueueError
from fdbqueue.store.codec import dec_int, enc_bytes, enc_int, enc_str
from fdbqueue.store.layout import (
    HISTORY_SHARDS,
    JOURNAL_SHARDS,
    QUEUE_SHARD,
    JournalKeys,
    QueueKeys,
    WorkKeys,
)

INTS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 255, 256, -256, 2**64 - 2, 2**64 - 1, 2**64, -(2**64 - 1), -(2**64)]),
)


@given(INTS)
def test_enc_int_matches_the_tuple_layer(n: int) -> None:
    packed = fdb.tuple.pack((n,))
    assert enc_int(n) == packed
    assert dec_int(b"ab" + packed + b"z", 2) == (n, 2 + len(packed))


@given(st.binary(max_size=40), st.text(max_size=40))
def test_enc_bytes_and_str_match_the_tuple_layer(b: bytes, s: str) -> None:
    assert enc_bytes(b) == fdb.tuple.pack((b,))
    assert enc_str(s) == fdb.tuple.pack((s,))


@given(st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**62), st.binary(min_size=8, max_size=8))
def test_queue_keys_match_the_subspace(priority: int, index: int, rand: bytes) -> None:
    k = QueueKeys.make("jobs", ("app", 1))
    key = k.ready_key(priority, index, rand)
    assert key == k.q.pack(("r", -priority, index, rand))
    assert k.parse_ready(key) == (priority, index, rand)
    assert k.priority_of(key) == priority
    mid = k.home_id(priority, index, rand)
    assert k.home_key(mid) == key  # a ready message's id names its key
    assert k.priority_marker(priority) == k.q.pack(("m", "pri", -priority))
    assert k.parse_marker(k.priority_marker(priority)) == priority
    begin, end = k.priority_range(priority)
    assert begin < key < end
    r = k.q.range(("r",))
    assert k.ready_range() == (r.start, r.stop)


def test_fixed_keys_match_the_subspace() -> None:
    k = QueueKeys.make("jobs")
    assert k.config == k.q.pack(("m", "cfg"))
    assert k.state == k.q.pack(("m", "st"))
    assert k.counter("ready") == k.q.pack(("m", "n", "ready"))
    assert k.wake == k.q.pack(("m", "n", "wake"))
    assert k.id_key("x") == k.q.pack(("id", "x"))
    assert k.home_key("not-a-home-id") is None and k.home_key("rzz") is None
    begin, end = k.meta_range()
    assert all(begin <= key < end for key in (k.config, k.state, k.wake, k.priority_marker(3)))


@given(st.integers(0, 2**63), st.text(max_size=40))
def test_index_keys_match_the_subspace(t_us: int, msg_id: str) -> None:
    k = QueueKeys.make("jobs", ("app", 1))
    assert k.inflight_key(msg_id) == k.q.pack(("f", msg_id))
    assert k.lease_key(t_us, msg_id) == k.q.pack(("l", t_us, msg_id))
    assert k.delayed_key(t_us, msg_id) == k.q.pack(("d", t_us, msg_id))
    assert k.expiry_key(t_us, msg_id) == k.q.pack(("x", t_us, msg_id))
    assert k.unpack_tail(k.lease_key(t_us, msg_id)) == ("l", t_us, msg_id)
    assert k.leases_due(t_us) == k.index_range("l", t_us + 1)  # (leasing.lease_short's read)


@given(st.text(min_size=1, max_size=60).filter(lambda s: "\x00" not in s))
def test_a_queues_work_entry_is_the_work_index_entry_for_its_name(name: str) -> None:
    """Enqueues mark ``QueueKeys.work_entry``; consumers scan ``WorkKeys``' range: one key."""
    try:
        k = QueueKeys.make(name, ("app", 1))
    except QueueError:
        return  # not a queue name
    wk = WorkKeys(("app", 1))
    assert k.work_entry == wk.entry(name) == k.root.pack(("wk", name))
    begin, end = wk.range()
    assert begin <= k.work_entry < end and wk.name(k.work_entry) == name


@given(
    st.text(min_size=1, max_size=20),
    st.integers(min_value=0, max_value=JOURNAL_SHARDS - 1),
    st.text(min_size=1, max_size=40),
    st.integers(min_value=0, max_value=0xFFFF),
    st.sampled_from([("fdbq",), ("app", 7, b"\x00x")]),
)
def test_journal_stamp_keys_match_the_tuple_layer(
    queue: str, shard: int, message_id: str, order: int, root: tuple[object, ...]
) -> None:
    """A new entry's key and its history pointer's, as ``set_versionstamped_key`` takes them:
    ``fdb.tuple``'s incomplete versionstamp of ``order``, its offset in the last four bytes;
    asked twice (the builders keep what they can)."""
    jk, sub = JournalKeys.make(root), Subspace(root)
    hs = zlib.crc32(message_id.encode()) % HISTORY_SHARDS
    for _ in range(2):
        assert jk.entry_to_stamp(queue, shard, order) == sub.pack_with_versionstamp(
            ("j", queue, shard, fdb.tuple.Versionstamp(user_version=order))
        )
        assert jk.history_to_stamp(message_id, order) == sub.pack_with_versionstamp(
            ("h", hs, message_id, fdb.tuple.Versionstamp(user_version=order))
        )
        # prefixes(): the entry's key in its shard (by the id's CRC where spread, else 0) and
        # the pointer's key up to the stamp (set_journal_entry's: the stamp, the order follow),
        # and the pointer's value (the queue, NUL, the entry's shard)
        for spread in (True, False):
            at = zlib.crc32(message_id.encode()) % JOURNAL_SHARDS if spread else 0
            entry, pointer, pointer_value = jk.prefixes(queue, message_id, spread)
            tail = b"\xff" * 10 + order.to_bytes(2, "big")  # fdb.tuple's incomplete stamp
            assert entry + tail + len(entry).to_bytes(4, "little") == sub.pack_with_versionstamp(
                ("j", queue, at, fdb.tuple.Versionstamp(user_version=order))
            )
            assert pointer + tail + len(pointer).to_bytes(4, "little") == sub.pack_with_versionstamp(
                ("h", hs, message_id, fdb.tuple.Versionstamp(user_version=order))
            )
            assert pointer_value == queue.encode() + b"\x00" + bytes((at,))
            assert jk.entry_prefix(queue, at) == entry
            # what the engines take them for: journal_templates (set_journal_entry's)
            assert journal_templates(order, entry, b"", pointer, b"", None) == (
                jk.entry_to_stamp(queue, at, order),
                jk.history_to_stamp(message_id, order),
            )


@given(
    st.text(min_size=1, max_size=20).filter(lambda s: all(ord(c) >= 32 and c != "\x7f" for c in s)),
    st.text(min_size=1, max_size=40),
    st.integers(min_value=0, max_value=0xFFFF),
    st.sampled_from([("fdbq",), ("app", 7, b"\x00x")]),
)
def test_a_consuming_operations_pointer_in_its_queue_matches_the_tuple_layer(
    queue: str, message_id: str, order: int, root: tuple[object, ...]
) -> None:
    """``queue_prefixes``: the entry's key in the queue's own keys (``Q + ("ej", stamp)``, since
    issue 30's ninth pass; shard 0 before), the pointer's key inside the queue's own keys
    (``Q + ("mh", message_id, stamp)``; ``"eh"`` before) up to the stamp, its value QUEUE_SHARD; the key a
    reader builds (``queue_history_key``) and the range it reads (``queue_history_range``)
    agree with them; asked twice (the builder keeps the queue's part)."""
    jk, sub = JournalKeys.make(root), Subspace(root)
    keys = QueueKeys.make(queue, root)
    stamp = bytes(range(10)) + order.to_bytes(2, "big")
    for _ in range(2):
        entry, pointer, value = jk.queue_prefixes(keys, message_id)
        assert entry == jk.queue_entry_prefix(keys) and value == bytes((QUEUE_SHARD,))
        assert entry + stamp == jk.entry_key(queue, QUEUE_SHARD, stamp)
        assert entry + stamp == sub.pack(("q", queue, "ej", fdb.tuple.Versionstamp(stamp[:10], order)))
        assert jk.entry_version(entry + stamp) == stamp
        begin, end = jk.entry_range(queue, QUEUE_SHARD, None)
        assert begin <= entry + stamp < end
        assert jk.entry_range(queue, QUEUE_SHARD, stamp)[0] > entry + stamp  # after ``since``
        # the queue's bell: after its lease deadlines, before its counters
        assert keys.q.range(("l",)).stop <= jk.queue_bell(keys) < keys.q.range(("m",)).start
        assert jk.queue_bell(keys) == jk.queue_bell_of(queue) == sub.pack(("q", queue, "lj"))
        tail = b"\xff" * 10 + order.to_bytes(2, "big")
        assert pointer + tail + len(pointer).to_bytes(4, "little") == sub.pack_with_versionstamp(
            ("q", queue, "mh", message_id, fdb.tuple.Versionstamp(user_version=order))
        )
        key = pointer + stamp
        assert key == jk.queue_history_key(queue, message_id, stamp)
        assert jk.history_version(key) == stamp
        begin, end = jk.queue_history_range(queue, message_id)
        assert begin <= key < end
        every = jk.queue_history_range(queue)
        assert every[0] <= begin and end <= every[1]
        # inside the queue's keys, right after its counters and before its staged requests and
        # ready range; the earlier place after the delayed range, before the leased records
        assert keys.q.range(("m",)).stop <= every[0] and every[1] <= keys.q.range(("pop",)).start
        assert every[1] <= keys.q.range(("r",)).start
        earlier = jk.earlier_history_range(queue)
        assert keys.q.range(("d",)).stop <= earlier[0] and earlier[1] <= keys.q.range(("f",)).start
        assert jk.queue_history_key(queue, message_id, stamp, "eh") == sub.pack(
            ("q", queue, "eh", message_id, fdb.tuple.Versionstamp(stamp[:10], order))
        )


HOME_KEYS = QueueKeys.make("jobs", ("app", 1))  # one object over every example: its caches fill


@given(st.integers(-(2**31), 2**31 - 1), st.integers(-5, 2**66), st.binary(min_size=8, max_size=8))
def test_home_is_the_ready_key_and_its_id_every_time(priority: int, index: int, rand: bytes) -> None:
    """``home`` (an enqueue's key and id, its priority's prefixes kept after the first) gives
    ``ready_key`` and ``home_id`` for any priority, index (past the inline case's bounds too) and
    random part, on a priority's first message and every later one."""
    for _ in range(2):
        key, mid = HOME_KEYS.home(priority, index, rand)
        assert (
            key
            == HOME_KEYS.ready_key(priority, index, rand)
            == HOME_KEYS.q.pack(("r", -priority, index, rand))
        )
        assert mid == HOME_KEYS.home_id(priority, index, rand)
        assert HOME_KEYS.home_key(mid) == key
