"""Jobs per consumer and status, for /job-status, /dlq-status and /metrics (docs/api.md).

Counting on every read does not scale with the table. QUEUED, INFLIGHT and DEAD jobs each have a
partial index, so counting one of them reads that index alone, but every entry of it: about 60-90
ms a million on a small server. DELIVERED jobs, nearly every job, have none (it would be as large
as the table and cost every delivery a write), so counting them reads the whole table: 2.6 s at
25,000,000 jobs.

So each status is counted live while that is cheap, and read from the summary (`JobStatusSummary`)
beyond, by PostgreSQL's own estimate of what a live count would read (pg_class.reltuples, kept by
vacuum and analyze, free to read):
- DELIVERED: live while the jobs table holds fewer than BROKER_LIVE_COUNT_MAX_JOBS;
- QUEUED, INFLIGHT, DEAD: live while the status's index holds fewer than
  BROKER_LIVE_COUNT_MAX_STATUS_JOBS.
A status due to come from a summary that was never refreshed (just after an upgrade) is counted
live instead.

`refresh_job_status_summary` (a housekeeping schedule) recounts every status of every consumer in
one read of the table and replaces the summary in the same short transaction; each row says when
(`refreshedAt` on the API).

QUEUED jobs are dated by `enqueued_at` (when they joined the queue: published, requeued or
replayed), the others by `status_changed_at`: the QUEUED jobs' index holds the former, so their
oldest and newest come from the index alone, and it is what tells how long the queue has been
waiting (a job back for its next retry keeps its age).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, connections, router, transaction
from django.db.models import (
    Case,
    CharField,
    Count,
    DateTimeField,
    F,
    Max,
    Min,
    QuerySet,
    Value,
    When,
)
from django.utils import timezone

from broker.conf import broker_settings
from jobs.models import Job, JobStatusSummary
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED, JobStatus

STATUSES = (QUEUED, INFLIGHT, DELIVERED, DEAD)
LOCK_ID = 0x6272_6F6B_6572_4A53  # pg_try_advisory_xact_lock key of the refresh ("brokerJS")

# What a live count of each status reads (jobs/models/): its partial index, or the table.
READS = {
    QUEUED: "job_consumer_queued_age_idx",  # (consumer, enqueued_at): count, oldest, newest
    INFLIGHT: "job_consumer_inflight_idx",  # (consumer); their times from the table: they are few
    DEAD: "job_consumer_dead_idx",  # (consumer, status_changed_at)
    DELIVERED: Job._meta.db_table,
}


@dataclass(frozen=True)
class StatusCount:
    consumer_id: int
    status: JobStatus
    count: int
    oldest: datetime | None  # None when counted without times
    newest: datetime | None
    refreshed_at: datetime | None  # None: counted now; else when the summary counted it


@dataclass(frozen=True)
class JobCounts:
    counts: list[StatusCount]  # one per consumer and status it has jobs in
    summarised: frozenset[JobStatus]  # the statuses whose counts come from the summary
    refreshed_at: datetime | None  # when the summary was last refreshed; None: never


def status_counts(statuses: Iterable[JobStatus] = STATUSES, *, times: bool = True) -> JobCounts:
    """Each consumer's jobs in each of `statuses`, live or from the summary as the module's
    docstring says; with the oldest and newest of them unless `times` is false (their min and max
    cost a live count about a fifth more)."""
    statuses = list(statuses)
    refreshed_at = summary_refreshed_at()
    summarised = _too_large(statuses) if refreshed_at else []
    live = [status for status in statuses if status not in summarised]
    counts = _summary(summarised) + _live_counts(live, times)
    return JobCounts(counts, frozenset(summarised), refreshed_at)


def summary_refreshed_at() -> datetime | None:
    """When the summary was last refreshed; None if never (or only over an empty table)."""
    last: datetime | None = JobStatusSummary.objects.aggregate(last=Max("refreshed_at"))["last"]
    return last


# --- reading ------------------------------------------------------------------------------------


def _too_large(statuses: list[JobStatus]) -> list[JobStatus]:
    """Those of `statuses` that PostgreSQL estimates past their live count limit."""
    estimates = _estimated_rows([READS[status] for status in statuses])
    return [status for status in statuses if estimates[READS[status]] >= _limit(status)]


def _limit(status: JobStatus) -> int:
    if status == DELIVERED:
        return broker_settings.BROKER_LIVE_COUNT_MAX_JOBS
    return broker_settings.BROKER_LIVE_COUNT_MAX_STATUS_JOBS


def _summary(statuses: list[JobStatus]) -> list[StatusCount]:
    rows = JobStatusSummary.objects.filter(status__in=statuses)
    return [
        StatusCount(
            row.consumer_id,
            JobStatus(row.status),
            row.count,
            row.oldest,
            row.newest,
            row.refreshed_at,
        )
        for row in rows
    ]


def _estimated_rows(relations: list[str]) -> dict[str, float]:
    """PostgreSQL's estimate of the rows in each relation (a table or an index), summed over its
    partitions if it is partitioned; 0 where it has none yet (never vacuumed nor analyzed)."""
    estimates = dict.fromkeys(relations, 0.0)
    reading = connections[router.db_for_read(Job)]
    with reading.cursor() as cursor:
        cursor.execute(_ESTIMATES_SQL, [relations])
        for name, rows in cursor.fetchall():
            estimates[name] = float(rows or 0)
    return estimates


# A partitioned table or index has no rows of its own: its partitions' estimates are added up
# (pg_partition_tree lists nothing for a plain one). reltuples is -1 before the first vacuum or
# analyze.
_ESTIMATES_SQL = """
SELECT name, COALESCE(
    (
        SELECT SUM(GREATEST(c.reltuples, 0))
        FROM pg_partition_tree(to_regclass(name)) AS tree JOIN pg_class AS c ON c.oid = tree.relid
        WHERE tree.isleaf
    ),
    (SELECT GREATEST(c.reltuples, 0) FROM pg_class AS c WHERE c.oid = to_regclass(name))
)
FROM unnest(%s::text[]) AS name
"""


def _live_counts(statuses: list[JobStatus], times: bool = True) -> list[StatusCount]:
    """Count `statuses` now: one statement (so one snapshot), a grouped read per status."""
    if not statuses:
        return []
    first, *others = [_counted(status, times) for status in statuses]
    rows = first.union(*others, all=True) if others else first
    return [
        StatusCount(consumer_id, JobStatus(status), n, oldest, newest, None)
        for consumer_id, status, n, oldest, newest in rows
    ]


def _counted(
    status: JobStatus, times: bool = True
) -> QuerySet[Job, tuple[int, str, int, datetime | None, datetime | None]]:
    """Per consumer: its jobs in `status`, the oldest and the newest (or None). The status is a
    constant of the SELECT, not a grouped column, so that an index without it can answer alone."""
    stamp = "enqueued_at" if status == QUEUED else "status_changed_at"
    none = Value(None, output_field=DateTimeField())
    return (
        Job.objects.filter(status=status)
        .order_by()
        .values("consumer")
        .annotate(
            status_name=Value(status.value, output_field=CharField()),
            # COUNT(*), not COUNT(id): the partial indexes hold no id (counting ids reads the
            # table: 1.3 s at 5,000,000 dead jobs, where the index alone takes 0.45 s).
            n=Count("*"),
            oldest=Min(stamp) if times else none,
            newest=Max(stamp) if times else none,
        )
        .values_list("consumer", "status_name", "n", "oldest", "newest")
    )


# --- refresh ------------------------------------------------------------------------------------


def refresh_job_status_summary() -> int | None:
    """Recount every consumer's jobs per status into the summary; return the rows written, or None
    if another refresh was running (its figures are as new: nothing to add). Run every few
    minutes (install_schedules) or by hand: `manage.py refresh_job_status_summary`.

    One plain read of the whole table (no lock on any job: publishers and dispatchers go on), in
    the transaction that then replaces the summary's few rows, so readers see the old summary or
    the new one, never a mix. At 25,000,000 jobs the read takes about 3 s.
    """
    with transaction.atomic():
        if not _try_lock():
            return None
        refreshed_at = timezone.now()  # before the read: its snapshot is at least this new
        rows = [
            JobStatusSummary(
                consumer_id=consumer_id,
                status=status,
                count=n,
                oldest=oldest,
                newest=newest,
                refreshed_at=refreshed_at,
            )
            for consumer_id, status, n, oldest, newest in _all_counts()
        ]
        JobStatusSummary.objects.all().delete()
        JobStatusSummary.objects.bulk_create(rows)
    return len(rows)


def _try_lock() -> bool:
    """Let one refresh run at a time: a second would read the whole table again for the same
    figures."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [LOCK_ID])
        row = cursor.fetchone()
    return bool(row and row[0])


def _all_counts() -> QuerySet[Job, tuple[int, str, int, datetime, datetime]]:
    """Every consumer's jobs per status with the oldest and newest: one grouped scan."""
    stamp = Case(When(status=QUEUED, then=F("enqueued_at")), default=F("status_changed_at"))
    return (
        Job.objects.order_by()
        .values("consumer", "status")
        .annotate(n=Count("*"), oldest=Min(stamp), newest=Max(stamp))
        .values_list("consumer", "status", "n", "oldest", "newest")
    )
