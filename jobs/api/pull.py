"""Pull consumers drive their jobs' state machine over REST (docs/api.md, webhook-broker's pull
API).

A paused pull consumer (docs/delivery.md, "Pause") is handed nothing: queued-jobs lists no jobs,
claim takes none and a job cannot be moved to INFLIGHT (409). Jobs already INFLIGHT can still be
reported, so work a worker holds is not lost by pausing. A request already past its pause check when
the pause lands completes, as a push delivery in flight does.

No request sweeps expired leases: the dispatchers' maintenance step does, about once a second
(jobs/maintenance.py; docs/architecture.md, "Background duties"). A claim takes only QUEUED jobs,
so a job under a live lease is never handed out, and one whose lease expired is handed out again
once that step returned it.
"""

from __future__ import annotations

import time
from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import FormParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.errors import ApiError
from broker.api.parsers import JsonBodyParser
from broker.api.schema import PULL_ONLY_ERRORS, error_response
from broker.api.serializers import ErrorSerializer
from broker.parsing import parse_int
from broker.storable_text import read_json
from consumers.models import Consumer
from jobs.api import long_poll
from jobs.api.access import (
    authorized_consumer,
    consumer_job,
    credentials_of,
    proven_credentials,
)
from jobs.api.serializers import JobLinksSerializer, QueuedJobsSerializer
from jobs.models import Job, delete_jobs
from jobs.outcome_log import PullReport
from jobs.queue import (
    PULL_FAILED,
    PullCredentials,
    acknowledge_pull_job,
    claim_for_pull,
    take_for_pull,
)
from jobs.retry import Verdict
from jobs.states import (
    DEAD,
    DELIVERED,
    INFLIGHT,
    QUEUED,
    JobStatus,
    TransitionConflict,
    check_transition,
)

DEFAULT_LIMIT, MAX_LIMIT = 25, 100
MAX_INCREMENTAL_TIMEOUT = 86400
# A long poll holds its thread: it must end well before gunicorn's default 30 s --timeout, which
# kills a sync worker busy with one request that long (seen under load: a 500 and a lost worker).
# A longer wait is shortened to this, not refused: workers written for the earlier 30 s go on.
MAX_WAIT_SECONDS = 20
LONGEST_WAIT_ACCEPTED = 3600
TOKEN_HEADERS = [
    OpenApiParameter("X-Broker-Channel-Token", str, OpenApiParameter.HEADER, required=True),
    OpenApiParameter("X-Broker-Consumer-Token", str, OpenApiParameter.HEADER, required=True),
]
JOB_PARAMETERS = [
    *TOKEN_HEADERS,
    OpenApiParameter(
        "job_id",
        str,
        OpenApiParameter.PATH,
        pattern="^[0-9a-v]{20}$",
        description="the job's ID: an xid, as webhook-broker's (docs/api.md#ids)",
    ),
]


class TokenView(APIView):
    """Guarded by the channel and consumer tokens instead of admin authentication."""

    authentication_classes = []
    permission_classes = []


def _bounded_int(raw: Any, name: str, default: int, high: int) -> int:
    if raw in (None, ""):
        return default
    try:
        value = parse_int(str(raw))
    except ValueError:
        raise ApiError(status.HTTP_400_BAD_REQUEST, f"{name} must be an integer.") from None
    if value < 0:
        raise ApiError(status.HTTP_400_BAD_REQUEST, f"{name} must not be negative.")
    return min(value, high)


class QueuedJobsView(TokenView):
    @extend_schema(
        operation_id="list_queued_jobs",
        parameters=[
            *TOKEN_HEADERS,
            OpenApiParameter("limit", int, description="default 25, max 100"),
        ],
        responses={200: QueuedJobsSerializer, **PULL_ONLY_ERRORS},
    )
    def get(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        consumer = authorized_consumer(request, channel_id, consumer_id, pull_only=True)
        limit = _bounded_int(request.query_params.get("limit"), "limit", DEFAULT_LIMIT, MAX_LIMIT)
        if consumer.paused:
            return Response({"Result": []})
        jobs = (
            Job.objects.filter(consumer=consumer, status=QUEUED)
            .select_related("message")
            .order_by("-priority", "pk")[:limit]
        )
        return Response(QueuedJobsSerializer({"Result": list(jobs)}).data)


class ClaimForm(serializers.Serializer[Any]):
    limit = serializers.IntegerField(required=False, min_value=0, max_value=MAX_LIMIT)
    timeout = serializers.IntegerField(required=False, min_value=1, max_value=86400)
    wait = serializers.FloatField(required=False, min_value=0, max_value=LONGEST_WAIT_ACCEPTED)


class ClaimView(TokenView):
    parser_classes = [FormParser, JsonBodyParser]

    @extend_schema(
        operation_id="claim_jobs",
        parameters=TOKEN_HEADERS,
        request=ClaimForm,
        responses={
            **PULL_ONLY_ERRORS,
            200: OpenApiResponse(
                QueuedJobsSerializer,
                description="the jobs taken, maybe none; with `Retry-After` (seconds) when the"
                " claim could not wait (no waiting place free, or the server stopping)",
            ),
        },
    )
    def post(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        """Atomically take up to `limit` queued jobs (INFLIGHT under a lease of `timeout` s)."""
        # The common claim, of a consumer whose token this process checked before, is one
        # statement that checks the request's tokens too (jobs/api/access.py,
        # `proven_credentials`). Only jobs it took prove them: a claim that took none (a bad
        # body, tokens that do not match, a paused consumer, nothing due) is checked step by
        # step below, as every other is, and so answered as it always was.
        proven = proven_credentials(request, channel_id, consumer_id)
        if proven is not None and (jobs := _proven_claim(request, proven)):
            return _claimed(jobs)
        consumer = authorized_consumer(request, channel_id, consumer_id, pull_only=True)
        form = ClaimForm(data=request.data)
        form.is_valid(raise_exception=True)
        limit = form.validated_data.get("limit", DEFAULT_LIMIT)
        lease = form.validated_data.get("timeout")  # None: the queue's own lease length
        wait = min(form.validated_data.get("wait", 0), MAX_WAIT_SECONDS)
        deadline = time.monotonic() + wait
        jobs = _claim_unless_paused(consumer, limit, lease) if limit else []
        if jobs or not limit or not wait:
            return _claimed(jobs)

        # Long poll: hold the request until jobs arrive or `wait` runs out, if this process has
        # a waiting place free (jobs/api/long_poll.py). A paused consumer waits too, so its
        # workers do not spin, and gets jobs if it is resumed meanwhile.
        def claim_again() -> list[Job]:
            consumer.refresh_from_db(fields=["paused"])
            return _claim_unless_paused(consumer, limit, lease)

        polled = long_poll.poll(claim_again, deadline)
        response = _claimed(polled.found)
        if polled.come_back_seconds is not None:
            response["Retry-After"] = str(polled.come_back_seconds)
        return response


def _proven_claim(request: Request, credentials: PullCredentials) -> list[Job]:
    """The jobs a statement that checks the request's credentials claims; none for a body the
    step-by-step path refuses, or when there is nothing to wait for (`limit` 0)."""
    try:
        data = request.data
    except Exception:
        # DRF parses a body once (a body it cannot parse then reads as empty): the refusal the
        # step-by-step path gives first, if any, then this one, as that path would answer.
        authorized_consumer(
            request, credentials.channel_id, credentials.consumer_id, pull_only=True
        )
        raise
    form = ClaimForm(data=data)
    if not form.is_valid() or not (limit := form.validated_data.get("limit", DEFAULT_LIMIT)):
        return []
    return claim_for_pull(credentials, limit, form.validated_data.get("timeout"))


def _claim_unless_paused(consumer: Consumer, limit: int, lease: int | None) -> list[Job]:
    return [] if consumer.paused else claim_for_pull(consumer, limit, lease)


def _claimed(jobs: list[Job]) -> Response:
    return Response(QueuedJobsSerializer({"Result": jobs}).data)


class TransitionRequest(serializers.Serializer[Any]):
    # QUEUED is accepted only as the job's current state (202, as in webhook-broker).
    NextState = serializers.ChoiceField(choices=[QUEUED, INFLIGHT, DELIVERED, DEAD])
    IncrementalTimeout = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_INCREMENTAL_TIMEOUT
    )


class JobView(TokenView):
    @extend_schema(
        operation_id="get_job",
        parameters=JOB_PARAMETERS,
        responses={200: JobLinksSerializer, **PULL_ONLY_ERRORS},
    )
    def get(self, request: Request, channel_id: str, consumer_id: str, job_id: str) -> Response:
        consumer = authorized_consumer(request, channel_id, consumer_id, pull_only=True)
        return Response(JobLinksSerializer(consumer_job(consumer, job_id)).data)

    @extend_schema(
        operation_id="transition_job",
        parameters=JOB_PARAMETERS,
        request={"application/json": TransitionRequest},
        responses={
            **PULL_ONLY_ERRORS,
            202: OpenApiResponse(description="moved, or already in that state"),
            409: OpenApiResponse(
                ErrorSerializer, description="moving to INFLIGHT while the consumer is paused"
            ),
        },
    )
    def post(self, request: Request, channel_id: str, consumer_id: str, job_id: str) -> Response:
        # The common report, a held job DELIVERED or DEAD, is one statement that checks the
        # request's tokens too, once this process has checked the consumer's token the long way
        # (jobs/api/access.py, `proven_credentials`). A request it does not move is checked and
        # looked into step by step below, as every other is, and so answered as it always was.
        plain = _plain_acknowledgement(request)
        proven = proven_credentials(request, channel_id, consumer_id) if plain else None
        if plain and proven and _acknowledge(proven, job_id, plain):
            return Response(status=status.HTTP_202_ACCEPTED)
        consumer = authorized_consumer(request, channel_id, consumer_id, pull_only=True)
        try:
            target, timeout = _transition_request(request)
        except ApiError:
            consumer_job(consumer, job_id)  # a job not found is 404 before a bad body is 400
            raise
        # Once tried above, the statement is not tried again: a job it did not move then is
        # looked into below (the same statement would move it only if it came INFLIGHT
        # meanwhile, or its consumer's token was stored anew unchanged; the state machine below
        # moves such a job as well).
        common = target in (DELIVERED, DEAD) and not timeout and proven is None
        if common and _acknowledge(credentials_of(consumer), job_id, target):
            return Response(status=status.HTTP_202_ACCEPTED)
        job = consumer_job(consumer, job_id)
        if timeout and (target != INFLIGHT or job.status == INFLIGHT):
            raise ApiError(
                status.HTTP_400_BAD_REQUEST,
                "IncrementalTimeout is only allowed when moving a job to INFLIGHT.",
            )
        if job.status != target:
            if target == INFLIGHT and consumer.paused:
                check_transition(job.status, target)  # a forbidden move stays a 400
                raise ApiError(
                    status.HTTP_409_CONFLICT,
                    "Consumer is paused: no job can be moved to INFLIGHT until it is resumed.",
                )
            _move(job, target, timeout)
        return Response(status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        operation_id="delete_dead_job",
        parameters=JOB_PARAMETERS,
        responses={204: None, 404: error_response("no such job, or it is not DEAD")},
    )
    def delete(self, request: Request, channel_id: str, consumer_id: str, job_id: str) -> Response:
        """Delete one dead job (any consumer type)."""
        consumer = authorized_consumer(
            request, channel_id, consumer_id, pull_only=False, unknown_consumer_status=404
        )
        job = consumer_job(consumer, job_id)
        if not delete_jobs(Job.objects.filter(pk=job.pk, status=DEAD)):
            raise ApiError(status.HTTP_404_NOT_FOUND, "No dead job with that ID.")
        return Response(status=status.HTTP_204_NO_CONTENT)


def _acknowledge(credentials: PullCredentials, job_id: str, target: str) -> bool:
    """The common report in one statement (DEAD with the pull consumer's reason); False when it
    moved nothing."""
    reason = PULL_FAILED if target == DEAD else ""
    return acknowledge_pull_job(credentials, job_id, JobStatus(target), reason)


def _plain_acknowledgement(request: Request) -> str | None:
    """DELIVERED or DEAD when the body asks just that (`{"NextState": "DELIVERED"}`, with at most
    an `IncrementalTimeout` of 0), read without DRF's serializer, which would read it the same;
    None for any other body, left to `_transition_request` once the tokens are checked."""
    try:
        fields = wire_keys(json_object(request.body or b"{}"), ["NextState", "IncrementalTimeout"])
    except ApiError:
        return None
    target, timeout = fields.get("NextState"), fields.get("IncrementalTimeout", 0)
    plain = fields.keys() <= {"NextState", "IncrementalTimeout"} and type(timeout) is int
    return target if plain and not timeout and target in (DELIVERED, DEAD) else None


def _transition_request(request: Request) -> tuple[str, int]:
    """NextState and IncrementalTimeout from the JSON body; key case is ignored, as in Go."""
    body = json_object(request.body or b"{}")
    form = TransitionRequest(data=wire_keys(body, ["NextState", "IncrementalTimeout"]))
    if not form.is_valid():
        raise ApiError(status.HTTP_400_BAD_REQUEST, "Invalid transition request.")
    return form.validated_data["NextState"], form.validated_data.get("IncrementalTimeout", 0)


def json_object(body: bytes) -> dict[str, Any]:
    """A request's body: a JSON object, else 400 (naming a field whose text cannot be stored)."""
    try:
        document = read_json(body)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(status.HTTP_400_BAD_REQUEST, "The body must be JSON.") from None
    if not isinstance(document, dict):
        raise ApiError(status.HTTP_400_BAD_REQUEST, "The body must be a JSON object.")
    return document


def wire_keys(fields: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """`fields` with any spelling of `names` as given there: key case is ignored, as in Go."""
    canonical = {name.lower(): name for name in names}
    return {canonical.get(key.lower(), key): value for key, value in fields.items()}


def _move(job: Job, target: str, timeout: int) -> None:
    report = PullReport.of(job)  # an outcome (DELIVERED, DEAD) is logged, as a push one is
    try:
        if target == INFLIGHT:
            take_for_pull(job, incremental_timeout=timeout)
        elif target == DELIVERED:
            job.mark_delivered()
            report.log(Verdict.DELIVERED)
        elif target == DEAD:
            job.mark_dead(PULL_FAILED)
            report.log(Verdict.DEAD, PULL_FAILED)
        else:
            raise ApiError(status.HTTP_400_BAD_REQUEST, "Invalid transition request.")
    except TransitionConflict:
        # Someone else moved it first; fine if it ended where this caller wanted it.
        job.refresh_from_db(fields=["status"])
        if job.status != target:
            raise ApiError(status.HTTP_400_BAD_REQUEST, "Invalid transition request.") from None


class RequeueDeadJobView(TokenView):
    @extend_schema(
        operation_id="requeue_dead_job",
        parameters=JOB_PARAMETERS,
        request=None,
        responses={202: None, 400: error_response("the job is not DEAD")},
    )
    def post(self, request: Request, channel_id: str, consumer_id: str, job_id: str) -> Response:
        consumer = authorized_consumer(request, channel_id, consumer_id, pull_only=False)
        job = consumer_job(consumer, job_id)
        if not Job.objects.filter(pk=job.pk).requeue_dead():
            raise ApiError(status.HTTP_400_BAD_REQUEST, "The job is not DEAD.")
        return Response(status=status.HTTP_202_ACCEPTED)
