"""Why a consumer is delivering or not, for the dashboard's rows, its page and its jobs' pages
(issue 20: the reason for a failure within two clicks of the dashboard): its newest attempt, its
newest failure (kept on its row by the dispatcher: Consumer.last_failure...), when its next
attempt is due, and what holds its jobs back."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import OuterRef, Subquery

from broker.templatetags.ui_format import utc
from consumers.models import Consumer
from jobs.models import DeliveryAttempt
from jobs.queue import circuit
from jobs.queue_depth import next_due_times


@dataclass(frozen=True)
class DeliveryState:
    last_attempt: DeliveryAttempt | None  # the newest, whatever its outcome
    next_due: datetime | None  # the earliest due time of its queued jobs; None: none queued
    held_back: str  # why none of its jobs is sent now, in words; "" when nothing holds them


def delivery_states(consumers: list[Consumer], now: datetime) -> dict[int, DeliveryState]:
    """Each consumer's DeliveryState, by ID, in a fixed number of queries."""
    ids = [consumer.pk for consumer in consumers]
    due = next_due_times(ids[0] if len(ids) == 1 else None)
    attempts = last_attempts(ids)
    return {
        consumer.pk: DeliveryState(
            attempts.get(consumer.pk), due.get(consumer.pk), held_back_by(consumer, now)
        )
        for consumer in consumers
    }


def held_back_by(consumer: Consumer, now: datetime) -> str:
    """Why none of the consumer's jobs is sent now, in words; "" when nothing holds them."""
    if consumer.paused:
        return "consumer paused"
    if circuit.state(consumer, now) == circuit.OPEN:
        return f"circuit open until {utc(consumer.circuit_open_until)}"
    if consumer.throttled_until and consumer.throttled_until > now:
        return f"consumer answered 429, held until {utc(consumer.throttled_until)}"
    return ""


def last_attempts(consumer_ids: Iterable[int]) -> dict[int, DeliveryAttempt]:
    """Each consumer's newest attempt, by consumer ID: one probe of attempt_consumer_idx per
    consumer, then the rows themselves (two queries however many attempts there are)."""
    newest = (
        DeliveryAttempt.objects.filter(consumer_id=OuterRef("pk"))
        .order_by("-started_at")
        .values("pk")[:1]
    )
    ids = (
        Consumer.objects.filter(pk__in=list(consumer_ids))
        .annotate(attempt=Subquery(newest))
        .exclude(attempt=None)
        .values_list("attempt", flat=True)
    )
    attempts = DeliveryAttempt.objects.defer("response_excerpt").filter(pk__in=list(ids))
    return {attempt.consumer_id: attempt for attempt in attempts if attempt.consumer_id}
