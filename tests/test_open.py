"""fdbqueue.open(): URL parsing, defaults and clear errors for bad URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.engines import parse_url


def test_parse_paths() -> None:
    assert parse_url("sqlite:///var/lib/app/q.db").path == "/var/lib/app/q.db"
    assert parse_url("sqlite://q.db").path == "q.db"
    assert parse_url("sqlite:///q.db?sync=normal").params == {"sync": "normal"}
    assert parse_url("fdb://").path == ""
    assert parse_url("fdb:///etc/foundationdb/fdb.cluster").path == "/etc/foundationdb/fdb.cluster"
    assert parse_url("sim://?seed=7&faults=0.05").params == {"seed": "7", "faults": "0.05"}


@pytest.mark.parametrize(
    "url",
    [
        "",
        "queues.db",
        "postgres://localhost/db",
        "sqlite://",
        "sqlite:///tmp/x.db?sync=sometimes",
        "sqlite:///tmp/x.db?colour=blue",
        "sim://?seed=abc",
        "sim://?faults=2",
        "sim://?seed=1&seed=2",
        "memory://?faults=0.1",
        "fdb://?api_version=banana",
    ],
)
def test_bad_urls_are_clear_errors(url: str) -> None:
    with pytest.raises(fdbqueue.InvalidURLError) as err:
        fdbqueue.open(url)
    assert str(err.value)  # a message, not an empty error
    assert isinstance(err.value, fdbqueue.QueueError)


def test_default_url_is_env_then_local_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FDBQUEUE_URL", raising=False)
    db = fdbqueue.open()
    try:
        assert db.engine == "sqlite"
        db.set(b"k", b"v")  # type: ignore[attr-defined]
    finally:
        db.close()
    assert (tmp_path / "fdbqueue.db").exists()
    monkeypatch.setenv("FDBQUEUE_URL", "memory://")
    db = fdbqueue.open()
    assert db.engine == "memory"
    db.close()


def test_sqlite_creates_parent_directories(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "q.db"
    db = fdbqueue.open(f"sqlite://{target}")
    db.set(b"k", b"v")  # type: ignore[attr-defined]
    db.close()
    assert target.exists()
    again = fdbqueue.open(f"sqlite://{target}")
    assert again.get(b"k") == b"v"  # type: ignore[attr-defined]
    again.close()
