"""Running the pull consumers' statements (jobs/queue/sql/pull.sql): a claim in one statement, an
acknowledgement in one, a report's read and its moves in one each.

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

from consumers.models import Consumer
from jobs.models import Job
from jobs.queue.leases import claimed_job
from jobs.queue.queries import statement
from jobs.queue.types import HeldRow, NamedJob, PullMove


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
        name = "claim_heads_for_pull" if ordered else "claim_for_pull"
        cursor.execute(statement(name), parameters)
        rows = cursor.fetchall()
    return [claimed_job(connection.alias, row) for row in rows]


def acknowledge_pull_job(job: NamedJob, target: str, reason: str, now: datetime) -> HeldRow | None:
    with connection.cursor() as cursor:
        cursor.execute(
            statement("acknowledge_pull_job"),
            {
                "job": job.key,
                "channel": job.consumer.channel_id,
                "consumer": job.consumer.consumer_id,
                "channel_token": job.consumer.channel_token,
                "stored_token": job.consumer.stored_token,
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
        cursor.execute(statement("lock_reported"), {"consumer": consumer.pk, "keys": keys})
        rows: list[Sequence[Any]] = cursor.fetchall()
    return rows


def apply_pull_moves(moves: Sequence[PullMove], now: datetime) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            statement("apply_pull_moves"),
            {
                "keys": [move.key for move in moves],
                "targets": [move.target.value for move in moves],
                "reasons": [move.reason for move in moves],
                "due": [move.due_at for move in moves],
                "refunds": [move.refund for move in moves],
                "now": now,
            },
        )
        moved: int = cursor.rowcount
    return moved


def extend_leases(keys: list[int], untils: list[datetime]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(statement("extend_leases"), {"keys": keys, "untils": untils})
        extended: int = cursor.rowcount
    return extended
