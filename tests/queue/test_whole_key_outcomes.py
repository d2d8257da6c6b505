"""Push outcomes recorded by each job's whole primary key, (id, partition_at), as the claim returned
it (jobs/queue/sql/outcomes.sql, `record_outcomes`; jobs/queue/outcomes.py): in the job's own
time partition only, whatever its creation time; a job no longer under that key gets nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from jobs import partitions, queue
from jobs.delivery import AttemptResult
from jobs.models import DeliveryAttempt, Job
from jobs.queue.rules import push_lease_expiry
from jobs.retry import Outcome, Verdict
from jobs.states import DELIVERED, QUEUED
from tests.helpers import make_consumer
from tests.queue.test_queue import publish

pytestmark = pytest.mark.django_db
DAY = timedelta(days=1)
NOW = datetime(2031, 3, 10, 12, tzinfo=UTC)  # the jobs' creation, and the claim's time
CARRIED = NOW + 2 * DAY  # where retention carried them: a newer partition than their creation's


@pytest.fixture(autouse=True)
def several_partitions(settings):
    """A partition a day from three days before NOW to a few days after it (a week's partition,
    the default, would hold them all)."""
    settings.BROKER_PARTITION_DAYS = 1
    partitions.ensure_partitions(CARRIED, since=NOW - 3 * DAY)


def partition_of(moment: datetime) -> str:
    return partitions.JOBS.partition_name(partitions.span_start(moment))


def place_jobs(at: datetime) -> None:
    Job.objects.update(partition_at=at)


def result_of(job: queue.ClaimedJob, status_code: int) -> AttemptResult:
    return AttemptResult(
        job.job_id, job.partition_at, job.attempt, job.consumer_id, NOW, 12.0, status_code
    )


def record(results: list[AttemptResult], outcomes: list[Outcome]) -> dict[int, Outcome]:
    by_job = {result.job_id: outcome for result, outcome in zip(results, outcomes, strict=True)}
    return queue.record_outcomes(results, by_job, "test-dispatcher", NOW)


def scans_by_partition() -> dict[str, int]:
    """Scans of each jobs partition so far in this transaction (the test's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, coalesce(seq_scan, 0) + coalesce(idx_scan, 0)"
            " FROM pg_stat_xact_user_tables WHERE relname LIKE 'jobs\\_job\\_%'"
        )
        return dict(cursor.fetchall())


def test_outcomes_of_jobs_carried_to_a_newer_partition_are_recorded_there_alone(channel):
    make_consumer(channel)
    for message_id in ("ok", "retry"):
        publish(message_id, received_at=NOW)
    # Some jobs elsewhere, in flight too, that the recording must leave alone.
    for day in (-2, -1, 0, 1):
        publish(f"other{day}", received_at=NOW)
        Job.objects.filter(message__public_id=f"other{day}").update(partition_at=NOW + day * DAY)
    Job.objects.filter(message__public_id__in=["ok", "retry"]).update(partition_at=CARRIED)
    claimed = {job.message.message_id: job for job in queue.claim_for_push(10, NOW)}
    assert {claimed[m].partition_at for m in ("ok", "retry")} == {CARRIED}
    assert {claimed[m].created_at for m in ("ok", "retry")} == {NOW}
    later = NOW + timedelta(minutes=1)
    before = scans_by_partition()

    applied = record(
        [result_of(claimed["ok"], 200), result_of(claimed["retry"], 500)],
        [Outcome(Verdict.DELIVERED, ""), Outcome(Verdict.RETRY, "HTTP 500", later)],
    )

    after = scans_by_partition()
    touched = {name for name, scans in after.items() if scans != before.get(name, 0)}
    assert touched == {partition_of(CARRIED)}
    assert len(applied) == 2
    jobs = {job.message.public_id: job for job in Job.objects.select_related("message")}
    assert (jobs["ok"].status, jobs["ok"].lease_expires_at) == (DELIVERED, None)
    assert (jobs["retry"].status, jobs["retry"].next_attempt_at) == (QUEUED, later)
    recorded = DeliveryAttempt.objects.values_list("job_id", "status_code")
    assert sorted(recorded) == sorted([(jobs["ok"].pk, 200), (jobs["retry"].pk, 500)])


def test_a_job_carried_forward_after_its_claim_gets_nothing_of_that_claim(channel):
    """Its lease expired, the sweep gave it back, retention carried it to another partition: the
    old claim's outcome no longer names it (as if it had been deleted), and no attempt row is
    written for it, nor does it move, whichever way the attempt ended."""
    make_consumer(channel)
    for message_id in ("ok", "failed"):
        publish(message_id, received_at=NOW)
    place_jobs(NOW)
    claimed = {job.message.message_id: job for job in queue.claim_for_push(10, NOW)}
    assert queue.sweep_expired_leases(push_lease_expiry(NOW) + timedelta(seconds=1)) == 2
    assert partitions.carry_forward(partition_of(NOW), NOW + DAY, CARRIED) == 2

    record(
        [result_of(claimed["ok"], 200), result_of(claimed["failed"], 410)],
        [Outcome(Verdict.DELIVERED, ""), Outcome(Verdict.DEAD, "HTTP 410")],
    )

    assert set(Job.objects.values_list("status", "partition_at")) == {(QUEUED, CARRIED)}
    assert not DeliveryAttempt.objects.exists()
