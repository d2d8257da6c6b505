"""Where the push claim looks: the partitions of jobs that can hold pending work.

The claim names its jobs by status and consumer, not by `partition_at`, so PostgreSQL would plan
it over every partition of jobs and each of their indexes: about 1.2 ms a partition, most of it
planning (docs/scaling.md, "Partitions"). Pending jobs (QUEUED, INFLIGHT) are nearly all young,
though: a delivered or dead job never becomes pending again but by a requeue or a replay. So
the claim is given a lower bound, `partition_at >= pending_from()`, which PostgreSQL prunes by
when it plans: only the partitions from the oldest one holding a pending job are planned.

The bound is the least of
- the start of the oldest partition with a pending job (found by one probe per partition, oldest
  first, stopping at the first that has one);
- the oldest `partition_at` of a pending job in the DEFAULT partition (rows no partition covers
  may have any time);
- the database's now minus RECENT_MARGIN: a transaction that began before the bound was worked
  out inserts its jobs with its own start time (`partition_at` defaults to now()).

Each process keeps the bound for REFRESH_SECONDS at most: a job made pending in a partition
below it by a path nobody announced is claimed at most that much later. The paths that put
finished jobs back in the queue (`JobQuerySet.transition` for requeue and replay, the batch
requeue of jobs/queue/dead_jobs.py) call `jobs_reopened()`: this process forgets its bound at
once, and the others at that transaction's commit, when its NOTIFY on REOPENED_CHANNEL reaches
their listener (jobs/queue/wakeup.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction

from jobs.partitions.catalog import JOBS, partitions
from jobs.states import PENDING_SQL

REFRESH_SECONDS = 10.0
RECENT_MARGIN = timedelta(hours=1)
REOPENED_CHANNEL = "broker_jobs_reopened"
EARLIEST = datetime.min.replace(tzinfo=UTC)  # the bound when the initial partition is pending

_PENDING = f"status IN {PENDING_SQL}"
_PROBE = "SELECT EXISTS (SELECT FROM {table} WHERE " + _PENDING + ")"  # noqa: S608
_DEFAULT_AND_NOW = f"SELECT (SELECT min({JOBS.key}) FROM {JOBS.default} WHERE {_PENDING}), now()"  # noqa: S608


class _Bound:
    """This process's bound and when it was worked out (monotonic); None: work it out again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.value: datetime | None = None
        self.found_at = 0.0

    def get(self) -> datetime:
        with self.lock:
            if self.value is not None and self.clock() - self.found_at < REFRESH_SECONDS:
                return self.value
        found_at = self.clock()
        value = oldest_pending_partition_at()
        with self.lock:
            self.value, self.found_at = value, found_at
        return value

    def forget(self) -> None:
        with self.lock:
            self.value = None


_bound = _Bound()


def pending_from() -> datetime:
    """The lower bound of `partition_at` for the claim: no pending job lies below it, but those
    this process was not told of within REFRESH_SECONDS."""
    return _bound.get()


def forget() -> None:
    """Work the bound out again before the next claim of this process."""
    _bound.forget()


def jobs_reopened() -> None:
    """Finished jobs are being made pending again in this transaction (a requeue, a replay):
    they may lie below every process's bound."""
    forget()
    transaction.on_commit(forget)  # a claim of ours before the commit may have read it early
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [REOPENED_CHANNEL])


def oldest_pending_partition_at() -> datetime:
    """The bound as the database has it now (see the module's docstring)."""
    with connection.cursor() as cursor:
        cursor.execute(_DEFAULT_AND_NOW)
        in_default, now = cursor.fetchone()
        bound: datetime = now - RECENT_MARGIN
        if in_default is not None:
            bound = min(bound, in_default)
        for partition in partitions(JOBS):
            if partition.start is not None and partition.start >= bound:
                break  # this one and those after it are planned anyway
            cursor.execute(_PROBE.format(table=connection.ops.quote_name(partition.name)))
            if cursor.fetchone()[0]:
                return min(bound, partition.start or EARLIEST)
    return bound
