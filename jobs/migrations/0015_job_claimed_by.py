"""Which dispatcher holds an INFLIGHT job (issue 36): its jobs go back to the queue as soon as it
is known dead. Nullable, without a default: PostgreSQL adds the column to every partition of the
jobs table without rewriting a row."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0014_time_partitions"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="claimed_by",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
    ]
