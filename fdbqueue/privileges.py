"""Owners and privileges: who a transaction acts for, and what it may do on a queue."""

from __future__ import annotations

from fdbqueue.engines.base import Transaction

ANONYMOUS = "anonymous"


def principal_of(tr: Transaction) -> str:
    """The principal ``tr`` acts for: its database's (``open(url, principal=...)``)."""
    found = getattr(tr.db, "principal", None)
    return found if isinstance(found, str) and found else ANONYMOUS
