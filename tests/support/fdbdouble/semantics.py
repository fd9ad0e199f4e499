"""What libfdb_c decides, as tables and one function, for the double (tests/support/fdbdouble).

Error descriptions and predicates (``fdb_get_error``, ``fdb_error_predicate`` of
``bindings/c/fdb_c.cpp``), which options change nothing the sim store models, atomic op
codes, and one batch of ``fdb_transaction_get_range`` (``validate_and_update_parameters``
of ``bindings/c/fdb_c.cpp``, ``GetRangeLimits`` of ``fdbclient/NativeAPI.actor.cpp``).
"""

from __future__ import annotations

import struct
from typing import Any

from fdbqueue.engines.contract import KeySelector
from fdbqueue.errors import MAYBE_COMMITTED, RETRYABLE_NOT_COMMITTED, EngineError

# fdb.options ErrorPredicate codes (fdbclient/vexillographer/fdb.options).
_PRED_RETRYABLE, _PRED_MAYBE_COMMITTED, _PRED_RETRYABLE_NOT_COMMITTED = 50000, 50001, 50002
# FDBStreamingMode and validate_and_update_parameters (bindings/c/fdb_c.cpp).
_WANT_ALL, _ITERATOR, _EXACT, _SERIAL = -2, -1, 0, 4
_UNLIMITED = 1 << 62
_MODE_BYTES = (_UNLIMITED, 256, 1000, 4096, 120000)
_ITERATION_BYTES = (4096, 6144, 9216, 13824, 20736, 31104, 46656, 69984, 80000, 120000)
# FDBConflictRangeType
CONFLICT_READ, CONFLICT_WRITE = 0, 1

# Descriptions as fdb_get_error gives them (documentation/sphinx/source/api-error-codes.rst).
DESCRIPTIONS = {
    0: "Success",
    1007: "Transaction is too old to perform reads or be committed",
    1020: "Transaction not committed due to conflict with another transaction",
    1021: "Transaction may or may not have committed",
    1025: "Operation aborted because the transaction was cancelled",
    1031: "Operation aborted because the transaction timed out",
    1032: "Too many watches currently set",
    1036: "Read or wrote an unreadable key",
    1039: "The cluster has been upgraded to a new protocol version",
    1101: "Asynchronous operation cancelled",
    2004: "Key outside legal range",
    2005: "Range begin key larger than end key",
    2006: "Option set with an invalid value",
    2017: "Operation issued while a commit was outstanding",
    2020: "Transaction does not have a valid commit version",
    2021: "Transaction is read-only and therefore does not have a commit version",
    2101: "Transaction exceeds byte limit",
    2102: "Key length exceeds limit",
    2103: "Value length exceeds limit",
    2108: "Operation is not supported",
    2203: "API version not valid",
    2210: "EXACT streaming mode requires limits, but none were given",
    4100: "An internal error occurred",
}


def error_predicate(predicate: int, code: int) -> int:
    """``fdb_error_predicate`` of ``bindings/c/fdb_c.cpp``."""
    if predicate == _PRED_RETRYABLE:
        return int(code in MAYBE_COMMITTED or code in RETRYABLE_NOT_COMMITTED)
    if predicate == _PRED_MAYBE_COMMITTED:
        return int(code in MAYBE_COMMITTED)
    if predicate == _PRED_RETRYABLE_NOT_COMMITTED:
        return int(code in RETRYABLE_NOT_COMMITTED)
    return 0


# Transaction options that change nothing the sim models (priorities, tags, tracing, logging).
NEUTRAL_OPTIONS = frozenset(
    {
        "causal_write_risky",
        "causal_read_risky",
        "causal_read_disable",
        "include_port_in_address",
        "priority_system_immediate",
        "priority_batch",
        "debug_retry_logging",
        "transaction_logging_enable",
        "debug_transaction_identifier",
        "log_transaction",
        "transaction_logging_max_field_length",
        "server_request_tracing",
        "tag",
        "auto_throttle_tag",
        "span_parent",
        "read_priority_normal",
        "read_priority_low",
        "read_priority_high",
        "read_server_side_cache_enable",
        "read_server_side_cache_disable",
        "report_conflicting_keys",
    }
)


NEUTRAL_DATABASE_OPTIONS = frozenset(
    {
        "location_cache_size",
        "max_watches",
        "machine_id",
        "datacenter_id",
        "transaction_logging_max_field_length",
        "transaction_causal_read_risky",
        "transaction_include_port_in_address",
        "transaction_report_conflicting_keys",
        "test_causal_read_risky",
    }
)


def int_param(value: Any) -> int:
    if not isinstance(value, bytes) or len(value) != 8:
        raise EngineError(2006, "an int option takes 8 bytes")
    (n,) = struct.unpack("<q", value)
    return int(n)


def mutation_ops(table: dict[str, Any]) -> dict[int, str]:
    """fdb.options MutationType codes -> the contract's atomic op names (API >= 510: V2 semantics)."""
    names = {
        "add": "add",
        "and": "bit_and",
        "bit_and": "bit_and",
        "and_v2": "bit_and",
        "or": "bit_or",
        "bit_or": "bit_or",
        "xor": "bit_xor",
        "bit_xor": "bit_xor",
        "max": "max",
        "min": "min",
        "min_v2": "min",
        "byte_min": "byte_min",
        "byte_max": "byte_max",
        "append_if_fits": "append_if_fits",
        "compare_and_clear": "compare_and_clear",
        "set_versionstamped_key": "set_versionstamped_key",
        "set_versionstamped_value": "set_versionstamped_value",
    }
    return {v[0]: names[k.lower()] for k, v in table.items() if k.lower() in names}


def range_batch(
    tr: Any,
    begin: KeySelector,
    end: KeySelector,
    limit: int,
    target_bytes: int,
    mode: int,
    iteration: int,
    snapshot: bool,
    reverse: bool,
) -> tuple[list[tuple[bytes, bytes]], bool]:
    """One batch of ``fdb_transaction_get_range``: (rows, more)."""
    rows_limit = limit if limit > 0 else _UNLIMITED
    byte_limit = target_bytes if target_bytes > 0 else _UNLIMITED
    if rows_limit == _UNLIMITED and byte_limit == _UNLIMITED and mode == _EXACT:
        raise EngineError(2210, "exact_mode_without_limits")
    if mode == _WANT_ALL:
        mode = _SERIAL
    if mode == _ITERATOR:
        if iteration <= 0:
            raise EngineError(2000, "client_invalid_operation")
        mode_bytes = _ITERATION_BYTES[min(iteration, len(_ITERATION_BYTES)) - 1]
    elif 0 <= mode <= _SERIAL:
        mode_bytes = _MODE_BYTES[mode]
    else:
        raise EngineError(2000, "client_invalid_operation")
    byte_limit = mode_bytes if byte_limit == _UNLIMITED else min(byte_limit, mode_bytes)
    if byte_limit == _UNLIMITED:
        rows = (
            tr.snapshot.get_range(begin, end, 0 if rows_limit == _UNLIMITED else rows_limit, reverse)
            if (snapshot)
            else tr.get_range(begin, end, 0 if rows_limit == _UNLIMITED else rows_limit, reverse)
        )
        return [(kv.key, kv.value) for kv in rows], len(rows) == rows_limit
    # Every row costs at least 8 bytes (GetRangeLimits::decrement): no more can fit.
    probe_limit = min(rows_limit, byte_limit // 8 + 1) + 1
    probe = tr.snapshot.get_range(begin, end, probe_limit, reverse)
    n, used = 0, 0
    for kv in probe:
        if n >= rows_limit or (n >= 1 and used >= byte_limit):
            break
        n += 1
        used += 8 + len(kv.key) + len(kv.value)
    more = len(probe) > n
    if snapshot:
        rows = probe[:n]
    else:
        # The serializable read of exactly this batch: its read conflict range ends after
        # the last row returned when there is more, at the range's end otherwise.
        rows = tr.get_range(
            begin, end, n if more else (0 if rows_limit == _UNLIMITED else rows_limit), reverse
        )
    return [(kv.key, kv.value) for kv in rows], more
