from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from jobs.stats import refresh_delivery_stats


class Command(BaseCommand):
    help = (
        "Bring the dashboard's delivery statistics up to date (jobs/stats.py); safe to "
        "re-run and to run alongside the schedule."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--hours",
            type=float,
            help="recount the last HOURS hours from the attempts (at most the 2 days kept)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        hours = options["hours"]
        since = timezone.now() - timedelta(hours=hours) if hours else None
        counted = refresh_delivery_stats(since=since)
        self.stdout.write(f"counted {counted} delivery attempts")
