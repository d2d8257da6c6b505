"""A dispatcher's fair share of its slots (jobs/fair_share.py; docs/dispatcher.md, "Fair share"):
consumers that answer slowly cannot take the slots that the others need (issue 36)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from broker import publish
from jobs.delivery import AttemptResult
from jobs.fair_share import FairShare
from jobs.models import Job
from jobs.queue import ClaimedJob, OutgoingMessage
from jobs.states import DELIVERED
from tests.delivery import push_consumer
from tests.helpers import make_channel, make_producer
from tests.processes import kill_if_running, start_dispatcher, wait_until
from tests.receiver import Reply

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def claimed(consumer_id: int, *job_ids: int) -> list[ClaimedJob]:
    message = OutgoingMessage("m", b"", "", "application/json", 0, {})
    return [ClaimedJob(j, NOW, 1, 0, NOW, consumer_id, NOW, NOW, message) for j in job_ids]


def answer(consumer_id: int, job_id: int, status: int | None, seconds: float) -> AttemptResult:
    error = "" if status is not None else "connection"
    return AttemptResult(
        job_id, NOW, 1, consumer_id, NOW, seconds * 1000, status_code=status, error_class=error
    )


def test_consumers_new_to_the_dispatcher_share_a_quarter_of_its_slots():
    share = FairShare(concurrency=128)
    rooms = share.rooms()
    assert (rooms.new_room, rooms.new_budget) == (32, 32)
    share.claimed(claimed(1, *range(20)))
    rooms = share.rooms()
    assert rooms.rooms == {1: 12}
    assert rooms.new == {1}
    assert rooms.new_budget == 12  # the other new consumers get what consumer 1 left


def test_a_consumer_that_answers_grows_and_one_that_is_unavailable_shrinks():
    share = FairShare(concurrency=128)
    share.claimed(claimed(1, 1, 2, 3) + claimed(2, 4, 5))
    share.finished([answer(1, 1, 200, 0.01), answer(1, 2, 404, 0.01), answer(1, 3, 200, 0.01)])
    share.finished([answer(2, 4, 503, 0.01), answer(2, 5, None, 0.01)])
    rooms = share.rooms()
    assert rooms.rooms == {1: 35, 2: 8}  # 32 + 3; 32 / 2 / 2
    assert rooms.new == frozenset()
    assert rooms.new_budget == 32


def test_slow_consumers_together_hold_at_most_half_of_the_slots():
    share = FairShare(concurrency=128, slow_seconds=1.0)
    for consumer_id in (1, 2, 3):
        jobs = range(consumer_id * 1000, consumer_id * 1000 + 10)
        share.claimed(claimed(consumer_id, *jobs))
        share.finished([answer(consumer_id, jobs[0], 200, 25.0)])  # answered, after 25 s
    share.claimed(claimed(4, 4000))
    share.finished([answer(4, 4000, 200, 0.005)])
    rooms = share.rooms()
    # 64 slots for the three slow ones: 21 each, 9 of them already held.
    assert [rooms.rooms[c] for c in (1, 2, 3)] == [12, 12, 12]
    assert rooms.rooms[4] == 33  # a fast consumer is not held back


def test_a_delivery_in_flight_for_longer_than_the_limit_makes_its_consumer_slow():
    share = FairShare(concurrency=16, slow_seconds=0.05, slow_share=0.25)
    share.claimed(claimed(1, 1, 2, 3, 4))
    share.sending(1, 1)
    share.finished([answer(1, job, 200, 0.001) for job in (2, 3, 4)])  # fast: limit 4 + 3
    assert share.rooms().rooms == {1: 6}  # job 1 still in flight
    time.sleep(0.1)
    assert share.rooms().rooms == {1: 3}  # slow now: a quarter of 16, job 1 held


@pytest.mark.django_db(transaction=True)
def test_slow_receivers_do_not_hold_up_another_channels_consumer(receiver):
    """Three consumers whose receivers take 8 s to answer 200, with 450 jobs between them, and a
    healthy consumer of another channel: before, the slow ones took every slot of the dispatcher
    (100 each, 128 slots) and the healthy one's jobs waited for their answers."""
    make_producer()
    slow_channel, healthy_channel = make_channel("slow"), make_channel("healthy")
    for number in range(3):
        receiver.replies[f"/slow{number}"] = Reply(delay=8)
        push_consumer(slow_channel, receiver, f"slow{number}", f"/slow{number}")
    healthy = push_consumer(healthy_channel, receiver, "healthy", "/healthy")
    for number in range(150):
        publish(slow_channel, b"{}", producer="shop", message_id=f"s{number}")
    process = start_dispatcher()
    try:
        wait_until(lambda: len(receiver.received) >= 20, 30)  # the slow ones hold slots
        time.sleep(1.5)  # and have been in flight for longer than a second
        for number in range(100):
            publish(healthy_channel, b"{}", producer="shop", message_id=f"h{number}")
        delivered = Job.objects.filter(consumer=healthy, status=DELIVERED)
        took = wait_until(lambda: delivered.count() == 100, 30)
    finally:
        kill_if_running(process)
    assert took < 4, f"the healthy consumer waited {took:.1f} s for slots"
    slow_sent = sum(r.path.startswith("/slow") for r in receiver.received)
    assert slow_sent <= 64 + 3, "slow consumers hold at most half of the 128 slots"
