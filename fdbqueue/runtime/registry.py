"""A worker's entry in the registry of workers (``fdbqueue.api.workers``), kept by a heartbeat.

A :class:`Registration` writes the worker's record when it starts, rewrites it every
``interval`` seconds from a thread of its own (counts, messages in hand, the heartbeat's
read version), and clears it when the worker stops. The worker calls it at few points:
:meth:`Registration.start` and :meth:`~Registration.close` around its run, and
:meth:`~Registration.handling` around each handler call; the counts are read from the
worker's own stats at each beat, so the message path pays a dict insert and delete only.

Each beat is one small transaction writing one key, the worker's own: the registry has no
key that every worker writes. Every ``PRUNE_EVERY`` beats a worker clears the records of
workers dead for ``PRUNE_AFTER`` seconds (blind clears after a snapshot read: they conflict
with nothing). A beat that fails (the database unreachable) is logged and tried again at the
next: the record then ages, and readers show the worker dead until it is heard of again.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from fdbqueue.api.workers import PRUNE_AFTER, encode_record, prune_workers
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.errors import QueueError
from fdbqueue.ops.txn import run_once
from fdbqueue.store.clock import db_now, now_us
from fdbqueue.store.entropy import random_bytes
from fdbqueue.store.layout import DEFAULT_ROOT, WorkerKeys
from fdbqueue.types import check_duration

log = logging.getLogger("fdbqueue.runtime.registry")

DEFAULT_INTERVAL = 5.0  # seconds between heartbeats
PRUNE_EVERY = 12  # beats between prunes of dead workers' records (a minute at the default)


class Registration:
    """One running worker's record in the registry (see the module docstring).

    ``counts()`` returns (handled, failed) when a beat is written. ``enabled=False`` makes
    every method a no-op (a worker run with ``register=False``).
    """

    def __init__(
        self,
        db: Database,
        kind: str,
        queues: Sequence[str],
        counts: Callable[[], tuple[int, int]],
        *,
        concurrency: int = 1,
        interval: float = DEFAULT_INTERVAL,
        enabled: bool = True,
        root: tuple[Any, ...] = DEFAULT_ROOT,
    ) -> None:
        self.db = db
        self.kind = kind
        self.queues = [str(q) for q in queues]
        self.counts = counts
        self.concurrency = concurrency
        self.interval = check_duration("registry_interval", interval, positive=True)
        self.enabled = enabled
        self.keys = WorkerKeys(root)
        self.root = tuple(root)
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.id = f"{self.host}:{self.pid}:{random_bytes(4).hex()}"
        self.started = now_us() / 1e6
        self._in_hand: dict[str, tuple[str, float]] = {}  # message id -> (queue, since)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beats = random.randrange(PRUNE_EVERY)  # workers started together prune apart

    # -- what the worker calls -------------------------------------------------------------------

    def start(self) -> None:
        """Write the record now (the worker shows at once), then beat from a thread."""
        if not self.enabled or self._thread is not None:
            return
        self._stop.clear()
        try:
            self.beat()
        except QueueError as exc:  # the worker runs anyway; the next beat tries again
            log.warning("worker %s: could not register: %s", self.id, exc)
        self._thread = threading.Thread(target=self._run, name="fdbqueue-registry", daemon=True)
        self._thread.start()

    def handling(self, queue: str, message_id: str) -> AbstractContextManager[None]:
        """Around a handler call: the message is in hand (shown at the next beat). A small
        object, not a generator: it runs once a message (about a microsecond)."""
        return _Holding(self, queue, message_id) if self.enabled else _NOTHING

    def begin(self, queue: str, message_id: str) -> None:
        """A handler call begins (for a caller that cannot use :meth:`handling`). A dict's
        item set and pop are atomic under the GIL; the beat copies the dict (atomic too)."""
        if self.enabled:
            self._in_hand[message_id] = (queue, now_us() / 1e6)

    def end(self, message_id: str) -> None:
        if self.enabled:
            self._in_hand.pop(message_id, None)

    def close(self) -> None:
        """Stop beating and clear the record: a stopped worker leaves the registry."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=30)
        try:
            run_once(self.db, lambda t, _: t.clear(self.keys.entry(self.id)))
        except QueueError as exc:  # unreachable: the record ages and is shown dead
            log.warning("could not remove worker %s from the registry: %s", self.id, exc)

    # -- the heartbeat ---------------------------------------------------------------------------

    def record(self, t: Transaction) -> dict[str, Any]:
        handled, failed = self.counts()
        hand = [[mid, q, since] for mid, (q, since) in self._in_hand.copy().items()]
        return {
            "host": self.host,
            "pid": self.pid,
            "kind": self.kind,
            "queues": self.queues,
            "concurrency": self.concurrency,
            "started": self.started,
            "handled": handled,
            "failed": failed,
            "in_hand": hand[:64],  # bounded: a record stays one small value
            "beat": db_now(t),
            "seen": now_us() / 1e6,
            "interval": self.interval,
        }

    def beat(self) -> None:
        """Write the record in a transaction of its own (a blind write of one key)."""
        key = self.keys.entry(self.id)
        run_once(self.db, lambda t, _: t.set(key, encode_record(self.record(t))))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
                self._beats += 1
                if self._beats % PRUNE_EVERY == 0:
                    prune_workers(self.db, older_than=PRUNE_AFTER, root=self.root)
            except QueueError as exc:
                log.warning("worker %s: heartbeat to the registry failed: %s", self.id, exc)
            except Exception:  # a bug must not end the beat silently: say it, go on
                log.exception("worker %s: heartbeat to the registry failed", self.id)


class _Holding:
    __slots__ = ("mid", "queue", "reg")

    def __init__(self, reg: Registration, queue: str, mid: str) -> None:
        self.reg, self.queue, self.mid = reg, queue, mid

    def __enter__(self) -> None:
        self.reg._in_hand[self.mid] = (self.queue, now_us() / 1e6)

    def __exit__(self, *exc: object) -> None:
        self.reg._in_hand.pop(self.mid, None)


_NOTHING = nullcontext()


def worker_counts(stats: Any, lock: threading.Lock) -> Callable[[], tuple[int, int]]:
    """``counts`` for a worker whose stats have ``processed`` and ``failed``."""

    def counts() -> tuple[int, int]:
        with lock:
            return stats.processed + stats.failed, stats.failed

    return counts
