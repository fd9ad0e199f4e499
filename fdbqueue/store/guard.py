"""A queue's guard: its owner and ACL as stored, and the one rule of who holds a right.

Apart from the settings (store/config.py) because both the privileges' checks
(ops/privileges.py) and the settings' cache decide by it: the cache decides once per metadata
version whether the principal of a database holds what a short step needs
(``config._plain_limit``, ``config._take_keys``), and must decide exactly as the check does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from fdbqueue.types import ANONYMOUS, RIGHTS

#: Each right's bit in an ACL's mask.
RIGHT_BITS = {name: 1 << i for i, name in enumerate(RIGHTS)}
NO_ACL: Mapping[str, int] = MappingProxyType({})


def allowed(owner: str | None, acl: Mapping[str, int], principal: str, right: str) -> bool:
    """Whether ``principal`` holds ``right`` on a queue of ``owner`` and ``acl``."""
    if owner is None or principal == owner:
        return True
    return bool(acl.get(principal, 0) & RIGHT_BITS[right])


def acting_for(db: Any) -> str:
    """The principal ``db``'s transactions act for (``open(url, principal=...)``)."""
    found = getattr(db, "principal", None)
    return found if isinstance(found, str) and found else ANONYMOUS


def decode_guard(raw: bytes | None) -> tuple[str | None, Mapping[str, int]]:
    """A queue's owner and ACL (principal -> rights mask) from its guard key's value."""
    if not raw:
        return None, NO_ACL
    found = _guard_cache.get(raw)  # read by every operation: decoded once
    if found is None:
        data = json.loads(raw)
        found = data.get("owner"), MappingProxyType(dict(data.get("acl", {})))
        if len(_guard_cache) > 256:  # someone writing junk
            _guard_cache.clear()
        _guard_cache[raw] = found
    return found


def encode_guard(owner: str | None, acl: Mapping[str, int]) -> bytes | None:
    """The guard key's value, or None (clear it) for an open queue with no grants."""
    if owner is None and not acl:
        return None
    return json.dumps({"owner": owner, "acl": dict(sorted(acl.items()))}, separators=(",", ":")).encode()


_guard_cache: dict[bytes, tuple[str | None, Mapping[str, int]]] = {}
