"""Producers, channels and consumers over the REST API (docs/api.md)."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
import time_machine
from django.utils.http import http_date

from broker import publish
from broker.models import Channel, Producer
from consumers.models import Consumer
from jobs.models import DeliveryAttempt, Job
from tests.conftest import FORM
from tests.helpers import make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db


def put(client, url, data, **headers):
    return client.put(url, urlencode(data), content_type=FORM, headers=headers)


@pytest.mark.parametrize(("kind", "model"), [("producer", Producer), ("channel", Channel)])
def test_put_creates_with_a_generated_token_shown_once(admin_client, kind, model):
    response = put(admin_client, f"/{kind}/shop-1", {"name": "The Shop"})

    assert response.status_code == 200
    body = response.json()
    assert (body["ID"], body["Name"]) == ("shop-1", "The Shop")
    assert len(body["Token"]) >= 32
    assert model.objects.get(pk="shop-1").check_token(body["Token"])
    assert response["Last-Modified"] == http_date(model.objects.get().changed_at.timestamp())
    assert "Token" not in admin_client.get(f"/{kind}/shop-1").json()


@pytest.mark.parametrize("kind", ["producer", "channel"])
def test_put_with_a_token_and_no_name_uses_the_id_as_name(admin_client, kind):
    body = put(admin_client, f"/{kind}/shop", {"token": "chosen-token"}).json()

    assert (body["Name"], body["Token"]) == ("shop", "chosen-token")


def test_get_returns_the_resource_with_last_modified(admin_client):
    make_channel("orders")

    response = admin_client.get("/channel/orders")

    assert response.status_code == 200
    body = response.json()
    assert body["ID"] == "orders"
    assert body["ConsumersURL"] == "/channel/orders/consumers"
    assert body["MessagesURL"] == "/channel/orders/messages"
    assert body["BroadcastURL"] == "/channel/orders/broadcast"
    assert body["MessagesStatusURL"] == "/channel/orders/messages-status"
    assert body["ChangedAt"].endswith("Z")
    assert "Last-Modified" in response


@pytest.mark.parametrize("url", ["/producer/nope", "/channel/nope", "/channel/nope/consumer/x"])
def test_unknown_resources_are_404_in_json(admin_client, url):
    response = admin_client.get(url)

    assert response.status_code == 404
    assert "Error" in response.json()


def test_update_needs_if_unmodified_since(admin_client):
    make_producer("shop")

    response = put(admin_client, "/producer/shop", {"name": "Renamed"})

    assert response.status_code == 400
    assert "If-Unmodified-Since" in response.json()["Error"]
    assert Producer.objects.get().name == "Shop"


def test_update_with_a_stale_if_unmodified_since_is_412(admin_client):
    with time_machine.travel("2026-01-01T00:00:00Z", tick=False):
        make_producer("shop")
    stale = admin_client.get("/producer/shop")["Last-Modified"]
    assert put(admin_client, "/producer/shop", {"name": "A"}, **{"If-Unmodified-Since": stale})

    response = put(admin_client, "/producer/shop", {"name": "B"}, **{"If-Unmodified-Since": stale})

    assert response.status_code == 412
    assert Producer.objects.get().name == "A"


def test_two_updates_within_one_second_cannot_both_pass(admin_client):
    with time_machine.travel("2026-01-01T00:00:00.100Z", tick=False):
        make_producer("shop")
        seen = admin_client.get("/producer/shop")["Last-Modified"]
        first = put(admin_client, "/producer/shop", {"name": "A"}, **{"If-Unmodified-Since": seen})
        second = put(admin_client, "/producer/shop", {"name": "B"}, **{"If-Unmodified-Since": seen})

    assert (first.status_code, second.status_code) == (200, 412)
    assert first["Last-Modified"] != seen


def test_update_keeps_the_token_unless_a_new_one_is_sent(admin_client):
    make_producer("shop", token="original")
    since = {"If-Unmodified-Since": admin_client.get("/producer/shop")["Last-Modified"]}

    renamed = put(admin_client, "/producer/shop", {"name": "Renamed"}, **since)
    assert "Token" not in renamed.json()
    assert Producer.objects.get().check_token("original")

    since = {"If-Unmodified-Since": renamed["Last-Modified"]}
    rotated = put(admin_client, "/producer/shop", {"token": "rotated"}, **since)
    assert rotated.json()["Token"] == "rotated"
    assert Producer.objects.get().check_token("rotated")
    assert Producer.objects.get().name == "Renamed"


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", ""])
def test_management_writes_must_be_form_encoded(admin_client, content_type):
    response = admin_client.put("/producer/shop", '{"name": "x"}', content_type=content_type)

    assert response.status_code == 415
    assert not Producer.objects.exists()


@pytest.mark.parametrize("bad_id", ["has space", "a" * 256, "semi;colon", "dot.ted"])
def test_invalid_ids_are_400(admin_client, bad_id):
    response = put(admin_client, f"/producer/{bad_id}", {"name": "x"})

    assert response.status_code == 400
    assert not Producer.objects.exists()


def test_overlong_names_are_400(admin_client):
    response = put(admin_client, "/producer/shop", {"name": "x" * 256})

    assert response.status_code == 400


def test_lists_are_paginated_newest_first_with_both_links(admin_client):
    for number in range(30):
        with time_machine.travel(f"2026-01-01T00:00:{number:02d}Z", tick=False):
            make_producer(f"p{number:02d}")

    first = admin_client.get("/producers").json()
    assert first["Result"] == [f"/producer/p{n:02d}" for n in range(29, 4, -1)]
    second = admin_client.get(first["Pages"]["next"]).json()
    assert second["Result"] == [f"/producer/p{n:02d}" for n in range(4, -1, -1)]
    back = admin_client.get(second["Pages"]["previous"]).json()
    assert back["Result"] == first["Result"]
    beyond = admin_client.get(second["Pages"]["next"]).json()
    assert beyond == {"Result": [], "Pages": {}}


def test_tampered_or_conflicting_cursors_are_400(admin_client):
    make_producer("shop")
    link = admin_client.get("/producers").json()["Pages"]["next"]

    assert admin_client.get(link[:-3] + "abc").status_code == 400
    assert admin_client.get("/producers?next=garbage").status_code == 400
    assert admin_client.get("/producers?next=a&previous=b").status_code == 400


def test_put_consumer_creates_it_with_defaults(admin_client):
    make_channel("orders")

    response = put(
        admin_client, "/channel/orders/consumer/billing", {"callbackUrl": "https://b.example/h"}
    )

    assert response.status_code == 200
    body = response.json()
    assert body["ID"] == body["Name"] == "billing"
    assert (body["Type"], body["CallbackURL"]) == ("push", "https://b.example/h")
    assert body["DeadLetterQueueURL"] == "/channel/orders/consumer/billing/dlq"
    assert (body["Paused"], body["Ordering"], body["RetryDelays"]) == (False, "none", None)
    consumer = Consumer.objects.get()
    assert consumer.token == body["Token"]
    assert "Token" not in admin_client.get("/channel/orders/consumer/billing").json()


def test_put_consumer_accepts_the_extension_fields(admin_client):
    make_channel("orders")

    body = put(
        admin_client,
        "/channel/orders/consumer/billing",
        {
            "callbackUrl": "http://b.example/h",
            "type": "pull",
            "ordering": "ordered",
            "retryDelays": "1, 5,30",
            "nonRetryableStatuses": "400,422",
            "maxInFlight": "8",
            "token": "consumer-token",
        },
    ).json()

    assert body["Type"] == "pull"
    assert body["Ordering"] == "ordered"
    assert body["RetryDelays"] == [1, 5, 30]
    assert body["NonRetryableStatuses"] == [400, 422]
    assert body["MaxInFlight"] == 8
    assert Consumer.objects.get().max_attempts == 4


@pytest.mark.parametrize(
    "form",
    [
        {"name": "no callback URL"},
        {"callbackUrl": "/relative"},
        {"callbackUrl": "ftp://b.example/h"},
        {"callbackUrl": "http://b.example/h", "type": "poll"},
        {"callbackUrl": "http://b.example/h", "ordering": "sorted"},
        {"callbackUrl": "http://b.example/h", "retryDelays": "1,x"},
        {"callbackUrl": "http://b.example/h", "retryDelays": "-1"},
        {"callbackUrl": "http://b.example/h", "nonRetryableStatuses": "99"},
        {"callbackUrl": "http://b.example/h", "maxInFlight": "0"},
    ],
)
def test_bad_consumer_forms_are_400_and_change_nothing(admin_client, form):
    make_channel("orders")

    response = put(admin_client, "/channel/orders/consumer/billing", form)

    assert response.status_code == 400
    assert response.json()["Error"]
    assert not Consumer.objects.exists()


def test_put_consumer_on_an_unknown_channel_is_404(admin_client):
    response = put(admin_client, "/channel/nope/consumer/k", {"callbackUrl": "http://x.example"})

    assert response.status_code == 404


def test_consumer_update_keeps_fields_not_sent(admin_client):
    channel = make_channel("orders")
    consumer = make_consumer(channel, "billing", type="pull")
    since = {
        "If-Unmodified-Since": admin_client.get("/channel/orders/consumer/billing")["Last-Modified"]
    }

    response = put(
        admin_client,
        "/channel/orders/consumer/billing",
        {"callbackUrl": "http://new.example/h"},
        **since,
    )

    assert response.status_code == 200
    consumer.refresh_from_db()
    assert (consumer.callback_url, consumer.type) == ("http://new.example/h", "pull")


def test_consumer_list_is_per_channel(admin_client):
    orders, other = make_channel("orders"), make_channel("other")
    make_consumer(orders, "a")
    make_consumer(orders, "b")
    make_consumer(other, "c")

    body = admin_client.get("/channel/orders/consumers").json()

    assert sorted(body["Result"]) == ["/channel/orders/consumer/a", "/channel/orders/consumer/b"]
    assert admin_client.get("/channel/nope/consumers").status_code == 404


def test_delete_consumer_needs_if_unmodified_since_and_takes_its_jobs(admin_client):
    channel = make_channel("orders")
    make_producer("shop")
    doomed, kept = make_consumer(channel, "doomed"), make_consumer(channel, "kept")
    message = publish(channel, b"x", producer="shop")
    doomed_job = Job.objects.get(consumer=doomed)
    DeliveryAttempt.objects.create(
        job=doomed_job,
        attempt_number=1,
        started_at=doomed_job.created_at,
        duration_ms=1,
        dispatcher_id="d",
    )
    url = "/channel/orders/consumer/doomed"

    assert admin_client.delete(url).status_code == 400
    assert (
        admin_client.delete(url, headers={"If-Unmodified-Since": http_date(0)}).status_code == 412
    )
    since = admin_client.get(url)["Last-Modified"]
    response = admin_client.delete(url, headers={"If-Unmodified-Since": since})

    assert response.status_code == 204
    assert not Consumer.objects.filter(pk=doomed.pk).exists()
    assert list(Job.objects.values_list("consumer_id", flat=True)) == [kept.pk]
    assert not DeliveryAttempt.objects.exists()
    assert Job.objects.get().message == message
    assert admin_client.delete(url, headers={"If-Unmodified-Since": since}).status_code == 404


@pytest.mark.parametrize(
    "form",
    [
        {"callbackUrl": "http://b.example/h", "maxInFlight": "1,2"},
        {"callbackUrl": "http://b.example/h", "retryDelays": "\u0661"},
    ],
)
def test_numbers_must_be_plain_ascii_integers(admin_client, form):
    make_channel("orders")

    assert put(admin_client, "/channel/orders/consumer/billing", form).status_code == 400
    assert not Consumer.objects.exists()


@pytest.mark.parametrize("url", ["/producer/a%00b", "/channel/%00/consumers"])
def test_nul_bytes_in_ids_are_404(admin_client, url):
    assert admin_client.get(url).status_code == 404


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/hook", "http://169.254.169.254/latest", "http://localhost/x"]
)
def test_private_callback_urls_are_refused_unless_allowed(admin_client, settings, url):
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = False
    make_channel("orders")

    response = put(admin_client, "/channel/orders/consumer/billing", {"callbackUrl": url})

    assert response.status_code == 400
    assert "refusing callback host" in response.json()["Error"]
    assert not Consumer.objects.exists()
