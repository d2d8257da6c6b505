"""Running the queue's statements of publishing, release, replay and the push claim: each hot
operation one statement and one round trip. The statements are those of jobs/queue/sql/
(publish.sql, push_claim.sql), run by name; this module gives them their parameters and reads
their answers
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from broker.models import Message
from jobs.partitions import pending
from jobs.queue.postgres_batch import batch_parameters, inserted_batch
from jobs.queue.queries import statement
from jobs.queue.rules import producer_rule_parameters, push_lease_expiry
from jobs.queue.types import (
    ClaimedJob,
    ClaimRooms,
    Inserted,
    InsertedBatch,
    MessageBatch,
    TokenDigests,
)


def insert_message(message: Message, tokens: TokenDigests | None = None) -> Inserted:
    # Alone, the statement commits by itself; inside a caller's transaction it needs a
    # savepoint so that a refused message (duplicate ID) leaves that transaction usable.
    savepoint = transaction.atomic() if connection.in_atomic_block else nullcontext()
    parameters = _message_parameters(message) | _check_parameters(tokens)
    with savepoint, connection.cursor() as cursor:
        cursor.execute(statement("insert_message"), parameters)
        row = cursor.fetchone()
    message.pk, message.status, message.dispatched_at = row[:3]
    message._state.adding = message.pk is None
    return Inserted.from_checks(*row[3:7])


def insert_messages(batch: MessageBatch) -> InsertedBatch:
    # As insert_message: a savepoint only inside a caller's transaction.
    savepoint = transaction.atomic() if connection.in_atomic_block else nullcontext()
    with savepoint, connection.cursor() as cursor:
        cursor.execute(statement("insert_messages"), batch_parameters(batch))
        return inserted_batch(batch, cursor.fetchone())


def release_due_messages(now: datetime, limit: int) -> int:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement("release_due_messages"), {"now": now, "limit": limit})
        released, _ = cursor.fetchone()
    return int(released)


def add_jobs(message: Message, consumer_ids: list[int], now: datetime) -> None:
    if not consumer_ids:
        return
    parameters: dict[str, Any] = {
        "message": message.pk,
        "consumers": consumer_ids,
        "priority": message.priority,
        "ordering_key": message.ordering_key,
        "now": now,
    }
    with connection.cursor() as cursor:
        cursor.execute(statement("add_jobs"), parameters)


def claim_for_push(
    limit: int, now: datetime, rooms: ClaimRooms, dispatcher_id: str | None
) -> list[ClaimedJob]:
    with connection.cursor() as cursor:
        parameters = claim_parameters(limit, now, rooms, dispatcher_id)
        cursor.execute(statement("claim_for_push"), parameters)
        rows = cursor.fetchall()
    return [ClaimedJob.from_row(row) for row in rows]


def wake_dispatchers() -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement("wake_dispatchers"))


def _message_parameters(message: Message) -> dict[str, Any]:
    return {
        "channel": message.channel_id,
        "producer": message.producer_id,
        "public_id": message.public_id,
        "payload": message.payload,
        "payload_file": message.payload_file,
        "payload_size": message.payload_size,
        "content_type": message.content_type,
        "priority": message.priority,
        "headers": json.dumps(message.headers),
        "ordering_key": message.ordering_key,
        "event_type": message.event_type,
        "now": message.received_at,
        "traceparent": message.traceparent,
        "tracestate": message.tracestate,
    }


def _check_parameters(tokens: TokenDigests | None) -> dict[str, Any]:
    return {
        "check_tokens": tokens is not None,
        "channel_token": tokens.channel if tokens else None,
        "producer_token": tokens.producer if tokens else None,
        **producer_rule_parameters(),
    }


def claim_parameters(
    limit: int, now: datetime, rooms: ClaimRooms, dispatcher_id: str | None
) -> dict[str, Any]:
    """The parameters of `claim_for_push` (sql/push_claim.sql)."""
    consumers = list(rooms.rooms)
    return {
        "now": now,
        "lease_until": push_lease_expiry(now),
        "limit": limit,
        "candidates": 2 * limit,
        "dispatcher": dispatcher_id,
        "room_consumers": consumers,
        "rooms": [rooms.rooms[c] for c in consumers],
        "new": [c in rooms.new for c in consumers],
        "new_room": rooms.new_room,
        "new_budget": rooms.new_budget,
        "pending_from": pending.pending_from(),
    }
