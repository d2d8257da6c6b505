"""POST /channel/{c}/broadcast-batch (extension, docs/api.md "Batch broadcast"): many messages in
one request, stored all or nothing by one statement.

The tokens and their answers are the broadcast's (broker/api/broadcast.py). Then the body is
read (413 over BROKER_MAX_BATCH_BYTES by its Content-Length, before reading), every message is
read and checked (400 or 413 listing every problem, by index and field; 409 naming duplicate IDs),
the producer's rate limit counts every message (429), and `store_batch` inserts them. The rate
is taken after the checks, so that a refused batch changes nothing at all.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.batch_items import BatchItemSerializer, parse_items, read_batch, wire_error
from broker.api.broadcast import HEADERS, authenticate, producer_id_of
from broker.api.errors import ApiError
from broker.api.serializers import ErrorSerializer
from broker.conf import broker_settings
from broker.publishing_batch import (
    BatchRefused,
    DuplicateMessages,
    PublishedMessage,
    check_batch,
    store_batch,
)
from broker.ratelimit import OverBurst, given_back_if_not_stored, take_broadcasts
from broker.schema_allowance import metered

TOKEN_HEADERS = HEADERS[:3]  # channel token, producer ID, producer token


class BroadcastBatchSerializer(serializers.Serializer[Any]):
    messages = BatchItemSerializer(many=True, help_text="at most BROKER_MAX_BATCH_MESSAGES")


class StoredMessageSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    location = serializers.CharField(
        help_text="/channel/{c}/message/{id}, or …/scheduled-message/{id} for a scheduled one"
    )


class BatchStoredSerializer(serializers.Serializer[Any]):
    messages = StoredMessageSerializer(many=True, help_text="in the request's order")


class ItemErrorSerializer(serializers.Serializer[Any]):
    index = serializers.IntegerField(help_text="the message's place in messages, from 0")
    field = serializers.CharField(help_text="the field at fault (empty: the item itself)")
    message = serializers.CharField()


# `errors` is also a Serializer attribute: this shape is declared by its fields.
BatchErrorSerializer = inline_serializer(
    "BatchError",
    {
        "Error": serializers.CharField(),
        "errors": ItemErrorSerializer(
            many=True, required=False, help_text="every message's problems"
        ),
    },
)


class BatchDuplicatesSerializer(ErrorSerializer):
    duplicates = serializers.ListField(child=serializers.CharField())


def _error(description: str) -> OpenApiResponse:
    return OpenApiResponse(ErrorSerializer, description=description)


class BroadcastBatchView(APIView):
    authentication_classes = []
    permission_classes = []
    parser_classes = []

    @extend_schema(
        operation_id="broadcast_batch",
        request={"application/json": BroadcastBatchSerializer},
        parameters=[
            OpenApiParameter(name, str, OpenApiParameter.HEADER, required=True, description=text)
            for name, _, text in TOKEN_HEADERS
        ],
        responses={
            201: OpenApiResponse(BatchStoredSerializer, description="all stored"),
            400: OpenApiResponse(
                BatchErrorSerializer,
                description="malformed JSON, or messages refused (errors: index, field, "
                "message); nothing stored",
            ),
            401: _error("unknown producer or missing token"),
            403: _error(
                "wrong token; or, with BROKER_PRODUCER_CHANNELS=bound, a channel the producer is"
                " not allowed on; nothing stored"
            ),
            404: _error("unknown channel"),
            409: OpenApiResponse(
                BatchDuplicatesSerializer,
                description="IDs already in the channel or twice in the batch; nothing stored",
            ),
            413: OpenApiResponse(
                BatchErrorSerializer,
                description="body over BROKER_MAX_BATCH_BYTES, more than "
                "BROKER_MAX_BATCH_MESSAGES messages or than the producer's burst, or a payload "
                "over BROKER_MAX_PAYLOAD_BYTES or too costly to check against its event type's "
                "schema (listed in errors); nothing stored",
            ),
            429: _error(
                "the batch's messages are over the producer's BROKER_BROADCAST_RATE_LIMIT, or the "
                "producer is over its allowance of schema checking "
                "(BROKER_SCHEMA_STEPS_PER_SECOND); Retry-After gives the seconds to wait"
            ),
            507: _error(
                "the payload could not be stored (payload storage full or failing); retry later"
            ),
        },
    )
    def post(self, request: Request, channel_id: str) -> Response:
        """Publish many messages at once, all or nothing."""
        producer_id = producer_id_of(request)
        authenticate(request, channel_id, producer_id)  # the broadcast's, answers and all
        messages, errors = parse_items(read_batch(_body(request)))
        try:
            with metered(producer_id):  # OverAllowance: 429 with Retry-After
                rows = check_batch(channel_id, producer_id, messages, errors)
            take_broadcasts(producer_id, len(rows))  # RateLimited: 429 with Retry-After
            with given_back_if_not_stored(producer_id, len(rows)):
                published = store_batch(channel_id, producer_id, rows)
        except BatchRefused as refused:
            return Response(
                {"Error": str(refused), "errors": [wire_error(e) for e in refused.errors]},
                status=_refusal_status(refused),
            )
        except DuplicateMessages as duplicates:
            return Response(
                {"Error": str(duplicates), "duplicates": duplicates.ids},
                status=status.HTTP_409_CONFLICT,
            )
        except OverBurst as over:
            raise ApiError(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, str(over)) from None
        answer = [_stored(channel_id, message) for message in published]
        return Response({"messages": answer}, status=status.HTTP_201_CREATED)


def _body(request: Request) -> bytes:
    """The raw body, refused (413) by its declared length before any of it is read."""
    limit = broker_settings.BROKER_MAX_BATCH_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(status.HTTP_400_BAD_REQUEST, "Malformed Content-Length.") from None
    if declared > limit:
        raise ApiError(
            status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"The request body is over {limit} bytes."
        )
    # Read from the stream: `request.body` stops at DATA_UPLOAD_MAX_MEMORY_SIZE, a single
    # payload's limit, and a batch's is its own.
    return bytes(request._request.read())


def _refusal_status(refused: BatchRefused) -> int:
    if any(error.too_large for error in refused.errors):
        return status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    return status.HTTP_400_BAD_REQUEST


def _stored(channel_id: str, message: PublishedMessage) -> dict[str, str]:
    kind = "scheduled-message" if message.scheduled else "message"
    location = f"/channel/{channel_id}/{kind}/{message.message_id}"
    return {"id": message.message_id, "location": location}
