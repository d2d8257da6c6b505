"""How one dispatcher shares its delivery slots among push consumers (docs/dispatcher.md, "Fair
share"), so that consumers that answer slowly, or not at all, cannot take the slots the others
need. A consumer's `maxInFlight` stays its upper bound across all dispatchers; this decides how
much of it one dispatcher actually hands out.

Each consumer is, at this dispatcher, one of:
- **new**: it has not answered here yet. New consumers may be handed `new_room` jobs each, and
  all of them together a quarter of the slots (`new_share`), so that nobody can fill the
  dispatcher before their first answers say what they are.
- **slow**: one of its deliveries here has been in flight, or its last answer took, longer than
  `slow_seconds`. Slow consumers share `slow_share` of the slots (half by default) equally among
  them: whatever they do, the other half stays for everybody else.
- **proven**: it answered, and fast.

A consumer's own limit moves as TCP's congestion window does (additive increase, multiplicative
decrease): one more for every answer that shows it up (a 2xx, or a 4xx of its own), halved by
every attempt that found it unavailable (jobs/retry.py `is_unavailable`), between 1 and the
dispatcher's concurrency. A slow consumer still grows to its share, so a receiver that is slow
but alone gets half the dispatcher, never the whole of it.

Plain bookkeeping in the dispatcher's memory: every dispatcher keeps its own, so the shares hold
for each of them and so for all together. Nothing here touches the database.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from broker.payloads import PAYLOAD_MISSING
from jobs.delivery import REQUEST_ERROR, STORAGE_ERROR, AttemptResult
from jobs.queue import ClaimedJob, ClaimRooms
from jobs.retry import is_unavailable

# Failed attempts that say nothing of the consumer (as for its circuit breaker): cut off at the
# dispatcher's shutdown, no request made, the payload storage failing or the payload gone.
NOT_THE_CONSUMERS_DOING = frozenset({"shutdown", REQUEST_ERROR, STORAGE_ERROR, PAYLOAD_MISSING})


@dataclass
class FairShare:
    concurrency: int
    slow_seconds: float = 1.0
    slow_share: float = 0.5
    new_share: float = 0.25
    # consumer -> job ID -> when its request went on the wire (monotonic; None: not yet)
    _in_flight: dict[int, dict[int, float | None]] = field(default_factory=dict)
    _consumer_of: dict[int, int] = field(default_factory=dict)  # job ID -> consumer ID
    _limits: dict[int, float] = field(default_factory=dict)  # of consumers that answered here
    _slow_answers: set[int] = field(default_factory=set)  # whose last answer was slow

    @property
    def new_room(self) -> int:
        return max(1, math.floor(self.concurrency * self.new_share))

    def claimed(self, jobs: Iterable[ClaimedJob]) -> None:
        for job in jobs:
            self._in_flight.setdefault(job.consumer_id, {})[job.job_id] = None
            self._consumer_of[job.job_id] = job.consumer_id

    def sending(self, consumer_id: int, job_id: int) -> None:
        """The job's request goes out now (after its rate limit slot, if it waited for one)."""
        jobs = self._in_flight.get(consumer_id)
        if jobs is not None and job_id in jobs:
            jobs[job_id] = time.monotonic()

    def finished(self, results: Iterable[AttemptResult]) -> None:
        """Attempts whose outcome is being recorded: their slots are free, their answers counted,
        once each (a result recorded again, after a failed batch or a database outage, is no
        longer in flight here and counts no more)."""
        for result in results:
            if not self._forget(result.job_id) or result.error_class in NOT_THE_CONSUMERS_DOING:
                continue
            limit = self._limits.get(result.consumer_id, float(self.new_room))
            if result.status_code is not None and not is_unavailable(result):
                limit += 1
            else:
                limit /= 2
            self._limits[result.consumer_id] = min(max(limit, 1.0), self.concurrency)
            if result.duration_ms > self.slow_seconds * 1000:
                self._slow_answers.add(result.consumer_id)
            else:
                self._slow_answers.discard(result.consumer_id)

    def released(self, job_ids: Iterable[int]) -> None:
        """Claimed jobs given back unsent."""
        for job_id in job_ids:
            self._forget(job_id)

    def rooms(self) -> ClaimRooms:
        """What the next claim may hand each consumer."""
        now = time.monotonic()
        slow = {c for c in self._in_flight if self._is_slow(c, now)} | self._slow_answers
        slow_each = max(1, math.floor(self.concurrency * self.slow_share / max(len(slow), 1)))
        rooms: dict[int, int] = {}
        new, new_in_flight = set(), 0
        for consumer_id in self._in_flight.keys() | self._limits.keys():
            held = len(self._in_flight.get(consumer_id, ()))
            limit = self._limits.get(consumer_id, float(self.new_room))
            if consumer_id in slow:
                limit = min(limit, slow_each)
            elif consumer_id not in self._limits:
                new.add(consumer_id)
                new_in_flight += held
            rooms[consumer_id] = max(math.floor(limit) - held, 0)
        budget = max(self.new_room - new_in_flight, 0)
        return ClaimRooms(rooms, frozenset(new), self.new_room, budget)

    def _is_slow(self, consumer_id: int, now: float) -> bool:
        started = self._in_flight.get(consumer_id, {}).values()
        return any(at is not None and now - at > self.slow_seconds for at in started)

    def _forget(self, job_id: int) -> bool:
        """The job is no longer in flight here; False if it was not."""
        consumer_id = self._consumer_of.pop(job_id, None)
        if consumer_id is None:
            return False
        jobs = self._in_flight.get(consumer_id, {})
        jobs.pop(job_id, None)
        if not jobs:
            self._in_flight.pop(consumer_id, None)
        return True
