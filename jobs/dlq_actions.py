"""Requeue and purge of a consumer's whole dead-letter queue, however big (docs/api.md,
"Dead-letter queue"; docs/housekeeping.md).

One UPDATE or DELETE of a million dead jobs holds their locks for half a minute or more. Here an
action goes in batches of BATCH_SIZE jobs (jobs/queue/dead_jobs.py), each one short transaction
together with the action's progress (jobs.DeadLetterAction). The request that asks for it runs
batches for INLINE_SECONDS: a queue emptied by then is answered as it always was. Otherwise the
request hands the action to housekeeping, a django-q2 task queued in the same transaction as the
hand-over (so it cannot get lost between the two), and answers with where to follow it. The task
runs it SLICE_SECONDS at a time, queueing the rest as a new task after each slice, so that the
other housekeeping tasks get their turn.

Whoever runs batches holds the action's lease, which each batch renews. A runner that vanishes (a
crash, a restart) leaves a lease that runs out after LEASE; `resume_actions`, a housekeeping
schedule, then goes on from where the last batch ended. A failed batch is undone with its
progress and retried; after MAX_FAILURES in a row the action is FAILED and says why.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.utils import timezone
from django_q.tasks import async_task  # type: ignore[import-untyped]

from consumers.models import Consumer
from jobs.models import DeadLetterAction
from jobs.queue.dead_jobs import DeadRange, count_range, take_keys, take_range

logger = logging.getLogger(__name__)

REQUEUE, PURGE = DeadLetterAction.Kind.REQUEUE, DeadLetterAction.Kind.PURGE
# Jobs per batch. With a warm cache a requeue costs some 50 microseconds a job (the upkeep of
# about ten indexes), a purge some 20 (bench/scale.py --dlq-actions): about 100 ms a batch, well
# under a second with a cold cache or a busy server too. A batch binds the same few parameters
# whatever its size.
BATCH_SIZE = 2_000
INLINE_SECONDS = 2.0  # of batches in the request that asks, before it hands the rest over
SLICE_SECONDS = 30.0  # of batches in one housekeeping task, before it queues the rest
LEASE = timedelta(seconds=60)  # a runner not heard from for this long is gone
MAX_FAILURES = 3  # failed batches in a row before the action gives up
KEPT = timedelta(days=7)  # a finished action's progress stays readable this long
# A big action yields the database to deliveries: after each batch its runner waits this many
# times as long as the batch took, so that it works at most a quarter of the time. On the 2-core
# bench (bench/scale.py --dlq-actions), a requeue of 1,075,560 dead jobs slowed other consumers'
# deliveries to 64 % of their rate at full speed, to 76 % working 40 % of the time, and left
# them 83 % working a quarter (docs/performance-history.md); an action is a background job,
# deliveries are not.
YIELD_RATIO = 3.0
EARLIEST = datetime(1, 1, 1, tzinfo=UTC)  # where an action without `since` starts


def act_on_queue(
    consumer: Consumer, kind: str, since: datetime | None = None, until: datetime | None = None
) -> DeadLetterAction:
    """Requeue or purge (`kind`) the consumer's jobs that are dead now, those that died at or
    after `since` and before `until` if given: INLINE_SECONDS of it here, the rest handed to
    housekeeping. The action as it stands; one finished here is not kept (no one has its URL)."""
    action = start(consumer, kind, since, until)
    run(action, INLINE_SECONDS)
    if action.finished:
        action.delete()
    else:
        hand_off(action)
    return action


def act_on_jobs(kind: str, keys: Sequence[int]) -> int:
    """Requeue or purge (`kind`) those of the jobs `keys` that are DEAD, BATCH_SIZE of them per
    transaction; how many. For a bounded selection (the operator UI's)."""
    return sum(take_keys(kind, keys[i : i + BATCH_SIZE]) for i in range(0, len(keys), BATCH_SIZE))


def start(
    consumer: Consumer, kind: str, since: datetime | None = None, until: datetime | None = None
) -> DeadLetterAction:
    """A new action, held by this process."""
    now = timezone.now()
    # The bound is exclusive: a microsecond on, for a job that died in this very microsecond.
    died_before = now + timedelta(microseconds=1)
    return DeadLetterAction.objects.create(
        consumer=consumer,
        kind=kind,
        since=since,
        died_before=died_before if until is None else min(until, died_before),
        resume_from=since or EARLIEST,
        runner=_new_runner(),
        lease_expires_at=now + LEASE,
        created_at=now,
        updated_at=now,
    )


def run(action: DeadLetterAction, seconds: float) -> None:
    """Batches of `action` for about `seconds` (at least one), until it is finished, or no
    longer this runner's."""
    deadline = time.monotonic() + seconds
    while paced_step(action) and time.monotonic() < deadline:
        pass


def paced_step(action: DeadLetterAction) -> bool:
    """`step`, then, when more is waiting, a pause that leaves the database to deliveries."""
    started = time.monotonic()
    more = step(action)
    if more:
        yield_to_deliveries(time.monotonic() - started)
    return more


def yield_to_deliveries(batch_seconds: float) -> None:
    time.sleep(YIELD_RATIO * batch_seconds)


def step(action: DeadLetterAction) -> bool:
    """One batch of `action`, in one transaction with its progress; whether more may be waiting
    for this runner. Not when the action is finished, nor when it is no longer this runner's
    (another took it over after its lease ran out, or its consumer was deleted): that batch is
    undone."""
    if action.finished:
        return False
    dead = DeadRange(action.consumer_id, action.resume_from, action.died_before)
    try:
        with transaction.atomic():
            batch = take_range(action.kind, dead, BATCH_SIZE)
            last = batch.picked < BATCH_SIZE
            if not action.record_batch(batch.taken, batch.last_died_at, last=last, lease=LEASE):
                raise _NoLongerOurs
    except _NoLongerOurs:
        return False
    except Exception as error:
        action.record_failure(f"{type(error).__name__}: {error}", give_up_after=MAX_FAILURES)
        raise
    return not action.finished


def hand_off(action: DeadLetterAction) -> None:
    """Give the rest of `action` to housekeeping: estimate its total if not done yet, free its
    lease and queue a task to go on, in one transaction."""
    if not action.runner:  # no longer ours: whoever has it goes on
        return
    with transaction.atomic():
        estimate = None
        if action.estimated_total is None:
            left = count_range(
                DeadRange(action.consumer_id, action.resume_from, action.died_before)
            )
            estimate = action.done + left
        if action.release(estimated_total=estimate):
            async_task(
                "jobs.dlq_actions.continue_action",
                action.pk,
                task_name=f"dead-letter {action.kind} {action.public_id}",
            )
            logger.info(
                "dead-letter %s %s of consumer %s: %d of about %d done, the rest goes on in"
                " housekeeping",
                action.kind,
                action.public_id,
                action.consumer_id,
                action.done,
                action.estimated_total,
            )


def continue_action(action_id: int) -> str:
    """Housekeeping task: SLICE_SECONDS of the action's batches, then the rest queued as a new
    task. Nothing when another runner holds it, or it is finished or gone."""
    action = DeadLetterAction.claim(action_id, _new_runner(), LEASE)
    if action is None:
        return "held by another runner, finished or gone"
    run(action, SLICE_SECONDS)
    if action.finished:
        logger.info(
            "dead-letter %s %s of consumer %s finished: %d jobs in %d batches",
            action.kind,
            action.public_id,
            action.consumer_id,
            action.done,
            action.batches,
        )
    else:
        hand_off(action)
    return f"{action.done} done, {action.state}"


def resume_actions() -> int:
    """Housekeeping schedule: go on with every action whose runner is gone (its lease ran out)
    or that waits for one, and forget actions finished more than KEPT ago. How many it went on
    with."""
    now = timezone.now()
    DeadLetterAction.objects.filter(finished_at__lt=now - KEPT).delete()
    stalled = DeadLetterAction.objects.filter(
        state=DeadLetterAction.State.RUNNING, lease_expires_at__lte=now
    )
    keys = list(stalled.order_by("pk").values_list("pk", flat=True))
    for key in keys:
        try:
            continue_action(key)
        except Exception:  # recorded on the action; the others still get their turn
            logger.exception("dead-letter action %d failed a batch", key)
    return len(keys)


class _NoLongerOurs(Exception):
    """Raised to undo a batch whose progress this runner may no longer record."""


def _new_runner() -> str:
    return secrets.token_hex(16)
