"""What the dashboard, /_status, the metrics and the reports read: dispatcher heartbeats, delivery
statistics, the Spark report's rows and the job status summaries."""

from __future__ import annotations

from django.db import models

from consumers.models import Consumer
from jobs.states import JobStatus


class DispatcherHeartbeat(models.Model):
    """One row per running dispatcher, refreshed every few seconds (UI and /_status)."""

    dispatcher_id = models.CharField(max_length=255, unique=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    last_beat_at = models.DateTimeField()
    in_flight = models.PositiveIntegerField(default=0)
    delivered = models.PositiveBigIntegerField(default=0)  # attempts answered 2xx since start
    failed = models.PositiveBigIntegerField(default=0)  # attempts that failed since start

    def __str__(self) -> str:
        return self.dispatcher_id


class DeliveryStats(models.Model):
    """Push attempts of one consumer in one minute or one hour: the rollup behind the dashboard's
    rates, success rates, latencies and charts (jobs/stats.py recounts it from
    DeliveryAttempt)."""

    class Span(models.IntegerChoices):
        MINUTE = 60
        HOUR = 3600

    # No FK index: the unique (consumer, span, period_start) constraint leads with it.
    consumer = models.ForeignKey(
        Consumer, on_delete=models.CASCADE, related_name="delivery_stats", db_index=False
    )
    span = models.PositiveIntegerField(choices=Span.choices)  # seconds
    period_start = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    delivered = models.PositiveIntegerField(default=0)  # answered 2xx
    failed = models.PositiveIntegerField(default=0)  # anything else
    # The failed attempts by status-code class (a consumer's page shows them beside the 2xx of
    # `delivered`); a status outside 300..599 counts in `failed` only.
    status_3xx = models.PositiveIntegerField(default=0)
    status_4xx = models.PositiveIntegerField(default=0)
    status_5xx = models.PositiveIntegerField(default=0)
    no_answer = models.PositiveIntegerField(default=0)  # timeout, refused connection, ...
    # Publish-to-delivery latency of the delivered attempts: {bucket number: count}, buckets as
    # jobs.stats.latency_bucket defines them; histograms add up, so any period's percentiles can
    # be estimated from its rows.
    latency_histogram = models.JSONField(default=dict)

    class Meta:
        verbose_name_plural = "delivery stats"
        constraints = [
            models.UniqueConstraint(
                fields=["consumer", "span", "period_start"], name="delivery_stats_unique"
            ),
        ]
        indexes = [
            # Every read and delete: one span's rows from (or before) a time, all consumers.
            models.Index(fields=["span", "period_start"], name="delivery_stats_period_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_id} {self.period_start:%Y-%m-%d %H:%M} ({self.span} s)"


class DeliveryReport(models.Model):
    """One figure row of the `spark_etl report` (docs/spark_etl.md): one consumer of one channel
    over one UTC hour or day of publishing. Written only by the pipeline (spark_etl/transforms.py
    defines the figures); the operator UI's reports page charts it."""

    class Grain(models.TextChoices):
        HOUR = "hour"
        DAY = "day"

    grain = models.CharField(max_length=4, choices=Grain.choices)
    period_start = models.DateTimeField()
    # Public IDs, not foreign keys: the report outlives archived messages and deleted consumers.
    channel_id = models.CharField(max_length=255)
    consumer_id = models.CharField(max_length=255)
    messages = models.BigIntegerField()
    jobs = models.BigIntegerField()
    delivered = models.BigIntegerField()
    dead = models.BigIntegerField()
    success_rate = models.FloatField(null=True)  # delivered / (delivered + dead)
    first_attempt_success_rate = models.FloatField(null=True)
    mean_attempts = models.FloatField(null=True)
    latency_p50_ms = models.FloatField(null=True)  # publish -> delivery, delivered jobs
    latency_p95_ms = models.FloatField(null=True)
    latency_p99_ms = models.FloatField(null=True)
    top_failures = models.TextField(blank=True, default="")  # "503:12,timeout:4"

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["grain", "channel_id", "consumer_id", "period_start"],
                name="delivery_report_unique",
            ),
        ]
        indexes = [
            # The reports page: one grain over a time range, all consumers (charts and totals);
            # also the pipeline's replacement of a recomputed range.
            models.Index(fields=["grain", "period_start"], name="delivery_report_period_idx"),
        ]

    def __str__(self) -> str:
        period = f"{self.period_start:%Y-%m-%d %H:%M}"
        return f"{self.channel_id}/{self.consumer_id} {self.grain} {period}"


class JobStatusSummary(models.Model):
    """One consumer's jobs in one status as the last refresh counted them (jobs/status_summary.py):
    what /job-status, /dlq-status and /metrics answer for a status too large to count on every
    read. Replaced whole by each refresh."""

    # No constraint in the database: a consumer deleted while a refresh counts would fail its
    # insert. Rows of a deleted consumer are simply not shown, and the next refresh drops them.
    consumer = models.ForeignKey(
        Consumer,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,  # the unique (consumer, status) constraint leads with it
        related_name="+",
    )
    status = models.CharField(max_length=9, choices=JobStatus.choices)
    count = models.PositiveBigIntegerField()
    # The oldest and newest of those jobs: by enqueued_at for QUEUED jobs, else status_changed_at
    # (jobs/status_summary.py says why).
    oldest = models.DateTimeField()
    newest = models.DateTimeField()
    refreshed_at = models.DateTimeField()  # when the refresh that counted them began

    class Meta:
        verbose_name_plural = "job status summaries"
        constraints = [
            models.UniqueConstraint(
                fields=["consumer", "status"], name="job_status_summary_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_id} {self.status}: {self.count}"
