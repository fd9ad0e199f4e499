"""Which way the layer took: a count of the leases and acks that went the long way, for the
tests of the short steps (ops/leasing.py ``lease_short``, ops/delivery.py ``ack_short``)."""

from __future__ import annotations

from typing import Any

import pytest

import fdbqueue.api.leases as api
from fdbqueue.ops import delivery, leasing


class Ways:
    """How many leases and acks went the long way (``lease_batch``, ``ack_in``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.leases = 0
        self.acks = 0
        real_batch, real_ack = leasing.lease_batch, delivery.ack_in

        def batch(*args: Any, **kwargs: Any) -> Any:
            self.leases += 1
            return real_batch(*args, **kwargs)

        def ack(*args: Any, **kwargs: Any) -> Any:
            self.acks += 1
            return real_ack(*args, **kwargs)

        for mod in (leasing, api):
            monkeypatch.setattr(mod, "lease_batch", batch)
        for mod in (api, delivery):  # (delivery.ack_own's long way too)
            monkeypatch.setattr(mod, "ack_in", ack)
