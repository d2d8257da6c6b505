"""Pull consumers over REST (docs/data-model.md; docs/api.md; docs/configuration.md): queued-jobs, a
job's reads and transitions, requeue and delete of a dead job, lease expiry and the claim
extension."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
import time_machine
from django.db import connection
from django.test import Client

from broker import publish
from broker.xids import key_of_xid, public_key_xid
from consumers.models import Consumer
from jobs.maintenance import Maintenance
from jobs.models import Job
from jobs.queue.leases import LEASE_EXPIRED, sweep_expired_leases
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from tests.helpers import at_once, make_consumer_with_token, pull_job, tokens

pytestmark = pytest.mark.django_db

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def lease_settings(settings):
    settings.BROKER_DELIVERY_TIMEOUT_SECONDS = 30
    settings.BROKER_RATIONAL_DELAY_SECONDS = 2
    return settings


def url(consumer_id: str = "worker", tail: str = "queued-jobs") -> str:
    return f"/channel/orders/consumer/{consumer_id}/{tail}"


def job_url(job: Job) -> str:
    return url(job.consumer.public_id, f"job/{job.public_id}")


def snapshot(job: Job) -> Mapping[str, object]:
    return Job.objects.filter(pk=job.pk).values().get()


def queued_ids(
    client, consumer_id: str = "worker", query: str = "", token: str = "consumer-token"
) -> list[str]:
    response = client.get(f"{url(consumer_id)}{query}", headers=tokens(token))
    assert response.status_code == 200
    return [item["Message"]["MessageID"] for item in response.json()["Result"]]


def move(client, job: Job, body: object, token: str = "consumer-token"):
    text = body if isinstance(body, str) else json.dumps(body)
    return client.post(job_url(job), text, content_type=JSON, headers=tokens(token))


def claim(client, body: dict[str, object] | None = None, *, as_json: bool = False):
    data = json.dumps(body or {}) if as_json else urlencode(body or {})
    return client.post(
        url(tail="claim"), data, content_type=JSON if as_json else FORM, headers=tokens()
    )


# webhook-broker's own pull flow


def test_two_pull_consumers_each_work_through_their_own_copy_of_forty_messages(client, channel):
    make_consumer_with_token(channel, "a", token="a-token")
    make_consumer_with_token(channel, "b", token="b-token")
    for n in range(40):
        publish(
            "orders",
            {"n": n},
            producer="shop",
            message_id=f"m{n}",
            priority=5 if n % 10 == 9 else 0,
        )
    # Priority first (m9, m19, m29, m39), then the rest oldest first.
    expected = [f"m{n}" for n in (9, 19, 29, 39)] + [f"m{n}" for n in range(40) if n % 10 != 9]

    first_page = client.get(url("a"), headers=tokens("a-token")).json()["Result"]
    assert [item["Message"]["MessageID"] for item in first_page] == expected[:25]
    for item in first_page:
        response = client.post(
            url("a", f"job/{item['ID']}"),
            {"NextState": "INFLIGHT"},
            content_type=JSON,
            headers=tokens("a-token"),
        )
        assert response.status_code == 202

    assert queued_ids(client, "a", token="a-token") == expected[25:]
    assert queued_ids(client, "b", token="b-token") == expected[:25]
    assert queued_ids(client, "b", "?limit=100", token="b-token") == expected
    assert Job.objects.filter(consumer__public_id="a", status=INFLIGHT).count() == 25
    assert Job.objects.filter(consumer__public_id="b", status=QUEUED).count() == 40


@pytest.mark.parametrize(
    ("query", "count"),
    [("", 25), ("?limit=", 25), ("?limit=7", 7), ("?limit=100", 100), ("?limit=500", 100)],
)
def test_queued_jobs_limit_defaults_to_25_and_is_clamped_at_100(client, worker, query, count):
    for n in range(101):
        publish("orders", {"n": n}, producer="shop", message_id=f"m{n}")

    assert queued_ids(client, query=query) == [f"m{n}" for n in range(count)]


def test_queued_jobs_limit_zero_returns_nothing(client, worker):
    pull_job(worker)

    response = client.get(url(), {"limit": 0}, headers=tokens())

    assert response.status_code == 200
    assert response.json() == {"Result": []}


@pytest.mark.parametrize("limit", ["abc", "-1", "2.5", "1e3"])
def test_queued_jobs_rejects_a_limit_that_is_not_a_natural_number(client, worker, limit):
    response = client.get(url(), {"limit": limit}, headers=tokens())

    assert response.status_code == 400
    assert "limit" in response.json()["Error"]


def test_queued_jobs_shows_each_job_with_its_message(client, worker):
    job = pull_job(worker, message_id="order-1", priority=3, headers={"X-Trace": "abc"})

    response = client.get(url(), headers=tokens())

    assert response.json() == {
        "Result": [
            {
                "ID": job.public_id,
                "Priority": 3,
                "IncrementalTimeout": 0,
                "Attempts": 0,
                "Message": {
                    "MessageID": "order-1",
                    "Payload": '{"order": 1}',
                    "PayloadEncoding": "utf-8",
                    "Headers": {"X-Trace": "abc"},
                    "ContentType": "application/json",
                    "EventType": None,
                },
            }
        ]
    }


def test_queued_jobs_lists_only_queued_jobs(client, worker):
    queued = pull_job(worker, message_id="queued")
    for status in (INFLIGHT, DELIVERED, DEAD):
        pull_job(worker, status)

    assert queued_ids(client) == [queued.message.public_id]


# GET a job


def test_job_shows_webhook_brokers_hyperlinked_fields(client, worker):
    job = pull_job(worker, message_id="order-1")

    body = client.get(job_url(job), headers=tokens()).json()

    assert body["ListenerEndpoint"] == "http://127.0.0.1:9/worker"
    assert body["ListenerName"] == worker.name
    assert body["Status"] == "QUEUED"
    assert datetime.fromisoformat(body["StatusChangedAt"]) == job.status_changed_at
    assert body["MessageURL"] == "/channel/orders/message/order-1"
    assert body["ChannelURL"] == "/channel/orders"
    assert body["ConsumerURL"] == "/channel/orders/consumer/worker"
    assert body["ProducerURL"] == "/producer/shop"
    assert body["JobRequeueURL"] == ""


@pytest.mark.parametrize("status", [INFLIGHT, DELIVERED])
def test_job_requeue_url_is_empty_unless_the_job_is_dead(client, worker, status):
    job = pull_job(worker, status)

    body = client.get(job_url(job), headers=tokens()).json()

    assert (body["Status"], body["JobRequeueURL"]) == (status, "")


def test_a_dead_job_links_to_its_requeue(client, worker):
    job = pull_job(worker, DEAD)

    body = client.get(job_url(job), headers=tokens()).json()

    assert body["Status"] == "DEAD"
    assert (
        body["JobRequeueURL"]
        == f"/channel/orders/consumer/worker/job/{job.public_id}/requeue-dead-job"
    )


# POST a job: transitions


@pytest.mark.parametrize(
    ("source", "target"),
    [(QUEUED, INFLIGHT), (INFLIGHT, DELIVERED), (INFLIGHT, DEAD), (DEAD, INFLIGHT)],
)
def test_allowed_transitions_are_accepted(client, worker, source, target):
    job = pull_job(worker, source)

    response = move(client, job, {"NextState": target})

    assert response.status_code == 202
    assert response.content == b""
    job.refresh_from_db()
    assert job.status == target


@pytest.mark.parametrize("status", [QUEUED, INFLIGHT, DELIVERED, DEAD])
def test_asking_for_the_current_state_is_accepted_and_changes_nothing(client, worker, status):
    job = pull_job(worker, status)
    before = snapshot(job)

    response = move(client, job, {"NextState": status})

    assert response.status_code == 202
    assert snapshot(job) == before


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (QUEUED, DELIVERED),
        (QUEUED, DEAD),
        (INFLIGHT, QUEUED),
        (DELIVERED, INFLIGHT),
        (DELIVERED, DEAD),
        (DELIVERED, QUEUED),
        (DEAD, DELIVERED),
        (DEAD, QUEUED),
    ],
)
def test_transitions_a_pull_consumer_may_not_make_are_400(client, worker, source, target):
    job = pull_job(worker, source)
    before = snapshot(job)

    response = move(client, job, {"NextState": target})

    assert response.status_code == 400
    assert snapshot(job) == before


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        '{"NextState": "INFLIGHT"',
        "[]",
        '"INFLIGHT"',
        {},
        {"NextState": "inflight"},
        {"NextState": "DONE"},
        {"NextState": None},
        {"NextState": "INFLIGHT", "IncrementalTimeout": -5},
        {"NextState": "INFLIGHT", "IncrementalTimeout": "soon"},
    ],
)
def test_malformed_transition_requests_are_400(client, worker, body):
    job = pull_job(worker)
    before = snapshot(job)

    response = move(client, job, body)

    assert response.status_code == 400
    assert snapshot(job) == before


@pytest.mark.parametrize(
    ("status", "target"),
    [(QUEUED, DELIVERED), (INFLIGHT, DEAD), (INFLIGHT, DELIVERED), (INFLIGHT, INFLIGHT)],
)
def test_incremental_timeout_is_400_unless_the_job_goes_inflight(client, worker, status, target):
    job = pull_job(worker, status)
    before = snapshot(job)

    response = move(client, job, {"NextState": target, "IncrementalTimeout": 10})

    assert response.status_code == 400
    assert "IncrementalTimeout" in response.json()["Error"]
    assert snapshot(job) == before


def test_a_zero_incremental_timeout_counts_as_none(client, worker):
    job = pull_job(worker, INFLIGHT)

    response = move(client, job, {"NextState": "DELIVERED", "IncrementalTimeout": 0})

    assert response.status_code == 202


@pytest.mark.parametrize(("timeout", "lease_seconds"), [(None, 32), (0, 32), (60, 92)])
def test_taking_a_job_leases_it_for_the_delivery_timeout_plus_grace_plus_extra(
    client, worker, lease_settings, timeout, lease_seconds
):
    job = pull_job(worker)
    body = {"NextState": "INFLIGHT"} | (
        {"IncrementalTimeout": timeout} if timeout is not None else {}
    )

    with time_machine.travel(T0, tick=False):
        response = move(client, job, body)

    assert response.status_code == 202
    job.refresh_from_db()
    assert job.lease_expires_at == T0 + timedelta(seconds=lease_seconds)
    assert job.incremental_timeout == (timeout or 0)
    assert job.attempts == 1


def test_lower_case_keys_work_as_in_go(client, worker, lease_settings):
    job = pull_job(worker)

    with time_machine.travel(T0, tick=False):
        response = move(client, job, {"nextState": "INFLIGHT", "incrementalTimeout": 8})

    assert response.status_code == 202
    job.refresh_from_db()
    assert (job.status, job.lease_expires_at) == (INFLIGHT, T0 + timedelta(seconds=40))


@pytest.mark.parametrize("content_type", [JSON, "text/plain", FORM])
def test_the_transition_body_is_read_as_json_whatever_its_content_type(
    client, worker, content_type
):
    job = pull_job(worker)

    response = client.post(
        job_url(job), '{"NextState": "INFLIGHT"}', content_type=content_type, headers=tokens()
    )

    assert response.status_code == 202
    assert snapshot(job)["status"] == INFLIGHT


def test_retrying_a_dead_job_counts_an_attempt(client, worker, lease_settings):
    job = pull_job(worker, DEAD)
    Job.objects.filter(pk=job.pk).update(attempts=4)

    with time_machine.travel(T0, tick=False):
        response = move(client, job, {"NextState": "INFLIGHT", "IncrementalTimeout": 5})

    assert response.status_code == 202
    job.refresh_from_db()
    assert (job.status, job.attempts) == (INFLIGHT, 5)
    assert job.lease_expires_at == T0 + timedelta(seconds=37)


def test_reporting_failure_makes_the_job_dead_with_a_reason(client, worker):
    job = pull_job(worker, INFLIGHT)

    response = move(client, job, {"NextState": "DEAD"})

    assert response.status_code == 202
    job.refresh_from_db()
    assert job.status == DEAD
    assert "pull consumer" in job.last_error
    assert job.lease_expires_at is None


def test_reporting_success_delivers_the_job(client, worker):
    job = pull_job(worker, INFLIGHT)

    response = move(client, job, {"NextState": "DELIVERED"})

    assert response.status_code == 202
    job.refresh_from_db()
    assert (job.status, job.lease_expires_at, job.attempts) == (DELIVERED, None, 1)


# Job lookup and token checks, on every token-guarded endpoint

PULL_ONLY = [
    ("get", "queued-jobs"),
    ("post", "claim"),
    ("get", "job/{job}"),
    ("post", "job/{job}"),
]
ANY_CONSUMER = [("post", "job/{job}/requeue-dead-job"), ("delete", "job/{job}")]


def call(client, method: str, path: str, headers: dict[str, str]):
    if method == "post":
        return client.post(path, {"NextState": "INFLIGHT"}, content_type=JSON, headers=headers)
    return getattr(client, method)(path, headers=headers)


@pytest.mark.parametrize(
    ("channel_id", "consumer_id", "headers", "expected"),
    [
        ("orders", "worker", {}, 401),
        ("orders", "worker", {"X-Broker-Channel-Token": "channel-token"}, 401),
        ("orders", "worker", {"X-Broker-Consumer-Token": "consumer-token"}, 401),
        ("orders", "nobody", tokens(), 401),
        ("orders", "worker", tokens(channel="wrong"), 403),
        ("orders", "worker", tokens("wrong"), 403),
        ("orders", "worker", tokens("other-token"), 403),
        ("nowhere", "worker", tokens(), 404),
    ],
)
@pytest.mark.parametrize(("method", "tail"), PULL_ONLY + ANY_CONSUMER)
def test_token_problems_are_refused_before_anything_changes(
    client, channel, worker, channel_id, consumer_id, headers, expected, method, tail
):
    make_consumer_with_token(channel, "other", token="other-token")
    job = pull_job(worker, DEAD)
    before = snapshot(job)
    path = f"/channel/{channel_id}/consumer/{consumer_id}/{tail.format(job=job.public_id)}"
    if consumer_id == "nobody" and method == "delete":
        expected = 404  # webhook-broker's DELETE endpoints answer 404 for an unknown consumer

    response = call(client, method, path, headers)

    assert response.status_code == expected
    assert "Error" in response.json()
    assert snapshot(job) == before


@pytest.mark.parametrize(("method", "tail"), PULL_ONLY)
def test_push_consumers_get_412_from_the_pull_endpoints(client, channel, method, tail):
    pusher = make_consumer_with_token(channel, "pusher", type=Consumer.Type.PUSH)
    job = pull_job(pusher)

    response = call(client, method, url("pusher", tail.format(job=job.public_id)), tokens())

    assert response.status_code == 412
    assert snapshot(job)["status"] == QUEUED


@pytest.mark.parametrize(
    "job_id",
    ["999999", "abc", "1e3", "-1", " 1", "²", "9" * 30, "0000000000000000000g", "v" * 20],
)
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_unknown_or_malformed_job_ids_are_404(client, worker, job_id, method):
    pull_job(worker, DEAD)

    response = call(client, method, url(tail=f"job/{job_id}"), tokens())

    assert response.status_code == 404


def other_spellings(job: Job) -> list[str]:
    """Strings that decode to the job's key but are not its ID: its row key in decimal, its xid
    in capitals (base32 decoders take them, rs/xid does not), with spare bits set in the last
    character, and with a creation second one off."""
    parts = key_of_xid(job.public_id)
    assert parts is not None
    seconds, key = parts
    xid = job.public_id
    return [
        str(job.pk),
        xid.upper(),
        xid[:-1] + "1",
        public_key_xid(seconds + 1, key),
    ]


@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_a_job_is_found_only_by_its_own_id(client, worker, method):
    job = pull_job(worker, DEAD)

    for spelling in other_spellings(job):
        response = call(client, method, url(tail=f"job/{spelling}"), tokens())

        assert response.status_code == 404, spelling
        assert snapshot(job)["status"] == DEAD


@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_another_consumers_job_is_404(client, channel, worker, method):
    other = make_consumer_with_token(channel, "other", token="other-token")
    job = pull_job(other, DEAD)
    before = snapshot(job)

    response = call(client, method, url(tail=f"job/{job.public_id}"), tokens())

    assert response.status_code == 404
    assert snapshot(job) == before


def test_another_consumers_dead_job_cannot_be_requeued(client, channel, worker):
    other = make_consumer_with_token(channel, "other", token="other-token")
    job = pull_job(other, DEAD)

    response = client.post(url(tail=f"job/{job.public_id}/requeue-dead-job"), headers=tokens())

    assert response.status_code == 404
    assert snapshot(job)["status"] == DEAD


# Requeue and delete of one dead job


@pytest.mark.parametrize("kind", [Consumer.Type.PULL, Consumer.Type.PUSH])
def test_requeue_dead_job_queues_it_again_with_attempts_reset(client, channel, kind):
    consumer = make_consumer_with_token(channel, type=kind)
    job = pull_job(consumer, DEAD)

    response = client.post(job_url(job) + "/requeue-dead-job", headers=tokens())

    assert response.status_code == 202
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_expires_at) == (QUEUED, 0, None)


@pytest.mark.parametrize("status", [QUEUED, INFLIGHT, DELIVERED])
def test_requeue_of_a_job_that_is_not_dead_is_400(client, worker, status):
    job = pull_job(worker, status)
    before = snapshot(job)

    response = client.post(job_url(job) + "/requeue-dead-job", headers=tokens())

    assert response.status_code == 400
    assert snapshot(job) == before


@pytest.mark.parametrize("kind", [Consumer.Type.PULL, Consumer.Type.PUSH])
def test_delete_removes_a_dead_job(client, channel, kind):
    consumer = make_consumer_with_token(channel, type=kind)
    job = pull_job(consumer, DEAD)

    response = client.delete(job_url(job), headers=tokens())

    assert response.status_code == 204
    assert not Job.objects.filter(pk=job.pk).exists()


@pytest.mark.parametrize("status", [QUEUED, INFLIGHT, DELIVERED])
def test_delete_of_a_job_that_is_not_dead_is_404(client, worker, status):
    job = pull_job(worker, status)

    response = client.delete(job_url(job), headers=tokens())

    assert response.status_code == 404
    assert snapshot(job)["status"] == status


# Lease expiry


def test_an_expired_lease_returns_the_job_to_the_queue_with_its_attempt_counted(
    worker, lease_settings
):
    with time_machine.travel(T0, tick=False) as traveller:
        job = pull_job(worker, INFLIGHT)
        traveller.shift(33)

        assert sweep_expired_leases() == 1

    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_expires_at) == (QUEUED, 1, None)
    assert job.last_error == LEASE_EXPIRED
    assert job.next_attempt_at == T0 + timedelta(seconds=33)


@pytest.mark.parametrize("seconds_later", [0, 31, 32])
def test_a_lease_that_has_not_expired_is_left_alone(worker, lease_settings, seconds_later):
    with time_machine.travel(T0, tick=False) as traveller:
        job = pull_job(worker, INFLIGHT)
        before = snapshot(job)
        traveller.shift(seconds_later)

        assert sweep_expired_leases() == 0

    assert snapshot(job) == before


def test_the_incremental_timeout_keeps_the_job_leased_longer(client, worker, lease_settings):
    job = pull_job(worker)
    with time_machine.travel(T0, tick=False) as traveller:
        assert (
            move(client, job, {"NextState": "INFLIGHT", "IncrementalTimeout": 100}).status_code
            == 202
        )
        traveller.shift(100)
        assert sweep_expired_leases() == 0
        traveller.shift(33)
        assert sweep_expired_leases() == 1


@pytest.mark.parametrize(
    ("global_delays", "consumer_delays", "attempts", "expected"),
    [
        ([10, 20], None, 2, QUEUED),  # 3 attempts allowed: one first try and one per delay
        ([10, 20], None, 3, DEAD),
        ([10, 20], None, 7, DEAD),
        ([10, 20], [5], 1, QUEUED),  # the consumer's own retry delays win
        ([10, 20], [5], 2, DEAD),
        ([], None, 1, DEAD),
        ([10], [1, 2, 3, 4], 4, QUEUED),
    ],
)
def test_an_expired_lease_kills_the_job_once_its_attempts_are_used_up(
    worker, lease_settings, global_delays, consumer_delays, attempts, expected
):
    lease_settings.BROKER_RETRY_DELAYS = global_delays
    worker.retry_delays = consumer_delays
    worker.save()
    with time_machine.travel(T0, tick=False) as traveller:
        job = pull_job(worker, INFLIGHT)
        Job.objects.filter(pk=job.pk).update(attempts=attempts)
        traveller.shift(60)

        assert sweep_expired_leases() == 1

    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_expires_at) == (expected, attempts, None)
    assert job.last_error.startswith(LEASE_EXPIRED)


def test_an_expired_lease_is_listed_again_once_the_dispatchers_sweep_ran(
    client, worker, lease_settings
):
    with time_machine.travel(T0, tick=False) as traveller:
        job = pull_job(worker, INFLIGHT, message_id="order-1")
        assert queued_ids(client) == []
        traveller.shift(33)
        assert queued_ids(client) == []  # no request sweeps: the dispatchers' step does

        Maintenance("dispatcher-1").sweep()

        assert queued_ids(client) == ["order-1"]

    job.refresh_from_db()
    assert (job.status, job.attempts) == (QUEUED, 1)


# Claim (extension)


@pytest.mark.parametrize("as_json", [False, True])
def test_claim_takes_jobs_under_the_requested_lease(client, worker, as_json):
    with time_machine.travel(T0, tick=False):
        for n in range(5):
            publish("orders", {"n": n}, producer="shop", message_id=f"m{n}", priority=n % 2)

        response = claim(client, {"limit": 3, "timeout": 120}, as_json=as_json)
        assert queued_ids(client) == ["m2", "m4"]

    assert response.status_code == 200
    result = response.json()["Result"]
    assert [item["Message"]["MessageID"] for item in result] == ["m1", "m3", "m0"]
    assert set(result[0]) == {"ID", "Priority", "IncrementalTimeout", "Attempts", "Message"}
    assert {(item["Attempts"], item["IncrementalTimeout"]) for item in result} == {(1, 0)}
    taken = [job for job in Job.objects.all() if job.public_id in {item["ID"] for item in result}]
    assert {(job.status, job.lease_expires_at) for job in taken} == {
        (INFLIGHT, T0 + timedelta(seconds=120))
    }


def test_claim_defaults_to_25_jobs_and_the_standard_lease(client, worker, lease_settings):
    with time_machine.travel(T0, tick=False):
        for n in range(30):
            publish("orders", {"n": n}, producer="shop")

        result = claim(client).json()["Result"]

    assert len(result) == 25
    assert set(Job.objects.filter(status=INFLIGHT).values_list("lease_expires_at", flat=True)) == {
        T0 + timedelta(seconds=32)
    }


def test_claim_takes_only_this_consumers_due_jobs(client, channel, worker):
    make_consumer_with_token(channel, "other", token="other-token")
    pull_job(worker, message_id="due")
    later = pull_job(worker, message_id="later")
    Job.objects.filter(pk=later.pk).update(
        next_attempt_at=later.next_attempt_at + timedelta(hours=1)
    )

    result = claim(client, {"limit": 10}).json()["Result"]

    assert [item["Message"]["MessageID"] for item in result] == ["due"]
    assert Job.objects.filter(consumer__public_id="other", status=QUEUED).count() == 2
    assert claim(client, {"limit": 10}).json() == {"Result": []}


def test_claim_of_zero_jobs_takes_nothing(client, worker):
    job = pull_job(worker)

    response = claim(client, {"limit": 0})

    assert response.json() == {"Result": []}
    assert snapshot(job)["status"] == QUEUED


def test_claim_never_hands_out_a_leased_job_and_takes_it_once_swept(client, worker, lease_settings):
    with time_machine.travel(T0, tick=False) as traveller:
        pull_job(worker, INFLIGHT, message_id="order-1")
        assert claim(client).json()["Result"] == []
        traveller.shift(33)
        assert claim(client).json()["Result"] == []  # expired, but not swept yet

        Maintenance("dispatcher-1").sweep()
        result = claim(client).json()["Result"]

    assert [(item["Message"]["MessageID"], item["Attempts"]) for item in result] == [("order-1", 2)]


@pytest.mark.parametrize(
    "body",
    [{"limit": -1}, {"limit": "many"}, {"timeout": 0}, {"wait": 3601}, {"wait": -1}],
)
def test_claim_rejects_bad_parameters(client, worker, body):
    job = pull_job(worker)

    response = claim(client, body)

    assert response.status_code == 400
    assert snapshot(job)["status"] == QUEUED


def test_claim_needs_a_form_or_json_body(client, worker):
    response = client.post(
        url(tail="claim"), "limit=1", content_type="text/plain", headers=tokens()
    )

    assert response.status_code == 415


def test_claim_with_wait_returns_empty_when_nothing_arrives(client, worker):
    started = time.monotonic()

    response = claim(client, {"wait": 0.4})

    assert response.json() == {"Result": []}
    assert time.monotonic() - started >= 0.4


@pytest.mark.django_db(transaction=True)
def test_competing_claims_never_hand_out_a_job_twice(channel, worker):
    for n in range(200):
        publish("orders", {"n": n}, producer="shop")
    taken: list[str] = []
    statuses: list[int] = []

    def claim_until_empty() -> None:
        client = Client()
        while True:
            response = claim(client, {"limit": 7, "timeout": 300})
            statuses.append(response.status_code)
            result = response.json()["Result"]
            if not result:
                return
            taken.extend(item["ID"] for item in result)

    at_once(*[claim_until_empty] * 8)

    assert set(statuses) == {200}
    assert len(taken) == len(set(taken)) == 200
    assert set(taken) == {job.public_id for job in Job.objects.all()}
    assert set(Job.objects.values_list("status", "attempts")) == {(INFLIGHT, 1)}


@pytest.mark.django_db(transaction=True)
def test_claim_long_poll_answers_as_soon_as_a_job_is_published(client, channel, worker):
    def publish_soon() -> None:
        try:
            time.sleep(0.3)
            publish("orders", {"n": 1}, producer="shop", message_id="late")
        finally:
            connection.close()

    publisher = threading.Thread(target=publish_soon)
    started = time.monotonic()
    publisher.start()
    response = claim(client, {"wait": 15})
    elapsed = time.monotonic() - started
    publisher.join()

    assert [item["Message"]["MessageID"] for item in response.json()["Result"]] == ["late"]
    # Long before the wait was over (a loaded machine may take seconds; never 15).
    assert 0.3 <= elapsed < 15


@pytest.mark.django_db(transaction=True)
def test_racing_takes_of_one_job_count_one_attempt(channel, worker):
    job = pull_job(worker)
    barrier = threading.Barrier(8)
    statuses: list[int] = []

    def take() -> None:
        try:
            barrier.wait()
            statuses.append(move(Client(), job, {"NextState": "INFLIGHT"}).status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Each caller finds the job INFLIGHT in the end (202), but only one moved it.
    assert statuses == [202] * 8
    job.refresh_from_db()
    assert (job.status, job.attempts) == (INFLIGHT, 1)
