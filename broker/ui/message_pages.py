"""Message search by ID, a message with every job and attempt, and replay (docs/ui.md).

Replay goes through `broker.replay.replay`, the service behind the REST API's
`POST /channel/{c}/message/{m}/replay`: the UI has no rules of its own about what may be replayed.
Every query here is an index look-up or a bounded index walk (docs/ui-messages.md).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django import forms
from django.contrib import messages
from django.db.models import F, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import URLPattern, path

from broker.models import Message
from broker.replay import NotReplayable, ReplayResult, replay
from broker.ui import inputs, paging
from broker.ui.access import CHANGE_MESSAGES, VIEW_MESSAGES, operator_view
from broker.ui.views import message_preview, messages_with_id
from consumers.models import Consumer
from jobs.models import DeliveryAttempt, Job, job_public_id
from jobs.states import DELIVERED

# A message's attempts shown on its page, newest kept: a job replayed many times cannot make
# the page unbounded.
MAX_ATTEMPTS = 500
# Columns of a listing: never the payload.
LIST_FIELDS = (
    "pk",
    "public_id",
    "channel_id",
    "producer_id",
    "status",
    "received_at",
    "dispatched_at",
    "payload_size",
    "content_type",
    "priority",
)


class SearchForm(forms.Form):
    q = inputs.TextField(max_length=255)
    channel = inputs.IdField()
    # Keyset cursor: show ids below.
    before = forms.IntegerField(required=False, min_value=1, max_value=inputs.MAX_PRIMARY_KEY)


@operator_view(get=VIEW_MESSAGES)
def message_search(request: HttpRequest) -> HttpResponse:
    form = SearchForm(request.GET)
    context: dict[str, object] = {"form": form, "hits": None, "recent": [], "is_first_page": True}
    if not form.is_valid():  # the form as typed, its problems named, and no messages
        return render(request, "ui/messages.html", context, status=400)
    search = form.cleaned_data
    query, channel = search["q"], search["channel"]
    if query:
        hits = find_messages(query, channel)
        if len(hits) == 1:
            return redirect("ui:message", message_pk=hits[0].pk)
        context["hits"] = hits
    else:
        recent = recent_messages(channel, search["before"])
        page = paging.page_of(request, recent, lambda row: str(row.pk), parameter="before")
        context.update(recent=page.rows, **page.links())
    return render(request, "ui/messages.html", context)


def find_messages(query: str, channel_id: str = "") -> list[Message]:
    """Messages whose ID is `query` (in `channel_id` if given: `messages_with_id`), and the one
    whose internal id it is when it is a number."""
    by_id = messages_with_id(query, channel_id)
    hits = {message.pk: message for message in _listing(by_id)[: paging.PAGE_SIZE]}
    if query.isascii() and query.isdigit() and len(query) < 19:  # fits a bigint
        by_pk = Message.objects.filter(pk=int(query))
        if channel_id:
            by_pk = by_pk.filter(channel_id=channel_id)
        hits.update((message.pk, message) for message in _listing(by_pk))
    return sorted(hits.values(), key=lambda message: -message.pk)


def recent_messages(channel_id: str, before: int | None) -> list[Message]:
    """Up to a page and one more of messages, newest (highest id) first, below `before`.

    Across channels the primary key is walked backwards. For one channel each status is read
    from message_channel_status_idx (channel, status, -id), exactly in index order, and the
    few lists merged: bounded index scans, however the channel's messages are spread.
    """
    if not channel_id:
        newest = Message.objects.all()
        if before:
            newest = newest.filter(pk__lt=before)
        return list(_listing(newest).order_by("-pk")[: paging.PAGE_SIZE + 1])
    per_status = []
    for status in Message.Status.values:
        rows = Message.objects.filter(channel_id=channel_id, status=status)
        if before:
            rows = rows.filter(pk__lt=before)
        per_status.append(list(_listing(rows).order_by("-pk")[: paging.PAGE_SIZE + 1]))
    merged = heapq.merge(*per_status, key=lambda message: -message.pk)
    return list(merged)[: paging.PAGE_SIZE + 1]


def _listing(messages: QuerySet[Message]) -> QuerySet[Message]:
    return messages.only(*LIST_FIELDS)


@dataclass
class ConsumerRow:
    """One consumer of the message's channel, with its job for this message (if it has one)."""

    consumer: Consumer
    job: Job | None
    message_received_at: datetime

    @property
    def replayable(self) -> bool:
        """What broker.replay would act on (it has the last word, e.g. on a busy ordering key)."""
        if self.job is None:  # joined after the publish, or its job was deleted
            return self.consumer.created_at > self.message_received_at
        return self.job.status == DELIVERED


@operator_view(get=VIEW_MESSAGES)
def message_detail(request: HttpRequest, message_pk: int) -> HttpResponse:
    return message_page(request, get_object_or_404(Message.objects.defer("payload"), pk=message_pk))


@operator_view(get=VIEW_MESSAGES)
def message_by_id(request: HttpRequest, channel_id: str, message_id: str) -> HttpResponse:
    """The same page at the message's public address: its channel and message ID, as producers
    and the API know it."""
    messages_of_channel = Message.objects.defer("payload").filter(channel_id=channel_id)
    return message_page(request, get_object_or_404(messages_of_channel, public_id=message_id))


def message_page(request: HttpRequest, message: Message) -> HttpResponse:
    jobs = {job.consumer_id: job for job in message.jobs.all()}
    consumers = Consumer.objects.filter(channel_id=message.channel_id).order_by("public_id")
    rows = [
        ConsumerRow(consumer, jobs.pop(consumer.pk, None), message.received_at)
        for consumer in consumers
    ]
    attempts = attempts_of(message)
    context = {
        "message": message,
        "rows": rows,
        "attempts": attempts,
        "attempts_capped": len(attempts) >= MAX_ATTEMPTS,
        "preview": message_preview(message),
        "replayable": message.status != Message.Status.SCHEDULED
        and any(row.replayable for row in rows),
    }
    return render(request, "ui/message.html", context)


def attempts_of(message: Message) -> Sequence[DeliveryAttempt]:
    """Every attempt of every job of the message, in one query (attempt_job_idx per job), each
    with its job's public ID and consumer ID; the newest MAX_ATTEMPTS, shown oldest first. Their
    headers are left to the job page: up to twice 4,096 characters a row, 500 rows."""
    newest = (
        DeliveryAttempt.objects.filter(job__message=message)
        .defer("request_headers", "response_headers")
        .annotate(
            consumer_public_id=F("job__consumer__public_id"), job_created_at=F("job__created_at")
        )
        .order_by("-started_at", "-pk")[:MAX_ATTEMPTS]
    )
    return with_job_public_ids(reversed(newest))


def with_job_public_ids(attempts: Iterable[DeliveryAttempt]) -> list[DeliveryAttempt]:
    """The attempts (annotated with their job's `job_created_at`), each given its job's public
    ID: the template's link to the job."""
    rows = list(attempts)
    for attempt in rows:
        created_at = attempt.job_created_at  # type: ignore[attr-defined]
        attempt.job_public_id = job_public_id(attempt.job_id, created_at)  # type: ignore[attr-defined]
    return rows


class ReplayForm(forms.Form):
    consumer = inputs.IdField()  # blank: every consumer of the channel


@operator_view(post=CHANGE_MESSAGES)
def message_replay(request: HttpRequest, message_pk: int) -> HttpResponse:
    """Replay to the consumer named in the form, or to every consumer of the channel."""
    message = get_object_or_404(Message.objects.only("pk", "channel_id"), pk=message_pk)
    consumer = None
    if consumer_id := inputs.valid(ReplayForm(request.POST))["consumer"]:
        consumer = get_object_or_404(Consumer, channel_id=message.channel_id, public_id=consumer_id)
    try:
        result = replay(message, consumer)
    except NotReplayable as error:
        messages.error(request, str(error))
    else:
        report(request, result)
    return redirect("ui:message", message_pk=message.pk)


def report(request: HttpRequest, result: ReplayResult) -> None:
    summary = result.summary()
    if result.queued:
        messages.success(request, f"Replay: {summary}.")
    else:
        messages.warning(request, f"Nothing was replayed: {summary}.")


urlpatterns: list[URLPattern] = [
    path("messages", message_search, name="messages"),
    path("messages/<int:message_pk>", message_detail, name="message"),
    path("messages/<int:message_pk>/replay", message_replay, name="message-replay"),
    path("messages/<str:channel_id>/<str:message_id>", message_by_id, name="message-by-id"),
]
