"""The rules the queue's operations share, written once: lease length, the default in-flight cap,
the rate limit's horizon, which consumers a message fans out to (event types: the fragments
`matching_patterns` and `subscribed` of jobs/queue/sql/shared.sql, which only statements use),
whether an ordered consumer's key is busy, and which channels a producer may publish to
(BROKER_PRODUCER_CHANNELS, in SQL too: `producer_may_publish_sql` names its fragment for the
broadcast endpoint). Rules that one statement alone applies are written in it and named
there: the push claim's slots and the head of each ordering key (sql/push_claim.sql); the
circuit breaker's are jobs/queue/circuit.py's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from broker.conf import broker_settings
from broker.models import Producer
from consumers.models import Consumer
from jobs.models import Job, JobQuerySet
from jobs.queue import queries
from jobs.states import PENDING

# How many jobs a push consumer may have INFLIGHT at once when it sets no maxInFlight.
DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER = 100
# The PostgreSQL NOTIFY channel that wakes idle dispatchers (jobs/queue/wakeup.py).
WAKEUP_CHANNEL = "broker_jobs"
# The advisory lock that an idle dispatcher holds, exclusive, on its LISTEN connection: publishing
# statements NOTIFY only when they cannot take it shared (jobs/queue/wakeup.py). "brokerWG".
WAKEUP_GUARD_LOCK = 0x6272_6F6B_6572_5747
# How far ahead a claim may book a rate-limited consumer's delivery slots: a claimed job waits in
# its dispatcher until its slot, so the consumer's pace does not depend on how often dispatchers
# claim, as long as one claims within this (their idle poll is a second too).
SLOT_HORIZON_SECONDS = 1.0
# What the LISTEN connection of a dispatcher is named after (jobs/queue/dispatchers.py).
SESSION_PREFIX = "webhook-broker dispatcher "


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
    """`producer_may_publish` in SQL, for the SQL expressions `producer` and `channel` (IDs;
    sql/shared.sql, `producer_may_publish`); `producer_rule_parameters()` gives its parameter."""
    return queries.fragment("producer_may_publish", producer, channel)


def producer_rule_parameters() -> dict[str, bool]:
    """The parameters `producer_may_publish_sql` needs: the setting is read at each statement,
    so that a change of it (a test's override) applies at once."""
    return {"producers_bound": producers_bound()}
