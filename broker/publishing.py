"""Publishing: the single path by which messages enter the broker (REST broadcast and `publish()`).

A message and one job per consumer of its channel are inserted in one transaction, so once a
producer holds a 201 (or its own transaction commits), every consumer's job exists. Called inside a
caller's `transaction.atomic()`, the insert joins that transaction (transactional outbox,
docs/outbox.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.db import DataError, IntegrityError, transaction
from django.utils import timezone

from broker import event_catalogue, event_types, payloads, tracing
from broker.conf import broker_settings
from broker.models import MESSAGE_ID_PATTERN, Channel, Message, Producer
from broker.xids import new_xid
from jobs import queue
from jobs.queue import TokenDigests
from jobs.queue.rules import producer_may_publish

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_HEADERS = 50
MAX_HEADER_VALUE_LENGTH = 8192
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,255}\Z")  # an RFC 9110 token
_UNSAFE_HEADER_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control characters but tab
# The model's rule for message IDs, compiled here: Django's validator reaches its pattern through
# a lazy proxy, a tenth of a batch broadcast's time in py-spy (docs/performance-history.md,
# "Batch ingest (issue 18)").
_MESSAGE_ID = re.compile(MESSAGE_ID_PATTERN)

# Metadata headers that are never kept, so never stored, delivered or handed to pull consumers:
# hop-by-hop and framing headers (the HTTP client makes its own, and a replayed one would corrupt
# the request), credentials (a receiver, or any pull consumer, would get the producer's), what
# describes the connection (the broker is the client: a producer's X-Forwarded-For would let it
# pose as any address to receivers behind a proxy), and the broker's own and the signature's
# names (a producer must not set or shadow them: a kept X-Broker-Producer-Token would let pull
# consumers publish as the producer). docs/api.md.
REFUSED_METADATA_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "host",
        "content-length",
        "authorization",
        "cookie",
        "forwarded",
        "x-real-ip",
    }
)
REFUSED_METADATA_PREFIXES = ("proxy-", "x-forwarded-", "x-broker-", "webhook-")

T = TypeVar("T", Channel, Producer)


class PublishError(ValueError):
    """The message was refused; nothing was stored. `field` names the argument at fault, when one
    is (a batch's per-message errors name it: broker/publishing_batch.py)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class InvalidMessage(PublishError):
    pass


class PayloadTooLarge(PublishError):
    pass


class DuplicateMessage(PublishError):
    pass


class ScheduleTooSoon(PublishError):
    """A broadcast scheduled sooner than BROKER_MIN_SCHEDULE_DELAY_SECONDS from now
    (docs/scheduled.md)."""


class UnknownChannel(PublishError, LookupError):
    pass


class UnknownProducer(PublishError, LookupError):
    pass


class ProducerNotAllowed(PublishError):
    """BROKER_PRODUCER_CHANNELS=bound and the channel is not one the producer may publish to:
    nothing was stored (docs/api.md, "Producers bound to channels")."""

    def __init__(self, producer_id: str, channel_id: str) -> None:
        super().__init__(
            f"Producer {producer_id[:300]!r} may not publish to channel {channel_id[:300]!r}: "
            "with BROKER_PRODUCER_CHANNELS=bound a producer publishes only to the channels it "
            "is allowed on (an admin adds them with the field channels of PUT "
            f"/producer/{producer_id[:300]})."
        )


class TokensRefused(PublishError):
    """The channel or producer token given with `tokens` did not match: nothing was stored. The
    HTTP broadcast then reads the stored tokens to say which (404, 401 or 403)."""


# What refuses a publish for certain once it has written payload files: no row names them, so they
# are deleted again (payloads.DeletedIfRefused). After another error, a connection lost during
# the insert say, the row may exist: the files stay, and purge_orphan_payloads removes them if
# not.
REFUSALS = (PublishError, IntegrityError, DataError, payloads.PayloadNotStored)


def publish(
    channel: Channel | str,
    payload: bytes | str | dict[str, Any] | list[Any],
    *,
    producer: Producer | str,
    message_id: str | None = None,
    priority: int = 0,
    headers: Mapping[str, str] | None = None,
    content_type: str | None = None,
    ordering_key: str | None = None,
    event_type: str | None = None,
    scheduled_for: datetime | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
    tokens: TokenDigests | None = None,
) -> Message:
    """Store a message and its jobs atomically and return the message.

    `payload` may be bytes, text (sent as UTF-8) or a dict/list (sent as JSON); `content_type`
    defaults accordingly. Ordered consumers receive the messages of one `ordering_key` one at a
    time, in publish order (docs/delivery.md, "Ordering"); messages without one share a key. Only
    the consumers subscribed to its `event_type` get a job (broker/event_types.py; none: the
    consumers without event type patterns, and those with `*`). Raises
    a PublishError subclass, with nothing stored, for bad input, an unknown channel or producer, a
    producer not allowed on the channel (ProducerNotAllowed, only with
    BROKER_PRODUCER_CHANNELS=bound), or a message ID the channel already has.

    With `scheduled_for` (an aware datetime) the message is stored SCHEDULED, with no jobs; it is
    released (its jobs created for the consumers the channel has then) by
    `jobs.queue.release_due_messages` within about a second of that time, and can be
    cancelled until then (docs/scheduled.md). BROKER_MIN_SCHEDULE_DELAY_SECONDS applies
    to the HTTP header only: a time in the past here means "at the next release".

    A payload above BROKER_PAYLOAD_OFFLOAD_BYTES is written to the payload storage before the row
    (docs/delivery.md, "Large payloads", broker/payloads.py). If the caller's transaction then rolls
    back, that file stays behind until `manage.py purge_orphan_payloads` removes it.

    `traceparent` and `tracestate` are a W3C trace context to continue (the HTTP broadcast
    passes the producer's headers); a malformed one is ignored. The message keeps the context
    its deliveries send on: with tracing on, that of this publish's span (broker/tracing.py).

    `tokens` are the digests of the channel and producer tokens a broadcast was given: the
    message is then stored only if both match, checked by the insert itself (TokensRefused if
    not). In-process callers pass none: they are trusted code.
    """
    message_id = message_id if message_id is not None else new_xid()
    ordering_key = ordering_key or ""
    channel_id = channel.pk if isinstance(channel, Channel) else channel
    producer_id = producer.pk if isinstance(producer, Producer) else producer
    given = tracing.parse(traceparent, tracestate)
    with tracing.publish_span(channel_id, message_id, producer_id, given) as trace:
        body, content_type = check_message(
            payload, message_id, priority, headers or {}, content_type, ordering_key
        )
        check_event_type(event_type, body, content_type, event_catalogue.Schemas(channel_id))
        if scheduled_for is not None:
            scheduled_for = check_schedule(scheduled_for)
        message = Message(
            channel_id=channel_id,
            producer_id=producer_id,
            public_id=message_id,
            payload=body,
            payload_size=len(body),
            content_type=content_type,
            priority=priority,
            headers=dict(headers or {}),
            ordering_key=ordering_key,
            event_type=event_type,
            received_at=timezone.now(),
            scheduled_for=scheduled_for,
            traceparent=trace.traceparent if trace else None,
            tracestate=(trace.tracestate or None) if trace else None,
        )
        with payloads.DeletedIfRefused(REFUSALS) as written:
            if payloads.should_offload(body):
                # Written before the row, so that a stored message always has its file
                # (docs/delivery.md, "Large payloads").
                message.payload, message.payload_file = b"", written.store(body)
            _insert(message, tokens)
        return message


def _insert(message: Message, tokens: TokenDigests | None) -> None:
    try:
        if message.scheduled_for is not None:
            _insert_scheduled(message, tokens)
            return
        inserted = queue.insert_message(message, tokens)
    except IntegrityError:
        if Message.objects.filter(
            channel_id=message.channel_id, public_id=message.public_id
        ).exists():
            raise DuplicateMessage(
                f"Channel {message.channel_id!r} already has a message with ID "
                f"{message.public_id!r}."
            ) from None
        raise
    if not inserted.channel_found:
        raise UnknownChannel(f"No channel with ID {message.channel_id[:300]!r}.")
    if not inserted.producer_found:
        raise UnknownProducer(f"No producer with ID {message.producer_id[:300]!r}.")
    if not inserted.tokens_matched:
        raise TokensRefused("A token does not match.")
    if not inserted.producer_allowed:
        raise ProducerNotAllowed(message.producer_id, message.channel_id)


def _insert_scheduled(message: Message, tokens: TokenDigests | None) -> None:
    """A scheduled message: the row alone, SCHEDULED, no jobs (they are made at its release).

    Not on the hot path, so plain ORM on every database. It shares the (channel, public_id)
    constraint with every other message, so an ID already used by a scheduled or a normal
    message of the channel is a DuplicateMessage either way.
    """
    message.channel = _resolve(Channel, message.channel_id, UnknownChannel)
    message.producer = _resolve(Producer, message.producer_id, UnknownProducer)
    if tokens and not tokens.match(message.channel.token_hash, message.producer.token_hash):
        raise TokensRefused("A token does not match.")
    if not producer_may_publish(message.producer_id, message.channel_id):
        raise ProducerNotAllowed(message.producer_id, message.channel_id)
    message.status = Message.Status.SCHEDULED
    message.dispatched_at = None
    with transaction.atomic():  # a savepoint: a duplicate leaves a caller's transaction usable
        message.save(force_insert=True)


def check_schedule(when: datetime) -> datetime:
    """scheduled_for as publish() takes it: an aware datetime, in UTC; InvalidMessage if not."""
    if not isinstance(when, datetime):
        raise InvalidMessage("scheduled_for must be a datetime.", "scheduled_for")
    if timezone.is_naive(when):
        raise InvalidMessage("scheduled_for must be timezone-aware.", "scheduled_for")
    try:
        return when.astimezone(UTC)
    except OverflowError:
        raise InvalidMessage("scheduled_for is out of range.", "scheduled_for") from None


def check_message(
    payload: bytes | str | dict[str, Any] | list[Any],
    message_id: str,
    priority: int,
    headers: Mapping[str, str],
    content_type: str | None,
    ordering_key: str,
) -> tuple[bytes, str]:
    """What `publish()` checks before storing anything; InvalidMessage or PayloadTooLarge when
    the message would be refused. Returns the payload as bytes and its content type."""
    body, content_type = _encode_payload(payload, content_type)
    _validate(message_id, priority, dict(headers))
    _validate_ordering_key(ordering_key)
    return body, content_type


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
        raise InvalidMessage(
            f"A payload must be bytes, str, dict or list, not {type(payload)}.", "payload"
        )
    if not body:
        raise InvalidMessage("The payload is empty.", "payload")
    limit = broker_settings.BROKER_MAX_PAYLOAD_BYTES
    if len(body) > limit:
        raise PayloadTooLarge(
            f"The payload has {len(body)} bytes; the limit is {limit}.", "payload"
        )
    content_type = content_type or default_type
    if len(content_type) > 255 or _UNSAFE_HEADER_VALUE.search(content_type):
        raise InvalidMessage(
            "The content type is too long or contains control characters.", "content_type"
        )
    return body, content_type


def _validate(message_id: str, priority: int, headers: dict[str, str]) -> None:
    if not _MESSAGE_ID.search(str(message_id)):
        raise InvalidMessage(f"Invalid message ID {message_id[:300]!r}.", "message_id")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidMessage("The priority must be an integer.", "priority")
    if not INT32_MIN <= priority <= INT32_MAX:
        raise InvalidMessage("The priority must fit in a signed 32-bit integer.", "priority")
    _validate_headers(headers)


def check_event_type(
    event_type: str | None, body: bytes, content_type: str, schemas: event_catalogue.Schemas
) -> None:
    """InvalidMessage when `event_type` is given and not a valid one (naming the rule), or when
    the channel's event type catalogue has a schema for it that the JSON payload does not match
    (broker/event_catalogue.py); PayloadTooLarge when checking the payload against it would go
    beyond a limit of that check (its nesting, or the publish's validation steps)."""
    if event_type is None:
        return
    if not isinstance(event_type, str):
        raise InvalidMessage("The event type must be text.", "event_type")
    try:
        event_types.checked_event_type(event_type)
    except event_types.InvalidEventType as exc:
        raise InvalidMessage(str(exc), "event_type") from None
    try:
        schemas.check(event_type, body, content_type)
    except event_catalogue.PayloadTooCostly as exc:
        raise PayloadTooLarge(str(exc), "payload") from None
    except event_catalogue.PayloadRefused as exc:
        raise InvalidMessage(str(exc), "payload") from None


def _validate_ordering_key(key: str) -> None:
    if not isinstance(key, str) or len(key) > 255 or _UNSAFE_HEADER_VALUE.search(key):
        raise InvalidMessage(
            "The ordering key must be text of at most 255 characters.", "ordering_key"
        )


def is_refused_metadata_header(name: str) -> bool:
    """Whether a header may never be kept as metadata (REFUSED_METADATA_HEADERS), in any case."""
    name = name.lower()
    return (
        name in REFUSED_METADATA_HEADERS
        or name.startswith(REFUSED_METADATA_PREFIXES)
        or name == _consumer_header_name()  # when renamed out of X-Broker-*
    )


def _consumer_header_name() -> str:
    """The name of the header that carries the consumer's token on deliveries, lower-case (a
    header's name, compared as such: it is no credential)."""
    return str(broker_settings.BROKER_CONSUMER_TOKEN_HEADER).lower()


def check_keepable(name: str) -> None:
    """InvalidMessage naming `name` if it is a header never kept as metadata."""
    if is_refused_metadata_header(name):
        raise InvalidMessage(
            f"Metadata header {name[:100]!r} is never kept: hop-by-hop and framing headers, "
            "credentials (Authorization, Cookie, Proxy-*), Forwarded, X-Forwarded-*, X-Real-IP "
            "and X-Broker-* and webhook-* headers are refused.",
            "headers",
        )


def _validate_headers(headers: dict[str, str]) -> None:
    if len(headers) > MAX_HEADERS:
        raise InvalidMessage(f"At most {MAX_HEADERS} metadata headers are kept.", "headers")
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise InvalidMessage(f"Invalid metadata header name {str(name)[:100]!r}.", "headers")
        check_keepable(name)
        if not isinstance(value, str) or _UNSAFE_HEADER_VALUE.search(value):
            raise InvalidMessage(
                f"Metadata header {name!r} must be text without line breaks.", "headers"
            )
        if len(value) > MAX_HEADER_VALUE_LENGTH:
            raise InvalidMessage(
                f"Metadata header {name!r} is over {MAX_HEADER_VALUE_LENGTH}.", "headers"
            )


def _resolve(model: type[T], pk: str, error: type[PublishError]) -> T:
    try:
        return model.objects.get(pk=pk)
    except model.DoesNotExist:
        raise error(f"No {model.__name__.lower()} with ID {pk[:300]!r}.") from None
