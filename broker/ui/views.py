"""Dead jobs and job detail pages. Views stay thin: every status change goes through the job
state machine's own methods (`Job.requeue`); the list's actions on many jobs are in
broker/ui/job_actions.py."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from django import forms
from django.contrib import messages
from django.db.models import BinaryField, Exists, F, Func, Q, QuerySet, Subquery, Value
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import Resolver404, get_script_prefix, resolve, reverse
from django.utils import timezone

from broker.models import Channel, Message
from broker.ui import inputs, paging
from broker.ui.access import CHANGE_JOBS, DELETE_JOBS, VIEW_JOBS, operator_view
from broker.ui.attempt_history import attempt_history
from broker.ui.delivery_state import held_back_by
from consumers.models import Consumer
from jobs.models import Job, attempts_of_outer_job
from jobs.queue_depth import BoundedCount
from jobs.states import DEAD, ForbiddenTransition, TransitionConflict

PREVIEW_BYTES = 4096
CHOICES = 500  # suggestions a channel or consumer field offers
# Dead jobs a search by status code or error text looks through per page, newest first: neither
# has an index, and a search that matches nothing must not read every dead job (docs/ui.md).
SEARCHED = 5_000
# The most dead jobs the list counts of those its filters match: past it, "≥ 10,000". The same
# bound as an action takes (job_actions.ACTION_LIMIT), so that the list and an action's
# confirmation page count alike.
MATCHES_COUNTED = 10_000
# The permissions of the dead jobs list's actions (broker/ui/job_actions.py).
ACTION_PERMISSIONS = (CHANGE_JOBS, DELETE_JOBS)
# Newest change first: the order of the partial index job_dead_recent_idx.
DEAD_JOBS_ORDER = paging.Keyset(
    "status_changed_at", "pk", inputs.moment, inputs.primary_key, descending=True
)


class DeadJobFilters(forms.Form):
    channel = inputs.IdField()
    consumer = inputs.IdField()
    message = inputs.TextField(max_length=255)  # the message's ID, as its producer gave it
    since = inputs.MomentField()
    until = inputs.MomentField()
    status_code = forms.IntegerField(required=False, min_value=100, max_value=599)
    error = inputs.TextField()
    cursor = DEAD_JOBS_ORDER.cursor_field()

    def given(self) -> list[tuple[str, str]]:
        """The filters given, without the page's cursor: what "all matching" posts again."""
        return [
            (name, str(self.data[name]))
            for name in self.base_fields
            if name != "cursor" and self.data.get(name)
        ]

    def apply(self, jobs: QuerySet[Job]) -> QuerySet[Job]:
        """The dead jobs the filters match, from the page's cursor on; those of the filters
        that no index serves look through the next SEARCHED of the others' (`last_searched`)."""
        jobs = self.indexed(jobs)
        if not self.searches():
            return jobs
        last = self.last_searched
        if last is not None:
            # The window as a range of the index rather than a list of keys: with a list the
            # planner may read every dead job in order and test each against the list (with
            # partitioned tables it did, docs/performance-history.md), with a range it reads
            # SEARCHED.
            jobs = DEAD_JOBS_ORDER.through(jobs, (last.status_changed_at, last.pk))
        data = self.cleaned_data
        if data["status_code"] is not None:
            # A Q object: the annotation is unknown to the type checker's model of Job.
            jobs = jobs.filter(Q(last_status_code=data["status_code"]))
        if data["error"]:
            # What operators type is often in the answer ("connection to clickhouse:9000
            # refused" under a bare "HTTP 503"): the job's last error or any of its attempts'.
            answered = attempts_of_outer_job().filter(response_excerpt__icontains=data["error"])
            jobs = jobs.filter(Q(last_error__icontains=data["error"]) | Exists(answered))
        return jobs

    def indexed(self, jobs: QuerySet[Job]) -> QuerySet[Job]:
        """`jobs` after the cursor, by the filters an index serves: channel, consumer, message,
        time."""
        data = self.cleaned_data
        if data["channel"]:
            jobs = jobs.filter(consumer__channel_id=data["channel"])
        if data["consumer"]:
            jobs = jobs.filter(consumer__public_id=data["consumer"])
        if data["message"]:
            # The message's jobs through the unique (message, consumer) index.
            jobs = jobs.filter(message__in=messages_with_id(data["message"], data["channel"]))
        if data["since"]:
            jobs = jobs.filter(status_changed_at__gte=data["since"])
        if data["until"]:
            jobs = jobs.filter(status_changed_at__lt=data["until"])
        return DEAD_JOBS_ORDER.after(jobs, data["cursor"])

    def searches(self) -> bool:
        """Whether a filter that no index serves is given: status code or error text."""
        return self.cleaned_data["status_code"] is not None or bool(self.cleaned_data["error"])

    @functools.cached_property
    def last_searched(self) -> Job | None:
        """The last dead job a search by status code or error text looks through, when there
        are SEARCHED and older ones may match too; None otherwise (no such search, or it sees
        every dead job the other filters leave)."""
        if not self.searches():
            return None
        jobs = DEAD_JOBS_ORDER.ordered(self.indexed(Job.objects.filter(status=DEAD)))
        return next(iter(jobs.only("status_changed_at")[SEARCHED - 1 : SEARCHED]), None)


def messages_with_id(public_id: str, channel_id: str | None = None) -> QuerySet[Message]:
    """The messages whose ID is `public_id`, of `channel_id` if given. With a channel the unique
    (channel, public_id) index answers; without one, the sub-select of channel ids makes
    PostgreSQL probe that same index once per channel (a nested loop): there is no index on
    public_id alone, and channels are few where messages are many."""
    found = Message.objects.filter(public_id=public_id)
    if channel_id:
        return found.filter(channel_id=channel_id)
    return found.filter(channel_id__in=Channel.objects.values("pk"))


def count_matches(jobs: QuerySet[Job], limit: int) -> BoundedCount:
    """How many `jobs` there are, counted no further than `limit` + 1 (a LIMITed subquery): a
    count of a million dead jobs stops where the page no longer needs it."""
    return BoundedCount(jobs[: limit + 1].count(), limit)


def dead_jobs_with_last_status() -> QuerySet[Job]:
    last_attempt = attempts_of_outer_job().order_by("-started_at")
    return DEAD_JOBS_ORDER.ordered(
        Job.objects.filter(status=DEAD)
        .select_related("message", "consumer")
        .defer("message__payload")  # never load payloads for a listing
        .annotate(last_status_code=Subquery(last_attempt.values("status_code")[:1]))
    )


@operator_view(get=VIEW_JOBS)
def dead_jobs(request: HttpRequest) -> HttpResponse:
    filters = DeadJobFilters(request.GET)
    if not filters.is_valid():
        # The page again with what was typed and what is wrong with it, and no rows.
        context = {
            "filters": filters,
            "jobs": [],
            "id_choices": id_choices(),
            "quick_ranges": quick_ranges(request, timezone.now()),
        }
        return render(request, "ui/dead_jobs.html", {**context, "is_first_page": True}, status=400)
    jobs = filters.apply(dead_jobs_with_last_status())
    page = paging.page_of(request, jobs, DEAD_JOBS_ORDER.cursor_of)
    # What "all matching" acts on: the filters from the first page on, whichever page this is.
    from_the_top = unpaged(request, filters)
    context = {
        "filters": filters,
        "jobs": page.rows,
        "matches": count_matches(from_the_top.apply(dead_jobs_with_last_status()), MATCHES_COUNTED),
        "matches_searched": from_the_top.last_searched is not None,
        "quick_ranges": quick_ranges(request, timezone.now()),
        "searched": f"{SEARCHED:,}",
        "search_older": None if page.next_page else search_older(request, filters),
        # The ticks of the rows only for users who may requeue or delete them.
        "may_act": any(request.user.has_perm(name) for name in ACTION_PERMISSIONS),
        "id_choices": id_choices(filters.cleaned_data["channel"]),
        # The filters, for "all matching" to post again (the page's cursor left out).
        "matching": filters.given(),
        **page.links(),
    }
    return render(request, "ui/dead_jobs.html", context)


def unpaged(request: HttpRequest, filters: DeadJobFilters) -> DeadJobFilters:
    """`filters` (valid) without the page's cursor: the same filters on the first page."""
    if not filters.cleaned_data["cursor"]:
        return filters
    query = without(request.GET, "cursor")
    first_page = DeadJobFilters(query)
    inputs.valid(first_page)
    return first_page


def without(query: QueryDict, *names: str) -> QueryDict:
    query = query.copy()
    for name in names:
        query.pop(name, None)
    return query


def quick_ranges(request: HttpRequest, now: datetime) -> list[tuple[str, str]]:
    """Links to the list as filtered, died in the last hour, or today (UTC): each the query
    string with `since` set (to the minute, as typed) and `until` and the cursor gone."""
    today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    ranges = []
    for name, since in (("Last hour", now - timedelta(hours=1)), ("Today", today)):
        query = without(request.GET, "since", "until", "cursor")
        query["since"] = since.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
        ranges.append((name, query.urlencode()))
    return ranges


def search_older(request: HttpRequest, filters: DeadJobFilters) -> str | None:
    """The query string that searches on past the dead jobs this page's search looked through,
    when it stopped at SEARCHED of them; None when it saw every one."""
    last = filters.last_searched
    if last is None:
        return None
    query = request.GET.copy()
    query["cursor"] = DEAD_JOBS_ORDER.cursor_of(last)
    return query.urlencode()


def id_choices(channel_id: str | None = None) -> dict[str, list[str]]:
    """What channel and consumer fields suggest (templates/ui/id_choices.html): the channels,
    and the consumers of `channel_id` or of every channel; at most CHOICES of each, by ID."""
    consumers = Consumer.objects.all()
    if channel_id:
        consumers = consumers.filter(channel_id=channel_id)
    return {
        "channels": list(Channel.objects.order_by("pk").values_list("pk", flat=True)[:CHOICES]),
        "consumers": list(
            consumers.order_by("public_id").values_list("public_id", flat=True).distinct()[:CHOICES]
        ),
    }


@operator_view(get=VIEW_JOBS)
def job_detail(request: HttpRequest, job_id: str) -> HttpResponse:
    job = get_object_or_404(
        Job.objects.select_related("message", "consumer")
        .defer("message__payload")
        .with_public_id(job_id)
    )
    attempts = list(job.delivery_attempts.order_by("started_at"))
    context = {
        "job": job,
        "message": job.message,
        "preview": message_preview(job.message),
        "attempts": attempts,
        "history": attempt_history(job, attempts),
        "back": came_from(request) or default_back(job),
        "held_back": held_back_by(job.consumer, timezone.now()),
    }
    return render(request, "ui/job.html", context)


def came_from(request: HttpRequest) -> str | None:
    """The UI page the operator came from (its filters kept), when the browser says and it is a
    page of this site's UI; None otherwise."""
    referer = request.headers.get("Referer", "")
    if not inputs.is_local_url(referer, request.get_host()):
        return None
    parts = urlsplit(referer)
    if not inputs.is_ui_path(parts.path) or parts.path == request.path:
        return None
    if not shows_a_page(parts.path):  # a confirmation page, at the URL its form posted to
        return None
    return parts.path + (f"?{parts.query}" if parts.query else "")


def shows_a_page(path: str) -> bool:
    """Whether `path` is a page a link can lead to, not an action's URL (access.operator_view)."""
    try:
        match = resolve("/" + path.removeprefix(get_script_prefix()))
    except Resolver404:
        return False
    return bool(getattr(match.func, "shows_a_page", True))


def default_back(job: Job) -> str:
    """Where a job's page leads back to without a referrer: the dead jobs for a dead job, its
    consumer's page otherwise."""
    if job.status == DEAD:
        return reverse("ui:dead-jobs")
    return reverse("ui:consumer", args=[job.consumer.channel_id, job.consumer.public_id])


def message_preview(message: Message) -> str | None:
    """The start of an inline payload as text, indented when it is the whole of a JSON payload;
    None when it is offloaded (it is not read). Only the first PREVIEW_BYTES leave the database,
    however large the payload."""
    if message.payload_file:
        return None
    head = (
        Message.objects.filter(pk=message.pk)
        .annotate(
            head=Func(
                F("payload"),
                Value(1),
                Value(PREVIEW_BYTES),
                function="SUBSTR",
                output_field=BinaryField(),
            )
        )
        .values_list("head", flat=True)
        .get()
    )
    text = bytes(head).decode("utf-8", errors="replace")
    whole = len(head) == message.payload_size
    return indented_json(text) if whole and is_json(message.content_type) else text


def is_json(content_type: str) -> bool:
    media_type = content_type.split(";")[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def indented_json(text: str) -> str:
    """JSON text indented for reading; the text as it is when it does not parse."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


@operator_view(post=CHANGE_JOBS)
def requeue_job(request: HttpRequest, job_id: str) -> HttpResponse:
    job = get_object_or_404(Job.objects.with_public_id(job_id))
    try:
        job.requeue()
    except (ForbiddenTransition, TransitionConflict) as error:
        messages.error(request, str(error))
    else:
        messages.success(request, f"Job {job.public_id} was requeued.")
    return redirect("ui:job", job_id=job.public_id)


def redirect_back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    """To the page the form was on (its filters kept), if that is a page of this site."""
    return HttpResponseRedirect(page_posted_from(request, default))


def page_posted_from(request: HttpRequest, default: str, field: str = "next") -> str:
    """The form's `next` (or `field`): the page it was on, if that is a page of this site; else
    `default`."""
    target = request.POST.get(field, "")
    return target if inputs.is_local_url(target, request.get_host()) else default
