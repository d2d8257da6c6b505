"""Operator UI: scheduled and periodic message pages, through Django's test client (docs/ui.md,
docs/scheduled.md; docs/periodic.md). The UI writes through the same services as the REST API, so
several tests do the same thing over both and compare the outcome."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
import time_machine
from django.contrib.auth.models import User
from django.db import connection
from django.http import HttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils.html import escape

from broker import publish
from broker.models import Message, PeriodicMessage
from broker.periodic import run_due_ticks
from broker.ui.schedule_pages import ScheduledFilters, pending_messages
from jobs.models import Job
from jobs.queue import release_due_messages
from tests.conftest import FORM
from tests.helpers import (
    BROADCAST_HEADERS,
    make_channel,
    make_consumer,
    make_operator,
    make_producer,
)
from tests.ui.paging import every_page

pytestmark = pytest.mark.django_db

NOW = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=10)
ADMIN_TOKEN = "ui-schedules-admin-token"


@pytest.fixture
def orders():
    channel = make_channel("orders", token="channel-token")
    make_producer("shop", token="producer-token")
    make_consumer(channel, "billing")
    return channel


@pytest.fixture
def staff_client(client, clock):
    # Logged in at the tests' time: a session opened before the clock moved would be expired.
    client.force_login(make_operator())
    return client


@pytest.fixture(autouse=True)
def admin_token(settings):
    """The token of `api_client()`, the REST API's client (separate from the UI's session)."""
    settings.BROKER_ADMIN_TOKENS = [ADMIN_TOKEN]


def api_client() -> Client:
    return Client(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})


@pytest.fixture
def clock():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def scheduled(message_id: str, when: datetime = LATER, channel: str = "orders") -> Message:
    return publish(channel, b'{"n": 1}', producer="shop", message_id=message_id, scheduled_for=when)


def listed(response) -> list[str]:
    return [row.public_id for row in response.context["rows"]]


def listed_periodic(response) -> list[str]:
    return [schedule.public_id for schedule, _ in response.context["rows"]]


def text(response: HttpResponse) -> str:
    return response.content.decode()


def flashed(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


# --- access ------------------------------------------------------------------------------------


def test_pages_need_a_staff_login(client, orders, clock):
    scheduled("later-1")
    pages = [
        "/ui/scheduled",
        "/ui/scheduled/new",
        "/ui/scheduled/orders/later-1",
        "/ui/periodic",
        "/ui/periodic/new",
    ]
    for url in pages:
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=/ui/")

    client.force_login(User.objects.create_user("someone", password="pw"))  # not staff
    assert client.get("/ui/scheduled").status_code == 302
    assert client.post("/ui/scheduled/orders/later-1/cancel").status_code == 302
    assert Message.objects.filter(public_id="later-1").exists()


def test_actions_need_a_csrf_token(orders, clock):
    scheduled("later-1")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(make_operator())
    create_via_api("ping")

    assert browser.post("/ui/scheduled/orders/later-1/cancel").status_code == 403
    assert browser.post("/ui/periodic/orders/ping/disable").status_code == 403
    assert browser.post("/ui/periodic/orders/ping/delete").status_code == 403
    assert browser.post("/ui/periodic/new", {"channel": "orders"}).status_code == 403
    assert browser.post("/ui/scheduled/new", {"channel": "orders"}).status_code == 403
    assert Message.objects.filter(public_id="later-1").exists()
    assert PeriodicMessage.objects.get().enabled

    # The forms carry the token, so the same browser gets through once it has loaded the page.
    page = browser.get("/ui/scheduled")
    token = page.context["csrf_token"]
    response = browser.post("/ui/scheduled/orders/later-1/cancel", {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert not Message.objects.exists()


def test_actions_are_post_only(staff_client, orders, clock):
    scheduled("later-1")
    create_via_api("ping")

    assert staff_client.get("/ui/scheduled/orders/later-1/cancel").status_code == 405
    assert staff_client.get("/ui/periodic/orders/ping/disable").status_code == 405
    assert staff_client.get("/ui/periodic/orders/ping/delete").status_code == 405
    assert Message.objects.exists()
    assert PeriodicMessage.objects.get().enabled


# --- scheduled messages: the list ----------------------------------------------------------------


def test_the_list_shows_pending_messages_soonest_first(staff_client, orders, clock):
    make_channel("refunds", token="t")
    scheduled("in-an-hour", NOW + timedelta(hours=1))
    scheduled("in-ten-minutes", LATER)
    scheduled("refund-1", NOW + timedelta(minutes=30), channel="refunds")
    publish("orders", b"now", producer="shop", message_id="sent-at-once")
    scheduled("released", NOW - timedelta(minutes=1))
    release_due_messages()

    response = staff_client.get("/ui/scheduled")

    assert response.status_code == 200
    assert listed(response) == ["in-ten-minutes", "refund-1", "in-an-hour"]
    page = text(response)
    assert "2030-01-01 12:10:00" in page
    assert 'href="/ui/scheduled/orders/in-ten-minutes"' in page
    assert "<td>shop</td>" in page  # the producer
    assert "8\xa0bytes" in page  # the size
    assert 'action="/ui/scheduled/orders/in-ten-minutes/cancel"' in page
    assert listed(staff_client.get("/ui/scheduled", {"channel": "refunds"})) == ["refund-1"]
    assert listed(staff_client.get("/ui/scheduled", {"channel": "nope"})) == []


def test_scheduled_pages_follow_a_cursor_with_a_fixed_number_of_queries(
    staff_client, orders, clock, monkeypatch
):
    monkeypatch.setattr("broker.ui.paging.PAGE_SIZE", 2)
    # Two share one instant: the id breaks the tie, so neither is skipped nor shown twice.
    times = [LATER, LATER, LATER, NOW + timedelta(hours=2), NOW + timedelta(days=1)]
    expected = [scheduled(f"s{number}", when).public_id for number, when in enumerate(times)]
    make_channel("refunds", token="t")
    scheduled("elsewhere", LATER, channel="refunds")

    seen, query_counts = every_page(staff_client, "/ui/scheduled?channel=orders", listed)

    assert seen == expected
    assert len(query_counts) == 1  # every page, full or not, costs the same queries


def test_the_list_query_count_does_not_grow_with_rows(staff_client, orders, clock):
    scheduled("first")
    with CaptureQueriesContext(connection) as one:
        staff_client.get("/ui/scheduled")
    for number in range(20):
        scheduled(f"more-{number}")
    with CaptureQueriesContext(connection) as many:
        response = staff_client.get("/ui/scheduled")

    assert len(listed(response)) == 21
    assert len(many) == len(one)
    assert not any('"broker_message"."payload"' in query["sql"] for query in many)


def a_scheduled_backlog(channels: list[str], per_channel: int) -> None:
    """Many scheduled messages, inserted at once and analysed, so the planner chooses as it
    would in production (a few rows would make any plan look alike)."""
    for channel in channels[1:]:
        make_channel(channel)
    backlog = [
        Message(
            channel_id=channel,
            producer_id="shop",
            public_id=f"{channel}-{number}",
            payload=b"{}",
            content_type="application/json",
            status=Message.Status.SCHEDULED,
            received_at=NOW,
            scheduled_for=LATER + timedelta(seconds=number),
        )
        for channel in channels
        for number in range(per_channel)
    ]
    Message.objects.bulk_create(backlog, batch_size=1000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE broker_message")


def full_sort(plan: str) -> bool:
    """A Sort node that reads every matching row (an Incremental Sort only orders ties)."""
    return re.search(r"(?<!Incremental )Sort  \(", plan) is not None


def plan_of(filters: dict[str, str]) -> str:
    form = ScheduledFilters(filters)
    assert form.is_valid()
    return pending_messages(form)[:51].explain()


def test_the_list_of_every_channel_reads_the_release_index_in_order(orders, clock):
    a_scheduled_backlog(["orders", "refunds", "returns"], 2000)

    for filters in ({}, {"cursor": f"{LATER.isoformat()}~1"}):
        plan = plan_of(filters)
        assert "message_scheduled_due_idx" in plan
        assert not full_sort(plan)  # read in order: a page costs a page


def test_one_channels_list_reads_its_own_partial_index_in_order(orders, clock):
    a_scheduled_backlog(["orders", "refunds", "returns"], 2000)

    for filters in ({"channel": "orders"}, {"channel": "orders", "cursor": f"{LATER}~1"}):
        plan = plan_of(filters)
        assert "message_channel_pending_idx" in plan
        assert not full_sort(plan)


# --- scheduled messages: detail, create, cancel ---------------------------------------------------


def test_the_detail_page_shows_the_message_and_its_payload(staff_client, orders, clock):
    publish(
        "orders",
        b'{"order": 42}',
        producer="shop",
        message_id="later-1",
        scheduled_for=LATER,
        ordering_key="customer-7",
        headers={"X-Trace": "abc"},
    )

    response = staff_client.get("/ui/scheduled/orders/later-1")

    page = text(response)
    assert response.status_code == 200
    for fact in ["2030-01-01 12:10:00 UTC", "customer-7", "X-Trace", "{&quot;order&quot;: 42}"]:
        assert fact in page
    assert "Cancel this message" in page
    assert staff_client.get("/ui/scheduled/orders/nope").status_code == 404


def schedule_form(**fields) -> dict[str, str]:
    return {
        "channel": "orders",
        "producer": "shop",
        "message_id": "",
        "content_type": "application/json",
        "payload": '{"order": 42}',
        "priority": "0",
        "ordering_key": "",
        "scheduled_for": "2030-01-01T12:10",
        **fields,
    }


def test_schedule_a_message(staff_client, orders, clock):
    response = staff_client.post(
        "/ui/scheduled/new",
        schedule_form(message_id="hello", priority="3", ordering_key="k", payload="a\r\nb"),
        follow=True,
    )

    message = Message.objects.get()
    assert (message.public_id, message.status, message.scheduled_for) == (
        "hello",
        "SCHEDULED",
        LATER,
    )
    assert (message.priority, message.ordering_key, message.content_type) == (
        3,
        "k",
        "application/json",
    )
    assert bytes(message.payload) == b"a\nb"
    assert not Job.objects.exists()  # jobs come at the release
    assert response.redirect_chain == [("/ui/scheduled?channel=orders", 302)]
    assert flashed(response) == ["Message hello is scheduled for 2030-01-01 12:10:00 UTC."]

    # An RFC 3339 time with an offset is taken too; an empty message ID is generated.
    staff_client.post("/ui/scheduled/new", schedule_form(scheduled_for="2030-01-01T14:00:00+01:00"))
    generated = Message.objects.exclude(public_id="hello").get()
    assert generated.scheduled_for == NOW + timedelta(hours=1)
    assert re.fullmatch(r"[0-9a-v]{20}", generated.public_id)  # an xid, as webhook-broker


def test_too_soon_is_refused_with_the_message_the_api_gives(staff_client, orders, clock, settings):
    settings.BROKER_MIN_SCHEDULE_DELAY_SECONDS = 300
    api_answer = Client().post(
        "/channel/orders/broadcast",
        b"x",
        content_type="text/plain",
        headers={**BROADCAST_HEADERS, "X-Broker-Scheduled-For": "2030-01-01T12:04:00Z"},
    )
    assert api_answer.status_code == 412

    response = staff_client.post(
        "/ui/scheduled/new", schedule_form(scheduled_for="2030-01-01T12:04")
    )

    assert response.status_code == 400
    assert api_answer.json()["Error"] in response.context["form"].non_field_errors()
    assert not Message.objects.exists()


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"producer": "nobody"}, "No producer with ID 'nobody'."),
        ({"channel": "nope"}, "No channel with ID 'nope'."),
        ({"message_id": ".hidden"}, "Invalid message ID '.hidden'."),
        ({"priority": str(2**31)}, "The priority must fit in a signed 32-bit integer."),
        ({"ordering_key": "a\x01b"}, "The ordering key must be text of at most 255 characters."),
        ({"message_id": "taken"}, "Channel 'orders' already has a message with ID 'taken'."),
    ],
)
def test_create_refuses_what_publish_refuses(staff_client, orders, clock, fields, error):
    publish("orders", b"x", producer="shop", message_id="taken")

    response = staff_client.post("/ui/scheduled/new", schedule_form(**fields))

    assert response.status_code == 400
    assert error in response.context["form"].non_field_errors()
    assert list(Message.objects.values_list("public_id", flat=True)) == ["taken"]


@pytest.mark.parametrize(
    "value",
    ["tomorrow", "2030-01-02", "2030-02-30T12:00", "2030-01-02T12:00+0100", "20300102T1200"],
)
def test_create_refuses_an_unreadable_time(staff_client, orders, clock, value):
    response = staff_client.post("/ui/scheduled/new", schedule_form(scheduled_for=value))

    assert response.status_code == 400
    assert response.context["form"].errors["scheduled_for"] == [
        "Give a date and time, e.g. 2030-01-31T12:00."
    ]
    assert not Message.objects.exists()


def test_create_refuses_a_missing_field(staff_client, orders, clock):

    response = staff_client.post("/ui/scheduled/new", schedule_form(payload=""))
    assert response.context["form"].errors["payload"]
    assert not Message.objects.exists()


def test_the_create_form_proposes_a_time_the_minimum_delay_allows(staff_client, orders, clock):
    response = staff_client.get("/ui/scheduled/new?channel=orders")

    form = response.context["form"]
    assert form.initial == {"channel": "orders", "scheduled_for": "2030-01-01T12:03"}
    assert 'placeholder="e.g. 2030-01-31 12:00"' in text(response)  # ISO, whatever the locale


def test_cancel_deletes_a_message_not_yet_released(staff_client, orders, clock):
    scheduled("later-1")
    scheduled("later-2")

    response = staff_client.post(
        "/ui/scheduled/orders/later-1/cancel", {"next": "/ui/scheduled?channel=orders"}, follow=True
    )

    assert response.redirect_chain == [("/ui/scheduled?channel=orders", 302)]
    assert flashed(response) == ["Scheduled message later-1 was cancelled (deleted)."]
    assert listed(response) == ["later-2"]
    clock.move_to(LATER)
    assert release_due_messages() == 1
    assert Job.objects.get().message.public_id == "later-2"


def test_cancel_after_release_is_refused_and_changes_nothing(staff_client, orders, clock):
    scheduled("later-1")
    clock.move_to(LATER)
    release_due_messages()

    response = staff_client.post("/ui/scheduled/orders/later-1/cancel", follow=True)

    assert flashed(response) == [
        "Scheduled message 'later-1' was already released; it can no longer be cancelled."
    ]
    assert Message.objects.get().status == Message.Status.DISPATCHED
    assert Job.objects.count() == 1


def test_cancel_of_an_unknown_message_says_so(staff_client, orders, clock):
    response = staff_client.post("/ui/scheduled/orders/nope/cancel", follow=True)

    assert flashed(response) == ["No scheduled message 'nope' in channel 'orders'."]


def test_cancel_never_redirects_off_site(staff_client, orders, clock):
    scheduled("later-1")

    response = staff_client.post(
        "/ui/scheduled/orders/later-1/cancel", {"next": "https://evil.example/"}
    )

    assert response["Location"] == "/ui/scheduled"


# --- periodic messages -------------------------------------------------------------------------


EVERY_MINUTE = {"producer": "shop", "payload": '{"ping": 1}', "intervalSeconds": "60"}


def create_via_api(public_id: str, **fields) -> PeriodicMessage:
    data = {**EVERY_MINUTE, "id": public_id, **fields}
    form = {name: value for name, value in data.items() if value is not None}
    response = api_client().post(
        "/channel/orders/periodic-messages", urlencode(form), content_type=FORM
    )
    assert response.status_code == 201, response.content
    return PeriodicMessage.objects.get(public_id=public_id)


def periodic_form(**fields) -> dict[str, str]:
    """What the browser posts from the create form: every field, empty when not filled."""
    form = {
        "channel": "orders",
        "id": "",
        "intervalSeconds": "",
        "cron": "",
        "timeZone": "UTC",
        "enabled": "true",
        "producer": "shop",
        "contentType": "",
        "priority": "",
        "orderingKey": "",
        "payload": '{"ping": 1}',
        "payloadEncoding": "utf-8",
        "headers": "",
        **fields,
    }
    return {name: value for name, value in form.items() if value is not None}


def test_the_periodic_list(staff_client, orders, clock):
    make_channel("refunds", token="t")
    create_via_api("ping")
    create_via_api("morning", intervalSeconds=None, cron="0 9 * * 1-5", timeZone="Europe/Berlin")
    create_via_api("paused", enabled="false", skipWhilePending="true")
    refund = PeriodicMessage.objects.get(public_id="ping")
    refund.pk, refund.public_id, refund.channel_id = None, "audit", "refunds"
    refund._state.adding = True
    refund.save()
    run_due_ticks(now=NOW + timedelta(minutes=1))

    response = staff_client.get("/ui/periodic")

    assert listed_periodic(response) == ["morning", "paused", "ping", "audit"]
    page = text(response)
    assert "every 60 s" in page
    assert "<code>0 9 * * 1-5</code>" in page
    assert "Europe/Berlin" in page
    assert "skip while pending" in page
    assert page.count("status-disabled") == 1
    assert "2030-01-01 12:02:00" in page  # ping's next run, after its tick at 12:01
    assert "2030-01-02 08:00:00" in page  # 09:00 in Berlin
    last = PeriodicMessage.objects.get(public_id="ping").last_message
    assert last is not None
    assert f'href="/ui/messages?q={last.public_id}&amp;channel=orders"' in page
    assert listed_periodic(staff_client.get("/ui/periodic", {"channel": "refunds"})) == ["audit"]


def test_periodic_pages_follow_a_cursor_with_a_fixed_number_of_queries(
    staff_client, orders, clock, monkeypatch
):
    monkeypatch.setattr("broker.ui.paging.PAGE_SIZE", 2)
    names = [f"p{number}" for number in range(5)]
    for name in names:
        create_via_api(name)
    run_due_ticks(now=NOW + timedelta(minutes=1))  # each has a last message to show

    seen, query_counts = every_page(staff_client, "/ui/periodic?channel=orders", listed_periodic)

    assert seen == names
    assert len(query_counts) == 1


def test_create_a_periodic_message(staff_client, orders, clock):
    response = staff_client.post(
        "/ui/periodic/new",
        periodic_form(
            id="ping",
            intervalSeconds="60",
            headers='{"X-Kind": "ping"}',
            priority="2",
            eventType="report.daily",
        ),
        follow=True,
    )

    periodic = PeriodicMessage.objects.get()
    assert periodic.event_type == "report.daily"
    assert response.redirect_chain == [("/ui/periodic/orders/ping", 302)]
    assert flashed(response) == ["Periodic message ping was created."]
    assert (periodic.interval_seconds, periodic.cron, periodic.enabled) == (60, "", True)
    assert (periodic.headers, periodic.priority) == ({"X-Kind": "ping"}, 2)
    assert periodic.content_type == "application/octet-stream"  # the API's default
    assert periodic.next_run_at == NOW + timedelta(minutes=1)  # as the API's POST sets it


def test_a_periodic_message_created_disabled_has_no_next_run(staff_client, orders, clock):
    form = periodic_form(id="later", cron="@daily", timeZone="Europe/Berlin", enabled=None)

    staff_client.post("/ui/periodic/new", form)

    periodic = PeriodicMessage.objects.get()
    assert (periodic.cron, periodic.enabled, periodic.next_run_at) == ("@daily", False, None)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"intervalSeconds": "60", "cron": "* * * * *"}, "Give either intervalSeconds or cron"),
        ({}, "Creating needs intervalSeconds or cron."),
        ({"cron": "61 * * * *"}, "Invalid cron expression '61 * * * *'."),
        ({"cron": "* * * * * *"}, "A cron expression has 5 fields"),
        ({"cron": "0 0 30 2 *"}, "never matches"),
        ({"cron": "0 9 * * *", "timeZone": "Mars/Olympus"}, "Unknown time zone"),
        ({"intervalSeconds": "0"}, "intervalSeconds: "),
        ({"intervalSeconds": "60", "producer": "nobody"}, "No producer 'nobody'."),
        ({"intervalSeconds": "60", "payload": ""}, "payload: "),
        ({"intervalSeconds": "60", "headers": "[1]"}, "headers: a JSON object"),
        ({"intervalSeconds": "60", "id": "a b"}, "Invalid periodic message ID"),
        ({"intervalSeconds": "60", "channel": "nope"}, "No channel 'nope'."),
    ],
)
def test_create_refuses_what_the_api_refuses(staff_client, orders, clock, fields, error):
    response = staff_client.post("/ui/periodic/new", periodic_form(**fields))

    assert response.status_code == 400
    assert any(error in shown for shown in response.context["errors"]), response.context["errors"]
    assert not PeriodicMessage.objects.exists()
    assert escape(fields.get("payload", '{"ping": 1}')) in text(response)  # kept in the form


def test_create_refuses_a_duplicate_id(staff_client, orders, clock):
    create_via_api("ping")

    response = staff_client.post("/ui/periodic/new", periodic_form(id="ping", intervalSeconds="5"))

    assert response.context["errors"] == ["Periodic message 'ping' already exists."]
    assert PeriodicMessage.objects.get().interval_seconds == 60


def put_via_api(public_id: str, data: dict[str, str]):
    client = api_client()
    url = f"/channel/orders/periodic-message/{public_id}"
    stamp = client.get(url)["Last-Modified"]
    response = client.put(
        url, urlencode(data), content_type=FORM, headers={"If-Unmodified-Since": stamp}
    )
    assert response.status_code == 200, response.content
    return response.json()


def next_runs() -> dict[str, datetime | None]:
    return dict(PeriodicMessage.objects.values_list("public_id", "next_run_at"))


@pytest.mark.parametrize(
    "schedule",
    [{}, {"intervalSeconds": None, "cron": "0 9 * * *", "timeZone": "Europe/Berlin"}],
)
def test_enable_and_disable_move_next_run_at_exactly_as_the_api_does(
    staff_client, orders, clock, schedule
):
    create_via_api("by-ui", **schedule)
    create_via_api("by-api", **schedule)

    clock.move_to(NOW + timedelta(hours=3, seconds=20, microseconds=5000))
    staff_client.post("/ui/periodic/orders/by-ui/disable")
    put_via_api("by-api", {"enabled": "false"})
    assert next_runs() == {"by-ui": None, "by-api": None}
    assert not PeriodicMessage.objects.filter(enabled=True).exists()

    clock.move_to(NOW + timedelta(days=1, hours=1, seconds=7, microseconds=3000))
    response = staff_client.post("/ui/periodic/orders/by-ui/enable", follow=True)
    put_via_api("by-api", {"enabled": "true"})
    runs = next_runs()
    enabled_by_ui = runs["by-ui"]
    assert enabled_by_ui is not None
    assert enabled_by_ui == runs["by-api"]
    assert enabled_by_ui > NOW + timedelta(days=1, hours=1)
    shown = f"{enabled_by_ui:%Y-%m-%d %H:%M:%S}"
    assert flashed(response)[-1] == f"Periodic message by-ui is enabled; next run {shown} UTC."

    # Enabling what is enabled changes nothing, as a PUT enabled=true would not.
    clock.move_to(NOW + timedelta(days=2))
    staff_client.post("/ui/periodic/orders/by-ui/enable")
    assert next_runs()["by-ui"] == enabled_by_ui


def test_enable_from_the_list_returns_to_the_list(staff_client, orders, clock):
    create_via_api("ping", enabled="false")

    response = staff_client.post(
        "/ui/periodic/orders/ping/enable", {"next": "/ui/periodic?channel=orders"}
    )

    assert response["Location"] == "/ui/periodic?channel=orders"
    assert PeriodicMessage.objects.get().enabled
    assert staff_client.post("/ui/periodic/orders/nope/enable").status_code == 404
    assert staff_client.post("/ui/periodic/nope/ping/enable").status_code == 404


def edit_form(page_response, **changes) -> dict[str, str]:
    """The edit form as the browser posts it, from the values the page rendered."""
    values = page_response.context["values"]
    schedule = page_response.context["schedule"]
    form = {
        name: str(values[name])
        for name in [
            "producer",
            "payload",
            "payloadEncoding",
            "contentType",
            "priority",
            "headers",
            "orderingKey",
            "intervalSeconds",
            "cron",
            "timeZone",
        ]
    }
    if values["skipWhilePending"]:
        form["skipWhilePending"] = "true"
    form["changed_at"] = schedule.changed_at.isoformat()
    form.update(changes)
    return {name: value for name, value in form.items() if value is not None}


def test_edit_a_periodic_message(staff_client, orders, clock):
    create_via_api("ping", headers='{"X-Kind": "ping"}', orderingKey="k")
    page = staff_client.get("/ui/periodic/orders/ping")
    assert page.status_code == 200
    assert "every 60 s" in text(page)

    clock.move_to(NOW + timedelta(minutes=30))
    response = staff_client.post(
        "/ui/periodic/orders/ping",
        edit_form(page, intervalSeconds="", cron="*/15 * * * *", orderingKey="", priority="4"),
        follow=True,
    )

    assert flashed(response) == ["Periodic message ping was saved."]
    periodic = PeriodicMessage.objects.get()
    assert (periodic.interval_seconds, periodic.cron) == (None, "*/15 * * * *")
    assert (periodic.ordering_key, periodic.priority) == ("", 4)
    assert periodic.headers == {"X-Kind": "ping"}
    assert bytes(periodic.payload) == b'{"ping": 1}'
    assert periodic.next_run_at == NOW + timedelta(minutes=45)  # the first tick of the new cron


def test_saving_the_form_unchanged_keeps_a_binary_payload_and_the_next_run(
    staff_client, orders, clock
):
    create_via_api("bin", payload="AP8=", payloadEncoding="base64", skipWhilePending="true")
    before = PeriodicMessage.objects.get()
    page = staff_client.get("/ui/periodic/orders/bin")

    clock.move_to(NOW + timedelta(seconds=30))
    response = staff_client.post("/ui/periodic/orders/bin", edit_form(page))

    assert response.status_code == 302
    after = PeriodicMessage.objects.get()
    assert bytes(after.payload) == b"\x00\xff"
    assert after.skip_while_pending
    assert after.next_run_at == before.next_run_at


def test_an_invalid_edit_is_refused_and_changes_nothing(staff_client, orders, clock):
    create_via_api("ping")
    page = staff_client.get("/ui/periodic/orders/ping")

    response = staff_client.post("/ui/periodic/orders/ping", edit_form(page, cron="0 9 * * *"))

    assert response.status_code == 400
    assert response.context["errors"] == ["Give either intervalSeconds or cron, not both."]
    assert PeriodicMessage.objects.get().cron == ""


def test_an_edit_made_on_a_stale_page_is_refused(staff_client, orders, clock):
    create_via_api("ping")
    page = staff_client.get("/ui/periodic/orders/ping")
    clock.move_to(NOW + timedelta(seconds=5))
    put_via_api("ping", {"priority": "9"})  # someone else, meanwhile

    response = staff_client.post("/ui/periodic/orders/ping", edit_form(page, priority="1"))

    assert response.status_code == 400
    assert "changed by someone else" in response.context["errors"][0]
    assert PeriodicMessage.objects.get().priority == 9


def test_delete_a_periodic_message_keeps_what_it_published(staff_client, orders, clock):
    create_via_api("ping")
    run_due_ticks(now=NOW + timedelta(minutes=1))

    response = staff_client.post("/ui/periodic/orders/ping/delete", follow=True)

    assert response.redirect_chain == [("/ui/periodic?channel=orders", 302)]
    assert flashed(response) == [
        "Periodic message ping was deleted; the messages it published stay."
    ]
    assert not PeriodicMessage.objects.exists()
    assert Message.objects.count() == 1
    again = staff_client.post("/ui/periodic/orders/ping/delete", follow=True)
    assert flashed(again) == ["There is no periodic message ping in orders."]
