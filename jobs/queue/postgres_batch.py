"""The batch publish on PostgreSQL: many messages and their jobs in one statement (sql/publish.sql,
`insert_messages`, run by jobs/queue/postgres.py). This module holds the parameter it takes (the
batch as one JSON array, read by jsonb_array_elements) and the reading of its answer.
Why one statement: docs/performance-history.md, "Batch ingest (issue 18)".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jobs.queue.rules import producer_rule_parameters
from jobs.queue.types import InsertedBatch, MessageBatch


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
