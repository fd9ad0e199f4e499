"""FoundationDB's limits, which every engine enforces, so that what fits one engine fits a cluster.

From ``documentation/sphinx/source/known-limitations.rst`` and ``fdbclient/ClientKnobs.cpp``:
a key of at most 10,000 bytes (2102, key_too_large), a value of at most 100,000 bytes (2103,
value_too_large), a transaction of at most 10,000,000 bytes as ``Transaction::getSize`` counts
it (2101, transaction_too_large), and reads within 5 seconds of the read version (1007,
transaction_too_old: ``MAX_READ_TRANSACTION_LIFE_VERSIONS`` in ``fdbserver/core/ServerKnobs.cpp``).
The layer's budgets (``fdbqueue.store.budget``) are derived from them.
"""

from __future__ import annotations

KEY_SIZE_LIMIT = 10_000
VALUE_SIZE_LIMIT = 100_000
TRANSACTION_SIZE_LIMIT = 10_000_000
TRANSACTION_WINDOW_SECONDS = 5.0
