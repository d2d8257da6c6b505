"""Short transactions, bounded locks (issue 36; docs/dispatcher.md, "Short transactions, bounded
locks"): a session holding a consumer's row stalls nobody else's deliveries, and the broker's own
sessions neither wait nor hold locks without bound."""

from __future__ import annotations

import time

import pytest
from django.db import OperationalError, connection

from broker import publish
from consumers.models import Consumer
from jobs.models import DeliveryAttempt, Job
from jobs.states import DELIVERED
from tests.delivery import push_consumer
from tests.helpers import another_session, make_channel, make_producer
from tests.processes import kill_if_running, start_dispatcher, wait_until
from tests.receiver import Reply

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_broker_sessions_bound_lock_waits_and_idle_transactions():
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone() == ("5s",)
        cursor.execute("SHOW idle_in_transaction_session_timeout")
        assert cursor.fetchone() == ("30s",)


def test_a_consumer_row_held_by_another_session_stalls_no_other_consumer(receiver):
    """psql holds a failing consumer's row FOR UPDATE and stays idle in its transaction. Before,
    the dispatcher's recording waited on that row for ever (counting the circuit's failures), and
    with it every outcome of the batch: a healthy consumer of another channel got stuck INFLIGHT.
    Now its jobs go through, the locked consumer's failures are recorded too (its circuit row
    skipped), and a publish to the locked consumer's channel fails after the lock timeout
    instead of hanging."""
    make_producer()
    failing_channel, healthy_channel = make_channel("failing"), make_channel("healthy")
    receiver.replies["/down"] = Reply(status=500)
    locked = push_consumer(failing_channel, receiver, "down", "/down")
    healthy = push_consumer(healthy_channel, receiver, "up", "/up")
    for number in range(20):
        publish(failing_channel, b"{}", producer="shop", message_id=f"f{number}")
    with another_session() as psql:
        psql.execute(
            f"SELECT * FROM {Consumer._meta.db_table} WHERE id = %s FOR UPDATE",  # noqa: S608
            [locked.pk],
        )  # and now idle in transaction
        process = start_dispatcher()
        try:
            for number in range(100):
                publish(healthy_channel, b"{}", producer="shop", message_id=f"h{number}")
            delivered = Job.objects.filter(consumer=healthy, status=DELIVERED)
            wait_until(lambda: delivered.count() == 100, 30)
            failures = DeliveryAttempt.objects.filter(consumer_id=locked.pk)
            wait_until(lambda: failures.count() >= 20, 30)
            started = time.monotonic()
            with pytest.raises(OperationalError, match="lock timeout"):
                publish(failing_channel, b"{}", producer="shop", message_id="while-locked")
            waited = time.monotonic() - started
        finally:
            kill_if_running(process)
    assert 4 < waited < 15
    assert not Job.objects.filter(message__public_id="while-locked").exists()
