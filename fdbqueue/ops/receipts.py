"""Receipts: how a retry after commit_unknown_result (1021) learns whether its attempt landed.

FoundationDB's advice for 1021 (its developer guide, "Transactions with unknown results") is
to make the transaction idempotent: write a unique key with it and check for that key on retry.
A receipt is that key; the staged-dequeue result codec lives here too, since sweeps and
contention both read it. Everything here composes inside the caller's transaction.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import TypeVar

from fdbqueue.engines.contract import Database, Transaction, adopt, engine_traits, is_transaction, retry_loop
from fdbqueue.errors import CommitUnknownError
from fdbqueue.ops.txn import run_once
from fdbqueue.store.clock import db_now, versions
from fdbqueue.store.entropy import random_bytes
from fdbqueue.store.layout import QueueKeys

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
_RESULT_HEAD = struct.Struct("<qH")


def encode_result(made: int, key: bytes, record: bytes) -> bytes:
    """A fulfilled request: when (a read version), the message's ready key (its place), its record."""
    return _RESULT_HEAD.pack(made, len(key)) + key + record


def decode_result(raw: bytes) -> tuple[int, bytes, bytes]:
    made, n = _RESULT_HEAD.unpack_from(raw)
    start = _RESULT_HEAD.size
    return made, raw[start : start + n], raw[start + n :]


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


def run_once_confirmed(tr: Transaction | Database, keys: QueueKeys, body: Callable[[Transaction], T]) -> T:
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
    if is_transaction(tr):
        return body(tr)  # type: ignore[arg-type]
    if not engine_traits(tr)[1]:
        # run_once's loop, on the database adopted above (no second look at it).
        return retry_loop(tr, lambda t, _: body(t), None, True)  # type: ignore[arg-type]
    rand = random_bytes(8)
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
