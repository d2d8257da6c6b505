"""A private PostgreSQL primary and its streaming replica, for the tests of the read replica.

Both are clusters of their own: `initdb` into a temporary directory, servers on free loopback
ports, stopped and deleted afterwards, failure or not. The machine's own server (the tests'
database on 5432) is never touched. initdb and postgres refuse to run as root, so when the tests
run as root the clusters belong to the `postgres` user.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.processes import free_port
from tests.tools import require_tool

SERVER_USER = "postgres"  # the OS user that owns the clusters when the tests run as root
STARTUP_SECONDS = 120  # a loaded machine can be slow to start a server
# Small servers: they hold a test's few rows; fsync off as nothing here needs to survive a crash.
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "shared_buffers": "'16MB'",
    "max_connections": "40",
    "fsync": "off",
    "wal_level": "replica",
    "max_wal_senders": "4",
    "hot_standby": "on",
}


@dataclass
class Server:
    """One server of the pair: its data directory, port and log (its standard error)."""

    bin: Path
    data: Path
    port: int
    log: Path

    def url(self, database: str, **options: str) -> str:
        url = f"postgres://postgres@127.0.0.1:{self.port}/{database}"
        return f"{url}?{urllib.parse.urlencode(options)}" if options else url

    def query(self, sql: str, parameters: tuple[Any, ...] = (), database: str = "postgres") -> Any:
        """The first column of the first row of `sql` (None without rows), run in a connection
        of its own."""
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=database, autocommit=True
        ) as connection:
            cursor = connection.execute(sql, parameters)
            row = cursor.fetchone() if cursor.description else None
        return None if row is None else row[0]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def start(self) -> None:
        _run(
            self.bin / "pg_ctl", "start", "--wait", f"--timeout={STARTUP_SECONDS}",
            f"--pgdata={self.data}", f"--log={self.log}",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        _run(self.bin / "pg_ctl", "stop", "--wait", f"--pgdata={self.data}", f"--mode={mode}")

    def is_running(self) -> bool:
        return (self.data / "postmaster.pid").exists()


@contextlib.contextmanager
def primary_and_replica(replica_settings: dict[str, str]) -> Iterator[tuple[Server, Server]]:
    """A started primary, and a hot standby streaming from it with `replica_settings` on top
    of its own; both stopped and their directory deleted afterwards."""
    # The directory of initdb, pg_ctl and pg_basebackup; without them the test skips.
    bin_dir = require_tool("postgresql-server")
    root = Path(tempfile.mkdtemp(prefix="broker-pg-"))
    _give_to_server_user(root)
    servers: list[Server] = []
    try:
        primary = Server(bin_dir, root / "primary", free_port(), root / "primary.log")
        _run(bin_dir / "initdb", "--auth=trust", "--username=postgres", "--no-sync",
             "--encoding=UTF8", "--no-locale", f"--pgdata={primary.data}")  # fmt: skip
        _configure(primary, root, SETTINGS)
        servers.append(primary)
        primary.start()
        replica = Server(bin_dir, root / "replica", free_port(), root / "replica.log")
        # -R: standby.signal and primary_conninfo, so that it starts as a streaming standby.
        _run(bin_dir / "pg_basebackup", "--host=127.0.0.1", f"--port={primary.port}",
             "--username=postgres", f"--pgdata={replica.data}", "--write-recovery-conf",
             "--wal-method=stream", "--checkpoint=fast", "--no-sync")  # fmt: skip
        _configure(replica, root, replica_settings)
        servers.append(replica)
        replica.start()
        yield primary, replica
    finally:
        for server in reversed(servers):
            if server.is_running():
                with contextlib.suppress(subprocess.SubprocessError):
                    server.stop(mode="immediate")
        shutil.rmtree(root, ignore_errors=True)


def wait_for_replay(primary: Server, replica: Server, seconds: float = 60) -> None:
    """Until the replica has replayed everything the primary has written so far."""
    target = primary.query("SELECT pg_current_wal_lsn()")
    _wait(
        lambda: replica.query("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)), seconds
    )


def pause_replay(replica: Server, seconds: float = 60) -> None:
    """Stop the replica replaying the primary's changes; returns once replay has stopped."""
    replica.query("SELECT pg_wal_replay_pause()")
    _wait(lambda: replica.query("SELECT pg_get_wal_replay_pause_state()") == "paused", seconds)


def resume_replay(primary: Server, replica: Server) -> None:
    replica.query("SELECT pg_wal_replay_resume()")
    wait_for_replay(primary, replica)


def _configure(server: Server, root: Path, settings: dict[str, str]) -> None:
    # Appended lines win over earlier ones (the replica's copy of the primary's file).
    lines = {**settings, "port": str(server.port), "unix_socket_directories": f"'{root}'"}
    with (server.data / "postgresql.conf").open("a") as conf:
        conf.writelines(f"{name} = {value}\n" for name, value in lines.items())


def _wait(condition: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s"
        time.sleep(0.05)


def _running_as_root() -> bool:
    return os.geteuid() == 0


def _give_to_server_user(directory: Path) -> None:
    if _running_as_root():
        shutil.chown(directory, SERVER_USER, SERVER_USER)


def _run(*command: str | Path) -> None:
    """A PostgreSQL program, as the server user when the tests run as root."""
    as_user: dict[str, Any] = {}
    if _running_as_root():
        as_user = {"user": SERVER_USER, "group": SERVER_USER, "extra_groups": []}
    result = subprocess.run(
        [str(part) for part in command],
        cwd=tempfile.gettempdir(),  # somewhere the server user may be
        env={"PATH": os.environ.get("PATH", ""), "HOME": tempfile.gettempdir(), "LC_ALL": "C"},
        capture_output=True,
        text=True,
        timeout=STARTUP_SECONDS + 30,
        check=False,
        **as_user,
    )
    if result.returncode != 0:
        raise AssertionError(f"{command[0]} failed: {result.stdout}{result.stderr}")
