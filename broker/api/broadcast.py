"""POST /channel/{c}/broadcast: publish a message over HTTP (SPEC §4)."""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.errors import ApiError
from broker.api.serializers import ErrorSerializer
from broker.api.tokens import require_token
from broker.conf import broker_settings
from broker.models import Channel, Producer
from broker.publishing import publish

DEFAULT_CONTENT_TYPE = "application/octet-stream"
HEADERS = [
    ("X-Broker-Channel-Token", True, "the channel's token"),
    ("X-Broker-Producer-ID", True, "the producer publishing"),
    ("X-Broker-Producer-Token", True, "the producer's token"),
    ("X-Broker-Message-ID", False, "unique per channel; generated when absent"),
    ("X-Broker-Message-Priority", False, "integer, higher first (default 0)"),
    ("X-Broker-Metadata-Headers", False, "comma-separated names of headers to keep and replay"),
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
            201: OpenApiResponse(description="stored; Location names the message"),
            400: _error("empty body or malformed header"),
            401: _error("unknown producer or missing token"),
            403: _error("wrong token"),
            404: _error("unknown channel"),
            409: _error("duplicate message ID in the channel"),
            413: _error("payload over BROKER_MAX_PAYLOAD_BYTES"),
        },
    )
    def post(self, request: Request, channel_id: str) -> Response:
        channel = Channel.objects.filter(pk=channel_id).first()
        if channel is None:
            raise ApiError(status.HTTP_404_NOT_FOUND, f"No channel {channel_id!r}.")
        require_token(request, "X-Broker-Channel-Token", channel, "Channel")
        producer = _authenticated_producer(request)
        message = publish(
            channel,
            _payload(request),
            producer=producer,
            message_id=request.headers.get("X-Broker-Message-ID") or None,
            priority=_priority(request),
            headers=_metadata_headers(request),
            content_type=request.headers.get("Content-Type") or DEFAULT_CONTENT_TYPE,
        )
        location = f"/channel/{channel.pk}/message/{message.public_id}"
        return Response(status=status.HTTP_201_CREATED, headers={"Location": location})


def _authenticated_producer(request: Request) -> Producer:
    producer_id = request.headers.get("X-Broker-Producer-ID")
    producer = Producer.objects.filter(pk=producer_id).first() if producer_id else None
    if producer is None:
        raise ApiError(status.HTTP_401_UNAUTHORIZED, "Unknown or missing X-Broker-Producer-ID.")
    require_token(request, "X-Broker-Producer-Token", producer, "Producer")
    return producer


def _payload(request: Request) -> bytes:
    if "X-Broker-Scheduled-For" in request.headers:
        raise ApiError(
            status.HTTP_400_BAD_REQUEST, "Scheduled messages are not supported by this version yet."
        )
    limit = broker_settings.BROKER_MAX_PAYLOAD_BYTES
    too_large = ApiError(
        status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, f"The payload is over {limit} bytes."
    )
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(status.HTTP_400_BAD_REQUEST, "Malformed Content-Length.") from None
    if declared > limit:
        raise too_large  # refuse before reading the body
    try:
        return bytes(request.body)
    except RequestDataTooBig:
        raise too_large from None


def _priority(request: Request) -> int:
    raw = request.headers.get("X-Broker-Message-Priority", "").strip()
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        raise ApiError(
            status.HTTP_400_BAD_REQUEST, "X-Broker-Message-Priority must be an integer."
        ) from None


def _metadata_headers(request: Request) -> dict[str, str]:
    """The request headers named in X-Broker-Metadata-Headers, to replay on delivery."""
    names = request.headers.get("X-Broker-Metadata-Headers", "")
    kept = {}
    for name in (part.strip() for part in names.split(",")):
        value = request.headers.get(name) if name else None
        if value:
            kept[name] = value
    return kept
