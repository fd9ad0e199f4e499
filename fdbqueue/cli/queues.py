"""The queue commands of ``fdbqueue``: create, list, enqueue, dequeue, browse, purge... Each only
calls the public API; the parser that names them is in :mod:`fdbqueue.cli.commands`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

import fdbqueue
from fdbqueue.cli.console import (
    RUNTIME_ERRORS,
    CommandError,
    _age,
    _batches,
    _cells,
    _clip,
    _encoded_size,
    _enqueue_batch,
    _headers,
    _message_json,
    _number,
    _parse_payload,
    _parser,
    _payload_text,
    _positive,
    _print_json,
    _print_message,
    _print_pairs,
    _progress,
    _read_stdin,
    _render,
    _seconds,
    _stats_now,
    _table,
    _ttl,
    _where,
)

EMPTY = 3  # exit code: dequeue/peek found no message

# -- commands --------------------------------------------------------------------------------------

_S = {"metavar": "S"}


def _rate(text: str) -> str | None:
    """A ``--rate-limit``: none clears it; nothing at all is an error (a blank variable in a
    script must not lift a limit unseen); create_queue checks the rest (exit 2 if bad)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "expected a rate such as 50/s or 1000/m, or none to clear it; got ''"
        )
    return None if text.strip().lower() == "none" else text


_CREATE_OPTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("--max-size", {"type": _parser(int, 1, "a whole number >= 1 or none", none=True)},
     "most messages held (none: no limit)"),
    ("--overflow", {"choices": ("reject", "block")}, "when full: refuse, or wait for room"),
    ("--max-deliveries", {"type": _positive}, "deliveries before the error queue"),
    ("--error-queue", {"metavar": "Q"}, "dead-letter queue ('': NAME.error)"),
    ("--retry-delay", {"type": _seconds, **_S}, "wait before a retry"),
    ("--retry-backoff", {"type": _number, "metavar": "F"}, "retry delay multiplier per delivery"),
    ("--max-retry-delay", {"type": _seconds, **_S}, "longest retry delay"),
    ("--retry-jitter", {"type": _number, "metavar": "F"}, "fraction a retry delay is cut at random (0..1)"),
    ("--lease-seconds", {"type": _seconds, **_S}, "worker-mode lease"),
    ("--ttl", {"type": _ttl(none=True), **_S}, "lifetime of each message (none: never expires)"),
    ("--expiry-action", {"choices": ("error", "discard")}, "expired messages: error queue, or dropped"),
    ("--strict-order", {"action": argparse.BooleanOptionalAction}, "one delivery at a time, in order"),
    ("--max-payload", {"type": _positive, "metavar": "B"}, "largest payload, bytes"),
    ("--dedup-window", {"type": _seconds, **_S}, "how long a --dedup-key is remembered"),
    ("--journal", {"action": argparse.BooleanOptionalAction}, "keep a journal of every operation"),
    ("--journal-retention", {"type": _seconds, **_S}, "how long journal entries are kept"),
    ("--rate-limit", {"type": _rate, "metavar": "N/U"},
     "at most N leased a second, minute, hour or day by all workers together: 50/s, 1000/m (none: no limit)"),
    ("--owner", {"metavar": "P"}, "owning principal: every right, others only what is granted ('': none)"),
]  # fmt: skip
_SETTINGS = [flag[2:].replace("-", "_") for flag, _, _ in _CREATE_OPTIONS]


def _cmd_create(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    settings = {k: getattr(args, k) for k in _SETTINGS if hasattr(args, k)}
    if settings.get("error_queue") == "":
        settings["error_queue"] = None  # back to the default, "<name>.error"
    if settings.get("owner") == "":
        settings["owner"] = None  # open to every principal
    try:
        fdbqueue.queue_config(db, args.name)
        verb = "updated" if settings else "unchanged"
    except fdbqueue.QueueNotFoundError:
        verb = "created"
    cfg = fdbqueue.create_queue(db, args.name, **settings)
    values = dataclasses.asdict(cfg)
    if args.json:
        _print_json({"name": args.name, **values})
    else:
        rows = [(k, v) for k, v in values.items() if k != "extra" or v]
        rows = [
            (k, f"{args.name}.error (default)" if k == "error_queue" and v is None else v) for k, v in rows
        ]
        _print_pairs(rows, title=f"queue {args.name!r} {verb}")
    return 0


def _cmd_delete(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    if args.ids:  # messages, not the queue
        q = fdbqueue.Queue(args.name)
        fdbqueue.queue_config(db, args.name)  # an unknown queue: said alone, not as missing ids
        missing = [i for i in args.ids if not q.delete(db, i)]
        done = len(args.ids) - len(missing)
        print(f"deleted {done} message{'s' if done != 1 else ''} from {args.name}")
        if missing:
            raise CommandError(f"no message {', '.join(missing)} in queue {args.name!r}", 1)
        return 0
    st = fdbqueue.queue_stats(db, args.name)
    held = st.ready + st.inflight + st.delayed
    if held and not args.yes:
        raise CommandError(f"queue {args.name!r} holds {held} message(s); pass --yes to delete it anyway")
    fdbqueue.destroy_queue(db, args.name)
    print(f"deleted queue {args.name!r}" + (f" and its {held} message(s)" if held else ""))
    return 0


def _state(st: fdbqueue.QueueStats) -> str:
    names = {(True, True): "running", (False, False): "paused", (False, True): "enqueue paused"}
    return names.get((st.enqueue_enabled, st.dequeue_enabled), "dequeue paused")


def _cmd_list(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    stats = []
    hidden = 0  # queues the principal may not browse: left out, as the dashboard and metrics do
    for name in fdbqueue.list_queues(db):
        try:
            stats.append(_stats_now(db, name))
        except fdbqueue.QueueNotFoundError:
            pass  # deleted since the listing
        except fdbqueue.AccessDeniedError:
            hidden += 1
    note = (
        f"{hidden} queue{'s' if hidden != 1 else ''} not shown: principal {db.principal!r} may not browse "
        f"{'them' if hidden != 1 else 'it'}"
        if hidden
        else ""
    )
    if args.json:
        _print_json([{**dataclasses.asdict(s), "state": _state(s)} for s in stats])
        if note:
            print(f"fdbqueue: {note}", file=sys.stderr)  # stdout stays one JSON document
        return 0
    if not stats:
        print("no queues" + (f" ({note})" if note else ""))
        return 0
    table = _table("name", "ready", "in flight", "delayed", "errors", "state")
    groups = _partition_groups(db, [s.name for s in stats])
    shown: set[str] = set()
    for s in stats:
        if s.name in shown:
            continue
        group = groups.get(s.name)
        if group is not None:  # a partitioned queue: one row for all, then its partitions
            base, n = group
            parts = [p for p in stats if groups.get(p.name, ("", 0))[0] == base]
            total = [sum(getattr(p, f) for p in parts) for f in ("ready", "inflight", "delayed", "errors")]
            table.add_row(*_cells(f"{base} ({n} partitions)", *total, ""))
            for p in parts:
                table.add_row(*_cells(f"  {p.name}", p.ready, p.inflight, p.delayed, p.errors, _state(p)))
                shown.add(p.name)
            continue
        table.add_row(*_cells(s.name, s.ready, s.inflight, s.delayed, s.errors, _state(s)))
    _render(table)
    if note:
        print(note)
    return 0


def _partition_groups(db: fdbqueue.Database, names: list[str]) -> dict[str, tuple[str, int]]:
    """Each listed partition's partitioned queue and its partition count."""
    out: dict[str, tuple[str, int]] = {}
    for base, n in fdbqueue.partitioned_queues(db).items():
        for i in range(n):
            out[f"{base}.p{i}"] = (base, n)
    return {name: out[name] for name in names if name in out}


_STAT_LABELS = {"ready": "ready (depth)", "inflight": "in flight", "errors": "errors (in error queue)"}


def _cmd_stats(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    st = _stats_now(db, args.name, args.interval)
    if args.json:
        _print_json(dataclasses.asdict(st))
        return 0
    # Every field QueueStats has, so that figures added to it show up here without a change.
    rows: list[tuple[str, object]] = []
    for key, value in dataclasses.asdict(st).items():
        label = _STAT_LABELS.get(key, key.replace("_", " "))
        if key.endswith("_rate"):
            rows += [] if value is None else [(label, f"{value:,.1f} msg/s")]
        elif key.endswith("_age"):
            rows.append((label, _age(value)))
        elif key not in ("name", "enqueue_enabled", "dequeue_enabled"):
            rows.append((label, value))
    rows.append(("state", _state(st)))
    _print_pairs(rows, title=f"queue {st.name!r}")
    return 0


def _cmd_enqueue(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    headers = _headers(args.header)
    if args.payload:
        if args.raw:
            raise CommandError("--raw reads stdin; it takes no PAYLOAD arguments")
        items = [(n, _parse_payload(p, f"argument {n}", args.json)) for n, p in enumerate(args.payload, 1)]
        what = "argument"
    else:
        items = _read_stdin(args)
        what = "line"
    if not items:
        raise CommandError("nothing to enqueue: no PAYLOAD arguments and no lines on stdin")
    if args.dedup_key is not None and len(items) > 1:
        raise CommandError(f"--dedup-key applies to a single message; got {len(items)}")
    try:
        cfg: fdbqueue.QueueConfig | None = fdbqueue.queue_config(db, args.name)
    except fdbqueue.QueueNotFoundError:
        cfg = None  # created with defaults on first use
    limit = (cfg or fdbqueue.QueueConfig()).max_payload
    for n, p in items:
        if _encoded_size(p) > limit:
            raise CommandError(
                f"{_where(what, n)}: payload of {_encoded_size(p)} bytes exceeds the max_payload of "
                f"queue {args.name!r} ({limit} bytes); nothing was enqueued"
            )
    q = fdbqueue.Queue(args.name)
    opts: dict[str, Any] = dict(priority=args.priority, delay=args.delay, ttl=args.ttl, headers=headers)
    if args.dedup_key is not None:
        prior = q.deduplicated(db, args.dedup_key)
        msg_id = q.enqueue(db, items[0][1], dedup_key=args.dedup_key, timeout=args.timeout, **opts)
        _print_ids([msg_id], args.quiet)
        if msg_id == prior:
            print(
                f"fdbqueue: duplicate: --dedup-key {args.dedup_key!r} was enqueued before as "
                f"{msg_id} (within the dedup window); nothing was enqueued",
                file=sys.stderr,
            )
        return 0
    ids: list[str] = []
    try:
        with _progress(len(items), args.progress) as advance:
            for batch in _batches(db, q, cfg, [p for _, p in items], _encoded_size(headers or {})):
                ids.extend(_enqueue_batch(db, q, batch, args.timeout, opts))
                advance(len(batch))
    except fdbqueue.QueueFullError as exc:
        if not ids and len(items) == 1:
            raise
        if ids or args.quiet:
            _print_ids(ids, args.quiet)
        first, last = items[len(ids)][0], items[-1][0]
        span = f"{what} {first}" if first == last else f"{what}s {first} to {last}"
        size = f" (max_size {cfg.max_size})" if cfg and cfg.max_size is not None else ""
        raise CommandError(
            f"queue {args.name!r} is full{size}: enqueued {len(ids)} of {len(items)} messages, "
            f"refused {len(items) - len(ids)} ({span})" + ("" if exc.block else "; see --overflow block"),
            1,
        ) from None
    except fdbqueue.QueueError as exc:
        if not ids:
            raise
        _print_ids(ids, args.quiet)
        code = 1 if isinstance(exc, RUNTIME_ERRORS) else 2
        raise CommandError(
            f"{exc}; the first {len(ids)} of {len(items)} messages (through {what} "
            f"{items[len(ids) - 1][0]}) were enqueued, the rest were not",
            code,
        ) from None
    _print_ids(ids, args.quiet)
    return 0


def _print_ids(ids: list[str], quiet: bool) -> None:
    print(len(ids) if quiet else "\n".join(ids))


def _existing(db: fdbqueue.Database, name: str) -> fdbqueue.Queue:
    """A handle on ``name``, which must exist: reading a mistyped queue should not look empty."""
    fdbqueue.queue_config(db, name)
    return fdbqueue.Queue(name)


def _show_or_empty(m: fdbqueue.Message | None, args: argparse.Namespace) -> int:
    if m is None:
        if args.json:
            _print_json(None)
        else:
            print(f"queue {args.name!r} has no message ready", file=sys.stderr)
        return EMPTY
    _print_message(m, args)
    return 0


def _cmd_dequeue(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    """``dequeue`` and ``peek``."""
    q = _existing(db, args.name)
    return _show_or_empty(q.peek(db) if args.command == "peek" else q.dequeue(db, timeout=args.timeout), args)


def _cmd_get(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    m = _existing(db, args.name).get(db, args.id)
    if m is None:
        raise CommandError(f"no message {args.id!r} in queue {args.name!r}", 1)
    _print_message(m, args)
    return 0


def _cmd_browse(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    messages = _existing(db, args.name).browse(db, limit=args.limit or None)
    if args.json:  # JSON Lines: one message per line, streamed
        for m in messages:
            _print_json(_message_json(m))
        return 0
    shown = list(messages)
    # Dead letters (an error queue's messages) say why they are there and where from.
    dead = any(m.reason is not None or m.origin is not None for m in shown)
    table = _table(
        "id",
        "priority",
        "deliveries",
        "enqueued",
        "headers",
        "payload",
        *(("reason", "origin") if dead else ()),
    )
    _clip(table, 5, 60)
    for m in shown:
        payload = _payload_text(m).replace("\n", "\\n")
        headers = json.dumps(dict(m.headers)) if m.headers else ""
        age = _age(time.time() - m.enqueued_at) + " ago"
        more = (m.reason, m.origin) if dead else ()
        table.add_row(*_cells(m.id, m.priority, m.deliveries, age, headers, payload, *more))
    if not table.row_count:
        print(f"queue {args.name!r} has no message ready")
        return 0
    _render(table)
    return 0


def _cmd_sweep(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    st = _existing(db, args.name).sweep(db)
    if args.json:
        _print_json(dataclasses.asdict(st))
    else:
        _print_pairs(list(dataclasses.asdict(st).items()), title=f"sweep of {args.name!r}")
    return 0


def _cmd_purge(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    if not args.yes:
        raise CommandError(f"purge removes every message of queue {args.name!r}; pass --yes to confirm")
    removed = fdbqueue.purge_queue(db, args.name)
    print(f"purged {removed} message(s) from queue {args.name!r}")
    return 0


def _set_state(db: fdbqueue.Database, args: argparse.Namespace, *, enabled: bool) -> int:
    both = not args.enqueue and not args.dequeue
    st = fdbqueue.set_state(
        db,
        args.name,
        enqueue=enabled if (both or args.enqueue) else None,
        dequeue=enabled if (both or args.dequeue) else None,
    )
    print(
        f"queue {args.name!r}: enqueue {'running' if st.enqueue else 'paused'}, "
        f"dequeue {'running' if st.dequeue else 'paused'}"
    )
    return 0


_DEMO_FIELDS = [("enqueued", "messages"), ("processed exactly once", "processed_once")]
_DEMO_FIELDS += [("processed twice", "duplicates"), ("lost", "missing")]


DEMO_HELP = """\
run the end-to-end demo: producer and worker processes, exactly-once processing

By default the demo makes a fresh embedded store in a temporary directory (sync=full, the
durable setting) and removes it at the end (--keep leaves it, and prints where). It never
uses $FDBQUEUE_URL: that names your store. Given --url explicitly, it works in that store
in queues named for this run (demo-<run>.orders and its error queue, under the root
("fdbqueue-demo", <run>)) and removes them and its records at the end; your own queues are
neither read nor written. It prints a summary and exits 0 when every message was processed
exactly once or accounted for, else 1. With pyspark installed (pip install '.[spark]' in a checkout)
and Java, a Spark step follows: a bulk load with df.write (run twice: the second adds
nothing), a drain by a worker, and fdbqueue audit of that queue."""


def _cmd_demo(args: argparse.Namespace) -> int:
    from fdbqueue.cli.demo import run_demo

    url = args.url  # explicit only: $FDBQUEUE_URL names the user's store, never the demo's
    where = f"queues of their own in {url}" if url else "a temporary store (sync=full)"
    print(
        f"fdbqueue demo: {args.producers} producer and {args.workers} worker processes, "
        f"{args.messages} messages, exactly-once processing, in {where}"
    )
    r = run_demo(
        url,
        messages=args.messages,
        producers=args.producers,
        workers=args.workers,
        keep=args.keep,
        spark=args.spark,
    )
    if callable(getattr(r, "rows", None)):
        rows: list[tuple[str, object]] = list(r.rows())  # the result knows how to present itself
    else:
        secs = getattr(r, "seconds", 0.0)
        rows = [(label, getattr(r, name, "-")) for label, name in _DEMO_FIELDS]
        rows += [("wall time", f"{secs:.2f} s")]
    ok = bool(getattr(r, "ok", False))
    print("OK: every message processed exactly once" if ok else "FAILED: see the counts below")
    _print_pairs(rows)
    notes = getattr(r, "notes", None)
    for line in notes() if callable(notes) else []:
        print(line)
    return 0 if ok else 1
