"""What a delivery attempt means for its job: delivered, retried later, or dead
(docs/dispatcher.md)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import Enum

from broker.conf import broker_settings
from broker.payloads import PAYLOAD_MISSING
from consumers.models import Consumer
from jobs.delivery import AttemptResult

# Only unavailability counts towards a consumer's circuit (docs/delivery.md, "Circuit breaker"): no
# answer at all (refused, reset, timed out, or a callback host that resolves to no address we may
# call), a 5xx, or a status that says "not now". Any other answer, a 404 say, is the consumer's
# decision: it uses attempts like any failure and never hides the consumer behind an open circuit.
# Failures that are not the consumer's doing (cut off at shutdown, payload storage, a request-error)
# do not count either.
UNAVAILABLE_ERROR_CLASSES = frozenset({"timeout", "connection", "unsafe-callback"})
UNAVAILABLE_STATUSES = frozenset({408, 429})
# The longest a 429's Retry-After holds back a whole consumer (docs/delivery.md, "Rate limit").
MAX_THROTTLE_SECONDS = 3600


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
    # The consumer is unavailable (`is_unavailable`): counts towards opening its circuit.
    unavailable: bool = False
    refund: bool = False  # RETRY without using up the attempt (a circuit's failed probe)
    # A 429 with Retry-After: no job of the consumer is claimed before this (docs/delivery.md,
    # "Rate limit").
    throttle_until: datetime | None = None


def decide(result: AttemptResult, consumer: Consumer, now: datetime) -> Outcome:
    """Apply the consumer's retry policy to one attempt's result."""
    if result.succeeded:
        return Outcome(Verdict.DELIVERED)
    outcome = _decide_failure(result, consumer, now)
    wait = throttle_seconds(result)
    if wait is not None:
        return replace(outcome, throttle_until=now + timedelta(seconds=wait))
    return outcome


def throttle_seconds(result: AttemptResult) -> float | None:
    """How long a 429 with Retry-After holds back every job of its consumer (at most
    MAX_THROTTLE_SECONDS); None for any other answer."""
    if result.status_code == 429 and result.retry_after is not None:
        return min(result.retry_after, MAX_THROTTLE_SECONDS)
    return None


def _decide_failure(result: AttemptResult, consumer: Consumer, now: datetime) -> Outcome:
    if result.error_class == PAYLOAD_MISSING:
        # Nothing to send, ever: dead at once (docs/delivery.md, "Large payloads"), and not the
        # consumer's doing.
        return Outcome(Verdict.DEAD, result.error)
    if result.status_code == 410:
        return Outcome(Verdict.DEAD, "HTTP 410 Gone: consumer paused", pause_consumer=True)
    if result.status_code in (consumer.non_retryable_statuses or []):
        return Outcome(Verdict.DEAD, f"HTTP {result.status_code} is not retryable")
    unavailable = is_unavailable(result)
    delay = retry_delay(consumer, result.attempt)
    if delay is None:
        reason = f"{result.error}; all {result.attempt} attempts used"
        return Outcome(Verdict.DEAD, reason, unavailable=unavailable)
    if result.retry_after is not None:
        # Honoured up to the consumer's longest retry delay (Retry-After is at most a day).
        delay = max(delay, min(result.retry_after, max(consumer.retry_delays_in_effect)))
    due_at = now + timedelta(seconds=delay)
    return Outcome(Verdict.RETRY, result.error, due_at=due_at, unavailable=unavailable)


def retry_delay(consumer: Consumer, attempt: int) -> float | None:
    """Seconds until a job that failed its `attempt`-th attempt is due again, by the consumer's
    retry schedule (jittered); None once every attempt is used. Push deliveries and pull
    workers' give-backs with `Backoff` (jobs/queue/reports.py) both follow it."""
    delays = consumer.retry_delays_in_effect
    if attempt > len(delays):
        return None
    return jittered(delays[attempt - 1], broker_settings.BROKER_RETRY_JITTER)


def is_unavailable(result: AttemptResult) -> bool:
    """Whether a failed attempt shows the consumer unavailable (see UNAVAILABLE_STATUSES)."""
    return shows_unavailable(result.status_code, result.error_class)


def shows_unavailable(status_code: int | None, error_class: str) -> bool:
    """`is_unavailable` of an attempt by what was recorded of it (a DeliveryAttempt's fields)."""
    if status_code is None:
        return error_class in UNAVAILABLE_ERROR_CLASSES
    return 500 <= status_code <= 599 or status_code in UNAVAILABLE_STATUSES


def jittered(seconds: float, jitter: float, rng: random.Random | None = None) -> float:
    """`seconds` ± `jitter` (a fraction), so retries of many jobs do not arrive in lockstep."""
    if not jitter:
        return seconds
    return seconds * (1 + (rng or random).uniform(-jitter, jitter))  # not security
