"""Queued, in-flight and dead jobs per consumer, counted only up to a bound (the UI: the
dashboard, a consumer's page).

An exact count of a consumer's backlog reads every entry of its index: millions of rows for a
consumer that is down. The dashboard only needs to tell 120 from 9,000 from "a lot", so each
count stops at `limit` + 1 rows and shows as "≥ 10,000" beyond. One statement for all consumers:
per consumer and status, a LIMITed scan of the partial index of that status
(job_consumer_queued_idx, job_consumer_inflight_idx, job_consumer_dead_idx in
jobs/models/),
so its cost is bounded by consumers x 3 x limit index entries, however large the tables grow.

When each consumer's next attempt is due (`next_due_times`) is read from the claim's own index,
job_consumer_due_idx, a few index probes per consumer.

The totals over every consumer are counted on their own (`status_totals`), up to a higher bound:
a sum of per-consumer counts that stopped at their bound would be neither exact nor the bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper

from consumers.models import Consumer
from jobs.models import Job
from jobs.states import DEAD, INFLIGHT, QUEUED

COUNT_LIMIT = 10_000
TOTAL_LIMIT = 100_000  # the dashboard's tiles: every consumer's jobs of a status


@dataclass(frozen=True)
class BoundedCount:
    """A count that stopped at `limit`: "≥ 10,000" when there were more, visibly a lower
    bound."""

    value: int
    limit: int

    @property
    def capped(self) -> bool:
        return self.value > self.limit

    def __str__(self) -> str:
        return f"≥ {self.limit:,}" if self.capped else f"{self.value:,}"


@dataclass(frozen=True)
class QueueDepth:
    queued: BoundedCount
    in_flight: BoundedCount
    dead: BoundedCount


def _bounded_count_sql(status: str, of_consumer: bool = True) -> str:
    # A scalar subquery over a LIMITed one: the count stops at limit + 1 rows. The status is a
    # literal (not a parameter) so that PostgreSQL matches the partial index of that status.
    # Of the consumer `c` of the enclosing query, or of every consumer.
    consumer = "j.consumer_id = c.id AND " if of_consumer else ""
    return f"""(SELECT COUNT(*) FROM (
        SELECT 1 FROM {Job._meta.db_table} j
        WHERE {consumer}j.status = '{status}' LIMIT %(bound)s
    ) AS first_rows)"""  # noqa: S608 (a table name and a status constant; no user input)


_QUEUE_DEPTH_SQL = f"""
SELECT c.id, {_bounded_count_sql(QUEUED)}, {_bounded_count_sql(INFLIGHT)},
    {_bounded_count_sql(DEAD)}
FROM {Consumer._meta.db_table} c
"""  # noqa: S608


# Every consumer's jobs of each status, each count stopping at the bound: index-only scans of the
# statuses' partial indexes (job_consumer_queued_idx, job_lease_idx, job_dead_recent_idx).
_STATUS_TOTALS_SQL = ", ".join(
    _bounded_count_sql(status, of_consumer=False) for status in (QUEUED, INFLIGHT, DEAD)
)


def status_totals(limit: int = TOTAL_LIMIT) -> QueueDepth:
    """Queued, in-flight and dead jobs of every consumer, each counted up to `limit` + 1."""
    with _reading().cursor() as cursor:
        cursor.execute(f"SELECT {_STATUS_TOTALS_SQL}", {"bound": limit + 1})
        queued, in_flight, dead = cursor.fetchone() or (0, 0, 0)
    return QueueDepth(
        BoundedCount(queued, limit), BoundedCount(in_flight, limit), BoundedCount(dead, limit)
    )


def queue_depths(limit: int = COUNT_LIMIT, consumer_id: int | None = None) -> dict[int, QueueDepth]:
    """Per consumer ID (all, or the one given): its queued, in-flight and dead jobs, each counted
    up to `limit` + 1."""
    sql, parameters = _QUEUE_DEPTH_SQL, {"bound": limit + 1}
    if consumer_id is not None:
        sql, parameters = (
            f"{sql} WHERE c.id = %(consumer)s",
            {**parameters, "consumer": consumer_id},
        )
    with _reading().cursor() as cursor:
        cursor.execute(sql, parameters)
        rows = cursor.fetchall()
    return {
        consumer_id: QueueDepth(
            BoundedCount(queued, limit), BoundedCount(in_flight, limit), BoundedCount(dead, limit)
        )
        for consumer_id, queued, in_flight, dead in rows
    }


# The earliest due time of each consumer's QUEUED jobs, without reading its backlog: the claim's
# index (job_consumer_due_idx: consumer, priority descending, due time) holds each priority's
# earliest job first, so a recursive walk steps from one priority present to the next lower one,
# an index probe each, and the earliest of those heads is the answer. Priorities are few, so this
# is a few probes per consumer, where MIN() would read every queued job of a consumer that is down.
_NEXT_DUE_SQL = f"""
SELECT c.id, (
    WITH RECURSIVE present(priority) AS (
        SELECT (SELECT j.priority FROM {Job._meta.db_table} j
            WHERE j.consumer_id = c.id AND j.status = '{QUEUED}'
            ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM {Job._meta.db_table} j
            WHERE j.consumer_id = c.id AND j.status = '{QUEUED}' AND j.priority < present.priority
            ORDER BY j.priority DESC LIMIT 1)
        FROM present WHERE present.priority IS NOT NULL
    )
    SELECT MIN((SELECT j.next_attempt_at FROM {Job._meta.db_table} j
        WHERE j.consumer_id = c.id AND j.status = '{QUEUED}' AND j.priority = present.priority
        ORDER BY j.next_attempt_at LIMIT 1))
    FROM present
)
FROM {Consumer._meta.db_table} c
"""  # noqa: S608 (table names and a status constant; no user input)


def queue_depth_of(consumer_id: int, limit: int = COUNT_LIMIT) -> QueueDepth:
    """One consumer's queued, in-flight and dead jobs (its page), counted as the dashboard's."""
    none = BoundedCount(0, limit)
    return queue_depths(limit, consumer_id).get(consumer_id, QueueDepth(none, none, none))


def next_due_times(consumer_id: int | None = None) -> dict[int, datetime | None]:
    """Per consumer ID (all, or the one given): when its earliest QUEUED job is due; None when it
    has none. What holds a consumer back (paused, circuit, 429) is on its row, not here."""
    sql, parameters = _NEXT_DUE_SQL, {}
    if consumer_id is not None:
        sql, parameters = f"{sql} WHERE c.id = %(consumer)s", {"consumer": consumer_id}
    with _reading().cursor() as cursor:
        cursor.execute(sql, parameters)
        return dict(cursor.fetchall())


def _reading() -> BaseDatabaseWrapper:
    """The database these counts are read from: the read replica in a request that may read
    there (broker/db_routing.py), else the primary. Raw SQL is not routed by itself."""
    return connections[router.db_for_read(Job)]
