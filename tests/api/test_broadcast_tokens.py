"""The broadcast's token check folded into the publish statement (docs/performance-history.md,
"Ingest: broadcast throughput"): the same answers as the separate check, one query per
broadcast."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from broker.models import Message
from broker.publishing import TokensRefused, publish
from broker.tokens import hash_token
from jobs.models import Job
from jobs.queue import TokenDigests
from tests.helpers import BROADCAST_HEADERS, make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db

RIGHT = {"channel": "channel-token", "producer": "producer-token"}


@pytest.fixture(autouse=True)
def setup():
    channel = make_channel("orders", token=RIGHT["channel"])
    make_producer("shop", token=RIGHT["producer"])
    make_consumer(channel, "billing")


def headers(channel_token, producer_id, producer_token, bad_priority):
    """A broadcast's headers; None leaves a header out."""
    given = {
        "X-Broker-Channel-Token": channel_token,
        "X-Broker-Producer-ID": producer_id,
        "X-Broker-Producer-Token": producer_token,
        "X-Broker-Message-Priority": "high" if bad_priority else None,
    }
    return {name: value for name, value in given.items() if value is not None}


# Every combination of channel, tokens, producer and content a caller can get wrong.
COMBINATIONS = list(
    itertools.product(
        ["orders", "nowhere"],
        [None, "wrong", RIGHT["channel"]],
        [None, "ghost", "shop", "bad id!"],
        [None, "wrong", RIGHT["producer"]],
        [False, True],
    )
)


def answers(client, settings, rate_limit):
    settings.BROKER_BROADCAST_RATE_LIMIT = rate_limit
    settings.BROKER_BROADCAST_BURST = 10_000
    results = []
    for index, (channel, channel_token, producer, producer_token, bad) in enumerate(COMBINATIONS):
        response = client.post(
            f"/channel/{channel}/broadcast",
            b'{"n": 1}',
            content_type="application/json",
            headers={
                **headers(channel_token, producer, producer_token, bad),
                "X-Broker-Message-ID": f"m-{rate_limit}-{index}",
            },
        )
        results.append((response.status_code, response.content))
    return results


def test_the_statement_answers_every_refusal_as_the_separate_check_does(client, settings):
    # With a rate limit the tokens are checked by a query of their own before the publish;
    # without one, by the publish statement. Each combination must get the same answer.
    folded = answers(client, settings, rate_limit=0)
    separate = answers(client, settings, rate_limit=1_000)

    assert folded == separate
    statuses = {status for status, _ in folded}
    assert statuses == {201, 400, 401, 403, 404}
    accepted = [
        combination
        for combination, (status, _) in zip(COMBINATIONS, folded, strict=True)
        if status == 201
    ]
    assert accepted == [("orders", RIGHT["channel"], "shop", RIGHT["producer"], False)]
    assert Message.objects.count() == 2  # one per run: only the right tokens stored anything
    assert Job.objects.count() == 2


def test_a_wrong_token_is_403_before_a_bad_header_is_400(client):
    response = client.post(
        "/channel/orders/broadcast",
        b"x",
        content_type="text/plain",
        headers=headers(RIGHT["channel"], "shop", "wrong", bad_priority=True),
    )

    assert (response.status_code, response.json()) == (
        403,
        {"Error": "Producer token does not match."},
    )


def test_a_broadcast_is_one_query(client):
    with CaptureQueriesContext(connection) as queries:
        response = client.post(
            "/channel/orders/broadcast",
            b'{"n": 1}',
            content_type="application/json",
            headers=BROADCAST_HEADERS,
        )

    assert response.status_code == 201
    statements = [query["sql"].split()[0] for query in queries.captured_queries]
    # The savepoint is the test's transaction around the request (publish joins a caller's).
    assert [word for word in statements if word not in {"SAVEPOINT", "RELEASE"}] == ["WITH"]


def test_a_body_to_offload_is_stored_only_after_its_tokens_match(client, settings, tmp_path):
    settings.BROKER_PAYLOAD_OFFLOAD_BYTES = 10
    settings.STORAGES = {
        **settings.STORAGES,
        "broker_payloads": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path)},
        },
    }
    body = b"x" * 100

    refused = client.post(
        "/channel/orders/broadcast",
        body,
        content_type="text/plain",
        headers={**BROADCAST_HEADERS, "X-Broker-Producer-Token": "wrong"},
    )
    assert refused.status_code == 403
    assert list(tmp_path.iterdir()) == []

    accepted = client.post(
        "/channel/orders/broadcast", body, content_type="text/plain", headers=BROADCAST_HEADERS
    )
    assert accepted.status_code == 201
    assert [path.name for path in tmp_path.iterdir()] == [Message.objects.get().payload_file]


@pytest.mark.parametrize("scheduled", [False, True], ids=["now", "scheduled"])
@pytest.mark.parametrize(
    ("channel_token", "producer_token"),
    [("wrong", RIGHT["producer"]), (RIGHT["channel"], "wrong"), (RIGHT["channel"], None)],
)
def test_publish_with_tokens_stores_nothing_unless_both_match(
    channel_token, producer_token, scheduled
):
    digests = TokenDigests(
        hash_token(channel_token), hash_token(producer_token) if producer_token else None
    )
    when = {"scheduled_for": _in_an_hour()} if scheduled else {}

    with pytest.raises(TokensRefused):
        publish("orders", b"x", producer="shop", tokens=digests, **when)

    assert (Message.objects.count(), Job.objects.count()) == (0, 0)
    right = TokenDigests(hash_token(RIGHT["channel"]), hash_token(RIGHT["producer"]))
    message = publish("orders", b"x", producer="shop", tokens=right, **when)
    assert Message.objects.get().pk == message.pk


def _in_an_hour():
    return timezone.now() + timedelta(hours=1)


def test_a_token_changed_during_the_broadcast_is_403(client, monkeypatch):
    # The statement saw the old token; the check after it sees the new one, which was given.
    def refused(*args, **kwargs):
        raise TokensRefused("A token does not match.")

    monkeypatch.setattr("broker.api.broadcast.publish", refused)

    response = client.post(
        "/channel/orders/broadcast", b"x", content_type="text/plain", headers=BROADCAST_HEADERS
    )

    assert (response.status_code, response.json()) == (403, {"Error": "A token does not match."})
