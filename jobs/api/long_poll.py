"""Long polls (`POST …/claim` with `wait`) and the web server's threads (issue 36).

A claim that waits holds its request thread until jobs come or its wait is over, and a thread
that waits serves nobody else: with gunicorn's sync workers, as many long-polling pull workers as
the server had processes took it whole (another tenant's broadcast waited 19 s). So a process
lets at most BROKER_PULL_WAITERS_PER_PROCESS claims wait at once, and always fewer than the
threads its server runs requests in (gunicorn says how many: broker/gunicorn_conf.py). A claim
that finds no waiting place free, or a server that is stopping, gets what there is at once, with
the seconds after which to come back (Retry-After), so that its worker neither spins nor waits in
a queue of requests.

Waiting holds no database connection: between polls the thread gives its connections back as
between requests, so that with the pool (a few connections per process) waiting claims cannot
leave the other threads without one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from django.db import connections

from broker.conf import broker_settings

T = TypeVar("T")

# How often a waiting claim looks for jobs: a job is handed out this long after it is queued at
# the latest. With waiting bounded per process, so is the polling: 2 claims x 5 polls a second.
POLL_INTERVAL_SECONDS = 0.2
# What a claim that could not wait is told (Retry-After, whole seconds): about as soon as a
# waiting claim would have seen a new job, and one request a second per worker at most.
COME_BACK_SECONDS = 1


@dataclass
class Polled(Generic[T]):
    """What a long poll found, and when to come back if it could not wait its whole time."""

    found: list[T]
    come_back_seconds: int | None = None


class WaitingPlaces:
    """The claims of this process that may wait at once: one place per waiting claim."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken = 0
        self.server_threads: int | None = None  # None: the server did not say (runserver, tests)
        self.server_stopping: Callable[[], bool] = lambda: False

    def capacity(self) -> int:
        """BROKER_PULL_WAITERS_PER_PROCESS, and one thread always left for other requests."""
        places = broker_settings.BROKER_PULL_WAITERS_PER_PROCESS
        if self.server_threads is not None:
            places = min(places, self.server_threads - 1)
        return max(places, 0)

    def take(self) -> bool:
        with self._lock:
            if self._taken >= self.capacity():
                return False
            self._taken += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self._taken -= 1


waiting_places = WaitingPlaces()


def served_by(threads: int, stopping: Callable[[], bool]) -> None:
    """The web server's word, once per process: it runs requests in `threads` threads, and
    `stopping()` is true once it stops (then waiting claims answer at once, so that they do not
    hold its graceful shutdown)."""
    waiting_places.server_threads = threads
    waiting_places.server_stopping = stopping


def poll(claim: Callable[[], list[T]], deadline: float) -> Polled[T]:
    """`claim()` every POLL_INTERVAL_SECONDS until it finds something or the `deadline`
    (time.monotonic()) is past, if a waiting place is free; else at once, with the seconds after
    which to come back."""
    if not waiting_places.take():
        return Polled([], COME_BACK_SECONDS)
    try:
        while time.monotonic() < deadline:
            if waiting_places.server_stopping():
                return Polled([], COME_BACK_SECONDS)
            _give_back_connections()
            time.sleep(min(POLL_INTERVAL_SECONDS, max(deadline - time.monotonic(), 0)))
            found = claim()
            if found:
                return Polled(found)
        return Polled([])
    finally:
        waiting_places.give_back()


def _give_back_connections() -> None:
    """What Django does between requests (close_old_connections): with the pool, each
    connection goes back to it; without, a thread keeps its own for DATABASE_CONN_MAX_AGE. Not
    inside a transaction (a test's), which it would end."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()
