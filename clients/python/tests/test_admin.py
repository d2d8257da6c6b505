"""Admin against the live broker, one group of calls per test."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.conftest import Broker, Publisher, unique
from webhook_broker_client import BadRequest, Conflict, NotFound
from webhook_broker_client._http import HttpClient
from webhook_broker_client.admin import Admin

FAR_FUTURE = datetime(2099, 1, 31, 12, 0, tzinfo=UTC)
RECEIVER = "http://127.0.0.1:9/hook"  # never called: these consumers are paused or pull


@pytest.fixture
def admin(broker: Broker) -> Iterator[Admin]:
    with Admin(broker.url, broker.admin_token) as client:
        yield client


def pull_consumer(admin: Admin, publisher: Publisher) -> tuple[str, str]:
    consumer_id = unique("pull")
    created = admin.put_consumer(
        publisher.channel_id, consumer_id, callback_url=RECEIVER, type="pull"
    )
    return consumer_id, created["Token"]


def claim_and_report(
    broker: Broker, publisher: Publisher, consumer: tuple[str, str], state: str
) -> list[str]:
    """Take the consumer's jobs through the pull API and report them all `state`."""
    consumer_id, token = consumer
    tokens = {"X-Broker-Channel-Token": publisher.channel_token, "X-Broker-Consumer-Token": token}
    base = f"/channel/{publisher.channel_id}/consumer/{consumer_id}"
    with HttpClient(broker.url, headers=tokens) as http:
        claimed = http.request("POST", f"{base}/claim", json={"limit": 100, "timeout": 60})
        ids = [job["ID"] for job in claimed.json()["Result"]]
        report = [{"ID": job_id, "NextState": state} for job_id in ids]
        http.request("POST", f"{base}/report", json={"Jobs": report})
    return ids


def test_channels_and_producers(admin: Admin) -> None:
    channel_id, producer_id = unique("ch"), unique("pr")
    created = admin.put_channel(channel_id, name="Orders")
    assert created["ID"] == channel_id
    assert created["Token"]
    renamed = admin.put_channel(channel_id, name="Orders v2")  # an update: If-Unmodified-Since
    assert "Token" not in renamed
    assert admin.get_channel(channel_id)["Name"] == "Orders v2"
    assert channel_id in admin.channels()
    producer = admin.put_producer(producer_id, token="a-token-of-our-own", channels=[channel_id])
    assert producer["Token"] == "a-token-of-our-own"
    assert admin.get_producer(producer_id)["Channels"] == [channel_id]
    admin.put_producer(producer_id, name="Renamed")  # channels omitted: kept
    assert admin.get_producer(producer_id)["Channels"] == [channel_id]
    assert producer_id in admin.producers()
    with pytest.raises(NotFound):
        admin.get_channel(unique("missing"))


def test_consumers_take_every_field(admin: Admin, publisher: Publisher) -> None:
    channel_id, consumer_id = publisher.channel_id, unique("push")
    consumer = admin.put_consumer(
        channel_id,
        consumer_id,
        callback_url=RECEIVER,
        name="Billing",
        token="consumer-token",
        type="push",
        ordering="ordered",
        retry_delays=[1, 5, 30],
        non_retryable_statuses=[400, 422],
        max_in_flight=7,
        max_job_age=3600,
        max_per_second=0.5,
        event_types=["order.*", "invoice.paid"],
        signing_secret="whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk=",
    )
    expected = {
        "Name": "Billing",
        "Token": "consumer-token",
        "CallbackURL": RECEIVER,
        "Type": "push",
        "Ordering": "ordered",
        "RetryDelays": [1, 5, 30],
        "NonRetryableStatuses": [400, 422],
        "MaxInFlight": 7,
        "MaxJobAge": 3600,
        "MaxPerSecond": 0.5,
        "EventTypes": ["order.*", "invoice.paid"],
    }
    assert {name: consumer.get(name) for name in expected} == expected
    secret = admin.signing_secret(channel_id, consumer_id)["SigningSecret"]
    assert secret == "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="
    # An update keeps what it leaves out; a blank sets a field back to its default.
    updated = admin.put_consumer(channel_id, consumer_id, max_in_flight="", event_types="")
    assert (updated["MaxInFlight"], updated["EventTypes"]) == (None, [])
    assert (updated["RetryDelays"], updated["Ordering"]) == ([1, 5, 30], "ordered")
    assert consumer_id in admin.consumers(channel_id)
    pulled, _ = pull_consumer(admin, publisher)
    assert admin.get_consumer(channel_id, pulled)["Type"] == "pull"


def test_pause_resume_close_circuit_and_delete(admin: Admin, publisher: Publisher) -> None:
    channel_id, consumer_id = publisher.channel_id, unique("push")
    admin.put_consumer(channel_id, consumer_id, callback_url=RECEIVER)
    assert admin.pause_consumer(channel_id, consumer_id)["Paused"] is True
    assert admin.get_consumer(channel_id, consumer_id)["Paused"] is True
    assert admin.resume_consumer(channel_id, consumer_id)["Paused"] is False
    closed = admin.close_circuit(channel_id, consumer_id)
    assert (closed["CircuitState"], closed["ConsecutiveFailures"]) == ("closed", 0)
    admin.delete_consumer(channel_id, consumer_id)
    with pytest.raises(NotFound):
        admin.get_consumer(channel_id, consumer_id)
    with pytest.raises(NotFound):
        admin.delete_consumer(channel_id, consumer_id)


def test_signing_secrets_rotate(admin: Admin, publisher: Publisher) -> None:
    channel_id, consumer_id = publisher.channel_id, unique("push")
    admin.put_consumer(channel_id, consumer_id, callback_url=RECEIVER)
    before = admin.signing_secret(channel_id, consumer_id)
    assert before["SigningSecret"].startswith("whsec_")
    rotated = admin.rotate_signing_secret(channel_id, consumer_id)
    assert rotated["SigningSecret"] != before["SigningSecret"]
    assert rotated["PreviousSigningSecretExpiresAt"]


def test_messages_jobs_and_replay(broker: Broker, admin: Admin, publisher: Publisher) -> None:
    consumer = pull_consumer(admin, publisher)
    with publisher.producer(broker.url) as producer:
        message_id = producer.publish("hello", event_type="greeting")
    message = admin.get_message(publisher.channel_id, message_id)
    assert (message["Payload"], message["EventType"], message["Status"]) == (
        "hello",
        "greeting",
        "DISPATCHED",
    )
    jobs = admin.message_jobs(publisher.channel_id, message_id)
    assert [job["Status"] for job in jobs] == ["QUEUED"]
    assert message_id in admin.messages(publisher.channel_id, status="DISPATCHED")
    assert message_id not in admin.messages(publisher.channel_id, status="ACKNOWLEDGED")
    counts = admin.messages_status(publisher.channel_id)["counts"]
    assert counts["DISPATCHED"]["Count"] == 1
    with pytest.raises(Conflict):  # its job is queued: nothing to replay yet
        admin.replay(publisher.channel_id, message_id)
    claim_and_report(broker, publisher, consumer, "DELIVERED")
    replay = admin.replay(publisher.channel_id, message_id, consumer[0])
    assert replay["Replayed"] == [consumer[0]]
    assert admin.message_jobs(publisher.channel_id, message_id)[0]["Status"] == "QUEUED"
    with pytest.raises(BadRequest):
        list(admin.messages(publisher.channel_id, status="NO-SUCH-STATUS"))


def test_lists_follow_every_page(admin: Admin, publisher: Publisher) -> None:
    names = [f"type.{number}" for number in range(30)]  # more than one page of 25
    for name in names:
        admin.put_event_type(publisher.channel_id, name)
    assert sorted(admin.event_types(publisher.channel_id)) == sorted(names)


def test_event_type_catalogue(admin: Admin, publisher: Publisher) -> None:
    schema: dict[str, Any] = {"type": "object", "required": ["id"]}
    created = admin.put_event_type(
        publisher.channel_id, "order.created", description="An order", schema=schema
    )
    assert (created["Description"], created["Schema"]) == ("An order", schema)
    admin.put_event_type(publisher.channel_id, "order.created", description="Orders")
    stored = admin.get_event_type(publisher.channel_id, "order.created")
    assert (stored["Description"], stored["Schema"]) == ("Orders", schema)
    admin.delete_event_type(publisher.channel_id, "order.created")
    assert list(admin.event_types(publisher.channel_id)) == []


def test_scheduled_messages(broker: Broker, admin: Admin, publisher: Publisher) -> None:
    with publisher.producer(broker.url) as producer:
        message_id = producer.publish("later", scheduled_for=FAR_FUTURE)
    waiting = list(admin.scheduled_messages(publisher.channel_id, status="SCHEDULED"))
    assert waiting == [message_id]
    scheduled = admin.get_scheduled_message(publisher.channel_id, message_id)
    assert (scheduled["payload"], scheduled["status"]) == ("later", "SCHEDULED")
    assert message_id in admin.messages(publisher.channel_id, status="SCHEDULED")
    admin.cancel_scheduled_message(publisher.channel_id, message_id)
    with pytest.raises(NotFound):
        admin.get_scheduled_message(publisher.channel_id, message_id)


def test_periodic_messages(admin: Admin, publisher: Publisher) -> None:
    periodic_id = unique("every-hour")
    created = admin.put_periodic_message(
        publisher.channel_id,
        periodic_id,
        producer=publisher.producer_id,
        payload=b"\xffbinary",
        content_type="application/x-raw",
        priority=4,
        headers={"X-Tenant": "acme"},
        ordering_key="k",
        event_type="tick",
        interval_seconds=3600,
        skip_while_pending=True,
        enabled=False,
    )
    assert (created["PayloadEncoding"], created["IntervalSeconds"]) == ("base64", 3600)
    assert (created["Headers"], created["OrderingKey"]) == ({"X-Tenant": "acme"}, "k")
    assert (created["Enabled"], created["SkipWhilePending"]) == (False, True)
    updated = admin.put_periodic_message(
        publisher.channel_id, periodic_id, cron="0 6 * * *", time_zone="Europe/Paris"
    )
    schedule = (updated["Cron"], updated["IntervalSeconds"], updated["TimeZone"])
    assert schedule == ("0 6 * * *", None, "Europe/Paris")
    assert updated["EventType"] == "tick"
    assert list(admin.periodic_messages(publisher.channel_id)) == [periodic_id]
    assert admin.get_periodic_message(publisher.channel_id, periodic_id)["Priority"] == 4
    admin.delete_periodic_message(publisher.channel_id, periodic_id)
    assert list(admin.periodic_messages(publisher.channel_id)) == []


def test_dead_letter_queue(broker: Broker, admin: Admin, publisher: Publisher) -> None:
    consumer = pull_consumer(admin, publisher)
    consumer_id, consumer_token = consumer
    with publisher.producer(broker.url) as producer:
        message_ids = {producer.publish(f"m{n}") for n in range(3)}
    dead = claim_and_report(broker, publisher, consumer, "DEAD")
    listed = list(admin.dead_jobs(publisher.channel_id, consumer_id))
    assert sorted(job["ID"] for job in listed) == sorted(dead)
    assert {job["MessageURL"].rsplit("/", 1)[1] for job in listed} == message_ids
    ours = [e for e in admin.dlq_status()["consumers"] if e["consumerId"] == consumer_id]
    assert [(e["channelId"], e["deadCount"]) for e in ours] == [(publisher.channel_id, 3)]
    requeued = admin.requeue_dlq(publisher.channel_id, consumer_id)
    assert requeued == {"count": 3, "action": None}
    claim_and_report(broker, publisher, consumer, "DEAD")
    purged = admin.purge_dlq(
        publisher.channel_id,
        consumer_id,
        channel_token=publisher.channel_token,
        consumer_token=consumer_token,
    )
    assert purged == {"count": 3, "action": None}
    assert list(admin.dead_jobs(publisher.channel_id, consumer_id)) == []
    with publisher.producer(broker.url) as producer:
        producer.publish("m4")
    claim_and_report(broker, publisher, consumer, "DEAD")
    assert admin.purge_dlq(publisher.channel_id, consumer_id) == {"count": 1, "action": None}
    with pytest.raises(NotFound):
        admin.dlq_action(publisher.channel_id, consumer_id, "d4ksq9g00000000001k0")


def test_status_and_job_counts(broker: Broker, admin: Admin, publisher: Publisher) -> None:
    consumer_id, _ = pull_consumer(admin, publisher)
    with publisher.producer(broker.url) as producer:
        producer.publish("counted")
    assert admin.status()["status"] == "ok"
    counts = admin.job_status()[publisher.channel_id][consumer_id]
    assert [(entry["statusName"], entry["count"]) for entry in counts] == [("QUEUED", 1)]
