"""A consumer's recent delivery attempts on its page (issue 20): why it fails, before anything
dies. Read from attempt_consumer_idx, newest first, and filtered within the consumer's newest
SCANNED attempts, so that a filter that matches nothing still reads a bounded number of rows
however many attempts the consumer has (docs/ui-consumers.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import forms
from django.db.models import F, Q, Subquery

from broker.ui import inputs
from broker.ui.message_pages import with_job_public_ids
from consumers.models import Consumer
from jobs.models import DeliveryAttempt

SCANNED = 10_000  # the newest attempts of a consumer that its filters look through
SHOWN = 25
# The status classes an operator filters by: what each matches.
OUTCOMES = {
    "2xx": Q(status_code__gte=200, status_code__lt=300),
    "3xx": Q(status_code__gte=300, status_code__lt=400),
    "4xx": Q(status_code__gte=400, status_code__lt=500),
    "5xx": Q(status_code__gte=500, status_code__lt=600),
    "timeout": Q(status_code__isnull=True, error_class="timeout"),
    "connection": Q(status_code__isnull=True, error_class="connection"),
}


class AttemptFilters(forms.Form):
    status_code = forms.IntegerField(required=False, min_value=100, max_value=599)
    outcome = forms.ChoiceField(
        choices=[("", "any"), *((name, name) for name in OUTCOMES)], required=False
    )
    since = inputs.MomentField()
    until = inputs.MomentField()


@dataclass(frozen=True)
class RecentAttempts:
    filters: AttemptFilters
    shown: list[DeliveryAttempt]  # each with .job_public_id
    scanned: int = SCANNED


def recent_attempts(consumer: Consumer, query: Any) -> RecentAttempts:
    """The consumer's newest attempts that match the filters given in `query` (a QueryDict)."""
    filters = AttemptFilters(query)
    if not filters.is_valid():  # the page names the problems above the form as typed
        return RecentAttempts(filters, [])
    data = filters.cleaned_data
    window = DeliveryAttempt.objects.filter(consumer_id=consumer.pk)
    if data["since"]:
        window = window.filter(started_at__gte=data["since"])
    if data["until"]:
        window = window.filter(started_at__lt=data["until"])
    newest = window.order_by("-started_at").values("pk")[:SCANNED]
    scanned = DeliveryAttempt.objects.filter(pk__in=Subquery(newest))
    matching = scanned
    if data["status_code"] is not None:
        matching = matching.filter(status_code=data["status_code"])
    if data["outcome"]:
        matching = matching.filter(OUTCOMES[data["outcome"]])
    # The ids first, from attempt_consumer_idx alone; then only those rows, with their jobs.
    shown = list(matching.order_by("-started_at").values_list("pk", flat=True)[:SHOWN])
    rows = DeliveryAttempt.objects.filter(pk__in=shown).annotate(
        job_created_at=F("job__created_at")
    )
    return RecentAttempts(filters, with_job_public_ids(rows.order_by("-started_at")))
