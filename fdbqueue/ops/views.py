"""One definition of what a queue holds now, for every view of it.

The counters (``ready``, ``inflight``, ``delayed``) move when a message moves: when a sweep
or a dequeue expires it, promotes it or releases it. Between such a move coming due and the
move being made, the counters still count the message where it was. Every view (``size``,
``empty``, ``peek``, ``nth``, ``browse``, ``queue_stats``, ``all_queue_stats``, the command
line's ``list``, the metrics, the dashboard) reads the counters and corrects them here, by
database time (the transaction's read version), as a sweep at that moment would leave them:

- **expired**: a ready message whose TTL has passed, or a delayed one that has come due
  with its TTL passed. Not ready; counted with the queue's expired total.
- **delayed**: a delayed message not yet due (its TTL is checked when it comes due, as a
  sweep does).
- **ready**: a ready message whose TTL has not passed, and a delayed message that is due
  and not expired (shown where a dequeue will place it).
- **in flight**: a leased message whose lease has not ended.
- **lease ended**: a leased message whose lease has ended. Neither in flight nor ready: the
  next sweep or dequeue releases it, and its retry delay and deliveries decide where it goes
  (ready, delayed or the error queue).

The correction reads the three indexes ordered by deadline (TTL ``x``, delays ``d``, leases
``l``) from their start to now: what is due and not yet swept. Sweeps and dequeues keep that
short, and each read is bounded by :data:`VIEW_SCAN_LIMIT` entries; past it the figures
correct for the earliest entries only and say so (``exact`` False). The indexes are read at
snapshot isolation: a view conflicts with nothing. Composes inside a caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

from fdbqueue.engines.contract import Transaction
from fdbqueue.errors import CorruptMessageError
from fdbqueue.store.clock import db_now
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.meta import Meta
from fdbqueue.store.record import Record, decode_record

VIEW_SCAN_LIMIT = 1000  # due entries of each index a view reads at most (one range read each)


@dataclass(frozen=True)
class Pending:
    """What is due in a queue and not yet swept, at database time ``now``.

    ``expired_ready``: the ready keys whose TTL has passed; ``due``: the due delayed entries
    (key, record) whose TTL has not passed, in due order; ``due_expired``: due delayed
    entries whose TTL has passed; ``lease_ended``: leases whose deadline has passed.
    ``exact``: False when an index held more due entries than :data:`VIEW_SCAN_LIMIT`.
    """

    now: int
    expired_ready: frozenset[bytes]
    due: tuple[tuple[bytes, Record], ...]
    due_expired: int
    lease_ended: int
    exact: bool

    @property
    def none(self) -> bool:
        """Nothing due: the counters and the ready set are the views as they are."""
        return not self.expired_ready and not self.due


@dataclass(frozen=True)
class Counts:
    """A queue's messages by state as every view counts them (module docstring)."""

    ready: int
    delayed: int
    inflight: int
    lease_ended: int
    expired: int  # the queue's expired total, with those expired and not yet moved
    exact: bool


def pending(
    t: Transaction, keys: QueueKeys, meta: Meta, now: int, *, leases: bool = True, ttl: bool = True
) -> Pending:
    """Read what is due and not yet swept in ``keys``' queue (snapshot reads, bounded).

    The delay and lease indexes are read only when their counters say they hold anything;
    ``leases=False`` skips the lease index (views of the ready set need none of it),
    ``ttl=False`` the TTL index (a walk of the ready set checks each record's TTL itself)."""
    snap = t.snapshot
    exact = True
    if not ttl:
        return _due(t, keys, meta, now, frozenset(), exact, leases)
    # Ready messages past their TTL: the TTL index up to now names them by id. A ready one
    # is at its home key, or where its id entry points (a retry back at its place);
    # entries of leased or delayed messages are passed (a sweep drops them too).
    begin, end = keys.index_range("x", now + 1)
    entries = snap.get_range(begin, end, VIEW_SCAN_LIMIT + 1)
    exact = exact and len(entries) <= VIEW_SCAN_LIMIT
    expired: set[bytes] = set()
    if entries and meta.count("ready"):
        ids = [str(keys.unpack_tail(kv.key)[2]) for kv in entries[:VIEW_SCAN_LIMIT]]
        homes = [keys.home_key(i) for i in ids]
        asked = [h for h in homes if h is not None] + [keys.id_key(i) for i in ids]
        found = dict(zip(asked, snap.get_many(asked), strict=True))
        for msg_id, home in zip(ids, homes, strict=True):
            if home is not None and found[home] is not None:
                expired.add(home)
                continue
            where = found[keys.id_key(msg_id)]
            if where is not None and keys.unpack_tail(where)[0] == "r":
                expired.add(where)
    return _due(t, keys, meta, now, frozenset(expired), exact, leases)


def _due(
    t: Transaction,
    keys: QueueKeys,
    meta: Meta,
    now: int,
    expired: frozenset[bytes],
    exact: bool,
    leases: bool,
) -> Pending:
    """:func:`pending`'s read of the delay and lease indexes."""
    snap = t.snapshot
    due: list[tuple[bytes, Record]] = []
    due_expired = 0
    if meta.count("delayed"):
        begin, end = keys.index_range("d", now + 1)
        rows = snap.get_range(begin, end, VIEW_SCAN_LIMIT + 1)
        exact = exact and len(rows) <= VIEW_SCAN_LIMIT
        for kv in rows[:VIEW_SCAN_LIMIT]:
            try:
                rec = decode_record(kv.value, keys, kv.key)
            except CorruptMessageError:
                continue  # a dequeue moves it to the error queue; no view shows it
            if rec.expired(now):
                due_expired += 1
            else:
                due.append((kv.key, rec))
    ended = 0
    if leases and meta.count("inflight"):
        begin, end = keys.index_range("l", now + 1)
        rows = snap.get_range(begin, end, VIEW_SCAN_LIMIT + 1)
        exact = exact and len(rows) <= VIEW_SCAN_LIMIT
        ended = min(len(rows), VIEW_SCAN_LIMIT)
    return Pending(now, expired, tuple(due), due_expired, ended, exact)


def counts(meta: Meta, p: Pending, expired_total: int = 0) -> Counts:
    """The counters of ``meta`` corrected by ``p``: the figures every view shows.
    ``expired_total``: the queue's ``expired`` counter (messages already moved)."""
    due = len(p.due)
    return Counts(
        ready=max(0, meta.count("ready") - len(p.expired_ready) + due),
        delayed=max(0, meta.count("delayed") - due - p.due_expired),
        inflight=max(0, meta.count("inflight") - p.lease_ended),
        lease_ended=p.lease_ended,
        expired=expired_total + len(p.expired_ready) + p.due_expired,
        exact=p.exact,
    )


def due_unswept(t: Transaction, keys: QueueKeys, meta: Meta, now: int, cap: int = 64) -> int:
    """How many TTL and delay entries have come due and not been swept, counted up to ``cap``
    each (one small read of index keys each; the delay index only when messages are delayed).
    0: the ready set is every view as it stands (a key selector finds position n)."""
    snap = t.snapshot
    n = len(snap.get_range(*keys.index_range("x", now + 1), cap)) if meta.count("ready") else 0
    if meta.count("delayed"):
        n += len(snap.get_range(*keys.index_range("d", now + 1), cap))
    return n


def ready_count(t: Transaction, keys: QueueKeys, meta: Meta) -> int:
    """How many messages are ready now (``Queue.size``): the counter, corrected."""
    return counts(meta, pending(t, keys, meta, db_now(t), leases=False)).ready
