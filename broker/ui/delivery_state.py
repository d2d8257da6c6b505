"""Why a consumer is delivering or not, for the dashboard's rows, its page and its jobs' pages
(issue 20: the reason for a failure within two clicks of the dashboard): its newest attempt, its
newest failure (kept on its row by the dispatcher: Consumer.last_failure...), when its next
attempt is due, what holds its jobs back, and its state badges: the few words the dashboard and
its page both show, from this one place so that they agree (issue 38)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import OuterRef, Subquery

from broker.templatetags.ui_format import utc
from consumers.models import Consumer
from jobs.models import DeliveryAttempt
from jobs.queue import circuit
from jobs.queue_depth import next_due_times

# The failure the dispatcher records for a 410 Gone (jobs/queue/outcomes.py: failure_summary),
# the answer that pauses a consumer (jobs/retry.py).
GONE = re.compile(r"HTTP 410(:|$)")
CHANGED_AT_STEP = timedelta(seconds=1)  # see paused_by_gone


@dataclass(frozen=True)
class Badge:
    text: str
    kind: str  # its style, class badge-<kind>: active, paused, circuit-open, ...
    title: str = ""  # the detail, shown on hover


@dataclass(frozen=True)
class DeliveryState:
    last_attempt: DeliveryAttempt | None  # the newest, whatever its outcome
    next_due: datetime | None  # the earliest due time of its queued jobs; None: none queued
    held_back: str  # why none of its jobs is sent now, in words; "" when nothing holds them
    badges: tuple[Badge, ...] = ()  # state_badges
    paused_by_gone: bool = False  # paused because its endpoint answered 410 Gone


def delivery_states(consumers: list[Consumer], now: datetime) -> dict[int, DeliveryState]:
    """Each consumer's DeliveryState, by ID, in a fixed number of queries."""
    ids = [consumer.pk for consumer in consumers]
    due = next_due_times(ids[0] if len(ids) == 1 else None)
    attempts = last_attempts(ids)
    return {
        consumer.pk: DeliveryState(
            attempts.get(consumer.pk),
            due.get(consumer.pk),
            held_back_by(consumer, now),
            state_badges(consumer, now),
            paused_by_gone(consumer),
        )
        for consumer in consumers
    }


def held_back_by(consumer: Consumer, now: datetime) -> str:
    """Why none of the consumer's jobs is sent now, in words; "" when nothing holds them."""
    if consumer.paused:
        gone = paused_by_gone(consumer)
        return "consumer paused: it answered 410 Gone" if gone else "consumer paused"
    if circuit.state(consumer, now) == circuit.OPEN:
        return f"circuit open until {utc(consumer.circuit_open_until)}"
    if throttled(consumer, now):
        return f"consumer answered 429, held until {utc(consumer.throttled_until)}"
    return ""


def state_badges(consumer: Consumer, now: datetime) -> tuple[Badge, ...]:
    """What keeps the consumer from receiving now (paused, and why; circuit open or half-open;
    held by a 429), or "Active" when nothing does: never "Active" beside any of those."""
    badges = [pause_badge(consumer)] if consumer.paused else []
    state = circuit.state(consumer, now)
    if state == circuit.OPEN:
        until = utc(consumer.circuit_open_until)
        badges.append(Badge("Circuit open", "circuit-open", f"nothing is sent until {until}"))
    elif state == circuit.HALF_OPEN:
        badges.append(Badge("Circuit half-open", "circuit-half-open", "the next claim probes"))
    if throttled(consumer, now):
        until = utc(consumer.throttled_until)
        badges.append(Badge("Held: 429", "throttled", f"it answered 429; held until {until}"))
    return tuple(badges) or (Badge("Active", "active"),)


def pause_badge(consumer: Consumer) -> Badge:
    if paused_by_gone(consumer):
        answered = utc(consumer.last_failure_at)
        return Badge(
            "Paused: 410 Gone",
            "paused",
            f"its endpoint answered 410 Gone at {answered}: resume it once it wants webhooks",
        )
    return Badge("Paused", "paused", "its jobs wait until it is resumed")


def paused_by_gone(consumer: Consumer) -> bool:
    """Whether the consumer's pause came from its endpoint answering 410 Gone rather than from an
    operator: its newest failure is that 410, and no change of its settings came after it (a
    resume or a pause by hand, through the UI, the API or the admin, moves changed_at; the
    dispatcher's pause does not). Read from the row, so without a query of its own.

    changed_at moves in steps of whole seconds (broker/models.py: next_change_time, for
    Last-Modified) and can run up to a second ahead of the change, so a failure up to a second
    before it counts as after it: only a resume and a pause by hand within the second of the
    410 would read as the 410's."""
    failed_at = consumer.last_failure_at
    return (
        consumer.paused
        and failed_at is not None
        and failed_at > consumer.changed_at - CHANGED_AT_STEP
        and GONE.match(consumer.last_failure) is not None
    )


def throttled(consumer: Consumer, now: datetime) -> bool:
    """Held back by a 429 with Retry-After (jobs/retry.py: throttle_seconds)."""
    return consumer.throttled_until is not None and consumer.throttled_until > now


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
