"""Running a function in a transaction: :func:`transactional` (the decorator every operation
of the layer comes through: joined to the caller's transaction, or in its own retried one) and
:func:`run_transaction` (a body in a fresh, retried transaction).

Apart from :mod:`.contract`, which holds what they run on (the protocols, the retry loop
:func:`~.contract.retry_loop`, and which objects are an engine's transactions and databases:
:func:`~.contract.adopt`, :func:`~.contract.is_transaction`): this is the calling convention
built on them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import GeneratorType
from typing import Any, TypeVar

from fdbqueue.engines.contract import (
    Again,
    Attempt,
    Database,
    Done,
    Transaction,
    _adopted,
    _own_database,
    _transaction_kinds,
    adopt,
    is_transaction,
    retry_loop,
)
from fdbqueue.errors import EngineError, QueueError

T = TypeVar("T")


def run_transaction(db: Database, body: Callable[[Transaction], T]) -> T:
    """Run ``body(tr)`` in a fresh transaction on ``db``, retrying retryable errors.

    The loop of ``@fdb.transactional`` (:func:`retry`): commit, and on error ``on_error``
    (which backs off, or re-raises what is not retryable). A body may therefore run more than
    once. A raw ``fdb.Database`` of the bindings is wrapped (see :func:`adopt`).
    """

    return retry_loop(_own_database(db, "run_transaction"), _body_step(body), None, False)


def _body_step(body: Callable[[Transaction], T]) -> Callable[[Transaction, Attempt], T]:
    """``body`` as a step of :func:`retry_loop` (a generator returned is refused)."""

    def step(tr: Transaction, attempt: Attempt) -> T:
        result = body(tr)
        if inspect.isgenerator(result):
            raise ValueError("a transactional function must not return a generator")
        return result

    return step


F = TypeVar("F", bound=Callable[..., Any])


def _step(
    func: Callable[..., Any], index: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[..., Any]:
    """``func``'s call with ``tr`` in place of the transaction or database it was given: a
    joined call, or (``attempt`` given) the retry loop's step, which refuses a generator."""
    if "tr" in kwargs:

        def call(tr: Any, attempt: Attempt | None = None) -> Any:
            result = func(*args, **{**kwargs, "tr": tr})
            if attempt is not None and type(result) is GeneratorType:
                raise ValueError("a transactional function must not return a generator")
            return result

        return call

    def call_at(tr: Any, attempt: Attempt | None = None) -> Any:
        result = func(*args[:index], tr, *args[index + 1 :], **kwargs)
        if attempt is not None and type(result) is GeneratorType:
            raise ValueError("a transactional function must not return a generator")
        return result

    return call_at


def _call_loop(
    db: Database,
    func: Callable[..., Any],
    before: tuple[Any, ...],
    after: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """:func:`retry_loop` running ``func(*before, tr, *after, **kwargs)`` as its step with no
    ``on_error`` hook and no unknown outcome to report (``transactional``'s call on a
    Database, the common one): the same commits, resets and retries, without the step's
    closure, its frame and the :class:`Attempt` that nothing here reads. A returned
    :class:`Done` or :class:`Again` is taken as :func:`retry_loop` takes it; a generator is
    refused as :func:`_step`'s step refuses it."""
    tr = db.create_transaction()
    try:
        while True:
            try:
                result = func(*before, tr, *after, **kwargs)
                kind = type(result)
                if kind is GeneratorType:
                    raise ValueError("a transactional function must not return a generator")
                if kind is Done:
                    tr.cancel()
                    return result.value
                tr.commit()
                if kind is Again:
                    if result.then is not None:
                        result.then()
                    tr.reset()
                    continue
                return result
            except EngineError as exc:
                tr.on_error(exc)  # backs off, or raises what is not retryable (retry_loop's, unhooked)
    except BaseException:
        tr.cancel()
        raise


def transactional(func: F) -> F:
    """Run ``func`` inside a transaction: the argument ``tr`` (by position or keyword).

    Given a Transaction, ``func`` joins it and the caller commits. Given a Database,
    ``func`` runs in its own transaction, committed and retried on retryable errors
    (so it may run more than once: keep it idempotent). Generator functions are refused.
    Raw ``fdb.Database`` / ``fdb.Transaction`` objects of the bindings are wrapped (:func:`adopt`).
    """
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise ValueError("generator functions cannot be transactional: the body may run twice")
    params = list(inspect.signature(func).parameters)
    if "tr" not in params:
        raise ValueError(f"{func.__qualname__} needs a parameter named 'tr'")
    index = params.index("tr")

    # Every operation of the layer comes through here. A joined call (``tr`` a transaction of
    # a kind already known: :func:`adopt`, :func:`is_transaction`, looked up inline) calls
    # ``func`` with the arguments as given; otherwise :func:`_step` makes the call with the
    # adopted ``tr`` in its place, which is both the joined call and the retry loop's step
    # (``attempt`` given: :func:`_body_step`'s, with its generator check). The closure is made
    # only there: a wrapper that held it would make its cells at every call.
    # (GeneratorType cannot be subclassed: ``type() is`` is isinstance.)
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "tr" in kwargs:
            target = kwargs["tr"]
        elif index < len(args):
            target = args[index]
        else:
            raise TypeError(f"{func.__qualname__}() missing the transaction or database 'tr'")
        kind = type(target)
        if kind in _adopted:
            own = target
        else:
            try:
                own = adopt(target)
            except QueueError as exc:
                raise QueueError(f"{func.__qualname__}(), as 'tr': {exc}") from None
            kind = type(own)
        joined = _transaction_kinds.get(kind)
        if joined is None:
            joined = is_transaction(own)
        if joined:
            if own is target:
                return func(*args, **kwargs)  # _step's call, with the same tr
            return _step(func, index, args, kwargs)(own)
        if "tr" in kwargs:  # run_transaction's loop on the database adopted and checked here
            return retry_loop(own, _step(func, index, args, kwargs), None, False)
        return _call_loop(own, func, args[:index], args[index + 1 :], kwargs)

    return wrapper  # type: ignore[return-value]
