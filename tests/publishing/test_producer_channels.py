"""BROKER_PRODUCER_CHANNELS=bound in process (docs/api.md, "Producers bound to channels"): the
queue's inserts, `publish()` and `publish_many()` (the outbox), scheduled
messages, and periodic messages when they are saved and when they tick."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.http import http_date

from broker import publish, publish_many
from broker.models import Channel, Message, PeriodicMessage
from broker.periodic import run_due_ticks
from broker.publishing import ProducerNotAllowed, PublishError
from broker.publishing_batch import BatchMessage
from broker.tokens import hash_token
from jobs import queue
from jobs.models import Job
from tests.conftest import FORM
from tests.helpers import make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def channels() -> tuple[Channel, Channel]:
    """ "shop" may publish to "orders", not to "audit"; both channels have a consumer."""
    orders = make_channel("orders", token="orders-token")
    audit = make_channel("audit", token="audit-token")
    make_producer("shop", token="shop-token").allowed_channels.set([orders])
    make_consumer(orders, "warehouse")
    make_consumer(audit, "auditor")
    return orders, audit


@pytest.fixture
def bound(settings):
    settings.BROKER_PRODUCER_CHANNELS = "bound"


def unsaved(channel_id: str, message_id: str) -> Message:
    return Message(
        channel_id=channel_id,
        producer_id="shop",
        public_id=message_id,
        payload=b"{}",
        payload_size=2,
        content_type="application/json",
        received_at=NOW,
    )


def stored() -> list[tuple[str, str]]:
    return sorted(Message.objects.values_list("channel_id", "public_id"))


# --- the queue's inserts ---------------------------------------------------------------------


def test_open_inserts_anywhere_and_bound_only_where_allowed(settings):
    assert queue.insert_message(unsaved("audit", "open-1")) == queue.Inserted(True, True)

    settings.BROKER_PRODUCER_CHANNELS = "bound"
    refused = queue.insert_message(unsaved("audit", "bound-1"))
    allowed = queue.insert_message(unsaved("orders", "bound-2"))

    assert refused == queue.Inserted(True, True, producer_allowed=False)
    assert allowed == queue.Inserted(True, True)
    assert stored() == [("audit", "open-1"), ("orders", "bound-2")]
    assert Job.objects.count() == 2


def test_both_refusals_are_reported_when_both_apply(bound):
    """Wrong tokens and no right to the channel: the queue says both."""
    wrong = queue.TokenDigests(hash_token("guess"), hash_token("shop-token"))
    right = queue.TokenDigests(hash_token("audit-token"), hash_token("shop-token"))

    assert queue.insert_message(unsaved("audit", "m-1"), wrong) == queue.Inserted(
        True, True, tokens_matched=False, producer_allowed=False
    )
    assert queue.insert_message(unsaved("audit", "m-2"), right) == queue.Inserted(
        True, True, producer_allowed=False
    )
    assert not Message.objects.exists()


def test_a_batch_insert_is_refused_whole(bound):
    rows = [queue.NewMessage(f"m-{n}", b"{}", "", 2, "application/json", 0, {}, "") for n in (1, 2)]

    refused = queue.insert_messages(queue.MessageBatch("audit", "shop", NOW, rows))
    allowed = queue.insert_messages(queue.MessageBatch("orders", "shop", NOW, rows))

    assert (refused.producer_allowed, refused.keys) == (False, [])
    assert (allowed.producer_allowed, len(allowed.keys)) == (True, 2)
    assert stored() == [("orders", "m-1"), ("orders", "m-2")]


# --- publish() and publish_many() -------------------------------------------------------------


def test_publish_is_open_by_default():
    publish("audit", {"n": 1}, producer="shop", message_id="m-1")
    publish_many("audit", [BatchMessage("two", message_id="m-2")], producer="shop")

    assert stored() == [("audit", "m-1"), ("audit", "m-2")]


def test_bound_publish_refuses_a_channel_the_producer_is_not_allowed_on(bound):
    with pytest.raises(ProducerNotAllowed, match="Producer 'shop' may not publish to channel"):
        publish("audit", {"n": 1}, producer="shop", message_id="m-1")
    with pytest.raises(ProducerNotAllowed):
        publish_many("audit", [BatchMessage("two", message_id="m-2")], producer="shop")
    publish("orders", {"n": 1}, producer="shop", message_id="m-3")

    assert stored() == [("orders", "m-3")]
    assert Job.objects.count() == 1


def test_bound_a_scheduled_publish_is_refused_at_once(bound):
    later = timezone.now() + timedelta(hours=1)

    with pytest.raises(ProducerNotAllowed):
        publish("audit", "later", producer="shop", message_id="s-1", scheduled_for=later)
    with pytest.raises(ProducerNotAllowed):
        publish_many(
            "audit", [BatchMessage("later", message_id="s-2", scheduled_for=later)], producer="shop"
        )
    publish("orders", "later", producer="shop", message_id="s-3", scheduled_for=later)

    assert stored() == [("orders", "s-3")]


def test_bound_a_refused_publish_leaves_the_callers_transaction_usable(bound):
    with transaction.atomic():
        publish("orders", "first", producer="shop", message_id="m-1")
        with pytest.raises(PublishError):
            publish("audit", "refused", producer="shop", message_id="m-2")
        publish("orders", "after", producer="shop", message_id="m-3")

    assert stored() == [("orders", "m-1"), ("orders", "m-3")]


def test_bound_costs_the_publish_no_extra_round_trip(bound):
    """One statement checks channel, producer and the producer's right, and inserts (the test's
    own transaction adds a savepoint around it, as a caller's would)."""
    with CaptureQueriesContext(connection) as allowed:
        publish("orders", b"one", producer="shop", message_id="m-1")
    with CaptureQueriesContext(connection) as refused, pytest.raises(ProducerNotAllowed):
        publish("audit", b"one", producer="shop", message_id="m-2")

    assert len(statements(allowed)) == 1
    assert len(statements(refused)) == 1


def statements(captured: CaptureQueriesContext) -> list[str]:
    return [
        query["sql"]
        for query in captured.captured_queries
        if not query["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))
    ]


# --- periodic messages ------------------------------------------------------------------------

PERIODIC = "/channel/audit/periodic-message/ping"
EVERY_MINUTE = {"producer": "shop", "payload": '{"ping": 1}', "intervalSeconds": "60"}


def put(client, url: str, data: dict[str, str], changed_at=None):
    headers = {"If-Unmodified-Since": http_date(changed_at.timestamp())} if changed_at else {}
    return client.put(url, urlencode(data), content_type=FORM, headers=headers)


def test_bound_a_schedule_is_refused_when_saved_for_a_channel_not_allowed(admin_client, bound):
    refused = put(admin_client, PERIODIC, EVERY_MINUTE)
    disabled = put(admin_client, PERIODIC, {**EVERY_MINUTE, "enabled": "false"})
    allowed = put(admin_client, "/channel/orders/periodic-message/ping", EVERY_MINUTE)

    assert refused.status_code == 400
    assert "Producer 'shop' may not publish to channel 'audit'" in refused.json()["Error"]
    assert disabled.status_code == 200  # a disabled schedule publishes nothing
    assert allowed.status_code == 200
    schedule = PeriodicMessage.objects.get(channel_id="audit")
    enabling = put(admin_client, PERIODIC, {"enabled": "true"}, schedule.changed_at)
    assert enabling.status_code == 400


def test_a_schedule_whose_producer_lost_the_channel_skips_its_ticks_and_can_be_disabled(
    admin_client, settings, caplog
):
    assert put(admin_client, PERIODIC, EVERY_MINUTE).status_code == 200  # open: allowed
    settings.BROKER_PRODUCER_CHANNELS = "bound"
    schedule = PeriodicMessage.objects.get()

    with caplog.at_level(logging.ERROR, logger="broker.periodic"):
        published = run_due_ticks(now=schedule.next_run_at)

    assert published == 0
    assert not Message.objects.exists()
    schedule.refresh_from_db()
    assert schedule.skipped_ticks == 1
    assert "may not publish to channel 'audit'" in caplog.text
    disabling = put(admin_client, PERIODIC, {"enabled": "false"}, schedule.changed_at)
    assert disabling.status_code == 200
