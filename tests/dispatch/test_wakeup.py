"""Waking `manage.py dispatch` as a real process (docs/dispatcher.md, "Waking up"): an idle one
guards and is woken by a NOTIFY; a busy one does not guard, so publishes send none; a publish
whose transaction is open while the dispatcher goes idle is not lost; a dispatcher killed while
guarding takes its guard along. Each dispatcher polls every 30 s only: what goes out sooner was
woken by the protocol, not by the poll."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from broker import publish
from jobs.models import DispatcherHeartbeat, Job
from jobs.states import DELIVERED, INFLIGHT
from tests.delivery import push_consumer
from tests.processes import kill_if_running, start_dispatcher, stop, wait_until
from tests.receiver import Reply
from tests.wakeup import guard_holders, listening, notified, session_name

pytestmark = pytest.mark.django_db(transaction=True)

POLL = ("--poll-seconds", "30")
PROMPTLY = 10.0  # seconds: long before the 30 s poll, even on a loaded machine


def delivered(*message_ids: str) -> bool:
    jobs = Job.objects.filter(message__public_id__in=message_ids, status=DELIVERED)
    return jobs.count() == len(message_ids)


def first_request_slow(receiver, seconds: float) -> None:
    """The receiver answers its first request after `seconds`, the others at once."""
    answered: list[bool] = []

    def rule(_request):
        answered.append(True)
        return Reply(200, delay=seconds) if len(answered) == 1 else None

    receiver.rule = rule


def test_an_idle_dispatcher_guards_and_a_publish_wakes_it_with_a_notify(channel, receiver):
    push_consumer(channel, receiver)
    process = start_dispatcher(*POLL)
    try:
        wait_until(lambda: len(guard_holders()) == 1, seconds=30)
        with listening() as listener:
            publish(channel, b"x", producer="shop", message_id="woken")
            latency = wait_until(lambda: delivered("woken"), seconds=PROMPTLY)
            notices = notified(listener, 0.2)
        wait_until(lambda: len(guard_holders()) == 1, seconds=PROMPTLY)  # idle again: guards
        stop(process)
    finally:
        kill_if_running(process)
    assert notices == ["broker_jobs"]
    assert latency < PROMPTLY


def test_a_dispatcher_without_room_does_not_guard_and_publishes_send_no_notify(channel, receiver):
    push_consumer(channel, receiver)
    first_request_slow(receiver, 2.0)
    process = start_dispatcher(*POLL, "--concurrency", "1")
    try:
        wait_until(lambda: len(guard_holders()) == 1, seconds=30)
        publish(channel, b"x", producer="shop", message_id="slow")
        wait_until(lambda: len(receiver.received) == 1, seconds=PROMPTLY)  # its one slot taken
        holders_while_busy = guard_holders()
        with listening() as listener:
            for number in range(5):
                publish(channel, b"x", producer="shop", message_id=f"busy-{number}")
            notices = notified(listener, 0.3)
        busy = [f"busy-{number}" for number in range(5)]
        wait_until(lambda: delivered("slow", *busy), seconds=PROMPTLY)
        stop(process)
    finally:
        kill_if_running(process)
    assert holders_while_busy == []
    assert notices == []


def test_a_publish_uncommitted_while_the_dispatcher_goes_idle_is_delivered_promptly(
    channel, receiver
):
    """The lost wake-up: the publish skips its NOTIFY (nobody guards while the dispatcher is
    busy), and its transaction is still open when the dispatcher runs out of work. The
    dispatcher cannot guard until it commits, so it keeps claiming, and takes the job soon after
    the commit."""
    push_consumer(channel, receiver)
    first_request_slow(receiver, 1.5)
    process = start_dispatcher(*POLL, "--concurrency", "1")
    opened, commit = threading.Event(), threading.Event()

    def producer() -> None:
        try:
            with transaction.atomic():  # the outbox: a publish inside the producer's transaction
                publish(channel, b"x", producer="shop", message_id="in-transaction")
                opened.set()
                commit.wait(30)
        finally:
            connection.close()

    publishing = threading.Thread(target=producer)
    try:
        wait_until(lambda: len(guard_holders()) == 1, seconds=30)
        publish(channel, b"x", producer="shop", message_id="slow")
        wait_until(lambda: len(receiver.received) == 1, seconds=PROMPTLY)  # busy: no guard
        with listening() as listener:
            publishing.start()
            assert opened.wait(PROMPTLY)
            wait_until(lambda: delivered("slow"), seconds=PROMPTLY)  # now it runs out of work
            time.sleep(0.5)  # and claims again and again, unable to guard
            holders_while_open = guard_holders()
            commit.set()
            latency = wait_until(lambda: delivered("in-transaction"), seconds=PROMPTLY)
            notices = notified(listener, 0.2)
        wait_until(lambda: len(guard_holders()) == 1, seconds=PROMPTLY)  # guards once more
        stop(process)
    finally:
        commit.set()
        if publishing.is_alive() or publishing.ident:
            publishing.join(30)
        kill_if_running(process)
    assert holders_while_open == []
    assert notices == []  # no NOTIFY: the dispatcher's claims found the job
    assert latency < PROMPTLY


def test_a_dispatcher_killed_while_guarding_leaves_the_guard_to_the_other(channel, receiver):
    push_consumer(channel, receiver)
    processes = [start_dispatcher(*POLL), start_dispatcher(*POLL)]
    try:
        wait_until(lambda: DispatcherHeartbeat.objects.count() == 2, seconds=60)
        wait_until(lambda: len(guard_holders()) == 1, seconds=30)
        names = {
            session_name(beat.dispatcher_id): beat.pid for beat in DispatcherHeartbeat.objects.all()
        }
        guard = names[guard_holders()[0]]
        victim = next(p for p in processes if p.pid == guard)
        survivor = next(p for p in processes if p.pid != guard)
        victim.kill()
        victim.wait(10)
        taken_over = wait_until(lambda: len(guard_holders()) == 1, seconds=PROMPTLY)
        holders = guard_holders()
        started = time.monotonic()
        publish(channel, b"x", producer="shop", message_id="after-the-kill")
        publish_seconds = time.monotonic() - started
        latency = wait_until(lambda: delivered("after-the-kill"), seconds=PROMPTLY)
        stop(survivor)
    finally:
        kill_if_running(*processes)
    assert holders == [name for name, pid in names.items() if pid == survivor.pid]
    assert taken_over < PROMPTLY
    assert publish_seconds < PROMPTLY  # a publish never waits for the guard
    assert latency < PROMPTLY
    assert not Job.objects.filter(status=INFLIGHT).exists()
