"""The queue manager's moves: a queue destroyed or purged, a message deleted by id in whatever
state it is, a ready message moved to another queue, a dead letter redriven. Part of the one
writer of message state (``fdbqueue.ops.moves``): every function composes inside the caller's
transaction.
"""

from __future__ import annotations

from fdbqueue.engines.contract import Transaction
from fdbqueue.errors import CorruptMessageError
from fdbqueue.ops import journaling, workindex
from fdbqueue.ops.moves.core import Note, after, copy_chunks, remove_message
from fdbqueue.ops.moves.leases import end_lease
from fdbqueue.ops.moves.places import put_ready, take_delayed
from fdbqueue.store.codec import pack_count, unpack_count
from fdbqueue.store.config import bump_metadata_version
from fdbqueue.store.layout import QueueKeys, ready_count
from fdbqueue.store.record import Record, decode_record


def destroy(tr: Transaction, keys: QueueKeys, *, journaled: bool = False) -> None:
    """Remove the queue and every key it has: messages, indexes, counters, settings (its
    journal stays, until trimmed, with what of it is kept in the queue's keys on the embedded
    engine: the consuming operations' and the arrivals' history pointers, the entries and the
    bell, ``JournalKeys.queue_kept_ranges``)."""
    if journaled:
        journaling.record(tr, keys, "destroy")
    begin, end = keys.all_range()
    # (the kept range's end not named ``after``: that is the move's follow-up, imported here)
    for kept, kept_end in keys.journal_keys().queue_kept_ranges(keys.name):
        tr.clear_range(begin, kept)
        begin = kept_end
    tr.clear_range(begin, end)
    tr.clear(keys.listing)
    workindex.unmark(tr, keys)


def purge(tr: Transaction, keys: QueueKeys) -> int:
    """Remove every message (ready, leased, delayed) and its indexes, keeping the settings;
    returns how many the counters said there were.

    Range clears, a few hundred bytes whatever the queue holds (a range clear counts its
    begin and end only: ``Transaction::getSize`` in ``fdbclient/NativeAPI.actor.cpp``). The
    counters are read at snapshot isolation: every enqueue and dequeue adds to them
    atomically, and a serializable read would make each of those adds conflict with the
    purge, which then never commits on a busy queue. Setting them to zero stays right
    whatever was added meanwhile: the same commit clears every message they count. The taken
    counter (layout.py: ready less it, done plus it) is folded into done and zeroed, so that
    the ready count starts from zero again; only the embedded engine writes it, where nothing
    conflicts (head.take_short), so what is read of it is what is there. So for the counted
    counter (ready plus wake less it: enqueuing._plain_step): cleared, the ready count is the
    ready counter's again (zero).
    """
    removed = 0
    taken, wake, counted = tr.snapshot.get_many([keys.counter(c) for c in ("taken", "wake", "counted")])
    for tag in ("ready", "inflight", "delayed"):
        raw = tr.snapshot.get(keys.counter(tag))
        removed += ready_count(raw, taken, wake, counted) if tag == "ready" else max(0, unpack_count(raw))
        tr.set(keys.counter(tag), pack_count(0))
    if taken is not None and unpack_count(taken):
        tr.add(keys.counter("done"), pack_count(unpack_count(taken)))
        tr.set(keys.counter("taken"), pack_count(0))
    if counted is not None:
        tr.clear(keys.counter("counted"))
    for begin, end in keys.message_ranges():
        tr.clear_range(begin, end)
    tr.clear_range(*keys.priority_marker_range())
    bump_metadata_version(tr, keys)
    return removed


def purge_some(tr: Transaction, keys: QueueKeys, limit: int) -> tuple[int, bool]:
    """A journaled queue's purge, one step: remove up to ``limit`` messages one by one, each
    journaled ``purge`` (so that its history ends there); returns how many, and whether
    more are left. A damaged record (no id to journal) is left to :func:`purge`'s clears."""
    n = 0
    for tag in ("r", "f", "d"):
        r = keys.q.range((tag,))
        kvs = tr.get_range(r.start, r.stop, limit - n + 1)
        for kv in kvs[: limit - n]:
            try:
                rec = decode_record(kv.value, keys, kv.key)
            except CorruptMessageError:
                continue
            if tag == "r":
                remove_message(tr, keys, kv.key, rec, count="ready")
            elif tag == "f":
                end_lease(tr, keys, rec)
                remove_message(tr, keys, kv.key, rec)  # its chunks and TTL entry
            else:
                take_delayed(tr, keys, kv.key, rec, expired=True)
                remove_message(tr, keys, kv.key, rec)
            after(tr, keys, True, Note("purge"), rec)
            n += 1
        if len(kvs) > limit - n or n >= limit:
            return n, True
    return n, False


def move_message(
    tr: Transaction,
    src: QueueKeys,
    src_journaled: bool,
    dst: QueueKeys,
    dst_journaled: bool,
    key: bytes,
    rec: Record,
) -> None:
    """Move the ready message at ``key`` of ``src`` to the tail of its priority in ``dst``,
    keeping its id, headers, priority, payload (its chunks copied), enqueue time, TTL and
    deliveries: the queue manager's forwarding between two queues, one transaction
    (Bernstein & Newcomer). Journaled ``move_out`` in ``src`` and ``move_in`` in ``dst``."""
    copy_chunks(tr, src, dst, rec)
    remove_message(tr, src, key, rec, count="ready")  # its chunks with it
    if src_journaled:
        after(tr, src, True, Note("move_out", None, {"to": dst.name}), rec)
    note = Note("move_in", None, {"origin": src.name})
    put_ready(tr, dst, None, rec, src.priority_of(key), journaled=dst_journaled, note=note)


def redrive_message(
    tr: Transaction,
    src: QueueKeys,
    src_journaled: bool,
    dst: QueueKeys,
    dst_journaled: bool,
    key: bytes,
    rec: Record,
) -> None:
    """Put the dead letter at ``key`` of error queue ``src`` back to work in ``dst``: at the
    tail of the priority it had, deliveries reset, its dead-letter fields dropped; payload
    (chunks copied), id, headers and enqueue time kept. Journaled ``redrive`` in both."""
    copy_chunks(tr, src, dst, rec)
    remove_message(tr, src, key, rec, count="ready")
    if src_journaled:
        after(tr, src, True, Note("redrive", None, {"to": dst.name}), rec)
    back = rec.with_(deliveries=0, extra={})
    note = Note("redrive", None, {"origin": src.name})
    put_ready(tr, dst, None, back, int(rec.extra.get("priority", 0)), journaled=dst_journaled, note=note)


def delete_message(tr: Transaction, keys: QueueKeys, key: bytes, rec: Record, *, journaled: bool) -> None:
    """Remove the message at ``key`` in whichever state it is (ready, leased, delayed) with
    its indexes and chunks; a leased one's holder then finds its lease gone. Journaled
    ``delete``."""
    tag = keys.unpack_tail(key)[0]
    if tag == "f":
        end_lease(tr, keys, rec)
        remove_message(tr, keys, key, rec)
    elif tag == "d":
        take_delayed(tr, keys, key, rec)
        remove_message(tr, keys, key, rec)
    else:
        remove_message(tr, keys, key, rec, count="ready")
    after(tr, keys, journaled, Note("delete"), rec)
