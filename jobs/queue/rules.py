"""The rules every queue operation applies, written once: lease length, in-flight caps, which
consumers may receive (pause, circuit breaker, 429 throttling), how fast (rate limit), which
consumers a message fans out to (event types), which jobs of an ordered consumer may go out, and
which channels a producer may publish to (BROKER_PRODUCER_CHANNELS).

The PostgreSQL statements (jobs/queue/postgres.py) apply the same rules in SQL, each statement
naming the rule it follows here; the tests of jobs/queue run every operation on both databases.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, Q, QuerySet

from broker import event_types
from broker.conf import broker_settings
from broker.models import Producer
from consumers.models import Consumer
from jobs.models import Job, JobQuerySet
from jobs.states import INFLIGHT, QUEUED

# How many jobs a push consumer may have INFLIGHT at once when it sets no maxInFlight.
DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER = 100
# The PostgreSQL NOTIFY channel that wakes idle dispatchers (jobs/queue/wakeup.py).
WAKEUP_CHANNEL = "broker_jobs"
PENDING = (QUEUED, INFLIGHT)  # statuses of a job that is still on its way
# How far ahead a claim may book a rate-limited consumer's delivery slots: a claimed job waits in
# its dispatcher until its slot, so the consumer's pace does not depend on how often dispatchers
# claim, as long as one claims within this (their idle poll is a second too).
SLOT_HORIZON_SECONDS = 1.0
# The join table of Producer.allowed_channels: (producer_id, channel_id), unique together.
_ALLOWED_CHANNELS = Producer.allowed_channels.through._meta.db_table


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


def push_lease_expiry(now: datetime) -> datetime:
    """A push claim's lease: a job may wait up to SLOT_HORIZON_SECONDS for its slot first."""
    return lease_expiry(now) + timedelta(seconds=SLOT_HORIZON_SECONDS)


def receiving_push_consumers(now: datetime) -> QuerySet[Consumer]:
    """Push consumers whose jobs may be claimed: not paused, not throttled by a 429's
    Retry-After, and with the circuit closed or half-open (its cooldown over: one probe may
    go)."""
    return Consumer.objects.filter(type=Consumer.Type.PUSH, paused=False).filter(
        Q(circuit_open_until__isnull=True) | Q(circuit_open_until__lte=now),
        Q(throttled_until__isnull=True) | Q(throttled_until__lte=now),
    )


def first_free_slot(next_slot_at: datetime | None, now: datetime) -> datetime:
    """When a rate-limited consumer's next request may go: its next slot, or now if that has
    passed (slots left unused are not saved up: no burst follows a quiet spell)."""
    return now if next_slot_at is None else max(next_slot_at, now)


def bookable_slots(first_slot: datetime, per_second: float, now: datetime) -> int:
    """How many slots, 1/per_second apart from `first_slot`, begin within the horizon."""
    ahead = (now - first_slot).total_seconds() + SLOT_HORIZON_SECONDS
    return max(math.ceil(ahead * per_second), 0)


def slot_times(first_slot: datetime, per_second: float, count: int) -> list[datetime]:
    """`count` slots in a row from `first_slot`, 1/per_second apart."""
    return [first_slot + timedelta(seconds=n / per_second) for n in range(count)]


def subscribed_consumer_ids(
    consumers: list[tuple[int, list[str]]], event_type: str | None
) -> list[int]:
    """The IDs, in their order, of the (ID, event type patterns) consumers that a message of
    `event_type` fans out to (broker/event_types.py)."""
    return [pk for pk, patterns in consumers if event_types.matches(patterns, event_type)]


def matching_patterns_sql(event_type: str) -> str:
    """SQL: the text[] of every pattern that matches a message whose type is the SQL expression
    `event_type`: `*`, the type itself, and each of its prefixes followed by `*` (`o*`, `or*`,
    ..., `order.created*`); `*` alone for an untyped message (NULL). Computed once per message,
    so that matching a consumer is one C operator over its patterns (`subscribed_sql`), not a
    subquery per consumer."""
    prefixes = f"""(SELECT ARRAY['*', {event_type}] || array_agg(left({event_type}, n) || '*')
        FROM generate_series(1, length({event_type})) AS n)"""  # noqa: S608 (code, not values)
    # An untyped message (most, on a channel without event types) needs no subquery.
    return f"(CASE WHEN {event_type} IS NULL THEN ARRAY['*'] ELSE {prefixes} END)"


def subscribed_sql(consumer: str, matching: str) -> str:
    """`subscribed_consumer_ids`'s rule in SQL: whether the consumer row `consumer` receives a
    message whose `matching_patterns_sql` is the SQL expression `matching`: it has no patterns,
    or one of them is among those (jsonb's `?|`)."""
    return f"({consumer}.event_types = '[]'::jsonb OR {consumer}.event_types ?| {matching})"


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


def producers_bound() -> bool:
    """BROKER_PRODUCER_CHANNELS=bound: a producer publishes only to the channels it is allowed
    on, so that knowing a channel's token (every pull consumer of it does) is not enough to
    publish there. `open`, the default, is webhook-broker's rule: any producer, any channel."""
    return broker_settings.BROKER_PRODUCER_CHANNELS == "bound"


def producer_may_publish(producer_id: str, channel_id: str) -> bool:
    """Whether the producer may publish to the channel under BROKER_PRODUCER_CHANNELS."""
    if not producers_bound():
        return True
    return Producer.objects.filter(pk=producer_id, allowed_channels=channel_id).exists()


def producer_may_publish_sql(producer: str, channel: str) -> str:
    """`producer_may_publish` in SQL, for the SQL expressions `producer` and `channel` (IDs):
    true when the statement's parameter `producers_bound` is false, else one probe of the join
    table's unique (producer, channel) index. `producer_rule_parameters()` gives the parameter.
    Plain SQL that SQLite runs too (the broadcast's token query is not PostgreSQL's alone)."""
    return f"""(NOT %(producers_bound)s OR EXISTS (
        SELECT 1 FROM {_ALLOWED_CHANNELS} allowed
        WHERE allowed.producer_id = {producer} AND allowed.channel_id = {channel}))"""  # noqa: S608 (code, not values)


def producer_rule_parameters() -> dict[str, bool]:
    """The parameters `producer_may_publish_sql` needs: the setting is read at each statement,
    so that a change of it (a test's override) applies at once."""
    return {"producers_bound": producers_bound()}
