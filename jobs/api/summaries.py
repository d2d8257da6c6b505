"""/dlq-status and /job-status: exact counts straight from the jobs table (SPEC §4).

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
from jobs.states import DEAD


class DeadCountSerializer(serializers.Serializer[Any]):
    channelId = serializers.CharField()  # noqa: N815 (wire names)
    channelName = serializers.CharField()  # noqa: N815
    consumerId = serializers.CharField()  # noqa: N815
    consumerName = serializers.CharField()  # noqa: N815
    deadCount = serializers.IntegerField()  # noqa: N815


class DlqStatusSerializer(serializers.Serializer[Any]):
    consumers = DeadCountSerializer(many=True)


class StatusCountSerializer(serializers.Serializer[Any]):
    Status = serializers.CharField()
    Count = serializers.IntegerField()
    OldestItemTimestamp = serializers.DateTimeField()
    NewestItemTimestamp = serializers.DateTimeField()


JOB_STATUS_SCHEMA = {
    "type": "object",
    "additionalProperties": {
        "type": "object",
        "additionalProperties": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "Status": {"type": "string"},
                    "Count": {"type": "integer"},
                    "OldestItemTimestamp": {"type": "string", "format": "date-time"},
                    "NewestItemTimestamp": {"type": "string", "format": "date-time"},
                },
                "required": ["Status", "Count", "OldestItemTimestamp", "NewestItemTimestamp"],
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
            .annotate(n=Count("pk"))
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
                        "Status": row["status"],
                        "Count": row["n"],
                        "OldestItemTimestamp": row["oldest"],
                        "NewestItemTimestamp": row["newest"],
                    }
                ).data
            )
        return Response(summary)
