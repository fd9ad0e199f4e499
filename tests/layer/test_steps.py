"""fdbqueue.ops.steps: a blocking operation written once, taken by the thread driver and by asyncio's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import fdbqueue.aio.queue as aio
from fdbqueue.engines.local.watches import EventWatch
from fdbqueue.ops.steps import Emit, Run, Steps, Wait, drive, iterate


def _fail() -> None:
    raise ValueError("from the call")


def _steps(log: list[str]) -> Steps[str]:
    """Calls, a handled error, a wait on a fired and on a silent watch, then a result."""
    try:
        got = yield Run(lambda: 20 + 1)
        log.append(f"sent {got}")
        try:
            yield Run(_fail)
        except ValueError as exc:  # what the call raised, thrown in where it was asked
            log.append(f"caught {exc}")
        fired = EventWatch(b"k", None)
        fired.fire()
        log.append(f"fired {(yield Wait([fired], 5.0))}")
        log.append(f"silent {(yield Wait([EventWatch(b'k', None)], 0.01))}")
        return "done"
    finally:
        log.append("cleaned up")


def _sync(steps: Steps[Any]) -> Any:
    return drive(steps)


def _async(steps: Steps[Any]) -> Any:
    return asyncio.run(aio.drive(steps))


DRIVERS: list[Callable[[Steps[Any]], Any]] = [_sync, _async]


@pytest.mark.parametrize("take", DRIVERS, ids=["threads", "asyncio"])
def test_both_drivers_take_the_same_steps_alike(take: Callable[[Steps[Any]], Any]) -> None:
    log: list[str] = []
    assert take(_steps(log)) == "done"
    assert log == ["sent 21", "caught from the call", "fired True", "silent False", "cleaned up"]


@pytest.mark.parametrize("take", DRIVERS, ids=["threads", "asyncio"])
def test_an_error_the_steps_do_not_handle_reaches_the_caller_after_their_clean_up(
    take: Callable[[Steps[Any]], Any],
) -> None:
    log: list[str] = []

    def steps() -> Steps[None]:
        try:
            yield Run(_fail)
        finally:
            log.append("cleaned up")

    with pytest.raises(ValueError, match="from the call"):
        take(steps())
    assert log == ["cleaned up"]


@pytest.mark.parametrize("take", DRIVERS, ids=["threads", "asyncio"])
def test_drive_refuses_steps_that_emit(take: Callable[[Steps[Any]], Any]) -> None:
    def steps() -> Steps[None]:
        yield Emit(1)

    with pytest.raises(TypeError, match="use iterate"):
        take(steps())


def _emitting(log: list[str]) -> Steps[None]:
    try:
        for i in range(5):
            got = yield Run(lambda i=i: i * 10)
            yield Emit(got)
    finally:
        log.append("cleaned up")


def test_iterate_yields_what_the_steps_emit_and_cleans_up_when_stopped_early() -> None:
    log: list[str] = []
    assert list(iterate(_emitting(log))) == [0, 10, 20, 30, 40]
    assert log == ["cleaned up"]
    taking = iterate(_emitting(log))
    assert [next(taking), next(taking)] == [0, 10]
    taking.close()
    assert log == ["cleaned up", "cleaned up"]


def test_aio_iterate_yields_what_the_steps_emit_and_cleans_up_when_stopped_early() -> None:
    log: list[str] = []

    async def main() -> list[Any]:
        every = [v async for v in aio.iterate(_emitting(log))]
        taking = aio.iterate(_emitting(log))
        first = [await taking.__anext__(), await taking.__anext__()]
        await taking.aclose()
        return [every, first]

    assert asyncio.run(main()) == [[0, 10, 20, 30, 40], [0, 10]]
    assert log == ["cleaned up", "cleaned up"]
