"""High-contention dequeue: the staged dequeue-request set (FoundationDB's high-contention queue).

A dequeuer registers a request ``("pop", version, rand)`` (the read version of its first
attempt: requests are served in that order and aged by database time, never by a client's
clock); whichever waiter runs next pairs
waiting requests with ready messages in batches, using snapshot range reads plus exact
point reads of each paired request and message, so two fulfillers conflict only when
they touch the same one; each pairing writes the message to ``("res", rand)``, and its
requester collects it. Throughput holds up as dequeuers are added, where plain
dequeues all collide on the first key.

It cannot join a caller's transaction: the request must be committed (visible) before
anyone can fulfil it, and the result is collected in a later transaction, so a staged
dequeue spans several transactions of its own. In a caller's transaction use the plain
dequeue: it conflicts under contention and the caller's retry loop runs it again.
"""

from __future__ import annotations

import random
import time

from fdbqueue.engines.contract import RETRY, Again, Attempt, Database, Done, KeyValue, Transaction, retry
from fdbqueue.errors import CommitUnknownError, CorruptMessageError, QueueStoppedError
from fdbqueue.ops.head import HEAD_BATCH, HEAD_SKIP_LIMIT
from fdbqueue.ops.moves.departures import collect_result, count_handed, drop_result, hand_over
from fdbqueue.ops.moves.places import move_corrupt
from fdbqueue.ops.privileges import checked
from fdbqueue.ops.reading import to_message
from fdbqueue.ops.receipts import RESULT_TTL_VERSIONS, decode_result
from fdbqueue.ops.scan import KEYS, ReadyScan
from fdbqueue.ops.sweep import sweep_step
from fdbqueue.ops.txn import run_once
from fdbqueue.store.budget import Budget, move_cost
from fdbqueue.store.clock import db_now, versions
from fdbqueue.store.config import QueueConfig
from fdbqueue.store.entropy import random_bytes
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.meta import due_entries, read_meta
from fdbqueue.store.record import decode_record
from fdbqueue.types import Message

BATCH = 100
STALE_REQUEST_VERSIONS = versions(30)  # a request this old lost its waiter: clear it, pair nothing
_PENDING = object()


def _live_items(
    keys: QueueKeys, t: Transaction, cfg: QueueConfig, n: int, now: int, budget: Budget
) -> list[KeyValue]:
    """Up to ``n`` ready messages from the head, moving aside the expired ones met on the way
    as far as ``budget`` affords (the others stay for a later transaction or a sweep)."""
    out: list[KeyValue] = []
    scan = ReadyScan(
        t,
        keys,
        now,
        cfg=cfg,
        budget=budget,
        sizes=(8, HEAD_BATCH),  # grows by 8 times a batch past a run of expired messages, as the head scan's
        need=n,
        row_limit=n + HEAD_SKIP_LIMIT,
        # As for a pairing, only a true collision conflicts: an expired message moved aside
        # gets the conflict of a point read, without its round trip (the value was read just now).
        conflict=KEYS,
    )
    for key, raw, _rec in scan:
        if len(out) < n:
            out.append(KeyValue(key, raw))
            scan.claim()
    return out


def waiting_requests(tr: Transaction, keys: QueueKeys) -> bool:
    """True when staged requests wait (a snapshot read: no conflict)."""
    return bool(tr.snapshot.get_range(*keys.pop_range(), limit=1))


def staged_dequeue(db: Database, keys: QueueKeys) -> Message | None:
    """Dequeue through the request set; None when the queue was empty at fulfilment."""
    rand = random_bytes(8)  # made outside every retry loop: the request's identity
    res_key = keys.result_key(rand)
    made: list[bytes] = []  # the request's key: made in the first attempt, kept by the retries

    def register(t: Transaction, unknown: bool) -> bool:
        if unknown and made and any(v is not None for v in t.get_many([res_key, made[0]])):
            # The attempt that ended in commit_unknown_result did register, and another
            # waiter may already have paired it: registering again could pair it twice.
            return True
        meta = checked(t, keys, "dequeue")
        if meta.config is None:
            return False
        if not meta.state.dequeue:
            raise QueueStoppedError(f"dequeue is disabled on queue {keys.name!r}")
        if not made:  # after the metadata, which brought database time's correction
            made.append(keys.pop_key(db_now(t), rand))
        t.set(made[0], b"")  # the same key on every attempt: idempotent
        return True

    if not run_once(db, register):
        return None
    req_key = made[0]
    delay = 0.0005
    while True:
        # Our own request first: with many dequeuers another's fulfil has usually paired it
        # already, and then this fulfil stops at its first read (see ``mine``) instead of
        # pairing others' requests and colliding with their fulfils.
        fulfil(db, keys, mine=req_key)
        got = _collect(db, keys, req_key, res_key)
        if got is not _PENDING:
            return got  # type: ignore[return-value]
        time.sleep(delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, 0.05)


def _collect(db: Database, keys: QueueKeys, req_key: bytes, res_key: bytes) -> object:
    taken: list[Message] = []
    made: list[int] = []  # when the result was made (a version)

    def body(t: Transaction, unknown: bool) -> object:
        request, raw = t.get_many([req_key, res_key])  # one round trip for both
        if unknown and taken:
            # A sweep reclaims results older than RESULT_TTL: past that, a missing result
            # may be one put back rather than one we collected (the same argument as for
            # receipts: sweep.read_receipt).

            if db_now(t) - made[0] > RESULT_TTL_VERSIONS:
                raise CommitUnknownError(
                    "the outcome of collecting a staged dequeue's message is unknown: its commit "
                    "ended in commit_unknown_result (1021) and the retry came after uncollected "
                    "results are put back; the message was taken, or is back in the queue"
                )
            if raw is None:
                return taken[0]  # the attempt that ended in commit_unknown_result committed
        if request is not None:
            return _PENDING
        if raw is None:
            return None
        made_at, key, record = decode_result(raw)
        made[:] = [made_at]
        try:
            msg = to_message(t, keys, key, decode_record(record, keys, key), delivered=True)
        except CorruptMessageError as exc:  # its payload chunks are damaged: not handed out
            cfg = read_meta(t, keys).config or QueueConfig()
            drop_result(t, res_key)
            move_corrupt(keys, t, cfg, key, record, exc, state="done")  # fulfil counted it done
            return None
        collect_result(t, keys, res_key, decode_record(record, keys, key))
        taken[:] = [msg]
        return msg

    return run_once(db, body)


def _done(mine: bytes, reqs: list[KeyValue]) -> bool:
    """True when request ``mine`` is not among ``reqs``, the first waiting requests in order,
    though it would be: it was paired (or cleared) already."""
    if len(reqs) == BATCH and mine > reqs[-1].key:
        return False  # beyond this batch: it may still wait
    return all(kv.key != mine for kv in reqs)


def fulfil(db: Database, keys: QueueKeys, *, mine: bytes | None = None) -> int:
    """Pair waiting requests with ready messages, a batch per transaction; returns pairs made.

    ``mine``: the caller's own request key. When the first read shows it no longer waits
    (another waiter paired it), nothing is paired: the caller collects its result at once.
    """
    made = 0

    def count(n: int) -> None:
        nonlocal made
        made += n

    def step(t: Transaction, attempt: Attempt) -> int | Again | Done[int]:
        # A constant number of round trips per batch, none per pair: the requests
        # and messages come from snapshot range reads, each one paired gets a read
        # conflict key of its own (FoundationDB's high-contention queue recipe: two
        # fulfillers conflict only when they touch the same request or message), and
        # the requests' result keys are read together in one get_many.
        reqs = t.snapshot.get_range(*keys.pop_range(), limit=BATCH)
        if not reqs:
            return Done(made)
        if mine is not None and _done(mine, reqs):
            return Done(made)
        budget = Budget()  # this transaction's (fdbqueue/store/budget.py)
        meta = read_meta(t, keys)
        now = db_now(t)  # after read_meta, which read the time correction with the metadata
        cfg = meta.config
        if cfg is not None and due_entries(t, keys, meta, now):
            sweep_step(keys, t, cfg, now, 16, budget)  # due delays and expired leases first
        stale_before = now - STALE_REQUEST_VERSIONS
        live = []
        for req in reqs:
            if keys.unpack_tail(req.key)[1] < stale_before:
                t.add_read_conflict_key(req.key)
                t.clear(req.key)
            else:
                live.append(req)
        items = _live_items(keys, t, cfg, len(live), now, budget) if cfg is not None else []
        affordable: list[KeyValue] = []
        for item in items:
            # The result holds the record: within the budget, the rest next transaction.
            if not budget.take(move_cost(len(item.key), len(item.value), 0)):
                break
            affordable.append(item)
        paired = live[: len(affordable)]
        results = [keys.result_key(keys.unpack_tail(req.key)[2]) for req in paired]
        existing = t.get_many(results) if results else []
        handed = 0
        for req, item, res, seen in zip(paired, affordable, results, existing, strict=True):
            # Conflict keys, not reads: without them two fulfillers could hand out
            # one message twice, and the snapshot reads already gave the values.
            t.add_read_conflict_key(req.key)
            t.add_read_conflict_key(item.key)
            if seen is not None:
                t.clear(req.key)  # already paired (see register): never pair twice
                continue
            rec = decode_record(item.value, keys, item.key)
            hand_over(t, keys, res, now, item.key, item.value, rec, journaled=cfg is not None and cfg.journal)
            handed += 1
            t.clear(req.key)
        count_handed(t, keys, handed)
        if not budget.more:
            for req in live[len(items) :]:
                t.add_read_conflict_key(req.key)
                t.clear(req.key)  # nothing to pair: its requester gets None
        n = len(paired)
        if len(reqs) < BATCH and not budget.more:
            return made + n  # once committed
        return Again(lambda: count(n))

    # A conflict (1020): another waiter fulfilled these.
    return retry(db, step, on_error=lambda exc, attempt: made if exc.code == 1020 else RETRY)
