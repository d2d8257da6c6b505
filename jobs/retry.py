"""What a delivery attempt means for its job: delivered, retried later, or dead (SPEC §5)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from broker.conf import broker_settings
from broker.payloads import PAYLOAD_MISSING
from consumers.models import Consumer
from jobs.delivery import STORAGE_ERROR, AttemptResult

# Failures that say nothing about the consumer, so they do not count towards its circuit: a
# delivery we cut off at shutdown, a payload storage that failed us.
NOT_THE_CONSUMERS_DOING = {"shutdown", STORAGE_ERROR}


class Verdict(Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason: str = ""
    due_at: datetime | None = None  # RETRY: not before this
    pause_consumer: bool = False  # 410 Gone: the consumer asked to stop receiving
    # No usable answer (timeout, connection error, a retryable status): counts towards opening
    # the consumer's circuit (SPEC §6.4). A status the consumer chose to send as final does not.
    unavailable: bool = False
    refund: bool = False  # RETRY without using up the attempt (a circuit's failed probe)


def decide(result: AttemptResult, consumer: Consumer, now: datetime) -> Outcome:
    """Apply the consumer's retry policy to one attempt's result."""
    if result.succeeded:
        return Outcome(Verdict.DELIVERED)
    if result.error_class == PAYLOAD_MISSING:
        # Nothing to send, ever: dead at once (SPEC §6.7), and not the consumer's doing.
        return Outcome(Verdict.DEAD, result.error)
    if result.status_code == 410:
        return Outcome(Verdict.DEAD, "HTTP 410 Gone: consumer paused", pause_consumer=True)
    if result.status_code in (consumer.non_retryable_statuses or []):
        return Outcome(Verdict.DEAD, f"HTTP {result.status_code} is not retryable")
    unavailable = result.error_class not in NOT_THE_CONSUMERS_DOING
    delays = consumer.retry_delays_in_effect
    if result.attempt > len(delays):
        reason = f"{result.error}; all {result.attempt} attempts used"
        return Outcome(Verdict.DEAD, reason, unavailable=unavailable)
    delay = jittered(delays[result.attempt - 1], broker_settings.BROKER_RETRY_JITTER)
    if result.retry_after is not None:
        delay = max(delay, result.retry_after)
    due_at = now + timedelta(seconds=delay)
    return Outcome(Verdict.RETRY, result.error, due_at=due_at, unavailable=unavailable)


def jittered(seconds: float, jitter: float, rng: random.Random | None = None) -> float:
    """`seconds` ± `jitter` (a fraction), so retries of many jobs do not arrive in lockstep."""
    if not jitter:
        return seconds
    return seconds * (1 + (rng or random).uniform(-jitter, jitter))  # not security
