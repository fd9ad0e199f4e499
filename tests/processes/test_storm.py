"""The SIGKILL storm: real processes share one store file while the test kills them at random.

On ``sqlite://...?sync=full`` and ``?sync=normal``, each a store of its own, child
processes (forkserver: each restart is a fork of a server that has already imported
fdbqueue, so a kill lands in real work, not in an import) run tests/support/storm_children.py:

* PRODUCERS producers send numbers 0..NUMBERS-1, each as one message to the exactly-once
  queue and one to the lease queue, with dedup key ``"<p>-<n>"``: half as one enqueue call
  per queue, half as both enqueues in one transaction. A restarted producer starts again a
  few numbers before the last it had logged as acknowledged, so it re-sends messages the
  store already has (some already consumed): dedup must swallow them.
* exactly-once consumers: a hand-written ``dequeue(tr)`` loop and a ``Worker`` in
  ``exactly_once`` mode; each consumption is counted in the store in the dequeue's own
  transaction (the ground truth).
* lease consumers: a hand-written lease/record/ack loop and a lease-mode ``Worker`` whose
  handler records each delivery in the store before the ack (at least once).
* every 50th number's first delivery fails on purpose in both queues (an aborted dequeue,
  a nack with a retry delay), so retries, the delayed index and the failure counts run
  under the kills too.
* an admin process creating, filling, leasing from, purging, destroying and re-creating a
  third queue, and reading the others' stats, on the same store.

The test SIGKILLs a ready child every 0.1-0.5 s (producers every other kill, the other
roles in turn) and starts a replacement, until the producers have sent everything and at
least KILLS kills are made; then it SIGKILLs every child at once, consumers mid-flight.
Then it checks:

1. each queue's counters (ready, in flight, delayed) equal what a scan of its keys finds,
   with the dead consumers' leases still out; ``fdbqueue.queue_stats`` equals the keys as
   the views count them (a due delayed message is ready, an ended lease is not in flight),
   read in one transaction;
2. after LEASE_SECONDS of database time (the real clock: database time follows it) the
   stats still equal the keys so counted (every lease ended now); sweeps leave nothing in
   flight or delayed (what the leases' expiry sent to the delay index comes due within the
   retry delay), and the counters and the stats then equal the keys as they are;
3. a fresh consumer (this process) drains both queues: nothing is left in them, nothing
   was dead-lettered;
4. every number was acknowledged to its producer, each send of it (re-sends included) was
   told the same ids, those the store's dedup entries hold; every message was consumed
   exactly once from the exactly-once queue and at least once from the lease queue, with
   the acknowledged id; no lease delivery was processed twice (a duplicate is a later
   delivery) and every redelivery is explained: an ack refused as too late, or a killed
   holder of at most as many unacked deliveries as it can hold at once (from the records:
   which process processed each delivery); no payload or header arrived damaged; the ``done`` and
   ``made_ready`` totals match; ``PRAGMA integrity_check`` is ok.

Size: the default is CI-sized: 4 producers x 750 numbers = 6,000 messages and at least 40
kills per store (kills go on while the producers send), 35-65 s for both stores on the
2-core machine shared with other work. ``FDBQUEUE_STORM_SCALE=10`` runs by hand a storm
about ten times larger (8 producers, 120,000 messages and at least 400 kills per store);
any factor works. ``FDBQUEUE_STORM_SEED=<seed>`` makes the test's choices (whom to kill,
when) those of a printed seed again; the children's timing stays the OS's. ``-s`` prints the
seed and where the store and the children's logs are kept, then each storm's time, kills by
role, what was in flight at the last kill, re-sends and redeliveries.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import random
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import LeaseError, Queue
from fdbqueue.store.clock import db_now
from fdbqueue.store.codec import unpack_count
from fdbqueue.store.layout import READY_PARTS, ready_count
from tests.support import storm_children as sc
from tests.support.processes import Children, assert_nothing_left, held, real_clock

SCALE = float(os.environ.get("FDBQUEUE_STORM_SCALE", "1"))
PRODUCERS = 4 if SCALE < 2 else 8
NUMBERS = max(20, int(750 * SCALE))  # per producer: one message in each checked queue
KILLS = max(6, int(40 * SCALE))  # per store
KILL_EVERY = (0.1, 0.5)  # seconds between kills
# A kill cycle: producers every other kill, every other role in turn, so each is killed.
ROLES = ("producer", "eo-loop", "producer", "eo-worker", "producer", "lease-loop", "producer", "lease-worker")
ROLES += ("producer", "admin")
LEASE_ROLES = ("lease-loop", "lease-worker")
CONSUMERS = (
    ("eo-loop", sc.eo_loop),
    ("eo-worker", sc.eo_worker),
    ("lease-loop", sc.lease_loop),
    ("lease-worker", sc.lease_worker),
    ("admin", sc.admin),
)
# Bounds on waiting, never on speed: generous, so a loaded machine is slow, not failing.
GIVE_UP = 300 * SCALE + 120  # seconds for the producers to finish, kills included
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(int(2 * GIVE_UP + 300)),
    pytest.mark.usefixtures(real_clock.__name__),
]


@pytest.fixture(scope="module", autouse=True)
def _forkserver() -> None:
    # Children fork from a server that imported these first (if this test starts it).
    multiprocessing.get_context("forkserver").set_forkserver_preload(
        ["fdbqueue", "tests.support.storm_children"]
    )


def _done(out: Path) -> bool:
    return all((out / f"prod-{p}.done").exists() for p in range(PRODUCERS))


def _kill_next(kids: Children, order: Iterator[str], out: Path, rng: random.Random) -> bool:
    """SIGKILL a ready child of the next role that has one, and start its replacement."""
    for _ in range(len(ROLES)):
        role = next(order)
        candidates = kids.killable(role)
        if not candidates:
            continue
        child = rng.choice(candidates)
        if not kids.kill(child):
            continue  # it had just ended: a producer that sent its last number
        if role != "producer" or not (out / f"prod-{child.args[2]}.done").exists():
            kids.restart(child)
        return True
    return False


def _storm(kids: Children, out: Path, rng: random.Random) -> tuple[float, int]:
    """Kill until the producers are done and KILLS kills are made: the caller's last SIGKILL
    of every child then comes with the consumers mid-flight (or idle, waiting on watches).
    Returns (seconds, kills while a producer was sending)."""
    start = time.monotonic()
    order = itertools.cycle(ROLES)
    next_kill = start + rng.uniform(*KILL_EVERY)
    during = 0
    while True:
        kids.check_alive()
        if _done(out) and sum(kids.kills.values()) >= KILLS:
            break
        assert time.monotonic() - start < GIVE_UP, f"the producers did not finish in {GIVE_UP} s"
        if time.monotonic() >= next_kill:
            producing = not _done(out)
            if _kill_next(kids, order, out, rng) and producing:
                during += 1
            next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
        time.sleep(0.05)
    return time.monotonic() - start, during


# -- the checks -------------------------------------------------------------------------------


def _scan(db: Any, q: Queue, tag: str) -> int:
    return len(db.get_range_startswith(q.keys.q.pack((tag,))))


def _assert_counters_match_keys(db: Any, name: str) -> tuple[int, int, int]:
    """The durable ready, in-flight and delayed counters equal the keys a scan finds. (The
    stats are these counters corrected for what is due and not yet swept, as every view
    shows it: compared with the keys after the final sweep, when nothing is due.)"""
    q = Queue(name)
    # the ready count: ready - taken + (wake - counted) (store/layout.py: ready_count)
    ready = ready_count(*(db.get(q.keys.counter(c)) for c in READY_PARTS))
    counters = (ready, *(unpack_count(db.get(q.keys.counter(c))) for c in ("inflight", "delayed")))
    leased, deadlines = _scan(db, q, "f"), _scan(db, q, "l")
    found = (_scan(db, q, "r"), leased, _scan(db, q, "d"))
    assert counters == found, f"{name}: counters say ready/inflight/delayed {counters}, the keys {found}"
    assert deadlines == leased, f"{name}: {leased} leased messages but {deadlines} lease deadlines"
    return found


@fdbqueue.transactional
def _assert_views_match_keys(tr: Any, name: str) -> None:
    """``fdbqueue.queue_stats`` equals the keys a scan finds, corrected as every view corrects
    the counters (fdbqueue/ops/views.py): a delayed message that has come due is ready, a
    lease that has ended is not in flight. One transaction: stats and scan read one version
    of the store at one database time, so this holds whatever is due, with no sweep."""
    q = Queue(name)
    st = fdbqueue.queue_stats(tr, name)
    now = db_now(tr)
    due = len(tr.get_range(*q.keys.index_range("d", now + 1)))
    ended = len(tr.get_range(*q.keys.index_range("l", now + 1)))
    ready, leased, delayed = (len(tr.get_range_startswith(q.keys.q.pack((t,)))) for t in ("r", "f", "d"))
    # exact: no index held more due entries than a view reads (VIEW_SCAN_LIMIT), as here
    seen = (st.ready, st.inflight, st.lease_ended, st.delayed, st.exact)
    want = (ready + due, leased - ended, ended, delayed - due, True)
    assert seen == want, f"{name}: stats say ready/inflight/lease ended/delayed/exact {seen}, the keys {want}"


def _final_sweep(db: Any, name: str) -> None:
    """Sweep until nothing is in flight and nothing delayed: the dead consumers' leases have
    run out by now, and what their expiry or a nack sent to the delay index (the lease
    queue's retry_delay) comes due within the retry delay. Then nothing is due and not yet
    swept, so the stats show the counters as they are."""
    q = Queue(name)
    deadline = time.monotonic() + 60
    while True:
        q.sweep(db)
        if held(db, q)[1:] == (0, 0):
            return
        assert time.monotonic() < deadline, f"{name}: in flight or delayed after sweeping: {held(db, q)}"
        time.sleep(0.2)


@fdbqueue.transactional
def _take_eo(tr: Any, q: Queue, n: int) -> int:
    """Dequeue and record up to ``n`` messages in one transaction; how many."""
    for i in range(n):
        m = q.dequeue(tr)
        if m is None:
            return i
        sc.record_eo(tr, m)
    return n


@fdbqueue.transactional
def _settle(tr: Any, q: Queue, batch: list[Any]) -> None:
    """Record and ack leased messages, all in one transaction."""
    for m in batch:
        sc.record_delivery(tr, m)
        q.ack(tr, m)


def _drain(db: Any) -> None:
    """A fresh consumer (no refusals, no kills) takes what is left, in batches: a storm
    ten times the default leaves tens of thousands of messages."""
    eo, lease = Queue(sc.EO), Queue(sc.LEASE)
    deadline = time.monotonic() + GIVE_UP
    while _take_eo(db, eo, 64):
        assert time.monotonic() < deadline, f"the exactly-once queue did not drain: {held(db, eo)}"
    while True:
        assert time.monotonic() < deadline, f"the lease queue did not drain: {held(db, lease)}"
        batch = lease.lease_many(db, 64, sc.LEASE_SECONDS)
        if batch:
            # A lease run out (this process descheduled on a loaded machine) aborts the
            # batch, records and acks together: the sweep hands those messages out again.
            with contextlib.suppress(LeaseError):
                _settle(db, lease, batch)
            continue
        if held(db, lease) == (0, 0, 0):
            return
        lease.sweep(db)
        time.sleep(0.2)


def _acknowledged(out: Path) -> tuple[dict[str, set[tuple[str, str]]], int]:
    """What the producers were told: per number, the (exactly-once, lease) ids each send of
    it returned; and how many sends there were in all (re-sends included)."""
    acked: dict[str, set[tuple[str, str]]] = {}
    sends = 0
    for f in out.glob("prod-*-*.log"):
        p = int(f.name.split("-")[1])
        for line in f.read_text().splitlines():
            n, eo_id, lease_id = line.split()
            acked.setdefault(sc.key(p, int(n)), set()).add((eo_id, lease_id))
            sends += 1
    return acked, sends


def _committed(db: Any, name: str) -> dict[str, str]:
    """The messages the store took, by dedup key: one entry each, ``<id>|<version>`` (kept
    for the dedup window, an hour, past the end of this test)."""
    q = Queue(name)
    return {
        q.keys.unpack_tail(kv.key)[1]: kv.value.decode().split("|")[0]
        for kv in db.get_range_startswith(q.keys.q.pack(("k",)))
    }


def _records(db: Any, prefix: bytes) -> dict[str, int]:
    return {kv.key[len(prefix) :].decode(): unpack_count(kv.value) for kv in db.get_range_startswith(prefix)}


def _ids(db: Any, prefix: bytes) -> dict[str, str]:
    return {kv.key[len(prefix) :].decode(): kv.value.decode() for kv in db.get_range_startswith(prefix)}


def _refused_ids(out: Path) -> set[str]:
    """The ids of the messages whose ack was refused as too late: the lease loop's
    ``refused-*.log`` and the Worker's "could not ack <id>" warnings."""
    ids = {line for f in out.glob("refused-*.log") for line in f.read_text().split()}
    for f in (out / "err").glob("*.err"):
        ids.update(re.findall(r"could not ack ([^\s:]+)", f.read_text(errors="replace")))
    return ids


def _unnamed_ack_failures(out: Path) -> list[str]:
    """The Worker's batched acks that failed outright (``could not ack <n> messages``, the
    Settler's log line): their messages come back unnamed, charged to their holder."""
    found = []
    for f in (out / "err").glob("*.err"):
        text = f.read_text(errors="replace")
        found += [f"{f.stem}: {line}" for line in re.findall(r"could not ack \d+ messages.*", text)]
    return found


def test_the_checks_hold_with_leases_out_and_retries_delayed(tmp_path: Path) -> None:
    """The storm's counter and stats checks on what its final SIGKILL leaves in the lease
    queue: a lease out (its holder dead) and a retry waiting in the delay index. The final
    sweep sends the expired lease to the delay index too (the queue's retry_delay); the stats
    show a due delayed message as ready, so they meet the keys only once nothing is delayed
    (the old final sweep stopped when nothing was in flight: this failed every time)."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    fdbqueue.create_queue(db, "l", lease_seconds=0.3, retry_delay=0.2, max_deliveries=1000)
    q = Queue("l")
    q.enqueue_many(db, [{"n": n} for n in range(4)])
    _held, nacked = q.lease_many(db, 2, 0.3)  # the first one's holder is dead
    q.nack(db, nacked)  # delayed for the retry delay
    _assert_counters_match_keys(db, "l")
    _assert_views_match_keys(db, "l")
    time.sleep(0.5)  # the lease has ended, the retry has come due: nothing swept yet
    _assert_views_match_keys(db, "l")
    _final_sweep(db, "l")
    assert _assert_counters_match_keys(db, "l") == (4, 0, 0)
    st = fdbqueue.queue_stats(db, "l")
    assert (st.ready, st.inflight, st.delayed) == (4, 0, 0)
    db.close()


@pytest.mark.parametrize("sync", ["full", "normal"])
def test_sigkill_storm_loses_duplicates_and_corrupts_nothing(sync: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "err").mkdir(parents=True)
    path = tmp_path / "storm.db"
    url = f"sqlite://{path}?sync={sync}"
    db = fdbqueue.open(url)
    # max_deliveries is high: a message leased again and again by consumers that are killed
    # must not be dead-lettered here (tests/layer/test_delivery.py covers that path).
    fdbqueue.create_queue(db, sc.EO, max_deliveries=1000)
    # The lease queue's retries wait a little: nacked messages pass through the delayed index.
    fdbqueue.create_queue(db, sc.LEASE, lease_seconds=sc.LEASE_SECONDS, retry_delay=0.2, max_deliveries=1000)
    # The test's choices (FDBQUEUE_STORM_SEED replays a printed seed's); the children's timing is the OS's.
    seed = int(os.environ.get("FDBQUEUE_STORM_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    # Said first, so a storm that fails still names its seed and where its store and the
    # children's logs (prod-*, refused-*, admin-*, err/<pid>.err) are kept.
    print(f"\nstorm sync={sync} seed={seed}: store and logs in {tmp_path}")
    kids = Children("forkserver", errors=out / "err")
    try:
        for p in range(PRODUCERS):
            kids.start("producer", sc.producer, url, str(out), p, NUMBERS, ready=True, may_finish=True)
        for role, target in CONSUMERS:
            kids.start(role, target, url, str(out), ready=True)
        seconds, during = _storm(kids, out, rng)
    finally:
        kids.stop()
    kills = sum(kids.kills.values())
    admin_ops = Counter(line for f in out.glob("admin-*.log") for line in f.read_text().split())
    print(
        f"storm sync={sync} seed={seed}: {seconds:.1f} s, {kills} kills ({during} while producing): "
        f"{dict(kids.kills)}; stopped at the end: {dict(kids.stopped)}; admin: {dict(admin_ops)}"
    )

    # 1-2. Counters against keys, with the dead consumers' leases out, then after a sweep.
    names = [sc.EO, sc.LEASE] + ([sc.SCRATCH] if sc.SCRATCH in fdbqueue.list_queues(db) else [])
    print(
        f"  ready/in flight/delayed at the stop: { {n: _assert_counters_match_keys(db, n) for n in names} }"
    )
    for name in names:
        _assert_views_match_keys(db, name)
    time.sleep(sc.LEASE_SECONDS + 0.5)  # database time follows the monotonic clock
    for name in names:
        _assert_views_match_keys(db, name)  # now with every lease ended, delays due
        _final_sweep(db, name)
        found = _assert_counters_match_keys(db, name)
        st = fdbqueue.queue_stats(db, name)  # nothing due, nothing delayed: the views show the counters
        assert (st.ready, st.inflight, st.delayed) == found, (name, st)

    # 3. A fresh consumer drains both queues; nothing is left and the totals add up.
    _drain(db)
    for name in (sc.EO, sc.LEASE):
        assert_nothing_left(db, name)
    acked, sends = _acknowledged(out)
    eo_ids, lease_ids = _committed(db, sc.EO), _committed(db, sc.LEASE)
    every = {sc.key(p, n) for p in range(PRODUCERS) for n in range(NUMBERS)}
    assert set(acked) == every, f"numbers never acknowledged: {sorted(every - set(acked))[:5]}"
    assert set(eo_ids) == set(lease_ids) == every, (
        f"unexpected dedup entries: {sorted(set(eo_ids) ^ every)[:5]}"
    )
    # A re-send (a restarted producer's) was told the first send's ids: no second message.
    told = {k: ids for k, ids in acked.items() if ids != {(eo_ids[k], lease_ids[k])}}
    assert not told, f"sends of one number were told other ids than the store's: {list(told.items())[:3]}"

    # 4. Exactly once / at least once, against the records in the store.
    bad = db.get_range_startswith(b"storm/bad/")
    assert not bad, f"{len(bad)} messages arrived damaged, e.g. {bad[:3]}"
    eo = _records(db, b"storm/eo/")
    lost = every - set(eo)
    twice = {k: n for k, n in eo.items() if n != 1}
    assert not lost, f"exactly-once queue: {len(lost)} messages never consumed, e.g. {sorted(lost)[:3]}"
    assert not twice, f"exactly-once queue: consumed more than once: {list(twice.items())[:5]}"
    assert set(eo) == every, f"exactly-once queue: consumed unknown messages {sorted(set(eo) - every)[:3]}"
    assert _ids(db, b"storm/eo-id/") == eo_ids, "exactly-once queue: a consumed message had another id"

    deliveries = _records(db, b"storm/lease/")
    per_message = Counter(k.rsplit("/", 1)[0] for k in deliveries)
    lost = every - set(per_message)
    assert not lost, f"lease queue: {len(lost)} messages never processed, e.g. {sorted(lost)[:3]}"
    assert set(per_message) == every, f"lease queue: unknown messages {sorted(set(per_message) - every)[:3]}"
    assert _ids(db, b"storm/lease-id/") == lease_ids, "lease queue: a processed message had another id"
    again = {k: n for k, n in deliveries.items() if n != 1}
    assert not again, (
        f"lease queue: one delivery processed twice (two holders of a lease): {list(again.items())[:5]}"
    )
    redelivered = sum(per_message.values()) - len(every)
    lease_kills = sum(kids.kills[r] + kids.stopped[r] for r in LEASE_ROLES)
    refused_ids = _refused_ids(out)
    # The totals: every message made ready once, plus once per failed exactly-once attempt
    # (counted back in place) and per lease that ran out or was nacked (back to ready, or
    # delayed and then promoted); the last delivery of a lease-queue message is the one
    # acked, and recorded first.
    eo_failed = sum(int(v) - 1 for v in _ids(db, b"storm/eo-n/").values())
    last = Counter({k: 0 for k in every})
    for k in deliveries:
        message, delivery = k.rsplit("/", 1)
        last[message] = max(last[message], int(delivery))
    lease_returned = sum(last.values()) - len(every)
    # Each processed delivery that was not the last of its message lost its ack: refused as
    # too late (logged with the message's id), or its holder was killed with it unacked.
    # Charged to the holder, which can hold only so many unacked at once: how many one kill
    # redelivers depends on how the acks were batched at that moment (more under load), so
    # the bound is per process, from the records, not one per kill.
    holders = _ids(db, b"storm/lease-by/")
    charged: Counter[str] = Counter()
    for k in deliveries:
        message, delivery = k.rsplit("/", 1)
        if int(delivery) < last[message] and lease_ids[message] not in refused_ids:
            charged[holders[k]] += 1
    print(
        f"  {sends - len(every)} numbers sent again; {redelivered} lease redeliveries for "
        f"{lease_kills} kills of lease consumers and {len(refused_ids)} messages with acks refused "
        f"(charged to the holders killed: {sorted(charged.values(), reverse=True)[:8]}); "
        f"{lease_returned} leases ran out or were nacked; {eo_failed} exactly-once attempts failed"
    )
    over = {h: n for h, n in charged.items() if n > sc.UNACKED_AT_MOST.get(h.split(":")[0], 0)}
    assert not over, (
        f"lease queue: processes redelivered more than they could hold unacked ({sc.UNACKED_AT_MOST}), "
        f"with no ack refused: {over}; settlements that failed outright, their messages unnamed: "
        f"{_unnamed_ack_failures(out)}"
    )
    assert len(charged) <= lease_kills, f"{len(charged)} lease consumers lost acks, {lease_kills} were killed"

    eo_stats, lease_stats = fdbqueue.queue_stats(db, sc.EO), fdbqueue.queue_stats(db, sc.LEASE)
    assert (eo_stats.made_ready, eo_stats.done) == (len(every) + eo_failed, len(every)), eo_stats
    assert (lease_stats.made_ready, lease_stats.done) == (len(every) + lease_returned, len(every)), (
        lease_stats
    )
    assert (eo_stats.dead, eo_stats.expired, lease_stats.dead, lease_stats.expired) == (0, 0, 0, 0)
    db.close()

    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    con.close()

    assert kills >= KILLS
    if kills >= len(ROLES):  # the kills go round the roles: each was killed
        assert all(kids.kills[r] for r in set(ROLES)), f"a role was never killed: {dict(kids.kills)}"
