"""Publishing: the single path by which messages enter the broker (REST broadcast and `publish()`).

A message and one job per consumer of its channel are inserted in one transaction, so once a
producer holds a 201 (or its own transaction commits), every consumer's job exists. Called inside
a caller's `transaction.atomic()`, the insert joins that transaction (transactional outbox, §6.2).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from broker.conf import broker_settings
from broker.models import Channel, Message, Producer, validate_message_id
from consumers.models import Consumer
from jobs.models import Job

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_HEADERS = 50
MAX_HEADER_VALUE_LENGTH = 8192
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,255}\Z")  # an RFC 9110 token
_UNSAFE_HEADER_VALUE = re.compile(r"[\x00\r\n]")

T = TypeVar("T", Channel, Producer)


class PublishError(ValueError):
    """The message was refused; nothing was stored."""


class InvalidMessage(PublishError):
    pass


class PayloadTooLarge(PublishError):
    pass


class DuplicateMessage(PublishError):
    pass


class UnknownChannel(PublishError, LookupError):
    pass


class UnknownProducer(PublishError, LookupError):
    pass


def publish(
    channel: Channel | str,
    payload: bytes | str | dict[str, Any] | list[Any],
    *,
    producer: Producer | str,
    message_id: str | None = None,
    priority: int = 0,
    headers: Mapping[str, str] | None = None,
    content_type: str | None = None,
) -> Message:
    """Store a message and its jobs atomically and return the message.

    `payload` may be bytes, text (sent as UTF-8) or a dict/list (sent as JSON); `content_type`
    defaults accordingly. Raises a PublishError subclass, with nothing stored, for bad input, an
    unknown channel or producer, or a message ID the channel already has.
    """
    body, content_type = _encode_payload(payload, content_type)
    message_id = message_id if message_id is not None else uuid.uuid4().hex
    _validate(message_id, priority, dict(headers or {}))
    channel = _resolve(Channel, channel, UnknownChannel)
    producer = _resolve(Producer, producer, UnknownProducer)
    now = timezone.now()
    message = Message(
        channel=channel,
        producer=producer,
        public_id=message_id,
        payload=body,
        content_type=content_type,
        priority=priority,
        headers=dict(headers or {}),
        received_at=now,
    )
    try:
        # The message insert is the block's first write: a duplicate ID fails before anything
        # else happened, and rolling the block back (a savepoint inside a caller's transaction)
        # leaves the caller's own work intact.
        with transaction.atomic():
            _insert_with_jobs(message, now)
    except IntegrityError:
        if Message.objects.filter(channel=channel, public_id=message_id).exists():
            raise DuplicateMessage(
                f"Channel {channel.pk!r} already has a message with ID {message_id!r}."
            ) from None
        raise
    return message


def _insert_with_jobs(message: Message, now: datetime) -> None:
    consumer_ids = list(
        Consumer.objects.filter(channel_id=message.channel_id).values_list("pk", flat=True)
    )
    if consumer_ids:
        message.status = Message.Status.DISPATCHED
        message.dispatched_at = now
    else:
        message.status = Message.Status.ACKNOWLEDGED
    message.save(force_insert=True)
    Job.objects.bulk_create(
        Job(
            message=message,
            consumer_id=consumer_id,
            priority=message.priority,
            next_attempt_at=now,
            created_at=now,
            status_changed_at=now,
        )
        for consumer_id in consumer_ids
    )


def _encode_payload(
    payload: bytes | str | dict[str, Any] | list[Any], content_type: str | None
) -> tuple[bytes, str]:
    if isinstance(payload, (bytes, bytearray, memoryview)):
        body, default_type = bytes(payload), "application/octet-stream"
    elif isinstance(payload, str):
        body, default_type = payload.encode(), "text/plain; charset=utf-8"
    elif isinstance(payload, (dict, list)):
        body, default_type = json.dumps(payload).encode(), "application/json"
    else:
        raise InvalidMessage(f"A payload must be bytes, str, dict or list, not {type(payload)}.")
    if not body:
        raise InvalidMessage("The payload is empty.")
    limit = broker_settings.BROKER_MAX_PAYLOAD_BYTES
    if len(body) > limit:
        raise PayloadTooLarge(f"The payload has {len(body)} bytes; the limit is {limit}.")
    content_type = content_type or default_type
    if len(content_type) > 255 or _UNSAFE_HEADER_VALUE.search(content_type):
        raise InvalidMessage("The content type is too long or contains control characters.")
    return body, content_type


def _validate(message_id: str, priority: int, headers: dict[str, str]) -> None:
    try:
        validate_message_id(message_id)
    except ValidationError:
        raise InvalidMessage(f"Invalid message ID {message_id[:300]!r}.") from None
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidMessage("The priority must be an integer.")
    if not INT32_MIN <= priority <= INT32_MAX:
        raise InvalidMessage("The priority must fit in a signed 32-bit integer.")
    _validate_headers(headers)


def _validate_headers(headers: dict[str, str]) -> None:
    if len(headers) > MAX_HEADERS:
        raise InvalidMessage(f"At most {MAX_HEADERS} metadata headers are kept.")
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise InvalidMessage(f"Invalid metadata header name {str(name)[:100]!r}.")
        if not isinstance(value, str) or _UNSAFE_HEADER_VALUE.search(value):
            raise InvalidMessage(f"Metadata header {name!r} must be text without line breaks.")
        if len(value) > MAX_HEADER_VALUE_LENGTH:
            raise InvalidMessage(f"Metadata header {name!r} is over {MAX_HEADER_VALUE_LENGTH}.")


def _resolve(model: type[T], instance_or_id: T | str, error: type[PublishError]) -> T:
    if isinstance(instance_or_id, model):
        return instance_or_id
    try:
        return model.objects.get(pk=instance_or_id)
    except model.DoesNotExist:
        raise error(f"No {model.__name__.lower()} with ID {str(instance_or_id)[:300]!r}.") from None
