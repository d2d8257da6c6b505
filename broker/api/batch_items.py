"""The body of `POST /channel/{c}/broadcast-batch` (docs/api.md, "Batch broadcast"): JSON
`{"messages": [...]}` read into `publish_many()`'s messages, with every item's problems found at
once (index, field, message).

What the wire has and `publish()` does not is checked here: the JSON types, `payload` (text) or
`payload_base64` (bytes), RFC 3339 for `scheduled_for` and the header's minimum delay. The rest
(IDs, priority range, metadata headers, sizes) is `publish()`'s own check, run on every message by
broker/publishing_batch.py. An item's fields are declared once, by `BatchItemSerializer`, which
the OpenAPI schema shows.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any

from rest_framework import serializers, status

from broker.api.errors import ApiError
from broker.conf import broker_settings
from broker.publishing import ScheduleTooSoon
from broker.publishing_batch import BatchMessage, ItemError, TooManyMessages
from broker.scheduling import parse_rfc3339, require_min_delay
from broker.storable_text import read_json


# An item of `messages`, the one declaration of its fields: the OpenAPI schema shows it, and the
# reading below takes their names and types from it (FIELDS, TEXT_FIELDS). The serializer never
# validates: the reading names every item's problems by index and field, in the API's own words.
# (No docstring: the schema would show it.)
class BatchItemSerializer(serializers.Serializer[Any]):
    id = serializers.CharField(required=False, help_text="unique per channel; generated if absent")
    payload = serializers.CharField(
        required=False, help_text="the payload as text (stored as UTF-8); or payload_base64"
    )
    payload_base64 = serializers.CharField(
        required=False, help_text="the payload's bytes in base64 (binary payloads); or payload"
    )
    content_type = serializers.CharField(
        required=False,
        help_text="default text/plain; charset=utf-8 (payload), application/octet-stream "
        "(payload_base64)",
    )
    priority = serializers.IntegerField(required=False, help_text="higher first (default 0)")
    headers = serializers.DictField(
        child=serializers.CharField(),
        required=False,
        help_text="metadata headers to replay on delivery (the X-Broker-Metadata-Headers rules)",
    )
    ordering_key = serializers.CharField(required=False)
    scheduled_for = serializers.DateTimeField(
        required=False,
        help_text="RFC 3339; at least BROKER_MIN_SCHEDULE_DELAY_SECONDS away: a scheduled message",
    )
    traceparent = serializers.CharField(required=False, help_text="W3C trace context")
    tracestate = serializers.CharField(required=False)
    event_type = serializers.CharField(
        required=False,
        help_text="the event type (as X-Broker-Event-Type): only subscribed consumers get it",
    )


_ITEM_FIELDS = BatchItemSerializer().fields
FIELDS = frozenset(_ITEM_FIELDS)
# One of the two, each checked in its own way (_payload).
PAYLOAD_FIELDS = ("payload", "payload_base64")
# The other strings, checked alike, in the order declared.
TEXT_FIELDS = tuple(
    name
    for name, field in _ITEM_FIELDS.items()
    if type(field) is serializers.CharField and name not in PAYLOAD_FIELDS
)
# A text payload is stored as its UTF-8 bytes, which may hold NUL; every other text may not.
BINARY_FIELDS = frozenset({"messages[].payload"})
# publish()'s names for the fields whose names differ on the wire.
WIRE_NAMES = {"message_id": "id"}
_PLACEHOLDER = BatchMessage(payload=b"")  # stands for an item already refused here


class FieldProblem(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def read_batch(body: bytes) -> list[Any]:
    """The `messages` of a request's body: 400 unless a JSON object with a non-empty list of
    them, or when a field holds text that cannot be stored (UnstorableText, naming it); 413 with
    more than BROKER_MAX_BATCH_MESSAGES."""
    try:
        document = read_json(body, binary=BINARY_FIELDS)
    except (ValueError, UnicodeDecodeError):
        raise _bad('The body must be JSON: {"messages": [...]}.') from None
    if not isinstance(document, dict) or set(document) != {"messages"}:
        raise _bad('The body must be a JSON object with one field, "messages".')
    items = document["messages"]
    if not isinstance(items, list) or not items:
        raise _bad('"messages" must be a non-empty list.')
    limit = broker_settings.BROKER_MAX_BATCH_MESSAGES
    if len(items) > limit:
        raise TooManyMessages(f"The batch has {len(items)} messages; at most {limit} are taken.")
    return items


def parse_items(items: list[Any]) -> tuple[list[BatchMessage], list[ItemError]]:
    """Each item as `publish_many()` takes it, and the problems of those that cannot be read
    (their places hold a placeholder that is not checked again)."""
    messages, errors = [], []
    for index, item in enumerate(items):
        try:
            messages.append(_message(item))
        except FieldProblem as problem:
            messages.append(_PLACEHOLDER)
            errors.append(ItemError(index, problem.field, str(problem)))
    return messages, errors


def wire_error(error: ItemError) -> dict[str, object]:
    """An item's problem as the answer lists it, under the field's name on the wire."""
    field = WIRE_NAMES.get(error.field, error.field)
    return {"index": error.index, "field": field, "message": error.message}


def _message(item: object) -> BatchMessage:
    if not isinstance(item, dict):
        raise FieldProblem("", "Each message must be a JSON object.")
    unknown = sorted(set(item) - FIELDS)
    if unknown:
        raise FieldProblem(unknown[0], f"Unknown field {unknown[0][:100]!r}.")
    fields = {name: value for name, value in item.items() if value is not None}
    for name in TEXT_FIELDS:
        if not isinstance(fields.get(name, ""), str):
            raise FieldProblem(name, f"{name} must be a string.")
    return BatchMessage(
        payload=_payload(fields),
        message_id=fields.get("id"),
        priority=_priority(fields.get("priority", 0)),
        headers=_headers(fields.get("headers", {})),
        content_type=fields.get("content_type"),
        ordering_key=fields.get("ordering_key"),
        scheduled_for=_scheduled_for(fields.get("scheduled_for")),
        traceparent=fields.get("traceparent"),
        tracestate=fields.get("tracestate"),
        event_type=fields.get("event_type"),
    )


def _payload(fields: dict[str, Any]) -> bytes | str:
    """`payload`, text stored as UTF-8, or `payload_base64`, bytes: one of them."""
    text, encoded = fields.get("payload"), fields.get("payload_base64")
    if (text is None) == (encoded is None):
        raise FieldProblem("payload", "Give one of payload (text) and payload_base64 (bytes).")
    if text is not None:
        if not isinstance(text, str):
            raise FieldProblem("payload", "payload must be a string (binary: payload_base64).")
        return text
    if not isinstance(encoded, str):
        raise FieldProblem("payload_base64", "payload_base64 must be a base64 string.")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise FieldProblem("payload_base64", "payload_base64 is not valid base64.") from None


def _priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldProblem("priority", "priority must be an integer.")
    return value  # its range is publish()'s check


def _headers(value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise FieldProblem("headers", "headers must be an object of strings.")
    return value


def _scheduled_for(value: object) -> datetime | None:
    """RFC 3339, at least BROKER_MIN_SCHEDULE_DELAY_SECONDS away (the header's rules)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise FieldProblem("scheduled_for", "scheduled_for must be an RFC 3339 string.")
    try:
        when = parse_rfc3339(value)
    except ValueError:
        raise FieldProblem(
            "scheduled_for",
            "scheduled_for must be an RFC 3339 date-time, e.g. 2030-01-31T12:00:00Z.",
        ) from None
    try:
        require_min_delay(when)
    except ScheduleTooSoon as too_soon:  # its words name the header; here it is the field
        raise FieldProblem(
            "scheduled_for", str(too_soon).replace("X-Broker-Scheduled-For", "scheduled_for")
        ) from None
    return when


def _bad(problem: str) -> ApiError:
    return ApiError(status.HTTP_400_BAD_REQUEST, problem)
