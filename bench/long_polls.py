"""Broadcast latency beside long-polling pull workers (issue 36): can long polls take the web tier?

For each server setup asked for (bench/ingest.py's `--server` forms; by default the documented
one) and, with `--before DIR`, an older checkout served as in the issue's report (gunicorn, 3
sync workers), the benchmark

1. creates a fresh PostgreSQL database `bench_long_polls` on 127.0.0.1:5432, runs the
   migrations, and makes two tenants: a channel with one pull consumer that every long-polling
   worker claims for, and another channel with a producer of its own and a push consumer (no
   dispatcher runs: its jobs stay queued);
2. for each number of long-polling workers in `--pullers` (0 is the broadcasts alone), starts the
   server afresh (no claim left waiting by the row before) and that many workers, threads of one
   client process, each claiming `{"limit": 10, "wait": 20}` in a loop over a kept-alive
   connection and coming back after `Retry-After` when given one;
3. once every worker's first claim is in, idles `--idle` seconds and counts the CPU the waiting
   costs (the server's processes and this database's PostgreSQL backends, in cores) and the
   claims answered meanwhile, those told to come back (`Retry-After`) among them;
4. times `--broadcasts` broadcasts of the other tenant, one after another, each on a connection
   of its own: p50, p99 and the slowest. A broadcast not answered within 30 s ends the row, as
   does `--row-seconds` of broadcasting;
5. prints a table of every row, stops the server, and drops the database.

Run from the project root:

    .venv/bin/python bench/long_polls.py                          # documented:CORES
    mkdir /tmp/before-36 && git archive 36e2f7c | tar -x -C /tmp/before-36  # before issue 36
    .venv/bin/python bench/long_polls.py --before /tmp/before-36  # and sync:3 serving it
    .venv/bin/python bench/long_polls.py --server documented:2 --pullers 0,30,100
    .venv/bin/python bench/long_polls.py --help
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from dispatch_harness import (
    CORES,
    HOST,
    ROOT,
    Bench,
    close_django_connections,
    cpu_by_group,
    cpu_table,
    fresh_database,
    machine,
    percentile,
    setup_django,
)
from ingest import DEFAULT_SERVER, ServerConfig
from pull import database_backends_cpu, server

DATABASE = "bench_long_polls"
TOKEN = "bench-token"  # noqa: S105 (every token of a throwaway database)
PULLED, OTHER = "pulled", "other-tenant"  # the two tenants' channels
CLAIM = f"/channel/{PULLED}/consumer/worker/claim"
CLAIM_BODY = json.dumps({"limit": 10, "wait": 20})
BROADCAST_BODY = json.dumps({"order": 12345, "note": "x" * 160})
GIVE_UP_SECONDS = 30  # one broadcast this slow ends its row (the report: 19 s)


# --- the long-polling workers (a process of their own) -----------------------------------------


def long_poll(port: int, counts: Counter[str], lock: threading.Lock, stop: threading.Event) -> None:
    """One pull worker: claims with `wait` as long as `stop` is not set, as a worker that
    honours Retry-After does."""
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    headers = {
        "Content-Type": "application/json",
        "X-Broker-Channel-Token": TOKEN,
        "X-Broker-Consumer-Token": TOKEN,
    }
    while not stop.is_set():
        try:
            connection.request("POST", CLAIM, CLAIM_BODY, headers)
            answer = connection.getresponse()
            answer.read()
        except OSError as error:
            with lock:
                counts[f"error: {type(error).__name__}"] += 1
            return
        come_back = answer.getheader("Retry-After")
        with lock:
            counts["claims"] += 1
            counts["told to come back"] += come_back is not None
            if answer.status != 200:
                counts[f"HTTP {answer.status}"] += 1
        if come_back is not None:
            stop.wait(float(come_back))


def pull_workers(port: int, workers: int, go: Event, report: Event, out: Any) -> None:
    """The client process: `workers` threads of long_poll(); each time `report` is set, their
    counts so far go to `out` (and `report` is cleared); they stop when `go` is cleared."""
    counts: Counter[str] = Counter()
    lock, stop = threading.Lock(), threading.Event()
    threads = [
        threading.Thread(target=long_poll, args=(port, counts, lock, stop), daemon=True)
        for _ in range(workers)
    ]
    for thread in threads:
        thread.start()
    while go.is_set():
        if report.wait(0.1):
            with lock:
                out.put(dict(counts))
            report.clear()
    stop.set()  # daemon threads: a claim the server still holds ends with the process


# --- one row: a server, its long-polling workers and the other tenant's broadcasts -------------


@dataclass
class Row:
    pullers: int
    latencies: list[float]
    planned: int
    idle_cores: float  # the server's and this database's CPU while the workers only wait
    claims_per_second: float
    told_to_come_back_per_second: float
    errors: dict[str, int]

    def line(self) -> str:
        answered = sum(latency < GIVE_UP_SECONDS for latency in self.latencies)
        ms = [1000 * latency for latency in self.latencies]
        p50, p99 = percentile(ms, 0.5), percentile(ms, 0.99)
        return (
            f"{self.pullers:>7}  {answered:>4} of {self.planned:<4} {p50:>9.1f} {p99:>9.1f}"
            f" {max(ms):>9.1f}  {self.idle_cores:>10.3f}  {self.claims_per_second:>8.1f}"
            f"  {self.told_to_come_back_per_second:>9.1f}  {self.errors or ''}"
        )


HEADER = "pullers  broadcasts    p50 ms    p99 ms    max ms  idle cores  claims/s  come back"


def broadcast(port: int, number: int) -> float:
    """Seconds until one broadcast of the other tenant is answered; GIVE_UP_SECONDS if never."""
    connection = http.client.HTTPConnection(HOST, port, timeout=GIVE_UP_SECONDS)
    headers = {
        "Content-Type": "application/json",
        "X-Broker-Channel-Token": TOKEN,
        "X-Broker-Producer-ID": "other-producer",
        "X-Broker-Producer-Token": TOKEN,
        "X-Broker-Message-ID": f"b-{time.time_ns()}-{number}",
    }
    started = time.perf_counter()
    try:
        connection.request("POST", f"/channel/{OTHER}/broadcast", BROADCAST_BODY, headers)
        answer = connection.getresponse()
        answer.read()
    except TimeoutError:
        return GIVE_UP_SECONDS
    finally:
        connection.close()
    if answer.status != 201:
        raise RuntimeError(f"broadcast: HTTP {answer.status}")
    return time.perf_counter() - started


def one_row(bench: Bench, config: ServerConfig, root: Path, pullers: int) -> Row:
    args = bench.args
    log = bench.logs / f"server-{pullers}.log"
    with server(config, bench.env, log, root) as (port, master):
        for number in range(20):  # warm-up: every worker process's first requests
            broadcast(port, number)
        spawn = multiprocessing.get_context("spawn")
        go, report, out = spawn.Event(), spawn.Event(), spawn.Queue()
        go.set()
        client = spawn.Process(target=pull_workers, args=(port, pullers, go, report, out))
        client.start()
        try:
            time.sleep(3)  # every worker's first claim is in, and the refused ones came back
            report.set()
            first = out.get(timeout=60)
            before, started = cpu_table(), time.monotonic()
            time.sleep(args.idle)
            after, idled = cpu_table(), time.monotonic() - started
            report.set()
            second = out.get(timeout=60)
            latencies: list[float] = []
            deadline = time.monotonic() + args.row_seconds
            while len(latencies) < args.broadcasts and GIVE_UP_SECONDS not in latencies:
                if time.monotonic() > deadline:
                    break
                latencies.append(broadcast(port, len(latencies)))
            report.set()
            last = out.get(timeout=60)
        finally:
            go.clear()
            client.join(timeout=60)
    cpu = cpu_by_group(before, after, {"server": {master}})["server"]
    cpu += database_backends_cpu(bench, before, after)

    def rate(name: str) -> float:
        return float(second.get(name, 0) - first.get(name, 0)) / idled

    errors = {k: v for k, v in last.items() if k.startswith(("error", "HTTP"))}
    return Row(
        pullers,
        latencies,
        args.broadcasts,
        cpu / idled,
        rate("claims"),
        rate("told to come back"),
        errors,
    )


# --- setup and the run ---------------------------------------------------------------------------


def prepare() -> None:
    """The two tenants: a pull consumer's channel, and another channel with its own producer."""
    from broker.models import Channel, Producer
    from consumers.models import Consumer

    producer = Producer(id="other-producer", name="Other tenant's producer")
    producer.set_token(TOKEN)
    producer.save()
    for channel_id, consumer_type in ((PULLED, Consumer.Type.PULL), (OTHER, Consumer.Type.PUSH)):
        channel = Channel(id=channel_id, name=channel_id)
        channel.set_token(TOKEN)
        channel.save()
        consumer = Consumer(
            channel=channel,
            public_id="worker",
            name="worker",
            callback_url=f"http://{HOST}:9/worker",
            type=consumer_type,
        )
        consumer.set_token(TOKEN)
        consumer.save()


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add(
        "--server",
        type=ServerConfig.parse,
        action="append",
        help=f"a server setup, as bench/ingest.py's (repeatable; default {DEFAULT_SERVER})",
    )
    add(
        "--before",
        type=Path,
        help="an older checkout (`git archive REV | tar -x -C DIR`), served by gunicorn with 3 sync"
        " workers as in the issue's report, measured after this checkout's setups",
    )
    add("--pullers", default="0,3,10,30", help="long-polling workers of each row, comma-separated")
    add("--broadcasts", type=int, default=100, help="the other tenant's broadcasts timed per row")
    add("--idle", type=float, default=10.0, help="seconds the CPU of the waiting is counted")
    add("--row-seconds", type=float, default=120.0, help="most seconds of broadcasts per row")
    args = parser.parse_args()
    args.server = args.server or [ServerConfig.parse(DEFAULT_SERVER)]
    args.pullers = [int(count) for count in args.pullers.split(",")]
    return args


def main() -> None:
    args = parse_arguments()
    print(f"long polls beside broadcasts, {machine()}")
    print(
        f"per row: the long-polling workers (claim limit 10, wait 20 s) of one consumer, then"
        f" {args.broadcasts} broadcasts of another tenant, one at a time; idle CPU over"
        f" {args.idle:g} s; a {CORES}-core machine",
        flush=True,
    )
    with ExitStack() as stack:
        database_url = stack.enter_context(fresh_database(DATABASE))
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-long-polls-")))
        bench = Bench(args, database_url, logs)
        stack.callback(bench.db.close)
        bench.env["DJANGO_ALLOWED_HOSTS"] = HOST
        setup_django(bench.env)
        prepare()
        close_django_connections()
        setups = [(config, ROOT) for config in args.server]
        if args.before:
            setups.append((ServerConfig.parse("sync:3"), args.before))
        for config, root in setups:
            where = "" if root == ROOT else f" from {root}"
            command = " ".join(config.command(0)[1:])
            print(f"\n{config}{where}: python {command}\n{HEADER}", flush=True)
            for pullers in args.pullers:
                print(one_row(bench, config, root, pullers).line(), flush=True)


if __name__ == "__main__":
    main()
