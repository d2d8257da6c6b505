"""The circuit breaker of push consumers (docs/delivery.md, "Circuit breaker"): a consumer that is
down is left alone.

After BROKER_CIRCUIT_FAILURE_THRESHOLD attempts in a row find the consumer unavailable (no
answer, a 5xx, 429 or 408: jobs/retry.py `is_unavailable`), its circuit opens for
BROKER_CIRCUIT_COOLDOWN_SECONDS: the claim takes none of its jobs, so none of them uses an attempt.
When the cooldown is over the circuit is half-open: the claim takes one job, the probe. Any answer
that is not unavailability (a 2xx, or a 4xx of the consumer's own) closes the circuit; an
unavailable probe opens it again for twice as long (at most an hour) and gets its attempt back,
so a consumer that is down for days does not push its jobs into the dead-letter queue one probe
at a time (they expire after their age limit instead: jobs/queue/expiry.py).

The state lives in three consumer columns, changed with conditional UPDATEs in the transaction
that records the attempts; the push claim reads them (jobs/queue/postgres_push.py, `_RECEIVING`
and the cap).

A recording never waits for a consumer's row (issue 36): a row another transaction holds (another
dispatcher's recording, a claim booking rate limit slots, an operator's edit, a process frozen
mid-transaction) is skipped, `free_rows`. Its failures then go uncounted and its circuit is not
closed by this batch: the consumer's next attempts count, or close it, again. No recording, and
so no dispatcher, is ever held up by another's, and publishers never wait for any of them (the
locks are FOR NO KEY UPDATE, which the foreign-key checks of new jobs do not wait for).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db.models import F, QuerySet

from broker.conf import broker_settings
from consumers.models import CIRCUIT_FIELDS, Consumer

logger = logging.getLogger(__name__)
MAX_COOLDOWN_SECONDS = 3600


def record_unavailable(failures: Counter[int], now: datetime) -> dict[int, datetime]:
    """Count attempts that got no usable answer, per consumer ID; open circuits that reach the
    threshold. Returns, for consumers whose probe failed, when their circuit half-opens again.

    The consumer rows are locked until the recording transaction ends, so that two dispatchers
    recording failures of one consumer count them one after the other; a row another
    transaction holds is skipped (the module's docstring).
    """
    consumers = (
        Consumer.objects.select_for_update(skip_locked=True, no_key=True)
        .only("channel_id", "public_id", *CIRCUIT_FIELDS)
        .order_by("pk")  # one order for every recording: they cannot deadlock one another
    ).in_bulk(list(failures))
    reopened = {}
    for consumer in consumers.values():
        probe = consumer.circuit_state(now) == "half-open"
        open_until = _count_failures(consumer, failures[consumer.pk], now)
        if probe and open_until:
            reopened[consumer.pk] = open_until
    return reopened


def _count_failures(consumer: Consumer, failures: int, now: datetime) -> datetime | None:
    """`failures` more attempts in a row got no usable answer: count them, open if need be.

    Returns when the circuit half-opens again if this opened it (or reopened it), else None.
    """
    threshold = broker_settings.BROKER_CIRCUIT_FAILURE_THRESHOLD
    base = broker_settings.BROKER_CIRCUIT_COOLDOWN_SECONDS
    changes: dict[str, object] = {"circuit_failures": F("circuit_failures") + failures}
    if consumer.circuit_state(now) == "half-open":  # the probe failed
        cooldown = min(2 * max(consumer.circuit_cooldown_seconds, base), MAX_COOLDOWN_SECONDS)
    elif consumer.circuit_open_until is None and threshold:
        cooldown = base if consumer.circuit_failures + failures >= threshold else 0
    else:
        cooldown = 0  # still open: failures of deliveries sent before it opened
    open_until = now + timedelta(seconds=cooldown) if cooldown else None
    if open_until:
        changes.update(circuit_open_until=open_until, circuit_cooldown_seconds=cooldown)
        logger.warning("circuit of consumer %s open for %d s", consumer, cooldown)
    Consumer.objects.filter(pk=consumer.pk).update(**changes)
    return open_until


def close_circuits(consumer_ids: Iterable[int]) -> None:
    """Reset the circuits of consumers that answered (what jobs/queue/postgres.py does within
    its statement that records deliveries)."""
    tripped = Consumer.objects.filter(pk__in=list(consumer_ids)).exclude(
        circuit_failures=0, circuit_open_until=None
    )
    free_rows(tripped).update(
        circuit_failures=0, circuit_open_until=None, circuit_cooldown_seconds=0
    )


def free_rows(consumers: QuerySet[Consumer]) -> QuerySet[Consumer]:
    """Those of `consumers` whose rows no other transaction holds, locked for this one (FOR NO
    KEY UPDATE SKIP LOCKED): what a recording may change without waiting."""
    locked = consumers.select_for_update(skip_locked=True, no_key=True).values("pk")
    return Consumer.objects.filter(pk__in=locked)
