"""The ``fdbqueue`` command. It only calls the public API; no logic lives only here."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Callable, Sequence

import fdbqueue
from fdbqueue.cli.console import (
    PROGRESS_OVER,
    RUNTIME_ERRORS,
    CommandError,
    OneLineParser,
    _check_url,
    _count,
    _int,
    _positive,
    _seconds,
    _ttl,
)
from fdbqueue.cli.journal import add_journal_commands
from fdbqueue.cli.ops import add_audit_command, add_ops_commands
from fdbqueue.cli.queues import (
    _CREATE_OPTIONS,
    DEMO_HELP,
    _cmd_browse,
    _cmd_create,
    _cmd_delete,
    _cmd_demo,
    _cmd_dequeue,
    _cmd_enqueue,
    _cmd_get,
    _cmd_list,
    _cmd_purge,
    _cmd_stats,
    _cmd_sweep,
    _set_state,
)
from fdbqueue.cli.worker import _cmd_worker, add_pool_options
from fdbqueue.cli.workers import add_workers_command

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
