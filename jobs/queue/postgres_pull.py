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
from jobs.queue.types import HeldRow, NamedJob, PullCredentials, PullMove


def claim_for_pull(
    claimant: Consumer | PullCredentials, limit: int, lease_until: datetime, now: datetime
) -> list[Job]:
    """The claim of a consumer the caller checked, or of one whose credentials the statement
    checks (`claimant` a PullCredentials: it claims nothing unless they match)."""
    parameters: dict[str, Any] = {"limit": limit, "now": now, "lease_until": lease_until}
    if isinstance(claimant, PullCredentials):
        ordered, suffix = claimant.ordered, "_proven"
        parameters.update(_credential_parameters(claimant))
        parameters["ordering"] = (
            Consumer.Ordering.ORDERED if ordered else Consumer.Ordering.NONE
        ).value
    else:
        ordered, suffix = claimant.ordering == Consumer.Ordering.ORDERED, ""
        parameters["consumer"] = claimant.pk
    with connection.cursor() as cursor:
        name = "claim_heads_for_pull" if ordered else "claim_for_pull"
        cursor.execute(statement(name + suffix), parameters)
        rows = cursor.fetchall()
    return [claimed_job(connection.alias, row) for row in rows]


def _credential_parameters(credentials: PullCredentials) -> dict[str, Any]:
    """The parameters of proven_pull_consumer (jobs/queue/sql/pull.sql)."""
    return {
        "channel": credentials.channel_id,
        "consumer": credentials.consumer_id,
        "channel_token": credentials.channel_token,
        "stored_token": credentials.stored_token,
    }


def acknowledge_pull_job(job: NamedJob, target: str, reason: str, now: datetime) -> HeldRow | None:
    with connection.cursor() as cursor:
        cursor.execute(
            statement("acknowledge_pull_job"),
            {
                "job": job.key,
                **_credential_parameters(job.consumer),
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
