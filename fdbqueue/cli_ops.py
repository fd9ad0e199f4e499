"""The command line's operations: ``metrics`` (a Prometheus endpoint)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable

import fdbqueue
from fdbqueue.cli_io import CommandError

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
    p.add_argument("--addr", default="0.0.0.0", help="address to listen on (default all)")


def _cmd_metrics(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    from fdbqueue.metrics import serve

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
