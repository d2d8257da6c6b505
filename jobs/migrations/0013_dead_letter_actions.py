"""Requeue and purge of big dead-letter queues in batches (issue 21): the record of an action
that outlasts its request, its progress, and the lease of whoever runs it
(jobs.DeadLetterAction; jobs/dlq_actions.py, docs/api.md "Dead-letter queue")."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('consumers', '0007_consumer_last_failure'),
        ('jobs', '0012_job_status_summary'),
    ]

    operations = [
        migrations.CreateModel(
            name='DeadLetterAction',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('requeue', 'Requeue'), ('purge', 'Purge')], max_length=7)),
                ('state', models.CharField(choices=[('running', 'Running'), ('done', 'Done'), ('failed', 'Failed')], default='running', max_length=7)),
                ('since', models.DateTimeField(blank=True, null=True)),
                ('died_before', models.DateTimeField()),
                ('resume_from', models.DateTimeField()),
                ('done', models.PositiveBigIntegerField(default=0)),
                ('estimated_total', models.PositiveBigIntegerField(blank=True, null=True)),
                ('batches', models.PositiveIntegerField(default=0)),
                ('failures', models.PositiveSmallIntegerField(default=0)),
                ('error', models.TextField(blank=True, default='')),
                ('runner', models.CharField(blank=True, default='', max_length=32)),
                ('lease_expires_at', models.DateTimeField()),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('consumer', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='consumers.consumer')),
            ],
            options={
                'indexes': [models.Index(condition=models.Q(('state', 'running')), fields=['lease_expires_at'], name='dead_letter_action_lease_idx')],
            },
        ),
    ]
