"""The API under a real server as a process of its own, on the test database: gunicorn (the
production server) or `manage.py runserver` (the developer's).

For what the Django test client cannot show: the WSGI server's own limits (header sizes), a
long-lived process whose database goes away and comes back, and the connections a server holds.
"""

from __future__ import annotations

import contextlib
import http.client
import os
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
from typing import IO

from django.db import connection

from broker.management.commands.runbroker import web_command
from tests import ROOT
from tests.clock import skip_if_moved

GUNICORN = Path(sys.executable).parent / "gunicorn"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class ApiServer:
    process: subprocess.Popen[str]
    port: int
    log: IO[str]  # the server's output: gunicorn's and the application's logs

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        request = urllib.request.Request(  # noqa: S310 (always http://127.0.0.1)
            self.url(path), data=body, method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
                return Answer(response.status, dict(response.headers), response.read())
        except urllib.error.HTTPError as error:
            return Answer(error.code, dict(error.headers), error.read())

    def send_raw(self, request: bytes) -> Answer:
        """The answer to `request` sent as these bytes, for what an HTTP client would not send
        (malformed header lines)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
            sock.sendall(request)
            response = http.client.HTTPResponse(sock)
            response.begin()
            return Answer(response.status, dict(response.headers), response.read())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def database_url(**options: str) -> str:
    """This test's database as a DATABASE_URL, with libpq options (`application_name=...`)."""
    settings = connection.settings_dict
    url = f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"
    return f"{url}?{urllib.parse.urlencode(options)}" if options else url


@contextlib.contextmanager
def running_api(**environment: str) -> Iterator[ApiServer]:
    """gunicorn serving broker.wsgi on 127.0.0.1, on this test's database; stopped afterwards.

    Its output, logs included, is `server.output()`.
    """
    port = _free_port()
    command = [str(GUNICORN), "broker.wsgi", "--bind", f"127.0.0.1:{port}", "--workers", "1"]
    with _serving(command, port, environment) as server:
        yield server


@contextlib.contextmanager
def running_documented_api(workers: int, **environment: str) -> Iterator[ApiServer]:
    """The web server as `manage.py runbroker` runs it (gunicorn, its options there) with
    `workers` worker processes, on 127.0.0.1 and this test's database; stopped afterwards."""
    port = _free_port()
    with _serving(web_command(f"127.0.0.1:{port}", workers), port, environment) as server:
        yield server


@contextlib.contextmanager
def running_runserver(**environment: str) -> Iterator[ApiServer]:
    """`manage.py runserver` (a thread per HTTP connection, no autoreloader) on 127.0.0.1, on
    this test's database; stopped afterwards."""
    port = _free_port()
    command = [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"]
    with _serving(command, port, environment) as server:
        yield server


@contextlib.contextmanager
def _serving(command: list[str], port: int, environment: dict[str, str]) -> Iterator[ApiServer]:
    skip_if_moved()
    # A file, not a pipe: a pipe nobody reads could fill up and stall the server.
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in the finally below)
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "broker.settings",
            "DATABASE_URL": database_url(),
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
            **environment,
        },
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = ApiServer(process, port, log)
    try:
        _wait_for(server)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def _wait_for(server: ApiServer) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"the server exited: {server.output()}")
        with contextlib.suppress(OSError):
            if server.request("GET", "/_status").status == 200:
                return
        time.sleep(0.1)
    raise AssertionError("the server did not answer within 30 s")
