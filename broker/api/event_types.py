"""A channel's event type catalogue over the API (docs/api.md, "Event type catalogue"): list,
read, create-or-update, delete. Admin only, as every management endpoint."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker import event_catalogue
from broker.api.conditional import require_unmodified_since, with_last_modified
from broker.api.errors import ApiError
from broker.api.pagination import url_page
from broker.api.schema import IF_UNMODIFIED_SINCE, PAGE_PARAMETERS
from broker.api.serializers import ListResultSerializer, read_form
from broker.models import Channel, EventType


def event_type_url(entry: EventType) -> str:
    return f"/channel/{entry.channel_id}/event-type/{entry.name}"


class EventTypeSerializer(serializers.Serializer[Any]):
    Name = serializers.CharField(source="name")
    Description = serializers.CharField(source="description")
    Schema = serializers.JSONField(source="schema", allow_null=True)
    ChangedAt = serializers.DateTimeField(source="changed_at")


class EventTypeForm(serializers.Serializer[Any]):
    """PUT form fields; on update an omitted field keeps its value."""

    description = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=event_catalogue.MAX_DESCRIPTION_LENGTH,
        help_text="what the event means, for the people who subscribe to it",
    )
    schema = serializers.CharField(
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        help_text="a JSON Schema (Draft 2020-12 unless it names another in $schema) that JSON "
        "payloads of this type must match; blank: none",
    )

    def validate_schema(self, value: str) -> dict[str, Any] | None:
        try:
            return event_catalogue.checked_schema(value)
        except event_catalogue.InvalidCatalogueEntry as error:
            raise serializers.ValidationError(str(error)) from None


class EventTypeListView(APIView):
    @extend_schema(
        operation_id="list_event_types",
        parameters=PAGE_PARAMETERS,
        responses={200: ListResultSerializer},
    )
    def get(self, request: Request, channel_id: str) -> Response:
        channel = get_object_or_404(Channel, pk=channel_id)
        return url_page(request, EventType.objects.filter(channel=channel), event_type_url)


class EventTypeDetailView(APIView):
    serializer_class = EventTypeSerializer

    @extend_schema(operation_id="get_event_type")
    def get(self, request: Request, channel_id: str, name: str) -> Response:
        entry = get_object_or_404(EventType, channel_id=channel_id, name=name)
        return _detail(entry)

    @extend_schema(
        operation_id="put_event_type", request=EventTypeForm, parameters=[IF_UNMODIFIED_SINCE]
    )
    def put(self, request: Request, channel_id: str, name: str) -> Response:
        _check_name(name)
        form = read_form(request, EventTypeForm)
        channel = get_object_or_404(Channel, pk=channel_id)

        def unmodified_since(entry: EventType) -> None:
            require_unmodified_since(request, entry.changed_at)

        entry = event_catalogue.save_entry(channel, name, form, unmodified_since)
        return _detail(entry)

    @extend_schema(
        operation_id="delete_event_type", responses={204: None}, parameters=[IF_UNMODIFIED_SINCE]
    )
    def delete(self, request: Request, channel_id: str, name: str) -> Response:
        with transaction.atomic():
            entry = get_object_or_404(
                EventType.objects.select_for_update(), channel_id=channel_id, name=name
            )
            require_unmodified_since(request, entry.changed_at)
            entry.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


def _check_name(name: str) -> None:
    try:
        event_catalogue.checked_name(name)
    except event_catalogue.InvalidCatalogueEntry as error:
        raise ApiError(status.HTTP_400_BAD_REQUEST, str(error)) from None


def _detail(entry: EventType) -> Response:
    return with_last_modified(Response(EventTypeSerializer(entry).data), entry.changed_at)
