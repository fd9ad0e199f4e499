"""The command line's operations: ``metrics`` (a Prometheus endpoint), ``web`` (the dashboard), periodic jobs
(``schedule``, ``schedules``, ``unschedule``, ``scheduler``), ``audit`` (a Spark job). The integrations
are imported when their command runs: a missing extra is one line saying what to install."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable

import fdbqueue
from fdbqueue.api.export import journal_names, open_from, queue_names
from fdbqueue.cli.console import CommandError, _check_url
from fdbqueue.errors import MissingExtraError, QueueError

Add = Callable[..., argparse.ArgumentParser]


def add_ops_commands(add: Add) -> None:
    """Register ``metrics`` with the CLI's ``add`` helper."""
    p = add(
        "metrics",
        _cmd_metrics,
        "serve every queue's depth, age and totals for Prometheus until SIGTERM / Ctrl-C",
        json_flag=False,
        named=False,
    )
    p.add_argument(
        "--port", type=int, default=9464, help="TCP port (default 9464, Prometheus's registry entry)"
    )
    p.add_argument(
        "--addr",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this host only; 0.0.0.0 for every interface, "
        "for a Prometheus on another host: the figures name every queue)",
    )
    p = add(
        "web",
        _cmd_web,
        "serve the web dashboard (queues, messages, dead letters, pause/resume) until SIGTERM / Ctrl-C",
        json_flag=False,
        named=False,
    )
    p.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    p.add_argument(
        "--addr",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: put a proxy with "
        "authentication in front to serve others)",
    )
    p.add_argument("--read-only", action="store_true", help="refuse every action (pause, redrive, delete)")
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="a host name the dashboard also answers (repeatable): a reverse proxy's; without "
        "a port at any port (default: localhost, 127.0.0.1, [::1] and --addr, at --port)",
    )
    p.add_argument(
        "--interval", type=float, default=2.0, help="seconds between samples of the queues (default 2)"
    )
    _add_schedule_commands(add)


def _add_schedule_commands(add: Add) -> None:
    p = add(
        "schedule",
        _cmd_schedule,
        "enqueue PAYLOAD into QUEUE at each tick of CRON (UTC)",
        json_flag=False,
        named=False,
    )
    p.add_argument("sched", metavar="NAME", help="the schedule's name (making it again replaces it)")
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("cron", metavar="CRON", help="'*/5 * * * *' (five fields, or six with seconds last)")
    p.add_argument("payload", metavar="PAYLOAD", help="the message text")
    p.add_argument("--priority", type=int, default=0)
    p.add_argument(
        "--catch-up", choices=("latest", "all", "none"), default="latest", help="missed ticks after downtime"
    )
    add("schedules", _cmd_schedules, "list the schedules with their last and next run", named=False)
    p = add("unschedule", _cmd_unschedule, "remove a schedule", json_flag=False, named=False)
    p.add_argument("sched", metavar="NAME")
    p = add(
        "scheduler", _cmd_scheduler, "run the schedules until SIGTERM / Ctrl-C", json_flag=False, named=False
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between passes (default 1)")


def _cmd_schedule(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    name = fdbqueue.schedule(
        db,
        args.queue,
        args.cron,
        args.payload,
        name=args.sched,
        priority=args.priority,
        catch_up=args.catch_up,
    )
    print(f"scheduled {name!r}: {args.queue} at {args.cron!r} (UTC)")
    return 0


def _cmd_schedules(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    import json

    rows = fdbqueue.schedules(db)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": s.name,
                        "queue": s.queue,
                        "cron": s.cron,
                        "last_run": s.last_run and s.last_run.isoformat(),
                        "next_run": s.next_run.isoformat(),
                    }
                    for s in rows
                ]
            )
        )
        return 0
    for s in rows:
        last = s.last_run.isoformat(timespec="seconds") if s.last_run else "never"
        print(f"{s.name}\t{s.queue}\t{s.cron}\tlast {last}\tnext {s.next_run.isoformat(timespec='seconds')}")
    return 0


def _cmd_unschedule(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    if not fdbqueue.unschedule(db, args.sched):
        raise CommandError(f"no schedule named {args.sched!r}", 1)
    print(f"removed schedule {args.sched!r}")
    return 0


def _cmd_scheduler(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise CommandError(f"--interval must be > 0, got {args.interval}")
    sched = fdbqueue.Scheduler(db, interval=args.interval)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sched.stop())
    print("fdbqueue scheduler: running the schedules; stop with SIGTERM or Ctrl-C", file=sys.stderr)
    print(f"scheduler stopped: enqueued {sched.run()}")
    return 0


def _cmd_web(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    from fdbqueue.web import Dashboard

    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port must be 0..65535, got {args.port}")
    if not 0.1 <= args.interval <= 3600:
        raise CommandError(f"--interval must be 0.1..3600 seconds, got {args.interval}")
    try:
        dashboard = Dashboard(
            db,
            read_only=args.read_only,
            interval=args.interval,
            window=max(300.0, 150 * args.interval),
            allowed_hosts=args.allowed_host,
        )
    except QueueError as exc:
        raise CommandError(f"--allowed-host: {exc}") from None
    mode = "read-only" if args.read_only else f"acting as {db.principal}"

    def announce(url: str) -> None:
        print(f"fdbqueue web on {url}/ ({mode}); stop with SIGTERM or Ctrl-C", file=sys.stderr, flush=True)

    try:
        dashboard.serve(args.port, args.addr, announce=announce)
    except OSError as exc:
        raise CommandError(f"cannot listen on {args.addr}:{args.port}: {exc.strerror or exc}", 1) from None
    return 0


def _cmd_metrics(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    from fdbqueue.runtime.metrics import serve

    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port must be 0..65535, got {args.port}")
    try:
        exporter = serve(db, args.port, args.addr)
    except OSError as exc:
        raise CommandError(f"cannot listen on {args.addr}:{args.port}: {exc.strerror or exc}", 1) from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(
        f"fdbqueue metrics on http://{args.addr}:{exporter.port}/metrics; stop with SIGTERM or Ctrl-C",
        file=sys.stderr,
    )
    try:
        while not stop.wait(1.0):
            pass
    finally:
        exporter.close()
    return 0


def add_audit_command(add: Add) -> None:
    """Register ``fdbqueue audit`` (the ``spark`` extra) with the CLI's ``add`` helper."""
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


def _cmd_audit(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get("FDBQUEUE_URL") or "sqlite://fdbqueue.db"
    _check_url(url)
    from fdbqueue.spark import local_session  # MissingExtraError without the spark extra
    from fdbqueue.spark.audit import run_audit, summary_lines

    try:  # the plot is drawn after the Spark job: say it is missing before the job starts
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError("fdbqueue audit's plot (matplotlib)", "spark", exc.name) from exc
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
