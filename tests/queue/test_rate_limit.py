"""The delivery rate limit per consumer and 429 throttling (docs/delivery.md, "Rate limit"), through
the queue's claim, and across two dispatchers' claims at once."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from consumers.models import Consumer
from jobs import queue
from jobs.delivery import AttemptResult
from jobs.models import Job
from jobs.queue import ClaimedJob
from jobs.retry import MAX_THROTTLE_SECONDS, Verdict, decide
from jobs.states import INFLIGHT, QUEUED
from tests.helpers import make_consumer
from tests.queue.test_queue import publish

pytestmark = pytest.mark.django_db
NOW = timezone.now().replace(microsecond=0)


def paced_consumer(channel, consumer_id: str = "billing", per_second: float = 2) -> Consumer:
    consumer = make_consumer(channel, consumer_id)
    consumer.max_per_second = per_second
    consumer.save()
    return consumer


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def claims(now, limit: int = 100) -> list[tuple[str, object]]:
    """(message ID, send time) of what a claim at `now` hands out, in its order."""
    return [(job.message.message_id, job.send_at) for job in queue.claim_for_push(limit, now)]


def test_a_claim_books_slots_one_second_ahead_spaced_by_the_rate(channel):
    consumer = paced_consumer(channel, per_second=2)
    for n in range(5):
        publish(f"m-{n}")

    assert claims(NOW) == [("m-0", NOW), ("m-1", NOW + seconds(0.5))]
    # Held back: QUEUED, no attempt used.
    assert set(Job.objects.filter(status=QUEUED).values_list("attempts", flat=True)) == {0}
    assert Job.objects.filter(status=QUEUED).count() == 3
    consumer.refresh_from_db()
    assert consumer.next_slot_at == NOW + seconds(1)

    # A tenth of a second later the slot at +1 s is within the horizon; the next one is not.
    assert claims(NOW + seconds(0.1)) == [("m-2", NOW + seconds(1))]
    assert claims(NOW + seconds(0.2)) == []
    assert claims(NOW + seconds(0.6)) == [("m-3", NOW + seconds(1.5))]


def test_jobs_held_back_keep_their_order(channel):
    paced_consumer(channel, per_second=1)
    for n in range(4):
        publish(f"m-{n}", priority=1 if n == 3 else 0)

    taken = [message_id for n in range(4) for message_id, _ in claims(NOW + seconds(n))]

    assert taken == ["m-3", "m-0", "m-1", "m-2"]  # priority first, then publish order


def test_slots_left_unused_are_not_saved_up_for_a_burst(channel):
    consumer = paced_consumer(channel, per_second=2)
    consumer.next_slot_at = NOW - timedelta(hours=1)
    consumer.save()
    for n in range(5):
        publish(f"m-{n}")

    assert claims(NOW) == [("m-0", NOW), ("m-1", NOW + seconds(0.5))]


def test_a_slow_rate_still_books_one_slot(channel):
    paced_consumer(channel, per_second=0.1)
    publish("m-0")
    publish("m-1")

    assert claims(NOW) == [("m-0", NOW)]
    assert claims(NOW + seconds(9.5)) == [("m-1", NOW + seconds(10))]


def test_the_in_flight_cap_and_the_claim_limit_use_only_the_slots_of_jobs_taken(channel):
    consumer = paced_consumer(channel, per_second=10)
    for n in range(20):
        publish(f"m-{n}")

    assert len(claims(NOW, limit=3)) == 3
    consumer.refresh_from_db()
    assert consumer.next_slot_at == NOW + seconds(0.3)


def test_an_unlimited_consumer_is_not_held_back(channel):
    paced_consumer(channel, "slow", per_second=1)
    make_consumer(channel, "fast")
    for n in range(5):
        publish(f"m-{n}")

    handed = queue.claim_for_push(100, NOW)

    fast = [job for job in handed if job.send_at is None]
    assert len(fast) == 5
    assert len(handed) == 6


def first_claimed_of(consumer: Consumer) -> ClaimedJob:
    """Claim one job at a time until one of `consumer`'s comes: which consumer's job a claim of
    one takes first is the queue's choice."""
    for _ in range(Job.objects.count()):
        claimed = queue.claim_for_push(1, NOW)
        if claimed and claimed[0].consumer_id == consumer.pk:
            return claimed[0]
    raise AssertionError(f"no job of {consumer} was claimed")


def test_a_429_with_retry_after_holds_back_every_job_of_its_consumer(channel):
    throttled = make_consumer(channel, "billing")
    make_consumer(channel, "audit")
    for n in range(3):
        publish(f"m-{n}")
    first = first_claimed_of(throttled)
    # The claims of one that found it may have taken every audit job: two more of each.
    for n in range(3, 5):
        publish(f"m-{n}")
    result = AttemptResult(
        first.job_id,
        first.partition_at,
        first.attempt,
        throttled.pk,
        NOW,
        5.0,
        status_code=429,
        retry_after=30,
    )
    outcome = decide(result, throttled, NOW)
    queue.record_outcomes([result], {first.job_id: outcome}, "test", NOW)

    throttled.refresh_from_db()
    assert throttled.throttled_until == NOW + seconds(30)
    during = queue.claim_for_push(100, NOW + seconds(10))
    assert {job.consumer_id for job in during} == {Consumer.objects.get(public_id="audit").pk}
    waiting = Job.objects.filter(consumer=throttled, status=QUEUED).exclude(pk=first.job_id)
    assert set(waiting.values_list("attempts", flat=True)) == {0}

    after = queue.claim_for_push(100, NOW + seconds(31))
    assert {job.job_id for job in after} >= set(waiting.values_list("pk", flat=True))


def test_a_later_throttle_is_not_shortened_by_a_shorter_retry_after(channel):
    consumer = make_consumer(channel)
    consumer.throttled_until = NOW + seconds(60)
    consumer.save()
    publish("m-0")
    Job.objects.update(status=INFLIGHT, attempts=1)
    job = Job.objects.get()
    result = AttemptResult(
        job.pk, job.partition_at, 1, consumer.pk, NOW, 5.0, status_code=429, retry_after=5
    )

    queue.record_outcomes([result], {job.pk: decide(result, consumer, NOW)}, "t", NOW)

    consumer.refresh_from_db()
    assert consumer.throttled_until == NOW + seconds(60)


@pytest.mark.parametrize(
    ("status", "retry_after", "held_for"),
    [
        (429, 30.0, 30),
        (429, 86400.0, MAX_THROTTLE_SECONDS),
        (429, None, None),  # no Retry-After: only the job waits, by the retry policy
        (503, 30.0, None),  # unavailability: the circuit breaker's to judge
    ],
)
def test_which_answers_throttle_a_consumer(channel, status, retry_after, held_for):
    consumer = make_consumer(channel)
    result = AttemptResult(
        1, NOW, 1, consumer.pk, NOW, 5.0, status_code=status, retry_after=retry_after
    )

    outcome = decide(result, consumer, NOW)

    assert outcome.verdict is Verdict.RETRY
    expected = None if held_for is None else NOW + seconds(held_for)
    assert outcome.throttle_until == expected


@pytest.mark.django_db(transaction=True)
def test_a_claim_skips_a_consumer_another_claim_is_booking_without_waiting(channel):
    """While one dispatcher's claim holds the paced consumer's row, another claim takes nothing
    of that consumer but everybody else's jobs, at once; the next claim books after the first
    one's slots, reading the row as the first left it."""
    consumer = paced_consumer(channel, per_second=2)
    unlimited = make_consumer(channel, "audit")
    for n in range(5):
        publish(f"m-{n}")
    first_claimed = threading.Event()
    first_may_commit = threading.Event()
    second: list[list[tuple[int, object]]] = []

    def first_dispatcher() -> None:
        try:
            with transaction.atomic():
                [job] = queue.claim_for_push(1, NOW)
                assert (job.consumer_id, job.send_at) == (consumer.pk, NOW)
                first_claimed.set()
                assert first_may_commit.wait(300)  # longer than the second claim is given
        finally:
            connections.close_all()

    def second_dispatcher() -> None:
        try:
            second.append([(j.consumer_id, j.send_at) for j in queue.claim_for_push(100, NOW)])
        finally:
            connections.close_all()

    Consumer.objects.filter(pk=unlimited.pk).update(paused=True)  # the first claim takes m-0
    first = threading.Thread(target=first_dispatcher)
    first.start()
    assert first_claimed.wait(60)
    Consumer.objects.filter(pk=unlimited.pk).update(paused=False)
    other = threading.Thread(target=second_dispatcher)
    other.start()
    other.join(30)  # a claim takes milliseconds; one that waited for the lock would still be here
    still_waiting = other.is_alive()
    first_may_commit.set()
    first.join(60)
    other.join(60)

    assert not still_waiting, "the second claim waited for the first one's lock"
    assert second == [[(unlimited.pk, None)] * 5]
    consumer.refresh_from_db()
    assert consumer.next_slot_at == NOW + seconds(0.5)
    assert claims(NOW) == [("m-1", NOW + seconds(0.5))]
