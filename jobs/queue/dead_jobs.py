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
from django.db.models import Field
from django.utils import timezone

from jobs.models import DeadLetterAction, Job, requeue_changes
from jobs.partitions import pending
from jobs.queue.queries import statement
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
    parameters: dict[str, Any] = {
        "consumer": dead.consumer_id,
        "since": dead.since,
        "before": dead.before,
        "limit": limit,
    }
    return _run(kind, "range", parameters)


def take_keys(kind: str, keys: Sequence[int]) -> int:
    """Requeue or purge (`kind`) those of the jobs `keys` that are DEAD; how many."""
    return _run(kind, "keys", {"keys": list(keys)}).taken


def count_range(dead: DeadRange) -> int:
    """How many jobs `dead` holds now (an index range of job_consumer_dead_idx)."""
    parameters: dict[str, Any] = {
        "consumer": dead.consumer_id,
        "since": dead.since,
        "before": dead.before,
    }
    with connection.cursor() as cursor:
        cursor.execute(statement("count_dead_range"), dict[str, Any](parameters))
        return int(cursor.fetchone()[0])


def _run(kind: str, picked_by: str, parameters: dict[str, Any]) -> Batch:
    """One batch: sql/dead_jobs.sql's `requeue_dead_range`, `purge_dead_keys`, ...
    (`picked_by`: range or keys). A requeue sets the state machine's columns, each from a
    parameter."""
    if kind == REQUEUE:
        changes = _requeue_columns()
        assignments = ", ".join(f"{column} = %(set_{column})s" for column in changes)
        sql = statement(f"requeue_dead_{picked_by}", requeue_assignments=assignments)
        parameters = {**parameters, **{f"set_{column}": value for column, value in changes.items()}}
    else:
        sql = statement(f"purge_dead_{picked_by}")
    with transaction.atomic(), connection.cursor() as cursor:
        if kind == REQUEUE:
            pending.jobs_reopened()
        cursor.execute(sql, parameters)
        picked_count, taken, last_died_at = cursor.fetchone()
    return Batch(picked_count, taken, last_died_at)


def _requeue_columns() -> dict[str, Any]:
    """The columns a requeue sets and their values: the state machine's (JobQuerySet.transition,
    JobQuerySet.requeue_dead), by column name."""
    check_transition(DEAD, QUEUED)
    changes = {"status_changed_at": timezone.now(), **requeue_changes()}
    return {_column(name): value for name, value in changes.items()}


def _column(name: str) -> str:
    field = cast("Field[Any, Any]", Job._meta.get_field(name))
    return str(field.column)
