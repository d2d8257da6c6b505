"""Producer against the live broker: what each keyword becomes, batches, retries, refusals."""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.conftest import Broker, Publisher, admin_http, unique
from tests.flaky_proxy import flaky_proxy
from webhook_broker_client import (
    BadRequest,
    BrokerError,
    BrokerUnavailable,
    Conflict,
    NotFound,
    RetryPolicy,
    Unauthorized,
)
from webhook_broker_client.producer import AsyncProducer, BatchMessage

FAST = RetryPolicy(attempts=5, initial_delay=0.01, max_delay=0.05)
FAR_FUTURE = datetime(2099, 1, 31, 12, 0, tzinfo=UTC)


def read(broker: Broker, path: str) -> Any:
    with admin_http(broker) as http:
        return http.request("GET", path).json()


def message(broker: Broker, publisher: Publisher, message_id: str) -> Any:
    return read(broker, f"/channel/{publisher.channel_id}/message/{message_id}")


def payload_bytes(stored: Any) -> bytes:
    """A message's payload as bytes: base64 when it is not UTF-8 (docs/api.md, "Messages")."""
    if stored["PayloadEncoding"] == "base64":
        return base64.b64decode(stored["Payload"])
    return str(stored["Payload"]).encode()


def test_publish_returns_the_id_of_the_stored_message(broker: Broker, publisher: Publisher) -> None:
    with publisher.producer(broker.url, FAST) as producer:
        message_id = producer.publish(b"\x00binary\xff")
    stored = message(broker, publisher, message_id)
    assert stored["ID"] == message_id
    assert payload_bytes(stored) == b"\x00binary\xff"
    assert stored["ContentType"] == "application/octet-stream"


def test_every_keyword_reaches_the_message(broker: Broker, publisher: Publisher) -> None:
    message_id = unique("order")
    with publisher.producer(broker.url, FAST) as producer:
        returned = producer.publish(
            '{"total": 3}',
            message_id=message_id,
            content_type="application/json",
            event_type="order.created",
            ordering_key="customer-7",
            priority=-5,
            headers={"X-Tenant": "acme"},
        )
    assert returned == message_id
    stored = message(broker, publisher, message_id)
    assert stored["Payload"] == '{"total": 3}'
    assert stored["ContentType"] == "application/json"
    assert stored["EventType"] == "order.created"
    assert stored["Priority"] == -5
    assert stored["Headers"] == {"X-Tenant": "acme"}


def test_a_scheduled_message_keeps_every_keyword(broker: Broker, publisher: Publisher) -> None:
    with publisher.producer(broker.url, FAST) as producer:
        message_id = producer.publish(
            {"total": 3},
            event_type="order.created",
            ordering_key="customer-7",
            priority=9,
            scheduled_for=FAR_FUTURE,
            headers={"X-Tenant": "acme"},
        )
    stored = read(broker, f"/channel/{publisher.channel_id}/scheduled-message/{message_id}")
    assert stored["messageId"] == message_id
    assert stored["payload"] == '{"total":3}'
    assert stored["contentType"] == "application/json"
    assert stored["orderingKey"] == "customer-7"
    assert stored["eventType"] == "order.created"
    assert stored["priority"] == 9
    assert stored["headers"] == {"X-Tenant": "acme"}
    assert datetime.fromisoformat(stored["dispatchSchedule"]) == FAR_FUTURE


def test_text_is_sent_as_utf8_text(broker: Broker, publisher: Publisher) -> None:
    with publisher.producer(broker.url, FAST) as producer:
        message_id = producer.publish("héllo")
    stored = message(broker, publisher, message_id)
    assert (stored["Payload"], stored["ContentType"]) == ("héllo", "text/plain; charset=utf-8")


def test_a_batch_is_stored_in_order_with_its_fields(broker: Broker, publisher: Publisher) -> None:
    batch = [
        BatchMessage("first", message_id=unique("b"), event_type="a.b", priority=3),
        BatchMessage(b"\x01\x02", content_type="application/x-raw", headers={"X-Tenant": "t"}),
        BatchMessage({"n": 1}, ordering_key="k", scheduled_for=FAR_FUTURE),
    ]
    with publisher.producer(broker.url, FAST) as producer:
        ids = producer.publish_batch(batch)
    assert ids[0] == batch[0].message_id
    assert len(set(ids)) == 3
    first, second = (message(broker, publisher, i) for i in ids[:2])
    assert (first["Payload"], first["EventType"], first["Priority"]) == ("first", "a.b", 3)
    assert payload_bytes(second) == b"\x01\x02"
    assert (second["ContentType"], second["Headers"]) == ("application/x-raw", {"X-Tenant": "t"})
    scheduled = read(broker, f"/channel/{publisher.channel_id}/scheduled-message/{ids[2]}")
    assert (scheduled["payload"], scheduled["orderingKey"]) == ('{"n":1}', "k")
    assert scheduled["contentType"] == "application/json"


def test_a_publish_is_retried_after_5xx_and_429_with_the_same_id(
    broker: Broker, publisher: Publisher
) -> None:
    with (
        flaky_proxy(broker.url, ["fail", "throttle", "reset", "fail"]) as (url, script),
        publisher.producer(url, FAST) as producer,
    ):
        message_id = producer.publish("once")
    assert len(script.seen) == 5
    assert {headers["X-Broker-Message-ID"] for _, _, headers in script.seen} == {message_id}
    assert message(broker, publisher, message_id)["Payload"] == "once"


def test_a_lost_answer_then_409_counts_as_success(broker: Broker, publisher: Publisher) -> None:
    with (
        flaky_proxy(broker.url, ["lose"]) as (url, script),
        publisher.producer(url, FAST) as producer,
    ):
        message_id = producer.publish("stored by the first try")
    assert len(script.seen) == 2  # the second try was answered 409: the broker had it
    assert message(broker, publisher, message_id)["Payload"] == "stored by the first try"


def test_a_batch_whose_answer_was_lost_is_not_stored_twice(
    broker: Broker, publisher: Publisher
) -> None:
    with (
        flaky_proxy(broker.url, ["lose"]) as (url, script),
        publisher.producer(url, FAST) as producer,
    ):
        ids = producer.publish_batch([BatchMessage("a"), BatchMessage("b")])
    assert len(script.seen) == 2
    assert [message(broker, publisher, i)["Payload"] for i in ids] == ["a", "b"]


def test_an_id_the_channel_has_counts_as_success(broker: Broker, publisher: Publisher) -> None:
    with publisher.producer(broker.url, FAST) as producer:
        first = producer.publish("first", message_id="same")
        again = producer.publish("second", message_id="same")
    assert first == again == "same"
    assert message(broker, publisher, "same")["Payload"] == "first"


@dataclass(frozen=True)
class CallsBackOnRetry(RetryPolicy):
    """The ordinary policy that also tells the test when a retry is about to happen."""

    on_retry: Callable[[], None] = lambda: None

    def delay_before_retry(self, failed_attempts: int, error: BrokerError) -> float | None:
        self.on_retry()
        return super().delay_before_retry(failed_attempts, error)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_refused_connection_is_retried(broker: Broker, publisher: Publisher) -> None:
    port = free_port()
    with ExitStack() as proxies:
        # Nothing listens on the port for the first try; the proxy opens it before the retry.
        def open_port() -> None:
            if not proxies._exit_callbacks:  # type: ignore[attr-defined]
                proxies.enter_context(flaky_proxy(broker.url, [], port=port))

        policy = CallsBackOnRetry(initial_delay=0.01, max_delay=0.05, on_retry=open_port)
        with publisher.producer(f"http://127.0.0.1:{port}", policy) as producer:
            message_id = producer.publish("after a refusal")
    assert message(broker, publisher, message_id)["Payload"] == "after a refusal"


def test_no_answer_after_every_try_is_broker_unavailable(publisher: Publisher) -> None:
    policy = RetryPolicy(attempts=2, initial_delay=0.01)
    url = f"http://127.0.0.1:{free_port()}"
    with publisher.producer(url, policy) as producer, pytest.raises(BrokerUnavailable) as e:
        producer.publish("nowhere")
    assert e.value.status is None
    assert "no answer from the broker" in str(e.value)


def test_refusals_carry_status_and_message(broker: Broker, publisher: Publisher) -> None:
    wrong = Publisher(publisher.channel_id, "wrong", publisher.producer_id, "wrong")
    with wrong.producer(broker.url, FAST) as producer, pytest.raises(Unauthorized) as e:
        producer.publish("x")
    assert e.value.status == 403
    assert "token" in e.value.message.lower()
    missing = Publisher("no-such-channel", "t", publisher.producer_id, "t")
    with missing.producer(broker.url, FAST) as producer, pytest.raises(NotFound) as unknown:
        producer.publish("x")
    assert unknown.value.status == 404


def test_a_bad_request_is_not_retried(broker: Broker, publisher: Publisher) -> None:
    with (
        flaky_proxy(broker.url, []) as (url, script),
        publisher.producer(url, FAST) as producer,
        pytest.raises(BadRequest) as e,
    ):
        producer.publish("x", event_type="not a type!")
    assert len(script.seen) == 1
    assert e.value.status == 400
    assert str(e.value) == f"HTTP 400: {e.value.message}"
    assert "X-Broker-Event-Type" in e.value.message or "event type" in e.value.message.lower()


def test_a_batch_naming_an_id_twice_is_a_conflict(broker: Broker, publisher: Publisher) -> None:
    twice = [BatchMessage("a", message_id="dup"), BatchMessage("b", message_id="dup")]
    with publisher.producer(broker.url, FAST) as producer, pytest.raises(Conflict) as e:
        producer.publish_batch(twice)
    assert e.value.body["duplicates"] == ["dup"]


def test_a_batch_partly_stored_before_is_a_conflict(broker: Broker, publisher: Publisher) -> None:
    with publisher.producer(broker.url, FAST) as producer:
        producer.publish("earlier", message_id="taken")
        with pytest.raises(Conflict):
            producer.publish_batch([BatchMessage("a", message_id="taken"), BatchMessage("b")])


def test_async_producer_publishes_and_retries(broker: Broker, publisher: Publisher) -> None:
    async def publish_all(url: str) -> tuple[str, list[str]]:
        async with AsyncProducer(
            url,
            publisher.channel_id,
            publisher.channel_token,
            publisher.producer_id,
            publisher.producer_token,
            retry=FAST,
        ) as producer:
            one = await producer.publish({"a": 1}, event_type="x.y", priority=2)
            many = await producer.publish_batch([BatchMessage("b"), BatchMessage("c")])
            return one, many

    with flaky_proxy(broker.url, ["fail", "lose"]) as (url, script):
        one, many = asyncio.run(publish_all(url))
    assert len(script.seen) == 4
    stored = message(broker, publisher, one)
    assert (stored["Payload"], stored["EventType"], stored["Priority"]) == ('{"a":1}', "x.y", 2)
    assert [message(broker, publisher, i)["Payload"] for i in many] == ["b", "c"]
