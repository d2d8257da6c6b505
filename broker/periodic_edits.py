"""Creating, changing and deleting periodic messages (docs/periodic.md): the one implementation
behind the REST API (broker/api/periodic.py) and the operator UI (broker/ui/periodic_pages.py).

A change arrives as the fields of `PeriodicMessageForm` (the API's form field names); the UI
builds the same dict from its HTML form, so both go through the same validation, the same
"interval or cron" rule and the same recomputation of `next_run_at` (`reschedule`). Refusals
are `InvalidPeriodicMessage` with a message meant for the person who made the change; the API
answers them with 400, the UI shows them next to its form.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction
from rest_framework import serializers
from rest_framework.fields import empty

from broker.conf import broker_settings
from broker.models import Channel, PeriodicMessage, Producer, is_resource_id
from broker.periodic import (
    InvalidSchedule,
    reschedule,
    validate_cron,
    validate_publishable,
    validate_time_zone,
)
from broker.publishing import INT32_MAX, INT32_MIN, PublishError
from broker.storable_text import UnstorableText, read_json

DEFAULT_CONTENT_TYPE = "application/octet-stream"
# The settings whose change moves next_run_at to the first tick of the new schedule.
SCHEDULE_FIELDS = ("interval_seconds", "cron", "timezone", "enabled")

# Called with the locked schedule before a change or deletion; raises to refuse it (the API's
# If-Unmodified-Since check, the UI's "changed since you opened the page" check).
Precondition = Callable[[PeriodicMessage], None]


class InvalidPeriodicMessage(ValueError):
    """The change would make a schedule that cannot work; nothing was saved."""


class PeriodicMessageExists(InvalidPeriodicMessage):
    """The channel already has a periodic message with that ID."""


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
    eventType = serializers.CharField(  # noqa: N815
        required=False,
        allow_blank=True,
        max_length=255,
        help_text="the messages' event type (as X-Broker-Event-Type); blank: none",
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
            headers = read_json(value, root="$") if value.strip() else {}
        except ValueError:
            raise serializers.ValidationError("a JSON object of header names to text.") from None
        except UnstorableText as error:  # stored as jsonb, which holds neither
            raise serializers.ValidationError(str(error)) from None
        if not isinstance(headers, dict):
            raise serializers.ValidationError("a JSON object of header names to text.")
        return headers

    def validate_eventType(self, value: str) -> str | None:  # noqa: N802
        return value.strip() or None  # checked with the rest of the message (periodic.py)

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
    "eventType": "event_type",
    "timeZone": "timezone",
    "enabled": "enabled",
    "skipWhilePending": "skip_while_pending",
}


def apply_form(schedule: PeriodicMessage, form: dict[str, Any]) -> None:
    """Set the schedule's fields from a validated form (not saved); InvalidPeriodicMessage for
    an invalid combination. Moves next_run_at when the schedule or `enabled` changed."""
    creating = schedule._state.adding
    before = {field: getattr(schedule, field) for field in SCHEDULE_FIELDS}
    if "producer" in form:
        if not Producer.objects.filter(pk=form["producer"]).exists():
            raise InvalidPeriodicMessage(f"No producer {form['producer'][:300]!r}.")
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
        raise InvalidPeriodicMessage(f"Creating needs {' and '.join(missing)}.")
    if "intervalSeconds" not in form and "cron" not in form:
        raise InvalidPeriodicMessage("Creating needs intervalSeconds or cron.")
    schedule.content_type = schedule.content_type or DEFAULT_CONTENT_TYPE


def _validate(schedule: PeriodicMessage) -> None:
    """What publish() will check at each tick, checked now, so a schedule cannot fail later."""
    try:
        if schedule.cron:
            validate_cron(schedule.cron, schedule.timezone)
        validate_publishable(schedule)
    except (InvalidSchedule, PublishError) as error:
        raise InvalidPeriodicMessage(str(error)) from None


def new_periodic_id() -> str:
    """The ID of a periodic message created without one."""
    return uuid.uuid4().hex


def check_periodic_id(public_id: str) -> None:
    if not is_resource_id(public_id):
        raise InvalidPeriodicMessage(
            "Invalid periodic message ID: use 1 to 255 letters, digits, _ or -."
        )


def create_periodic(channel: Channel, public_id: str, form: dict[str, Any]) -> PeriodicMessage:
    """A new periodic message from a validated PeriodicMessagePostForm (without its `id`);
    InvalidPeriodicMessage, or PeriodicMessageExists when the ID is taken."""
    check_periodic_id(public_id)
    schedule = PeriodicMessage(channel=channel, public_id=public_id)
    apply_form(schedule, form)
    try:
        with transaction.atomic():
            schedule.save(force_insert=True)
    except IntegrityError:
        raise PeriodicMessageExists(f"Periodic message {public_id!r} already exists.") from None
    return schedule


def change_periodic(
    channel: Channel,
    public_id: str,
    form: dict[str, Any],
    *,
    create_missing: bool = False,
    precondition: Precondition | None = None,
) -> PeriodicMessage:
    """Apply a validated PeriodicMessageForm to the channel's periodic message `public_id` and
    save it; with `create_missing`, create it when there is none (the API's PUT).

    PeriodicMessage.DoesNotExist when there is none to change. `precondition` sees the locked
    row of an existing schedule first and may raise to refuse the change.
    """
    with transaction.atomic():
        # Locked: also against a dispatcher publishing a tick of it right now.
        schedule = (
            PeriodicMessage.objects.select_for_update()
            .filter(channel=channel, public_id=public_id)
            .first()
        )
        if schedule is None:
            if not create_missing:
                raise PeriodicMessage.DoesNotExist(f"No periodic message {public_id!r}.")
            schedule = PeriodicMessage(channel=channel, public_id=public_id)
        elif precondition is not None:
            precondition(schedule)
        apply_form(schedule, form)
        schedule.save()
    return schedule


def set_enabled(channel: Channel, public_id: str, enabled: bool) -> PeriodicMessage:
    """Enable or disable a schedule: the API's PUT `enabled=true|false`, with no precondition.
    Enabling starts the schedule from now; disabling clears next_run_at."""
    return change_periodic(channel, public_id, {"enabled": enabled})


def delete_periodic(
    channel_id: str, public_id: str, precondition: Precondition | None = None
) -> None:
    """Delete a periodic message (the messages it published stay: they belong to the channel).
    PeriodicMessage.DoesNotExist when there is none."""
    with transaction.atomic():
        schedule = PeriodicMessage.objects.select_for_update().get(
            channel_id=channel_id, public_id=public_id
        )
        if precondition is not None:
            precondition(schedule)
        schedule.delete()
