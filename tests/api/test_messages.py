"""Reading messages over the API: one with its jobs, lists by status, counts (docs/api.md)."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest

from broker import publish
from jobs.models import DeliveryAttempt, Job
from jobs.states import DEAD
from tests.helpers import make_consumer

pytestmark = pytest.mark.django_db


def test_a_message_with_its_jobs(admin_client, channel):
    billing = make_consumer(channel, "billing")
    make_consumer(channel, "audit")
    publish(
        channel,
        {"id": 1},
        producer="shop",
        message_id="order-1",
        priority=3,
        headers={"X-Trace-Id": "abc"},
    )
    Job.objects.filter(consumer=billing).update(status=DEAD, last_error="HTTP 500")

    body = admin_client.get("/channel/orders/message/order-1").json()

    assert body["ID"] == "order-1"
    assert (body["Payload"], body["PayloadEncoding"]) == ('{"id": 1}', "utf-8")
    assert (body["ContentType"], body["Priority"]) == ("application/json", 3)
    assert (body["ProducedBy"], body["ProducerID"]) == ("Shop", "shop")
    assert body["Status"] == "DISPATCHED"
    assert body["Headers"] == {"X-Trace-Id": "abc"}
    assert body["ReceivedAt"] == body["DispatchedAt"]
    jobs = {job["ListenerName"]: job for job in body["Jobs"]}  # consumer names, as upstream
    assert jobs["Billing"]["Status"] == "DEAD"
    assert jobs["Billing"]["LastError"] == "HTTP 500"
    assert jobs["Billing"]["ListenerEndpoint"] == billing.callback_url
    assert jobs["Audit"]["Status"] == "QUEUED"


def test_each_job_shows_its_last_attempt(admin_client, channel, django_assert_max_num_queries):
    billing = make_consumer(channel, "billing")
    make_consumer(channel, "audit")
    publish(channel, b"{}", producer="shop", message_id="order-2")
    job = Job.objects.get(consumer=billing)
    started = job.created_at + timedelta(seconds=1)
    for number, (status_code, error_class) in enumerate([(None, "timeout"), (503, "")], 1):
        DeliveryAttempt.objects.create(
            job=job,
            attempt_number=number,
            started_at=started + timedelta(seconds=number),
            duration_ms=12.5 * number,
            status_code=status_code,
            error_class=error_class,
            dispatcher_id="d1",
        )

    with django_assert_max_num_queries(6):  # auth, message, its jobs with their last attempts
        body = admin_client.get("/channel/orders/message/order-2").json()

    jobs = {job["ListenerName"]: job for job in body["Jobs"]}
    assert jobs["Billing"]["LastAttempt"] == {
        "Number": 2,
        "StartedAt": (started + timedelta(seconds=2)).isoformat().replace("+00:00", "Z"),
        "DurationMs": 25.0,
        "StatusCode": 503,
        "ErrorClass": "",
    }
    assert jobs["Audit"]["LastAttempt"] is None  # not attempted yet


def test_binary_payloads_are_base64(admin_client, channel):
    publish(channel, b"\xff\x00\xfe", producer="shop", message_id="bin")

    body = admin_client.get("/channel/orders/message/bin").json()

    assert body["PayloadEncoding"] == "base64"
    assert base64.b64decode(body["Payload"]) == b"\xff\x00\xfe"


def test_unknown_messages_are_404(admin_client, channel):
    assert admin_client.get("/channel/orders/message/nope").status_code == 404
    assert admin_client.get("/channel/nope/message/x").status_code == 404


def test_messages_list_by_status_newest_first(admin_client, channel):
    for number in range(3):
        publish(channel, b"x", producer="shop", message_id=f"early-{number}")
    make_consumer(channel)
    for number in range(2):
        publish(channel, b"x", producer="shop", message_id=f"late-{number}")

    everything = admin_client.get("/channel/orders/messages").json()["Result"]
    dispatched = admin_client.get("/channel/orders/messages?status=DISPATCHED").json()
    acknowledged = admin_client.get("/channel/orders/messages?status=101").json()

    assert everything[0] == "/channel/orders/message/late-1"
    assert len(everything) == 5
    assert dispatched["Result"] == [f"/channel/orders/message/late-{n}" for n in (1, 0)]
    assert "status=DISPATCHED" in dispatched["Pages"]["next"]
    assert len(acknowledged["Result"]) == 3


def test_messages_list_refuses_unknown_statuses_and_channels(admin_client, channel):
    assert admin_client.get("/channel/orders/messages?status=SENT").status_code == 400
    assert admin_client.get("/channel/nope/messages").status_code == 404


def test_messages_list_paginates(admin_client, channel):
    for number in range(27):
        publish(channel, b"x", producer="shop", message_id=f"m{number:02d}")

    first = admin_client.get("/channel/orders/messages").json()
    second = admin_client.get(first["Pages"]["next"]).json()

    assert len(first["Result"]) == 25
    assert second["Result"] == ["/channel/orders/message/m01", "/channel/orders/message/m00"]


def test_messages_status_counts(admin_client, channel):
    publish(channel, b"x", producer="shop")
    make_consumer(channel)
    publish(channel, b"x", producer="shop")
    publish(channel, b"x", producer="shop")

    body = admin_client.get("/channel/orders/messages-status").json()

    assert body == {
        "counts": {
            "ACKNOWLEDGED": {
                "Count": 1,
                "Links": {"messages": "/channel/orders/messages?status=101"},
            },
            "DISPATCHED": {
                "Count": 2,
                "Links": {"messages": "/channel/orders/messages?status=102"},
            },
        }
    }
    assert admin_client.get("/channel/nope/messages-status").status_code == 404
