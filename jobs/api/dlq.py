"""A consumer's dead-letter queue: list, requeue (all or since T), purge, and the progress of a
requeue or purge too big for its request (docs/api.md, "Dead-letter queue")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.auth import IsBrokerAdmin, is_broker_admin
from broker.api.errors import ApiError
from broker.api.pagination import paginate
from broker.api.schema import PAGE_PARAMETERS
from broker.api.serializers import PagesSerializer, read_form
from consumers.models import Consumer
from jobs.api.access import authorized_consumer
from jobs.api.pull import TOKEN_HEADERS
from jobs.api.serializers import JobLinksSerializer
from jobs.dlq_actions import PURGE, REQUEUE, act_on_queue
from jobs.models import DeadLetterAction, Job
from jobs.states import DEAD


class DeadJobsSerializer(serializers.Serializer[Any]):
    DeadJobs = JobLinksSerializer(many=True)
    Pages = PagesSerializer()


class RequeueForm(serializers.Serializer[Any]):
    requeue = serializers.CharField(required=False, help_text="the consumer's token")
    since = serializers.DateTimeField(required=False, help_text="only jobs that died after this")


# Wire names: the lower camel case of the DLQ's answers (requeuedCount, deletedCount).
class DeadLetterActionSerializer(serializers.Serializer[DeadLetterAction]):
    """Extension: a requeue or purge that outlasted its request, and how far it got."""

    id = serializers.CharField(source="public_id")
    action = serializers.ChoiceField(source="kind", choices=DeadLetterAction.Kind.choices)
    state = serializers.ChoiceField(choices=DeadLetterAction.State.choices)
    channelId = serializers.CharField(source="consumer.channel_id")  # noqa: N815
    consumerId = serializers.CharField(source="consumer.public_id")  # noqa: N815
    since = serializers.DateTimeField(allow_null=True)
    diedBefore = serializers.DateTimeField(source="died_before")  # noqa: N815
    doneCount = serializers.IntegerField(source="done")  # noqa: N815
    estimatedCount = serializers.IntegerField(source="estimated_total", allow_null=True)  # noqa: N815
    batches = serializers.IntegerField()
    error = serializers.CharField()
    createdAt = serializers.DateTimeField(source="created_at")  # noqa: N815
    updatedAt = serializers.DateTimeField(source="updated_at")  # noqa: N815
    finishedAt = serializers.DateTimeField(source="finished_at", allow_null=True)  # noqa: N815


GOES_ON = "extension: a requeue or purge that goes on in the background (Location is its URL)"


class RequeuedSerializer(serializers.Serializer[Any]):
    requeuedCount = serializers.IntegerField()  # noqa: N815 (wire name)
    action = DeadLetterActionSerializer(required=False, help_text=GOES_ON)


class DeletedSerializer(serializers.Serializer[Any]):
    deletedCount = serializers.IntegerField()  # noqa: N815 (wire name)


class PurgeGoesOnSerializer(DeletedSerializer):
    action = DeadLetterActionSerializer(help_text=GOES_ON)


def action_url(action: DeadLetterAction) -> str:
    consumer = f"/channel/{action.consumer.channel_id}/consumer/{action.consumer.public_id}"
    return f"{consumer}/dlq/action/{action.public_id}"


def answer(action: DeadLetterAction, count_field: str, finished_status: int) -> Response:
    """A finished action as webhook-broker answers; one that goes on, 202 with its progress and
    its URL in Location."""
    if action.finished:
        return Response({count_field: action.done}, status=finished_status)
    body = {count_field: action.done, "action": DeadLetterActionSerializer(action).data}
    headers = {"Location": action_url(action)}
    return Response(body, status=status.HTTP_202_ACCEPTED, headers=headers)


class DeadLetterQueueView(APIView):
    def get_permissions(self) -> Sequence[Any]:
        # Listing needs an admin. Requeue is authorized by the consumer token in the form (as in
        # webhook-broker) or by an admin; purge by the channel and consumer tokens.
        return super().get_permissions() if self.request.method == "GET" else []

    @extend_schema(
        operation_id="list_dead_jobs",
        parameters=PAGE_PARAMETERS,
        responses={200: DeadJobsSerializer},
    )
    def get(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        consumer = get_object_or_404(Consumer, channel_id=channel_id, public_id=consumer_id)
        dead = Job.objects.filter(consumer=consumer, status=DEAD).select_related(
            "message", "consumer"
        )
        items, pages = paginate(request, dead, keys=("status_changed_at", "pk"))
        return Response({"DeadJobs": JobLinksSerializer(items, many=True).data, "Pages": pages})

    @extend_schema(
        operation_id="requeue_dead_jobs", request=RequeueForm, responses={202: RequeuedSerializer}
    )
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
        action = act_on_queue(consumer, REQUEUE, since=form.get("since"))
        return answer(action, "requeuedCount", status.HTTP_202_ACCEPTED)

    @extend_schema(
        operation_id="purge_dead_jobs",
        parameters=TOKEN_HEADERS,
        responses={200: DeletedSerializer, 202: PurgeGoesOnSerializer},
    )
    def delete(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        # Extension: an admin's own credentials purge too (as they requeue), so that operators
        # and their tools need no consumer's tokens; webhook-broker's tokens still work.
        if is_broker_admin(request.user) and not _names_tokens(request):
            consumer = get_object_or_404(Consumer, channel_id=channel_id, public_id=consumer_id)
        else:
            consumer = authorized_consumer(
                request, channel_id, consumer_id, pull_only=False, unknown_consumer_status=404
            )
        return answer(act_on_queue(consumer, PURGE), "deletedCount", status.HTTP_200_OK)


def _names_tokens(request: Request) -> bool:
    """Whether the request gives a channel or consumer token: given, they must be right, admin or
    not (as a requeue's)."""
    return any(parameter.name in request.headers for parameter in TOKEN_HEADERS)


class DeadLetterActionView(APIView):
    """Extension: the progress of a requeue or purge of the DLQ that went on in the background."""

    # An admin, or the channel and consumer tokens (as the purge): checked in `get`.
    permission_classes: Sequence[Any] = []

    @extend_schema(
        operation_id="get_dead_letter_action",
        parameters=TOKEN_HEADERS,
        responses={200: DeadLetterActionSerializer},
    )
    def get(self, request: Request, channel_id: str, consumer_id: str, action_id: str) -> Response:
        if IsBrokerAdmin().has_permission(request, self):
            consumer = get_object_or_404(Consumer, channel_id=channel_id, public_id=consumer_id)
        else:
            consumer = authorized_consumer(
                request, channel_id, consumer_id, pull_only=False, unknown_consumer_status=404
            )
        action = DeadLetterAction.named(action_id).filter(consumer=consumer).first()
        if action is None:
            raise ApiError(status.HTTP_404_NOT_FOUND, "Dead-letter action could not be found.")
        action.consumer = consumer  # the one the request named: not read again
        return Response(DeadLetterActionSerializer(action).data)
