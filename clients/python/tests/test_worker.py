"""The pull worker's outcomes against a live broker: what each one does to the job, as the admin
API shows it (Status, Attempts, LastError)."""

from __future__ import annotations

import logging
import signal
import threading
from collections import Counter

import pytest

from tests.conftest import Broker
from tests.pull_setup import TOKEN, eventually, pull_consumer, running
from webhook_broker_client import Defer, Job, Reject, Retry
from webhook_broker_client._http import HttpClient


def test_a_handler_that_returns_delivers_the_job(broker: Broker) -> None:
    pull = pull_consumer(broker)
    [message_id] = pull.publish(1)
    seen: list[Job] = []
    with running(pull.worker(), seen.append):
        eventually(lambda: pull.job(message_id)["Status"] == "DELIVERED")
    job = pull.job(message_id)
    assert job["Attempts"] == 1
    [handled] = seen
    assert handled.message_id == message_id
    assert handled.payload == message_id.encode()
    assert handled.attempts == 1
    assert handled.content_type.startswith("text/plain")
    assert handled.event_type is None


def test_retry_with_a_delay_gives_the_job_back_as_an_attempt(broker: Broker) -> None:
    pull = pull_consumer(broker)
    [message_id] = pull.publish(1)
    calls: list[int] = []

    def handler(job: Job) -> None:
        calls.append(job.attempts)
        raise Retry(delay=3600, reason="the ERP is busy")

    with running(pull.worker(), handler):
        eventually(lambda: pull.job(message_id)["Status"] == "QUEUED" and bool(calls))
    job = pull.job(message_id)
    assert job["Attempts"] == 1
    assert "the ERP is busy" in job["LastError"]
    assert calls == [1]  # not due again for an hour


def test_retry_without_a_delay_follows_the_consumers_schedule(broker: Broker) -> None:
    pull = pull_consumer(broker, retry_delays="1,1")
    [message_id] = pull.publish(1)
    attempts: list[int] = []

    def handler(job: Job) -> None:
        attempts.append(job.attempts)
        if len(attempts) < 3:
            raise Retry()

    with running(pull.worker(), handler):
        eventually(lambda: pull.job(message_id)["Status"] == "DELIVERED")
    assert attempts == [1, 2, 3]
    assert pull.job(message_id)["Attempts"] == 3


def test_reject_makes_the_job_dead_at_once_with_the_reason(broker: Broker) -> None:
    pull = pull_consumer(broker, retry_delays="1,1")
    [message_id] = pull.publish(1)
    calls: list[str] = []

    def handler(job: Job) -> None:
        calls.append(job.id)
        raise Reject("order 7 has no customer")

    with running(pull.worker(), handler):
        eventually(lambda: pull.job(message_id)["Status"] == "DEAD")
    job = pull.job(message_id)
    assert job["Attempts"] == 1
    assert "order 7 has no customer" in job["LastError"]
    assert len(calls) == 1


def test_defer_gives_the_job_back_without_counting_the_attempt(broker: Broker) -> None:
    pull = pull_consumer(broker, retry_delays="1")  # two attempts: counted, three would kill it
    [message_id] = pull.publish(1)
    attempts: list[int] = []

    def handler(job: Job) -> None:
        attempts.append(job.attempts)
        if len(attempts) < 4:
            raise Defer()

    with running(pull.worker(), handler):
        eventually(lambda: pull.job(message_id)["Status"] == "DELIVERED")
    assert attempts == [1, 1, 1, 1]
    assert pull.job(message_id)["Attempts"] == 1


def test_defer_with_a_delay_leaves_the_job_queued_unattempted(broker: Broker) -> None:
    pull = pull_consumer(broker)
    [message_id] = pull.publish(1)
    calls: list[str] = []

    def handler(job: Job) -> None:
        calls.append(job.id)
        raise Defer(delay=3600)

    with running(pull.worker(), handler):
        eventually(lambda: bool(calls) and pull.job(message_id)["Status"] == "QUEUED")
    job = pull.job(message_id)
    assert job["Attempts"] == 0
    assert "unstarted" in job["LastError"]


def test_an_exception_is_retried_logged_and_dead_as_poison_after_the_attempts(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    pull = pull_consumer(broker, retry_delays="1,1")  # three attempts
    [message_id] = pull.publish(1)
    calls: Counter[str] = Counter()

    def handler(job: Job) -> None:
        calls[job.id] += 1
        raise KeyError("no such order")

    with (
        caplog.at_level(logging.ERROR, "webhook_broker_client.worker"),
        running(pull.worker(), handler),
    ):
        eventually(lambda: pull.job(message_id)["Status"] == "DEAD")
    job = pull.job(message_id)
    assert job["Attempts"] == 3
    assert "no attempts left" in job["LastError"]
    assert list(calls.values()) == [3]
    failures = [r for r in caplog.records if r.name == "webhook_broker_client.worker"]
    assert len(failures) == 3
    assert all(r.exc_info and r.exc_info[0] is KeyError for r in failures)


def test_a_binary_payload_reaches_the_handler_as_its_bytes(broker: Broker) -> None:
    pull = pull_consumer(broker)

    raw = bytes(range(256))
    headers = {
        "X-Broker-Channel-Token": TOKEN,
        "X-Broker-Producer-ID": pull.producer,
        "X-Broker-Producer-Token": TOKEN,
        "X-Broker-Message-ID": "binary",
        "Content-Type": "application/octet-stream",
    }
    with HttpClient(broker.url, headers=headers) as http:
        http.request("POST", f"/channel/{pull.channel}/broadcast", content=raw)
    seen: list[Job] = []
    with running(pull.worker(), seen.append):
        eventually(lambda: pull.job("binary")["Status"] == "DELIVERED")
    assert seen[0].payload == raw
    assert seen[0].content_type == "application/octet-stream"


def test_run_in_the_main_thread_restores_the_signal_handlers(broker: Broker) -> None:
    pull = pull_consumer(broker)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    worker = pull.worker(wait_seconds=0.5)
    during: list[object] = []

    def stop_soon() -> None:
        eventually(lambda: signal.getsignal(signal.SIGTERM) is not before[0])
        during.append(signal.getsignal(signal.SIGTERM))
        worker.stop()

    threading.Thread(target=stop_soon).start()
    worker.run(lambda job: None)
    assert during
    assert during[0] is not before[0]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
