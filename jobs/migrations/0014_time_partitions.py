"""Time partitions of jobs and attempts (jobs/partitions.py, docs/scaling.md).

A populated database is partitioned in place: its rows become each table's "initial" partition,
so the migration builds two unique indexes and scans each table once, without blocking writes,
then swaps the catalog in one short transaction; it copies nothing. Not atomic: CREATE INDEX
CONCURRENTLY runs outside a transaction.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models
from django.utils import timezone

from jobs import partitions
from jobs.migrations._partition_in_place import partition_in_place


def partition(apps, schema_editor):
    now = timezone.now()
    for table in partitions.TABLES:
        partition_in_place(table, now)
    partitions.ensure_partitions(now)


def refuse(apps, schema_editor):
    raise RuntimeError("jobs 0014 cannot be reversed: the jobs and attempts tables stay partitioned")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("jobs", "0013_dead_letter_actions"),
    ]

    operations = [
        # The attempts' key to their job cannot be a constraint once the job's key includes its
        # partition's time.
        migrations.AlterField(
            model_name="deliveryattempt",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="delivery_attempts",
                to="jobs.job",
            ),
        ),
        # statement_timestamp() is stable: PostgreSQL stores it once for the existing rows,
        # without rewriting the table.
        migrations.AddField(
            model_name="job",
            name="partition_at",
            field=models.DateTimeField(
                db_default=django.db.models.functions.datetime.Now(), editable=False
            ),
        ),
        migrations.RunPython(partition, refuse),
    ]
