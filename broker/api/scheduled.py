"""Scheduled messages over the API: list, read, cancel (docs/api.md; docs/scheduled.md).

The JSON is webhook-broker's, lower-case field names included: `{"result": [...], "pages": ...}`
for the list, `id`, `messageId`, `dispatchSchedule`, ... for one message. Cancelling is our
extension (webhook-broker cannot cancel).
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.errors import ApiError
from broker.api.pagination import paginate
from broker.api.schema import PAGE_PARAMETERS
from broker.api.serializers import ErrorSerializer, PagesSerializer, encode_payload
from broker.models import Channel, Message
from broker.payloads import PAYLOAD_MISSING, PayloadMissing
from broker.scheduling import AlreadyReleased, NotScheduled, cancel_scheduled
from broker.xids import public_key_xid

# webhook-broker's scheduled-message statuses: waiting, or released into the normal flow.
PENDING, RELEASED = "SCHEDULED", "DISPATCHED"
STATUS_CODES = {"101": PENDING, "102": RELEASED}  # its ScheduledMsgStatus values
STATUS_NUMBERS = {name: number for number, name in STATUS_CODES.items()}


def scheduled_status(message: Message) -> str:
    return PENDING if message.status == Message.Status.SCHEDULED else RELEASED


def scheduled_messages_url(channel_id: str, status_name: str | None = None) -> str:
    url = f"/channel/{channel_id}/scheduled-messages"
    return f"{url}?status={STATUS_NUMBERS[status_name]}" if status_name else url


class ScheduledMessageSerializer(serializers.Serializer[Any]):
    """webhook-broker's fields, then ours: `payloadEncoding` ("utf-8" or "base64", as for
    normal messages), `payloadError` (only when an offloaded payload is gone), `orderingKey`,
    `receivedAt`, `messageURL` (the message, with its jobs once released), and
    `dispatchedDate` (webhook-broker's name for `dispatchedAt` before May 2025, for older
    clients). `id` is an xid, as webhook-broker's: the row's key and receipt second."""

    id = serializers.SerializerMethodField()
    messageId = serializers.CharField(source="public_id")  # noqa: N815 (wire names)
    contentType = serializers.CharField(source="content_type")  # noqa: N815
    priority = serializers.IntegerField()
    producedBy = serializers.CharField(source="producer_id")  # noqa: N815
    dispatchSchedule = serializers.DateTimeField(source="scheduled_for")  # noqa: N815
    dispatchedAt = serializers.DateTimeField(source="dispatched_at", allow_null=True)  # noqa: N815
    status = serializers.SerializerMethodField()
    payload = serializers.SerializerMethodField()
    payloadEncoding = serializers.SerializerMethodField()  # noqa: N815
    payloadError = serializers.CharField(required=False, help_text=PAYLOAD_MISSING)  # noqa: N815
    headers = serializers.DictField(child=serializers.CharField())
    orderingKey = serializers.CharField(source="ordering_key")  # noqa: N815
    eventType = serializers.CharField(source="event_type", allow_null=True)  # noqa: N815
    receivedAt = serializers.DateTimeField(source="received_at")  # noqa: N815
    messageURL = serializers.SerializerMethodField()  # noqa: N815
    dispatchedDate = serializers.DateTimeField(source="dispatched_at", allow_null=True)  # noqa: N815

    def get_id(self, message: Message) -> str:
        return public_key_xid(message.received_at.timestamp(), message.pk)

    def get_status(self, message: Message) -> str:
        return scheduled_status(message)

    def get_payload(self, message: Message) -> str | None:
        encoded = _encoded(message)
        return encoded[0] if encoded else None

    def get_payloadEncoding(self, message: Message) -> str | None:  # noqa: N802
        encoded = _encoded(message)
        return encoded[1] if encoded else None

    def get_messageURL(self, message: Message) -> str:  # noqa: N802
        return f"/channel/{message.channel_id}/message/{message.public_id}"

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = dict(super().to_representation(instance))
        if data["payload"] is None:
            data["payloadError"] = PAYLOAD_MISSING
        return data


def _encoded(message: Message) -> tuple[str, str] | None:
    try:
        return encode_payload(message.read_payload())
    except PayloadMissing:
        return None


class ScheduledListSerializer(serializers.Serializer[Any]):
    result = serializers.ListField(
        child=serializers.CharField(), help_text="scheduled-message URLs"
    )
    pages = PagesSerializer()


class ScheduledMessageListView(APIView):
    @extend_schema(
        operation_id="list_scheduled_messages",
        parameters=[
            OpenApiParameter(
                "status",
                str,
                many=True,
                description="SCHEDULED (not released yet) or DISPATCHED (released), or "
                "webhook-broker's 101 / 102",
            ),
            *PAGE_PARAMETERS,
        ],
        responses={200: ScheduledListSerializer},
    )
    def get(self, request: Request, channel_id: str) -> Response:
        channel = get_object_or_404(Channel, pk=channel_id)
        # Every message ever scheduled in the channel stays here, released or not.
        messages = Message.objects.filter(channel=channel, scheduled_for__isnull=False)
        statuses = {_status(value) for value in request.query_params.getlist("status")}
        if statuses == {PENDING}:
            messages = messages.filter(status=Message.Status.SCHEDULED)
        elif statuses == {RELEASED}:
            messages = messages.exclude(status=Message.Status.SCHEDULED)
        items, pages = paginate(request, messages.only("pk", "public_id"), keys=("pk",))
        urls = [f"/channel/{channel.pk}/scheduled-message/{item.public_id}" for item in items]
        return Response({"result": urls, "pages": pages})


def _status(value: str) -> str:
    status_name = STATUS_CODES.get(value, value.upper())
    if status_name not in (PENDING, RELEASED):
        raise ApiError(
            status.HTTP_400_BAD_REQUEST, "status must be SCHEDULED or DISPATCHED (or 101 / 102)."
        )
    return status_name


class ScheduledMessageDetailView(APIView):
    @extend_schema(
        operation_id="get_scheduled_message", responses={200: ScheduledMessageSerializer}
    )
    def get(self, request: Request, channel_id: str, message_id: str) -> Response:
        message = get_object_or_404(
            Message, channel_id=channel_id, public_id=message_id, scheduled_for__isnull=False
        )
        return Response(ScheduledMessageSerializer(message).data)

    @extend_schema(
        operation_id="cancel_scheduled_message",
        responses={
            204: OpenApiResponse(description="cancelled: the message is deleted"),
            404: OpenApiResponse(ErrorSerializer, description="no such scheduled message"),
            409: OpenApiResponse(ErrorSerializer, description="already released"),
        },
    )
    def delete(self, request: Request, channel_id: str, message_id: str) -> Response:
        try:
            cancel_scheduled(channel_id, message_id)
        except NotScheduled:
            raise ApiError(status.HTTP_404_NOT_FOUND, "No such scheduled message.") from None
        except AlreadyReleased as error:
            raise ApiError(status.HTTP_409_CONFLICT, str(error)) from None
        return Response(status=status.HTTP_204_NO_CONTENT)
