"""The pull consumers' statements on PostgreSQL (jobs/queue/postgres.py keeps the rest): a claim
in one statement, an acknowledgement in one, a report's read and its moves in one each.

Pull workers ask over HTTP for batches of 50 to 500 jobs; what costs there is the interpreter's
work per job, so the statements return only what the answer and the log lines need, and no ORM
query is compiled on the way (docs/performance-history.md, "Pull: batch acknowledgement (issue
18)").
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection

from broker.models import Message
from consumers.models import Consumer
from jobs.models import Job
from jobs.queue.leases import CLAIMED_JOB_FIELDS, CLAIMED_MESSAGE_FIELDS, claimed_job
from jobs.queue.rules import PENDING
from jobs.queue.types import HeldRow, NamedJob, PullMove
from jobs.states import INFLIGHT, QUEUED

_JOB = Job._meta.db_table
_MESSAGE = Message._meta.db_table

# An ordered consumer is handed only the head of each ordering key, so that a key's messages go
# one at a time, in order: the job with no pending (rules.PENDING) job of the same consumer and
# key with a lower id.
_HEAD_OF_KEY = f"""AND NOT EXISTS (
        SELECT FROM {_JOB} earlier
        WHERE earlier.consumer_id = j.consumer_id AND earlier.ordering_key = j.ordering_key
            AND earlier.status IN {tuple(status.value for status in PENDING)}
            AND earlier.id < j.id
    )"""

# The pull claim: the consumer's best due jobs, locked (skipping those another worker is taking),
# moved to INFLIGHT under the lease with one attempt more, and returned with their messages.
# MATERIALIZED with the LIMIT: docs/queue-design.md (PostgreSQL bug #15715). Rows are matched on
# the whole primary key, (id, partition_at), as in the push claim (postgres.py).
_CLAIM_FOR_PULL = f"""
WITH due AS MATERIALIZED (
    SELECT j.id, j.partition_at
    FROM {_JOB} j
    WHERE j.consumer_id = %(consumer)s AND j.status = '{QUEUED.value}'
        AND j.next_attempt_at <= %(now)s {{head_of_key}}
    ORDER BY j.priority DESC, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {_JOB} j
SET status = '{INFLIGHT.value}', status_changed_at = %(now)s, attempts = j.attempts + 1,
    lease_expires_at = %(lease_until)s, incremental_timeout = 0
FROM due, {_MESSAGE} m
WHERE j.id = due.id AND j.partition_at = due.partition_at AND j.status = '{QUEUED.value}'
    AND m.id = j.message_id
RETURNING {", ".join(f"j.{name}" for name in CLAIMED_JOB_FIELDS)},
    {", ".join(f"m.{name}" for name in CLAIMED_MESSAGE_FIELDS)}
"""  # noqa: S608
CLAIM_FOR_PULL_SQL = _CLAIM_FOR_PULL.format(head_of_key="")
CLAIM_HEADS_FOR_PULL_SQL = _CLAIM_FOR_PULL.format(head_of_key=_HEAD_OF_KEY)

# A pull consumer's report on one job it holds (DELIVERED or DEAD): the move and what its log line
# says of the job before it (`held`, read in the statement's snapshot) in one round trip; nothing
# when the job is not the consumer's or not INFLIGHT (the caller then looks into why).
ACKNOWLEDGE_PULL_JOB_SQL = f"""
WITH held AS (
    SELECT job.id, job.attempts, job.status_changed_at, message.public_id, message.channel_id,
        message.traceparent, message.tracestate
    FROM {_JOB} job JOIN {_MESSAGE} message ON message.id = job.message_id
    WHERE job.id = %(job)s AND job.consumer_id = %(consumer)s
        AND job.created_at >= %(created_from)s AND job.created_at < %(created_until)s
)
UPDATE {_JOB} job
SET status = %(target)s, status_changed_at = %(now)s, lease_expires_at = NULL,
    last_error = %(reason)s
FROM held
WHERE job.id = held.id AND job.status = '{INFLIGHT.value}'
RETURNING held.attempts, held.status_changed_at, held.public_id, held.channel_id,
    held.traceparent, held.tracestate
"""  # noqa: S608

# A report's read: the consumer's jobs among those named, locked in key order (two reports never
# deadlock): its key and creation time (its public ID), its state, then types.HELD_COLUMNS.
LOCK_REPORTED_SQL = f"""
SELECT job.id, job.created_at, job.status, job.attempts, job.status_changed_at,
    message.public_id, message.channel_id, message.traceparent, message.tracestate
FROM {_JOB} job JOIN {_MESSAGE} message ON message.id = job.message_id
WHERE job.consumer_id = %(consumer)s AND job.id = ANY(%(keys)s::bigint[])
ORDER BY job.id
FOR UPDATE OF job
"""  # noqa: S608

# A report's moves, whatever their targets, in one conditional UPDATE: each job's own state, last
# error and (QUEUED) due time; jobs no longer INFLIGHT are left alone and not counted.
APPLY_PULL_MOVES_SQL = f"""
UPDATE {_JOB} job
SET status = move.target, status_changed_at = %(now)s, lease_expires_at = NULL,
    last_error = move.reason, next_attempt_at = coalesce(move.due_at, job.next_attempt_at)
FROM unnest(%(keys)s::bigint[], %(targets)s::text[], %(reasons)s::text[],
    %(due)s::timestamptz[]) AS move(id, target, reason, due_at)
WHERE job.id = move.id AND job.status = '{INFLIGHT.value}'
"""  # noqa: S608


def claim_for_pull(
    consumer: Consumer, limit: int, lease_until: datetime, now: datetime
) -> list[Job]:
    ordered = consumer.ordering == Consumer.Ordering.ORDERED
    parameters: dict[str, Any] = {
        "consumer": consumer.pk,
        "limit": limit,
        "now": now,
        "lease_until": lease_until,
    }
    with connection.cursor() as cursor:
        cursor.execute(CLAIM_HEADS_FOR_PULL_SQL if ordered else CLAIM_FOR_PULL_SQL, parameters)
        rows = cursor.fetchall()
    return [claimed_job(connection.alias, row) for row in rows]


def acknowledge_pull_job(job: NamedJob, target: str, reason: str, now: datetime) -> HeldRow | None:
    with connection.cursor() as cursor:
        cursor.execute(
            ACKNOWLEDGE_PULL_JOB_SQL,
            {
                "job": job.key,
                "consumer": job.consumer_id,
                "created_from": job.created_from,
                "created_until": job.created_until,
                "target": target,
                "reason": reason,
                "now": now,
            },
        )
        row: HeldRow | None = cursor.fetchone()
    return row


def lock_reported(consumer: Consumer, keys: list[int]) -> list[Sequence[Any]]:
    with connection.cursor() as cursor:
        cursor.execute(LOCK_REPORTED_SQL, {"consumer": consumer.pk, "keys": keys})
        rows: list[Sequence[Any]] = cursor.fetchall()
    return rows


def apply_pull_moves(moves: Sequence[PullMove], now: datetime) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            APPLY_PULL_MOVES_SQL,
            {
                "keys": [move.key for move in moves],
                "targets": [move.target.value for move in moves],
                "reasons": [move.reason for move in moves],
                "due": [move.due_at for move in moves],
                "now": now,
            },
        )
        moved: int = cursor.rowcount
    return moved
