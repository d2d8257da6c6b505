"""Periodic messages (docs/periodic.md): when a schedule ticks, and publishing its due ticks.

A schedule is an interval (`interval_seconds`) or a 5-field cron expression evaluated in an IANA
time zone. The dispatcher calls `run_due_ticks()` about twice a second; every due schedule is
handled in its own transaction, so that one tick's publish and the move of `next_run_at` commit
together or not at all. The rules (daylight saving time, missed ticks, skip_while_pending,
exactly once) are in docs/periodic.md.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo, available_timezones

from croniter import CroniterError, croniter
from django.db import transaction
from django.utils import timezone

from broker.event_catalogue import Schemas
from broker.models import Message, PeriodicMessage
from broker.publishing import (
    DuplicateMessage,
    ProducerNotAllowed,
    PublishError,
    check_event_type,
    check_message,
    publish,
)
from jobs.models import Job
from jobs.queue.rules import producer_may_publish
from jobs.states import INFLIGHT, QUEUED

logger = logging.getLogger(__name__)

# Schedules handled per run_due_ticks() call, so that one call stays short in the dispatcher loop.
BATCH = 100
# Missed cron ticks counted one by one in a catch-up; beyond this, the catch-up jumps ahead.
MAX_COUNTED_MISSES = 1000
# A time zone's offsets differ by at most this (DST is 1 h nearly everywhere, 2 h at most).
MAX_DST_SHIFT = timedelta(hours=2)
CRON_ALIASES = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
STAMP = "%Y%m%dT%H%M%SZ"
MAX_MESSAGE_ID = 255


class InvalidSchedule(ValueError):
    """A schedule that cannot tick: bad cron expression, unknown zone, bad interval."""


@cache
def _zone_names() -> frozenset[str]:
    return frozenset(available_timezones())


def validate_time_zone(name: str) -> ZoneInfo:
    # Membership first: ZoneInfo() also opens file paths and raises odd errors for odd names.
    if name not in _zone_names():
        raise InvalidSchedule(f"Unknown time zone {name[:100]!r}; use an IANA name.")
    return ZoneInfo(name)


def validate_cron(expression: str, zone: str = "UTC") -> None:
    """A 5-field cron expression (or an alias such as @daily) that matches some future time."""
    fields = expression.split()
    if not (len(fields) == 5 or (len(fields) == 1 and fields[0] in CRON_ALIASES)):
        raise InvalidSchedule("A cron expression has 5 fields: minute hour day month weekday.")
    if not croniter.is_valid(expression):
        raise InvalidSchedule(f"Invalid cron expression {expression[:100]!r}.")
    try:
        next(_cron_ticks(expression, validate_time_zone(zone), timezone.now()))
    except CroniterError:
        raise InvalidSchedule(f"The cron expression {expression!r} never matches.") from None


def next_tick(schedule: PeriodicMessage, after: datetime) -> datetime:
    """The schedule's first tick strictly after `after`.

    An interval schedule ticks `interval_seconds` after `after`: pass the previous tick (not the
    time it ran) and the ticks never drift. A cron schedule ticks at the next instant whose wall
    time in `schedule.timezone` matches, with the DST rule of docs/periodic.md.
    """
    if schedule.interval_seconds:
        return after + timedelta(seconds=schedule.interval_seconds)
    return next(_cron_ticks(schedule.cron, validate_time_zone(schedule.timezone), after))


def first_tick(schedule: PeriodicMessage, now: datetime) -> datetime:
    """The first tick of a schedule enabled (or changed) at `now`; intervals on whole seconds."""
    return next_tick(schedule, now.replace(microsecond=0) if schedule.interval_seconds else now)


def _cron_ticks(expression: str, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """The instants (UTC, strictly increasing, all after `after`) at which `expression` fires.

    croniter walks wall times (naive); each becomes one instant, or two for a wall time that
    occurs twice (fall back) in schedules that fire every hour. Around a DST change instants
    are not in the order of their wall times, so they wait in a heap until no later wall time
    can produce an earlier instant.
    """
    every_hour = _matches_every_hour(expression)
    near_change = _near_offset_change(zone, after)
    start = _wall(after, zone) - (MAX_DST_SHIFT if near_change else timedelta(0))
    walls = croniter(expression, start)
    pending: list[datetime] = []
    last = after
    while True:
        wall = walls.get_next(datetime)
        instants = _instants(wall, zone, every_hour)
        for instant in instants:
            if instant > last:
                heapq.heappush(pending, instant)
        # No later wall time maps to an instant before `floor` (only a DST change reorders).
        floor = instants[0]
        if _near_offset_change(zone, floor):
            floor -= MAX_DST_SHIFT
        while pending and pending[0] <= floor:
            instant = heapq.heappop(pending)
            if instant > last:  # equal instants: a wall time in a gap and its shifted twin
                last = instant
                yield instant


def _instants(wall: datetime, zone: ZoneInfo, every_hour: bool) -> list[datetime]:
    """The UTC instants of a naive wall time in `zone`, earliest first.

    A wall time in a spring-forward gap does not exist: it maps (fold=0) to the instant shifted
    forward by the gap (02:30 becomes 03:30), as RFC 5545 does. A wall time that occurs twice maps
    to its first occurrence, and to both when the schedule fires every hour.
    """
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if second > first and every_hour:  # a repeated wall time
        return [first, second]
    return [first]


def _wall(instant: datetime, zone: ZoneInfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def _near_offset_change(zone: ZoneInfo, instant: datetime) -> bool:
    """Whether the zone's UTC offset changes within 3 hours of `instant`."""
    around = [instant + timedelta(hours=hours) for hours in (-3, 0, 3)]
    return len({moment.astimezone(zone).utcoffset() for moment in around}) > 1


@cache
def _matches_every_hour(expression: str) -> bool:
    hours = croniter(expression).expanded[1]
    return hours == ["*"] or len(hours) == 24


def validate_publishable(schedule: PeriodicMessage) -> None:
    """Raise the PublishError that publishing a tick of this schedule would raise, if any: the
    API checks a schedule once, so that its ticks do not fail one by one later.

    With BROKER_PRODUCER_CHANNELS=bound that includes its producer's right to the channel
    (ProducerNotAllowed), but only while the schedule is enabled: a disabled one publishes
    nothing, and disabling one whose producer lost the channel must stay possible."""
    if schedule.enabled and not producer_may_publish(schedule.producer_id, schedule.channel_id):
        raise ProducerNotAllowed(schedule.producer_id, schedule.channel_id)
    tick = timezone.now().replace(microsecond=0)
    check_message(
        bytes(schedule.payload),
        tick_message_id(schedule, tick),
        schedule.priority,
        schedule.headers,
        schedule.content_type,
        schedule.ordering_key,
    )
    check_event_type(
        schedule.event_type,
        bytes(schedule.payload),
        schedule.content_type,
        Schemas(schedule.channel_id),
    )


def tick_message_id(schedule: PeriodicMessage, tick: datetime) -> str:
    """The message ID of one tick, the same for every dispatcher: the channel's unique message
    IDs then refuse a second publish of the same tick, whatever happens."""
    stamp = tick.astimezone(UTC).strftime(STAMP)
    prefix = schedule.public_id
    if len(prefix) + 1 + len(stamp) > MAX_MESSAGE_ID:
        digest = hashlib.sha256(prefix.encode()).hexdigest()[:16]
        prefix = f"{prefix[: MAX_MESSAGE_ID - len(stamp) - len(digest) - 2]}-{digest}"
    return f"{prefix}-{stamp}"


def run_due_ticks(now: datetime | None = None) -> int:
    """Publish the due ticks of enabled schedules (up to BATCH schedules); return how many
    messages were published.

    Each schedule is taken with FOR UPDATE SKIP LOCKED in its own transaction: concurrent
    dispatchers each take different schedules, and the row lock plus the move of next_run_at
    in the same transaction as the publish mean a tick is published once.
    """
    now = now or timezone.now()
    published = 0
    for _ in range(BATCH):
        with transaction.atomic():
            schedule = (
                PeriodicMessage.objects.select_for_update(skip_locked=True)
                .filter(enabled=True, next_run_at__lte=now)
                .order_by("next_run_at")
                .first()
            )
            if schedule is None:
                break
            published += _run_tick(schedule, now)
    return published


def _run_tick(schedule: PeriodicMessage, now: datetime) -> bool:
    """Publish the schedule's latest due tick (or skip it), count the missed ones, and move
    next_run_at to the first tick after now; True if a message was published. The caller holds
    the row lock."""
    due = schedule.next_run_at or now  # never None: selected by next_run_at <= now
    tick, missed, following = _latest_due_tick(schedule, due, now)
    changes: dict[str, object] = {"next_run_at": following}
    published = False
    if schedule.skip_while_pending and _still_pending(schedule.last_message_id):
        missed += 1
    else:
        message, published = _publish_tick(schedule, tick)
        if message is None:
            missed += 1
        else:
            changes.update(last_run_at=tick, last_message=message)
    changes["skipped_ticks"] = schedule.skipped_ticks + missed
    # An update, not save(): ticks are activity, not a change of the schedule, so ChangedAt (the
    # API's Last-Modified) stays and clients' If-Unmodified-Since stays valid.
    PeriodicMessage.objects.filter(pk=schedule.pk).update(**changes)
    return published


def _latest_due_tick(
    schedule: PeriodicMessage, due: datetime, now: datetime
) -> tuple[datetime, int, datetime]:
    """The latest tick at or before `now` (starting from the due tick `due`), how many earlier
    ticks were missed, and the first tick after `now`."""
    if schedule.interval_seconds:
        interval = timedelta(seconds=schedule.interval_seconds)
        missed = (now - due) // interval
        latest = due + missed * interval
        return latest, missed, latest + interval
    ticks = _cron_ticks(schedule.cron, validate_time_zone(schedule.timezone), due)
    latest, missed = due, 0
    for following in ticks:
        if following > now:
            return latest, missed, following
        latest, missed = following, missed + 1
        if missed >= MAX_COUNTED_MISSES:
            break
    # A long outage of a frequent schedule: find the latest tick near now instead of walking.
    latest = _latest_cron_tick(schedule, now)
    return latest, missed, next_tick(schedule, latest)


def _latest_cron_tick(schedule: PeriodicMessage, now: datetime) -> datetime:
    window = timedelta(hours=1)
    while True:
        ticks = _cron_ticks(schedule.cron, validate_time_zone(schedule.timezone), now - window)
        tick = next(ticks)
        if tick <= now:
            for following in ticks:
                if following > now:
                    return tick
                tick = following
        window *= 2


def _still_pending(message_id: int | None) -> bool:
    """Whether the previous tick's message still has jobs to deliver (QUEUED or INFLIGHT)."""
    if message_id is None:
        return False
    return Job.objects.filter(message_id=message_id, status__in=[QUEUED, INFLIGHT]).exists()


def _publish_tick(schedule: PeriodicMessage, tick: datetime) -> tuple[Message | None, bool]:
    """The tick's message and whether it was published now: (new message, True); (existing
    message, False) if this tick was published before; (None, False) if it cannot be published
    (logged; the tick counts as skipped)."""
    message_id = tick_message_id(schedule, tick)
    try:
        message = publish(
            schedule.channel_id,
            bytes(schedule.payload),
            producer=schedule.producer_id,
            message_id=message_id,
            priority=schedule.priority,
            headers=schedule.headers,
            content_type=schedule.content_type,
            ordering_key=schedule.ordering_key,
            event_type=schedule.event_type,
        )
    except DuplicateMessage:
        # Only if the schedule's next_run_at was moved back by hand, or the channel has another
        # message with this ID: the unique message ID keeps the tick from being published twice.
        logger.warning("periodic message %s: tick %s was already published", schedule, tick)
        existing = Message.objects.get(channel_id=schedule.channel_id, public_id=message_id)
        return existing, False
    except PublishError as error:
        logger.error("periodic message %s: tick %s not published: %s", schedule, tick, error)
        return None, False
    return message, True


def reschedule(schedule: PeriodicMessage, now: datetime | None = None) -> None:
    """Set next_run_at for the schedule as it now is: its first tick after now when enabled,
    none when disabled. Called on create, enable, disable and a change of the schedule."""
    if schedule.enabled:
        schedule.next_run_at = first_tick(schedule, now or timezone.now())
    else:
        schedule.next_run_at = None
