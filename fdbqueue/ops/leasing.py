"""Leasing in batches: the head of a queue in one range read, within one transaction's budget.

A worker's prefetch leases up to ``n`` messages in one transaction. The head batch is read
at snapshot isolation in one range read, and each message taken gets a read conflict of its
own, so that leasers conflict only when they take the same message (FoundationDB's queue
recipe, ``recipes/python-recipes/micro_queue.py``); the chunks of chunked messages come in
one ``get_many``; each counter gets one atomic add per batch. Every function composes inside
the caller's transaction.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Mapping
from typing import Any

from fdbqueue.engines.contract import Attempt, Transaction, retry_loop
from fdbqueue.errors import CorruptMessageError
from fdbqueue.ops import ratelimit
from fdbqueue.ops.contended import lease_contended
from fdbqueue.ops.delivery import (
    HELD_LEASES,
    _held,
    lease_until,
    open_for_dequeue,
    own_database,
)
from fdbqueue.ops.head import (
    HEAD_BATCH,
    HEAD_SKIP_LIMIT,
    KEPT_RUN,
    LEASE_KEPT,
    TAKE_RESERVE,
    claim_kept,
    deliverable_head,
    keep_run,
    keeps_head,
    kept_entry,
    kept_paused,
    kept_run,
    take_kept,
)
from fdbqueue.ops.lease_one import lease_counts, prepare_lease, write_lease
from fdbqueue.ops.moves.core import JOURNALED, VOLATILE, count_known
from fdbqueue.ops.moves.leases import count_leased, put_leased_batch
from fdbqueue.ops.moves.places import move_corrupt
from fdbqueue.ops.reading import expires_at, read_payload, read_payloads
from fdbqueue.ops.scan import FILTER_SCAN_LIMIT, expire_within
from fdbqueue.ops.sweep import sweep_step
from fdbqueue.store.budget import BATCH_PAYLOAD_BYTES, CHUNK_BYTES, Budget, encoded_len, grown_record
from fdbqueue.store.clock import db_now, versions
from fdbqueue.store.config import QueueConfig
from fdbqueue.store.entropy import new_rand
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.meta import LEASE_COUNTERS, Meta, due_entries, read_meta_for, read_take
from fdbqueue.store.record import Record, decode_record, encode_leased
from fdbqueue.types import Message, headers_match


def lease_batch(
    keys: QueueKeys,
    tr: Transaction,
    seconds: float | None,
    receipt: str,
    n: int,
    budget: Budget | None = None,
    where: Mapping[str, Any] | None = None,
    spread: int = 0,
) -> list[Message]:
    """Lease up to ``n`` from the head. ``spread``: pass over a random number (below
    ``spread``, and leaving at least ``n`` of the ready messages the queue counts) of
    deliverable messages first, unclaimed: consumers of one queue at the same moment then
    part ways instead of taking the same head and conflicting (QuiCK's consumers pick at
    random among the first ready items). Strict order never skips."""
    # What a lease needs; the wake counter too when it may take a kept head (head.keeps_head).
    kept = where is None and not spread and keeps_head(tr, keys)
    opened = open_for_dequeue(tr, keys, read_meta_for(tr, keys, LEASE_KEPT if kept else LEASE_COUNTERS))
    if opened is None:
        return []
    cfg, meta = opened
    now = db_now(tr)
    limited = ratelimit.gate(tr, keys, cfg, now, n)  # None: no rate limit applies
    if limited is not None:
        n = limited.granted
        if not n:
            return []  # held back: ratelimit.throttled() says how long
    budget = Budget(TAKE_RESERVE) if budget is None else budget
    if cfg.strict_order:  # one delivery in flight at a time: at most one head
        due = meta.waiting()
        head = deliverable_head(keys, tr, cfg, where, False, now, check_due=due, budget=budget)
        heads = [] if head is None else [head]
        clean = False  # (the due check may have moved messages: the counters read are not current)
        if head is not None:
            budget.charge(lease_cost(len(head[0]), head[1]))  # TAKE_RESERVE was kept for it
    else:
        skip = 0
        if spread:  # a work set's consumer (settling.lease_settling): not a plain lease
            room = min(spread, meta.count("ready") - n + 1)
            skip = random.randrange(room) if room > 1 else 0
        counts = meta.raw if kept else None  # with the ready and wake counters
        heads, clean = _ready_heads(keys, tr, cfg, meta, n, now, budget, where, skip, counts)
        if skip and not heads:  # fewer ready than counted: from the head after all
            heads, clean = _ready_heads(keys, tr, cfg, meta, n, now, budget, where)
    payloads: dict[str, bytes] = _NO_PAYLOADS
    damaged: dict[str, CorruptMessageError] | None = None
    for _, rec in heads:
        if rec.chunks:  # a chunked message among them: every chunk read at once
            payloads, damaged = read_payloads(tr, keys, [rec for _, rec in heads])
            break
    if damaged:  # a sound record whose payload chunks are damaged: moved aside, not leased
        for key, rec in heads:
            if rec.id in damaged:
                move_corrupt(keys, tr, cfg, key, rec.encode(), damaged[rec.id], budget)
        heads = [(key, rec) for key, rec in heads if rec.id not in damaged]
        clean = False
    secs = seconds or cfg.lease_seconds
    if heads:
        # The ready and in-flight counters as read, moved on by the batch: written as values
        # where nothing conflicts and nothing here wrote them since (moves.count_known).
        raw = meta.raw
        if not (
            clean
            and not meta.cluster
            and count_known(tr, _leased_counters(keys), (raw[1], raw[4]), (-len(heads), len(heads)))
        ):
            count_leased(tr, keys, len(heads))
    out = lease_heads(keys, tr, heads, secs, receipt, now, cfg, payloads) if heads else []
    if limited is not None:
        limited.spend(tr, len(out))
    return out


def _ready_heads(
    keys: QueueKeys,
    tr: Transaction,
    cfg: QueueConfig,
    meta: Meta,
    n: int,
    now: int,
    budget: Budget,
    where: Mapping[str, Any] | None = None,
    skip: int = 0,
    kept: list[bytes | None] | None = None,
) -> tuple[list[tuple[bytes, Record]], bool]:
    """Up to ``n`` deliverable ready messages from the head, in one range read (more only
    when expired ones had to be moved aside), instead of one read per message.

    The read is a snapshot read, and each message taken (or expired) gets a read conflict
    of its own: two leasers conflict only when they take the same message, the recipe of
    FoundationDB's queue (a conflict over the whole scanned range would add nothing: a
    message enqueued concurrently ahead of these serializes after this transaction).
    Within ``budget``: the first message always (TAKE_RESERVE was kept for it), the others
    while they fit; expired messages it cannot afford to move are passed over for later.
    ``where``: only messages whose headers match; the others stay (FILTER_SCAN_LIMIT of them
    are passed over at most). ``skip``: the first that many deliverable ones are passed over
    unclaimed (``lease_batch``). ``kept``: the metadata ``tr`` read with the ready and wake
    counters (``Meta.raw``): the first records may come from the last lease's kept run, and
    this one keeps the rest of its read for the next (``head.py``, "a head kept between
    transactions"). With the heads, whether nothing was moved on the way (no due message made
    ready, nothing expired or damaged moved aside): the counters ``meta`` read are then still
    current.

    This is ``ReadyScan(..., need=n, skip_limit=HEAD_SKIP_LIMIT, check_first=True,
    conflict=KEYS)`` (``scan.py``) written out, with the filter applied after the retry-delay
    check: every lease runs it, and the scanner's object and generator cost a lease + ack
    about 2 % more instructions (``scripts/count_instructions.py``). Change the two together.
    """
    if due_entries(tr, keys, meta, now):
        sweep_step(keys, tr, cfg, now, 16, budget)  # due delays and expired leases first
        kept = None  # made ready just now: not what the counters read say
        swept = True
    else:
        swept = False
    begin, end = keys.ready_range()
    out: list[tuple[bytes, Record]] = []
    skipped = passed = read = 0
    # A little more than wanted (expired ones are moved aside), but a lease of one reads one:
    # a live head, the common case, needs no spare, and past an expired one the reads grow.
    extra = 0 if n == 1 else min(8, 1 + n // 8)
    if kept is not None and n == 1 and not budget.scan_exhausted():
        # The common lease: the head of the run the last take kept (head.take_kept), no read.
        found = take_kept(keys, tr, kept, now)
        if found is not None:
            budget.charge(lease_cost(len(found[0]), found[1]))  # TAKE_RESERVE was kept for it
            tr.add_read_conflict_key(found[0])
            return [found], True  # nothing swept (kept), nothing skipped
        if kept_paused(tr.db, keys):
            # Found out of date just now (another consumer or producer is at work): read as a
            # lease that keeps nothing, as the next KEPT_PAUSE leases will (head.keeps_head),
            # rather than read KEPT_RUN records and keep them over the pause.
            kept = None
    entry = first = None if kept is None else kept_run(keys, tr, kept)
    while len(out) < n and skipped < HEAD_SKIP_LIMIT:
        if budget.scan_exhausted():
            budget.more = True  # expired messages beyond this transaction's reading: later
            break
        if first is not None:  # the head of the ready set, kept from the last lease: no read
            batch, first = first.run, None
            want = len(batch)
        else:
            entry = None  # the batch is read: no kept run
            want = budget.batch(n - len(out) + extra if kept is None else max(n + extra, KEPT_RUN))
            batch = tr.snapshot.get_range(begin, end, want)
            budget.read(batch)
        for i, (key, raw) in enumerate(batch):
            try:
                rec = decode_record(raw, keys, key)
            except CorruptMessageError as exc:
                move_corrupt(keys, tr, cfg, key, raw, exc, budget)
                skipped += 1
                continue
            if rec.expired(now):
                if expire_within(keys, tr, cfg, key, raw, rec, budget):
                    tr.add_read_conflict_key(key)
                skipped += 1
                continue
            if rec.extra and int(rec.extra.get("not_before", 0)) > now:  # extra: mostly empty
                # A head waiting out its retry delay holds the rest back.
                return out, not (swept or skipped)
            if where is not None and not headers_match(rec.headers, where):
                passed += 1
                if passed >= FILTER_SCAN_LIMIT:
                    return out, not (swept or skipped)
                continue
            if skip:
                skip -= 1  # passed over unclaimed: no conflict, another consumer's
                continue
            cost = lease_cost(len(key), rec)
            if not out:
                budget.charge(cost)
            elif not budget.take(cost):
                return out, not (swept or skipped)  # the budget is spent: the rest next call
            read += rec.chunks * CHUNK_BYTES
            if out and read > BATCH_PAYLOAD_BYTES:
                return out, not (swept or skipped)  # large payloads: the first alone
            tr.add_read_conflict_key(key)
            out.append((key, rec))
            if len(out) == n:
                if kept is not None and not (skipped or passed or skip):
                    keep_run(keys, tr, batch, i + 1, kept, n, entry)
                return out, not (swept or skipped)
        if len(batch) < want:
            break
        begin = batch[-1].key + b"\x00"
        extra = min(max(1, extra) * 8, HEAD_BATCH)  # past a run of expired ones: a few round trips
    return out, not (swept or skipped)


def lease_heads(
    keys: QueueKeys,
    tr: Transaction,
    heads: list[tuple[bytes, Record]],
    seconds: float,
    receipt: str,
    now: int,
    cfg: QueueConfig,
    payloads: Mapping[str, bytes],
) -> list[Message]:
    """Move each ready message of ``heads`` (key, record) into flight under ``receipt.i``:
    taken out of the ready set here (with its TTL entry, as ``moves.put_leased_batch`` does), the
    caller counting the batch (``moves.count_leased``). What every lease of one batch shares
    is made once: the deadline (a version), the wall-clock ``until``, the lease entries'
    prefix, the queue's settings. The leased record carries the journal's mark on a journaled
    queue (its ack, release and extend know without reading the settings). ``payloads``: the
    chunked messages' payloads read already (``read_payloads``)."""
    deadline = now + versions(seconds)
    until = lease_until(seconds)
    shown = until / 1e6
    strict, journaled, volatile = cfg.strict_order, cfg.journal, cfg.volatile
    general = strict or volatile
    if len(_held) + len(heads) > HELD_LEASES:  # leases never settled here: start again
        _held.clear()
    name = keys.name
    out: list[Message] = []
    writes: list[tuple[bytes, Record, bytes, tuple[bytes, bytes], str]] = []
    ats = keys.leased_at(deadline, [r.id for _, r in heads])
    priorities = keys.priorities_of([key for key, _ in heads])
    for i, ((key, rec), at, priority) in enumerate(zip(heads, ats, priorities, strict=True)):
        key_hex = key.hex()
        rcpt = f"{receipt}.{i}"
        raw: bytes | None = None
        if rec.extra or general:
            extra = dict(rec.extra)
            extra.update(key=key_hex, receipt=rcpt, deadline=deadline, until=until)
            extra.pop("not_before", None)
            if journaled:
                extra[JOURNALED] = 1
            if volatile:
                extra[VOLATILE] = 1
            if strict:
                extra["strict"] = True
        else:  # the common shape: written directly when it can be (encode_leased), else encoded
            extra = {"key": key_hex, "receipt": rcpt, "deadline": deadline, "until": until}
            if journaled:
                extra[JOURNALED] = 1
            raw = encode_leased(rec, key_hex, rcpt, deadline, until, journaled)
        leased = Record(
            rec.id,
            rec.enqueued_us,
            rec.content_type,
            rec.headers,
            rec.deliveries + 1,
            rec.expires_us,
            rec.chunks,
            extra,
            rec.payload,
        )
        if raw is None:
            raw = leased.encode()
        writes.append((key, leased, raw, at, rcpt))
        _held[rcpt] = raw, leased, keys, at
        if not rec.chunks:
            payload = rec.payload
        else:
            found = payloads.get(rec.id)
            payload = read_payload(tr, keys, rec) if found is None else found
        out.append(
            Message.from_record(
                leased,
                name,
                priority,
                key,
                payload,
                receipt=rcpt,
                lease_deadline=shown,
                expires_at=None if rec.expires_us is None else expires_at(tr, rec),
            )
        )
    put_leased_batch(tr, keys, deadline, writes)
    return out


def lease_cost(key_len: int, rec: Record) -> int:
    """An upper bound of the bytes leasing ``rec`` adds (budget.py): its record rewritten
    under ("f", id) with the lease fields, a lease entry, its ready and expiry entries cleared,
    a counter added: four or five keys, each counted about three times."""
    size = 64 + len(rec.payload)
    if rec.headers:
        size += encoded_len(rec.headers)
    if rec.extra:
        size += encoded_len(rec.extra)
    return 16 * (key_len + 32) + grown_record(key_len, size)


def _leased_counters(keys: QueueKeys) -> tuple[bytes, bytes]:
    """The ready and in-flight counters' keys (``QueueKeys.meta_read``'s, packed once)."""
    read = keys.meta_read()
    return read[1], read[4]


_NO_PAYLOADS: dict[str, bytes] = {}  # (read only: lease_batch's when no message is chunked)


# -- the common lease's own step ------------------------------------------------------------------
#
# Most leases of one message on the embedded engine are the same, as most dequeues are
# (ops/head.py, "the common dequeue's own step"): a queue with no owner, open for dequeues,
# without strict order, a volatile prefix or a rate limit; nothing delayed, and
# no lease due to expire; the head the kept run's first record, without headers, TTL,
# chunks or extra fields. lease_short does that one case straight from what it reads: the
# metadata version and the counters in one read (meta.read_take, the settings this process
# last found for the queue while they are the queue's at that version), the record's fields
# (record.decode_fields), the leased record's bytes (record.encode_leased), five writes in one
# call (moves.put_leased_one), on a journaled queue the lease's entry (journaling.record_short,
# the long way's put_leased writes the same) and the leased record's mark with it, and the kept
# run's rest kept for the next take. Any other case,
# found before anything is written or kept, takes the long way (lease_batch), which reads again
# and acts as it always did: the step is the long way's kept-head lease of one with its
# choices made (_ready_heads' take_kept, count_known, lease_heads), not another rule.


def lease_short(keys: QueueKeys, tr: Transaction, seconds: float | None, receipt: str) -> Message | None:
    """A lease of one message in ``tr`` under ``receipt + ".0"`` for ``seconds`` (None: the
    queue's lease_seconds) in the common case above, leased and counted as
    ``lease_batch(keys, tr, seconds, receipt, 1)`` leases it; None, having written and kept
    nothing, when the case is another: the caller takes the long way in the same ``tr``.
    Composes inside the caller's transaction (the kept run's rest is kept once it commits)."""
    db = tr.db
    if getattr(db, "may_conflict", True):  # engine_traits' first: only where nothing conflicts
        return None
    entry = kept_entry(db, keys)
    if entry is None:
        return None
    found = read_take(tr, keys)  # (no owner, open, not strict, not volatile: _take_keys)
    if found is None:
        return None
    values, settings, read = found  # version, ready, wake, inflight, delayed, taken (and their keys)
    version, ready, wake, inflight, _delayed, taken = values
    cfg = settings.config
    if (
        (_delayed is not None and _delayed != _ZERO)
        or cfg is None
        or ratelimit.limited(cfg)
        or entry.ready != ready
        or entry.wake != wake
        or entry.taken != taken
        or entry.version != version
        or entry.db() is not db
    ):
        # A delayed message may be due (the long way's due check); a rate limit's tokens to
        # take; the ready set changed, or another queue under the name
        # (head.kept_run says so).
        return None
    now = int(tr.get_read_version())  # db_now where nothing conflicts: the read version
    counts = lease_counts(keys, tr, ready, inflight, now)  # (ready is 8 bytes: entry.ready is)
    if counts is None:
        return None
    run = entry.run
    prepared = prepare_lease(run[0][0], run[0][1], seconds, cfg, now, receipt)
    if prepared is None:
        return None
    # Taken out (head.kept_run: a run serves one take), unless another thread's take of this
    # queue on this handle took it since the lookup above: the long way then.
    if not claim_kept(db, keys, entry):
        return None
    # Decided: from here on as the long way writes (lease_heads, put_leased_batch, count_known).
    msg = write_lease(keys, tr, prepared, (read[1], read[3]), counts)
    if len(run) > 1:  # head.keep_run's, in the same entry: its wake and version are as read
        entry.run = run[1:]
        entry.ready = counts[0]
        tr.on_finish(entry.landed)
    return msg


def lease_own(db: object, keys: QueueKeys, seconds: float | None) -> list[Message] | None:
    """``Queue.lease(db)`` (non-blocking, ``seconds`` checked) where its own retried transaction
    needs no receipt: on an engine where nothing conflicts and no commit ends unknown (the
    embedded one), one transaction whose step is :func:`lease_short`, and the long way
    (:func:`lease_batch`) in the same transaction when the case is another. What it leased
    (at most one); None, having committed nothing of a lease, where it does not apply, or
    when the long way moved expired messages aside and found none yet (``Budget.more``): the
    caller then leases as ever (``Queue.lease_many``), which goes on from there."""
    own = own_database(db)
    if own is None:
        return None
    # Made outside the retry loop, as Queue._lease_attempt's: 16 random bytes as its, drawn
    # as two of new_rand's pieces (no lock, no slice).
    receipt = (new_rand() + new_rand()).hex()
    budgets: list[Budget] = []  # the long way's, begun when it is first taken

    def step(t: Transaction, _: Attempt) -> list[Message]:
        one = lease_short(keys, t, seconds, receipt)
        if one is None:  # among other consumers (the kept head paused): ops/contended.py
            one = lease_contended(keys, t, seconds, receipt)
        if one is not None:
            return [one]
        if budgets:
            budgets[0].next_transaction()
        else:
            budgets.append(Budget(TAKE_RESERVE))
        return lease_batch(keys, t, seconds, receipt, 1, budgets[0])

    ratelimit.throttled()  # forget an earlier lease's: this one says (Queue._lease_attempt's)
    got = retry_loop(own, step, None, True)
    return None if not got and budgets and budgets[0].more else got


_RECORD = tuple.__new__
_PACK, _UNPACK = struct.Struct("<q").pack, struct.Struct("<q").unpack
_ZERO = bytes(8)
_ONE = _PACK(1)
