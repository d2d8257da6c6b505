"""The broker's commands as real processes on the test's database, and waiting for them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.db import connection

from tests import ROOT
from tests.clock import skip_if_moved


def start_dispatcher(*arguments: str, **environment_overrides: str) -> subprocess.Popen[str]:
    """A dispatcher process on this test's database."""
    return start_manage("dispatch", *arguments, **environment_overrides)


def start_manage(*arguments: str, **environment_overrides: str) -> subprocess.Popen[str]:
    """`manage.py <arguments>` as a process of its own, on this test's database."""
    skip_if_moved()
    settings = connection.settings_dict
    environment = {
        **os.environ,
        # Its output is a pipe read when the process has ended: at INFO, a dispatcher's line per
        # delivery (docs/observability.md) fills it and blocks the process mid-test. Tests that
        # look at those lines ask for INFO (or DEBUG) themselves.
        "DJANGO_LOG_LEVEL": "WARNING",
        **environment_overrides,
        "DJANGO_SETTINGS_MODULE": "broker.settings",
        "DATABASE_URL": (
            f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/"
            f"{settings['NAME']}"
        ),
        "BROKER_ALLOW_PRIVATE_CALLBACKS": "true",
    }
    return subprocess.Popen(
        [sys.executable, "manage.py", *arguments],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


# A DATABASE_URL for processes that never reach the database (no such database exists).
NEVER_CONNECTED = "postgres://postgres@127.0.0.1:5432/never_connected"


def operator_environment(**variables: str) -> dict[str, str]:
    """The environment of a broker process started as an operator starts it: manage.py's own
    settings (not tests.settings), a database that is never connected to unless `variables` set
    DATABASE_URL, and `variables`; for the errors of start-up."""
    environment = {**os.environ, "DATABASE_URL": NEVER_CONNECTED, **variables}
    environment.pop("DJANGO_SETTINGS_MODULE", None)
    return environment


def run_manage(*arguments: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """`manage.py <arguments>` run to its end in operator_environment(**variables)."""
    return subprocess.run(
        [sys.executable, "manage.py", *arguments],
        cwd=ROOT,
        env=operator_environment(**variables),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def wait_until(condition, seconds: float) -> float:
    """Poll until `condition()` is true; return how long it took (fail after `seconds`)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < seconds, "timed out"
        time.sleep(0.02)
    return time.monotonic() - started


def stop(process: subprocess.Popen[str]) -> str:
    """SIGTERM, then the process's output once it has exited."""
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    return output


def kill_if_running(*processes: subprocess.Popen[str]) -> None:
    """What a failing test left running is killed, so it does not outlive the test."""
    for process in processes:
        if process.poll() is None:
            process.kill()


def free_port() -> int:
    """A TCP port nothing listens on now, on 127.0.0.1."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        return int(listener.getsockname()[1])


def group_is_running(group: int) -> bool:
    """Whether any process of the process group `group` is alive (zombies excepted)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while we looked
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False
