"""The common dequeue and lease among other consumers: their own steps while the kept head is
paused.

A consumer alone takes its head from the run its last take kept (``ops/head.py``,
``take_short``: one read, two writes). Where other consumers or producers are at work - four
processes draining one queue - the run is out of date at almost every take, so ``kept_run``
pauses keeping for ``KEPT_PAUSE`` takes, and those takes went the long way
(``Queue._take``): the metadata read through ``read_meta_for``, the settings checked again,
the head found by ``deliverable_head``, the ready and done counters written as read. On the
embedded engine every transaction holds the store lock from its first read to its commit, so
that Python is paid once per message *by all the processes*: the lock's holder runs it while
the others wait.

:func:`take_contended` does the paused case in the same few steps as ``take_short``, with a
read of the head in place of the kept run: the metadata version and the counters in one read
(``meta.read_take``: the settings this process last found for the queue, while they are the
queue's at that version and need none of the dequeue's checks for this principal), nothing
leased or delayed (no due check to make), the head alone (one record, a snapshot read: where
this runs nothing conflicts), its fields (``record.decode_fields``), and the writes of
``take_short``: the record cleared, the taken counter plus one (every reader takes ready as
ready - taken and done as done + taken: ``store/layout.py``), the journal's entry. Any other
case, found before anything is written, takes the long way in the same transaction, which
reads again and acts as it always did: the step is the long way's take with its choices made,
not another rule.

:func:`lease_contended` is the same for a lease of one (``Queue.lease(db)``), beside
``leasing.lease_short``: the metadata version and the counters in one read, the lease index
where leases are in flight (one may have expired), the head alone, then ``lease_short``'s
writes - the record leased and written in one pass (``record.lease_plain``), five writes in one
call (``moves.put_leased_one``), the ready and in-flight counters set to what was read less and
plus one, the lease's journal entry on a journaled queue. A rate limit to take tokens from, a
delay that may be due, a head not in the common shape: the long way (``leasing.lease_batch``).
"""

from __future__ import annotations

import struct
from functools import partial

from fdbqueue.engines.contract import Transaction
from fdbqueue.ops import journaling, ratelimit
from fdbqueue.ops.head import _ONE, _PACK, _UNPACK, _ZERO, _kept, failed_take
from fdbqueue.ops.lease_one import lease_counts, prepare_lease, write_lease
from fdbqueue.ops.moves.departures import take_plain
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.meta import read_take
from fdbqueue.store.record import decode_fields
from fdbqueue.types import Message


def take_contended(keys: QueueKeys, tr: Transaction, in_caller: bool = True) -> Message | None:
    """The next message of a dequeue in ``tr`` while this handle's kept head of the queue is
    paused (the case above), taken and counted as ``Queue._take`` takes it; None, having
    written nothing, when the case is another (no pause, settings to check, a lease or delay
    that may be due, a head with a TTL, chunks or extra fields, damage, nothing ready): the
    caller takes the long way in the same ``tr``. Counts one take of the pause, as the long
    way's ``keeps_head`` does, so that the pause ends.

    Composes inside the caller's transaction: the message is gone when it commits and back
    when it does not, the delivery then counted as failed (``delivery.count_failed_attempt``)
    when ``in_caller`` (a caller's transaction; a dequeue's own retried one counts none)."""
    db = tr.db
    entry = _kept.get((id(db), keys.packed))
    if entry is None or not entry.pause or entry.db() is not db:
        return None  # (no pause: take_short's or the long way's; or another database's under a reused id)
    # One read: the metadata version and the counters, while the settings this process found
    # at that version need none of the dequeue's checks for this principal (read_take).
    found = read_take(tr, keys)
    if found is None:
        return None
    values, settings, read = found  # version, ready, wake, inflight, delayed, taken (and their keys)
    inflight, delayed, taken = values[3], values[4], values[5]
    if (inflight is not None and inflight != _ZERO) or (delayed is not None and delayed != _ZERO):
        return None  # a lease may have expired or a delay come due: the long way's due check
    begin, end = keys.ready_range()
    head = tr.snapshot.get_range(begin, end, 1)  # (nothing conflicts here: no range to record)
    if not head:
        return None  # nothing ready: the long way says so (and watches, for a blocking dequeue)
    key, raw = head[0]
    fields = decode_fields(raw)
    if fields is None:
        return None  # damaged, or not a plain record: the long way moves it aside
    msg_id, enqueued_us, content_type, headers, deliveries, expires_us, chunks, extra, payload = fields
    if expires_us is not None or chunks or extra:
        return None  # a TTL to check, chunks to read, a retry delay (not_before) or more
    try:  # count_known's arithmetic; not 8 bytes, or past 64 bits: the long way
        taken = _ONE if taken is None else _PACK(_UNPACK(taken)[0] + 1)
    except struct.error:
        return None
    msg = Message.handed_out(
        keys.name, keys.priority_of(key), key, msg_id, enqueued_us, content_type, headers, deliveries, payload
    )
    # Decided: from here on as take_short writes.
    take_plain(tr, keys, key, msg_id, read[5], taken)  # (moves: the record, its id entry, taken + 1)
    if settings.config.journal:  # type: ignore[union-attr]  # (read_take: a config)
        journaling.record_short(tr, keys, "dequeue", msg_id, deliveries + 1)
    entry.pause -= 1  # (keeps_head's count: the pause ends after KEPT_PAUSE takes, whichever way)
    if in_caller:
        tr.on_finish(partial(failed_take, keys, db, msg))
    return msg


def lease_contended(keys: QueueKeys, tr: Transaction, seconds: float | None, receipt: str) -> Message | None:
    """A lease of one message in ``tr`` under ``receipt + ".0"`` for ``seconds`` (None: the
    queue's lease_seconds) while this handle's kept head of the queue is paused (the case
    above), leased and counted as ``leasing.lease_batch(keys, tr, seconds, receipt, 1)`` leases
    it; None, having written nothing, when the case is another (no pause, settings to check, a
    rate limit, a delay or a lease that may be due, a head with headers, a TTL, chunks or extra
    fields, damage, nothing ready): the caller takes the long way in the same ``tr``. Counts
    one lease of the pause, as the long way's ``keeps_head`` does, so that the pause ends.
    Composes inside the caller's transaction."""
    db = tr.db
    entry = _kept.get((id(db), keys.packed))
    if entry is None or not entry.pause or entry.db() is not db:
        return None  # (no pause: lease_short's or the long way's; or another database's under a reused id)
    found = read_take(tr, keys)  # (no owner, or one who granted it; open, not strict or volatile)
    if found is None:
        return None
    values, settings, read = found  # version, ready, wake, inflight, delayed, taken (and their keys)
    ready, inflight, delayed = values[1], values[3], values[4]
    cfg = settings.config
    if (delayed is not None and delayed != _ZERO) or ready is None or cfg is None or ratelimit.limited(cfg):
        return None  # a delay may be due (the long way's due check); a rate limit's tokens to take
    now = int(tr.get_read_version())  # db_now where nothing conflicts: the read version
    counts = lease_counts(keys, tr, ready, inflight, now)
    if counts is None:
        return None
    head = tr.snapshot.get_range(*keys.ready_range(), 1)  # (nothing conflicts here: no range to record)
    if not head:
        return None  # nothing ready: the long way says so (and watches, for a blocking lease)
    prepared = prepare_lease(head[0][0], head[0][1], seconds, cfg, now, receipt)
    if prepared is None:
        return None
    # Decided: from here on as lease_short writes (lease_one.write_lease).
    entry.pause -= 1  # (keeps_head's count: the pause ends after KEPT_PAUSE leases, whichever way)
    return write_lease(keys, tr, prepared, (read[1], read[3]), counts)


__all__ = ["lease_contended", "take_contended"]
