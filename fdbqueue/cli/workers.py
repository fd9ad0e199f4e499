"""The ``workers`` command: the registry of workers (``fdbqueue.workers``) as a table or JSON."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import fdbqueue
from fdbqueue.cli.console import _age, _print_json, _render, _table

Add = Callable[..., argparse.ArgumentParser]


def add_workers_command(add: Add) -> None:
    """Register ``workers`` with the CLI's ``add`` helper."""
    p = add(
        "workers",
        _cmd_workers,
        "list the workers consuming from this database: host, pid, queues, counts, the message in hand",
        named=False,
    )
    p.add_argument("--alive", action="store_true", help="only the live ones (not those not heard of lately)")


def _cmd_workers(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    found = fdbqueue.workers(db, alive=True if args.alive else None)
    if args.json:
        _print_json([w.as_dict() for w in found])
        return 0
    if not found:
        print("no workers")
        return 0
    now = time.time()
    table = _table("id", "state", "host", "pid", "queues", "up", "handled", "failed", "current", "since")
    for w in found:
        cur = w.current
        more = f" (+{len(w.in_hand) - 1})" if len(w.in_hand) > 1 else ""
        table.add_row(
            w.id,
            "alive" if w.alive else f"dead (last seen {_age(max(0.0, now - w.last_seen))} ago)",
            w.host,
            str(w.pid),
            ", ".join(w.queues),
            _age(max(0.0, now - w.started)),
            str(w.handled),
            str(w.failed),
            "-" if cur is None else f"{cur.queue}/{cur.id}{more}",
            "-" if cur is None else _age(max(0.0, now - cur.since)),
        )
    _render(table)
    return 0
