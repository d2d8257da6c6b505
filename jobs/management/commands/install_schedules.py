from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django_q.models import Schedule  # type: ignore[import-untyped]

from jobs import partitions

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
    # PostgreSQL's time partitions of jobs and attempts: made ahead, dropped past retention
    # (jobs/partitions/, docs/scaling.md).
    "broker: maintain partitions": {
        "func": "jobs.partitions.maintain_partitions",
        "schedule_type": Schedule.CRON,
        "cron": "7 * * * *",  # hourly
    },
    # The dashboard's per-minute delivery statistics (jobs/stats.py, docs/ui-dashboard.md).
    "broker: refresh delivery stats": {
        "func": "jobs.stats.refresh_delivery_stats",
        "schedule_type": Schedule.MINUTES,
        "minutes": 1,
        "cron": None,
    },
    # The per-consumer job counts that /job-status, /dlq-status and /metrics read once the jobs
    # are too many to count at every request (jobs/status_summary.py, docs/api.md): a read of
    # the whole jobs table, about 3 s at 25,000,000 jobs, so not every minute.
    "broker: refresh job status summary": {
        "func": "jobs.status_summary.refresh_job_status_summary",
        "schedule_type": Schedule.MINUTES,
        "minutes": 5,
        "cron": None,
    },
    # Requeues and purges of big dead-letter queues whose runner is gone (a crash, a restart)
    # go on from their last batch (jobs/dlq_actions.py, docs/api.md "Dead-letter queue").
    "broker: resume dead-letter actions": {
        "func": "jobs.dlq_actions.resume_actions",
        "schedule_type": Schedule.MINUTES,
        "minutes": 1,
        "cron": None,
    },
}

# The spark_etl runs (docs/spark_etl.md): the report, then the archive, nightly. The
# archive runs an hour before the purge of delivered messages with the same retention, so the
# purge finds nothing it would delete unarchived; with the archive installed the purge is only
# the safety net for a night whose archive failed (docs/housekeeping.md).
SPARK_SCHEDULES: dict[str, dict[str, Any]] = {
    "broker: spark_etl report": {
        "func": "django.core.management.call_command",
        "args": "'spark_etl', 'report'",
        "schedule_type": Schedule.CRON,
        "cron": "7 1 * * *",
    },
    "broker: spark_etl archive": {
        "func": "django.core.management.call_command",
        "args": "'spark_etl', 'archive'",
        "schedule_type": Schedule.CRON,
        "cron": "17 2 * * *",
    },
}


class Command(BaseCommand):
    help = "Create or update the broker's housekeeping schedules (django-q2); safe to re-run."

    def add_arguments(self, parser: CommandParser) -> None:
        spark = parser.add_mutually_exclusive_group()
        spark.add_argument(
            "--spark",
            action="store_true",
            dest="spark",
            default=None,
            help="also install the nightly spark_etl report and archive (needs PostgreSQL, Java"
            " and the JDBC driver on the cluster's machine; docs/spark_etl.md)",
        )
        spark.add_argument(
            "--no-spark", action="store_false", dest="spark", help="remove the spark_etl runs"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        for name, fields in SCHEDULES.items():
            self.install(name, fields)
        # Neither flag: spark_etl runs installed earlier are brought up to date, none are added.
        spark = options["spark"]
        for name, fields in SPARK_SCHEDULES.items():
            if spark or (spark is None and Schedule.objects.filter(name=name).exists()):
                self.install(name, fields)
            elif spark is False and Schedule.objects.filter(name=name).delete()[0]:
                self.stdout.write(f"removed: {name}")
        # Without the archive, housekeeping drops old partitions again (docs/scaling.md).
        if spark is False and partitions.forget_archive():
            self.stdout.write("retention: back to housekeeping (the archive no longer runs)")

    def install(self, name: str, fields: dict[str, Any]) -> None:
        _, created = Schedule.objects.update_or_create(
            name=name, defaults={**fields, "repeats": -1}
        )
        self.stdout.write(f"{'created' if created else 'updated'}: {name}")
