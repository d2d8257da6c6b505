"""The pull worker's batches, concurrency and leases against a live broker; the requests it sends
are counted on the wire by a recording proxy in front of the broker."""

from __future__ import annotations

import threading
import time
from collections import Counter

from tests.conftest import Broker
from tests.pull_setup import eventually, pull_consumer, running
from tests.recording_proxy import recording_proxy
from webhook_broker_client import Job, RetryPolicy


def test_a_backlog_costs_a_claim_and_a_report_per_batch(broker: Broker) -> None:
    pull = pull_consumer(broker)
    message_ids = pull.publish(200)
    handled: Counter[str] = Counter()
    with recording_proxy(broker.url) as proxy:
        worker = pull.worker(proxy.url, concurrency=2, prefetch=48)  # batches of 50
        with running(worker, lambda job: handled.update([job.message_id])):
            eventually(lambda: len(handled) == 200, what="200 jobs handled")
            eventually(lambda: pull.all_delivered(message_ids))
        claims = proxy.count("claim") - proxy.count("claim:empty")
        reports = proxy.count("report")
    assert set(handled.values()) == {1}
    # 4 batches of 50: a claim and a report each, give or take a batch split by the timing of
    # the handler threads (claims that found the queue empty, once it was, are not counted).
    # One job at a time would have been 400 requests.
    assert claims <= 6, claims
    assert reports <= 6, reports


def test_no_more_handlers_run_at_once_than_the_concurrency(broker: Broker) -> None:
    pull = pull_consumer(broker)
    message_ids = pull.publish(24)
    lock = threading.Lock()
    now_running, most_running, done = 0, 0, []

    def handler(job: Job) -> None:
        nonlocal now_running, most_running
        with lock:
            now_running += 1
            most_running = max(most_running, now_running)
        time.sleep(0.2)
        with lock:
            now_running -= 1
            done.append(job.message_id)

    with running(pull.worker(concurrency=3, prefetch=5), handler):
        eventually(lambda: len(done) == 24, what="24 jobs handled")
        eventually(lambda: pull.all_delivered(message_ids))
    assert most_running == 3
    assert sorted(done) == message_ids


def test_a_job_longer_than_its_lease_is_kept_and_handed_out_once(broker: Broker) -> None:
    pull = pull_consumer(broker)
    [message_id] = pull.publish(1)
    calls: list[str] = []

    def slow(job: Job) -> None:
        calls.append(job.id)
        time.sleep(6)  # three leases of 2 s: the sweep (about once a second) would take it back

    with recording_proxy(broker.url) as proxy:
        with running(pull.worker(proxy.url, lease_seconds=2), slow):
            eventually(lambda: bool(calls), what="the first worker has the job")
            # A rival that would claim the job the moment the sweep took it back.
            with running(pull.worker(proxy.url, lease_seconds=2), slow):
                eventually(lambda: pull.job(message_id)["Status"] == "DELIVERED")
        extensions = proxy.count("extend")
    assert len(calls) == 1
    assert pull.job(message_id)["Attempts"] == 1
    assert extensions >= 2


def test_the_worker_outlives_a_broker_that_fails_for_a_while(broker: Broker) -> None:
    pull = pull_consumer(broker)
    message_ids = pull.publish(3)
    quick = RetryPolicy(attempts=2, initial_delay=0.05, max_delay=0.1)
    handled: list[str] = []
    with recording_proxy(broker.url) as proxy:

        def handler(job: Job) -> None:
            handled.append(job.message_id)
            proxy.down = True  # the broker goes away before the outcome is reported

        with running(pull.worker(proxy.url, concurrency=1, prefetch=2, retry=quick), handler):
            eventually(lambda: proxy.count("report:refused") >= 2, what="reports refused")
            eventually(lambda: proxy.count("claim:refused") >= 2, what="claims refused")
            proxy.down = False
            eventually(lambda: pull.all_delivered(message_ids))
    assert sorted(handled) == message_ids
    assert {job["Attempts"] for job in pull.jobs(message_ids).values()} == {1}
