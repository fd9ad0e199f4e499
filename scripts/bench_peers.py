#!/usr/bin/env python3
"""fdbqueue against the alternatives. One run measures, side by side on this machine:

- fdbqueue, embedded engine (``sqlite://...?sync=full``; ``sync=normal`` in the fast table);
- persist-queue's ``SQLiteAckQueue`` (multithreading=True, auto_commit=True; its own default
  SQLite settings: WAL journal, ``synchronous`` left at SQLite's default FULL);
- huey's ``SqliteStorage`` (what ``SqliteHuey`` keeps its tasks in: WAL journal, ``synchronous``
  left at SQLite's default FULL): ``enqueue``; dequeue = its ``dequeue`` (SELECT + DELETE in one
  transaction: there is no ack, a task is gone once taken); its consumer polls, every 0.1 s
  while the queue is empty by default (``initial_delay``), and (d) polls the same way;
- PostgreSQL via psycopg 3: one row per message, dequeue = ``SELECT ... FOR UPDATE SKIP LOCKED``
  then ``DELETE`` in one transaction (``synchronous_commit=on``; ``off`` in the fast table);
- Redis reliable list queue: ``LPUSH``; dequeue = ``LMOVE`` to a processing list, ack =
  ``LREM`` (``appendfsync always``; ``everysec`` in the fast table).

Workloads, 200-byte messages:
  (a) enqueue, one commit per message;
  (b) dequeue + ack, one per transaction (fdbqueue: ``q.dequeue(tr)`` in a
      ``@fdbqueue.transactional`` function, exactly once; and ``lease`` + ``ack``);
  (c) 4 consumer processes draining a pre-filled queue at once; every id must be seen exactly
      once across them (fdbqueue: the in-transaction dequeue);
  (d) end-to-end latency at 500 msg/s offered load, one blocking consumer (fdbqueue:
      ``q.dequeue(db, timeout=...)`` in a consumer process); the producer stamps its send time
      into the payload. At the durable setting a last row gives the disk's own floor at the
      same rate: two 8 KiB writes, each followed by fdatasync, per message.

Each round runs every system once through every workload (the order of systems rotates
between rounds); tables give the median over rounds, and each ratio fdbqueue/peer is the
ratio of the two medians. Start the servers first with ``scripts/peers.sh start``; a peer that
cannot be reached is skipped with the reason.

Usage: .venv/bin/python scripts/bench_peers.py [--n 10000] [--n-durable 3000] [--repeat 3]
       [--settings durable,fast] [--systems fdbqueue,persistqueue,huey,postgres,redis] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import multiprocessing as mp
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import benchlib

import fdbqueue

PAYLOAD_SIZE = 200
HEADER = struct.Struct(">Qd")  # sequence number, send time (time.monotonic(): system-wide on Linux)
SENTINEL = 2**64 - 1
PAD = bytes(range(256))[: PAYLOAD_SIZE - HEADER.size]
FILL_BATCH = 500
CONSUMERS = 4

SYSTEMS = ("fdbqueue", "persistqueue", "huey", "postgres", "redis")
LABEL = {
    "fdbqueue": "fdbqueue",
    "persistqueue": "persist-queue",
    "huey": "huey",
    "postgres": "PostgreSQL",
    "redis": "Redis",
}
WHAT = {  # what each system runs, for the settings table
    "fdbqueue": (
        "embedded engine; (b) q.dequeue(tr) in @transactional, and lease + ack (2 transactions); "
        "(d) q.dequeue(db, timeout=0.5)"
    ),
    "persistqueue": (
        "SQLiteAckQueue(multithreading=True, auto_commit=True); (b) get + ack (2 commits); "
        "(d) get(timeout=0.5) + ack in a thread of the producer's process"
    ),
    "huey": (
        "SqliteStorage (SqliteHuey's); (b) dequeue: SELECT + DELETE, 1 transaction, no ack; "
        "(d) dequeue polled every 0.1 s while empty (its consumer's initial_delay)"
    ),
    "postgres": (
        "one row per message, INSERT + pg_notify in one statement; (b) BEGIN, SELECT ... FOR UPDATE "
        "SKIP LOCKED, DELETE, COMMIT; (d) the same, LISTEN between empty polls"
    ),
    "redis": "LPUSH; (b) LMOVE to a processing list + LREM (ack); (d) BLMOVE + LREM",
}
DEFAULT_PG = "postgresql://postgres@127.0.0.1:55432/bench"
DEFAULT_REDIS = "redis://127.0.0.1:56379/0"
DEFAULT_REDIS_FAST = "redis://127.0.0.1:56380/0"


def payload(seq: int, stamp: float = 0.0) -> bytes:
    return HEADER.pack(seq, stamp) + PAD


def unpack(p: bytes) -> tuple[int, float]:
    seq, stamp = HEADER.unpack_from(p)
    return seq, stamp


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Clients: one per system, built from a picklable spec in whichever process uses it.


@fdbqueue.transactional
def _fdb_take(tr: Any, q: fdbqueue.Queue) -> bytes | None:
    m = q.dequeue(tr)  # gone when tr commits: exactly once
    return None if m is None else m.payload


class FdbqueueClient:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.db = fdbqueue.open(spec["url"])
        self.q = fdbqueue.Queue(spec["queue"])

    def enqueue(self, p: bytes) -> None:
        self.q.enqueue(self.db, p)

    def take(self) -> bytes | None:
        return _fdb_take(self.db, self.q)

    def lease_ack(self) -> bytes | None:
        m = self.q.lease(self.db)
        if m is None:
            return None
        self.q.ack(self.db, m)
        return m.payload

    def take_blocking(self, timeout: float) -> bytes | None:
        m = self.q.dequeue(self.db, timeout=timeout)
        return None if m is None else m.payload

    def fill(self, payloads: list[bytes]) -> None:
        for i in range(0, len(payloads), FILL_BATCH):
            self.q.enqueue_many(self.db, payloads[i : i + FILL_BATCH])

    def close(self) -> None:
        self.db.close()


def sqlite_pragmas(conn: Any) -> dict[str, Any]:
    """What an SQLite peer's connection runs at, read back from it."""
    return {
        "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
        "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(
            conn.execute("PRAGMA synchronous").fetchone()[0], "?"
        ),
    }


class PersistQueueClient:
    def __init__(self, spec: dict[str, Any]) -> None:
        import persistqueue

        self.empty = persistqueue.Empty
        self.q = persistqueue.SQLiteAckQueue(spec["path"], multithreading=True, auto_commit=True)
        if spec["sync"] != "default":
            # Not a persist-queue option: set on both of its connections (the fast table only).
            for conn in {id(c): c for c in (self.q._getter, self.q._putter)}.values():
                conn.execute(f"PRAGMA synchronous={spec['sync']}")

    def pragmas(self) -> dict[str, Any]:
        return sqlite_pragmas(self.q._putter)

    def enqueue(self, p: bytes) -> None:
        self.q.put(p)

    def take(self) -> bytes | None:
        try:
            item = self.q.get(block=False, raw=True)
        except self.empty:
            return None
        self.q.ack(id=item["pqid"])
        return item["data"]

    def take_blocking(self, timeout: float) -> bytes | None:
        try:
            item = self.q.get(block=True, timeout=timeout, raw=True)
        except self.empty:
            return None
        self.q.ack(id=item["pqid"])
        return item["data"]

    def fill(self, payloads: list[bytes]) -> None:
        q = self.q
        now = time.time()
        with q.tran_lock:  # its own INSERT, many rows in one transaction (not timed)
            q._putter.executemany(q._sql_insert, [(q._serializer.dumps(p), now) for p in payloads])
            q._putter.commit()
        q.total += len(payloads)

    def close(self) -> None:
        self.q.close()


class HueyClient:
    POLL = 0.1  # huey's Consumer(initial_delay=0.1): how often an idle consumer asks storage

    def __init__(self, spec: dict[str, Any]) -> None:
        from huey.storage import SqliteStorage

        sync = spec["sync"]

        class Storage(SqliteStorage):  # type: ignore[misc]
            def _create_connection(self) -> Any:
                conn = super()._create_connection()
                if sync != "default":  # not a huey option (the fast table only)
                    conn.execute(f"PRAGMA synchronous={sync}")
                return conn

        self.s = Storage(name=spec["queue"], filename=spec["path"])

    def pragmas(self) -> dict[str, Any]:
        return sqlite_pragmas(self.s.conn)

    def enqueue(self, p: bytes) -> None:
        self.s.enqueue(p)

    def take(self) -> bytes | None:
        data = self.s.dequeue()
        return None if data is None else bytes(data)

    def take_blocking(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while True:
            data = self.s.dequeue()
            if data is not None:
                return bytes(data)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(self.POLL, left))

    def fill(self, payloads: list[bytes]) -> None:
        conn = self.s.conn
        conn.execute("BEGIN")  # its own INSERT, many rows in one transaction (not timed)
        conn.executemany(
            "INSERT INTO task (queue, data, priority) VALUES (?, ?, 0)", [(self.s.name, p) for p in payloads]
        )
        conn.execute("COMMIT")

    def close(self) -> None:
        self.s.close()


class PostgresClient:
    def __init__(self, spec: dict[str, Any]) -> None:
        import psycopg

        self.conn = psycopg.connect(spec["dsn"], autocommit=True, connect_timeout=5)
        self.conn.execute(f"SET synchronous_commit = {spec['synchronous_commit']}")
        t, self.channel = spec["table"], spec["channel"]
        # Enqueue: the row and a NOTIFY for blocking consumers, one statement, one transaction.
        self.sql_put = (
            f"WITH ins AS (INSERT INTO {t} (payload) VALUES (%s)) SELECT pg_notify('{self.channel}', '')"
        )
        self.sql_head = f"SELECT id, payload FROM {t} ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
        self.sql_del = f"DELETE FROM {t} WHERE id = %s"
        self.table = t
        self.listening = False

    def enqueue(self, p: bytes) -> None:
        self.conn.execute(self.sql_put, (p,))

    def take(self) -> bytes | None:
        conn = self.conn
        with conn.transaction():  # BEGIN; SELECT ... FOR UPDATE SKIP LOCKED; DELETE; COMMIT
            row = conn.execute(self.sql_head).fetchone()
            if row is None:
                return None
            conn.execute(self.sql_del, (row[0],))
        return bytes(row[1])

    def take_blocking(self, timeout: float) -> bytes | None:
        if not self.listening:
            self.conn.execute(f"LISTEN {self.channel}")
            self.listening = True
        deadline = time.monotonic() + timeout
        while True:
            got = self.take()
            if got is not None:
                return got
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            # Notifications that came during take() are buffered by psycopg: no lost wake-up.
            for _ in self.conn.notifies(timeout=remaining, stop_after=1):
                pass

    def fill(self, payloads: list[bytes]) -> None:
        with (
            self.conn.transaction(),
            self.conn.cursor() as cur,
            cur.copy(f"COPY {self.table} (payload) FROM STDIN") as cp,
        ):
            for p in payloads:
                cp.write_row((p,))

    def close(self) -> None:
        self.conn.close()


class RedisClient:
    def __init__(self, spec: dict[str, Any]) -> None:
        import redis

        self.r = redis.Redis.from_url(spec["url"], socket_connect_timeout=5)
        self.key = spec["key"]
        self.processing = f"{spec['key']}:processing:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def enqueue(self, p: bytes) -> None:
        self.r.lpush(self.key, p)

    def take(self) -> bytes | None:
        v = self.r.lmove(self.key, self.processing, "RIGHT", "LEFT")
        if v is None:
            return None
        self.r.lrem(self.processing, 1, v)  # the ack
        return bytes(v)

    def take_blocking(self, timeout: float) -> bytes | None:
        v = self.r.blmove(self.key, self.processing, timeout, "RIGHT", "LEFT")
        if v is None:
            return None
        self.r.lrem(self.processing, 1, v)
        return bytes(v)

    def fill(self, payloads: list[bytes]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for i in range(0, len(payloads), FILL_BATCH):
            pipe.lpush(self.key, *payloads[i : i + FILL_BATCH])
        pipe.execute()

    def close(self) -> None:
        self.r.close()


CLIENTS: dict[str, Any] = {
    "fdbqueue": FdbqueueClient,
    "persistqueue": PersistQueueClient,
    "huey": HueyClient,
    "postgres": PostgresClient,
    "redis": RedisClient,
}


def client(spec: dict[str, Any]) -> Any:
    return CLIENTS[spec["system"]](spec)


# ---------------------------------------------------------------------------------------------
# Fresh storage for one run of one system, and what the run's setting is.


class Peers:
    """Where each system lives, whether it is reachable, and how to give a run fresh storage."""

    def __init__(self, args: argparse.Namespace, directory: str) -> None:
        self.dir = directory
        self.args = args
        self.skip: dict[str, str] = {}
        self.info: dict[str, Any] = {}
        self._count = 0
        self._probe()

    def _probe(self) -> None:
        try:
            self.info["persist-queue"] = importlib.metadata.version("persist-queue")
        except importlib.metadata.PackageNotFoundError:
            self.skip["persistqueue"] = "persist-queue is not installed (pip install persist-queue)"
        try:
            self.info["huey"] = importlib.metadata.version("huey")
        except importlib.metadata.PackageNotFoundError:
            self.skip["huey"] = "huey is not installed (pip install huey)"
        try:
            import psycopg

            self.info["psycopg"] = psycopg.__version__
            with psycopg.connect(self.args.pg_dsn, autocommit=True, connect_timeout=5) as conn:
                self.info["postgresql"] = conn.execute("SHOW server_version").fetchone()[0]
                self.info["postgresql_fsync"] = conn.execute("SHOW fsync").fetchone()[0]
                self.info["postgresql_wal_sync_method"] = conn.execute("SHOW wal_sync_method").fetchone()[0]
                if self.info["postgresql_fsync"] != "on":
                    log("warning: the PostgreSQL server runs with fsync=off: not durable")
        except ImportError:
            self.skip["postgres"] = "psycopg is not installed (pip install 'psycopg[binary]')"
        except Exception as exc:
            self.skip["postgres"] = f"PostgreSQL not reachable at {self.args.pg_dsn}: {_short(exc)}"
        try:
            import redis

            self.info["redis-py"] = redis.__version__
            for setting, url in (("durable", self.args.redis_url), ("fast", self.args.redis_fast_url)):
                r = redis.Redis.from_url(url, socket_connect_timeout=5)
                try:
                    self.info["redis"] = r.info("server")["redis_version"]
                    conf = {**r.config_get("appendonly"), **r.config_get("appendfsync")}
                    self.info[f"redis_{setting}"] = conf
                    want = "always" if setting == "durable" else "everysec"
                    if conf.get("appendonly") != "yes" or conf.get("appendfsync") != want:
                        log(f"warning: Redis at {url} has {conf}, not appendonly yes / appendfsync {want}")
                finally:
                    r.close()
        except ImportError:
            self.skip["redis"] = "redis (redis-py) is not installed (pip install redis)"
        except Exception as exc:
            self.skip["redis"] = f"Redis not reachable: {_short(exc)}"

    def spec(self, system: str, setting: str) -> dict[str, Any]:
        """A fresh, empty queue of ``system`` at ``setting`` ('durable' or 'fast')."""
        self._count += 1
        tag = f"r{os.getpid()}_{self._count}"
        durable = setting == "durable"
        if system == "fdbqueue":
            path = os.path.join(self.dir, f"fdbqueue-{tag}.db")
            return {
                "system": system,
                "url": f"sqlite://{path}?sync={'full' if durable else 'normal'}",
                "queue": "bench",
                "files": [path],
            }
        if system == "persistqueue":
            path = os.path.join(self.dir, f"persistqueue-{tag}")
            return {
                "system": system,
                "path": path,
                "sync": "default" if durable else "NORMAL",
                "files": [path],
            }
        if system == "huey":
            path = os.path.join(self.dir, f"huey-{tag}.db")
            return {
                "system": system,
                "path": path,
                "queue": "bench",
                "sync": "default" if durable else "NORMAL",
                "files": [path],
            }
        if system == "postgres":
            import psycopg

            table = f"bench_q_{tag}"
            with psycopg.connect(self.args.pg_dsn, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
                conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, payload bytea NOT NULL)")
            return {
                "system": system,
                "dsn": self.args.pg_dsn,
                "table": table,
                "channel": f"chan_{tag}",
                "synchronous_commit": "on" if durable else "off",
            }
        if system == "redis":
            url = self.args.redis_url if durable else self.args.redis_fast_url
            return {
                "system": system,
                "url": url,
                "key": f"fdbqueue-bench:{tag}",
            }
        raise ValueError(system)

    def spec_text(self, system: str, setting: str) -> str:
        """The durability setting of ``system`` at ``setting``, as run."""
        durable = setting == "durable"
        if system == "fdbqueue":
            return "sync=full" if durable else "sync=normal"
        if system == "persistqueue":
            return (
                "WAL, synchronous=FULL (its default)"
                if durable
                else "WAL, synchronous=NORMAL (set on its connections by this script)"
            )
        if system == "huey":
            return (
                "WAL, synchronous=FULL (its default)"
                if durable
                else "WAL, synchronous=NORMAL (set on its connections by this script)"
            )
        if system == "postgres":
            fsync = self.info.get("postgresql_fsync", "?")
            return f"synchronous_commit={'on' if durable else 'off'} (server fsync={fsync})"
        conf = self.info.get(f"redis_{setting}", {})
        return f"appendonly {conf.get('appendonly', '?')}, appendfsync {conf.get('appendfsync', '?')}"

    def drop(self, spec: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):
            if spec["system"] in ("fdbqueue", "persistqueue", "huey"):
                for f in spec["files"]:
                    if os.path.isdir(f):
                        shutil.rmtree(f, ignore_errors=True)
                    else:
                        for suffix in ("", "-wal", "-shm", ".lock", "-journal"):
                            with contextlib.suppress(OSError):
                                os.unlink(f + suffix)
                        for extra in os.listdir(self.dir):  # the engine's side files
                            if extra.startswith(os.path.basename(f)):
                                p = os.path.join(self.dir, extra)
                                if os.path.isdir(p):
                                    shutil.rmtree(p, ignore_errors=True)
                                else:
                                    os.unlink(p)
            elif spec["system"] == "postgres":
                import psycopg

                with psycopg.connect(self.args.pg_dsn, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"DROP TABLE IF EXISTS {spec['table']}")
            elif spec["system"] == "redis":
                import redis

                r = redis.Redis.from_url(spec["url"], socket_connect_timeout=5)
                keys = list(r.scan_iter(match=spec["key"] + "*", count=1000))
                if keys:
                    r.delete(*keys)
                r.close()


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:200]


# ---------------------------------------------------------------------------------------------
# Workloads.


def run_enqueue_dequeue(spec: dict[str, Any], n: int) -> dict[str, Any]:
    """(a) n enqueues, one commit each; then (b) n dequeue+ack, one transaction each."""
    c = client(spec)
    try:
        t0 = time.perf_counter()
        for i in range(n):
            c.enqueue(payload(i))
        t_enq = time.perf_counter() - t0
        seen, t_deq, leftover = _take_all(c.take, n)
    finally:
        c.close()
    return {
        "enqueue": {"n": n, "seconds": t_enq, "rate": n / t_enq},
        "dequeue": {"n": len(seen), "seconds": t_deq, "rate": len(seen) / t_deq, **check(seen, n, leftover)},
    }


def run_lease_ack(spec: dict[str, Any], n: int) -> dict[str, Any]:
    """(b) fdbqueue only: lease + ack (two transactions a message) on a pre-filled queue."""
    c = client(spec)
    try:
        c.fill([payload(i) for i in range(n)])
        seen, t, leftover = _take_all(c.lease_ack, n)
    finally:
        c.close()
    return {"n": len(seen), "seconds": t, "rate": len(seen) / t, **check(seen, n, leftover)}


def run_worker(spec: dict[str, Any], n: int) -> dict[str, Any]:
    """(b) fdbqueue only: a lease-mode Worker (batched acks, the default) draining a pre-filled
    queue: lease + ack as a Worker does it, one process, a no-op handler."""
    c = client(spec)
    try:
        c.fill([payload(i) for i in range(n)])
        seen: list[int] = []
        w = fdbqueue.Worker(c.db, c.q, lambda m: seen.append(unpack(m.payload)[0]))
        t0 = time.perf_counter()
        w.run(until_empty=True)
        t = time.perf_counter() - t0
        leftover = c.lease_ack()
    finally:
        c.close()
    return {"n": len(seen), "seconds": t, "rate": len(seen) / t, **check(seen, n, leftover)}


def _take_all(take: Callable[[], bytes | None], n: int) -> tuple[list[int], float, bytes | None]:
    """Up to n takes, timed: the sequence numbers seen, the seconds, then one more take
    (which must find nothing)."""
    seen: list[int] = []
    t0 = time.perf_counter()
    for _ in range(n):
        p = take()
        if p is None:
            break
        seen.append(unpack(p)[0])
    return seen, time.perf_counter() - t0, take()


def check(seen: list[int], n: int, leftover: Any = None) -> dict[str, Any]:
    counts = Counter(seen)
    dupes = sum(v - 1 for v in counts.values() if v > 1)
    missing = n - len(counts.keys() & set(range(n)))
    return {
        "duplicates": dupes,
        "missing": missing,
        "left_in_queue": leftover is not None,
        "exactly_once": dupes == 0 and missing == 0 and leftover is None,
    }


def _drain(c: Any, worker: bool = False) -> tuple[list[int], float, str | None]:
    seen: list[int] = []
    misses = 0
    error = None
    if worker:  # fdbqueue: a lease-mode Worker (batched acks), until it finds the queue empty
        try:
            fdbqueue.Worker(c.db, c.q, lambda m: seen.append(unpack(m.payload)[0])).run(until_empty=True)
        except Exception as exc:
            error = _short(exc)
        return seen, time.monotonic(), error
    try:
        while True:
            p = c.take()
            if p is None:
                misses += 1
                if misses >= 3:  # empty three times in a row, 2 ms apart: drained
                    break
                time.sleep(0.002)
                continue
            misses = 0
            seen.append(unpack(p)[0])
    except Exception as exc:
        error = _short(exc)
    return seen, time.monotonic(), error


def _drain_process(spec: dict[str, Any], barrier: Any, out: Any, worker: bool = False) -> None:
    try:
        c = client(spec)
    except Exception as exc:
        out.put((os.getpid(), [], time.monotonic(), f"open: {_short(exc)}"))
        with contextlib.suppress(Exception):
            barrier.abort()
        return
    try:
        barrier.wait(timeout=120)
    except Exception as exc:
        out.put((os.getpid(), [], time.monotonic(), f"start: {_short(exc)}"))
        return
    seen, t_end, error = _drain(c, worker)
    with contextlib.suppress(Exception):
        c.close()
    out.put((os.getpid(), seen, t_end, error))


def run_drain(spec: dict[str, Any], n: int, threads: bool = False, worker: bool = False) -> dict[str, Any]:
    """(c) CONSUMERS processes (or threads sharing one client) drain n pre-filled messages;
    ``worker``: each process runs an fdbqueue Worker (lease + batched acks)."""
    c = client(spec)
    c.fill([payload(i) for i in range(n)])
    results: list[tuple[int, list[int], float, str | None]] = []
    if threads:
        lock = threading.Lock()
        start = threading.Barrier(CONSUMERS + 1)

        def body() -> None:
            start.wait()
            seen, t_end, err = _drain(c)
            with lock:
                results.append((threading.get_ident(), seen, t_end, err))

        ts = [threading.Thread(target=body) for _ in range(CONSUMERS)]
        for t in ts:
            t.start()
        start.wait()
        t0 = time.monotonic()
        for t in ts:
            t.join()
    else:
        c.close()
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(CONSUMERS + 1)
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_drain_process, args=(spec, barrier, out, worker)) for _ in range(CONSUMERS)
        ]
        for p in procs:
            p.start()
        with contextlib.suppress(Exception):  # a consumer that failed to open broke it: reported below
            barrier.wait(timeout=120)
        t0 = time.monotonic()
        deadline = time.monotonic() + max(120.0, n / 50)
        for _ in procs:
            try:
                results.append(out.get(timeout=max(1.0, deadline - time.monotonic())))
            except Exception:
                break
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        c = client(spec)
    try:
        leftover = c.take()
    finally:
        c.close()
    seen = [s for r in results for s in r[1]]
    errors = [r[3] for r in results if r[3]]
    if len(results) < CONSUMERS:
        errors.append(f"{CONSUMERS - len(results)} consumer(s) did not report")
    t_end = max((r[2] for r in results), default=t0)
    elapsed = max(t_end - t0, 1e-9)
    distinct = len(set(seen))
    return {
        "n": distinct,
        "deliveries": len(seen),
        "seconds": elapsed,
        "rate": distinct / elapsed,  # distinct messages: a duplicate delivery is not throughput
        "per_consumer": sorted(len(r[1]) for r in results),
        "errors": errors,
        "mode": "threads" if threads else "processes",
        **check(seen, n, leftover),
    }


def _latency_consume(c: Any, ready: Any, hard_deadline: float) -> tuple[list[float], int, str | None]:
    lat: list[float] = []
    got = 0
    error = None
    try:
        ready.set()
        while time.monotonic() < hard_deadline:
            p = c.take_blocking(0.5)
            now = time.monotonic()
            if p is None:
                continue
            seq, stamp = unpack(p)
            if seq == SENTINEL:
                break
            got += 1
            lat.append(now - stamp)
    except Exception as exc:
        error = _short(exc)
    return lat, got, error


def _latency_process(spec: dict[str, Any], ready: Any, out: Any, hard_deadline: float) -> None:
    try:
        c = client(spec)
    except Exception as exc:
        ready.set()
        out.put(([], 0, f"open: {_short(exc)}"))
        return
    res = _latency_consume(c, ready, hard_deadline)
    with contextlib.suppress(Exception):
        c.close()
    out.put(res)


def paced(rate: float, seconds: float) -> Iterator[float]:
    """An open-loop schedule: yields each send's due time, t0 + i / rate, once it has come,
    for ``seconds`` (a late send does not move the ones after it)."""
    t0 = time.monotonic()
    for i in range(int(rate * seconds)):
        target = t0 + i / rate
        now = time.monotonic()
        if now - t0 >= seconds:
            return
        if now < target:
            time.sleep(target - now)
        yield target


def run_latency(spec: dict[str, Any], rate: float, seconds: float, drain: float) -> dict[str, Any]:
    """(d) an open-loop producer at ``rate`` msg/s for ``seconds``; one blocking consumer."""
    in_thread = spec["system"] == "persistqueue"  # its blocking get is woken by put() in-process only
    c = client(spec)
    # Create the queue before the consumer starts (fdbqueue creates it on first use).
    c.enqueue(payload(SENTINEL - 1))
    c.take()
    box: list[Any] = []
    if in_thread:
        ready: Any = threading.Event()
        hard = time.monotonic() + seconds + drain + 10
        th = threading.Thread(target=lambda: box.append(_latency_consume(c, ready, hard)))
        th.start()
    else:
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        out = ctx.Queue()
        hard = time.monotonic() + seconds + drain + 30  # + start-up of the process
        proc = ctx.Process(target=_latency_process, args=(spec, ready, out, hard))
        proc.start()
    ready.wait(60)
    time.sleep(0.3)  # let the consumer reach its first blocking wait
    lags: list[float] = []
    sent = 0
    t0 = time.monotonic()
    for target in paced(rate, seconds):
        stamp = time.monotonic()
        lags.append(stamp - target)
        c.enqueue(payload(sent, stamp))
        sent += 1
    t_sent = time.monotonic() - t0
    c.enqueue(payload(SENTINEL))
    if in_thread:
        th.join()
        lat, got, error = box[0]
    else:
        try:
            lat, got, error = out.get(timeout=max(1.0, hard - time.monotonic() + 5))
        except Exception:
            lat, got, error = [], 0, "the consumer did not report"
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    c.close()
    lat.sort()
    return {
        "offered": rate,
        "seconds": seconds,
        "sent": sent,
        "achieved": sent / t_sent if t_sent > 0 else 0.0,
        "received": got,
        "p50_ms": pct(lat, 50) * 1e3,
        "p99_ms": pct(lat, 99) * 1e3,
        "max_ms": (lat[-1] if lat else float("nan")) * 1e3,
        "send_lag_p99_ms": pct(sorted(lags), 99) * 1e3,
        "consumer": "thread in the producer's process" if in_thread else "separate process",
        "error": error,
    }


DISK = "disk"  # a row of (d) at the durable setting, not a system: the disk's own floor
FRAME = 8240  # what an fdbqueue enqueue appends to the WAL: two frames of 4 KiB pages


def run_disk_floor(directory: str, rate: float, seconds: float) -> dict[str, Any]:
    """(d)'s floor on this disk: at the same offered rate, per message, two appends to one file,
    each followed by fdatasync (the enqueue's commit and the dequeue's, which no durable queue
    can avoid), timed from before the first write to after the second fsync."""
    path = os.path.join(directory, "disk-floor.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        span = 4 << 20  # written once and fsynced first: later writes overwrite, as a WAL does
        os.pwrite(fd, b"\0" * span, 0)
        os.fsync(fd)
        block = PAD[:1] * FRAME
        lat: list[float] = []
        t0 = time.monotonic()
        offset = 0
        for _ in paced(rate, seconds):
            start = time.monotonic()
            for _ in range(2):
                os.pwrite(fd, block, offset)
                os.fdatasync(fd)
                offset = (offset + FRAME) % (span - FRAME)
            lat.append(time.monotonic() - start)
    finally:
        os.close(fd)
        os.unlink(path)
    lat.sort()
    return {
        "offered": rate,
        "seconds": seconds,
        "sent": len(lat),
        "achieved": len(lat) / max(time.monotonic() - t0, 1e-9),
        "received": len(lat),
        "p50_ms": pct(lat, 50) * 1e3,
        "p99_ms": pct(lat, 99) * 1e3,
        "max_ms": (lat[-1] if lat else float("nan")) * 1e3,
    }


def pct(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


# ---------------------------------------------------------------------------------------------
# One round: every system through every workload.


def run_system(peers: Peers, system: str, setting: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {}
    wl = args.workloads

    def fresh() -> dict[str, Any]:
        return peers.spec(system, setting)

    def on_fresh(run: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``run(spec, *args, **kwargs)`` on a fresh store of this system, dropped after."""
        spec = fresh()
        try:
            return run(spec, *args, **kwargs)
        finally:
            peers.drop(spec)

    if "a" in wl or "b" in wl:
        spec = fresh()
        try:
            if system in ("persistqueue", "huey"):
                pq = client(spec)
                res["pragmas"] = pq.pragmas()
                pq.close()
            r = run_enqueue_dequeue(spec, n)
            res["a"] = r["enqueue"]
            res["b"] = r["dequeue"]
        finally:
            peers.drop(spec)
        log(f"    {system:12} a {res['a']['rate']:9,.0f} msg/s   b {res['b']['rate']:9,.0f} msg/s")
        if system == "fdbqueue" and "b" in wl:
            res["b_lease"] = on_fresh(run_lease_ack, n)
            log(f"    {system:12} b (lease+ack) {res['b_lease']['rate']:9,.0f} msg/s")
            res["b_worker"] = on_fresh(run_worker, n)
            log(f"    {system:12} b (Worker)    {res['b_worker']['rate']:9,.0f} msg/s")
    if "c" in wl:
        res["c"] = on_fresh(run_drain, n)
        log(
            f"    {system:12} c {res['c']['rate']:9,.0f} msg/s  exactly-once={res['c']['exactly_once']}"
            f" dupes={res['c']['duplicates']} missing={res['c']['missing']} {res['c']['errors'] or ''}"
        )
        if system == "fdbqueue":
            res["c_worker"] = on_fresh(run_drain, n, worker=True)
            log(f"    {system:12} c (Workers) {res['c_worker']['rate']:9,.0f} msg/s")
        if system == "persistqueue":
            res["c_threads"] = on_fresh(run_drain, n, threads=True)
            log(f"    {system:12} c (threads) {res['c_threads']['rate']:9,.0f} msg/s")
    if "d" in wl:
        res["d"] = on_fresh(run_latency, args.rate, args.latency_seconds, args.drain_seconds)
        d = res["d"]
        log(
            f"    {system:12} d sent {d['achieved']:.0f}/s p50 {d['p50_ms']:.2f} ms p99 {d['p99_ms']:.2f} ms"
            f" received {d['received']}/{d['sent']} {d['error'] or ''}"
        )
    return res


# ---------------------------------------------------------------------------------------------
# Tables.

_MARKDOWN = False


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:
            return "-"
        if value >= 100:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}"
        if value >= 0.1 or value == 0:
            return f"{value:.2f}"
        return f"{value:.2g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def show(title: str, headers: list[str], rows: list[list[Any]]) -> None:
    benchlib.show_table(title, headers, [[fmt(c) for c in row] for row in rows], markdown=_MARKDOWN)


def args_seconds(rounds: list[dict[str, Any]]) -> str:
    for rnd in rounds:
        for res in rnd.values():
            if isinstance(res, dict) and "d" in res:
                return f"{res['d']['seconds']:g} s"
    return "?"


def med(values: list[float]) -> float:
    vals = [v for v in values if v == v]
    return statistics.median(vals) if vals else float("nan")


def spread(values: list[float]) -> str:
    vals = [v for v in values if v == v]
    if not vals:
        return "-"
    return f"{fmt(min(vals))}-{fmt(max(vals))}"


def get(rounds: list[dict[str, Any]], system: str, wl: str, field: str) -> list[float]:
    out = []
    for rnd in rounds:
        v = rnd.get(system, {}).get(wl, {}).get(field)
        if v is not None:
            out.append(float(v))
    return out


def ratio_of_medians(
    rounds: list[dict[str, Any]], a: tuple[str, str], b: tuple[str, str], field: str
) -> float:
    """fdbqueue's median figure over the peer's: the ratio of the two cells of the table.

    Not a median of same-round ratios: one system's workloads take 10-40 s here, and the shared
    disk's fsync time changes several-fold within that, so pairs in a round are no closer in
    conditions than any two runs; the median of each side over rounds is the sturdier figure.
    """
    x, y = med(get(rounds, a[0], a[1], field)), med(get(rounds, b[0], b[1], field))
    return x / y if x == x and y == y and y else float("nan")


def summarise(setting: str, n: int, rounds: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for system in systems:
        s: dict[str, Any] = {}
        for wl in ("a", "b", "b_lease", "b_worker", "c", "c_worker", "c_threads"):
            rates = get(rounds, system, wl, "rate")
            if rates:
                s[wl] = {"rate_median": med(rates), "rate_min": min(rates), "rate_max": max(rates)}
                if wl.startswith("b") or wl.startswith("c"):
                    s[wl]["exactly_once_all_rounds"] = all(
                        rnd[system][wl]["exactly_once"] for rnd in rounds if wl in rnd.get(system, {})
                    )
                    s[wl]["duplicates_max"] = max(get(rounds, system, wl, "duplicates") or [0])
                    s[wl]["missing_max"] = max(get(rounds, system, wl, "missing") or [0])
        if get(rounds, system, "d", "p50_ms"):
            s["d"] = {
                f: med(get(rounds, system, "d", f))
                for f in ("achieved", "p50_ms", "p99_ms", "max_ms", "send_lag_p99_ms", "received", "sent")
            }
        if system != "fdbqueue" and "fdbqueue" in systems:
            s["fdbqueue_over_peer"] = {
                name: ratio_of_medians(rounds, ("fdbqueue", fw), (system, wl), field)
                for name, fw, wl, field in (
                    ("a", "a", "a", "rate"),
                    ("b", "b", "b", "rate"),
                    ("b_lease", "b_lease", "b", "rate"),
                    ("b_worker", "b_worker", "b", "rate"),
                    ("c", "c", "c", "rate"),
                    ("d_p50", "d", "d", "p50_ms"),
                    ("d_p99", "d", "d", "p99_ms"),
                )
            }
        summary[system] = s
    return summary


def setting_text(rounds: list[dict[str, Any]], system: str) -> str:
    return next((rnd[system]["setting_text"] for rnd in rounds if system in rnd), "?")


def print_tables(setting: str, n: int, rounds: list[dict[str, Any]], systems: list[str]) -> None:
    present = [s for s in systems if any(s in rnd for rnd in rounds)]
    if not present:
        return
    r = len(rounds)
    tag = f"({setting}, N={n:,}, median of {r} round{'s' if r > 1 else ''})"
    fdb = "fdbqueue" in present

    show(
        f"Systems at the {setting} setting",
        ["system", "durability", "what runs"],
        [[LABEL[s], setting_text(rounds, s), WHAT[s]] for s in present],
    )

    def ratio(system: str, wl: str, fdb_wl: str, field: str = "rate") -> Any:
        if system == "fdbqueue" or not fdb:
            return "-"
        return ratio_of_medians(rounds, ("fdbqueue", fdb_wl), (system, wl), field)

    def once(system: str, wl: str) -> str:
        flags = [rnd[system][wl]["exactly_once"] for rnd in rounds if wl in rnd.get(system, {})]
        return "yes" if all(flags) else f"NO ({flags.count(False)}/{len(flags)} rounds)"

    rows = []
    for s in present:
        rates = get(rounds, s, "a", "rate")
        if rates:
            rows.append([LABEL[s], med(rates), spread(rates), 1e6 / med(rates), ratio(s, "a", "a")])
    if rows:
        show(
            f"(a) enqueue, one commit per message {tag}",
            ["system", "msg/s", "range", "µs/msg", "fdbqueue ÷ peer"],
            rows,
        )

    rows = []
    names = {
        ("fdbqueue", "b"): "fdbqueue: dequeue(tr), 1 transaction",
        ("fdbqueue", "b_lease"): "fdbqueue: lease + ack, 2 transactions",
        ("fdbqueue", "b_worker"): "fdbqueue: a Worker's lease + ack (batched acks)",
        ("persistqueue", "b"): "persist-queue: get + ack, 2 commits",
        ("huey", "b"): "huey: dequeue (SELECT + DELETE), 1 transaction, no ack",
        ("postgres", "b"): "PostgreSQL: SKIP LOCKED + DELETE, 1 transaction",
        ("redis", "b"): "Redis: LMOVE + LREM, 2 commands",
    }
    for s in present:
        for wl in ("b", "b_lease", "b_worker"):
            rates = get(rounds, s, wl, "rate")
            if not rates:
                continue
            rows.append(
                [
                    names[(s, wl)],
                    med(rates),
                    spread(rates),
                    1e6 / med(rates),
                    once(s, wl),
                    ratio(s, wl, "b") if wl == "b" else "-",
                    ratio(s, wl, "b_lease") if wl == "b" else "-",
                    ratio(s, wl, "b_worker") if wl == "b" else "-",
                ]
            )
    if rows:
        show(
            f"(b) dequeue + ack, one message at a time {tag}",
            [
                "system",
                "msg/s",
                "range",
                "µs/msg",
                "each once",
                "fdbqueue tx ÷ peer",
                "fdbqueue lease ÷ peer",
                "fdbqueue Worker ÷ peer",
            ],
            rows,
        )

    rows = []
    for s in present:
        for wl in ("c", "c_worker", "c_threads"):
            rates = get(rounds, s, wl, "rate")
            if not rates:
                continue
            label = (
                LABEL[s]
                + {
                    "c": "",
                    "c_worker": f": {CONSUMERS} Worker processes (lease + batched acks)",
                    "c_threads": f": {CONSUMERS} threads, one queue object",
                }[wl]
            )
            errs = sorted({e for rnd in rounds for e in rnd.get(s, {}).get(wl, {}).get("errors", [])})
            rows.append(
                [
                    label,
                    med(rates),
                    spread(rates),
                    once(s, wl),
                    int(max(get(rounds, s, wl, "duplicates") or [0])),
                    int(max(get(rounds, s, wl, "missing") or [0])),
                    ratio(s, wl, "c"),
                    ratio(s, wl, "c_worker"),
                    ("; ".join(errs))[:60] or "-",
                ]
            )
    if rows:
        show(
            f"(c) {CONSUMERS} consumer processes draining N messages at once {tag}",
            [
                "system",
                "msg/s",
                "range",
                "exactly once",
                "max dupes",
                "max missing",
                "fdbqueue ÷ peer",
                "fdbqueue Workers ÷ peer",
                "errors",
            ],
            rows,
        )

    def latency_cells(key: str) -> list[Any]:
        p50, p99 = get(rounds, key, "d", "p50_ms"), get(rounds, key, "d", "p99_ms")
        return [
            med(get(rounds, key, "d", "achieved")),
            med(p50),
            spread(p50),
            med(p99),
            spread(p99),
            med(get(rounds, key, "d", "max_ms")),
        ]

    rows = []
    offered = float("nan")
    for s in present:
        if not get(rounds, s, "d", "p50_ms"):
            continue
        offered = next(rnd[s]["d"]["offered"] for rnd in rounds if "d" in rnd.get(s, {}))
        rows.append(
            [
                LABEL[s],
                *latency_cells(s),
                f"{int(med(get(rounds, s, 'd', 'received')))}/{int(med(get(rounds, s, 'd', 'sent')))}",
                ratio(s, "d", "d", "p50_ms"),
                ratio(s, "d", "d", "p99_ms"),
            ]
        )
    if rows and get(rounds, DISK, "d", "p50_ms"):
        floor = "floor: 2 x (write 8 KiB + fdatasync) per message, same disk"
        rows.append([floor, *latency_cells(DISK), "-", None, None])
    if rows:
        show(
            f"(d) end-to-end latency, {offered:.0f} msg/s offered for {args_seconds(rounds)}, one blocking "
            f"consumer ({setting}, median of {r} round{'s' if r > 1 else ''})",
            [
                "system",
                "sent msg/s",
                "p50 ms",
                "p50 range",
                "p99 ms",
                "p99 range",
                "max ms",
                "received/sent",
                "fdbqueue p50 ÷ peer",
                "fdbqueue p99 ÷ peer",
            ],
            rows,
        )


# ---------------------------------------------------------------------------------------------
# The machine.


def machine(directory: str) -> dict[str, Any]:
    return {
        "fdbqueue_commit": _git_commit(),
        **benchlib.machine(filesystem=benchlib.filesystem_of(directory), loadavg_at_start=benchlib.loadavg()),
    }


def _git_commit() -> str:
    """The checkout's commit, '+changes' when fdbqueue/ differs from it ('' outside git)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--", "fdbqueue"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+changes" if dirty else "") if head else ""


def main(argv: list[str] | None = None) -> int:
    global _MARKDOWN
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--n",
        type=int,
        default=10_000,
        help="messages per workload at the fast setting (10000: 3 rounds of everything take 6-9 "
        "minutes on 2 loaded cores; persist-queue's dequeue slows with N, see the docs)",
    )
    p.add_argument(
        "--n-durable",
        type=int,
        default=None,
        help="messages per workload at the durable setting (default: 3000, or --n if smaller): "
        "every commit waits for an fsync, 0.3 to 7 ms on this shared disk; the 4-process drain "
        "needs about a second of it to settle",
    )
    p.add_argument("--repeat", type=int, default=3, help="rounds; tables give medians (3)")
    p.add_argument("--settings", default="durable,fast", help="durable,fast (both)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"subset of {','.join(SYSTEMS)}")
    p.add_argument("--workloads", default="abcd", help="subset of abcd (all)")
    p.add_argument("--rate", type=float, default=500.0, help="offered load of (d), msg/s (500)")
    p.add_argument("--latency-seconds", type=float, default=4.0, help="length of the (d) producer run, s (4)")
    p.add_argument(
        "--drain-seconds", type=float, default=30.0, help="(d): longest wait for the backlog, s (30)"
    )
    p.add_argument("--pg-dsn", default=os.environ.get("PEERS_PG_DSN", DEFAULT_PG))
    p.add_argument("--redis-url", default=os.environ.get("PEERS_REDIS_URL", DEFAULT_REDIS))
    p.add_argument("--redis-fast-url", default=os.environ.get("PEERS_REDIS_FAST_URL", DEFAULT_REDIS_FAST))
    p.add_argument("--dir", default=None, help="directory for the SQLite files (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--json-file", default=None, help="also write the JSON document to this file")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument(
        "--from-json", default=None, help="print the tables of a saved --json document; run nothing"
    )
    args = benchlib.parse_args(
        p,
        argv,
        n=200,
        n_durable=100,
        repeat=1,
        settings="fast",
        systems="fdbqueue",
        rate=200.0,
        latency_seconds=0.5,
    )
    _MARKDOWN = args.markdown
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        for setting, data in saved["settings"].items():
            present = [s for s in SYSTEMS if any(s in rnd for rnd in data["rounds"])]
            print_tables(setting, data["n"], data["rounds"], present)
        print_footer(saved)
        return 0
    systems = [s for s in args.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r}")
    settings = [s for s in args.settings.split(",") if s]
    for s in settings:
        if s not in ("durable", "fast"):
            p.error(f"unknown setting {s!r}")
    n_fast = args.n
    n_durable = args.n_durable if args.n_durable is not None else min(3000, args.n)

    started = time.monotonic()
    directory = tempfile.mkdtemp(prefix="bench-peers-", dir=args.dir)
    try:
        peers = Peers(args, directory)
        mach = machine(directory)
        for s, why in peers.skip.items():
            if s in systems:
                log(f"skipping {LABEL[s]}: {why}")
        active = [s for s in systems if s not in peers.skip]
        doc: dict[str, Any] = {
            "machine": mach,
            "versions": {"fdbqueue": fdbqueue.__version__, **peers.info},
            "skipped": {s: peers.skip[s] for s in systems if s in peers.skip},
            "payload_bytes": PAYLOAD_SIZE,
            "consumers": CONSUMERS,
            "rate": args.rate,
            "latency_seconds": args.latency_seconds,
            "repeat": args.repeat,
            "settings": {},
        }
        for setting in settings:
            n = n_durable if setting == "durable" else n_fast
            rounds: list[dict[str, Any]] = []
            for k in range(args.repeat):
                order = active[k % len(active) :] + active[: k % len(active)] if active else []
                log(f"[{setting} N={n} round {k + 1}/{args.repeat}] {', '.join(order)}")
                rnd: dict[str, Any] = {}
                for system in order:
                    t = time.monotonic()
                    try:
                        rnd[system] = run_system(peers, system, setting, n, args)
                    except Exception as exc:
                        log(f"    {system}: failed: {_short(exc)}")
                        rnd[system] = {"error": _short(exc)}
                    rnd[system]["setting_text"] = peers.spec_text(system, setting)
                    rnd[system]["wall_seconds"] = time.monotonic() - t
                if setting == "durable" and "d" in args.workloads:
                    rnd[DISK] = {"d": run_disk_floor(directory, args.rate, args.latency_seconds)}
                    d = rnd[DISK]["d"]
                    log(f"    {'disk floor':12} d p50 {d['p50_ms']:.2f} ms p99 {d['p99_ms']:.2f} ms")
                rounds.append(rnd)
            doc["settings"][setting] = {
                "n": n,
                "rounds": rounds,
                "summary": summarise(setting, n, rounds, active),
            }
            if not args.json:
                print_tables(setting, n, rounds, active)
        doc["seconds"] = time.monotonic() - started
        doc["machine"]["loadavg_at_end"] = benchlib.loadavg()
        doc["machine"]["fdbqueue_commit_at_end"] = _git_commit()
        if args.json_file:
            with open(args.json_file, "w") as f:
                json.dump(doc, f, indent=2, default=str)
        if args.json:
            print(json.dumps(doc, indent=2, default=str))
        else:
            print_footer(doc)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


def print_footer(doc: dict[str, Any]) -> None:
    m, v = doc["machine"], doc["versions"]
    print()
    print(
        f"Machine: nproc={m['nproc']}, CPU {m['cpu']!r}, Python {m['python']}, SQLite {m['sqlite']}, "
        f"PostgreSQL {v.get('postgresql', '-')}, Redis {v.get('redis', '-')}, {m['platform']}; "
        f"SQLite files on {m['filesystem'] or '?'}; load average {m['loadavg_at_start']} at start, "
        f"{m['loadavg_at_end']} at end."
    )
    print(
        f"Clients: fdbqueue {v.get('fdbqueue')} (commit {m.get('fdbqueue_commit') or '?'} at start, "
        f"{m.get('fdbqueue_commit_at_end') or '?'} at end), persist-queue {v.get('persist-queue', '-')}, "
        f"huey {v.get('huey', '-')}, "
        f"psycopg {v.get('psycopg', '-')}, redis-py {v.get('redis-py', '-')}."
    )
    for setting, data in doc["settings"].items():
        for peer in ("persistqueue", "huey"):
            pragmas = {json.dumps(r[peer]["pragmas"]) for r in data["rounds"] if "pragmas" in r.get(peer, {})}
            if pragmas:
                print(
                    f"{LABEL[peer]} at the {setting} setting, read back from its connection: "
                    f"{', '.join(sorted(pragmas))}."
                )
    for s, why in doc["skipped"].items():
        print(f"Skipped {LABEL[s]}: {why}")
    ns = ", ".join(f"{k} N={d['n']:,}" for k, d in doc["settings"].items())
    print(
        f"Messages of {PAYLOAD_SIZE} bytes ({ns}); (c) {CONSUMERS} consumer processes; "
        f"(d) {doc['rate']:.0f} msg/s offered for {doc['latency_seconds']:.0f} s. "
        f"Each figure is the median of {doc['repeat']} round(s). Ratios are fdbqueue ÷ peer, the ratio of "
        "the two medians: above 1 fdbqueue is faster (throughput); below 1 its latency is lower. "
        f"Took {doc['seconds']:.0f} s."
    )


if __name__ == "__main__":
    sys.exit(main())
