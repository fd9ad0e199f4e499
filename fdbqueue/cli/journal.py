"""The command line's journal, privileges and moves: journal, history, grant, revoke, acl,
redrive, move."""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Console

import fdbqueue
import fdbqueue.ops.privileges
from fdbqueue.api.export import journal_names, open_from, queue_names
from fdbqueue.cli.console import CommandError, _cells, _check_url, _count, _headers, _render, _seconds, _table
from fdbqueue.spark.audit import run_audit, summary_lines
from fdbqueue.types import JournalEntry

Add = Callable[..., argparse.ArgumentParser]


def _version(text: str) -> str:
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != 12:
        raise argparse.ArgumentTypeError(f"a journal version is 24 hex digits, got {text!r}")
    return text


def add_journal_commands(add: Add, common: argparse.ArgumentParser) -> None:
    """Register ``journal`` and ``history`` with the CLI's ``add`` helper."""
    del common
    p = add(
        "journal",
        _cmd_journal,
        "print a queue's journal (every journaled queue: no QUEUE)",
        json_flag=False,
        named=False,
    )
    p.add_argument(
        "name", nargs="?", default=None, metavar="QUEUE", help="queue (default: every journaled queue)"
    )
    p.add_argument(
        "--since", type=_version, default=None, metavar="V", help="after version V (hex, exclusive)"
    )
    p.add_argument("--limit", type=_count, default=0, help="at most N entries (0: all)")
    p.add_argument("--follow", "-f", action="store_true", help="then wait for new entries (Ctrl-C stops)")
    p.add_argument(
        "--timeout", type=_seconds, default=None, metavar="S", help="--follow: stop after S idle seconds"
    )
    p.add_argument("--json-lines", "--json", action="store_true", help="one JSON object per entry")
    p = add("history", _cmd_history, "print one message's journal entries, across queues", named=False)
    p.add_argument("id", metavar="ID", help="message id")
    rights = ", ".join(fdbqueue.ops.privileges.RIGHTS)
    for name, func, text in (
        ("grant", _cmd_grant, "give a principal rights on a queue (needs admin)"),
        ("revoke", _cmd_revoke, "take rights on a queue from a principal (needs admin)"),
    ):
        p = add(name, func, text, json_flag=False)
        p.add_argument("who", metavar="PRINCIPAL")
        p.add_argument("rights", nargs="+", metavar="RIGHT", help=rights)
    add("acl", _cmd_acl, "who holds which rights on a queue (needs admin)")
    text = "send an error queue's dead letters back to their origin queues (or --to), deliveries reset"
    p = add("redrive", _cmd_redrive, text, json_flag=False)
    p.add_argument(
        "--to", default=None, metavar="Q", help="the queue they all go to (default: each one's origin)"
    )
    p.add_argument("--where", action="append", metavar="K=V", help="only messages with this header")
    p.add_argument("--limit", type=_count, default=0, help="at most N messages (0: all)")
    p = add("move", _cmd_move, "move a queue's ready messages to another queue", json_flag=False)
    p.add_argument("dst", metavar="DST", help="the queue they go to")
    p.add_argument("--where", action="append", metavar="K=V", help="only messages with this header")
    p.add_argument("--limit", type=_count, default=0, help="at most N messages (0: all)")
    text = "forward a queue to another database, exactly once (resumable; --follow keeps going)"
    p = add("forward", _cmd_forward, text, json_flag=False, named=False)
    p.add_argument("--from", dest="src_url", required=True, metavar="URL", help="the source database")
    p.add_argument("--queue", required=True, metavar="Q", help="the source queue")
    p.add_argument("--to", dest="dst_url", required=True, metavar="URL", help="the destination database")
    p.add_argument("--to-queue", default=None, metavar="Q", help="the destination queue (default: --queue)")
    p.add_argument("--follow", action="store_true", help="keep forwarding as messages arrive (SIGTERM stops)")
    p.add_argument("--batch", type=_count, default=100, help="messages per transaction (default 100)")
    p.add_argument("--limit", type=_count, default=0, help="at most N messages (0: all)")
    p.add_argument("--where", action="append", metavar="K=V", help="only messages with this header")
    p.add_argument(
        "--exclusive",
        action="store_true",
        help="the forwarder is the source queue's only consumer (an outbox): no leases, faster",
    )
    p.add_argument(
        "--ack-queue", default=None, metavar="Q", help="one acknowledgement per message, on the source"
    )
    add("routes", _cmd_routes, "the routing values of a partitioned queue sent to named queues")
    p = add("route", _cmd_route, "send a routing value of a partitioned queue to QUEUE", json_flag=False)
    p.add_argument("value", metavar="VALUE", help="the routing value")
    p.add_argument("queue", metavar="QUEUE", help="where its messages go ('': back to its partition)")


def entry_json(e: JournalEntry) -> dict[str, Any]:
    """A journal entry as JSON: its version in hex, ``at`` in ISO 8601 (UTC)."""
    return {**e.to_json(), "at": datetime.datetime.fromtimestamp(e.at, datetime.timezone.utc).isoformat()}


def _print_entries(entries: Iterable[JournalEntry], as_json: bool, *, stream: bool) -> int:
    n = 0
    if as_json or stream:
        for e in entries:
            if as_json:
                print(json.dumps(entry_json(e), separators=(",", ":")), flush=True)
            else:
                d = entry_json(e)
                print(
                    f"{d['version']}  {d['at']}  {e.queue}  {e.op}  {e.message_id or '-'}  {e.principal}",
                    flush=True,
                )
            n += 1
        return n
    table = _table("version", "at", "queue", "op", "message", "principal", "deliveries", "reason", "details")
    for e in entries:
        d = entry_json(e)
        details = json.dumps(e.details, separators=(",", ":")) if e.details else ""
        if len(details) > 80:
            details = details[:77] + "..."  # --json-lines has all of it
        table.add_row(*_cells(d["version"], d["at"], e.queue, e.op, e.message_id or "-", e.principal,
                              e.deliveries, e.reason or "", details))  # fmt: skip
        n += 1
    _render(table)
    return n


def _cmd_journal(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    if args.timeout is not None and not args.follow:
        raise CommandError("--timeout goes with --follow")
    entries = fdbqueue.journal(
        db, args.name, since=args.since, limit=args.limit or None, follow=args.follow, timeout=args.timeout
    )
    _print_entries(entries, args.json_lines, stream=args.follow)
    sys.stdout.flush()
    return 0


def _cmd_history(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    entries = fdbqueue.history(db, args.id)
    if not entries:
        raise CommandError(f"no journal entries for message {args.id!r} (its queue keeps no journal?)", 3)
    if args.json:
        for e in entries:
            print(json.dumps(entry_json(e), separators=(",", ":")))
        return 0
    _print_entries(entries, False, stream=False)
    return 0


def _cmd_grant(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    held = fdbqueue.grant(db, args.name, args.who, args.rights)
    print(f"{args.who} holds {', '.join(sorted(held)) or 'nothing'} on {args.name}")
    return 0


def _cmd_revoke(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    held = fdbqueue.revoke(db, args.name, args.who, args.rights)
    print(f"{args.who} holds {', '.join(sorted(held)) or 'nothing'} on {args.name}")
    return 0


def _cmd_acl(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    found = fdbqueue.acl(db, args.name)
    if args.json:
        print(json.dumps({p: sorted(r) for p, r in sorted(found.items())}))
        return 0
    if not found:
        print(f"queue {args.name!r} has no owner: open to every principal")
        return 0
    table = _table("principal", "rights")
    for p, r in sorted(found.items()):
        table.add_row(*_cells(p, ", ".join(sorted(r))))
    _render(table)
    return 0


def _cmd_redrive(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    where = _headers(args.where) if args.where else None
    n = fdbqueue.redrive(db, args.name, to=args.to, where=where, limit=args.limit or None)
    dest = args.to or "their origin queues"
    print(f"redrove {n} message{'s' if n != 1 else ''} from {args.name} to {dest}")
    return 0


def _cmd_move(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    where = _headers(args.where) if args.where else None
    n = fdbqueue.move(db, args.name, args.dst, where=where, limit=args.limit or None)
    print(f"moved {n} message{'s' if n != 1 else ''} from {args.name} to {args.dst}")
    return 0


def _cmd_routes(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    found = fdbqueue.routes(db, args.name)
    if args.json:
        print(json.dumps(found, sort_keys=True))
        return 0
    if not found:
        print(f"{args.name}: every routing value goes to its hashed partition")
        return 0
    table = _table("value", "queue")
    for value, queue in sorted(found.items()):
        table.add_row(*_cells(value, queue))
    _render(table)
    return 0


def _cmd_route(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    fdbqueue.set_route(db, args.name, args.value, args.queue or None)
    where = args.queue or "its hashed partition"
    print(f"{args.name}: messages of {args.value!r} now go to {where}")
    return 0


def _cmd_forward(args: argparse.Namespace) -> int:
    """Not given the main database: both ends are named (``main`` runs it before opening one)."""
    _check_url(args.src_url)
    _check_url(args.dst_url)
    if not args.batch:
        raise CommandError("--batch must be at least 1")
    src = fdbqueue.open(args.src_url, principal=args.principal)
    dst = fdbqueue.open(args.dst_url, principal=args.principal)
    try:
        if args.queue not in fdbqueue.list_queues(src):  # a typo would forward 0, or wait for ever
            if not args.follow:
                raise CommandError(f"no queue named {args.queue!r} in {args.src_url}", 1)
            print(
                f"fdbqueue: warning: no queue named {args.queue!r} in {args.src_url} yet; waiting",
                file=sys.stderr,
            )
        where = _headers(args.where) if args.where else None
        f = fdbqueue.Forwarder(
            src,
            args.queue,
            dst,
            args.to_queue or args.queue,
            batch=args.batch,
            ack_queue=args.ack_queue,
            where=where,
            exclusive=args.exclusive,
        )
        run = functools.partial(f.run, follow=args.follow, limit=args.limit or None, install_signals=True)
        if sys.stderr.isatty():
            from rich.progress import Progress

            with Progress(console=Console(stderr=True), transient=True) as bar:
                task = bar.add_task(f"forwarding {args.queue}", total=None)
                st = run(progress=lambda s: bar.update(task, completed=s.forwarded))
        else:
            st = run()
    finally:
        src.close()
        dst.close()
    lag = "" if st.lag is None else f", lag {st.lag:.1f} s"
    print(f"forwarded {st.forwarded} (already there: {st.skipped}, retried: {st.retried}{lag})")
    return 0


# -- fdbqueue audit: the Spark job of spark/audit.py ----------------------------------------------


def add_audit_command(add: Any) -> None:
    """Register ``fdbqueue audit`` with the CLI's ``add`` helper."""
    p = add(
        "audit",
        _cmd_audit,
        "account for every message of journaled queues (a Spark job); exit 1 if any is unaccounted",
        json_flag=False,
        named=False,
    )
    p.add_argument(
        "--queue", default="*", metavar="Q", help="queue, pattern or list (default: every journaled one)"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="where messages.parquet and audit.png go")
    p.add_argument(
        "--master",
        default=None,
        metavar="M",
        help="Spark master, as spark-submit takes it (default local[2])",
    )


def _cmd_audit(args: Any) -> int:
    import os

    url = args.url or os.environ.get("FDBQUEUE_URL") or "sqlite://fdbqueue.db"
    _check_url(url)
    try:
        from fdbqueue.spark import local_session  # the spark extra
    except ImportError as exc:
        raise CommandError(str(exc), 2) from None
    principal = args.principal or os.environ.get("FDBQUEUE_PRINCIPAL")
    db = open_from({"url": url, **({"principal": principal} if principal else {})})
    try:  # the queues and the right to read them, before a JVM starts for nothing
        queue_names(db, journal_names(db, args.queue or "*"))
    finally:
        db.close()
    spark = local_session("fdbqueue-audit", master=args.master)
    report = run_audit(spark, url, args.out, queues=args.queue, principal=principal)
    print("\n".join(summary_lines(report)))
    return 1 if report.unaccounted else 0
