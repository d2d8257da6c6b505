"""Consumer pages: list, create/edit, pause/resume, close circuit, secret, test event.

Views stay thin: settings are validated and saved by consumers/services.py, the same
functions
the REST API's consumer PUT uses; pause, resume, close circuit and rotate are its services too;
the test event is jobs/test_event.py. Secrets and tokens appear only in the response to a
POST
that asked for them (never in a URL, a redirect, a message cookie or a log), marked no-store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from django import forms
from django.contrib import messages
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.utils import timezone

from broker import event_types
from broker.models import EventType
from broker.ui import inputs, paging
from broker.ui.access import (
    ADD_CONSUMERS,
    CHANGE_CONSUMERS,
    MANAGE_SIGNING_SECRETS,
    VIEW_CONSUMERS,
    operator_view,
    require,
)
from broker.ui.consumer_attempts import recent_attempts
from broker.ui.consumer_figures import consumer_figures
from broker.ui.consumer_forms import (
    ConsumerSettingsForm,
    EditConsumerForm,
    NewConsumerForm,
    defaults,
)
from broker.ui.delivery_state import delivery_states, state_badges, throttled
from consumers import services
from consumers.models import Consumer
from jobs.delivery import AttemptResult
from jobs.queue import circuit
from jobs.queue_depth import COUNT_LIMIT, BoundedCount, queue_depth_of
from jobs.test_event import send_test_event

logger = logging.getLogger(__name__)
P = ParamSpec("P")

EXCERPT_SHOWN = 2000  # characters of a test event's response kept for the page
LISTED_FIELDS = [
    "channel_id",
    "public_id",
    "name",
    "type",
    "callback_url",
    "paused",
    "ordering",
    "circuit_open_until",
    "circuit_failures",
    # What its state badges read (delivery_state.state_badges): why it is paused, its 429 hold.
    *("changed_at", "last_failure_at", "last_failure", "throttled_until"),
]


class ConsumerListFilters(forms.Form):
    channel = inputs.IdField()
    after = paging.BY_CHANNEL_AND_ID.cursor_field()


class ConsumerExists(Exception):
    pass


class ConsumerChanged(Exception):
    pass


# The list


@operator_view(get=VIEW_CONSUMERS)
def consumer_list(request: HttpRequest) -> HttpResponse:
    filters = inputs.valid(ConsumerListFilters(request.GET))
    channel_id = filters["channel"]
    consumers = listed_consumers(channel_id, filters["after"])
    page = paging.page_of(request, consumers, paging.BY_CHANNEL_AND_ID.cursor_of, parameter="after")
    now = timezone.now()
    for consumer in page.rows:
        consumer.circuit = circuit.state(consumer, now)  # type: ignore[attr-defined]
        consumer.badges = state_badges(consumer, now)  # type: ignore[attr-defined]
    context = {"consumers": page.rows, "channel": channel_id, **page.links()}
    return render(request, "ui/consumers.html", context)


def listed_consumers(channel_id: str, cursor: tuple[str, str] | None) -> QuerySet[Consumer]:
    consumers = Consumer.objects.only(*LISTED_FIELDS)
    if channel_id:
        consumers = consumers.filter(channel_id=channel_id)
    consumers = paging.BY_CHANNEL_AND_ID.after(consumers, cursor)
    return paging.BY_CHANNEL_AND_ID.ordered(consumers)


# One consumer


def consumer_or_404(channel_id: str, consumer_id: str) -> Consumer:
    return get_object_or_404(Consumer, channel_id=channel_id, public_id=consumer_id)


def found(control: Callable[P, Consumer], *args: P.args, **kwargs: P.kwargs) -> Consumer:
    """What a consumer service returns; the 404 page when there is no such consumer."""
    try:
        return control(*args, **kwargs)
    except services.ConsumerNotFound:
        raise Http404 from None


def back_to(consumer: Consumer) -> HttpResponse:
    return redirect("ui:consumer", channel_id=consumer.channel_id, consumer_id=consumer.public_id)


@operator_view(get=VIEW_CONSUMERS)
def consumer_detail(request: HttpRequest, channel_id: str, consumer_id: str) -> HttpResponse:
    consumer = consumer_or_404(channel_id, consumer_id)
    now = timezone.now()
    context = {
        "consumer": consumer,
        "circuit": circuit.state(consumer, now),
        "throttled": throttled(consumer, now),
        "previous_secret_signs": len(consumer.active_signing_secrets(now)) > 1,
        "job_counts": job_counts(consumer),
        "test_event": request.session.pop(_test_event_key(consumer), None),
        "received_types": received_types(consumer),
        "recent": recent_attempts(consumer, request.GET),
        "state": delivery_states([consumer], now)[consumer.pk],
        "figures": consumer_figures(consumer, now),
        "defaults": defaults(),
    }
    status = 400 if context["recent"].filters.errors else 200
    return render(request, "ui/consumer.html", context, status=status)


def received_types(consumer: Consumer) -> list[EventType]:
    """The entries of its channel's event type catalogue that its patterns receive."""
    catalogue = EventType.objects.filter(channel_id=consumer.channel_id).only("name", "description")
    return [entry for entry in catalogue if event_types.matches(consumer.event_types, entry.name)]


def job_counts(consumer: Consumer) -> dict[str, BoundedCount]:
    """Queued, in flight and dead jobs, each counted up to COUNT_LIMIT as the dashboard counts
    them (jobs/queue_depth.py)."""
    depth = queue_depth_of(consumer.pk, COUNT_LIMIT)
    return {"queued": depth.queued, "inflight": depth.in_flight, "dead": depth.dead}


@operator_view(get=ADD_CONSUMERS, post=ADD_CONSUMERS)
def consumer_create(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        form = NewConsumerForm(initial=inputs.valid(inputs.ChannelChoice(request.GET)))
        return render(request, "ui/consumer_form.html", {"form": _as_allowed(request, form)})
    form = _as_allowed(request, NewConsumerForm(request.POST))
    if not form.is_valid():
        return render(request, "ui/consumer_form.html", {"form": form}, status=400)
    data = form.cleaned_data
    try:
        consumer = services.save_consumer(
            data["channel"], data["consumer_id"], form.api_form(), _must_be_new
        )
    except ConsumerExists:
        form.add_error("consumer_id", "This channel already has a consumer with this ID.")
        return render(request, "ui/consumer_form.html", {"form": form}, status=409)
    logger.info("consumer %s created by %s", consumer, request.user)
    # The token is shown here, once: not after a redirect, where it would sit in the message
    # store (a cookie) on its way.
    return no_store(render(request, "ui/consumer_created.html", {"consumer": consumer}))


SettingsForm = TypeVar("SettingsForm", bound=ConsumerSettingsForm)


def _as_allowed(request: HttpRequest, form: SettingsForm) -> SettingsForm:
    """The form for this user: importing a signing secret is setting one, which needs the
    secrets' permission (with a secret of their choosing, a user could sign webhooks). A secret
    posted by a user without it is refused (a 403 page), never silently dropped."""
    if not request.user.has_perm(MANAGE_SIGNING_SECRETS):
        if request.method == "POST" and request.POST.get("signing_secret"):
            require(request, MANAGE_SIGNING_SECRETS)
        del form.fields["signing_secret"]
    return form


def _must_be_new(existing: Consumer | None) -> None:
    if existing is not None:
        raise ConsumerExists


@operator_view(get=CHANGE_CONSUMERS, post=CHANGE_CONSUMERS)
def consumer_edit(request: HttpRequest, channel_id: str, consumer_id: str) -> HttpResponse:
    consumer = consumer_or_404(channel_id, consumer_id)
    if request.method == "GET":
        context = {
            "form": _as_allowed(request, EditConsumerForm.of(consumer)),
            "consumer": consumer,
        }
        return render(request, "ui/consumer_form.html", context)
    form = _as_allowed(request, EditConsumerForm(request.POST, consumer=consumer))
    context = {"form": form, "consumer": consumer}
    if not form.is_valid():
        return render(request, "ui/consumer_form.html", context, status=400)
    try:
        services.save_consumer(
            consumer.channel,
            consumer.public_id,
            form.api_form(),
            _unchanged_since(form.cleaned_data["changed_at"]),
        )
    except ConsumerChanged:
        form.add_error(
            None,
            "Someone else changed this consumer after you opened this form, so nothing was "
            "saved. Open the form again to see their change, then make yours.",
        )
        context["stale"] = True
        return render(request, "ui/consumer_form.html", context, status=409)
    messages.success(request, f"Saved the settings of {consumer.public_id}.")
    return back_to(consumer)


def _unchanged_since(changed_at: datetime) -> Callable[[Consumer | None], None]:
    def check(existing: Consumer | None) -> None:
        # Deleted meanwhile counts as changed: saving would create it again.
        if existing is None or existing.changed_at != changed_at:
            raise ConsumerChanged

    return check


# Actions (POST, then back to the consumer's page)


@operator_view(post=CHANGE_CONSUMERS)
def pause(request: HttpRequest, channel_id: str, consumer_id: str) -> HttpResponse:
    consumer = found(services.pause_consumer, channel_id, consumer_id, True)
    messages.success(request, f"Paused {consumer.public_id}: its jobs wait until it is resumed.")
    return back_to(consumer)


@operator_view(post=CHANGE_CONSUMERS)
def resume(request: HttpRequest, channel_id: str, consumer_id: str) -> HttpResponse:
    consumer = found(services.pause_consumer, channel_id, consumer_id, False)
    messages.success(request, f"Resumed {consumer.public_id}: delivery goes on.")
    return back_to(consumer)


@operator_view(post=CHANGE_CONSUMERS)
def close_circuit(request: HttpRequest, channel_id: str, consumer_id: str) -> HttpResponse:
    consumer = found(services.close_circuit, channel_id, consumer_id)
    messages.success(request, f"Closed the circuit of {consumer.public_id}.")
    return back_to(consumer)


@operator_view(post=CHANGE_CONSUMERS)
def send_test(request: HttpRequest, channel_id: str, consumer_id: str) -> HttpResponse:
    consumer = consumer_or_404(channel_id, consumer_id)
    if consumer.is_pull:
        messages.error(request, "Test events are pushed; a pull consumer fetches its jobs.")
        return back_to(consumer)
    result = send_test_event(consumer, sent_by=request.user.get_username())
    # Shown once by the consumer page after the redirect (a reload must not send another).
    request.session[_test_event_key(consumer)] = _shown(result)
    if result.succeeded:
        messages.success(request, f"Test event delivered: HTTP {result.status_code}.")
    else:
        messages.error(request, f"Test event failed: {result.error or result.error_class}.")
    return back_to(consumer)


def _test_event_key(consumer: Consumer) -> str:
    return f"ui-test-event-{consumer.pk}"


def _shown(result: AttemptResult) -> dict[str, Any]:
    return {
        "sent_at": f"{timezone.localtime(result.started_at):%Y-%m-%d %H:%M:%S %Z}",
        "status_code": result.status_code,
        "duration_ms": round(result.duration_ms, 1),
        "error_class": result.error_class,
        "error": result.error,
        "excerpt": result.response_excerpt[:EXCERPT_SHOWN],
        "succeeded": result.succeeded,
    }


# The signing secret: a confirmation page (GET), then the action (POST with confirm=yes)


@operator_view(get=MANAGE_SIGNING_SECRETS, post=MANAGE_SIGNING_SECRETS)
def rotate_secret(request: HttpRequest, channel_id: str, consumer_id: str) -> HttpResponse:
    consumer = consumer_or_404(channel_id, consumer_id)
    if not _confirmed(request):
        return _confirmation(request, consumer, "rotate")
    consumer = found(services.rotate_signing_secret, channel_id, consumer_id)
    logger.info("signing secret of %s rotated by %s", consumer, request.user)
    until = timezone.localtime(consumer.previous_secret_expires_at)
    messages.success(
        request,
        f"Rotated the signing secret of {consumer.public_id}. Deliveries are signed with the new "
        f"and the previous secret until {until:%Y-%m-%d %H:%M %Z}; reveal the new one to give "
        "it to the receiver.",
    )
    # A redirect, not the secret: reloading this response must not rotate a second time (and
    # drop the secret the receiver still uses).
    return back_to(consumer)


@operator_view(get=MANAGE_SIGNING_SECRETS, post=MANAGE_SIGNING_SECRETS)
def reveal_secret(request: HttpRequest, channel_id: str, consumer_id: str) -> HttpResponse:
    consumer = consumer_or_404(channel_id, consumer_id)
    if not _confirmed(request):
        return _confirmation(request, consumer, "reveal")
    logger.info("signing secret of %s revealed to %s", consumer, request.user)
    context = {
        "consumer": consumer,
        "secret": consumer.signing_secret,
        "previous_until": consumer.previous_secret_expires_at
        if len(consumer.active_signing_secrets(timezone.now())) > 1
        else None,
    }
    return no_store(render(request, "ui/consumer_secret.html", context))


def _confirmed(request: HttpRequest) -> bool:
    return request.method == "POST" and request.POST.get("confirm") == "yes"


def _confirmation(request: HttpRequest, consumer: Consumer, action: str) -> HttpResponse:
    status = 200 if request.method == "GET" else 400  # a POST without the confirmation
    context = {"consumer": consumer, "action": action}
    return render(request, "ui/consumer_confirm.html", context, status=status)


def no_store(response: HttpResponse) -> HttpResponse:
    """A page with a secret on it must not stay in a browser's or a proxy's cache."""
    response["Cache-Control"] = "no-store"
    return response


urlpatterns = [
    path("consumers", consumer_list, name="consumers"),
    path("consumers/new", consumer_create, name="consumer-create"),
    path("consumers/<str:channel_id>/<str:consumer_id>", consumer_detail, name="consumer"),
    path("consumers/<str:channel_id>/<str:consumer_id>/edit", consumer_edit, name="consumer-edit"),
    path("consumers/<str:channel_id>/<str:consumer_id>/pause", pause, name="consumer-pause"),
    path("consumers/<str:channel_id>/<str:consumer_id>/resume", resume, name="consumer-resume"),
    path(
        "consumers/<str:channel_id>/<str:consumer_id>/close-circuit",
        close_circuit,
        name="consumer-close-circuit",
    ),
    path(
        "consumers/<str:channel_id>/<str:consumer_id>/test-event",
        send_test,
        name="consumer-test-event",
    ),
    path(
        "consumers/<str:channel_id>/<str:consumer_id>/secret/rotate",
        rotate_secret,
        name="consumer-rotate-secret",
    ),
    path(
        "consumers/<str:channel_id>/<str:consumer_id>/secret/reveal",
        reveal_secret,
        name="consumer-reveal-secret",
    ),
]
