"""A consumer's dead-letter queue: list, requeue (all or since T), purge (docs/api.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.auth import is_broker_admin
from broker.api.errors import ApiError
from broker.api.pagination import paginate
from broker.api.serializers import PagesSerializer, read_form
from consumers.models import Consumer
from jobs.api.access import authorized_consumer
from jobs.api.pull import TOKEN_HEADERS
from jobs.api.serializers import JobLinksSerializer
from jobs.models import Job, delete_jobs
from jobs.states import DEAD


class DeadJobsSerializer(serializers.Serializer[Any]):
    DeadJobs = JobLinksSerializer(many=True)
    Pages = PagesSerializer()


class RequeueForm(serializers.Serializer[Any]):
    requeue = serializers.CharField(required=False, help_text="the consumer's token")
    since = serializers.DateTimeField(required=False, help_text="only jobs that died after this")


class RequeuedSerializer(serializers.Serializer[Any]):
    requeuedCount = serializers.IntegerField()  # noqa: N815 (wire name)


class DeletedSerializer(serializers.Serializer[Any]):
    deletedCount = serializers.IntegerField()  # noqa: N815 (wire name)


class DeadLetterQueueView(APIView):
    def get_permissions(self) -> Sequence[Any]:
        # Listing needs an admin. Requeue is authorized by the consumer token in the form (as in
        # webhook-broker) or by an admin; purge by the channel and consumer tokens.
        return super().get_permissions() if self.request.method == "GET" else []

    @extend_schema(responses={200: DeadJobsSerializer})
    def get(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        consumer = get_object_or_404(Consumer, channel_id=channel_id, public_id=consumer_id)
        dead = Job.objects.filter(consumer=consumer, status=DEAD).select_related(
            "message", "consumer"
        )
        items, pages = paginate(request, dead, keys=("status_changed_at", "pk"))
        return Response({"DeadJobs": JobLinksSerializer(items, many=True).data, "Pages": pages})

    @extend_schema(request=RequeueForm, responses={202: RequeuedSerializer})
    def post(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        form = read_form(request, RequeueForm)
        consumer = get_object_or_404(Consumer, channel_id=channel_id, public_id=consumer_id)
        # A token that is given must be right, admin or not: a wrong one is a mistake to report,
        # not something an admin's rights paper over.
        token = form.get("requeue")
        # An admin's own credentials, not BROKER_OPEN_ADMIN_API: webhook-broker, whose open API
        # that setting restores, asks every requeue for the consumer's token.
        if (token or not is_broker_admin(request.user)) and not consumer.check_token(token):
            raise ApiError(
                status.HTTP_400_BAD_REQUEST, "The requeue form field must be the consumer's token."
            )
        dead = Job.objects.filter(consumer=consumer)
        if "since" in form:
            dead = dead.filter(status_changed_at__gte=form["since"])
        return Response({"requeuedCount": dead.requeue_dead()}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(parameters=TOKEN_HEADERS, responses={200: DeletedSerializer})
    def delete(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        consumer = authorized_consumer(
            request, channel_id, consumer_id, pull_only=False, unknown_consumer_status=404
        )
        return Response({"deletedCount": delete_jobs(consumer.jobs.filter(status=DEAD))})
