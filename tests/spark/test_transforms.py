"""The report's pure DataFrame functions on small hand-made frames (no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spark_etl import transforms
from tests.spark.conftest import spark_only

pytestmark = spark_only

T0 = datetime(2026, 5, 4, 10, 15, tzinfo=UTC)


def frames(spark, jobs, attempts, scheduled_for=None):
    messages = spark.createDataFrame(
        [(1, "orders", T0, scheduled_for), (2, "orders", T0 + timedelta(hours=1), None)],
        "id long, channel_id string, received_at timestamp, scheduled_for timestamp",
    )
    consumers = spark.createDataFrame([(7, "billing"), (8, "audit")], "id long, public_id string")
    jobs = spark.createDataFrame(
        jobs,
        "id long, message_id long, consumer_id long, status string, attempts int,"
        " status_changed_at timestamp",
    )
    attempts = spark.createDataFrame(
        attempts,
        "id long, job_id long, started_at timestamp, status_code int, error_class string",
    )
    return messages, jobs, attempts, consumers


def test_first_attempt_is_the_earliest_not_the_lowest_id(spark):
    _, _, attempts, _ = frames(
        spark,
        [],
        [
            (1, 10, T0 + timedelta(seconds=9), 200, ""),  # lowest id, but the retry
            (2, 10, T0 + timedelta(seconds=1), 503, "http-status"),
            (3, 11, T0 + timedelta(seconds=1), 204, ""),
        ],
    )
    rows = {row["job_id"]: row for row in transforms.attempts_per_job(attempts).collect()}
    assert rows[10]["attempt_rows"] == 2
    assert rows[10]["first_attempt_ok"] is False
    assert rows[11]["attempt_rows"] == 1
    assert rows[11]["first_attempt_ok"] is True


def test_facts_latency_from_the_due_time_and_attempts_made(spark):
    due = T0 + timedelta(hours=2)
    messages, jobs, attempts, consumers = frames(
        spark,
        [
            (10, 1, 7, "DELIVERED", 1, due + timedelta(milliseconds=1500)),
            (11, 1, 8, "DEAD", 3, T0),  # pull: no attempt rows, its counter says 3
            (12, 2, 7, "QUEUED", 0, T0),
        ],
        [(i, 10, T0 + timedelta(seconds=i), 500 if i < 3 else 200, "") for i in range(1, 4)],
        scheduled_for=due,
    )
    facts = {
        row["job_id"]: row
        for row in transforms.job_facts(messages, jobs, attempts, consumers).collect()
    }
    assert facts[10]["latency_ms"] == pytest.approx(1500.0)
    assert facts[10]["attempts_made"] == 3  # requeued: three rows, counter 1
    assert facts[10]["consumer_id"] == "billing"
    assert facts[10]["channel_id"] == "orders"
    assert facts[11]["attempts_made"] == 3
    assert facts[11]["latency_ms"] is None
    assert facts[11]["first_attempt_ok"] is None
    assert facts[12]["attempts_made"] == 0


def test_report_rates_percentiles_and_top_failures(spark):
    delivered = [
        (10 + i, 1, 7, "DELIVERED", 1, T0 + timedelta(milliseconds=ms))
        for i, ms in enumerate([100, 200, 300, 400])
    ]
    jobs = [*delivered, (20, 1, 7, "DEAD", 2, T0), (21, 2, 7, "INFLIGHT", 1, T0)]
    rows: list[tuple[int, int, datetime, int | None, str]]
    rows = [(i, 10 + i, T0, 200, "") for i in range(4)]
    rows += [(10, 20, T0, 503, "http-status"), (11, 20, T0, None, "timeout")]
    rows += [(12, 21, T0, 503, "http-status"), (13, 21, T0, 404, "http-status")]
    messages, job_frame, attempts, consumers = frames(spark, jobs, rows)
    facts = transforms.job_facts(messages, job_frame, attempts, consumers)
    report = {
        (row["grain"], row["period_start"].hour): row
        for row in transforms.delivery_report(facts, attempts).collect()
    }
    day = report["day", 0]
    assert (day["messages"], day["jobs"], day["delivered"], day["dead"]) == (2, 6, 4, 1)
    assert day["success_rate"] == pytest.approx(0.8)
    assert day["first_attempt_success_rate"] == pytest.approx(4 / 6)
    assert day["mean_attempts"] == pytest.approx((4 + 2) / 5)
    # percentile_cont over 100, 200, 300, 400
    assert day["latency_p50_ms"] == pytest.approx(250.0)
    assert day["latency_p95_ms"] == pytest.approx(385.0)
    assert day["latency_p99_ms"] == pytest.approx(397.0)
    assert day["top_failures"] == "503:2,404:1,timeout:1"
    assert report["hour", 10]["jobs"] == 5
    assert report["hour", 11]["jobs"] == 1
    assert report["hour", 11]["success_rate"] is None  # nothing finished yet
    assert report["hour", 11]["latency_p50_ms"] is None
