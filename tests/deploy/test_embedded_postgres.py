"""The embedded PostgreSQL server (broker/embedded_postgres.py): start, use, stop, one owner at a
time, and the two crashes: of its owner (the server is adopted) and of the server (restarted,
its data recovered). Each test has a server of its own in a new temporary directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from broker.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError, running_url
from tests import ROOT
from tests.processes import wait_until


@pytest.fixture
def directory() -> Iterator[Path]:
    # Not pytest's tmp_path: as root, its parents (0700) are out of the server user's reach.
    path = Path(tempfile.mkdtemp(prefix="broker-embedded-test-"))
    yield path
    if (path / "postmaster.pid").exists():
        EmbeddedPostgres(path).stop()  # a test that failed halfway
    shutil.rmtree(path, ignore_errors=True)


def query(url: str, sql: str) -> object:
    with psycopg.connect(url, autocommit=True) as connection:
        cursor = connection.execute(sql)
        row = cursor.fetchone() if cursor.description else None
    return row[0] if row else None


def test_starts_on_loopback_tcp_answers_listen_notify_and_stops(directory):
    server = EmbeddedPostgres(directory)  # as runbroker runs it: durable, with a password
    url = server.start()
    try:
        assert url.startswith("postgres://postgres:")
        assert "@127.0.0.1:" in url
        assert url.endswith("/broker")
        assert str(query(url, "SELECT version()")).startswith("PostgreSQL 18.")
        assert str(query(url, "SELECT inet_server_addr()")) == "127.0.0.1"
        without_password = url.replace(url.split("@")[0], "postgres://postgres")
        with pytest.raises(psycopg.OperationalError, match="password"):
            query(without_password, "SELECT 1")
        with psycopg.connect(url, autocommit=True) as listener:
            listener.execute("LISTEN wake")
            query(url, "SELECT pg_notify('wake', 'hello')")
            (notification,) = list(listener.notifies(timeout=5, stop_after=1))
        assert notification.payload == "hello"
        assert running_url(directory) == url  # another process's view of it
    finally:
        server.stop()
    assert running_url(directory) is None
    assert not (directory / "postmaster.pid").exists()


def test_a_second_owner_is_refused_while_others_use_the_server(directory):
    first = EmbeddedPostgres(directory, durable=False, password=False)
    url = first.start()
    try:
        with pytest.raises(EmbeddedPostgresError, match=r"another process .* owns"):
            EmbeddedPostgres(directory, durable=False, password=False).start()
        assert running_url(directory) == url
        assert query(url, "SELECT 1") == 1
    finally:
        first.stop()
    second = EmbeddedPostgres(directory, durable=False, password=False)
    assert query(second.start(), "SELECT 1") == 1  # once given up, the directory is free
    second.stop()


def start_owner(directory: Path) -> tuple[subprocess.Popen[str], str]:
    """A process of its own that starts the server and waits, to be killed."""
    program = (
        "import sys, time; from pathlib import Path; "
        "from broker.embedded_postgres import EmbeddedPostgres; "
        "print(EmbeddedPostgres(Path(sys.argv[1])).start(), flush=True); time.sleep(600)"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", program, str(directory)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdout is not None
    return owner, owner.stdout.readline().strip()


def test_after_kill_9_of_its_owner_the_running_server_is_adopted(directory):
    owner, url = start_owner(directory)
    query(url, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    assert running_url(directory) == url  # the server outlives its owner

    server = EmbeddedPostgres(directory)
    assert server.start() == url  # the same server, same port: adopted, not started again
    assert query(url, "SELECT n FROM kept") == 1
    server.stop()
    assert running_url(directory) is None


def test_after_kill_9_of_the_server_a_start_recovers_its_data(directory):
    owner, url = start_owner(directory)
    query(url, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)")
    postmaster = int((directory / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGKILL)
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    wait_until(lambda: running_url(directory) is None, seconds=10)

    server = EmbeddedPostgres(directory)
    restarted = server.start()  # waits while the killed server is a zombie, then recovers
    try:
        assert query(restarted, "SELECT n FROM kept") == 1
        log = (directory / "server.log").read_text()
        assert "database system was interrupted" in log or "not properly shut down" in log
    finally:
        server.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: the server runs as user postgres")
def test_as_root_a_directory_out_of_the_server_users_reach_is_placed_where_it_can_reach(
    tmp_path,
):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    server = EmbeddedPostgres(private / "postgres", durable=False, password=False)
    try:
        assert query(server.start(), "SELECT 1") == 1
        link = private / "postgres"
        assert link.is_symlink()
        assert link.resolve().parent == Path("/var/lib/webhook-broker")
        assert private.stat().st_mode & 0o777 == 0o700  # no parent's permissions widened
        assert link.resolve().owner() == "postgres"
    finally:
        server.stop()
        shutil.rmtree((private / "postgres").resolve(), ignore_errors=True)


def manage(directory: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """`manage.py` run in `directory` as an operator runs it: no DATABASE_URL."""
    environment = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    environment.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *arguments],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_other_commands_use_the_running_server_of_their_directory_or_say_how_to_start_it(
    directory,
):
    directory.chmod(0o755)  # the server user's way to postgres/ inside it, as root
    stopped = manage(directory, "check")
    assert stopped.returncode == 1
    assert "(broker.E003) DATABASE_URL is not set" in stopped.stderr
    assert "manage.py runbroker" in stopped.stderr

    server = EmbeddedPostgres(directory / "postgres")
    url = server.start()
    try:
        assert manage(directory, "check").returncode == 0
        show_port = "from django.db import connection; print(connection.settings_dict['PORT'])"
        running = manage(directory, "shell", "-c", show_port)
        assert running.stdout.split()[-1] == url.rsplit(":", 1)[1].split("/")[0]
    finally:
        server.stop()
