"""The locks a recording of push outcomes takes (jobs/queue/sql/outcomes.sql, `record_outcomes`):
its jobs first, in their keys' order, and only then its consumers' rows, as a consumer's
deletion takes them (its jobs, then its row), so that the two never deadlock."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from consumers.models import Consumer
from jobs import queue
from jobs.delivery import AttemptResult
from jobs.models import DeliveryAttempt, Job
from jobs.queue import outcomes as outcomes_module
from jobs.queue import queries
from jobs.retry import decide
from tests.helpers import make_consumer
from tests.queue.test_queue import publish

NOW = timezone.now().replace(microsecond=0)


def failed_results(consumer: Consumer) -> list[AttemptResult]:
    """The consumer's jobs claimed, each of their attempts answered 503 (unavailable: counted
    towards the circuit, so the recording changes the consumer's row)."""
    return [
        AttemptResult(
            job.job_id, job.partition_at, job.attempt, consumer.pk, NOW, 5.0, status_code=503
        )
        for job in queue.claim_for_push(10, NOW)
    ]


def recording_waits_for_a_lock() -> bool:
    """Whether a recording statement waits for a lock (pg_stat_activity keeps the start of its
    text)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE %s)",
            [queries.statement("record_outcomes")[:40] + "%"],
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_a_recording_and_its_consumers_deletion_do_not_deadlock(channel):
    """The deletion holds the jobs when the recording starts: the recording waits for them
    holding no consumer row, so the deletion goes on to the consumer's row and commits, and the
    recording then finds the jobs gone and records nothing."""
    consumer = make_consumer(channel)
    for n in range(2):
        publish(f"m-{n}")
    results = failed_results(consumer)
    outcomes = {r.job_id: decide(r, consumer, NOW) for r in results}
    jobs_deleted, may_delete_consumer = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def delete_consumer() -> None:
        try:
            with transaction.atomic():
                Job.objects.filter(consumer_id=consumer.pk).delete()
                jobs_deleted.set()
                assert may_delete_consumer.wait(60)
                Consumer.objects.filter(pk=consumer.pk).delete()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def record() -> None:
        try:
            with transaction.atomic():
                queue.record_outcomes(results, outcomes, "test", NOW)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    deleter = threading.Thread(target=delete_consumer)
    deleter.start()
    assert jobs_deleted.wait(60)
    recorder = threading.Thread(target=record)
    recorder.start()
    deadline = time.monotonic() + 30
    while not (waiting := recording_waits_for_a_lock()) and time.monotonic() < deadline:
        time.sleep(0.05)
    may_delete_consumer.set()
    deleter.join(60)
    recorder.join(60)

    assert waiting  # for the jobs the deletion held
    assert errors == []
    assert not Consumer.objects.filter(pk=consumer.pk).exists()
    assert not DeliveryAttempt.objects.exists()


@pytest.mark.django_db
def test_the_jobs_go_in_their_keys_order_whatever_the_batchs(channel):
    """Two recordings sharing jobs lock them in one order; what depends on the batch's order
    (the newest failure of equal start times, the last 429's hold) keeps it (`places`)."""
    consumer = make_consumer(channel)
    for n in range(3):
        publish(f"m-{n}")
    results = list(reversed(failed_results(consumer)))
    outcomes = {r.job_id: decide(r, consumer, NOW) for r in results}

    parameters = outcomes_module._parameters(results, outcomes)

    assert parameters["jobs"] == sorted(r.job_id for r in results)
    assert parameters["places"] == [2, 1, 0]
