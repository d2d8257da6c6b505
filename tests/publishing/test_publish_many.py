"""publish_many(): many messages in one queue operation, all or nothing, in the caller's
transaction (docs/outbox.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from broker import publish, publish_many
from broker.models import Message
from broker.publishing import UnknownChannel, UnknownProducer
from broker.publishing_batch import (
    BatchMessage,
    BatchTooLarge,
    DuplicateMessages,
    InvalidBatch,
    ItemError,
    PublishedMessage,
    TooManyMessages,
)
from jobs.models import Job
from jobs.queue import release_due_messages
from jobs.queue.rules import WAKEUP_CHANNEL
from tests.db_snapshot import snapshot
from tests.helpers import make_channel, make_consumer, make_producer
from tests.publishing.test_publishing import REFUSE_JOB_TRIGGER
from tests.wakeup import listening

pytestmark = pytest.mark.django_db

LATER = datetime(2999, 1, 1, tzinfo=UTC)


@pytest.fixture
def consumers(channel):
    return [make_consumer(channel, "billing"), make_consumer(channel, "audit")]


def batch(*ids: str, **fields) -> list[BatchMessage]:
    return [
        BatchMessage(f"payload of {public_id}", message_id=public_id, **fields) for public_id in ids
    ]


def test_publish_many_stores_the_messages_and_their_jobs_in_order(channel, consumers):
    published = publish_many(channel, batch("a", "b", "c"), producer="shop")

    messages = list(Message.objects.order_by("pk"))
    assert published == [PublishedMessage(m.public_id, m.pk, False) for m in messages]
    assert [m.public_id for m in messages] == ["a", "b", "c"]
    assert {m.status for m in messages} == {Message.Status.DISPATCHED}
    assert {m.dispatched_at for m in messages} == {messages[0].received_at}
    assert bytes(messages[1].payload) == b"payload of b"
    for consumer in consumers:
        jobs = Job.objects.filter(consumer=consumer).order_by("pk")
        assert [job.message.public_id for job in jobs] == ["a", "b", "c"]


def test_a_full_batch_of_the_default_limit(channel, consumers):
    ids = [f"m-{n}" for n in range(1000)]  # BROKER_MAX_BATCH_MESSAGES' default

    published = publish_many(channel, batch(*ids), producer="shop")

    assert [p.message_id for p in published] == ids
    assert list(Message.objects.order_by("pk").values_list("public_id", flat=True)) == ids
    assert Job.objects.count() == 2000


def test_each_message_is_what_publish_would_store(channel, consumers):
    fields: dict[str, Any] = {
        "priority": 3,
        "headers": {"X-Tenant": "t1"},
        "content_type": "text/csv",
        "ordering_key": "k",
    }
    publish(channel, "same", producer="shop", message_id="single", **fields)
    publish_many(channel, [BatchMessage("same", message_id="many", **fields)], producer="shop")

    def stored(public_id: str):
        return Message.objects.filter(public_id=public_id).values_list(
            "payload",
            "payload_size",
            "content_type",
            "priority",
            "headers",
            "ordering_key",
            "status",
        )[0]

    assert stored("many") == stored("single")
    jobs = Job.objects.filter(message__public_id="many")
    assert set(jobs.values_list("priority", "ordering_key", "status")) == {(3, "k", "QUEUED")}


def test_payloads_are_encoded_as_publish_encodes_them(channel):
    publish_many(
        channel,
        [BatchMessage(b"\x00"), BatchMessage("text"), BatchMessage({"a": 1}), BatchMessage([1])],
        producer="shop",
    )

    assert list(Message.objects.order_by("pk").values_list("content_type", flat=True)) == [
        "application/octet-stream",
        "text/plain; charset=utf-8",
        "application/json",
        "application/json",
    ]


def test_scheduled_messages_wait_for_their_release(channel, consumers):
    published = publish_many(
        channel, [*batch("now"), *batch("later", scheduled_for=LATER)], producer="shop"
    )

    assert [p.scheduled for p in published] == [False, True]
    later = Message.objects.get(public_id="later")
    assert (later.status, later.scheduled_for) == (Message.Status.SCHEDULED, LATER)
    assert not Job.objects.filter(message=later).exists()
    assert release_due_messages(LATER) == 1
    assert Job.objects.filter(message=later).count() == 2


def test_every_invalid_message_is_listed_and_nothing_is_stored(channel, consumers):
    before = snapshot()

    with pytest.raises(InvalidBatch) as refused:
        publish_many(
            channel,
            [
                BatchMessage("fine"),
                BatchMessage("x", message_id="bad id"),
                BatchMessage("x", priority=2**31),
                BatchMessage(""),
                BatchMessage("x", headers={"Cookie": "c"}, ordering_key="k" * 256),
                BatchMessage("x", scheduled_for=datetime(2999, 1, 1)),  # naive
            ],
            producer="shop",
        )

    assert [(e.index, e.field) for e in refused.value.errors] == [
        (1, "message_id"),
        (2, "priority"),
        (3, "payload"),
        (4, "headers"),  # the first problem of a message is its one
        (5, "scheduled_for"),
    ]
    assert snapshot() == before


def test_a_payload_over_the_limit_makes_it_too_large(channel, settings):
    settings.BROKER_MAX_PAYLOAD_BYTES = 5

    with pytest.raises(BatchTooLarge) as refused:
        publish_many(channel, [BatchMessage("12345"), BatchMessage("123456")], producer="shop")

    assert refused.value.errors == [ItemError(1, "payload", refused.value.errors[0].message, True)]
    assert not Message.objects.exists()


def test_more_than_the_batch_limit_is_refused(channel, settings):
    settings.BROKER_MAX_BATCH_MESSAGES = 2

    with pytest.raises(TooManyMessages):
        publish_many(channel, batch("a", "b", "c"), producer="shop")

    assert not Message.objects.exists()


def test_an_empty_batch_stores_nothing(channel, django_assert_num_queries):
    with django_assert_num_queries(0):
        assert publish_many(channel, [], producer="shop") == []


def test_duplicates_in_the_batch_or_the_channel_are_named(channel, consumers):
    publish(channel, "x", producer="shop", message_id="taken")
    before = snapshot()

    with pytest.raises(DuplicateMessages) as twice:
        publish_many(channel, batch("a", "b", "a"), producer="shop")
    with pytest.raises(DuplicateMessages) as taken:
        publish_many(channel, batch("new", "taken"), producer="shop")

    assert (twice.value.ids, taken.value.ids) == (["a"], ["taken"])
    assert snapshot() == before


def test_unknown_channel_or_producer_stores_nothing(channel):
    make_channel("other")

    with pytest.raises(UnknownChannel):
        publish_many("nope", batch("a"), producer="shop")
    with pytest.raises(UnknownProducer):
        publish_many("other", batch("a"), producer="stranger")

    assert not Message.objects.exists()


def test_a_failure_while_inserting_jobs_leaves_no_message(channel):
    make_consumer(channel, "billing")
    doomed = make_consumer(channel, "doomed")
    with connection.cursor() as cursor:
        for statement in REFUSE_JOB_TRIGGER:
            cursor.execute(statement.format(consumer_id=doomed.pk))

    with pytest.raises(DatabaseError, match="job insert refused"):
        publish_many(channel, batch("a", "b"), producer="shop")

    assert not Message.objects.exists()
    assert not Job.objects.exists()


# --- in the caller's transaction (the outbox) --------------------------------------------------


def test_a_rolled_back_caller_publishes_nothing(channel, consumers):
    def callers_unit_of_work() -> None:
        with transaction.atomic():
            publish_many(channel, batch("a", "b"), producer="shop")
            raise RuntimeError("the caller's own work failed")

    with pytest.raises(RuntimeError):
        callers_unit_of_work()

    assert not Message.objects.exists()
    assert not Job.objects.exists()


def test_a_committed_caller_publishes_with_its_own_work(channel, consumers):
    with transaction.atomic():
        make_producer("created-in-the-same-transaction")
        publish_many(channel, batch("a", "b"), producer="created-in-the-same-transaction")

    assert Message.objects.count() == 2
    assert Job.objects.count() == 4


def test_a_duplicate_inside_a_callers_transaction_leaves_it_usable(channel):
    publish(channel, "x", producer="shop", message_id="taken")

    with transaction.atomic():
        with pytest.raises(DuplicateMessages):
            publish_many(channel, batch("a", "taken"), producer="shop")
        publish_many(channel, batch("b"), producer="shop")

    assert set(Message.objects.values_list("public_id", flat=True)) == {"taken", "b"}


# --- waking the dispatchers ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_batch_wakes_the_dispatchers_once_and_a_scheduled_one_not_at_all():
    channel = make_channel()
    make_producer()
    make_consumer(channel)
    with listening(guard=True) as listener:  # as an idle dispatcher does
        publish_many(channel, [BatchMessage(str(n)) for n in range(50)], producer="shop")
        woken = [n.channel for n in listener.notifies(timeout=1)]
        publish_many(channel, batch("later", scheduled_for=LATER), producer="shop")
        scheduled = [n.channel for n in listener.notifies(timeout=0.3)]

    assert (woken, scheduled) == ([WAKEUP_CHANNEL], [])
    assert Job.objects.count() == 50
