"""Admin pages for producers, channels, messages and periodic messages."""

from __future__ import annotations

import copy
import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import models, transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse_lazy

from broker import event_catalogue
from broker.models import (
    Channel,
    EventType,
    Message,
    PeriodicMessage,
    Producer,
    TokenProtected,
)
from broker.periodic import (
    InvalidSchedule,
    reschedule,
    validate_cron,
    validate_publishable,
    validate_time_zone,
)
from broker.publishing import PublishError
from broker.scheduling import AlreadyReleased, NotScheduled, cancel_scheduled
from broker.storable_text import StorableJSONField

PAYLOAD_PREVIEW_BYTES = 4096
# The formfield_overrides of every admin that edits a JSON field: text the database cannot store
# (a lone surrogate, NUL) is refused on the field, naming its place, never a 500 on save
# (tests/reliability/test_hostile_text.py checks that no admin is without it).
STORABLE_JSON: dict[type[models.Field[Any, Any]], dict[str, Any]] = {
    models.JSONField: {"form_class": StorableJSONField}
}


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """For rows whose changes must go through the domain services (state machine, publish)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class TokenProtectedAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["id", "name", "changed_at"]
    search_fields = ["id", "name"]
    readonly_fields = ["created_at", "changed_at"]
    actions = ["rotate_token"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # The ID is the resource's identity (and its URL): fixed once created.
        return self.readonly_fields + (["id"] if obj else [])

    def save_model(
        self, request: HttpRequest, obj: TokenProtected, form: Any, change: bool
    ) -> None:
        if not change:
            self._announce_token(request, obj, obj.set_token())
        super().save_model(request, obj, form, change)

    @admin.action(description="Rotate token (the new token is shown once)", permissions=["change"])
    def rotate_token(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for obj in queryset:
            token = obj.set_token()
            obj.save(update_fields=["token_hash", "changed_at"])
            self._announce_token(request, obj, token)

    def _announce_token(self, request: HttpRequest, obj: TokenProtected, token: str) -> None:
        messages.warning(request, f"Token of {obj.pk}: {token} (stored hashed; copy it now).")


@admin.register(Producer)
class ProducerAdmin(TokenProtectedAdmin):
    # The channels it may publish to with BROKER_PRODUCER_CHANNELS=bound. The widget offers only
    # channels that exist, the one rule set_allowed_channels (broker/stakeholders.py) applies to
    # the API and seed files.
    filter_horizontal = ["allowed_channels"]


admin.site.register(Channel, TokenProtectedAdmin)
# The admin's "View site" link: the operator UI, the site's pages for people.
admin.site.site_url = reverse_lazy("ui:dashboard")  # type: ignore[assignment]


class EventTypeForm(forms.ModelForm):  # type: ignore[type-arg]
    def clean_name(self) -> str:
        try:
            return event_catalogue.checked_name(self.cleaned_data["name"])
        except event_catalogue.InvalidCatalogueEntry as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_schema(self) -> dict[str, Any] | None:
        """The API's check of a schema: valid for its draft."""
        schema = self.cleaned_data["schema"]
        try:
            return event_catalogue.checked_schema("" if schema is None else json.dumps(schema))
        except event_catalogue.InvalidCatalogueEntry as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(EventType)
class EventTypeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The event type catalogue (docs/api.md, "Event type catalogue")."""

    form = EventTypeForm
    formfield_overrides = STORABLE_JSON
    list_display = ["name", "channel", "changed_at"]
    list_filter = ["channel"]
    search_fields = ["name", "description"]
    readonly_fields = ["created_at", "changed_at"]


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = [
        "public_id",
        "channel",
        "producer",
        "status",
        "event_type",
        "scheduled_for",
        "priority",
        "received_at",
    ]
    list_filter = ["status", "channel"]
    search_fields = ["=public_id"]
    show_full_result_count = False  # no full-table COUNT on large tables
    exclude = ["payload"]
    readonly_fields = ["payload_preview"]
    actions = ["cancel_scheduled"]

    @admin.action(
        description="Cancel the selected scheduled messages (not yet released)",
        permissions=["delete"],
    )
    def cancel_scheduled(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        cancelled, refused = 0, []
        for message in queryset.only("channel_id", "public_id"):
            try:
                cancel_scheduled(message.channel_id, message.public_id)
                cancelled += 1
            except (NotScheduled, AlreadyReleased) as exc:
                refused.append(str(exc))
        if cancelled:
            messages.success(request, f"Cancelled {cancelled} scheduled message(s).")
        for reason in refused:
            messages.warning(request, reason)

    @admin.display(description="payload")
    def payload_preview(self, obj: Message) -> str:
        if obj.payload_file:  # not read from storage just to show a page
            return f"{obj.payload_size} bytes, offloaded to payload storage as {obj.payload_file}"
        payload = bytes(obj.payload)
        preview = payload[:PAYLOAD_PREVIEW_BYTES].decode("utf-8", errors="replace")
        return preview + (" …" if len(payload) > PAYLOAD_PREVIEW_BYTES else "")


class PeriodicMessageForm(forms.ModelForm):  # type: ignore[type-arg]
    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        interval, cron = data.get("interval_seconds"), (data.get("cron") or "").strip()
        if bool(interval) == bool(cron):
            raise forms.ValidationError("Give either an interval or a cron expression.")
        data["cron"] = cron
        # What publish() checks at each tick, checked now (as the API does).
        candidate = copy.copy(self.instance)
        for field in ("content_type", "priority", "headers", "ordering_key", "enabled"):
            if field in data:
                setattr(candidate, field, data[field])
        try:
            validate_time_zone(data.get("timezone") or "")
            if cron:
                validate_cron(cron, data["timezone"])
            validate_publishable(candidate)
        except (InvalidSchedule, PublishError) as error:
            raise forms.ValidationError(str(error)) from None
        return data


@admin.register(PeriodicMessage)
class PeriodicMessageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Created through the API (the payload is bytes); here: view, change the schedule, enable
    and disable. A change of the schedule or of `enabled` moves the next run (docs/periodic.md)."""

    form = PeriodicMessageForm
    formfield_overrides = STORABLE_JSON
    list_display = [
        "channel",
        "public_id",
        "schedule",
        "enabled",
        "next_run_at",
        "last_run_at",
        "skipped_ticks",
    ]
    list_filter = ["enabled", "channel"]
    search_fields = ["=public_id"]
    exclude = ["payload"]
    readonly_fields = [
        "channel",
        "public_id",
        "producer",
        "payload_preview",
        "next_run_at",
        "last_run_at",
        "last_message",
        "skipped_ticks",
        "created_at",
        "changed_at",
    ]
    actions = ["enable", "disable"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="schedule")
    def schedule(self, obj: PeriodicMessage) -> str:
        if obj.interval_seconds:
            return f"every {obj.interval_seconds} s"
        return f"{obj.cron} ({obj.timezone})"

    @admin.display(description="payload")
    def payload_preview(self, obj: PeriodicMessage) -> str:
        payload = bytes(obj.payload)
        preview = payload[:PAYLOAD_PREVIEW_BYTES].decode("utf-8", errors="replace")
        return preview + (" …" if len(payload) > PAYLOAD_PREVIEW_BYTES else "")

    def save_model(
        self, request: HttpRequest, obj: PeriodicMessage, form: Any, change: bool
    ) -> None:
        if {"interval_seconds", "cron", "timezone", "enabled"} & set(form.changed_data):
            reschedule(obj)
        super().save_model(request, obj, form, change)

    @admin.action(description="Enable (next run: the first tick from now)", permissions=["change"])
    def enable(self, request: HttpRequest, queryset: QuerySet[PeriodicMessage]) -> None:
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable", permissions=["change"])
    def disable(self, request: HttpRequest, queryset: QuerySet[PeriodicMessage]) -> None:
        self._set_enabled(request, queryset, False)

    def _set_enabled(
        self, request: HttpRequest, queryset: QuerySet[PeriodicMessage], enabled: bool
    ) -> None:
        changed = 0
        for obj in queryset.filter(enabled=not enabled):
            with transaction.atomic():
                # Locked, as a dispatcher may be publishing one of its ticks right now.
                obj = PeriodicMessage.objects.select_for_update().get(pk=obj.pk)
                obj.enabled = enabled
                reschedule(obj)
                obj.save()
                changed += 1
        self.message_user(request, f"{'Enabled' if enabled else 'Disabled'} {changed}.")
