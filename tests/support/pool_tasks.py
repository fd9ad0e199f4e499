"""Tasks a process pool's children run (``app.worker(processes=N)``): found by module and name.

The app's own database is ``memory://``, so that a child importing this module opens nothing
on disk; the worker is given the real database (``app.worker(db=...)``)."""

from __future__ import annotations

import os

import fdbqueue

app = fdbqueue.Tasks("memory://")


@app.task(queue="pool-tasks", store_result=True)
def pid_times(n: int) -> list[int]:
    """The child's pid (to tell children from the worker) and ``2 * n``."""
    return [os.getpid(), 2 * n]


@app.task(queue="pool-tasks", store_result=True)
def fails(text: str) -> None:
    raise ValueError(text)
