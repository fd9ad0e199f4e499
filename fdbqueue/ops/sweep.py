"""Timeout sweeps: expired leases back, due delayed messages in, TTLs out, old entries gone.

Every index is ordered by its deadline, so a sweep reads only what is due: cheap when
nothing is. Each due entry is read serializably before it is moved, so sweepers running
at once conflict only over the same entry; the loser retries and finds it gone. A sweep
is therefore idempotent and safe from many workers (no double moves).

``now`` throughout is the sweeping transaction's read version, and every deadline is in
versions (``fdbqueue.store.clock``): whose clock runs the sweep does not matter.
"""

from __future__ import annotations

from fdbqueue.engines.contract import Transaction
from fdbqueue.errors import CorruptMessageError
from fdbqueue.ops.delivery import expire_lease, promote_delayed
from fdbqueue.ops.journal_trim import maybe_trim
from fdbqueue.ops.moves.departures import reclaim_result
from fdbqueue.ops.moves.leases import drop_stale_entry
from fdbqueue.ops.moves.places import expire, move_corrupt
from fdbqueue.ops.reading import locate
from fdbqueue.ops.receipts import RESULT_TTL_VERSIONS, clear_old_receipts, decode_result
from fdbqueue.store.budget import Budget, move_cost
from fdbqueue.store.clock import versions
from fdbqueue.store.config import QueueConfig, read_config
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import decode_record
from fdbqueue.types import SweepStats


def _due(tr: Transaction, keys: QueueKeys, tag: str, now: int, limit: int) -> list[bytes]:
    begin, end = keys.index_range(tag, now + 1)
    # A snapshot read: only the entries acted on are read serializably (point reads).
    return [kv.key for kv in tr.snapshot.get_range(begin, end, limit)]


def sweep_step(
    keys: QueueKeys, tr: Transaction, cfg: QueueConfig, now: int, limit: int, budget: Budget | None = None
) -> SweepStats:
    """Move up to ``limit`` due entries of each index, within ``budget`` (``budget.py``: what
    does not fit is left for the next transaction, ``budget.more`` says so); composes inside ``tr``."""
    st = SweepStats()
    budget = Budget() if budget is None else budget
    for lkey in _due(tr, keys, "l", now, limit):
        outcome = expire_lease(keys, tr, cfg, lkey, now, budget)
        if outcome == "later":
            break
        if outcome is not None:
            st.leases += 1
            st.dead += outcome == "dead"
            st.expired += outcome == "expired"
    for dkey in _due(tr, keys, "d", now, limit):
        outcome = promote_delayed(keys, tr, cfg, dkey, now, budget)
        if outcome == "later":
            break
        if outcome is not None:
            st.delayed += outcome == "ready"
            st.expired += outcome == "expired"
    for xkey in _due(tr, keys, "x", now, limit):
        if budget.more:
            break
        if tr.get(xkey) is None:
            continue
        msg_id = keys.unpack_tail(xkey)[2]
        where = locate(tr, keys, msg_id)
        raw = None if where is None or keys.unpack_tail(where)[0] != "r" else tr.get(where)
        if where is None or raw is None:
            drop_stale_entry(tr, xkey)
            continue  # leased or delayed: checked again when it is released or promoted
        try:
            rec = decode_record(raw, keys, where, msg_id)
        except CorruptMessageError as exc:
            drop_stale_entry(tr, xkey)
            move_corrupt(keys, tr, cfg, where, raw, exc, budget)
            continue
        if not budget.take(move_cost(len(where), len(raw), rec.chunks)):
            break  # the entry stays for the next transaction
        drop_stale_entry(tr, xkey)
        expire(keys, tr, cfg, where, rec)
        st.expired += 1
    return st


def sweep_housekeeping(
    keys: QueueKeys, tr: Transaction, cfg: QueueConfig, now: int, limit: int, budget: Budget | None = None
) -> SweepStats:
    """Old dedup entries, old dequeue receipts and uncollected staged results, within ``budget``."""
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
    st.results += reclaim_results(keys, tr, now, limit, budget, journaled=cfg.journal)
    if cfg.journal:
        maybe_trim(tr, keys, cfg.journal_retention)
    return st


def reclaim_results(
    keys: QueueKeys,
    tr: Transaction,
    now: int,
    limit: int,
    budget: Budget | None = None,
    *,
    journaled: bool = False,
) -> int:
    """Staged-dequeue results nobody collected (the requester died): back to their place,
    as many as ``budget`` affords."""
    n = 0
    for kv in tr.snapshot.get_range(*keys.index_range("res"), limit):
        made, key, raw = decode_result(kv.value)
        if made > now - RESULT_TTL_VERSIONS or tr.get(kv.key) is None:
            continue
        if budget is not None and not budget.take(move_cost(len(key), len(raw), 0)):
            break
        reclaim_result(tr, keys, kv.key, key, decode_record(raw, keys, key), journaled=journaled)
        n += 1
    return n


def sweep(keys: QueueKeys, tr: Transaction, now: int, limit: int = 100) -> SweepStats:
    """One sweep transaction's worth of work on ``q`` (see the module docstring)."""
    cfg = read_config(tr, keys)
    if cfg is None:
        return SweepStats()
    budget = Budget()
    st = sweep_step(keys, tr, cfg, now, limit, budget)
    st.add(sweep_housekeeping(keys, tr, cfg, now, limit, budget))
    return st
