from __future__ import annotations

from django.contrib import admin

from consumers.models import Consumer


@admin.register(Consumer)
class ConsumerAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["public_id", "channel", "type", "callback_url", "paused", "changed_at"]
    list_filter = ["type", "paused", "channel"]
    search_fields = ["public_id", "name", "callback_url"]
    # The token is encrypted at rest and never shown in list or form views.
    exclude = ["token"]
    readonly_fields = ["created_at", "changed_at"]
