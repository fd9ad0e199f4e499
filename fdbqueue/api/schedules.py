"""Periodic jobs: ``schedule(db, queue, cron, payload, name=)`` enqueues ``payload`` into
``queue`` at each tick of a cron expression, exactly once per tick whatever the number of
schedulers running (``Scheduler``, ``fdbqueue scheduler``, or workers with
``run_schedules=True``).

A schedule is one record in the database with the last tick it enqueued. A scheduler's pass
reads it, finds the ticks after that one up to now, and in one transaction enqueues and moves
the record on: two schedulers passing at once conflict on the record (FoundationDB's
optimistic concurrency; the embedded engine serialises them), the loser runs again, finds the
tick taken and writes nothing. Each tick's enqueue also carries the dedup key
``schedule:<name>:<tick>``, a second guard.

Missed ticks (every scheduler down): ``catch_up="latest"`` (the default) enqueues only the
most recent missed tick, once; ``"all"`` enqueues each missed tick (at most ``MAX_CATCH_UP`` a
pass); ``"none"`` skips them (a tick more than ``MISSED_AFTER`` seconds late) and waits for the
next. Ticks before the schedule was made never
run. Cron expressions are those of ``cronsim`` (five fields, or six with seconds last), in UTC.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cronsim import CronSim, CronSimError

from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import Database, Transaction, adopt
from fdbqueue.errors import QueueError
from fdbqueue.ops.enqueuing import enqueue_items
from fdbqueue.ops.items import new_item
from fdbqueue.ops.privileges import check, principal_of
from fdbqueue.ops.txn import run_once
from fdbqueue.store.clock import now_us
from fdbqueue.store.codec import utf8
from fdbqueue.store.guard import allowed, decode_guard
from fdbqueue.store.layout import DEFAULT_ROOT, QueueKeys, ScheduleKeys

log = logging.getLogger("fdbqueue.scheduler")

CATCH_UP = ("latest", "all", "none")
MAX_CATCH_UP = 100  # missed ticks one pass enqueues at most with catch_up="all"
MISSED_AFTER = 10.0  # seconds late a tick is missed, for catch_up="none" (a pass runs each second)
_UTC = datetime.timezone.utc


@dataclass(frozen=True)
class Schedule:
    """One periodic job: ``last_run`` and ``next_run`` are UTC datetimes (None: not yet)."""

    name: str
    queue: str
    cron: str
    priority: int
    catch_up: str
    created: datetime.datetime
    last_run: datetime.datetime | None
    next_run: datetime.datetime


def _check_cron(cron: str) -> None:
    if not isinstance(cron, str):
        raise QueueError(f"cron must be a str, got {type(cron).__name__}")
    try:
        next(CronSim(cron, datetime.datetime.now(_UTC)))
    except (CronSimError, StopIteration) as exc:
        raise QueueError(f"not a cron expression: {cron!r} ({exc})") from None


def _checked_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise QueueError(f"name must be a non-empty str, got {name!r}")
    utf8(name, f"schedule name {name!r}")  # it goes into a key (InvalidTextError, a QueueError)
    return name


def schedule(
    db: Database,
    queue: str,
    cron: str,
    payload: object,
    *,
    name: str | None = None,
    priority: int = 0,
    headers: Mapping[str, Any] | None = None,
    catch_up: str = "latest",
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> str:
    """Enqueue ``payload`` into ``queue`` at each tick of ``cron`` (UTC) from now on; returns the
    schedule's name (default ``"<queue> <cron>"``). Making it again under the same name
    replaces it, keeping its last run. Needs the ``enqueue`` right on ``queue`` (and on the
    queue of the schedule it replaces): AccessDeniedError before anything is written."""
    q = Queue(queue, root=root)  # a valid name
    _check_cron(cron)
    if catch_up not in CATCH_UP:
        raise QueueError(f"catch_up must be one of {CATCH_UP}, got {catch_up!r}")
    item = new_item(payload, priority, headers, 0.0, None, None)  # an enqueue's checks and encoding
    data, ctype = item.payload, item.content_type
    name = _checked_name(f"{queue} {cron}" if name is None else name)
    sk = ScheduleKeys(root)

    def body(t: Transaction, _: bool) -> str:
        # A schedule is a standing enqueue that any scheduler runs with its own rights: who
        # makes one, or replaces one, must hold enqueue on its queue (and on the old one's).
        check(t, q.keys, "enqueue")
        old = t.get(sk.entry(name))
        if old is not None and (was := json.loads(old)["queue"]) != queue:
            check(t, Queue(was, root=root).keys, "enqueue")
        now = now_us()
        rec: dict[str, Any] = {
            "queue": queue,
            "cron": cron,
            "payload": base64.b64encode(data).decode(),
            "ctype": ctype.value,
            "headers": dict(headers or {}),
            "priority": priority,
            "catch_up": catch_up,
            "created": now,
            "last": None,
        }
        if old is not None:
            prev = json.loads(old)
            rec["created"], rec["last"] = prev["created"], prev["last"]
        t.set(sk.entry(name), json.dumps(rec, sort_keys=True).encode())
        return name

    return run_once(adopt(db), body)


def unschedule(db: Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> bool:
    """Remove schedule ``name``; True if there was one. Needs enqueue on its queue."""
    name = _checked_name(name)
    sk = ScheduleKeys(root)

    def body(t: Transaction, _: bool) -> bool:
        raw = t.get(sk.entry(name))
        if raw is None:
            return False
        check(t, Queue(json.loads(raw)["queue"], root=root).keys, "enqueue")
        t.clear(sk.entry(name))
        return True

    return run_once(adopt(db), body)


def _when(us: int | None) -> datetime.datetime | None:
    return None if us is None else datetime.datetime.fromtimestamp(us / 1e6, _UTC)


def schedules(db: Database, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> list[Schedule]:
    """Every schedule of a queue the principal may browse, by name, with its last and next run."""
    sk = ScheduleKeys(root)

    def body(t: Transaction, _: bool) -> list[tuple[bytes, bytes]]:
        rows = [(kv.key, kv.value) for kv in t.get_range(*sk.range())]
        queues = [str(json.loads(raw)["queue"]) for _, raw in rows]
        guards = t.snapshot.get_many([QueueKeys.make(q, root).guard for q in queues])
        who = principal_of(t)
        return [row for row, g in zip(rows, guards, strict=True) if allowed(*decode_guard(g), who, "browse")]

    rows = run_once(adopt(db), body)
    out = []
    now = datetime.datetime.now(_UTC)
    for key, raw in rows:
        rec = json.loads(raw)
        after = max(now, _when(rec["last"]) or now)
        nxt = next(CronSim(rec["cron"], after.replace(microsecond=0)))
        created = _when(rec["created"])
        assert created is not None
        out.append(
            Schedule(
                sk.name(key),
                rec["queue"],
                rec["cron"],
                rec["priority"],
                rec["catch_up"],
                created,
                _when(rec["last"]),
                nxt,
            )
        )
    return out


def _due(rec: dict[str, Any], now: datetime.datetime) -> list[datetime.datetime]:
    """The ticks of ``rec`` after its last run (or its making) up to ``now``, by its policy."""
    start = _when(rec["last"]) or _when(rec["created"])
    assert start is not None
    ticks: list[datetime.datetime] = []
    for tick in CronSim(rec["cron"], start.replace(microsecond=0)):
        if tick > now:
            break
        if tick <= start:
            continue
        ticks.append(tick)
        if rec["catch_up"] != "all" and len(ticks) > 1:
            ticks.pop(0)  # keep the latest only
        if len(ticks) >= MAX_CATCH_UP:
            break
    if rec["catch_up"] == "none" and ticks:
        # Missed ones are skipped: a tick counts as on time up to MISSED_AFTER late.
        ticks = [t for t in ticks if (now - t).total_seconds() < MISSED_AFTER]
        if not ticks:
            rec["skip_to"] = int(now.timestamp() * 1e6)
    return ticks


def run_schedules(
    db: Database, *, root: tuple[Any, ...] = DEFAULT_ROOT, now: datetime.datetime | None = None
) -> int:
    """One pass over every schedule: enqueue the ticks that are due; returns how many. Safe
    from any number of processes at once (the module docstring says why)."""
    sk = ScheduleKeys(root)
    names = run_once(adopt(db), lambda t, _: [sk.name(kv.key) for kv in t.get_range(*sk.range())])
    total = 0
    for name in names:

        def body(t: Transaction, _: bool, name: str = name) -> int:
            raw = t.get(sk.entry(name))
            if raw is None:
                return 0  # removed meanwhile
            rec = json.loads(raw)
            ticks = _due(rec, now or datetime.datetime.now(_UTC))
            q = Queue(rec["queue"], root=root)
            payload = base64.b64decode(rec["payload"])
            value: object = payload.decode() if rec["ctype"] == "t" else payload
            if rec["ctype"] == "j":
                value = json.loads(payload)
            for tick in ticks:
                stamp = int(tick.timestamp())
                # The layer's own headers, past the check of reserved names the schedule's get.
                layer = {"fdbqueue-schedule": name, "fdbqueue-tick": tick.isoformat()}
                key = f"schedule:{name}:{stamp}"
                item = new_item(value, rec["priority"], rec["headers"], 0.0, None, key, layer)
                enqueue_items(q.keys, t, [item], None)
            if ticks or "skip_to" in rec:
                rec["last"] = int(ticks[-1].timestamp() * 1e6) if ticks else rec.pop("skip_to")
                rec.pop("skip_to", None)
                t.set(sk.entry(name), json.dumps(rec, sort_keys=True).encode())
            return len(ticks)

        try:
            total += run_once(adopt(db), body)
        except QueueError as exc:  # one bad schedule (a paused queue) must not stop the others
            log.warning("schedule %r: %s", name, exc)
    return total


class Scheduler:
    """Runs every schedule until :meth:`stop`: a pass each ``interval`` seconds (default 1;
    ticks are at most that late)."""

    def __init__(self, db: Database, *, interval: float = 1.0, root: tuple[Any, ...] = DEFAULT_ROOT) -> None:
        self.db = db
        self.interval = interval
        self.root = root
        self.enqueued = 0
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        """Pass until stopped; returns how many ticks it enqueued."""
        while not self._stop.is_set():
            self.enqueued += run_schedules(self.db, root=self.root)
            self._stop.wait(self.interval)
        return self.enqueued
