"""The dispatcher's half of the wake-up protocol, step by step (jobs/dispatch_idle.py): its claims
are run here, its waits and its guard on an event loop of their own with a real LISTEN
connection, and a producer's transaction in a thread, so that each race is played in the order
the test chooses. The dispatcher polls every POLL_SECONDS only: a wait that ends sooner, with
nothing to wake it, is the protocol's."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

from broker import publish
from jobs.dispatch import Dispatcher, DispatcherConfig
from jobs.dispatch_idle import FIRST_RETRY_SECONDS, LONGEST_RETRY_SECONDS
from jobs.models import Job
from jobs.queue import Listener
from tests.delivery import push_consumer
from tests.wakeup import guard_holders, session_name

pytestmark = pytest.mark.django_db(transaction=True)

POLL_SECONDS = 30.0
SOON = 5.0  # a wait the protocol ends itself: far below the poll, even on a loaded machine

Run = Callable[[Coroutine[Any, Any, Any]], Any]


@contextmanager
def listening_dispatcher() -> Iterator[tuple[Dispatcher, Run]]:
    """A dispatcher with a running Listener on an event loop in a thread; `run` runs a coroutine
    there and returns its result."""
    dispatcher = Dispatcher(DispatcherConfig(poll_seconds=POLL_SECONDS, dispatcher_id="idle"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    connected = threading.Event()
    listener = Listener(connected.set, "idle")
    dispatcher.idle.listener = listener

    def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(2 * POLL_SECONDS)

    async def start() -> asyncio.Task[None]:
        return asyncio.create_task(listener.run())

    async def stop(listening: asyncio.Task[None]) -> None:
        listening.cancel()  # its connection closes, and the guard goes
        with contextlib.suppress(asyncio.CancelledError):
            await listening

    listening = run(start())
    try:
        assert connected.wait(10)
        yield dispatcher, run
    finally:
        run(stop(listening))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def listener_of(dispatcher: Dispatcher) -> Listener:
    assert dispatcher.idle.listener is not None
    return dispatcher.idle.listener


def timed_wait(dispatcher: Dispatcher, run: Run) -> float:
    """How long the loop's wait lasts when nothing wakes it."""

    async def wait() -> float:
        started = time.monotonic()
        await dispatcher.idle.wait(asyncio.Event(), POLL_SECONDS)
        return time.monotonic() - started

    return float(run(wait()))


@contextmanager
def open_publish(channel, message_id: str) -> Iterator[None]:
    """A publish inside a producer's transaction in another session, open until the block ends,
    then committed."""
    opened, commit = threading.Event(), threading.Event()

    def producer() -> None:
        try:
            with transaction.atomic():
                publish(channel, b"x", producer="shop", message_id=message_id)
                opened.set()
                commit.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        assert opened.wait(10)
        yield
    finally:
        commit.set()
        thread.join(30)


def test_a_publish_committed_between_an_empty_claim_and_the_guard_is_claimed_at_once(
    channel, receiver
):
    push_consumer(channel, receiver)
    with listening_dispatcher() as (dispatcher, run):
        with open_publish(channel, "late"):
            assert dispatcher.claim(10) == []  # not committed yet
        # Committed without a NOTIFY (nobody guarded), after the claim that came back empty:
        # the dispatcher takes the guard now, and must look once more before it sleeps.
        run(dispatcher.idle.claimed(0, 10))
        guarding = listener_of(dispatcher).guarding
        waited = timed_wait(dispatcher, run)
        claimed = dispatcher.claim(10)
        run(dispatcher.idle.claimed(len(claimed), 10))
        given_back = not listener_of(dispatcher).guarding
    assert guarding
    assert waited < SOON
    assert message_ids(claimed) == ["late"]
    assert given_back  # it has work: publishes may commit without a NOTIFY again


def test_while_a_publish_without_a_notify_is_open_the_dispatcher_claims_again_backing_off(
    channel, receiver
):
    push_consumer(channel, receiver)
    with listening_dispatcher() as (dispatcher, run):
        with open_publish(channel, "outbox"):
            waits = []
            for _ in range(6):
                assert dispatcher.claim(10) == []
                run(dispatcher.idle.claimed(0, 10))
                waits.append(timed_wait(dispatcher, run))
            holders = guard_holders()
        claimed = dispatcher.claim(10)  # the first claim after the commit takes it
    assert holders == []
    assert waits[0] >= FIRST_RETRY_SECONDS
    assert all(wait < LONGEST_RETRY_SECONDS + SOON for wait in waits)
    assert sum(waits) >= FIRST_RETRY_SECONDS * 31  # 5, 10, 20, 40, 50, 50 ms: it backs off
    assert message_ids(claimed) == ["outbox"]


def test_an_idle_dispatcher_guards_and_waits_for_the_poll_or_a_notify(channel, receiver):
    push_consumer(channel, receiver)
    with listening_dispatcher() as (dispatcher, run):
        assert dispatcher.claim(10) == []
        run(dispatcher.idle.claimed(0, 10))  # guards, then must claim once more at once
        assert timed_wait(dispatcher, run) < SOON
        assert dispatcher.claim(10) == []
        run(dispatcher.idle.claimed(0, 10))  # guarding: it waits
        holders = guard_holders()

        async def woken_by_a_publish() -> float:
            woken = asyncio.Event()
            listener_of(dispatcher).wake = woken.set
            started = time.monotonic()
            await asyncio.to_thread(publish_and_close, channel)
            await dispatcher.idle.wait(woken, POLL_SECONDS)
            return time.monotonic() - started

        waited = run(woken_by_a_publish())
    assert holders == [session_name("idle")]
    assert waited < SOON


def publish_and_close(channel) -> None:
    try:
        publish(channel, b"x", producer="shop", message_id="wakes")
    finally:
        connection.close()


def message_ids(requests) -> list[str]:
    jobs = Job.objects.filter(pk__in=[request.job_id for request in requests])
    return list(jobs.values_list("message__public_id", flat=True))
