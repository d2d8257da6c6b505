"""A pull consumer's single acknowledgement with its token checks folded into the statement that
moves the job (jobs/api/access.py, `proven_credentials`; jobs/queue/sql/pull.sql): the same
answers as the checks made one by one, one query once the process knows the consumer's token, and
every change of the tokens or the consumer seen at once."""

from __future__ import annotations

import hmac
import itertools
import json

import pytest
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from rest_framework.request import Request

from broker.models import Channel
from broker.tokens import hash_token
from consumers.models import Consumer
from jobs.api.access import checked_tokens, proven_credentials
from jobs.models import Job
from jobs.queue import take_for_pull
from jobs.states import DEAD, DELIVERED, INFLIGHT
from tests.helpers import make_consumer_with_token, pull_job, tokens

pytestmark = pytest.mark.django_db

JSON = "application/json"


def acknowledge(
    client, job_id: str, *, consumer_token: str = "consumer-token", channel_token="channel-token"
):
    """`POST …/consumer/worker/job/{j}` `{"NextState": "DELIVERED"}`."""
    return client.post(
        f"/channel/orders/consumer/worker/job/{job_id}",
        json.dumps({"NextState": DELIVERED}),
        content_type=JSON,
        headers=tokens(consumer_token, channel_token),
    )


def teach(client, worker: Consumer) -> None:
    """Let the process check the worker's token the long way once (a good acknowledgement)."""
    assert acknowledge(client, pull_job(worker, INFLIGHT).public_id).status_code == 202
    assert checked_tokens.known("orders", worker.public_id) is not None


def queries_of(client, job: Job) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = acknowledge(client, job.public_id)
    assert response.status_code == 202
    return len(queries)


def test_an_acknowledgement_is_one_statement_once_the_process_knows_the_consumers_token(
    client, worker
):
    first, second = pull_job(worker, INFLIGHT), pull_job(worker, INFLIGHT)

    # The first: the consumer read with its channel's token hash, its token decrypted and
    # checked, then the move, one statement that also returns what the log line needs.
    assert queries_of(client, first) == 2
    # Every later one: the move alone, which checks the tokens itself.
    assert queries_of(client, second) == 1
    for job in Job.objects.filter(pk__in=[first.pk, second.pk]):
        assert (job.status, job.lease_expires_at, job.last_error) == (DELIVERED, None, "")


# Every combination of channel, consumer, tokens, job and body a caller can get wrong.
COMBINATIONS = list(
    itertools.product(
        ["orders", "nowhere"],
        ["worker", "nobody", "pusher"],
        [None, "wrong", "channel-token"],
        [None, "wrong", "consumer-token"],
        ["mine", "theirs", "malformed"],
        [{"NextState": DELIVERED}, {"NextState": DEAD}, {"NextState": "DONE"}],
    )
)


def answers(client, channel: Channel, worker: Consumer) -> list[tuple[int, bytes, str]]:
    """Each combination's answer, and the states of the worker's job and another's after it."""
    theirs = pull_job(make_consumer_with_token(channel, f"other-{Consumer.objects.count()}"))
    take_for_pull(theirs)
    mine = pull_job(worker, INFLIGHT)
    results = []
    for channel_id, consumer_id, channel_token, consumer_token, job, body in COMBINATIONS:
        job_id = {"mine": mine.public_id, "theirs": theirs.public_id, "malformed": "abc"}[job]
        response = client.post(
            f"/channel/{channel_id}/consumer/{consumer_id}/job/{job_id}",
            json.dumps(body),
            content_type=JSON,
            headers=tokens(consumer_token, channel_token),
        )
        states = [Job.objects.get(pk=j.pk).status for j in (mine, theirs)]
        results.append((response.status_code, response.content, "/".join(states)))
        if states[0] != INFLIGHT:
            mine = pull_job(worker, INFLIGHT)  # the next combinations find one to move again
    return results


def test_the_statement_answers_every_refusal_as_the_checks_one_by_one_do(client, channel, worker):
    make_consumer_with_token(channel, "pusher", type=Consumer.Type.PUSH)
    long_way = answers(client, channel, worker)
    checked_tokens.forget()
    teach(client, worker)
    folded = answers(client, channel, worker)

    assert folded == long_way
    assert {status for status, _, _ in folded} == {202, 400, 401, 403, 404, 412}
    moved = [c for c, (status, _, _) in zip(COMBINATIONS, folded, strict=True) if status == 202]
    right = ("orders", "worker", "channel-token", "consumer-token", "mine")
    assert moved == [(*right, {"NextState": DELIVERED}), (*right, {"NextState": DEAD})]


def test_a_new_consumer_token_is_seen_at_once_however_it_was_stored(client, worker):
    teach(client, worker)
    job = pull_job(worker, INFLIGHT)
    worker.set_token("rotated")
    worker.save()

    assert acknowledge(client, job.public_id).status_code == 403
    Consumer.objects.filter(pk=worker.pk).update(token="updated")  # no save(): still encrypted
    assert acknowledge(client, job.public_id, consumer_token="rotated").status_code == 403
    assert Job.objects.get(pk=job.pk).status == INFLIGHT
    assert acknowledge(client, job.public_id, consumer_token="updated").status_code == 202


def test_a_new_channel_token_is_seen_at_once(client, channel, worker):
    teach(client, worker)
    job = pull_job(worker, INFLIGHT)
    channel.set_token("rotated")
    channel.save()

    assert acknowledge(client, job.public_id).status_code == 403
    assert Job.objects.get(pk=job.pk).status == INFLIGHT
    assert acknowledge(client, job.public_id, channel_token="rotated").status_code == 202


def test_a_consumer_turned_push_or_deleted_is_seen_at_once(client, worker):
    teach(client, worker)
    job = pull_job(worker, INFLIGHT)
    Consumer.objects.filter(pk=worker.pk).update(type=Consumer.Type.PUSH)

    assert acknowledge(client, job.public_id).status_code == 412
    assert Job.objects.get(pk=job.pk).status == INFLIGHT
    worker.delete()
    assert acknowledge(client, job.public_id).status_code == 401


def test_a_paused_consumer_still_acknowledges_the_jobs_it_holds(client, worker):
    teach(client, worker)
    job = pull_job(worker, INFLIGHT)
    Consumer.objects.filter(pk=worker.pk).update(paused=True)

    assert queries_of(client, job) == 1
    assert Job.objects.get(pk=job.pk).status == DELIVERED


def test_a_known_consumers_token_is_still_compared_in_constant_time(client, worker, monkeypatch):
    teach(client, worker)
    compared: list[str] = []
    real = hmac.compare_digest

    def counting(a, b):
        compared.append(a)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    for token, proven in [("consumer-tokem", False), ("consumer-token", True)]:
        request = Request(RequestFactory().post("/", headers=tokens(token, "channel-token")))
        compared.clear()

        assert (proven_credentials(request, "orders", "worker") is not None) == proven
        assert compared == [hash_token(token)]
