"""In-memory engine with FoundationDB's optimistic concurrency, plus seeded fault injection.

``memory://`` and ``sim://?seed=N&faults=P&delay=S`` are this engine; memory has no faults.
It is where the queue layer proves itself on FoundationDB's terms (developer-guide.rst,
"Transaction basics" and "Conflict ranges"; documentation/sphinx/source/ in FoundationDB's source):

* MVCC: every key keeps a chain of ``(version, value | None)``; a transaction reads the
  snapshot at its read version (the latest commit when it first reads) merged with its
  own buffered writes (the in-process engines' read-your-writes :class:`WriteMap`).
  Versions advance with the clock (1e6 a second) and by >= 1 a commit.
* Conflicts: reads record read-conflict ranges exactly as FDB's ReadYourWrites does (not
  for snapshot reads, not over keys this transaction already set or cleared, only over the
  part of a range actually read). A commit fails with 1020 when a transaction committed
  after its read version wrote into one of them.
* Commit as Transaction::commitMutations (fdbclient/NativeAPI.actor.cpp): a read-only
  transaction returns at once; otherwise the size as Transaction::getSize counts it (2101),
  then makeSelfConflicting's read conflict range, so the 5-second window applies to every
  transaction with writes that took a read version before committing (1007).
* Faults: from ``random.Random(seed)``, each commit with writes may fail with 1020 or 1007
  (not applied) or 1021 (applied or not, by a coin flip) - the cases a layer must survive -
  where FoundationDB could give that commit the code (:func:`fault_possible`).
  ``SimDatabase.fault_source`` is the seam :mod:`fdbqueue.testing` scripts outcomes through
  (1039, 1031 and 1025 during commit too).

One lock guards the store; it is held for one operation at a time, never across user code.
The store itself (version chains, commit resolution, garbage collection, watches) is in
``engines/sim/store.py``; this module holds the transactions, fault injection and the URL.
"""

from __future__ import annotations

import copy
import math
import random
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from fdbqueue.engines.checks import key_after
from fdbqueue.engines.contract import (
    KEY_RANGE_REF_BYTES,
    MUTATION_REF_BYTES,
    SYSTEM_KEYS,
    KeySelector,
    KeyValue,
)
from fdbqueue.engines.limits import TRANSACTION_WINDOW_SECONDS
from fdbqueue.engines.local.mutations import apply_atomic, fill_versionstamp, make_versionstamp
from fdbqueue.engines.local.transaction import LocalDatabase, LocalTransaction
from fdbqueue.engines.local.watches import EventWatch
from fdbqueue.engines.local.writemap import WriteMap
from fdbqueue.engines.sim.faults import (
    MAYBE_COMMITTED_FAULTS,
    CommitInfo,
    Fault,
    fault_possible,
)
from fdbqueue.engines.sim.store import (
    _STAMP,
    _UNDER,
    _VALUE,
    ManualClock,
    Range,
    SimStore,
    _value_at,
    _Write,
)
from fdbqueue.errors import ClusterUnavailableError, EngineError, InvalidURLError

if TYPE_CHECKING:
    from fdbqueue.engines.url import ParsedURL

__all__ = ["SimDatabase", "SimTransaction", "open_sim"]


def _weak_decide(ref: weakref.ref[SimTransaction]) -> Callable[[bytes, _Write], bytes | None]:
    """``SimTransaction._decide`` of the transaction behind ``ref``, holding it weakly (a
    write map is read only through its live transaction)."""

    def decide(key: bytes, w: _Write) -> bytes | None:
        tr = ref()
        assert tr is not None
        return tr._decide(key, w)

    return decide


class SimTransaction(LocalTransaction):
    """One attempt's reads, conflict ranges and buffered writes; the store sees them only at commit."""

    def __init__(self, db: SimDatabase) -> None:
        self._sim = db
        self._rv: int | None = None
        self._rv_time = 0.0
        self._token: int | None = None
        self._empty_commit = False  # a commit that begins the attempt: nothing read or written
        # The write map's hook reaches this transaction through a weak reference: a bound
        # method would make a reference cycle (transaction -> write map -> method ->
        # transaction), and a transaction freed only by the cyclic collector keeps its store
        # and writes until a collection (tests/engines/sqlite/test_lifetime.py).
        self._decider = _weak_decide(weakref.ref(self))
        self._reset_attempt()
        super().__init__(db)

    def _reset_attempt(self) -> None:
        # Buffered writes by key, and the cleared ranges (read through: read-your-writes).
        self._wm: WriteMap[_Write] = WriteMap(self._decider)
        self._clears: list[tuple[int, bytes, bytes]] = []  # (sequence, begin, end) in call order
        self._vs_keys: list[tuple[int, bytes, bytes]] = []  # (sequence, key template, value)
        self._unreadable: list[Range] = []  # where versionstamped keys may land
        self._seq = 0
        self._rconf: list[Range] = []
        self._wconf: list[Range] = []

    # -- attempt life cycle ----------------------------------------------------------------------

    def _begin(self) -> None:
        # The attempt's first read, write or conflict range (LocalTransaction._touch), or a
        # commit of nothing: FoundationDB's commit of a transaction that read and wrote nothing
        # returns at once, without a request (Transaction::commitMutations,
        # fdbclient/NativeAPI.actor.cpp), so traffic() does not count it as an attempt.
        self._release()
        self._reset_attempt()
        if not self._empty_commit:
            for c in self._sim.counters:
                c.began()

    def _commit_attempt(self) -> None:
        self._empty_commit = self._started is None and self._state == "open"
        try:
            super()._commit_attempt()
        finally:
            self._empty_commit = False

    def _rollback(self) -> None:
        # Lock-free on purpose: __del__ calls this from the garbage collector, which may run
        # in the middle of a locked section of this very thread.
        self._release()

    def _release(self) -> None:
        token, self._token, self._rv = self._token, None, None
        if token is not None:
            self._sim._released.append(token)  # dropped from _live under the lock (SimStore)

    def _acquire_locked(self) -> int:
        """The read version, taken at the first read (store lock held).

        As FoundationDB's GRV: at least the latest commit, and advancing with the clock even
        when nothing commits (the master advances commit versions by VERSIONS_PER_SECOND times
        the time elapsed, ``fdbserver/sequencer/masterserver.cpp``, and proxies commit empty
        batches when idle, ``MAX_COMMIT_BATCH_INTERVAL`` in ``fdbserver/core/ServerKnobs.cpp``).
        One below the clock's version, so that every later commit (at least the clock's
        version) is above it.
        """
        rv = self._rv
        if rv is None:
            db = self._sim
            if db._released:
                db._drop_released_locked()  # read-only work never collects: keep _live small
            rv = self._rv = max(db._version, db._now_version() - 1)
            self._rv_time = db.clock()
            self._token = next(db._tokens)
            db._live[self._token] = (rv, self._rv_time)
        elif self._token not in self._sim._live:
            raise EngineError(1007, "read version expired: older than the 5-second window")
        return rv

    def _check_window(self) -> None:
        # FoundationDB counts the 5 s from the read version (taken at the first read), not
        # from the first operation: a transaction that only wrote so far is not too old.
        if self._rv is not None and self.db.clock() - self._rv_time > TRANSACTION_WINDOW_SECONDS:
            raise EngineError(1007, "transaction is older than the 5-second window")

    # -- read-your-writes helpers ----------------------------------------------------------------

    def _check_readable(self, begin: bytes, end: bytes) -> None:
        for ub, ue in self._unreadable:
            if ub < end and begin < ue:
                raise EngineError(1036, "range holds a versionstamped key of this transaction")

    def _eval(self, key: bytes, w: _Write, rv: int) -> bytes | None:
        """This transaction's view of ``key`` given its buffered write ``w``."""
        if w.kind == _VALUE:
            return w.value
        if w.kind == _STAMP:
            raise EngineError(1036, "a versionstamped value cannot be read before commit")
        chain = self._sim._chains.get(key)
        value = None if chain is None or self._wm.cleared(key) else _value_at(chain, rv)
        for op, param in w.ops or ():
            value = apply_atomic(op, value, param)
        return value

    def _decide(self, key: bytes, w: _Write) -> bytes | None:
        """What a range read or key selector sees of a buffered write (the write map's hook;
        the read version is taken: reads run under the store lock after _acquire_locked)."""
        assert self._rv is not None
        return self._eval(key, w, self._rv)

    def _snapshot(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        """Up to ``limit`` (0: all) present pairs of [begin, end) at the read version (lock held)."""
        rv = self._rv
        assert rv is not None
        chains = self._sim._chains
        out: list[KeyValue] = []
        for k in self._sim._keys.irange(begin, end, (True, False), reverse):
            v = _value_at(chains[k], rv)
            if v is not None:
                out.append(KeyValue(k, v))
                if len(out) == limit:
                    break
        return out

    def _add_read_conflict(self, begin: bytes, end: bytes) -> None:
        """Add [begin, end) minus what this transaction's own sets and clears already decide.

        FDB's updateConflictMap: only unmodified ranges and atomic-op-only keys conflict.
        """
        end = min(end, SYSTEM_KEYS)
        if begin >= end:
            return
        wm = self._wm
        if not wm:
            self._rconf.append((begin, end))
            return
        known: list[Range] = list(wm.cleared_in(begin, end))
        if wm.values:
            writes = wm.values
            for k in wm.keys_in(begin, end):
                if writes[k].kind != _UNDER:
                    known.append((k, key_after(k)))
        known.sort()
        cur = begin
        for kb, ke in known:
            if kb > cur:
                self._rconf.append((cur, kb))
            cur = max(cur, ke)
            if cur >= end:
                return
        self._rconf.append((cur, end))

    # -- engine primitives: reads --------------------------------------------------------------

    def _get(self, key: bytes, snapshot: bool) -> bytes | None:
        self._sim._check_up()
        with self._sim._lock:
            rv = self._acquire_locked()
            wm = self._wm
            w = wm.values.get(key)
            if w is not None and w.kind != _UNDER:
                return self._eval(key, w, rv)  # decided by this transaction: no conflict
            if self._unreadable:
                self._check_readable(key, key_after(key))
            cleared = bool(wm) and wm.cleared(key)
            if w is not None:
                value = self._eval(key, w, rv)
            elif cleared:
                value = None
            else:
                chain = self._sim._chains.get(key)
                value = None if chain is None else _value_at(chain, rv)
        if not snapshot and not cleared:
            self._add_read_conflict(key, key_after(key))
        return value

    def _resolve(self, selector: KeySelector, snapshot: bool) -> bytes:
        self._sim._check_up()
        key, or_equal, offset = selector
        with self._sim._lock:
            self._acquire_locked()
            # The offset-th key after the anchor (the last key < key, or <= if or_equal), or
            # before it, over the snapshot overlaid with this transaction's writes.
            result = self._wm.resolve(self._snapshot, selector)
            if offset >= 1:
                lo = key_after(key) if or_equal else key
                hi = key_after(result)
            else:
                hi = key_after(key) if or_equal else key
                lo = result
            if self._unreadable:
                self._check_readable(lo, hi)
        if not snapshot:  # over what resolution examined (RYW addConflictRange for GetKeyReq)
            self._add_read_conflict(lo, hi)
        return result

    def _get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]:
        self._sim._check_up()
        with self._sim._lock:
            self._acquire_locked()
            out = self._wm.get_range(self._snapshot, begin, end, limit, reverse)
            # Only the part actually read conflicts: with the limit reached, the keys past
            # the last one returned were not looked at.
            lo, hi = begin, end
            if limit and len(out) == limit:
                if reverse:
                    lo = out[-1].key
                else:
                    hi = key_after(out[-1].key)
            if self._unreadable:
                self._check_readable(lo, hi)
        if not snapshot:
            self._add_read_conflict(lo, hi)
        return out

    def get_read_version(self) -> int:
        self._sim._check_up()
        return super().get_read_version()

    def _read_version(self) -> int:
        with self._sim._lock:
            return self._acquire_locked()

    # -- engine primitives: writes -------------------------------------------------------------

    def _put(self, key: bytes, w: _Write) -> None:
        self._wm.set(key, w)
        self._wconf.append((key, key_after(key)))

    def _set(self, key: bytes, value: bytes) -> None:
        self._sim._check_up()
        self._put(key, _Write(_VALUE, value))

    def _clear(self, key: bytes) -> None:
        self._sim._check_up()
        self._put(key, _Write(_VALUE, None))

    def _clear_range(self, begin: bytes, end: bytes) -> None:
        self._sim._check_up()
        self._wm.clear_range(begin, end)  # drops the writes inside, merges the cleared ranges
        self._clears.append((self._seq, begin, end))
        self._seq += 1
        self._unreadable = [(ub, ue) for ub, ue in self._unreadable if not (begin <= ub and ue <= end)]
        self._wconf.append((begin, end))

    def _atomic(self, op: str, key: bytes, param: bytes) -> None:
        self._sim._check_up()
        wm = self._wm
        w = wm.values.get(key)
        if w is None:
            if wm and wm.cleared(key):  # over a clear: the result is known
                self._put(key, _Write(_VALUE, apply_atomic(op, None, param)))
            else:
                self._put(key, _Write(_UNDER, None, [(op, param)]))
            return
        if w.kind == _VALUE:
            w.value = apply_atomic(op, w.value, param)
        else:
            assert w.ops is not None
            w.ops.append((op, param))
        self._wconf.append((key, key_after(key)))

    def _versionstamped(self, kind: str, key: bytes, value: bytes) -> None:
        self._sim._check_up()
        if kind == "value":
            self._put(key, _Write(_STAMP, value, []))
            return
        # The final key is known only at commit. Like FDB (RYW atomicOp), the range it may
        # land in - stamps from read version + 1 up to all 0xff - is a write conflict and
        # unreadable (1036) for the rest of the transaction.
        first = make_versionstamp(self._rv + 1 if self._rv is not None else 0)
        lo = fill_versionstamp(key, first)
        hi = key_after(fill_versionstamp(key, b"\xff" * 10))
        self._vs_keys.append((self._seq, key, value))
        self._seq += 1
        self._unreadable.append((lo, hi))
        if lo < SYSTEM_KEYS:
            self._wconf.append((lo, min(hi, SYSTEM_KEYS)))

    def _conflict_range(self, kind: str, begin: bytes, end: bytes) -> None:
        self._sim._check_up()
        if kind == "read":
            # No read version yet is fine: one taken at commit sees no later write.
            self._add_read_conflict(begin, end)
        elif begin < end:
            self._wconf.append((begin, end))

    # -- commit ----------------------------------------------------------------------------------

    def _transaction_size(self) -> int:
        """Transaction::getSize (fdbclient/NativeAPI.actor.cpp) of what RYW would hand over.

        ReadYourWritesTransaction::writeRangeToNativeTransaction sends the write map: one
        ClearRange per cleared range, then one mutation per set or clear of a key (a clear
        inside a cleared range is covered by it) and per atomic op or versionstamped write;
        the write conflict ranges and (RYW readConflicts) the read conflict ranges merged.
        """
        n, total = 0, 0
        wm = self._wm
        for b, e in wm.cleared_ranges:
            n, total = n + 1, total + len(b) + len(e)
        for k, w in wm.values.items():
            if w.kind == _UNDER:
                for _, param in w.ops or ():
                    n, total = n + 1, total + len(k) + len(param)
            elif w.value is None:
                if not wm.cleared(k):
                    n, total = n + 1, total + 2 * len(k) + 1
            else:
                n, total = n + 1, total + len(k) + len(w.value)
        for _, template, value in self._vs_keys:
            n, total = n + 1, total + len(template) + len(value)
        total += n * MUTATION_REF_BYTES
        for ranges in (self._wconf, self._rconf):
            merged = _merge(ranges)
            total += sum(len(b) + len(e) for b, e in merged) + KEY_RANGE_REF_BYTES * len(merged)
        return total

    def _commit(self) -> int:
        db = self._sim
        fault: Fault | None = None
        version = -1
        try:
            db._check_up()
            if not (self._wm or self._vs_keys or self._wconf):
                with db._lock:
                    db.stats.read_only += 1
                return -1  # read-only: commits locally, no check (Transaction::commitMutations)
            if db.delay > 0:
                db.sleep(db._rng.random() * db.delay)
            fired: list[EventWatch] = []
            with db._lock:
                if self._state == "cancelled":
                    # cancel() from another thread while the commit was on its way: it never
                    # reached the proxy here, so nothing applies (on a cluster it may have).
                    raise EngineError(1025, "the transaction was cancelled during commit")
                if db._in_flight:
                    db._land_locked(fired)
                source = db.fault_source
                if source is not None or db.faults > 0:
                    commit = CommitInfo(reads=bool(self._rconf), read_version=self._rv is not None)
                    fault = (source or db.seeded_fault)(commit)
                    if fault is not None and not fault_possible(fault.code, commit):
                        fault = None
                if fault is not None:
                    db.stats.faults[fault.code] = db.stats.faults.get(fault.code, 0) + 1
                    if fault.code not in MAYBE_COMMITTED_FAULTS:
                        raise EngineError(fault.code, "injected fault")
                # Transaction::makeSelfConflicting (called from commitMutations unless
                # causal_write_risky): a read conflict range on a key nobody else writes, so
                # that the resolver checks the read version's age (1007) but nothing can
                # conflict with it. FoundationDB makes the key unique and writes it too; here
                # no commit writes it (the write half would never meet a reader), so one key
                # serves all. Needed only where the check would not run anyway.
                if not self._rconf and self._rv is not None:
                    self._rconf.append(_SELF_CONFLICT)
                if fault is not None and fault.later:
                    db._in_flight.append(self._in_flight_copy())
                elif fault is None or fault.applied:
                    try:
                        version = db._check_and_apply_locked(self, fired)
                    except EngineError:
                        if fault is None:
                            raise
                self._release()
                db._collect_locked()
        except EngineError as exc:
            if exc.code == 1020:
                for c in db.counters:
                    c.conflicted()
            raise
        finally:
            self._release()
        for w in fired:
            w.fire()
        if fault is not None:
            applied = (
                "is still in flight" if fault.later else "was applied" if version >= 0 else "was not applied"
            )
            raise EngineError(fault.code, f"injected fault: the commit {applied}")
        return version

    def _in_flight_copy(self) -> SimTransaction:
        """What this attempt sends, kept to land later (store lock held): the containers are
        replaced, not changed, when the attempt resets; its read version stays registered."""
        late = copy.copy(self)
        if late._rv is not None:
            db = self._sim
            late._token = next(db._tokens)
            db._live[late._token] = (late._rv, late._rv_time)
        return late


_SELF_CONFLICT: Range = (b"\xff/SC/", b"\xff/SC/\x00")


def _merge(ranges: list[Range]) -> list[Range]:
    """Sorted, with overlapping and touching ranges joined (as RYW coalesces them)."""
    out: list[Range] = []
    for b, e in sorted(ranges):
        if out and b <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        elif b < e:
            out.append((b, e))
    return out


FaultSource = Callable[[CommitInfo], "Fault | None"]


class SimDatabase(SimStore, LocalDatabase):
    """The sim engine's database: a :class:`SimStore` with seeded faults and :class:`SimTransaction` s."""

    retry_base_delay = 0.001  # fault-heavy tests retry a lot; FDB's 10 ms would only slow them

    @property
    def may_commit_unknown(self) -> bool:  # type: ignore[override]
        """Only injected faults end a commit unknown here: without them the layer skips receipts."""
        return self.faults > 0 or self.fault_source is not None

    def __init__(
        self, *, seed: int = 0, faults: float = 0.0, delay: float = 0.0, clock: ManualClock | None = None
    ) -> None:
        if not 0.0 <= faults <= 1.0:
            raise ValueError(f"faults must be a probability in [0, 1], got {faults!r}")
        if not (math.isfinite(delay) and delay >= 0.0):
            raise ValueError(f"delay must be a non-negative number of seconds, got {delay!r}")
        super().__init__(clock)
        self.seed, self.faults, self.delay = seed, faults, delay
        self.engine = "sim"
        self.url = f"sim://?seed={seed}&faults={faults}&delay={delay}"
        self._rng = random.Random(seed)
        # The seam fdbqueue.testing scripts through: asked, store lock held, for the outcome
        # of every commit with writes; None: the seeded faults (seeded_fault) decide.
        self.fault_source: FaultSource | None = None
        self._in_flight: list[SimTransaction] = []  # commits an injected 1031 / 1025 left
        self._backoff_hooks: deque[Callable[[], object]] = deque()
        self._outages = 0  # active fdbqueue.testing.outage() contexts

    def seeded_fault(self, commit: CommitInfo) -> Fault | None:
        """The seeded fault of one commit with writes: with probability ``faults``, 1020, 1021
        or 1007 (a third each; 1021 applied or not by a coin flip), None when FoundationDB could
        not give this commit that code. One draw a commit (two for a 1021): same seed, same run."""
        if self.faults <= 0:
            return None
        r = self._rng.random()
        if r >= self.faults:
            return None
        code = (1020, 1021, 1007)[min(2, int(3 * r / self.faults))]
        fault = Fault(code, self._rng.random() < 0.5) if code == 1021 else Fault(code)
        return fault if fault_possible(code, commit) else None

    def backoff(self, seconds: float) -> None:
        hook = self._backoff_hooks.popleft() if self._backoff_hooks else None
        if hook is not None:
            hook()
        super().backoff(seconds)

    def _land_locked(self, fired: list[EventWatch]) -> None:
        """Commits left in flight by an injected 1031 or 1025 reach the resolver now: applied
        unless they conflict or are too old, silently (nobody waits for them any more)."""
        landing, self._in_flight = self._in_flight, []
        now = self.clock()
        for late in landing:
            try:
                if late._rv is not None and now - late._rv_time > TRANSACTION_WINDOW_SECONDS:
                    continue  # the resolver refuses its read version: too old
                self._check_and_apply_locked(late, fired)
            except EngineError:
                pass
            finally:
                if late._token is not None:
                    self._live.pop(late._token, None)

    def _check_up(self) -> None:
        if self._outages:
            raise ClusterUnavailableError(f"{self.url} is unavailable (fdbqueue.testing.outage)")

    def create_transaction(self) -> SimTransaction:
        self._check_up()
        return SimTransaction(self)


def _number(params: dict[str, str], name: str, lo: float, hi: float) -> float:
    raw = params[name]
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and lo <= value <= hi):
        bound = f"between {lo:g} and {hi:g}" if math.isfinite(hi) else f"a number >= {lo:g}"
        raise InvalidURLError(f"sim:// parameter {name} must be {bound}, got {raw!r}")
    return value


def open_sim(url: str, parsed: ParsedURL) -> SimDatabase:
    """Open ``memory://`` (no faults, no parameters) or ``sim://?seed=N&faults=P&delay=S``."""
    from fdbqueue.engines.url import take_params

    if parsed.path:
        raise InvalidURLError(f"{parsed.scheme}:// takes no path, got {parsed.path!r} in {url!r}")
    if parsed.scheme == "memory":
        take_params(parsed, {})
        db = SimDatabase()
        db.engine = "memory"
    else:
        params = take_params(parsed, {"seed": "0", "faults": "0", "delay": "0"})
        try:
            seed = int(params["seed"])
        except ValueError:
            raise InvalidURLError(
                f"sim:// parameter seed must be an integer, got {params['seed']!r}"
            ) from None
        faults = _number(params, "faults", 0.0, 1.0)
        delay = _number(params, "delay", 0.0, math.inf)
        db = SimDatabase(seed=seed, faults=faults, delay=delay)
    db.url = url
    return db
