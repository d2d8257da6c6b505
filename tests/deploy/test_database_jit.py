"""JIT compilation is off on the broker's own PostgreSQL connections unless DATABASE_JIT=server
(docs/configuration.md#jit): at 25,000,000 jobs it made the dispatcher's claim 40 times slower."""

from __future__ import annotations

import subprocess
import sys

import pytest

from broker.env import database_settings
from tests import ROOT
from tests.api_server import database_url
from tests.helpers import another_session
from tests.processes import operator_environment

# What a broker process's connection says of its JIT setting, and where the value comes from.
SHOW_JIT = (
    "from django.db import connection\n"
    "with connection.cursor() as cursor:\n"
    "    cursor.execute(\"SELECT setting, source FROM pg_settings WHERE name = 'jit'\")\n"
    "    print(*cursor.fetchone())\n"
)


@pytest.mark.parametrize(
    ("url", "mode", "options"),
    [
        ("postgres://db/broker", None, "-c jit=off"),  # the default
        ("postgres://db/broker", "off", "-c jit=off"),
        # The URL's own options come first; the broker's setting is added after them.
        ("postgres://db/broker?options=-c%20work_mem%3D8MB", None, "-c work_mem=8MB -c jit=off"),
        ("postgres://db/broker", "server", None),
        ("postgres://db/broker?options=-c%20work_mem%3D8MB", "server", "-c work_mem=8MB"),
    ],
)
def test_the_connection_options(monkeypatch, url, mode, options):
    monkeypatch.setenv("DATABASE_LOCK_TIMEOUT_SECONDS", "0")  # their own test is below
    monkeypatch.setenv("DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", "0")
    if mode is None:
        monkeypatch.delenv("DATABASE_JIT", raising=False)
    else:
        monkeypatch.setenv("DATABASE_JIT", mode)

    assert database_settings(url)["OPTIONS"].get("options") == options


@pytest.mark.parametrize(
    ("lock", "idle", "options"),
    [
        (
            None,
            None,
            "-c jit=off -c lock_timeout=5000 -c idle_in_transaction_session_timeout=30000",
        ),
        ("0.25", "0", "-c jit=off -c lock_timeout=250"),
        ("0", "0", "-c jit=off"),
    ],
)
def test_the_lock_timeouts_in_the_connection_options(monkeypatch, lock, idle, options):
    """docs/configuration.md#lock-timeouts; the values in milliseconds, 0 leaves the server's."""
    for variable, value in (
        ("DATABASE_LOCK_TIMEOUT_SECONDS", lock),
        ("DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", idle),
    ):
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
    monkeypatch.delenv("DATABASE_JIT", raising=False)

    assert database_settings("postgres://db/broker")["OPTIONS"]["options"] == options


def broker_jit(**variables: str) -> str:
    """`setting source` of JIT on a connection a broker process (manage.py) opens to this
    test's database."""
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "--command", SHOW_JIT],
        cwd=ROOT,
        env=operator_environment(DATABASE_URL=database_url(), **variables),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout.strip().splitlines()[-1]  # after the shell's own lines


def server_jit() -> str:
    """`setting source` of JIT on a plain connection to the same database: the server's own."""
    with another_session() as plain:
        row = plain.execute("SELECT setting, source FROM pg_settings WHERE name = 'jit'").fetchone()
    assert row is not None
    return " ".join(row)


@pytest.mark.django_db
def test_a_broker_connection_has_jit_off_by_default():
    assert broker_jit() == "off client"


@pytest.mark.django_db
def test_with_server_a_broker_connection_keeps_the_servers_setting():
    assert broker_jit(DATABASE_JIT="server") == server_jit()
    assert not server_jit().endswith(" client")
