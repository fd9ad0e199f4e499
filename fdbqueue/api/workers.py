"""The registry of workers: who consumes, on which queues, since when, doing what.

Every Worker, AsyncWorker and Dispatcher writes a record of itself under
``root + ("wr", worker_id)`` (``layout.WorkerKeys``) when it starts, rewrites it at each
heartbeat (``fdbqueue.runtime.registry``) and clears it when it stops. One key a worker,
written by that worker alone, in a small transaction of its own every few seconds: no key
that every worker writes (a hot key on FoundationDB), nothing added to the lease path.

A record whose last heartbeat is more than ``DEAD_AFTER_BEATS`` intervals old, in database
time (the heartbeat stores its read version: no client's clock takes part), is shown dead:
its process was killed, or cannot reach the database. Dead records are cleared by the other
workers' heartbeats once they are ``PRUNE_AFTER`` seconds old, or by :func:`prune_workers`.

:func:`workers` is open to every principal, who sees the workers of the queues it may
browse (and, of their messages in hand, those of such queues): a record names queues and
message ids, which ``browse`` guards.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.engines.versions import VERSIONS_PER_SECOND
from fdbqueue.errors import QueueError
from fdbqueue.ops.privileges import principal_of
from fdbqueue.ops.txn import run_once
from fdbqueue.store.clock import db_now
from fdbqueue.store.guard import allowed, decode_guard
from fdbqueue.store.layout import DEFAULT_ROOT, QueueKeys, WorkerKeys
from fdbqueue.types import check_duration, check_flag

DEAD_AFTER_BEATS = 3  # heartbeats missed before a worker is shown dead
PRUNE_AFTER = 3600.0  # seconds a dead worker's record is kept (for people to see what died)
MAX_WORKERS = 10_000  # records one call reads at most


@dataclass(frozen=True)
class CurrentMessage:
    """A message a worker has in hand: its id, its queue, and since when (wall clock, s)."""

    id: str
    queue: str
    since: float


@dataclass(frozen=True)
class WorkerInfo:
    """One worker as its last heartbeat described it.

    ``started``, ``last_seen`` and ``CurrentMessage.since`` are wall-clock seconds since the
    epoch (for people); ``alive`` is decided in database time. ``handled`` counts every
    settled handler call (``failed`` included); ``current`` is the message in hand longest
    (None when idle), ``in_hand`` all of them (a worker with ``concurrency`` > 1).
    """

    id: str
    host: str
    pid: int
    kind: str  # "Worker", "AsyncWorker" or "Dispatcher"
    queues: tuple[str, ...]
    concurrency: int
    started: float
    handled: int
    failed: int
    in_hand: tuple[CurrentMessage, ...]
    alive: bool
    last_seen: float
    interval: float  # seconds between its heartbeats

    @property
    def current(self) -> CurrentMessage | None:
        return min(self.in_hand, key=lambda c: c.since) if self.in_hand else None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the CLI's ``--json``, the dashboard)."""
        cur = self.current
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "kind": self.kind,
            "queues": list(self.queues),
            "concurrency": self.concurrency,
            "started": self.started,
            "handled": self.handled,
            "failed": self.failed,
            "current": None if cur is None else {"id": cur.id, "queue": cur.queue, "since": cur.since},
            "in_hand": [{"id": c.id, "queue": c.queue, "since": c.since} for c in self.in_hand],
            "alive": self.alive,
            "last_seen": self.last_seen,
        }


def encode_record(record: Mapping[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), sort_keys=True).encode()


def _decode(worker_id: str, raw: bytes, now: int) -> tuple[WorkerInfo | None, int]:
    """The record and its last heartbeat's version (None, 0 when damaged)."""
    try:
        d = json.loads(raw)
        interval = float(d["interval"])
        beat = int(d["beat"])
        info = WorkerInfo(
            id=worker_id,
            host=str(d["host"]),
            pid=int(d["pid"]),
            kind=str(d.get("kind", "Worker")),
            queues=tuple(str(q) for q in d["queues"]),
            concurrency=int(d.get("concurrency", 1)),
            started=float(d["started"]),
            handled=int(d["handled"]),
            failed=int(d["failed"]),
            in_hand=tuple(CurrentMessage(str(i), str(q), float(s)) for i, q, s in d.get("in_hand", ())),
            alive=now - beat <= DEAD_AFTER_BEATS * interval * VERSIONS_PER_SECOND,
            last_seen=float(d["seen"]),
            interval=interval,
        )
    except (ValueError, KeyError, TypeError):
        return None, 0  # a damaged record: left out (its worker rewrites it, or it is pruned)
    return info, beat


def _read(t: Transaction, wk: WorkerKeys) -> list[tuple[bytes, WorkerInfo | None, int]]:
    now = db_now(t)
    rows = t.snapshot.get_range(*wk.range(), limit=MAX_WORKERS)
    return [(kv.key, *_decode(wk.worker_id(kv.key), kv.value, now)) for kv in rows]


def workers(
    tr: Transaction | Database, *, alive: bool | None = None, root: tuple[Any, ...] = DEFAULT_ROOT
) -> list[WorkerInfo]:
    """The registered workers, oldest first (``alive``: only live ones, or only dead ones).

    A principal sees the workers of which it may browse a queue; of their messages in hand,
    those of the queues it may browse. Reads only (snapshot reads: it conflicts with no
    heartbeat); composes inside the caller's transaction.
    """
    if alive is not None:
        check_flag("alive", alive)  # "yes" would filter out every worker, silently
    wk = WorkerKeys(root)

    def body(t: Transaction, _: bool) -> list[WorkerInfo]:
        may_browse = _Rights(t, root, "browse")
        out = []
        for _key, info, _beat in _read(t, wk):
            if info is None or (alive is not None and info.alive != alive):
                continue
            if not any(may_browse(q) for q in info.queues):
                continue
            hand = tuple(c for c in info.in_hand if may_browse(c.queue))
            if hand != info.in_hand:
                info = _replace_hand(info, hand)
            out.append(info)
        out.sort(key=lambda w: (w.started, w.id))
        return out

    return run_once(tr, body)


class _Rights:
    """Whether ``tr``'s principal holds ``right`` on a queue, by name (each guard read once)."""

    def __init__(self, t: Transaction, root: tuple[Any, ...], right: str) -> None:
        self.t, self.root, self.right = t, root, right
        self.who = principal_of(t)
        self.seen: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        found = self.seen.get(name)
        if found is None:
            try:
                keys = QueueKeys.make(name, self.root)
            except QueueError:  # a damaged name: names no queue of anyone's
                found = False
            else:
                owner, acl = decode_guard(self.t.snapshot.get(keys.guard))
                found = allowed(owner, acl, self.who, self.right)
            self.seen[name] = found
        return found


def _replace_hand(info: WorkerInfo, hand: tuple[CurrentMessage, ...]) -> WorkerInfo:
    return dataclasses.replace(info, in_hand=hand)


def prune_workers(
    tr: Transaction | Database, *, older_than: float = PRUNE_AFTER, root: tuple[Any, ...] = DEFAULT_ROOT
) -> int:
    """Clear the records of workers dead for more than ``older_than`` seconds (database time)
    and damaged records; returns how many. Only the records of workers of which the principal
    may administer a queue (``admin``). Blind clears after snapshot reads: conflicts with
    nothing. Composes inside the caller's transaction."""
    wk = WorkerKeys(root)

    older_than = check_duration("older_than", older_than)

    def body(t: Transaction, _: bool) -> int:
        now = db_now(t)
        may_admin = _Rights(t, root, "admin")
        n = 0
        for key, info, beat in _read(t, wk):
            if info is None or (
                not info.alive
                and now - beat > older_than * VERSIONS_PER_SECOND
                and any(may_admin(q) for q in info.queues)
            ):
                t.clear(key)
                n += 1
        return n

    return run_once(tr, body)
