"""The operator UI's actions on a whole dead-letter queue (issue 21; broker/ui/job_actions.py):
"requeue since" and "all matching" of one consumer take every job, in batches, and one that
outlasts its request goes on in the background with a page that shows how far it got."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobs import dlq_actions
from jobs.dlq_actions import continue_action
from jobs.models import DeadLetterAction, Job
from jobs.states import DEAD, QUEUED
from tests.ui.test_dead_jobs import dead_job

pytestmark = pytest.mark.django_db

SINCE = {"channel": "orders", "consumer": "billing", "since": "2000-01-01 00:00"}


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(dlq_actions, "BATCH_SIZE", 2)


@pytest.fixture
def past_the_budget(monkeypatch, small_batches):
    monkeypatch.setattr(dlq_actions, "INLINE_SECONDS", 0.0)


def test_requeue_since_past_the_budget_shows_its_progress_until_done(staff_client, past_the_budget):
    jobs = [dead_job(died_ago=timedelta(minutes=n)) for n in range(5)]

    asked = staff_client.post("/ui/dead-jobs/requeue-since", SINCE).content.decode()
    assert "it takes every one of them, 2 per transaction" in asked
    done = staff_client.post("/ui/dead-jobs/requeue-since", {**SINCE, "confirmed": "yes"})

    action = DeadLetterAction.objects.get()
    assert done["Location"] == f"/ui/dead-jobs/actions/{action.public_id}"
    page = staff_client.get(done["Location"])
    assert [str(m) for m in page.context["messages"]] == [
        "Requeued 2 of the dead jobs of orders/billing since 2000-01-01 00:00:00+00:00 so far;"
        " the rest goes on in the background."
    ]
    shown = page.content.decode()
    assert '<dd id="state">Running</dd>' in shown
    assert "2 of about 5, in 1 batch" in shown
    assert "data-auto-refresh" in shown

    continue_action(action.pk)

    shown = staff_client.get(done["Location"]).content.decode()
    assert '<dd id="state">Done</dd>' in shown
    assert "5 of about 5, in 3 batches" in shown
    assert "data-auto-refresh" not in shown
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True)
    ) == {QUEUED}


def test_all_matching_of_one_consumer_takes_its_whole_queue(staff_client, monkeypatch):
    monkeypatch.setattr("broker.ui.job_actions.ACTION_LIMIT", 2)
    jobs = [dead_job(died_ago=timedelta(hours=n)) for n in range(3)]
    form = {"action": "delete", "channel": "orders", "consumer": "billing"}

    asked = staff_client.post("/ui/dead-jobs/matching", form).content.decode()
    assert "<h1>Delete ≥ 2 dead jobs?</h1>" in asked
    assert "it takes every one of them" in asked
    done = staff_client.post("/ui/dead-jobs/matching", {**form, "confirmed": "yes"})

    assert done["Location"] == "/ui/dead-jobs"
    assert not Job.objects.filter(pk__in=[job.pk for job in jobs]).exists()
    assert not DeadLetterAction.objects.exists()  # finished within the request: not kept
    shown = [str(m) for m in staff_client.get("/ui/dead-jobs").context["messages"]]
    assert shown == ["Deleted 3 of every dead job the filters match."]


def test_selected_jobs_go_in_batches_too(staff_client, small_batches):
    jobs = [dead_job() for _ in range(5)]
    form = {"action": "delete", "job": [job.public_id for job in jobs], "confirmed": "yes"}

    staff_client.post("/ui/dead-jobs/bulk", form)

    assert not Job.objects.exists()
    shown = [str(m) for m in staff_client.get("/ui/dead-jobs").context["messages"]]
    assert shown == ["Deleted 5 of the 5 selected jobs."]


def test_the_progress_page_of_a_failed_action_says_why(staff_client, past_the_budget):
    dead_job()
    dead_job()
    dead_job()
    staff_client.post("/ui/dead-jobs/requeue-since", {**SINCE, "confirmed": "yes"})
    action = DeadLetterAction.objects.get()
    DeadLetterAction.objects.filter(pk=action.pk).update(
        state=DeadLetterAction.State.FAILED, error="OperationalError: the disk is full"
    )

    shown = staff_client.get(f"/ui/dead-jobs/actions/{action.public_id}").content.decode()

    assert '<dd id="state">Failed</dd>' in shown
    assert "OperationalError: the disk is full" in shown
    assert Job.objects.filter(status=DEAD).count() == 1


@pytest.mark.parametrize(("action_id", "expected"), [("0000000000000000000g", 404), ("x", 400)])
def test_an_unknown_or_malformed_action_is_a_page_of_its_own(staff_client, action_id, expected):
    response = staff_client.get(f"/ui/dead-jobs/actions/{action_id}")

    assert response.status_code == expected
    assert response["Content-Type"].startswith("text/html")
