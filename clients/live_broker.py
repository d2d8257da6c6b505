"""A real broker for the clients' tests: a fresh database, `manage.py runbroker`, then cleanup.

As a module (Python tests): `with live_broker(root) as broker: broker.url, broker.admin_token`.
As a command (any other test runner, e.g. the TypeScript client's):

    python clients/live_broker.py [--root PATH] -- CMD ARGS...

starts a broker, runs CMD with WEBHOOK_BROKER_URL and WEBHOOK_BROKER_TOKEN (the admin token) in
its environment, stops the broker and exits with CMD's exit code.

Standard library only, so that it runs before any client is installed. The database is created
and dropped by the broker's own Python (which has psycopg), on the server of $DATABASE_URL
(default postgres://postgres@127.0.0.1:5432). Callbacks to loopback addresses are allowed
(BROKER_ALLOW_PRIVATE_CALLBACKS): the tests' receivers listen on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SERVER_URL = "postgres://postgres@127.0.0.1:5432/postgres"
START_TIMEOUT_SECONDS = 120.0
STOP_TIMEOUT_SECONDS = 60.0
REPOSITORY_ROOT = Path(__file__).resolve().parent.parent

# Run by the broker's Python: it has psycopg, this file must not need it.
_DATABASE_SCRIPT = """
import sys, psycopg
action, server_url, name = sys.argv[1:4]
with psycopg.connect(server_url, autocommit=True) as connection:
    if action == "create":
        connection.execute(f'CREATE DATABASE "{name}"')
    else:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
"""


@dataclass(frozen=True)
class LiveBroker:
    url: str
    admin_token: str
    database_url: str
    log_path: Path


def broker_python(root: Path) -> str:
    """The broker checkout's virtualenv Python, or this one when the checkout has none."""
    candidate = root / ".venv" / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable


def database_url_named(server_url: str, name: str) -> str:
    """`server_url` pointing at database `name` instead (user, host, port and query kept)."""
    parts = urllib.parse.urlsplit(server_url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))


def _database(python: str, action: str, server_url: str, name: str) -> None:
    command = [python, "-c", _DATABASE_SCRIPT, action, server_url, name]
    subprocess.run(command, check=True, capture_output=True, timeout=120)  # noqa: S603


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _status_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_status", timeout=5) as response:  # noqa: S310
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait_until_up(process: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the broker exited ({process.returncode}):\n{_tail(log_path)}")
        if _status_ok(url):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the broker did not answer /_status in time:\n{_tail(log_path)}")


def _tail(log_path: Path, lines: int = 40) -> str:
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the whole process group (runbroker stops its children), then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def live_broker(root: Path = REPOSITORY_ROOT) -> Iterator[LiveBroker]:
    """A broker on a free loopback port with a database of its own, stopped and dropped after."""
    python = broker_python(root)
    server_url = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    name = f"client_tests_{secrets.token_hex(6)}"
    database_url = database_url_named(server_url, name)
    _database(python, "create", server_url, name)
    try:
        with tempfile.TemporaryDirectory(prefix="live-broker-") as workdir:
            yield from _run_broker(root, python, database_url, Path(workdir))
    finally:
        _database(python, "drop", server_url, name)


def _run_broker(root: Path, python: str, database_url: str, workdir: Path) -> Iterator[LiveBroker]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    token = secrets.token_urlsafe(32)
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "BROKER_ADMIN_TOKENS": token,
        "BROKER_ALLOW_PRIVATE_CALLBACKS": "true",
        "DJANGO_SETTINGS_MODULE": "broker.settings",
    }
    command = [python, str(root / "manage.py"), "runbroker", "--bind", f"127.0.0.1:{port}"]
    command += ["--workers", "1", "--dispatchers", "1", "--no-housekeeping"]
    log_path = workdir / "broker.log"
    # The broker works in its own directory (static files, payloads): nothing lands in the checkout.
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603
            command,
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_until_up(process, url, log_path)
        yield LiveBroker(url, token, database_url, log_path)
    finally:
        _stop(process)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=REPOSITORY_ROOT, help="the broker checkout")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    options = parser.parse_args(argv)
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("give the command to run after --")
    with live_broker(options.root) as broker:
        env = {**os.environ, "WEBHOOK_BROKER_URL": broker.url}
        env["WEBHOOK_BROKER_TOKEN"] = broker.admin_token
        return subprocess.run(command, env=env, check=False).returncode  # noqa: S603


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
