"""The job page's attempt rows and its "Attempts 3 of 5" agree (issue 38): a circuit's failed
probe, whose attempt is given back, and the attempts before a requeue are marked as not counted
(broker/ui/attempt_history.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from broker import publish
from broker.ui.attempt_history import EARLIER, PROBE, attempt_history
from jobs.models import DeliveryAttempt, Job
from jobs.states import DEAD, DELIVERED, QUEUED
from tests.delivery import push_consumer, run_once
from tests.receiver import Reply

START = timezone.now().replace(microsecond=0) + timedelta(days=1)


def rows(*numbers_and_statuses: tuple[int, int | None]) -> list[DeliveryAttempt]:
    """Attempt rows, oldest first: (attempt number, status code; None: a timeout)."""
    return [
        DeliveryAttempt(
            attempt_number=number,
            started_at=START + timedelta(minutes=index),
            duration_ms=1.0,
            status_code=status,
            error_class="" if status == 200 else "timeout" if status is None else "http-status",
        )
        for index, (number, status) in enumerate(numbers_and_statuses)
    ]


def notes(job: Job, attempts: list[DeliveryAttempt]) -> list[str]:
    return [row.uncounted for row in attempt_history(job, attempts).rows]


def test_attempts_that_each_count_are_not_marked():
    job = Job(status=DEAD, attempts=3)
    assert notes(job, rows((1, 503), (2, None), (3, 503))) == ["", "", ""]


def test_a_probe_given_back_is_marked_where_the_next_attempt_repeats_its_number():
    job = Job(status=DELIVERED, attempts=3)
    history = attempt_history(job, rows((1, 503), (2, 503), (3, None), (3, 200)))
    assert [row.uncounted for row in history.rows] == ["", "", PROBE, ""]
    assert (history.probes, history.earlier) == (1, 0)


def test_a_probe_as_first_attempt_is_marked_too():
    job = Job(status=DELIVERED, attempts=1)
    assert notes(job, rows((1, 503), (1, 503), (1, 200))) == [PROBE, PROBE, ""]


def test_the_latest_probe_is_marked_while_its_job_waits_for_the_circuit():
    waiting = Job(
        status=QUEUED, attempts=2, last_error="HTTP 503; circuit open again, attempt not counted"
    )
    assert notes(waiting, rows((1, 503), (2, 503), (3, 503))) == ["", "", PROBE]
    retrying = Job(status=QUEUED, attempts=3, last_error="HTTP 503")  # counted, due again later
    assert notes(retrying, rows((1, 503), (2, 503), (3, 503))) == ["", "", ""]


def test_attempts_before_a_requeue_are_marked():
    requeued = Job(status=QUEUED, attempts=0)  # not tried again yet
    assert notes(requeued, rows((1, 503), (2, 503))) == [EARLIER, EARLIER]
    tried_again = Job(status=DELIVERED, attempts=2)
    history = attempt_history(tried_again, rows((1, 503), (2, 503), (1, 503), (2, 200)))
    assert [row.uncounted for row in history.rows] == [EARLIER, EARLIER, "", ""]
    assert history.earlier == 2


def test_a_replayed_delivery_starts_the_count_afresh():
    replayed = Job(status=DELIVERED, attempts=1)
    assert notes(replayed, rows((1, 200), (1, 200))) == [EARLIER, ""]


@pytest.mark.django_db
def test_a_real_failed_probe_reads_as_not_counted(
    staff_client, channel, receiver, dispatcher, settings
):
    """Through the dispatcher and the circuit as they record a probe (jobs/queue/circuit.py):
    two failures open the circuit, the half-open probe fails and is given back, and the page's
    count and rows agree."""
    settings.BROKER_RETRY_JITTER = 0
    settings.BROKER_RETRY_DELAYS = [1, 1, 1, 1]  # five attempts
    settings.BROKER_CIRCUIT_FAILURE_THRESHOLD = 2
    settings.BROKER_CIRCUIT_COOLDOWN_SECONDS = 30
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(503)
    publish(channel, b"x", producer="shop")
    for elapsed in (0, 2, 2 + 31):  # two failures open the circuit; the third is the probe
        with time_machine.travel(START + timedelta(seconds=elapsed), tick=False):
            run_once(dispatcher)
    job = Job.objects.get()
    assert (job.status, job.attempts) == (QUEUED, 2)

    response = staff_client.get(f"/ui/jobs/{job.public_id}")

    history = response.context["history"]
    assert [row.attempt.attempt_number for row in history.rows] == [1, 2, 3]
    assert [row.uncounted for row in history.rows] == ["", "", PROBE]
    shown = response.content.decode()
    assert "2 of 5" in shown
    assert "1 circuit probe below not counted" in shown
    assert f'<span class="tag">{PROBE}</span>' in shown
