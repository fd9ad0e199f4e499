"""Looking at an embedded store from outside: a stored value read by a connection of its own,
a key template for versionstamps, the SQL a call runs on a handle's connection."""

from __future__ import annotations

import sqlite3
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

# A stamp the stamped-write tests make every commit fill in (the engine's own is the commit's
# version, not known before the commit): so that a template can be made to land on a chosen key.
STAMP = b"S" * 10


def stored(path: Path, key: bytes) -> bytes | None:
    """The value the store file holds, read by a connection of its own."""
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
    finally:
        conn.close()
    return None if row is None else bytes(row[0])


def template(prefix: bytes) -> bytes:
    """A key template that ``set_versionstamped_key`` fills to ``prefix + stamp``."""
    return prefix + b"\0" * 10 + struct.pack("<I", len(prefix))


def traced(db: Any, call: Callable[[], Any]) -> tuple[list[str], Any]:
    """The SQL statements ``call()`` runs on ``db``'s connection (each one stepped), and what
    it returned."""
    conn = db._store.conn
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        got = call()
    finally:
        conn.set_trace_callback(None)
    return statements, got
