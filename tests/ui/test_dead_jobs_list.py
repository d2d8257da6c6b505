"""The dead jobs list's ways to find and count (issue 38): a message-ID filter, the number of
matches on the list itself (bounded, and the same as an action's confirmation counts), quick
ranges, and example dates that read as examples (docs/ui.md, "Dead jobs")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs

import pytest
import time_machine
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from broker.models import Channel
from jobs.models import Job
from jobs.states import DEAD, QUEUED
from tests.helpers import make_consumer, make_job
from tests.ui.test_dead_jobs import dead_job, listed

pytestmark = pytest.mark.django_db


def test_the_message_filter_finds_the_jobs_of_a_message_id(staff_client):
    wanted, other = dead_job(), dead_job()
    elsewhere = make_job(DEAD)  # the same message ID in another channel
    refunds = Channel.objects.create(id="refunds", name="Refunds")
    Job.objects.filter(pk=elsewhere.pk).update(consumer=make_consumer(refunds, "audit"))
    elsewhere.message.public_id = wanted.message.public_id
    elsewhere.message.channel = refunds
    elsewhere.message.save()

    def ids(**query) -> set[int]:
        return set(listed(staff_client.get("/ui/dead-jobs", query)))

    assert ids(message=wanted.message.public_id) == {wanted.pk, elsewhere.pk}
    assert ids(message=wanted.message.public_id, channel="orders") == {wanted.pk}
    assert ids(message="no-such-message") == set()
    assert other.pk in ids()


def test_all_matching_with_a_message_takes_only_that_messages_jobs(staff_client):
    wanted, other = dead_job(), dead_job()
    form = {
        "action": "delete",
        "channel": "orders",
        "consumer": "billing",
        "message": wanted.message.public_id,
    }

    asked = staff_client.post("/ui/dead-jobs/matching", form)
    assert not asked.context["preview"].whole  # not the consumer's whole queue
    staff_client.post("/ui/dead-jobs/matching", {**form, "confirmed": "yes"})

    assert list(Job.objects.values_list("pk", flat=True)) == [other.pk]


def test_the_list_shows_how_many_jobs_match(staff_client):
    for minutes in range(3):
        dead_job(died_ago=timedelta(minutes=minutes), error="HTTP 503")
    make_job(QUEUED)

    shown = staff_client.get("/ui/dead-jobs").content.decode()
    assert '<span id="match-count" data-refresh>3 dead jobs match</span>' in shown
    one = staff_client.get("/ui/dead-jobs", {"message": "m-1"}).content.decode()
    assert ">1 dead job matches<" in one
    searched = staff_client.get("/ui/dead-jobs", {"error": "503"})
    assert searched.context["matches"].value == 3
    dead_job(error="HTTP 410", status_code=410)
    by_status = staff_client.get("/ui/dead-jobs", {"status_code": 410})
    assert by_status.context["matches"].value == 1


def test_the_count_is_bounded_and_agrees_with_the_confirmation(staff_client, monkeypatch):
    monkeypatch.setattr("broker.ui.views.MATCHES_COUNTED", 2)
    monkeypatch.setattr("broker.ui.job_actions.ACTION_LIMIT", 2)
    for minutes in range(3):
        dead_job(died_ago=timedelta(minutes=minutes))

    shown = staff_client.get("/ui/dead-jobs").content.decode()
    asked = staff_client.post("/ui/dead-jobs/matching", {"action": "requeue"}).content.decode()

    assert ">≥ 2 dead jobs match<" in shown
    assert "<h1>Requeue ≥ 2 dead jobs?</h1>" in asked


def test_every_page_counts_from_the_first(staff_client, monkeypatch):
    monkeypatch.setattr("broker.ui.paging.PAGE_SIZE", 2)
    for minutes in range(5):
        dead_job(died_ago=timedelta(minutes=minutes))
    first = staff_client.get("/ui/dead-jobs")
    with CaptureQueriesContext(connection) as on_the_first:
        staff_client.get("/ui/dead-jobs")

    with CaptureQueriesContext(connection) as on_the_next:
        second = staff_client.get(f"/ui/dead-jobs?{first.context['next_page']}")

    assert len(listed(second)) == 2
    assert second.context["matches"].value == first.context["matches"].value == 5
    assert len(on_the_next) == len(on_the_first)


def test_quick_ranges_set_since_and_keep_the_other_filters(staff_client):
    now = datetime(2030, 3, 4, 10, 17, 30, tzinfo=UTC)
    with time_machine.travel(now, tick=False):
        staff_client.force_login(User.objects.get())  # a session of that day
        recent = dead_job(died_ago=timedelta(minutes=30))
        dead_job(died_ago=timedelta(hours=2))
        dead_job(died_ago=timedelta(days=1))
        response = staff_client.get(
            "/ui/dead-jobs", {"channel": "orders", "until": "2030-03-04 05:00", "cursor": ""}
        )
        ranges = dict(response.context["quick_ranges"])
        last_hour = parse_qs(ranges["Last hour"])
        today = parse_qs(ranges["Today"])

        assert last_hour == {"channel": ["orders"], "since": ["2030-03-04 09:17"]}
        assert today == {"channel": ["orders"], "since": ["2030-03-04 00:00"]}
        assert listed(staff_client.get(f"/ui/dead-jobs?{ranges['Last hour']}")) == [recent.pk]
        assert len(listed(staff_client.get(f"/ui/dead-jobs?{ranges['Today']}"))) == 2


def test_quick_ranges_are_offered_when_the_filters_are_wrong(staff_client):
    response = staff_client.get("/ui/dead-jobs", {"since": "yesterday"})
    assert response.status_code == 400
    assert [name for name, _ in response.context["quick_ranges"]] == ["Last hour", "Today"]


def test_example_dates_are_placeholders_that_say_so(staff_client):
    shown = staff_client.get("/ui/dead-jobs").content.decode()
    assert 'name="since" placeholder="e.g. 2026-11-25 04:00" value=""' in shown
    assert 'name="until" placeholder="e.g. 2026-11-25 05:00" value=""' in shown
