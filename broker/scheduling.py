"""Scheduled messages (docs/scheduled.md): the schedule rules and the cancel (the release is the job
queue's: `jobs.queue.release_due_messages`).

A scheduled message is an ordinary Message row with status SCHEDULED, `scheduled_for` set and no
jobs (`publish(scheduled_for=...)`, or the broadcast header X-Broker-Scheduled-For). Its release
creates one QUEUED job per consumer the channel has *then* and makes it DISPATCHED (ACKNOWLEDGED
when the channel has no consumer), in one transaction; from there on it is delivered like any
other message. Until the release it can be cancelled, which deletes it. See docs/scheduled.md.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.utils import timezone

from broker.conf import broker_settings
from broker.models import Message
from broker.publishing import ScheduleTooSoon

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
