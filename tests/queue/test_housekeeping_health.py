"""The housekeeping container's health check: no schedule long overdue (jobs/health.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import Schedule  # type: ignore[import-untyped]

from jobs.health import SCHEDULE_SLACK, overdue_schedules

pytestmark = pytest.mark.django_db


def schedule(name: str, due_in: timedelta, repeats: int = -1) -> None:
    Schedule.objects.create(
        name=name,
        func="jobs.stats.refresh_delivery_stats",
        schedule_type=Schedule.MINUTES,
        minutes=1,
        next_run=timezone.now() + due_in,
        repeats=repeats,
    )


def test_a_schedule_due_long_ago_means_no_cluster_runs_them():
    schedule("soon", timedelta(seconds=30))
    schedule("just due", -SCHEDULE_SLACK + timedelta(minutes=1))  # the scheduler gets to it
    schedule("finished", -timedelta(days=1), repeats=0)  # runs no more: never due
    assert overdue_schedules() == []

    schedule("forgotten", -SCHEDULE_SLACK - timedelta(minutes=1))
    assert overdue_schedules() == ["forgotten"]
