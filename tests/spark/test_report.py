"""`spark_etl report` against PostgreSQL: every figure of every row, in the dashboard's table and
in Parquet, equals the plain-Python computation over the generated history (tests/spark/history)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from consumers.models import Consumer
from jobs.models import DeliveryReport, Job
from spark_etl import pipeline, store
from spark_etl.transforms import REPORT_COLUMNS
from tests.spark.conftest import spark_test
from tests.spark.history import START, expected_report, make_history, new_message

pytestmark = spark_test

FIGURES = [name for name in REPORT_COLUMNS if name not in {"grain", "period_start"}][2:]


def assert_same_figures(found: dict[str, Any], expected: dict[str, Any], where: object) -> None:
    for name in FIGURES:
        want, got = expected[name], found[name]
        if isinstance(want, float):
            assert got is not None, (where, name)
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-6), (where, name, got, want)
        else:
            assert got == want, (where, name, got, want)


def table_rows() -> dict[tuple[Any, ...], dict[str, Any]]:
    return {
        (row.grain, row.period_start, row.channel_id, row.consumer_id): {
            name: getattr(row, name) for name in FIGURES
        }
        for row in DeliveryReport.objects.all()
    }


def test_every_figure_matches_an_independent_computation(spark, etl_config):
    history = make_history()
    expected = expected_report(history)
    assert {key[0] for key in expected} == {"hour", "day"}
    assert any(figures["dead"] for figures in expected.values())
    assert any(figures["top_failures"].count(",") == 2 for figures in expected.values())

    result = pipeline.run_report(spark, etl_config, until=history.until)

    assert result.rows == len(expected)
    rows = table_rows()
    assert set(rows) == set(expected)
    for key, figures in expected.items():
        assert_same_figures(rows[key], figures, key)

    # The Parquet copy holds the same rows, partitioned by grain and date.
    parquet = spark.read.parquet(etl_config.report_path).collect()
    assert len(parquet) == len(expected)
    for row in parquet:
        period = row["period_start"].replace(tzinfo=UTC)  # the session's time zone is UTC
        key = (row["grain"], period, row["channel_id"], row["consumer_id"])
        assert_same_figures(row.asDict(), expected[key], key)
        assert row["date"] == period.date()

    # And two figures straight from PostgreSQL, by SQL over the same rows.
    success_rate, p95 = sql_success_rate_and_p95("billing", START, START + timedelta(days=1))
    row = DeliveryReport.objects.get(grain="day", period_start=START, consumer_id="billing")
    assert row.success_rate is not None
    assert row.latency_p95_ms is not None
    assert math.isclose(row.success_rate, success_rate, rel_tol=1e-9)
    assert math.isclose(row.latency_p95_ms, p95, rel_tol=1e-6)


def sql_success_rate_and_p95(
    consumer: str, since: datetime, until: datetime
) -> tuple[float, float]:
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT
                avg(CASE WHEN j.status = 'DELIVERED' THEN 1.0 ELSE 0 END)
                    FILTER (WHERE j.status IN ('DELIVERED', 'DEAD')),
                percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM
                    j.status_changed_at - coalesce(m.scheduled_for, m.received_at)) * 1000)
                    FILTER (WHERE j.status = 'DELIVERED')
            FROM jobs_job j JOIN broker_message m ON m.id = j.message_id
            JOIN consumers_consumer c ON c.id = j.consumer_id
            WHERE c.public_id = %s AND m.received_at >= %s AND m.received_at < %s""",
            [consumer, since, until],
        )
        success_rate, p95 = cursor.fetchone()
    return float(success_rate), float(p95)


def test_a_nightly_run_reads_only_from_the_watermark(spark, etl_config):
    history = make_history()
    first = pipeline.run_report(spark, etl_config, until=history.until)
    assert first.since is None
    with store.connect(etl_config) as conn:
        assert store.watermark(conn, "report") == history.until
    before = table_rows()

    # Later: a message of the first day (older than the settle window) and one of the last day
    # arrive; the nightly run (no --since) recomputes only from the watermark less 48 hours.
    late_old = new_message(history_rng(), "users", START + timedelta(hours=1, minutes=5))
    late_new = new_message(history_rng(), "users", history.until - timedelta(minutes=30))
    for message in (late_old, late_new):
        message.scheduled_for = None
        message.save()
        Job.objects.create(
            message=message,
            consumer=Consumer.objects.get(public_id="crm"),
            status="DEAD",
            attempts=1,
            status_changed_at=message.received_at + timedelta(seconds=1),
        )
    now = history.until + timedelta(hours=1, minutes=10)
    second = pipeline.run_report(spark, etl_config, now=now)

    assert second.since == datetime(2026, 3, 3, tzinfo=UTC)  # the day of watermark - 48 h
    assert second.until == history.until + timedelta(hours=1)
    after = table_rows()
    first_hour = ("hour", START + timedelta(hours=1), "users", "crm")
    assert after.get(first_hour) == before.get(first_hour)  # outside the window: not re-read
    last_hour = ("hour", history.until - timedelta(hours=1), "users", "crm")
    assert after[last_hour]["jobs"] == 1
    assert after[last_hour]["dead"] == 1
    unchanged = {key for key in before if key[1] < second.since}
    assert {key: after[key] for key in unchanged} == {key: before[key] for key in unchanged}


def history_rng():
    import random

    return random.Random(99)  # noqa: S311 (test data)


def test_an_empty_window_leaves_an_empty_report(spark, etl_config):
    result = pipeline.run_report(spark, etl_config, until=timezone.now())
    assert result.rows == 0
    assert not DeliveryReport.objects.exists()
