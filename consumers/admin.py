from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from consumers import services
from consumers.models import Consumer
from consumers.services import SettingFormField, set_paused
from jobs.queue import circuit


class ConsumerForm(forms.ModelForm):  # type: ignore[type-arg]
    """The model's fields, but the settings typed as text and checked by their declarations in
    consumers/services.py, as the API and the operator UI take them (comma-separated lists,
    blank for the default)."""

    # In place of the model's field, which would write the URL, credentials and query in clear,
    # into the page: the change form shows it masked (ConsumerAdmin.callback) and takes a new one.
    new_callback_url = forms.CharField(
        label="New callback URL",
        required=False,
        max_length=services.MAX_CALLBACK_URL_LENGTH,
        help_text="Blank: keep the current one. A new URL is typed whole: its credentials and "
        "query values are never shown again.",
    )
    retry_delays = SettingFormField(
        services.RETRY_DELAYS, required=False, help_text="Blank: BROKER_RETRY_DELAYS."
    )
    non_retryable_statuses = SettingFormField(services.NON_RETRYABLE_STATUSES, required=False)
    max_in_flight = SettingFormField(services.MAX_IN_FLIGHT, required=False)
    max_per_second = SettingFormField(
        services.MAX_PER_SECOND, required=False, help_text="Blank: no limit."
    )
    max_job_age = SettingFormField(
        services.MAX_JOB_AGE, required=False, help_text="Blank: BROKER_MAX_JOB_AGE_SECONDS."
    )
    event_types = SettingFormField(
        services.EVENT_TYPES, required=False, help_text="Blank: every message."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for setting in services.SETTINGS:  # the values as the fields take them
            if setting.attribute in self.fields:
                self.initial[setting.attribute] = setting.text_of(self.instance)

    def clean_new_callback_url(self) -> str:
        """The API's check, address guard included: a private address is refused on save."""
        url: str = self.cleaned_data["new_callback_url"]
        if not url and self.instance._state.adding:
            raise forms.ValidationError("A new consumer needs a callback URL.")
        url = services.validated(
            lambda value: services.checked_new_callback_url(value, self.instance.callback_url), url
        )
        if url:
            self.instance.callback_url = url  # the model field is not in the form
        return url


@admin.register(Consumer)
class ConsumerAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    form = ConsumerForm
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
            services.forget_booked_slots(obj)
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
