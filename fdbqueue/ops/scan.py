"""The ready-set scanner: every walk of a queue's ready messages inside one transaction.

A dequeue's filtered search (:func:`find_match`), the staged dequeue's pairing
(``contention.py``), an exclusive forwarder's peek (``outbox.py``), a browse page
(``browse.py``) and ``move`` (``api/transfer.py``) all read the ready set in key order,
decode each record, deal with the damaged and the expired, and filter by headers.
:class:`ReadyScan` does that once; what differs between them is declared. The two walks
every dequeue and every lease run (``head._head``, ``leasing._ready_heads``) are the same
walk written out, because the scanner's object and generator cost them instructions
(``scripts/count_instructions.py``): each says which declaration it is.

- **batches**: each range read asks for what the caller still ``need``\\ s plus an extra
  (``sizes``: one per read, the last repeated), within the transaction's read budget
  (``Budget.batch``: SCAN_READ_BYTES and SCAN_SECONDS, ``store/budget.py``);
- **bounds**: rows looked at (``row_limit``), rows set aside (``skip_limit``), records
  claimed (``need`` ends the reading, ``limit`` ends the scan at the next row) and the
  payload bytes of those claimed (:meth:`ReadyScan.claim`: BATCH_PAYLOAD_BYTES, the first
  always fits);
- **a damaged record** (its checksum fails): moved aside through the one writer within the
  budget (ASIDE), passed over for a sweep or a consumer to move (SKIP), or raised (RAISE);
- **an expired record**: moved aside within the budget (ASIDE, :func:`expire_within`), or
  passed over (SKIP);
- **the filter**: ``where``, a record's headers (``types.headers_match``);
- **the conflicts** (correctness on FoundationDB, so each walk keeps its own): RANGE adds what
  a serializable range read of the rows walked would have (``[start, key]`` for each record
  yielded, ``[start, end]`` at the end, ``[start, cursor]`` when the read budget is spent);
  KEYS a read conflict key for each expired record moved aside, NONE none (with KEYS and
  NONE the caller adds one for each record it takes: two takers conflict only on the same
  message, FoundationDB's queue recipe). Reads are snapshot reads unless ``snapshot=False``
  (serializable: a browse page). A damaged record moved aside always gets its key
  (``moves.move_corrupt``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from fdbqueue.engines.contract import Transaction
from fdbqueue.errors import CorruptMessageError
from fdbqueue.ops.moves.places import expire, move_corrupt
from fdbqueue.store.budget import BATCH_PAYLOAD_BYTES, CHUNK_BYTES, Budget, move_cost
from fdbqueue.store.config import QueueConfig
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import Record, decode_record
from fdbqueue.types import headers_match

ASIDE, SKIP, RAISE = "aside", "skip", "raise"  # what a damaged or expired record gets
RANGE, KEYS, NONE = "range", "keys", "none"  # the read conflicts a scan adds


def expire_within(
    keys: QueueKeys, tr: Transaction, cfg: QueueConfig, key: bytes, raw: bytes, rec: Record, b: Budget
) -> bool:
    """Move the expired message at ``key`` aside if the budget affords it (its chunks are
    copied when it goes to the error queue); False leaves it in place for later."""
    chunks = rec.chunks if cfg.expiry_action == "error" else 0
    if not b.take(move_cost(len(key), len(raw), chunks)):
        return False
    expire(keys, tr, cfg, key, rec)
    return True


class ReadyScan:
    """One walk of the ready set of ``keys``' queue in ``t`` at database time ``now``: iterate
    it for ``(key, raw, record)`` of each live record that matches (see the module docstring).

    After the walk, ``cursor`` is where a next transaction goes on (None: the end was seen),
    ``exhausted`` whether the transaction's read budget ended it, ``rows`` how many rows it
    looked at and ``skipped`` how many of them were damaged or expired.
    """

    __slots__ = (
        "budget",
        "cfg",
        "check_first",
        "conflict",
        "cursor",
        "damaged",
        "end",
        "exhausted",
        "expired",
        "keys",
        "limit",
        "need",
        "now",
        "payload",
        "row_limit",
        "rows",
        "sizes",
        "skip_limit",
        "skipped",
        "snapshot",
        "t",
        "taken",
        "where",
    )

    def __init__(
        self,
        t: Transaction,
        keys: QueueKeys,
        now: int,
        *,
        cfg: QueueConfig | None = None,
        budget: Budget | None = None,
        begin: bytes | None = None,
        where: Mapping[str, Any] | None = None,
        sizes: tuple[int, ...] = (64,),
        need: int | None = None,
        limit: int | None = None,
        row_limit: int | None = None,
        skip_limit: int | None = None,
        check_first: bool = False,
        damaged: str = ASIDE,
        expired: str = ASIDE,
        conflict: str = NONE,
        snapshot: bool = True,
    ) -> None:
        """``cfg`` and ``budget`` are needed to set records aside (ASIDE). ``need``: records
        the caller still wants, asked for in each read beside ``sizes``; the reading stops
        when claims bring it to 0 (the batch in hand is walked to its end). ``limit``: at
        most this many claims; the row after them ends the scan, unvisited, as ``cursor``.
        ``check_first``: the read budget is checked before each read (a lease batch), not
        after each full one."""
        self.t, self.keys, self.now, self.cfg, self.budget, self.where = t, keys, now, cfg, budget, where
        ready_begin, self.end = keys.ready_range()
        self.cursor: bytes | None = begin or ready_begin
        self.sizes, self.need, self.limit = sizes, need, limit
        self.row_limit, self.skip_limit, self.check_first = row_limit, skip_limit, check_first
        self.damaged, self.expired, self.conflict, self.snapshot = damaged, expired, conflict, snapshot
        self.exhausted = False
        self.rows = self.skipped = self.taken = self.payload = 0

    def __iter__(self) -> Iterator[tuple[bytes, bytes, Record]]:
        t, budget, end, sizes, limit = self.t, self.budget, self.end, self.sizes, self.limit
        ranged = self.conflict == RANGE
        reader = t.snapshot if self.snapshot else t
        start = self.cursor
        assert start is not None
        begin = start
        reads = 0
        while True:
            if self.need is not None and self.need <= 0:
                return
            if self.skip_limit is not None and self.skipped >= self.skip_limit:
                return
            if self.row_limit is not None and self.rows >= self.row_limit:
                return
            if self.check_first and budget is not None and budget.scan_exhausted():
                self.exhausted = True
                return
            want = (self.need or 0) + sizes[min(reads, len(sizes) - 1)]
            ask = want if budget is None else budget.batch(want)
            kvs = reader.get_range(begin, end, ask)
            if budget is not None:
                budget.read(kvs)
            for key, raw in kvs:
                if limit is not None and self.taken >= limit:
                    self.cursor = key  # the first row not visited
                    return
                self.rows += 1
                rec = self.judge(key, raw)
                if rec is not None:
                    if ranged:
                        t.add_read_conflict_range(start, key + b"\x00")
                    yield key, raw, rec
            if len(kvs) < ask:
                if ranged:
                    t.add_read_conflict_range(start, end)  # saw the end, as a serializable read would
                self.cursor = None
                return
            begin = self.cursor = kvs[-1].key + b"\x00"
            if not self.check_first and budget is not None and budget.scan_exhausted():
                if ranged:
                    t.add_read_conflict_range(start, begin)
                self.exhausted = True
                return
            reads += 1

    def judge(self, key: bytes, raw: bytes) -> Record | None:
        """The record at ``key`` if it is live and matches; a damaged or expired one is dealt
        with as declared and counted in ``skipped``, one that does not match passed over."""
        try:
            rec = decode_record(raw, self.keys, key)
        except CorruptMessageError as exc:
            if self.damaged == RAISE:
                raise
            if self.damaged == ASIDE:
                assert self.cfg is not None
                move_corrupt(self.keys, self.t, self.cfg, key, raw, exc, self.budget)
            self.skipped += 1
            return None
        if rec.expired(self.now):
            if self.expired == ASIDE:
                assert self.cfg is not None and self.budget is not None
                moved = expire_within(self.keys, self.t, self.cfg, key, raw, rec, self.budget)
                if moved and self.conflict == KEYS:
                    self.t.add_read_conflict_key(key)  # two movers of one message conflict
            self.skipped += 1
            return None
        if self.where is not None and not headers_match(rec.headers, self.where):
            return None
        return rec

    def claim(self, rec: Record | None = None) -> bool:
        """Count a record the caller takes. Given ``rec``, False (nothing counted) when its
        payload chunks would take those claimed past BATCH_PAYLOAD_BYTES: a batch of large
        messages is split, the first always goes."""
        if rec is not None:
            size = self.payload + rec.chunks * CHUNK_BYTES
            if self.taken and size > BATCH_PAYLOAD_BYTES:
                return False
            self.payload = size
        self.taken += 1
        if self.need is not None:
            self.need -= 1
        return True


FILTER_SCAN_LIMIT = 10_000  # dequeue(where=...) looks at most this many messages, over all transactions
FILTER_BATCH = 100


def find_match(
    keys: QueueKeys,
    tr: Transaction,
    cfg: QueueConfig,
    begin: bytes,
    where: dict[str, Any],
    now: int,
    budget: Budget,
) -> tuple[bytes, Record] | None:
    """The oldest ready message whose headers match ``where`` (a dequeue's filtered search:
    ``head.deliverable_head``, which takes the oldest live message instead when the scan is
    over with ``budget.more`` False and the caller asked for a fallback).

    Snapshot batches from ``budget.resume`` (or the head), at most SCAN_READ_BYTES and
    SCAN_SECONDS per transaction and FILTER_SCAN_LIMIT messages in all; a match is taken
    with a read conflict on its key alone (a serializable point read of it at this
    transaction's read version), so only a concurrent take of the same message conflicts.
    Where the per-transaction bound is reached first, ``budget.resume`` and ``budget.more``
    say where the next transaction goes on (a dequeue given a Database does so; in a
    caller's transaction the dequeue returns None).
    """
    scan = ReadyScan(
        tr,
        keys,
        now,
        cfg=cfg,
        budget=budget,
        begin=budget.resume or begin,
        where=where,
        sizes=(FILTER_BATCH,) if budget.read_rows else (8, FILTER_BATCH),
        row_limit=FILTER_SCAN_LIMIT - budget.scanned,
        conflict=KEYS,
    )
    for key, _raw, rec in scan:
        budget.scanned += scan.rows
        tr.add_read_conflict_key(key)
        budget.resume = None
        return key, rec
    budget.scanned += scan.rows
    if scan.exhausted:
        budget.resume = scan.cursor
        budget.more = True
        return None
    budget.resume = None
    budget.more = False  # the scan is over: what it left is a sweep's
    return None
