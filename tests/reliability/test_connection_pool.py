"""PostgreSQL connections per process are bounded by a pool (issue 14).

`manage.py runserver` starts a thread per HTTP connection; with a connection kept per thread,
concurrent producers ran PostgreSQL out of connections ("too many clients"). With the pool
(DATABASE_POOL, on by default) a process holds at most DATABASE_POOL_MAX_SIZE connections, a
request waits for a free one, and one that waits too long gets the API's clean 503.
"""

from __future__ import annotations

import multiprocessing
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections

from broker.env import database_conn_max_age, database_pool
from broker.models import Message
from tests.api_server import ApiServer, database_url, running_runserver
from tests.helpers import BROADCAST_HEADERS, make_channel, make_consumer, make_producer

POSTGRES = "django.db.backends.postgresql"
BROADCAST = {**BROADCAST_HEADERS, "Content-Type": "application/json"}
# For the tests of the pool itself: this run has one unless DATABASE_POOL=false.
needs_the_pool = pytest.mark.skipif(
    not django_settings.DATABASES["default"]["OPTIONS"].get("pool"),
    reason="this run has no connection pool (DATABASE_POOL=false)",
)


# --- settings -----------------------------------------------------------------------------


def test_postgresql_gets_a_pool_by_default(monkeypatch):
    for name in ("DATABASE_POOL", "DATABASE_POOL_MAX_SIZE", "DATABASE_POOL_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("DATABASE_CONN_MAX_AGE", raising=False)

    pool = database_pool()

    assert pool is not None
    assert (pool["min_size"], pool["max_size"], pool["timeout"]) == (0, 4, 5.0)
    assert database_conn_max_age(pooled=True) == 0  # Django refuses anything else with a pool


def test_the_pool_is_configured_from_the_environment(monkeypatch):
    monkeypatch.setenv("DATABASE_POOL", "true")
    monkeypatch.setenv("DATABASE_POOL_MAX_SIZE", "8")
    monkeypatch.setenv("DATABASE_POOL_TIMEOUT", "2.5")

    pool = database_pool()

    assert pool is not None
    assert (pool["max_size"], pool["timeout"]) == (8, 2.5)


def test_without_the_pool_each_thread_keeps_its_connection_for_a_minute(monkeypatch):
    monkeypatch.setenv("DATABASE_POOL", "false")
    monkeypatch.delenv("DATABASE_CONN_MAX_AGE", raising=False)

    assert database_pool() is None
    assert database_conn_max_age(pooled=False) == 60


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("DATABASE_POOL", "sometimes", "DATABASE_POOL='sometimes' is not a boolean"),
        ("DATABASE_POOL_MAX_SIZE", "1", "DATABASE_POOL_MAX_SIZE=1 must be at least 2"),
        ("DATABASE_POOL_TIMEOUT", "soon", "DATABASE_POOL_TIMEOUT='soon' is not a number"),
    ],
)
def test_bad_pool_settings_stop_the_process(monkeypatch, name, raw, message):
    monkeypatch.setenv("DATABASE_POOL", "true")
    monkeypatch.setenv(name, raw)

    with pytest.raises(ImproperlyConfigured, match=message):
        database_pool()


def test_a_connection_age_with_the_pool_is_refused(monkeypatch):
    monkeypatch.setenv("DATABASE_CONN_MAX_AGE", "60")

    with pytest.raises(ImproperlyConfigured, match="set DATABASE_POOL=false"):
        database_conn_max_age(pooled=True)


# --- a pool that is used up ---------------------------------------------------------------


@needs_the_pool
@pytest.mark.django_db(transaction=True)
def test_a_request_that_finds_the_pool_used_up_gets_503(client, settings, monkeypatch):
    settings.BROKER_ADMIN_TOKENS = ["admin-token"]
    assert not Message.objects.exists()  # the pool is open, with one idle connection
    connection.close()  # the test's own connection goes back to the pool
    pool = connection.pool  # type: ignore[attr-defined]  # PostgreSQL's, unknown to django-stubs
    held = [pool.getconn(timeout=60) for _ in range(pool.max_size)]  # every one there can be
    monkeypatch.setattr(pool, "timeout", 0.1)  # how long a request waits for a free connection
    try:
        response = client.get("/producers", headers={"Authorization": "Bearer admin-token"})
    finally:
        for held_connection in held:
            pool.putconn(held_connection)

    assert response.status_code == 503
    assert response.json() == {"Error": "The database is unavailable; retry shortly."}
    assert response["Retry-After"] == "5"


# --- a forked process (django-q2's cluster) -----------------------------------------------


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _report_backend_pid(answer) -> None:
    answer.put(backend_pid())


@needs_the_pool
@pytest.mark.django_db(transaction=True)
def test_a_forked_process_does_not_share_its_parents_connections():
    parent = backend_pid()
    connections.close_all()  # as django-q2 does before it forks: the connection idles in the pool
    fork = multiprocessing.get_context("fork")
    answer = fork.SimpleQueue()
    child = fork.Process(target=_report_backend_pid, args=(answer,))
    child.start()
    child.join()

    assert child.exitcode == 0
    assert answer.get() != parent  # its own session, not the one idle in the parent's pool
    assert backend_pid() > 0  # and the parent goes on with a pool of its own


# --- runserver under concurrent producers -------------------------------------------------


class ConnectionCounter:
    """Samples, in a thread, how many connections PostgreSQL has for one application name."""

    def __init__(self, application: str) -> None:
        self.application = application
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample)

    def count(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                [self.application],
            )
            return int(cursor.fetchone()[0])

    def __enter__(self) -> ConnectionCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        try:
            while not self._stop.wait(0.005):
                self.peak = max(self.peak, self.count())
        finally:
            connection.close()


def broadcast(server: ApiServer, number: int) -> int:
    headers = {**BROADCAST, "X-Broker-Message-ID": f"m-{number}"}
    return server.request("POST", "/channel/orders/broadcast", b'{"n": 1}', headers).status


@pytest.mark.django_db(transaction=True)
def test_runserver_holds_no_more_connections_than_the_pool_under_concurrent_producers():
    make_consumer(make_channel())
    make_producer()
    # The server's sessions carry this name, so that they can be told from everyone else's.
    application = f"broker-test-runserver-{uuid.uuid4().hex[:8]}"
    maximum = 3

    with running_runserver(
        DATABASE_URL=database_url(application_name=application),
        DATABASE_POOL="true",
        DATABASE_POOL_MAX_SIZE=str(maximum),
        DATABASE_CONN_MAX_AGE="0",
        # 16 requests share 3 connections: on a loaded machine one may wait long for its turn,
        # and what is measured is how many connections, not how fast.
        DATABASE_POOL_TIMEOUT="120",
    ) as server:
        # urllib opens a TCP connection per request: runserver starts a thread for each.
        with ConnectionCounter(application) as counter, ThreadPoolExecutor(16) as producers:
            statuses = list(producers.map(lambda n: broadcast(server, n), range(200)))
        held_afterwards = counter.count()  # the pool keeps what it opened

    assert statuses == [201] * 200
    assert Message.objects.count() == 200
    assert counter.peak <= maximum
    assert 1 <= held_afterwards <= maximum
