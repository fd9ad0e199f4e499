"""Older names of the public testing hooks (:mod:`fdbqueue.testing`), kept for existing tests."""

from __future__ import annotations

from fdbqueue.testing import FaultScript as ScriptedFaults
from fdbqueue.testing import on_backoff

__all__ = ["ScriptedFaults", "on_backoff"]
