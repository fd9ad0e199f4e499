"""The layer format stored with a store's queues: written on first use, and a store of another
major format refused (its keys mean other things). Apart from the settings (store/config.py),
which read it with every queue's settings: the rule is the store's, not the settings'."""

from __future__ import annotations

from fdbqueue.engines.contract import Transaction
from fdbqueue.errors import UnsupportedLayerFormatError
from fdbqueue.store.layout import LAYER_FORMAT, QueueKeys


def check_format(found: str) -> None:
    """Refuse a layer format whose major differs from ours (stored by another fdbqueue)."""
    if found.split(".")[0] == LAYER_FORMAT.split(".")[0]:
        return
    why = (
        "it kept deadlines, due times and receipts in wall-clock microseconds, which this "
        "version keeps in database versions; drain its queues with the fdbqueue that wrote "
        "them, then clear their keys"
        if found.split(".")[0] == "1"
        else "it was written by another fdbqueue version; use that one"
    )
    raise UnsupportedLayerFormatError(
        f"this database holds fdbqueue layer format {found}; this version reads format "
        f"{LAYER_FORMAT} only: {why}"
    )


def check_layer_format(tr: Transaction, keys: QueueKeys) -> None:
    """Write the layer format on first use; refuse a store of another major format."""
    raw = tr.get(keys.format)
    if raw is None:
        tr.set(keys.format, LAYER_FORMAT.encode())
        return
    check_format(raw.decode(errors="replace"))
