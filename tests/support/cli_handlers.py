"""Handlers for the ``fdbqueue worker`` tests (imported by ``--handler tests.support.cli_handlers:...``)."""

from __future__ import annotations

import os
import time
from typing import Any

import fdbqueue

NOT_CALLABLE = 42


def record(message: fdbqueue.Message) -> None:
    """Lease mode: append the message id to $CLI_HANDLER_LOG (one line per processed message)."""
    time.sleep(float(os.environ.get("CLI_HANDLER_SLEEP", "0")))
    fd = os.open(os.environ["CLI_HANDLER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, message.id.encode() + b"\n")
    finally:
        os.close(fd)


def in_transaction(tr: Any, message: fdbqueue.Message) -> None:
    """Exactly-once mode: record the message in the same transaction that dequeues it."""
    tr[b"cli_handlers/" + message.id.encode()] = message.payload


def fail(message: fdbqueue.Message) -> None:
    raise RuntimeError(f"cannot handle {message.id}")
