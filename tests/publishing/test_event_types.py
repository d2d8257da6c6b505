"""Event types (broker/event_types.py, issue 19): a message's type decides which consumers of its
channel get a job, in each of the queue's fan-outs (publish, batch, scheduled release), the
statements matching as broker/event_types.py does; and the type travels
with the message to the API, pull consumers and push deliveries."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from hypothesis import given
from hypothesis import strategies as st

from broker import publish, publish_many
from broker.event_types import InvalidEventType, checked_patterns, matches, parse_patterns
from broker.models import Message
from broker.publishing import InvalidMessage
from broker.publishing_batch import BatchMessage
from broker.seed import SeedError, apply_seed, parse_seed
from consumers.models import Consumer
from jobs.models import Job
from jobs.queue import release_due_messages
from jobs.queue.queries import fragment
from tests.conftest import ADMIN_TOKEN, FORM
from tests.delivery import push_consumer, run_once
from tests.helpers import BROADCAST_HEADERS, make_consumer, make_consumer_with_token, tokens

pytestmark = pytest.mark.django_db

# (patterns, event type, receives?)
RULES = [
    ([], "order.created", True),
    ([], None, True),
    (["*"], None, True),
    (["*"], "anything", True),
    (["order.created"], "order.created", True),
    (["order.created"], "order.created.v2", False),
    (["order.*"], "order.created", True),
    (["order.*"], "order.item.added", True),
    (["order.*"], "order", False),
    (["order.*"], "orders.created", False),
    (["order*"], "orders.created", True),
    (["order.*", "invoice.paid"], "invoice.paid", True),
    (["order.*", "invoice.paid"], "invoice.void", False),
    (["order.*"], None, False),
    (["order.created"], None, False),
]


@pytest.mark.parametrize(("patterns", "event_type", "receives"), RULES)
def test_the_rule(patterns, event_type, receives):
    assert matches(patterns, event_type) is receives


def test_patterns_are_checked_and_tidied():
    assert parse_patterns(" order.* , invoice.paid,,order.*, ") == ["order.*", "invoice.paid"]
    assert parse_patterns("") == []
    for bad in ["order.**", "*.created", "order created", "é", "x" * 256, "or*der"]:
        with pytest.raises(InvalidEventType, match="not valid"):
            checked_patterns([bad])


def channel_with_subscribers(channel) -> dict[str, Consumer]:
    subscriptions = {
        "everything": [],
        "star": ["*"],
        "orders": ["order.*"],
        "created": ["order.created"],
        "invoices": ["invoice.*", "refund.issued"],
    }
    consumers = {}
    for name, patterns in subscriptions.items():
        consumer = make_consumer(channel, name)
        consumer.event_types = patterns
        consumer.save()
        consumers[name] = consumer
    return consumers


def receivers(message: Message) -> set[str]:
    return set(Job.objects.filter(message=message).values_list("consumer__public_id", flat=True))


def test_publish_makes_jobs_for_the_subscribed_consumers_only(channel):
    channel_with_subscribers(channel)

    created = publish(channel, b"1", producer="shop", event_type="order.created")
    paid = publish(channel, b"2", producer="shop", event_type="invoice.paid")
    untyped = publish(channel, b"3", producer="shop")

    assert receivers(created) == {"everything", "star", "orders", "created"}
    assert receivers(paid) == {"everything", "star", "invoices"}
    assert receivers(untyped) == {"everything", "star"}
    assert Message.objects.get(pk=created.pk).event_type == "order.created"
    assert Message.objects.get(pk=untyped.pk).event_type is None


def test_a_message_no_consumer_subscribes_to_is_stored_acknowledged(channel):
    consumer = make_consumer(channel, "orders")
    consumer.event_types = ["order.*"]
    consumer.save()

    message = publish(channel, b"x", producer="shop", event_type="invoice.paid")

    stored = Message.objects.get(pk=message.pk)
    assert stored.status == Message.Status.ACKNOWLEDGED
    assert stored.dispatched_at is None
    assert not Job.objects.exists()


def test_a_batch_fans_each_message_out_by_its_own_type(channel):
    channel_with_subscribers(channel)

    publish_many(
        channel,
        [
            BatchMessage(b"1", message_id="a", event_type="order.created"),
            BatchMessage(b"2", message_id="b", event_type="nobody.cares"),
            BatchMessage(b"3", message_id="c"),
        ],
        producer="shop",
    )

    a, b, c = (Message.objects.get(public_id=public_id) for public_id in "abc")
    assert receivers(a) == {"everything", "star", "orders", "created"}
    assert receivers(b) == {"everything", "star"}
    assert receivers(c) == {"everything", "star"}
    assert (a.event_type, b.event_type, c.event_type) == ("order.created", "nobody.cares", None)
    assert {m.status for m in (a, b, c)} == {Message.Status.DISPATCHED}


def test_a_batch_message_nobody_subscribes_to_is_acknowledged(channel):
    consumer = make_consumer(channel, "orders")
    consumer.event_types = ["order.*"]
    consumer.save()

    publish_many(
        channel,
        [
            BatchMessage(b"1", message_id="a", event_type="order.created"),
            BatchMessage(b"2", message_id="b", event_type="invoice.paid"),
        ],
        producer="shop",
    )

    statuses = dict(Message.objects.values_list("public_id", "status"))
    assert statuses == {"a": Message.Status.DISPATCHED, "b": Message.Status.ACKNOWLEDGED}
    assert Job.objects.count() == 1


def test_a_scheduled_message_goes_to_those_subscribed_at_its_release(channel):
    consumers = channel_with_subscribers(channel)
    due = datetime(2030, 1, 1, tzinfo=UTC)
    message = publish(channel, b"x", producer="shop", event_type="refund.issued", scheduled_for=due)
    consumers["orders"].event_types = ["refund.*"]  # subscribed after publish, before release
    consumers["orders"].save()

    assert release_due_messages(now=due + timedelta(seconds=1)) == 1

    assert receivers(message) == {"everything", "star", "invoices", "orders"}


def test_an_invalid_event_type_is_refused_and_nothing_stored(channel):
    for bad in ["", "has space", "x" * 256, "é"]:
        with pytest.raises(InvalidMessage, match=r"[Ee]vent type") as refused:
            publish(channel, b"x", producer="shop", event_type=bad)
        assert refused.value.field == "event_type"
    assert not Message.objects.exists()


@given(
    patterns=st.lists(
        st.sampled_from(["*", "a", "a.*", "a.b", "a.b*", "b.*", "ab", "a*", "b"]), max_size=4
    ),
    event_type=st.none() | st.sampled_from(["a", "a.b", "a.b.c", "ab", "b", "b.x", "c"]),
)
def test_postgresql_and_python_give_the_same_answer(patterns, event_type):
    rule = fragment("subscribed", "consumer", fragment("matching_patterns", "%(type)s::text"))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {rule} FROM (SELECT %(patterns)s::jsonb) AS consumer(event_types)",  # noqa: S608
            {"type": event_type, "patterns": json.dumps(patterns)},
        )
        [in_sql] = cursor.fetchone()
    assert in_sql is matches(patterns, event_type)


# --- the wire --------------------------------------------------------------------------------


def broadcast(client, **headers):
    return client.post(
        "/channel/orders/broadcast",
        b'{"id": 1}',
        content_type="application/json",
        headers={**BROADCAST_HEADERS, **headers},
    )


def test_the_broadcast_header_sets_the_type_shown_on_the_message(client, channel, settings):
    settings.BROKER_ADMIN_TOKENS = [ADMIN_TOKEN]
    response = broadcast(
        client, **{"X-Broker-Message-ID": "m1", "X-Broker-Event-Type": "order.created"}
    )
    assert response.status_code == 201

    shown = client.get(
        "/channel/orders/message/m1", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )

    assert shown.json()["EventType"] == "order.created"


@pytest.mark.parametrize("value", ["", "has space", "x" * 256, "a/b"])
def test_an_invalid_broadcast_header_is_a_400_naming_it(client, channel, value):
    response = broadcast(client, **{"X-Broker-Event-Type": value})

    assert response.status_code == 400
    assert "Event type" in response.json()["Error"] or "event type" in response.json()["Error"]
    assert not Message.objects.exists()


def test_a_consumer_subscribes_through_the_api(admin_client, channel):
    put = admin_client.put(
        "/channel/orders/consumer/billing",
        "callbackUrl=http%3A%2F%2F127.0.0.1%3A9%2Fhook&eventTypes=order.*%2C+invoice.paid",
        content_type=FORM,
    )
    assert put.status_code == 200, put.content
    assert put.json()["EventTypes"] == ["order.*", "invoice.paid"]

    refused = admin_client.put(
        "/channel/orders/consumer/billing",
        "callbackUrl=http%3A%2F%2F127.0.0.1%3A9%2Fhook&eventTypes=order.**",
        content_type=FORM,
    )
    assert refused.status_code == 400
    assert "order.**" in refused.content.decode()
    assert Consumer.objects.get().event_types == ["order.*", "invoice.paid"]

    cleared = admin_client.put(
        "/channel/orders/consumer/billing",
        "callbackUrl=http%3A%2F%2F127.0.0.1%3A9%2Fhook&eventTypes=",
        content_type=FORM,
        headers={"If-Unmodified-Since": put["Last-Modified"]},
    )
    assert cleared.status_code == 200, cleared.content
    assert cleared.json()["EventTypes"] == []


def test_a_push_delivery_carries_the_type(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    publish(channel, b"1", producer="shop", event_type="order.created")
    publish(channel, b"2", producer="shop")

    run_once(dispatcher)

    sent = sorted(receiver.received, key=lambda request: request.body)
    assert sent[0].headers["X-Broker-Event-Type"] == "order.created"
    assert "X-Broker-Event-Type" not in sent[1].headers


def test_a_pull_consumer_sees_the_type(client, channel):
    make_consumer_with_token(channel)
    publish(channel, b"x", producer="shop", event_type="order.created")

    response = client.get("/channel/orders/consumer/worker/queued-jobs", headers=tokens())

    [job] = response.json()["Result"]
    assert job["Message"]["EventType"] == "order.created"


def test_the_seed_sets_a_consumers_event_types():
    text = """
[initial-channels]
orders = Orders
[initial-consumers]
billing = http://127.0.0.1:9/hook
[billing]
channel = orders
eventTypes = order.*, invoice.paid
"""
    apply_seed(parse_seed(text))
    assert Consumer.objects.get().event_types == ["order.*", "invoice.paid"]

    with pytest.raises(SeedError, match="eventTypes"):
        parse_seed(text.replace("order.*, invoice.paid", "order.**"))


def test_a_replay_creates_jobs_only_for_new_consumers_subscribed_to_the_type(channel):
    from broker.replay import NOT_SUBSCRIBED, replay

    make_consumer(channel, "first")
    message = publish(channel, b"x", producer="shop", event_type="invoice.paid")
    Job.objects.update(status="DELIVERED")
    for name, patterns in {"orders": ["order.*"], "invoices": ["invoice.*"]}.items():
        consumer = make_consumer(channel, name)
        consumer.event_types = patterns
        consumer.save()

    result = replay(message)

    assert result.created == ["invoices"]
    assert [(s.consumer, s.reason) for s in result.skipped] == [("orders", NOT_SUBSCRIBED)]
    assert receivers(message) == {"first", "invoices"}
