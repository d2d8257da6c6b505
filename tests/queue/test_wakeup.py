"""The wake-up guard (jobs/queue/wakeup.py, sql/wakeup.sql): publishes NOTIFY only while a
dispatcher guards, a guard cannot be taken while a publish without a NOTIFY is uncommitted, and
the Listener keeps it on its LISTEN connection, which takes it along when it goes."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest
from django.db import connection, transaction

from broker import publish
from jobs.queue import Guard, Listener, wake_dispatchers
from jobs.queue.rules import WAKEUP_CHANNEL, WAKEUP_GUARD_LOCK
from jobs.queue.wakeup import RECONNECT_SECONDS, _connection_kwargs
from tests.helpers import make_consumer
from tests.wakeup import guard_holders, listening, notified, session_name, try_to_guard

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_publish_notifies_only_while_a_dispatcher_guards(channel):
    make_consumer(channel)
    with listening() as listener, psycopg.connect(**_connection_kwargs()) as dispatcher:
        publish(channel, b"x", producer="shop", message_id="nobody-guards")
        unguarded = notified(listener, 0.3)
        assert try_to_guard(dispatcher) == "held"
        publish(channel, b"x", producer="shop", message_id="guarded")
        guarded = notified(listener, 2)
        dispatcher.execute("SELECT pg_advisory_unlock_all()")  # as stop_guarding does
        publish(channel, b"x", producer="shop", message_id="given-back")
        given_back = notified(listener, 0.3)

    assert (unguarded, guarded, given_back) == ([], [WAKEUP_CHANNEL], [])


def test_a_publish_that_makes_no_job_neither_notifies_nor_holds_the_guard(channel):
    with listening(guard=True) as listener, psycopg.connect(**_connection_kwargs()) as other:
        publish(channel, b"x", producer="shop")  # the channel has no consumer
        notices = notified(listener, 0.3)
        listener.execute("SELECT pg_advisory_unlock_all()")
        with transaction.atomic():
            publish(channel, b"x", producer="shop")
            while_open = try_to_guard(other)
    assert (notices, while_open) == ([], "held")


def test_no_guard_while_a_publish_without_a_notify_is_uncommitted(channel):
    make_consumer(channel)
    with (
        psycopg.connect(**_connection_kwargs()) as first,
        psycopg.connect(**_connection_kwargs()) as second,
    ):
        with transaction.atomic():  # a producer's transaction, the outbox way
            publish(channel, b"x", producer="shop")
            while_open = try_to_guard(first)
        after_commit = try_to_guard(first)
        beside_it = try_to_guard(second)

    assert (while_open, after_commit, beside_it) == ("publishing", "held", "held elsewhere")


def test_a_rolled_back_publish_leaves_the_guard_free(channel):
    make_consumer(channel)
    with psycopg.connect(**_connection_kwargs()) as dispatcher:
        with transaction.atomic():
            publish(channel, b"x", producer="shop")
            transaction.set_rollback(True)
        assert try_to_guard(dispatcher) == "held"


def test_a_replay_wakeup_follows_the_guard_too():
    with listening(guard=True) as listener:
        with transaction.atomic():
            wake_dispatchers()
        assert notified(listener, 2) == [WAKEUP_CHANNEL]


def run_listener(check) -> None:
    """Run `check(listener, woken)` on an event loop beside a running Listener."""

    async def scenario() -> None:
        woken = asyncio.Event()
        listener = Listener(woken.set, "wakeup-test")
        running = asyncio.create_task(listener.run())
        try:
            await asyncio.wait_for(woken.wait(), 10)  # connected
            woken.clear()
            await check(listener, woken)
        finally:
            running.cancel()

    # Its own thread: the test's Django connection stays out of the event loop's.
    failures: list[BaseException] = []
    thread = threading.Thread(target=lambda: _run_catching(scenario, failures))
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    if failures:
        raise failures[0]


def _run_catching(scenario, failures: list[BaseException]) -> None:
    try:
        asyncio.run(scenario())
    except BaseException as exc:  # handed to the test's thread
        failures.append(exc)


def notify_once() -> None:
    """A replay's wake-up in a transaction of its own, from outside the event loop's thread."""
    with psycopg.connect(**_connection_kwargs()) as other:
        other.execute("SELECT pg_notify(%s, '')", [WAKEUP_CHANNEL])


def test_the_listener_guards_wakes_on_notify_and_gives_the_guard_back():
    async def check(listener: Listener, woken: asyncio.Event) -> None:
        assert await listener.try_guard() is Guard.HELD
        assert listener.guarding
        assert await guard_holders_now() == [session_name("wakeup-test")]
        await asyncio.to_thread(notify_once)
        await asyncio.wait_for(woken.wait(), 5)  # read between the guard's statements
        await listener.stop_guarding()
        assert not listener.guarding
        assert await guard_holders_now() == []

    run_listener(check)


def test_another_session_guarding_is_told_apart_from_publishes():
    async def check(listener: Listener, woken: asyncio.Event) -> None:
        with psycopg.connect(**_connection_kwargs()) as other:
            assert try_to_guard(other) == "held"
            assert await listener.try_guard() is Guard.HELD_ELSEWHERE
            with other.transaction():
                other.execute("SELECT pg_advisory_unlock_all()")
                other.execute("SELECT pg_advisory_xact_lock_shared(%s)", [WAKEUP_GUARD_LOCK])
                assert await listener.try_guard() is Guard.PUBLISHING
            assert await listener.try_guard() is Guard.HELD

    run_listener(check)


def test_a_lost_listen_connection_takes_the_guard_with_it_and_comes_back():
    async def check(listener: Listener, woken: asyncio.Event) -> None:
        assert await listener.try_guard() is Guard.HELD
        with psycopg.connect(**_connection_kwargs()) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                [session_name("wakeup-test")],
            )
        await asyncio.wait_for(woken.wait(), 5)  # told at once: nobody may guard now
        woken.clear()
        assert not listener.guarding
        assert await guard_holders_now() == []
        await asyncio.wait_for(woken.wait(), RECONNECT_SECONDS + 10)  # listening again
        assert await listener.try_guard() is Guard.HELD

    run_listener(check)


async def guard_holders_now() -> list[str]:
    """guard_holders(), from a thread of its own: Django's ORM stays off the event loop."""

    def look() -> list[str]:
        try:
            return guard_holders()
        finally:
            connection.close()

    return await asyncio.to_thread(look)
