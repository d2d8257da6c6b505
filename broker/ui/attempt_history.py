"""A job's attempt rows on its page, each marked when it does not count towards the job's
"Attempts 3 of 5" (docs/ui.md, "Job").

The job's `attempts` counts the attempts since it last joined the queue as new work, while its
DeliveryAttempt rows are every push attempt ever recorded. Two kinds of row are not counted, and
the rows alone say which (no column records it):
- a circuit's failed half-open probe (jobs/queue/circuit.py): its row is written with the next
  attempt number, and the attempt is given back, so the job's next attempt has the same number
  again; until then the job waits QUEUED, its last error ending in PROBE_NOT_COUNTED;
- attempts before a requeue or a replay, which start the count afresh: the numbers start at 1
  again, or the job has used fewer attempts than its latest rows number.
A first attempt that found the consumer unavailable, followed by another first attempt, reads as
a probe: a requeue right after such an attempt leaves the same rows, and is far rarer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jobs.models import DeliveryAttempt, Job
from jobs.queue.circuit import PROBE_NOT_COUNTED
from jobs.retry import shows_unavailable
from jobs.states import QUEUED

PROBE = "circuit probe, not counted"
EARLIER = "before a requeue, not counted"


@dataclass(frozen=True)
class HistoryRow:
    attempt: DeliveryAttempt
    uncounted: str  # why it does not count towards the job's attempts (PROBE, EARLIER), or ""


@dataclass(frozen=True)
class AttemptHistory:
    rows: list[HistoryRow]

    @property
    def probes(self) -> int:
        return sum(row.uncounted == PROBE for row in self.rows)

    @property
    def earlier(self) -> int:
        return sum(row.uncounted == EARLIER for row in self.rows)


def attempt_history(job: Job, attempts: Sequence[DeliveryAttempt]) -> AttemptHistory:
    """The job's attempts, oldest first, each with why it is not counted (if it is not)."""
    notes = [""] * len(attempts)
    start = 0  # the first row since the job last joined the queue as new work
    for index in range(1, len(attempts)):
        before, number = attempts[index - 1], attempts[index].attempt_number
        if number == before.attempt_number and _found_unavailable(before):
            notes[index - 1] = PROBE  # the attempt was given back: the next one has its number
        elif number <= before.attempt_number:
            start = index  # counting started afresh: a requeue or a replay
    if attempts and _waits_after_a_probe(job, attempts[-1]):
        notes[-1] = PROBE
    counted = [attempts[i] for i in range(start, len(attempts)) if not notes[i]]
    if counted and counted[-1].attempt_number > job.attempts:
        start = len(attempts)  # requeued or replayed since its latest counted attempt
    for index in range(start):
        notes[index] = notes[index] or EARLIER
    return AttemptHistory([HistoryRow(a, note) for a, note in zip(attempts, notes, strict=True)])


def _found_unavailable(attempt: DeliveryAttempt) -> bool:
    return shows_unavailable(attempt.status_code, attempt.error_class)


def _waits_after_a_probe(job: Job, latest: DeliveryAttempt) -> bool:
    """Whether the latest attempt was a failed probe whose job waits for the circuit to
    half-open again: the job is QUEUED with that attempt given back, and says so."""
    return (
        job.status == QUEUED
        and latest.attempt_number == job.attempts + 1
        and job.last_error.endswith(PROBE_NOT_COUNTED)
    )
