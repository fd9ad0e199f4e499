"""What the dashboard shows and does, as plain data: a queue's messages (browsed by state, with
a filter), one message with its journal history, and the actions (pause, resume, redrive,
delete). Nothing here knows HTTP; ``fdbqueue.web.app`` turns these into JSON endpoints.

Reads are snapshot reads in one short transaction each, bounded by :data:`SCAN_LIMIT` records
and :data:`PREVIEW` bytes a message, so a page never holds a transaction near FoundationDB's
five-second window nor brings a queue of large messages into memory. Every call goes through
the layer's own checks: ``browse`` to read, ``admin`` to act (``AccessDeniedError`` otherwise).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from fdbqueue.api import admin
from fdbqueue.api.redrive import delete_by_id, redrive
from fdbqueue.api.workers import workers as registered
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.errors import CorruptMessageError, QueueError, QueueNotFoundError
from fdbqueue.ops import journaling
from fdbqueue.ops.privileges import check, may
from fdbqueue.ops.reading import expires_at, locate, read_payload
from fdbqueue.ops.txn import run_once
from fdbqueue.store.clock import now_us
from fdbqueue.store.config import read_state
from fdbqueue.store.layout import DEFAULT_ROOT, STATE_TAGS, QueueKeys, validate_queue_name
from fdbqueue.store.meta import read_meta
from fdbqueue.store.record import Record, decode_record
from fdbqueue.types import QueueStats

SCAN_LIMIT = 2_000  # records one page of a queue's messages reads at most, matching or not
PAGE_LIMIT = 200  # messages one page returns at most
PREVIEW = 2_048  # payload bytes a listed message shows
DETAIL_PREVIEW = 65_536  # payload bytes a message's own page shows
_CONTENT_TYPES = {"b": "bytes", "t": "text", "j": "json"}


def stats_dict(st: QueueStats, rates: tuple[float, float] | None = None) -> dict[str, Any]:
    """A queue's figures as JSON (rates: made ready and consumed per second, when known)."""
    out = dataclasses.asdict(st)
    if rates is not None:
        out["ready_rate"], out["done_rate"] = rates
    return out


def queue_detail(db: Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> dict[str, Any]:
    """A queue's figures, settings, whether the principal may act on it, where it dead-letters
    and which queues dead-letter into it: one transaction."""
    keys = QueueKeys.make(_name(name), root)

    def body(t: Transaction, _: bool) -> dict[str, Any]:
        meta = read_meta(t, keys)
        if meta.config is None:
            raise QueueNotFoundError(f"no queue named {name!r}")
        check(t, keys, "browse", meta)
        cfg = meta.config
        st = read_state(t, keys)
        return {
            "settings": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "extra"},
            "error_queue": cfg.error_queue_for(name),
            "admin": may(t, meta, "admin"),
            "paused": {"enqueue": not st.enqueue, "dequeue": not st.dequeue},
            "owner": meta.owner,
        }

    out = run_once(db, body)
    out["stats"] = stats_dict(admin.queue_stats(db, name, root=root))
    return out


def workers(db: Database, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> dict[str, Any]:
    """The registry of workers (``fdbqueue.workers``): those of the queues the principal may
    browse, with the server's time to measure their ages by."""
    return {"time": now_us() / 1e6, "workers": [w.as_dict() for w in registered(db, root=root)]}


def parse_filter(text: str) -> tuple[dict[str, str], list[str]]:
    """A filter box's text: ``name=value`` terms match headers, other words the id or the
    payload's text (all must match)."""
    where: dict[str, str] = {}
    words: list[str] = []
    for term in text.split():
        name, eq, value = term.partition("=")
        if eq and name:
            where[name] = value
        else:
            words.append(term.lower())
    return where, words


def messages(
    db: Database,
    name: str,
    *,
    state: str = "ready",
    filter: str = "",
    limit: int = 50,
    after: str | None = None,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> dict[str, Any]:
    """One page of a queue's messages in ``state`` (ready in dequeue order; leased; delayed by
    due time) that match ``filter``, from cursor ``after``: ``{"messages", "next", "scanned"}``;
    ``next`` is None at the end. At most SCAN_LIMIT records are read a page."""
    if state not in STATE_TAGS:
        raise QueueError(f"state must be one of {', '.join(STATE_TAGS)}, got {state!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= PAGE_LIMIT:
        raise QueueError(f"limit must be an int from 1 to {PAGE_LIMIT}, got {limit!r}")
    keys = QueueKeys.make(_name(name), root)
    begin, end = keys.state_range(state)
    if after:
        try:
            cursor = bytes.fromhex(after)
        except ValueError:
            raise QueueError(f"after must be a cursor this dashboard gave, got {after!r}") from None
        if not begin <= cursor < end:
            raise QueueError("after must be a cursor of this queue and state")
        begin = cursor + b"\x00"
    where, words = parse_filter(filter)

    def body(t: Transaction, _: bool) -> dict[str, Any]:
        meta = read_meta(t, keys)
        if meta.config is None:
            raise QueueNotFoundError(f"no queue named {name!r}")
        check(t, keys, "browse", meta)
        found: list[dict[str, Any]] = []
        scanned = 0
        start = begin
        while True:
            ask = min(500, SCAN_LIMIT - scanned)
            kvs = t.snapshot.get_range(start, end, ask)
            for kv in kvs:
                scanned += 1
                m = _listed(t, keys, state, kv.key, kv.value)
                if _matches(m, where, words):
                    found.append(m)
                    if len(found) == limit:
                        return {"messages": found, "next": kv.key.hex(), "scanned": scanned}
            if len(kvs) < ask:
                return {"messages": found, "next": None, "scanned": scanned}
            if scanned >= SCAN_LIMIT:  # the bound of a page: the next goes on from here
                return {"messages": found, "next": kvs[-1].key.hex(), "scanned": scanned}
            start = kvs[-1].key + b"\x00"

    return run_once(db, body)


def _listed(t: Transaction, keys: QueueKeys, state: str, key: bytes, raw: bytes) -> dict[str, Any]:
    try:
        rec = decode_record(raw, keys, key)
    except CorruptMessageError as exc:
        return {"id": None, "key": key.hex(), "state": state, "damaged": str(exc), "headers": {}}
    out = _fields(t, keys, state, key, rec)
    if rec.chunks:
        out["preview"], out["truncated"] = None, True  # in chunks: shown on the message's page
    else:
        out["preview"], out["truncated"] = _preview(rec.payload, rec.content_type, PREVIEW)
    out["size"] = len(rec.payload) if not rec.chunks else None
    return out


def _fields(t: Transaction, keys: QueueKeys, state: str, key: bytes, rec: Record) -> dict[str, Any]:
    origin = rec.extra.get("origin")
    deliveries = rec.deliveries
    if origin is not None:  # a dead letter: the priority and deliveries it had in its origin
        priority = int(rec.extra.get("priority", 0))
        deliveries = int(rec.extra.get("deliveries", rec.deliveries))
    elif state == "ready":
        priority = keys.priority_of(key)
    elif state == "leased" and "key" in rec.extra:
        priority = keys.priority_of(bytes.fromhex(str(rec.extra["key"])))
    else:
        priority = int(rec.extra.get("priority", 0))
    until = rec.extra.get("until") if state == "leased" else None
    lease = None if until is None else int(until) / 1e6
    return {
        "id": rec.id,
        "state": state,
        "priority": priority,
        "enqueued_at": rec.enqueued_us / 1e6,
        "age": max(0.0, (now_us() - rec.enqueued_us) / 1e6),
        "deliveries": deliveries,
        "headers": {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in rec.headers.items()},
        "content_type": _CONTENT_TYPES.get(rec.content_type, rec.content_type),
        "reason": None if rec.extra.get("reason") is None else str(rec.extra["reason"]),
        "origin": None if origin is None else str(origin),
        "expires_at": expires_at(t, rec),
        "lease_until": lease,
    }


def _preview(payload: bytes, content_type: str, limit: int) -> tuple[str, bool]:
    """The payload as text for people: text and JSON decoded (JSON indented when whole),
    bytes as hex; cut at ``limit`` bytes."""
    cut = payload[:limit]
    if content_type == "b":
        return cut.hex(" "), len(payload) > limit
    text = cut.decode("utf-8", errors="replace")
    if content_type == "j" and len(payload) <= limit:
        with contextlib.suppress(ValueError):  # not whole JSON after all: shown as it is
            text = json.dumps(json.loads(payload), indent=2, ensure_ascii=False)
    return text, len(payload) > limit


def _matches(m: Mapping[str, Any], where: Mapping[str, str], words: list[str]) -> bool:
    headers = m["headers"]
    if any(headers.get(k) != v for k, v in where.items()):
        return False
    if not words:
        return True
    hay = " ".join(str(m.get(f) or "") for f in ("id", "preview", "reason", "origin")).lower()
    return all(w in hay for w in words)


def message(db: Database, name: str, msg_id: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> dict[str, Any]:
    """Message ``msg_id`` of queue ``name`` wherever it waits, with a longer preview, and its
    journal history (the queues of this database it passed through), or 404 when it is gone
    (its history is still given: ``state`` is then None)."""
    keys = QueueKeys.make(_name(name), root)
    if not isinstance(msg_id, str) or not msg_id:
        raise QueueError("a message id is needed")

    def body(t: Transaction, _: bool) -> dict[str, Any]:
        meta = read_meta(t, keys)
        if meta.config is None:
            raise QueueNotFoundError(f"no queue named {name!r}")
        check(t, keys, "browse", meta)
        out: dict[str, Any] = {"id": msg_id, "queue": name, "state": None, "journal": meta.config.journal}
        where = locate(t, keys, msg_id)
        raw = None if where is None else t.snapshot.get(where)
        state = None if where is None else keys.state_of(where)  # locate names a record's key
        if where is None or raw is None or state is None:
            return out
        try:
            rec = decode_record(raw, keys, where, msg_id)
            payload = read_payload(t.snapshot, keys, rec)
        except CorruptMessageError as exc:
            return {**out, "state": state, "damaged": str(exc)}
        out.update(_fields(t, keys, state, where, rec))
        out["preview"], out["truncated"] = _preview(payload, rec.content_type, DETAIL_PREVIEW)
        out["size"] = len(payload)
        out["journal"] = meta.config.journal
        return out

    out = run_once(db, body)
    out["history"] = [e.to_json() for e in journaling.history(db, msg_id, root=root)]
    return out


# -- actions: each needs admin on the queue (the layer checks it) ----------------------------------


def pause(
    db: Database, name: str, direction: str, paused: bool, *, root: tuple[Any, ...] = DEFAULT_ROOT
) -> dict[str, bool]:
    """Pause (``paused=True``) or resume one direction (enqueue, dequeue) or both."""
    if direction not in ("enqueue", "dequeue", "both"):
        raise QueueError(f"direction must be enqueue, dequeue or both, got {direction!r}")
    if not isinstance(paused, bool):
        raise QueueError(f"paused must be true or false, got {paused!r}")
    on = not paused
    st = admin.set_state(
        db,
        _name(name),
        enqueue=on if direction in ("enqueue", "both") else None,
        dequeue=on if direction in ("dequeue", "both") else None,
        root=root,
    )
    return {"enqueue": not st.enqueue, "dequeue": not st.dequeue}


def redrive_dead(
    db: Database,
    name: str,
    ids: list[str] | None,
    filter: str = "",
    *,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> int:
    """Redrive dead letters of error queue ``name``: those of ``ids``, else every one whose
    headers match the ``name=value`` terms of ``filter``."""
    where, words = parse_filter(filter)
    if words:
        raise QueueError("a redrive filters on headers only (name=value)")
    return redrive(db, _name(name), ids=ids, where=where or None, root=root)


def delete(db: Database, name: str, ids: list[str], *, root: tuple[Any, ...] = DEFAULT_ROOT) -> int:
    """Delete messages ``ids`` of queue ``name`` in whatever state; how many were there."""
    keys = QueueKeys.make(_name(name), root)
    admin.queue_config(db, keys.name, root=root)  # an unknown queue is an error, not "0 deleted"
    return sum(delete_by_id(db, keys, i) for i in ids)


def _name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise QueueError("a queue name is needed")
    return validate_queue_name(name)
