"""Pure DataFrame functions of the report: DataFrames in, a DataFrame out, no I/O.

Input frames (columns as read from PostgreSQL):
- messages: id, channel_id, received_at, scheduled_for
- jobs: id, message_id, consumer_id, status, attempts, status_changed_at
- attempts: id, job_id, started_at, status_code, error_class
- consumers: id, public_id

Definitions (docs/spark_etl.md):
- A job belongs to the hour and the day (UTC) its message was received.
- success rate: delivered / (delivered + dead); jobs still queued or in flight are left out.
- first-attempt success rate: of the jobs with at least one recorded attempt, the share whose
  earliest attempt got a 2xx.
- mean attempts: over delivered and dead jobs, the attempts each made: its recorded attempts, or
  the job's own counter when that is larger (pull consumers record no attempt rows).
- latency: for delivered jobs, from when the message was due (its scheduled time, else when it
  was received) to the job's move to DELIVERED; exact percentiles, interpolated as PostgreSQL's
  percentile_cont.
- top failures: the three most frequent outcomes of failed attempts, "503:12,timeout:4": the HTTP
  status, or the error class when there was no response; ties by name.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F  # noqa: N812 (the usual name)

GRAINS = ("hour", "day")
TOP_FAILURES = 3
REPORT_COLUMNS = [
    "grain",
    "period_start",
    "channel_id",
    "consumer_id",
    "messages",
    "jobs",
    "delivered",
    "dead",
    "success_rate",
    "first_attempt_success_rate",
    "mean_attempts",
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "top_failures",
]
_KEYS = ["grain", "period_start", "channel_id", "consumer_id"]


def is_success(status_code: Column) -> Column:
    return status_code.isNotNull() & status_code.between(200, 299)


def attempts_per_job(attempts: DataFrame) -> DataFrame:
    """job_id, attempt_rows, first_attempt_ok (the earliest attempt, ties by id, got a 2xx)."""
    return attempts.groupBy("job_id").agg(
        F.count(F.lit(1)).alias("attempt_rows"),
        F.min_by(is_success(F.col("status_code")), F.struct("started_at", "id")).alias(
            "first_attempt_ok"
        ),
    )


def job_facts(
    messages: DataFrame, jobs: DataFrame, attempts: DataFrame, consumers: DataFrame
) -> DataFrame:
    """One row per job: where it belongs in the report and what happened to it."""
    due = F.coalesce(F.col("scheduled_for"), F.col("received_at"))
    latency_ms = (F.unix_micros(F.col("status_changed_at")) - F.unix_micros(due)) / 1000.0
    return (
        jobs.select(
            F.col("id").alias("job_id"),
            "message_id",
            "consumer_id",
            "status",
            F.col("attempts").alias("job_attempts"),
            "status_changed_at",
        )
        .join(
            messages.select(
                F.col("id").alias("message_id"), "channel_id", "received_at", "scheduled_for"
            ),
            "message_id",
        )
        .join(
            consumers.select(
                F.col("id").alias("consumer_id"), F.col("public_id").alias("consumer")
            ),
            "consumer_id",
        )
        .join(attempts_per_job(attempts), "job_id", "left")
        .select(
            "job_id",
            "message_id",
            "channel_id",
            F.col("consumer").alias("consumer_id"),
            "received_at",
            "status",
            F.greatest(F.coalesce(F.col("attempt_rows"), F.lit(0)), F.col("job_attempts")).alias(
                "attempts_made"
            ),
            "first_attempt_ok",
            F.when(F.col("status") == "DELIVERED", latency_ms).alias("latency_ms"),
        )
    )


def in_every_grain(facts: DataFrame) -> DataFrame:
    """Each row once per grain, with that grain's period: one aggregation serves both grains."""
    periods = F.array(
        *[
            F.struct(F.lit(grain).alias("grain"), F.date_trunc(grain, "received_at").alias("start"))
            for grain in GRAINS
        ]
    )
    return (
        facts.withColumn("period", F.explode(periods))
        .withColumn("grain", F.col("period.grain"))
        .withColumn("period_start", F.col("period.start"))
        .drop("period")
    )


def _ratio(part: Column, whole: Column) -> Column:
    return F.when(whole > 0, part / whole)


def figures(facts: DataFrame) -> DataFrame:
    """Every figure but the top failures, per grain, period, channel and consumer."""
    delivered = F.sum(F.when(F.col("status") == "DELIVERED", 1).otherwise(0))
    dead = F.sum(F.when(F.col("status") == "DEAD", 1).otherwise(0))
    terminal = F.col("status").isin("DELIVERED", "DEAD")
    latency = F.percentile(F.col("latency_ms"), [0.5, 0.95, 0.99])
    return (
        in_every_grain(facts)
        .groupBy(*_KEYS)
        .agg(
            F.count_distinct("message_id").alias("messages"),
            F.count(F.lit(1)).alias("jobs"),
            delivered.alias("delivered"),
            dead.alias("dead"),
            F.avg(F.col("first_attempt_ok").cast("double")).alias("first_attempt_success_rate"),
            F.avg(F.when(terminal, F.col("attempts_made"))).alias("mean_attempts"),
            latency.alias("latency"),
        )
        .withColumn("success_rate", _ratio(F.col("delivered"), F.col("delivered") + F.col("dead")))
        .withColumn("latency_p50_ms", F.col("latency")[0])
        .withColumn("latency_p95_ms", F.col("latency")[1])
        .withColumn("latency_p99_ms", F.col("latency")[2])
        .drop("latency")
    )


def failure_label(status_code: Column, error_class: Column) -> Column:
    return F.coalesce(
        status_code.cast("string"), F.nullif(error_class, F.lit("")), F.lit("unknown")
    )


def top_failures(facts: DataFrame, attempts: DataFrame) -> DataFrame:
    """The `TOP_FAILURES` most frequent failure outcomes per period, channel and consumer, as
    "label:count,label:count"."""
    failed = attempts.where(~is_success(F.col("status_code"))).select(
        "job_id", failure_label(F.col("status_code"), F.col("error_class")).alias("label")
    )
    placed = facts.select("job_id", "received_at", "channel_id", "consumer_id")
    counted = in_every_grain(failed.join(placed, "job_id")).groupBy(*_KEYS, "label").count()
    ranked = counted.withColumn(
        "rank",
        F.row_number().over(
            Window.partitionBy(*_KEYS).orderBy(F.col("count").desc(), F.col("label"))
        ),
    ).where(F.col("rank") <= TOP_FAILURES)
    items = F.array_sort(
        F.collect_list(F.struct("rank", F.concat_ws(":", "label", "count").alias("item")))
    )
    return ranked.groupBy(*_KEYS).agg(
        F.array_join(F.transform(items, lambda entry: entry["item"]), ",").alias("top_failures")
    )


def delivery_report(facts: DataFrame, attempts: DataFrame) -> DataFrame:
    """The report: one row per grain (hour and day), period, channel and consumer."""
    report = figures(facts).join(top_failures(facts, attempts), _KEYS, "left")
    return report.select(
        *[
            F.coalesce("top_failures", F.lit("")).alias(name) if name == "top_failures" else name
            for name in REPORT_COLUMNS
        ]
    )
