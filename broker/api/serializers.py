"""JSON shapes shared by the API (webhook-broker's PascalCase field names, docs/api.md)."""

from __future__ import annotations

import base64
from typing import Any

from rest_framework import serializers, status
from rest_framework.request import Request

from broker.api.errors import ApiError
from broker.models import Message, is_resource_id
from broker.payloads import PAYLOAD_MISSING, PayloadMissing

FORM_MEDIA_TYPE = "application/x-www-form-urlencoded"


class ErrorSerializer(serializers.Serializer[Any]):
    Error = serializers.CharField()


class PagesSerializer(serializers.Serializer[Any]):
    next = serializers.CharField(required=False)
    previous = serializers.CharField(required=False)


class ListResultSerializer(serializers.Serializer[Any]):
    Result = serializers.ListField(child=serializers.CharField(), help_text="resource URLs")
    Pages = PagesSerializer()


class StakeholderSerializer(serializers.Serializer[Any]):
    """A producer, channel or consumer: webhook-broker's MsgStakeholder fields."""

    ID = serializers.CharField(source="public_id")
    Name = serializers.CharField(source="name")
    # Present only in the response of the PUT that set the token: tokens are not readable later.
    Token = serializers.CharField(source="plain_token", required=False)
    ChangedAt = serializers.DateTimeField(source="changed_at")

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = dict(super().to_representation(instance))
        if data.get("Token") is None:
            del data["Token"]
        return data


class StakeholderForm(serializers.Serializer[Any]):
    """PUT form fields. On update an omitted field keeps its value (see docs/api.md)."""

    name = serializers.CharField(required=False, allow_blank=True, max_length=255)
    token = serializers.CharField(required=False, allow_blank=True, max_length=255)


def validate_path_id(value: str, what: str) -> str:
    if not is_resource_id(value):
        raise ApiError(
            status.HTTP_400_BAD_REQUEST, f"Invalid {what} ID: use 1 to 255 letters, digits, _ or -."
        )
    return value


def read_form(request: Request, form_class: type[serializers.Serializer[Any]]) -> dict[str, Any]:
    """The validated form of a management write; 415 unless the body is form-encoded."""
    if request.content_type.split(";")[0].strip().lower() != FORM_MEDIA_TYPE:
        raise ApiError(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, f"Send the fields as {FORM_MEDIA_TYPE}."
        )
    form = form_class(data=request.data)
    form.is_valid(raise_exception=True)
    return dict(form.validated_data)


def encode_payload(payload: bytes | memoryview) -> tuple[str, str]:
    """The payload for JSON: its text when it is UTF-8, else base64; and which of the two."""
    raw = bytes(payload)
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode(), "base64"


class PayloadFieldsMixin(serializers.Serializer[Any]):
    """`Payload` and `PayloadEncoding` ("utf-8" or "base64"): binary payloads survive JSON.

    An offloaded payload (docs/delivery.md, "Large payloads") is read from storage. One whose file
    is gone is shown as null, with `PayloadError: "payload-missing"`: the rest of the message (or of
    the list of jobs) is still worth having, so this is not an error status for the whole response.
    """

    Payload = serializers.SerializerMethodField()
    PayloadEncoding = serializers.SerializerMethodField()
    # Only when the payload cannot be read (required=False: absent from the object, it is skipped).
    PayloadError = serializers.CharField(required=False, help_text=PAYLOAD_MISSING)

    def get_Payload(self, message: Message) -> str | None:  # noqa: N802 (wire name)
        encoded = _encoded_payload(message)
        return encoded[0] if encoded else None

    def get_PayloadEncoding(self, message: Message) -> str | None:  # noqa: N802
        encoded = _encoded_payload(message)
        return encoded[1] if encoded else None

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = dict(super().to_representation(instance))
        if data["Payload"] is None:
            data["PayloadError"] = PAYLOAD_MISSING
        return data


def payload_fields(message: Message) -> dict[str, Any]:
    """`PayloadFieldsMixin`'s fields of one message, for a serializer that writes its output
    out rather than field by field (`QueuedMessageSerializer`)."""
    encoded = _encoded_payload(message)
    if encoded is None:
        return {"Payload": None, "PayloadEncoding": None, "PayloadError": PAYLOAD_MISSING}
    return {"Payload": encoded[0], "PayloadEncoding": encoded[1]}


def _encoded_payload(message: Message) -> tuple[str, str] | None:
    """The payload as `encode_payload` gives it; None when its offloaded file is gone."""
    try:
        return encode_payload(message.read_payload())
    except PayloadMissing:
        return None
