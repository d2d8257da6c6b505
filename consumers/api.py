"""Consumer management: list, read, create-or-update, delete (docs/api.md)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.http import Http404
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import (
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import serializers, status
from rest_framework.fields import empty
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.conditional import require_unmodified_since, with_last_modified
from broker.api.pagination import url_page
from broker.api.schema import IF_UNMODIFIED_SINCE, PAGE_PARAMETERS
from broker.api.serializers import (
    ListResultSerializer,
    StakeholderForm,
    StakeholderSerializer,
    read_form,
    validate_path_id,
)
from broker.models import Channel
from consumers import services
from consumers.models import Consumer
from jobs.queue import circuit


def consumer_url(consumer: Consumer) -> str:
    return f"/channel/{consumer.channel_id}/consumer/{consumer.public_id}"


class ConsumerSerializer(StakeholderSerializer):
    CallbackURL = serializers.CharField(source="callback_url")
    DeadLetterQueueURL = serializers.SerializerMethodField()
    Type = serializers.CharField(source="type")
    # Extensions (docs/api.md); webhook-broker clients ignore unknown fields.
    Paused = serializers.BooleanField(source="paused")
    Ordering = serializers.CharField(source="ordering")
    RetryDelays = serializers.ListField(
        source="retry_delays", child=serializers.IntegerField(), allow_null=True
    )
    NonRetryableStatuses = serializers.ListField(
        source="non_retryable_statuses", child=serializers.IntegerField()
    )
    MaxInFlight = serializers.IntegerField(source="max_in_flight", allow_null=True)
    # Push requests per second at most, across all dispatchers; null: no limit.
    MaxPerSecond = serializers.FloatField(source="max_per_second", allow_null=True)
    # Until when a 429 with Retry-After holds its jobs back; null or past: not held.
    ThrottledUntil = serializers.DateTimeField(
        source="throttled_until", allow_null=True, read_only=True
    )
    # Seconds a push job may wait undelivered before it expires; null: BROKER_MAX_JOB_AGE_SECONDS.
    MaxJobAge = serializers.IntegerField(source="max_job_age", allow_null=True)
    # The event type patterns it receives (broker/event_types.py); empty: every message.
    EventTypes = serializers.ListField(source="event_types", child=serializers.CharField())
    # The circuit breaker (docs/delivery.md, "Circuit breaker"), as the dispatcher left it; changed
    # only by …/circuit/close.
    CircuitState = serializers.SerializerMethodField()
    CircuitOpenUntil = serializers.DateTimeField(
        source="circuit_open_until", allow_null=True, read_only=True
    )
    ConsecutiveFailures = serializers.IntegerField(source="circuit_failures", read_only=True)

    def get_DeadLetterQueueURL(self, consumer: Consumer) -> str:  # noqa: N802 (wire name)
        return f"{consumer_url(consumer)}/dlq"

    @extend_schema_field(serializers.ChoiceField(choices=circuit.STATES))
    def get_CircuitState(self, consumer: Consumer) -> str:  # noqa: N802 (wire name)
        return circuit.state(consumer, timezone.now())


class SettingField(serializers.CharField):
    """A consumer setting in the PUT form: the CharField's own checks, then its declaration's
    (consumers/services.py, shared with the UI and the admin)."""

    def __init__(self, setting: services.ConsumerSetting, **kwargs: Any) -> None:
        self.setting = setting
        if setting.max_length is not None:
            kwargs.setdefault("max_length", setting.max_length)
        super().__init__(**kwargs)

    def run_validation(self, data: Any = empty) -> Any:
        return self.setting.clean(super().run_validation(data))


def _optional(setting: services.ConsumerSetting, **kwargs: Any) -> SettingField:
    """A setting that may be left out (kept) or blank (its default)."""
    return SettingField(setting, required=False, allow_blank=True, **kwargs)


class ConsumerForm(StakeholderForm):
    callbackUrl = SettingField(services.CALLBACK_URL)  # noqa: N815 (wire name)
    type = serializers.ChoiceField(choices=Consumer.Type.values, required=False, allow_blank=True)
    ordering = serializers.ChoiceField(choices=Consumer.Ordering.values, required=False)
    retryDelays = _optional(services.RETRY_DELAYS)  # noqa: N815 (blank: BROKER_RETRY_DELAYS)
    nonRetryableStatuses = _optional(services.NON_RETRYABLE_STATUSES)  # noqa: N815
    maxInFlight = _optional(services.MAX_IN_FLIGHT)  # noqa: N815
    maxJobAge = _optional(services.MAX_JOB_AGE)  # noqa: N815 (blank: the global limit)
    maxPerSecond = _optional(  # noqa: N815
        services.MAX_PER_SECOND,
        help_text="push requests per second at most, across all dispatchers: a decimal number "
        "above 0 (0.5: one every two seconds); blank or absent: no limit",
    )
    eventTypes = _optional(  # noqa: N815
        services.EVENT_TYPES,
        help_text="comma-separated event types it receives: a type, a prefix ending in * "
        "(order.*), or *; blank or absent: every message (for messages published later)",
    )
    # Imports an existing secret (e.g. one the receiver already has); never echoed back.
    signingSecret = SettingField(  # noqa: N815
        services.SIGNING_SECRET,
        required=False,
        help_text="whsec_ + base64 of 24 to 64 bytes; replaces the current secret, no overlap",
    )


class ConsumerListView(APIView):
    @extend_schema(
        operation_id="list_consumers",
        parameters=PAGE_PARAMETERS,
        responses={200: ListResultSerializer},
    )
    def get(self, request: Request, channel_id: str) -> Response:
        channel = get_object_or_404(Channel, pk=channel_id)
        return url_page(request, Consumer.objects.filter(channel=channel), consumer_url)


class ConsumerDetailView(APIView):
    serializer_class = ConsumerSerializer

    @extend_schema(operation_id="get_consumer")
    def get(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        consumer = get_object_or_404(Consumer, channel_id=channel_id, public_id=consumer_id)
        return with_last_modified(Response(ConsumerSerializer(consumer).data), consumer.changed_at)

    @extend_schema(
        operation_id="put_consumer", request=ConsumerForm, parameters=[IF_UNMODIFIED_SINCE]
    )
    def put(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        validate_path_id(consumer_id, "consumer")
        form = read_form(request, ConsumerForm)
        channel = get_object_or_404(Channel, pk=channel_id)

        def unmodified_since(existing: Consumer | None) -> None:
            if existing is not None:  # creating needs no precondition
                require_unmodified_since(request, existing.changed_at)

        consumer = services.save_consumer(channel, consumer_id, form, unmodified_since)
        return with_last_modified(Response(ConsumerSerializer(consumer).data), consumer.changed_at)

    @extend_schema(
        operation_id="delete_consumer", responses={204: None}, parameters=[IF_UNMODIFIED_SINCE]
    )
    def delete(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        with transaction.atomic():
            consumer = get_object_or_404(
                Consumer.objects.select_for_update(), channel_id=channel_id, public_id=consumer_id
            )
            require_unmodified_since(request, consumer.changed_at)
            # Its jobs (queued, in flight, dead) and their attempts go with it: there is nobody
            # left to deliver them to. The messages stay for the channel's other consumers.
            consumer.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


CONSUMER_AS_NOW = OpenApiResponse(ConsumerSerializer, description="the consumer, after the change")


class ConsumerServiceView(APIView):
    """A view that acts through consumers/services.py, whose ConsumerNotFound is a 404 here.

    Mapped here rather than in broker.api.errors.DOMAIN_ERRORS: importing consumers.services
    there would be an import cycle (services uses broker.api.serializers, which imports errors).
    """

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, services.ConsumerNotFound):
            exc = Http404(str(exc))
        return super().handle_exception(exc)


class PauseConsumerView(ConsumerServiceView):
    """Pause delivery: jobs keep accumulating, none is attempted or handed out until resumed.

    Push deliveries already in flight finish; pull consumers' INFLIGHT jobs can still be
    reported DELIVERED or DEAD. Pausing a paused consumer is a 202 that changes nothing.
    """

    paused = True

    @extend_schema(operation_id="pause_consumer", request=None, responses={202: CONSUMER_AS_NOW})
    def post(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        return _accepted(services.pause_consumer(channel_id, consumer_id, self.paused))


@extend_schema_view(post=extend_schema(operation_id="resume_consumer"))
class ResumeConsumerView(PauseConsumerView):
    """Resume delivery of a paused consumer; resuming one that is not paused changes nothing."""

    paused = False


class CloseCircuitView(ConsumerServiceView):
    """Close the consumer's circuit now (docs/delivery.md, "Circuit breaker"): delivery resumes with
    the next claim.

    Resets ConsecutiveFailures and the cooldown; ChangedAt does not move, as for every circuit
    change (they are delivery activity, not settings). A closed circuit stays closed.
    """

    @extend_schema(
        operation_id="close_consumer_circuit", request=None, responses={202: CONSUMER_AS_NOW}
    )
    def post(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        return _accepted(services.close_circuit(channel_id, consumer_id))


def _accepted(consumer: Consumer) -> Response:
    response = Response(ConsumerSerializer(consumer).data, status=status.HTTP_202_ACCEPTED)
    return with_last_modified(response, consumer.changed_at)


class SigningSecretSerializer(serializers.Serializer[Any]):
    SigningSecret = serializers.CharField(source="signing_secret", help_text="whsec_ + base64")
    PreviousSigningSecretExpiresAt = serializers.DateTimeField(
        source="previous_secret_expires_at",
        required=False,
        help_text="present while the previous secret still signs deliveries",
    )

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = dict(super().to_representation(instance))
        if len(instance.active_signing_secrets(timezone.now())) < 2:
            del data["PreviousSigningSecretExpiresAt"]
        return data


class SigningSecretView(ConsumerServiceView):
    """A consumer's Standard Webhooks signing secret (docs/delivery.md, "Signing"), kept out of the
    consumer JSON."""

    @extend_schema(
        operation_id="get_signing_secret",
        description="The current signing secret.",
        responses={200: SigningSecretSerializer},
    )
    def get(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        consumer = get_object_or_404(Consumer, channel_id=channel_id, public_id=consumer_id)
        return _secret_response(consumer)

    @extend_schema(
        operation_id="rotate_signing_secret",
        description="Rotate: a new secret signs from now on, the old one too for 24 hours.",
        request=None,
        responses={200: SigningSecretSerializer},
    )
    def post(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        return _secret_response(services.rotate_signing_secret(channel_id, consumer_id))


def _secret_response(consumer: Consumer) -> Response:
    response = Response(SigningSecretSerializer(consumer).data)
    # A secret must not linger in a browser or proxy cache.
    response["Cache-Control"] = "no-store"
    return response
