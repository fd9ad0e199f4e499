"""The journal across processes: four processes on one embedded store, one SIGKILLed mid-run.

Afterwards every message's last journal entry says where it is: ready or delayed after an
enqueue, nack, release, promotion or expired lease; in flight after a lease; gone after an
ack or dequeue; in the error queue after a dead letter. A killed process's transaction in
progress commits nothing, so it journals nothing either.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.ops.reading import locate
from fdbqueue.store.layout import QueueKeys

CHILD = textwrap.dedent(
    """
    import random, sys, time
    import fdbqueue
    from fdbqueue import Queue
    url, seed, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rnd = random.Random(seed)
    db = fdbqueue.open(url)
    leased = []
    end = time.monotonic() + seconds
    print("ready", flush=True)
    while time.monotonic() < end:
        q = Queue(rnd.choice(("a", "b")))
        r = rnd.random()
        try:
            if r < 0.4:
                q.enqueue(db, b"x" * rnd.choice([10, 15_000]), delay=rnd.choice([0.0, 0.0, 0.3]))
            elif r < 0.55:
                q.dequeue(db)
            elif r < 0.75:
                m = q.lease(db)
                if m is not None:
                    leased.append((q, m))
            elif leased:
                lq, m = leased.pop(rnd.randrange(len(leased)))
                w = rnd.random()
                if w < 0.5:
                    lq.ack(db, m)
                elif w < 0.85:
                    lq.nack(db, m, reason="child")
                else:
                    lq.release(db, m)
            else:
                q.sweep(db)
        except fdbqueue.LeaseError:
            pass
    """
)

BACK = {"enqueue", "nack", "release", "lease_expired", "promote"}


@pytest.mark.slow
def test_journal_and_queues_agree_after_a_sigkill(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    for name in ("a", "b"):
        fdbqueue.create_queue(db, name, journal=True, max_deliveries=3, lease_seconds=1.0)
        fdbqueue.create_queue(db, f"{name}.error", journal=True)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(fdbqueue.__file__).parent.parent)}
    children = [
        subprocess.Popen(
            [sys.executable, str(script), url, str(seed), "4.0"], stdout=subprocess.PIPE, env=env, text=True
        )
        for seed in range(4)
    ]
    for c in children:
        assert c.stdout is not None and c.stdout.readline().strip() == "ready"
    time.sleep(random.Random(0).uniform(1.0, 2.0))
    children[0].send_signal(signal.SIGKILL)
    for c in children:
        c.wait(60)
    assert children[0].returncode == -signal.SIGKILL
    assert all(c.returncode == 0 for c in children[1:])
    time.sleep(1.2)  # every lease has expired; a sweep moves them back
    for name in ("a", "b"):
        Queue(name).sweep(db)
    entries = list(fdbqueue.journal(db, None))
    lives: dict[str, list[tuple[str, str]]] = {}
    for e in entries:
        if e.message_id is not None:
            lives.setdefault(e.message_id, []).append((e.op, e.queue))
    assert len(lives) > 20
    for mid, life in lives.items():
        assert life[0][0] == "enqueue", life
        origin = life[0][1]
        last_own = [op for op, queue in life if queue == origin][-1]
        where = _where(db, origin, mid)
        if last_own in BACK:
            assert where in ("r", "d"), (mid, life, where)
        elif last_own == "lease":
            pytest.fail(f"{mid}: still leased after every lease expired and a sweep: {life}")
        elif last_own in ("ack", "dequeue"):
            assert where is None, (mid, life, where)
        else:
            assert last_own in ("dead", "expired"), life
            assert where is None
            assert life[-1] == ("dead", f"{origin}.error")
            assert _where(db, f"{origin}.error", mid) == "r"
    # and nothing is in a queue that the journal does not know of
    for name in ("a", "b", "a.error", "b.error"):
        for m in Queue(name).browse(db, limit=None):
            assert m.id in lives


def _where(db: fdbqueue.Database, queue: str, mid: str) -> str | None:
    keys = QueueKeys.make(queue)

    @fdbqueue.transactional
    def find(tr: fdbqueue.Transaction) -> str | None:
        key = locate(tr, keys, mid)
        return None if key is None else str(keys.unpack_tail(key)[0])

    return find(db)
