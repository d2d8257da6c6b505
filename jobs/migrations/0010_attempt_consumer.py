"""Attempts carry their job's consumer (jobs.DeliveryAttempt.consumer_id), for a consumer's recent
attempts in the UI. Attempts already recorded get it from their jobs, before the index is built:
one pass over the table (minutes for tens of millions of rows; docs/ui-consumers.md)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0009_drop_job_due_idx'),
    ]

    operations = [
        migrations.AddField(
            model_name='deliveryattempt',
            name='consumer_id',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.RunSQL(
            """UPDATE jobs_deliveryattempt SET consumer_id = (
                SELECT consumer_id FROM jobs_job WHERE jobs_job.id = jobs_deliveryattempt.job_id
            ) WHERE consumer_id IS NULL""",
            migrations.RunSQL.noop,
        ),
        migrations.AddIndex(
            model_name='deliveryattempt',
            index=models.Index(
                fields=['consumer_id', '-started_at'],
                include=['id', 'status_code', 'error_class'],
                name='attempt_consumer_idx',
            ),
        ),
    ]
