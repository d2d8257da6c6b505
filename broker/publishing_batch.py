"""Publishing many messages at once: `publish_many()` and the batch broadcast
(`POST /channel/{c}/broadcast-batch`, docs/api.md).

All or nothing. Every message is checked as `publish()` checks one (broker/publishing.py), and
every problem is reported at once, by the message's index and the field at fault; an ID twice in
the batch, or one the channel already has, refuses the batch too. Only then are the payloads
above BROKER_PAYLOAD_OFFLOAD_BYTES written to the payload storage, and the messages with their
jobs inserted by one queue operation (`jobs.queue.insert_messages`: one statement on
PostgreSQL). Inside a caller's `transaction.atomic()` the insert joins that transaction, as
`publish()` does (the transactional outbox, docs/outbox.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.db import IntegrityError
from django.utils import timezone

from broker import payloads, tracing
from broker.conf import broker_settings
from broker.event_catalogue import Schemas
from broker.models import Channel, Message, Producer
from broker.publishing import (
    REFUSALS,
    DuplicateMessage,
    InvalidMessage,
    PayloadTooLarge,
    ProducerNotAllowed,
    PublishError,
    UnknownChannel,
    UnknownProducer,
    check_event_type,
    check_message,
    check_schedule,
)
from broker.xids import new_xid
from jobs import queue
from jobs.queue import MessageBatch, NewMessage


class BatchMessage(NamedTuple):
    """One message of `publish_many()`: the arguments `publish()` takes for one message (a
    tuple, which is cheap to build a thousand times)."""

    payload: bytes | str | dict[str, Any] | list[Any]
    message_id: str | None = None
    priority: int = 0
    headers: Mapping[str, str] | None = None
    content_type: str | None = None
    ordering_key: str | None = None
    scheduled_for: datetime | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    event_type: str | None = None


@dataclass(frozen=True)
class PublishedMessage:
    """A message `publish_many()` stored: its ID in the channel, its key, and whether it waits
    for its scheduled time (a scheduled message) or was published now."""

    message_id: str
    pk: int
    scheduled: bool


@dataclass(frozen=True)
class ItemError:
    """What is wrong with one message of a batch: its index, the field at fault, why."""

    index: int
    field: str
    message: str
    # A payload over BROKER_MAX_PAYLOAD_BYTES, or too costly to check against its schema (413,
    # not 400).
    too_large: bool = False


class BatchRefused(PublishError):
    """Messages of the batch are refused; `errors` says which and why. Nothing was stored."""

    def __init__(self, errors: list[ItemError]) -> None:
        count = len({error.index for error in errors})
        super().__init__(f"{count} of the batch's messages are refused; nothing was stored.")
        self.errors = sorted(errors, key=lambda error: error.index)


class InvalidBatch(BatchRefused, InvalidMessage):
    pass


class BatchTooLarge(BatchRefused, PayloadTooLarge):
    """A payload over BROKER_MAX_PAYLOAD_BYTES, or too costly to check against its schema, among
    the batch's problems."""


class TooManyMessages(PayloadTooLarge):
    """More messages than BROKER_MAX_BATCH_MESSAGES."""


class DuplicateMessages(DuplicateMessage):
    """IDs given twice in the batch, or that the channel already has; `ids` names them."""

    def __init__(self, channel_id: str, ids: list[str]) -> None:
        super().__init__(
            f"Message IDs already in channel {channel_id!r} or given twice in the batch: "
            f"{', '.join(repr(public_id) for public_id in ids[:20])}"
            + (f" and {len(ids) - 20} more." if len(ids) > 20 else ".")
        )
        self.ids = ids


def publish_many(
    channel: Channel | str, messages: Sequence[BatchMessage], *, producer: Producer | str
) -> list[PublishedMessage]:
    """Store these messages, and each one's jobs, atomically; return them in their order.

    Each message is what `publish()` takes (`BatchMessage`) and is checked as it checks one;
    BROKER_MAX_BATCH_MESSAGES is the most at once (TooManyMessages). Raises, with nothing
    stored: InvalidBatch or BatchTooLarge listing every message's problems (`errors`),
    DuplicateMessages naming IDs given twice or already in the channel, UnknownChannel,
    UnknownProducer, ProducerNotAllowed (BROKER_PRODUCER_CHANNELS=bound). Scheduled messages
    (`scheduled_for`) are stored SCHEDULED, without jobs, as `publish()` stores one. Dispatchers
    are woken once for the batch.
    """
    channel_id = channel.pk if isinstance(channel, Channel) else channel
    producer_id = producer.pk if isinstance(producer, Producer) else producer
    checked = check_batch(channel_id, producer_id, messages)
    return store_batch(channel_id, producer_id, checked)


def check_batch(
    channel_id: str,
    producer_id: str,
    messages: Sequence[BatchMessage],
    errors: Sequence[ItemError] = (),
) -> list[NewMessage]:
    """Every message checked, nothing stored: the rows to insert, or the batch's refusal.

    `errors` are problems the caller found first (the HTTP layer's: fields it could not read);
    the messages they name are not checked again (their entries in `messages` are placeholders),
    and every problem is reported together.
    """
    count_limit = broker_settings.BROKER_MAX_BATCH_MESSAGES
    if len(messages) > count_limit:
        raise TooManyMessages(
            f"The batch has {len(messages)} messages; at most {count_limit} are taken at once."
        )
    found = list(errors)
    refused = {error.index for error in found}
    rows = []
    schemas = Schemas(channel_id)
    for index, message in enumerate(messages):
        if index in refused:
            continue
        try:
            rows.append(_checked(channel_id, producer_id, message, schemas))
        except PublishError as error:
            too_large = isinstance(error, PayloadTooLarge)
            found.append(ItemError(index, error.field or "payload", str(error), too_large))
    if found:
        too_large = any(error.too_large for error in found)
        raise (BatchTooLarge if too_large else InvalidBatch)(found)
    twice = [public_id for public_id, n in Counter(row.public_id for row in rows).items() if n > 1]
    if twice:
        raise DuplicateMessages(channel_id, twice)
    return rows


def _checked(
    channel_id: str, producer_id: str, message: BatchMessage, schemas: Schemas
) -> NewMessage:
    """One message as `publish()` checks it, ready to insert (its payload not yet offloaded)."""
    message_id = message.message_id if message.message_id is not None else new_xid()
    ordering_key = message.ordering_key or ""
    headers = dict(message.headers or {})
    given = tracing.parse(message.traceparent, message.tracestate)
    # Tracing on: a publish span per message (its check; the insert is shared by the batch).
    with tracing.publish_span(channel_id, message_id, producer_id, given) as trace:
        body, content_type = check_message(
            message.payload,
            message_id,
            message.priority,
            headers,
            message.content_type,
            ordering_key,
        )
        check_event_type(message.event_type, body, content_type, schemas)
        scheduled_for = message.scheduled_for
        if scheduled_for is not None:
            scheduled_for = check_schedule(scheduled_for)
    return NewMessage(
        message_id,
        body,
        "",
        len(body),
        content_type,
        message.priority,
        headers,
        ordering_key,
        scheduled_for,
        trace.traceparent if trace else None,
        (trace.tracestate or None) if trace else None,
        message.event_type,
    )


def store_batch(
    channel_id: str, producer_id: str, rows: list[NewMessage]
) -> list[PublishedMessage]:
    """Offload the large payloads, then insert the checked rows with their jobs in one queue
    operation. Refused (the payload storage refusing one of the payloads, a duplicate ID, an
    unknown channel or producer, a producer not allowed on the channel): every file the batch
    wrote is deleted and nothing is stored."""
    if not rows:
        return []
    with payloads.DeletedIfRefused(REFUSALS) as written:
        # Written before the rows, so that a stored message always has its file
        # (docs/delivery.md, "Large payloads").
        rows = [
            row._replace(payload=b"", payload_file=written.store(row.payload))
            if payloads.should_offload(row.payload)
            else row
            for row in rows
        ]
        keys = _insert(MessageBatch(channel_id, producer_id, timezone.now(), rows))
    return [
        PublishedMessage(row.public_id, key, row.scheduled_for is not None)
        for row, key in zip(rows, keys, strict=True)
    ]


def _insert(batch: MessageBatch) -> list[int]:
    try:
        inserted = queue.insert_messages(batch)
    except IntegrityError:
        ids = [row.public_id for row in batch.messages]
        taken = Message.objects.filter(channel_id=batch.channel_id, public_id__in=ids)
        existing = set(taken.values_list("public_id", flat=True))
        if existing:
            raise DuplicateMessages(
                batch.channel_id, [public_id for public_id in ids if public_id in existing]
            ) from None
        raise
    if not inserted.channel_found:
        raise UnknownChannel(f"No channel with ID {batch.channel_id[:300]!r}.")
    if not inserted.producer_found:
        raise UnknownProducer(f"No producer with ID {batch.producer_id[:300]!r}.")
    if not inserted.producer_allowed:
        raise ProducerNotAllowed(batch.producer_id, batch.channel_id)
    return inserted.keys
