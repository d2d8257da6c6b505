"""Housekeeping tasks, run as django-q2 schedules (docs/housekeeping.md).

Each task is a plain function that django-q2 calls by its dotted name; `install_schedules`
(`manage.py install_schedules`) creates their schedules. They are safe to run at any time, by
hand too, and to run twice: each deletes only what is finished and old.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from broker.conf import broker_settings
from broker.models import Message
from jobs import partitions
from jobs.models import Job
from jobs.states import DELIVERED

BATCH = 1000  # messages deleted per statement: short transactions, bounded memory


def purge_delivered(days: int | None = None) -> int:
    """Delete messages received more than `days` ago (BROKER_RETENTION_DAYS) whose every job was
    delivered, with their jobs and attempts; return how many messages went.

    Dead, queued and in-flight jobs keep their message: they are the work left, and the DLQ.
    Messages that had no consumer (ACKNOWLEDGED) go by age alone; scheduled ones never do.
    On PostgreSQL the jobs and attempts go by time partition (jobs/partitions/), so a delivered
    job can outlive the retention by up to BROKER_PARTITION_DAYS; its message goes after it. Where
    `spark_etl archive` runs, this deletes nothing: the archive deletes what it has copied.
    """
    days = broker_settings.BROKER_RETENTION_DAYS if days is None else days
    if not days:
        return 0
    now = timezone.now()
    cutoff = now - timedelta(days=days)
    unfinished = Job.objects.filter(message=OuterRef("pk"))
    if partitions.is_partitioned(partitions.JOBS):
        if partitions.archive_owns_retention():
            return 0  # spark_etl archive deletes old messages, once they are in Parquet
        # Jobs go with their time partitions and a message once it has none left: deleting
        # delivered jobs row by row is what the partitions are there to avoid.
        partitions.retire_partitions(now, days)
    else:
        unfinished = unfinished.exclude(status=DELIVERED)
    old = (
        Message.objects.filter(received_at__lt=cutoff)
        .exclude(status=Message.Status.SCHEDULED)
        .exclude(Exists(unfinished))
    )
    deleted = 0
    while batch := list(old.values_list("pk", flat=True)[:BATCH]):
        with transaction.atomic():
            # Locked, then checked again by a statement of its own (so it sees what committed
            # while it waited): a replay, which locks its message, may have queued a job since.
            list(Message.objects.filter(pk__in=batch).select_for_update().values_list("pk"))
            ids = list(old.filter(pk__in=batch).values_list("pk", flat=True))
            Message.objects.filter(pk__in=ids).delete()  # jobs and attempts cascade
        deleted += len(ids)
    return deleted


def purge_orphan_payloads(hours: int = 24) -> int:
    """Delete offloaded payload files that no message names (docs/delivery.md, "Large payloads"),
    written `hours` ago."""
    return Message.purge_orphan_payloads(timedelta(hours=hours))
