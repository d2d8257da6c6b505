from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest

from broker.admin import ReadOnlyAdmin
from jobs.models import DeliveryAttempt, Job, JobQuerySet


class DeliveryAttemptInline(admin.TabularInline):  # type: ignore[type-arg]
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    fields = ("attempt_number", "started_at", "duration_ms", "status_code", "error_class")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = [
        "public_id",
        "message",
        "consumer",
        "status",
        "priority",
        "attempts",
        "next_attempt_at",
    ]
    list_filter = ["status"]
    list_select_related = ["message", "consumer"]
    raw_id_fields = ["message", "consumer"]
    show_full_result_count = False
    inlines = [DeliveryAttemptInline]
    actions = ["requeue_dead"]

    # Jobs are read-only in the admin (no change permission there), so the action checks the
    # permission that the UI's requeue needs itself.
    @admin.action(description="Requeue selected dead jobs", permissions=["requeue"])
    def requeue_dead(self, request: HttpRequest, queryset: JobQuerySet) -> None:
        # Through the state machine: only jobs still DEAD move, whatever else is selected.
        moved = queryset.requeue_dead()
        messages.success(request, f"Requeued {moved} dead job(s).")

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("jobs.change_job")


@admin.register(DeliveryAttempt)
class DeliveryAttemptAdmin(ReadOnlyAdmin):
    list_display = ["job", "attempt_number", "started_at", "status_code", "error_class"]
    list_filter = ["error_class"]
    raw_id_fields = ["job"]
    show_full_result_count = False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
