"""`POST …/consumer/{k}/report` (extension, docs/api.md "Pull consumers"): a pull consumer reports
many of its jobs' outcomes in one request, so that a worker needs two requests per batch (claim,
report) instead of one per job.

The whole request is checked before anything changes (400 names the problem); then each job is
moved on its own (jobs/queue/reports.py) and answered with the status `POST …/job/{j}` would
give it: 202 (moved, or already there), 404 (not this consumer's job), 400 (a move the state
machine refuses). A paused consumer can still report the jobs it holds.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from broker.api.errors import ApiError
from broker.api.serializers import ErrorSerializer
from jobs.api.access import authorized_consumer
from jobs.api.pull import (
    MAX_INCREMENTAL_TIMEOUT,
    TOKEN_HEADERS,
    TokenView,
    json_object,
    wire_keys,
)
from jobs.queue import OutcomeReport, ReportResult, report_pull_outcomes
from jobs.states import DEAD, DELIVERED, QUEUED, JobStatus

MAX_REPORTS = 500
MAX_ERROR_LENGTH = 1000
REPORTABLE = (DELIVERED, DEAD, QUEUED)
ITEM_KEYS = ["ID", "NextState", "IncrementalTimeout", "Error", "Backoff", "Attempted"]


class ReportedJob(serializers.Serializer[Any]):
    ID = serializers.CharField(help_text="the job's ID, as claim gave it")
    NextState = serializers.ChoiceField(choices=REPORTABLE)
    IncrementalTimeout = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_INCREMENTAL_TIMEOUT,
        help_text="QUEUED only: seconds before the job is due again (default 0)",
    )
    Error = serializers.CharField(
        required=False,
        max_length=MAX_ERROR_LENGTH,
        help_text="DEAD or QUEUED only: why, kept in the job's LastError",
    )
    Backoff = serializers.BooleanField(
        required=False,
        help_text="QUEUED only, true: due again after the consumer's retry delay for the attempt"
        " it used (its RetryDelays, as a failed push delivery), instead of IncrementalTimeout",
    )
    Attempted = serializers.BooleanField(
        required=False,
        help_text="QUEUED only, false: the worker never started the job; the attempt the claim"
        " counted is taken back (default true)",
    )


class ReportRequest(serializers.Serializer[Any]):
    Jobs = serializers.ListField(child=ReportedJob(), min_length=1, max_length=MAX_REPORTS)


class ReportedJobResult(serializers.Serializer[Any]):
    ID = serializers.CharField()
    Status = serializers.IntegerField(help_text="202, 404 or 400, as POST …/job/{j} would answer")
    State = serializers.CharField(required=False, help_text="the job's state now (not on 404)")
    Error = serializers.CharField(required=False, help_text="on 404 and 400: why")


class ReportResponse(serializers.Serializer[Any]):
    Result = ReportedJobResult(many=True)


class ReportView(TokenView):
    @extend_schema(
        parameters=TOKEN_HEADERS,
        request={"application/json": ReportRequest},
        responses={
            200: OpenApiResponse(ReportResponse, description="a result per job, in their order"),
            400: OpenApiResponse(ErrorSerializer, description="a bad request: nothing changed"),
        },
    )
    def post(self, request: Request, channel_id: str, consumer_id: str) -> Response:
        """Report many jobs' outcomes: DELIVERED, DEAD, or QUEUED (given back)."""
        consumer = authorized_consumer(request, channel_id, consumer_id, pull_only=True)
        results = report_pull_outcomes(consumer, parse_reports(request.body))
        return Response({"Result": [answer(result) for result in results]})


def parse_reports(body: bytes) -> list[OutcomeReport]:
    """The reports of a request's body, every one checked; 400 for the first problem."""
    jobs = wire_keys(json_object(body), ["Jobs"]).get("Jobs")
    if not isinstance(jobs, list) or not jobs:
        raise bad("Jobs must be a non-empty list.")
    if len(jobs) > MAX_REPORTS:
        raise bad(f"Jobs holds {len(jobs)} jobs; at most {MAX_REPORTS} are taken at once.")
    reports = [_report(f"Jobs[{n}]", item) for n, item in enumerate(jobs)]
    first: dict[str, int] = {}
    for n, report in enumerate(reports):
        if (earlier := first.setdefault(report.job_id, n)) != n:
            raise bad(f"Jobs[{n}] names the same job as Jobs[{earlier}].")
    return reports


def _report(where: str, item: object) -> OutcomeReport:
    if not isinstance(item, dict):
        raise bad(f"{where} must be a JSON object.")
    fields = wire_keys(item, ITEM_KEYS)
    job_id, state = fields.get("ID"), fields.get("NextState")
    timeout, error = _given(fields, "IncrementalTimeout", 0), _given(fields, "Error", "")
    if not isinstance(job_id, str):
        raise bad(f"{where}.ID must be a string.")
    if state not in REPORTABLE:
        raise bad(f"{where}.NextState must be DELIVERED, DEAD or QUEUED (claim takes jobs).")
    if type(timeout) is not int or not 0 <= timeout <= MAX_INCREMENTAL_TIMEOUT:
        raise bad(f"{where}.IncrementalTimeout must be 0 to {MAX_INCREMENTAL_TIMEOUT} seconds.")
    if timeout and state != QUEUED:
        raise bad(f"{where}.IncrementalTimeout is only allowed with NextState QUEUED.")
    if not isinstance(error, str) or len(error) > MAX_ERROR_LENGTH:
        raise bad(f"{where}.Error must be a string of at most {MAX_ERROR_LENGTH} characters.")
    if error and state == DELIVERED:
        raise bad(f"{where}.Error is only allowed with NextState DEAD or QUEUED.")
    backoff, attempted = _given(fields, "Backoff", False), _given(fields, "Attempted", True)
    if not isinstance(backoff, bool) or not isinstance(attempted, bool):
        raise bad(f"{where}.Backoff and {where}.Attempted must be true or false.")
    if (backoff or not attempted) and state != QUEUED:
        raise bad(f"{where}: Backoff and Attempted false are only allowed with NextState QUEUED.")
    if backoff and (timeout or not attempted):
        raise bad(f"{where}.Backoff excludes IncrementalTimeout and Attempted false.")
    return OutcomeReport(job_id, JobStatus(state), timeout, error, backoff, attempted)


def _given(fields: dict[str, Any], name: str, default: object) -> Any:
    """A field's value; null counts as left out, as Go's decoder has it."""
    value = fields.get(name)
    return default if value is None else value


def answer(result: ReportResult) -> dict[str, object]:
    """A job's result as `POST …/job/{j}` would answer it."""
    answer: dict[str, object] = {"ID": result.job_id}
    if result.state is None:
        answer.update(Status=status.HTTP_404_NOT_FOUND, Error="Job could not be found.")
    elif result.refused:
        answer.update(Status=status.HTTP_400_BAD_REQUEST, State=result.state, Error=result.refused)
    else:
        answer.update(Status=status.HTTP_202_ACCEPTED, State=result.state)
    return answer


def bad(problem: str) -> ApiError:
    return ApiError(status.HTTP_400_BAD_REQUEST, problem)
