"""How much schema checking one producer may have a web process do
(`BROKER_SCHEMA_STEPS_PER_SECOND`, docs/configuration.md, "Schema checking allowance").

A single publish is bounded by broker/schema_budget.py (at most MAX_VALIDATION_STEPS). That bound
alone lets a producer sending costly payloads back to back, each within it, keep the process busy
checking them, at the expense of every other producer's broadcasts (issue 36: `uniqueItems` over
4,000 objects, about 16 ms each). So each producer also has an allowance of steps per second:

- before a publish's payloads are checked, the producer must not be in debt, else the publish is
  refused (`429` with `Retry-After`) before any of its work is done;
- once checked, the steps the publish spent are charged, refused payloads included.

The allowance is GCRA over steps (as broker/ratelimit.py over broadcasts): `due`, per producer, is
when the steps charged so far are paid for at `rate`; a producer is refused while
`due - now > TOLERANCE_SECONDS`. As the check comes before the work and the charge after, a quiet
producer can always make one publish, however costly (up to MAX_VALIDATION_STEPS: 8 s of debt at
the default rate); the tolerance lets the cheap publishes of a burst, sent together, all in.
It is kept in each process's memory: the work it bounds is that
process's CPU, and a check of it costs no round trip. N web processes give a producer N times the
allowance. In-process `publish()` (the outbox) runs in the caller's process and is not metered.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from broker.conf import broker_settings
from broker.schema_budget import Budget

TOLERANCE_SECONDS = 0.25  # of debt: 125 typical events at once at the default rate
MAX_PRODUCERS_KEPT = 10_000  # then the producers out of debt are forgotten
clock = time.monotonic  # seconds; tests set their own


class OverAllowance(Exception):
    """The producer has used its allowance of schema checking for now: 429 with Retry-After."""

    def __init__(self, producer_id: str, retry_after: int) -> None:
        super().__init__(
            f"Producer {producer_id!r} has used its allowance of schema checking"
            " (BROKER_SCHEMA_STEPS_PER_SECOND steps a second in each web process);"
            f" retry after {retry_after} s."
        )
        self.retry_after = retry_after


class Allowances:
    """Every producer's `due` time in this process (time.monotonic() seconds)."""

    def __init__(self) -> None:
        self._due: dict[str, float] = {}
        self._lock = threading.Lock()  # gthread workers publish from several threads

    def check(self, producer_id: str, now: float) -> None:
        """OverAllowance while the producer is more than TOLERANCE_SECONDS in debt."""
        with self._lock:
            debt = self._due.get(producer_id, now) - now
        if debt > TOLERANCE_SECONDS:
            raise OverAllowance(producer_id, max(1, math.ceil(debt - TOLERANCE_SECONDS)))

    def charge(self, producer_id: str, rate: float, steps: int, now: float) -> None:
        with self._lock:
            if len(self._due) >= MAX_PRODUCERS_KEPT:
                self._due = {key: due for key, due in self._due.items() if due > now}
            self._due[producer_id] = max(self._due.get(producer_id, now), now) + steps / rate


ALLOWANCES = Allowances()
_BUDGETS: ContextVar[list[Budget] | None] = ContextVar("schema_budgets", default=None)


def publish_budget() -> Budget:
    """A publish's budget of steps; inside `metered`, its spending is charged to the producer."""
    budget = Budget()
    metered_budgets = _BUDGETS.get()
    if metered_budgets is not None:
        metered_budgets.append(budget)
    return budget


def refuse_if_in_debt(producer_id: str) -> None:
    """OverAllowance while `producer_id` is in debt. Called first thing by a typed broadcast,
    before its tokens are looked up: a refusal then costs no round trip, however many are sent
    (it tells a caller without the tokens no more than that the producer is busy)."""
    if broker_settings.BROKER_SCHEMA_STEPS_PER_SECOND > 0:
        ALLOWANCES.check(producer_id, clock())


@contextmanager
def metered(producer_id: str) -> Iterator[None]:
    """Around an HTTP publish of `producer_id`: OverAllowance at once while it is in debt, and
    the steps its schema checks spent charged when it ends, however it ends."""
    rate = float(broker_settings.BROKER_SCHEMA_STEPS_PER_SECOND)
    if rate <= 0:
        yield
        return
    refuse_if_in_debt(producer_id)
    budgets: list[Budget] = []
    token = _BUDGETS.set(budgets)
    try:
        yield
    finally:
        _BUDGETS.reset(token)
        spent = sum(budget.steps - max(budget.left, 0) for budget in budgets)
        if spent:
            ALLOWANCES.charge(producer_id, rate, spent, clock())
