"""A consumer's dead-letter queue over REST (docs/api.md): list, requeue (all or since T), purge,
and the /dlq-status and /job-status summaries."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import time_machine

from consumers.models import Consumer
from jobs.models import Job
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED, JobStatus
from tests.helpers import make_channel, make_consumer_with_token, pull_job, tokens

pytestmark = pytest.mark.django_db

ADMIN = {"Authorization": "Bearer admin-token"}
FORM = "application/x-www-form-urlencoded"
DLQ = "/channel/orders/consumer/worker/dlq"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def admin_token(settings):
    settings.BROKER_ADMIN_TOKENS = ["admin-token"]


def jobs_of(
    consumer: Consumer, count: int = 1, status: JobStatus = DEAD, at: datetime | None = None
) -> list[Job]:
    """`count` jobs of `consumer` brought to `status` through the state machine, at time `at`."""
    clock = time_machine.travel(at, tick=False) if at else contextlib.nullcontext()
    with clock:
        return [pull_job(consumer, status, error="HTTP 500") for _ in range(count)]


def everything() -> list[Mapping[str, object]]:
    return list(Job.objects.order_by("pk").values())


def listed(response) -> list[str]:
    assert response.status_code == 200
    return [item["ID"] for item in response.json()["DeadJobs"]]


def requeue(client, form: dict[str, str], headers: dict[str, str] | None = None, url: str = DLQ):
    # Content-Type as a header too: the test client drops content_type when the body is empty.
    headers = {"Content-Type": FORM, **(headers or {})}
    return client.post(url, urlencode(form), content_type=FORM, headers=headers)


# GET: list


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, tokens(), {"Authorization": "Basic x"}]
)
def test_listing_needs_an_admin(client, worker, headers):
    jobs_of(worker)

    response = client.get(DLQ, headers=headers)

    assert response.status_code == 401
    assert "DeadJobs" not in response.json()


def test_lists_only_this_consumers_dead_jobs(client, channel, worker):
    dead = jobs_of(worker, 2)
    for status in (QUEUED, INFLIGHT, DELIVERED):
        jobs_of(worker, status=status)
    jobs_of(make_consumer_with_token(channel, "other", token="other-token"))

    assert sorted(listed(client.get(DLQ, headers=ADMIN))) == sorted(job.public_id for job in dead)


def test_a_dead_job_is_shown_with_webhook_brokers_fields(client, worker):
    (job,) = jobs_of(worker, at=T0)
    prefix = f"/channel/orders/consumer/worker/job/{job.public_id}"

    item = client.get(DLQ, headers=ADMIN).json()["DeadJobs"][0]

    assert item["ListenerEndpoint"] == "http://127.0.0.1:9/worker"
    assert item["ListenerName"] == worker.name  # as webhook-broker: the name, not the ID
    assert item["Status"] == "DEAD"
    assert datetime.fromisoformat(item["StatusChangedAt"]) == T0
    assert item["MessageURL"] == f"/channel/orders/message/{job.message.public_id}"
    assert item["JobRequeueURL"] == f"{prefix}/requeue-dead-job"
    assert item["LastError"] == "HTTP 500"


def test_an_empty_dlq_has_no_links(client, worker):
    assert client.get(DLQ, headers=ADMIN).json() == {"DeadJobs": [], "Pages": {}}


@pytest.mark.parametrize(
    "url", ["/channel/orders/consumer/nobody/dlq", "/channel/x/consumer/w/dlq"]
)
def test_listing_an_unknown_consumer_is_404(client, worker, url):
    assert client.get(url, headers=ADMIN).status_code == 404


def test_pages_hold_25_newest_first_and_their_links_lead_both_ways(client, worker):
    # Three jobs die at each instant, so the job ID has to break ties.
    dead = [job for n in range(10) for job in jobs_of(worker, 3, at=T0 + timedelta(seconds=n))]
    newest_first = [job.public_id for job in sorted(dead, key=lambda job: -job.pk)]

    first = client.get(DLQ, headers=ADMIN).json()
    assert [item["ID"] for item in first["DeadJobs"]] == newest_first[:25]
    assert set(first["Pages"]) == {"next", "previous"}
    assert first["Pages"]["next"].startswith(f"{DLQ}?next=")

    second = client.get(first["Pages"]["next"], headers=ADMIN).json()
    assert [item["ID"] for item in second["DeadJobs"]] == newest_first[25:]

    assert client.get(second["Pages"]["next"], headers=ADMIN).json() == {
        "DeadJobs": [],
        "Pages": {},
    }
    back = client.get(second["Pages"]["previous"], headers=ADMIN).json()
    assert back == first
    newer = client.get(first["Pages"]["previous"], headers=ADMIN).json()
    assert newer == {"DeadJobs": [], "Pages": {}}


def test_a_job_dying_while_paging_does_not_shift_the_next_page(client, worker):
    dead = [job for n in range(26) for job in jobs_of(worker, at=T0 + timedelta(seconds=n))]
    first = client.get(DLQ, headers=ADMIN).json()
    jobs_of(worker, at=T0 + timedelta(hours=1))

    second = client.get(first["Pages"]["next"], headers=ADMIN).json()

    assert [item["ID"] for item in second["DeadJobs"]] == [dead[0].public_id]


@pytest.mark.parametrize("tamper", ["flip", "garbage", "both"])
def test_a_tampered_cursor_is_400(client, worker, tamper):
    jobs_of(worker, 26)
    link = client.get(DLQ, headers=ADMIN).json()["Pages"]["next"]
    cursor = parse_qs(urlsplit(link).query)["next"][0]
    query = {
        "flip": {"next": cursor[:-3] + ("A" if cursor[-3] != "A" else "B") + cursor[-2:]},
        "garbage": {"next": "not-a-cursor"},
        "both": {"next": cursor, "previous": cursor},
    }[tamper]

    response = client.get(DLQ, query, headers=ADMIN)

    assert response.status_code == 400
    assert "Error" in response.json()


# POST: requeue


def test_requeue_with_the_consumer_token_queues_every_dead_job_again(client, channel, worker):
    dead = jobs_of(worker, 3)
    Job.objects.filter(pk__in=[job.pk for job in dead]).update(attempts=9)
    alive = [*jobs_of(worker, status=INFLIGHT), *jobs_of(worker, status=DELIVERED)]
    (elsewhere,) = jobs_of(make_consumer_with_token(channel, "other", token="other-token"))

    response = requeue(client, {"requeue": "consumer-token"})

    assert response.status_code == 202
    assert response.json() == {"requeuedCount": 3}
    requeued = Job.objects.filter(pk__in=[job.pk for job in dead])
    assert {(job.status, job.attempts, job.lease_expires_at) for job in requeued} == {
        (QUEUED, 0, None)
    }
    assert [job.status for job in Job.objects.filter(pk__in=[job.pk for job in alive])] == [
        INFLIGHT,
        DELIVERED,
    ]
    elsewhere.refresh_from_db()
    assert elsewhere.status == DEAD


@pytest.mark.parametrize(
    "form",
    [
        {},
        {"requeue": ""},
        {"requeue": "wrong"},
        {"requeue": "channel-token"},
        {"requeue": "other-token"},
        {"token": "consumer-token"},
    ],
)
def test_requeue_without_the_right_token_is_400_and_changes_nothing(client, channel, worker, form):
    make_consumer_with_token(channel, "other", token="other-token")
    jobs_of(worker, 2)
    before = everything()

    response = requeue(client, form, headers=tokens())

    assert response.status_code == 400
    assert "requeue" in response.json()["Error"]
    assert everything() == before


def test_an_admin_may_requeue_without_the_consumer_token(client, worker):
    jobs_of(worker, 2)

    response = requeue(client, {}, headers=ADMIN)

    assert response.status_code == 202
    assert set(Job.objects.values_list("status", flat=True)) == {QUEUED}


@pytest.mark.parametrize("token", ["wrong", "consumer-token-but-not-quite"])
def test_a_wrong_requeue_token_is_refused_even_for_an_admin(token, client, worker):
    jobs_of(worker)

    response = requeue(client, {"requeue": token}, headers=ADMIN)

    assert response.status_code == 400
    assert "requeue" in response.json()["Error"]
    assert set(Job.objects.values_list("status", flat=True)) == {DEAD}


def test_a_wrong_admin_token_is_refused(client, worker):
    jobs_of(worker)

    response = requeue(client, {}, headers={"Authorization": "Bearer wrong"})

    assert response.status_code == 401
    assert set(Job.objects.values_list("status", flat=True)) == {DEAD}


@pytest.mark.parametrize(
    "since", ["2026-01-01T00:00:00Z", "2026-01-01T02:00:00+02:00", "2026-01-01T00:00:00.000Z"]
)
def test_requeue_since_t_takes_only_jobs_that_died_at_or_after_t(client, worker, since):
    (before,) = jobs_of(worker, at=T0 - timedelta(microseconds=1))
    at_t = jobs_of(worker, at=T0)
    after_t = jobs_of(worker, at=T0 + timedelta(days=1))

    response = requeue(client, {"requeue": "consumer-token", "since": since})

    assert response.status_code == 202
    assert response.json() == {"requeuedCount": 2}
    before.refresh_from_db()
    assert before.status == DEAD
    requeued = Job.objects.filter(pk__in=[job.pk for job in at_t + after_t])
    assert set(requeued.values_list("status", flat=True)) == {QUEUED}


@pytest.mark.parametrize("since", ["yesterday", "2026-13-01T00:00:00Z", "1767225600"])
def test_requeue_since_an_unreadable_time_is_400(client, worker, since):
    jobs_of(worker)

    response = requeue(client, {"requeue": "consumer-token", "since": since})

    assert response.status_code == 400
    assert set(Job.objects.values_list("status", flat=True)) == {DEAD}


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ('{"requeue": "consumer-token"}', "application/json"),
        ("requeue=consumer-token", "text/plain"),
    ],
)
def test_requeue_needs_a_form_body(client, worker, body, content_type):
    jobs_of(worker)

    response = client.post(DLQ, body, content_type=content_type)

    assert response.status_code == 415
    assert set(Job.objects.values_list("status", flat=True)) == {DEAD}


def test_requeue_of_an_unknown_consumer_is_404(client, worker):
    response = requeue(client, {"requeue": "consumer-token"}, url="/channel/orders/consumer/x/dlq")

    assert response.status_code == 404


def test_requeue_of_a_push_consumers_dlq_works_too(client, channel):
    pusher = make_consumer_with_token(channel, "worker", type=Consumer.Type.PUSH)
    jobs_of(pusher, 2)

    response = requeue(client, {"requeue": "consumer-token"})

    assert response.json() == {"requeuedCount": 2}


# DELETE: purge


@pytest.mark.parametrize("kind", [Consumer.Type.PULL, Consumer.Type.PUSH])
def test_purge_deletes_only_this_consumers_dead_jobs(client, channel, kind):
    worker = make_consumer_with_token(channel, type=kind)
    other = make_consumer_with_token(channel, "other", token="other-token")
    jobs_of(worker, 3)
    for status in (QUEUED, INFLIGHT, DELIVERED):
        jobs_of(worker, status=status)
    jobs_of(other, 2)
    alive = set(Job.objects.exclude(consumer=worker, status=DEAD).values_list("pk", flat=True))

    response = client.delete(DLQ, headers=tokens())

    assert response.status_code == 200
    assert response.json() == {"deletedCount": 3}
    assert set(Job.objects.values_list("pk", flat=True)) == alive
    assert Job.objects.filter(consumer=other, status=DEAD).count() == 2
    assert client.delete(DLQ, headers=tokens()).json() == {"deletedCount": 0}


@pytest.mark.parametrize(
    ("url", "headers", "expected"),
    [
        (DLQ, {}, 401),
        (DLQ, {"X-Broker-Channel-Token": "channel-token"}, 401),
        (DLQ, tokens(channel="wrong"), 403),
        (DLQ, tokens("wrong"), 403),
        (DLQ, {**ADMIN, **tokens("wrong")}, 403),  # tokens given must be right, admin or not
        ("/channel/orders/consumer/nobody/dlq", tokens(), 404),  # as webhook-broker
        ("/channel/nowhere/consumer/worker/dlq", tokens(), 404),
    ],
)
def test_purge_needs_both_tokens_or_an_admin(client, worker, url, headers, expected):
    jobs_of(worker, 2)

    response = client.delete(url, headers=headers)

    assert response.status_code == expected
    assert Job.objects.filter(status=DEAD).count() == 2


def test_an_admin_purges_without_the_consumers_tokens(client, worker):
    jobs_of(worker, 2)

    response = client.delete(DLQ, headers=ADMIN)

    assert (response.status_code, response.json()) == (200, {"deletedCount": 2})
    assert not Job.objects.filter(status=DEAD).exists()
    assert client.delete("/channel/orders/consumer/nobody/dlq", headers=ADMIN).status_code == 404


# Summaries


@pytest.mark.parametrize("url", ["/dlq-status", "/job-status"])
def test_summaries_need_an_admin(client, url):
    assert client.get(url).status_code == 401


def test_dlq_status_counts_dead_jobs_per_consumer_exactly(client, channel, worker):
    events = make_channel("events", token="events-token")
    jobs_of(worker, 3)
    jobs_of(worker, status=QUEUED)
    jobs_of(make_consumer_with_token(channel, "other", token="other-token"), 1)
    make_consumer_with_token(channel, "quiet", token="quiet-token")
    jobs_of(make_consumer_with_token(events, "audit", token="audit-token"), 2)

    response = client.get("/dlq-status", headers=ADMIN)

    assert response.status_code == 200
    assert response.json() == {
        "consumers": [
            {
                "channelId": "events",
                "channelName": "Events",
                "consumerId": "audit",
                "consumerName": "Audit",
                "deadCount": 2,
            },
            {
                "channelId": "orders",
                "channelName": "Orders",
                "consumerId": "other",
                "consumerName": "Other",
                "deadCount": 1,
            },
            {
                "channelId": "orders",
                "channelName": "Orders",
                "consumerId": "worker",
                "consumerName": "Worker",
                "deadCount": 3,
            },
        ]
    }


def test_dlq_status_follows_requeue_and_purge_at_once(client, worker):
    def dead_count() -> list[int]:
        rows = client.get("/dlq-status", headers=ADMIN).json()["consumers"]
        return [row["deadCount"] for row in rows]

    first, _ = jobs_of(worker, 2)

    assert dead_count() == [2]
    response = client.post(
        f"/channel/orders/consumer/worker/job/{first.public_id}/requeue-dead-job", headers=tokens()
    )
    assert response.status_code == 202
    assert dead_count() == [1]
    assert client.delete(DLQ, headers=tokens()).status_code == 200
    assert dead_count() == []


def test_job_status_counts_jobs_per_channel_consumer_and_status(client, worker):
    jobs_of(worker, 2, status=DEAD, at=T0)
    jobs_of(worker, 1, status=DEAD, at=T0 + timedelta(hours=1))
    jobs_of(worker, 1, status=QUEUED, at=T0)

    response = client.get("/job-status", headers=ADMIN)

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"orders"}
    assert set(body["orders"]) == {"worker"}
    # webhook-broker's StatusCount: its JobStatus numbers (1001 QUEUED ... 1004 DEAD).
    rows = {row.pop("status"): row for row in body["orders"]["worker"]}
    assert set(rows) == {1004, 1001}
    assert rows[1004]["count"] == 3
    assert rows[1004]["statusName"] == "DEAD"
    assert datetime.fromisoformat(rows[1004]["oldestItemTimestamp"]) == T0
    assert datetime.fromisoformat(rows[1004]["newestItemTimestamp"]) == T0 + timedelta(hours=1)
    assert rows[1001]["count"] == 1
    assert set(rows[1001]) == {"count", "oldestItemTimestamp", "newestItemTimestamp", "statusName"}


def test_summaries_of_an_empty_broker(client):
    assert client.get("/dlq-status", headers=ADMIN).json() == {"consumers": []}
    assert client.get("/job-status", headers=ADMIN).json() == {}
