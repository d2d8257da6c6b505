"""POST /channel/{c}/broadcast: publish a message over HTTP (docs/api.md)."""

from __future__ import annotations

from datetime import datetime

from django.core.exceptions import RequestDataTooBig
from django.db import DataError, connection
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker import payloads
from broker.api.errors import ApiError
from broker.api.serializers import ErrorSerializer
from broker.api.tokens import StoredToken, require_token
from broker.conf import broker_settings
from broker.models import Channel, Producer, is_resource_id
from broker.parsing import parse_int
from broker.publishing import ProducerNotAllowed, PublishError, check_keepable, publish
from broker.ratelimit import configured_limit, given_back_if_not_stored, take_broadcast
from broker.scheduling import parse_rfc3339, require_min_delay
from broker.schema_allowance import metered, refuse_if_in_debt
from broker.tokens import hash_token
from jobs.queue import TokenDigests
from jobs.queue.rules import producer_may_publish_sql, producer_rule_parameters

DEFAULT_CONTENT_TYPE = "application/octet-stream"
# The stored token digests, and whether the producer may publish to the channel
# (BROKER_PRODUCER_CHANNELS), in one round trip.
STORED_CREDENTIALS_SQL = (
    f"SELECT (SELECT token_hash FROM {Channel._meta.db_table} WHERE id = %(channel)s),"  # noqa: S608
    f" (SELECT token_hash FROM {Producer._meta.db_table} WHERE id = %(producer)s),"
    f" {producer_may_publish_sql('%(producer)s', '%(channel)s')}"
)
HEADERS = [
    ("X-Broker-Channel-Token", True, "the channel's token"),
    ("X-Broker-Producer-ID", True, "the producer publishing"),
    ("X-Broker-Producer-Token", True, "the producer's token"),
    ("X-Broker-Message-ID", False, "unique per channel; generated when absent"),
    ("X-Broker-Message-Priority", False, "integer, higher first (default 0)"),
    ("X-Broker-Metadata-Headers", False, "comma-separated names of headers to keep and replay"),
    ("X-Broker-Ordering-Key", False, "ordered consumers get one key's messages in order"),
    (
        "X-Broker-Scheduled-For",
        False,
        "RFC 3339 time to release the message at, at least BROKER_MIN_SCHEDULE_DELAY_SECONDS away",
    ),
    ("traceparent", False, "W3C trace context, continued by the deliveries; malformed: ignored"),
    ("tracestate", False, "W3C trace state, kept with traceparent"),
]


def _error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


class BroadcastView(APIView):
    authentication_classes = []
    permission_classes = []
    parser_classes = []

    @extend_schema(
        operation_id="broadcast",
        request={"*/*": OpenApiTypes.BINARY},
        parameters=[
            OpenApiParameter(
                name, str, OpenApiParameter.HEADER, required=required, description=text
            )
            for name, required, text in HEADERS
        ],
        responses={
            201: OpenApiResponse(
                description="stored; Location names the message (the scheduled message when "
                "X-Broker-Scheduled-For was given)"
            ),
            400: _error("empty body or malformed header"),
            401: _error("unknown producer or missing token"),
            403: _error(
                "wrong token; or, with BROKER_PRODUCER_CHANNELS=bound, a channel the producer is"
                " not allowed on"
            ),
            404: _error("unknown channel"),
            409: _error("duplicate message ID in the channel"),
            412: _error("X-Broker-Scheduled-For sooner than the minimum delay"),
            413: _error(
                "payload over BROKER_MAX_PAYLOAD_BYTES, or too costly to check against its event "
                "type's schema (nesting, validation steps)"
            ),
            429: _error(
                "the producer is over BROKER_BROADCAST_RATE_LIMIT, or over its allowance of "
                "schema checking (BROKER_SCHEMA_STEPS_PER_SECOND); Retry-After gives the seconds "
                "to wait"
            ),
            507: _error(
                "the payload could not be stored (payload storage full or failing); retry later"
            ),
        },
    )
    def post(self, request: Request, channel_id: str) -> Response:
        producer_id = producer_id_of(request)
        typed = "X-Broker-Event-Type" in request.headers  # its payload may have a schema
        if typed:
            refuse_if_in_debt(producer_id)  # OverAllowance: 429 with Retry-After
        if configured_limit() is not None or typed or not _small_body(request):
            # Tokens first, in a query of their own: so nobody can spend a producer's allowance
            # (of broadcasts, of schema checking) without its token, and a body to offload is
            # read and stored, or one of a typed message checked, only once they match.
            authenticate(request, channel_id, producer_id)
            take_broadcast(producer_id)  # RateLimited: 429 with Retry-After
            with given_back_if_not_stored(producer_id), metered(producer_id):
                return _publish(request, channel_id, producer_id, tokens=None)
        try:
            # The hot path: the publish statement checks the tokens itself (one round trip).
            return _publish(request, channel_id, producer_id, _given_tokens(request))
        except (ApiError, PublishError, DataError):
            # Refused, for its tokens or for its content: the tokens are judged first, as on
            # the path above, so a caller without them learns nothing else (404, 401, 403).
            authenticate(request, channel_id, producer_id)
            raise


def _publish(
    request: Request, channel_id: str, producer_id: str, tokens: TokenDigests | None
) -> Response:
    payload = _payload(request)
    scheduled_for = _scheduled_for(request)
    message = publish(
        channel_id,
        payload,
        producer=producer_id,
        message_id=request.headers.get("X-Broker-Message-ID") or None,
        priority=_priority(request),
        headers=_metadata_headers(request),
        content_type=request.headers.get("Content-Type") or DEFAULT_CONTENT_TYPE,
        ordering_key=request.headers.get("X-Broker-Ordering-Key", "").strip(),
        event_type=_event_type(request),
        scheduled_for=scheduled_for,
        # The producer's W3C trace context, continued by the deliveries (malformed: ignored).
        traceparent=request.headers.get("traceparent"),
        tracestate=request.headers.get("tracestate"),
        tokens=tokens,
    )
    kind = "message" if scheduled_for is None else "scheduled-message"
    location = f"/channel/{channel_id}/{kind}/{message.public_id}"
    return Response(status=status.HTTP_201_CREATED, headers={"Location": location})


def _event_type(request: Request) -> str | None:
    """X-Broker-Event-Type, if sent (publish() checks it: 400 naming the rule)."""
    value = request.headers.get("X-Broker-Event-Type")
    return value.strip() if value is not None else None


def producer_id_of(request: Request) -> str:
    producer_id = request.headers.get("X-Broker-Producer-ID", "")
    # Malformed: unknown, and never sent to the database.
    return producer_id if is_resource_id(producer_id) else ""


def _given_tokens(request: Request) -> TokenDigests:
    channel, producer = (
        request.headers.get(name) for name in ("X-Broker-Channel-Token", "X-Broker-Producer-Token")
    )
    return TokenDigests(
        hash_token(channel) if channel else None, hash_token(producer) if producer else None
    )


def authenticate(request: Request, channel_id: str, producer_id: str) -> None:
    """Check the channel and producer tokens: 404, 401 or 403 unless both match; then 403
    (ProducerNotAllowed) when BROKER_PRODUCER_CHANNELS=bound and the channel is not one the
    producer may publish to. Judged only once the tokens match, so that a caller without them
    learns nothing of which producer may publish where."""
    channel_hash, producer_hash, allowed = _stored_credentials(channel_id, producer_id)
    if channel_hash is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, f"No channel {channel_id!r}.")
    require_token(request, "X-Broker-Channel-Token", StoredToken(channel_hash), "Channel")
    if producer_hash is None:
        raise ApiError(status.HTTP_401_UNAUTHORIZED, "Unknown or missing X-Broker-Producer-ID.")
    require_token(request, "X-Broker-Producer-Token", StoredToken(producer_hash), "Producer")
    if not allowed:
        raise ProducerNotAllowed(producer_id, channel_id)


def _stored_credentials(channel_id: str, producer_id: str) -> tuple[str | None, str | None, bool]:
    """Both stored token hashes and the producer's right to the channel, in one round trip
    (broadcast is the hot path)."""
    parameters = {"channel": channel_id, "producer": producer_id} | producer_rule_parameters()
    with connection.cursor() as cursor:
        cursor.execute(STORED_CREDENTIALS_SQL, parameters)
        channel_hash, producer_hash, allowed = cursor.fetchone()
    return channel_hash, producer_hash, bool(allowed)


def _small_body(request: Request) -> bool:
    """Whether the declared body is kept in the row, not offloaded (False when malformed)."""
    try:
        return not payloads.is_offloaded_size(_declared_length(request))
    except ApiError:
        return False


def _declared_length(request: Request) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(status.HTTP_400_BAD_REQUEST, "Malformed Content-Length.") from None


def _payload(request: Request) -> bytes:
    limit = broker_settings.BROKER_MAX_PAYLOAD_BYTES
    too_large = ApiError(
        status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"The payload is over {limit} bytes."
    )
    if _declared_length(request) > limit:
        raise too_large  # refuse before reading the body
    try:
        return bytes(request.body)
    except RequestDataTooBig:
        raise too_large from None


def _scheduled_for(request: Request) -> datetime | None:
    """X-Broker-Scheduled-For: 400 unless RFC 3339, 412 when sooner than the minimum delay."""
    raw = request.headers.get("X-Broker-Scheduled-For", "").strip()
    if not raw:
        return None
    try:
        when = parse_rfc3339(raw)
    except ValueError:
        raise ApiError(
            status.HTTP_400_BAD_REQUEST,
            "X-Broker-Scheduled-For must be an RFC 3339 date-time, e.g. 2030-01-31T12:00:00Z.",
        ) from None
    require_min_delay(when)  # ScheduleTooSoon: 412
    return when


def _priority(request: Request) -> int:
    raw = request.headers.get("X-Broker-Message-Priority", "").strip()
    if not raw:
        return 0
    try:
        return parse_int(raw)
    except ValueError:
        raise ApiError(
            status.HTTP_400_BAD_REQUEST, "X-Broker-Message-Priority must be an integer."
        ) from None


def _metadata_headers(request: Request) -> dict[str, str]:
    """The request headers named in X-Broker-Metadata-Headers, to replay on delivery.

    Naming a header that is never kept is refused (400) whether or not the request has it:
    the producer learns at once that it will not be delivered (`publish` checks the rest).
    """
    names = request.headers.get("X-Broker-Metadata-Headers", "")
    kept = {}
    for name in (part.strip() for part in names.split(",")):
        check_keepable(name)  # InvalidMessage: 400
        value = request.headers.get(name) if name else None
        if value:
            kept[name] = value
    return kept
