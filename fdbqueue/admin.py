"""The queue manager: create, destroy, list queues; settings; stop and start each direction."""

from __future__ import annotations

from typing import Any

from fdbqueue.config import (
    QueueConfig,
    QueueNotFoundError,
    QueueState,
    read_config,
    read_state,
    write_config,
)
from fdbqueue.engines.base import Database, Transaction
from fdbqueue.layout import DEFAULT_ROOT, QueueKeys, pack_count, queues_range, root_subspace
from fdbqueue.queue import run_once


def create_queue(
    tr: Transaction | Database,
    name: str,
    *,
    root: tuple[Any, ...] = DEFAULT_ROOT,
    exist_ok: bool = True,
    **settings: Any,
) -> QueueConfig:
    """Create queue ``name`` with ``settings`` (see :class:`QueueConfig`), or update its settings.

    Atomic; composes inside the caller's transaction. Unknown setting names are an error.
    """
    keys = QueueKeys.make(name, root)
    unknown = set(settings) - set(QueueConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown queue setting(s): {', '.join(sorted(unknown))}")

    def body(t: Transaction, _: bool) -> QueueConfig:
        current = read_config(t, keys)
        if current is not None and not exist_ok:
            from fdbqueue.errors import QueueError

            raise QueueError(f"queue {name!r} already exists")
        cfg = (current or QueueConfig()).replace(**settings)
        write_config(t, keys, cfg)
        return cfg

    return run_once(tr, body)


def queue_config(tr: Transaction | Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> QueueConfig:
    """The settings of queue ``name``; QueueNotFoundError when it does not exist."""
    keys = QueueKeys.make(name, root)

    def body(t: Transaction, _: bool) -> QueueConfig:
        cfg = read_config(t, keys)
        if cfg is None:
            raise QueueNotFoundError(f"no queue named {name!r}")
        return cfg

    return run_once(tr, body)


def destroy_queue(tr: Transaction | Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> None:
    """Remove queue ``name`` and every key it has (messages, indexes, counters, settings)."""
    keys = QueueKeys.make(name, root)

    def body(t: Transaction, _: bool) -> None:
        if read_config(t, keys) is None:
            raise QueueNotFoundError(f"no queue named {name!r}")
        t.clear_range(*keys.all_range())
        t.clear(keys.listing)

    run_once(tr, body)


def list_queues(tr: Transaction | Database, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> list[str]:
    """Names of every queue under ``root``, sorted."""
    sub = root_subspace(root)

    def body(t: Transaction, _: bool) -> list[str]:
        return [str(sub.unpack(kv.key)[1]) for kv in t.get_range(*queues_range(root))]

    return run_once(tr, body)


def set_state(
    tr: Transaction | Database,
    name: str,
    *,
    enqueue: bool | None = None,
    dequeue: bool | None = None,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> QueueState:
    """Enable or disable enqueue and dequeue independently (None leaves a direction as it is)."""
    keys = QueueKeys.make(name, root)

    def body(t: Transaction, _: bool) -> QueueState:
        if read_config(t, keys) is None:
            raise QueueNotFoundError(f"no queue named {name!r}")
        st = read_state(t, keys)
        new = QueueState(
            enqueue=st.enqueue if enqueue is None else bool(enqueue),
            dequeue=st.dequeue if dequeue is None else bool(dequeue),
        )
        t.set(keys.state, new.encode())
        if new.dequeue and not st.dequeue:
            t.add(keys.wake, pack_count(1))  # wake blocked dequeuers: they may proceed now
        return new

    return run_once(tr, body)


def stop_queue(tr: Transaction | Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> QueueState:
    """Disable both directions."""
    return set_state(tr, name, enqueue=False, dequeue=False, root=root)


def start_queue(tr: Transaction | Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> QueueState:
    """Enable both directions."""
    return set_state(tr, name, enqueue=True, dequeue=True, root=root)
