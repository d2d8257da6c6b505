"""Per-producer rate limiting of HTTP broadcasts (`BROKER_BROADCAST_RATE_LIMIT`).

A token bucket kept in the database, so the limit holds across any number of API processes and
machines. It is stored as GCRA (the "generic cell rate algorithm"): one number per producer, the
theoretical arrival time `tat` of its next broadcast. A broadcast at `now` is allowed when
`tat - now <= tolerance`, where `tolerance = (burst - 1) / rate`; it then moves `tat` to
`max(tat, now) + 1 / rate`. That is exactly a bucket of `burst` tokens refilled at `rate` per
second, in a single `INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING`: one round trip and one
row lock per allowed broadcast, and nothing written for a refused one (the conflict's `WHERE`
fails, no row comes back). Concurrent broadcasts of one producer queue on its row for the length
of that statement only, never across the publish.

Times come from the API process's clock (`time.time()`), so API hosts should be NTP-synchronised:
a skew of s seconds between two hosts lets a producer gain or lose up to s seconds of allowance.
`publish()` called in-process is not limited: it runs in the caller's own transaction and process.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import connection

from broker import payloads
from broker.conf import broker_settings

TABLE = "broker_broadcast_rate"  # created by migration 0005_broadcast_rate_buckets


@dataclass(frozen=True)
class Limit:
    rate: float  # broadcasts per second, sustained
    burst: int  # broadcasts allowed at once after a quiet spell

    @property
    def interval(self) -> float:
        return 1.0 / self.rate

    @property
    def tolerance(self) -> float:
        return (self.burst - 1) * self.interval


class OverBurst(Exception):
    """A batch of more broadcasts than the producer's burst: no wait would let it through."""

    def __init__(self, producer_id: str, count: int, burst: int) -> None:
        super().__init__(
            f"The batch has {count} messages; producer {producer_id!r} may send at most {burst}"
            " at once (BROKER_BROADCAST_BURST)."
        )


class RateLimited(Exception):
    """The producer is over its broadcast rate; it may retry after `retry_after` seconds."""

    def __init__(self, producer_id: str, retry_after: int) -> None:
        super().__init__(f"Producer {producer_id!r} is over its broadcast rate limit.")
        self.retry_after = retry_after


def configured_limit() -> Limit | None:
    """The limit from the settings, or None when broadcasts are not limited (rate 0)."""
    rate = float(broker_settings.BROKER_BROADCAST_RATE_LIMIT)
    if rate <= 0:
        return None
    burst = int(broker_settings.BROKER_BROADCAST_BURST) or max(1, math.ceil(rate))
    return Limit(rate, burst)


def take_broadcast(producer_id: str, now: float | None = None) -> None:
    """Count one broadcast of `producer_id`, or raise RateLimited (and count nothing)."""
    limit = configured_limit()
    if limit is None:
        return
    now = time.time() if now is None else now
    if not _take(producer_id, limit, now):
        raise RateLimited(producer_id, _retry_after(producer_id, limit, now))


def take_broadcasts(producer_id: str, count: int, now: float | None = None) -> None:
    """Count `count` broadcasts of `producer_id` at once (a batch: one per message), or raise
    RateLimited and count none: allowed when the last of them would be. OverBurst when `count`
    is more than the burst, which no wait would allow."""
    limit = configured_limit()
    if limit is None:
        return
    if count > limit.burst:
        raise OverBurst(producer_id, count, limit.burst)
    now = time.time() if now is None else now
    if not _take(producer_id, limit, now, count):
        raise RateLimited(producer_id, _retry_after(producer_id, limit, now, count))


@contextmanager
def given_back_if_not_stored(producer_id: str, count: int = 1) -> Iterator[None]:
    """Around the storing of broadcasts already counted: when the broker fails to store them
    (PayloadNotStored, a 507: the payload storage is full or broken), the producer gets their
    allowance back, as it would have if they had never been sent. Refusals of the producer's own
    making (a 400, a 409) stay counted: a flood of them is what the limit is for."""
    try:
        yield
    except payloads.PayloadNotStored:
        limit = configured_limit()
        if limit is not None:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {TABLE} SET tat = tat - %s WHERE producer_id = %s",  # noqa: S608
                    [count * limit.interval, producer_id],
                )
        raise


def _take(producer_id: str, limit: Limit, now: float, cells: int = 1) -> bool:
    """One atomic step of the bucket for `cells` broadcasts; whether they are allowed."""
    later = f"greatest({TABLE}.tat, %(now)s)"  # the later of the stored time and now
    sql = (
        f"INSERT INTO {TABLE} (producer_id, tat) VALUES (%(producer)s, %(first)s)"  # noqa: S608
        f" ON CONFLICT (producer_id) DO UPDATE"
        f" SET tat = {later} + %(cells)s * %(interval)s"
        f" WHERE {later} + %(extra)s - %(now)s <= %(tolerance)s"
        f" RETURNING tat"
    )
    parameters: dict[str, str | float] = {
        "producer": producer_id,
        "first": now + cells * limit.interval,
        "cells": cells,
        "extra": (cells - 1) * limit.interval,  # the last cell's distance from the first
        "now": now,
        "interval": limit.interval,
        "tolerance": limit.tolerance,
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, parameters)
        return cursor.fetchone() is not None


def _retry_after(producer_id: str, limit: Limit, now: float, cells: int = 1) -> int:
    """Whole seconds until the next `cells` broadcasts would be allowed (at least 1)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tat FROM {TABLE} WHERE producer_id = %s", [producer_id])  # noqa: S608
        row = cursor.fetchone()
    extra = (cells - 1) * limit.interval
    wait = (float(row[0]) + extra - now - limit.tolerance) if row else limit.interval
    return max(1, math.ceil(wait))
