"""Per-producer broadcast rate limiting (broker/ratelimit.py): 429 with Retry-After, nothing
stored, one bucket per producer shared by every API process."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.test import Client

from broker.models import Message
from broker.ratelimit import TABLE, Limit, RateLimited, configured_limit, take_broadcast
from jobs.models import Job
from tests.db_snapshot import snapshot
from tests.helpers import at_once, make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db

URL = "/channel/orders/broadcast"


def auth(producer: str = "shop") -> dict[str, str]:
    return {
        "X-Broker-Channel-Token": "channel-token",
        "X-Broker-Producer-ID": producer,
        "X-Broker-Producer-Token": f"{producer}-token",
    }


@pytest.fixture(autouse=True)
def channel():
    channel = make_channel("orders", token="channel-token")
    make_producer("shop", token="shop-token")
    make_producer("other", token="other-token")
    make_consumer(channel, "billing")
    return channel


def broadcast(client, producer: str = "shop", **headers: str):
    return client.post(
        URL, b'{"n": 1}', content_type="application/json", headers={**auth(producer), **headers}
    )


def bucket_rows() -> list[tuple[str, float]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT producer_id, tat FROM {TABLE} ORDER BY producer_id")  # noqa: S608
        return [(row[0], float(row[1])) for row in cursor.fetchall()]


def test_broadcasts_are_not_limited_by_default(client):
    assert configured_limit() is None
    for _ in range(30):
        assert broadcast(client).status_code == 201
    assert bucket_rows() == []  # no work at all on the hot path


def test_over_the_limit_is_429_with_retry_after_and_stores_nothing(client, settings):
    settings.BROKER_BROADCAST_RATE_LIMIT = 0.5  # one every two seconds
    settings.BROKER_BROADCAST_BURST = 3
    for _ in range(3):
        assert broadcast(client).status_code == 201
    before = snapshot()

    refused = broadcast(client, **{"X-Broker-Message-ID": "one-too-many"})

    assert refused.status_code == 429
    assert refused.json() == {"Error": "Producer 'shop' is over its broadcast rate limit."}
    assert refused["Content-Type"] == "application/json"
    retry_after = refused["Retry-After"]
    assert retry_after.isdigit()
    assert 1 <= int(retry_after) <= 2
    assert snapshot() == before  # no message, no job, and the bucket itself unchanged
    assert not Message.objects.filter(public_id="one-too-many").exists()
    assert Message.objects.count() == 3
    assert Job.objects.count() == 3


def test_each_producer_has_its_own_bucket(client, settings):
    settings.BROKER_BROADCAST_RATE_LIMIT = 0.01
    settings.BROKER_BROADCAST_BURST = 2
    assert [broadcast(client).status_code for _ in range(3)] == [201, 201, 429]
    assert [broadcast(client, "other").status_code for _ in range(3)] == [201, 201, 429]
    assert [producer for producer, _ in bucket_rows()] == ["other", "shop"]


def test_waiting_for_retry_after_is_enough(client, settings):
    settings.BROKER_BROADCAST_RATE_LIMIT = 1
    settings.BROKER_BROADCAST_BURST = 1
    assert broadcast(client).status_code == 201
    refused = broadcast(client)
    assert refused.status_code == 429

    time.sleep(int(refused["Retry-After"]))

    assert broadcast(client).status_code == 201


def test_requests_that_fail_authentication_spend_nothing(client, settings):
    """Nobody without the producer's token can use up its allowance."""
    settings.BROKER_BROADCAST_RATE_LIMIT = 0.01
    settings.BROKER_BROADCAST_BURST = 1
    for _ in range(5):
        response = broadcast(client, **{"X-Broker-Producer-Token": "guessed"})
        assert response.status_code == 403
    assert bucket_rows() == []
    assert broadcast(client).status_code == 201


def test_a_large_refused_payload_is_refused_before_it_is_read(client, settings):
    settings.BROKER_BROADCAST_RATE_LIMIT = 0.01
    settings.BROKER_BROADCAST_BURST = 1
    assert broadcast(client).status_code == 201
    response = client.post(
        URL, b"x" * 1_000_000, content_type="application/octet-stream", headers=auth()
    )
    assert response.status_code == 429


# --- the algorithm, with an explicit clock --------------------------------------------------


def allowed(producer: str, now: float) -> bool:
    try:
        take_broadcast(producer, now=now)
    except RateLimited:
        return False
    return True


def test_the_bucket_refills_at_the_rate_and_holds_at_most_the_burst(settings):
    settings.BROKER_BROADCAST_RATE_LIMIT = 2  # a token every 0.5 s
    settings.BROKER_BROADCAST_BURST = 3
    start = 1_000_000.0

    assert [allowed("shop", start) for _ in range(4)] == [True, True, True, False]
    assert allowed("shop", start + 0.49) is False
    assert allowed("shop", start + 0.5) is True
    assert allowed("shop", start + 0.5) is False
    # An hour of silence refills the bucket to its burst, not to 7200.
    later = start + 3600
    assert [allowed("shop", later) for _ in range(4)] == [True, True, True, False]


def test_retry_after_is_the_wait_rounded_up(settings):
    settings.BROKER_BROADCAST_RATE_LIMIT = 0.1  # one every 10 s
    settings.BROKER_BROADCAST_BURST = 1
    start = 2_000_000.0
    take_broadcast("shop", now=start)

    with pytest.raises(RateLimited) as caught:
        take_broadcast("shop", now=start + 2.5)

    assert caught.value.retry_after == 8  # 7.5 s, rounded up
    assert allowed("shop", start + 9.9) is False
    assert allowed("shop", start + 10) is True


def test_the_default_burst_is_one_seconds_worth(settings):
    settings.BROKER_BROADCAST_RATE_LIMIT = 2.5
    assert configured_limit() == Limit(rate=2.5, burst=3)
    settings.BROKER_BROADCAST_RATE_LIMIT = 0.2
    assert configured_limit() == Limit(rate=0.2, burst=1)


@pytest.mark.django_db(transaction=True)
def test_concurrent_broadcasts_from_many_connections_share_one_bucket(settings):
    """Every API process has its own database connection: eight threads, eight connections,
    forty broadcasts at once; exactly the burst gets through."""
    settings.BROKER_BROADCAST_RATE_LIMIT = 0.001
    settings.BROKER_BROADCAST_BURST = 10
    statuses: list[int] = []
    lock = threading.Lock()

    def producer_process() -> None:
        client = Client()
        for _ in range(5):
            status = broadcast(client).status_code
            with lock:
                statuses.append(status)

    at_once(*[producer_process] * 8)

    assert sorted(statuses) == [201] * 10 + [429] * 30
    assert Message.objects.count() == 10
