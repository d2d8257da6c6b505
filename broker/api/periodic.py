"""Periodic messages over the API (docs/periodic.md): list, create, read, create-or-update,
delete."""

from __future__ import annotations

from typing import Any

from django.http import Http404
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.conditional import require_unmodified_since, with_last_modified
from broker.api.errors import ApiError
from broker.api.pagination import url_page
from broker.api.schema import IF_UNMODIFIED_SINCE, PAGE_PARAMETERS, error_response
from broker.api.serializers import ListResultSerializer, encode_payload, read_form, validate_path_id
from broker.models import Channel, PeriodicMessage
from broker.periodic_edits import (
    InvalidPeriodicMessage,
    PeriodicMessageExists,
    PeriodicMessageForm,
    PeriodicMessagePostForm,
    change_periodic,
    create_periodic,
    delete_periodic,
    new_periodic_id,
)


def periodic_url(schedule: PeriodicMessage) -> str:
    return f"/channel/{schedule.channel_id}/periodic-message/{schedule.public_id}"


class PeriodicMessageSerializer(serializers.Serializer[Any]):
    ID = serializers.CharField(source="public_id")
    ProducerID = serializers.CharField(source="producer_id")
    Payload = serializers.SerializerMethodField()
    PayloadEncoding = serializers.SerializerMethodField()
    ContentType = serializers.CharField(source="content_type")
    Priority = serializers.IntegerField(source="priority")
    Headers = serializers.DictField(source="headers", child=serializers.CharField())
    OrderingKey = serializers.CharField(source="ordering_key")
    EventType = serializers.CharField(source="event_type", allow_null=True)
    IntervalSeconds = serializers.IntegerField(source="interval_seconds", allow_null=True)
    Cron = serializers.CharField(source="cron", allow_null=True)
    TimeZone = serializers.CharField(source="timezone")
    Enabled = serializers.BooleanField(source="enabled")
    SkipWhilePending = serializers.BooleanField(source="skip_while_pending")
    NextRunAt = serializers.DateTimeField(source="next_run_at", allow_null=True)
    LastRunAt = serializers.DateTimeField(source="last_run_at", allow_null=True)
    LastMessageID = serializers.SerializerMethodField()
    SkippedTicks = serializers.IntegerField(source="skipped_ticks")
    ChangedAt = serializers.DateTimeField(source="changed_at")

    def get_Payload(self, schedule: PeriodicMessage) -> str:  # noqa: N802 (wire name)
        return encode_payload(schedule.payload)[0]

    def get_PayloadEncoding(self, schedule: PeriodicMessage) -> str:  # noqa: N802
        return encode_payload(schedule.payload)[1]

    def get_LastMessageID(self, schedule: PeriodicMessage) -> str | None:  # noqa: N802
        return schedule.last_message.public_id if schedule.last_message else None

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = dict(super().to_representation(instance))
        data["Cron"] = data["Cron"] or None  # "" in the row
        return data


def _detail(schedule: PeriodicMessage, status_code: int = status.HTTP_200_OK) -> Response:
    response = Response(PeriodicMessageSerializer(schedule).data, status=status_code)
    return with_last_modified(response, schedule.changed_at)


def _refused(error: InvalidPeriodicMessage) -> ApiError:
    if isinstance(error, PeriodicMessageExists):
        return ApiError(status.HTTP_409_CONFLICT, str(error))
    return ApiError(status.HTTP_400_BAD_REQUEST, str(error))


class PeriodicMessageListView(APIView):
    @extend_schema(
        operation_id="list_periodic_messages",
        parameters=PAGE_PARAMETERS,
        responses={200: ListResultSerializer},
    )
    def get(self, request: Request, channel_id: str) -> Response:
        channel = get_object_or_404(Channel, pk=channel_id)
        return url_page(request, PeriodicMessage.objects.filter(channel=channel), periodic_url)

    @extend_schema(
        operation_id="create_periodic_message",
        request=PeriodicMessagePostForm,
        responses={
            201: OpenApiResponse(PeriodicMessageSerializer, description="created"),
            409: error_response("a periodic message with that ID exists"),
        },
    )
    def post(self, request: Request, channel_id: str) -> Response:
        form = read_form(request, PeriodicMessagePostForm)
        public_id = form.pop("id", None) or new_periodic_id()
        validate_path_id(public_id, "periodic message")
        channel = get_object_or_404(Channel, pk=channel_id)
        try:
            schedule = create_periodic(channel, public_id, form)
        except InvalidPeriodicMessage as error:
            raise _refused(error) from None
        response = _detail(schedule, status.HTTP_201_CREATED)
        response["Location"] = periodic_url(schedule)
        return response


class PeriodicMessageDetailView(APIView):
    serializer_class = PeriodicMessageSerializer

    @extend_schema(operation_id="get_periodic_message")
    def get(self, request: Request, channel_id: str, periodic_id: str) -> Response:
        schedule = get_object_or_404(
            PeriodicMessage.objects.select_related("last_message"),
            channel_id=channel_id,
            public_id=periodic_id,
        )
        return _detail(schedule)

    @extend_schema(
        operation_id="put_periodic_message",
        request=PeriodicMessageForm,
        responses={
            200: PeriodicMessageSerializer,
            409: error_response("created at the same moment by another request"),
        },
        parameters=[IF_UNMODIFIED_SINCE],
    )
    def put(self, request: Request, channel_id: str, periodic_id: str) -> Response:
        validate_path_id(periodic_id, "periodic message")
        form = read_form(request, PeriodicMessageForm)
        channel = get_object_or_404(Channel, pk=channel_id)

        def unmodified_since(schedule: PeriodicMessage) -> None:
            require_unmodified_since(request, schedule.changed_at)

        try:
            schedule = change_periodic(
                channel, periodic_id, form, create_missing=True, precondition=unmodified_since
            )
        except InvalidPeriodicMessage as error:
            raise _refused(error) from None
        return _detail(schedule)

    @extend_schema(
        operation_id="delete_periodic_message",
        responses={204: None},
        parameters=[IF_UNMODIFIED_SINCE],
    )
    def delete(self, request: Request, channel_id: str, periodic_id: str) -> Response:
        def unmodified_since(schedule: PeriodicMessage) -> None:
            require_unmodified_since(request, schedule.changed_at)

        try:
            delete_periodic(channel_id, periodic_id, precondition=unmodified_since)
        except PeriodicMessage.DoesNotExist:
            raise Http404 from None
        return Response(status=status.HTTP_204_NO_CONTENT)
