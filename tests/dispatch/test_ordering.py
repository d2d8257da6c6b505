"""Ordered consumers: one key's messages one at a time, in publish order (docs/delivery.md,
"Ordering")."""

from __future__ import annotations

import signal
from collections import defaultdict
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from broker import publish
from consumers.models import Consumer
from jobs.models import Job
from jobs.states import DEAD, DELIVERED, QUEUED
from tests.delivery import push_consumer, run_once
from tests.helpers import make_channel, make_consumer, make_producer
from tests.processes import start_dispatcher, wait_until
from tests.receiver import Received, Reply

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def short_retries(settings):
    settings.BROKER_RETRY_JITTER = 0
    settings.BROKER_RETRY_DELAYS = [60, 600]
    settings.BROKER_CIRCUIT_FAILURE_THRESHOLD = 0  # the circuit has tests of its own


def ordered_consumer(channel, receiver, **fields) -> Consumer:
    return push_consumer(channel, receiver, ordering=Consumer.Ordering.ORDERED, **fields)


def claimed_ids(dispatcher) -> list[str]:
    return sorted(r.headers["X-Broker-Message-ID"] for r in dispatcher.claim(100))


def test_only_the_head_of_each_key_is_claimed(channel, receiver, dispatcher):
    ordered_consumer(channel, receiver)
    for message_id, key in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b"), ("x1", "")]:
        publish(channel, b"x", producer="shop", message_id=message_id, ordering_key=key)

    assert claimed_ids(dispatcher) == ["a1", "b1", "x1"]
    assert claimed_ids(dispatcher) == []  # the heads are in flight: their keys wait


def test_the_next_message_of_a_key_follows_its_delivery(channel, receiver, dispatcher):
    ordered_consumer(channel, receiver)
    for number in range(3):
        publish(channel, b"x", producer="shop", message_id=f"m{number}", ordering_key="k")

    for number in range(3):
        [result] = run_once(dispatcher)
        assert Job.objects.get(pk=result.job_id).message.public_id == f"m{number}"
    assert [r.headers["X-Broker-Message-ID"] for r in receiver.received] == ["m0", "m1", "m2"]


def test_a_failing_head_blocks_only_its_own_key(channel, receiver, dispatcher):
    ordered_consumer(channel, receiver)
    receiver.rule = lambda r: Reply(500) if r.headers["X-Broker-Message-ID"] == "a1" else None
    for message_id, key in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b")]:
        publish(channel, b"x", producer="shop", message_id=message_id, ordering_key=key)

    run_once(dispatcher)  # a1 fails and waits 60 s; b1 is delivered
    run_once(dispatcher)  # b2; a2 stays behind its failing head

    delivered = [r.headers["X-Broker-Message-ID"] for r in receiver.received]
    assert sorted(delivered) == ["a1", "b1", "b2"]
    assert Job.objects.get(message__public_id="a2").status == QUEUED
    assert dispatcher.claim(10) == []
    with time_machine.travel(timezone.now() + timedelta(seconds=61)):
        receiver.rule = None
        run_once(dispatcher)  # a1 again, delivered
        run_once(dispatcher)  # then a2
    assert Job.objects.filter(status=DELIVERED).count() == 4


def test_a_dead_head_unblocks_the_next(channel, receiver, dispatcher):
    ordered_consumer(channel, receiver, retry_delays=[])  # one attempt only
    receiver.rule = lambda r: Reply(500) if r.headers["X-Broker-Message-ID"] == "a1" else None
    publish(channel, b"x", producer="shop", message_id="a1", ordering_key="a")
    publish(channel, b"x", producer="shop", message_id="a2", ordering_key="a")

    run_once(dispatcher)
    assert Job.objects.get(message__public_id="a1").status == DEAD
    assert claimed_ids(dispatcher) == ["a2"]


def test_unordered_consumers_ignore_keys(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    for number in range(3):
        publish(channel, b"x", producer="shop", message_id=f"m{number}", ordering_key="k")

    assert claimed_ids(dispatcher) == ["m0", "m1", "m2"]


@pytest.mark.django_db(transaction=True)
def test_two_dispatchers_never_deliver_a_key_out_of_order(receiver):
    """Three keys, a failing head on one of them, two dispatcher processes."""
    make_producer()
    channel = make_channel()
    consumer = make_consumer(channel)
    consumer.callback_url = receiver.url()
    consumer.ordering = Consumer.Ordering.ORDERED
    consumer.save()

    def rule(request: Received) -> Reply:
        # The head of key a fails until both other keys are through: it would never get through
        # if it blocked them.
        others_done = {"b-29", "c-29"} <= {
            r.headers["X-Broker-Message-ID"] for r in receiver.received
        }
        if request.headers["X-Broker-Message-ID"] == "a-0" and not others_done:
            return Reply(503)
        return Reply(200, delay=0.002)

    receiver.rule = rule
    for number in range(30):
        for key in "abc":
            publish(channel, b"x", producer="shop", message_id=f"{key}-{number}", ordering_key=key)
    environment = {
        "BROKER_RETRY_DELAYS": ",".join(["1"] * 30),
        "BROKER_RETRY_JITTER": "0",
        "BROKER_CIRCUIT_FAILURE_THRESHOLD": "0",
    }
    dispatchers = [start_dispatcher("--poll-seconds", "0.2", **environment) for _ in range(2)]
    try:
        wait_until(lambda: Job.objects.filter(status=DELIVERED).count() == 90, seconds=60)
    finally:
        for process in dispatchers:
            process.send_signal(signal.SIGTERM)
        for process in dispatchers:
            process.communicate(timeout=30)

    arrivals = defaultdict(list)
    for request in receiver.received:
        key, number = request.headers["X-Broker-Message-ID"].split("-")
        arrivals[key].append(int(number))
    # Each key: every message after the previous one, the failing head repeated in place.
    tries_of_the_head = arrivals["a"].count(0)
    assert tries_of_the_head >= 2
    assert arrivals["a"] == [0] * tries_of_the_head + list(range(1, 30))
    assert arrivals["b"] == list(range(30))
    assert arrivals["c"] == list(range(30))


def test_an_ordered_pull_consumer_claims_only_heads(channel):
    from jobs.queue import claim_for_pull

    consumer = make_consumer(channel, "puller", type=Consumer.Type.PULL)
    consumer.ordering = Consumer.Ordering.ORDERED
    consumer.save()
    for message_id, key in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
        publish(channel, b"x", producer="shop", message_id=message_id, ordering_key=key)

    first = claim_for_pull(consumer, limit=10, lease_seconds=30)
    assert sorted(job.message.public_id for job in first) == ["a1", "b1"]
    assert claim_for_pull(consumer, limit=10, lease_seconds=30) == []
    next(job for job in first if job.message.public_id == "a1").mark_delivered()
    assert [job.message.public_id for job in claim_for_pull(consumer, 10, 30)] == ["a2"]
