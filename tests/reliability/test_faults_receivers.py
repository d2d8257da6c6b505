"""Receivers that misbehave at the TCP level, against a real `manage.py dispatch` (issue 9).

Every job must end DELIVERED, or DEAD with a reason that says what went wrong, and the dispatcher
must stay within bounded memory while receivers send huge or endless bodies.
"""

from __future__ import annotations

import pytest

from broker import publish
from jobs.curl_multi import EXCERPT_BYTES
from jobs.models import DeliveryAttempt, Job
from jobs.states import DEAD, DELIVERED
from tests.faults import report
from tests.helpers import make_channel, make_consumer, make_producer
from tests.processes import kill_if_running, start_dispatcher, stop, wait_until
from tests.reliability.faulty_receiver import BEHAVIOURS, FaultyReceiver

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = 6
# What each behaviour must end as, and a word its dead jobs' reason must contain.
EXPECTED = {
    "/ok": (DELIVERED, ""),
    "/cut-in-body": (DELIVERED, ""),  # a complete 200 status line is the consumer's answer
    "/trickle-fast": (DELIVERED, ""),
    "/huge-body": (DELIVERED, ""),
    "/endless-body": (DELIVERED, ""),
    "/hang": (DEAD, "no answer within 1 s"),
    "/trickle-slow": (DEAD, "no answer within 1 s"),
    "/cut-in-status-line": (DEAD, "Empty reply from server"),  # libcurl's words
}
MAX_DISPATCHER_RSS_KB = 200 * 1024  # it idles at ~90 MB; six huge bodies read would be 384+


@pytest.fixture
def faulty_receiver():
    running = FaultyReceiver().start()
    yield running
    running.stop()


def peak_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_every_misbehaving_receiver_ends_delivered_or_dead_with_a_reason(faulty_receiver):
    make_producer()
    channel = make_channel()
    for path in BEHAVIOURS:
        consumer = make_consumer(channel, path.strip("/"))
        consumer.callback_url = faulty_receiver.url(path)
        consumer.retry_delays = [0, 0]  # three attempts, back to back
        consumer.save()
    for number in range(MESSAGES):
        publish(channel, b'{"n": %d}' % number, producer="shop", message_id=f"m-{number}")

    dispatcher = start_dispatcher(
        "--concurrency",
        "16",
        BROKER_DELIVERY_TIMEOUT_SECONDS="1",
        BROKER_RETRY_JITTER="0",
        BROKER_CIRCUIT_FAILURE_THRESHOLD="1000",  # this test is about each attempt, not the breaker
    )
    try:
        unfinished = Job.objects.exclude(status__in=[DELIVERED, DEAD])
        wait_until(lambda: not unfinished.exists(), seconds=120)
        peak_kb = peak_rss_kb(dispatcher.pid)
        output = stop(dispatcher)
    finally:
        kill_if_running(dispatcher)
    assert dispatcher.returncode == 0, output

    flapping = Job.objects.filter(consumer__public_id="flap")
    assert flapping.count() == MESSAGES
    for job in flapping.filter(status=DEAD):  # three failures in a row are possible, then dead
        assert job.last_error
    for path, (status, reason) in EXPECTED.items():
        jobs = Job.objects.filter(consumer__public_id=path.strip("/"))
        assert sorted(jobs.values_list("status", flat=True)) == [status] * MESSAGES, path
        for job in jobs:
            assert reason in job.last_error, (path, job.last_error)
            if status == DEAD:
                assert job.attempts == 3
    excerpts = DeliveryAttempt.objects.filter(job__consumer__public_id="huge-body")
    assert all(len(a.response_excerpt) <= EXCERPT_BYTES for a in excerpts)
    assert peak_kb < MAX_DISPATCHER_RSS_KB

    report(
        "misbehaving receivers",
        jobs=Job.objects.count(),
        delivered=Job.objects.filter(status=DELIVERED).count(),
        dead_with_reason=Job.objects.filter(status=DEAD).exclude(last_error="").count(),
        flap_delivered=flapping.filter(status=DELIVERED).count(),
        dispatcher_peak_rss_mb=round(peak_kb / 1024, 1),
    )
