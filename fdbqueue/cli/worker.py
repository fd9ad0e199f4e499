"""The ``worker`` command: a handler named ``module:function``, served by a :class:`fdbqueue.Worker`
until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import fdbqueue
from fdbqueue.cli.console import CommandError, _count, _positive, _print_json, _worker_summary, setup_logging


def _memory(text: str) -> int:
    """``--max-memory-per-child``: bytes, or a size with a unit (512MB, 1.5GiB)."""
    from fdbqueue.runtime.pool import check_memory

    try:
        size = check_memory(text)  # digits alone are bytes
    except fdbqueue.QueueError:
        raise argparse.ArgumentTypeError(
            f"expected bytes or a size such as 512MB or 1.5GiB, got {text!r}"
        ) from None
    assert size is not None
    return size


def add_pool_options(p: argparse.ArgumentParser) -> None:
    """The ``worker`` command's process pool (``Worker(processes=N)``)."""
    p.add_argument(
        "--processes",
        type=_count,
        default=0,
        metavar="N",
        help="run the handler in N child processes (lease mode; default 0: in this process's threads); "
        "this process leases and settles. The handler must be importable by its module's name",
    )
    p.add_argument(
        "--max-tasks-per-child",
        type=_positive,
        default=None,
        metavar="N",
        help="with --processes: replace a child after N handler calls",
    )
    p.add_argument(
        "--max-memory-per-child",
        type=_memory,
        default=None,
        metavar="SIZE",
        help="with --processes: replace a child whose resident memory is above SIZE after a call "
        "(bytes, or 512MB, 1GiB ...)",
    )


def _load_handler(spec: str) -> Callable[..., Any]:
    """``module:function`` (or ``module:obj.method``), imported from the current directory too."""
    obj = _load(spec, "--handler", "module:function", "handler")
    if not callable(obj):
        raise CommandError(f"handler {spec!r} is not callable")
    return obj  # type: ignore[no-any-return]


def _load_tasks(spec: str) -> fdbqueue.Tasks:
    """``module:app``: an :class:`fdbqueue.Tasks`, imported from the current directory too."""
    obj = _load(spec, "--tasks", "module:app", "tasks")
    if not isinstance(obj, fdbqueue.Tasks):
        raise CommandError(f"--tasks {spec!r} is a {type(obj).__name__}, not an fdbqueue.Tasks app")
    return obj


def _load(spec: str, option: str, shape: str, what: str) -> Any:
    """The object ``module:attr`` names (``attr`` may be dotted)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CommandError(f"{option} must look like {shape}, got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does; the console script does not
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name + ".").startswith(exc.name + "."):
            raise CommandError(f"cannot import {what} module {module_name!r}: no such module") from None
        raise CommandError(f"importing {what} module {module_name!r} failed: {exc}") from None
    except Exception as exc:  # the user's module raised on import: their mistake, one line
        raise CommandError(
            f"importing {what} module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CommandError(f"{what} module {module_name!r} has no attribute {attr!r}") from None
    return obj


def _cmd_worker(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    if args.tasks is not None:
        return _cmd_task_worker(db, args)
    if args.handler is None or not args.names:
        raise CommandError("worker needs queue names and --handler MODULE:FUNCTION, or --tasks MODULE:APP")
    handler = _load_handler(args.handler)
    from fdbqueue import Worker  # public API

    setup_logging(args.log_level, args.log_format)
    from fdbqueue.api.admin import is_pattern

    pattern = len(args.names) == 1 and is_pattern(args.names[0])  # every matching queue, fairly
    missing = [] if pattern else sorted(set(args.names) - set(fdbqueue.list_queues(db)))
    if missing:  # a typo would otherwise wait silently forever
        print(f"fdbqueue: warning: no queue named {', '.join(missing)} yet; waiting", file=sys.stderr)

    worker = Worker(
        db,
        args.names[0] if pattern else args.names,
        handler,
        mode=args.mode,  # either spelling: the Worker normalises it
        concurrency=args.concurrency,
        lease_seconds=args.lease_seconds,
        sweep_interval=args.sweep_interval,
        heartbeat=args.heartbeat,
        shutdown_timeout=args.shutdown_timeout,
        time_limit=args.time_limit,
        processes=args.processes,
        max_tasks_per_child=args.max_tasks_per_child,
        max_memory_per_child=args.max_memory_per_child,
    )
    print(
        f"fdbqueue worker: {', '.join(args.names)} in {args.mode} mode, {_where(args)}, "
        f"handler {args.handler}; stop with SIGTERM or Ctrl-C",
        file=sys.stderr,
    )
    stats = worker.run(install_signals=True, until_empty=args.until_empty, max_messages=args.max_messages)
    values = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else dict(vars(stats))
    if args.json:
        _print_json(values)
    else:
        print(f"worker stopped: {_worker_summary(stats, values)}")
    return 0


def _where(args: argparse.Namespace) -> str:
    """Where the handlers run, for the worker's first line."""
    n = args.processes
    return f"{n} child process{'es' if n != 1 else ''}" if n else f"concurrency {args.concurrency}"


def _cmd_task_worker(db: fdbqueue.Database, args: argparse.Namespace) -> int:
    """``worker --tasks module:app``: the app's worker over its tasks' queues."""
    if args.handler is not None or args.names:
        raise CommandError("--tasks runs the app's own queues: give no queue names and no --handler")
    if args.mode.replace("-", "_") != "lease":
        raise CommandError(
            "--tasks takes its mode from the app's tasks (exactly_once=True ones run on an exactly-once "
            "worker, the others in lease mode): leave --mode out"
        )
    app = _load_tasks(args.tasks)
    setup_logging(args.log_level, args.log_format)
    # Every option given reaches the worker, or is refused: none is silently left out.
    if args.processes and args.concurrency not in (1, args.processes):
        raise CommandError(
            f"with --processes {args.processes} each child runs one task at a time: leave concurrency at 1 "
            f"(or give {args.processes}), got --concurrency {args.concurrency}"
        )
    options: dict[str, Any] = {}
    for name in ("max_tasks_per_child", "max_memory_per_child"):
        if getattr(args, name) is not None:
            if not args.processes:
                raise CommandError(
                    "--max-tasks-per-child and --max-memory-per-child need processes > 0 (--processes N)"
                )
            options[name] = getattr(args, name)
    if not any(t.is_async for t in app.tasks.values()):  # an AsyncWorker has no sweeper of its own
        options["sweep_interval"] = args.sweep_interval
    target = db if args.url else None  # the app's own database unless --url names one
    if target is None and args.principal is not None and app.db.principal != args.principal:
        target = own = fdbqueue.open(app.db.url, principal=args.principal)  # the app's, as --principal
    else:
        own = None
    try:
        return _run_task_worker(app, args, target, options)
    finally:
        if own is not None:
            own.close()


def _run_task_worker(
    app: fdbqueue.Tasks, args: argparse.Namespace, target: fdbqueue.Database | None, options: dict[str, Any]
) -> int:
    worker = app.worker(
        concurrency=args.concurrency,
        processes=args.processes,
        time_limit=args.time_limit,
        db=target,
        lease_seconds=args.lease_seconds,
        heartbeat=args.heartbeat,
        shutdown_timeout=args.shutdown_timeout,
        **options,
    )
    n = len(app.tasks)
    print(
        f"fdbqueue worker: {n} task{'' if n == 1 else 's'} of {args.tasks} on {', '.join(app.queues)}, "
        f"{_where(args)}; stop with SIGTERM or Ctrl-C",
        file=sys.stderr,
    )
    stats = worker.run(install_signals=True, until_empty=args.until_empty, max_messages=args.max_messages)
    values = dataclasses.asdict(stats)
    if args.json:
        _print_json(values)
    else:
        print(f"worker stopped: {_worker_summary(stats, values)}")
    return 0
