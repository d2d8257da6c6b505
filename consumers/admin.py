from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from broker import event_types
from broker.admin import STORABLE_JSON
from consumers.models import Consumer
from consumers.services import (
    InvalidSetting,
    checked_new_callback_url,
    parse_max_per_second,
    set_paused,
)
from jobs.queue import circuit


class ConsumerForm(forms.ModelForm):  # type: ignore[type-arg]
    # In place of the model's field, which would write the URL, credentials and query in clear,
    # into the page: the change form shows it masked (ConsumerAdmin.callback) and takes a new one.
    new_callback_url = forms.CharField(
        label="New callback URL",
        required=False,
        max_length=2048,
        help_text="Blank: keep the current one. A new URL is typed whole: its credentials and "
        "query values are never shown again.",
    )

    def clean_new_callback_url(self) -> str:
        """The API's check, address guard included: a private address is refused on save."""
        url: str = self.cleaned_data["new_callback_url"]
        if not url and self.instance._state.adding:
            raise forms.ValidationError("A new consumer needs a callback URL.")
        try:
            url = checked_new_callback_url(url, self.instance.callback_url)
        except InvalidSetting as exc:
            raise forms.ValidationError(str(exc)) from None
        if url:
            self.instance.callback_url = url  # the model field is not in the form
        return url

    def clean_max_per_second(self) -> float | None:
        """The API's bounds for the rate limit."""
        rate = self.cleaned_data["max_per_second"]
        if rate is None:
            return None
        try:
            return parse_max_per_second(str(rate))
        except InvalidSetting as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_event_types(self) -> list[str]:
        """The API's rule for the patterns (a JSON list of them here)."""
        value = self.cleaned_data["event_types"] or []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise forms.ValidationError('A JSON list of patterns: ["order.*", "invoice.paid"].')
        try:
            return event_types.checked_patterns(value)
        except event_types.InvalidEventType as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(Consumer)
class ConsumerAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = ConsumerForm
    formfield_overrides = STORABLE_JSON
    list_display = [
        "public_id",
        "channel",
        "type",
        "callback",
        "paused",
        "circuit",
        "circuit_failures",
        "changed_at",
    ]
    list_filter = ["type", "paused", "channel"]
    # Not the callback URL: a search by it would tell its secrets a character at a time.
    search_fields = ["public_id", "name"]
    # Encrypted at rest and never shown in list or form views: the operator UI reveals a signing
    # secret only on purpose, after a confirmation (docs/ui-consumers.md). The callback URL is
    # shown masked (`callback`) and replaced through the form's `new_callback_url`.
    exclude = ["token", "signing_secret", "previous_signing_secret", "callback_url"]
    # The circuit is the dispatcher's to change (and the "close circuit" action's), not the form's.
    readonly_fields = [
        "callback",
        "created_at",
        "changed_at",
        "circuit_failures",
        "circuit_open_until",
        "circuit_cooldown_seconds",
        "next_slot_at",
        "throttled_until",
    ]
    actions = ["pause", "resume", "close_circuit"]

    def save_model(
        self,
        request: HttpRequest,
        obj: Consumer,
        form: forms.ModelForm[Consumer],
        change: bool,
    ) -> None:
        if "max_per_second" in form.changed_data:
            obj.next_slot_at = None  # slots booked at the old rate do not hold the new one back
        super().save_model(request, obj, form, change)

    @admin.display(description="callback URL")
    def callback(self, consumer: Consumer) -> str:
        return consumer.masked_callback_url

    @admin.display(description="circuit")
    def circuit(self, consumer: Consumer) -> str:
        return circuit.state(consumer, timezone.now())

    @admin.action(description="Pause delivery to the selected consumers", permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet[Consumer]) -> None:
        self._set_paused(request, queryset, paused=True)

    @admin.action(description="Resume delivery to the selected consumers", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Consumer]) -> None:
        self._set_paused(request, queryset, paused=False)

    @admin.action(description="Close the circuit of the selected consumers", permissions=["change"])
    def close_circuit(self, request: HttpRequest, queryset: QuerySet[Consumer]) -> None:
        for consumer in queryset:
            circuit.close(consumer)
        messages.success(request, f"Closed the circuit of {len(queryset)} consumer(s).")

    @staticmethod
    def _set_paused(request: HttpRequest, queryset: QuerySet[Consumer], *, paused: bool) -> None:
        # Locked as in the API, so a concurrent consumer PUT cannot write back the old value.
        with transaction.atomic():
            # of=self: the changelist's queryset joins the channel, whose row needs no lock.
            consumers = list(queryset.select_for_update(of=("self",)))
            for consumer in consumers:
                set_paused(consumer, paused)
        verb = "Paused" if paused else "Resumed"
        messages.success(request, f"{verb} {len(consumers)} consumer(s).")
