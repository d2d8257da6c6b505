"""Scheduled messages (docs/scheduled.md): the header, the release, cancel, and the API that shows
them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.utils import timezone

from broker import payloads, publish
from broker.models import Message
from broker.publishing import DuplicateMessage, InvalidMessage
from jobs.models import Job
from jobs.queue import release_due_messages
from tests.helpers import (
    BROADCAST_HEADERS,
    at_once,
    make_channel,
    make_consumer,
    make_consumer_with_token,
    make_producer,
)

pytestmark = pytest.mark.django_db

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=10)


@pytest.fixture
def channel():
    channel = make_channel("orders", token="channel-token")
    make_producer("shop", token="producer-token")
    make_consumer(channel, "billing")
    return channel


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def broadcast(client, when: str | None, body=b'{"id": 1}', **headers):
    if when is not None:
        headers["X-Broker-Scheduled-For"] = when
    return client.post(
        "/channel/orders/broadcast",
        body,
        content_type="application/json",
        headers={**BROADCAST_HEADERS, **headers},
    )


def schedule(message_id: str, when: datetime = LATER, **kwargs) -> Message:
    return publish(
        "orders", b"x", producer="shop", message_id=message_id, scheduled_for=when, **kwargs
    )


# The header


@pytest.mark.parametrize(
    "value",
    [
        "tomorrow",
        "2030-01-01",
        "2030-01-01T13:00:00",  # no offset: which zone?
        "20300101T130000Z",  # ISO 8601 basic format, not RFC 3339
        "2030-01-01T25:00:00Z",
        "2030-02-30T13:00:00Z",
        "9999-12-31T23:59:59-23:59",  # beyond year 9999 in UTC
        "2030-01-01T13:00:00+0100",
    ],
)
def test_a_malformed_schedule_is_400_and_stores_nothing(client, channel, clock, value):
    response = broadcast(client, value)

    assert response.status_code == 400
    assert "X-Broker-Scheduled-For" in response.json()["Error"]
    assert not Message.objects.exists()


def test_a_schedule_sooner_than_the_minimum_delay_is_412(client, channel, clock, settings):
    assert broadcast(client, "2030-01-01T12:01:59Z").status_code == 412
    assert broadcast(client, "2029-12-31T12:00:00Z").status_code == 412
    assert not Message.objects.exists()
    assert broadcast(client, "2030-01-01T12:02:00Z").status_code == 201

    settings.BROKER_MIN_SCHEDULE_DELAY_SECONDS = 10
    assert broadcast(client, "2030-01-01T12:00:09Z").status_code == 412
    assert broadcast(client, "2030-01-01T13:00:10+01:00").status_code == 201


def test_a_scheduled_broadcast_is_stored_without_jobs(client, channel, clock):
    response = broadcast(
        client,
        "2030-01-01T13:10:00.250+01:00",
        **{
            "X-Broker-Message-ID": "later-1",
            "X-Broker-Message-Priority": "7",
            "X-Broker-Ordering-Key": "cart-9",
            "X-Broker-Metadata-Headers": "X-Trace-Id",
            "X-Trace-Id": "abc",
        },
    )

    assert response.status_code == 201
    assert response["Location"] == "/channel/orders/scheduled-message/later-1"
    message = Message.objects.get()
    assert message.status == Message.Status.SCHEDULED
    assert message.scheduled_for == datetime(2030, 1, 1, 12, 10, 0, 250000, tzinfo=UTC)
    assert (message.priority, message.ordering_key) == (7, "cart-9")
    assert message.headers == {"X-Trace-Id": "abc"}
    assert message.dispatched_at is None
    assert not Job.objects.exists()


def test_an_empty_schedule_header_publishes_at_once(client, channel, clock):
    response = broadcast(client, " ")

    assert response.status_code == 201
    assert "/message/" in response["Location"]
    assert Job.objects.count() == 1


# publish() from Python


def test_publish_needs_an_aware_datetime_but_no_minimum_delay(channel, clock):
    with pytest.raises(InvalidMessage):
        schedule("naive", datetime(2030, 1, 1, 13, 0))

    soon = schedule("soon", NOW + timedelta(seconds=1))

    assert soon.status == Message.Status.SCHEDULED
    assert release_due_messages() == 0
    clock.shift(1)
    assert release_due_messages() == 1


# Release


def test_nothing_is_released_before_its_time(channel, clock):
    schedule("later-1")

    clock.move_to(LATER - timedelta(microseconds=1))

    assert release_due_messages() == 0
    assert not Job.objects.exists()
    assert Message.objects.get().status == Message.Status.SCHEDULED


def test_release_fans_out_to_the_consumers_present_at_release_time(client, channel, clock):
    schedule("later-1", priority=4, ordering_key="cart-9")
    channel.consumers.get(public_id="billing").delete()  # gone before the release: no job
    make_consumer(channel, "audit")
    make_consumer_with_token(channel, "worker")  # a pull consumer, token "consumer-token"

    clock.move_to(LATER)
    assert release_due_messages() == 1

    message = Message.objects.get()
    assert message.status == Message.Status.DISPATCHED
    assert message.dispatched_at == LATER
    jobs = Job.objects.filter(message=message).select_related("consumer")
    assert sorted(job.consumer.public_id for job in jobs) == ["audit", "worker"]
    assert {(job.status, job.priority, job.ordering_key) for job in jobs} == {
        ("QUEUED", 4, "cart-9")
    }
    assert release_due_messages() == 0  # released once only
    assert Job.objects.count() == 2
    # Deliverable: the pull consumer is handed it like any other message.
    queued = client.get(
        "/channel/orders/consumer/worker/queued-jobs",
        headers={
            "X-Broker-Channel-Token": "channel-token",
            "X-Broker-Consumer-Token": "consumer-token",
        },
    ).json()["Result"]
    assert [job["Message"]["MessageID"] for job in queued] == ["later-1"]


def test_a_channel_without_consumers_acknowledges_the_message(clock):
    make_channel("orders")
    make_producer("shop")
    schedule("later-1")

    clock.move_to(LATER)

    assert release_due_messages() == 1
    message = Message.objects.get()
    assert (message.status, message.dispatched_at) == (Message.Status.ACKNOWLEDGED, None)


def test_release_keeps_due_order_for_ordered_consumers(channel, clock):
    schedule("second", LATER + timedelta(seconds=2), ordering_key="k")
    schedule("first", LATER + timedelta(seconds=1), ordering_key="k")

    clock.move_to(LATER + timedelta(seconds=5))
    assert release_due_messages() == 2

    in_job_order = Job.objects.order_by("pk").values_list("message__public_id", flat=True)
    assert list(in_job_order) == ["first", "second"]


def test_a_batch_releases_at_most_limit_messages(channel, clock):
    for number in range(5):
        schedule(f"m{number}")
    clock.move_to(LATER)

    assert release_due_messages(limit=3) == 3
    assert release_due_messages(limit=3) == 2
    assert Job.objects.count() == 5


def test_called_every_half_second_a_message_is_released_within_one_second(channel, clock):
    due = NOW + timedelta(minutes=3, milliseconds=300)
    schedule("later-1", due)
    released_at = None

    for _ in range(600):  # five minutes of dispatcher ticks
        clock.shift(0.5)
        if release_due_messages():
            released_at = Message.objects.get().dispatched_at
            break

    assert released_at is not None
    assert due <= released_at < due + timedelta(seconds=1)
    assert Job.objects.get().next_attempt_at == released_at  # claimable at once


# Cancel


def test_cancel_before_release_deletes_the_message_and_its_payload(
    admin_client, channel, clock, settings, django_capture_on_commit_callbacks
):
    settings.BROKER_PAYLOAD_OFFLOAD_BYTES = 10
    big = publish(
        "orders", b"y" * 100, producer="shop", message_id="big", scheduled_for=LATER
    ).payload_file
    assert big
    assert payloads.payload_storage().exists(big)

    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.delete("/channel/orders/scheduled-message/big")

    assert response.status_code == 204
    assert not Message.objects.exists()
    assert not payloads.payload_storage().exists(big)
    clock.move_to(LATER)
    assert release_due_messages() == 0
    assert not Job.objects.exists()
    assert admin_client.get("/channel/orders/scheduled-message/big").status_code == 404


def test_cancel_after_release_is_409_and_changes_nothing(admin_client, channel, clock):
    schedule("later-1")
    clock.move_to(LATER)
    release_due_messages()

    response = admin_client.delete("/channel/orders/scheduled-message/later-1")

    assert response.status_code == 409
    assert "released" in response.json()["Error"]
    assert Message.objects.get().status == Message.Status.DISPATCHED
    assert Job.objects.count() == 1


def test_cancel_of_unknown_or_normal_messages_is_404(admin_client, channel, clock):
    publish("orders", b"x", producer="shop", message_id="now-1")

    assert admin_client.delete("/channel/orders/scheduled-message/now-1").status_code == 404
    assert admin_client.delete("/channel/orders/scheduled-message/nope").status_code == 404
    assert admin_client.delete("/channel/nope/scheduled-message/now-1").status_code == 404
    assert Message.objects.count() == 1


def test_cancel_needs_an_admin(client, channel, clock):
    schedule("later-1")

    assert client.delete("/channel/orders/scheduled-message/later-1").status_code == 401
    assert Message.objects.exists()


# Message IDs are shared with normal messages


def test_a_scheduled_id_already_used_by_a_normal_message_is_409(client, channel, clock):
    assert broadcast(client, None, **{"X-Broker-Message-ID": "m-1"}).status_code == 201

    response = broadcast(client, "2030-01-01T13:00:00Z", **{"X-Broker-Message-ID": "m-1"})

    assert response.status_code == 409
    assert Message.objects.get().status == Message.Status.DISPATCHED


def test_a_normal_id_already_used_by_a_scheduled_message_is_409(client, channel, clock):
    assert (
        broadcast(client, "2030-01-01T13:00:00Z", **{"X-Broker-Message-ID": "m-1"}).status_code
        == 201
    )

    assert broadcast(client, None, **{"X-Broker-Message-ID": "m-1"}).status_code == 409
    assert (
        broadcast(client, "2030-01-01T14:00:00Z", **{"X-Broker-Message-ID": "m-1"}).status_code
        == 409
    )
    with pytest.raises(DuplicateMessage):
        publish("orders", b"x", producer="shop", message_id="m-1")
    assert Message.objects.get().status == Message.Status.SCHEDULED
    assert not Job.objects.exists()


# Reading


def test_read_a_scheduled_message(admin_client, channel, clock):
    schedule("later-1", priority=2, headers={"X-Trace-Id": "abc"}, ordering_key="k")

    body = admin_client.get("/channel/orders/scheduled-message/later-1").json()

    assert body["messageId"] == "later-1"
    assert (body["payload"], body["payloadEncoding"]) == ("x", "utf-8")
    assert (body["contentType"], body["priority"]) == ("application/octet-stream", 2)
    assert (body["producedBy"], body["headers"], body["orderingKey"]) == (
        "shop",
        {"X-Trace-Id": "abc"},
        "k",
    )
    assert (body["dispatchSchedule"], body["dispatchedAt"]) == ("2030-01-01T12:10:00Z", None)
    assert body["dispatchedDate"] is None  # the name before webhook-broker's May 2025 rename
    assert body["status"] == "SCHEDULED"
    assert body["messageURL"] == "/channel/orders/message/later-1"

    clock.move_to(LATER)
    release_due_messages()
    body = admin_client.get("/channel/orders/scheduled-message/later-1").json()

    assert (body["status"], body["dispatchedAt"]) == ("DISPATCHED", "2030-01-01T12:10:00Z")
    assert body["dispatchedDate"] == body["dispatchedAt"]


def test_scheduled_messages_list_and_counts(admin_client, channel, clock):
    publish("orders", b"x", producer="shop", message_id="now-1")
    schedule("s-1", LATER)
    schedule("s-2", LATER + timedelta(minutes=5))
    schedule("s-3", LATER + timedelta(minutes=1))
    clock.move_to(LATER)
    release_due_messages()  # s-1

    def urls(query: str = "") -> list[str]:
        response = admin_client.get(f"/channel/orders/scheduled-messages{query}")
        assert response.status_code == 200
        result: list[str] = response.json()["result"]
        return result

    assert urls() == [f"/channel/orders/scheduled-message/s-{n}" for n in (3, 2, 1)]
    assert (
        urls("?status=SCHEDULED")
        == urls("?status=101")
        == [
            "/channel/orders/scheduled-message/s-3",
            "/channel/orders/scheduled-message/s-2",
        ]
    )
    assert (
        urls("?status=DISPATCHED")
        == urls("?status=102")
        == ["/channel/orders/scheduled-message/s-1"]
    )
    assert admin_client.get("/channel/orders/scheduled-messages?status=103").status_code == 400
    assert admin_client.get("/channel/nope/scheduled-messages").status_code == 404

    counts = admin_client.get("/channel/orders/messages-status").json()
    assert counts["counts"] == {
        "DISPATCHED": {"Count": 2, "Links": {"messages": "/channel/orders/messages?status=102"}},
        "SCHEDULED_SCHEDULED": {
            "Count": 2,
            "Links": {"messages": "/channel/orders/scheduled-messages?status=101"},
        },
        "SCHEDULED_DISPATCHED": {
            "Count": 1,
            "Links": {"messages": "/channel/orders/scheduled-messages?status=102"},
        },
    }
    assert counts["next_scheduled_message_at"] == "2030-01-01T12:11:00Z"


def test_pending_messages_show_in_message_endpoints_only_when_asked_for(
    admin_client, channel, clock
):
    publish("orders", b"x", producer="shop", message_id="now-1")
    schedule("later-1")

    everything = admin_client.get("/channel/orders/messages").json()["Result"]
    pending = admin_client.get("/channel/orders/messages?status=SCHEDULED").json()["Result"]
    message = admin_client.get("/channel/orders/message/later-1").json()

    assert everything == ["/channel/orders/message/now-1"]
    assert pending == ["/channel/orders/message/later-1"]
    assert (message["Status"], message["Jobs"], message["DispatchedAt"]) == ("SCHEDULED", [], None)
    assert message["ScheduledFor"] == "2030-01-01T12:10:00Z"
    assert admin_client.get("/channel/orders/message/now-1").json()["ScheduledFor"] is None


# Several dispatchers at once


@pytest.mark.django_db(transaction=True)
def test_concurrent_releases_release_every_message_exactly_once():
    channel = make_channel("orders")
    make_producer("shop")
    for consumer_id in ("billing", "audit", "crm"):
        make_consumer(channel, consumer_id)
    due = NOW - timedelta(seconds=1)
    for number in range(200):
        schedule(f"m{number:03d}", due)
    released: list[int] = []

    def dispatcher() -> None:
        while count := release_due_messages(now=NOW, limit=7):
            released.append(count)

    at_once(*[dispatcher] * 4)

    assert sum(released) == 200
    assert len(released) > 200 // 7  # the work was split, not done by one caller
    assert Job.objects.count() == 200 * 3
    pairs = set(Job.objects.values_list("message_id", "consumer_id"))
    assert len(pairs) == 600
    assert not Message.objects.filter(status=Message.Status.SCHEDULED).exists()


def test_the_admin_cancels_scheduled_messages_not_yet_released(client):
    from django.contrib.auth.models import User

    make_producer()
    channel = make_channel()
    make_consumer(channel)
    later = timezone.now() + timedelta(hours=1)
    waiting = publish(channel, b"x", producer="shop", message_id="waiting", scheduled_for=later)
    sent = publish(channel, b"x", producer="shop", message_id="sent")
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))

    response = client.post(
        "/admin/broker/message/",
        {"action": "cancel_scheduled", "_selected_action": [waiting.pk, sent.pk]},
        follow=True,
    )

    assert response.status_code == 200
    assert "Cancelled 1 scheduled message(s)." in response.content.decode()
    assert list(Message.objects.values_list("public_id", flat=True)) == ["sent"]
