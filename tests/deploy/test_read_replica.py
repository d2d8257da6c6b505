"""Reads that may lag go to a streaming replica (BROKER_READ_DATABASE_URL, broker/db_routing.py,
docs/configuration.md#read-replica).

The router's rules in-process, then the real thing: a private PostgreSQL primary and hot standby
(tests/pg_cluster.py, never the machine's server) and the broker under gunicorn on both. With
the replica's replay paused, what the broker reads there cannot show a new message, while what
it reads on the primary does: that tells the two apart. The replica logs every statement with
the connection's application name, which shows what the broker ran there.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest
from django.contrib.sessions.models import Session
from django.db import router, transaction
from django.urls import URLPattern, URLResolver, get_resolver

from broker.db_routing import PRIMARY, REPLICA_VIEWS, replica_reads, view_name
from broker.env import READ_REPLICA
from broker.models import Message
from jobs.models import Job
from tests import ROOT
from tests.api_server import ApiServer, running_api
from tests.helpers import BROADCAST_HEADERS, PULL_HEADERS
from tests.pg_cluster import Server, pause_replay, primary_and_replica, resume_replay
from tests.processes import free_port

ADMIN_TOKEN = "replica-admin-token"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# The application names of the broker's connections, as the replica's log shows them.
BROKER_READS = "broker-reads"
MIGRATE_READS = "broker-migrate"
REPLICA_LOGGING = {"log_statement": "all", "log_line_prefix": "'%a|'"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


# --- the router's rules ------------------------------------------------------------------------


def test_without_a_marked_request_every_read_goes_to_the_primary():
    assert router.db_for_read(Message) == PRIMARY
    assert router.db_for_write(Message) == PRIMARY


def test_the_routed_views_are_the_urlconfs_own():
    # A view renamed or moved would silently leave the replica; every name must be served.
    assert REPLICA_VIEWS - set(_views_of(get_resolver().url_patterns)) == set()


def _views_of(patterns: list[URLPattern | URLResolver]) -> Iterator[str]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _views_of(pattern.url_patterns)
        else:
            yield view_name(pattern.callback)


@pytest.mark.parametrize(
    ("setting", "expected"),
    [(["broker.db_routing.ReadReplicaRouter"], READ_REPLICA), ([], PRIMARY)],
)
def test_a_marked_request_reads_from_the_replica_but_logins_and_sessions_do_not(
    settings, setting, expected
):
    settings.DATABASE_ROUTERS = setting
    with replica_reads(allowed=True):
        assert router.db_for_read(Message) == expected
        assert router.db_for_read(Session) == PRIMARY  # a new login must be known at once
        assert router.db_for_write(Message) == PRIMARY


def test_after_a_write_the_request_reads_the_primary(settings):
    settings.DATABASE_ROUTERS = ["broker.db_routing.ReadReplicaRouter"]
    with replica_reads(allowed=True):
        before = router.db_for_read(Job)
        router.db_for_write(Job)  # what save(), update() and select_for_update() ask

        assert (before, router.db_for_read(Job)) == (READ_REPLICA, PRIMARY)


@pytest.mark.django_db
def test_a_read_in_a_transaction_stays_with_it(settings):
    settings.DATABASE_ROUTERS = ["broker.db_routing.ReadReplicaRouter"]
    with replica_reads(allowed=True), transaction.atomic():
        assert router.db_for_read(Job) == PRIMARY


def test_migrations_run_on_the_primary_only(settings):
    settings.DATABASE_ROUTERS = ["broker.db_routing.ReadReplicaRouter"]

    assert router.allow_migrate_model(PRIMARY, Message)
    assert not router.allow_migrate_model(READ_REPLICA, Message)


# --- a real primary and streaming replica ------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Server, Server]]:
    """The broker's schema on a private primary, replayed on its replica."""
    with primary_and_replica(REPLICA_LOGGING) as (primary, replica):
        primary.query("CREATE DATABASE broker")
        # With the replica configured, as an operator would run it: migrations touch only the
        # primary (the replica's log is checked below).
        manage(primary, replica.url("broker", application_name=MIGRATE_READS), "migrate")
        yield primary, replica


@pytest.fixture(scope="module")
def broker(cluster: tuple[Server, Server]) -> Iterator[ApiServer]:
    """gunicorn reading from the replica, with a channel, a producer and a pull consumer."""
    primary, replica = cluster
    reads = replica.url("broker", application_name=BROKER_READS)
    with running_api(**environment(primary, reads)) as server:
        for path, fields in [
            ("/producer/shop", {"name": "Shop", "token": "producer-token"}),
            ("/channel/orders", {"name": "Orders", "token": "channel-token"}),
            (
                "/channel/orders/consumer/worker",
                {"name": "Worker", "token": "consumer-token", "type": "pull",
                 "callbackUrl": "http://127.0.0.1:9/worker"},
            ),
        ]:  # fmt: skip
            answer = server.request("PUT", path, form(fields), {**ADMIN, **FORM})
            assert answer.status in (200, 201), answer.body
        yield server


def environment(primary: Server, replica_url: str) -> dict[str, str]:
    return {
        "DATABASE_URL": primary.url("broker", application_name="broker-writes"),
        "BROKER_READ_DATABASE_URL": replica_url,
        "BROKER_ADMIN_TOKENS": ADMIN_TOKEN,
        # How long a request waits for a replica connection that does not come.
        "DATABASE_POOL_TIMEOUT": "2",
    }


def manage(primary: Server, replica_url: str, *arguments: str, **variables: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *arguments],
        cwd=ROOT,
        env={
            **os.environ,
            **environment(primary, replica_url),
            "DJANGO_SETTINGS_MODULE": "broker.settings",
            **variables,
        },
        capture_output=True,
        text=True,
        timeout=600,  # migrations on a loaded machine
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def form(fields: dict[str, str]) -> bytes:
    return urllib.parse.urlencode(fields).encode()


def publish(server: ApiServer, message_id: str) -> int:
    headers = {
        **BROADCAST_HEADERS,
        "X-Broker-Message-ID": message_id,
        "Content-Type": "application/json",
    }
    return server.request("POST", "/channel/orders/broadcast", b'{"n": 1}', headers).status


def statements(
    replica: Server, application: str, since: int = 0, until: int | None = None
) -> list[str]:
    """The replica's log lines of the statements that connections named `application` ran,
    between characters `since` and `until` of the log."""
    lines = replica.log_text()[since:until].splitlines()
    return [line for line in lines if line.startswith(f"{application}|")]


def test_migrations_never_touch_the_replica(cluster):
    _, replica = cluster

    assert statements(replica, MIGRATE_READS) == []


def test_lists_read_from_the_replica_and_writes_never_touch_it(cluster, broker):
    primary, replica = cluster
    pause_replay(replica)
    try:
        start = len(replica.log_text())
        published = publish(broker, "during-lag")
        after_publish = len(replica.log_text())
        listed = broker.request("GET", "/channel/orders/messages", headers=ADMIN)
        one = broker.request("GET", "/channel/orders/message/during-lag", headers=ADMIN)
        queued = broker.request(
            "GET", "/channel/orders/consumer/worker/queued-jobs", headers=PULL_HEADERS
        )
    finally:
        resume_replay(primary, replica)
    caught_up = broker.request("GET", "/channel/orders/messages", headers=ADMIN)

    assert published == 201
    assert statements(replica, BROKER_READS, start, after_publish) == []  # nothing of the write
    assert (listed.status, one.status, queued.status) == (200, 404, 200)
    assert b"during-lag" not in listed.body  # read on the replica, which has not replayed it
    assert b"during-lag" in queued.body  # the pull API reads the primary
    assert statements(replica, BROKER_READS, after_publish)  # the reads went there
    assert b"during-lag" in caught_up.body


def login(server: ApiServer, username: str, password: str) -> urllib.request.OpenerDirector:
    """A browser with a session: through the admin's login page, as the UI sends operators."""
    browser = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    with browser.open(server.url("/admin/login/")) as page:
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.read())
    assert token is not None
    fields = {"username": username, "password": password, "next": "/ui/"}
    fields["csrfmiddlewaretoken"] = token.group(1).decode()
    with browser.open(server.url("/admin/login/"), form(fields)) as landed:
        assert landed.url == server.url("/ui/")
    return browser


def page(browser: urllib.request.OpenerDirector, server: ApiServer, path: str) -> str:
    with browser.open(server.url(path)) as answer:
        assert answer.status == 200
        return str(answer.read().decode())


def test_an_operator_who_logs_in_during_lag_sees_ui_pages_from_the_replica(cluster, broker):
    primary, replica = cluster
    pause_replay(replica)
    try:
        replica_url = replica.url("broker", application_name=BROKER_READS)
        manage(primary, replica_url, "createsuperuser", "--noinput", "--username=night-shift",
               "--email=ops@example.com", DJANGO_SUPERUSER_PASSWORD="lag-is-fine-42")  # fmt: skip
        assert publish(broker, "ui-during-lag") == 201
        # The user and the session exist on the primary alone: logins read there.
        browser = login(broker, "night-shift", "lag-is-fine-42")
        lagging = page(browser, broker, "/ui/messages")
    finally:
        resume_replay(primary, replica)
    caught_up = page(browser, broker, "/ui/messages")

    assert "ui-during-lag" not in lagging
    assert "ui-during-lag" in caught_up


def test_reads_fall_back_to_the_primary_when_the_replica_does_not_answer(cluster, broker):
    primary, _ = cluster
    nobody = f"postgres://postgres@127.0.0.1:{free_port()}/broker"  # nothing listens there
    with running_api(**environment(primary, nobody)) as server:
        assert publish(server, "replica-down") == 201
        first = server.request("GET", "/channel/orders/messages", headers=ADMIN)
        second = server.request("GET", "/job-status", headers=ADMIN)
        log = server.output()

    assert (first.status, second.status) == (200, 200)
    assert b"replica-down" in first.body  # read on the primary
    assert log.count("read replica unavailable") == 1  # then not tried again for a while
