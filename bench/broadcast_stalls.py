"""Why a broadcast can take seconds (issue 38): upstream's integration test's publishing pattern
(50 producers at once, each waiting for its answer, to one channel of 7 push consumers) against
gunicorn while a dispatcher drains what they publish, on a fresh `bench_broadcast_stalls`
database.

It prints the broadcasts' durations as the producers saw them (upstream's client gives up at
2 s) and as gunicorn logged them (`%(D)s`, from the request read to the answer written), and,
from `pg_stat_activity` sampled every 20 ms, what the publish statements were doing while
running (CPU or a wait event, and who blocked them): a statement seen waiting on a lock, for
WAL or the like names the cause; fast statements in slow requests put it in the web process.

    .venv/bin/python bench/broadcast_stalls.py                      # 10,000 broadcasts, 4 x 4
    .venv/bin/python bench/broadcast_stalls.py --workers 2 --messages 3000 --no-dispatcher
"""

from __future__ import annotations

import argparse
import http.client
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
from dispatch_harness import (
    HOST,
    ROOT,
    Receivers,
    broker_environment,
    free_port,
    fresh_database,
    log_tail,
    percentile,
    setup_django,
    start_process,
    stop_process,
)
from ingest import wait_until_serving

DATABASE = "bench_broadcast_stalls"
TOKEN = "bench-stalls-token"  # noqa: S105 (a throwaway database's)
CHANNEL, PRODUCER = "stalls", "stalls-producer"
PAYLOAD = b'{"test":"hello world"}'  # upstream's
HEADERS = {
    "Content-Type": "application/json",
    "X-Broker-Channel-Token": TOKEN,
    "X-Broker-Producer-ID": PRODUCER,
    "X-Broker-Producer-Token": TOKEN,
}
UPSTREAM_TIMEOUT = 2.0
SLOW = 0.5  # a statement running this long is reported with what it waited for
# The running statements of this database but the sampler's own, with their wait and blockers.
SAMPLE_SQL = """
SELECT pid, extract(epoch FROM clock_timestamp() - query_start),
    coalesce(wait_event_type || ':' || wait_event, 'CPU'), left(query, 60),
    pg_blocking_pids(pid)
FROM pg_stat_activity
WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()
"""


def main() -> None:
    args = parse_arguments()
    logs = Path(tempfile.mkdtemp(prefix="broadcast-stalls-"))
    with fresh_database(DATABASE) as url:
        env = broker_environment(url)
        setup_django(env)
        sinks = Receivers(1, 0, logs)
        try:
            sinks.wait_until_serving()
            make_tenant(sinks.port, args.consumers)
            run(args, env, url, logs)
        finally:
            sinks.stop()
            from django.db import connections

            connections.close_all()


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--producers", type=int, default=50)
    parser.add_argument("--consumers", type=int, default=7)
    parser.add_argument("--workers", type=int, default=4, help="gunicorn worker processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument("--no-dispatcher", action="store_true", help="publish only")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for gunicorn")
    return parser.parse_args()


def make_tenant(port: int, consumers: int) -> None:
    from broker.models import Channel, Producer
    from consumers.models import Consumer

    channel = Channel(id=CHANNEL, name=CHANNEL)
    channel.set_token(TOKEN)
    channel.save()
    producer = Producer(id=PRODUCER, name=PRODUCER)
    producer.set_token(TOKEN)
    producer.save()
    for n in range(consumers):
        Consumer.objects.create(
            channel_id=CHANNEL,
            public_id=f"c{n}",
            name=f"c{n}",
            callback_url=f"http://{HOST}:{port}/c{n}",
        )


def run(args: argparse.Namespace, env: dict[str, str], url: str, logs: Path) -> None:
    port = free_port()
    access = logs / "access.log"
    web_env = {**env, **dict(item.split("=", 1) for item in args.env)}
    web = start_process(
        [
            sys.executable, "-m", "gunicorn", "--config", "python:broker.gunicorn_conf",
            "broker.wsgi", "--bind", f"{HOST}:{port}", "--workers", str(args.workers),
            "--threads", str(args.threads), "--access-logfile", str(access),
            "--access-logformat", "%(p)s %(D)s %(s)s %(U)s",
        ],
        logs / "web.log",
        web_env,
    )  # fmt: skip
    processes = [web]
    try:
        wait_until_serving(port, web, timeout=60)
        if not args.no_dispatcher:
            processes.append(
                start_process([sys.executable, "manage.py", "dispatch"], logs / "dispatch.log", env)
            )
        sampler = Sampler(url)
        sampler.start()
        started = time.monotonic()
        durations, failures = publish(port, args.messages, args.producers)
        published = time.monotonic() - started
        sampler.stop()
        report(args, durations, failures, published, access, sampler)
    finally:
        for process in reversed(processes):
            stop_process(process, "process")
        print(f"logs in {logs}; web log tail:\n{log_tail(logs / 'web.log', 5)}")


def publish(port: int, messages: int, producers: int) -> tuple[list[float], Counter[str]]:
    """`messages` broadcasts from `producers` threads, each on a kept-alive connection as Go's
    client does: every broadcast's duration at the client, and what was not a 201."""
    left = iter(range(messages))
    lock = threading.Lock()
    durations: list[float] = []
    failures: Counter[str] = Counter()

    def producer() -> None:
        connection = http.client.HTTPConnection(HOST, port, timeout=30)
        while True:
            with lock:
                if next(left, None) is None:
                    break
            start = time.monotonic()
            try:
                connection.request("POST", f"/channel/{CHANNEL}/broadcast", PAYLOAD, HEADERS)
                answer = connection.getresponse()
                answer.read()
                outcome = "" if answer.status == 201 else f"HTTP {answer.status}"
            except (OSError, http.client.HTTPException) as exc:
                outcome = type(exc).__name__
                connection.close()
            with lock:
                durations.append(time.monotonic() - start)
                if outcome:
                    failures[outcome] += 1
        connection.close()

    threads = [threading.Thread(target=producer) for _ in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return durations, failures


class Sampler(threading.Thread):
    """pg_stat_activity every 20 ms: the publish statements' states, and the slow ones."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.running = True
        self.states: Counter[str] = Counter()  # a publish statement seen in this state
        self.slow: dict[int, tuple[float, str, str]] = {}  # pid -> longest seen, state, blockers
        self.longest = 0.0

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as db:
            while self.running:
                rows = db.execute(SAMPLE_SQL).fetchall()
                queries = {pid: query for pid, _, _, query, _ in rows}
                for pid, age, state, query, blockers in rows:
                    if not query.lstrip().startswith("WITH channel AS"):
                        continue
                    self.states[state] += 1
                    self.longest = max(self.longest, float(age))
                    if age >= SLOW and age > self.slow.get(pid, (0.0, "", ""))[0]:
                        blocked_by = "; ".join(queries.get(b, "?")[:40] for b in blockers)
                        self.slow[pid] = (float(age), state, blocked_by)
                time.sleep(0.02)

    def stop(self) -> None:
        self.running = False
        self.join()


def report(
    args: argparse.Namespace,
    durations: list[float],
    failures: Counter[str],
    published: float,
    access: Path,
    sampler: Sampler,
) -> None:
    logged = [line.split() for line in access.read_text().splitlines()]
    server = [int(micros) / 1e6 for _, micros, _, path in logged if path.endswith("/broadcast")]
    # A process that stops running (not scheduled, or one thread holding the GIL) stalls all its
    # threads' requests at once: the slow ones by the worker that served them.
    slow_by_worker = Counter(pid for pid, micros, *_ in logged if int(micros) / 1e6 >= SLOW)
    print(
        f"{len(durations)} broadcasts by {args.producers} producers in {published:.1f} s"
        f" ({len(durations) / published:.0f}/s), gunicorn {args.workers} x {args.threads},"
        f" {'no dispatcher' if args.no_dispatcher else 'one dispatcher draining'}"
    )
    for name, values in (("client", durations), ("server", server)):
        over = sum(value > UPSTREAM_TIMEOUT for value in values)
        print(
            f"  {name}: p50 {percentile(values, 0.5) * 1000:.0f} ms, p99"
            f" {percentile(values, 0.99) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms;"
            f" over {UPSTREAM_TIMEOUT:g} s: {over}"
        )
    print(f"  not 201: {dict(failures) or 'none'}")
    print(f"  server over {SLOW:g} s by worker: {dict(slow_by_worker) or 'none'}")
    total = sum(sampler.states.values()) or 1
    print(f"  publish statements sampled: {total}, longest seen {sampler.longest * 1000:.0f} ms")
    for state, count in sampler.states.most_common(8):
        print(f"    {state}: {100 * count / total:.1f} %")
    for pid, (age, state, blockers) in sorted(sampler.slow.items(), key=lambda i: -i[1][0])[:10]:
        print(f"    slow statement pid {pid}: {age * 1000:.0f} ms, {state}, blocked by: {blockers}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
