# The age limit of push jobs (jobs/expiry.py): when a job joined the queue, and the index the
# expiry reads, built concurrently so that a large jobs table keeps taking publishes and claims.

import django.db.models.functions.datetime
import django.utils.timezone
from django.db import migrations, models

from jobs.migrations._concurrent_index import AddIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ('broker', '0006_message_channel_pending_index'),
        ('consumers', '0004_max_job_age_and_callback_url_check'),
        ('jobs', '0007_delivery_report'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='enqueued_at',
            field=models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), default=django.utils.timezone.now),
        ),
        # Jobs waiting or in flight count their age from their creation, not from this upgrade.
        migrations.RunSQL(
            "UPDATE jobs_job SET enqueued_at = created_at WHERE status IN ('QUEUED', 'INFLIGHT')",
            reverse_sql=migrations.RunSQL.noop,
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name='job',
            index=models.Index(condition=models.Q(('status', 'QUEUED')), fields=['consumer', 'enqueued_at'], name='job_consumer_queued_age_idx'),
        ),
    ]
