"""Admin pages for producers, channels and messages."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from broker.models import Channel, Message, Producer, TokenProtected

PAYLOAD_PREVIEW_BYTES = 4096


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

    @admin.action(description="Rotate token (the new token is shown once)")
    def rotate_token(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for obj in queryset:
            token = obj.set_token()
            obj.save(update_fields=["token_hash", "changed_at"])
            self._announce_token(request, obj, token)

    def _announce_token(self, request: HttpRequest, obj: TokenProtected, token: str) -> None:
        messages.warning(request, f"Token of {obj.pk}: {token} (stored hashed; copy it now).")


admin.site.register(Producer, TokenProtectedAdmin)
admin.site.register(Channel, TokenProtectedAdmin)


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ["public_id", "channel", "producer", "status", "priority", "received_at"]
    list_filter = ["status", "channel"]
    search_fields = ["=public_id"]
    show_full_result_count = False  # no full-table COUNT on large tables
    exclude = ["payload"]
    readonly_fields = ["payload_preview"]

    @admin.display(description="payload")
    def payload_preview(self, obj: Message) -> str:
        if obj.payload_file:  # not read from storage just to show a page
            return f"{obj.payload_size} bytes, offloaded to payload storage as {obj.payload_file}"
        payload = bytes(obj.payload)
        preview = payload[:PAYLOAD_PREVIEW_BYTES].decode("utf-8", errors="replace")
        return preview + (" …" if len(payload) > PAYLOAD_PREVIEW_BYTES else "")
