"""Fair consumption over many queues: what a Worker or a Dispatcher serves when given a
pattern (``"tenant.*"``) or a :class:`~fdbqueue.api.routing.PartitionedQueue`.

The queues are found through the work index (``workindex``: one entry per queue that may
have work, kept by the one writer of message state in the transaction that gives a queue
work), not by polling each queue: Apple's QuiCK design (Shraer et al., SIGMOD 2021). A
consumer takes turns: each turn serves the queues with work in an order of its own (a
permutation drawn from its token), starting after the queue it served last (the first turn
at a random queue, so that consumers started together do not all take the same queue
first), and takes at most a bounded batch from each, so one queue's backlog never starves
another. A queue that gives nothing is retired from the index (or parked until its next
delayed message or lease deadline).

One consumer at a time serves a queue (QuiCK leases a queue's top-level pointer): a queue
another consumer claims (``workindex.claim``) is skipped or visited last, and a queue nobody
claims goes to one of the work set's consumers busy now (rendezvous hashing over the tokens
of the live claims): the others leave it to that one, for at most ``DEFER_SECONDS``, instead
of all probing it and taking its one message at the same moment.

With nothing to do, a consumer registers itself asleep and watches its registration
(``workindex.sleep``), in the transaction whose scan found nothing: whoever next gives one of
its queues work wakes one such consumer, not all of them (``workindex.wake_one``); a consumer
that finds more than its fair share in a queue wakes one more. Queues created after it
started are served as soon as they have work. While it sleeps, its idle waits cost no
transaction: it looks at the index again when woken, when a parked entry comes due, or after
``LOST_WAKEUP_RECHECK`` seconds (when it also renews its registration).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import zlib
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
from fdbqueue.store.clock import db_now, seconds_of, versions
from fdbqueue.store.codec import unpack_count
from fdbqueue.store.entropy import new_rand
from fdbqueue.store.layout import DEFAULT_ROOT, READY_PARTS, QueueKeys, ready_count

log = logging.getLogger("fdbqueue.runtime.worker")

AVOID_SECONDS = 60.0  # a queue that refused a turn (no right to dequeue, say) is skipped this long
ROUND = 1000  # index entries a turn reads at most, from each side of where it resumes
FAIR_SHARE = 4  # a turn takes at least this many from a queue (when the consumer wants them)
DEFER_SECONDS = 1.0  # a queue nobody claims is left to the consumer it goes to this long at most
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
        self.watches = 0  # watches armed so far (one per sleep: a measure for tests)
        # This consumer's claims (workindex.claim): 4 bytes that say which queues it serves
        # (its work set's name: consumers of the same one serve the same queues, _scan),
        # then 4 random ones.
        self.token = zlib.crc32(f"{self.root!r}/{self.name}".encode()).to_bytes(4, "big") + new_rand()[:4]
        self._salt = zlib.crc32(self.token)  # its own order of the queues (_order)
        # Its registration while asleep: a fresh key each time it goes to sleep, so that no
        # registration key is written more than twice (set, then cleared by a waker).
        self._sleep_token = new_rand()
        self._watch: Watch | None = None  # the registration's watch while asleep
        self._armed_at = 0.0  # monotonic time it was armed
        self._registered = False  # a registration may be in the index
        self._more: set[str] = set()  # queues that gave a full share: wake one more consumer
        self._started = False  # the first turn starts at a random queue
        self.contended: set[str] = set()  # queues other consumers claimed at the last turn
        self.owned: set[str] = set()  # queues this consumer claimed at the last turn
        self._empty: set[str] = set()  # queues found empty at the last visit, not retired
        self._left = False  # the last scan left queues with work to other consumers
        self._deferred: dict[str, float] = {}  # the queues it left to them, since (monotonic)

    def __repr__(self) -> str:
        return f"WorkSet({self.name!r})"

    def matches(self, name: str) -> bool:
        if self.part is not None:
            return name in self._members or name in self._routed
        # Dead letters are served only when asked for: "tenant.*.error".
        return workindex.matches(self.pattern, (), name)

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
        mono = time.monotonic()
        with self._lock:
            for n in [n for n, until in self._avoid.items() if until <= mono]:
                del self._avoid[n]
            avoid = set(self._avoid)
        names = self._order([n for n, due in entries if due <= now and n not in avoid], after)
        self.contended = set()
        self.owned = set()
        self._left = False
        deferred, self._deferred = self._deferred, {}
        if names:
            # Queues another consumer serves right now (workindex.claim) are skipped when
            # it took what there was (until its claim ends: a wait is bounded by that, as
            # by a parked entry), visited last, at random among their first ready
            # messages, when more is there. Consumers spread over the queues instead of
            # meeting on the same heads; the others keep their round-robin order (no queue
            # waits more than a turn of this consumer's).
            busy: set[bytes] = set()
            claimed, own = workindex.claims(t, self.wk, self.prefix, now, self.token, ROUND, busy)
            self.owned = own
            if claimed or own:
                done = {n for n in names if claimed.get(n, 0) > 0}
                parked += [claimed[n] for n in done]
                self.contended = {n for n in names if claimed.get(n, 0) < 0}
                names = [n for n in names if n not in claimed] + [n for n in names if n in self.contended]
            busy = {tok for tok in busy if tok[:4] == self.token[:4] and tok != self.token}
            if busy:
                # A queue nobody claims goes to one of the consumers of this work set busy
                # on its queues (those with a live claim, and this one), the same for all of
                # them: the one ranking it highest (rendezvous hashing, Thaler & Ravishankar
                # 1998). The others leave it to that one instead of all probing it and taking
                # its one message at the same moment (a conflict each): QuiCK's one consumer
                # per queue. A consumer that stops or stays away lets its claims end within
                # CLAIM_SECONDS, then is no longer counted, and its queues go to others; a
                # skipped queue bounds this consumer's waits as a claim does. And a queue is
                # left to another for DEFER_SECONDS at most: still free after that (its
                # consumer may not serve it: no right to dequeue there), this one takes it.
                busy.add(self.token)
                free = [n for n in names if n not in own and n not in self.contended]
                theirs = {
                    n
                    for n in free
                    if mono - deferred.get(n, mono) < DEFER_SECONDS and self._chosen(n, busy) != self.token
                }
                self._deferred = {n: deferred.get(n, mono) for n in theirs}
                if theirs:
                    names = [n for n in names if n not in theirs]
                    parked.append(now + versions(workindex.CLAIM_SECONDS))
                    self._left = True
        self._parked_until = mono + seconds_of(min(parked) - now) if parked else None
        if len(names) > 1 and not self._started:
            # The first turn starts at a random queue: consumers started together spread
            # over the queues instead of following one another onto the same heads; later
            # turns start after the queue served last (round robin: no queue waits more
            # than a turn, whatever the others do).
            k = random.randrange(len(names))
            names = names[k:] + names[:k]
        return names

    @staticmethod
    def _chosen(name: str, tokens: set[bytes]) -> bytes:
        """Which of the consumers ``tokens`` a queue nobody claims goes to (rendezvous)."""
        raw = name.encode()
        return max(tokens, key=lambda tok: (zlib.crc32(tok + raw), tok))

    def _rank(self, name: str) -> int:
        return zlib.crc32(name.encode(), self._salt)

    def _order(self, names: list[str], after: str) -> list[str]:
        """``names`` in this consumer's own order of the queues (a permutation drawn from its
        token), starting after ``after``. In name order, consumers that fall into step follow
        one another from queue to queue and take the same last messages at the same moment
        (a conflict each); each in an order of its own, two meet on a queue only by chance.
        Still a round robin: a turn visits every queue once, none waits more than a turn."""
        ranked = sorted(names, key=self._rank)
        if after:
            mark = self._rank(after)
            k = next((i for i, n in enumerate(ranked) if self._rank(n) > mark), len(ranked))
            ranked = ranked[k:] + ranked[:k]
        return ranked

    def _asleep(self) -> bool:
        """Registered and watching, the watch unfired and fresh, no parked entry due: the
        index has nothing new for this consumer (no transaction needed to know it)."""
        w = self._watch
        if w is None or w.is_ready():
            return False
        now = time.monotonic()
        if now - self._armed_at >= LOST_WAKEUP_RECHECK:
            return False
        return self._parked_until is None or now < self._parked_until

    def _awake(self) -> None:
        w, self._watch = self._watch, None
        if w is not None:
            w.cancel()

    def rotation(self, db: Database) -> list[Queue]:
        """The queues with work now, in this turn's order (one transaction; none while
        this consumer sleeps and nothing woke it)."""
        self.fill(db)
        if self._asleep():
            return []
        self._awake()
        with self._lock:
            more, self._more = self._more, set()
        registered, sleep_token = self._registered, self._sleep_token

        def body(t: Transaction, _: bool) -> list[str]:
            names = self._scan(t)
            if names and registered:
                workindex.wake_up(t, self.wk, sleep_token)  # awake by itself: out of the sleepers
            for name in sorted(more.intersection(names))[:1]:
                workindex.wake_one(t, self.wk, name)  # more here than one consumer's share
            return names

        names = run_once(db, body)
        if names:
            self._started = True
            self._registered = False
        return [self.queue(n) for n in names]

    def served(self, q: Queue, full: bool = False) -> None:
        """``q`` had its turn: the next turn starts after it. ``full``: it gave as many as
        were asked for (more may be there: the next turn wakes another consumer)."""
        with self._lock:
            self._after = q.name
            self._started = True
            self.recent.add(q.name)
            if full:
                self._more.add(q.name)

    def take_recent(self) -> list[Queue]:
        """The queues served since the last call (what a consumer's periodic sweep visits)."""
        with self._lock:
            names, self.recent = self.recent, set()
        return [self.queue(n) for n in sorted(names)]

    def jostle(self) -> None:
        """This consumer met another on a queue (a conflict): its next turn starts at a
        random queue, so that two consumers that took turns in step part ways."""
        with self._lock:
            self._started = False

    def vesting(self, q: Queue) -> bool:
        """Whether ``q`` was found empty at this consumer's last visit (retire it if again)."""
        return q.name in self._empty

    def visited(self, q: Queue, settled: bool) -> None:
        """``q`` gave messages or was retired (``settled``), or was found empty and left."""
        if settled:
            self._empty.discard(q.name)
        else:
            if len(self._empty) > 10_000:
                self._empty.clear()
            self._empty.add(q.name)

    def retire_all(self, db: Database, queues: list[Queue]) -> None:
        """Retire ``queues`` (found empty) in one transaction; a failure only costs visits."""

        def body(t: Transaction, _: bool) -> None:
            now = db_now(t)
            for q in queues:
                workindex.retire(t, q.keys, now)

        try:
            run_once(db, body)
        except QueueError as exc:
            log.debug("could not retire %d queues from the work index: %s", len(queues), exc)
            return
        for q in queues:
            self._empty.discard(q.name)

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
        set (False). Asleep: registered in the transaction whose scan found nothing, so no
        wake-up is missed, and watching the registration; a wait that ends without news
        keeps both for the next one. Bounded by the first parked entry and by
        ``LOST_WAKEUP_RECHECK`` (then it looks and registers afresh)."""
        if not self._asleep():
            self._awake()
            extra = sorted(n for n in self._routed if not workindex.matches(self.pattern, (), n))

            old = self._sleep_token if self._registered else None
            token = new_rand()

            def arm(t: Transaction, _: bool) -> tuple[bool, Watch | None]:
                if self._scan(t):
                    return True, None
                if old is not None:
                    workindex.wake_up(t, self.wk, old)  # renewed: the earlier one goes
                if self._left:
                    # Queues with work left to the consumers they go to (_scan): this one
                    # looks again when their claims would end, awake. Registered, it would
                    # clear its registration at that look, and a producer waking it at the
                    # same moment would conflict (the registration it read was written).
                    return False, None
                key = workindex.sleep(t, self.wk, token, self.pattern, extra)
                return False, t.watch(key)

            found, w = run_once(db, arm)
            if found:
                return True
            if w is None:
                self._registered = False
                back = self._parked_until
                if back is None or not self._left:
                    return True
                end = back if timeout is None else min(back, time.monotonic() + timeout)
                stop.wait(max(0.0, end - time.monotonic()))
                return not stop.is_set() and time.monotonic() >= back
            self._sleep_token = token
            self._watch, self._armed_at, self._registered = w, time.monotonic(), True
            self.watches += 1
        w = self._watch
        assert w is not None
        limit = self._armed_at + LOST_WAKEUP_RECHECK
        if timeout is not None:
            limit = min(limit, time.monotonic() + timeout)
        if self._parked_until is not None:
            limit = min(limit, self._parked_until)
        while not stop.is_set():
            step = min(0.25, limit - time.monotonic())
            if step <= 0:
                return self._parked_until is not None and time.monotonic() >= self._parked_until
            if wait_on(w, step):
                if w.is_ready():
                    self._registered = False  # woken: a waker cleared the registration
                self._awake()
                return True
        return False

    def leave(self, db: Database) -> None:
        """The consumer stops: its registration goes (else a waker would spend a wake-up on
        it until it is stale)."""
        self._awake()
        if self._registered:
            with contextlib.suppress(QueueError):
                run_once(db, lambda t, _: workindex.wake_up(t, self.wk, self._sleep_token))
            self._registered = False

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
                    wanted = [keys.counter(c) for c in (*READY_PARTS, "delayed", "inflight")]
                    raws = t.snapshot.get_many(wanted)
                    if ready_count(*raws[:4]) > 0 or any(unpack_count(raw) > 0 for raw in raws[4:]):
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
