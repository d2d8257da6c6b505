"""Reading messages: one with its jobs, a channel's list by status, counts (SPEC §4)."""

from __future__ import annotations

from typing import Any

from django.db.models import Count
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.errors import ApiError
from broker.api.pagination import paginate
from broker.api.serializers import ListResultSerializer, PayloadFieldsMixin
from broker.models import Channel, Message
from jobs.api.serializers import JobSummarySerializer

# webhook-broker's numeric message statuses, accepted in ?status= alongside the names.
STATUS_CODES = {"101": Message.Status.ACKNOWLEDGED, "102": Message.Status.DISPATCHED}
STATUS_NUMBERS = {name: number for number, name in STATUS_CODES.items()}


class MessageSerializer(PayloadFieldsMixin):
    ID = serializers.CharField(source="public_id")
    ContentType = serializers.CharField(source="content_type")
    Priority = serializers.IntegerField(source="priority")
    ProducedBy = serializers.CharField(source="producer.name")
    ProducerID = serializers.CharField(source="producer_id")
    ReceivedAt = serializers.DateTimeField(source="received_at")
    DispatchedAt = serializers.DateTimeField(source="dispatched_at", allow_null=True)
    Status = serializers.CharField(source="status")
    Headers = serializers.DictField(source="headers", child=serializers.CharField())
    Jobs = JobSummarySerializer(source="jobs.all", many=True)


class MessageDetailView(APIView):
    @extend_schema(responses={200: MessageSerializer})
    def get(self, request: Request, channel_id: str, message_id: str) -> Response:
        message = get_object_or_404(
            Message.objects.select_related("producer").prefetch_related("jobs__consumer"),
            channel_id=channel_id,
            public_id=message_id,
        )
        return Response(MessageSerializer(message).data)


class MessageListView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "status",
                str,
                many=True,
                description="ACKNOWLEDGED or DISPATCHED (or webhook-broker's 101 / 102)",
            )
        ],
        responses={200: ListResultSerializer},
    )
    def get(self, request: Request, channel_id: str) -> Response:
        channel = get_object_or_404(Channel, pk=channel_id)
        messages = Message.objects.filter(channel=channel)
        statuses = [_status(value) for value in request.query_params.getlist("status")]
        if statuses:
            messages = messages.filter(status__in=statuses)
        items, pages = paginate(request, messages.only("pk", "public_id"), keys=("pk",))
        urls = [f"/channel/{channel.pk}/message/{item.public_id}" for item in items]
        return Response({"Result": urls, "Pages": pages})


def _status(value: str) -> str:
    status_name = STATUS_CODES.get(value, value.upper())
    if status_name not in Message.Status.values:
        raise ApiError(
            status.HTTP_400_BAD_REQUEST,
            "status must be ACKNOWLEDGED or DISPATCHED (or 101 / 102).",
        )
    return status_name


class StatusCountSerializer(serializers.Serializer[Any]):
    Count = serializers.IntegerField()
    Links = serializers.DictField(child=serializers.CharField())


class MessagesStatusSerializer(serializers.Serializer[Any]):
    counts = serializers.DictField(child=StatusCountSerializer())


class MessagesStatusView(APIView):
    @extend_schema(responses={200: MessagesStatusSerializer})
    def get(self, request: Request, channel_id: str) -> Response:
        channel = get_object_or_404(Channel, pk=channel_id)
        rows = Message.objects.filter(channel=channel).values("status").annotate(n=Count("pk"))
        counts = {
            row["status"]: {
                "Count": row["n"],
                "Links": {
                    "messages": f"/channel/{channel.pk}/messages"
                    f"?status={STATUS_NUMBERS[row['status']]}"
                },
            }
            for row in rows
        }
        return Response({"counts": counts})
