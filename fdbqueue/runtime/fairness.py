"""Fair consumption over many queues: what a Worker or a Dispatcher serves when given a
pattern (``"tenant.*"``) or a :class:`~fdbqueue.api.routing.PartitionedQueue`.

The queues are found through the work index (``workindex``: one entry per queue that may
have work, kept by the one writer of message state in the transaction that gives a queue
work), not by polling each queue: Apple's QuiCK design (Shraer et al., SIGMOD 2021). A
consumer takes turns: each turn serves the queues with work in name order, starting after
the queue it served last, and takes at most a bounded batch from each, so one queue's
backlog never starves another. A queue that gives nothing is retired from the index (or
parked until its next delayed message or lease deadline). With nothing to do, a consumer
waits on one watch, the index's bell, however many queues it serves: queues created after
it started are served as soon as they have work.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import threading
import time
from typing import Any

from fdbqueue.api.admin import PATTERN_CHARS, is_pattern
from fdbqueue.api.queue import Queue
from fdbqueue.api.routing import PartitionedQueue, route_table
from fdbqueue.engines.contract import Database, Transaction, Watch
from fdbqueue.errors import QueueError, QueueStoppedError
from fdbqueue.ops import workindex
from fdbqueue.ops.steps import wait_on
from fdbqueue.ops.txn import run_once
from fdbqueue.ops.waiting import LOST_WAKEUP_RECHECK
from fdbqueue.store.clock import db_now, seconds_of
from fdbqueue.store.codec import unpack_count
from fdbqueue.store.layout import DEFAULT_ROOT, QueueKeys

log = logging.getLogger("fdbqueue.runtime.worker")

ERROR_SUFFIX = ".error"  # the default error queues' names (config.error_queue_name)
AVOID_SECONDS = 60.0  # a queue that refused a turn (no right to dequeue, say) is skipped this long
ROUND = 1000  # index entries a turn reads at most, from each side of where it resumes
FAIR_SHARE = 4  # a turn takes at least this many from a queue (when the consumer wants them)
FILL_BATCH = 200  # queues of the listing one transaction looks at when the index is filled


class WorkSet:
    """The queues a pattern (``fnmatch``: ``"tenant.*"``) or a PartitionedQueue (its partitions
    and the queues its routes name) stands for, present and future, served in fair turns
    through the work index. Not shared between threads without its lock (it takes it)."""

    def __init__(self, spec: str | PartitionedQueue, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> None:
        if isinstance(spec, PartitionedQueue):
            self.part: PartitionedQueue | None = spec
            self.pattern = f"{spec.name}.p*"
            root = spec.root
            self.prefix = f"{spec.name}.p"
            self._members = {q.name for q in spec.queues}
        elif is_pattern(spec) and isinstance(spec, str):
            self.part = None
            self.pattern = spec
            self.prefix = spec[: min(spec.index(c) for c in PATTERN_CHARS if c in spec)]
            self._members = set()
        else:
            raise QueueError(f"a work set is a pattern (with * ? or [) or a PartitionedQueue, got {spec!r}")
        self.root = root
        self.wk = workindex.work_keys(root)
        self.name = spec.name if isinstance(spec, PartitionedQueue) else spec
        self._routed: set[str] = set()
        self._after = ""  # the queue served last: the next turn starts after it
        self._queues: dict[str, Queue] = {}
        self._lock = threading.Lock()
        self._parked_until: float | None = None  # monotonic time the first parked entry is due
        self._filled = False
        self._avoid: dict[str, float] = {}  # queues that refused a turn -> monotonic time to retry
        self.recent: set[str] = set()  # queues served since the last sweep
        self.watches = 0  # watches armed so far (one per idle wait: a measure for tests)

    def __repr__(self) -> str:
        return f"WorkSet({self.name!r})"

    def matches(self, name: str) -> bool:
        if self.part is not None:
            return name in self._members or name in self._routed
        if name.endswith(ERROR_SUFFIX) and not self.pattern.endswith(ERROR_SUFFIX):
            return False  # dead letters are served only when asked for: "tenant.*.error"
        return fnmatch.fnmatchcase(name, self.pattern)

    def queue(self, name: str) -> Queue:
        q = self._queues.get(name)
        if q is None:
            if len(self._queues) > 100_000:
                self._queues.clear()
            q = self._queues[name] = Queue(name, root=self.root)
        return q

    # -- reading the index -------------------------------------------------------------------

    def _entries(self, t: Transaction, after: str) -> list[tuple[str, int]]:
        """(name, due) of the matching entries: those after ``after`` first, then the rest."""
        if self.part is not None:
            self._routed = set(route_table(t, self.part.name, self.root).values())
        begin, end = self.wk.range(self.prefix)
        mid = self.wk.entry(after) + b"\x00" if after else begin
        kvs = list(t.snapshot.get_range(max(mid, begin), end, ROUND))
        if mid > begin:
            kvs += t.snapshot.get_range(begin, min(mid, end), ROUND)
        out = [(self.wk.name(kv.key), workindex.decode_due(kv.value)) for kv in kvs]
        seen = {n for n, _ in out}
        extra = sorted(n for n in self._routed if n not in seen and not n.startswith(self.prefix))
        if extra:  # routes to queues outside the partitions' prefix
            raws = t.snapshot.get_many([self.wk.entry(n) for n in extra])
            found = zip(extra, raws, strict=True)
            out += [(n, workindex.decode_due(raw)) for n, raw in found if raw is not None]
        return [(n, due) for n, due in out if self.matches(n)]

    def _scan(self, t: Transaction) -> list[str]:
        now = db_now(t)
        with self._lock:
            after = self._after
        entries = self._entries(t, after)
        parked = [due for _, due in entries if due > now]
        self._parked_until = time.monotonic() + seconds_of(min(parked) - now) if parked else None
        mono = time.monotonic()
        with self._lock:
            for n in [n for n, until in self._avoid.items() if until <= mono]:
                del self._avoid[n]
            avoid = set(self._avoid)
        return [n for n, due in entries if due <= now and n not in avoid]

    def rotation(self, db: Database) -> list[Queue]:
        """The queues with work now, in this turn's order (one transaction)."""
        self.fill(db)
        names = run_once(db, lambda t, _: self._scan(t))
        return [self.queue(n) for n in names]

    def served(self, q: Queue) -> None:
        """``q`` had its turn: the next turn starts after it."""
        with self._lock:
            self._after = q.name
            self.recent.add(q.name)

    def take_recent(self) -> list[Queue]:
        """The queues served since the last call (what a consumer's periodic sweep visits)."""
        with self._lock:
            names, self.recent = self.recent, set()
        return [self.queue(n) for n in sorted(names)]

    def retire(self, db: Database, q: Queue) -> None:
        """``q`` gave nothing: out of the index, or parked till its next deadline."""
        run_once(db, lambda t, _: workindex.retire(t, q.keys, db_now(t)))

    def avoid(self, db: Database, q: Queue, exc: QueueError) -> None:
        """``q`` refused its turn: paused (it leaves the index till dequeue is enabled again)
        or anything else, such as no right to dequeue (skipped for ``AVOID_SECONDS``)."""
        if isinstance(exc, QueueStoppedError):
            with contextlib.suppress(QueueError):
                self.retire(db, q)
            return
        log.warning("work set %r skips queue %r for %.0f s: %s", self.name, q.name, AVOID_SECONDS, exc)
        with self._lock:
            self._avoid[q.name] = time.monotonic() + AVOID_SECONDS
            self._after = q.name

    def drained(self, db: Database) -> bool:
        """No matching queue is in the index but those that refused their turn: none holds a
        message ready, delayed or leased (a queue emptied by other consumers is retired by
        a turn first)."""
        self.fill(db)

        def body(t: Transaction, _: bool) -> bool:
            with self._lock:
                avoid = set(self._avoid)
            return all(n in avoid for n, _ in self._entries(t, ""))

        return run_once(db, body)

    # -- waiting -----------------------------------------------------------------------------

    def wait(self, db: Database, timeout: float | None, stop: threading.Event) -> bool:
        """Wait until a matching queue may have work (True), ``timeout`` passes or ``stop`` is
        set (False): one watch on the index's bell, armed in the transaction that found no
        work, so nothing marked in between is missed; bounded by the first parked entry."""

        def arm(t: Transaction, _: bool) -> tuple[bool, Watch | None]:
            if self._scan(t):
                return True, None
            return False, t.watch(self.wk.bell)

        found, w = run_once(db, arm)
        if found or w is None:
            return True
        self.watches += 1
        try:
            start = time.monotonic()
            limit = start + min(LOST_WAKEUP_RECHECK, timeout if timeout is not None else LOST_WAKEUP_RECHECK)
            if self._parked_until is not None:
                limit = min(limit, self._parked_until)
            while not stop.is_set():
                step = min(0.25, limit - time.monotonic())
                if step <= 0:
                    return self._parked_until is not None and time.monotonic() >= self._parked_until
                if wait_on(w, step):
                    return True
            return False
        finally:
            w.cancel()

    # -- an index built late ------------------------------------------------------------------

    def fill(self, db: Database) -> None:
        """Once per database: mark every queue of the listing that holds messages (a store
        whose queues were written before the index was kept), then record that it is done."""
        if self._filled:
            return
        if run_once(db, lambda t, _: t.get(self.wk.filled)) is not None:
            self._filled = True
            return
        cursor: bytes | None = None
        while True:
            start = cursor

            def step(t: Transaction, _: bool, start: bytes | None = start) -> bytes | None:
                found = workindex.listing_names(t, self.root, start, FILL_BATCH)
                busy = []
                for _key, name in found:
                    keys = QueueKeys.make(name, self.root)
                    raws = t.snapshot.get_many([keys.counter(c) for c in ("ready", "delayed", "inflight")])
                    if any(unpack_count(raw) > 0 for raw in raws):
                        busy.append(name)
                workindex.fill(t, self.root, busy)
                if len(found) < FILL_BATCH:
                    t.set(self.wk.filled, b"1")
                    return None
                return found[-1][0]

            cursor = run_once(db, step)
            if cursor is None:
                break
        self._filled = True
