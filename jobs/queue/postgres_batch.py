"""The batch publish on PostgreSQL: many messages and their jobs in one statement.

The statement is built by jobs/queue/postgres.py (with the job columns and the NOTIFY its other
fan-out statements use) from the text here, and run there; this module holds its SQL, the
parameter it takes (the batch as one JSON array, read by jsonb_array_elements) and the reading of
its answer.
Why one statement: docs/performance-history.md, "Batch ingest (issue 18)".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from broker.models import Channel, Message, Producer
from consumers.models import Consumer
from jobs.models import Job
from jobs.queue.rules import (
    matching_patterns_sql,
    producer_may_publish_sql,
    producer_rule_parameters,
    subscribed_sql,
)
from jobs.queue.types import InsertedBatch, MessageBatch
from jobs.states import QUEUED

_MESSAGE = Message._meta.db_table
_STATUS = Message.Status


def insert_batch_sql(job_columns: str, notify: str) -> str:
    """The batch publish: the channel and producer checked, and that the producer may publish to
    the channel (rules.producer_may_publish_sql), every message inserted in the batch's
    order (so message IDs, and the job IDs made from them, follow it: an ordered consumer gets a
    key's messages in that order), one QUEUED job per subscribed consumer (rules.subscribed_sql)
    for each unscheduled message, and dispatchers woken once, at commit. The consumers are read
    once, in the snapshot of the inserts. A duplicate ID fails the whole statement
    (IntegrityError): nothing is inserted."""
    return f"""
WITH channel AS (
    SELECT id FROM {Channel._meta.db_table} WHERE id = %(channel)s
), producer AS (
    SELECT known.id, {producer_may_publish_sql("known.id", "%(channel)s")} AS allowed
    FROM {Producer._meta.db_table} known WHERE known.id = %(producer)s
), consumers AS MATERIALIZED (
    SELECT consumer.id, consumer.event_types FROM {Consumer._meta.db_table} consumer
    JOIN channel ON consumer.channel_id = channel.id
), item AS (
    -- One JSON array per message, its fields in the order of batch_parameters.
    SELECT e->>0 AS public_id, decode(e->>1, 'hex') AS payload, e->>2 AS payload_file,
        (e->>3)::int AS payload_size, e->>4 AS content_type, (e->>5)::int AS priority,
        e->6 AS headers, e->>7 AS ordering_key, (e->>8)::timestamptz AS scheduled_for,
        e->>9 AS traceparent, e->>10 AS tracestate, e->>11 AS event_type,
        {matching_patterns_sql("e->>11")} AS patterns, position
    FROM jsonb_array_elements(%(messages)s::jsonb) WITH ORDINALITY AS message_row(e, position)
), message AS (
    INSERT INTO {_MESSAGE} (channel_id, producer_id, public_id, payload, payload_file,
        payload_size, content_type, priority, headers, ordering_key, event_type, status,
        received_at, dispatched_at, scheduled_for, traceparent, tracestate)
    SELECT channel.id, producer.id, item.public_id, item.payload, item.payload_file,
        item.payload_size, item.content_type, item.priority, item.headers,
        item.ordering_key, item.event_type,
        CASE WHEN item.scheduled_for IS NOT NULL THEN '{_STATUS.SCHEDULED.value}'
            WHEN item.subscribed THEN '{_STATUS.DISPATCHED.value}'
            ELSE '{_STATUS.ACKNOWLEDGED.value}' END,
        %(now)s,
        CASE WHEN item.scheduled_for IS NULL AND item.subscribed THEN %(now)s::timestamptz END,
        item.scheduled_for, item.traceparent, item.tracestate
    FROM (
        SELECT item.*, EXISTS (
            SELECT FROM consumers WHERE {subscribed_sql("consumers", "item.patterns")}
        ) AS subscribed
        FROM item
    ) AS item, channel, producer
    WHERE producer.allowed
    ORDER BY item.position
    RETURNING id, public_id, priority, ordering_key, scheduled_for
), jobs AS (
    INSERT INTO {Job._meta.db_table} {job_columns}
    SELECT message.id, consumers.id, '{QUEUED.value}', message.priority, message.ordering_key, 0,
        %(now)s, 0, '', %(now)s, %(now)s, %(now)s
    FROM message JOIN item ON item.public_id = message.public_id
    JOIN consumers ON {subscribed_sql("consumers", "item.patterns")}
    WHERE message.scheduled_for IS NULL
    ORDER BY message.id, consumers.id
    RETURNING message_id
)
SELECT EXISTS (SELECT FROM channel), EXISTS (SELECT FROM producer), inserted.public_ids,
    inserted.keys, (SELECT allowed FROM producer), (SELECT {notify} WHERE EXISTS (SELECT FROM jobs))
FROM (SELECT array_agg(public_id) AS public_ids, array_agg(id) AS keys FROM message) AS inserted
"""  # noqa: S608


def batch_parameters(batch: MessageBatch) -> dict[str, Any]:
    """The statement's parameters: the messages as one JSON array, in the batch's order.

    One text parameter rather than an array per column: psycopg writes arrays element by element in
    Python, a third of the web worker's time per batch (docs/performance-history.md, "Batch ingest
    (issue 18)"), where the JSON encoder and PostgreSQL's JSON reader are C. A message is a JSON
    array, not an object (a quarter of the encoding time); payloads travel in hex (JSON has no
    bytes, and hex is the cheapest encoding to write); every other text was checked free of NUL,
    which PostgreSQL's text cannot hold.
    """
    rows = [
        [
            m.public_id,
            m.payload.hex(),
            m.payload_file,
            m.payload_size,
            m.content_type,
            m.priority,
            m.headers,
            m.ordering_key,
            m.scheduled_for.isoformat() if m.scheduled_for else None,
            m.traceparent,
            m.tracestate,
            m.event_type,
        ]
        for m in batch.messages
    ]
    return {
        "channel": batch.channel_id,
        "producer": batch.producer_id,
        "now": batch.received_at,
        "messages": json.dumps(rows),
        **producer_rule_parameters(),
    }


def inserted_batch(batch: MessageBatch, row: Sequence[Any]) -> InsertedBatch:
    """The statement's answer: the keys of the messages in the batch's order (RETURNING gives
    rows in no promised order, so they are matched by public ID, unique in the batch)."""
    channel_found, producer_found, public_ids, keys, allowed = row[:5]
    by_id = dict(zip(public_ids or [], keys or [], strict=True))
    return InsertedBatch(
        channel_found,
        producer_found,
        [by_id[m.public_id] for m in batch.messages] if by_id else [],
        producer_allowed=not producer_found or allowed is True,
    )
