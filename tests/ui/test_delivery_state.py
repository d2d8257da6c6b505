"""Why a consumer fails, on its dashboard row and its page (issue 20): its newest attempt, its
newest failure as the dispatcher recorded it, and when its next attempt is due or what holds it
back (broker/ui/delivery_state.py), from a real dispatcher step against a real receiver."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from broker import publish
from consumers import services
from consumers.models import Consumer
from jobs.models import Job
from jobs.queue_depth import next_due_times
from jobs.states import QUEUED
from tests.delivery import push_consumer, run_once
from tests.helpers import make_consumer
from tests.receiver import Reply

pytestmark = pytest.mark.django_db
REFUSAL = b"connection to clickhouse:9000 refused"


@pytest.fixture(autouse=True)
def policy(settings):
    settings.BROKER_RETRY_JITTER = 0
    settings.BROKER_RETRY_DELAYS = [60, 600]
    settings.BROKER_CIRCUIT_FAILURE_THRESHOLD = 3


@pytest.fixture
def failing(channel, receiver) -> Consumer:
    """A consumer whose receiver answers 503 with why, after one failed attempt."""
    consumer = push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(503, body=REFUSAL)
    publish(channel, b"{}", producer="shop", message_id="m1")
    return consumer


def row_of(page: str, consumer: Consumer) -> str:
    """The dashboard's rows of `consumer`: its figures, and the line that says why."""
    start = page.index(f'data-consumer="{consumer.channel_id}/{consumer.public_id}"')
    why = page.index(f'data-why="{consumer.channel_id}/{consumer.public_id}"')
    return page[start : page.index("</tr>", why)]


def test_the_dashboard_row_says_why_and_when_next(staff_client, failing, dispatcher):
    before = timezone.now().replace(microsecond=0)
    run_once(dispatcher)

    row = row_of(staff_client.get("/ui/").content.decode(), failing)

    assert "HTTP 503" in row.split('class="last-attempt"')[1]
    assert "connection to clickhouse:9000 refused" in row.split('class="last-failure')[1]
    next_attempt = row.split('class="next-attempt"')[1].split("</span>\n")[0]
    due = Job.objects.get().next_attempt_at
    assert due >= before + timedelta(seconds=60)
    assert f"due {due:%Y-%m-%d %H:%M:%S} UTC" in next_attempt
    assert 'href="/ui/consumers/orders/billing"' in row  # its name leads to its page


def test_the_consumer_page_says_the_same(staff_client, failing, dispatcher):
    run_once(dispatcher)

    page = staff_client.get("/ui/consumers/orders/billing").content.decode()

    assert "HTTP 503" in page.split('id="last-attempt"')[1].split("</dd>")[0]
    assert "clickhouse:9000 refused" in page.split('id="last-failure"')[1].split("</dd>")[0]
    assert "due " in page.split('id="next-attempt"')[1].split("</dd>")[0]


def test_an_open_circuit_is_what_holds_the_next_attempt(staff_client, failing, dispatcher):
    failing.circuit_open_until = timezone.now() + timedelta(minutes=5)
    failing.save()

    row = row_of(staff_client.get("/ui/").content.decode(), failing)

    next_attempt = row.split('class="next-attempt"')[1].split("</span>\n")[0]
    assert "held back: circuit open until" in next_attempt
    assert "none recorded" in row  # no failure yet


def test_a_consumer_with_no_answer_shows_the_error(staff_client, channel, dispatcher):
    consumer = make_consumer(channel)  # its callback, port 9 on loopback, refuses connections
    publish(channel, b"{}", producer="shop", message_id="m1")
    run_once(dispatcher)

    consumer.refresh_from_db()
    assert "connect" in consumer.last_failure.lower()  # the HTTP client's words for the refusal
    row = row_of(staff_client.get("/ui/").content.decode(), consumer)
    assert "connection" in row.split('class="last-attempt"')[1]  # the attempt's error class


def test_a_later_success_leaves_the_failure_and_an_older_failure_never_replaces_it(
    failing, dispatcher, receiver
):
    run_once(dispatcher)
    failing.refresh_from_db()
    failed_at = failing.last_failure_at
    receiver.replies["/hook"] = Reply(200)
    publish(failing.channel, b"{}", producer="shop", message_id="m2")
    with time_machine.travel(timezone.now() + timedelta(seconds=61), tick=False):
        run_once(dispatcher)

    failing.refresh_from_db()
    assert failing.last_failure_at == failed_at
    assert "refused" in failing.last_failure


def test_next_due_is_the_earliest_whatever_the_priorities(channel):
    consumer, idle = make_consumer(channel, "billing"), make_consumer(channel, "idle")
    now = timezone.now()
    for number, (priority, minutes) in enumerate([(5, 30), (5, 20), (0, 10), (-3, 40)]):
        publish(channel, b"{}", producer="shop", message_id=f"m{number}", priority=priority)
        Job.objects.filter(message__public_id=f"m{number}", consumer=consumer).update(
            next_attempt_at=now + timedelta(minutes=minutes)
        )
    Job.objects.filter(consumer=idle).delete()

    due = next_due_times()

    assert due[consumer.pk] == now + timedelta(minutes=10)
    assert due[idle.pk] is None
    assert next_due_times(consumer.pk) == {consumer.pk: now + timedelta(minutes=10)}
    Job.objects.filter(consumer=consumer, next_attempt_at=now + timedelta(minutes=10)).update(
        status="DEAD"
    )
    assert next_due_times(consumer.pk)[consumer.pk] == now + timedelta(minutes=20)
    assert Job.objects.filter(consumer=consumer, status=QUEUED).count() == 3


def test_a_pause_by_a_410_says_so_on_the_dashboard_and_on_its_page(
    staff_client, channel, receiver, dispatcher
):
    consumer = push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(410, body=b"this endpoint was removed")
    publish(channel, b"{}", producer="shop", message_id="m1")
    run_once(dispatcher)
    consumer.refresh_from_db()
    assert consumer.paused  # by the dispatcher (jobs/retry.py)

    row = row_of(staff_client.get("/ui/").content.decode(), consumer)
    page = staff_client.get("/ui/consumers/orders/billing").content.decode()

    assert re.findall(r'class="badge [^"]*"[^>]*>([^<]+)<', row) == ["Paused: 410 Gone"]
    assert "held back: consumer paused: it answered 410 Gone" in row
    assert re.search(r'id="delivery-state"[^>]*>Paused: 410 Gone<', page)
    assert "yes: it answered 410 Gone" in page

    # Resumed, then paused by hand: a pause like any other.
    services.pause_consumer("orders", "billing", False)
    services.pause_consumer("orders", "billing", True)
    page = staff_client.get("/ui/consumers/orders/billing").content.decode()
    assert re.search(r'id="delivery-state"[^>]*>Paused<', page)
    assert "yes: jobs wait until resumed" in page
