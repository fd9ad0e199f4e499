"""The journal: one entry per operation on a journaled queue, in commit order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fdbqueue.engines.base import Transaction
from fdbqueue.layout import QueueKeys


def record(
    tr: Transaction,
    keys: QueueKeys,
    op: str,
    message_id: str | None = None,
    *,
    deliveries: int = 0,
    reason: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> None:
    """Write one journal entry for ``op`` on queue ``keys.name`` in ``tr``; the caller checks
    that the queue is journaled. Composes inside ``tr``: the entry commits or aborts with it."""
    raise NotImplementedError("the journal is being built (issue 14)")
