"""Scheduled messages: list, read, create and cancel (docs/scheduled.md). The periodic message pages
are in broker/ui/periodic_pages.py; both are routed from here.

Writes go through the services the REST API uses: creating is `publish(..., scheduled_for=...)`
after the broadcast header's minimum-delay rule (`require_min_delay`), cancelling is
`cancel_scheduled`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import URLPattern, path, reverse
from django.utils import timezone

from broker.conf import broker_settings
from broker.models import Message
from broker.publishing import PublishError, publish
from broker.scheduling import (
    AlreadyReleased,
    NotScheduled,
    cancel_scheduled,
    parse_rfc3339,
    require_min_delay,
)
from broker.ui import inputs, paging, periodic_pages
from broker.ui.access import ADD_MESSAGES, DELETE_MESSAGES, VIEW_MESSAGES, operator_view
from broker.ui.views import message_preview, redirect_back

# An ISO 8601 date and time without an offset (read as UTC), "T" or a space between them,
# seconds optional: what the form's field asks for.
DATETIME_LOCAL = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?\Z", re.ASCII)
# Soonest release first, ties within one instant by id.
SCHEDULED_ORDER = paging.Keyset("scheduled_for", "pk", inputs.moment, inputs.primary_key)
LISTED_FIELDS = (
    "pk",
    "channel_id",
    "public_id",
    "producer_id",
    "scheduled_for",
    "payload_size",
    "content_type",
    "priority",
    "ordering_key",
)


class ScheduledFilters(forms.Form):
    channel = inputs.IdField()
    cursor = SCHEDULED_ORDER.cursor_field()


class ScheduleMessageForm(forms.Form):
    """What a scheduled broadcast carries; `publish()` checks the message itself."""

    channel = forms.CharField(max_length=255)
    producer = forms.CharField(max_length=255)
    message_id = forms.CharField(
        label="Message ID", required=False, max_length=255, help_text="generated when empty"
    )
    content_type = forms.CharField(max_length=255, required=False, initial="application/json")
    payload = forms.CharField(widget=forms.Textarea(attrs={"rows": 6}), strip=False)
    priority = forms.IntegerField(initial=0)
    ordering_key = forms.CharField(required=False, max_length=255)
    scheduled_for = forms.CharField(
        help_text="in UTC",
        # Text in ISO 8601, not the browser's date picker, which shows its locale's format.
        widget=forms.TextInput(attrs={"placeholder": "e.g. 2030-01-31 12:00"}),
    )

    def clean_scheduled_for(self) -> datetime:
        return parse_schedule_time(self.cleaned_data["scheduled_for"])


def parse_schedule_time(text: str) -> datetime:
    """An RFC 3339 date-time (as the broadcast header takes), or one without an offset, read as
    UTC, the zone every page of the UI shows; within the range
    broker/ui/inputs.py allows."""
    try:
        return inputs.in_range(_schedule_time(text.strip()))
    except ValueError as error:
        raise forms.ValidationError(str(error)) from None


def _schedule_time(text: str) -> datetime:
    try:
        return parse_rfc3339(text)
    except ValueError:
        pass
    if not DATETIME_LOCAL.match(text):
        raise ValueError("Give a date and time, e.g. 2030-01-31T12:00.")
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    except ValueError:  # 2030-02-30 and the like
        raise ValueError("Give a date and time, e.g. 2030-01-31T12:00.") from None


def earliest_schedule_time() -> str:
    """A first proposal for the form: the next whole minute the minimum delay allows."""
    delay = timedelta(seconds=broker_settings.BROKER_MIN_SCHEDULE_DELAY_SECONDS)
    earliest = timezone.now().astimezone(UTC) + delay + timedelta(minutes=1)
    return earliest.replace(second=0, microsecond=0).strftime("%Y-%m-%dT%H:%M")


def pending_messages(filters: ScheduledFilters) -> QuerySet[Message]:
    """Messages waiting for their release, soonest first. Served by the partial index
    message_scheduled_due_idx (scheduled_for WHERE status = 'SCHEDULED'), read in order."""
    pending: QuerySet[Message] = Message.objects.filter(status=Message.Status.SCHEDULED)
    if channel := filters.cleaned_data["channel"]:
        pending = pending.filter(channel_id=channel)
    pending = SCHEDULED_ORDER.after(pending, filters.cleaned_data["cursor"])
    return SCHEDULED_ORDER.ordered(pending.only(*LISTED_FIELDS))


@operator_view(get=VIEW_MESSAGES)
def scheduled_list(request: HttpRequest) -> HttpResponse:
    filters = ScheduledFilters(request.GET)
    inputs.valid(filters)
    pending = pending_messages(filters)
    page = paging.page_of(request, pending, SCHEDULED_ORDER.cursor_of)
    context = {"filters": filters, "rows": page.rows, **page.links()}
    return render(request, "ui/scheduled.html", context)


@operator_view(get=VIEW_MESSAGES)
def scheduled_detail(request: HttpRequest, channel_id: str, message_id: str) -> HttpResponse:
    message = get_object_or_404(
        Message.objects.defer("payload"),
        channel_id=channel_id,
        public_id=message_id,
        scheduled_for__isnull=False,
    )
    context = {"message": message, "preview": message_preview(message)}
    return render(request, "ui/scheduled_message.html", context)


@operator_view(get=ADD_MESSAGES, post=ADD_MESSAGES)
def scheduled_create(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        form = ScheduleMessageForm(
            initial={
                **inputs.valid(inputs.ChannelChoice(request.GET)),
                "scheduled_for": earliest_schedule_time(),
            }
        )
        return render(request, "ui/scheduled_new.html", {"form": form})
    form = ScheduleMessageForm(request.POST)
    if form.is_valid():
        try:
            message = schedule_message(form.cleaned_data)
        except PublishError as error:
            form.add_error(None, str(error))
        else:
            messages.success(
                request,
                f"Message {message.public_id} is scheduled for "
                f"{message.scheduled_for:%Y-%m-%d %H:%M:%S} UTC.",
            )
            return HttpResponseRedirect(f"{reverse('ui:scheduled')}?channel={message.channel_id}")
    return render(request, "ui/scheduled_new.html", {"form": form}, status=400)


def schedule_message(data: dict[str, Any]) -> Message:
    """What POST /channel/{c}/broadcast with X-Broker-Scheduled-For does once its tokens are
    checked: the minimum delay first (ScheduleTooSoon), then `publish()`, whose checks
    (`check_message`, channel, producer, duplicate ID) raise the other PublishErrors."""
    require_min_delay(data["scheduled_for"])
    payload: str = data["payload"].replace("\r\n", "\n")  # a textarea posts CRLF line ends
    return publish(
        data["channel"],
        payload.encode(),
        producer=data["producer"],
        message_id=data["message_id"] or None,
        priority=data["priority"],
        # None: publish()'s default for bytes, application/octet-stream, as for a broadcast
        # without a Content-Type.
        content_type=data["content_type"] or None,
        ordering_key=data["ordering_key"],
        scheduled_for=data["scheduled_for"],
    )


@operator_view(post=DELETE_MESSAGES)
def scheduled_cancel(request: HttpRequest, channel_id: str, message_id: str) -> HttpResponse:
    try:
        cancel_scheduled(channel_id, message_id)
    except (NotScheduled, AlreadyReleased) as error:
        messages.error(request, str(error))
    else:
        messages.success(request, f"Scheduled message {message_id} was cancelled (deleted).")
    return redirect_back(request, reverse("ui:scheduled"))


urlpatterns: list[URLPattern] = [
    path("scheduled", scheduled_list, name="scheduled"),
    path("scheduled/new", scheduled_create, name="scheduled-new"),
    path("scheduled/<str:channel_id>/<str:message_id>", scheduled_detail, name="scheduled-message"),
    path(
        "scheduled/<str:channel_id>/<str:message_id>/cancel",
        scheduled_cancel,
        name="scheduled-cancel",
    ),
    *periodic_pages.urlpatterns,
]
