"""/job-status, /dlq-status and /metrics counted live, or from the job status summary once the
jobs are too many (jobs/status_summary.py, docs/api.md "Job counts: live or from the summary");
and messages-status read from indexes alone."""

from __future__ import annotations

import contextlib
import re
import threading
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection, connections

from broker import publish
from broker.api.messages import _message_counts
from broker.models import Channel, Message
from consumers.models import Consumer
from jobs.models import Job, JobStatusSummary
from jobs.queue import OutcomeReport, release_due_messages, report_pull_outcomes, take_for_pull
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED, JobStatus
from jobs.status_summary import (
    LOCK_ID,
    READS,
    _counted,
    _estimated_rows,
    refresh_job_status_summary,
    status_counts,
    summary_refreshed_at,
)
from tests.helpers import (
    at_once,
    make_channel,
    make_consumer_with_token,
    pull_job,
    scans_a_table,
)

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture(autouse=True)
def admin(settings):
    settings.BROKER_ADMIN_TOKENS = ["admin-token"]


@pytest.fixture
def summary_only(settings):
    """Every status from the summary, as on a database far past the limits."""
    settings.BROKER_LIVE_COUNT_MAX_JOBS = 0
    settings.BROKER_LIVE_COUNT_MAX_STATUS_JOBS = 0


ADMIN = {"Authorization": "Bearer admin-token"}


def jobs_of(consumer: Consumer, status: JobStatus, at: datetime, count: int = 1) -> list[Job]:
    with time_machine.travel(at, tick=False):
        return [pull_job(consumer, status) for _ in range(count)]


def refresh_at(at: datetime) -> int | None:
    with time_machine.travel(at, tick=False):
        return refresh_job_status_summary()


def job_status(client) -> dict[str, dict[int, dict[str, Any]]]:
    """/job-status as consumer ID -> status number -> its entry (without the number)."""
    response = client.get("/job-status", headers=ADMIN)
    assert response.status_code == 200
    return {
        consumer: {entry.pop("status"): entry for entry in entries}
        for channel in response.json().values()
        for consumer, entries in channel.items()
    }


def dead_counts(client) -> tuple[dict[str, int], str | None]:
    body = client.get("/dlq-status", headers=ADMIN).json()
    counts = {row["consumerId"]: row["deadCount"] for row in body["consumers"]}
    return counts, body.get("refreshedAt")


def stamp(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def entry(count: int, oldest: datetime, newest: datetime, name: str, **more: Any) -> dict[str, Any]:
    return {
        "count": count,
        "oldestItemTimestamp": stamp(oldest),
        "newestItemTimestamp": stamp(newest),
        "statusName": name,
        **more,
    }


# Live


def test_a_fresh_broker_shows_every_status_exactly_at_once(client, worker):
    jobs_of(worker, DELIVERED, T0, 2)
    jobs_of(worker, DELIVERED, T0 + HOUR)
    jobs_of(worker, DEAD, T0 + 2 * HOUR)
    jobs_of(worker, INFLIGHT, T0 + 3 * HOUR)
    # Queued at T0, taken and given back for a retry at T0 + 4 h: still queued since T0.
    [retried] = jobs_of(worker, QUEUED, T0)
    with time_machine.travel(T0 + 4 * HOUR, tick=False):
        take_for_pull(retried)
        report_pull_outcomes(worker, [OutcomeReport(retried.public_id, QUEUED, 3600, "HTTP 503")])
    jobs_of(worker, QUEUED, T0 + 4 * HOUR)

    assert job_status(client) == {
        "worker": {
            1001: entry(2, T0, T0 + 4 * HOUR, "QUEUED"),
            1002: entry(1, T0 + 3 * HOUR, T0 + 3 * HOUR, "INFLIGHT"),
            1003: entry(3, T0, T0 + HOUR, "DELIVERED"),
            1004: entry(1, T0 + 2 * HOUR, T0 + 2 * HOUR, "DEAD"),
        }
    }
    assert dead_counts(client) == ({"worker": 1}, None)


def test_statuses_are_listed_in_the_order_they_always_were(client, worker):
    for status in (QUEUED, DEAD, DELIVERED, INFLIGHT):
        jobs_of(worker, status, T0)

    body = client.get("/job-status", headers=ADMIN).json()

    assert [e["statusName"] for e in body["orders"]["worker"]] == sorted(
        ["QUEUED", "DEAD", "DELIVERED", "INFLIGHT"]
    )


def test_the_summary_is_not_read_below_the_limits(client, worker):
    jobs_of(worker, DELIVERED, T0)
    refresh_at(T0 + HOUR)
    jobs_of(worker, DELIVERED, T0 + 2 * HOUR)

    assert job_status(client)["worker"][1003] == entry(2, T0, T0 + 2 * HOUR, "DELIVERED")


# From the summary


def test_the_summary_answers_with_when_it_counted_and_a_refresh_brings_it_up_to_date(
    client, worker, summary_only
):
    jobs_of(worker, DELIVERED, T0, 2)
    jobs_of(worker, DEAD, T0 + HOUR)
    assert refresh_at(T0 + 2 * HOUR) == 2  # DELIVERED and DEAD of one consumer
    jobs_of(worker, DELIVERED, T0 + 3 * HOUR)
    jobs_of(worker, DEAD, T0 + 3 * HOUR)
    jobs_of(worker, QUEUED, T0 + 3 * HOUR)
    counted = stamp(T0 + 2 * HOUR)

    assert job_status(client) == {
        "worker": {
            1003: entry(2, T0, T0, "DELIVERED", refreshedAt=counted),
            1004: entry(1, T0 + HOUR, T0 + HOUR, "DEAD", refreshedAt=counted),
        }
    }
    assert dead_counts(client) == ({"worker": 1}, counted)

    assert refresh_at(T0 + 4 * HOUR) == 3
    counted = stamp(T0 + 4 * HOUR)
    assert job_status(client) == {
        "worker": {
            1001: entry(1, T0 + 3 * HOUR, T0 + 3 * HOUR, "QUEUED", refreshedAt=counted),
            1003: entry(3, T0, T0 + 3 * HOUR, "DELIVERED", refreshedAt=counted),
            1004: entry(2, T0 + HOUR, T0 + 3 * HOUR, "DEAD", refreshedAt=counted),
        }
    }
    assert dead_counts(client) == ({"worker": 2}, counted)


def test_only_the_statuses_past_their_limit_come_from_the_summary(client, worker, settings):
    settings.BROKER_LIVE_COUNT_MAX_JOBS = 0  # the table is "large"; the indexes are not
    jobs_of(worker, DELIVERED, T0)
    jobs_of(worker, DEAD, T0)
    refresh_at(T0 + HOUR)
    jobs_of(worker, DELIVERED, T0 + 2 * HOUR)
    jobs_of(worker, DEAD, T0 + 2 * HOUR)

    statuses = job_status(client)["worker"]

    assert statuses[1003] == entry(1, T0, T0, "DELIVERED", refreshedAt=stamp(T0 + HOUR))
    assert statuses[1004] == entry(2, T0, T0 + 2 * HOUR, "DEAD")  # live: no refreshedAt
    assert dead_counts(client) == ({"worker": 2}, None)


def test_a_status_the_summary_found_empty_says_when(client, worker, summary_only):
    jobs_of(worker, DELIVERED, T0)
    refresh_at(T0 + HOUR)
    jobs_of(worker, DEAD, T0 + 2 * HOUR)  # after the refresh: not in the summary yet

    assert dead_counts(client) == ({}, stamp(T0 + HOUR))
    assert set(job_status(client)["worker"]) == {1003}


def test_before_the_first_refresh_the_counts_are_live(client, worker, summary_only):
    jobs_of(worker, DELIVERED, T0)
    jobs_of(worker, DEAD, T0)

    assert job_status(client)["worker"][1003] == entry(1, T0, T0, "DELIVERED")
    assert dead_counts(client) == ({"worker": 1}, None)


def test_a_deleted_consumer_leaves_the_answers_at_once_and_the_summary_at_its_refresh(
    client, channel, worker, summary_only
):
    gone = make_consumer_with_token(channel, "gone", token="gone-token")
    jobs_of(worker, DEAD, T0)
    jobs_of(gone, DEAD, T0)
    refresh_at(T0 + HOUR)
    gone_key = gone.pk
    gone.delete()

    assert dead_counts(client)[0] == {"worker": 1}
    assert set(job_status(client)) == {"worker"}
    assert JobStatusSummary.objects.filter(consumer_id=gone_key).exists()
    refresh_at(T0 + 2 * HOUR)
    assert not JobStatusSummary.objects.filter(consumer_id=gone_key).exists()


def test_a_refresh_of_an_empty_table_leaves_an_empty_summary(client, summary_only):
    assert refresh_at(T0) == 0
    assert summary_refreshed_at() is None
    assert client.get("/job-status", headers=ADMIN).json() == {}
    assert client.get("/dlq-status", headers=ADMIN).json() == {"consumers": []}


def test_metrics_come_from_the_summary_too_and_say_when_it_counted(
    admin_client, worker, summary_only
):
    jobs_of(worker, QUEUED, T0, 2)
    jobs_of(worker, DEAD, T0)
    refresh_at(T0 + HOUR)
    jobs_of(worker, DEAD, T0 + 2 * HOUR)

    text = admin_client.get("/metrics").content.decode()

    assert 'broker_jobs_queued{channel="orders",consumer="worker"} 2.0' in text
    assert 'broker_jobs_dead{channel="orders",consumer="worker"} 1.0' in text
    assert 'dead_job_count{channel="orders",consumer="worker"} 1.0' in text
    assert (
        gauge(text, "broker_job_status_summary_refreshed_timestamp_seconds")
        == (T0 + HOUR).timestamp()
    )
    assert 'broker_job_status_summary_in_use{status="DEAD"} 1.0' in text


def gauge(text: str, name: str) -> float:
    [value] = [line.split()[1] for line in text.splitlines() if line.startswith(f"{name} ")]
    return float(value)


def test_metrics_are_live_below_the_limits(admin_client, worker):
    jobs_of(worker, DEAD, T0)
    refresh_at(T0 + HOUR)
    jobs_of(worker, DEAD, T0 + 2 * HOUR)

    text = admin_client.get("/metrics").content.decode()

    assert 'broker_jobs_dead{channel="orders",consumer="worker"} 2.0' in text
    assert 'broker_job_status_summary_in_use{status="DEAD"} 0.0' in text


# The refresh


def test_a_refresh_run_again_gives_the_same_summary(worker):
    jobs_of(worker, DELIVERED, T0, 3)
    jobs_of(worker, QUEUED, T0 + HOUR)

    refresh_at(T0 + 2 * HOUR)
    first = summary_rows()
    call_command("refresh_job_status_summary", stdout=(out := StringIO()))

    assert "counted 2 consumer and status pairs" in out.getvalue()
    assert (
        summary_rows()
        == first
        == {
            (worker.pk, "DELIVERED", 3, T0, T0),
            (worker.pk, "QUEUED", 1, T0 + HOUR, T0 + HOUR),
        }
    )


def summary_rows() -> set[tuple[int, str, int, datetime, datetime]]:
    return set(
        JobStatusSummary.objects.values_list("consumer_id", "status", "count", "oldest", "newest")
    )


@pytest.mark.django_db(transaction=True)
def test_a_refresh_while_another_runs_leaves_it_alone(worker):
    jobs_of(worker, DELIVERED, T0)
    refresh_at(T0 + HOUR)
    jobs_of(worker, DELIVERED, T0 + 2 * HOUR)
    outcome: list[int | None] = []

    def refresh() -> None:
        try:
            outcome.append(refresh_job_status_summary())
        finally:
            connections.close_all()

    with connection.cursor() as cursor:  # hold the lock, as a running refresh does
        cursor.execute("BEGIN")
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_ID])
        thread = threading.Thread(target=refresh)
        thread.start()
        thread.join(timeout=30)
        cursor.execute("COMMIT")

    assert outcome == [None]  # gave way at once, without waiting
    assert summary_rows() == {(worker.pk, "DELIVERED", 1, T0, T0)}


@pytest.mark.django_db(transaction=True)
def test_a_refresh_does_not_wait_for_a_job_being_moved(worker):
    """A dispatcher holds the job it is delivering locked until its outcome commits; the
    refresh's plain read passes it by (and counts what had committed)."""
    [job] = jobs_of(worker, INFLIGHT, T0)
    outcome: list[int | None] = []

    def refresh() -> None:
        try:
            outcome.append(refresh_job_status_summary())
        finally:
            connections.close_all()

    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        delivered = "UPDATE {job} SET status = 'DELIVERED' WHERE id = %s"
        cursor.execute(delivered.format(job=Job._meta.db_table), [job.pk])
        thread = threading.Thread(target=refresh)
        thread.start()
        thread.join(timeout=30)
        finished = not thread.is_alive()
        cursor.execute("ROLLBACK")
    thread.join(timeout=30)

    assert finished
    assert outcome == [1]
    assert summary_rows() == {(worker.pk, "INFLIGHT", 1, T0, T0)}


@pytest.mark.django_db(transaction=True)
def test_refreshes_at_once_write_one_correct_summary(worker):
    jobs_of(worker, DELIVERED, T0, 2)
    jobs_of(worker, DEAD, T0)
    outcome: list[int | None] = []

    at_once(*[lambda: outcome.append(refresh_job_status_summary())] * 4)

    assert len(outcome) == 4
    assert 2 in outcome  # at least one counted; any other either counted too or gave way
    assert set(outcome) <= {2, None}
    assert summary_rows() == {(worker.pk, "DELIVERED", 2, T0, T0), (worker.pk, "DEAD", 1, T0, T0)}


# PostgreSQL's estimates choose the source


def test_the_planners_estimate_of_the_table_decides(client, worker, settings):
    bulk_jobs(worker, DELIVERED, 3000)
    refresh_at(T0 + HOUR)
    jobs_of(worker, DELIVERED, T0 + 2 * HOUR)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    estimate = _estimated_rows([READS[DELIVERED]])[READS[DELIVERED]]
    assert 2900 <= estimate <= 3100

    settings.BROKER_LIVE_COUNT_MAX_JOBS = 10_000
    assert job_status(client)["worker"][1003]["count"] == 3001
    settings.BROKER_LIVE_COUNT_MAX_JOBS = 2000
    assert job_status(client)["worker"][1003]["count"] == 3000


def test_every_status_index_is_estimated(worker):
    bulk_jobs(worker, DEAD, 2000)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")

    estimates = _estimated_rows(list(READS.values()))

    assert 1900 <= estimates[READS[DEAD]] <= 2100
    assert estimates[READS[QUEUED]] < 100
    assert estimates[READS[INFLIGHT]] < 100


def test_the_indexes_read_are_the_models():
    indexes = {index.name for index in Job._meta.indexes}
    assert {READS[status] for status in (QUEUED, INFLIGHT, DEAD)} <= indexes
    assert READS[DELIVERED] == Job._meta.db_table


def on_postgresql_15() -> None:
    """The plan shapes asserted are PostgreSQL 15's, on which the 25,000,000-job figures were
    measured (docs/performance.md) and CI runs tests/api (.ci/run). At these tests' sizes
    PostgreSQL 18 reads some of the same counts by bitmap heap scans instead."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version_num")
        version = int(cursor.fetchone()[0])
    if version >= 160000:
        pytest.skip("plan shapes of PostgreSQL 15 (CI runs tests/api on it)")


@pytest.mark.django_db(transaction=True)
def test_live_counts_of_queued_and_dead_jobs_read_their_index_alone(worker):
    on_postgresql_15()
    bulk_jobs(worker, DEAD, 20_000)
    bulk_jobs(worker, QUEUED, 20_000)
    bulk_jobs(worker, DELIVERED, 20_000)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {Job._meta.db_table}")

    for status in (QUEUED, DEAD):
        plan = _counted(status).explain()
        assert f"Index Only Scan using {READS[status]}" in plan, plan
        assert not scans_a_table(plan), plan
    assert status_counts([QUEUED, DEAD]).counts[0].count == 20_000


def bulk_jobs(consumer: Consumer, status: JobStatus, count: int) -> None:
    """`count` jobs of `consumer` in `status`, of messages of their own, all at T0, in SQL."""
    tables = {"message": Message._meta.db_table, "job": Job._meta.db_table}
    prefix = f"bulk-{status}-"
    statements = [
        """INSERT INTO {message} (channel_id, producer_id, public_id, payload, content_type,
            headers, priority, status, received_at, ordering_key, payload_size, payload_file)
        SELECT %(channel)s, 'shop', %(prefix)s || n, '\\x7b7d', 'application/json', '{{}}', 0,
            'DISPATCHED', %(at)s, '', 2, ''
        FROM generate_series(1, %(count)s) AS n""",
        """INSERT INTO {job} (message_id, consumer_id, status, priority, ordering_key, attempts,
            next_attempt_at, incremental_timeout, last_error, created_at, status_changed_at,
            enqueued_at)
        SELECT id, %(consumer)s, %(status)s, 0, '', 1, received_at, 0, '', received_at,
            received_at, received_at
        FROM {message} WHERE public_id LIKE %(like)s""",
    ]
    parameters: dict[str, Any] = {
        "channel": consumer.channel_id,
        "consumer": consumer.pk,
        "status": status.value,
        "prefix": prefix,
        "like": prefix + "%",
        "at": T0,
        "count": count,
    }
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement.format(**tables), parameters)


# messages-status


def test_messages_status_counts_every_kind(admin_client, channel, worker):
    publish("orders", b"x", producer="shop")  # DISPATCHED (worker)
    other = make_channel("quiet", token="quiet-token")
    publish(other.pk, b"x", producer="shop")  # ACKNOWLEDGED, another channel
    with time_machine.travel(T0, tick=False):
        publish("orders", b"x", producer="shop", scheduled_for=T0 + HOUR)
        publish("orders", b"x", producer="shop", scheduled_for=T0 + 2 * HOUR)
        publish("orders", b"x", producer="shop", scheduled_for=T0 + 3 * HOUR)
    with time_machine.travel(T0 + HOUR + timedelta(minutes=1), tick=False):
        assert release_due_messages() == 1

    body = admin_client.get("/channel/orders/messages-status").json()

    assert body["counts"] == {
        "DISPATCHED": {"Count": 2, "Links": {"messages": "/channel/orders/messages?status=102"}},
        "SCHEDULED_SCHEDULED": {
            "Count": 2,
            "Links": {"messages": "/channel/orders/scheduled-messages?status=101"},
        },
        "SCHEDULED_DISPATCHED": {
            "Count": 1,
            "Links": {"messages": "/channel/orders/scheduled-messages?status=102"},
        },
    }
    assert body["next_scheduled_message_at"] == stamp(T0 + 2 * HOUR)
    quiet = admin_client.get("/channel/quiet/messages-status").json()
    assert quiet == {
        "counts": {
            "ACKNOWLEDGED": {
                "Count": 1,
                "Links": {"messages": "/channel/quiet/messages?status=101"},
            }
        }
    }


@pytest.mark.django_db(transaction=True)
def test_messages_status_reads_indexes_alone(channel):
    """100,000 messages over ten channels; the channel's counts come from three index-only scans
    of its own entries (heap fetches 0 once vacuumed), not from its messages' rows."""
    on_postgresql_15()
    for n in range(1, 10):
        make_channel(f"c{n}", token=f"c{n}-token")
    statement = """INSERT INTO {message} (channel_id, producer_id, public_id, payload,
            content_type, headers, priority, status, received_at, ordering_key, payload_size,
            payload_file, scheduled_for)
        SELECT CASE WHEN n %% 10 = 0 THEN 'orders' ELSE 'c' || n %% 10 END, 'shop', 'm-' || n,
            '\\x7b7d', 'application/json', '{{}}', 0,
            CASE WHEN n %% 40 = 0 THEN 'SCHEDULED' ELSE 'DISPATCHED' END, %s, '', 2, '',
            CASE WHEN n %% 20 = 0 THEN %s::timestamptz END
        FROM generate_series(1, 100000) AS n"""
    with connection.cursor() as cursor:
        cursor.execute(statement.format(message=Message._meta.db_table), [T0, T0 + HOUR])
        cursor.execute(f"VACUUM ANALYZE {Message._meta.db_table}")
        # The channels' own table too: emptied by DELETE between tests (tests/flush.py), its
        # pages are not all-visible until vacuumed, and the channel's row is fetched from them.
        cursor.execute(f"VACUUM ANALYZE {Channel._meta.db_table}")

    with capture_plans() as plans:
        found = _message_counts(channel)

    counts = (found["DISPATCHED"], found["SCHEDULED"], found["ever_scheduled"])
    assert counts == (7500, 2500, 5000)
    assert found["next_due"] == T0 + HOUR
    [plan] = plans
    assert "Seq Scan on broker_message" not in plan, plan
    assert not re.search(r"Heap Fetches: [1-9]", plan), plan
    for index in (
        "message_channel_status_idx",
        "message_channel_scheduled_idx",
        "message_channel_pending_idx",
    ):
        assert f"Index Only Scan using {index}" in plan, plan


@contextlib.contextmanager
def capture_plans():
    """EXPLAIN ANALYZE of each SELECT run inside, as it ran (its real plan and heap fetches)."""
    plans: list[str] = []

    def explain(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("SELECT"):
            with connection.cursor() as cursor:
                cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
                plans.append("\n".join(row[0] for row in cursor.fetchall()))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(explain):
        yield plans
