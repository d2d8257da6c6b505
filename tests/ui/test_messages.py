"""Operator UI: message search, the message page, replay, through Django's test client
(docs/ui.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from broker import publish
from broker.models import Message
from consumers.models import Consumer
from jobs.models import DeliveryAttempt, Job
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from tests.helpers import make_channel, make_consumer, make_operator

pytestmark = pytest.mark.django_db


def delivered_message(
    channel, consumers=("billing",), attempts=1, message_id="order-42"
) -> Message:
    """A message published to `consumers`, each job DELIVERED after `attempts` push attempts."""
    for consumer_id in consumers:
        if not Consumer.objects.filter(channel=channel, public_id=consumer_id).exists():
            make_consumer(channel, consumer_id)
    message = publish(
        channel,
        {"order": 42},
        producer="shop",
        message_id=message_id,
        headers={"X-Trace": "abc-123"},
        ordering_key="customer-7",
    )
    for job in Job.objects.filter(message=message):
        for number in range(1, attempts + 1):
            DeliveryAttempt.objects.create(
                job=job,
                attempt_number=number,
                started_at=timezone.now() + timedelta(seconds=number),
                duration_ms=12.5,
                status_code=200 if number == attempts else 503,
                error_class="" if number == attempts else "http-status",
                response_excerpt=f"answer {number} of {job.consumer.public_id}",
                dispatcher_id="host-1:42:abcd",
            )
        Job.objects.filter(pk=job.pk).update(status=DELIVERED, attempts=attempts)
    return message


def page_of(response) -> str:
    return str(response.content.decode())


def flashed(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


# --- access --------------------------------------------------------------------------------------


def test_pages_need_a_staff_login(client, channel):
    message = delivered_message(channel)
    for url in ["/ui/messages", f"/ui/messages/{message.pk}"]:
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=/ui/messages")

    client.force_login(User.objects.create_user("someone", password="pw"))  # not staff
    assert client.get("/ui/messages").status_code == 302
    assert client.post(f"/ui/messages/{message.pk}/replay").status_code == 302
    assert Job.objects.get().status == DELIVERED


def test_replay_needs_the_csrf_token(channel):
    message = delivered_message(channel)
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_operator())

    without = client.post(f"/ui/messages/{message.pk}/replay", {"consumer": "billing"})
    page = client.get(f"/ui/messages/{message.pk}")
    token = page.context["csrf_token"]
    with_token = client.post(
        f"/ui/messages/{message.pk}/replay", {"consumer": "billing", "csrfmiddlewaretoken": token}
    )

    assert without.status_code == 403
    assert with_token.status_code == 302
    assert Job.objects.get().status == QUEUED


def test_replay_is_post_only(staff_client, channel):
    message = delivered_message(channel)

    assert staff_client.get(f"/ui/messages/{message.pk}/replay").status_code == 405
    assert Job.objects.get().status == DELIVERED


# --- search --------------------------------------------------------------------------------------


def test_searching_an_id_opens_its_message(staff_client, channel):
    message = delivered_message(channel)

    response = staff_client.get("/ui/messages", {"q": " order-42 "})

    assert response.status_code == 302
    assert response["Location"] == f"/ui/messages/{message.pk}"


def test_search_by_channel_and_id_and_by_internal_id(staff_client, channel):
    message = delivered_message(channel)
    make_channel("refunds")

    by_channel = staff_client.get("/ui/messages", {"q": "order-42", "channel": "orders"})
    elsewhere = staff_client.get("/ui/messages", {"q": "order-42", "channel": "refunds"})
    by_pk = staff_client.get("/ui/messages", {"q": str(message.pk)})

    assert by_channel["Location"] == f"/ui/messages/{message.pk}"
    assert elsewhere.status_code == 200
    assert "No message found" in page_of(elsewhere)
    assert by_pk["Location"] == f"/ui/messages/{message.pk}"


def test_a_miss_says_so(staff_client, channel):
    delivered_message(channel)

    response = staff_client.get("/ui/messages", {"q": "ORDER-42"})

    assert response.status_code == 200
    assert response.context["hits"] == []
    assert "No message found" in page_of(response)
    assert "case-sensitive" in page_of(response)


def test_one_id_in_two_channels_lists_both(staff_client, channel):
    first = delivered_message(channel)
    second = delivered_message(make_channel("refunds"), consumers=("audit",))

    response = staff_client.get("/ui/messages", {"q": "order-42"})

    assert response.status_code == 200
    assert [m.pk for m in response.context["hits"]] == [second.pk, first.pk]
    for message in (first, second):
        assert f'href="/ui/messages/{message.pk}"' in page_of(response)


def test_a_numeric_id_finds_both_the_message_id_and_the_internal_id(staff_client, channel):
    named = delivered_message(channel, message_id="a")
    other = delivered_message(channel, message_id="b")
    Message.objects.filter(pk=other.pk).update(public_id=str(named.pk))  # ID = the other's pk

    response = staff_client.get("/ui/messages", {"q": str(named.pk)})

    assert {m.pk for m in response.context["hits"]} == {named.pk, other.pk}


def test_recent_messages_page_by_keyset_without_counting(staff_client, channel, monkeypatch):
    monkeypatch.setattr("broker.ui.paging.PAGE_SIZE", 2)
    make_consumer(channel, "billing")
    ids = [publish(channel, b"x", producer="shop", message_id=f"m-{n}").pk for n in range(5)]
    publish(make_channel("refunds"), b"x", producer="shop", message_id="elsewhere")

    for query, expected in [({"channel": "orders"}, ids[::-1]), ({}, None)]:
        seen: list[int] = []
        url = "/ui/messages"
        params = dict(query)
        while True:
            with CaptureQueriesContext(connection) as queries:
                response = staff_client.get(url, params)
            assert not any("COUNT(" in q["sql"].upper() for q in queries)
            seen += [m.pk for m in response.context["recent"]]
            if not response.context["next_page"]:
                break
            url, params = f"/ui/messages?{response.context['next_page']}", {}
        if expected is not None:
            assert seen == expected
        else:
            assert seen == sorted(Message.objects.values_list("pk", flat=True), reverse=True)


def test_recent_messages_of_a_channel_merge_every_status(staff_client, channel):
    early = publish(channel, b"x", producer="shop", message_id="early")  # no consumer yet
    delivered = delivered_message(channel, message_id="sent")
    waiting = publish(
        channel, b"x", producer="shop", message_id="later", scheduled_for=timezone.now()
    )
    publish(make_channel("refunds"), b"x", producer="shop", message_id="elsewhere")

    response = staff_client.get("/ui/messages", {"channel": "orders"})

    listed = [(m.pk, m.status) for m in response.context["recent"]]
    assert listed == [
        (waiting.pk, Message.Status.SCHEDULED),
        (delivered.pk, Message.Status.DISPATCHED),
        (early.pk, Message.Status.ACKNOWLEDGED),
    ]


# --- the message page ----------------------------------------------------------------------------


def test_the_message_page_shows_facts_jobs_attempts_payload_and_headers(staff_client, channel):
    message = delivered_message(channel, consumers=("billing", "audit"), attempts=2)
    late = make_consumer(channel, "late")
    dead = Job.objects.get(consumer__public_id="audit")
    Job.objects.filter(pk=dead.pk).update(status=DEAD, last_error="HTTP 410 from the callback")

    response = staff_client.get(f"/ui/messages/{message.pk}")

    page = page_of(response)
    assert response.status_code == 200
    for text in [
        "order-42",
        "orders",
        "shop",
        "application/json",
        "customer-7",
        "X-Trace",
        "abc-123",
        "{\n  &quot;order&quot;: 42\n}",
        "HTTP 410 from the callback",
        "answer 1 of billing",
        "answer 2 of audit",
        "joined the channel after",
    ]:
        assert text in page, text
    rows = {row.consumer.public_id: row for row in response.context["rows"]}
    assert rows["billing"].job.status == DELIVERED
    assert rows["audit"].job.status == DEAD
    assert rows["late"].job is None
    assert rows["late"].consumer == late
    assert len(response.context["attempts"]) == 4
    for job in Job.objects.all():
        assert f'href="/ui/jobs/{job.public_id}"' in page
    # Replay buttons: billing (delivered) and late (no job); audit is dead: requeue instead.
    assert 'name="consumer" value="billing"' in page
    assert 'name="consumer" value="late"' in page
    assert 'name="consumer" value="audit"' not in page
    assert "Replay to all consumers" in page


def test_the_message_page_reads_only_the_start_of_a_payload(staff_client, channel, settings):
    settings.BROKER_PAYLOAD_OFFLOAD_BYTES = 1_000_000
    make_consumer(channel, "billing")
    message = publish(channel, "é" * 5000, producer="shop", message_id="long")

    response = staff_client.get(f"/ui/messages/{message.pk}")

    preview = response.context["preview"]
    assert preview.startswith("éé")
    assert len(preview.encode()) <= 4096 + 3
    assert "First bytes of 10000" in page_of(response)


def test_an_offloaded_payload_is_not_read(staff_client, channel):
    message = delivered_message(channel)
    Message.objects.filter(pk=message.pk).update(payload_file="gone-file", payload=b"")

    response = staff_client.get(f"/ui/messages/{message.pk}")

    assert response.context["preview"] is None
    assert "Offloaded to payload storage" in page_of(response)


def test_an_unknown_message_is_404(staff_client):
    assert staff_client.get("/ui/messages/999999").status_code == 404
    assert staff_client.get("/ui/messages/orders/no-such-message").status_code == 404


def test_a_message_opens_at_its_public_address(staff_client, channel):
    message = delivered_message(channel, message_id="order-42_x")
    by_pk = staff_client.get(f"/ui/messages/{message.pk}")

    by_id = staff_client.get("/ui/messages/orders/order-42_x")

    assert by_id.status_code == 200
    assert by_id.context["message"] == message
    assert by_pk.context["message"] == message
    assert "answer 1 of billing" in page_of(by_id)


def test_the_message_page_query_count_does_not_grow_with_jobs_or_attempts(staff_client, channel):
    small = delivered_message(channel, consumers=("c0",), attempts=1, message_id="small")
    with CaptureQueriesContext(connection) as one:
        staff_client.get(f"/ui/messages/{small.pk}")

    big_channel = make_channel("big")
    big = delivered_message(
        big_channel, consumers=[f"c{n}" for n in range(6)], attempts=4, message_id="big"
    )
    with CaptureQueriesContext(connection) as many:
        response = staff_client.get(f"/ui/messages/{big.pk}")

    assert len(response.context["attempts"]) == 24
    assert len(many) == len(one)
    assert len(many) <= 9  # two of them load the operator's permissions (broker/ui/access.py)


# --- replay --------------------------------------------------------------------------------------


def test_replay_to_one_consumer(staff_client, channel):
    message = delivered_message(channel, consumers=("billing", "audit"))

    response = staff_client.post(
        f"/ui/messages/{message.pk}/replay", {"consumer": "billing"}, follow=True
    )

    assert response.redirect_chain == [(f"/ui/messages/{message.pk}", 302)]
    assert flashed(response) == ["Replay: replayed to billing."]
    statuses = dict(Job.objects.values_list("consumer__public_id", "status"))
    assert statuses == {"billing": QUEUED, "audit": DELIVERED}
    assert DeliveryAttempt.objects.count() == 2  # history kept
    rows = {row.consumer.public_id: row for row in response.context["rows"]}
    assert rows["billing"].job.status == QUEUED


def test_replay_to_all_reports_what_was_skipped(staff_client, channel):
    message = delivered_message(channel, consumers=("billing", "audit", "busy"))
    Job.objects.filter(consumer__public_id="busy").update(status=INFLIGHT)
    make_consumer(channel, "late")

    response = staff_client.post(f"/ui/messages/{message.pk}/replay", follow=True)

    (text,) = flashed(response)
    assert text.startswith("Replay: replayed to billing, audit; new job for late; busy skipped")
    statuses = dict(Job.objects.values_list("consumer__public_id", "status"))
    assert statuses == {"billing": QUEUED, "audit": QUEUED, "busy": INFLIGHT, "late": QUEUED}


def test_nothing_to_replay_is_a_warning(staff_client, channel):
    message = delivered_message(channel)
    Job.objects.update(status=QUEUED)

    response = staff_client.post(
        f"/ui/messages/{message.pk}/replay", {"consumer": "billing"}, follow=True
    )

    (text,) = flashed(response)
    assert text.startswith("Nothing was replayed: billing skipped (already queued")
    assert next(iter(response.context["messages"])).tags == "warning"


def test_a_scheduled_message_cannot_be_replayed(staff_client, channel):
    make_consumer(channel, "billing")
    message = publish(
        channel,
        b"x",
        producer="shop",
        message_id="later",
        scheduled_for=timezone.now() + timedelta(hours=1),
    )

    page = staff_client.get(f"/ui/messages/{message.pk}")
    response = staff_client.post(f"/ui/messages/{message.pk}/replay", follow=True)

    assert "Replay to all consumers" not in page_of(page)
    assert "Not released yet" in page_of(page)
    assert "scheduled and not released yet" in flashed(response)[0]
    assert not Job.objects.exists()


def test_replay_to_an_unknown_consumer_is_404(staff_client, channel):
    message = delivered_message(channel)
    make_consumer(make_channel("refunds"), "audit")  # not a consumer of this channel

    response = staff_client.post(f"/ui/messages/{message.pk}/replay", {"consumer": "audit"})

    assert response.status_code == 404
    assert Job.objects.get().status == DELIVERED
