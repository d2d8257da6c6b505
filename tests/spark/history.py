"""A known delivery history for the pipeline's tests, and the report computed from it in plain
Python (the independent computation the Spark figures are checked against).

Several days and hours, two channels, push and pull consumers, retries, dead jobs, jobs still
queued or in flight, requeued jobs (attempt counter below their attempt rows), scheduled
messages and messages without consumers. Random, from a fixed seed.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from broker.models import Message
from consumers.models import Consumer
from jobs.models import DeliveryAttempt, Job
from tests.helpers import make_channel, make_consumer, make_producer

START = datetime(2026, 3, 2, tzinfo=UTC)
DAYS = 3
FAILURES = [(503, "http-status"), (500, "http-status"), (429, "http-status"), (None, "timeout")]
FAILURES += [(None, "connection"), (404, "http-status")]


@dataclass
class History:
    messages: list[Message] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    attempts: list[DeliveryAttempt] = field(default_factory=list)

    @property
    def until(self) -> datetime:
        return START + timedelta(days=DAYS)


def consumers() -> list[Consumer]:
    make_producer()
    orders, users = make_channel("orders"), make_channel("users")
    return [
        make_consumer(orders, "billing"),
        make_consumer(orders, "shipping"),
        make_consumer(orders, "audit", type=Consumer.Type.PULL),
        make_consumer(users, "crm"),
    ]


def make_history(seed: int = 8) -> History:
    rng = random.Random(seed)  # noqa: S311 (test data, reproducible)
    history = History()
    subscribers = consumers()
    for day in range(DAYS):
        for hour in sorted(rng.sample(range(24), 6)):
            for channel in ("orders", "users", "orders"):
                received = START + timedelta(days=day, hours=hour, seconds=rng.randrange(3600))
                history.messages.append(new_message(rng, channel, received))
    history.messages.append(new_message(rng, "users", START + timedelta(hours=5), jobless=True))
    Message.objects.bulk_create(history.messages)
    for message in history.messages:
        if message.status == Message.Status.ACKNOWLEDGED:
            continue
        for consumer in subscribers:
            if consumer.channel_id == message.channel_id:
                add_job(rng, history, message, consumer)
    Job.objects.bulk_create(history.jobs)
    for attempt in history.attempts:
        attempt.job_id = attempt.job.pk
    rng.shuffle(history.attempts)  # ids in no particular order: "first" means earliest start
    DeliveryAttempt.objects.bulk_create(history.attempts)
    return history


def new_message(
    rng: random.Random, channel: str, received: datetime, jobless: bool = False
) -> Message:
    scheduled = received + timedelta(hours=2) if rng.random() < 0.15 else None
    return Message(
        channel_id=channel,
        producer_id="shop",
        public_id=f"m-{received.timestamp():.0f}-{rng.randrange(10**6)}",
        payload=b'{"n": 1}',
        content_type="application/json",
        status=Message.Status.ACKNOWLEDGED if jobless else Message.Status.DISPATCHED,
        received_at=received,
        scheduled_for=scheduled,
    )


def add_job(rng: random.Random, history: History, message: Message, consumer: Consumer) -> None:
    due = message.scheduled_for or message.received_at
    status = rng.choices(["DELIVERED", "DEAD", "QUEUED", "INFLIGHT"], [70, 18, 8, 4])[0]
    push = consumer.type == Consumer.Type.PUSH
    tries = {"DELIVERED": rng.randint(1, 4), "DEAD": rng.randint(1, 5)}.get(
        status, rng.randint(0, 2)
    )
    changed = due + timedelta(milliseconds=rng.uniform(3, 90_000))
    job = Job(
        message=message,
        consumer=consumer,
        status=status,
        attempts=tries,
        created_at=due,
        status_changed_at=changed,
    )
    history.jobs.append(job)
    if not push:
        return
    if status in {"DELIVERED", "DEAD"} and tries > 2 and rng.random() < 0.3:
        job.attempts = 1  # requeued from the DLQ: the counter restarted, the attempt rows stay
    for number in range(1, tries + 1):
        succeeded = status == "DELIVERED" and number == tries
        status_code, error_class = (
            (rng.choice([200, 204]), "") if succeeded else rng.choice(FAILURES)
        )
        started = due + timedelta(seconds=number * 7, microseconds=rng.randrange(10**6))
        history.attempts.append(
            DeliveryAttempt(
                job=job,
                attempt_number=number,
                started_at=min(started, changed),
                duration_ms=rng.uniform(1, 500),
                status_code=status_code,
                error_class=error_class,
                dispatcher_id="test",
            )
        )


# --- the report, in plain Python ----------------------------------------------------------------


def percentile_cont(values: list[float], fraction: float) -> float | None:
    """PostgreSQL's percentile_cont: linear interpolation between the closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def truncate(moment: datetime, grain: str) -> datetime:
    moment = moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return moment.replace(hour=0) if grain == "day" else moment


def expected_report(history: History) -> dict[tuple[str, datetime, str, str], dict[str, Any]]:
    attempts_of: dict[int, list[DeliveryAttempt]] = defaultdict(list)
    for attempt in history.attempts:
        attempts_of[attempt.job_id].append(attempt)
    groups: dict[tuple[str, datetime, str, str], list[Job]] = defaultdict(list)
    for job in history.jobs:
        for grain in ("hour", "day"):
            period = truncate(job.message.received_at, grain)
            groups[grain, period, job.message.channel_id, job.consumer.public_id].append(job)
    return {key: figures(jobs, attempts_of) for key, jobs in groups.items()}


def figures(jobs: list[Job], attempts_of: dict[int, list[DeliveryAttempt]]) -> dict[str, Any]:
    delivered = [job for job in jobs if job.status == "DELIVERED"]
    dead = [job for job in jobs if job.status == "DEAD"]
    terminal = delivered + dead
    firsts = [
        min(attempts_of[job.pk], key=lambda a: (a.started_at, a.pk))
        for job in jobs
        if attempts_of[job.pk]
    ]
    latencies = [
        (job.status_changed_at - (job.message.scheduled_for or job.message.received_at))
        / timedelta(milliseconds=1)
        for job in delivered
    ]
    failures: Counter[str] = Counter()
    for job in jobs:
        for attempt in attempts_of[job.pk]:
            if attempt.status_code is None or not 200 <= attempt.status_code <= 299:
                failures[str(attempt.status_code or attempt.error_class)] += 1
    top = sorted(failures.items(), key=lambda item: (-item[1], item[0]))[:3]
    return {
        "messages": len({job.message_id for job in jobs}),
        "jobs": len(jobs),
        "delivered": len(delivered),
        "dead": len(dead),
        "success_rate": len(delivered) / len(terminal) if terminal else None,
        "first_attempt_success_rate": (
            sum(200 <= (a.status_code or 0) <= 299 for a in firsts) / len(firsts)
            if firsts
            else None
        ),
        "mean_attempts": (
            sum(max(len(attempts_of[job.pk]), job.attempts) for job in terminal) / len(terminal)
            if terminal
            else None
        ),
        "latency_p50_ms": percentile_cont(latencies, 0.5),
        "latency_p95_ms": percentile_cont(latencies, 0.95),
        "latency_p99_ms": percentile_cont(latencies, 0.99),
        "top_failures": ",".join(f"{label}:{count}" for label, count in top),
    }
