"""A consumer's recent attempts on its page (issue 20): the reason for a failure is on the
consumer's page, filterable, each attempt linked to its job; the filters read a bounded number
of rows (broker/ui/consumer_attempts.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.models import DeliveryAttempt, Job
from jobs.states import QUEUED
from tests.helpers import make_job

pytestmark = pytest.mark.django_db
PAGE = "/ui/consumers/orders/billing"


def attempt(job: Job, minutes_ago: int, status_code: int | None, **fields) -> DeliveryAttempt:
    return DeliveryAttempt.objects.create(
        job=job,
        attempt_number=job.delivery_attempts.count() + 1,
        started_at=timezone.now() - timedelta(minutes=minutes_ago),
        duration_ms=2287.6,
        status_code=status_code,
        error_class=fields.pop("error_class", "http-status" if status_code else "connection"),
        dispatcher_id="d1",
        **fields,
    )


@pytest.fixture
def failing() -> Job:
    """A consumer whose circuit-worthy failures have a reason: clickhouse refuses."""
    job = make_job(QUEUED, attempts=3)
    attempt(job, 30, 200, error_class="")
    attempt(job, 20, 503, response_excerpt="connection to clickhouse:9000 refused")
    attempt(job, 10, None, error_class="timeout")
    return job


def test_the_page_says_why_the_consumer_fails(staff_client, failing):
    page = staff_client.get(PAGE).content.decode()

    assert "timeout" in page.split('id="last-attempt"')[1].split("</dd>")[0]
    assert f'href="/ui/jobs/{failing.public_id}"' in page
    assert "connection to clickhouse:9000 refused" in page
    assert "2.3 s" in page  # durations in a human unit


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("", ["timeout", 503, 200]),
        ("outcome=5xx", [503]),
        ("outcome=2xx", [200]),
        ("outcome=timeout", ["timeout"]),
        ("outcome=connection", []),
        ("status_code=503", [503]),
        ("status_code=404", []),
    ],
)
def test_recent_attempts_filter_by_status_and_class(staff_client, failing, query, shown):
    response = staff_client.get(f"{PAGE}?{query}")

    listed = [a.status_code or a.error_class for a in response.context["recent"].shown]
    assert listed == shown
    if not shown:
        assert "No attempt matches among the newest 10000" in response.content.decode()


def test_recent_attempts_filter_by_time(staff_client, failing):
    since = (timezone.now() - timedelta(minutes=25)).strftime("%Y-%m-%d %H:%M:%S")
    until = (timezone.now() - timedelta(minutes=15)).strftime("%Y-%m-%d %H:%M:%S")

    response = staff_client.get(PAGE, {"since": since, "until": until})

    assert [a.status_code for a in response.context["recent"].shown] == [503]


def test_filters_look_only_through_the_newest_attempts(staff_client, failing, monkeypatch):
    monkeypatch.setattr("broker.ui.consumer_attempts.SCANNED", 1)

    response = staff_client.get(f"{PAGE}?outcome=5xx")

    assert response.context["recent"].shown == []  # the 503 is older than the newest one


def test_the_page_query_count_does_not_grow_with_attempts(staff_client, failing):
    with CaptureQueriesContext(connection) as few:
        staff_client.get(PAGE)
    for minutes in range(40):
        attempt(failing, minutes, 500)
    with CaptureQueriesContext(connection) as many:
        staff_client.get(PAGE)

    assert len(many) == len(few)


def test_a_bad_filter_is_a_400_naming_it(staff_client, failing):
    response = staff_client.get(f"{PAGE}?outcome=6xx")

    assert response.status_code == 400
    assert "<code>outcome</code>" in response.content.decode()
