"""A double of FoundationDB's C client library (libfdb_c) backed by the sim engine, for tests.

The official ``foundationdb`` Python bindings are pure Python over ``ctypes`` calls into
libfdb_c: ``fdb/impl.py`` loads it with ``ctypes.CDLL`` and declares each function's
``argtypes``, ``restype`` and ``errcheck`` in ``init_c_api``. :func:`install` puts
:class:`CAPIDouble` where that library object goes (intercepting ``ctypes.CDLL`` for the
libfdb_c name while ``fdb.impl`` is imported), so that the bindings' own futures,
``on_ready`` callbacks, ``block_until_ready``, streaming range reads, options, ``on_error``,
watches, versionstamps and errors run unchanged, and ``fdbqueue/engines/fdb.py`` above them.
It works with the 7.1, 7.3 and 8.0 wheels (the same entry points, ``bindings/c/foundationdb/fdb_c.h``):
each looks for the library next to ``fdb/impl.py``, then through a ``<name>.pth`` file there,
then by name on the loader's path, then with ``ctypes.util.find_library``, and every way ends
in ``ctypes.CDLL`` of a path whose base name is ``libfdb_c.so`` / ``libfdb_c.dylib`` /
``fdb_c.dll``: the one call :func:`install` intercepts, only while ``fdb.impl`` is imported.

What it models, function by function (names from ``fdb_c.h``):

* ``fdb_select_api_version_impl`` / ``fdb_get_max_api_version``: a library exactly as new
  as the bindings' header version. ``fdb_setup_network``, ``fdb_run_network`` (blocks the
  bindings' network thread until ``fdb_stop_network``; it completes watches),
  ``fdb_network_set_option`` (accepted).
* ``fdb_create_database`` reads the cluster file: its connection string names one sim
  store (:meth:`CAPIDouble.new_cluster_file` makes a fresh one). ``fdb_database_create_transaction``
  is ``SimDatabase.create_transaction``; ``fdb_database_set_option`` accepts the options that
  change nothing the sim models.
* Reads (``fdb_transaction_get``, ``_get_key``, ``_get_range``, ``_get_read_version``) are
  the sim transaction's public reads, evaluated when issued (what read-your-writes sees
  then) and returned through futures that are ready at once, or after the store's
  ``read_latency`` (completed by the network thread: a round trip, so that reads issued
  together cost one latency and reads waited on one by one one each). ``fdb_transaction_get_range``
  applies ``validate_and_update_parameters`` of ``bindings/c/fdb_c.cpp`` (streaming modes,
  the iterator's byte progression, row and byte limits with FoundationDB's per-row count of
  ``8 + key + value`` from ``GetRangeLimits::decrement`` in ``fdbclient/NativeAPI.actor.cpp``)
  and returns ``more``: the bindings then continue from the last key, and the read
  conflict range covers only what was returned (a snapshot probe sizes the batch; the
  serializable read then reads exactly that batch).
* Writes (``fdb_transaction_set``, ``_clear``, ``_clear_range``, ``_atomic_op``) return
  nothing; an error is kept and returned by the commit, as ``ThreadSafeTransaction::set``
  (``fdbclient/ThreadSafeTransaction.cpp``) keeps it in ``deferredError``. Atomic op codes
  are those of ``fdb.options``; AND and MIN mean AND_V2 and MIN_V2 from API 510
  (``Transaction::atomicOp``, ``fdbclient/NativeAPI.actor.cpp``).
* ``fdb_transaction_commit`` and ``fdb_transaction_on_error`` run on a worker thread, so
  the bindings block on a future that is not ready and are woken by its callback from
  another thread. ``on_error`` is the sim's: retryable codes back off and reset, others
  (and a reached retry limit) fail the future with the code; the persistent options
  (timeout, retry limit, max retry delay, set by ``fdb_transaction_set_option``) survive it.
* ``fdb_transaction_watch``: the sim's watch, completed by the network thread when it fires
  or fails; cancelling or destroying the future cancels it (1101).
* ``fdb_transaction_get_versionstamp``: ready when the commit ends (2021 for a read-only
  transaction, 2020 after a failed commit, 1025 if reset first).
* ``fdb_get_error`` and ``fdb_error_predicate`` follow ``bindings/c/fdb_c.cpp``.
* Futures: ``fdb_future_is_ready``, ``_set_callback`` (called at once when ready, else from
  the completing thread), ``_block_until_ready``, ``_get_error``, ``_get_int64``,
  ``_get_key``, ``_get_value``, ``_get_keyvalue_array`` (writing through the ``byref``
  out-parameters into memory the future owns until ``fdb_future_destroy``), ``_cancel``.
  The ``errcheck`` the bindings set on a function is applied as ctypes applies it.

What it does not model: the network (no latency, no partitions: faults come from the sim
store), tenants, ``fdb_transaction_set_read_version``, size estimates, split points,
locality, options that change semantics other than timeout / retry limit / max retry delay
(they fail with 2108 unsupported_operation, as do database options that set transaction
defaults), the multi-version client, and a read's result changing while its future is
pending (a read is evaluated when issued). Semantics (conflicts, versions, limits,
injected faults) are the sim engine's, not this module's: it only translates.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.fdbdouble.library import DEFAULT_SIM_URL, CAPIDouble

__all__ = ["DEFAULT_SIM_URL", "LIBRARY_NAMES", "CAPIDouble", "install", "installed"]

LIBRARY_NAMES = ("libfdb_c.so", "libfdb_c.dylib", "fdb_c.dll")


_double: CAPIDouble | None = None


def installed() -> CAPIDouble | None:
    """The double the bindings in this process use, if any."""
    return _double


@contextmanager
def _intercept_cdll(double: CAPIDouble) -> Iterator[None]:
    real = ctypes.CDLL

    def cdll(name: Any, *args: Any, **kwargs: Any) -> Any:
        if name and os.path.basename(str(name)) in LIBRARY_NAMES:
            return double
        return real(name, *args, **kwargs)

    ctypes.CDLL = cdll  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        ctypes.CDLL = real  # type: ignore[misc]


def install() -> CAPIDouble:
    """Make the ``fdb`` bindings of this process load :class:`CAPIDouble` instead of libfdb_c.

    Must run before ``fdb.api_version()``. Raises RuntimeError when the bindings already
    run over a real library.
    """
    global _double
    if _double is not None:
        return _double
    import fdb

    double = CAPIDouble()
    impl = sys.modules.get("fdb.impl")
    if impl is None:
        with _intercept_cdll(double):
            impl = importlib.import_module("fdb.impl")
        if impl._capi is not double:
            raise RuntimeError("fdb.impl loaded a real libfdb_c (one is installed next to the bindings)")
    else:
        # Imported already (a real libfdb_c loaded): replace it only while no API version is chosen.
        if fdb.is_api_version_selected():
            raise RuntimeError("the fdb bindings already selected an API version over a real libfdb_c")
        impl._capi = double
        impl._FDBBase.capi = double
    _double = double
    return double
