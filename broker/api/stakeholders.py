"""Producers and channels: paginated lists, read, create-or-update (docs/api.md)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.conditional import require_unmodified_since, with_last_modified
from broker.api.errors import ApiError
from broker.api.pagination import url_page
from broker.api.schema import IF_UNMODIFIED_SINCE, PAGE_PARAMETERS
from broker.api.serializers import (
    ListResultSerializer,
    StakeholderForm,
    StakeholderSerializer,
    read_form,
    validate_path_id,
)
from broker.models import Channel, Producer
from broker.stakeholders import (
    InvalidChannelList,
    allowed_channel_ids,
    apply_stakeholder_form,
    parse_channel_ids,
    set_allowed_channels,
)


class ProducerSerializer(StakeholderSerializer):
    Channels = serializers.SerializerMethodField(
        help_text="IDs of the channels it may publish to, sorted; enforced only with"
        " BROKER_PRODUCER_CHANNELS=bound"
    )

    def get_Channels(self, producer: Producer) -> list[str]:  # noqa: N802 (wire field name)
        return allowed_channel_ids(producer)


class ProducerForm(StakeholderForm):
    channels = serializers.CharField(
        required=False,
        allow_blank=True,
        help_text="comma-separated IDs of existing channels it may publish to (enforced with"
        " BROKER_PRODUCER_CHANNELS=bound); blank: none; omitted on update: kept",
    )

    def validate_channels(self, value: str) -> list[str]:
        try:
            return parse_channel_ids(value)
        except InvalidChannelList as error:
            raise serializers.ValidationError(str(error)) from None


class ChannelSerializer(StakeholderSerializer):
    ConsumersURL = serializers.SerializerMethodField()
    MessagesURL = serializers.SerializerMethodField()
    BroadcastURL = serializers.SerializerMethodField()
    MessagesStatusURL = serializers.SerializerMethodField()

    def get_ConsumersURL(self, channel: Channel) -> str:  # noqa: N802 (wire field name)
        return f"/channel/{channel.pk}/consumers"

    def get_MessagesURL(self, channel: Channel) -> str:  # noqa: N802
        return f"/channel/{channel.pk}/messages"

    def get_BroadcastURL(self, channel: Channel) -> str:  # noqa: N802
        return f"/channel/{channel.pk}/broadcast"

    def get_MessagesStatusURL(self, channel: Channel) -> str:  # noqa: N802
        return f"/channel/{channel.pk}/messages-status"


class StakeholderListView(APIView):
    model: ClassVar[type[Producer] | type[Channel]]
    path: ClassVar[str]

    @extend_schema(parameters=PAGE_PARAMETERS, responses={200: ListResultSerializer})
    def get(self, request: Request) -> Response:
        return url_page(request, self.model.objects.all(), lambda item: f"/{self.path}/{item.pk}")


class StakeholderDetailView(APIView):
    model: ClassVar[type[Producer] | type[Channel]]
    serializer_class: ClassVar[type[StakeholderSerializer]] = StakeholderSerializer
    form_class: ClassVar[type[StakeholderForm]] = StakeholderForm

    def get(self, request: Request, resource_id: str) -> Response:
        resource = get_object_or_404(self.model, pk=resource_id)
        return with_last_modified(
            Response(self.serializer_class(resource).data), resource.changed_at
        )

    @extend_schema(request=StakeholderForm, parameters=[IF_UNMODIFIED_SINCE])
    def put(self, request: Request, resource_id: str) -> Response:
        validate_path_id(resource_id, self.model.__name__.lower())
        form = read_form(request, self.form_class)
        with transaction.atomic():
            resource = self.model.objects.select_for_update().filter(pk=resource_id).first()
            if resource is None:
                resource = self.model(id=resource_id)
            else:
                require_unmodified_since(request, resource.changed_at)
            apply_stakeholder_form(resource, form, default_name=resource_id)
            resource.save()
            self.save_related(resource, form)  # may refuse: the whole change rolls back
        return with_last_modified(
            Response(self.serializer_class(resource).data), resource.changed_at
        )

    def save_related(self, resource: Producer | Channel, form: dict[str, Any]) -> None:
        """What the form sets beside the resource's own row, once that is saved: nothing but
        for a producer."""


@extend_schema_view(get=extend_schema(operation_id="list_producers"))
class ProducerListView(StakeholderListView):
    model = Producer
    path = "producer"


@extend_schema_view(get=extend_schema(operation_id="get_producer"))
class ProducerDetailView(StakeholderDetailView):
    model = Producer
    serializer_class = ProducerSerializer
    form_class = ProducerForm

    @extend_schema(
        operation_id="put_producer", request=ProducerForm, parameters=[IF_UNMODIFIED_SINCE]
    )
    def put(self, request: Request, resource_id: str) -> Response:
        return super().put(request, resource_id)

    def save_related(self, resource: Producer | Channel, form: dict[str, Any]) -> None:
        if "channels" not in form or not isinstance(resource, Producer):
            return
        try:
            set_allowed_channels(resource, form["channels"])
        except InvalidChannelList as error:
            raise ApiError(status.HTTP_400_BAD_REQUEST, str(error)) from None


@extend_schema_view(get=extend_schema(operation_id="list_channels"))
class ChannelListView(StakeholderListView):
    model = Channel
    path = "channel"


@extend_schema_view(
    get=extend_schema(operation_id="get_channel"), put=extend_schema(operation_id="put_channel")
)
class ChannelDetailView(StakeholderDetailView):
    model = Channel
    serializer_class = ChannelSerializer
