"""Find a reachable FoundationDB cluster for the tests, or skip saying exactly what is missing.

:func:`find_cluster` returns the path of a cluster file whose cluster answered a read:

1. ``$FDB_CLUSTER_FILE`` when set: the file must exist and its cluster must answer;
2. otherwise, when the FoundationDB client library (libfdb_c) loads and a Docker engine
   answers, a throwaway server started with testcontainers (once per test session,
   removed at exit) from ``foundationdb/foundationdb`` at the client library's own
   version (``$FDBQUEUE_FDB_IMAGE`` overrides the image);
3. otherwise ``pytest.skip`` with the reason.

The decision is made once per session and cached. :func:`cluster_or_none` asks the same
without skipping: the conformance tests then run over the C-API double (tests/support/fdbdouble/).
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fdbqueue.errors import QueueError

SKIP = "FoundationDB tests skipped: "
IMAGE_ENV = "FDBQUEUE_FDB_IMAGE"
PROBE_TIMEOUT_S = 10

# Runs in a child process, so that a missing or broken libfdb_c cannot disturb the test process.
_LIBRARY_PROBE = r"""
import ctypes, sys
import fdb
from fdbqueue.engines.fdb import DEFAULT_API_VERSION
try:
    fdb.api_version(DEFAULT_API_VERSION)
except Exception as exc:
    print(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    sys.exit(1)
version = ""
try:
    import fdb.impl
    get = fdb.impl._capi.fdb_get_client_version
    get.restype = ctypes.c_char_p
    version = get().decode().split(",")[0]
except Exception:
    pass
print(version or "unknown version")
"""


@dataclass(frozen=True)
class ClientLibrary:
    """Whether libfdb_c loads here; ``detail`` is its version or why it does not load."""

    loadable: bool
    detail: str


_library: ClientLibrary | None = None
_cluster_file: str | None = None
_skip_reason: str | None = None
_container: Any = None


def client_library() -> ClientLibrary:
    """Whether ``fdb.api_version()`` can load libfdb_c on this machine (checked once)."""
    global _library
    if _library is None:
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _LIBRARY_PROBE], capture_output=True, text=True, timeout=60
            )
            lines = (proc.stdout.strip() or proc.stderr.strip() or "no output").splitlines()
            _library = ClientLibrary(proc.returncode == 0, lines[-1])
        except (OSError, subprocess.SubprocessError) as exc:
            _library = ClientLibrary(False, f"cannot run the probe: {exc}")
    return _library


def find_cluster() -> str:
    """The path of a reachable cluster's cluster file, or ``pytest.skip(reason)``."""
    global _cluster_file, _skip_reason
    if _cluster_file is None and _skip_reason is None:
        try:
            _cluster_file = _find()
        except _Unavailable as exc:
            _skip_reason = SKIP + str(exc)
    if _skip_reason is not None:
        pytest.skip(_skip_reason)
    assert _cluster_file is not None
    return _cluster_file


def cluster_or_none() -> str | None:
    """The path of a reachable cluster's cluster file, or None (the reason is kept for
    :func:`find_cluster`): the conformance tests then run over the C-API double."""
    global _cluster_file, _skip_reason
    if _cluster_file is None and _skip_reason is None:
        try:
            _cluster_file = _find()
        except _Unavailable as exc:
            _skip_reason = SKIP + str(exc)
    return _cluster_file


class _Unavailable(Exception):
    pass


def _find() -> str:
    env = os.environ.get("FDB_CLUSTER_FILE")
    library = client_library()
    if env:
        path = os.path.abspath(env)
        if not os.path.isfile(path):
            raise _Unavailable(f"FDB_CLUSTER_FILE={env} does not exist")
        if not library.loadable:
            raise _Unavailable(
                f"FDB_CLUSTER_FILE={env} is set, but no libfdb_c client library loads on this "
                f"machine ({library.detail}); install foundationdb-clients"
            )
        _check_reachable(path)
        return path
    if not library.loadable:
        raise _Unavailable(
            "no libfdb_c client library on this machine (install foundationdb-clients) "
            "and FDB_CLUSTER_FILE is not set"
        )
    return _start_container(library)


def _check_reachable(path: str) -> None:
    import fdbqueue

    try:
        fdbqueue.open(f"fdb://{path}?timeout={PROBE_TIMEOUT_S}").close()
    except QueueError as exc:
        raise _Unavailable(str(exc)) from exc


def _docker_problem() -> str | None:
    try:
        import docker  # type: ignore[import-untyped]
        import testcontainers.core.container  # noqa: F401
    except ImportError as exc:
        return f"testcontainers is not installed ({exc})"
    try:
        docker.from_env().ping()
    except Exception as exc:
        return f"no working Docker engine ({type(exc).__name__}: {str(exc)[:160]})"
    return None


def _image_for(library: ClientLibrary) -> str:
    # The server must speak the client library's protocol: use the same release.
    if os.environ.get(IMAGE_ENV):
        return os.environ[IMAGE_ENV]
    if library.detail[:1].isdigit():
        return f"foundationdb/foundationdb:{library.detail}"
    return "foundationdb/foundationdb:7.3.77"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_container(library: ClientLibrary) -> str:
    global _container
    problem = _docker_problem()
    if problem:
        raise _Unavailable(
            f"libfdb_c {library.detail} is installed but FDB_CLUSTER_FILE is not set and a "
            f"FoundationDB container cannot be started: {problem}"
        )
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    image = _image_for(library)
    port = _free_port()
    # Host mode advertises 127.0.0.1:port; the server listens on 0.0.0.0, so binding the
    # same port on both sides lets the host reach it at the advertised address.
    container = (
        DockerContainer(image)
        .with_env("FDB_NETWORKING_MODE", "host")
        .with_env("FDB_PORT", str(port))
        .with_bind_ports(port, port)
        .waiting_for(LogMessageWaitStrategy("Starting FDB server"))
    )
    try:
        container.start()
    except Exception as exc:
        raise _Unavailable(
            f"cannot start {image} ({type(exc).__name__}: {str(exc)[:200]}); set {IMAGE_ENV} "
            "to a foundationdb/foundationdb tag matching the client library"
        ) from exc
    _container = container
    atexit.register(_stop_container)
    _configure(container, image)
    directory = Path(tempfile.mkdtemp(prefix="fdbqueue-fdb-"))
    cluster_file = directory / "fdb.cluster"
    cluster_file.write_text(f"docker:docker@127.0.0.1:{port}\n")
    # A new database takes a few seconds to recruit its roles: probe until it answers.
    deadline = time.monotonic() + 60
    while True:
        try:
            _check_reachable(str(cluster_file))
            return str(cluster_file)
        except _Unavailable:
            if time.monotonic() > deadline:
                raise


def _configure(container: Any, image: str) -> None:
    """Create the database (single replica, memory engine); idempotent."""
    deadline = time.monotonic() + 60
    output = ""
    while time.monotonic() < deadline:
        result = container.exec(["fdbcli", "--exec", "configure new single memory", "--timeout", "20"])
        output = (result.output or b"").decode(errors="replace")
        if result.exit_code == 0 or "already exists" in output:
            return
        time.sleep(1)
    raise _Unavailable(f"{image} started but 'configure new single memory' failed: {output.strip()[:300]}")


def _stop_container() -> None:
    global _container
    if _container is not None:
        try:
            _container.stop()
        finally:
            _container = None
