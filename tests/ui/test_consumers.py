"""Operator UI: the consumer pages, through Django's test client (docs/delivery.md, "Circuit
breaker"; docs/ui.md)."""

from __future__ import annotations

import json
import logging
import re
import socket
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from standardwebhooks import Webhook

from broker.models import Message, Producer
from consumers.models import Consumer
from jobs.models import DeliveryAttempt, Job
from jobs.signing import signature_headers
from jobs.states import DEAD, QUEUED
from jobs.stats import refresh_delivery_stats
from jobs.test_event import TEST_EVENT_HEADER
from tests.conftest import FORM
from tests.helpers import make_channel, make_consumer, make_job, make_operator, make_producer
from tests.receiver import Reply
from tests.ui.paging import every_page

pytestmark = pytest.mark.django_db

PAGE = "/ui/consumers/orders/billing"


@pytest.fixture
def billing():
    return make_consumer(make_channel("orders"), "billing")


def settings_form(**fields) -> dict[str, str]:
    """A complete settings form, as the browser posts it."""
    return {
        "name": "Billing",
        "callback_url": "https://billing.example/hook",
        "type": "push",
        "ordering": "none",
        "retry_delays": "",
        "non_retryable_statuses": "",
        "max_in_flight": "",
        "max_job_age": "",
        "event_types": "",
        "token": "",
        "signing_secret": "",
        **fields,
    }


def create(client, **fields):
    return client.post(
        "/ui/consumers/new",
        {"channel": "orders", "consumer_id": "billing", **settings_form(**fields)},
    )


def edit_form_of(consumer: Consumer, **fields) -> dict[str, str]:
    return settings_form(changed_at=consumer.changed_at.isoformat(), **fields)


def shown(client, url: str = PAGE) -> str:
    return str(client.get(url).content.decode())


def found(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not found"
    return match.group(1)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Access


ACTIONS = ["pause", "resume", "close-circuit", "test-event", "secret/rotate", "secret/reveal"]


def test_every_page_and_action_needs_a_staff_login(client, billing):
    pages = ["/ui/consumers", "/ui/consumers/new", PAGE, f"{PAGE}/edit", f"{PAGE}/secret/reveal"]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=/ui/consumers")

    client.force_login(User.objects.create_user("someone", password="pw"))  # not staff
    for action in ACTIONS:
        assert client.post(f"{PAGE}/{action}", {"confirm": "yes"}).status_code == 302
    assert client.post(f"{PAGE}/edit", settings_form()).status_code == 302
    after = Consumer.objects.get()
    assert not after.paused
    assert after.signing_secret == billing.signing_secret
    assert after.changed_at == billing.changed_at


def test_actions_need_the_csrf_token(billing):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_operator())

    for action in ACTIONS:
        assert client.post(f"{PAGE}/{action}", {"confirm": "yes"}).status_code == 403
    assert client.post(f"{PAGE}/edit", settings_form()).status_code == 403
    assert Consumer.objects.get().signing_secret == billing.signing_secret
    assert not Consumer.objects.get().paused

    page = shown(client)  # the form's token, as a browser would send it
    token = found(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    response = client.post(f"{PAGE}/pause", {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert Consumer.objects.get().paused


def test_actions_are_posts_only(staff_client, billing):
    for action in ["pause", "resume", "close-circuit", "test-event"]:
        assert staff_client.get(f"{PAGE}/{action}").status_code == 405
    assert not Consumer.objects.get().paused


# The list


def test_the_list_groups_consumers_by_channel(staff_client):
    orders, refunds = make_channel("orders"), make_channel("refunds")
    make_consumer(refunds, "audit")
    make_consumer(orders, "shipping", type="pull")
    billing = make_consumer(orders, "billing")
    billing.set_token("listed-token")
    billing.save()
    Consumer.objects.filter(pk=billing.pk).update(
        paused=True, circuit_open_until=timezone.now() + timedelta(minutes=5)
    )

    response = staff_client.get("/ui/consumers")
    page = response.content.decode()

    listed = [(c.channel_id, c.public_id) for c in response.context["consumers"]]
    assert listed == [("orders", "billing"), ("orders", "shipping"), ("refunds", "audit")]
    assert page.count('class="channel-row"') == 2
    assert 'href="/ui/consumers/orders/billing"' in page
    assert "http://127.0.0.1:9/billing" in page
    assert ">Paused<" in page  # its state badges, as on the dashboard and its page
    assert ">Circuit open<" in page
    assert ">open<" in page
    assert ">Active<" not in page.split('href="/ui/consumers/orders/billing"')[1].split("</tr>")[0]
    assert "/ui/dead-jobs?channel=orders&amp;consumer=billing" in page
    assert "listed-token" not in page
    assert billing.signing_secret not in page
    channel_only = staff_client.get("/ui/consumers", {"channel": "refunds"})
    assert [c.public_id for c in channel_only.context["consumers"]] == ["audit"]


def test_the_list_pages_by_keyset_without_counting(staff_client, monkeypatch):
    monkeypatch.setattr("broker.ui.paging.PAGE_SIZE", 2)
    for channel_id in ["a", "b"]:
        channel = make_channel(channel_id)
        for consumer_id in ["x", "y", "z"]:
            make_consumer(channel, consumer_id)

    seen, _ = every_page(
        staff_client,
        "/ui/consumers",
        lambda response: [f"{c.channel_id}/{c.public_id}" for c in response.context["consumers"]],
    )

    assert seen == ["a/x", "a/y", "a/z", "b/x", "b/y", "b/z"]


def test_the_list_query_count_does_not_grow_with_rows(staff_client):
    channel = make_channel("orders")
    make_consumer(channel, "first")
    with CaptureQueriesContext(connection) as one:
        staff_client.get("/ui/consumers")
    for number in range(20):
        make_consumer(make_channel(f"c{number}"), f"k{number}")
    with CaptureQueriesContext(connection) as many:
        staff_client.get("/ui/consumers")

    assert len(many) == len(one)


# The consumer page


def test_the_page_shows_settings_but_no_token_or_secret(staff_client, billing):
    billing.set_token("the-consumer-token")
    billing.retry_delays = [5, 60]
    billing.non_retryable_statuses = [400, 422]
    billing.save()

    page = shown(staff_client)

    assert "http://127.0.0.1:9/billing" in page
    assert "5, 60" in page
    assert "400, 422" in page
    assert "Active" in page
    assert "the-consumer-token" not in page
    assert billing.signing_secret not in page
    assert billing.signing_secret.removeprefix("whsec_")[:12] not in page
    assert "/ui/dead-jobs?channel=orders&amp;consumer=billing" in page
    assert "Close circuit" not in page  # closed: nothing to close


def test_job_counts_are_bounded_and_the_page_query_count_is_flat(staff_client, monkeypatch):
    monkeypatch.setattr("broker.ui.consumer_pages.COUNT_LIMIT", 2)
    make_job(DEAD)
    with CaptureQueriesContext(connection) as one:
        first = staff_client.get(PAGE)
    for _ in range(3):
        make_job(DEAD)
    make_job(QUEUED)
    with CaptureQueriesContext(connection) as many:
        later = staff_client.get(PAGE)

    def shown(response) -> dict[str, str]:
        return {status: str(count) for status, count in response.context["job_counts"].items()}

    assert shown(first) == {"queued": "0", "inflight": "0", "dead": "1"}
    assert shown(later) == {"queued": "1", "inflight": "0", "dead": "≥ 2"}
    assert len(many) == len(one)


def test_an_unknown_consumer_is_404(staff_client, billing):
    assert staff_client.get("/ui/consumers/orders/nobody").status_code == 404
    assert staff_client.post("/ui/consumers/orders/nobody/pause").status_code == 404


# Create


def test_create_generates_a_token_and_shows_it_once(staff_client):
    make_channel("orders")

    response = create(
        staff_client,
        retry_delays="1, 5,30",
        non_retryable_statuses="400,422",
        max_in_flight="8",
        max_job_age="3600",
        event_types="order.*, invoice.paid",
    )

    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    consumer = Consumer.objects.get()
    token = found(r'id="consumer-token">([^<]+)<', response.content.decode())
    assert consumer.check_token(token)
    assert (consumer.public_id, consumer.name, consumer.type) == ("billing", "Billing", "push")
    assert consumer.retry_delays == [1, 5, 30]
    assert consumer.non_retryable_statuses == [400, 422]
    assert consumer.max_in_flight == 8
    assert consumer.max_job_age == 3600
    assert consumer.event_types == ["order.*", "invoice.paid"]
    assert token not in shown(staff_client)  # only that once


def test_create_takes_a_given_token_and_defaults_like_the_api(staff_client):
    make_channel("orders")

    create(staff_client, name="", token="chosen-token", type="pull", ordering="ordered")

    consumer = Consumer.objects.get()
    assert consumer.check_token("chosen-token")
    assert consumer.name == "billing"  # blank: the ID, as the API
    assert consumer.retry_delays is None  # blank: the global BROKER_RETRY_DELAYS
    assert (consumer.type, consumer.ordering) == ("pull", "ordered")


def test_create_refuses_an_existing_id_an_unknown_channel_and_a_bad_id(staff_client, billing):
    duplicate = create(staff_client, callback_url="https://other.example/h")
    assert duplicate.status_code == 409
    assert "already has a consumer with this ID" in duplicate.content.decode()
    assert Consumer.objects.get().callback_url == billing.callback_url

    unknown = staff_client.post(
        "/ui/consumers/new", {"channel": "nope", "consumer_id": "k", **settings_form()}
    )
    assert "No such channel." in unknown.context["form"].errors["channel"]
    bad_id = staff_client.post(
        "/ui/consumers/new", {"channel": "orders", "consumer_id": "a b", **settings_form()}
    )
    assert bad_id.context["form"].errors["consumer_id"]
    assert Consumer.objects.count() == 1


# Validation: the same functions, so the same verdicts and messages as the API's PUT

BAD_SETTINGS = [
    ("callback_url", "callbackUrl", "/relative"),
    ("callback_url", "callbackUrl", "ftp://b.example/h"),
    ("retry_delays", "retryDelays", "1,x"),
    ("retry_delays", "retryDelays", "-1"),
    ("retry_delays", "retryDelays", ",".join(["1"] * 51)),
    ("retry_delays", "retryDelays", "\u0661"),
    ("non_retryable_statuses", "nonRetryableStatuses", "99"),
    ("max_in_flight", "maxInFlight", "0"),
    ("max_in_flight", "maxInFlight", "1,2"),
    ("max_job_age", "maxJobAge", "-1"),
    ("max_job_age", "maxJobAge", "soon"),
    ("max_per_second", "maxPerSecond", "0"),
    ("max_per_second", "maxPerSecond", "-2"),
    ("max_per_second", "maxPerSecond", "fast"),
    ("max_per_second", "maxPerSecond", "nan"),
    ("max_per_second", "maxPerSecond", "inf"),
    ("max_per_second", "maxPerSecond", "100001"),
    ("event_types", "eventTypes", "order.**"),
    ("event_types", "eventTypes", "has space"),
    ("signing_secret", "signingSecret", "whsec_short"),
]


@pytest.mark.parametrize(("field", "wire_name", "value"), BAD_SETTINGS)
def test_bad_settings_are_refused_next_to_the_field_as_the_api_refuses_them(
    staff_client, admin_client, field, wire_name, value
):
    make_channel("orders")

    response = create(staff_client, **{field: value})

    assert response.status_code == 400
    errors = response.context["form"].errors
    assert list(errors) == [field]
    assert f'id="{field}-error"' in response.content.decode()
    api = admin_client.put(
        "/channel/orders/consumer/billing",
        urlencode({"callbackUrl": "https://b.example/h", wire_name: value}),
        content_type=FORM,
    )
    assert api.status_code == 400
    assert api.json()["Error"] == f"{wire_name}: {errors[field][0]}"
    assert not Consumer.objects.exists()


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/hook", "http://169.254.169.254/latest", "http://localhost/x"]
)
def test_private_callbacks_are_refused_unless_allowed(staff_client, settings, url):
    make_channel("orders")
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = False

    refused = create(staff_client, callback_url=url)

    assert refused.status_code == 400
    assert "refusing callback host" in refused.context["form"].errors["callback_url"][0]
    assert not Consumer.objects.exists()

    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = True
    assert create(staff_client, callback_url=url).status_code == 200
    assert Consumer.objects.get().callback_url == url


# Edit


def test_the_edit_form_starts_from_the_current_settings(staff_client, billing):
    billing.retry_delays, billing.max_in_flight = [5, 60], 3
    billing.event_types = ["order.*", "invoice.paid"]
    billing.max_per_second = 20
    billing.save()

    form = staff_client.get(f"{PAGE}/edit").context["form"]

    assert "callback_url" not in form.initial  # shown masked in its help; blank keeps it
    assert billing.callback_url in form.fields["callback_url"].help_text  # no secret to mask
    assert form.initial["retry_delays"] == "5, 60"
    assert form.initial["max_in_flight"] == "3"  # as typed, as every setting
    assert form.initial["event_types"] == "order.*, invoice.paid"
    page = staff_client.get(PAGE).content.decode()
    assert "<code>order.*</code>, <code>invoice.paid</code>" in page
    assert form.initial["max_per_second"] == "20"
    assert "20 requests/s" in page
    assert form.initial["changed_at"] == billing.changed_at.isoformat()


def test_edit_saves_and_keeps_the_token_when_left_blank(staff_client, billing):
    billing.set_token("kept-token")
    billing.save()

    response = staff_client.post(
        f"{PAGE}/edit",
        edit_form_of(
            billing,
            callback_url="https://new.example/h",
            retry_delays="10,20",
            max_per_second="2.5",
        ),
    )

    assert response.status_code == 302
    assert response["Location"] == PAGE
    after = Consumer.objects.get()
    assert after.callback_url == "https://new.example/h"
    assert after.retry_delays == [10, 20]
    assert after.max_per_second == 2.5
    assert after.check_token("kept-token")
    assert after.changed_at > billing.changed_at
    assert "Saved the settings of billing." in shown(staff_client)


def test_edit_imports_a_signing_secret_as_the_api_does(staff_client, billing):
    imported = "whsec_" + "A" * 44  # 33 bytes of key

    staff_client.post(f"{PAGE}/edit", edit_form_of(billing, signing_secret=imported))

    after = Consumer.objects.get()
    assert after.signing_secret == imported
    assert after.active_signing_secrets(timezone.now()) == [imported]  # no overlap


def test_edit_with_a_stale_form_is_refused(staff_client, billing):
    opened = edit_form_of(billing, callback_url="https://mine.example/h")
    billing.callback_url = "https://theirs.example/h"  # someone else saves in between
    billing.save()

    response = staff_client.post(f"{PAGE}/edit", opened)

    assert response.status_code == 409
    assert "Someone else changed this consumer" in response.content.decode()
    assert Consumer.objects.get().callback_url == "https://theirs.example/h"


def test_edit_of_a_paused_consumer_counts_the_pause_as_a_change(staff_client, billing):
    opened = edit_form_of(billing)
    staff_client.post(f"{PAGE}/pause")

    assert staff_client.post(f"{PAGE}/edit", opened).status_code == 409


def test_edit_shows_errors_and_saves_nothing(staff_client, billing):
    response = staff_client.post(f"{PAGE}/edit", edit_form_of(billing, callback_url="nope"))

    assert response.status_code == 400
    assert "must be an absolute http(s) URL." in response.content.decode()
    assert Consumer.objects.get().changed_at == billing.changed_at


# Pause, resume, close circuit: the API's services, so the same changes


def test_pause_and_resume_change_the_consumer_as_the_api_does(staff_client, admin_client):
    ui = make_consumer(make_channel("orders"), "billing")
    api = make_consumer(make_channel("refunds"), "billing")

    def compare(action: str) -> None:
        staff_client.post(f"/ui/consumers/orders/billing/{action}")
        admin_client.post(f"/channel/refunds/consumer/billing/{action}")

    compare("pause")
    paused_ui, paused_api = Consumer.objects.get(pk=ui.pk), Consumer.objects.get(pk=api.pk)
    assert paused_ui.paused
    assert paused_api.paused
    assert paused_ui.changed_at > ui.changed_at

    compare("pause")  # again: nothing changes, not even ChangedAt
    assert Consumer.objects.get(pk=ui.pk).changed_at == paused_ui.changed_at
    assert Consumer.objects.get(pk=api.pk).changed_at == paused_api.changed_at

    compare("resume")
    assert not Consumer.objects.get(pk=ui.pk).paused
    assert not Consumer.objects.get(pk=api.pk).paused
    assert "Resumed billing" in shown(staff_client)


def test_close_circuit_resets_it_as_the_api_does(staff_client, billing):
    open_until = timezone.now() + timedelta(minutes=5)
    Consumer.objects.filter(pk=billing.pk).update(
        circuit_failures=7, circuit_open_until=open_until, circuit_cooldown_seconds=240
    )
    page = shown(staff_client)
    assert "Close circuit" in page
    assert "circuit open" in page

    response = staff_client.post(f"{PAGE}/close-circuit")

    assert response.status_code == 302
    after = Consumer.objects.get()
    assert (after.circuit_failures, after.circuit_open_until, after.circuit_cooldown_seconds) == (
        0,
        None,
        0,
    )
    assert after.changed_at == billing.changed_at  # delivery activity, not a settings change
    assert "Closed the circuit of billing." in shown(staff_client)


# The signing secret


def verifies(secret: str, payload: bytes, headers: dict[str, str]) -> bool:
    try:
        Webhook(secret).verify(payload, headers, json_parse=False)
    except Exception:
        return False
    return True


def test_rotate_asks_first_then_keeps_the_previous_secret_valid(staff_client, billing):
    old = billing.signing_secret

    confirm = staff_client.get(f"{PAGE}/secret/rotate")
    assert confirm.status_code == 200
    assert "24 hours" in confirm.content.decode()
    unconfirmed = staff_client.post(f"{PAGE}/secret/rotate")
    assert unconfirmed.status_code == 400
    assert Consumer.objects.get().signing_secret == old

    response = staff_client.post(f"{PAGE}/secret/rotate", {"confirm": "yes"})

    assert response.status_code == 302  # a reload cannot rotate twice
    after = Consumer.objects.get()
    assert after.signing_secret != old
    assert after.previous_signing_secret == old
    assert after.previous_secret_expires_at is not None
    in_a_day = after.previous_secret_expires_at - timezone.now()
    assert timedelta(hours=23, minutes=59) < in_a_day <= timedelta(hours=24)
    headers = signature_headers(after, "msg-1", b"{}", timezone.now())
    assert verifies(old, b"{}", headers)
    assert verifies(after.signing_secret, b"{}", headers)
    page = shown(staff_client)
    assert "Rotated the signing secret of billing." in page
    assert after.signing_secret not in page
    assert "still signs until" in page


def test_reveal_shows_the_secret_only_in_the_post_response(staff_client, billing, caplog):
    secret = billing.signing_secret
    caplog.set_level(logging.DEBUG)

    confirm = staff_client.get(f"{PAGE}/secret/reveal")
    assert secret not in confirm.content.decode()
    assert secret not in staff_client.post(f"{PAGE}/secret/reveal").content.decode()

    revealed = staff_client.post(f"{PAGE}/secret/reveal", {"confirm": "yes"})

    assert revealed.status_code == 200
    assert revealed["Cache-Control"] == "no-store"
    assert f'id="signing-secret">{secret}<' in revealed.content.decode()
    assert secret not in shown(staff_client)
    assert secret not in caplog.text
    assert "revealed to ops" in caplog.text  # who saw it is logged, what they saw is not
    assert Consumer.objects.get().signing_secret == secret  # revealing changes nothing


# Send test event


def test_a_test_event_is_a_signed_delivery_and_its_result_is_shown(staff_client, billing, receiver):
    billing.callback_url = receiver.url("/hook")
    billing.set_token("sent-token")
    billing.save()

    response = staff_client.post(f"{PAGE}/test-event")

    assert response.status_code == 302
    assert response["Location"] == PAGE
    [request] = receiver.received
    assert request.path == "/hook"
    Webhook(billing.signing_secret).verify(request.body, request.headers, json_parse=False)
    assert request.headers["X-Broker-Consumer-Token"] == "sent-token"
    assert request.headers["X-Broker-Channel-ID"] == "orders"
    assert request.headers["X-Broker-Consumer-ID"] == "billing"
    assert request.headers[TEST_EVENT_HEADER] == "true"
    assert request.headers["Content-Type"] == "application/json"
    body = json.loads(request.body)
    assert body["type"] == "broker.test"
    assert body["id"] == request.headers["webhook-id"] == request.headers["X-Broker-Message-ID"]

    page = staff_client.get(PAGE)
    result = page.context["test_event"]
    assert result["status_code"] == 200
    assert result["excerpt"] == "ok"
    assert result["error_class"] == ""
    assert "Test event delivered: HTTP 200." in page.content.decode()
    assert staff_client.get(PAGE).context["test_event"] is None  # shown once
    # Not a channel message: nothing recorded, nothing to deliver again.
    assert not Message.objects.exists()
    assert not Job.objects.exists()
    assert not DeliveryAttempt.objects.exists()


def test_a_test_event_signs_with_both_secrets_during_a_rotation(staff_client, billing, receiver):
    billing.callback_url = receiver.url("/hook")
    billing.save()
    old = billing.signing_secret
    staff_client.post(f"{PAGE}/secret/rotate", {"confirm": "yes"})

    staff_client.post(f"{PAGE}/test-event")

    [request] = receiver.received
    new = Consumer.objects.get().signing_secret
    assert verifies(old, request.body, request.headers)
    assert verifies(new, request.body, request.headers)


def test_a_failing_test_event_shows_the_error(staff_client, billing, receiver):
    billing.callback_url = receiver.url("/down")
    billing.save()
    receiver.replies["/down"] = Reply(status=503, body=b"maintenance until 14:00")

    staff_client.post(f"{PAGE}/test-event")

    page = staff_client.get(PAGE)
    result = page.context["test_event"]
    assert (result["status_code"], result["error_class"]) == (503, "http-status")
    assert "maintenance until 14:00" in page.content.decode()
    assert "Test event failed: HTTP 503." in page.content.decode()
    assert Consumer.objects.get().circuit_failures == 0  # the circuit does not count tests


def test_a_test_event_to_a_closed_port_shows_a_connection_error(staff_client, billing):
    billing.callback_url = f"http://127.0.0.1:{closed_port()}/hook"
    billing.save()

    staff_client.post(f"{PAGE}/test-event")

    page = staff_client.get(PAGE)
    result = page.context["test_event"]
    assert result["status_code"] is None
    assert result["error_class"] == "connection"
    assert "no response" in page.content.decode()
    # libcurl's own words (jobs/curl_delivery.py).
    assert "Test event failed: curl error 7: Failed to connect" in page.content.decode()


def test_a_test_event_waits_no_longer_than_its_timeout(
    staff_client, billing, receiver, monkeypatch
):
    monkeypatch.setattr("jobs.test_event.MAX_TIMEOUT_SECONDS", 0.3)
    billing.callback_url = receiver.url("/slow")
    billing.save()
    receiver.replies["/slow"] = Reply(delay=1.0)

    staff_client.post(f"{PAGE}/test-event")

    result = staff_client.get(PAGE).context["test_event"]
    assert result["error_class"] == "timeout"
    assert result["duration_ms"] < 900


def test_a_test_event_goes_through_the_address_guard(staff_client, billing, receiver, settings):
    billing.callback_url = receiver.url("/hook")  # saved while private callbacks were allowed
    billing.save()
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = False

    staff_client.post(f"{PAGE}/test-event")

    assert receiver.received == []
    assert staff_client.get(PAGE).context["test_event"]["error_class"] == "unsafe-callback"


def test_pull_consumers_get_no_test_events(staff_client, receiver):
    consumer = make_consumer(make_channel("orders"), "billing", type="pull")
    consumer.callback_url = receiver.url("/hook")
    consumer.save()

    page = shown(staff_client)
    assert "Test events are push-only" in page
    assert "Send test event" not in page

    staff_client.post(f"{PAGE}/test-event")

    assert receiver.received == []
    assert "a pull consumer fetches its jobs" in shown(staff_client)


def test_the_page_lists_the_catalogued_types_it_receives(staff_client, billing):
    from broker.models import EventType

    for name, description in [("order.created", "An order was placed."), ("invoice.paid", "")]:
        EventType.objects.create(channel_id=billing.channel_id, name=name, description=description)
    billing.event_types = ["order.*"]
    billing.save()

    page = staff_client.get(PAGE).content.decode()

    assert "<code>order.created</code>: An order was placed." in page
    assert "<code>invoice.paid</code>" not in page


# Delivery figures (issue 38): from the per-minute statistics, before the settings


def stats_attempt(consumer: Consumer, ago: timedelta, status_code: int | None) -> None:
    """A push attempt of `consumer` that started `ago`, answered 120 ms after its publish."""
    started_at = timezone.now() - ago
    if not Producer.objects.filter(pk="shop").exists():
        make_producer()
    message = Message.objects.create(
        channel_id=consumer.channel_id,
        producer_id="shop",
        public_id=f"attempted-{Message.objects.count()}",
        payload=b"{}",
        content_type="application/json",
        status=Message.Status.DISPATCHED,
        received_at=started_at - timedelta(milliseconds=100),
    )
    DeliveryAttempt.objects.create(
        job=Job.objects.create(message=message, consumer=consumer, status=QUEUED),
        consumer_id=consumer.pk,
        attempt_number=1,
        started_at=started_at,
        duration_ms=20.0,
        status_code=status_code,
        error_class="" if status_code == 200 else "http-status",
        dispatcher_id="d1",
    )


def figures_of(response) -> dict[str, list[str]]:
    return {row.name: row.values for row in response.context["figures"].rows}


def test_the_page_shows_delivery_figures_from_the_statistics(staff_client, billing):
    other = make_consumer(billing.channel, "audit")
    for status in (200, 200, 404, 503, None):
        stats_attempt(billing, timedelta(minutes=5), status)
    for _ in range(2):
        stats_attempt(billing, timedelta(hours=3), 500)
    stats_attempt(billing, timedelta(hours=3), 302)
    stats_attempt(other, timedelta(minutes=5), 500)
    refresh_delivery_stats()
    DeliveryAttempt.objects.all().delete()  # the page reads the rollup, not the attempts

    response = staff_client.get(PAGE)

    figures = figures_of(response)
    assert figures["attempts"] == ["5", "8"]
    assert figures["class-2xx"] == ["2 (40.0%)", "2 (25.0%)"]
    assert figures["class-3xx"] == ["0 (0.0%)", "1 (12.5%)"]
    assert figures["class-4xx"] == ["1 (20.0%)", "1 (12.5%)"]
    assert figures["class-5xx"] == ["1 (20.0%)", "3 (37.5%)"]
    assert figures["class-no-answer"] == ["1 (20.0%)", "1 (12.5%)"]
    assert "class-other" not in figures
    assert figures["p50"] == figures["p95"] == ["≈ 115 ms", "≈ 115 ms"]  # 120 ms's bucket
    page = response.content.decode()
    assert "Delivered and failed per minute, last hour (UTC)" in page
    assert "Delivered and failed per hour, last 24 hours (UTC)" in page
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg"') == 2


def test_a_consumer_without_attempts_shows_empty_figures(staff_client, billing):
    figures = figures_of(staff_client.get(PAGE))

    assert figures["attempts"] == ["0", "0"]
    assert figures["class-2xx"] == ["—", "—"]
    assert figures["p95"] == ["—", "—"]


def test_the_delivery_state_and_figures_come_before_the_settings(staff_client, billing):
    page = shown(staff_client)

    places = [page.index(f'id="{section}"') for section in ("delivery", "figures", "settings")]
    assert places == sorted(places)
    assert page.index('id="last-failure"') < page.index("<dt>Retry delays</dt>")


def test_the_page_query_count_is_flat_in_the_statistics(staff_client, billing):
    stats_attempt(billing, timedelta(minutes=1), 200)
    refresh_delivery_stats()
    with CaptureQueriesContext(connection) as before:
        staff_client.get(PAGE)
    for minutes in range(2, 600, 7):
        stats_attempt(billing, timedelta(minutes=minutes), 200 if minutes % 3 else 503)
    refresh_delivery_stats()
    with CaptureQueriesContext(connection) as after:
        staff_client.get(PAGE)

    assert len(after) == len(before)


def test_unset_settings_show_their_default_values(staff_client, billing, settings):
    settings.BROKER_MAX_JOB_AGE_SECONDS = 2 * 86400

    page = shown(staff_client)

    assert "<dt>Max in flight</dt><dd>100 (default)</dd>" in page
    assert "<dt>Max job age</dt><dd>2 days (default)</dd>" in page


# The new consumer form (issue 38): groups, suggestions, the catalogue, defaults, copy buttons


def test_the_form_groups_its_fields_and_marks_the_required_ones(staff_client):
    make_channel("orders")

    response = staff_client.get("/ui/consumers/new")

    groups = response.context["form"].fieldsets()
    assert [group.legend for group in groups] == ["Where", "What", "How fast", "How safe"]
    assert [field.name for field in groups[0].fields] == [
        *("channel", "consumer_id", "name", "type", "callback_url"),
    ]
    page = response.content.decode()
    assert page.count("<legend>") == 4  # no catalogue: no channel legends
    required = re.findall(r'<label for="id_(\w+)">[^<]*<span class="required-mark"', page)
    assert required == ["channel", "consumer_id", "type", "callback_url", "ordering"]
    assert 'name="callback_url"' in page
    assert re.search(r'<input[^>]*name="consumer_id"[^>]*required', page)


def test_the_form_names_default_values_not_variables(staff_client, settings):
    settings.BROKER_RETRY_DELAYS = [30, 120, 3600, 86400]
    settings.BROKER_MAX_JOB_AGE_SECONDS = 3 * 86400

    form = staff_client.get("/ui/consumers/new").context["form"]

    assert form.fields["retry_delays"].help_text.endswith(
        "Blank: 30 s, 2 min, 1 h, 1 day (5 attempts)."
    )
    assert form.fields["max_in_flight"].help_text.endswith("Blank: 100.")
    assert form.fields["max_job_age"].help_text.endswith("Blank: 3 days.")
    assert "BROKER_" not in staff_client.get("/ui/consumers/new").content.decode()
    settings.BROKER_RETRY_DELAYS = []
    retries = staff_client.get("/ui/consumers/new").context["form"].fields["retry_delays"]
    assert retries.help_text.endswith("Blank: no retries (one attempt).")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(1, "1 s"), (90, "90 s"), (120, "2 min"), (5400, "90 min"), (7200, "2 h"), (86400, "1 day")],
)
def test_seconds_are_written_in_the_largest_whole_unit(seconds, text):
    from broker.ui.consumer_forms import seconds_text

    assert seconds_text(seconds) == text


def test_the_form_suggests_channels_and_offers_their_catalogues(staff_client):
    from broker.models import EventType

    make_channel("orders")
    make_channel("refunds")
    EventType.objects.create(channel_id="orders", name="order.created", description="Placed.")
    EventType.objects.create(channel_id="refunds", name="refund.issued")

    page = staff_client.get("/ui/consumers/new").content.decode()

    assert '<input type="text" name="channel"' in page
    assert 'list="channel-suggestions"' in page
    assert '<option value="orders">Orders</option>' in page
    assert '<option value="refunds">Refunds</option>' in page
    assert 'data-channel="orders"' in page
    assert 'value="orders/order.created"' in page
    assert 'value="refunds/refund.issued"' in page
    assert '<script src="/static/ui/consumers.js" defer></script>' in page


def test_ticked_catalogue_types_join_the_typed_patterns(staff_client):
    from broker.models import EventType

    make_channel("orders")
    for name in ("order.created", "order.paid"):
        EventType.objects.create(channel_id="orders", name=name)

    response = staff_client.post(
        "/ui/consumers/new",
        {
            "channel": "orders",
            "consumer_id": "billing",
            **settings_form(event_types="invoice.*, order.paid"),
            "catalogued_types": ["orders/order.created", "orders/order.paid"],
        },
    )

    assert response.status_code == 200
    assert Consumer.objects.get().event_types == ["invoice.*", "order.paid", "order.created"]


def test_another_channels_catalogue_entry_is_refused(staff_client):
    from broker.models import EventType

    make_channel("orders")
    make_channel("refunds")
    EventType.objects.create(channel_id="refunds", name="refund.issued")

    response = staff_client.post(
        "/ui/consumers/new",
        {
            "channel": "orders",
            "consumer_id": "billing",
            **settings_form(),
            "catalogued_types": ["refunds/refund.issued"],
        },
    )

    assert response.status_code == 400
    assert response.context["form"].errors["catalogued_types"] == [
        "refund.issued is in the catalogue of refunds, not orders."
    ]
    assert not Consumer.objects.exists()


def test_the_form_query_count_is_flat_in_channels_and_catalogue(staff_client):
    from broker.models import EventType

    make_channel("orders")
    with CaptureQueriesContext(connection) as few:
        staff_client.get("/ui/consumers/new")
    for n in range(20):
        make_channel(f"channel-{n}")
        EventType.objects.create(channel_id=f"channel-{n}", name=f"thing.{n}")
    with CaptureQueriesContext(connection) as many:
        page = staff_client.get("/ui/consumers/new").content.decode()

    assert len(many) == len(few)
    assert page.count('class="catalogue-group"') == 20


def test_the_token_and_secret_pages_have_copy_buttons(staff_client, billing):
    make_channel("refunds")
    created = staff_client.post(
        "/ui/consumers/new", {"channel": "refunds", "consumer_id": "k", **settings_form()}
    ).content.decode()
    revealed = staff_client.post(f"{PAGE}/secret/reveal", {"confirm": "yes"}).content.decode()

    assert 'data-copy="consumer-token" hidden>Copy token</button>' in created
    assert 'data-copy="signing-secret" hidden>Copy secret</button>' in revealed
    for page in (created, revealed):
        assert '<script src="/static/ui/consumers.js" defer></script>' in page
        assert "onclick" not in page
