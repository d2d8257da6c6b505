"""PostgreSQL stopped under a running API (docs/reliability.md; issue 9): 503 with a JSON error and
Retry-After, `/_status` unhealthy, never a traceback; the same process recovers by itself.

The API runs under gunicorn (tests/api_server.py) on the test database; the test stops the
machine's PostgreSQL cluster for a few seconds and always starts it again (`finally`). Marked
`disruptive` like tests/dispatch/test_process.py: other test runs sharing the server see the
outage too.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connection

from broker.models import Message
from tests.api_server import Answer, ApiServer, running_api
from tests.faults import report
from tests.helpers import (
    BROADCAST_HEADERS,
    PULL_HEADERS,
    make_channel,
    make_consumer,
    make_consumer_with_token,
    make_producer,
)

pytestmark = [
    pytest.mark.disruptive,
    pytest.mark.django_db(transaction=True),
    pytest.mark.needs_tool("postgresql-cluster"),
]

ADMIN = {"Authorization": "Bearer outage-admin-token"}
BROADCAST = {**BROADCAST_HEADERS, "Content-Type": "application/json"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}

# What a client does during the outage, each with the status it gets when the database is up.
REQUESTS: list[tuple[str, str, bytes | None, dict[str, str], int]] = [
    ("GET", "/producers", None, ADMIN, 200),
    ("GET", "/channel/orders", None, ADMIN, 200),
    ("GET", "/channel/orders/messages", None, ADMIN, 200),
    ("POST", "/channel/orders/broadcast", b'{"n": 1}', BROADCAST, 201),
    ("GET", "/channel/orders/consumer/worker/queued-jobs", None, PULL_HEADERS, 200),
    ("PUT", "/producer/newcomer", b"name=Newcomer", {**ADMIN, **FORM}, 200),
    ("GET", "/dlq-status", None, ADMIN, 200),
    ("GET", "/metrics", None, ADMIN, 200),
]


def cluster(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["/usr/bin/pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True,
        capture_output=True,
        timeout=60,
    )


def accepting() -> bool:
    probe = ["/usr/bin/pg_isready", "-h", "127.0.0.1", "-q"]
    return subprocess.run(probe, check=False).returncode == 0


@contextlib.contextmanager
def postgresql_stopped() -> Iterator[None]:
    """PostgreSQL down for the block; started again whatever happens in it."""
    connection.close()
    cluster("stop")
    try:
        yield
    finally:
        for attempt in range(5):
            with contextlib.suppress(subprocess.CalledProcessError):
                cluster("start")
                break
            time.sleep(1 + attempt)
        deadline = time.monotonic() + 60
        while not accepting():
            assert time.monotonic() < deadline, "PostgreSQL did not come back"
            time.sleep(0.1)


def assert_unavailable(answer: Answer, what: str) -> None:
    assert answer.status == 503, (what, answer.status, answer.body[:300])
    assert answer.headers["Content-Type"].startswith("application/json"), what
    assert answer.headers.get("Retry-After", "").isdigit(), what
    assert json.loads(answer.body) == {"Error": "The database is unavailable; retry shortly."}
    assert b"Traceback" not in answer.body


def our_database_answers() -> bool:
    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        connection.close()
        return False
    return True


@pytest.fixture
def rows():
    channel = make_channel()
    make_producer()
    make_consumer(channel, "billing")
    make_consumer_with_token(channel, "worker")


def call(server: ApiServer, method: str, path: str, body: bytes | None, headers) -> Answer:
    if path == "/producer/newcomer" and method == "PUT":
        path = f"/producer/newcomer-{time.monotonic_ns()}"  # a create each time, no precondition
    return server.request(method, path, body, headers)


def test_the_api_answers_503_while_the_database_is_down_and_recovers(rows):
    with running_api(BROKER_ADMIN_TOKENS="outage-admin-token") as server:
        for method, path, body, headers, expected in REQUESTS:
            assert call(server, method, path, body, headers).status == expected, path
        messages_before = Message.objects.count()
        pid = server.process.pid

        with postgresql_stopped():
            stopped_at = time.monotonic()
            for method, path, body, headers, _ in REQUESTS:
                assert_unavailable(call(server, method, path, body, headers), f"{method} {path}")
            # An API key needs the database to be checked: 503, not a wrong "401".
            assert_unavailable(
                server.request("GET", "/producers", headers={"Authorization": "Bearer api-key"}),
                "API key",
            )
            # HTML pages too: a session must be looked up for the admin and the operator UI.
            session = {"Cookie": "sessionid=abcdefghijklmnopqrstuvwxyz012345"}
            for page in ["/admin/", "/ui/"]:
                assert_unavailable(server.request("GET", page, headers=session), page)
            assert server.request("GET", "/admin/login/").status == 200  # needs no database
            status = server.request("GET", "/_status")
            assert status.status == 503
            health = json.loads(status.body)
            assert health["status"] == "unavailable"
            assert health["database"]["healthy"] is False
            down_for = time.monotonic() - stopped_at

        restarted_at = time.monotonic()
        first = server.request("GET", "/_status")
        recovered_in = time.monotonic() - restarted_at
        assert first.status == 200, first.body
        for method, path, body, headers, expected in REQUESTS:
            assert call(server, method, path, body, headers).status == expected, path
        assert server.process.pid == pid  # the same process, still running
        assert server.process.poll() is None
        output = server.output()

    assert "Traceback" not in output
    assert "database unavailable: OperationalError" in output
    while not our_database_answers():
        time.sleep(0.1)
    assert Message.objects.count() == messages_before + 1  # one broadcast after the restart
    report(
        "api with PostgreSQL stopped",
        requests_during_outage=len(REQUESTS) + 5,
        all_503_json=True,
        outage_seconds=round(down_for, 2),
        first_answer_after_start_seconds=round(recovered_in, 3),
    )
