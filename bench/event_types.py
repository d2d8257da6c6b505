"""The cost of event type subscriptions at publish (issue 19): `broker.publish()` of typed messages
to a channel of 50 consumers of which 5 subscribe to the type, against a channel of 5 consumers
without subscriptions, in the same run, alternating.

Each run publishes `--messages` messages of type `order.created` from this process, one
`publish()` (one statement and one commit) after the other, on a fresh PostgreSQL database
`bench_event_types` (dropped at the end). It prints, per run, messages/s, this process's CPU and
PostgreSQL's CPU per message, and checks with SQL that every message got exactly the expected
jobs; then the medians and the verdict: the filtered channel's rate is to be within 10 % of the
unfiltered one's (docs/performance-history.md, "Event types at publish (issue 19)").

    .venv/bin/python bench/event_types.py
    .venv/bin/python bench/event_types.py --messages 5000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dispatch_harness import (
    broker_environment,
    cpu_by_group,
    cpu_table,
    fresh_database,
    setup_django,
)

DATABASE = "bench_event_types"
EVENT_TYPE = "order.created"
SUBSCRIBED = 5


@dataclass
class Run:
    case: str
    rate: float
    client_ms: float
    postgres_ms: float


def channel_of(case: str, consumers: int) -> str:
    """A channel with `consumers` consumers: for "filtered", SUBSCRIBED of them subscribe to
    EVENT_TYPE and the others to types of their own; for "unfiltered", none has patterns."""
    from broker.models import Channel
    from consumers.models import Consumer

    channel = Channel(id=case, name=case)
    channel.set_token("bench-channel-token")
    channel.save()
    for n in range(consumers):
        if case == "unfiltered":
            patterns: list[str] = []
        elif n < SUBSCRIBED:
            patterns = ["order.*"] if n % 2 else [EVENT_TYPE]
        else:
            patterns = [f"billing{n}.*", f"invoice{n}.paid"]
        Consumer.objects.create(
            channel=channel,
            public_id=f"{case}-{n}",
            name=f"Consumer {n}",
            callback_url=f"http://127.0.0.1:9/{n}",
            event_types=patterns,
        )
    return case


def publish_run(case: str, messages: int, round_number: int) -> Run:
    from django.db import connection

    from broker import publish
    from jobs.models import Job

    before, started, cpu_started = cpu_table(), time.perf_counter(), time.process_time()
    for number in range(messages):
        publish(
            case,
            b'{"order": 12345}',
            producer="bench",
            message_id=f"r{round_number}-{number}",
            event_type=EVENT_TYPE,
        )
    seconds = time.perf_counter() - started
    client = time.process_time() - cpu_started
    postgres = cpu_by_group(before, cpu_table(), {})["postgres"]
    jobs = Job.objects.filter(
        message__channel_id=case, message__public_id__startswith=f"r{round_number}-"
    )
    expected = messages * SUBSCRIBED
    if jobs.count() != expected:
        sys.exit(f"{case}: {jobs.count()} jobs for {expected} expected")
    connection.close()
    return Run(case, messages / seconds, 1000 * client / messages, 1000 * postgres / messages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=3000, help="per run (default 3000)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each case (default 3)")
    args = parser.parse_args()
    with fresh_database(DATABASE) as url:
        setup_django(broker_environment(url))
        from broker.models import Producer

        producer = Producer(id="bench", name="Bench")
        producer.set_token("bench-producer-token")
        producer.save()
        channels = {"unfiltered": channel_of("unfiltered", SUBSCRIBED)}
        channels["filtered"] = channel_of("filtered", 50)
        print(
            f"event types at publish: {args.messages} messages of type {EVENT_TYPE} per run,"
            f" {args.rounds} rounds; 'unfiltered': {SUBSCRIBED} consumers without patterns;"
            f" 'filtered': 50 consumers, {SUBSCRIBED} subscribed"
        )
        runs: list[Run] = []
        for round_number in range(args.rounds):
            for case in (
                ("unfiltered", "filtered") if round_number % 2 == 0 else ("filtered", "unfiltered")
            ):
                run = publish_run(channels[case], args.messages, len(runs))
                runs.append(run)
                print(
                    f"  {case:10}  {run.rate:7,.0f} msg/s   CPU ms per message: publisher"
                    f" {run.client_ms:.3f}, postgres {run.postgres_ms:.3f}"
                )
    medians = {
        case: (
            statistics.median(run.rate for run in runs if run.case == case),
            statistics.median(run.postgres_ms for run in runs if run.case == case),
        )
        for case in ("unfiltered", "filtered")
    }
    ratio = medians["filtered"][0] / medians["unfiltered"][0]
    for case, (rate, postgres) in medians.items():
        print(f"median {case:10} {rate:7,.0f} msg/s, postgres {postgres:.3f} ms per message")
    verdict = "met" if ratio >= 0.9 else "NOT met"
    print(f"TARGET filtered >= 90 % of unfiltered: {100 * ratio:.0f} % -> {verdict}")


if __name__ == "__main__":
    main()
