"""Trimming a queue's journal: its entries older than a version or than its retention, with
their history pointers (both places a pointer lives, ``journaling._append``), in bounded
batches. Apart from :mod:`fdbqueue.ops.journaling` (which writes and reads the journal) as the
one part of it that removes entries."""

from __future__ import annotations

import json
import random
from typing import Any

from fdbqueue.engines.contract import Database, Transaction, adopt, is_transaction
from fdbqueue.ops.journaling import check_version
from fdbqueue.ops.privileges import check
from fdbqueue.ops.txn import run_once
from fdbqueue.store.clock import db_now, versions
from fdbqueue.store.config import read_config
from fdbqueue.store.layout import DEFAULT_ROOT, JournalKeys, QueueKeys

TRIM_BATCH = 200  # entries one trimming transaction removes at most


def trim_journal(
    tr: Transaction | Database,
    queue: str,
    *,
    before: bytes | str | None = None,
    retention: float | None = None,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> int:
    """Remove ``queue``'s journal entries older than ``before`` (a version, exclusive), else
    older than the queue's ``journal_retention`` (database time), with their history pointers.
    Returns how many it removed. Given a transaction, at most TRIM_BATCH of them (call again);
    given a Database, batches of its own transactions until none is left."""
    keys = QueueKeys.make(queue, root)
    cut = check_version(before)
    jk = JournalKeys.make(root)

    def step(t: Transaction, _: bool) -> int:
        check(t, keys, "admin")
        limit_version = cut
        if limit_version is None:
            keep = retention
            if keep is None:
                cfg = read_config(t, keys)
                keep = cfg.journal_retention if cfg is not None else None
            if keep is None:
                return 0
            oldest = max(0, db_now(t) - versions(keep))
            limit_version = oldest.to_bytes(8, "big") + b"\x00" * 4
        return trim_some(t, jk, queue, limit_version, TRIM_BATCH)

    tr = adopt(tr)
    if is_transaction(tr):
        return run_once(tr, step)
    total = 0
    while True:
        n = run_once(tr, step)
        total += n
        if n < TRIM_BATCH:
            return total


def trim_some(t: Transaction, jk: JournalKeys, queue: str, before: bytes, limit: int) -> int:
    """Clear up to ``limit`` entries of ``queue`` older than version ``before``, oldest first,
    with their history pointers; composes inside ``t``."""
    n = 0
    local = not getattr(t.db, "may_conflict", True)  # entries and pointers in the queue too (_append)
    for shard in jk.shards(local):
        begin, _ = jk.entry_range(queue, shard, None)
        end = jk.entry_key(queue, shard, before)
        kvs = t.get_range(begin, end, limit - n)
        for kv in kvs:
            mid = json.loads(kv.value)[2]
            if mid is not None:
                version = jk.entry_version(kv.key)
                t.clear(jk.history_key(mid, version))
                if local:
                    t.clear(jk.queue_history_key(queue, mid, version))
                    t.clear(jk.queue_history_key(queue, mid, version, "eh"))  # (before the ninth pass)
                    t.clear(jk.arrival_key(queue, mid, version))
            t.clear(kv.key)
        n += len(kvs)
        if n >= limit:
            break
    return n


def maybe_trim(t: Transaction, keys: QueueKeys, retention: float) -> None:
    """About one sweep in 64 trims a bounded batch of the queue's journal (as receipts are)."""
    if random.random() < 1 / 64:
        oldest = max(0, db_now(t) - versions(retention))
        trim_some(
            t, JournalKeys.of(keys.root), keys.name, oldest.to_bytes(8, "big") + b"\x00" * 4, TRIM_BATCH
        )
