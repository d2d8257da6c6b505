"""kill -9 of dispatchers at random moments under load, many times in one run (issue 9).

Three dispatchers share the work; every fraction of a second one of them, picked at random, is
killed with SIGKILL wherever it is (claiming, sending, recording) and a new one takes its place.
At the end every message must have been delivered, and the only repeats allowed are deliveries a
killed dispatcher had in flight: at most its concurrency per kill.
"""

from __future__ import annotations

import random
import subprocess
import time

import pytest

from broker import publish
from jobs.models import Job
from jobs.states import DELIVERED
from tests.faults import report
from tests.helpers import make_channel, make_consumer, make_producer
from tests.processes import kill_if_running, start_dispatcher, stop, wait_until
from tests.receiver import Reply

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = 6000
DISPATCHERS = 3
KILLS = 15
CONCURRENCY = 8
# Short leases so a killed dispatcher's jobs come back within seconds, yet long enough that a
# live dispatcher slowed down by the others starting on 2 cores never loses its own leases
# (which would add repeats no kill caused).
FAST_LEASES = {"BROKER_DELIVERY_TIMEOUT_SECONDS": "5", "BROKER_RATIONAL_DELAY_SECONDS": "1"}


def start() -> subprocess.Popen[str]:
    return start_dispatcher("--concurrency", str(CONCURRENCY), **FAST_LEASES)


@pytest.mark.slow  # two minutes of dispatchers killed and started again
def test_repeated_kill_9_of_random_dispatchers_loses_nothing(receiver):
    seed = random.randrange(1_000_000)  # noqa: S311 (a reproducible kill schedule, not a secret)
    chance = random.Random(seed)  # noqa: S311
    make_producer()
    channel = make_channel()
    consumer = make_consumer(channel)
    consumer.callback_url = receiver.url()
    consumer.save()
    receiver.replies["/hook"] = Reply(200, delay=0.05)  # keeps every dispatcher's slots busy
    for number in range(MESSAGES):
        publish(channel, b"x", producer="shop", message_id=f"m-{number}")

    started = time.monotonic()
    dispatchers = [start() for _ in range(DISPATCHERS)]
    killed: list[subprocess.Popen[str]] = []
    try:
        wait_until(lambda: len(receiver.received) >= 200, seconds=60)
        for _ in range(KILLS):
            time.sleep(chance.uniform(0.2, 1.2))
            victim = dispatchers.pop(chance.randrange(len(dispatchers)))
            victim.kill()
            victim.wait(timeout=10)
            killed.append(victim)
            dispatchers.append(start())
        kills_done_at = len(receiver.received)
        delivered = Job.objects.filter(status=DELIVERED)
        wait_until(lambda: delivered.count() == MESSAGES, seconds=180)
        outputs = [stop(dispatcher) for dispatcher in dispatchers]
    finally:
        kill_if_running(*dispatchers, *killed)
    assert [d.returncode for d in dispatchers] == [0] * DISPATCHERS, outputs

    delivered_ids = [request.headers["X-Broker-Message-ID"] for request in receiver.received]
    duplicates = len(delivered_ids) - len(set(delivered_ids))
    report(
        "kill -9 of random dispatchers",
        seed=seed,
        kills=KILLS,
        messages=MESSAGES,
        delivered_before_last_kill=kills_done_at,
        duplicate_deliveries=duplicates,
        seconds=round(time.monotonic() - started, 1),
    )
    assert kills_done_at < MESSAGES, "the kills must happen under load"
    assert set(delivered_ids) == {f"m-{number}" for number in range(MESSAGES)}
    assert duplicates <= KILLS * CONCURRENCY
    assert not Job.objects.exclude(status=DELIVERED).exists()
