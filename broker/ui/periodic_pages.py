"""Periodic messages: list, create, edit, enable/disable, delete (docs/periodic.md).

The HTML forms use the REST API's form field names, and every write goes through
broker/periodic_edits.py, as the API's do: the same validation (`PeriodicMessageForm`,
`apply_form`), the same "interval or cron" rule, and next_run_at recomputed the same way.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import get_object_or_404, render
from django.urls import URLPattern, path, reverse

from broker.api.serializers import encode_payload
from broker.models import Channel, PeriodicMessage
from broker.periodic_edits import (
    InvalidPeriodicMessage,
    PeriodicMessageForm,
    PeriodicMessagePostForm,
    Precondition,
    change_periodic,
    create_periodic,
    delete_periodic,
    new_periodic_id,
    set_enabled,
)
from broker.ui import inputs, paging
from broker.ui.access import (
    ADD_PERIODIC,
    CHANGE_PERIODIC,
    DELETE_PERIODIC,
    VIEW_PERIODIC,
    operator_view,
)
from broker.ui.views import redirect_back

# Form fields an operator may leave empty to mean "not given" (default on create, unchanged on
# edit). The others are sent even when empty: an empty ordering key or header list clears it, an
# empty payload is refused.
OMITTED_WHEN_EMPTY = frozenset(
    {"id", "producer", "contentType", "priority", "intervalSeconds", "cron", "timeZone"}
)
CHECKBOXES = ("enabled", "skipWhilePending")
FORM_FIELDS: list[str] = list(PeriodicMessagePostForm().get_fields())
LISTED_FIELDS = (
    "pk",
    "channel_id",
    "public_id",
    "interval_seconds",
    "cron",
    "timezone",
    "enabled",
    "skip_while_pending",
    "next_run_at",
    "last_run_at",
    "skipped_ticks",
    "last_message__public_id",
)


def message_search_url(channel_id: str, message_id: str) -> str:
    """The message page's search for one message (broker/ui/message_pages.py)."""
    return f"{reverse('ui:messages')}?{urlencode({'q': message_id, 'channel': channel_id})}"


class PeriodicFilters(forms.Form):
    channel = inputs.IdField()
    cursor = paging.BY_CHANNEL_AND_ID.cursor_field()


def listed_schedules(channel_id: str, cursor: tuple[str, str] | None) -> QuerySet[PeriodicMessage]:
    schedules = PeriodicMessage.objects.select_related("last_message")
    if channel_id:
        schedules = schedules.filter(channel_id=channel_id)
    schedules = paging.BY_CHANNEL_AND_ID.after(schedules, cursor)
    return paging.BY_CHANNEL_AND_ID.ordered(schedules.only(*LISTED_FIELDS))


@operator_view(get=VIEW_PERIODIC)
def periodic_list(request: HttpRequest) -> HttpResponse:
    filters = inputs.valid(PeriodicFilters(request.GET))
    channel_id = filters["channel"]
    schedules = listed_schedules(channel_id, filters["cursor"])
    page = paging.page_of(request, schedules, paging.BY_CHANNEL_AND_ID.cursor_of)
    context = {
        "channel": channel_id,
        "rows": [(schedule, last_message_url(schedule)) for schedule in page.rows],
        **page.links(),
    }
    return render(request, "ui/periodic.html", context)


def last_message_url(schedule: PeriodicMessage) -> str | None:
    if schedule.last_message is None:
        return None
    return message_search_url(schedule.channel_id, schedule.last_message.public_id)


def api_form_data(post: QueryDict, *, creating: bool) -> dict[str, str]:
    """The posted HTML form as the API's form fields: empty optional fields left out, the
    checkboxes as true/false (an unticked checkbox is not posted at all), and the payload's
    line ends as typed (a textarea posts CRLF)."""
    data = {
        name: value
        for name in FORM_FIELDS
        if name not in CHECKBOXES
        and (value := post.get(name)) is not None
        and not (value == "" and name in OMITTED_WHEN_EMPTY)
    }
    if "payload" in data and data.get("payloadEncoding") != "base64":
        data["payload"] = data["payload"].replace("\r\n", "\n")
    data["skipWhilePending"] = "true" if post.get("skipWhilePending") else "false"
    if creating:
        data["enabled"] = "true" if post.get("enabled") else "false"
    return data


def validation_errors(form: PeriodicMessageForm) -> list[str]:
    """The serializer's errors as sentences, each naming its field as the API does."""
    return [
        str(error) if field == "non_field_errors" else f"{field}: {error}"
        for field, errors in form.errors.items()
        for error in errors
    ]


def form_values(schedule: PeriodicMessage) -> dict[str, Any]:
    """A saved schedule as the values of the edit form's fields."""
    payload, encoding = encode_payload(schedule.payload)
    return {
        "producer": schedule.producer_id,
        "payload": payload,
        "payloadEncoding": encoding,
        "contentType": schedule.content_type,
        "priority": schedule.priority,
        "headers": json.dumps(schedule.headers) if schedule.headers else "",
        "orderingKey": schedule.ordering_key,
        "eventType": schedule.event_type or "",
        "intervalSeconds": schedule.interval_seconds or "",
        "cron": schedule.cron,
        "timeZone": schedule.timezone,
        "enabled": schedule.enabled,
        "skipWhilePending": schedule.skip_while_pending,
    }


@operator_view(get=ADD_PERIODIC, post=ADD_PERIODIC)
def periodic_create(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        channel = inputs.valid(inputs.ChannelChoice(request.GET))["channel"]
        values = {"channel": channel, "timeZone": "UTC", "enabled": True}
        return render(request, "ui/periodic_new.html", {"values": values})
    form = PeriodicMessagePostForm(data=api_form_data(request.POST, creating=True))
    errors = [] if form.is_valid() else validation_errors(form)
    if not errors:
        try:
            schedule = create_in_channel(request.POST.get("channel", ""), dict(form.validated_data))
        except InvalidPeriodicMessage as error:
            errors = [str(error)]
        else:
            messages.success(request, f"Periodic message {schedule.public_id} was created.")
            return HttpResponseRedirect(detail_url(schedule))
    context = {"values": request.POST, "errors": errors}
    return render(request, "ui/periodic_new.html", context, status=400)


def create_in_channel(channel_id: str, form: dict[str, Any]) -> PeriodicMessage:
    channel_id = channel_id.strip()
    try:
        inputs.resource_id(channel_id)
    except ValueError as error:
        raise InvalidPeriodicMessage(f"channel: {error}") from None
    channel = Channel.objects.filter(pk=channel_id).first()
    if channel is None:
        raise InvalidPeriodicMessage(f"No channel {channel_id[:300]!r}.")
    # An ID generated as the API's POST does when none is given.
    public_id = form.pop("id", None) or new_periodic_id()
    return create_periodic(channel, public_id, form)


def detail_url(schedule: PeriodicMessage) -> str:
    return reverse("ui:periodic-message", args=[schedule.channel_id, schedule.public_id])


def get_schedule(channel_id: str, periodic_id: str) -> PeriodicMessage:
    return get_object_or_404(
        PeriodicMessage.objects.select_related("last_message", "channel").defer(
            "last_message__payload", "last_message__headers"
        ),
        channel_id=channel_id,
        public_id=periodic_id,
    )


@operator_view(get=VIEW_PERIODIC, post=CHANGE_PERIODIC)
def periodic_detail(request: HttpRequest, channel_id: str, periodic_id: str) -> HttpResponse:
    """The schedule's state and its edit form; POST saves the form."""
    schedule = get_schedule(channel_id, periodic_id)
    if request.method == "GET":
        return render_detail(request, schedule, form_values(schedule), [])
    form = PeriodicMessageForm(data=api_form_data(request.POST, creating=False))
    errors = [] if form.is_valid() else validation_errors(form)
    if not errors:
        try:
            saved = change_periodic(
                schedule.channel,
                periodic_id,
                dict(form.validated_data),
                precondition=unchanged_since(request.POST.get("changed_at", "")),
            )
        except PeriodicMessage.DoesNotExist:
            raise Http404 from None
        except InvalidPeriodicMessage as error:
            errors = [str(error)]
        else:
            messages.success(request, f"Periodic message {saved.public_id} was saved.")
            return HttpResponseRedirect(detail_url(saved))
    return render_detail(request, schedule, request.POST, errors, status=400)


def unchanged_since(seen: str) -> Precondition:
    """Refuse to save over a change made after the form was opened (what If-Unmodified-Since
    does for the API). Ticks do not count: they do not move changed_at."""

    def check(schedule: PeriodicMessage) -> None:
        if schedule.changed_at.isoformat() != seen:
            raise InvalidPeriodicMessage(
                "This periodic message was changed by someone else since you opened the page; "
                "reload it and make your change again."
            )

    return check


def render_detail(
    request: HttpRequest,
    schedule: PeriodicMessage,
    values: Any,
    errors: list[str],
    status: int = 200,
) -> HttpResponse:
    context = {
        "schedule": schedule,
        "values": values,
        "errors": errors,
        "last_message_url": last_message_url(schedule),
    }
    return render(request, "ui/periodic_message.html", context, status=status)


@operator_view(post=CHANGE_PERIODIC)
def periodic_enable(request: HttpRequest, channel_id: str, periodic_id: str) -> HttpResponse:
    return switch(request, channel_id, periodic_id, enabled=True)


@operator_view(post=CHANGE_PERIODIC)
def periodic_disable(request: HttpRequest, channel_id: str, periodic_id: str) -> HttpResponse:
    return switch(request, channel_id, periodic_id, enabled=False)


def switch(request: HttpRequest, channel_id: str, periodic_id: str, enabled: bool) -> HttpResponse:
    channel = get_object_or_404(Channel, pk=channel_id)
    try:
        schedule = set_enabled(channel, periodic_id, enabled)
    except PeriodicMessage.DoesNotExist:
        raise Http404 from None
    if enabled:
        next_run = f"{schedule.next_run_at:%Y-%m-%d %H:%M:%S} UTC"
        messages.success(
            request, f"Periodic message {periodic_id} is enabled; next run {next_run}."
        )
    else:
        messages.success(request, f"Periodic message {periodic_id} is disabled.")
    return redirect_back(request, detail_url(schedule))


@operator_view(post=DELETE_PERIODIC)
def periodic_delete(request: HttpRequest, channel_id: str, periodic_id: str) -> HttpResponse:
    try:
        delete_periodic(channel_id, periodic_id)
    except PeriodicMessage.DoesNotExist:
        messages.error(request, f"There is no periodic message {periodic_id} in {channel_id}.")
    else:
        messages.success(
            request,
            f"Periodic message {periodic_id} was deleted; the messages it published stay.",
        )
    return HttpResponseRedirect(f"{reverse('ui:periodic')}?{urlencode({'channel': channel_id})}")


urlpatterns: list[URLPattern] = [
    path("periodic", periodic_list, name="periodic"),
    path("periodic/new", periodic_create, name="periodic-new"),
    path("periodic/<str:channel_id>/<str:periodic_id>", periodic_detail, name="periodic-message"),
    path(
        "periodic/<str:channel_id>/<str:periodic_id>/enable",
        periodic_enable,
        name="periodic-enable",
    ),
    path(
        "periodic/<str:channel_id>/<str:periodic_id>/disable",
        periodic_disable,
        name="periodic-disable",
    ),
    path(
        "periodic/<str:channel_id>/<str:periodic_id>/delete",
        periodic_delete,
        name="periodic-delete",
    ),
]
