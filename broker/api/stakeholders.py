"""Producers and channels: paginated lists, read, create-or-update (docs/api.md)."""

from __future__ import annotations

from typing import ClassVar

from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.conditional import require_unmodified_since, with_last_modified
from broker.api.pagination import url_page
from broker.api.schema import IF_UNMODIFIED_SINCE
from broker.api.serializers import (
    ListResultSerializer,
    StakeholderForm,
    StakeholderSerializer,
    read_form,
    validate_path_id,
)
from broker.models import Channel, Producer
from broker.stakeholders import apply_stakeholder_form


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

    @extend_schema(responses={200: ListResultSerializer})
    def get(self, request: Request) -> Response:
        return url_page(request, self.model.objects.all(), lambda item: f"/{self.path}/{item.pk}")


class StakeholderDetailView(APIView):
    model: ClassVar[type[Producer] | type[Channel]]
    serializer_class: ClassVar[type[StakeholderSerializer]] = StakeholderSerializer

    def get(self, request: Request, resource_id: str) -> Response:
        resource = get_object_or_404(self.model, pk=resource_id)
        return with_last_modified(
            Response(self.serializer_class(resource).data), resource.changed_at
        )

    @extend_schema(request=StakeholderForm, parameters=[IF_UNMODIFIED_SINCE])
    def put(self, request: Request, resource_id: str) -> Response:
        validate_path_id(resource_id, self.model.__name__.lower())
        form = read_form(request, StakeholderForm)
        with transaction.atomic():
            resource = self.model.objects.select_for_update().filter(pk=resource_id).first()
            if resource is None:
                resource = self.model(id=resource_id)
            else:
                require_unmodified_since(request, resource.changed_at)
            apply_stakeholder_form(resource, form, default_name=resource_id)
            resource.save()
        return with_last_modified(
            Response(self.serializer_class(resource).data), resource.changed_at
        )


class ProducerListView(StakeholderListView):
    model = Producer
    path = "producer"


class ProducerDetailView(StakeholderDetailView):
    model = Producer


class ChannelListView(StakeholderListView):
    model = Channel
    path = "channel"


class ChannelDetailView(StakeholderDetailView):
    model = Channel
    serializer_class = ChannelSerializer
