from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django_q.models import Schedule  # type: ignore[import-untyped]

# name -> how it runs. Names are the identity: re-running updates these schedules in place and
# leaves schedules an operator added alone. A schedule an operator changed in the admin is reset
# to these values on the next run; disable one by deleting it and not running the command.
SCHEDULES: dict[str, dict[str, Any]] = {
    "broker: purge delivered messages": {
        "func": "jobs.housekeeping.purge_delivered",
        "schedule_type": Schedule.CRON,
        "cron": "17 3 * * *",  # daily, at a quiet minute
    },
    "broker: purge orphan payload files": {
        "func": "jobs.housekeeping.purge_orphan_payloads",
        "schedule_type": Schedule.CRON,
        "cron": "47 3 * * *",
    },
}


class Command(BaseCommand):
    help = "Create or update the broker's housekeeping schedules (django-q2); safe to re-run."

    def handle(self, *args: Any, **options: Any) -> None:
        for name, fields in SCHEDULES.items():
            _, created = Schedule.objects.update_or_create(
                name=name, defaults={**fields, "repeats": -1}
            )
            self.stdout.write(f"{'created' if created else 'updated'}: {name}")
