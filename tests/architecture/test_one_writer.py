"""One writer of message state: every write of a message key is made by ``fdbqueue.ops.moves``.

The engine's writing methods are wrapped to note, for each write, the package module that made
it (the innermost frame of ``fdbqueue`` outside the engines). A workload that makes every
kind of move — enqueue (small, chunked, delayed, with a TTL), dequeue, staged dequeue, lease,
ack, nack with and without a delay, release, extend, lease expiry, promotion, dead letters,
expiry, a damaged record, an aborted in-transaction dequeue, purge, destroy — must show
``fdbqueue.ops.moves`` as the only writer of the keys that hold messages, their indexes and their
counters. The writer is a package, split for size along its seams (``fdbqueue/ops/moves/``): a
write by any of its modules is the writer's, and by no other module, one whose name merely
starts the same way included (:func:`the_one_writer`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.local.transaction import LocalTransaction
from fdbqueue.ops.contention import staged_dequeue
from fdbqueue.store.clock import FakeClock, fake_clock
from fdbqueue.store.codec import enc_str
from fdbqueue.store.layout import QueueKeys

# Tags under a queue's subspace whose keys are message state: ready, id entries, chunks,
# leased, lease entries, delayed, TTL entries, staged results.
STATE_TAGS = {"r", "id", "b", "f", "l", "d", "x", "res"}
WRITERS = ("set", "clear", "clear_range", "add", "max", "min", "byte_max", "byte_min", "compare_and_clear")
WRITER = "fdbqueue.ops.moves"  # the one writer: the package and its modules


def the_one_writer(module: str) -> bool:
    """Whether ``module`` is the one writer: ``fdbqueue.ops.moves`` or a module of that package."""
    return module == WRITER or module.startswith(WRITER + ".")


def _writer_module() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("fdbqueue.") and not name.startswith("fdbqueue.engines"):
            return str(name)
        if name.startswith("tests.") or name.startswith("test_"):
            return str(name)
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def is_state_key(key: bytes, keys: QueueKeys) -> bool:
    """Whether ``key`` of queue ``keys`` holds a message, one of its index entries or a counter."""
    if not key.startswith(keys.q.key()):
        return False
    tail = keys.unpack_tail(key) if key != keys.q.key() else ()
    if tail and tail[0] in STATE_TAGS:
        return True
    counters = keys.counter("ready")[: -len(enc_str("ready"))]  # the prefix of every counter
    return key.startswith(counters) or key.startswith(keys.priority_marker_range()[0])


def record_writes(monkeypatch: pytest.MonkeyPatch, classes: tuple[type, ...]) -> list[tuple[str, bytes, str]]:
    """Each write by a transaction of ``classes`` (the first's writing methods, inherited or
    its own; a subclass's, those it defines itself), noted as (method, key, the package module
    that made it)."""
    noted: list[tuple[str, bytes, str]] = []
    for cls in classes:
        for name in WRITERS:
            if cls is not classes[0] and name not in vars(cls):
                continue  # (inherited from the first: wrapped there once)
            real = getattr(cls, name)

            def wrapper(
                self: Any, key: bytes, *args: Any, _real: Callable[..., Any] = real, _name: str = name
            ) -> Any:
                noted.append((_name, key, _writer_module()))
                return _real(self, key, *args)

            monkeypatch.setattr(cls, name, wrapper)
    return noted


def test_the_one_writer_is_the_moves_package_and_nothing_beside_it() -> None:
    import fdbqueue.ops.moves as writer

    modules = sorted(p.stem for p in Path(writer.__file__).parent.glob("*.py") if p.stem != "__init__")
    assert len(modules) > 1  # split along its seams: each of its modules writes
    assert all(the_one_writer(f"{WRITER}.{m}") for m in modules) and the_one_writer(WRITER)
    for other in ("fdbqueue.ops.movesx", "fdbqueue.ops.moves_extra", "fdbqueue.ops.delivery", "fdbqueue.ops"):
        assert not the_one_writer(other), other


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bytes, str]]]:
    yield record_writes(monkeypatch, (LocalTransaction,))


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    with fake_clock() as c:
        yield c


def test_only_moves_writes_message_state(writes: list[tuple[str, bytes, str]], clock: FakeClock) -> None:
    db = fdbqueue.open("sim://?seed=3&faults=0")
    fdbqueue.create_queue(db, "w", max_deliveries=2, retry_delay=0.0, lease_seconds=5.0)
    fdbqueue.create_queue(db, "t", ttl=1.0)
    w, t = Queue("w"), Queue("t")
    w.enqueue(db, b"small")
    w.enqueue(db, b"x" * 25_000)  # chunked
    w.enqueue(db, b"later", delay=2.0)
    w.enqueue(db, b"ttl", ttl=0.5)
    t.enqueue_many(db, [b"a", b"b"])
    assert w.dequeue(db) is not None  # a dequeue
    m = w.lease(db)
    assert m is not None
    w.extend(db, m, 10.0)
    w.nack(db, m, delay=1.0)  # delayed retry
    m2 = w.lease(db)
    assert m2 is not None
    w.release(db, m2)
    m3 = w.lease(db)
    assert m3 is not None
    w.ack(db, m3)
    w.enqueue_many(db, [b"batch0", b"batch1"])
    batch = w.lease_many(db, 2)  # a batch's leases and acks (leasing.lease_heads, delivery.ack_many_in)
    assert len(batch) == 2
    assert w.ack_many(db, batch) == batch
    for _ in range(3):  # leases expire; nacks dead-letter at max_deliveries
        got = w.lease(db, lease_seconds=1.0)
        if got is None:
            break
        clock.advance(1.5)
        w.sweep(db)
    clock.advance(3.0)
    w.sweep(db)  # promotions, expiries
    t.sweep(db)
    # an aborted in-transaction dequeue counts the failed delivery
    w.enqueue(db, b"abort me")
    tr = db.create_transaction()
    assert w.dequeue(tr) is not None
    tr.cancel()
    w.enqueue(db, b"staged")
    assert staged_dequeue(db, w.keys) is not None
    # a damaged record is moved aside
    w.enqueue(db, b"damaged")
    begin, end = w.keys.ready_range()

    @fdbqueue.transactional
    def damage(tr: Any) -> None:
        for kv in tr.get_range(begin, end):
            tr.set(kv.key, kv.value[:-1] + bytes([kv.value[-1] ^ 1]))

    damage(db)
    w.dequeue(db)
    w.enqueue(db, b"purged")
    fdbqueue.purge_queue(db, "w")
    fdbqueue.destroy_queue(db, "t")

    all_keys = [QueueKeys.make(n) for n in ("w", "t", "w.error", "t.error")]
    wrong = sorted(
        {
            (op, mod)
            for op, key, mod in writes
            if not the_one_writer(mod) and not mod.startswith("test")
            for keys in all_keys
            if is_state_key(key, keys)
        }
    )
    state_writes = [1 for _, key, _ in writes for keys in all_keys if is_state_key(key, keys)]
    assert len(state_writes) > 50  # the workload did move messages
    assert not wrong, f"message state written outside fdbqueue.ops.moves: {wrong}"


OTHER_CONSUMER = """
import os, sys
import fdbqueue
db = fdbqueue.open(sys.argv[1])
q = fdbqueue.Queue(sys.argv[2])
take = fdbqueue.transactional(lambda tr: q.dequeue(tr))
while os.read(0, 1):
    assert take(db) is not None
    os.write(1, b"+")
"""


def test_only_moves_writes_message_state_on_the_embedded_engines_own_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded engine's own steps of the common operations (issue 30: the short enqueue,
    ``take_short``, ``lease_short``, ``ack_short``, and among other consumers
    ``take_contended`` and ``lease_contended``) run only where nothing conflicts, so the sim
    workload above never meets them: the same rule, checked where they run. Another process
    takes between this one's dequeues and leases (its writes are its own, not recorded here), as
    draining consumers do."""
    from fdbqueue.api import leases as api_leases
    from fdbqueue.api import queue as api_queue
    from fdbqueue.engines.sqlite.transaction import SqliteTransaction
    from fdbqueue.ops import contended, leasing

    noted = record_writes(monkeypatch, (LocalTransaction, SqliteTransaction))
    served = {"take_contended": 0, "lease_contended": 0}  # the steps among others did run
    for mod, name in (
        (api_queue, "take_contended"),
        (leasing, "lease_contended"),
        (api_leases, "lease_contended"),
    ):
        real = getattr(contended, name)

        def counted(*args: Any, _real: Callable[..., Any] = real, _name: str = name) -> Any:
            got = _real(*args)
            served[_name] += got is not None
            return got

        monkeypatch.setattr(mod, name, counted)
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, "j", journal=True)
    names = ("w", "j")
    take = fdbqueue.transactional(lambda tr, q: q.dequeue(tr))
    for name in names:
        q = Queue(name)
        for i in range(8):  # the short enqueue from the second on
            q.enqueue(db, f"{name}{i}".encode())
        q.enqueue_many(db, [b"more"] * 100)
        for _ in range(4):  # take_short from the second on
            assert take(db, q) is not None
        for _ in range(4):  # lease_short and ack_short from the second on
            m = q.lease(db)
            assert m is not None
            q.ack(db, m)
        other = subprocess.Popen(
            [sys.executable, "-c", OTHER_CONSUMER, url, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert other.stdin is not None and other.stdout is not None
        try:
            for i in range(40):  # among another consumer: take_contended, lease_contended once paused
                os.write(other.stdin.fileno(), b"+")
                assert os.read(other.stdout.fileno(), 1) == b"+"
                if i < 20:
                    assert take(db, q) is not None
                else:
                    m = q.lease(db)
                    assert m is not None
                    q.ack(db, m)
        finally:
            other.stdin.close()
            other.wait(timeout=60)
    all_keys = [QueueKeys.make(n) for n in names]
    wrong = sorted(
        {
            (op, mod)
            for op, key, mod in noted
            if not the_one_writer(mod)
            for keys in all_keys
            if is_state_key(key, keys)
        }
    )
    assert len([1 for _, key, _ in noted for keys in all_keys if is_state_key(key, keys)]) > 100
    assert served["take_contended"] >= 10 and served["lease_contended"] >= 10, served
    assert not wrong, f"message state written outside fdbqueue.ops.moves: {wrong}"
