"""The processes of the SIGKILL storm (tests/processes/test_storm.py), and the records they leave.

Module level and free of pytest, so that each spawned or forked child imports little.
Every child writes its stderr to ``<out>/err/<pid>.err`` and says it is working by setting
its ready Event; the test kills it at any instruction after that.

Ground truth lives in the store, next to the queues (``storm/...`` keys):

* ``storm/eo/<p>-<n>``: how many times message n of producer p was consumed from the
  exactly-once queue; written in the dequeue's own transaction, so it is exact.
* ``storm/lease/<p>-<n>/<delivery>``: lease mode, written by the handler in a transaction
  of its own before the ack (at-least-once): one key per delivery, so a duplicate shows
  which redelivery it was.
* ``storm/eo-id/<p>-<n>``, ``storm/lease-id/<p>-<n>``: the id of the message consumed.
* ``storm/eo-n/<p>-<n>``: its delivery count when consumed (1 + attempts that failed).
* ``storm/bad/<queue>/<message id>``: a payload or header that was not what was sent.
* ``storm/lease-by/<p>-<n>/<delivery>``: ``<role>:<pid>`` of the lease consumer that
  processed that delivery: a redelivery is then charged to the process that held the lease.

Producers log to ``<out>/prod-<p>-<pid>.log`` one line per number, ``<n> <eo id> <lease id>``,
after its enqueues returned: what the store acknowledged (a killed producer's last line may be missing, which
only makes the check conservative).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import fdbqueue
from fdbqueue import LeaseError, Message, Queue, QueueNotFoundError
from tests.support.processes import child_stderr

EO = "storm.eo"  # exactly-once consumers: dequeue(tr) and the record in one transaction
LEASE = "storm.lease"  # lease consumers: lease, record, ack
SCRATCH = "storm.scratch"  # the admin's: purged, destroyed and re-created all the time
LEASE_SECONDS = 2.0
SWEEP_EVERY = 0.5
REWIND = 3  # a restarted producer sends its last acknowledged numbers again: dedup must hold
BIG_EVERY = 97  # every 97th number is a 30 kB payload: chunks (fdbqueue.api.queue.CHUNK_SIZE)
REFUSE_EVERY = 50  # every 50th number's first delivery fails: retries under the kills too
ONE = (1).to_bytes(8, "little")
# At most how many processed deliveries a lease consumer holds unacked at once (a kill then
# redelivers them): the loop acks each before recording the next. The Worker (one handler
# thread) acks in batches (fdbqueue/ops/settling.py's Settler): what is pending commits with
# its next lease, or sooner in a transaction of the settler's own thread, settle_linger after
# the first. The next lease does not wait for that flush: while it waits for the store (other
# processes' commits; a loaded machine), the Worker leases and handles its next batch. So at
# most two prefetch batches: the one being flushed (the settler flushes one at a time) and the
# one in hand. (With other processes committing to the store, a Worker held up to 30 handled
# deliveries unacked at once, every ack made in the end: tests/README.md, "Flaky tests".)
PREFETCH = 16
UNACKED_AT_MOST = {"lease-loop": 1, "lease-worker": 2 * PREFETCH}
_holder = b"test"  # this process's "<role>:<pid>", in the lease records it writes
log = logging.getLogger("storm")


def key(p: int, n: int) -> str:
    return f"{p}-{n}"


def payload(p: int, n: int) -> dict[str, Any]:
    """Message n of producer p: its body is derived from (p, n), so a consumer can check it."""
    size = 30_000 if n % BIG_EVERY == 0 else 40 + (n * 7919 + p * 31) % 400
    seed = hashlib.sha256(key(p, n).encode()).hexdigest()
    return {"p": p, "n": n, "body": (seed * (size // len(seed) + 1))[:size]}


def headers(p: int, n: int) -> dict[str, str]:
    return {"producer": str(p), "number": str(n)}


def check(m: Message) -> tuple[str | None, bool]:
    """(``"<p>-<n>"`` or None if unreadable, whether payload and headers are intact)."""
    try:
        data = m.json()
        p, n = int(data["p"]), int(data["n"])
    except (ValueError, KeyError, TypeError):
        return None, False
    return key(p, n), data == payload(p, n) and dict(m.headers) == headers(p, n)


def eo_key(k: str) -> bytes:
    return b"storm/eo/" + k.encode()


def lease_key(k: str, delivery: int) -> bytes:
    return b"storm/lease/" + f"{k}/{delivery}".encode()


def bad_key(queue: str, m: Message) -> bytes:
    return b"storm/bad/" + f"{queue}/{m.id}".encode()


class Refused(Exception):
    """A handler's failure on purpose (see :func:`refuse_first`)."""


def refuse_first(m: Message, k: str | None) -> bool:
    """True for the first delivery of every REFUSE_EVERY-th number: its handler fails, so
    failed deliveries (retries, the delayed index, the counters) run under the kills too."""
    return k is not None and m.deliveries == 1 and int(k.split("-")[1]) % REFUSE_EVERY == 7


def consume_eo(tr: Any, m: Message) -> None:
    """The exactly-once handler: count the consumption inside the dequeue's transaction
    (or fail, aborting the dequeue: a failed delivery, counted back in place)."""
    k, _ = check(m)
    if refuse_first(m, k):
        raise Refused(f"first delivery of {k} refused")
    record_eo(tr, m)


def record_eo(tr: Any, m: Message) -> None:
    """Count the consumption of ``m`` from the exactly-once queue, in ``tr``."""
    k, ok = check(m)
    if not ok:
        tr.set(bad_key(EO, m), repr(m.payload[:200]).encode())
    tr.add(eo_key(k or m.id), ONE)
    tr.set(b"storm/eo-id/" + (k or m.id).encode(), m.id.encode())
    tr.set(b"storm/eo-n/" + (k or m.id).encode(), str(m.deliveries).encode())


@fdbqueue.transactional
def take_eo(tr: Any, q: Queue) -> bool:
    """Dequeue one message and record it, atomically; False when none was ready."""
    m = q.dequeue(tr)
    if m is None:
        return False
    consume_eo(tr, m)
    return True


@fdbqueue.transactional
def record_lease(tr: Any, m: Message) -> None:
    """The lease handler's record: its own transaction, before the ack (at least once); or
    :class:`Refused`, for the caller to nack."""
    k, _ = check(m)
    if refuse_first(m, k):
        raise Refused(f"first delivery of {k} refused")
    record_delivery(tr, m)


def record_delivery(tr: Any, m: Message) -> None:
    """Record this delivery of ``m`` from the lease queue, in ``tr``."""
    k, ok = check(m)
    if not ok:
        tr.set(bad_key(LEASE, m), repr(m.payload[:200]).encode())
    tr.add(lease_key(k or m.id, m.deliveries), ONE)
    tr.set(b"storm/lease-by/" + f"{k or m.id}/{m.deliveries}".encode(), _holder)
    tr.set(b"storm/lease-id/" + (k or m.id).encode(), m.id.encode())


@fdbqueue.transactional
def _enqueue_both(tr: Any, eo: Queue, lease: Queue, p: int, n: int) -> list[str]:
    return [_enqueue(tr, q, p, n) for q in (eo, lease)]


def _enqueue(tr: Any, q: Queue, p: int, n: int) -> str:
    return q.enqueue(tr, payload(p, n), headers=headers(p, n), priority=int(n % 3 == 0), dedup_key=key(p, n))


def _append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _begin(out: str) -> None:
    child_stderr(os.path.join(out, "err"))
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")


# -- the children -----------------------------------------------------------------------------


def producer(url: str, out: str, p: int, count: int, ready: Any) -> None:
    """Send numbers ``0 .. count-1`` to both queues with dedup keys, from where the last
    process of producer p left off (less REWIND), and log each once its enqueue returned.

    Even numbers: one enqueue call per queue (each its own transaction); odd numbers: both
    enqueues in one transaction of the producer's.
    """
    _begin(out)
    outdir = Path(out)
    acked = [
        int(line.split()[0]) for f in outdir.glob(f"prod-{p}-*.log") for line in f.read_text().splitlines()
    ]
    start = max(0, max(acked, default=-1) + 1 - REWIND)
    db = fdbqueue.open(url)
    eo, lease = Queue(EO), Queue(LEASE)
    fd = _append(outdir / f"prod-{p}-{os.getpid()}.log")
    ready.set()
    for n in range(start, count):
        ids = _enqueue_both(db, eo, lease, p, n) if n % 2 else [_enqueue(db, q, p, n) for q in (eo, lease)]
        os.write(fd, f"{n} {ids[0]} {ids[1]}\n".encode())  # one write: the whole line or none
    (outdir / f"prod-{p}.done").touch()


def eo_loop(url: str, out: str, ready: Any) -> None:
    """Exactly-once consumer by hand: ``dequeue(tr)`` and the record in one transaction."""
    _begin(out)
    db = fdbqueue.open(url)
    q = Queue(EO)
    ready.set()
    while True:
        try:
            if not take_eo(db, q):
                time.sleep(0.02)
        except Refused:
            pass  # the dequeue aborted with it: counted as a failed delivery, back in place


def eo_worker(url: str, out: str, ready: Any) -> None:
    """Exactly-once ``Worker``: the handler writes the record inside the dequeue's transaction."""
    _begin(out)
    db = fdbqueue.open(url)
    worker = fdbqueue.Worker(db, EO, consume_eo, mode="exactly_once", sweep_interval=SWEEP_EVERY)
    ready.set()
    worker.run()
    raise AssertionError("the exactly-once worker returned")


def _hold_as(role: str) -> None:
    global _holder
    _holder = f"{role}:{os.getpid()}".encode()


def lease_loop(url: str, out: str, ready: Any) -> None:
    """Lease consumer by hand: lease a few, record each, ack it; sweep now and then so that
    the leases of killed consumers come back. An ack refused (the lease ran out and the
    message went back) is logged to ``refused-<pid>.log``: its redelivery is allowed."""
    _begin(out)
    _hold_as("lease-loop")
    db = fdbqueue.open(url)
    q = Queue(LEASE)
    refused = _append(Path(out) / f"refused-{os.getpid()}.log")
    swept = 0.0
    ready.set()
    while True:
        if time.monotonic() - swept > SWEEP_EVERY:
            q.sweep(db)
            swept = time.monotonic()
        batch = q.lease_many(db, 4, LEASE_SECONDS)
        if not batch:
            time.sleep(0.02)
        for m in batch:
            try:
                record_lease(db, m)
            except Refused as exc:
                with contextlib.suppress(LeaseError):  # ran out already: back all the same
                    q.nack(db, m, reason=str(exc))
                continue
            try:
                q.ack(db, m)
            except LeaseError:
                os.write(refused, m.id.encode() + b"\n")


def lease_worker(url: str, out: str, ready: Any) -> None:
    """Lease-mode ``Worker``; it logs an ack it could not make ("could not ack") to its
    stderr file, which the test counts as an allowed redelivery. A :class:`Refused` handler
    is nacked by the Worker (and logged)."""
    _begin(out)
    _hold_as("lease-worker")
    db = fdbqueue.open(url)
    worker = fdbqueue.Worker(
        db,
        LEASE,
        lambda m: record_lease(db, m),
        lease_seconds=LEASE_SECONDS,
        sweep_interval=SWEEP_EVERY,
        prefetch=(1, PREFETCH),
    )
    ready.set()
    worker.run()
    raise AssertionError("the lease worker returned")


ADMIN_OPS = ("create", "fill", "lease", "ack", "dequeue", "sweep", "purge", "destroy", "stats")


def admin(url: str, out: str, ready: Any) -> None:
    """Create, fill, lease from, purge, destroy and re-create SCRATCH at random, and read the
    checked queues' stats: admin work interleaved with the rest on the same store. Each
    finished operation is logged to ``admin-<pid>.log``."""
    _begin(out)
    rng = random.Random(os.getpid())
    db = fdbqueue.open(url)
    q = Queue(SCRATCH)
    fd = _append(Path(out) / f"admin-{os.getpid()}.log")
    leased: list[Message] = []
    ready.set()
    while True:
        op = rng.choice(ADMIN_OPS)
        try:
            if op == "create":
                fdbqueue.create_queue(db, SCRATCH, lease_seconds=1.0, max_deliveries=3)
            elif op == "fill":
                q.enqueue_many(db, [{"scratch": i, "pad": "x" * rng.randrange(2000)} for i in range(20)])
            elif op == "lease":
                leased += q.lease_many(db, 5, 1.0)
            elif op == "ack" and leased:
                with contextlib.suppress(LeaseError):  # purged, destroyed or expired meanwhile
                    q.ack(db, leased.pop())
            elif op == "dequeue":
                q.dequeue(db)
            elif op == "sweep":
                q.sweep(db)
            elif op == "purge":
                fdbqueue.purge_queue(db, SCRATCH)
            elif op == "destroy":
                fdbqueue.destroy_queue(db, SCRATCH)
            elif op == "stats":
                fdbqueue.queue_stats(db, EO)
                fdbqueue.queue_stats(db, LEASE)
                fdbqueue.queue_stats(db, SCRATCH)
        except QueueNotFoundError:
            pass  # destroyed: the next fill or create brings it back
        os.write(fd, op.encode() + b"\n")
        time.sleep(rng.uniform(0, 0.03))
