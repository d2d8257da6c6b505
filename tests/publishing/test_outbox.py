"""The transactional outbox (docs/outbox.md): publish() joins the caller's transaction.

In process, against a table the broker knows nothing about; then the example host project of
docs/examples/outbox_host, which installs the broker's apps, as real processes on a database of
its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from django.db import connection, transaction

from broker import publish
from broker.models import Message
from broker.publishing import DuplicateMessage
from consumers.models import Consumer
from jobs.dispatch import Dispatcher, DispatcherConfig
from jobs.models import Job
from jobs.states import DELIVERED, QUEUED
from tests import ROOT
from tests.delivery import push_consumer, run_once

EXAMPLE = ROOT / "docs" / "examples" / "outbox_host"


class PaymentDeclined(Exception):
    """The caller's own failure, after it has published."""


# --- in process -----------------------------------------------------------------------------


@pytest.fixture
def orders_table() -> Iterator[None]:
    """The caller's own table: a temporary one, unknown to the broker and its migrations."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE shop_orders (customer varchar(100) PRIMARY KEY)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE shop_orders")


def save_order(customer: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO shop_orders (customer) VALUES (%s)", [customer])


def saved_orders() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT customer FROM shop_orders ORDER BY customer")
        return [customer for (customer,) in cursor.fetchall()]


def announce(customer: str, message_id: str | None = None) -> Message:
    return publish(
        "orders",
        {"event": "order.created", "customer": customer},
        producer="shop",
        message_id=message_id or f"order.created:{customer}",
    )


def delivered_bodies(receiver) -> list[dict[str, Any]]:
    return [json.loads(request.body) for request in receiver.received]


# Real transactions: the caller's `atomic()` is the outermost block, so it truly commits or rolls
# back (inside pytest-django's per-test transaction it would only be a savepoint).
@pytest.mark.django_db(transaction=True)
class TestInProcess:
    @pytest.fixture(autouse=True)
    def set_up(self, channel, receiver, orders_table):
        """A push consumer of `channel` that delivers to `receiver`, and the caller's table."""
        push_consumer(channel, receiver)

    def test_a_rolled_back_transaction_stores_and_delivers_nothing(
        self, channel, receiver, dispatcher
    ):
        def place_order_but_decline_payment() -> None:
            with transaction.atomic():
                save_order("ada")
                announce("ada")
                # Both writes were made, in the caller's transaction...
                assert saved_orders() == ["ada"]
                assert Job.objects.filter(message__public_id="order.created:ada").count() == 1
                raise PaymentDeclined

        with pytest.raises(PaymentDeclined):
            place_order_but_decline_payment()

        # ...and both went with it.
        assert saved_orders() == []
        assert not Message.objects.exists()
        assert not Job.objects.exists()
        run_once(dispatcher, limit=10)
        assert receiver.received == []

    def test_a_committed_transaction_is_delivered(self, channel, receiver, dispatcher):
        with transaction.atomic():
            save_order("ada")
            announce("ada")

        assert saved_orders() == ["ada"]
        run_once(dispatcher, limit=10)
        assert delivered_bodies(receiver) == [{"event": "order.created", "customer": "ada"}]
        assert receiver.received[0].headers["X-Broker-Message-ID"] == "order.created:ada"
        assert Job.objects.get().status == DELIVERED

    def test_a_duplicate_id_raises_and_leaves_the_callers_transaction_usable(
        self, channel, receiver, dispatcher
    ):
        with transaction.atomic():
            save_order("ada")
            announce("ada")
            with pytest.raises(DuplicateMessage):
                # The same event announced twice, say by a retried step: refused, not repeated.
                announce("ada, again", message_id="order.created:ada")
            # On PostgreSQL a failed statement aborts the whole transaction unless it ran in a
            # savepoint: these writes would fail, and the commit would roll everything back.
            save_order("bob")
            announce("bob")

        assert saved_orders() == ["ada", "bob"]
        run_once(dispatcher, limit=10)
        assert sorted(delivered_bodies(receiver), key=lambda body: body["customer"]) == [
            {"event": "order.created", "customer": "ada"},
            {"event": "order.created", "customer": "bob"},
        ]
        assert list(Job.objects.values_list("status", flat=True)) == [DELIVERED, DELIVERED]

    def test_no_dispatcher_sees_the_message_before_the_caller_commits(
        self, channel, receiver, dispatcher
    ):
        seen_elsewhere: list[int] = []

        def claim_elsewhere() -> None:
            # Another dispatcher, on a connection of its own.
            try:
                other = Dispatcher(DispatcherConfig(dispatcher_id="elsewhere"))
                seen_elsewhere.extend(request.job_id for request in other.claim(10))
            finally:
                connection.close()

        with transaction.atomic():
            save_order("ada")
            announce("ada")
            elsewhere = threading.Thread(target=claim_elsewhere)
            elsewhere.start()
            elsewhere.join(timeout=10)
            assert not elsewhere.is_alive()

        assert seen_elsewhere == []
        assert Job.objects.get().status == QUEUED  # not taken, so not lost either
        run_once(dispatcher, limit=10)
        assert delivered_bodies(receiver) == [{"event": "order.created", "customer": "ada"}]


# --- the example host project, as real processes ----------------------------------------------


class HostProject:
    """docs/examples/outbox_host on a database of its own, run with `manage.py` by the Python of
    a venv where the broker's wheel is installed (tests/packaging.py), as a host project has it."""

    def __init__(self, database: str, python: Path) -> None:
        self.python = str(python)
        settings = connection.settings_dict
        user, password = quote(settings["USER"] or ""), quote(settings["PASSWORD"] or "")
        credentials = f"{user}:{password}" if password else user
        self.connect_options: dict[str, Any] = {
            "host": settings["HOST"] or None,
            "port": settings["PORT"] or None,
            "user": settings["USER"] or None,
            "password": settings["PASSWORD"] or None,
        }
        self.database = database
        # Only what a deployment of the host would have: the broker comes from the installed
        # wheel, nothing from this checkout, this test run's settings or its environment.
        self.environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONDONTWRITEBYTECODE": "1",
            "DATABASE_URL": (
                f"postgres://{credentials}@{settings['HOST']}:{settings['PORT']}/{database}"
            ),
            "SHOP_ALLOW_PRIVATE_CALLBACKS": "true",  # the receiver listens on loopback
        }

    def admin_sql(self, statement: str) -> None:
        with psycopg.connect(dbname="postgres", autocommit=True, **self.connect_options) as db:
            db.execute(statement)

    def rows(self, query: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(dbname=self.database, **self.connect_options) as db:
            return db.execute(query).fetchall()

    def manage(self, *arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.python, "manage.py", *arguments],
            cwd=EXAMPLE,
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def start(self, *arguments: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [self.python, "manage.py", *arguments],
            cwd=EXAMPLE,
            env=self.environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


MESSAGES = f"SELECT public_id, payload FROM {Message._meta.db_table}"  # noqa: S608
# Every job, with its message's and its consumer's public IDs.
JOBS = f"""
SELECT m.public_id, c.public_id, j.status FROM {Job._meta.db_table} j
JOIN {Message._meta.db_table} m ON m.id = j.message_id
JOIN {Consumer._meta.db_table} c ON c.id = j.consumer_id
"""  # noqa: S608 (table names from model metadata)


@pytest.fixture
def host(installed_broker) -> Iterator[HostProject]:
    host = HostProject(f"outbox_example_{os.getpid()}", installed_broker.python)
    host.admin_sql(f"DROP DATABASE IF EXISTS {host.database} WITH (FORCE)")
    host.admin_sql(f"CREATE DATABASE {host.database}")
    yield host
    host.admin_sql(f"DROP DATABASE IF EXISTS {host.database} WITH (FORCE)")


def assert_succeeded(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"{result.args}\n{result.stdout}\n{result.stderr}"


@pytest.mark.slow  # the broker's wheel installed in a fresh venv: a minute and more
def test_the_example_host_project_publishes_exactly_what_it_commits(host, receiver, tmp_path):
    # The example's seed, with its consumer pointed at the test's receiver.
    seed = (EXAMPLE / "broker-seed.cfg").read_text()
    assert "https://billing.example.com/hooks/orders" in seed
    seed_file = tmp_path / "seed.cfg"
    seed_file.write_text(seed.replace("https://billing.example.com/hooks/orders", receiver.url()))

    assert_succeeded(host.manage("makemigrations", "shop", "--check", "--dry-run"))
    assert_succeeded(host.manage("migrate"))
    assert_succeeded(host.manage("load_seed", str(seed_file)))
    declined = host.manage("place_order", "bob", "99.00", "--decline-payment")
    assert declined.returncode == 1
    assert "declined; nothing was kept" in declined.stderr
    assert_succeeded(host.manage("place_order", "ada", "12.50"))

    orders = host.rows("SELECT id, customer FROM shop_order")
    assert [customer for _, customer in orders] == ["ada"]
    order_id = orders[0][0]
    message_id = f"order.created:{order_id}"
    messages = host.rows(MESSAGES)
    assert [public_id for public_id, _ in messages] == [message_id]
    order_created = {"event": "order.created", "order": order_id, "customer": "ada"}
    assert json.loads(bytes(messages[0][1])) == {**order_created, "total": "12.50"}
    assert host.rows(JOBS) == [(message_id, "billing", QUEUED.value)]

    # The host's own `manage.py dispatch` delivers it.
    dispatcher = host.start("dispatch", "--poll-seconds", "0.2")
    try:
        deadline = time.monotonic() + 15
        while host.rows(JOBS) != [(message_id, "billing", DELIVERED.value)]:
            assert time.monotonic() < deadline, "not delivered in time"
            assert dispatcher.poll() is None, dispatcher.communicate()[0]
            time.sleep(0.1)
    finally:
        dispatcher.send_signal(signal.SIGTERM)
        output = dispatcher.communicate(timeout=15)[0]
    assert dispatcher.returncode == 0, output
    assert [request.headers["X-Broker-Message-ID"] for request in receiver.received] == [message_id]
    assert delivered_bodies(receiver) == [{**order_created, "total": "12.50"}]
