"""The pull worker against what goes wrong on its side: exception texts the broker cannot store,
a report the broker refuses, answers that are not the broker's, and a stop while jobs wait."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from tests.conftest import Broker
from tests.flaky_proxy import flaky_proxy
from tests.pull_setup import eventually, pull_consumer, running
from tests.recording_proxy import recording_proxy
from webhook_broker_client import Job

LOGGER = "webhook_broker_client.worker"


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_errors_the_broker_cannot_store_do_not_lose_the_batch(broker: Broker) -> None:
    pull = pull_consumer(broker, retry_delays="3600")  # a retried job is not due for an hour
    message_ids = pull.publish(8)
    failures = {
        message_ids[1]: ValueError("bad\x00byte"),
        message_ids[4]: ValueError("x" * 5000),
        message_ids[6]: ValueError("lone \ud800 surrogate"),
        message_ids[7]: Unprintable(),
    }
    handled: list[str] = []

    def handler(job: Job) -> None:
        handled.append(job.message_id)
        if job.message_id in failures:
            raise failures[job.message_id]

    with running(pull.worker(concurrency=2, prefetch=6), handler):  # one batch of 8
        eventually(lambda: len(handled) == 8, what="8 jobs handled")
        eventually(lambda: all(pull.job(m)["Status"] == "QUEUED" for m in failures))
        eventually(lambda: pull.all_delivered([m for m in message_ids if m not in failures]))
    jobs = pull.jobs(list(failures))
    assert {job["Attempts"] for job in jobs.values()} == {1}
    assert "ValueError: bad\\x00byte" in jobs[message_ids[1]]["LastError"]
    assert "ValueError: xxx" in jobs[message_ids[4]]["LastError"]
    assert jobs[message_ids[4]]["LastError"].endswith("x\u2026")
    assert "lone \\ud800 surrogate" in jobs[message_ids[6]]["LastError"]
    assert "Unprintable: (its text could not be read)" in jobs[message_ids[7]]["LastError"]


def test_a_refused_report_is_sent_again_one_by_one(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    pull = pull_consumer(broker)
    message_ids = pull.publish(5)
    bad = message_ids[2]
    job_ids: dict[str, str] = {}

    def handler(job: Job) -> None:
        job_ids[job.message_id] = job.id

    def spoil(what: str, body: bytes) -> bytes:
        """The report item of one job gets an Error the broker refuses, wherever it is sent."""
        if what != "report":
            return body
        report = json.loads(body)
        for item in report["Jobs"]:
            if item["ID"] == job_ids.get(bad):
                item["NextState"], item["Error"] = "DEAD", "y" * 1001
        return json.dumps(report).encode()

    with recording_proxy(broker.url) as proxy, caplog.at_level(logging.WARNING, LOGGER):
        proxy.rewrite = spoil
        with running(pull.worker(proxy.url, concurrency=1, prefetch=4), handler):
            eventually(lambda: pull.all_delivered([m for m in message_ids if m != bad]))
    assert pull.job(bad)["Status"] == "INFLIGHT"  # until its lease ends: lost, not the batch
    assert any("one by one" in record.getMessage() for record in caplog.records)
    [refused] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert job_ids[bad] in refused.getMessage()


def test_an_answer_that_is_not_the_brokers_ends_the_run_after_a_wind_down(
    broker: Broker,
) -> None:
    pull = pull_consumer(broker)
    [message_id] = pull.publish(1)
    handled: list[str] = []

    def slow(job: Job) -> None:
        time.sleep(1.5)
        handled.append(job.message_id)

    # The first claim reaches the broker; the next (a slot is free) gets a proxy's HTML page.
    with flaky_proxy(broker.url, ["forward", "garbage"]) as (url, _):
        worker = pull.worker(url, concurrency=2)
        with pytest.raises(json.JSONDecodeError):
            worker.run(slow)
    assert handled == [message_id]
    assert pull.job(message_id)["Status"] == "DELIVERED"  # reported by the wind-down
    keepers = [t for t in threading.enumerate() if t.name == "webhook-worker-leases"]
    assert not any(thread.is_alive() for thread in keepers)


def test_the_lease_keeper_outlives_an_answer_that_is_not_the_brokers(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    pull = pull_consumer(broker)
    [message_id] = pull.publish(1)
    calls: list[str] = []

    def slow(job: Job) -> None:
        calls.append(job.id)
        time.sleep(5)  # two and a half leases of 2 s

    # One claim (the only slot is busy meanwhile), then the first extension gets an HTML page.
    with (
        flaky_proxy(broker.url, ["forward", "garbage"]) as (url, _),
        caplog.at_level(logging.ERROR, LOGGER),
        running(pull.worker(url, lease_seconds=2), slow),
    ):
        eventually(lambda: bool(calls), what="the job started")
        with running(pull.worker(lease_seconds=2), slow):  # a rival, would it be swept
            eventually(lambda: pull.job(message_id)["Status"] == "DELIVERED")
    assert len(calls) == 1
    assert pull.job(message_id)["Attempts"] == 1
    assert any("lease keeper" in record.getMessage() for record in caplog.records)


def test_a_stop_starts_no_waiting_job(broker: Broker) -> None:
    pull = pull_consumer(broker)
    message_ids = pull.publish(4)
    worker = pull.worker(concurrency=1, prefetch=3)
    handled: list[str] = []

    def handler(job: Job) -> None:
        handled.append(job.message_id)
        worker.stop()  # three jobs wait: none of them may start now

    with running(worker, handler) as thread:
        thread.join(timeout=60)
    [first] = handled
    jobs = pull.jobs(message_ids)
    assert jobs[first]["Status"] == "DELIVERED"
    rest = [jobs[m] for m in message_ids if m != first]
    assert [(job["Status"], job["Attempts"]) for job in rest] == [("QUEUED", 0)] * 3
