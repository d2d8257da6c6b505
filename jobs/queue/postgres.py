"""The queue's statements: each hot operation one statement and one round trip.

Every statement of the queue that is written in SQL lives here, but for the push claim's and the
pull consumers' own in jobs/queue/postgres_push.py and jobs/queue/postgres_pull.py (procrastinate
keeps its queries in one file the same way); the rules they share are those of
jobs/queue/rules.py. Table names come from model metadata and code constants are literals (so that
PostgreSQL matches the partial indexes even with a generic plan); every value is a parameter. Why
the statements are shaped as they are: docs/queue-design.md.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from broker.models import Channel, Message, Producer
from consumers.models import Consumer
from jobs.delivery import AttemptResult
from jobs.models import Job
from jobs.queue.postgres_batch import batch_parameters, insert_batch_sql, inserted_batch
from jobs.queue.postgres_push import (
    CLAIM_FOR_PUSH_SQL,
    RECORD_DELIVERIES_SQL,
    claim_parameters,
)
from jobs.queue.rules import (
    WAKEUP_CHANNEL,
    matching_patterns_sql,
    producer_may_publish_sql,
    producer_rule_parameters,
    subscribed_sql,
)
from jobs.queue.types import (
    ClaimedJob,
    ClaimRooms,
    Inserted,
    InsertedBatch,
    MessageBatch,
    TokenDigests,
)
from jobs.states import QUEUED

_JOB = Job._meta.db_table
_MESSAGE = Message._meta.db_table
_CONSUMER = Consumer._meta.db_table
_DISPATCHED, _ACKNOWLEDGED = Message.Status.DISPATCHED.value, Message.Status.ACKNOWLEDGED.value
_SCHEDULED = Message.Status.SCHEDULED.value

# The columns of a new job that a fan-out statement inserts; the values follow each statement's
# own source (a published message, or a released one).
_JOB_COLUMNS = """(message_id, consumer_id, status, priority, ordering_key, attempts,
    next_attempt_at, incremental_timeout, last_error, created_at, status_changed_at, enqueued_at)"""
# Wakes idle dispatchers: PostgreSQL delivers it at commit, once per transaction.
_NOTIFY = f"pg_notify('{WAKEUP_CHANNEL}', '')"

# Publish: the message and one job per subscribed consumer of the channel (rules.subscribed_sql)
# in one statement: atomic by
# itself, one round trip (a broadcast went from 8 round trips to 1 with it), and the consumers
# are read in the same snapshot as the insert. The channel and producer are checked in it too,
# and, for a broadcast, their tokens: the digests of the tokens given must equal the stored ones
# (an ordinary comparison, not a constant-time one, is safe here: it compares digests of what the
# caller sent, and learning how many leading characters of such a digest match the stored one
# tells nothing about a token, as SHA-256 cannot be steered towards a prefix); so is whether the
# producer may publish to the channel (rules.producer_may_publish_sql). `checked` says which of
# the two refused the message (coalesce: a token not given compares as null).
INSERT_MESSAGE_SQL = f"""
WITH channel AS (
    SELECT id, token_hash FROM {Channel._meta.db_table} WHERE id = %(channel)s
), producer AS (
    SELECT id, token_hash FROM {Producer._meta.db_table} WHERE id = %(producer)s
), checked AS (
    SELECT channel.id AS channel_id, producer.id AS producer_id,
        NOT %(check_tokens)s OR coalesce(channel.token_hash = %(channel_token)s
            AND producer.token_hash = %(producer_token)s, false) AS tokens_matched,
        {producer_may_publish_sql("producer.id", "channel.id")} AS allowed
    FROM channel, producer
), subscription AS (
    SELECT {matching_patterns_sql("%(event_type)s::text")} AS patterns
), consumers AS (
    SELECT consumer.id FROM {_CONSUMER} consumer JOIN channel ON consumer.channel_id = channel.id
    CROSS JOIN subscription WHERE {subscribed_sql("consumer", "subscription.patterns")}
), message AS (
    INSERT INTO {_MESSAGE} (channel_id, producer_id, public_id, payload,
        payload_file, payload_size, content_type, priority, headers, ordering_key, event_type,
        status, received_at, dispatched_at, traceparent, tracestate)
    SELECT checked.channel_id, checked.producer_id, %(public_id)s, %(payload)s,
        %(payload_file)s, %(payload_size)s, %(content_type)s, %(priority)s, %(headers)s::jsonb,
        %(ordering_key)s, %(event_type)s,
        CASE WHEN EXISTS (SELECT FROM consumers) THEN '{_DISPATCHED}' ELSE '{_ACKNOWLEDGED}' END,
        %(now)s, CASE WHEN EXISTS (SELECT FROM consumers) THEN %(now)s::timestamptz END,
        %(traceparent)s, %(tracestate)s
    FROM checked
    WHERE checked.tokens_matched AND checked.allowed
    RETURNING id, status, dispatched_at
), jobs AS (
    INSERT INTO {_JOB} {_JOB_COLUMNS}
    SELECT message.id, consumers.id, '{QUEUED.value}', %(priority)s, %(ordering_key)s, 0,
        %(now)s, 0, '', %(now)s, %(now)s, %(now)s
    FROM message, consumers
)
SELECT message.id, message.status, message.dispatched_at,
    EXISTS (SELECT FROM channel), EXISTS (SELECT FROM producer),
    (SELECT tokens_matched FROM checked), (SELECT allowed FROM checked),
    (SELECT {_NOTIFY} FROM message WHERE EXISTS (SELECT FROM consumers))
FROM (SELECT) AS one_row LEFT JOIN message ON true
"""  # noqa: S608

# Replay's new jobs (broker/replay.py): one for each of the consumers given, in their order, for a
# message published before they joined its channel. Job IDs follow that order, as in the fan-outs
# above.
ADD_JOBS_SQL = f"""
INSERT INTO {_JOB} {_JOB_COLUMNS}
SELECT %(message)s, consumer.id, '{QUEUED.value}', %(priority)s, %(ordering_key)s, 0, %(now)s, 0,
    '', %(now)s, %(now)s, %(now)s
FROM unnest(%(consumers)s::bigint[]) WITH ORDINALITY AS consumer(id, position)
ORDER BY consumer.position
"""  # noqa: S608

# Publish many at once: jobs/queue/postgres_batch.py (the batch broadcast, `publish_many`).
INSERT_BATCH_SQL = insert_batch_sql(_JOB_COLUMNS, _NOTIFY)

# Release of due scheduled messages: locks them (skipping those another caller holds; the status
# test is re-checked on the locked row version, so a message released meanwhile is not taken
# again), inserts their jobs for the consumers subscribed then (rules.subscribed_sql), then marks
# them released; the consumers are read in the same snapshot by both. Jobs are inserted in due
# order: job IDs define the order in which ordered consumers receive a key's messages, so a
# scheduled message takes its place in that order at its release. `AS MATERIALIZED` with the
# LIMIT: docs/queue-design.md (PostgreSQL bug #15715).
RELEASE_DUE_SQL = f"""
WITH due AS MATERIALIZED (
    SELECT id, channel_id, priority, ordering_key, scheduled_for,
        {matching_patterns_sql("event_type")} AS patterns
    FROM {_MESSAGE}
    WHERE status = '{_SCHEDULED}' AND scheduled_for <= %(now)s
    ORDER BY scheduled_for, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), jobs AS (
    INSERT INTO {_JOB} {_JOB_COLUMNS}
    SELECT due.id, consumer.id, '{QUEUED.value}', due.priority, due.ordering_key, 0, %(now)s, 0,
        '', %(now)s, %(now)s, %(now)s
    FROM due JOIN {_CONSUMER} consumer ON consumer.channel_id = due.channel_id
        AND {subscribed_sql("consumer", "due.patterns")}
    ORDER BY due.scheduled_for, due.id, consumer.id
    RETURNING message_id
), released AS (
    UPDATE {_MESSAGE} message
    SET status = CASE WHEN has_consumers THEN '{_DISPATCHED}' ELSE '{_ACKNOWLEDGED}' END,
        dispatched_at = CASE WHEN has_consumers THEN %(now)s::timestamptz END
    FROM (
        SELECT due.id, EXISTS (
            SELECT FROM {_CONSUMER} consumer WHERE consumer.channel_id = due.channel_id
                AND {subscribed_sql("consumer", "due.patterns")}
        ) AS has_consumers
        FROM due
    ) AS target
    WHERE message.id = target.id
    RETURNING message.id
)
SELECT (SELECT count(*) FROM released), (SELECT {_NOTIFY} WHERE EXISTS (SELECT FROM jobs))
"""  # noqa: S608


def insert_message(message: Message, tokens: TokenDigests | None = None) -> Inserted:
    # Alone, the statement commits by itself; inside a caller's transaction it needs a
    # savepoint so that a refused message (duplicate ID) leaves that transaction usable.
    savepoint = transaction.atomic() if connection.in_atomic_block else nullcontext()
    parameters = _message_parameters(message) | _check_parameters(tokens)
    with savepoint, connection.cursor() as cursor:
        cursor.execute(INSERT_MESSAGE_SQL, parameters)
        row = cursor.fetchone()
    message.pk, message.status, message.dispatched_at = row[:3]
    message._state.adding = message.pk is None
    return Inserted.from_checks(*row[3:7])


def insert_messages(batch: MessageBatch) -> InsertedBatch:
    # As insert_message: a savepoint only inside a caller's transaction.
    savepoint = transaction.atomic() if connection.in_atomic_block else nullcontext()
    with savepoint, connection.cursor() as cursor:
        cursor.execute(INSERT_BATCH_SQL, batch_parameters(batch))
        return inserted_batch(batch, cursor.fetchone())


def release_due_messages(now: datetime, limit: int) -> int:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(RELEASE_DUE_SQL, {"now": now, "limit": limit})
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
        cursor.execute(ADD_JOBS_SQL, parameters)


def claim_for_push(
    limit: int, now: datetime, rooms: ClaimRooms, dispatcher_id: str | None
) -> list[ClaimedJob]:
    with connection.cursor() as cursor:
        cursor.execute(CLAIM_FOR_PUSH_SQL, claim_parameters(limit, now, rooms, dispatcher_id))
        rows = cursor.fetchall()
    return [ClaimedJob.from_row(row) for row in rows]


def record_deliveries(results: list[AttemptResult], dispatcher_id: str, now: datetime) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            RECORD_DELIVERIES_SQL,
            {
                "dispatcher": dispatcher_id,
                "jobs": [r.job_id for r in results],
                "partitions": [r.partition_at for r in results],
                "batch_partitions": sorted({r.partition_at for r in results}),
                "job_consumers": [r.consumer_id for r in results],
                "consumers": list({r.consumer_id for r in results}),
                "attempts": [r.attempt for r in results],
                "started": [r.started_at for r in results],
                "durations": [r.duration_ms for r in results],
                "statuses": [r.status_code for r in results],
                "excerpts": [r.response_excerpt for r in results],
                "now": now,
            },
        )


def wake_dispatchers() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_NOTIFY}")


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
