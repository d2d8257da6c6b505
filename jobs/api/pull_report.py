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
from broker.api.schema import PULL_ONLY_ERRORS
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
ITEM_KEYS = ["ID", "NextState", "IncrementalTimeout", "Error", "Backoff", "Attempted", "Attempts"]


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
    Attempts = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="the job's Attempts as the claim gave them: when given, the report applies only"
        " to that claim (409 for this job once it was claimed again)",
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
    Status = serializers.IntegerField(
        help_text="202, 404 or 400, as POST …/job/{j} would answer; 409 when the item's Attempts"
        " names an earlier claim"
    )
    State = serializers.CharField(required=False, help_text="the job's state now (not on 404)")
    Error = serializers.CharField(required=False, help_text="on 404 and 400: why")


class ReportResponse(serializers.Serializer[Any]):
    Result = ReportedJobResult(many=True)


class ReportView(TokenView):
    @extend_schema(
        operation_id="report_jobs",
        parameters=TOKEN_HEADERS,
        request={"application/json": ReportRequest},
        responses={
            **PULL_ONLY_ERRORS,
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
    reports = [_report(f"Jobs[{n}]", fields) for n, fields in job_items(body, ITEM_KEYS)]
    refuse_repeats([report.job_id for report in reports])
    return reports


def job_items(body: bytes, keys: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """The `Jobs` of a report's or an extension's body, each an object read with `keys` matched
    case-insensitively, numbered; 400 for a list that is empty, too long, or holds something
    else than objects with a string ID."""
    jobs = wire_keys(json_object(body), ["Jobs"]).get("Jobs")
    if not isinstance(jobs, list) or not jobs:
        raise bad("Jobs must be a non-empty list.")
    if len(jobs) > MAX_REPORTS:
        raise bad(f"Jobs holds {len(jobs)} jobs; at most {MAX_REPORTS} are taken at once.")
    items = []
    for n, item in enumerate(jobs):
        if not isinstance(item, dict):
            raise bad(f"Jobs[{n}] must be a JSON object.")
        fields = wire_keys(item, keys)
        if not isinstance(fields.get("ID"), str):
            raise bad(f"Jobs[{n}].ID must be a string.")
        items.append((n, fields))
    return items


def refuse_repeats(job_ids: list[str]) -> None:
    """400 for a job named twice in one request (checked once every item is)."""
    first: dict[str, int] = {}
    for n, job_id in enumerate(job_ids):
        if (earlier := first.setdefault(job_id, n)) != n:
            raise bad(f"Jobs[{n}] names the same job as Jobs[{earlier}].")


def claimed_attempts(where: str, fields: dict[str, Any]) -> int | None:
    """An item's `Attempts`, the job's attempts as its claim gave them (the fence), if given."""
    attempts = _given(fields, "Attempts", None)
    if attempts is not None and (type(attempts) is not int or attempts < 1):
        raise bad(f"{where}.Attempts must be a whole number from 1: the job's Attempts as claimed.")
    return attempts


def _report(where: str, fields: dict[str, Any]) -> OutcomeReport:
    job_id, state = fields["ID"], fields.get("NextState")
    timeout, error = _given(fields, "IncrementalTimeout", 0), _given(fields, "Error", "")
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
    attempts = claimed_attempts(where, fields)
    return OutcomeReport(job_id, JobStatus(state), timeout, error, backoff, attempted, attempts)


def _given(fields: dict[str, Any], name: str, default: object) -> Any:
    """A field's value; null counts as left out, as Go's decoder has it."""
    value = fields.get(name)
    return default if value is None else value


def answer(result: ReportResult) -> dict[str, object]:
    """A job's result as `POST …/job/{j}` would answer it."""
    answer: dict[str, object] = {"ID": result.job_id}
    if result.state is None:
        answer.update(Status=status.HTTP_404_NOT_FOUND, Error="Job could not be found.")
    elif result.claimed_again:
        answer.update(Status=status.HTTP_409_CONFLICT, State=result.state, Error=result.refused)
    elif result.refused:
        answer.update(Status=status.HTTP_400_BAD_REQUEST, State=result.state, Error=result.refused)
    else:
        answer.update(Status=status.HTTP_202_ACCEPTED, State=result.state)
    return answer


def bad(problem: str) -> ApiError:
    return ApiError(status.HTTP_400_BAD_REQUEST, problem)
