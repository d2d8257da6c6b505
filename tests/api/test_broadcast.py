"""POST /channel/{c}/broadcast: every header and error code of docs/api.md."""

from __future__ import annotations

import pytest

from broker.models import Message
from jobs.models import Job
from tests.helpers import BROADCAST_HEADERS, make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db

URL = "/channel/orders/broadcast"


@pytest.fixture(autouse=True)
def setup():
    channel = make_channel("orders", token="channel-token")
    make_producer("shop", token="producer-token")
    return [make_consumer(channel, "billing"), make_consumer(channel, "audit")]


def broadcast(client, body=b'{"id": 1}', content_type="application/json", **headers):
    return client.post(
        URL, body, content_type=content_type, headers={**BROADCAST_HEADERS, **headers}
    )


def test_broadcast_stores_the_message_and_its_jobs(client, setup):
    response = broadcast(client, **{"X-Broker-Message-ID": "order-1"})

    assert response.status_code == 201
    assert response["Location"] == "/channel/orders/message/order-1"
    assert response.content == b""
    message = Message.objects.get()
    assert (message.public_id, bytes(message.payload)) == ("order-1", b'{"id": 1}')
    assert message.content_type == "application/json"
    assert message.producer_id == "shop"
    assert {job.consumer_id for job in Job.objects.all()} == {c.pk for c in setup}


def test_a_generated_message_id_is_in_location(client):
    response = broadcast(client)

    assert response["Location"] == f"/channel/orders/message/{Message.objects.get().public_id}"


def test_content_type_is_kept_verbatim_and_defaults_to_octet_stream(client):
    broadcast(client, b"a,b", "text/csv; charset=utf-8", **{"X-Broker-Message-ID": "csv"})
    client.generic(
        "POST", URL, b"\x00\x01", headers={**BROADCAST_HEADERS, "X-Broker-Message-ID": "raw"}
    )

    assert Message.objects.get(public_id="csv").content_type == "text/csv; charset=utf-8"
    raw = Message.objects.get(public_id="raw")
    assert (raw.content_type, bytes(raw.payload)) == ("application/octet-stream", b"\x00\x01")


@pytest.mark.parametrize(("header", "priority"), [("7", 7), (" -3 ", -3), ("", 0)])
def test_priority_header(client, header, priority):
    broadcast(client, **{"X-Broker-Message-Priority": header})

    assert Message.objects.get().priority == priority
    assert set(Job.objects.values_list("priority", flat=True)) == {priority}


def test_metadata_headers_named_in_the_header_are_kept(client):
    broadcast(
        client,
        **{
            "X-Broker-Metadata-Headers": "X-Trace-Id, X-Tenant,X-Absent",
            "X-Trace-Id": "abc",
            "X-Tenant": "t1",
            "X-Other": "not kept",
        },
    )

    assert Message.objects.get().headers == {"X-Trace-Id": "abc", "X-Tenant": "t1"}


@pytest.mark.parametrize(
    ("url", "headers", "status"),
    [
        ("/channel/nope/broadcast", {}, 404),
        (URL, {"X-Broker-Channel-Token": ""}, 401),
        (URL, {"X-Broker-Channel-Token": "wrong"}, 403),
        (URL, {"X-Broker-Producer-ID": ""}, 401),
        (URL, {"X-Broker-Producer-ID": "stranger"}, 401),
        (URL, {"X-Broker-Producer-Token": ""}, 401),
        (URL, {"X-Broker-Producer-Token": "wrong"}, 403),
        (URL, {"X-Broker-Message-Priority": "high"}, 400),
        (URL, {"X-Broker-Message-Priority": "99999999999"}, 400),
        (URL, {"X-Broker-Message-ID": "has space"}, 400),
        (URL, {"X-Broker-Metadata-Headers": "X-Big", "X-Big": "x" * 9000}, 400),
    ],
)
def test_refused_broadcasts_change_nothing(client, url, headers, status):
    response = client.post(
        url, b"payload", content_type="text/plain", headers={**BROADCAST_HEADERS, **headers}
    )

    assert response.status_code == status
    assert response.json()["Error"]
    assert not Message.objects.exists()
    assert not Job.objects.exists()


def test_an_empty_body_is_400(client):
    response = broadcast(client, b"")

    assert response.status_code == 400
    assert not Message.objects.exists()


def test_a_duplicate_message_id_is_409_and_keeps_the_original(client):
    broadcast(client, b"first", **{"X-Broker-Message-ID": "order-1"})

    response = broadcast(client, b"second", **{"X-Broker-Message-ID": "order-1"})

    assert response.status_code == 409
    assert bytes(Message.objects.get().payload) == b"first"
    assert Job.objects.count() == 2


def test_payload_size_limit_is_413(client, settings):
    settings.BROKER_MAX_PAYLOAD_BYTES = 1000

    assert broadcast(client, b"x" * 1000).status_code == 201
    response = broadcast(client, b"x" * 1001)

    assert response.status_code == 413
    assert Message.objects.count() == 1


def test_a_scheduled_broadcast_is_located_at_its_scheduled_message(client):
    # The rest (400, 412, release, cancel) is in tests/publishing/test_scheduled.py.
    response = broadcast(
        client, **{"X-Broker-Scheduled-For": "2999-01-01T00:00:00Z", "X-Broker-Message-ID": "s-1"}
    )

    assert response.status_code == 201
    assert response["Location"] == "/channel/orders/scheduled-message/s-1"
    assert Message.objects.get().status == Message.Status.SCHEDULED
    assert not Job.objects.exists()


def test_tokens_never_appear_in_error_responses(client):
    response = broadcast(client, **{"X-Broker-Producer-Token": "a-wrong-secret"})

    text = response.content.decode()
    assert "a-wrong-secret" not in text
    assert "producer-token" not in text


@pytest.mark.parametrize(
    ("content_type", "headers"),
    [
        ("text/plain", {"X-Broker-Message-Priority": "\u0661"}),  # Arabic-Indic 1: int() takes it
        ("text/plain", {"X-Broker-Message-Priority": "1_000"}),
        ("text/plain\x01", {}),
    ],
)
def test_lookalike_numbers_and_control_characters_are_400(client, content_type, headers):
    response = broadcast(client, b"x", content_type, **headers)

    assert response.status_code == 400
    assert not Message.objects.exists()


def test_nul_bytes_never_reach_the_database(client):
    in_path = client.post("/channel/a%00b/broadcast", b"x", "text/plain", headers=BROADCAST_HEADERS)
    in_header = broadcast(client, **{"X-Broker-Producer-ID": "sh\x00op"})

    assert (in_path.status_code, in_header.status_code) == (404, 401)
    assert in_path.json()["Error"]
    assert not Message.objects.exists()


def test_the_ordering_key_header_is_kept_on_the_message_and_its_jobs(client):
    response = broadcast(client, **{"X-Broker-Ordering-Key": "customer-7"})

    assert response.status_code == 201
    assert Message.objects.get().ordering_key == "customer-7"
    assert set(Job.objects.values_list("ordering_key", flat=True)) == {"customer-7"}


@pytest.mark.parametrize("key", ["k" * 256, "line\nbreak"])
def test_a_malformed_ordering_key_is_refused(client, key):
    response = broadcast(client, **{"X-Broker-Ordering-Key": key})

    assert response.status_code == 400
    assert not Message.objects.exists()
