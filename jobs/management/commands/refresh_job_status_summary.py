from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from jobs.status_summary import refresh_job_status_summary


class Command(BaseCommand):
    help = (
        "Recount the job status summary that /job-status, /dlq-status and /metrics read for "
        "large tables (jobs/status_summary.py); safe to run alongside the schedule."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        written = refresh_job_status_summary()
        if written is None:
            self.stdout.write("another refresh is running; its figures will be as new")
        else:
            self.stdout.write(f"counted {written} consumer and status pairs")
