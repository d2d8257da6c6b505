"""The rules every queue operation applies, written once: lease length, in-flight caps, which
consumers may receive (pause, circuit breaker) and which jobs of an ordered consumer may go out.

The PostgreSQL statements (jobs/queue/postgres.py) apply the same rules in SQL, each statement
naming the rule it follows here; the tests of jobs/queue run every operation on both databases.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, Q, QuerySet

from broker.conf import broker_settings
from consumers.models import Consumer
from jobs.models import Job, JobQuerySet
from jobs.states import INFLIGHT, QUEUED

# How many jobs a push consumer may have INFLIGHT at once when it sets no maxInFlight.
DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER = 100
# The PostgreSQL NOTIFY channel that wakes idle dispatchers (jobs/queue/wakeup.py).
WAKEUP_CHANNEL = "broker_jobs"
PENDING = (QUEUED, INFLIGHT)  # statuses of a job that is still on its way


def lease_length(incremental_timeout: int = 0) -> timedelta:
    """How long a job handed out stays INFLIGHT before the sweep takes it back: the delivery
    timeout, the grace of BROKER_RATIONAL_DELAY_SECONDS, and what a pull consumer asked for."""
    seconds = (
        broker_settings.BROKER_DELIVERY_TIMEOUT_SECONDS
        + broker_settings.BROKER_RATIONAL_DELAY_SECONDS
        + incremental_timeout
    )
    return timedelta(seconds=seconds)


def lease_expiry(now: datetime, incremental_timeout: int = 0) -> datetime:
    return now + lease_length(incremental_timeout)


def receiving_push_consumers(now: datetime) -> QuerySet[Consumer]:
    """Push consumers whose jobs may be claimed: not paused, and with the circuit closed or
    half-open (its cooldown over: one probe may go)."""
    return Consumer.objects.filter(type=Consumer.Type.PUSH, paused=False).filter(
        Q(circuit_open_until__isnull=True) | Q(circuit_open_until__lte=now)
    )


def in_flight_cap(consumer: Consumer) -> int:
    """How many jobs the consumer may have INFLIGHT: one probe while its circuit is half-open."""
    if consumer.circuit_open_until is not None:
        return 1
    return consumer.max_in_flight or DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER


def pending_of_key(consumer_id: int, ordering_key: str) -> JobQuerySet:
    """The consumer's jobs of one ordering key that are still on their way (QUEUED or
    INFLIGHT), through job_consumer_key_pending_idx."""
    return Job.objects.filter(
        consumer_id=consumer_id, ordering_key=ordering_key, status__in=PENDING
    )


def heads_of_their_keys(jobs: JobQuerySet) -> JobQuerySet:
    """Only the jobs with no earlier pending job of the same consumer and ordering key: all an
    ordered consumer may be handed, so that a key's messages go one at a time, in order (the
    lowest id first)."""
    earlier_pending = Job.objects.filter(
        consumer_id=OuterRef("consumer_id"),
        ordering_key=OuterRef("ordering_key"),
        status__in=PENDING,
        pk__lt=OuterRef("pk"),
    )
    return jobs.exclude(Exists(earlier_pending))


def key_busy(consumer: Consumer, ordering_key: str) -> bool:
    """Whether an ordered consumer has a job of this key on its way: a job of the key queued
    again now would overtake it (replay waits until the key is idle)."""
    if consumer.ordering != Consumer.Ordering.ORDERED:
        return False
    return pending_of_key(consumer.pk, ordering_key).exists()
