"""The dead jobs list's actions on many jobs at once: the ticked rows, every job the filters match,
and "requeue since". Each shows first what it would do, the number of jobs (bounded) and a sample
of them, and acts only once that page is confirmed (docs/ui.md, "Actions"). They act in batches
of one short transaction each, as the REST API's requeue and purge of a DLQ
(jobs/dlq_actions.py): "requeue since", and "all matching" when the filters name one consumer of
one channel, take that consumer's whole queue, going on in the background past a few seconds
(its page shows how far it got); the others take at most the newest ACTION_LIMIT jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import URLPattern, path, reverse

from broker.ui import inputs
from broker.ui.access import CHANGE_JOBS, DELETE_JOBS, VIEW_JOBS, operator_view, require
from broker.ui.views import (
    MATCHES_COUNTED,
    SEARCHED,
    DeadJobFilters,
    count_matches,
    dead_jobs_with_last_status,
    id_choices,
    page_posted_from,
    redirect_back,
)
from consumers.models import Consumer
from jobs import dlq_actions
from jobs.dlq_actions import PURGE, REQUEUE, act_on_jobs, act_on_queue
from jobs.models import DeadLetterAction, Job
from jobs.queue_depth import BoundedCount
from jobs.states import DEAD

# Each action, with its permission (views.ACTION_PERMISSIONS), the word for it, and what it is to
# jobs/dlq_actions.py.
ACTIONS = {"requeue": CHANGE_JOBS, "delete": DELETE_JOBS}
VERBS = {"requeue": "Requeue", "delete": "Delete"}
KINDS = {"requeue": REQUEUE, "delete": PURGE}
# The most jobs an action on a selection or on filters other than one consumer's queue takes:
# the newest that match (read as keys, then acted on in batches). An action on more is
# repeated. The preview of any action is one count bounded by it.
ACTION_LIMIT = MATCHES_COUNTED
SAMPLE_SIZE = 10
CONFIRMED = "yes"


@dataclass(frozen=True)
class Preview:
    """What an action would act on, for its confirmation page."""

    action: str
    jobs: BoundedCount
    sample: list[Job]
    what: str  # "the 3 selected jobs", "every dead job the filters match", ...
    fields: list[tuple[str, str]]  # the form's fields, to post again with the confirmation
    url: str  # where the confirmation posts
    whole: bool  # it takes a consumer's whole queue, not the newest ACTION_LIMIT jobs
    cancel: str  # where Cancel leads: the page the action was asked from

    @property
    def verb(self) -> str:
        return VERBS[self.action]


@dataclass(frozen=True)
class WholeQueue:
    """A consumer's dead jobs that died at or after `since` and before `until`: acted on all,
    in batches (jobs/dlq_actions.py)."""

    consumer: Consumer
    since: datetime | None = None
    until: datetime | None = None


@operator_view(post=VIEW_JOBS)  # and the permission of the action chosen, below
def selected_action(request: HttpRequest) -> HttpResponse:
    """Requeue or delete the ticked rows."""
    action = _action(request)
    public_ids = request.POST.getlist("job")
    keys = inputs.job_keys(public_ids, "job")
    if not keys:
        messages.warning(request, "No jobs were selected.")
        return back_to_list(request)
    jobs = Job.objects.filter(pk__in=keys, status=DEAD)
    fields = [("job", public_id) for public_id in public_ids]
    what = f"the {len(keys)} selected job{'s' if len(keys) != 1 else ''}"
    return _confirm_or_act(request, action, jobs, what, fields, "ui:bulk-action")


@operator_view(post=VIEW_JOBS)  # and the permission of the action chosen, below
def matching_action(request: HttpRequest) -> HttpResponse:
    """Requeue or delete every dead job the list's filters match (the newest ACTION_LIMIT)."""
    action = _action(request)
    filters = DeadJobFilters(request.POST)
    inputs.valid(filters)
    jobs = filters.apply(dead_jobs_with_last_status())
    return _confirm_or_act(
        request,
        action,
        jobs,
        "every dead job the filters match"
        + (f" among the newest {SEARCHED:,} they look through" if filters.searches() else ""),
        filters.given(),
        "ui:matching-action",
        whole=_whole_queue(filters.cleaned_data) if not filters.searches() else None,
    )


def _whole_queue(filters: dict[str, Any]) -> WholeQueue | None:
    """The queue the filters name when they give a channel and a consumer (and times only)."""
    if not (filters["channel"] and filters["consumer"]) or filters["message"]:
        return None
    found = Consumer.objects.filter(channel_id=filters["channel"], public_id=filters["consumer"])
    consumer = found.first()
    return WholeQueue(consumer, filters["since"], filters["until"]) if consumer else None


class RequeueSinceForm(forms.Form):
    channel = inputs.IdField(required=True)
    consumer = inputs.IdField(required=True)
    since = inputs.MomentField(required=True)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        found = Consumer.objects.filter(channel_id=data["channel"], public_id=data["consumer"])
        data["found"] = found.first()
        if data["found"] is None:
            self.add_error(
                "consumer", f"No consumer {data['consumer']!r} in channel {data['channel']!r}."
            )
        return data


@operator_view(post=CHANGE_JOBS)
def requeue_since(request: HttpRequest) -> HttpResponse:
    """Requeue a consumer's jobs that died since a time. A form with a mistake comes back with
    what was typed and what is wrong, not an error page."""
    form = RequeueSinceForm(request.POST)
    if not form.is_valid():
        # The channel's consumers only when the channel given is valid (it is a query value).
        context = {"form": form, "id_choices": id_choices(form.cleaned_data.get("channel"))}
        return render(request, "ui/requeue_since.html", context, status=400)
    data = form.cleaned_data
    consumer = data["found"]
    jobs = Job.objects.filter(
        consumer=consumer, status=DEAD, status_changed_at__gte=data["since"]
    ).order_by("-status_changed_at", "-pk")
    what = f"the dead jobs of {consumer.channel_id}/{consumer.public_id} since {data['since']}"
    fields = [(name, str(request.POST.get(name, ""))) for name in ("channel", "consumer", "since")]
    whole = WholeQueue(consumer, since=data["since"])
    return _confirm_or_act(request, "requeue", jobs, what, fields, "ui:requeue-since", whole=whole)


def _action(request: HttpRequest) -> str:
    action = request.POST.get("action", "")
    if action not in ACTIONS:
        raise inputs.bad("action", "Choose requeue or delete.")
    require(request, ACTIONS[action])
    return action


def _confirm_or_act(
    request: HttpRequest,
    action: str,
    jobs: QuerySet[Job],
    what: str,
    fields: list[tuple[str, str]],
    url_name: str,
    whole: WholeQueue | None = None,
) -> HttpResponse:
    """The confirmation page, unless this request confirms it: then the action, on the `whole`
    queue if given, else on the newest ACTION_LIMIT of `jobs`."""
    if request.POST.get("confirmed") != CONFIRMED:
        back = page_posted_from(request, reverse("ui:dead-jobs"))
        # Cancel leads back to where the action was asked (a job's page), which may not be
        # where the action leads once done (the job is gone).
        cancel = page_posted_from(request, back, field="cancel")
        sample = jobs.select_related("consumer", "message").defer("message__payload")
        preview = Preview(
            action,
            count_matches(jobs, ACTION_LIMIT),
            list(sample[:SAMPLE_SIZE]),
            what,
            [("action", action), *fields, ("next", back)],
            reverse(url_name),
            whole is not None,
            cancel,
        )
        context = {"preview": preview, "limit": ACTION_LIMIT, "batch": dlq_actions.BATCH_SIZE}
        return render(request, "ui/confirm_jobs.html", context)
    past = "Requeued" if action == "requeue" else "Deleted"
    if whole is not None:
        return _act_on_queue(request, action, whole, past, what)
    keys = list(jobs.values_list("pk", flat=True)[:ACTION_LIMIT])
    done = act_on_jobs(KINDS[action], keys)
    more = " More match: run it again for the next ones." if len(keys) == ACTION_LIMIT else ""
    messages.success(request, f"{past} {done:,} of {what}.{more}")
    return back_to_list(request)


def _act_on_queue(
    request: HttpRequest, action: str, whole: WholeQueue, past: str, what: str
) -> HttpResponse:
    """The action on a whole queue: back to the list when it finished within the request, else
    to its page, where it shows how far it got."""
    taken = act_on_queue(whole.consumer, KINDS[action], whole.since, whole.until)
    if taken.finished:
        messages.success(request, f"{past} {taken.done:,} of {what}.")
        return back_to_list(request)
    messages.info(
        request, f"{past} {taken.done:,} of {what} so far; the rest goes on in the background."
    )
    return HttpResponseRedirect(reverse("ui:dead-letter-action", args=[taken.public_id]))


@operator_view(get=VIEW_JOBS)
def dead_letter_action(request: HttpRequest, action_id: str) -> HttpResponse:
    """How far a requeue or delete of a consumer's dead jobs that went on in the background
    got."""
    action = get_object_or_404(DeadLetterAction.named(action_id).select_related("consumer"))
    filters = {"channel": action.consumer.channel_id, "consumer": action.consumer.public_id}
    context = {
        "action": action,
        "verb": "Requeue" if action.kind == REQUEUE else "Delete",
        "list_url": f"{reverse('ui:dead-jobs')}?{urlencode(filters)}",
    }
    return render(request, "ui/dead_letter_action.html", context)


def back_to_list(request: HttpRequest) -> HttpResponseRedirect:
    return redirect_back(request, reverse("ui:dead-jobs"))


urlpatterns: list[URLPattern] = [
    path("dead-jobs/bulk", selected_action, name="bulk-action"),
    path("dead-jobs/matching", matching_action, name="matching-action"),
    path("dead-jobs/requeue-since", requeue_since, name="requeue-since"),
    path("dead-jobs/actions/<str:action_id>", dead_letter_action, name="dead-letter-action"),
]
