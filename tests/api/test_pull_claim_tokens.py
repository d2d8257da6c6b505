"""A pull consumer's claim with its token checks folded into the statement that takes its jobs
(jobs/api/access.py, `proven_credentials`; jobs/queue/sql/pull.sql, proven_claimant), and the
consumer read of every other pull request, which decrypts a token only when this process has not
checked it before: the same answers as the checks made one by one, one query for a claim once the
process knows the consumer's token, and every change of the tokens or the consumer seen at once."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from broker import crypto, publish
from consumers.models import Consumer
from jobs.api import access
from jobs.api.access import checked_tokens
from jobs.models import Job
from jobs.states import DELIVERED, INFLIGHT, QUEUED
from tests.helpers import make_consumer_with_token, pull_job, tokens

pytestmark = pytest.mark.django_db

JSON = "application/json"


def claim(
    client,
    body: object = None,
    *,
    consumer_token: str | None = "consumer-token",
    channel_token: str | None = "channel-token",
    channel_id: str = "orders",
    consumer_id: str = "worker",
):
    """`POST …/consumer/{k}/claim` with a JSON body (`{"limit": 10}` unless given as text, or
    as a content type and text)."""
    content_type, text = JSON, body if isinstance(body, str) else json.dumps(body or {"limit": 10})
    if isinstance(body, tuple):
        content_type, text = body
    return client.post(
        f"/channel/{channel_id}/consumer/{consumer_id}/claim",
        text,
        content_type=content_type,
        headers=tokens(consumer_token, channel_token),
    )


def claimed(client, **given: Any) -> list[str]:
    """The IDs of the jobs a claim took (it must answer 200)."""
    response = claim(client, **given)
    assert response.status_code == 200, response.content
    return [job["ID"] for job in response.json()["Result"]]


def teach(client, worker: Consumer) -> None:
    """Let the process check the worker's token the long way once (a claim that takes a job)."""
    job = pull_job(worker)
    assert job.public_id in claimed(client)
    assert checked_tokens.known("orders", worker.public_id) is not None


def status_of(job: Job) -> str:
    return Job.objects.get(pk=job.pk).status


def test_a_claim_is_one_statement_once_the_process_knows_the_consumers_token(client, worker):
    first, second = pull_job(worker), pull_job(worker)

    with CaptureQueriesContext(connection) as long_way:
        assert claimed(client, body={"limit": 1}) == [first.public_id]
    with CaptureQueriesContext(connection) as folded:
        assert claimed(client, body={"limit": 1}) == [second.public_id]

    # The first: the consumer read with its channel's token hash, its token decrypted and
    # checked, then the claim. Every later one: the claim alone, which checks the tokens itself.
    assert len(long_way) == 2
    assert len(folded) == 1
    assert {status_of(first), status_of(second)} == {INFLIGHT}


def test_a_claim_answers_as_before_byte_for_byte(client, worker):
    pull_job(worker)
    long_way = claim(client, {"limit": 1})
    Job.objects.filter(consumer=worker).update(status=QUEUED, attempts=0)  # the same job again
    folded = claim(client, {"limit": 1})

    assert checked_tokens.known("orders", worker.public_id) is not None
    assert (folded.status_code, folded.content) == (long_way.status_code, long_way.content)
    fresh = {"X-Request-ID"}  # each request's own
    assert {k: v for k, v in folded.items() if k not in fresh} == {
        k: v for k, v in long_way.items() if k not in fresh
    }


# Every combination of channel, consumer, tokens and body a caller can get wrong.
COMBINATIONS = list(
    itertools.product(
        ["orders", "nowhere"],
        ["worker", "nobody", "pusher"],
        [None, "wrong", "channel-token"],
        [None, "wrong", "consumer-token"],
        [{"limit": 1}, {"limit": 0}, {"limit": -1}, "{not json", ("text/plain", "limit=1")],
    )
)


def answers(client, worker: Consumer) -> list[tuple[int, object, str]]:
    """Each combination's answer (a 200's as how many jobs it took) and the worker's job's state
    after it."""
    job = pull_job(worker)
    results = []
    for channel_id, consumer_id, channel_token, consumer_token, body in COMBINATIONS:
        response = claim(
            client,
            body,
            channel_id=channel_id,
            consumer_id=consumer_id,
            channel_token=channel_token,
            consumer_token=consumer_token,
        )
        ok = response.status_code == 200
        answer = len(response.json()["Result"]) if ok else response.content
        results.append((response.status_code, answer, status_of(job)))
        if status_of(job) != QUEUED:
            job = pull_job(worker)  # the next combinations find one to take again
    return results


def test_the_statement_answers_every_refusal_as_the_checks_one_by_one_do(client, channel, worker):
    make_consumer_with_token(channel, "pusher", type=Consumer.Type.PUSH)
    long_way = answers(client, worker)
    checked_tokens.forget()
    teach(client, worker)
    folded = answers(client, worker)

    assert folded == long_way
    assert {status for status, _, _ in folded} == {200, 400, 401, 403, 404, 412, 415}
    took = [c for c, (_, _, state) in zip(COMBINATIONS, folded, strict=True) if state == INFLIGHT]
    assert took == [("orders", "worker", "channel-token", "consumer-token", {"limit": 1})]


def test_a_paused_consumer_is_handed_nothing_once_known(client, worker):
    teach(client, worker)
    job = pull_job(worker)
    Consumer.objects.filter(pk=worker.pk).update(paused=True)

    assert claimed(client) == []
    assert status_of(job) == QUEUED
    Consumer.objects.filter(pk=worker.pk).update(paused=False)
    assert claimed(client) == [job.public_id]


def test_an_ordering_set_since_is_seen_at_once(client, channel, worker):
    teach(client, worker)  # unordered then
    Consumer.objects.filter(pk=worker.pk).update(ordering=Consumer.Ordering.ORDERED)
    for message_id, key in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
        publish(channel, b"x", producer="shop", message_id=message_id, ordering_key=key)

    response = claim(client)
    heads = sorted(job["Message"]["MessageID"] for job in response.json()["Result"])

    assert heads == ["a1", "b1"]
    assert claimed(client) == []  # learned ordered now: the ordered statement, no tail


def test_new_tokens_a_push_type_or_a_deletion_are_seen_at_once(client, channel, worker):
    teach(client, worker)
    job = pull_job(worker)
    worker.set_token("rotated")
    worker.save()
    assert claim(client).status_code == 403
    channel.set_token("new-channel-token")
    channel.save()
    assert claim(client, consumer_token="rotated").status_code == 403
    assert claimed(client, consumer_token="rotated", channel_token="new-channel-token") == [
        job.public_id
    ]

    job = pull_job(worker)
    rotated = {"consumer_token": "rotated", "channel_token": "new-channel-token"}
    Consumer.objects.filter(pk=worker.pk).update(type=Consumer.Type.PUSH)
    assert claim(client, **rotated).status_code == 412
    Consumer.objects.filter(pk=worker.pk).delete()
    assert claim(client, **rotated).status_code == 401
    assert not Job.objects.filter(pk=job.pk).exists()


def test_a_known_token_is_not_decrypted_again_and_a_new_one_is(client, worker, monkeypatch):
    """Other pull requests (here a report) read the consumer, but decrypt its token only when
    its stored text is not the one this process checked."""
    teach(client, worker)
    decrypted: list[str] = []
    real = crypto.decrypt

    def counting(stored: str) -> str:
        decrypted.append(stored)
        return real(stored)

    monkeypatch.setattr(access, "decrypt", counting)

    def report(job: Job, consumer_token: str = "consumer-token") -> int:
        body = {"Jobs": [{"ID": job.public_id, "NextState": DELIVERED}]}
        url = "/channel/orders/consumer/worker/report"
        response = client.post(
            url,
            json.dumps(body),
            content_type=JSON,
            headers=tokens(consumer_token, "channel-token"),
        )
        return int(response.status_code)

    assert report(pull_job(worker, INFLIGHT)) == 200
    assert decrypted == []  # the token the claim checked
    assert report(pull_job(worker, INFLIGHT), "wrong") == 403
    assert len(decrypted) == 1  # not the one known: checked the long way
    worker.set_token("rotated")
    worker.save()
    assert report(pull_job(worker, INFLIGHT)) == 403
    assert report(pull_job(worker, INFLIGHT), "rotated") == 200
    assert len(decrypted) == 3
    assert report(pull_job(worker, INFLIGHT), "rotated") == 200
    assert len(decrypted) == 3  # learned again
