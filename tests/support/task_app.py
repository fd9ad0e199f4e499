"""A task app for the CLI tests: ``fdbqueue worker --tasks tests.support.task_app:app``.

Its database is ``$FDBQUEUE_URL`` (``fdbqueue.open()``'s default), as an application's would be."""

from __future__ import annotations

import fdbqueue

app = fdbqueue.Tasks()
not_an_app = object()


@app.task(queue="cli-tasks", store_result=True)
def double(n: int) -> int:
    return 2 * n
