"""/dlq-status and /job-status: exact counts straight from the jobs table (docs/api.md).

No summary counter is kept (webhook-broker's can drift): dead jobs are counted through the partial
index on DEAD rows, which stays small.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Count, Max, Min
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from consumers.models import Consumer
from jobs.models import Job
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED


class DeadCountSerializer(serializers.Serializer[Any]):
    channelId = serializers.CharField()  # noqa: N815 (wire names)
    channelName = serializers.CharField()  # noqa: N815
    consumerId = serializers.CharField()  # noqa: N815
    consumerName = serializers.CharField()  # noqa: N815
    deadCount = serializers.IntegerField()  # noqa: N815


class DlqStatusSerializer(serializers.Serializer[Any]):
    consumers = DeadCountSerializer(many=True)


# webhook-broker's JobStatus numbers, which /job-status reports as it does.
JOB_STATUS_NUMBERS = {QUEUED: 1001, INFLIGHT: 1002, DELIVERED: 1003, DEAD: 1004}


class StatusCountSerializer(serializers.Serializer[Any]):
    """webhook-broker's StatusCount, plus `statusName` (extension) for people reading it."""

    status = serializers.IntegerField()
    count = serializers.IntegerField()
    oldestItemTimestamp = serializers.DateTimeField()  # noqa: N815 (wire names)
    newestItemTimestamp = serializers.DateTimeField()  # noqa: N815
    statusName = serializers.CharField()  # noqa: N815


JOB_STATUS_SCHEMA = {
    "type": "object",
    "additionalProperties": {
        "type": "object",
        "additionalProperties": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "status": {"type": "integer", "enum": sorted(JOB_STATUS_NUMBERS.values())},
                    "count": {"type": "integer"},
                    "oldestItemTimestamp": {"type": "string", "format": "date-time"},
                    "newestItemTimestamp": {"type": "string", "format": "date-time"},
                    "statusName": {"type": "string"},
                },
                "required": ["status", "count", "oldestItemTimestamp", "newestItemTimestamp"],
            },
        },
    },
}


def _consumers(ids: set[int]) -> dict[int, Consumer]:
    return Consumer.objects.select_related("channel").in_bulk(ids)


class DlqStatusView(APIView):
    @extend_schema(responses={200: DlqStatusSerializer})
    def get(self, request: Request) -> Response:
        counts = dict(
            Job.objects.filter(status=DEAD)
            .values("consumer")
            # COUNT(*), not COUNT(id): the partial index of the status holds no id, so counting ids
            # read the whole table (1.3 s at 5,000,000 dead jobs) where this reads the index alone.
            .annotate(n=Count("*"))
            .values_list("consumer", "n")
        )
        consumers = _consumers(set(counts))
        rows = [
            {
                "channelId": consumer.channel_id,
                "channelName": consumer.channel.name,
                "consumerId": consumer.public_id,
                "consumerName": consumer.name,
                "deadCount": counts[consumer.pk],
            }
            for consumer in sorted(consumers.values(), key=lambda c: (c.channel_id, c.public_id))
        ]
        return Response({"consumers": rows})


class JobStatusView(APIView):
    @extend_schema(
        responses={
            200: OpenApiResponse(
                description="channel ID -> consumer ID -> counts per job status",
                response=JOB_STATUS_SCHEMA,
            )
        }
    )
    def get(self, request: Request) -> Response:
        rows = (
            Job.objects.values("consumer", "status")
            .annotate(
                n=Count("pk"), oldest=Min("status_changed_at"), newest=Max("status_changed_at")
            )
            .order_by("consumer", "status")
        )
        consumers = _consumers({row["consumer"] for row in rows})
        summary: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
        for row in rows:
            consumer = consumers[row["consumer"]]
            summary[consumer.channel_id][consumer.public_id].append(
                StatusCountSerializer(
                    {
                        "status": JOB_STATUS_NUMBERS[row["status"]],
                        "count": row["n"],
                        "oldestItemTimestamp": row["oldest"],
                        "newestItemTimestamp": row["newest"],
                        "statusName": row["status"],
                    }
                ).data
            )
        return Response(summary)
