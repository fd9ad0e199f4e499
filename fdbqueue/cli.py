"""The ``fdbqueue`` command. It only calls the public API; no logic lives only here."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import fdbqueue
from fdbqueue.errors import QueueError


def _cmd_demo(args: argparse.Namespace) -> int:
    from fdbqueue.demo import run_demo

    print(
        f"fdbqueue demo: {args.producers} producer and {args.workers} worker processes, "
        f"{args.messages} messages, exactly-once processing on the embedded engine"
    )
    r = run_demo(args.url, messages=args.messages, producers=args.producers, workers=args.workers)
    rows = [
        ("messages enqueued", f"{r.messages}"),
        ("processed exactly once", f"{r.processed_once}"),
        ("processed twice or more", f"{r.duplicates}"),
        ("lost", f"{r.missing}"),
        ("wall time", f"{r.seconds:.2f} s"),
        ("throughput", f"{r.messages / r.seconds:,.0f} msg/s"),
        ("latency p50 / p99", f"{r.p50_ms:.1f} / {r.p99_ms:.1f} ms"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print("OK: every message processed exactly once" if r.ok else "FAILED: see the counts above")
    return 0 if r.ok else 1


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fdbqueue", description="Durable, transactional queues.")
    parser.add_argument(
        "--url", default=os.environ.get("FDBQUEUE_URL"), help="database URL (default: $FDBQUEUE_URL)"
    )
    parser.add_argument("--version", action="version", version=f"fdbqueue {fdbqueue.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the end-to-end demo on the embedded engine")
    demo.add_argument("--messages", type=_positive, default=2000)
    demo.add_argument("--producers", type=_positive, default=2)
    demo.add_argument("--workers", type=_positive, default=3)
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except QueueError as exc:
        print(f"fdbqueue: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
