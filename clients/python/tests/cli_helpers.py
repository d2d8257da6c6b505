"""Running the command line in the tests: in-process (click's CliRunner) or as a real process.

Both run the real entry point against the session's live broker, configured through the
environment as a user would (WEBHOOK_BROKER_URL, WEBHOOK_BROKER_TOKEN).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from tests.conftest import Broker
from webhook_broker_client.cli import cli

SOURCE_DIR = Path(__file__).resolve().parents[1] / "src"
PROCESS_TIMEOUT = 120.0
WAIT_TIMEOUT = 60.0  # generous: deliveries on a loaded machine


def broker_env(broker: Broker, **extra: str) -> dict[str, str]:
    return {"WEBHOOK_BROKER_URL": broker.url, "WEBHOOK_BROKER_TOKEN": broker.admin_token, **extra}


def invoke(
    broker: Broker, *args: str, input: str | None = None, env: Mapping[str, str] | None = None
) -> Result:
    """The command line run in this process; `env` adds to (or, with "", hides) the broker's."""
    environment = broker_env(broker)
    environment.update(env or {})
    runner = CliRunner()
    return runner.invoke(cli, list(args), input=input, env=environment, catch_exceptions=False)


def invoke_json(broker: Broker, *args: str, env: Mapping[str, str] | None = None) -> Any:
    """A command's --json output, parsed; the command must succeed."""
    result = invoke(broker, "--json", *args, env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def process_env(broker: Broker | None, **extra: str) -> dict[str, str]:
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("WEBHOOK_BROKER_")
    }
    path = [str(SOURCE_DIR), environment.get("PYTHONPATH", "")]
    environment["PYTHONPATH"] = os.pathsep.join(part for part in path if part)
    if broker is not None:
        environment.update(broker_env(broker))
    environment.update(extra)
    return environment


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "webhook_broker_client.cli", *args]


def run_process(
    broker: Broker | None, *args: str, input: str | None = None, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """The command line as a separate process, as a shell script runs it."""
    return subprocess.run(
        command(*args),
        env=process_env(broker, **extra_env),
        input=input,
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT,
        check=False,
    )


class Receiver:
    """A loopback HTTP receiver that answers `status` to every POST and keeps the bodies."""

    def __init__(self, status: int = 200) -> None:
        self.bodies: list[bytes] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                received.append(self.rfile.read(length))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet tests

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    @contextmanager
    def running(self) -> Iterator[Receiver]:
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join()


def wait_for(condition: Callable[[], Any], what: str, timeout: float = WAIT_TIMEOUT) -> Any:
    """Poll `condition` until it returns something true; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        outcome = condition()
        if outcome:
            return outcome
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout} s waiting for {what}")
        time.sleep(0.2)
