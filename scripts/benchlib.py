"""What every benchmark script reports about the machine it ran on."""

from __future__ import annotations

import contextlib
import os
import platform
import sqlite3
from typing import Any


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ('unknown' elsewhere)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def nproc() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 0  # pragma: no cover - not Linux


def loadavg() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def machine(**more: Any) -> dict[str, Any]:
    """CPUs, CPU model, Python, SQLite and platform, plus whatever the script adds."""
    return {
        "nproc": nproc(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        **more,
    }
