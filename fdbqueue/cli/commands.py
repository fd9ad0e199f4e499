"""The ``fdbqueue`` command. It only calls the public API; no logic lives only here."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import fdbqueue
from fdbqueue.cli.console import (
    PROGRESS_OVER,
    CommandError,
    OneLineParser,
    _age,
    _batches,
    _cells,
    _check_url,
    _clip,
    _count,
    _encoded_size,
    _enqueue_batch,
    _headers,
    _int,
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
from fdbqueue.cli.journal import add_journal_commands
from fdbqueue.cli.ops import add_audit_command, add_ops_commands
from fdbqueue.cli.worker import _cmd_worker, add_pool_options
from fdbqueue.cli.workers import add_workers_command

EMPTY = 3  # exit code: dequeue/peek found no message

EPILOG = """\
exit codes:
  0    success
  1    runtime failure: no such queue or message, queue stopped or full, store or cluster error,
       access denied (the principal lacks a right on the queue)
  2    usage or bad input: malformed argument, URL, header, JSON line or handler; payload too large
  3    nothing to return: dequeue or peek found no message (with --json, prints null)
  130  interrupted (Ctrl-C)

The database URL comes from --url, else $FDBQUEUE_URL, else sqlite://fdbqueue.db (./fdbqueue.db);
the principal from --principal, else $FDBQUEUE_PRINCIPAL, else "anonymous".
"""

# Conditions of the store or the queue, not mistakes in the command: exit 1. Every other
# QueueError is the library refusing an argument (a bad name, number or URL): exit 2.
RUNTIME_ERRORS: tuple[type[Exception], ...] = (
    fdbqueue.QueueNotFoundError,
    fdbqueue.AccessDeniedError,
    fdbqueue.ForeignQueueError,
    fdbqueue.QueueStoppedError,
    fdbqueue.QueueFullError,
    fdbqueue.EngineError,
    fdbqueue.ClusterUnavailableError,
    fdbqueue.StoreError,
    fdbqueue.UnsupportedLayerFormatError,
    fdbqueue.LeaseError,
    fdbqueue.NotJournaledError,
    fdbqueue.NotAnErrorQueueError,
)


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


# -- the parser ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    url_help = "database URL (default: $FDBQUEUE_URL, else sqlite://fdbqueue.db)"
    fmt = argparse.RawDescriptionHelpFormatter
    parser = OneLineParser(
        prog="fdbqueue", description="Durable, transactional queues.", epilog=EPILOG, formatter_class=fmt
    )
    parser.add_argument("--url", default=None, help=url_help)
    who_help = "act as this principal (default: $FDBQUEUE_PRINCIPAL, else anonymous)"
    parser.add_argument("--principal", default=None, metavar="P", help=who_help)
    parser.add_argument("--version", action="version", version=f"fdbqueue {fdbqueue.__version__}")
    # --url after the subcommand too; SUPPRESS keeps an absent one from hiding the global one.
    common = OneLineParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help=url_help)
    common.add_argument("--principal", default=argparse.SUPPRESS, metavar="P", help=who_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, func: Callable[..., int], help: str, *, json_flag: bool = True, named: bool = True
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name, help=help, description=help, parents=[common], epilog=EPILOG, formatter_class=fmt
        )
        p.set_defaults(func=func)
        if named:
            p.add_argument("name", metavar="NAME", help="queue name")
        if json_flag:
            p.add_argument("--json", action="store_true", help="print JSON (for scripts)")
        return p

    def message_output(p: argparse.ArgumentParser) -> None:
        p.add_argument("--payload-only", action="store_true", help="print only the raw payload bytes")

    p = add("create", _cmd_create, "create a queue, or update the settings of an existing one")
    for flag, kw, text in _CREATE_OPTIONS:  # absent options are left out: they change nothing
        p.add_argument(flag, default=argparse.SUPPRESS, help=text, **kw)

    text = "delete messages by id in any state, or with no ID the queue (--yes when it holds messages)"
    p = add("delete", _cmd_delete, text, json_flag=False)
    p.add_argument("ids", nargs="*", metavar="ID", help="message ids (ready, delayed or leased)")
    p.add_argument("--yes", action="store_true", help="delete the queue even if it holds messages")
    add("list", _cmd_list, "list queues with their depths", named=False)
    p = add("stats", _cmd_stats, "a queue's depth, in flight, delayed, errors, ages and rates")
    p.add_argument("--interval", type=_seconds, default=0.0, metavar="S", help="measure rates over S seconds")

    p = add("enqueue", _cmd_enqueue, "enqueue PAYLOADs, or one message per line of stdin", json_flag=False)
    p.add_argument("payload", nargs="*", metavar="PAYLOAD", help="message text (none: read stdin)")
    p.add_argument("--json", "--json-lines", action="store_true", help="parse each PAYLOAD / line as JSON")
    p.add_argument("--raw", action="store_true", help="all of stdin is one binary message")
    p.add_argument("--priority", type=_int, default=0, help="higher is dequeued first")
    p.add_argument("--delay", type=_seconds, default=0.0, metavar="S", help="invisible for S seconds")
    p.add_argument("--ttl", type=_ttl(none=False), default=None, metavar="S", help="expires after S seconds")
    p.add_argument("--header", action="append", metavar="K=V", help="a header (K:=JSON for non-strings)")
    p.add_argument("--dedup-key", default=None, metavar="K", help="enqueue at most once per key")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="a full queue with --overflow block: wait at most S seconds for room (default: until room)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"progress bar (default: on a terminal, over {PROGRESS_OVER} lines)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="print the count, not the ids")

    p = add("dequeue", _cmd_dequeue, "remove and print the next message")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="S", help="wait up to S seconds")
    message_output(p)
    p = add("peek", _cmd_dequeue, "print the next message without removing it")
    message_output(p)
    p = add("browse", _cmd_browse, "list ready messages in dequeue order (JSON Lines with --json)")
    p.add_argument("--limit", type=_count, default=100, help="at most N messages (0: all; default 100)")
    p = add("get", _cmd_get, "print the message with id ID")
    p.add_argument("id", metavar="ID")
    message_output(p)
    add("sweep", _cmd_sweep, "move expired leases, due delayed messages and expired TTLs now")
    p = add("purge", _cmd_purge, "remove every message of a queue (keeps its settings)", json_flag=False)
    p.add_argument("--yes", action="store_true", help="confirm")
    for name, enabled in (("pause", False), ("resume", True)):
        func = functools.partial(_set_state, enabled=enabled)
        p = add(name, func, f"{name} enqueue and/or dequeue", json_flag=False)
        p.add_argument("--enqueue", action="store_true", help=f"{name} enqueue (neither flag: both)")
        p.add_argument("--dequeue", action="store_true", help=f"{name} dequeue (neither flag: both)")

    p = add(
        "worker",
        _cmd_worker,
        "run a handler over queues, or an app's tasks, until SIGTERM / Ctrl-C",
        named=False,
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="the queues (with --handler)")
    p.add_argument(
        "--handler",
        metavar="MODULE:FUNCTION",
        help="lease mode: f(message); exactly-once: f(tr, message)",
    )
    p.add_argument(
        "--tasks",
        metavar="MODULE:APP",
        help="run the tasks of an fdbqueue.Tasks app over their queues (no NAME, no --handler); "
        "the app's own database unless --url is given",
    )
    p.add_argument(
        "--mode",
        choices=("lease", "exactly-once", "exactly_once"),
        default="lease",
        help="lease (default): the handler runs outside a transaction as f(message); returning "
        "acks, raising nacks (retried, then the error queue). exactly-once: the dequeue and the "
        "handler's writes are one transaction, f(tr, message); it must finish within the "
        "transaction limit (5 s)",
    )
    p.add_argument(
        "--concurrency",
        type=_positive,
        default=1,
        metavar="N",
        help="handler threads in this process (default 1); on the embedded engine exactly-once "
        "handlers take turns (one writer), use lease mode for parallel handlers",
    )
    p.add_argument(
        "--lease-seconds",
        type=_seconds,
        default=None,
        metavar="S",
        help="lease mode: seconds a leased message stays hidden before it is offered again "
        "(default: the queue's lease_seconds setting, 30 unless created otherwise)",
    )
    p.add_argument(
        "--sweep-interval",
        type=_seconds,
        default=5.0,
        metavar="S",
        help="how often to move expired leases, due delayed messages and TTLs (default 5)",
    )
    p.add_argument(
        "--heartbeat",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="lease mode: renew each lease while its handler runs, at about a third of it (default on)",
    )
    p.add_argument(
        "--time-limit",
        type=_seconds,
        default=None,
        metavar="S",
        help="give up on a handler call after S seconds: lease mode releases the message as a failed "
        "delivery (reason time_limit; the error queue at max deliveries) and abandons the call's thread "
        "(Python cannot stop one) or, with --processes, kills the child; exactly-once aborts a call "
        "that returns late",
    )
    add_pool_options(p)
    p.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="after SIGTERM, wait at most S seconds for handlers, then stop at once (a second SIGTERM "
        "does that too); messages in hand go back",
    )
    p.add_argument(
        "--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="WARNING", type=str.upper
    )
    p.add_argument("--log-format", choices=("text", "json"), default="text", help="json: one object a line")
    p.add_argument("--until-empty", action="store_true", help="stop once nothing is ready or delayed")
    p.add_argument("--max-messages", type=_positive, default=None, metavar="N", help="stop after N messages")

    add_journal_commands(add, common)
    add_audit_command(add)
    add_ops_commands(add)
    add_workers_command(add)

    p = add("demo", _cmd_demo, "run the end-to-end demo (in a temporary store)", json_flag=False, named=False)
    p.description = DEMO_HELP
    p.add_argument("--messages", type=_positive, default=2000, help="orders to enqueue (default 2000)")
    p.add_argument("--producers", type=_positive, default=2, help="producer processes (default 2)")
    p.add_argument("--workers", type=_positive, default=3, help="worker processes (default 3)")
    p.add_argument("--keep", action="store_true", help="keep the temporary store (or the run's queues)")
    p.add_argument(
        "--spark",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="then bulk load, drain and audit with Spark (default: when pyspark and Java are installed)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see EPILOG)."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        # argparse fills a variadic positional only before the first option: collect the rest
        # ("enqueue q a --priority 1 b"), and refuse anything else it did not recognise.
        variadic = {"enqueue": "payload", "worker": "names"}.get(args.command)
        if variadic and not any(e.startswith("-") and len(e) > 1 for e in extra):
            setattr(args, variadic, [*getattr(args, variadic), *extra])
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help, --version, or a usage error argparse has printed
        return exc.code if isinstance(exc.code, int) else 2
    db: fdbqueue.Database | None = None
    try:
        if args.command in ("demo", "forward", "audit"):  # no main database opened here
            return int(args.func(args))
        _check_url(args.url or os.environ.get("FDBQUEUE_URL"))
        db = fdbqueue.open(args.url, principal=args.principal)
        return int(args.func(db, args))
    except CommandError as exc:
        return _fail(str(exc), exc.code)
    except fdbqueue.QueueError as exc:
        return _fail(str(exc), 1 if isinstance(exc, RUNTIME_ERRORS) else 2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (| head): not an error worth a traceback
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        if db is not None:
            with contextlib.suppress(Exception):
                db.close()


def _fail(message: str, code: int) -> int:
    print(f"fdbqueue: error: {message}", file=sys.stderr)
    return code
