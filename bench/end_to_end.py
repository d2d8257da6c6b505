"""End to end (issue 40): the highest publish rate one machine sustains, publish → delivery.

Everything runs on the same cores, each as processes of its own: producers POSTing single
broadcasts over HTTP, the web server as the broker documents it (gunicorn with
broker/gunicorn_conf.py, one gthread worker of 4 threads per core: `manage.py runbroker`'s), the
dispatchers (`manage.py dispatch`, two by default, as the Compose file and the Kubernetes example
deploy them), one channel with two push consumers whose callbacks are the receiver
(bench/webhook_sink.py) on 127.0.0.1, and PostgreSQL, on a fresh database `bench_end_to_end`
(dropped after).

`--producers` forked processes (16) each keep one HTTP/1.1 connection alive (bench/ingest.py's
`BroadcastClient`) and publish their share of an open-loop schedule (bench/steady_publish.py): a
message every 1 / rate seconds, late ones sent as soon as possible, for `--step-seconds`. Then the
next step, at the next of `--rates`. For each step:

- the rate published, broadcasts refused, HTTP publish latency p50/p99 (request sent → 201 read);
- publish → delivery p50/p99 over every delivery (two per message): the receiver's time.time() at
  the job's first arrival minus the producer's time.time() just before it sent the request;
- the backlog when publishing ended (jobs not DELIVERED and the oldest one's age, from SQL), and
  whether every delivery arrived within `--settle-seconds` after that;
- CPU per message of each group of processes, from /proc over the step (its schedule's start
  until its last delivery): web (gunicorn's master and workers), dispatchers, database (the
  PostgreSQL backends connected to this database; the server's shared processes are not
  counted), receiver, producers; and how busy the whole machine was, other work included;
- every job DELIVERED (SQL), and each message at each consumer exactly once (receiver's counts).

A step passes when its p99 publish → delivery is within `--p99-ms` (100) and nothing fell behind:
the producers kept the rate (within 3 %), the broker refused no broadcast, every delivery arrived
within the settle time, each exactly once. The result is the highest rate of the unbroken run of
passing steps from the first. Stepping stops after a step that fell behind, or two that failed.
Between steps `VACUUM (ANALYZE)` runs on the queue tables, as autovacuum (off on the development
server) would.

    .venv/bin/python bench/end_to_end.py                       # 100 to 800 msg/s, 20 s a step
    .venv/bin/python bench/end_to_end.py --rates 200,300,350,400 --dispatchers 1
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import NamedTuple

from dispatch_harness import (
    CHANNEL,
    CORES,
    ROOT,
    Bench,
    DispatchOptions,
    Receivers,
    close_django_connections,
    cpu_by_group,
    cpu_table,
    database_backends,
    dispatchers,
    fresh_database,
    machine,
    prepare,
    receivers,
    setup_django,
    verify,
    wait_for,
)
from end_to_end_report import CONSUMERS, HEADER, Step, print_result, print_step
from ingest import BroadcastClient, ServerConfig, web_server
from steady_publish import Sender, SenderFactory, publish_steadily

DATABASE = "bench_end_to_end"
VACUUMED = "jobs_job, jobs_deliveryattempt, broker_message"


class Stage(NamedTuple):
    """What runs while the steps are measured."""

    sinks: Receivers
    port: int  # the web server's
    web: int  # gunicorn's master
    dispatchers: list[subprocess.Popen[bytes]]

    def alive(self) -> bool:
        return all(process.poll() is None for process in self.dispatchers)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument

    def rates(text: str) -> list[float]:
        return [float(part) for part in text.split(",")]

    steps = "100,150,200,250,300,350,400,500,600,800"
    add("--rates", type=rates, default=steps, help="messages/s, a step each, in this order")
    add("--step-seconds", type=float, default=20.0, help="publishing time of a step")
    add("--warmup-seconds", type=float, default=3.0, help="at the first rate, not measured")
    add("--settle-seconds", type=float, default=5.0, help="for the last deliveries after a step")
    add("--producers", type=int, default=16, help="producer processes, a connection each")
    add("--dispatchers", type=int, default=2, help="manage.py dispatch processes")
    add("--web-workers", type=int, default=CORES, help="gunicorn workers (4 threads each)")
    add("--p99-ms", type=float, default=100.0, help="the bound on p99 publish → delivery")
    args = parser.parse_args()
    # What dispatch_harness's Bench and helpers read.
    args.receivers = 1
    args.dispatch_command = f"{sys.executable} {ROOT / 'manage.py'} dispatch"
    return args


# --- one step ---------------------------------------------------------------------------------


def http_sender(port: int) -> SenderFactory:
    """Each forked producer: one kept-alive connection to the web server, a broadcast per call."""

    def make(prefix: str) -> Sender:
        loop = asyncio.new_event_loop()
        client = BroadcastClient(port)

        def send(first: int, batch: int) -> bool:
            try:
                status = loop.run_until_complete(client.broadcast(CHANNEL, f"{prefix}{first}"))
            except (ConnectionError, asyncio.IncompleteReadError, ValueError):
                loop.run_until_complete(client.close())
                return False
            return status == 201

        return send

    return make


def machine_ticks() -> tuple[int, int]:
    """The whole machine's CPU time so far, busy and in all (clock ticks, /proc/stat)."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return sum(ticks) - idle, sum(ticks)


def backlog(bench: Bench) -> tuple[int, float]:
    """Jobs not DELIVERED now, and the oldest one's age in ms."""
    row = bench.db.execute(
        "SELECT count(*), coalesce(1000 * extract(epoch FROM now() - min(created_at)), 0)"
        " FROM jobs_job WHERE status <> 'DELIVERED'"
    ).fetchone()
    return (int(row[0]), float(row[1])) if row else (0, 0.0)


def transactions(bench: Bench) -> int:
    """Transactions this database has seen so far, as its backends last reported them (each at
    most a second or so late while it works, PostgreSQL's statistics' own delay)."""
    return int(
        bench.scalar(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        )
    )


def delivered(bench: Bench, prefix: str) -> int:
    return int(
        bench.scalar(
            "SELECT count(*) FROM jobs_job j JOIN broker_message m ON m.id = j.message_id"
            " WHERE starts_with(m.public_id, %(prefix)s) AND j.status = 'DELIVERED'",
            {"prefix": prefix},
        )
    )


def run_step(bench: Bench, stage: Stage, rate: float, prefix: str, seconds: float) -> Step:
    """Publish at `rate` for `seconds`, wait for the deliveries, measure and check them."""
    args = bench.args
    stage.sinks.reset()
    started, before, machine_before = time.time(), cpu_table(), machine_ticks()
    transactions_before = transactions(bench)
    published = publish_steadily(
        rate, seconds, prefix, args.producers, sender=http_sender(stage.port)
    )
    queued, oldest_ms = backlog(bench)
    deliveries = len(CONSUMERS) * published.count

    def arrived() -> int:
        return stage.sinks.summary()[1]

    finished, late = wait_for(arrived, deliveries, args.settle_seconds, stage.alive)
    after, machine_after = cpu_table(), machine_ticks()
    transactions_after = transactions(bench)
    groups = {
        "web": {stage.web},
        "dispatchers": {process.pid for process in stage.dispatchers},
        "receiver": stage.sinks.pids,
        "database": database_backends(bench),
    }
    cpu = cpu_by_group(before, after, groups)
    cpu["producers"] = published.cpu_seconds
    if late:  # for the check: as long as a drain of what is left may take
        wait_for(arrived, deliveries, max(60.0, deliveries / 200), stage.alive)
    # A job is DELIVERED once its outcome is written, just after the receiver has answered.
    wait_for(lambda: delivered(bench, prefix), deliveries, 30, stage.alive)
    received = stage.sinks.received()
    busy, total = (a - b for a, b in zip(machine_after, machine_before, strict=True))
    return Step(
        rate=rate,
        published=published,
        seconds=finished - started,
        backlog=queued,
        oldest_ms=oldest_ms,
        kept_up=not late,
        arrived={key: first for key, (_, first) in received.items()},
        cpu=cpu,
        busy_cores=CORES * busy / total if total else math.nan,
        transactions=transactions_after - transactions_before,
        check=verify(bench, received, prefix=prefix),
    )


# --- the run ----------------------------------------------------------------------------------


def vacuum(bench: Bench) -> None:
    """What autovacuum would have done by now (it is off on the development server)."""
    bench.db.execute(f"VACUUM (ANALYZE) {VACUUMED}")


def measure(bench: Bench, stage: Stage) -> list[Step]:
    args = bench.args
    warm = run_step(bench, stage, args.rates[0], "w", args.warmup_seconds)
    print(f"warm-up: {warm.published}", flush=True)
    steps: list[Step] = []
    print(HEADER, flush=True)
    for index, rate in enumerate(args.rates):
        vacuum(bench)
        step = run_step(bench, stage, rate, f"s{index}-", args.step_seconds)
        steps.append(step)
        print_step(step, args.p99_ms)
        failed_twice = len(steps) > 1 and all(s.faults(args.p99_ms) for s in steps[-2:])
        if step.behind or failed_twice:
            break
    return steps


def main() -> None:
    args = parse_arguments()
    print(f"end to end, {machine()}", flush=True)
    server = ServerConfig.parse(f"documented:{args.web_workers}")
    options = DispatchOptions()  # manage.py dispatch's defaults
    print(
        f"  {args.producers} producer processes (one kept-alive connection each) → gunicorn"
        f" ({server}) → PostgreSQL → {args.dispatchers} dispatchers ({options}) → 2 push"
        f" consumers on one receiver; steps of {args.step_seconds:g} s",
        flush=True,
    )
    with ExitStack() as stack:
        url = stack.enter_context(fresh_database(DATABASE))
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-e2e-")))
        bench = Bench(args, url, logs)
        stack.callback(bench.db.close)
        setup_django(bench.env)
        stack.callback(close_django_connections)
        sinks = stack.enter_context(receivers(bench))
        prepare(bench, len(CONSUMERS), sinks.port)
        close_django_connections()
        port, master = stack.enter_context(web_server(server, bench.env))
        running = stack.enter_context(dispatchers(bench, args.dispatchers, options))
        steps = measure(bench, Stage(sinks, port, master, running))
    print_result(steps, args)
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"load average at the end: {load}")


if __name__ == "__main__":
    main()
