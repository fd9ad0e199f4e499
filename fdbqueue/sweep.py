"""Timeout sweeps: expired leases back, due delayed messages in, TTLs out, old entries gone.

Every index is ordered by its deadline, so a sweep reads only what is due: cheap when
nothing is. Each due entry is read serializably before it is moved, so sweepers running
at once conflict only over the same entry; the loser retries and finds it gone. A sweep
is therefore idempotent and safe from many workers (no double moves).

``now`` throughout is the sweeping transaction's read version, and every deadline is in
versions (``fdbqueue.clock``): whose clock runs the sweep does not matter.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from fdbqueue.budget import Budget, move_cost
from fdbqueue.clock import db_now, versions
from fdbqueue.config import QueueConfig, read_config
from fdbqueue.delivery import expire, expire_lease, locate, move_corrupt, promote_delayed
from fdbqueue.engines.base import Database, Transaction, adopt, engine_traits, is_transaction
from fdbqueue.errors import CommitUnknownError, CorruptMessageError
from fdbqueue.layout import QueueKeys, pack_count
from fdbqueue.message import decode_record
from fdbqueue.txn import run_once
from fdbqueue.types import SweepStats as SweepStats  # re-export

if TYPE_CHECKING:
    from fdbqueue.queue import Queue

# Receipts settle the retry of a commit that ended in commit_unknown_result (1021). They are
# keyed and aged by database time (read versions), never a client's clock. A 1021 comes with
# a recovery, and a recovery moves versions on by MAX_VERSIONS_IN_FLIGHT, 100 s of versions
# (fdbserver/core/ServerKnobs.cpp; fdbserver/clustercontroller/ClusterRecovery.cpp sets
# recoveryTransactionVersion = lastEpochEnd + MAX_VERSIONS_IN_FLIGHT): ten minutes leaves room
# for that and for the retries' backoff. A retry later than this raises CommitUnknownError.
RECEIPT_TTL_SECONDS = 600
RECEIPT_TTL_VERSIONS = versions(RECEIPT_TTL_SECONDS)
RESULT_TTL_VERSIONS = versions(300)  # an uncollected staged-dequeue result goes back after 5 min

T = TypeVar("T")


def _due(tr: Transaction, q: Queue, tag: str, now: int, limit: int) -> list[bytes]:
    begin, end = q.keys.index_range(tag, now + 1)
    # A snapshot read: only the entries acted on are read serializably (point reads).
    return [kv.key for kv in tr.snapshot.get_range(begin, end, limit)]


def sweep_step(
    q: Queue, tr: Transaction, cfg: QueueConfig, now: int, limit: int, budget: Budget | None = None
) -> SweepStats:
    """Move up to ``limit`` due entries of each index, within ``budget`` (``budget.py``: what
    does not fit is left for the next transaction, ``budget.more`` says so); composes inside ``tr``."""
    keys = q.keys
    st = SweepStats()
    budget = Budget() if budget is None else budget
    for lkey in _due(tr, q, "l", now, limit):
        outcome = expire_lease(q, tr, cfg, lkey, now, budget)
        if outcome == "later":
            break
        if outcome is not None:
            st.leases += 1
            st.dead += outcome == "dead"
            st.expired += outcome == "expired"
    for dkey in _due(tr, q, "d", now, limit):
        outcome = promote_delayed(q, tr, cfg, dkey, now, budget)
        if outcome == "later":
            break
        if outcome is not None:
            st.delayed += outcome == "ready"
            st.expired += outcome == "expired"
    for xkey in _due(tr, q, "x", now, limit):
        if budget.more:
            break
        if tr.get(xkey) is None:
            continue
        msg_id = keys.unpack_tail(xkey)[2]
        where = locate(tr, keys, msg_id)
        raw = None if where is None or keys.unpack_tail(where)[0] != "r" else tr.get(where)
        if where is None or raw is None:
            tr.clear(xkey)
            continue  # leased or delayed: checked again when it is released or promoted
        try:
            rec = decode_record(raw, q.keys, where, msg_id)
        except CorruptMessageError as exc:
            tr.clear(xkey)
            move_corrupt(q, tr, cfg, where, raw, exc, budget)
            continue
        if not budget.take(move_cost(len(where), len(raw), rec.chunks)):
            break  # the entry stays for the next transaction
        tr.clear(xkey)
        expire(q, tr, cfg, where, rec)
        st.expired += 1
    return st


def sweep_housekeeping(
    q: Queue, tr: Transaction, cfg: QueueConfig, now: int, limit: int, budget: Budget | None = None
) -> SweepStats:
    """Old dedup entries, old dequeue receipts and uncollected staged results, within ``budget``."""
    keys = q.keys
    st = SweepStats()
    horizon = now - versions(cfg.dedup_window)
    for kv in tr.snapshot.get_range(*keys.index_range("kt", horizon), limit):
        _, _t, dkey = keys.unpack_tail(kv.key)
        tr.clear(kv.key)
        raw = tr.get(keys.dedup_key(dkey))
        if raw is not None and int(raw.split(b"|")[1]) <= horizon:
            tr.clear(keys.dedup_key(dkey))
        st.dedup += 1
    clear_old_receipts(tr, keys, now)
    st.results += reclaim_results(q, tr, now, limit, budget)
    return st


def reclaim_results(q: Queue, tr: Transaction, now: int, limit: int, budget: Budget | None = None) -> int:
    """Staged-dequeue results nobody collected (the requester died): back to their place,
    as many as ``budget`` affords."""
    from fdbqueue.contention import decode_result
    from fdbqueue.delivery import put_ready

    n = 0
    for kv in tr.snapshot.get_range(*q.keys.index_range("res"), limit):
        made, key, raw = decode_result(kv.value)
        if made > now - RESULT_TTL_VERSIONS or tr.get(kv.key) is None:
            continue
        if budget is not None and not budget.take(move_cost(len(key), len(raw), 0)):
            break
        tr.clear(kv.key)
        put_ready(tr, q.keys, key, decode_record(raw, q.keys, key), q.keys.parse_ready(key)[0])
        n += 1
    if n:  # they were counted done when paired (contention.fulfil): not done after all
        tr.add(q.keys.counter("done"), pack_count(-n))
    return n


def clear_old_receipts(tr: Transaction, keys: QueueKeys, now: int) -> None:
    """Clear receipts past their TTL (``now``: a read version): one blind range clear, no conflict."""
    tr.clear_range(*keys.index_range("rc", now - RECEIPT_TTL_VERSIONS))


def new_receipt(tr: Transaction, keys: QueueKeys, rand: bytes) -> bytes:
    """A receipt key for an operation whose first attempt runs in ``tr``: keyed by its read
    version, so that every client ages it alike. Make it once; every retry reuses it."""
    return keys.receipt_key(db_now(tr), rand)


def read_receipt(tr: Transaction, keys: QueueKeys, receipt: bytes) -> bytes | None:
    """The receipt's value if the attempt that ended in commit_unknown_result committed, else None.

    Authoritative while this read version is within the TTL of the receipt's: every cleaner
    that committed before it cleared only receipts older than its own read version minus the
    TTL, which is below this one's (and a cleaner committing later conflicts with this read).
    Past that it may have been cleared: CommitUnknownError, never a guess.
    """
    made = int(keys.unpack_tail(receipt)[1])
    if db_now(tr) - made > RECEIPT_TTL_VERSIONS:
        raise CommitUnknownError(
            "the outcome of a commit that ended in commit_unknown_result (1021) is unknown: its "
            f"retry came more than {RECEIPT_TTL_SECONDS} s of database time later (a long outage "
            "or recovery), when the receipt that settles it may be gone; it may or may not have "
            "happened, so check before doing it again"
        )
    return tr.get(receipt)


def maybe_clear_old_receipts(tr: Transaction, keys: QueueKeys) -> None:
    """About one call in 64 clears receipts past their TTL (as every sweep does).

    Receipts only settle a commit_unknown_result, which is retried within seconds, so
    users who never run a sweep do not accumulate them.
    """
    if random.random() < 1 / 64:
        clear_old_receipts(tr, keys, db_now(tr))


def settled(tr: Transaction | Database, keys: QueueKeys, body: Callable[[Transaction], T]) -> T:
    """Run ``body(t)`` once, in the caller's transaction or in a retried one of its own that
    learns whether its own earlier attempt landed after a commit_unknown_result (1021).

    The state ``body`` acts on says nothing about that: between the attempt and its retry
    another client may have done what looks the same (a sweep released the message a nack
    was giving back, another worker leased it). So, given a Database on an engine whose
    commits may end unknown (``engine_traits``), the same transaction writes a receipt,
    keyed by the first attempt's read version (:func:`new_receipt`); a retry after a
    possible landing reads it (:func:`read_receipt`: authoritative within the TTL, else
    :class:`CommitUnknownError`) and, if it is there, returns what the attempt that landed
    computed instead of acting again. Only one attempt can land: the one after it finds
    its receipt. In a caller's transaction nothing is added: the caller's own retry
    settles its transaction.
    """
    tr = adopt(tr)
    if is_transaction(tr) or not engine_traits(tr)[1]:
        return run_once(tr, lambda t, _: body(t))
    rand = os.urandom(8)
    receipt: list[bytes] = []  # made in the first attempt, kept by its retries
    result: list[T] = []  # what the last attempt that reached its commit computed

    def attempt(t: Transaction, unknown: bool) -> T:
        if not receipt:
            receipt.append(new_receipt(t, keys, rand))
        elif unknown and result and read_receipt(t, keys, receipt[0]) is not None:
            return result[0]  # that attempt landed; this one commits nothing
        result[:] = [body(t)]
        t.set(receipt[0], b"")
        maybe_clear_old_receipts(t, keys)
        return result[0]

    return run_once(tr, attempt)


def sweep(q: Queue, tr: Transaction, now: int, limit: int = 100) -> SweepStats:
    """One sweep transaction's worth of work on ``q`` (see the module docstring)."""
    cfg = read_config(tr, q.keys)
    if cfg is None:
        return SweepStats()
    budget = Budget()
    st = sweep_step(q, tr, cfg, now, limit, budget)
    st.add(sweep_housekeeping(q, tr, cfg, now, limit, budget))
    return st
