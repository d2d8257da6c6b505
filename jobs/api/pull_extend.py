"""`POST …/consumer/{k}/extend` (extension, docs/api.md "Pull consumers"): a pull worker still busy
with jobs it holds moves the end of their leases, so a long job is not swept back to the queue
and handed to another worker while it runs.

Checked whole before anything changes (400 names the problem), then one transaction
(jobs/queue/reports.py): each job answered as a report would be, 202 with the new end of its
lease, 404 (not this consumer's job) or 400 (no longer INFLIGHT: its lease ran out and the sweep
took it back, so another worker may hold it now).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from broker.api.schema import PULL_ONLY_ERRORS
from broker.api.serializers import ErrorSerializer
from jobs.api.access import authorized_consumer
from jobs.api.pull import MAX_INCREMENTAL_TIMEOUT, TOKEN_HEADERS, TokenView
from jobs.api.pull_report import (
    MAX_REPORTS,
    ReportedJobResult,
    answer,
    bad,
    claimed_attempts,
    job_items,
    refuse_repeats,
)
from jobs.queue import LeaseRequest, extend_leases

MAX_LEASE_SECONDS = MAX_INCREMENTAL_TIMEOUT  # as a claim's `timeout`


class ExtendedJob(serializers.Serializer[Any]):
    ID = serializers.CharField(help_text="the job's ID, as claim gave it")
    Timeout = serializers.IntegerField(
        min_value=1, max_value=MAX_LEASE_SECONDS, help_text="the lease ends this many s from now"
    )
    Attempts = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="the job's Attempts as the claim gave them: when given, only that claim's lease"
        " is extended (409 for this job once it was claimed again)",
    )


class ExtendRequest(serializers.Serializer[Any]):
    Jobs = serializers.ListField(child=ExtendedJob(), min_length=1, max_length=MAX_REPORTS)


class ExtendedJobResult(ReportedJobResult):
    LeaseExpiresAt = serializers.DateTimeField(required=False, help_text="on 202: the lease's end")


class ExtendResponse(serializers.Serializer[Any]):
    Result = ExtendedJobResult(many=True)


class ExtendView(TokenView):
    @extend_schema(
        operation_id="extend_jobs",
        parameters=TOKEN_HEADERS,
        request={"application/json": ExtendRequest},
        responses={
            200: OpenApiResponse(ExtendResponse, description="a result per job, in their order"),
            400: OpenApiResponse(ErrorSerializer, description="a bad request: nothing changed"),
            **PULL_ONLY_ERRORS,
        },
    )
    def post(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        """Extend the leases of INFLIGHT jobs the worker holds."""
        consumer = authorized_consumer(request, channel_id, consumer_id, pull_only=True)
        leases = parse_leases(request.body, timezone.now())
        results = extend_leases(consumer, leases)
        answers = []
        for result, lease in zip(results, leases, strict=True):
            extended = result.state is not None and not result.refused
            answers.append(answer(result) | ({"LeaseExpiresAt": lease.until} if extended else {}))
        return Response({"Result": answers})


def parse_leases(body: bytes, now: datetime) -> list[LeaseRequest]:
    """The leases a request's body asks for, every one checked; 400 for the first problem."""
    leases = []
    for n, fields in job_items(body, ["ID", "Timeout", "Attempts"]):
        seconds = fields.get("Timeout")
        if type(seconds) is not int or not 1 <= seconds <= MAX_LEASE_SECONDS:
            raise bad(f"Jobs[{n}].Timeout must be 1 to {MAX_LEASE_SECONDS} seconds.")
        attempts = claimed_attempts(f"Jobs[{n}]", fields)
        leases.append(LeaseRequest(fields["ID"], now + timedelta(seconds=seconds), attempts))
    refuse_repeats([lease.job_id for lease in leases])
    return leases
