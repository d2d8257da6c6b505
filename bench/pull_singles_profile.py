"""One pull acknowledgement against one broadcast, in one process (issue 40): the SQL statements
each sends, the CPU each costs the broker's Python and PostgreSQL, and with `--profile` where the
Python's goes (cProfile).

bench/pull.py times the two through gunicorn; this script leaves the HTTP server out and runs the
broker's own request path, Django's test client, against a fresh `bench_pull_singles` database on
127.0.0.1:5432 (dropped at the end): `--requests` broadcasts to a channel with one pull consumer,
its jobs claimed, then `--requests` single acknowledgements (`POST …/job/{j}` `{"NextState":
"DELIVERED"}`) and as many broadcasts, one after the other, each kind timed with
`time.process_time` and with the CPU of the PostgreSQL backends serving it (/proc). The broker's
log lines (a line per request, and a delivery line per acknowledgement) go to stderr, as a
server's go to its log. Run from the root of the checkout to measure; the script imports the
broker from the current directory, so an older checkout (`git archive REV | tar -x -C DIR`) is
measured from DIR (the header's `code` is then this script's commit, `broker from` the one
measured):

    .venv/bin/python bench/pull_singles_profile.py 2>/dev/null
    .venv/bin/python bench/pull_singles_profile.py --profile 40 2>/dev/null   # the 40 heaviest
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from dispatch_harness import broker_environment, fresh_database, machine, process_cpu

if TYPE_CHECKING:
    from django.test import Client

DATABASE = "bench_pull_singles"
CHANNEL_TOKEN, CONSUMER_TOKEN, PRODUCER_TOKEN = "channel-token", "consumer-token", "producer-token"
BODY = json.dumps({"order": 12345, "items": [{"sku": "A-1", "qty": 2}], "note": "x" * 160})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="of each kind, timed")
    parser.add_argument("--profile", type=int, metavar="N", help="print the N heaviest calls")
    args = parser.parse_args()
    with fresh_database(DATABASE) as url:
        os.environ.update(broker_environment(url))
        sys.path.insert(0, str(Path.cwd()))  # the checkout measured: the current directory's
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", interactive=False, verbosity=0)
        import broker

        print(f"pull singles in one process; {machine()}; broker from {broker.__file__}")
        with psycopg.connect(url, autocommit=True) as observer:
            run(args.requests, args.profile, lambda: backends_cpu(observer))
        from django.db import connections

        connections.close_all()


def backends_cpu(observer: psycopg.Connection[tuple[int]]) -> float:
    """CPU seconds so far of the PostgreSQL backends serving the broker here (not `observer`)."""
    query = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    rows = observer.execute(query + " AND pid <> pg_backend_pid()").fetchall()
    return sum(process_cpu(pid) for (pid,) in rows)


def run(requests: int, heaviest: int | None, database_cpu: Callable[[], float]) -> None:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST="127.0.0.1")
    broadcast, acknowledge = _requests(client)
    for _ in range(2 * requests + 20):  # the jobs to acknowledge, and a warm-up of both paths
        broadcast()
    held = _claim(client, 2 * requests + 20)
    for job_id in held[:10]:
        acknowledge(job_id)
    timed: list[tuple[str, Callable[[], object]]] = [
        ("one acknowledgement", lambda: [acknowledge(job_id) for job_id in held[20:][:requests]]),
        ("one broadcast", lambda: [broadcast() for _ in range(requests)]),
    ]
    singles: list[tuple[str, Callable[[], None]]] = [
        ("acknowledgement", lambda: acknowledge(held[10])),
        ("broadcast", broadcast),
    ]
    for label, one in singles:
        with CaptureQueriesContext(connection) as queries:
            one()
        statements = [query["sql"].split(None, 1)[0] for query in queries.captured_queries]
        print(f"  one {label}: {len(statements)} SQL statement(s): {', '.join(statements)}")
    for label, work in timed:
        profile = cProfile.Profile() if heaviest else None
        started, database_started = time.process_time(), database_cpu()
        if profile:
            profile.runcall(work)
        else:
            work()
        cpu_ms = 1000 * (time.process_time() - started) / requests
        database_ms = 1000 * (database_cpu() - database_started) / requests
        print(
            f"  {label}: {cpu_ms:.3f} ms of this process's CPU each, PostgreSQL {database_ms:.3f};"
            f" {requests} sequential"
        )
        if profile and heaviest:
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(heaviest)
            print(text.getvalue())


def _requests(client: Client) -> tuple[Callable[[], None], Callable[[str], None]]:
    """The two requests, on a channel with one pull consumer, each checked for its status."""
    from broker.models import Channel, Producer
    from consumers.models import Consumer

    producer = Producer(id="shop", name="Shop")
    producer.set_token(PRODUCER_TOKEN)
    producer.save()
    channel = Channel(id="orders", name="Orders")
    channel.set_token(CHANNEL_TOKEN)
    channel.save()
    consumer = Consumer(channel=channel, public_id="worker", name="Worker", type="pull")
    consumer.set_token(CONSUMER_TOKEN)
    consumer.save()
    post = client.post
    publisher = {"X-Broker-Channel-Token": CHANNEL_TOKEN, "X-Broker-Producer-ID": "shop"}
    publisher["X-Broker-Producer-Token"] = PRODUCER_TOKEN
    worker = {"X-Broker-Channel-Token": CHANNEL_TOKEN, "X-Broker-Consumer-Token": CONSUMER_TOKEN}

    def broadcast() -> None:
        answer = post("/channel/orders/broadcast", BODY, "application/json", headers=publisher)
        if answer.status_code != 201:
            raise RuntimeError(f"broadcast: HTTP {answer.status_code} {answer.content!r}")

    def acknowledge(job_id: str) -> None:
        url = f"/channel/orders/consumer/worker/job/{job_id}"
        answer = post(url, '{"NextState": "DELIVERED"}', "application/json", headers=worker)
        if answer.status_code != 202:
            raise RuntimeError(f"acknowledgement: HTTP {answer.status_code} {answer.content!r}")

    return broadcast, acknowledge


def _claim(client: Client, jobs: int) -> list[str]:
    worker = {"X-Broker-Channel-Token": CHANNEL_TOKEN, "X-Broker-Consumer-Token": CONSUMER_TOKEN}
    held: list[str] = []
    while len(held) < jobs:
        answer = client.post(
            "/channel/orders/consumer/worker/claim",
            "limit=100",
            "application/x-www-form-urlencoded",
            headers=worker,
        )
        held += [job["ID"] for job in answer.json()["Result"]]
    return held


if __name__ == "__main__":
    main()
