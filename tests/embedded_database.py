"""The test session's PostgreSQL when DATABASE_URL is not set: an embedded server of its own
(broker/embedded_postgres.py) in a temporary directory, fast (no fsync), stopped and deleted when
the test process exits. tests/settings.py starts it, before Django reads its settings."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from broker.embedded_postgres import EmbeddedPostgres

PREFIX = "broker-test-postgres-"  # then the test process's PID: whose server it is


def start_session_server() -> str:
    """A new server for this test process; returns its URL."""
    sweep_servers_of_dead_sessions()
    directory = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    server = EmbeddedPostgres(directory, durable=False, password=False)
    url = server.start()
    atexit.register(stop_and_delete, server, directory)
    return url


def stop_and_delete(server: EmbeddedPostgres, directory: Path) -> None:
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)


def sweep_servers_of_dead_sessions() -> None:
    """A session killed (kill -9, a CI timeout) leaves its server running and its directory: both
    go at the next session's start, so that a killed run costs one server until then."""
    for directory in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        pid = int(directory.name.removeprefix(PREFIX).split("-")[0])
        if not _is_running(pid):
            with contextlib.suppress(OSError):
                EmbeddedPostgres(directory, durable=False, password=False).stop()
            shutil.rmtree(directory, ignore_errors=True)


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def delete_embedded_server(directory: Path) -> None:
    """After a test of a broker run in `directory`: the embedded server it left (killed, or the
    test failed first) stopped, and its cluster deleted, with what the link points to when it was
    placed out of `directory` (as root, broker/embedded_postgres.py)."""
    if not (directory.exists() or directory.is_symlink()):
        return
    cluster = directory.resolve()
    with contextlib.suppress(OSError):
        EmbeddedPostgres(directory).stop()
    shutil.rmtree(cluster, ignore_errors=True)
    if directory.is_symlink():
        directory.unlink()
