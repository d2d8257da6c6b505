"""The publish service: validation, fan-out, atomicity, duplicates, the outbox (docs/data-model.md;
docs/outbox.md)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from broker import publish
from broker.models import Message
from broker.publishing import (
    DuplicateMessage,
    InvalidMessage,
    PayloadTooLarge,
    UnknownChannel,
    UnknownProducer,
)
from jobs.models import Job
from jobs.states import QUEUED
from tests.helpers import at_once, make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db


REFUSE_JOB_TRIGGER = [
    "CREATE FUNCTION refuse_job() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN RAISE EXCEPTION 'job insert refused'; END $$",
    "CREATE TRIGGER refuse_job BEFORE INSERT ON jobs_job FOR EACH ROW "
    "WHEN (NEW.consumer_id = {consumer_id}) EXECUTE FUNCTION refuse_job()",
]


def test_publish_creates_the_message_and_one_queued_job_per_consumer(channel):
    consumers = [make_consumer(channel, name) for name in ("billing", "audit", "search")]
    make_consumer(make_channel("other"), "elsewhere")

    message = publish("orders", b'{"id": 1}', producer="shop", priority=5, message_id="order-1")

    stored = Message.objects.get(channel=channel, public_id="order-1")
    assert bytes(stored.payload) == b'{"id": 1}'
    assert (stored.status, stored.priority) == (Message.Status.DISPATCHED, 5)
    assert stored.dispatched_at == stored.received_at
    jobs = Job.objects.filter(message=message)
    assert {job.consumer_id for job in jobs} == {consumer.pk for consumer in consumers}
    assert {(job.status, job.priority, job.attempts) for job in jobs} == {(QUEUED, 5, 0)}


def test_a_message_without_consumers_is_acknowledged_only(channel):
    message = publish(channel, "hello", producer="shop")

    assert message.status == Message.Status.ACKNOWLEDGED
    assert message.dispatched_at is None
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("payload", "content_type", "body", "expected_type"),
    [
        (b"\x00\x01", None, b"\x00\x01", "application/octet-stream"),
        ("héllo", None, "héllo".encode(), "text/plain; charset=utf-8"),
        ({"a": [1, 2]}, None, b'{"a": [1, 2]}', "application/json"),
        (b"<x/>", "application/xml", b"<x/>", "application/xml"),
    ],
)
def test_payload_encoding_and_content_type(channel, payload, content_type, body, expected_type):
    message = publish(channel, payload, producer="shop", content_type=content_type)

    message.refresh_from_db()
    assert (bytes(message.payload), message.content_type) == (body, expected_type)


def test_generated_message_ids_are_unique(channel):
    ids = {publish(channel, b"x", producer="shop").public_id for _ in range(20)}

    assert len(ids) == 20


def test_metadata_headers_are_kept(channel):
    message = publish(channel, b"x", producer="shop", headers={"X-Trace-Id": "abc"})

    message.refresh_from_db()
    assert message.headers == {"X-Trace-Id": "abc"}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"payload": b""}, InvalidMessage),
        ({"payload": 42}, InvalidMessage),
        ({"message_id": ""}, InvalidMessage),
        ({"message_id": "a/b"}, InvalidMessage),
        ({"message_id": ".."}, InvalidMessage),
        ({"message_id": "x" * 256}, InvalidMessage),
        ({"priority": "high"}, InvalidMessage),
        ({"priority": True}, InvalidMessage),
        ({"priority": 2**31}, InvalidMessage),
        ({"headers": {"Bad Name": "v"}}, InvalidMessage),
        ({"headers": {"X-Ok": "line\r\nX-Injected: 1"}}, InvalidMessage),
        ({"headers": {f"X-{i}": "v" for i in range(51)}}, InvalidMessage),
        ({"content_type": "text/plain\r\nX-Injected: 1"}, InvalidMessage),
        ({"channel": "missing"}, UnknownChannel),
        ({"producer": "missing"}, UnknownProducer),
    ],
)
def test_bad_input_is_refused_and_stores_nothing(channel, kwargs, error):
    make_consumer(channel)
    arguments = {"channel": "orders", "payload": b"x", "producer": "shop", **kwargs}

    with pytest.raises(error):
        publish(arguments.pop("channel"), arguments.pop("payload"), **arguments)

    assert not Message.objects.exists()
    assert not Job.objects.exists()


def test_payload_over_the_limit_is_refused(channel, settings):
    settings.BROKER_MAX_PAYLOAD_BYTES = 10

    publish(channel, b"x" * 10, producer="shop")
    with pytest.raises(PayloadTooLarge):
        publish(channel, b"x" * 11, producer="shop")

    assert Message.objects.count() == 1


def test_duplicate_message_id_is_refused_and_changes_nothing(channel):
    make_consumer(channel)
    original = publish(channel, b"first", producer="shop", message_id="order-1")

    with pytest.raises(DuplicateMessage, match="order-1"):
        publish(channel, b"second", producer="shop", message_id="order-1")

    assert list(Message.objects.values_list("pk", flat=True)) == [original.pk]
    assert bytes(Message.objects.get().payload) == b"first"
    assert Job.objects.count() == 1


def test_the_same_message_id_is_fine_in_another_channel(channel):
    publish(channel, b"x", producer="shop", message_id="order-1")
    publish(make_channel("other"), b"x", producer="shop", message_id="order-1")

    assert Message.objects.filter(public_id="order-1").count() == 2


def test_a_failure_while_inserting_jobs_leaves_no_message(channel):
    make_consumer(channel, "billing")
    doomed = make_consumer(channel, "doomed")
    # A real database failure in the middle of the fan-out: a trigger rejects one consumer's job
    # after the message and possibly other jobs were inserted.
    with connection.cursor() as cursor:
        for statement in REFUSE_JOB_TRIGGER:
            cursor.execute(statement.format(consumer_id=doomed.pk))

    with pytest.raises(DatabaseError, match="job insert refused"):
        publish(channel, b"x", producer="shop", message_id="order-1")

    assert not Message.objects.exists()
    assert not Job.objects.exists()


def test_outbox_rollback_publishes_nothing(channel):
    make_consumer(channel)

    def callers_unit_of_work() -> None:
        with transaction.atomic():
            publish(channel, b"x", producer="shop")
            raise RuntimeError("the caller's own work failed")

    with pytest.raises(RuntimeError):
        callers_unit_of_work()

    assert not Message.objects.exists()
    assert not Job.objects.exists()


def test_outbox_commit_publishes_with_the_callers_work(channel):
    make_consumer(channel)

    with transaction.atomic():
        make_producer("created-in-the-same-transaction")
        publish(channel, b"x", producer="shop")

    assert Message.objects.count() == 1
    assert Job.objects.count() == 1


def test_a_duplicate_inside_a_callers_transaction_leaves_it_usable(channel):
    publish(channel, b"x", producer="shop", message_id="order-1")

    with transaction.atomic():
        with pytest.raises(DuplicateMessage):
            publish(channel, b"y", producer="shop", message_id="order-1")
        publish(channel, b"z", producer="shop", message_id="order-2")

    assert set(Message.objects.values_list("public_id", flat=True)) == {"order-1", "order-2"}


@pytest.mark.django_db(transaction=True)
def test_concurrent_publishers_of_one_id_get_exactly_one_message():
    channel = make_channel()
    make_producer()
    make_consumer(channel)
    outcomes: list[str] = []

    def publisher() -> None:
        try:
            publish("orders", b"x", producer="shop", message_id="order-1")
            outcomes.append("published")
        except DuplicateMessage:
            outcomes.append("duplicate")

    at_once(*[publisher] * 4)

    assert sorted(outcomes) == ["duplicate"] * 3 + ["published"]
    assert Message.objects.count() == 1
    assert Job.objects.count() == 1
