"""/dlq-status and /job-status (docs/api.md): counted on each request where that is cheap, else
from the job status summary, whose entries say when it counted them (jobs/status_summary.py)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from consumers.models import Consumer
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from jobs.status_summary import StatusCount, status_counts


class DeadCountSerializer(serializers.Serializer[Any]):
    channelId = serializers.CharField()  # noqa: N815 (wire names)
    channelName = serializers.CharField()  # noqa: N815
    consumerId = serializers.CharField()  # noqa: N815
    consumerName = serializers.CharField()  # noqa: N815
    deadCount = serializers.IntegerField()  # noqa: N815


class DlqStatusSerializer(serializers.Serializer[Any]):
    consumers = DeadCountSerializer(many=True)
    # Extension, only when the counts come from the summary: when it counted them.
    refreshedAt = serializers.DateTimeField(required=False)  # noqa: N815


# webhook-broker's JobStatus numbers, which /job-status reports as it does.
JOB_STATUS_NUMBERS = {QUEUED: 1001, INFLIGHT: 1002, DELIVERED: 1003, DEAD: 1004}


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
                    # Extension, for people reading it.
                    "statusName": {"type": "string"},
                    # Extension: only for a count from the summary.
                    "refreshedAt": {
                        "type": "string",
                        "format": "date-time",
                        "description": "only for a count from the summary: when it was counted",
                    },
                },
                "required": ["status", "count", "oldestItemTimestamp", "newestItemTimestamp"],
            },
        },
    },
}


def _consumers(ids: set[int]) -> dict[int, Consumer]:
    # Only the names: loading whole rows decrypts every consumer's token and secret and every
    # channel's token (0.6 ms a consumer, more than the counts themselves).
    named = Consumer.objects.select_related("channel").only(
        "public_id", "name", "channel_id", "channel__name"
    )
    return named.in_bulk(ids)


class DlqStatusView(APIView):
    @extend_schema(operation_id="get_dlq_status", responses={200: DlqStatusSerializer})
    def get(self, request: Request) -> Response:
        dead = status_counts([DEAD], times=False)
        counts = {count.consumer_id: count for count in dead.counts}
        consumers = _consumers(set(counts))
        rows = [
            {
                "channelId": consumer.channel_id,
                "channelName": consumer.channel.name,
                "consumerId": consumer.public_id,
                "consumerName": consumer.name,
                "deadCount": counts[consumer.pk].count,
            }
            for consumer in sorted(consumers.values(), key=lambda c: (c.channel_id, c.public_id))
        ]
        body: dict[str, Any] = {"consumers": rows}
        if dead.summarised:
            body["refreshedAt"] = dead.refreshed_at
        return Response(DlqStatusSerializer(body).data)


class JobStatusView(APIView):
    @extend_schema(
        operation_id="get_job_status",
        responses={
            200: OpenApiResponse(
                description="channel ID -> consumer ID -> counts per job status",
                response=JOB_STATUS_SCHEMA,
            )
        },
    )
    def get(self, request: Request) -> Response:
        counts = sorted(status_counts().counts, key=lambda count: (count.consumer_id, count.status))
        consumers = _consumers({count.consumer_id for count in counts})
        summary: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
        for count in counts:
            consumer = consumers.get(count.consumer_id)
            if consumer is None:  # deleted since the summary counted it
                continue
            summary[consumer.channel_id][consumer.public_id].append(_entry(count))
        return Response(summary)


def _entry(count: StatusCount) -> dict[str, Any]:
    """webhook-broker's StatusCount, as JOB_STATUS_SCHEMA says. Plain values, no serializer: the
    renderer writes datetimes as a DRF DateTimeField does (RFC 3339, "Z"), and a serializer per
    entry cost about 0.2 ms each, 600 entries at 200 consumers."""
    entry = {
        "status": JOB_STATUS_NUMBERS[count.status],
        "count": count.count,
        "oldestItemTimestamp": count.oldest,
        "newestItemTimestamp": count.newest,
        "statusName": count.status,
    }
    if count.refreshed_at:
        entry["refreshedAt"] = count.refreshed_at
    return entry
