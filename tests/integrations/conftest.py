"""Fixtures the command-line tests share: a store's URL, the store, and the CLI run in-process."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.cli import main

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("FDBQUEUE_URL", raising=False)
    return f"sqlite://{tmp_path / 'q.db'}?sync=normal"


@pytest.fixture
def db(url: str) -> Iterator[fdbqueue.Database]:
    database = fdbqueue.open(url)
    yield database
    database.close()


@pytest.fixture
def run(url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """``run(*argv, stdin=None)`` -> (exit code, stdout, stderr), in this process."""

    def call(*argv: str, stdin: bytes | None = None) -> tuple[int, str, str]:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        code = main(["--url", url, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return call
