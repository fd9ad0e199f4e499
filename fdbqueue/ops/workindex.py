"""The work index: which queues of a database may have work, kept with the messages.

Apple's QuiCK (Shraer et al., "QuiCK: a queuing system in CloudKit", SIGMOD 2021) serves
millions of queues with a two-level design: a top-level index holds one entry per queue that
has work, and consumers scan the index, not the queues. Here the entry is
``root + ("wk", queue)``: ``b""`` when the queue may have a deliverable message now, or an
8-byte version before which it has none (its next delayed message or lease deadline: QuiCK's
"vesting time"). It is a hint that may say too much, never too little:

* **Marked** by every move that gives a queue work (``moves``: an enqueue, a message made
  ready or delayed, dequeue enabled again), in the same transaction, as FoundationDB's record
  layer keeps an index in the transaction that changes its record ("IndexMaintainer"). A mark
  reads the entry at snapshot isolation and writes only when it is missing or parked, so
  producers of a busy queue write nothing here and never conflict with one another; while
  the entry is there the mark adds a read conflict on it, so a worker retiring it at the
  same moment makes the producer retry (and mark again) rather than leave a message unindexed.
* **Retired or parked** by a consumer that found nothing (:func:`retire`), in a transaction
  that reads the queue's ready, delayed and leased ranges without snapshot isolation: a
  message written meanwhile conflicts it (FoundationDB's read-write conflict rule), and it
  tries again.

**Waking idle consumers: one, not all.** An earlier design bumped one global key,
``root + ("wb",)``, whenever an entry came into the index, and every idle consumer watched
it. That key was written by about one commit in seven of a busy database, and FoundationDB
keeps one key on one storage team: its developer guide ("Avoid hot keys"; the known
limitations: a key modified more than 10-100 times a second) warns against exactly that, and
a lagging team makes ratekeeper throttle every client. And each ring woke every idle
consumer to rescan the index for one queue only one of them would serve (a herd: about
70-120 transactions per message with 32 idle consumers on 200 queues).

Instead an idle consumer registers itself, ``root + ("ws", token)`` (a random token; the
value says which queues it serves and when it registered), in the transaction whose scan of
the index found nothing, and watches that key (no wake-up slips between the scan and the
watch). A mark that brings an entry into the index reads a bounded number of registrations
at snapshot isolation from a random point (:data:`SLEEPERS_READ`) and clears the first whose
consumer serves that queue, with a read conflict on it so that two producers never spend
their wake-ups on the same sleeper: one consumer wakes per queue that comes to have work,
the others sleep on. These keys are random and each is written twice per sleep (the
registration and the wake-up), so no key takes a share of the writes. A consumer that finds
more than its fair share in a queue wakes one more the same way (:func:`wake_one`), so a
burst scales out one consumer at a time, as QuiCK's consumers each lease a queue's
top-level pointer rather than all taking it. A registration older than
``STALE_SECONDS`` (its consumer re-registers more often than that while it lives) is a
consumer that died: a waker clears it and looks further.

**Claims and vesting** (QuiCK's lease on a queue's top-level pointer, and its vesting time).
A consumer that takes messages from a queue, or finds one nobody claims empty, writes the
queue's claim ``root + ("wc", queue)`` for ``CLAIM_SECONDS`` (:func:`claim`): the others skip
it when the claimer took what there was and visit it last when it left more, so consumers
spread over the queues instead of meeting on the same heads (and a queue nobody claims
goes to one of the consumers with a live claim: ``runtime/fairness.py``). A blind write on the queue's own
key: no conflict, and producers never read it. A queue found empty is retired only once the
consumer found it empty twice in a row, or in a turn that found nothing at all
(``runtime/worker.py``): a queue its producers are feeding stays indexed, so no retire races
their enqueues, and they write no entry and wake no sleeper. Every function composes inside
the caller's transaction.
"""

from __future__ import annotations

import fnmatch
import json
import struct
from collections.abc import Iterable, Sequence
from typing import Any

from fdbqueue.engines.contract import Transaction
from fdbqueue.ops.waiting import LOST_WAKEUP_RECHECK, not_before
from fdbqueue.store.clock import db_now, versions
from fdbqueue.store.config import decode_config, decode_state
from fdbqueue.store.entropy import new_rand
from fdbqueue.store.layout import DEFAULT_ROOT, QueueKeys, WorkKeys, queues_range, root_subspace

_DUE = struct.Struct(">Q")
_KEYS: dict[Any, WorkKeys] = {}


def work_keys(root: tuple[Any, ...] = DEFAULT_ROOT) -> WorkKeys:
    found = _KEYS.get(root)
    if found is None:
        found = _KEYS[root] = WorkKeys(root)
    return found


def _keys_of(keys: QueueKeys) -> WorkKeys:
    prefix = keys.root.key()
    found = _KEYS.get(prefix)
    if found is None:
        found = _KEYS[prefix] = WorkKeys(keys.root)
    return found


UNREAD = b"unread"  # no entry's value: entries are b"" or 8 bytes
CLAIM_SECONDS = 0.25  # how long a consumer that took messages from a queue claims it
SLEEPERS_READ = 32  # registrations a waker looks at (from one end, at random) to wake one
STALE_SECONDS = 4 * LOST_WAKEUP_RECHECK  # a registration not renewed that long: its consumer died
ERROR_SUFFIX = ".error"  # the default error queues' names (config.error_queue_name)


def mark(
    tr: Transaction, keys: QueueKeys, seen: bytes | object | None = UNREAD, *, conflicts: bool = True
) -> None:
    """Queue ``keys`` may have a deliverable message now (see the module docstring).
    ``seen``: the entry's value, when the caller read it at snapshot isolation already;
    ``conflicts``: False where the engine never conflicts (``engine_traits``' first)."""
    entry = keys.work_entry
    if seen is UNREAD:
        seen = tr.snapshot.get(entry)
    if seen == b"":
        # A retire committed meanwhile conflicts: marked again. Where transactions never
        # conflict (the embedded engine: one writer at a time, its reads under the store
        # lock), no retire can commit between the read and this commit: nothing to add.
        if conflicts:
            tr.add_read_conflict_key(entry)
        return
    wk = _keys_of(keys)
    if keys.q.key() in getattr(tr.options, "volatile", ()):
        # A volatile queue's commit skips the fsync (the embedded engine): its entry with it,
        # and the wake-up of a sleeper.
        tr.options.set_volatile_prefix(entry)
        tr.options.set_volatile_prefix(wk.sleepers_range()[0])
    tr.set(entry, b"")
    wake_one(tr, wk, keys.name)


def unmark(tr: Transaction, keys: QueueKeys) -> None:
    """The queue is gone (destroyed): its entry goes too."""
    tr.clear(keys.work_entry)


def decode_due(raw: bytes) -> int:
    """An entry's value as the version from which its queue may have work (0: now)."""
    return 0 if not raw else int(_DUE.unpack(raw)[0])


def retire(tr: Transaction, keys: QueueKeys, now: int) -> int | None:
    """A consumer found nothing deliverable in the queue at ``now`` (a version): clear its entry
    when it holds nothing, park it until its next delayed message or lease deadline, or leave
    it when work is there after all. Returns the version it is parked until (0: left as work
    now, None: cleared). Any message made ready or delayed in the queue before this commits
    conflicts it (through the wake key and the delayed range; see below)."""
    wk = _keys_of(keys)
    entry = wk.entry(keys.name)
    tr.clear(wk.claim(keys.name))  # found nothing: nobody serves it now
    raw_cfg, raw_state, _wake = tr.get_many([keys.config, keys.state, keys.wake])
    if raw_cfg is None:
        tr.clear(entry)  # no such queue (destroyed, or never created)
        return None
    # Which writes must conflict this transaction (a conflict over more would only make it
    # collide with the queue's other consumers, whose leases and acks clear ready keys and
    # lease entries): a message made ready after the read version bumps the wake key
    # (moves.put_ready, count_new: the queue's index high-water mark), so a read of that
    # key stands for the ready range; a delayed message lands in the delayed range, read
    # without snapshot isolation. A lease taken meanwhile took a message this transaction
    # saw ready (then the entry stays) or one made ready after its read version (then the
    # wake key conflicts it); a lease entry that goes (an ack) only parks the entry for
    # longer than needed. So the ready and lease ranges are read at snapshot isolation.
    head = tr.snapshot.get_range(*keys.ready_range(), limit=1)
    firsts: dict[str, int] = {}
    for tag in ("d", "l"):
        rd = tr if tag == "d" else tr.snapshot
        first = rd.get_range(*keys.index_range(tag), limit=1)
        if first:
            firsts[tag] = int(keys.unpack_tail(first[0].key)[1])
    due = min(firsts.values()) if firsts else None
    if head:
        if not decode_state(raw_state).dequeue:
            tr.clear(entry)  # paused: enabling dequeue again marks it (moves.wake)
            return None
        if not decode_config(raw_cfg).strict_order:
            return 0  # deliverable (the consumer raced a producer): stays as it is
        # Strict order: held back by a live lease (its ack marks the queue) or the head's
        # retry delay; otherwise deliverable.
        held = [t for t in (firsts.get("l"), not_before(keys, head[0].key, head[0].value)) if t and t > now]
        if not held:
            return 0
        due = min(held)
    if due is None:
        tr.clear(entry)
        return None
    due = max(due, now + 1)
    tr.set(entry, _DUE.pack(due))
    return due


def fill(tr: Transaction, root: tuple[Any, ...], names: Iterable[str]) -> None:
    """Mark the named queues (an index built over queues that had messages before it was
    kept): a consumer that finds nothing in one retires it."""
    for name in names:
        mark(tr, QueueKeys.make(name, root))


def listing_names(
    tr: Transaction, root: tuple[Any, ...], begin: bytes | None, limit: int
) -> list[tuple[bytes, str]]:
    """Up to ``limit`` (key, queue name) pairs of the queue listing, after ``begin``."""
    start, end = queues_range(root)
    sub = root_subspace(root)
    kvs = tr.get_range(begin + b"\x00" if begin is not None else start, end, limit)
    return [(kv.key, str(sub.unpack(kv.key)[1])) for kv in kvs]


# -- idle consumers asleep, woken one at a time --------------------------------------------------


def matches(pattern: str, extra: Sequence[str], name: str) -> bool:
    """Whether a consumer of ``pattern`` (``fnmatch``) and the named ``extra`` queues serves
    queue ``name``: error queues only when the pattern names them (``"tenant.*.error"``)."""
    if name in extra:
        return True
    if name.endswith(ERROR_SUFFIX) and not pattern.endswith(ERROR_SUFFIX):
        return False
    return fnmatch.fnmatchcase(name, pattern)


def sleep(tr: Transaction, wk: WorkKeys, token: bytes, pattern: str, extra: Sequence[str]) -> bytes:
    """Register an idle consumer of ``pattern`` and ``extra`` queues; returns the key to
    watch (in this transaction: a wake-up cannot slip in between)."""
    key = wk.sleeper(token)
    value = {"p": pattern, "at": db_now(tr)}
    if extra:
        value["q"] = sorted(extra)
    tr.set(key, json.dumps(value, separators=(",", ":")).encode())
    return key


def wake_one(tr: Transaction, wk: WorkKeys, name: str) -> bool:
    """Wake one idle consumer that serves queue ``name`` (clear its registration: its watch
    fires), if one is among the :data:`SLEEPERS_READ` registrations read from a random
    point; True when one was woken. Snapshot reads: producers never conflict over who is
    asleep; a read conflict on the one cleared, so two wakers never wake the same."""
    # One read, from either end at random: a waker pays one round trip, found or not (a
    # read from a random point would take a second to wrap around when few sleep), and two
    # wakers at once still pick apart (the random pick below).
    begin, end = wk.sleepers_range()
    kvs = tr.snapshot.get_range(begin, end, SLEEPERS_READ, reverse=new_rand()[0] & 1 == 1)
    if not kvs:
        return False
    stale = db_now(tr) - versions(STALE_SECONDS)
    found: list[bytes] = []
    for kv in kvs:
        try:
            info = json.loads(kv.value)
            pattern, extra, at = str(info["p"]), list(info.get("q", ())), int(info["at"])
        except (ValueError, KeyError, TypeError):
            tr.clear(kv.key)  # not a registration this layer wrote: out of the way
            continue
        if at < stale:
            tr.clear(kv.key)  # its consumer stopped renewing it: gone
            continue
        if matches(pattern, extra, name):
            found.append(kv.key)
    if not found:
        return False
    # One at random of those read: two wakers at once seldom pick the same (they would
    # conflict, and one try again).
    key = found[int.from_bytes(new_rand(), "big") % len(found)]
    tr.add_read_conflict_key(key)
    tr.clear(key)
    return True


def wake_up(tr: Transaction, wk: WorkKeys, token: bytes) -> None:
    """An idle consumer is awake (or gone): its registration goes."""
    tr.clear(wk.sleeper(token))


# -- claims: one consumer at a time serves a queue first -----------------------------------------


def claim(tr: Transaction, keys: QueueKeys, token: bytes, more: bool) -> None:
    """The consumer ``token`` took messages from the queue, and left ``more`` ready or not:
    for ``CLAIM_SECONDS`` (renewed by each lease) it serves the queue first in its turns,
    and the others skip it (nothing more: what comes next is the claimer's) or visit it last
    (QuiCK's consumers lease a queue's top-level pointer so that one serves a queue at a
    time; a queue with more than one consumer's share still has them all). A consumer that
    finds the queue empty and retires it clears the claim; one that dies leaves it to end.
    A blind write on the queue's own claim key: no conflict, and producers never read it."""
    wk = _keys_of(keys)
    until = _DUE.pack(db_now(tr) + versions(CLAIM_SECONDS))
    tr.set(wk.claim(keys.name), until + token + (b"+" if more else b""))


def claims(
    tr: Transaction,
    wk: WorkKeys,
    prefix: str,
    now: int,
    token: bytes,
    limit: int,
    tokens: set[bytes] | None = None,
) -> tuple[dict[str, int], set[str]]:
    """The live claims on the queues under ``prefix`` at ``now`` (a snapshot read): those of
    other consumers than ``token`` (name -> the version the claim ends, negated when more is
    ready), and the names ``token`` claims itself. ``tokens``: gets the tokens of the
    consumers that hold a live claim (the consumers busy on these queues now)."""
    out, own = {}, set()
    for kv in tr.snapshot.get_range(*wk.claims_range(prefix), limit):
        v = kv.value
        if len(v) < 16:
            continue
        until = int(_DUE.unpack(v[:8])[0])
        if until <= now:
            continue
        if tokens is not None:
            tokens.add(v[8:16])
        if v[8:16] == token:
            own.add(wk.claimed(kv.key))
        else:
            out[wk.claimed(kv.key)] = -until if v[16:] == b"+" else until
    return out, own


def taken_by_other(tr: Transaction, keys: QueueKeys, token: bytes) -> bool:
    """Whether another consumer than ``token`` claims the queue now, having taken what
    there was (a snapshot read of the claim: one written since the caller's scan counts)."""
    v = tr.snapshot.get(_keys_of(keys).claim(keys.name))
    if v is None or len(v) < 16 or v[8:16] == token or v[16:] == b"+":
        return False
    return int(_DUE.unpack(v[:8])[0]) > db_now(tr)
