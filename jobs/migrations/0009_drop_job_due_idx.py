"""Drop job_due_idx (priority, due time of every consumer's queued jobs): no query needs it since
the push claim looks per consumer, and the planner chose it for that per-consumer scan, so the
queued jobs of a paused or capped consumer slowed every other consumer's claims (2.3-2.6 s per
claim behind 1,000,000 of them; docs/performance-history.md, "At 2,000 messages/s and behind
1,000,000 queued jobs (issue 18, 2026-11-24)"). One index fewer per new job, too."""

from django.db import migrations

from jobs.migrations._concurrent_index import RemoveIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    atomic = False  # DROP INDEX CONCURRENTLY runs outside a transaction

    dependencies = [("jobs", "0008_job_enqueued_at")]

    operations = [RemoveIndexConcurrentlyOnPostgres(model_name="job", name="job_due_idx")]
