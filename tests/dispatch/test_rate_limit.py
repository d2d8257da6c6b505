"""The dispatcher's side of the delivery rate limit (docs/delivery.md, "Rate limit"): a claimed
job goes no earlier than the slot its claim booked; one never sent gives its slot back unused
and its attempt too. The booking itself: tests/queue/test_rate_limit.py."""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta

import pytest

from broker import publish
from jobs.delivery import AttemptResult, open_sender
from jobs.dispatch import Dispatcher
from jobs.models import Job
from jobs.states import QUEUED
from tests.delivery import push_consumer
from tests.receiver import Reply

pytestmark = pytest.mark.django_db


def send_as_the_loop_does(dispatcher: Dispatcher, requests) -> list[AttemptResult | None]:
    async def all_of_them() -> list[AttemptResult | None]:
        async with open_sender(len(requests)) as sender:
            sends = (dispatcher._send(sender, request) for request in requests)
            return list(await asyncio.gather(*sends))

    return asyncio.run(all_of_them())


def test_each_job_goes_no_earlier_than_its_slot(channel, receiver, dispatcher):
    push_consumer(channel, receiver, max_per_second=4)
    for n in range(6):
        publish(channel, f"m-{n}".encode(), producer="shop", message_id=f"m-{n}")

    requests = dispatcher.claim(10)

    assert len(requests) == 4  # one second's worth of slots, a quarter of a second apart
    slots = [request.send_at for request in requests]
    assert [later - earlier for earlier, later in itertools.pairwise(slots)] == [
        timedelta(seconds=0.25)
    ] * 3
    send_as_the_loop_does(dispatcher, requests)
    arrived = {r.headers["X-Broker-Message-ID"]: r.at for r in receiver.received}
    for request in requests:
        assert arrived[request.headers["X-Broker-Message-ID"]] >= request.send_at
    assert Job.objects.filter(status=QUEUED, attempts=0).count() == 2  # held back, no attempt


def test_a_429_with_retry_after_holds_back_the_jobs_waiting_for_their_slots(
    channel, receiver, dispatcher
):
    push_consumer(channel, receiver, max_per_second=4)
    receiver.replies["/hook"] = Reply(429, {"Retry-After": "30"})
    for n in range(4):
        publish(channel, f"m-{n}".encode(), producer="shop", message_id=f"m-{n}")
    first, *waiting = dispatcher.claim(10)

    [answer] = send_as_the_loop_does(dispatcher, [first])
    held = send_as_the_loop_does(dispatcher, waiting)

    assert answer is not None
    assert answer.status_code == 429
    assert held == [None, None, None]  # not sent: given back by the loop, without an attempt
    assert len(receiver.received) == 1
    due_times = dict(Job.objects.values_list("pk", "next_attempt_at"))
    assert dispatcher.release([(r.job_id, r.partition_at) for r in waiting]) == 3
    released = Job.objects.filter(status=QUEUED, attempts=0)
    assert released.count() == 3
    for job in released:  # in their place in the queue, not behind the backlog
        assert job.next_attempt_at == due_times[job.pk]
