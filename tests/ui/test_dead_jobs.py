"""Operator UI: the dead jobs list and the job page, through Django's test client (docs/ui.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from broker.models import Channel
from jobs.models import DeliveryAttempt, Job
from jobs.states import DEAD, DELIVERED, QUEUED
from tests.helpers import make_consumer, make_job, make_operator
from tests.ui.paging import every_page

pytestmark = pytest.mark.django_db


def dead_job(*, died_ago: timedelta = timedelta(0), error: str = "", status_code=None) -> Job:
    job = make_job(DEAD, attempts=1)
    Job.objects.filter(pk=job.pk).update(
        status_changed_at=timezone.now() - died_ago, last_error=error
    )
    if status_code is not None:
        add_attempt(job, status_code=status_code)
    job.refresh_from_db()
    return job


def add_attempt(job: Job, status_code: int | None = 503, **fields) -> DeliveryAttempt:
    number = job.delivery_attempts.count() + 1
    return DeliveryAttempt.objects.create(
        job=job,
        attempt_number=number,
        started_at=timezone.now() + timedelta(seconds=number),
        duration_ms=10.0,
        status_code=status_code,
        error_class="http-status" if status_code else "connection",
        dispatcher_id="d1",
        **fields,
    )


def listed(response) -> list[int]:
    return [job.pk for job in response.context["jobs"]]


def test_pages_need_a_staff_login(client):
    job = dead_job()
    for url in ["/ui/dead-jobs", f"/ui/jobs/{job.public_id}"]:
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=/ui/")

    client.force_login(User.objects.create_user("someone", password="pw"))  # not staff
    assert client.get("/ui/dead-jobs").status_code == 302
    assert client.post(f"/ui/jobs/{job.public_id}/requeue").status_code == 302
    assert Job.objects.get().status == DEAD


def test_the_list_shows_only_dead_jobs_newest_first(staff_client):
    old = dead_job(died_ago=timedelta(hours=2))
    new = dead_job(died_ago=timedelta(minutes=1))
    make_job(QUEUED)

    response = staff_client.get("/ui/dead-jobs")

    assert response.status_code == 200
    assert listed(response) == [new.pk, old.pk]
    assert f'href="/ui/jobs/{new.public_id}"' in response.content.decode()


def test_filters(staff_client):
    timeout = dead_job(died_ago=timedelta(hours=3), error="timed out after 2s")
    gone = dead_job(died_ago=timedelta(hours=1), status_code=410)
    other_channel = Channel.objects.create(id="refunds", name="Refunds")
    elsewhere = make_job(DEAD)
    Job.objects.filter(pk=elsewhere.pk).update(consumer=make_consumer(other_channel, "audit"))

    def ids(**query) -> list[int]:
        return listed(staff_client.get("/ui/dead-jobs", query))

    assert ids(channel="refunds") == [elsewhere.pk]
    assert ids(consumer="audit") == [elsewhere.pk]
    assert ids(channel="orders", consumer="billing") == [gone.pk, timeout.pk]
    since = (timezone.now() - timedelta(hours=2)).isoformat()
    assert ids(since=since, channel="orders") == [gone.pk]
    assert ids(until=since) == [timeout.pk]
    assert ids(status_code=410) == [gone.pk]
    assert ids(error="TIMED OUT") == [timeout.pk]


def test_the_error_filter_also_searches_the_answers(staff_client):
    refused = dead_job(error="HTTP 503; all 3 attempts used", status_code=503)
    add_attempt(refused, response_excerpt="connection to ClickHouse:9000 refused")
    dead_job(error="HTTP 503; all 3 attempts used", status_code=503)  # said nothing more

    def ids(error: str) -> list[int]:
        return listed(staff_client.get("/ui/dead-jobs", {"error": error}))

    assert ids("clickhouse") == [refused.pk]
    assert ids("nowhere") == []
    assert len(ids("http 503")) == 2  # its own last error still counts


def test_a_search_looks_through_a_bounded_number_and_offers_the_next(staff_client, monkeypatch):
    monkeypatch.setattr("broker.ui.views.SEARCHED", 2)
    oldest = dead_job(died_ago=timedelta(hours=5), error="connection to clickhouse refused")
    for hours in range(4):
        dead_job(died_ago=timedelta(hours=hours), error="HTTP 503")

    first = staff_client.get("/ui/dead-jobs", {"error": "clickhouse"})
    assert listed(first) == []  # not among the two newest
    second = staff_client.get(f"/ui/dead-jobs?{first.context['search_older']}")
    assert listed(second) == []
    third = staff_client.get(f"/ui/dead-jobs?{second.context['search_older']}")

    assert listed(third) == [oldest.pk]
    assert third.context["search_older"] is None  # it looked through the last one
    assert "Search the next 2" in first.content.decode()


def test_searches_walk_jobs_that_died_at_the_same_moment_once_each(staff_client, monkeypatch):
    monkeypatch.setattr("broker.ui.views.SEARCHED", 2)
    moment = timezone.now() - timedelta(hours=1)
    jobs = [dead_job(error="HTTP 503") for _ in range(5)]
    Job.objects.filter(pk__in=[job.pk for job in jobs]).update(status_changed_at=moment)
    Job.objects.filter(pk__in=[jobs[1].pk, jobs[2].pk]).update(last_error="clickhouse refused")

    found, query, windows = [], "error=clickhouse", 0
    while query is not None:
        response = staff_client.get(f"/ui/dead-jobs?{query}")
        found += listed(response)
        query, windows = response.context["search_older"], windows + 1

    assert sorted(found) == sorted([jobs[1].pk, jobs[2].pk])  # each once, none skipped
    assert windows == 3  # 2 + 2 + 1 jobs looked through


def test_searches_find_attempts_whose_host_clock_was_behind(staff_client):
    job = dead_job(error="HTTP 503")
    behind = add_attempt(job, status_code=502, response_excerpt="upstream clickhouse is down")
    DeliveryAttempt.objects.filter(pk=behind.pk).update(
        started_at=job.created_at - timedelta(minutes=10)
    )

    assert listed(staff_client.get("/ui/dead-jobs", {"error": "clickhouse"})) == [job.pk]
    assert listed(staff_client.get("/ui/dead-jobs", {"status_code": 502})) == [job.pk]


def test_searches_find_attempts_recorded_long_after_the_job_died(staff_client):
    job = dead_job(died_ago=timedelta(days=3), error="HTTP 503")
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(days=4))
    late = add_attempt(job, status_code=504, response_excerpt="clickhouse timed out")
    DeliveryAttempt.objects.filter(pk=late.pk).update(started_at=timezone.now())  # 3 days on

    assert listed(staff_client.get("/ui/dead-jobs", {"error": "clickhouse"})) == [job.pk]
    assert listed(staff_client.get("/ui/dead-jobs", {"status_code": 504})) == [job.pk]


def test_pages_follow_a_cursor_without_counting(staff_client, monkeypatch):
    monkeypatch.setattr("broker.ui.paging.PAGE_SIZE", 2)
    jobs = [dead_job(died_ago=timedelta(minutes=minutes)) for minutes in range(5)]

    seen, _ = every_page(staff_client, "/ui/dead-jobs?channel=orders", listed)

    assert seen == [job.pk for job in jobs]


def test_the_list_query_count_does_not_grow_with_rows(staff_client):
    dead_job(status_code=500)
    with CaptureQueriesContext(connection) as one:
        staff_client.get("/ui/dead-jobs")
    for _ in range(5):
        dead_job(status_code=500)
    with CaptureQueriesContext(connection) as six:
        response = staff_client.get("/ui/dead-jobs")

    assert len(listed(response)) == 6
    assert len(six) == len(one)


def test_the_job_page_shows_the_job_and_its_attempts(staff_client):
    job = dead_job(error="HTTP 503")
    job.message.headers = {"X-Trace": "abc-123"}
    job.message.payload = b'{"order": 42}'
    job.message.save()
    add_attempt(job, status_code=500, response_excerpt="oops")
    add_attempt(job, status_code=None)

    with CaptureQueriesContext(connection) as queries:
        response = staff_client.get(f"/ui/jobs/{job.public_id}")

    page = response.content.decode()
    assert response.status_code == 200
    for text in [job.message.public_id, "billing", "HTTP 503", "X-Trace", "abc-123", "oops"]:
        assert text in page
    assert "{&quot;order&quot;: 42}" in page
    assert "connection" in page
    assert len(response.context["attempts"]) == 2
    assert len(queries) < 10


def test_an_offloaded_payload_is_not_read(staff_client):
    job = dead_job()
    job.message.payload, job.message.payload_file, job.message.payload_size = (
        b"",
        "ab/cd",
        5_000_000,
    )
    job.message.save()

    response = staff_client.get(f"/ui/jobs/{job.public_id}")

    assert response.context["preview"] is None
    assert "5000000 bytes" in response.content.decode()


def test_requeue_moves_a_dead_job_to_queued(staff_client):
    job = dead_job(error="HTTP 503")
    Job.objects.filter(pk=job.pk).update(attempts=5)

    response = staff_client.post(f"/ui/jobs/{job.public_id}/requeue", follow=True)

    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_expires_at) == (QUEUED, 0, None)
    assert "was requeued" in response.content.decode()


def test_requeue_of_a_job_that_is_not_dead_changes_nothing(staff_client):
    job = make_job(DELIVERED)

    response = staff_client.post(f"/ui/jobs/{job.public_id}/requeue", follow=True)

    assert Job.objects.get().status == DELIVERED
    assert "cannot go from DELIVERED to QUEUED" in response.content.decode()


def test_bulk_requeue_and_delete(staff_client):
    first, second, third = dead_job(), dead_job(), dead_job()
    alive = make_job(QUEUED)

    response = staff_client.post(
        "/ui/dead-jobs/bulk",
        {
            "action": "requeue",
            "job": [first.public_id, alive.public_id],
            "next": "/ui/dead-jobs?channel=orders",
            "confirmed": "yes",
        },
    )
    assert response["Location"] == "/ui/dead-jobs?channel=orders"
    assert Job.objects.get(pk=first.pk).status == QUEUED

    staff_client.post(
        "/ui/dead-jobs/bulk",
        {"action": "delete", "job": [second.public_id, alive.public_id], "confirmed": "yes"},
    )
    assert set(Job.objects.values_list("pk", flat=True)) == {first.pk, third.pk, alive.pk}

    response = staff_client.get("/ui/dead-jobs")
    shown = [str(message) for message in response.context["messages"]]
    assert shown == ["Requeued 1 of the 2 selected jobs.", "Deleted 1 of the 2 selected jobs."]


def test_bulk_redirects_only_to_this_site(staff_client):
    response = staff_client.post(
        "/ui/dead-jobs/bulk",
        {"action": "requeue", "next": "https://evil.example/", "confirmed": "yes"},
    )
    assert response["Location"] == "/ui/dead-jobs"


def test_requeue_since_takes_only_the_consumers_recent_dead_jobs(staff_client):
    old = dead_job(died_ago=timedelta(days=2))
    recent = dead_job(died_ago=timedelta(minutes=5))
    since = (timezone.now() - timedelta(days=1)).isoformat()

    staff_client.post(
        "/ui/dead-jobs/requeue-since",
        {"channel": "orders", "consumer": "billing", "since": since, "confirmed": "yes"},
    )

    assert Job.objects.get(pk=recent.pk).status == QUEUED
    assert Job.objects.get(pk=old.pk).status == DEAD


def test_posts_need_a_csrf_token():
    job = dead_job()
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_operator())

    assert client.post(f"/ui/jobs/{job.public_id}/requeue").status_code == 403
    assert (
        client.post("/ui/dead-jobs/bulk", {"action": "delete", "job": [job.public_id]}).status_code
        == 403
    )
    assert Job.objects.get().status == DEAD

    page = client.get(f"/ui/jobs/{job.public_id}")
    token = page.context["csrf_token"]
    assert (
        client.post(f"/ui/jobs/{job.public_id}/requeue", {"csrfmiddlewaretoken": token}).status_code
        == 302
    )
    assert Job.objects.get().status == QUEUED
