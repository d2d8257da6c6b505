"""Fault isolation inside the dispatcher (issue 14 §2): no failure of one delivery, one result
or one step of the loop ends the loop or holds up other jobs; only a database that is not this
version's ends the process, non-zero and saying why."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import subprocess
import sys
import threading

import pytest
from django.db import connection

from broker import publish
from jobs.dispatch import Dispatcher, DispatcherConfig
from jobs.maintenance import Maintenance
from jobs.models import DeliveryAttempt, Job
from jobs.states import DELIVERED, INFLIGHT
from tests import ROOT
from tests.delivery import send
from tests.helpers import another_session, make_channel, make_consumer, make_producer
from tests.processes import kill_if_running, wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture
def channel(receiver):
    make_producer()
    channel = make_channel()
    for name in ("billing", "audit"):
        consumer = make_consumer(channel, name)
        consumer.callback_url = receiver.url(f"/{name}")
        consumer.save()
    return channel


def test_a_result_the_database_refuses_keeps_only_its_own_job_back(channel, caplog):
    """One result that cannot be recorded (here text with a NUL, which PostgreSQL refuses) must
    not take the batch's other outcomes with it: they are recorded one by one."""
    for number in range(3):
        publish(channel, b"x", producer="shop", message_id=f"m{number}")
    dispatcher = Dispatcher()
    results = send(dispatcher.claim(10))
    poisoned = dataclasses.replace(results[0], status_code=500, response_excerpt="\x00")

    dispatcher.complete([poisoned, *results[1:]])

    assert Job.objects.get(pk=poisoned.job_id).status == INFLIGHT  # left to its lease
    others = Job.objects.exclude(pk=poisoned.job_id)
    assert set(others.values_list("status", flat=True)) == {DELIVERED}
    assert DeliveryAttempt.objects.count() == len(results) - 1
    assert "recording 6 delivery outcomes failed" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_step_that_fails_every_time_is_logged_and_the_loop_delivers_on(
    channel, receiver, monkeypatch, caplog
):
    """A bug in one step of the loop (here the release of scheduled messages) is logged with its
    traceback on every turn, and every other step, claims and deliveries included, goes on."""

    def release_due(self: Maintenance) -> int:
        raise RuntimeError("a bug in the release step")

    monkeypatch.setattr(Maintenance, "release_due", release_due)
    for number in range(10):
        publish(channel, b"x", producer="shop", message_id=f"m{number}")
    dispatcher = Dispatcher(DispatcherConfig(poll_seconds=0.05))
    loop = threading.Thread(target=asyncio.run, args=(dispatcher.run(),))
    caplog.set_level(logging.ERROR, logger="jobs.dispatch")
    loop.start()
    try:
        wait_until(lambda: Job.objects.filter(status=DELIVERED).count() == 20, seconds=60)
    finally:
        dispatcher.stop()
        loop.join(timeout=60)
    assert not loop.is_alive()
    failures = [r for r in caplog.records if "step release_due failed" in r.getMessage()]
    assert failures
    assert failures[0].exc_info is not None
    assert len(receiver.received) == 20


def test_a_database_without_the_schema_stops_the_dispatcher_saying_so():
    """The one reason a dispatcher ends on its own: tables missing (migrations not run). It
    exits non-zero with a message naming the remedy, rather than logging for ever."""
    settings = connection.settings_dict
    empty = f"broker_unmigrated_{threading.get_native_id()}"
    admin = another_session("postgres", autocommit=True)
    admin.execute(f'CREATE DATABASE "{empty}"')
    try:
        url = f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{empty}"
        process = subprocess.Popen(
            [sys.executable, "manage.py", "dispatch"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": url},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            output, _ = process.communicate(timeout=60)
        finally:
            kill_if_running(process)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{empty}" WITH (FORCE)')
        admin.close()
    assert process.returncode == 1, output
    assert "manage.py migrate" in output
    assert "Traceback" not in output


@pytest.mark.django_db(transaction=True)
def test_names_that_never_resolve_do_not_hold_up_other_consumers(receiver, monkeypatch):
    """A tenant's callback names whose DNS never answers (more of them than Python's default
    thread pool has threads) must not keep another consumer's name from resolving."""
    make_producer()
    channel = make_channel()
    for number in range(12):
        consumer = make_consumer(channel, f"stuck-{number}")
        consumer.callback_url = f"http://stuck-{number}.example:80/hook"
        consumer.save()
    polite = make_consumer(channel, "polite")
    polite.callback_url = f"http://localhost:{receiver.port}/hook"
    polite.save()
    released = threading.Event()
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if str(host).startswith("stuck-"):
            released.wait(120)  # a DNS server that does not answer
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    publish(channel, b"x", producer="shop")
    dispatcher = Dispatcher(DispatcherConfig(poll_seconds=0.05))
    loop = threading.Thread(target=asyncio.run, args=(dispatcher.run(),))
    loop.start()
    try:
        wait_until(lambda: Job.objects.filter(consumer=polite, status=DELIVERED).exists(), 60)
    finally:
        released.set()
        dispatcher.stop()
        loop.join(timeout=60)
    assert not loop.is_alive()
