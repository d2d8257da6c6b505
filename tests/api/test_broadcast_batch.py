"""POST /channel/{c}/broadcast-batch (extension, docs/api.md "Batch broadcast"): many messages in
one request, all or nothing: every answer of docs/api.md, and a refused batch changes nothing."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import time_machine

from broker.models import Message
from broker.ratelimit import TABLE
from jobs.models import Job
from jobs.queue import release_due_messages
from tests.db_snapshot import snapshot
from tests.helpers import BROADCAST_HEADERS, make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db

URL = "/channel/orders/broadcast-batch"
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LATER = "2030-01-01T13:00:00Z"  # an hour after NOW: past the minimum delay (120 s)


@pytest.fixture(autouse=True)
def consumers():
    channel = make_channel("orders", token="channel-token")
    make_producer("shop", token="producer-token")
    return [make_consumer(channel, "billing"), make_consumer(channel, "audit")]


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


@pytest.fixture
def storage_dir(settings, tmp_path):
    """This test's payload storage, in a directory of its own."""
    location = tmp_path / "payloads"
    configured = settings.STORAGES["broker_payloads"]
    settings.STORAGES = {
        **settings.STORAGES,
        "broker_payloads": {
            **configured,
            "OPTIONS": {**configured["OPTIONS"], "location": location},
        },
    }
    return location


def stored_files(location: Path) -> dict[str, bytes]:
    return (
        {path.name: path.read_bytes() for path in location.iterdir()} if location.exists() else {}
    )


def post(client, messages=None, *, body=None, **headers):
    if body is None:
        body = json.dumps({"messages": messages})
    return client.post(
        URL, body, content_type="application/json", headers={**BROADCAST_HEADERS, **headers}
    )


def test_a_batch_stores_every_message_and_a_job_per_consumer_in_order(client, consumers):
    response = post(client, [{"id": f"m-{n}", "payload": f"order {n}"} for n in range(5)])

    assert response.status_code == 201
    assert response.json() == {
        "messages": [
            {"id": f"m-{n}", "location": f"/channel/orders/message/m-{n}"} for n in range(5)
        ]
    }
    messages = list(Message.objects.order_by("pk"))
    assert [m.public_id for m in messages] == [f"m-{n}" for n in range(5)]  # keys in batch order
    assert {m.status for m in messages} == {Message.Status.DISPATCHED}
    assert {m.producer_id for m in messages} == {"shop"}
    assert bytes(messages[3].payload) == b"order 3"
    assert messages[3].content_type == "text/plain; charset=utf-8"
    for consumer in consumers:
        # An ordered consumer receives a key's messages in job order: the batch's.
        jobs = Job.objects.filter(consumer=consumer).order_by("pk")
        assert [job.message.public_id for job in jobs] == [f"m-{n}" for n in range(5)]
        assert {job.status for job in jobs} == {"QUEUED"}


def test_every_field_is_kept_as_the_single_broadcast_keeps_its_header(client):
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    response = post(
        client,
        [
            {
                "id": "full",
                "payload_base64": base64.b64encode(b"\x00\x01binary").decode(),
                "content_type": "application/x-thing",
                "priority": 7,
                "headers": {"X-Tenant": "t1"},
                "ordering_key": "customer-7",
                "traceparent": traceparent,
                "tracestate": "vendor=1",
            },
            {"payload_base64": "AAE="},
        ],
    )

    assert response.status_code == 201
    full = Message.objects.get(public_id="full")
    assert bytes(full.payload) == b"\x00\x01binary"
    assert (full.content_type, full.priority, full.headers) == (
        "application/x-thing",
        7,
        {"X-Tenant": "t1"},
    )
    assert (full.ordering_key, full.traceparent, full.tracestate) == (
        "customer-7",
        traceparent,
        "vendor=1",
    )
    assert set(Job.objects.filter(message=full).values_list("priority", "ordering_key")) == {
        (7, "customer-7")
    }
    generated = Message.objects.exclude(public_id="full").get()
    assert generated.content_type == "application/octet-stream"
    assert response.json()["messages"][1]["id"] == generated.public_id


def test_a_channel_without_consumers_acknowledges_the_batch(client, consumers):
    for consumer in consumers:
        consumer.delete()

    assert post(client, [{"payload": "a"}, {"payload": "b"}]).status_code == 201
    assert set(Message.objects.values_list("status", flat=True)) == {Message.Status.ACKNOWLEDGED}
    assert not Job.objects.exists()


def test_scheduled_items_become_scheduled_messages_released_at_their_time(client, clock):
    response = post(
        client,
        [{"id": "now", "payload": "a"}, {"id": "later", "payload": "b", "scheduled_for": LATER}],
    )

    assert response.status_code == 201
    assert [m["location"] for m in response.json()["messages"]] == [
        "/channel/orders/message/now",
        "/channel/orders/scheduled-message/later",
    ]
    later = Message.objects.get(public_id="later")
    assert (later.status, later.scheduled_for, later.dispatched_at) == (
        Message.Status.SCHEDULED,
        NOW + timedelta(hours=1),
        None,
    )
    assert not Job.objects.filter(message=later).exists()
    assert Job.objects.count() == 2  # the unscheduled message's

    clock.move_to(NOW + timedelta(hours=1))
    assert release_due_messages() == 1
    assert Job.objects.filter(message=later).count() == 2


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"payload": ""}, "payload"),
        ({}, "payload"),
        ({"payload": "a", "payload_base64": "YQ=="}, "payload"),
        ({"payload": {"json": "object"}}, "payload"),
        ({"payload_base64": "not base64!"}, "payload_base64"),
        ({"payload": "a", "id": "has space"}, "id"),
        ({"payload": "a", "id": 7}, "id"),
        ({"payload": "a", "priority": "high"}, "priority"),
        ({"payload": "a", "priority": 2**31}, "priority"),
        ({"payload": "a", "priority": True}, "priority"),
        ({"payload": "a", "headers": {"Authorization": "Bearer x"}}, "headers"),
        ({"payload": "a", "headers": {"X-Broker-Producer-Token": "x"}}, "headers"),
        ({"payload": "a", "headers": {"X-Big": "x" * 9000}}, "headers"),
        ({"payload": "a", "headers": ["X-Tenant"]}, "headers"),
        ({"payload": "a", "ordering_key": "k" * 256}, "ordering_key"),
        ({"payload": "a", "content_type": "text/plain\x01"}, "content_type"),
        ({"payload": "a", "scheduled_for": "tomorrow"}, "scheduled_for"),
        ({"payload": "a", "scheduled_for": "2030-01-01T12:01:00Z"}, "scheduled_for"),  # too soon
        ({"payload": "a", "colour": "blue"}, "colour"),
        ("just a string", ""),
    ],
)
def test_one_invalid_item_refuses_the_batch_naming_it(client, clock, item, field):
    before = snapshot()

    response = post(client, [{"id": "fine", "payload": "ok"}, item])

    assert response.status_code == 400
    body = response.json()
    assert body["Error"] == "1 of the batch's messages are refused; nothing was stored."
    assert [(e["index"], e["field"]) for e in body["errors"]] == [(1, field)]
    assert body["errors"][0]["message"]
    assert snapshot() == before


def test_every_problem_of_every_item_is_listed_at_once(client):
    response = post(
        client,
        [
            {"payload": "a", "priority": "high"},
            {"payload": "fine"},
            {"payload": "b", "id": "bad id"},
            {"payload": "c", "priority": 2**40},
        ],
    )

    assert response.status_code == 400
    assert [(e["index"], e["field"]) for e in response.json()["errors"]] == [
        (0, "priority"),
        (2, "id"),
        (3, "priority"),
    ]


@pytest.mark.parametrize(
    "body",
    [b"", b"{not json", b"[]", b'{"messages": []}', b'{"messages": {}}', b'{"msgs": [{}]}', b'"x"'],
)
def test_a_malformed_body_is_400_and_changes_nothing(client, body):
    before = snapshot()

    response = post(client, body=body)

    assert response.status_code == 400
    assert set(response.json()) == {"Error"}
    assert snapshot() == before


def test_an_id_twice_in_the_batch_is_409_naming_it(client):
    before = snapshot()

    response = post(
        client,
        [{"id": "a", "payload": "1"}, {"id": "b", "payload": "2"}, {"id": "a", "payload": "3"}],
    )

    assert response.status_code == 409
    assert response.json()["duplicates"] == ["a"]
    assert snapshot() == before


def test_an_id_the_channel_has_is_409_naming_it_and_keeps_the_original(client):
    assert post(client, [{"id": "a", "payload": "first"}]).status_code == 201
    before = snapshot()

    response = post(client, [{"id": "new", "payload": "x"}, {"id": "a", "payload": "second"}])

    assert response.status_code == 409
    assert response.json()["duplicates"] == ["a"]
    assert "'a'" in response.json()["Error"]
    assert snapshot() == before


def test_too_many_messages_is_413(client, settings):
    settings.BROKER_MAX_BATCH_MESSAGES = 3
    before = snapshot()

    response = post(client, [{"payload": str(n)} for n in range(4)])

    assert response.status_code == 413
    assert "at most 3" in response.json()["Error"]
    assert snapshot() == before
    assert post(client, [{"payload": str(n)} for n in range(3)]).status_code == 201


def test_a_payload_over_the_limit_is_413_naming_it(client, settings):
    settings.BROKER_MAX_PAYLOAD_BYTES = 10
    before = snapshot()

    response = post(
        client, [{"payload": "x" * 10}, {"payload": "x" * 11}, {"payload": "a", "priority": "?"}]
    )

    assert response.status_code == 413
    assert [(e["index"], e["field"]) for e in response.json()["errors"]] == [
        (1, "payload"),
        (2, "priority"),
    ]
    assert snapshot() == before


def test_a_body_over_the_batch_limit_is_413_before_it_is_read(client, settings):
    settings.BROKER_MAX_BATCH_BYTES = 100
    before = snapshot()

    response = post(client, [{"payload": "x" * 100}])

    assert response.status_code == 413
    assert "over 100 bytes" in response.json()["Error"]
    assert snapshot() == before


def test_a_batch_may_be_larger_than_one_payloads_limit(client, settings):
    # Django's DATA_UPLOAD_MAX_MEMORY_SIZE (a single broadcast's body) does not apply.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = post(client, [{"payload": "x" * 500} for _ in range(10)])

    assert response.status_code == 201
    assert Message.objects.count() == 10


@pytest.mark.parametrize(
    ("url", "headers", "status"),
    [
        ("/channel/nope/broadcast-batch", {}, 404),
        (URL, {"X-Broker-Channel-Token": ""}, 401),
        (URL, {"X-Broker-Channel-Token": "wrong"}, 403),
        (URL, {"X-Broker-Producer-ID": "stranger"}, 401),
        (URL, {"X-Broker-Producer-Token": "wrong"}, 403),
    ],
)
def test_the_broadcasts_token_answers(client, url, headers, status):
    before = snapshot()

    response = client.post(
        url,
        json.dumps({"messages": [{"payload": "a"}]}),
        content_type="application/json",
        headers={**BROADCAST_HEADERS, **headers},
    )

    assert response.status_code == status
    assert set(response.json()) == {"Error"}
    assert snapshot() == before


# --- the rate limit ----------------------------------------------------------------------------


def test_each_message_counts_against_the_producers_rate(client, settings):
    settings.BROKER_BROADCAST_RATE_LIMIT = 0.5  # one every two seconds
    settings.BROKER_BROADCAST_BURST = 5
    with time_machine.travel(NOW, tick=False):
        assert post(client, [{"payload": "a"}] * 3).status_code == 201
        before = snapshot()

        refused = post(client, [{"payload": "b"}] * 3)  # 3 + 3 > 5

        assert refused.status_code == 429
        assert refused.json() == {"Error": "Producer 'shop' is over its broadcast rate limit."}
        assert refused["Retry-After"] == "2"  # one message's interval: then the 3 fit
        assert snapshot() == before  # no message, and the bucket unchanged
        assert post(client, [{"payload": "c"}] * 2).status_code == 201  # 3 + 2 = 5: allowed
        assert Message.objects.count() == 5


def test_a_batch_larger_than_the_burst_is_413(client, settings):
    settings.BROKER_BROADCAST_RATE_LIMIT = 1
    settings.BROKER_BROADCAST_BURST = 2
    before = snapshot()

    response = post(client, [{"payload": "a"}] * 3)

    assert response.status_code == 413
    assert "at most 2 at once" in response.json()["Error"]
    assert snapshot() == before


def test_a_refused_batch_spends_no_allowance(client, settings):
    settings.BROKER_BROADCAST_RATE_LIMIT = 1
    settings.BROKER_BROADCAST_BURST = 2

    assert post(client, [{"payload": "a", "priority": "x"}]).status_code == 400

    assert TABLE not in {name for name, rows in snapshot().items() if rows}


# --- large payloads ----------------------------------------------------------------------------


def test_large_payloads_are_offloaded_as_the_broadcast_offloads_them(client, settings, storage_dir):
    settings.BROKER_PAYLOAD_OFFLOAD_BYTES = 10
    big = bytes(range(256)) * 4

    response = post(
        client,
        [
            {"id": "big", "payload_base64": base64.b64encode(big).decode()},
            {"id": "small", "payload": "tiny"},
        ],
    )

    assert response.status_code == 201
    stored = Message.objects.get(public_id="big")
    assert (bytes(stored.payload), stored.payload_size) == (b"", len(big))
    assert stored_files(storage_dir) == {stored.payload_file: big}
    assert stored.read_payload() == big
    assert Message.objects.get(public_id="small").payload_file == ""


def test_a_refused_batch_leaves_no_offloaded_file(client, settings, storage_dir):
    settings.BROKER_PAYLOAD_OFFLOAD_BYTES = 10
    assert post(client, [{"id": "a", "payload": "first"}]).status_code == 201

    response = post(
        client, [{"id": "new", "payload": "y" * 100}, {"id": "a", "payload": "z" * 100}]
    )

    assert response.status_code == 409
    assert stored_files(storage_dir) == {}


# --- the schema --------------------------------------------------------------------------------


def test_the_schema_describes_the_batch(client):
    schema = json.loads(client.get("/api/schema/", headers={"Accept": "application/json"}).content)

    operation = schema["paths"]["/channel/{channel_id}/broadcast-batch"]["post"]
    assert operation["operationId"] == "broadcast_batch"
    assert {p["name"] for p in operation["parameters"] if p["in"] == "header"} == {
        "X-Broker-Channel-Token",
        "X-Broker-Producer-ID",
        "X-Broker-Producer-Token",
    }
    assert "application/json" in operation["requestBody"]["content"]
    assert {"201", "400", "401", "403", "404", "409", "413", "429"} <= set(operation["responses"])
    item = schema["components"]["schemas"]["BatchItemRequest"]["properties"]
    assert set(item) == {
        "id",
        "payload",
        "payload_base64",
        "content_type",
        "priority",
        "headers",
        "ordering_key",
        "scheduled_for",
        "traceparent",
        "tracestate",
        "event_type",
    }
