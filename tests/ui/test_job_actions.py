"""Actions on many dead jobs (issue 20): each shows what it would affect, a bounded count and a
sample, and acts only once confirmed; "all matching" acts on the list's filters; a mistake in
"requeue since" comes back in the form (broker/ui/job_actions.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobs.models import Job
from jobs.states import DEAD, QUEUED
from tests.ui.test_dead_jobs import dead_job

pytestmark = pytest.mark.django_db


def statuses() -> list[str]:
    return list(Job.objects.order_by("pk").values_list("status", flat=True))


def test_delete_selected_asks_first_showing_what_it_will_delete(staff_client):
    first, second = dead_job(error="HTTP 503 from billing"), dead_job()
    form = {"action": "delete", "job": [first.public_id, second.public_id], "next": "/ui/dead-jobs"}

    asked = staff_client.post("/ui/dead-jobs/bulk", form)

    assert asked.status_code == 200
    page = asked.content.decode()
    assert "<h1>Delete 2 dead jobs?</h1>" in page
    assert first.public_id in page
    assert "HTTP 503 from billing" in page
    assert 'name="confirmed" value="yes"' in page
    assert Job.objects.count() == 2  # nothing yet

    done = staff_client.post("/ui/dead-jobs/bulk", {**form, "confirmed": "yes"})

    assert done["Location"] == "/ui/dead-jobs"
    assert not Job.objects.exists()


def test_all_matching_acts_on_the_filters_not_on_one_page(staff_client):
    matching = [dead_job(error="connection to clickhouse:9000 refused") for _ in range(3)]
    other = dead_job(error="HTTP 404")
    form = {"action": "requeue", "error": "clickhouse", "next": "/ui/dead-jobs?error=clickhouse"}

    asked = staff_client.post("/ui/dead-jobs/matching", form)

    assert "<h1>Requeue 3 dead jobs?</h1>" in asked.content.decode()
    assert asked.context["preview"].what == (
        "every dead job the filters match among the newest 5,000 they look through"
    )
    # The confirmation posts the filters again, each field once (not the request's own).
    assert [name for name, _ in asked.context["preview"].fields] == ["action", "error", "next"]
    staff_client.post("/ui/dead-jobs/matching", {**form, "confirmed": "yes"})
    assert {job.pk for job in Job.objects.filter(status=QUEUED)} == {j.pk for j in matching}
    assert Job.objects.get(pk=other.pk).status == DEAD


def test_an_action_on_more_than_its_bound_says_so_and_takes_the_newest(staff_client, monkeypatch):
    monkeypatch.setattr("broker.ui.job_actions.ACTION_LIMIT", 2)
    oldest = dead_job(died_ago=timedelta(hours=3))
    dead_job(died_ago=timedelta(hours=2))
    dead_job(died_ago=timedelta(hours=1))
    form = {"action": "requeue", "consumer": "billing"}

    asked = staff_client.post("/ui/dead-jobs/matching", form).content.decode()

    assert "<h1>Requeue ≥ 2 dead jobs?</h1>" in asked
    assert "this takes the newest 2, run it again for the rest" in asked
    staff_client.post("/ui/dead-jobs/matching", {**form, "confirmed": "yes"})
    assert Job.objects.get(pk=oldest.pk).status == DEAD
    assert Job.objects.filter(status=QUEUED).count() == 2
    shown = [str(m) for m in staff_client.get("/ui/dead-jobs").context["messages"]]
    assert shown == [
        "Requeued 2 of every dead job the filters match."
        " More match: run it again for the next ones."
    ]


def test_requeue_since_previews_then_requeues(staff_client):
    job = dead_job(died_ago=timedelta(minutes=5))
    form = {"channel": "orders", "consumer": "billing", "since": "2000-01-01 00:00"}

    asked = staff_client.post("/ui/dead-jobs/requeue-since", form)

    assert "<h1>Requeue 1 dead job?</h1>" in asked.content.decode()
    assert statuses() == [DEAD]
    staff_client.post("/ui/dead-jobs/requeue-since", {**form, "confirmed": "yes"})
    assert Job.objects.get(pk=job.pk).status == QUEUED


def test_a_typo_in_requeue_since_keeps_the_form_and_says_what_is_wrong(staff_client):
    dead_job()
    form = {"channel": "orders", "consumer": "biling", "since": "2000-01-01 00:00"}

    response = staff_client.post("/ui/dead-jobs/requeue-since", form)

    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "No consumer &#x27;biling&#x27; in channel &#x27;orders&#x27;." in page
    assert 'value="biling"' in page
    assert 'value="2000-01-01 00:00"' in page
    assert '<option value="billing">' in page  # the consumers to pick from
    assert statuses() == [DEAD]


def test_channel_and_consumer_fields_offer_what_exists_and_dates_read_iso(staff_client):
    dead_job()

    page = staff_client.get("/ui/dead-jobs").content.decode()

    assert 'list="channel-choices"' in page
    assert '<datalist id="channel-choices"><option value="orders"></datalist>' in page
    assert '<option value="billing">' in page
    assert "datetime-local" not in page  # a browser shows those in its own locale's format
    assert 'placeholder="e.g. 2026-11-25 04:00"' in page


def test_a_bad_filter_keeps_what_was_typed_and_says_what_is_wrong(staff_client):
    dead_job()

    response = staff_client.get("/ui/dead-jobs?consumer=billing&since=yesterday&status_code=42")

    assert response.status_code == 400
    page = response.content.decode()
    assert "<h1>Dead jobs</h1>" in page  # the list's own page, its form filled in
    assert 'value="yesterday"' in page
    assert 'value="billing"' in page
    assert "<code>since</code>" in page
    assert "<code>status_code</code>" in page
    assert response.context["jobs"] == []
