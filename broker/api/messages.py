"""Reading messages: one with its jobs, a channel's list by status, counts; replay (docs/api.md).

Scheduled messages not released yet (status SCHEDULED, docs/scheduled.md) are messages without jobs:
readable here, listed only when asked for with `?status=SCHEDULED`, and counted under
webhook-broker's `SCHEDULED_*` keys by messages-status (docs/scheduled.md).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count, OuterRef, Prefetch, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import FormParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.errors import ApiError
from broker.api.pagination import url_page
from broker.api.parsers import JsonBodyParser
from broker.api.scheduled import PENDING, RELEASED, scheduled_messages_url
from broker.api.schema import PAGE_PARAMETERS
from broker.api.serializers import ErrorSerializer, ListResultSerializer, PayloadFieldsMixin
from broker.models import Channel, Message
from broker.replay import NotReplayable, ReplayResult, replay
from consumers.models import Consumer
from jobs.api.serializers import MessageJobSerializer
from jobs.models import Job, with_last_attempt

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
    # Ours: when a scheduled message is (or was) due; null for a message published at once.
    ScheduledFor = serializers.DateTimeField(source="scheduled_for", allow_null=True)
    # Ours: the event type it was published with; null for none.
    EventType = serializers.CharField(source="event_type", allow_null=True)
    Status = serializers.CharField(source="status")
    Headers = serializers.DictField(source="headers", child=serializers.CharField())
    Jobs = MessageJobSerializer(source="jobs.all", many=True)


class MessageDetailView(APIView):
    @extend_schema(operation_id="get_message", responses={200: MessageSerializer})
    def get(self, request: Request, channel_id: str, message_id: str) -> Response:
        message = get_object_or_404(
            Message.objects.select_related("producer").prefetch_related(
                Prefetch("jobs", with_last_attempt(Job.objects.select_related("consumer")))
            ),
            channel_id=channel_id,
            public_id=message_id,
        )
        return Response(MessageSerializer(message).data)


class MessageListView(APIView):
    @extend_schema(
        operation_id="list_messages",
        parameters=[
            OpenApiParameter(
                "status",
                str,
                many=True,
                description="ACKNOWLEDGED or DISPATCHED (or webhook-broker's 101 / 102), or "
                "SCHEDULED (not released yet; listed only when asked for)",
            ),
            *PAGE_PARAMETERS,
        ],
        responses={200: ListResultSerializer},
    )
    def get(self, request: Request, channel_id: str) -> Response:
        channel = get_object_or_404(Channel, pk=channel_id)
        messages = Message.objects.filter(channel=channel)
        statuses = [_status(value) for value in request.query_params.getlist("status")]
        if statuses:
            messages = messages.filter(status__in=statuses)
        else:
            messages = messages.exclude(status=Message.Status.SCHEDULED)
        return url_page(
            request,
            messages.only("pk", "public_id"),
            lambda item: f"/channel/{channel.pk}/message/{item.public_id}",
            keys=("pk",),
        )


def _status(value: str) -> str:
    status_name = STATUS_CODES.get(value, value.upper())
    if status_name not in Message.Status.values:
        raise ApiError(
            status.HTTP_400_BAD_REQUEST,
            "status must be ACKNOWLEDGED, DISPATCHED or SCHEDULED (or 101 / 102).",
        )
    return status_name


class StatusCountSerializer(serializers.Serializer[Any]):
    Count = serializers.IntegerField()
    Links = serializers.DictField(child=serializers.CharField())


class MessagesStatusSerializer(serializers.Serializer[Any]):
    counts = serializers.DictField(child=StatusCountSerializer())
    # Only when a scheduled message is waiting: the earliest due time (as webhook-broker).
    next_scheduled_message_at = serializers.DateTimeField(required=False)


class MessagesStatusView(APIView):
    @extend_schema(operation_id="get_messages_status", responses={200: MessagesStatusSerializer})
    def get(self, request: Request, channel_id: str) -> Response:
        channel = get_object_or_404(Channel, pk=channel_id)
        found = _message_counts(channel)
        waiting = found[Message.Status.SCHEDULED]
        counts: dict[str, Any] = {}
        body: dict[str, Any] = {"counts": counts}
        for name, number in STATUS_NUMBERS.items():
            if found[name]:
                counts[name] = _count(
                    found[name], f"/channel/{channel.pk}/messages?status={number}"
                )
        if waiting:
            counts[f"SCHEDULED_{PENDING}"] = _count(
                waiting, scheduled_messages_url(channel.pk, PENDING)
            )
            body["next_scheduled_message_at"] = found["next_due"]
        # Every message published for later is either still waiting or was released.
        released = found["ever_scheduled"] - waiting
        if released:
            counts[f"SCHEDULED_{RELEASED}"] = _count(
                released, scheduled_messages_url(channel.pk, RELEASED)
            )
        return Response(MessagesStatusSerializer(body).data)


def _message_counts(channel: Channel) -> dict[str, Any]:
    """The channel's messages per status, those ever scheduled, and the earliest due time of the
    waiting ones: one statement (one snapshot), each part answered by an index alone:
    message_channel_status_idx, message_channel_scheduled_idx, message_channel_pending_idx
    (broker/models.py). Grouping by status with a count of the scheduled ones read every message
    of the channel from the table (584 ms at 25,000,000 jobs, docs/performance-history.md)."""
    of_channel = Message.objects.filter(channel=OuterRef("pk")).order_by()
    counted = {s.value: _counted(of_channel.filter(status=s)) for s in Message.Status}
    waiting = of_channel.filter(status=Message.Status.SCHEDULED).order_by("scheduled_for")
    found = Channel.objects.filter(pk=channel.pk).values(
        **counted,
        ever_scheduled=_counted(of_channel.filter(scheduled_for__isnull=False)),
        next_due=Subquery(waiting.values("scheduled_for")[:1]),
    )
    return dict(found.get())


def _counted(messages: QuerySet[Message]) -> Coalesce:
    """COUNT(*) of `messages` (of the outer query's channel) as a scalar subquery; 0 for none."""
    count = messages.values("channel").annotate(n=Count("*")).values("n")
    return Coalesce(Subquery(count), 0)


def _count(count: int, url: str) -> dict[str, Any]:
    return {"Count": count, "Links": {"messages": url}}


class ReplayForm(serializers.Serializer[Any]):
    # Blank is let through to be refused in the view: DRF would take an empty form field for an
    # omitted one, and "consumer=" from a client with an unset variable would replay to all.
    consumer = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=255,
        help_text="one consumer's ID; omitted: every consumer",
    )


class SkippedSerializer(serializers.Serializer[Any]):
    ConsumerID = serializers.CharField(source="consumer")
    Status = serializers.CharField(source="status", help_text="the job's status, unchanged")
    Reason = serializers.CharField(source="reason")


class ReplaySerializer(serializers.Serializer[Any]):
    Replayed = serializers.ListField(
        source="replayed",
        child=serializers.CharField(),
        help_text="consumers whose DELIVERED job is QUEUED again",
    )
    Created = serializers.ListField(
        source="created",
        child=serializers.CharField(),
        help_text="consumers that had no job for the message (added since): one was created",
    )
    Skipped = SkippedSerializer(source="skipped", many=True)


class MessageReplayView(APIView):
    """Deliver an already delivered message again, to one consumer or to all (docs/api.md)."""

    parser_classes = [FormParser, JsonBodyParser]

    @extend_schema(
        operation_id="replay_message",
        request=ReplayForm,
        responses={
            202: OpenApiResponse(
                ReplaySerializer,
                description="queued again for at least one consumer; the others are in Skipped",
            ),
            409: OpenApiResponse(
                ErrorSerializer,
                description="nothing could be replayed: every job is queued, in flight or dead, "
                "the message is not released yet, or its offloaded payload is gone",
            ),
        },
    )
    def post(self, request: Request, channel_id: str, message_id: str) -> Response:
        message = get_object_or_404(
            Message.objects.only("pk", "channel_id"), channel_id=channel_id, public_id=message_id
        )
        form = ReplayForm(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            result = replay(message, _named_consumer(channel_id, form.validated_data))
        except NotReplayable as error:
            raise ApiError(status.HTTP_409_CONFLICT, str(error)) from None
        return _replayed(result)


def _named_consumer(channel_id: str, form: dict[str, Any]) -> Consumer | None:
    """The consumer the form names, None for every consumer; 404 when the channel has none such."""
    if "consumer" not in form:
        return None
    if not form["consumer"]:
        raise ApiError(
            status.HTTP_400_BAD_REQUEST,
            "consumer must be a consumer ID; omit it to replay to every consumer.",
        )
    return get_object_or_404(Consumer, channel_id=channel_id, public_id=form["consumer"])


def _replayed(result: ReplayResult) -> Response:
    if not result.queued:
        raise ApiError(status.HTTP_409_CONFLICT, f"Nothing to replay: {result.summary()}.")
    return Response(ReplaySerializer(result).data, status=status.HTTP_202_ACCEPTED)
