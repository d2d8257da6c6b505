"""A dispatcher that dies, or freezes, gives its consumers' room back within seconds, not a whole
lease (jobs/queue/dispatchers.py; issue 36)."""

from __future__ import annotations

import signal
import time

import pytest

from broker import publish
from jobs.models import DispatcherHeartbeat, Job
from jobs.states import INFLIGHT
from tests.delivery import push_consumer
from tests.helpers import make_channel, make_producer
from tests.processes import kill_if_running, start_dispatcher, wait_until
from tests.receiver import Reply

pytestmark = pytest.mark.django_db(transaction=True)


def holder(process) -> str:
    """The dispatcher ID of a dispatcher process, from its heartbeat."""
    wait_until(lambda: DispatcherHeartbeat.objects.filter(pid=process.pid).exists(), 30)
    return DispatcherHeartbeat.objects.get(pid=process.pid).dispatcher_id


def slow_consumer_at_its_cap(receiver, delay: float):
    """A consumer whose 4 slots (maxInFlight) the first dispatcher fills with answers `delay`
    seconds away, with 20 more jobs waiting."""
    make_producer()
    channel = make_channel("orders")
    consumer = push_consumer(channel, receiver, max_in_flight=4)
    receiver.replies["/hook"] = Reply(delay=delay)
    for number in range(24):
        publish(channel, b"{}", producer="shop", message_id=f"m{number}")
    return consumer


def delivery_resumed_after(receiver, stop_signal: signal.Signals, seconds: float) -> float:
    """With a second dispatcher beside the one that holds the consumer's 4 slots, send the
    holder `stop_signal`: how long until the consumer's next request. Its jobs have left it."""
    first = start_dispatcher()
    second = None
    try:
        wait_until(lambda: len(receiver.received) == 4, 30)
        held = Job.objects.filter(status=INFLIGHT, claimed_by=holder(first))
        assert held.count() == 4
        second = start_dispatcher()
        holder(second)  # beating, and listening
        time.sleep(1)
        assert len(receiver.received) == 4  # the cap: nothing for the second one
        first.send_signal(stop_signal)
        stopped_at = time.monotonic()
        wait_until(lambda: len(receiver.received) > 4, seconds)
        resumed = time.monotonic() - stopped_at
        assert not held.exists()  # all four with the second dispatcher, or queued
    finally:
        first.send_signal(signal.SIGCONT)  # a frozen one, so that it can be killed
        kill_if_running(first, *([second] if second else []))
    print(f"delivery resumed {resumed:.1f} s after {stop_signal.name}")
    return resumed


def test_a_killed_dispatchers_jobs_go_to_another_within_seconds(receiver):
    """Before, the consumer got nothing for a whole lease (32 s): the dead dispatcher's INFLIGHT
    jobs kept filling its maxInFlight."""
    slow_consumer_at_its_cap(receiver, delay=20)
    resumed = delivery_resumed_after(receiver, signal.SIGKILL, 30)
    assert resumed < 6, f"the consumer got nothing for {resumed:.1f} s"


def test_a_frozen_dispatchers_jobs_go_to_another_before_their_leases_end(receiver):
    """SIGSTOP: its connection stays, its heartbeat stops. Its jobs go to the other dispatcher
    once it has been silent for FROZEN_SECONDS (15 s), not at the end of their lease (32 s)."""
    slow_consumer_at_its_cap(receiver, delay=60)
    resumed = delivery_resumed_after(receiver, signal.SIGSTOP, 40)
    assert resumed < 25, f"the consumer got nothing for {resumed:.1f} s"
