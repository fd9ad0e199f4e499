"""Reading queue contents in bulk, in parallel pieces: what the Spark data source
(``fdbqueue.spark``) runs, and nothing of Spark itself.

A queue's messages live in three key ranges - ready, leased (in flight), delayed - and its dead
letters in its error queue's ready range (layout.py). ``plan`` cuts each range into pieces of
at most ``split`` messages, finding the cut points with key selectors (``get_key`` with an
offset: one round trip a cut, no record read), so that a large queue is read by many tasks at
once. ``read_piece`` reads one piece in transactions of at most ``PAGE`` records each, well
inside FoundationDB's 5-second window (``budget.py``), resuming after the last key it read.

The rows of one piece are consistent per transaction, not across the whole read: a message
that moves while the read runs (a worker drains the queue) may be seen in two places or in
none, as a scan of a live table would see it.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fdbqueue.api.admin import is_pattern, list_queues
from fdbqueue.api.routing import partitioned_queues
from fdbqueue.engines import open_database
from fdbqueue.engines.contract import Database, KeySelector, Transaction
from fdbqueue.errors import CorruptMessageError, QueueError
from fdbqueue.ops.journaling import decode_entry, journaled_queues
from fdbqueue.ops.privileges import check
from fdbqueue.ops.reading import expires_at, read_payloads
from fdbqueue.ops.txn import run_once
from fdbqueue.store.budget import CHUNK_BYTES, SCAN_READ_BYTES
from fdbqueue.store.config import read_config
from fdbqueue.store.layout import DEFAULT_ROOT, STATE_TAGS, JournalKeys, QueueKeys
from fdbqueue.store.record import Record, decode_record

PAGE = 500  # records a read transaction returns at most
SPLIT = 20_000  # messages a piece holds at most
COLUMNS = (
    "queue string, id string, state string, priority int, enqueued_at timestamp, deliveries int, "
    "headers map<string,string>, payload binary, content_type string, reason string, origin string, "
    "expires_at timestamp"
)
JOURNAL_COLUMNS = (
    "version binary, at timestamp, op string, queue string, message_id string, principal string, "
    "deliveries int, reason string, details string"
)
_UTC = datetime.timezone.utc


@dataclass(frozen=True)
class Piece:
    """A part of one queue's range of one state: ``[begin, end)``."""

    queue: str
    state: str  # "ready", "leased", "delayed", "dead"
    begin: bytes
    end: bytes


def option_root(options: dict[str, str]) -> tuple[Any, ...]:
    """The data source's option ``root``: a JSON list (default ``["fdbqueue"]``)."""
    raw = options.get("root")
    if raw is None:
        return DEFAULT_ROOT
    try:
        root = json.loads(raw)
    except ValueError:
        raise QueueError(f"option root must be a JSON list, got {raw!r}") from None
    if not isinstance(root, list) or not root:
        raise QueueError(f"option root must be a non-empty JSON list, got {raw!r}")
    return tuple(root)


def open_from(options: dict[str, str]) -> Database:
    """The database the data source's options ``url`` and ``principal`` name."""
    url = options.get("url")
    if not url:
        raise QueueError('the fdbqueue data source needs .option("url", ...)')
    return open_database(url, principal=options.get("principal"))


def queue_names(db: Database, spec: str | list[str], *, root: tuple[Any, ...] = DEFAULT_ROOT) -> list[str]:
    """The queues ``spec`` names: one name, a list, a pattern (``fnmatch``), or a partitioned
    queue's name (its partitions); each with its error queue when it has one."""
    existing = list_queues(db, root=root)
    partitioned = partitioned_queues(db, root=root)
    names: list[str] = []
    for one in [spec] if isinstance(spec, str) else list(spec):
        if not isinstance(one, str) or not one:
            raise QueueError(f"queue must be a name, a list of names or a pattern, got {spec!r}")
        parts = partitioned.get(one)
        if is_pattern(one):
            names += [n for n in existing if fnmatch.fnmatchcase(n, one)]
        elif parts is not None:
            names += [f"{one}.p{i}" for i in range(parts) if f"{one}.p{i}" in existing]
        elif one in existing:
            names.append(one)
        else:
            raise QueueError(f"no queue named {one!r}")
    out: list[str] = []
    errors = error_queues(db, names, root=root)
    for name in names:
        if name not in out:
            out.append(name)
        err = errors.get(name)
        if err is not None and err != name and err in existing and err not in out:
            out.append(err)
    for name in out:  # the messages of each are read: browse on each (AccessDeniedError)
        _may_browse(db, QueueKeys.make(name, root))
    return out


def plan(
    db: Database, names: list[str], *, split: int = SPLIT, root: tuple[Any, ...] = DEFAULT_ROOT
) -> list[Piece]:
    """The pieces to read ``names`` in: each state's range of each queue, cut every ``split``
    messages (an error queue's ready messages read as ``dead``)."""
    if isinstance(split, bool) or not isinstance(split, int) or split < 1:
        raise QueueError(f"split must be an int >= 1, got {split!r}")
    errors = set(error_queues(db, names, root=root).values())
    pieces: list[Piece] = []
    for name in names:
        keys = QueueKeys.make(name, root)
        _may_browse(db, keys)  # its ranges' sizes are its figures
        for state in STATE_TAGS:
            begin, end = keys.state_range(state)
            if state == "ready" and name in errors:
                state = "dead"
            for lo, hi in _cuts(db, begin, end, split):
                pieces.append(Piece(name, state, lo, hi))
    return pieces


def error_queues(db: Database, names: list[str], *, root: tuple[Any, ...] = DEFAULT_ROOT) -> dict[str, str]:
    """Where each of ``names`` dead-letters (its error queue), for those that have settings:
    one transaction for all of them."""

    def body(t: Transaction, _: bool) -> dict[str, str]:
        out = {}
        for name in names:
            cfg = read_config(t, QueueKeys.make(name, root))
            if cfg is not None:
                out[name] = cfg.error_queue_for(name)
        return out

    return run_once(db, body)


def _cuts(db: Database, begin: bytes, end: bytes, split: int) -> list[tuple[bytes, bytes]]:
    """``[begin, end)`` cut every ``split`` keys: key selectors, one round trip a cut."""
    out = []
    lo = begin
    while True:

        def step(t: Transaction, _: bool, lo: bytes = lo) -> bytes:
            key: bytes = t.snapshot.get_key(KeySelector.first_greater_or_equal(lo) + split)
            return key

        hi = run_once(db, step)
        if hi >= end or hi <= lo:
            out.append((lo, end))
            return out
        out.append((lo, hi))
        lo = hi


Row = tuple[Any, ...]


def read_piece(db: Database, piece: Piece, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> Iterator[Row]:
    """The rows of ``piece`` (the columns of ``COLUMNS``), in key order, a transaction a page.
    The piece's range must lie inside its queue's range for its state (QueueError): the right
    checked is the named queue's, so the range may not reach into another's."""
    keys = QueueKeys.make(piece.queue, root)
    state = _PIECE_STATES.get(piece.state) if isinstance(piece.state, str) else None
    if state is None:
        raise QueueError(f"a piece's state is one of {sorted(_PIECE_STATES)}, got {piece.state!r}")
    _inside(piece, *keys.state_range(state))
    cursor = piece.begin
    while True:

        def page(t: Transaction, _: bool, cursor: bytes = cursor) -> tuple[list[Row], bytes | None]:
            check(t, keys, "browse")  # each page: a revoke takes effect at the next one
            kvs = t.snapshot.get_range(cursor, piece.end, PAGE)
            more = kvs[-1].key + b"\x00" if len(kvs) == PAGE else None
            # The records first, then every chunk of the chunked ones in one get_many (one
            # round trip on FoundationDB, not a range read per message), as far as a
            # transaction's share of bytes goes: the page ends before the record past it.
            recs: list[tuple[bytes, Record | None]] = []
            chunk_bytes = 0
            for kv in kvs:
                try:
                    rec: Record | None = decode_record(kv.value, keys, kv.key)
                except CorruptMessageError:
                    rec = None  # the queue's own consumers move it aside; an export shows what is sound
                if rec is not None and rec.chunks:
                    if recs and chunk_bytes + rec.chunks * CHUNK_BYTES > SCAN_READ_BYTES:
                        more = kv.key
                        break
                    chunk_bytes += rec.chunks * CHUNK_BYTES
                recs.append((kv.key, rec))
            payloads, damaged = read_payloads(t, keys, [rec for _, rec in recs if rec is not None])
            rows = [
                _row(t, keys, piece, key, rec, payloads.get(rec.id, rec.payload))
                for key, rec in recs
                if rec is not None and rec.id not in damaged
            ]
            return rows, more

        rows, nxt = run_once(db, page)
        yield from rows
        if nxt is None:
            return
        cursor = nxt


# A piece's states: layout.py's message states, and "dead" (an error queue's ready range).
_PIECE_STATES = {**{state: state for state in STATE_TAGS}, "dead": "ready"}


def _inside(piece: Piece, lo: bytes, hi: bytes) -> None:
    """Refuse a piece whose range is not inside ``[lo, hi)`` (a piece made by hand, or forged)."""
    b, e = piece.begin, piece.end
    if not (isinstance(b, bytes) and isinstance(e, bytes) and lo <= b <= e <= hi):
        raise QueueError(
            f"the piece's range lies outside queue {piece.queue!r}'s {piece.state} range: a piece is "
            "read only within the queue it names (make pieces with plan() or journal_plan())"
        )


def _row(t: Transaction, keys: QueueKeys, piece: Piece, key: bytes, rec: Record, payload: bytes) -> Row:
    if piece.state in ("ready", "dead"):
        priority = keys.priority_of(key)
    elif piece.state == "leased" and "key" in rec.extra:
        priority = keys.priority_of(bytes.fromhex(str(rec.extra["key"])))
    else:
        priority = int(rec.extra.get("priority", 0))
    reason = rec.extra.get("reason")
    origin = rec.extra.get("origin")
    deliveries = int(rec.extra.get("deliveries", rec.deliveries)) if piece.state == "dead" else rec.deliveries
    return (
        piece.queue,
        rec.id,
        piece.state,
        priority,
        datetime.datetime.fromtimestamp(rec.enqueued_us / 1e6, _UTC),
        deliveries,
        {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in rec.headers.items()},
        payload,
        _CONTENT_TYPE.get(rec.content_type, rec.content_type),
        None if reason is None else str(reason),
        None if origin is None else str(origin),
        _expires_at(t, rec),
    )


_CONTENT_TYPE = {"b": "bytes", "t": "text", "j": "json"}


def _expires_at(t: Transaction, rec: Record) -> datetime.datetime | None:
    at = expires_at(t, rec)  # TTLs are kept in database time: an estimate by this clock
    return None if at is None else datetime.datetime.fromtimestamp(at, _UTC)


# -- the journal -----------------------------------------------------------------------------------


def journal_plan(
    db: Database,
    spec: str,
    *,
    since: bytes | None = None,
    until: bytes | None = None,
    split: int = SPLIT,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> list[Piece]:
    """The pieces to read the journal of ``spec`` (a queue, a pattern, or ``"*"``: every
    journaled queue) in: each queue's shards, from after ``since`` to before ``until``
    (versions), cut every ``split`` entries. The principal needs ``browse`` on each queue."""
    jk = JournalKeys.make(root)
    pieces = []
    shards = jk.shards(not getattr(db, "may_conflict", True))  # the queue's own range too (embedded)
    for name in journal_names(db, spec, root=root):
        for shard in shards:
            begin, end = jk.entry_range(name, shard, since)
            if until is not None:
                end = min(end, jk.entry_key(name, shard, until))
            if begin < end:
                pieces += [Piece(name, "journal", lo, hi) for lo, hi in _cuts(db, begin, end, split)]
    return pieces


def journal_names(db: Database, spec: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> list[str]:
    """The journaled queues ``spec`` names (a queue, a pattern, ``"*"``, or a comma-separated
    list of them); the principal needs ``browse`` on each (AccessDeniedError)."""
    journaled = journaled_queues(db, root=root)
    names: list[str] = []
    for one in (s.strip() for s in spec.split(",")):
        pattern = is_pattern(one)
        found = [n for n in journaled if n == one or (pattern and fnmatch.fnmatchcase(n, one))]
        if not found and not pattern:
            raise QueueError(f"no journal for queue {one!r} (journal=True on create_queue keeps one)")
        names += [n for n in found if n not in names]
    for name in names:
        _may_browse(db, QueueKeys.make(name, root))
    return names


def journal_head(db: Database, names: list[str], *, root: tuple[Any, ...] = DEFAULT_ROOT) -> bytes | None:
    """The version of the newest journal entry of ``names`` (None: none), read in one
    transaction: every entry up to it is visible then, and any entry committed later has a
    higher version (versionstamps follow commit order), so a reader that has read up to the
    head and goes on after it misses nothing."""
    jk = JournalKeys.make(root)

    def body(t: Transaction, _: bool) -> bytes | None:
        head = None
        for name in names:
            check(t, QueueKeys.make(name, root), "browse")
            for shard in jk.shards(not getattr(t.db, "may_conflict", True)):
                last = t.snapshot.get_range(*jk.entry_range(name, shard, None), limit=1, reverse=True)
                if last:
                    v = jk.entry_version(last[0].key)
                    head = v if head is None or v > head else head
        return head

    return run_once(db, body)


def _may_browse(db: Database, keys: QueueKeys) -> None:
    def body(t: Transaction, _: bool) -> None:
        check(t, keys, "browse")

    run_once(db, body)


def read_journal_piece(db: Database, piece: Piece, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> Iterator[Row]:
    """The journal entries of ``piece`` as rows of ``JOURNAL_COLUMNS``, a transaction a page.
    The piece's range must lie inside one shard of its queue's journal (QueueError)."""
    jk = JournalKeys.make(root)
    keys = QueueKeys.make(piece.queue, root)
    if piece.state != "journal":
        raise QueueError(f"a journal piece's state is 'journal', got {piece.state!r}")
    shards = [jk.entry_range(piece.queue, shard, None) for shard in jk.shards(True)]  # every place
    shard = [(lo, hi) for lo, hi in shards if isinstance(piece.begin, bytes) and lo <= piece.begin < hi]
    _inside(piece, *(shard[0] if shard else shards[0]))
    cursor = piece.begin
    while True:

        def page(t: Transaction, _: bool, cursor: bytes = cursor) -> tuple[list[Row], bytes | None]:
            check(t, keys, "browse")  # each page: a revoke takes effect at the next one
            kvs = t.snapshot.get_range(cursor, piece.end, PAGE)
            rows = []
            for kv in kvs:
                e = decode_entry(piece.queue, jk.entry_version(kv.key), kv.value)
                at = datetime.datetime.fromtimestamp(e.at, _UTC)
                details = json.dumps(e.details, sort_keys=True)
                who = (e.queue, e.message_id, e.principal, e.deliveries, e.reason)
                rows.append((e.version, at, e.op, *who, details))
            return rows, (kvs[-1].key + b"\x00" if len(kvs) == PAGE else None)

        rows, nxt = run_once(db, page)
        yield from rows
        if nxt is None:
            return
        cursor = nxt
