"""The dispatcher's /livez and /readyz (`manage.py dispatch --health-port`, docs/deploy.md)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from jobs.health import Health, start_health_server
from jobs.management.commands.dispatch import Command
from tests import ROOT
from tests.clock import skip_if_moved
from tests.processes import free_port, kill_if_running, stop, wait_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_loop_that_turns_is_live_and_one_that_stopped_turning_is_not():
    clock = FakeClock()
    health = Health(clock)
    assert health.liveness(stale_after=60)[0]  # not turned yet: the start counts
    clock.now += 61
    assert health.liveness(stale_after=60) == (
        False,
        "the dispatcher's loop has not turned for 61 s",
    )
    health.tick()
    assert health.liveness(stale_after=60)[0]
    clock.now += 59
    assert health.liveness(stale_after=60)[0]
    clock.now += 2
    assert not health.liveness(stale_after=60)[0]
    health.stopping = True  # draining for its grace period, on purpose
    assert health.liveness(stale_after=60)[0]


def test_ready_only_while_the_last_database_step_succeeded_recently():
    clock = FakeClock()
    health = Health(clock)
    assert health.readiness(60) == (False, "no database step has succeeded yet")
    health.database_ok()
    assert health.readiness(60)[0]
    clock.now += 1
    health.database_failed()
    assert health.readiness(60) == (False, "the database is unavailable")
    clock.now += 1
    health.database_ok()  # back
    assert health.readiness(60)[0]
    clock.now += 61
    assert health.readiness(60) == (False, "no database step has succeeded for 61 s")
    health.database_ok()
    health.stopping = True
    assert health.readiness(60) == (False, "stopping: no longer claiming")


def probe(port: int, path: str) -> tuple[int | None, dict[str, Any]]:
    """(status, JSON body) of GET `path`; (None, {}) while nothing answers on the port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.load(error)
    except OSError:
        return None, {}


def test_the_health_server_answers_from_the_loops_timestamps():
    clock = FakeClock()
    health = Health(clock)
    server = start_health_server(health, 0, "127.0.0.1", stale_after=60)
    port = server.server_address[1]
    try:
        status, body = probe(port, "/readyz")
        assert (status, body["status"]) == (503, "unavailable")
        assert body["lastDatabaseSuccessSecondsAgo"] is None
        health.tick()
        health.database_ok()
        clock.now += 2.5
        assert probe(port, "/livez") == (
            200,
            {
                "status": "ok",
                "reason": "the dispatcher's loop is turning",
                "lastTickSecondsAgo": 2.5,
                "lastDatabaseSuccessSecondsAgo": 2.5,
                "lastDatabaseFailureSecondsAgo": None,
            },
        )
        assert probe(port, "/readyz?verbose=1")[0] == 200
        assert probe(port, "/metrics")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


def test_every_option_of_the_dispatch_command_says_what_it_does():
    parser = Command().create_parser("manage.py", "dispatch")
    undocumented = [action.dest for action in parser._actions if not action.help]
    assert undocumented == []


def test_a_health_staleness_below_two_poll_intervals_is_refused():
    with pytest.raises(CommandError, match="at least twice --poll-seconds"):
        call_command(
            "dispatch", "--health-port", "1", "--poll-seconds", "10", "--health-stale-seconds", "5"
        )


class Relay:
    """A loopback TCP relay to PostgreSQL that a test can cut: cut, it drops every connection
    it carries and closes new ones at once, as a database that went away does."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut_off = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            if self.cut_off:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._sockets += [client, upstream]
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        for end in (source, target):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.cut_off = True
        with self._lock:
            carried, self._sockets = self._sockets, []
        for end in carried:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    def restore(self) -> None:
        self.cut_off = False

    def close(self) -> None:
        self.listener.close()
        self.cut()


@contextlib.contextmanager
def relay_to_test_database() -> Iterator[Relay]:
    settings = connection.settings_dict
    relay = Relay(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    try:
        yield relay
    finally:
        relay.close()


def start_dispatcher_through(relay: Relay, *arguments: str) -> subprocess.Popen[str]:
    """A dispatcher process on this test's database, connected through `relay`."""
    skip_if_moved()
    settings = connection.settings_dict
    url = f"postgres://{settings['USER']}@127.0.0.1:{relay.port}/{settings['NAME']}"
    return subprocess.Popen(
        [sys.executable, "manage.py", "dispatch", *arguments],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "broker.settings", "DATABASE_URL": url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.django_db(transaction=True)
def test_readyz_follows_the_database_while_livez_stays_up():
    port = free_port()
    with relay_to_test_database() as relay:
        process = start_dispatcher_through(
            relay, "--health-port", str(port), "--poll-seconds", "0.2"
        )
        try:
            wait_until(lambda: probe(port, "/readyz")[0] == 200, seconds=60)
            assert probe(port, "/livez")[0] == 200

            relay.cut()  # the database goes away: no claim is possible
            wait_until(lambda: probe(port, "/readyz")[0] == 503, seconds=60)
            status, body = probe(port, "/readyz")
            assert (status, body["reason"]) == (503, "the database is unavailable")
            assert probe(port, "/livez")[0] == 200  # the loop goes on turning, and retrying

            relay.restore()
            wait_until(lambda: probe(port, "/readyz")[0] == 200, seconds=60)
            output = stop(process)
        finally:
            kill_if_running(process)
    assert process.returncode == 0, output
    assert f"health checks on http://127.0.0.1:{port}/livez and /readyz" in output
    assert "database unavailable" in output  # the cut did reach the dispatcher
    assert probe(port, "/livez") == (None, {})  # the server ends with the process
