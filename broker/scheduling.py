"""Scheduled messages (SPEC §6.8): the schedule rules, the release, the cancel.

A scheduled message is an ordinary Message row with status SCHEDULED, `scheduled_for` set and no
jobs (`publish(scheduled_for=...)`, or the broadcast header X-Broker-Scheduled-For). Its release
creates one QUEUED job per consumer the channel has *then* and makes it DISPATCHED (ACKNOWLEDGED
when the channel has no consumer), in one transaction; from there on it is delivered like any
other message. Until the release it can be cancelled, which deletes it. See docs/scheduled.md.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from broker.conf import broker_settings
from broker.models import Message
from broker.publishing import ScheduleTooSoon, create_jobs
from consumers.models import Consumer
from jobs.models import Job
from jobs.states import QUEUED

# Messages released per call (and per transaction) unless the caller says otherwise.
RELEASE_BATCH = 500

# RFC 3339 date-time: a full date, a full time and an offset (Z or ±hh:mm) are all required.
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})\Z", re.ASCII
)

SCHEDULED = Message.Status.SCHEDULED.value


class NotScheduled(LookupError):
    """No scheduled message with that ID in that channel (a normal message is not one)."""


class AlreadyReleased(Exception):
    """The scheduled message was released (it has jobs): too late to cancel it."""


def parse_rfc3339(text: str) -> datetime:
    """An RFC 3339 date-time as an aware UTC datetime; ValueError for anything else.

    Stricter than `datetime.fromisoformat`, which also takes dates alone, times without an
    offset (naive: which zone?) and ISO 8601's basic format.
    """
    text = text.strip()
    if not _RFC3339.match(text):
        raise ValueError("not an RFC 3339 date-time")
    if text[-1] in "Zz":
        text = text[:-1] + "+00:00"
    try:
        # Nanoseconds are cut to microseconds, the precision of the database.
        return datetime.fromisoformat(text[:10] + "T" + text[11:]).astimezone(UTC)
    except OverflowError:  # year 1 or 9999 moved out of range by its offset
        raise ValueError("date-time out of range") from None


def require_min_delay(when: datetime, now: datetime | None = None) -> None:
    """ScheduleTooSoon unless `when` is at least BROKER_MIN_SCHEDULE_DELAY_SECONDS away.

    The broadcast header's rule (webhook-broker's 412); `publish()` does not apply it.
    """
    delay = timedelta(seconds=broker_settings.BROKER_MIN_SCHEDULE_DELAY_SECONDS)
    earliest = (now or timezone.now()) + delay
    if when < earliest:
        raise ScheduleTooSoon(
            f"X-Broker-Scheduled-For must be at least {int(delay.total_seconds())} seconds from "
            f"now (not before {earliest.isoformat(timespec='seconds')})."
        )


def release_due_messages(now: datetime | None = None, limit: int = RELEASE_BATCH) -> int:
    """Release up to `limit` scheduled messages due at `now`; return how many were released.

    One call is one transaction (one statement on PostgreSQL): each due message (status
    SCHEDULED, `scheduled_for <= now`, oldest due first) gets one QUEUED job per consumer its
    channel has at this moment, with the message's priority and ordering key, and becomes
    DISPATCHED with `dispatched_at = now` (ACKNOWLEDGED, without jobs, when the channel has no
    consumer). On PostgreSQL idle dispatchers are woken with one NOTIFY on `broker_jobs`.

    Safe to call from any number of processes at once: the due rows are locked with
    `FOR UPDATE SKIP LOCKED` and re-checked to still be SCHEDULED, so every message is released
    exactly once, and a caller never waits for another. (SQLite serializes writers instead.)

    Meant to be called about every 0.5 s by the dispatcher loop, which gives the release
    precision of SPEC §6.8 (within 1 s of `scheduled_for`). A return value equal to `limit`
    means more may be due: call again at once.
    """
    now = now or timezone.now()
    if connection.vendor == "postgresql":
        return _release_in_one_statement(now, limit)
    return _release_portably(now, limit)


# Locks the due messages (skipping those another caller holds; the status test is re-checked
# on the locked row version, so a message released meanwhile is not taken again), inserts their
# jobs, then marks them released; the consumers are read in the same snapshot by both. Jobs are
# inserted in due order: job IDs define the order ordered consumers receive a key's messages
# in (SPEC §6.3), so a scheduled message takes its place in that order at its release.
# `AS MATERIALIZED` and LIMIT in the CTE: see SPEC §11 (PostgreSQL bug #15715).
_RELEASE_SQL = f"""
WITH due AS MATERIALIZED (
    SELECT id, channel_id, priority, ordering_key, scheduled_for
    FROM {Message._meta.db_table}
    WHERE status = %(scheduled)s AND scheduled_for <= %(now)s
    ORDER BY scheduled_for, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), jobs AS (
    INSERT INTO {Job._meta.db_table} (message_id, consumer_id, status, priority, ordering_key,
        attempts, next_attempt_at, incremental_timeout, last_error, created_at, status_changed_at,
        enqueued_at)
    SELECT due.id, consumer.id, %(queued)s, due.priority, due.ordering_key, 0, %(now)s, 0, '',
        %(now)s, %(now)s, %(now)s
    FROM due JOIN {Consumer._meta.db_table} consumer ON consumer.channel_id = due.channel_id
    ORDER BY due.scheduled_for, due.id, consumer.id
    RETURNING message_id
), released AS (
    UPDATE {Message._meta.db_table} message
    SET status = CASE WHEN has_consumers THEN %(dispatched)s ELSE %(acknowledged)s END,
        dispatched_at = CASE WHEN has_consumers THEN %(now)s::timestamptz END
    FROM (
        SELECT due.id, EXISTS (
            SELECT FROM {Consumer._meta.db_table} consumer
            WHERE consumer.channel_id = due.channel_id
        ) AS has_consumers
        FROM due
    ) AS target
    WHERE message.id = target.id
    RETURNING message.id
)
SELECT (SELECT count(*) FROM released),
    -- Wakes idle dispatchers (delivered by PostgreSQL at commit, once per transaction).
    (SELECT pg_notify('broker_jobs', '') WHERE EXISTS (SELECT FROM jobs))
"""  # noqa: S608


def _release_in_one_statement(now: datetime, limit: int) -> int:
    parameters: dict[str, Any] = {
        "now": now,
        "limit": limit,
        "scheduled": SCHEDULED,
        "queued": QUEUED.value,
        "dispatched": Message.Status.DISPATCHED.value,
        "acknowledged": Message.Status.ACKNOWLEDGED.value,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_RELEASE_SQL, parameters)
        released, _ = cursor.fetchone()
    return int(released)


def _release_portably(now: datetime, limit: int) -> int:
    """The same with the ORM: a conditional UPDATE per message says which caller won it."""
    with transaction.atomic():
        due = list(
            Message.objects.filter(status=SCHEDULED, scheduled_for__lte=now)
            .order_by("scheduled_for", "pk")
            .only("pk", "channel_id", "priority", "ordering_key")[:limit]
        )
        consumers: dict[str, list[int]] = {}
        for channel_id, consumer_id in Consumer.objects.filter(
            channel_id__in={message.channel_id for message in due}
        ).values_list("channel_id", "pk"):
            consumers.setdefault(channel_id, []).append(consumer_id)
        released = 0
        for message in due:
            released += _release_one(message, sorted(consumers.get(message.channel_id, [])), now)
    return released


def _release_one(message: Message, consumer_ids: list[int], now: datetime) -> int:
    status = Message.Status.DISPATCHED if consumer_ids else Message.Status.ACKNOWLEDGED
    won = Message.objects.filter(pk=message.pk, status=SCHEDULED).update(
        status=status, dispatched_at=now if consumer_ids else None
    )
    if won:
        create_jobs(message, consumer_ids, now)
    return won


def cancel_scheduled(channel_id: str, message_id: str) -> None:
    """Delete a scheduled message that has not been released yet (and its offloaded payload,
    once the deletion commits).

    NotScheduled if the channel has no scheduled message with that ID; AlreadyReleased if it
    has been released. The row lock makes this and a concurrent release exclusive: the release
    skips a row locked here, and this waits for a release that holds it, then sees it released.
    """
    with transaction.atomic():
        message = (
            Message.objects.select_for_update()
            .filter(channel_id=channel_id, public_id=message_id, scheduled_for__isnull=False)
            .only("pk", "status", "payload_file")
            .first()
        )
        if message is None:
            raise NotScheduled(f"No scheduled message {message_id!r} in channel {channel_id!r}.")
        if message.status != SCHEDULED:
            raise AlreadyReleased(
                f"Scheduled message {message_id!r} was already released; it can no longer be "
                "cancelled."
            )
        message.delete()  # post_delete removes an offloaded payload file on commit
