"""Two leased forwarders and a consumer share a source queue while the forwarders are stopped
(SIGSTOP) past their lease: every message must be consumed at the source or forwarded, once.

Real processes on the embedded engine (two store files). A producer (this process) enqueues
throughout; a consumer process dequeues at the source, recording each id in the same
transaction; each stop freezes one forwarder for longer than its lease, so that the other
forwarder or the consumer takes its batch meanwhile. The consumer starts first, alone, until
it took a message (its share, however loaded the machine). At the end a forwarder finishes what
the stopped ones left (resumable), and the counts are printed::

    python scripts/forward_stalls.py --stops 30 --stop-seconds 1.5 --lease 1.0 --messages 3000

Exit status 1 when a message was lost or doubled. tests/runtime/test_forwarding_stalls.py runs a short
version in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

FORWARDER = """
import sys, fdbqueue
src, dst = fdbqueue.open(sys.argv[1]), fdbqueue.open(sys.argv[2])
f = fdbqueue.Forwarder(src, "jobs", dst, "jobs", batch=int(sys.argv[3]), lease_seconds=float(sys.argv[4]))
print("ready", flush=True)
f.run(follow=True, install_signals=True)
"""

CONSUMER = """
import signal, sys, time, fdbqueue
from fdbqueue.ops.txn import run_once
src = fdbqueue.open(sys.argv[1])
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
jobs, consumed = fdbqueue.Queue("jobs"), fdbqueue.Queue("consumed")

def take(t, _):
    m = jobs.dequeue(t)
    if m is not None:
        consumed.enqueue(t, m.id)  # the record of it, in the transaction that takes it
    return m is not None

print("ready", flush=True)
while not stop:
    if not run_once(src, take):
        time.sleep(0.01)
    time.sleep(float(sys.argv[2]))
"""


def run(
    *,
    messages: int = 3000,
    stops: int = 30,
    stop_seconds: float = 1.5,
    lease: float = 1.0,
    batch: int = 20,
    consumer_pause: float = 0.02,
    seed: int = 1,
    workdir: Path | None = None,
) -> dict[str, Any]:
    """Run the harness; returns the counts (``lost`` and ``doubled`` must be 0)."""
    import fdbqueue
    from fdbqueue import Forwarder, Queue
    from fdbqueue.ops.txn import run_once
    from fdbqueue.store.layout import pending_range, tombs_range

    rnd = random.Random(seed)
    tmp = Path(workdir or tempfile.mkdtemp(prefix="fwd-stalls-"))
    src_url, dst_url = f"sqlite:///{tmp / 'src.db'}", f"sqlite:///{tmp / 'dst.db'}"
    src, dst = fdbqueue.open(src_url), fdbqueue.open(dst_url)
    root = Path(fdbqueue.__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}

    def start(code: str, *args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return p

    began = time.monotonic()
    per_stop = max(1, messages // max(1, stops))
    # The consumer first, alone, until it took a message: its share, however loaded the
    # machine (each forwarder leases the next batch ahead, and could leave it none). Not by
    # stopping both forwarders: a forwarder stopped inside a commit holds the store's lock.
    consumer = start(CONSUMER, src_url, str(consumer_pause))
    forwarders: list[subprocess.Popen[str]] = []
    sent: list[str] = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(min(per_stop, messages))])
    try:
        _await_consumer(src, consumer)
        forwarders += [start(FORWARDER, src_url, dst_url, str(batch), str(lease)) for _ in range(2)]
        for _ in range(stops):
            more = min(per_stop, messages - len(sent))  # the consumer's phase took one share
            if more:
                sent += Queue("jobs").enqueue_many(src, [b"m%d" % (len(sent) + i) for i in range(more)])
            time.sleep(rnd.uniform(0.0, 0.2))  # a batch in hand, at a random step
            victim = rnd.choice(forwarders)
            victim.send_signal(signal.SIGSTOP)
            time.sleep(stop_seconds)  # past its lease: the other forwarder or the consumer takes it
            victim.send_signal(signal.SIGCONT)
        if len(sent) < messages:
            sent += Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(len(sent), messages)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            s = fdbqueue.queue_stats(src, "jobs")
            if s.ready == 0 and s.inflight == 0:
                break
            time.sleep(0.1)
    finally:
        for p in [*forwarders, consumer]:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
        for p in [*forwarders, consumer]:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
    time.sleep(lease * 1.2)  # what a stopped forwarder left is older than a lease now
    final = Forwarder(src, "jobs", dst, "jobs", lease_seconds=lease)
    final.run()
    consumed = [m.payload.decode() for m in Queue("consumed").browse(src, limit=None)]
    forwarded = [m.id for m in Queue("jobs").browse(dst, limit=None)]
    seen = Counter(consumed) + Counter(forwarded)
    in_transit = (  # pending copies on the destination, tombstones on the source: none left
        (dst, pending_range(Queue("jobs").keys)),
        (src, tombs_range(Queue("jobs").keys)),
    )
    left = [run_once(db, lambda t, _, r=r: len(t.get_range(r[0], r[1], 10_000))) for db, r in in_transit]
    return {
        "messages": len(sent),
        "stops": stops,
        "stop_seconds": stop_seconds,
        "lease_seconds": lease,
        "consumed_at_source": len(consumed),
        "forwarded": len(forwarded),
        "lost": sum(1 for i in sent if seen[i] == 0),
        "doubled": sum(n - 1 for n in seen.values() if n > 1),
        "consumed_and_forwarded": len(set(consumed) & set(forwarded)),
        "left_on_source": Queue("jobs").size(src) + fdbqueue.queue_stats(src, "jobs").inflight,
        "pending_left": left[0],
        "tombstones_left": left[1],
        "seconds": round(time.monotonic() - began, 1),
    }


def _await_consumer(src: Any, consumer: subprocess.Popen[str], timeout: float = 120.0) -> None:
    """Wait until the consumer recorded a message (no forwarder runs yet: it has the source
    to itself); a consumer that died or took nothing within ``timeout`` seconds is the
    harness's failure, raised."""
    from fdbqueue import Queue

    deadline = time.monotonic() + timeout
    while Queue("consumed").size(src) == 0:
        if consumer.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the consumer took no message while it had the source to itself")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--stops", type=int, default=30)
    p.add_argument("--stop-seconds", type=float, default=1.5)
    p.add_argument("--lease", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    counts = run(
        messages=a.messages,
        stops=a.stops,
        stop_seconds=a.stop_seconds,
        lease=a.lease,
        batch=a.batch,
        seed=a.seed,
    )
    print(json.dumps(counts))
    return 1 if counts["lost"] or counts["doubled"] else 0


if __name__ == "__main__":
    sys.exit(main())
