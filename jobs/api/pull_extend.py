"""`POST …/consumer/{k}/extend` (extension, docs/api.md "Pull consumers"): a pull worker still busy
with jobs it holds moves the end of their leases, so a long job is not swept back to the queue
and handed to another worker while it runs.

Checked whole before anything changes (400 names the problem), then one transaction
(jobs/queue/reports.py): each job answered as a report would be, 202 with the new end of its
lease, 404 (not this consumer's job) or 400 (no longer INFLIGHT: its lease ran out and the sweep
took it back, so another worker may hold it now).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from broker.api.serializers import ErrorSerializer
from jobs.api.access import authorized_consumer
from jobs.api.pull import MAX_INCREMENTAL_TIMEOUT, TOKEN_HEADERS, TokenView, json_object, wire_keys
from jobs.api.pull_report import MAX_REPORTS, ReportedJobResult, answer, bad
from jobs.queue import extend_leases

MAX_LEASE_SECONDS = MAX_INCREMENTAL_TIMEOUT  # as a claim's `timeout`


class ExtendedJob(serializers.Serializer[Any]):
    ID = serializers.CharField(help_text="the job's ID, as claim gave it")
    Timeout = serializers.IntegerField(
        min_value=1, max_value=MAX_LEASE_SECONDS, help_text="the lease ends this many s from now"
    )


class ExtendRequest(serializers.Serializer[Any]):
    Jobs = serializers.ListField(child=ExtendedJob(), min_length=1, max_length=MAX_REPORTS)


class ExtendedJobResult(ReportedJobResult):
    LeaseExpiresAt = serializers.DateTimeField(required=False, help_text="on 202: the lease's end")


class ExtendResponse(serializers.Serializer[Any]):
    Result = ExtendedJobResult(many=True)


class ExtendView(TokenView):
    @extend_schema(
        parameters=TOKEN_HEADERS,
        request={"application/json": ExtendRequest},
        responses={
            200: OpenApiResponse(ExtendResponse, description="a result per job, in their order"),
            400: OpenApiResponse(ErrorSerializer, description="a bad request: nothing changed"),
        },
    )
    def post(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        """Extend the leases of INFLIGHT jobs the worker holds."""
        consumer = authorized_consumer(request, channel_id, consumer_id, pull_only=True)
        now = timezone.now()
        leases = [(job_id, now + timedelta(seconds=s)) for job_id, s in parse_leases(request.body)]
        results = extend_leases(consumer, leases)
        answers = []
        for result, (_, until) in zip(results, leases, strict=True):
            extended = result.state is not None and not result.refused
            answers.append(answer(result) | ({"LeaseExpiresAt": until} if extended else {}))
        return Response({"Result": answers})


def parse_leases(body: bytes) -> list[tuple[str, int]]:
    """(job ID, seconds) per item of the body, every one checked; 400 for the first problem."""
    jobs = wire_keys(json_object(body), ["Jobs"]).get("Jobs")
    if not isinstance(jobs, list) or not jobs:
        raise bad("Jobs must be a non-empty list.")
    if len(jobs) > MAX_REPORTS:
        raise bad(f"Jobs holds {len(jobs)} jobs; at most {MAX_REPORTS} are taken at once.")
    leases = []
    for n, item in enumerate(jobs):
        if not isinstance(item, dict):
            raise bad(f"Jobs[{n}] must be a JSON object.")
        fields = wire_keys(item, ["ID", "Timeout"])
        job_id, seconds = fields.get("ID"), fields.get("Timeout")
        if not isinstance(job_id, str):
            raise bad(f"Jobs[{n}].ID must be a string.")
        if type(seconds) is not int or not 1 <= seconds <= MAX_LEASE_SECONDS:
            raise bad(f"Jobs[{n}].Timeout must be 1 to {MAX_LEASE_SECONDS} seconds.")
        leases.append((job_id, seconds))
    if len({job_id for job_id, _ in leases}) != len(leases):
        raise bad("Jobs names the same job twice.")
    return leases
