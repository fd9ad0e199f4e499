#!/usr/bin/env python3
"""fdbqueue at a cluster's scale, on the cluster model (fdbqueue/engines/sim/cluster.py).

Hundreds of clients run the layer's public API (``Queue.enqueue_many``, ``lease_many``,
``ack_many``; ``PartitionedQueue.enqueue``) as greenlets on the model's virtual time, so the
numbers are the layer's on a modelled FoundationDB cluster: storage teams of ~20,000
writes/s, ratekeeper, commit batches, GRV/read/commit latencies, per-error backoff.

Scenarios (each on a fresh model, same seed):

* ``spread``: ``--queues`` queues (10,000), ``--producers`` (200) each enqueueing
  ``--enqueue-batch`` messages a transaction to a random queue, ``--consumers`` (500) each
  owning ``queues / consumers`` queues and taking ``lease_many(--lease-batch)`` then
  ``ack_many`` from them in turn; after a pass that found nothing it sleeps ``--poll`` s
  (0.1), doubling up to 1 s while its queues stay empty.
* ``hot``: one queue, ``--hot-producers`` (200) producers, ``--hot-consumers`` (100) consumers.
* ``hot-partitioned``: ``PartitionedQueue(partitions=--partitions)``, consumers spread over
  the partitions.
* ``spread+recovery`` / ``hot-partitioned+recovery``: the same with a recovery (versions jump
  ``--jump`` s, ``MAX_VERSIONS_IN_FLIGHT``) in the middle of the measured window, and after
  the window a drain of ``--drain`` s once the cluster is back (producers stopped): messages
  delivered twice (leased by two deliveries), acks refused (the lease had ended), and
  messages expired early (their TTL, ``--ttl`` s, 60 by default, was longer than the whole
  run, yet they were gone undelivered; ``--ttl 0``: no TTL, so that the messages whose leases
  the jump ended are delivered again).

Printed per scenario: messages delivered (acked) and enqueued per virtual second over the
window, transactions, commits and conflicts (1020) per delivered message, the hottest team's
writes per second (and as a share of its 20,000/s), the most written key and its share of
committed transactions, ratekeeper's limited share of the window, the mean read-version
wait, and the real seconds the scenario took. Deterministic by ``--seed`` (the layer's own
random ids, coin flips and wall clock come from seeded sources here, and the script runs
itself with PYTHONHASHSEED=0: small runs repeat exactly, full-scale ones within a few per cent,
as some order inside the layer is not seeded yet).

    python scripts/bench_cluster_model.py [--small] [--markdown] [--scenarios spread,hot,...]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))

from benchlib import machine, show_table

import fdbqueue
from fdbqueue.engines.sim.cluster import ClusterDatabase, ClusterKnobs
from fdbqueue.engines.sim.virtual import VirtualTime
from fdbqueue.store import entropy
from fdbqueue.store.clock import set_clock

SCENARIOS = ["spread", "hot", "hot-partitioned", "spread+recovery", "hot-partitioned+recovery"]


@dataclass
class Settings:
    seed: int = 1
    teams: int = 20
    queues: int = 10_000
    producers: int = 200
    consumers: int = 500
    hot_producers: int = 200
    hot_consumers: int = 100
    partitions: int = 20
    enqueue_batch: int = 1
    lease_batch: int = 10
    handle: float = 0.005  # seconds a consumer spends on a leased batch before acking it
    poll: float = 0.1
    warmup: float = 0.5
    measure: float = 0.5
    drain: float = 0.5
    jump: float = 100.0
    ttl: float = 60.0
    lease_seconds: float = 30.0


@dataclass
class Tally:
    enqueued: dict[str, Any] = field(default_factory=dict)  # id -> the queue it went to
    leases: Counter[str] = field(default_factory=Counter)  # id -> deliveries seen
    acked: int = 0
    ack_refused: int = 0
    errors: Counter[str] = field(default_factory=Counter)


class _VirtualWall:
    """What ``fdbqueue.store.entropy`` reads of the ``time`` module: the virtual clock."""

    def __init__(self, vt: VirtualTime) -> None:
        self.vt = vt

    def time_ns(self) -> int:
        return int((EPOCH + self.vt.now()) * 1e9)


EPOCH = 1.8e9  # the wall clock the runs show: 2027-01-15, moving with virtual time


@contextmanager
def deterministic(seed: int, vt: VirtualTime) -> Iterator[None]:
    """One run's randomness and wall clock from ``seed`` and ``vt``: the layer's random bytes
    (message ids, receipts) from ``random.Random(seed)``, its few coin flips (receipt pruning)
    from the seeded ``random`` module, and its wall clock (ids' time part, ``enqueued_at``)
    from virtual time. The kernel's bytes and the real clock would make each run place and
    order its messages differently."""
    rng = random.Random(seed)
    saved = entropy.os.urandom, entropy.time

    def urandom(n: int) -> bytes:
        return rng.randbytes(n)

    entropy.os.urandom = urandom  # type: ignore[assignment]
    entropy.time = _VirtualWall(vt)  # type: ignore[assignment]
    entropy._forget()
    random.seed(seed)
    set_clock(lambda: EPOCH + vt.now())
    try:
        yield
    finally:
        entropy.os.urandom, entropy.time = saved
        entropy._forget()
        set_clock(None)


def snapshot(db: ClusterDatabase, tally: Tally) -> dict[str, Any]:
    s = db.cluster_stats
    return {
        "t": db.vt.now(),
        "acked": tally.acked,
        "enqueued": len(tally.enqueued),
        "transactions": s.transactions,
        "commits": s.commits,
        "conflicts": db.stats.conflicts,
        "teams": [t.writes for t in db.teams],
        "keys": Counter(s.key_writes),
        "grvs": s.grvs,
        "grv_wait": s.grv_wait,
        "limited": db.ratekeeper.limited_seconds,
    }


def run(name: str, cfg: Settings) -> dict[str, Any]:
    """One scenario on a fresh model; its figures over the measured window."""
    began = time.perf_counter()
    vt = VirtualTime()
    with deterministic(cfg.seed, vt):
        out = _run(name, cfg, vt)
    out["real_s"] = time.perf_counter() - began
    return out


def _run(name: str, cfg: Settings, vt: VirtualTime) -> dict[str, Any]:
    db = ClusterDatabase(seed=cfg.seed, knobs=ClusterKnobs(teams=cfg.teams), clock=vt)
    tally = Tally()
    rng = random.Random(cfg.seed)
    stop = {"producers": False, "consumers": False}
    hot = name.startswith("hot")
    partitioned = "partitioned" in name
    payload = b"x" * 100

    if partitioned:
        pq = fdbqueue.PartitionedQueue("hot", partitions=cfg.partitions, key="k")
        consumed = pq.queues
    elif hot:
        consumed = [fdbqueue.Queue("hot")]
    else:
        consumed = [fdbqueue.Queue(f"tenant.{i:05d}") for i in range(cfg.queues)]

    def producer(p: int) -> None:
        r = random.Random(cfg.seed * 7919 + p)
        while not stop["producers"]:
            if partitioned:
                mid = pq.enqueue(
                    db,
                    payload,
                    headers={"k": f"c{r.randrange(1_000_000)}"},
                    ttl=cfg.ttl if cfg.ttl > 0 else None,
                )
                tally.enqueued[mid] = None
                continue
            q = consumed[0] if hot else consumed[r.randrange(len(consumed))]
            for mid in q.enqueue_many(
                db, [payload] * cfg.enqueue_batch, ttl=cfg.ttl if cfg.ttl > 0 else None
            ):
                tally.enqueued[mid] = q

    def consumer(mine: list[fdbqueue.Queue], c: int) -> None:
        r = random.Random(cfg.seed * 104729 + c)
        idle = cfg.poll
        while not stop["consumers"]:
            found = False
            for q in mine:
                if stop["consumers"]:
                    return
                got = q.lease_many(db, cfg.lease_batch, cfg.lease_seconds)
                if not got:
                    continue
                found = True
                for m in got:
                    tally.leases[m.id] += 1
                vt.sleep(cfg.handle)
                acked = q.ack_many(db, got)
                tally.acked += len(acked)
                tally.ack_refused += len(got) - len(acked)
            if found:
                idle = cfg.poll
            else:  # nothing in any of its queues: poll less and less often, up to 1 s
                vt.sleep(idle * (0.5 + r.random()))
                idle = min(2 * idle, 1.0)

    n_consumers = cfg.hot_consumers if hot else cfg.consumers
    owned: list[list[fdbqueue.Queue]] = [[] for _ in range(n_consumers)]
    for i, q in enumerate(consumed):
        owned[i % n_consumers].append(q)
    if len(consumed) < n_consumers:  # more consumers than queues: share them round robin
        for c in range(len(consumed), n_consumers):
            owned[c] = [consumed[c % len(consumed)]]
    for p in range(cfg.hot_producers if hot else cfg.producers):
        vt.spawn(producer, p, name=f"producer-{p}", delay=rng.random() * 0.01)
    for c in range(n_consumers):
        vt.spawn(consumer, owned[c], c, name=f"consumer-{c}", delay=rng.random() * 0.01)

    vt.run(until=cfg.warmup)
    before = snapshot(db, tally)
    recovery = name.endswith("+recovery")
    if recovery:
        vt.run(until=cfg.warmup + cfg.measure / 2)
        db.recover(jump=cfg.jump)
    vt.run(until=cfg.warmup + cfg.measure)
    after = snapshot(db, tally)

    out = figures(name, cfg, before, after)
    if recovery or name == "spread":
        stop["producers"] = True
        vt.run(until=max(cfg.warmup + cfg.measure, db.available_at) + cfg.drain)
        stop["consumers"] = True
        vt.run()  # every client ends its turn and stops
        out.update(outcome(db, vt, tally, consumed, partitioned))
    vt.close()
    return out


def figures(name: str, cfg: Settings, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    dt = after["t"] - before["t"]
    acked = after["acked"] - before["acked"]
    per = max(acked, 1)
    team_writes = [a - b for a, b in zip(after["teams"], before["teams"], strict=True)]
    hottest_team = max(range(len(team_writes)), key=lambda i: team_writes[i])
    keys = after["keys"]
    keys.subtract(before["keys"])
    key, key_writes = max(keys.items(), key=lambda kv: kv[1]) if keys else (b"", 0)
    commits = after["commits"] - before["commits"]
    grvs = max(after["grvs"] - before["grvs"], 1)
    return {
        "scenario": name,
        "delivered_per_s": acked / dt,
        "enqueued_per_s": (after["enqueued"] - before["enqueued"]) / dt,
        "txn_per_msg": (after["transactions"] - before["transactions"]) / per,
        "commits_per_msg": commits / per,
        "mutations_per_msg": sum(team_writes) / per,
        "conflicts_per_msg": (after["conflicts"] - before["conflicts"]) / per,
        "hottest_team_writes_per_s": team_writes[hottest_team] / dt,
        "hottest_team_share": team_writes[hottest_team] / max(sum(team_writes), 1),
        "hottest_key": key,
        "hottest_key_writes_per_s": key_writes / dt,
        "hottest_key_share_of_commits": key_writes / max(commits, 1),
        "ratekeeper_limited": (after["limited"] - before["limited"]) / dt,
        "grv_wait_ms": 1000 * (after["grv_wait"] - before["grv_wait"]) / grvs,
    }


def outcome(
    db: ClusterDatabase, vt: VirtualTime, tally: Tally, consumed: list[fdbqueue.Queue], partitioned: bool
) -> dict[str, Any]:
    """After the drain: messages delivered twice, acks refused, messages gone undelivered."""
    twice = sum(1 for n in tally.leases.values() if n > 1)
    undelivered = [mid for mid in tally.enqueued if mid not in tally.leases]
    gone = [0]

    def check() -> None:
        where = {q.name: q for q in consumed}
        for mid in undelivered:
            q = tally.enqueued[mid]
            candidates = [q] if q is not None else list(where.values())
            if all(c.get(db, mid) is None for c in candidates):
                gone[0] += 1

    if len(undelivered) <= 5_000:
        vt.spawn(check, name="checker")
        vt.run()
    else:
        gone[0] = -1  # too many left to look each one up: the drain was too short
    return {
        "delivered_twice": twice,
        "ack_refused": tally.ack_refused,
        "expired_early": gone[0],
        "undelivered": len(undelivered),
    }


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != "0":
        # Strings' hashes (the order of a set of queue names) must not change from run to run.
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--small",
        action="store_true",
        help="a smoke run (< 30 s): 500 queues, 20 producers, 50 consumers; hot: 10 and 8",
    )
    ap.add_argument("--smoke", action="store_true", help="--small, for CI")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--markdown", action="store_true")
    for f, default in vars(Settings()).items():
        ap.add_argument("--" + f.replace("_", "-"), type=type(default), default=None)
    args = ap.parse_args()
    cfg = Settings()
    if args.small or args.smoke:
        cfg = Settings(
            queues=500,
            producers=20,
            consumers=50,
            hot_producers=10,
            hot_consumers=8,
            partitions=8,
            warmup=0.3,
            measure=0.3,
            drain=0.3,
        )
    for f in vars(cfg):
        if getattr(args, f) is not None:
            setattr(cfg, f, getattr(args, f))
    names = [s for s in args.scenarios.split(",") if s]
    for s in names:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s!r}: choose from {', '.join(SCENARIOS)}")
    print(machine(**{k: v for k, v in vars(cfg).items()}))
    results = []
    for s in names:
        results.append(run(s, cfg))
        r = results[-1]
        print(f"# {s}: {r['delivered_per_s']:,.0f} msg/s delivered in {r['real_s']:.1f} s real", flush=True)
    show(results, args.markdown)


def show(results: list[dict[str, Any]], markdown: bool) -> None:
    fmt: list[tuple[str, str, Callable[[Any], str]]] = [
        ("scenario", "scenario", str),
        ("delivered_per_s", "delivered msg/s", lambda v: f"{v:,.0f}"),
        ("enqueued_per_s", "enqueued msg/s", lambda v: f"{v:,.0f}"),
        ("txn_per_msg", "txn/msg", lambda v: f"{v:.2f}"),
        ("commits_per_msg", "commits/msg", lambda v: f"{v:.2f}"),
        ("conflicts_per_msg", "conflicts/msg", lambda v: f"{v:.3f}"),
        ("mutations_per_msg", "mutations/msg", lambda v: f"{v:.1f}"),
        ("hottest_team_writes_per_s", "hottest team writes/s", lambda v: f"{v:,.0f} ({v / 200:.0f} %)"),
        ("hottest_team_share", "its share", lambda v: f"{100 * v:.1f} %"),
        ("hottest_key_writes_per_s", "hottest key writes/s", lambda v: f"{v:,.0f}"),
        ("hottest_key_share_of_commits", "of commits", lambda v: f"{100 * v:.1f} %"),
        ("ratekeeper_limited", "rk limited", lambda v: f"{100 * v:.0f} %"),
        ("grv_wait_ms", "GRV ms", lambda v: f"{v:.2f}"),
        ("real_s", "real s", lambda v: f"{v:.0f}"),
    ]
    show_table(
        "Throughput on the cluster model (per virtual second, over the measured window)",
        [h for _, h, _ in fmt],
        [[f(r[k]) for k, _, f in fmt] for r in results],
        markdown=markdown,
    )
    keys = [[r["scenario"], repr(r["hottest_key"])] for r in results]
    show_table("The most written key", ["scenario", "key"], keys, markdown=markdown)
    rec = [r for r in results if "delivered_twice" in r]
    if rec:
        show_table(
            "Recoveries: after a drain of the producers' last messages",
            ["scenario", "delivered twice", "acks refused", "expired early", "undelivered at the end"],
            [
                [
                    r["scenario"],
                    str(r["delivered_twice"]),
                    str(r["ack_refused"]),
                    str(r["expired_early"]),
                    str(r["undelivered"]),
                ]
                for r in rec
            ],
            markdown=markdown,
        )


if __name__ == "__main__":
    main()
