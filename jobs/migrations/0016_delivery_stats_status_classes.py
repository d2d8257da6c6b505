"""The delivery statistics count failed attempts by status-code class too (issue 38: a
consumer's page shows 2xx, 3xx, 4xx, 5xx and no answer). Defaults of 0: PostgreSQL adds the
columns without rewriting a row; rows counted before this migration show their failures as not
classified until they expire (two days for minutes, eight for hours)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0015_job_claimed_by"),
    ]

    operations = [
        migrations.AddField(
            model_name="deliverystats",
            name="status_3xx",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="deliverystats",
            name="status_4xx",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="deliverystats",
            name="status_5xx",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="deliverystats",
            name="no_answer",
            field=models.PositiveIntegerField(default=0),
        ),
    ]
