"""fdbqueue.open(): URL parsing, defaults and clear errors for bad URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.engines.url import parse_url


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


def test_sqlite_refuses_a_missing_directory(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "q.db"
    with pytest.raises(fdbqueue.StoreError) as err:
        fdbqueue.open(f"sqlite://{target}")
    assert f"the directory {tmp_path / 'a' / 'b'} does not exist" in str(err.value)
    assert "mkdir -p" in str(err.value)
    assert not (tmp_path / "a").exists()  # nothing created on the way
    (tmp_path / "a" / "b").mkdir(parents=True)
    db = fdbqueue.open(f"sqlite://{target}")
    db.set(b"k", b"v")  # type: ignore[attr-defined]
    db.close()
    again = fdbqueue.open(f"sqlite://{target}")
    assert again.get(b"k") == b"v"  # type: ignore[attr-defined]
    again.close()


def test_sqlite_expands_the_home_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    db = fdbqueue.open("sqlite://~/q.db")
    try:
        assert db.path == str(home / "q.db")  # type: ignore[attr-defined]
        db.set(b"k", b"v")  # type: ignore[attr-defined]
    finally:
        db.close()
    assert (home / "q.db").exists()
    assert not (tmp_path / "~").exists()  # no folder named "~"
