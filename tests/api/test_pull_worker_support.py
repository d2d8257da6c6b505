"""What a pull worker needs beyond claim and report (issue 39; docs/api.md, "Pull consumers"): a
job given back after the consumer's retry schedule (`Backoff`), a job given back unstarted
(`Attempted: false`), and `POST …/extend` for a job that runs longer than its lease."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from jobs.models import Job
from jobs.queue.leases import sweep_expired_leases
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from tests.api.test_pull_batch import claim, item, job_for, report, send, snapshot, status_of

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EXTEND_URL = "/channel/orders/consumer/worker/extend"


@pytest.fixture
def schedule(settings):
    settings.BROKER_DELIVERY_TIMEOUT_SECONDS = 30
    settings.BROKER_RATIONAL_DELAY_SECONDS = 2
    settings.BROKER_RETRY_DELAYS = [10, 20]  # three attempts
    settings.BROKER_RETRY_JITTER = 0
    return settings


def test_backoff_makes_the_job_due_after_the_consumers_retry_delay_for_its_attempt(
    client, worker, schedule
):
    with time_machine.travel(T0, tick=False) as traveller:
        job = job_for(worker)

        report(client, item(job, QUEUED, Backoff=True, Error="ERP busy"))

        row = snapshot(job)
        assert (row["status"], row["attempts"]) == (QUEUED, 1)
        assert row["next_attempt_at"] == T0 + timedelta(seconds=10)
        assert row["last_error"] == "given back by the pull consumer: ERP busy"
        traveller.shift(10)
        assert [taken["Attempts"] for taken in claim(client)] == [2]

        report(client, item(job, QUEUED, Backoff=True))
        assert snapshot(job)["next_attempt_at"] == T0 + timedelta(seconds=10 + 20)
        traveller.shift(20)
        assert [taken["Attempts"] for taken in claim(client)] == [3]

        response = report(client, item(job, QUEUED, Backoff=True))

    assert response.json()["Result"] == [{"ID": job.public_id, "Status": 202, "State": DEAD}]
    assert snapshot(job)["last_error"] == "given back by the pull consumer; no attempts left"


def test_a_job_given_back_unstarted_keeps_its_attempts_and_never_dies_of_it(
    client, worker, schedule
):
    schedule.BROKER_RETRY_DELAYS = []  # one attempt: any counted give-back would be DEAD
    with time_machine.travel(T0, tick=False):
        job = job_for(worker)
        for _ in range(3):
            response = report(client, item(job, QUEUED, Attempted=False))
            assert response.json()["Result"] == [
                {"ID": job.public_id, "Status": 202, "State": QUEUED}
            ]
            row = snapshot(job)
            assert (row["status"], row["attempts"], row["next_attempt_at"]) == (QUEUED, 0, T0)
            assert row["last_error"] == "given back unstarted by the pull consumer"
            assert [taken["Attempts"] for taken in claim(client)] == [1]

        report(client, item(job, QUEUED, Attempted=False, IncrementalTimeout=5))

    assert snapshot(job)["next_attempt_at"] == T0 + timedelta(seconds=5)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"Backoff": "yes"}, "Jobs[0].Backoff and Jobs[0].Attempted must be true or false."),
        ({"Attempted": 0}, "Jobs[0].Backoff and Jobs[0].Attempted must be true or false."),
        (
            {"NextState": DEAD, "Backoff": True},
            "Jobs[0]: Backoff and Attempted false are only allowed with NextState QUEUED.",
        ),
        (
            {"NextState": DELIVERED, "Attempted": False},
            "Jobs[0]: Backoff and Attempted false are only allowed with NextState QUEUED.",
        ),
        (
            {"Backoff": True, "IncrementalTimeout": 5},
            "Jobs[0].Backoff excludes IncrementalTimeout and Attempted false.",
        ),
        (
            {"Backoff": True, "Attempted": False},
            "Jobs[0].Backoff excludes IncrementalTimeout and Attempted false.",
        ),
    ],
)
def test_a_bad_backoff_or_attempted_is_400_and_changes_nothing(client, worker, fields, problem):
    job = job_for(worker)

    response = report(client, {**item(job, QUEUED), **fields})

    assert (response.status_code, response.json()) == (400, {"Error": problem})
    assert status_of(job) == INFLIGHT


def extend(client, *leases: tuple[Job | str, int]):
    jobs = [
        {"ID": job if isinstance(job, str) else job.public_id, "Timeout": seconds}
        for job, seconds in leases
    ]
    return send(client, {"Jobs": jobs}, url=EXTEND_URL)


def test_extend_moves_the_end_of_the_lease_so_the_sweep_leaves_the_job(client, worker, schedule):
    with time_machine.travel(T0, tick=False) as traveller:
        job = job_for(worker)  # leased for 32 s
        traveller.shift(30)

        response = extend(client, (job, 60))

        assert response.status_code == 200
        assert response.json()["Result"] == [
            {
                "ID": job.public_id,
                "Status": 202,
                "State": INFLIGHT,
                "LeaseExpiresAt": "2026-01-01T00:01:30Z",
            }
        ]
        assert snapshot(job)["lease_expires_at"] == T0 + timedelta(seconds=90)
        traveller.shift(59)
        assert sweep_expired_leases() == 0
        traveller.shift(2)
        assert sweep_expired_leases() == 1
    assert status_of(job) == QUEUED


def test_extend_answers_each_job_as_a_report_would(client, worker, schedule, channel):
    with time_machine.travel(T0, tick=False) as traveller:
        held, lost = job_for(worker), job_for(worker)
        traveller.shift(33)
        assert sweep_expired_leases() == 2
        assert len(claim(client)) == 2  # both held again; then `lost` is given back
        report(client, item(lost, QUEUED, IncrementalTimeout=600))

        response = extend(client, (held, 10), (lost, 10), ("dc2m8po000000000000g", 10))

    results = response.json()["Result"]
    assert [(r["ID"], r["Status"], r.get("State")) for r in results] == [
        (held.public_id, 202, INFLIGHT),
        (lost.public_id, 400, QUEUED),
        ("dc2m8po000000000000g", 404, None),
    ]
    assert results[1]["Error"] == "The job is QUEUED: its lease ran out before it was extended."
    assert "LeaseExpiresAt" not in results[1]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"Jobs": []}, "Jobs must be a non-empty list."),
        ({"Jobs": ["x"]}, "Jobs[0] must be a JSON object."),
        ({"Jobs": [{"ID": 5, "Timeout": 5}]}, "Jobs[0].ID must be a string."),
        ({"Jobs": [{"ID": "a"}]}, "Jobs[0].Timeout must be 1 to 86400 seconds."),
        ({"Jobs": [{"ID": "a", "Timeout": 0}]}, "Jobs[0].Timeout must be 1 to 86400 seconds."),
        ({"Jobs": [{"ID": "a", "Timeout": 1.5}]}, "Jobs[0].Timeout must be 1 to 86400 seconds."),
        (
            {"Jobs": [{"ID": "a", "Timeout": 5}, {"id": "a", "timeout": 6}]},
            "Jobs[1] names the same job as Jobs[0].",
        ),
    ],
)
def test_a_bad_extend_is_400_naming_the_problem_and_changes_nothing(
    client, worker, schedule, body, problem
):
    with time_machine.travel(T0, tick=False):
        job = job_for(worker)
        response = send(client, body, url=EXTEND_URL)

    assert (response.status_code, response.json()) == (400, {"Error": problem})
    assert snapshot(job)["lease_expires_at"] == T0 + timedelta(seconds=32)


def test_extend_needs_the_consumers_tokens(client, worker):
    job = job_for(worker)

    response = client.post(
        EXTEND_URL, json.dumps({"Jobs": [{"ID": job.public_id, "Timeout": 5}]}), "application/json"
    )

    assert response.status_code == 401


def test_attempts_fence_a_report_and_an_extension_to_the_claim_they_name(client, worker, schedule):
    """Worker A's lease ran out (an outage), the sweep gave the job back and worker B claimed it:
    A's report and extension, naming A's claim by its Attempts, change nothing of B's."""
    with time_machine.travel(T0, tick=False) as traveller:
        job = job_for(worker)  # A's claim: attempt 1
        traveller.shift(33)
        assert sweep_expired_leases() == 1
        assert [taken["Attempts"] for taken in claim(client)] == [2]  # B's claim
        b_lease = snapshot(job)["lease_expires_at"]

        reported = report(client, item(job, QUEUED, Attempts=1, Error="A gives up"))
        extended = extend_attempts(client, job, seconds=600, attempts=1)

        fenced = (
            "The job was claimed again since: it is at attempt 2 now (its lease ran out and"
            " the sweep gave it back); another worker may hold it."
        )
        for response in (reported, extended):
            assert response.json()["Result"] == [
                {"ID": job.public_id, "Status": 409, "State": INFLIGHT, "Error": fenced}
            ]
        row = snapshot(job)
        assert (row["status"], row["attempts"], row["lease_expires_at"]) == (INFLIGHT, 2, b_lease)
        assert row["last_error"] != "given back by the pull consumer: A gives up"
        # B names its own claim: both apply.
        assert (
            extend_attempts(client, job, seconds=60, attempts=2).json()["Result"][0]["Status"]
            == 202
        )
        response = report(client, item(job, DELIVERED, Attempts=2))
    assert response.json()["Result"] == [{"ID": job.public_id, "Status": 202, "State": DELIVERED}]


def extend_attempts(client, job: Job, seconds: int, attempts: int):
    body = {"Jobs": [{"ID": job.public_id, "Timeout": seconds, "Attempts": attempts}]}
    return send(client, body, url=EXTEND_URL)


@pytest.mark.parametrize("attempts", [0, -1, "1", 1.0, True])
def test_attempts_that_name_no_claim_are_400(client, worker, attempts):
    job = job_for(worker)
    problem = "Jobs[0].Attempts must be a whole number from 1: the job's Attempts as claimed."

    reported = report(client, item(job, DELIVERED, Attempts=attempts))
    extended = send(
        client,
        {"Jobs": [{"ID": job.public_id, "Timeout": 5, "Attempts": attempts}]},
        url=EXTEND_URL,
    )

    for response in (reported, extended):
        assert (response.status_code, response.json()) == (400, {"Error": problem})
    assert status_of(job) == INFLIGHT
