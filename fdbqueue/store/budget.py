"""Transaction budgets: how much one layer transaction may write, read and take in time.

FoundationDB refuses a transaction larger than 10,000,000 bytes (2101, transaction_too_large)
and advises keeping each under 1 MB (``documentation/sphinx/source/known-limitations.rst``).
It counts a transaction's size as ``Transaction::getSize`` does in
``fdbclient/NativeAPI.actor.cpp`` (``CommitTransactionRef::expectedSize`` in
``fdbclient/include/fdbclient/CommitTransaction.h``): every mutation's key + value (a clear's
begin + end), plus the begin + end of every read and write conflict range. Reads cost no
size but time: a transaction older than 5 s can no longer read (1007, transaction_too_old:
``MAX_READ_TRANSACTION_LIFE_VERSIONS`` in ``fdbserver/core/ServerKnobs.cpp``).

Every layer operation therefore works within a :class:`Budget` of ``TXN_BUDGET_BYTES``
(half of FoundationDB's advice), estimated with upper bounds from the keys and records it
touches. Work past the budget continues in further transactions when the operation runs
its own (given a Database), or is left for the next call (given a caller's Transaction):
expired messages a dequeue cannot afford to move stay where they are for a later dequeue
or sweep, and a lease_many returns fewer messages. The first move of a transaction is
always allowed, so that every transaction makes progress and nothing wedges; the limits
below make the largest single move fit the budget.

Pure computation: nothing here reads or writes the database.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from itertools import chain

from fdbqueue.engines.limits import TRANSACTION_SIZE_LIMIT, VALUE_SIZE_LIMIT

# FoundationDB's limits, which every engine enforces, are in fdbqueue.engines.limits: what
# fits the budgets below fits on a cluster.

TXN_BUDGET_BYTES = 1_000_000 // 2  # at most this many bytes per transaction, as FoundationDB counts

# Chunked payloads: FoundationDB's blob recipe, values of about 10 kB (the queue's CHUNK_SIZE),
# each followed by its 4-byte checksum (message.py).
CHUNK_BYTES = 10_004

# What a user's single call may write in one transaction (an enqueue, an enqueue_many): what
# FoundationDB accepts, less a margin for the layer's own keys beside the messages (counters,
# a receipt, the queue's settings on first use, index entries). Only past it is a call
# refused: the layer's own work keeps to TXN_BUDGET_BYTES, a user's call to the engine's limit.
LAYER_MARGIN_BYTES = 1_000_000
USER_TXN_LIMIT = TRANSACTION_SIZE_LIMIT - LAYER_MARGIN_BYTES

# The largest payload a message may have (the largest ``max_payload``): what one transaction
# can move under FoundationDB's limit. A payload is written in one transaction, and moved in
# one (to an error queue, to another queue: its chunks copied): 6 MiB is 630 chunks of
# CHUNK_BYTES, each with a key of up to about 1,100 bytes (queue prefixes up to 1,000) and its
# conflict range, about 8.4 MB, with the largest record and TAKE_RESERVE about 8.6 MB. A move
# of a message that large exceeds TXN_BUDGET_BYTES: the first move of a transaction is always
# allowed and nothing else fits beside it, so such messages move one per transaction.
MAX_PAYLOAD_BYTES = 6 * 1024 * 1024
DEFAULT_MAX_PAYLOAD = 1024 * 1024  # a queue's max_payload unless set: as SQS and Kafka

# A batch the layer hands out or forwards (lease_many, a forwarder's batch) stops adding
# messages once their chunked payloads reach this many bytes (the first always goes): so a
# batch of large messages is split, one per transaction where need be.
BATCH_PAYLOAD_BYTES = 1_000_000

# Limits on what a user gives, with headroom, so that every later state of a message's record
# still fits FoundationDB's value limit (100,000 bytes) and its keys the key limit (10,000):
# the record grows when leased (ready key, receipt, deadline), nacked (last_error: a reason),
# delayed (ready key, priority), dead-lettered (origin, reason, deliveries) and wrapped as a
# staged dequeue's result (its ready key beside it). With an inline payload of up to
# CHUNK_BYTES, headers of MAX_HEADERS_BYTES and one reason, a record stays under about
# 80,000 bytes for queue key prefixes up to 1,000 bytes.
MAX_HEADERS_BYTES = 60_000  # headers as the record stores them (compact JSON, ASCII-escaped)
MAX_REASON_BYTES = 4_000  # a nack or dead-letter reason, as the record stores it (JSON)
MAX_DEDUP_KEY_BYTES = 1_000  # a dedup key in UTF-8; it is part of two keys, up to twice as long packed

# Reads: a scan (the head past expired messages, a filtered dequeue) reads at most this many
# record bytes, and for at most this long, per transaction, well inside the 5 s window.
SCAN_READ_BYTES = 1_000_000
SCAN_SECONDS = 1.0

# What an operation's own bookkeeping costs around the messages it moves: the queue's
# metadata conflict keys, counter adds, a receipt, the error queue's settings on first use.
BASE_COST = 8_000

# Upper-bound slack for a key written elsewhere than where it was read (an id or expiry
# entry, the error queue's longer name, a lease or delayed key).
_KEY_SLACK = 32


def set_cost(key_len: int, value_len: int) -> int:
    """A set: the mutation (key + value) and its write conflict range [key, key + b"\\x00")."""
    return key_len + value_len + 2 * key_len + 1


def grown_record(key_len: int, raw_len: int) -> int:
    """A record of ``raw_len`` bytes after a state change added its fields (a ready key in hex,
    a receipt and deadline, or an origin and reason): at most the value limit."""
    return min(VALUE_SIZE_LIMIT, raw_len + 2 * key_len + 512)


def move_cost(key_len: int, raw_len: int, chunks: int) -> int:
    """An upper bound for moving one message's record from a key of ``key_len`` bytes to
    another state or to the error queue: about a dozen keys of that length written, cleared
    or read (each counted three or four times: mutation plus conflict range), the record
    written again, and its chunks copied."""
    k = key_len + _KEY_SLACK
    cost = 48 * k + grown_record(key_len, raw_len)
    if chunks:
        cost += chunks * set_cost(k + 16, CHUNK_BYTES) + 4 * k  # the copies, and a range clear
    return cost


class Budget:
    """What one transaction of one operation may still spend (see the module docstring).

    ``reserve``: bytes kept back for what the operation must do at the end (the take of the
    message it returns). ``more`` is set when work was left for a later transaction;
    ``resume`` is where a scan that spans transactions goes on from.
    """

    __slots__ = ("limit", "more", "moves", "read_bytes", "read_rows", "resume", "scanned", "spent", "started")

    def __init__(self, reserve: int = 0, *, limit: int = TXN_BUDGET_BYTES) -> None:
        self.limit = limit - reserve
        self.resume: bytes | None = None
        self.scanned = 0  # entries a multi-transaction scan has looked at, over all transactions
        self.next_transaction()

    def take(self, cost: int) -> bool:
        """Charge ``cost`` if it fits; the first move of a transaction always fits (progress).

        False: the caller leaves that work for a later transaction (and ``more`` says so).
        """
        if self.moves and self.spent + cost > self.limit:
            self.more = True
            return False
        self.spent += cost
        self.moves += 1
        return True

    def charge(self, cost: int) -> None:
        """Count a move that must be done whatever the budget (the first message a lease
        takes, for which a reserve was kept): later moves are then checked against it."""
        self.spent += cost
        self.moves += 1

    def read(self, rows: Iterable[tuple[bytes, bytes]]) -> None:
        """Count the bytes of ``rows`` (key-value pairs) a scan read."""
        if type(rows) is not list:
            rows = list(rows)
        # Every key's and value's length summed in C: a lease of 100 reads 100 rows.
        self.read_bytes += sum(map(len, chain.from_iterable(rows)))
        self.read_rows += len(rows)

    def batch(self, want: int) -> int:
        """How many rows a scan's next range read may ask for: up to ``want``, fewer when the
        rows read so far say that many would pass SCAN_READ_BYTES; at least 1."""
        if not self.read_rows:
            return max(1, want)
        left = SCAN_READ_BYTES - self.read_bytes
        return max(1, min(want, left * self.read_rows // max(1, self.read_bytes)))

    def scan_exhausted(self) -> bool:
        """True when a scan has read or lasted as much as one transaction should."""
        return self.read_bytes >= SCAN_READ_BYTES or time.monotonic() - self.started >= SCAN_SECONDS

    def next_transaction(self) -> None:
        """Start the next transaction of the same operation: a fresh budget, the same cursor."""
        self.spent = BASE_COST
        self.moves = 0
        self.read_bytes = 0
        self.read_rows = 0
        self.started = time.monotonic()
        self.more = False


def encoded_len(value: object) -> int:
    """Bytes ``value`` takes in a record: compact JSON, non-ASCII escaped (as Record.encode)."""
    return len(json.dumps(value, separators=(",", ":")))
