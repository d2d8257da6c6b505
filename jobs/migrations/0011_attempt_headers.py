"""Attempts keep the headers their request was sent with and those of the answer
(jobs.DeliveryAttempt.request_headers, response_headers: secrets masked, bounded; docs/ui.md, the
job page). Attempts already recorded get none: the database default, a constant, so PostgreSQL
adds both columns without rewriting the table."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0010_attempt_consumer'),
    ]

    operations = [
        migrations.AddField(
            model_name='deliveryattempt',
            name='request_headers',
            field=models.JSONField(blank=True, db_default=[], default=list),
        ),
        migrations.AddField(
            model_name='deliveryattempt',
            name='response_headers',
            field=models.JSONField(blank=True, db_default=[], default=list),
        ),
    ]
