"""`POST …/claim` with `wait` waits only in one of its process's waiting places (issue 36,
jobs/api/long_poll.py); a claim that cannot wait is answered at once, with Retry-After.

The whole server under long-polling workers is in tests/reliability/test_long_polls.py.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlencode

import pytest

from jobs.api.long_poll import waiting_places
from tests.helpers import pull_job, tokens

pytestmark = pytest.mark.django_db

CLAIM = "/channel/orders/consumer/worker/claim"
# Far longer than the answers below take, even on a loaded machine: they must not wait it out.
LONG_WAIT = 15


@pytest.fixture(autouse=True)
def server_unknown(monkeypatch):
    """As under runserver: the server said nothing about its threads, and never stops."""
    monkeypatch.setattr(waiting_places, "server_threads", None)
    monkeypatch.setattr(waiting_places, "server_stopping", lambda: False)


def claim(client, wait: float):
    """A timed claim: (the response, seconds it took)."""
    started = time.monotonic()
    response = client.post(
        CLAIM,
        urlencode({"wait": wait}),
        content_type="application/x-www-form-urlencoded",
        headers=tokens(),
    )
    return response, time.monotonic() - started


def test_a_claim_that_finds_no_waiting_place_answers_at_once_with_retry_after(
    client, worker, settings
):
    settings.BROKER_PULL_WAITERS_PER_PROCESS = 0

    response, seconds = claim(client, LONG_WAIT)

    assert response.status_code == 200
    assert response.json() == {"Result": []}
    assert response["Retry-After"] == "1"
    assert seconds < LONG_WAIT / 3


def test_a_claim_that_finds_jobs_needs_no_waiting_place(client, worker, settings):
    settings.BROKER_PULL_WAITERS_PER_PROCESS = 0
    job = pull_job(worker)

    response, _ = claim(client, LONG_WAIT)

    assert [item["ID"] for item in response.json()["Result"]] == [job.public_id]
    assert "Retry-After" not in response


def test_a_claim_that_waited_its_whole_time_is_not_told_to_come_back(client, worker):
    response, seconds = claim(client, 0.4)

    assert response.json() == {"Result": []}
    assert seconds >= 0.4
    assert "Retry-After" not in response


def test_the_places_are_shared_by_the_claims_of_a_process_and_given_back(client, worker, settings):
    settings.BROKER_PULL_WAITERS_PER_PROCESS = 2
    taken = [waiting_places.take(), waiting_places.take()]  # two claims wait elsewhere
    try:
        refused, seconds = claim(client, LONG_WAIT)
    finally:
        for _ in taken:
            waiting_places.give_back()
    waited, waited_seconds = claim(client, 0.4)

    assert taken == [True, True]
    assert refused["Retry-After"] == "1"
    assert seconds < LONG_WAIT / 3
    assert "Retry-After" not in waited
    assert waited_seconds >= 0.4


@pytest.mark.parametrize(
    ("threads", "setting", "places"),
    [(1, 2, 0), (2, 2, 1), (4, 2, 2), (4, 8, 3), (8, 8, 7), (None, 8, 8), (4, 0, 0)],
)
def test_a_process_always_keeps_a_thread_for_other_requests(
    settings, monkeypatch, threads, setting, places
):
    settings.BROKER_PULL_WAITERS_PER_PROCESS = setting
    monkeypatch.setattr(waiting_places, "server_threads", threads)

    assert waiting_places.capacity() == places


def test_a_sync_gunicorn_worker_lets_no_claim_wait(client, worker, monkeypatch):
    monkeypatch.setattr(waiting_places, "server_threads", 1)  # broker/gunicorn_conf.py's word

    response, seconds = claim(client, LONG_WAIT)

    assert response["Retry-After"] == "1"
    assert seconds < LONG_WAIT / 3


def test_a_stopping_server_answers_its_waiting_claims_at_once(client, worker, monkeypatch):
    stopping = threading.Event()
    monkeypatch.setattr(waiting_places, "server_stopping", stopping.is_set)
    timer = threading.Timer(0.3, stopping.set)  # SIGTERM, while the claim waits
    timer.start()
    try:
        response, seconds = claim(client, LONG_WAIT)
    finally:
        timer.cancel()

    assert response.json() == {"Result": []}
    assert response["Retry-After"] == "1"
    assert 0.3 <= seconds < LONG_WAIT / 3
