"""A requeue or purge of a dead-letter queue too big for its request (issue 21; docs/api.md,
"Dead-letter queue"): the 202 with what was done so far and where to follow the rest, that URL's
progress, its auth, and the housekeeping cluster finishing it for real."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
from django.utils import timezone
from django_q.models import OrmQ  # type: ignore[import-untyped]

from jobs import dlq_actions
from jobs.dlq_actions import continue_action
from jobs.models import DeadLetterAction, DeliveryAttempt, Job
from jobs.states import DEAD, QUEUED
from tests.helpers import make_consumer_with_token, pull_job, tokens
from tests.processes import start_manage, wait_until

pytestmark = pytest.mark.django_db

ADMIN = {"Authorization": "Bearer admin-token"}
FORM = "application/x-www-form-urlencoded"
DLQ = "/channel/orders/consumer/worker/dlq"


@pytest.fixture(autouse=True)
def admin_token(settings):
    settings.BROKER_ADMIN_TOKENS = ["admin-token"]


@pytest.fixture
def past_the_budget(monkeypatch):
    """Requests run a single batch of 2 jobs, then hand the rest over."""
    monkeypatch.setattr(dlq_actions, "BATCH_SIZE", 2)
    monkeypatch.setattr(dlq_actions, "INLINE_SECONDS", 0.0)


def dead(consumer, count: int) -> list[Job]:
    jobs = [pull_job(consumer, DEAD, error="HTTP 500") for _ in range(count)]
    for job in jobs:
        DeliveryAttempt.objects.create(
            job=job, attempt_number=1, started_at=timezone.now(), duration_ms=1, dispatcher_id="d"
        )
    return jobs


def requeue(client, form: dict[str, str], headers: dict[str, str] | None = None):
    headers = {"Content-Type": FORM, **(headers or {})}
    return client.post(DLQ, urlencode(form), content_type=FORM, headers=headers)


def the_action() -> DeadLetterAction:
    (action,) = DeadLetterAction.objects.all()
    return action


def test_a_requeue_past_the_budget_answers_202_with_its_progress_and_url(
    client, worker, past_the_budget
):
    jobs = dead(worker, 5)

    response = requeue(client, {"requeue": "consumer-token"})

    assert response.status_code == 202
    action = the_action()
    url = f"{DLQ}/action/{action.public_id}"
    assert response["Location"] == url
    body = response.json()
    assert body["requeuedCount"] == 2
    assert body["action"] == client.get(url, headers=tokens()).json()
    progress = body["action"]
    assert {key: progress[key] for key in ("id", "action", "state", "channelId", "consumerId")} == {
        "id": action.public_id,
        "action": "requeue",
        "state": "running",
        "channelId": "orders",
        "consumerId": "worker",
    }
    assert (progress["doneCount"], progress["estimatedCount"], progress["batches"]) == (2, 5, 1)
    assert (progress["since"], progress["finishedAt"], progress["error"]) == (None, None, "")
    assert datetime.fromisoformat(progress["diedBefore"]) == action.died_before
    assert Job.objects.filter(status=QUEUED).count() == 2
    (task,) = OrmQ.objects.all()  # housekeeping's part, queued with the hand-over
    assert task.task["args"] == (action.pk,)

    continue_action(action.pk)  # what the housekeeping cluster runs

    done = client.get(url, headers=ADMIN).json()
    assert (done["state"], done["doneCount"], done["batches"]) == ("done", 5, 3)
    assert done["finishedAt"] is not None
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True)
    ) == {QUEUED}


def test_a_purge_past_the_budget_answers_202_and_goes_on_to_the_end(
    client, worker, past_the_budget
):
    dead(worker, 3)

    response = client.delete(DLQ, headers=tokens())

    assert response.status_code == 202
    assert response.json()["deletedCount"] == 2
    assert response.json()["action"]["action"] == "purge"
    continue_action(the_action().pk)
    progress = client.get(response["Location"], headers=tokens()).json()
    assert (progress["state"], progress["doneCount"], progress["estimatedCount"]) == ("done", 3, 3)
    assert not Job.objects.exists()
    assert not DeliveryAttempt.objects.exists()


def test_since_is_kept_and_shown(client, worker, past_the_budget):
    dead(worker, 3)

    response = requeue(client, {"requeue": "consumer-token", "since": "2000-01-01T00:00:00Z"})

    assert datetime.fromisoformat(response.json()["action"]["since"]) == datetime(
        2000, 1, 1, tzinfo=UTC
    )


def test_an_action_finished_within_its_request_answers_as_webhook_broker_and_is_not_kept(
    client, worker
):
    dead(worker, 3)

    response = requeue(client, {"requeue": "consumer-token"})

    assert response.status_code == 202
    assert response.json() == {"requeuedCount": 3}
    assert not response.has_header("Location")
    assert not DeadLetterAction.objects.exists()


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, 401),
        ({"X-Broker-Channel-Token": "channel-token"}, 401),
        (tokens(channel="wrong"), 403),
        (tokens("wrong"), 403),
        (tokens("other-token"), 403),
        ({"Authorization": "Bearer wrong"}, 401),
        (tokens(), 200),
        (ADMIN, 200),
    ],
)
def test_progress_needs_an_admin_or_both_tokens(
    client, channel, worker, past_the_budget, headers, expected
):
    make_consumer_with_token(channel, "other", token="other-token")
    dead(worker, 3)
    url = client.delete(DLQ, headers=tokens())["Location"]

    response = client.get(url, headers=headers)

    assert response.status_code == expected
    assert ("doneCount" in response.json()) == (expected == 200)


def test_an_action_is_found_only_under_its_own_consumer(client, channel, worker, past_the_budget):
    make_consumer_with_token(channel, "other", token="other-token")
    dead(worker, 3)
    action = the_action_id(client)
    elsewhere = f"/channel/orders/consumer/other/dlq/action/{action}"

    assert client.get(elsewhere, headers=tokens("other-token")).status_code == 404
    assert client.get(elsewhere, headers=ADMIN).status_code == 404
    nobody = f"/channel/orders/consumer/nobody/dlq/action/{action}"
    assert client.get(nobody, headers=ADMIN).status_code == 404
    for wrong in ["0000000000000000000g", "not-an-id"]:
        response = client.get(f"{DLQ}/action/{wrong}", headers=ADMIN)
        assert response.status_code == 404
        assert response.json() == {"Error": "Dead-letter action could not be found."}


def the_action_id(client) -> str:
    response = client.delete(DLQ, headers=tokens())
    assert response.status_code == 202
    return str(response.json()["action"]["id"])


def test_a_wrong_requeue_token_still_changes_nothing(client, worker, past_the_budget):
    dead(worker, 3)

    response = requeue(client, {"requeue": "wrong"})

    assert response.status_code == 400
    assert not DeadLetterAction.objects.exists()
    assert Job.objects.filter(status=DEAD).count() == 3


@pytest.mark.django_db(transaction=True)
def test_the_housekeeping_cluster_finishes_what_the_request_handed_over(
    client, channel, worker, past_the_budget
):
    dead(worker, 5)
    response = requeue(client, {"requeue": "consumer-token"})
    assert response.status_code == 202

    def progress() -> dict[str, object]:
        return dict(client.get(response["Location"], headers=tokens()).json())

    cluster = start_manage("qcluster")  # its batches are of the real size: the rest in one
    try:
        wait_until(lambda: progress()["state"] == "done", seconds=90)
    finally:
        cluster.send_signal(signal.SIGTERM)
        output, _ = cluster.communicate(timeout=60)
    assert cluster.returncode == 0, output
    assert progress()["doneCount"] == 5
    assert Job.objects.filter(status=QUEUED).count() == 5
    finished = DeadLetterAction.objects.get().finished_at
    assert finished is not None
    assert finished > timezone.now() - timedelta(minutes=5)
