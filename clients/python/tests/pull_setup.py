"""Channels, pull consumers and messages for the worker's tests, made over the broker's real API
(plain requests through the client's HTTP layer, so these tests need nothing but the worker)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tests.conftest import Broker, unique
from webhook_broker_client import Job, Worker
from webhook_broker_client._http import HttpClient

TOKEN = "worker-test-token"


@dataclass(frozen=True)
class PullConsumer:
    broker: Broker
    channel: str
    consumer: str
    producer: str

    def worker(self, url: str | None = None, **options: Any) -> Worker:
        """A Worker for this consumer, through `url` (a proxy) or straight to the broker."""
        base = url or self.broker.url
        options.setdefault("wait_seconds", 1)  # a stop waits for a claim under way: keep it short
        return Worker(base, self.channel, self.consumer, TOKEN, TOKEN, **options)

    def publish(self, count: int, prefix: str = "m") -> list[str]:
        """`count` messages (one request), their IDs in order; each payload is its ID."""
        ids = [f"{prefix}-{n:04d}" for n in range(count)]
        messages = [{"id": message_id, "payload": message_id} for message_id in ids]
        headers = {
            "X-Broker-Channel-Token": TOKEN,
            "X-Broker-Producer-ID": self.producer,
            "X-Broker-Producer-Token": TOKEN,
        }
        with HttpClient(self.broker.url, headers=headers) as http:
            for start in range(0, count, 1000):
                body = {"messages": messages[start : start + 1000]}
                http.request("POST", f"/channel/{self.channel}/broadcast-batch", json=body)
        return ids

    def job(self, message_id: str) -> dict[str, Any]:
        """This consumer's job of a message, as the admin API shows it (Status, Attempts,
        LastError)."""
        with admin(self.broker) as http:
            message = http.request("GET", f"/channel/{self.channel}/message/{message_id}").json()
        [job] = message["Jobs"]
        return dict(job)

    def jobs(self, message_ids: list[str]) -> dict[str, dict[str, Any]]:
        return {message_id: self.job(message_id) for message_id in message_ids}

    def all_delivered(self, message_ids: list[str]) -> bool:
        """Whether every message's job is DELIVERED (asks until the first that is not)."""
        return all(self.job(message_id)["Status"] == "DELIVERED" for message_id in message_ids)


def admin(broker: Broker) -> HttpClient:
    return HttpClient(broker.url, headers={"Authorization": f"Bearer {broker.admin_token}"})


def pull_consumer(broker: Broker, retry_delays: str = "1,1") -> PullConsumer:
    """A fresh channel, producer and pull consumer (`retryDelays` seconds: len + 1 attempts)."""
    channel, consumer, producer = unique("ch"), unique("pull"), unique("prod")
    with admin(broker) as http:
        form = {"name": producer, "token": TOKEN}
        http.request("PUT", f"/producer/{producer}", data=form)
        http.request("PUT", f"/channel/{channel}", data={"name": channel, "token": TOKEN})
        form = {
            "name": consumer,
            "token": TOKEN,
            "type": "pull",
            "callbackUrl": "http://127.0.0.1:9/unused",
            "retryDelays": retry_delays,
        }
        http.request("PUT", f"/channel/{channel}/consumer/{consumer}", data=form)
    return PullConsumer(broker, channel, consumer, producer)


def eventually(check: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    """Poll until `check()` holds (generous: the machine may be busy), else fail."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what or check}")
        time.sleep(0.1)


@contextmanager
def running(worker: Worker, handler: Callable[[Job], object]) -> Iterator[threading.Thread]:
    """The worker running in a thread of its own; stopped, and seen to return, on leaving."""
    thread = threading.Thread(target=worker.run, args=(handler,), name="test-worker")
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(timeout=90)
        assert not thread.is_alive(), "the worker did not return after stop()"
