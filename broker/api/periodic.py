"""Periodic messages over the API (SPEC §6.9): list, create, read, create-or-update, delete."""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from typing import Any

from django.db import IntegrityError, transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.fields import empty
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.conditional import require_unmodified_since, with_last_modified
from broker.api.errors import ApiError
from broker.api.pagination import paginate
from broker.api.schema import IF_UNMODIFIED_SINCE
from broker.api.serializers import ListResultSerializer, encode_payload, read_form, validate_path_id
from broker.conf import broker_settings
from broker.models import Channel, PeriodicMessage, Producer
from broker.periodic import (
    InvalidSchedule,
    reschedule,
    validate_cron,
    validate_publishable,
    validate_time_zone,
)
from broker.publishing import INT32_MAX, INT32_MIN, PublishError

DEFAULT_CONTENT_TYPE = "application/octet-stream"
# The settings whose change moves next_run_at to the first tick of the new schedule.
SCHEDULE_FIELDS = ("interval_seconds", "cron", "timezone", "enabled")


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


class FormBoolean(serializers.BooleanField):
    """true / false; omitted means unchanged. (DRF's BooleanField reads a field missing from a
    form body as false, as for an unticked HTML checkbox.)"""

    default_empty_html = empty


class PeriodicMessageForm(serializers.Serializer[Any]):
    """PUT / POST form fields. On update an omitted field keeps its value."""

    producer = serializers.CharField(required=False, max_length=255, help_text="producer ID")
    payload = serializers.CharField(
        required=False, trim_whitespace=False, help_text="the message body (see payloadEncoding)"
    )
    payloadEncoding = serializers.ChoiceField(  # noqa: N815 (wire name)
        choices=["utf-8", "base64"], required=False, help_text="of payload; default utf-8"
    )
    contentType = serializers.CharField(required=False, max_length=255)  # noqa: N815
    priority = serializers.IntegerField(required=False, min_value=INT32_MIN, max_value=INT32_MAX)
    headers = serializers.CharField(
        required=False, allow_blank=True, help_text='metadata headers as JSON: {"X-Name": "v"}'
    )
    orderingKey = serializers.CharField(  # noqa: N815
        required=False, allow_blank=True, max_length=255, trim_whitespace=False
    )
    intervalSeconds = serializers.IntegerField(  # noqa: N815
        required=False, min_value=1, max_value=INT32_MAX, help_text="either this or cron"
    )
    cron = serializers.CharField(
        required=False, max_length=255, help_text="5 fields: minute hour day month weekday"
    )
    timeZone = serializers.CharField(  # noqa: N815
        required=False, max_length=64, help_text="IANA name, for cron; default UTC"
    )
    enabled = FormBoolean(required=False)
    skipWhilePending = FormBoolean(required=False)  # noqa: N815

    def validate_headers(self, value: str) -> dict[str, str]:
        try:
            headers = json.loads(value) if value.strip() else {}
        except ValueError:
            raise serializers.ValidationError("a JSON object of header names to text.") from None
        if not isinstance(headers, dict):
            raise serializers.ValidationError("a JSON object of header names to text.")
        return headers

    def validate_timeZone(self, value: str) -> str:  # noqa: N802
        try:
            validate_time_zone(value)
        except InvalidSchedule as error:
            raise serializers.ValidationError(str(error)) from None
        return value

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if "intervalSeconds" in data and "cron" in data:
            raise serializers.ValidationError("Give either intervalSeconds or cron, not both.")
        if "payload" in data:
            data["payload"] = _decode(data["payload"], data.get("payloadEncoding", "utf-8"))
        elif "payloadEncoding" in data:
            raise serializers.ValidationError("payloadEncoding needs a payload.")
        return data


class PeriodicMessagePostForm(PeriodicMessageForm):
    id = serializers.CharField(required=False, max_length=255, help_text="generated when absent")


def _decode(payload: str, encoding: str) -> bytes:
    try:
        if encoding == "base64":
            body = base64.b64decode(payload, validate=True)
        else:
            body = payload.encode()
    except UnicodeEncodeError:  # a lone surrogate
        raise serializers.ValidationError({"payload": "not valid text."}) from None
    except (binascii.Error, ValueError):
        raise serializers.ValidationError({"payload": "not valid base64."}) from None
    if not body:
        raise serializers.ValidationError({"payload": "the payload is empty."})
    limit = broker_settings.BROKER_MAX_PAYLOAD_BYTES
    if len(body) > limit:
        raise serializers.ValidationError({"payload": f"{len(body)} bytes; the limit is {limit}."})
    return body


FORM_TO_MODEL = {
    "payload": "payload",
    "contentType": "content_type",
    "priority": "priority",
    "headers": "headers",
    "orderingKey": "ordering_key",
    "timeZone": "timezone",
    "enabled": "enabled",
    "skipWhilePending": "skip_while_pending",
}


def apply_form(schedule: PeriodicMessage, form: dict[str, Any]) -> None:
    """Set the schedule's fields from a validated form; 400 for an invalid combination."""
    creating = schedule._state.adding
    before = {field: getattr(schedule, field) for field in SCHEDULE_FIELDS}
    if "producer" in form:
        if not Producer.objects.filter(pk=form["producer"]).exists():
            raise ApiError(status.HTTP_400_BAD_REQUEST, f"No producer {form['producer'][:300]!r}.")
        schedule.producer_id = form["producer"]
    for field, attribute in FORM_TO_MODEL.items():
        if field in form:
            setattr(schedule, attribute, form[field])
    if "intervalSeconds" in form:
        schedule.interval_seconds, schedule.cron = form["intervalSeconds"], ""
    if "cron" in form:
        schedule.interval_seconds, schedule.cron = None, form["cron"].strip()
    if creating:
        _require_on_create(schedule, form)
    _validate(schedule)
    if creating or any(getattr(schedule, field) != before[field] for field in SCHEDULE_FIELDS):
        reschedule(schedule)


def _require_on_create(schedule: PeriodicMessage, form: dict[str, Any]) -> None:
    missing = [name for name in ("producer", "payload") if name not in form]
    if missing:
        raise ApiError(status.HTTP_400_BAD_REQUEST, f"Creating needs {' and '.join(missing)}.")
    if "intervalSeconds" not in form and "cron" not in form:
        raise ApiError(status.HTTP_400_BAD_REQUEST, "Creating needs intervalSeconds or cron.")
    schedule.content_type = schedule.content_type or DEFAULT_CONTENT_TYPE


def _validate(schedule: PeriodicMessage) -> None:
    """What publish() will check at each tick, checked now, so a schedule cannot fail later."""
    try:
        if schedule.cron:
            validate_cron(schedule.cron, schedule.timezone)
        validate_publishable(schedule)
    except (InvalidSchedule, PublishError) as error:
        raise ApiError(status.HTTP_400_BAD_REQUEST, str(error)) from None


def _detail(schedule: PeriodicMessage, status_code: int = status.HTTP_200_OK) -> Response:
    response = Response(PeriodicMessageSerializer(schedule).data, status=status_code)
    return with_last_modified(response, schedule.changed_at)


class PeriodicMessageListView(APIView):
    @extend_schema(responses={200: ListResultSerializer})
    def get(self, request: Request, channel_id: str) -> Response:
        channel = get_object_or_404(Channel, pk=channel_id)
        items, pages = paginate(request, PeriodicMessage.objects.filter(channel=channel))
        return Response({"Result": [periodic_url(item) for item in items], "Pages": pages})

    @extend_schema(
        request=PeriodicMessagePostForm,
        responses={201: OpenApiResponse(PeriodicMessageSerializer, description="created")},
    )
    def post(self, request: Request, channel_id: str) -> Response:
        form = read_form(request, PeriodicMessagePostForm)
        public_id = form.pop("id", None) or uuid.uuid4().hex
        validate_path_id(public_id, "periodic message")
        channel = get_object_or_404(Channel, pk=channel_id)
        schedule = PeriodicMessage(channel=channel, public_id=public_id)
        apply_form(schedule, form)
        try:
            with transaction.atomic():
                schedule.save(force_insert=True)
        except IntegrityError:
            raise ApiError(
                status.HTTP_409_CONFLICT, f"Periodic message {public_id!r} already exists."
            ) from None
        response = _detail(schedule, status.HTTP_201_CREATED)
        response["Location"] = periodic_url(schedule)
        return response


class PeriodicMessageDetailView(APIView):
    serializer_class = PeriodicMessageSerializer

    def get(self, request: Request, channel_id: str, periodic_id: str) -> Response:
        schedule = get_object_or_404(
            PeriodicMessage.objects.select_related("last_message"),
            channel_id=channel_id,
            public_id=periodic_id,
        )
        return _detail(schedule)

    @extend_schema(request=PeriodicMessageForm, parameters=[IF_UNMODIFIED_SINCE])
    def put(self, request: Request, channel_id: str, periodic_id: str) -> Response:
        validate_path_id(periodic_id, "periodic message")
        form = read_form(request, PeriodicMessageForm)
        channel = get_object_or_404(Channel, pk=channel_id)
        with transaction.atomic():
            # Locked: also against a dispatcher publishing a tick of it right now.
            schedule = (
                PeriodicMessage.objects.select_for_update()
                .filter(channel=channel, public_id=periodic_id)
                .first()
            )
            if schedule is None:
                schedule = PeriodicMessage(channel=channel, public_id=periodic_id)
            else:
                require_unmodified_since(request, schedule.changed_at)
            apply_form(schedule, form)
            schedule.save()
        return _detail(schedule)

    @extend_schema(responses={204: None}, parameters=[IF_UNMODIFIED_SINCE])
    def delete(self, request: Request, channel_id: str, periodic_id: str) -> Response:
        with transaction.atomic():
            schedule = get_object_or_404(
                PeriodicMessage.objects.select_for_update(),
                channel_id=channel_id,
                public_id=periodic_id,
            )
            require_unmodified_since(request, schedule.changed_at)
            # The messages it published stay: they belong to the channel now.
            schedule.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)
