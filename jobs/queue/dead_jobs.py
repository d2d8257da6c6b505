"""Requeue and purge of dead jobs in batches: each call takes at most one batch, in one short
transaction (jobs/dlq_actions.py drives them; docs/api.md, "Dead-letter queue").

A batch is either the next `limit` of one consumer's dead jobs in the order they died, from a
time on (`DeadRange`: a dead-letter queue walked by job_consumer_dead_idx), or the dead jobs
among a few given keys (an operator's selection). A requeue makes the changes of the state
machine's DEAD -> QUEUED (JobQuerySet.requeue_dead); a purge deletes the jobs' attempts, then the
jobs.

A batch is one statement, and its jobs are picked FOR UPDATE SKIP LOCKED: a job
that another transaction holds (a concurrent action on the same queue, a pull worker taking it)
is left to it, and a batch never waits on anyone. It binds a handful of parameters whatever its
size (a list of keys is one array), so no batch nears the protocol's 65,535 of server-side
binding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import Field, QuerySet
from django.utils import timezone

from jobs.models import (
    CLOCK_ALLOWANCE,
    DeadLetterAction,
    DeliveryAttempt,
    Job,
    _requeue_changes,
)
from jobs.states import DEAD, QUEUED, check_transition

REQUEUE, PURGE = DeadLetterAction.Kind.REQUEUE, DeadLetterAction.Kind.PURGE


@dataclass(frozen=True)
class DeadRange:
    """One consumer's jobs that died at or after `since` and before `before`."""

    consumer_id: int
    since: datetime
    before: datetime


@dataclass(frozen=True)
class Batch:
    picked: int  # dead jobs the batch found: fewer than asked for means none are left after it
    taken: int  # of them, those requeued or deleted
    last_died_at: datetime | None  # when the latest of them died: where the next batch begins


def take_range(kind: str, dead: DeadRange, limit: int) -> Batch:
    """Requeue or purge (`kind`) the first `limit` jobs of `dead`, in the order they died."""
    parameters = {
        "consumer": dead.consumer_id,
        "since": dead.since,
        "before": dead.before,
        "limit": limit,
    }
    return _run(kind, _RANGE_SQL, parameters)


def take_keys(kind: str, keys: Sequence[int]) -> int:
    """Requeue or purge (`kind`) those of the jobs `keys` that are DEAD; how many."""
    return _run(kind, _KEYS_SQL, {"keys": list(keys)}).taken


def count_range(dead: DeadRange) -> int:
    """How many jobs `dead` holds now (an index range of job_consumer_dead_idx)."""
    return _in_range(dead).count()


def _in_range(dead: DeadRange) -> QuerySet[Job]:
    return Job.objects.filter(
        consumer_id=dead.consumer_id,
        status=DEAD,
        status_changed_at__gte=dead.since,
        status_changed_at__lt=dead.before,
    )


_JOB, _ATTEMPT = Job._meta.db_table, DeliveryAttempt._meta.db_table

# Which jobs a batch takes, locked. A range is read from job_consumer_dead_idx (consumer,
# status_changed_at) WHERE status = 'DEAD' (a literal, so that even a generic plan of a prepared
# statement matches the partial index): `since` moves on with every batch, so no batch walks
# again through the index entries of the jobs that earlier batches took. (For a queue smaller
# than a batch the planner may rather read the consumer's jobs and sort them: as cheap then.)
_RANGE_SQL = f"""
SELECT id, partition_at, created_at, status_changed_at FROM {_JOB}
WHERE consumer_id = %(consumer)s AND status = '{DEAD}'
    AND status_changed_at >= %(since)s AND status_changed_at < %(before)s
ORDER BY status_changed_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""  # noqa: S608 (table names from the models, constants: every value is a parameter)
_KEYS_SQL = f"""
SELECT id, partition_at, created_at, status_changed_at FROM {_JOB}
WHERE id = ANY(%(keys)s::bigint[]) AND status = '{DEAD}'
FOR UPDATE SKIP LOCKED
"""  # noqa: S608

# The picked jobs are named to the statements that change them by arrays of their keys
# (`= ANY(ARRAY(...))`), so that each reads them by its primary key or attempt_job_idx whatever
# row count the planner guessed for the batch. The range of their time partitions is named too
# (a range: PostgreSQL prunes partitions by it as the statement runs, but not by an array of
# values): it then reads only those partitions, where by id alone it probed every partition's
# index for every job (docs/performance-history.md). A dead job's attempts started after it was
# created and before it died: only the attempt partitions between the batch's oldest creation
# and latest death are read (CLOCK_ALLOWANCE wider each way, for the clocks of other hosts). An
# attempt recorded more than that after its job died (by a dispatcher stalled for a day) is left
# behind, an orphan row that goes with its partition.
_ALLOWANCE = f"interval '{CLOCK_ALLOWANCE.total_seconds():.0f} seconds'"
_PICKED = "ANY(ARRAY(SELECT id FROM picked))"
_PICKED_JOBS = f"""id = {_PICKED} AND status = '{DEAD}'
    AND partition_at BETWEEN (SELECT min(partition_at) FROM picked)
        AND (SELECT max(partition_at) FROM picked)"""  # noqa: S608
# The jobs stay locked from the pick on, so `status = 'DEAD'` holds for each; it is the state
# machine's condition all the same (JobQuerySet.transition).
_PURGE = f"""
attempts AS (
    DELETE FROM {_ATTEMPT} WHERE job_id = {_PICKED}
        AND started_at >= (SELECT min(created_at) FROM picked) - {_ALLOWANCE}
        AND started_at <= (SELECT max(status_changed_at) FROM picked) + {_ALLOWANCE}
),
taken AS (DELETE FROM {_JOB} WHERE {_PICKED_JOBS} RETURNING 1)
"""  # noqa: S608


def _requeue(columns: list[str]) -> str:
    assignments = ", ".join(f"{column} = %(set_{column})s" for column in columns)
    return f"""
taken AS (
    UPDATE {_JOB} SET status = '{QUEUED}', {assignments}
    WHERE {_PICKED_JOBS} RETURNING 1
)
"""  # noqa: S608


def _run(kind: str, picked: str, parameters: dict[str, Any]) -> Batch:
    if kind == REQUEUE:
        changes = _requeue_columns()
        action = _requeue(list(changes))
        parameters = {**parameters, **{f"set_{column}": value for column, value in changes.items()}}
    else:
        action = _PURGE
    sql = f"""
WITH picked AS ({picked}), {action}
SELECT (SELECT count(*) FROM picked), (SELECT count(*) FROM taken),
    (SELECT max(status_changed_at) FROM picked)
"""  # noqa: S608
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, parameters)
        picked_count, taken, last_died_at = cursor.fetchone()
    return Batch(picked_count, taken, last_died_at)


def _requeue_columns() -> dict[str, Any]:
    """The columns a requeue sets and their values: the state machine's (JobQuerySet.transition,
    JobQuerySet.requeue_dead), by column name."""
    check_transition(DEAD, QUEUED)
    changes = {"status_changed_at": timezone.now(), **_requeue_changes()}
    return {_column(name): value for name, value in changes.items()}


def _column(name: str) -> str:
    field = cast("Field[Any, Any]", Job._meta.get_field(name))
    return str(field.column)
