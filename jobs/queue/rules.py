"""The rules the queue's operations share, written once: lease length, the default in-flight cap,
the rate limit's horizon, which consumers a message fans out to (event types, in SQL), whether an
ordered consumer's key is busy, and which channels a producer may publish to
(BROKER_PRODUCER_CHANNELS). Rules that one statement alone applies are written in it and named
there: which push consumers may receive (pause, circuit breaker, 429 throttling), their in-flight
caps and slots (jobs/queue/postgres_push.py), the head of each ordering key (postgres_push.py,
postgres_pull.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

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
    """Whether the consumer row `consumer` receives a message whose `matching_patterns_sql` is the
    SQL expression `matching` (broker/event_types.py): it has no patterns, or one of them is
    among those (jsonb's `?|`)."""
    return f"({consumer}.event_types = '[]'::jsonb OR {consumer}.event_types ?| {matching})"


def pending_of_key(consumer_id: int, ordering_key: str) -> JobQuerySet:
    """The consumer's jobs of one ordering key that are still on their way (QUEUED or
    INFLIGHT), through job_consumer_key_pending_idx."""
    return Job.objects.filter(
        consumer_id=consumer_id, ordering_key=ordering_key, status__in=PENDING
    )


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
    table's unique (producer, channel) index. `producer_rule_parameters()` gives the parameter."""
    return f"""(NOT %(producers_bound)s OR EXISTS (
        SELECT 1 FROM {_ALLOWED_CHANNELS} allowed
        WHERE allowed.producer_id = {producer} AND allowed.channel_id = {channel}))"""  # noqa: S608 (code, not values)


def producer_rule_parameters() -> dict[str, bool]:
    """The parameters `producer_may_publish_sql` needs: the setting is read at each statement,
    so that a change of it (a test's override) applies at once."""
    return {"producers_bound": producers_bound()}
