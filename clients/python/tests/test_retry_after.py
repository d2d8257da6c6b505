"""Retry-After on any retried answer, 503 included (what the broker sends while its database is
down), as the TypeScript client honours it: waited as given, or raised at once past the cap."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from tests.conftest import Broker, Publisher, admin_http
from tests.flaky_proxy import flaky_proxy
from webhook_broker_client import RetryPolicy, ServerError
from webhook_broker_client._http import HttpClient, parse_retry_after

# A backoff far longer than any test may take: a test that ends in time waited Retry-After.
SLOW_BACKOFF = RetryPolicy(attempts=5, initial_delay=600.0, max_delay=600.0)
GENEROUS_TIMEOUT = 60.0


def test_a_503_with_retry_after_is_retried_after_it(broker: Broker, publisher: Publisher) -> None:
    outcome: list[str] = []
    with (
        flaky_proxy(broker.url, ["unavailable:0", "unavailable:0"]) as (url, script),
        publisher.producer(url, SLOW_BACKOFF) as producer,
    ):
        # In a daemon thread: were Retry-After ignored, the 10-minute backoff must not hang the run.
        thread = threading.Thread(
            target=lambda: outcome.append(producer.publish("after two 503s")), daemon=True
        )
        thread.start()
        thread.join(GENEROUS_TIMEOUT)
    assert outcome, "the publish waited the backoff, not the 503's Retry-After: 0"
    assert len(script.seen) == 3
    with admin_http(broker) as http:
        stored = http.request("GET", f"/channel/{publisher.channel_id}/message/{outcome[0]}")
    assert stored.json()["Payload"] == "after two 503s"


def test_a_503_retry_after_beyond_the_cap_is_raised_at_once(
    broker: Broker, publisher: Publisher
) -> None:
    with (
        flaky_proxy(broker.url, ["unavailable:3600"]) as (url, script),
        publisher.producer(url, RetryPolicy(max_retry_after=60.0)) as producer,
        pytest.raises(ServerError) as refused,
    ):
        producer.publish("not now")
    assert (refused.value.status, refused.value.retry_after, refused.value.tries) == (503, 3600, 1)
    assert len(script.seen) == 1


def test_a_get_honours_a_503_retry_after(broker: Broker) -> None:
    credentials = {"Authorization": f"Bearer {broker.admin_token}"}
    result: list[int] = []
    with (
        flaky_proxy(broker.url, ["unavailable:0"]) as (url, script),
        HttpClient(url, headers=credentials, retry=SLOW_BACKOFF) as http,
    ):
        thread = threading.Thread(
            target=lambda: result.append(http.request("GET", "/channels").status_code),
            daemon=True,
        )
        thread.start()
        thread.join(GENEROUS_TIMEOUT)
    assert result == [200]
    assert len(script.seen) == 2


def test_retry_after_is_seconds_or_an_http_date() -> None:
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after(" 0 ") == 0.0
    in_a_minute = format_datetime(datetime.now(UTC) + timedelta(minutes=1), usegmt=True)
    delay = parse_retry_after(in_a_minute)
    assert delay is not None
    assert 0 < delay <= 60
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT") == 0.0
    for unreadable in ("soon", "1.5", "-3", "", None):
        assert parse_retry_after(unreadable) is None
