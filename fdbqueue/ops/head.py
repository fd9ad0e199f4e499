"""What a dequeue may hand out: the head of the ready set, or the first match of a filter.

The scans (``scan.py``'s ReadyScan) move aside what they meet that can no longer be
delivered (expired or damaged records) within the transaction's budget (``budget.py``), and
first make ready what came due (a sweep step), so a dequeue never waits for a sweeper.
Every function here composes inside the caller's transaction.
"""

from __future__ import annotations

import struct
import weakref
from collections.abc import Mapping
from operator import itemgetter
from typing import Any

from fdbqueue.engines.contract import KeyValue, Transaction
from fdbqueue.errors import CorruptMessageError, EngineError, QueueError
from fdbqueue.ops import journaling
from fdbqueue.ops.delivery import count_failed_attempt
from fdbqueue.ops.moves.core import count_known, remove_message
from fdbqueue.ops.moves.departures import take_plain
from fdbqueue.ops.moves.places import move_corrupt
from fdbqueue.ops.scan import expire_within, find_match
from fdbqueue.ops.sweep import sweep_step
from fdbqueue.ops.waiting import next_due
from fdbqueue.store.budget import Budget
from fdbqueue.store.config import QueueConfig
from fdbqueue.store.guard import acting_for
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.meta import LEASE_COUNTERS, TAKE_COUNTERS, take_plan
from fdbqueue.store.record import Record, decode_fields, decode_record
from fdbqueue.types import Message

HEAD_SKIP_LIMIT = 100  # expired messages the staged dequeue looks past per pairing batch
HEAD_BATCH = 64  # the head scan reads 1, then 8, then up to this many records at a time
# Kept back from a dequeue's or lease's budget for the message it takes: the leased record
# (at most the value limit) and its index entries.
TAKE_RESERVE = 110_000
KEPT_RUN = 32  # ready records a head read takes for the takes after it (a kept head, below)
KEPT_BYTES = 64 * 1024  # of their values at most
# Kept runs a process holds, the oldest dropped first: at KEPT_BYTES each, 16 MB at most
# however many queues one process takes from (a Worker over a pattern of thousands).
KEPT_QUEUES = 256
KEPT_PAUSE = 16  # takes that read as before once a kept head was found out of date
#: What a take that may use a kept head reads with the metadata (:func:`keeps_head`).
TAKE_KEPT = TAKE_COUNTERS
LEASE_KEPT = LEASE_COUNTERS


def deliverable_head(
    keys: QueueKeys,
    tr: Transaction,
    cfg: QueueConfig,
    where: Mapping[str, Any] | None,
    fallback: bool,
    now: int,
    *,
    check_due: bool = True,
    budget: Budget | None = None,
    start: bytes | None = None,
    kept: list[bytes | None] | None = None,
    clean: list[bool] | None = None,
) -> tuple[bytes, Record] | None:
    """The next deliverable ready message; moves aside expired ones it meets.

    ``check_due``: whether delayed or leased messages may exist (their counters), so that
    what came due is made ready first; when none exist the two index reads are skipped.
    ``budget``: what this transaction may still spend (``fdbqueue/store/budget.py``): expired
    messages it cannot afford to move are passed over and left for a later transaction or
    a sweep, so a live message behind them is still found; ``budget.more`` then says that
    work was left. ``start``: a ready key to scan from (a lease_many's next message).
    ``kept``: the metadata this transaction read (``Meta.raw``) with the ready and wake
    counters (:func:`keeps_head` said to read the wake counter): the head may come from the
    last take's kept run, and this take keeps one for the next. ``clean`` (a list): True is
    put in it when the head was found with nothing moved on the way (nothing made ready by
    the due check, nothing expired or damaged moved aside), so that the counters ``kept``
    holds are still current (the kept path's knowledge; the others say nothing).
    """
    if where is not None and not all(isinstance(name, str) for name in where):
        raise QueueError(f"header names in a filter must be str (as stored), got {list(where)!r}")
    if check_due and next_due(tr, keys, now) is not None:
        budget = Budget(TAKE_RESERVE) if budget is None else budget
        sweep_step(keys, tr, cfg, now, 16, budget)  # due delays and expired leases first
        kept = None  # made ready just now: not what the counters read say
    if cfg.strict_order:
        if where is not None:
            raise QueueError(f"queue {keys.name!r} keeps strict order: dequeue by filter would break it")
        if tr.get_range(*keys.index_range("l"), limit=1):
            return None  # strict order: one delivery in flight at a time
    begin, end = keys.ready_range()
    if where is not None:
        budget = Budget(TAKE_RESERVE) if budget is None else budget
        found = find_match(keys, tr, cfg, begin, dict(where), now, budget)
        if found is None and fallback and not budget.more:  # the scan is over, none matched
            return _head(keys, tr, cfg, begin, end, now, budget)
        return found
    if kept is not None and start is None and not cfg.strict_order and not _stale_twice(tr.db, keys):
        found = take_kept(keys, tr, kept, now)
        if found is not None:
            if clean is not None:
                clean.append(True)
            return found
        # Found out of date twice in a row (another consumer or producer is at work): read the
        # head alone and keep nothing, as the next KEPT_PAUSE takes will (keeps_head, and
        # ops/contended.py), rather than read KEPT_RUN records and keep them over the pause;
        # keeping a run here would also end the pause it just began. Once (this handle's own
        # lease_many, release or enqueue in between, a consumer alone): the run read again.
        if not _stale_twice(tr.db, keys):
            read: list[KeyValue] = []
            found = _head(keys, tr, cfg, begin, end, now, budget, read)
            if found is not None and read:  # the head was the first record read: the rest is next
                keep_run(keys, tr, read, 1, kept, 1, stale=True)
                if clean is not None:
                    clean.append(True)
            return found
    return _head(keys, tr, cfg, start or begin, end, now, budget)


def _begun(budget: Budget | None, kvs: list[KeyValue]) -> Budget:
    """``budget``, or one begun now for a head scan that goes past its first record, with
    that record's read counted (a live head, the common case, needs none)."""
    if budget is not None:
        return budget
    fresh = Budget(TAKE_RESERVE)
    fresh.read(kvs)
    return fresh


def _head(
    keys: QueueKeys,
    tr: Transaction,
    cfg: QueueConfig,
    begin: bytes,
    end: bytes,
    now: int,
    budget: Budget | None,
    read: list[KeyValue] | None = None,
) -> tuple[bytes, Record] | None:
    """The first live ready message from ``begin``, moving expired ones aside within ``budget``.

    Read at snapshot isolation in growing batches (1, 8, 64 records: one round trip when the
    head is live, a few past a run of expired messages), bounded per transaction by the
    budget's read bytes and time; then the read conflict a serializable scan would have
    taken, ``[begin, the key returned]``, is added: a concurrent take of the same message,
    or of an expired one moved here, conflicts as before.

    This is ``ReadyScan(..., sizes=(1, 8, HEAD_BATCH), conflict=RANGE)`` (``scan.py``) written out:
    every dequeue runs it, and the scanner's object and generator cost it instructions
    (``scripts/count_instructions.py``). Change the two together.

    ``read`` (a list): the first read takes KEPT_RUN records, and when the first of them is
    the head, the records read are put in ``read`` (a kept head's next run).
    """
    scan_from = begin
    want = 1
    # The first batch (one record) is a serializable read: the read conflict it takes,
    # [begin, its key] or [begin, end) when there is none, is the very one the scan adds
    # when it stops there, as it does in the common case (a live head, or none): one call
    # less. Later batches are snapshot reads, their conflict added where the scan stops.
    # ``budget`` None (a dequeue in a caller's transaction): one is begun (_begun) only when
    # the scan goes past its first record, which a live head never does.
    first = True
    while True:
        limit = 1 if budget is None else budget.batch(want)  # a first batch: 1 either way
        if first:
            if read is not None:
                limit = KEPT_RUN if budget is None else budget.batch(KEPT_RUN)
            kvs = tr.get_range(begin, end, limit)
            if budget is not None:
                budget.read(kvs)
        else:
            kvs = tr.snapshot.get_range(begin, end, limit)
            budget = _begun(budget, [])  # begun by now (past the first record): for the type
            budget.read(kvs)
        for key, raw in kvs:
            try:
                rec = decode_record(raw, keys, key)
            except CorruptMessageError as exc:
                budget = _begun(budget, kvs)
                move_corrupt(keys, tr, cfg, key, raw, exc, budget)
                first = False
                continue
            if rec.expired(now):
                budget = _begun(budget, kvs)
                expire_within(keys, tr, cfg, key, raw, rec, budget)
                first = False
                continue
            if not first:
                tr.add_read_conflict_range(scan_from, key + b"\x00")
            if rec.extra and int(rec.extra.get("not_before", 0)) > now:  # extra: mostly empty
                return None  # strict order: the head waits out its retry delay
            if first and read is not None:
                read += kvs
            return key, rec
        if len(kvs) < limit:
            if not first:
                tr.add_read_conflict_range(scan_from, end)  # saw the end, as a serializable read would
            return None
        first = False
        budget = _begun(budget, kvs)  # begun already: every record of this batch was moved aside
        begin = kvs[-1].key + b"\x00"
        if budget.scan_exhausted():
            tr.add_read_conflict_range(scan_from, begin)
            budget.more = True  # expired messages beyond this transaction's reading: later
            return None
        want = min(want * 8, HEAD_BATCH)


# -- a head kept between transactions ------------------------------------------------------------
#
# A consumer alone on a queue reads the ready range for every take, though the record after the
# one it took is the next head unless someone changed the ready set. Where transactions cannot
# conflict (the embedded engine) a take reads KEPT_RUN records and keeps those after the one it
# took, for the next take to use in place of its range read while nothing changed the ready set,
# which it tells from counters it reads with the queue's metadata anyway: every message made ready
# adds to the wake counter (moves.put_ready, count_new, enqueuing._plain_step), every one leaving
# subtracts from the ready counter or adds to taken (moves.take, count_leased, remove_message,
# take_short). While they are what the commit that kept the run left, with the same metadata
# version (a fresh random value at every creation: a queue destroyed and made again under its name
# counts from nothing again), the run is still the head of the ready set. A run is kept once that
# commit landed (Transaction.on_finish); another write of the same transaction to the counters, or
# an abort, leaves them different. A run serves one take (taken out, even by an attempt that
# fails), and hands out a record only if a scan would find it live (decoded, not expired, no retry
# delay). Where transactions may conflict (FoundationDB, sim) nothing is kept.


class _Kept:
    """A kept run: the ready records after the last take's, and the ready, taken and wake
    counters (as stored) its commit left; in ``_kept`` once that commit landed; ``expect``,
    what :func:`take_short`'s one read must find (None: the step may not apply)."""

    __slots__ = (
        "db",
        "expect",
        "journal",
        "keys",
        "msg",
        "pause",
        "prio",
        "reads",
        "ready",
        "run",
        "slot",
        "stale",
        "taken",
        "version",
        "wake",
        "who",
    )

    def __init__(
        self,
        db: weakref.ref[Any],
        slot: tuple[int, bytes],
        run: list[KeyValue],
        ready: bytes,
        wake: bytes | None,
        version: bytes | None,
        taken: bytes | None,
    ) -> None:
        self.db = db  # weakly: a closed database is not kept alive (its id may then name another)
        self.slot = slot
        self.run = run
        self.ready = ready
        self.taken = taken  # another handle's or process's take_short counts there alone
        self.wake = wake
        self.version = version  # the queue's metadata version: a queue destroyed and made again
        self.pause = 0
        self.stale = False  # kept by a take that found the run before it out of date (_stale_twice)
        self.prio: tuple[bytes, int] | None = None  # take_short's: a priority's prefix, the priority
        self.expect: list[bytes | None] | None = None  # take_short's (above)
        self.reads: list[bytes] = []  # the keys take_short reads (meta.take_plan's)
        self.journal = False  # whether the queue journals, at ``version``
        self.who: str | None = None  # the principal take_plan decided for (None: an open queue)
        self.keys: QueueKeys | None = None  # the queue's (keep_run's), for :meth:`took`
        self.msg: Message | None = None  # take_short's in a caller's transaction: its message

    def landed(self, error: EngineError | None) -> None:
        """``Transaction.on_finish``: kept once the take's commit landed (the take took it out)."""
        if error is None:
            if len(_kept) >= KEPT_QUEUES and self.slot not in _kept:
                del _kept[next(iter(_kept))]  # the oldest (dicts keep insertion order)
            _kept[self.slot] = self

    def took(self, error: EngineError | None) -> None:
        """:func:`take_short`'s ``on_finish`` in a caller's transaction: :meth:`landed` (inline)
        when its commit landed, else the delivery counted as failed (:func:`failed_take`)."""
        if error is None:
            if self.run:
                if len(_kept) >= KEPT_QUEUES and self.slot not in _kept:
                    del _kept[next(iter(_kept))]
                _kept[self.slot] = self
        else:
            count_failed_attempt(self.keys, self.db(), self.msg, error)  # type: ignore[arg-type]


_kept: dict[tuple[int, bytes], _Kept] = {}


def keeps_head(tr: Transaction, keys: QueueKeys) -> bool:
    """Whether a take in ``tr`` tries a kept head, and so reads the wake counter with its
    metadata: where transactions cannot conflict, unless a kept run of this queue was found out
    of date in the last KEPT_PAUSE takes (another consumer or producer is at work: the longer
    read and the wake counter would only cost)."""
    db = tr.db
    if getattr(db, "may_conflict", True):  # engine_traits' first, as config._read_keys reads it
        return False
    entry = _kept.get((id(db), keys.packed))
    if entry is None or not entry.pause:
        return True
    entry.pause -= 1
    return False


def kept_run(keys: QueueKeys, tr: Transaction, raw: list[bytes | None]) -> _Kept | None:
    """The kept run of this queue on ``tr``'s database (its ``run``: not empty) when it is
    still the head of the ready set (``raw``: the metadata ``tr`` read, through its own writes,
    with the ready and wake counters), else None. Taken out either way: a run serves one take
    (:func:`keep_run` may keep the same entry again for the next, once this take commits)."""
    db = tr.db
    entry = _kept.pop((id(db), keys.packed), None)
    if entry is None or not entry.run or entry.db() is not db:  # (none, or a paused slot's)
        return None
    # The counters say whether the ready set changed; the metadata version, whether it is still
    # the same queue: one destroyed and made again under its name starts its counters from
    # nothing, and they can come back to what the run expects (write_config writes a fresh
    # random version at every creation: store/config.py, bump_metadata_version).
    entry.expect = None  # (used by the long way: keep_run says again what take_short may expect)
    if entry.ready != raw[1] or entry.taken != raw[6] or entry.wake != raw[2] or entry.version != raw[0]:
        entry.run = []
        entry.pause = KEPT_PAUSE
        _kept[id(db), keys.packed] = entry
        return None
    return entry


def take_kept(
    keys: QueueKeys, tr: Transaction, raw: list[bytes | None], now: int
) -> tuple[bytes, Record] | None:
    """:func:`deliverable_head`'s kept head alone, for a take that knows it applies (no filter,
    no start, not strict order, nothing due: the caller checked): the head of the kept run
    when it is still the head of the ready set (``raw``: as :func:`kept_run`) and a scan would
    hand it out as it is, its rest kept for the next take once ``tr`` commits. None: the take
    scans (the run is used up either way), with nothing moved."""
    entry = kept_run(keys, tr, raw)
    if entry is None:
        return None
    key, value = entry.run[0]
    rec = _live(keys, value, key, now)
    if rec is None:
        return None
    # No read conflict to add for the range not read: kept heads are used only where
    # transactions cannot conflict (keeps_head), whose engine records none.
    keep_run(keys, tr, entry.run, 1, raw, 1, entry)  # its rest, in the same entry
    return key, rec


def keep_run(
    keys: QueueKeys,
    tr: Transaction,
    kvs: list[KeyValue],
    taken: int,
    raw: list[bytes | None],
    n: int,
    entry: _Kept | None = None,
    *,
    stale: bool = False,
) -> None:
    """Keep ``kvs[taken:]`` for the next take, once ``tr`` commits, with the counters as this
    take of ``n`` leaves them (``raw``: as it read them); nothing past KEPT_BYTES of values
    (large messages are read when they are taken). ``entry``: the kept run ``kvs`` is (from
    :func:`kept_run`, so out of ``_kept`` and this transaction's alone): kept again with its
    rest, without another object, weak reference or count of its bytes (a tail of a run
    within KEPT_BYTES is within it). ``stale``: kept by a take that found the run before it out
    of date (:func:`_stale_twice`); a run kept again after a take from it is not."""
    run = kvs[taken:]
    ready = raw[1]
    if not run or ready is None or len(ready) != 8:
        return
    if entry is None:
        if sum(map(len, map(_VALUE, run))) > KEPT_BYTES:
            return
        db = tr.db
        try:
            ref = weakref.ref(db)
        except TypeError:  # a database that cannot be weakly referenced: nothing kept
            return
        entry = _Kept(ref, (id(db), keys.packed), run, _PACK(_UNPACK(ready)[0] - n), raw[2], raw[0], raw[6])
        entry.keys = keys
    else:
        entry.run = run
        entry.ready = _PACK(_UNPACK(ready)[0] - n)
        entry.taken = raw[6]
        entry.wake = raw[2]
        entry.version = raw[0]
    entry.stale = stale
    # What take_short's read must find: the counters as this take leaves them, nothing leased
    # or delayed, settings that need none of the dequeue's checks (meta.take_plan).
    inflight, delayed = raw[4], raw[5]
    plan = None
    if (inflight is None or inflight == _ZERO) and (delayed is None or delayed == _ZERO):
        plan = take_plan(tr.db, keys, raw[0])
    if plan is None:
        entry.expect = None
    else:
        entry.reads, entry.journal, entry.who = plan
        entry.expect = [raw[0], entry.ready, raw[2], inflight, delayed, raw[6]]
    tr.on_finish(entry.landed)


_VALUE = itemgetter(1)
_PACK, _UNPACK = struct.Struct("<q").pack, struct.Struct("<q").unpack


def _live(keys: QueueKeys, raw: bytes, key: bytes, now: int) -> Record | None:
    """The record at ``key`` if a scan would hand it out as it is; None: let the scan decide
    (damaged, expired, waiting out a retry delay)."""
    try:
        rec = decode_record(raw, keys, key)
    except CorruptMessageError:
        return None
    if rec.expired(now) or (rec.extra and int(rec.extra.get("not_before", 0)) > now):
        return None
    return rec


def take_counted(
    tr: Transaction, keys: QueueKeys, key: bytes, rec: Record, raw: list[bytes | None], journaled: bool
) -> bool:
    """``moves.take`` with the ready and done counters written as the values ``raw`` (the
    metadata read with them, ``read_meta_for``) holds, less and plus one
    (``moves.count_known``): only where the caller knows nothing wrote them since (a kept
    head's take: ``deliverable_head``'s ``clean``) and transactions cannot conflict. False,
    having written nothing, when the values are not plain counters: the caller takes."""
    found = _taken.get(keys.packed)
    if found is None:
        if len(_taken) > 4096:  # a process taking from very many queues: start again
            _taken.clear()
        found = _taken[keys.packed] = (keys.counter("ready"), keys.counter("done"))
    if len(raw) < 9 or not count_known(tr, found, (raw[1], raw[8]), (-1, 1)):
        return False
    remove_message(tr, keys, key, rec)
    if journaled:
        # moves.take's entry: no Note, no copy of the record for its deliveries
        journaling.record(tr, keys, "dequeue", rec.id, deliveries=rec.deliveries + 1)
    return True


_taken: dict[bytes, tuple[bytes, bytes]] = {}


# -- the common dequeue's own step ----------------------------------------------------------------
#
# Most dequeues in a caller's transaction on the embedded engine are the same: a queue with no
# owner, open, without strict order or a volatile prefix; nothing delayed or leased; the head the
# kept run's first record, without TTL, chunks or extra fields. take_short does that case from one
# read (the metadata version and the counters) compared in one with what the take that kept the
# run left (_Kept.expect: the settings found at that version need none of the dequeue's checks,
# meta.take_plan; the ready set unchanged, as kept_run tells), the record's fields
# (record.decode_fields), the Message from them, two writes (the record cleared, the taken counter
# plus one: every reader takes ready as ready - taken and done as done + taken, store/layout.py)
# and one callback. Any other case, found before anything is written or kept, takes the long way
# (Queue._take): the step is its kept-head take with its choices made, not another rule.


def take_short(keys: QueueKeys, tr: Transaction, in_caller: bool = True) -> Message | None:
    """The next message of a dequeue in ``tr`` in the common case above, taken and counted as
    ``Queue._take``'s kept-head take does; None, having written nothing and with the kept run
    as it was, when the case is another: the caller takes the long way in the same ``tr``.

    Composes inside the caller's transaction: the message is gone when it commits (the rest of
    the kept run kept for the next take then), and back when it does not, the delivery then
    counted as failed (``delivery.count_failed_attempt``) when ``in_caller`` (a caller's
    transaction; a dequeue's own retried one counts none, as ``Queue._take``)."""
    db = tr.db
    slot = (id(db), keys.packed)
    # Taken out first (kept_run's: another thread's take on this handle then scans), put back
    # by _back when the case is another. Kept by a take where nothing conflicts (keeps_head).
    entry = _kept.pop(slot, None)
    if entry is None:
        return None
    expect = entry.expect  # (None for a paused slot's, or where the step may not apply)
    if expect is None or entry.db() is not db or ((who := entry.who) is not None and who != acting_for(db)):
        return _back(slot, entry)  # (or another database's under a reused id, or principal's)
    # One read compared with what keep_run or this step's last take left (the comment above).
    values = tr.snapshot.get_many(entry.reads)
    if values != expect:
        return _back(slot, entry)
    run = entry.run
    key, raw = run[0]
    fields = decode_fields(raw)
    if fields is None:
        return _back(slot, entry)
    msg_id, enqueued_us, content_type, headers, deliveries, expires_us, chunks, extra, payload = fields
    if expires_us is not None or chunks or extra:
        return _back(slot, entry)  # a TTL to check, chunks to read, a retry delay (not_before) or more
    taken = values[5]
    try:  # count_known's arithmetic; not 8 bytes, or past 64 bits: the long way
        taken = _ONE if taken is None else _PACK(_UNPACK(taken)[0] + 1)
    except struct.error:
        return _back(slot, entry)
    # The priority: the run's last one, while the key starts with its encoding (a tuple-encoded
    # int is prefix-free), else decoded from the key.
    known = entry.prio
    if known is None or not key.startswith(known[0]):
        entry.prio = known = keys.priority_prefix(key)
    msg = Message.handed_out(
        keys.name, known[1], key, msg_id, enqueued_us, content_type, headers, deliveries, payload
    )
    # Decided: from here on as the long way writes (remove_message, count_known, take_counted).
    take_plain(tr, keys, key, msg_id, entry.reads[5], taken)  # (moves: the record, its id entry, taken + 1)
    if entry.journal:  # (record's entry for it: no reason, no details)
        journaling.record_short(tr, keys, "dequeue", msg_id, deliveries + 1)
    # keep_run's, in the same entry (its own list, out of _kept until the commit lands: the
    # head dropped in place), with what the next take's read must find.
    del run[0]
    entry.stale = False  # (taken from: not a run kept after one found out of date)
    entry.taken = values[5] = taken
    entry.expect = values
    if in_caller:
        entry.msg = msg
        tr.on_finish(entry.took)  # and the failed delivery counted when it does not land
    elif run:
        tr.on_finish(entry.landed)
    return msg


def _back(slot: tuple[int, bytes], entry: _Kept) -> Message | None:
    """take_short's way out when the case is another (its None): the kept run put back as it
    was (unless another thread's take kept one since), for the long way."""
    _kept.setdefault(slot, entry)
    return None


def failed_take(keys: QueueKeys, db: Any, msg: Message, error: EngineError | None) -> None:
    """``Transaction.on_finish`` of a dequeue in a caller's transaction: a failed delivery."""
    if error is not None:
        count_failed_attempt(keys, db, msg, error)


_ZERO = bytes(8)
_ONE = _PACK(1)


def kept_entry(db: Any, keys: QueueKeys) -> _Kept | None:
    """The kept run of this queue on ``db`` when there is one to use (not empty, not paused),
    left in place, for a step of its own that checks it as :func:`kept_run` does
    (``leasing.lease_short``, as :func:`take_short` here); None otherwise."""
    entry = _kept.get((id(db), keys.packed))
    return None if entry is None or entry.pause or not entry.run else entry


def claim_kept(db: Any, keys: QueueKeys, entry: _Kept) -> bool:
    """Take ``entry`` (from :func:`kept_entry`) out, as :func:`kept_run` does once it is used;
    False when another thread's take on this handle took it since (then the long way)."""
    if _kept.pop((id(db), keys.packed), None) is not entry:
        return False
    entry.expect = None  # (its counters change with this take: not take_short's to expect)
    return True


def _stale_twice(db: Any, keys: QueueKeys) -> bool:
    """After a dequeue's :func:`take_kept` found nothing to take: whether its kept run is paused
    and was itself kept by a take that found the run before it out of date (two in a row:
    other consumers or producers at work), so that the pause holds. A run out of date once
    after takes from it (this handle's own lease_many, release or enqueue in between) is not
    paused: the take reads and keeps a run again, as the take before a pause always did."""
    entry = _kept.get((id(db), keys.packed))
    if entry is None or not entry.pause:
        return False
    if entry.stale:
        return True
    entry.pause = 0
    return False


def kept_paused(db: Any, keys: QueueKeys) -> bool:
    """Whether this queue's kept run on ``db`` is paused (found out of date in the last
    KEPT_PAUSE takes: :func:`kept_run`)."""
    entry = _kept.get((id(db), keys.packed))
    return entry is not None and entry.pause > 0
