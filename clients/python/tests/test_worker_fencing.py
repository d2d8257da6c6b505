"""Fencing: a worker whose lease ran out while it could not reach the broker neither extends nor
moves the claim another worker made of the same job since (each item carries its `Attempts`)."""

from __future__ import annotations

import logging
import threading

import pytest

from tests.conftest import Broker
from tests.pull_setup import eventually, pull_consumer, running
from tests.recording_proxy import recording_proxy
from webhook_broker_client import Job, Retry, RetryPolicy

LOGGER = "webhook_broker_client.worker"


def test_a_worker_back_from_an_outage_leaves_the_new_claim_alone(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    pull = pull_consumer(broker, retry_delays="1,1")
    [message_id] = pull.publish(1)
    quick = RetryPolicy(attempts=2, initial_delay=0.05, max_delay=0.1)
    second_started, second_may_finish = threading.Event(), threading.Event()

    def second(job: Job) -> None:
        second_started.set()
        second_may_finish.wait(60)
        raise Retry(delay=3600, reason="the second worker's outcome")

    def claimed_again_seen() -> bool:
        return any("claimed again" in record.getMessage() for record in caplog.records)

    with recording_proxy(broker.url) as proxy, caplog.at_level(logging.WARNING, LOGGER):

        def first(job: Job) -> None:
            proxy.down = True  # no extension gets through: the lease runs out, the sweep takes it
            second_started.wait(60)  # ... and the second worker claims it again

        with running(pull.worker(proxy.url, lease_seconds=2, retry=quick), first):
            eventually(lambda: proxy.down, what="the first worker has the job")
            with running(pull.worker(lease_seconds=2), second):
                eventually(second_started.is_set, what="the second worker has the job")
                proxy.down = False  # the first worker's extension or report now gets through
                eventually(claimed_again_seen, what="the first worker told of the new claim")
                assert pull.job(message_id)["Status"] == "INFLIGHT"
                second_may_finish.set()
                eventually(lambda: pull.job(message_id)["Status"] == "QUEUED")
    job = pull.job(message_id)
    assert job["Attempts"] == 2
    assert "the second worker's outcome" in job["LastError"]
