"""What a publish sends: the broadcast's headers and body, a batch's JSON, the message IDs.

Shared by Producer and AsyncProducer, which only add the sending. The wire names are the
broker's (docs/api.md, "Broadcast" and "Batch broadcast").
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from webhook_broker_client.errors import Conflict

# A payload: bytes as they are, text as UTF-8, anything else as JSON.
Payload = bytes | str | Mapping[str, Any] | list[Any]

JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class BatchMessage:
    """One message of `publish_batch`; the fields mean what `publish`'s keywords mean."""

    payload: Payload
    message_id: str | None = None
    content_type: str | None = None
    event_type: str | None = None
    ordering_key: str | None = None
    priority: int | None = None
    scheduled_for: datetime | str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def new_message_id() -> str:
    """An ID made before the first try, so that every retry names the same message.

    32 hex digits of a random UUID: the broker's message ID rule allows them, and a collision
    (which the broker would answer with 409, taken here as success) is out of reach.
    """
    return uuid.uuid4().hex


def rfc3339(moment: datetime | str) -> str:
    """A time as the broker reads it; a naive datetime is refused (its zone would be a guess)."""
    if isinstance(moment, str):
        return moment
    if moment.tzinfo is None:
        raise ValueError("scheduled_for needs a timezone-aware datetime")
    return moment.isoformat()


def encoded_payload(payload: Payload, content_type: str | None) -> tuple[bytes, str | None]:
    """The body's bytes, and the content type to send when the caller gave none."""
    if isinstance(payload, bytes):
        return payload, content_type
    if isinstance(payload, str):
        return payload.encode(), content_type or TEXT_TYPE
    return json.dumps(payload, separators=(",", ":")).encode(), content_type or JSON_TYPE


def broadcast_headers(message: BatchMessage, message_id: str) -> dict[str, str]:
    """The headers of `POST /channel/{c}/broadcast` for one message (the payload is the body)."""
    headers = {"X-Broker-Message-ID": message_id}
    if message.event_type is not None:
        headers["X-Broker-Event-Type"] = message.event_type
    if message.ordering_key is not None:
        headers["X-Broker-Ordering-Key"] = message.ordering_key
    if message.priority is not None:
        headers["X-Broker-Message-Priority"] = str(int(message.priority))
    if message.scheduled_for is not None:
        headers["X-Broker-Scheduled-For"] = rfc3339(message.scheduled_for)
    if message.headers:
        # The broker keeps only the request headers that this one names (docs/api.md,
        # "Metadata headers"); it refuses the ones it never keeps, with a 400 naming them.
        headers.update(message.headers)
        headers["X-Broker-Metadata-Headers"] = ",".join(message.headers)
    return headers


def broadcast_request(message: BatchMessage) -> tuple[str, dict[str, str], bytes]:
    """The message ID, headers and body of one broadcast."""
    message_id = message.message_id or new_message_id()
    body, content_type = encoded_payload(message.payload, message.content_type)
    headers = broadcast_headers(message, message_id)
    if content_type is not None:
        headers["Content-Type"] = content_type
    return message_id, headers, body


def batch_item(message: BatchMessage, message_id: str) -> dict[str, Any]:
    """One entry of broadcast-batch's `messages`, in its snake_case field names."""
    item: dict[str, Any] = {"id": message_id}
    if isinstance(message.payload, bytes):
        item["payload_base64"] = base64.b64encode(message.payload).decode()
    else:
        body, content_type = encoded_payload(message.payload, message.content_type)
        item["payload"] = body.decode()
        item["content_type"] = content_type
    optional = {
        "content_type": message.content_type,
        "event_type": message.event_type,
        "ordering_key": message.ordering_key,
        "priority": message.priority,
        "scheduled_for": rfc3339(message.scheduled_for) if message.scheduled_for else None,
        "headers": dict(message.headers) or None,
    }
    item.update({name: value for name, value in optional.items() if value is not None})
    return item


def batch_request(messages: Iterable[BatchMessage]) -> tuple[list[str], dict[str, Any]]:
    """The IDs (given or made) and the JSON body of `POST /channel/{c}/broadcast-batch`."""
    ids, items = [], []
    for message in messages:
        message_id = message.message_id or new_message_id()
        ids.append(message_id)
        items.append(batch_item(message, message_id))
    if not items:
        raise ValueError("publish_batch needs at least one message")
    return ids, {"messages": items}


def is_our_batch_again(conflict: Conflict, ids: list[str]) -> bool:
    """Whether a batch's 409 says the channel has all of its IDs: our own batch, stored earlier.

    A batch is stored all or nothing, so a retry after an answer that was lost finds every ID
    taken. A 409 naming only some of them (or IDs given twice in the batch) is a real conflict.
    """
    duplicates = conflict.body.get("duplicates") if isinstance(conflict.body, dict) else None
    return (
        isinstance(duplicates, list) and len(set(ids)) == len(ids) and set(duplicates) == set(ids)
    )
