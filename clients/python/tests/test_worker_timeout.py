"""A hung handler and `job_timeout`: past it the worker gives the job up, the broker takes it
back when its lease ends (an attempt), another handler gets it, and the late outcome is dropped."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from tests.conftest import Broker
from tests.pull_setup import eventually, pull_consumer, running
from tests.recording_proxy import recording_proxy
from webhook_broker_client import Job, Reject

LOGGER = "webhook_broker_client.worker"


def test_a_hung_handler_gives_its_job_up_to_another_worker(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    pull = pull_consumer(broker, retry_delays="1")
    [message_id] = pull.publish(1)
    hung: list[int] = []
    returned = threading.Event()

    def hangs(job: Job) -> None:
        hung.append(job.attempts)
        time.sleep(8)
        returned.set()
        raise Reject("too late")  # were it reported, the job would not stay DELIVERED

    quick: list[int] = []
    with recording_proxy(broker.url) as proxy, caplog.at_level(logging.WARNING, LOGGER):
        first = pull.worker(proxy.url, lease_seconds=2, job_timeout=3)
        with running(first, hangs):
            eventually(lambda: bool(hung), what="the first worker has the job")
            with running(pull.worker(lease_seconds=2), lambda job: quick.append(job.attempts)):
                eventually(lambda: pull.job(message_id)["Status"] == "DELIVERED")
            eventually(returned.is_set, what="the hung handler returned")
        reports = proxy.count("report")  # the stop reported everything the first worker had
    assert (hung, quick) == ([1], [2])
    job = pull.job(message_id)
    assert (job["Status"], job["Attempts"]) == ("DELIVERED", 2)
    assert reports == 0
    messages = [record.getMessage() for record in caplog.records]
    assert any("job_timeout" in text and job["ID"] in text for text in messages)
    assert any("is dropped" in text for text in messages)


def test_a_job_claimed_again_by_the_same_worker_keeps_both_handlers_apart(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    pull = pull_consumer(broker, retry_delays="1")
    [message_id] = pull.publish(1)
    calls: list[int] = []
    returned = threading.Event()
    together = threading.Barrier(2, timeout=30)

    def handler(job: Job) -> None:
        calls.append(job.attempts)
        if job.message_id != message_id:
            together.wait()  # both handler threads must still serve
        elif job.attempts == 1:
            time.sleep(8)  # hung: given up after 3 s, claimed again by this worker's free slot
            returned.set()
            raise Reject("too late")

    worker = pull.worker(lease_seconds=2, job_timeout=3, concurrency=2)
    with caplog.at_level(logging.WARNING, LOGGER), running(worker, handler):
        eventually(lambda: pull.job(message_id)["Status"] == "DELIVERED")
        eventually(returned.is_set, what="the hung handler returned")
        later = pull.publish(2, prefix="later")
        eventually(lambda: pull.all_delivered(later))
    assert calls[:2] == [1, 2]
    job = pull.job(message_id)
    assert (job["Status"], job["Attempts"]) == ("DELIVERED", 2)
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
