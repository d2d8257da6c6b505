"""Soak (issue 9): a steady publish rate for minutes, push and pull consumers together.

What runs, each as a process of its own: the API under gunicorn (broadcasts and the pull API),
two dispatchers (`manage.py dispatch`) delivering to push consumers on a receiver
(bench/webhook_sink.py), and one pull worker per pull consumer (bench/pull_worker.py). This
process publishes over HTTP at `--rate` messages/s (open loop) and samples every process's resident
memory. At the end it checks that every job is DELIVERED, counts repeats and lost jobs, and prints
publish → delivery latency per minute (push: arrival at the receiver; pull: the claim).

It exits non-zero when a job was lost, a job is not DELIVERED, or a process's memory grew by more
than `--max-growth-mb` after the first quarter of the run.

    .venv/bin/python bench/soak.py                    # 600 s at 25 messages/s (100 jobs/s)
    .venv/bin/python bench/soak.py --seconds 60       # the short run tests/test_soak.py makes
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from dispatch_harness import (
    CHANNEL,
    HOST,
    PAYLOAD,
    PRODUCER,
    ROOT,
    Bench,
    DispatchOptions,
    close_django_connections,
    dispatchers,
    free_port,
    fresh_database,
    machine,
    percentile,
    prepare,
    receivers,
    rss_mb,
    setup_django,
    start_process,
    stop_process,
)

DATABASE = "bench_soak"
CHANNEL_TOKEN, PRODUCER_TOKEN = "bench-channel-token", "bench-producer-token"


@dataclass
class Run:
    """What the soak saw: when each message was published, memory samples per process."""

    published: dict[str, float] = field(default_factory=dict)
    rejected: int = 0
    memory: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--seconds", type=float, default=600.0, help="publishing time")
    add("--rate", type=float, default=25.0, help="messages/s published over HTTP")
    add("--push", type=int, default=2, help="push consumers")
    add("--pull", type=int, default=2, help="pull consumers, one worker process each")
    add("--dispatchers", type=int, default=2, help="dispatcher processes")
    add("--concurrency", type=int, default=64, help="manage.py dispatch --concurrency")
    add("--web-workers", type=int, default=2, help="gunicorn workers (4 threads each)")
    add("--sample-seconds", type=float, default=10.0, help="memory sampling interval")
    add("--max-growth-mb", type=float, default=25.0, help="allowed RSS growth after 1/4 of the run")
    add("--drain-timeout", type=float, default=120.0, help="seconds to finish after publishing")
    args = parser.parse_args()
    # What dispatch_harness's Bench and helpers read.
    args.receivers, args.batch_size, args.poll_seconds = 1, 100, 1.0
    args.dispatch_command = f"{sys.executable} {ROOT / 'manage.py'} dispatch"
    return args


def make_pull_consumers(count: int) -> list[str]:
    from consumers.models import Consumer

    names = [f"p{n}" for n in range(count)]
    for name in names:
        consumer = Consumer(
            channel_id=CHANNEL, public_id=name, name=name, callback_url="", type=Consumer.Type.PULL
        )
        consumer.set_token(f"{name}-token")
        consumer.save()
    return names


@contextmanager
def api_server(bench: Bench, workers: int) -> Iterator[str]:
    port = free_port()
    command = [str(Path(sys.executable).parent / "gunicorn"), "broker.wsgi", "--bind",
               f"{HOST}:{port}", "--workers", str(workers), "--threads", "4"]  # fmt: skip
    process = start_process(command, bench.logs / "gunicorn.log", bench.env)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(f"{url}/_status", timeout=10)
                break
            except requests.RequestException:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("gunicorn did not start") from None
                time.sleep(0.2)
        yield url
    finally:
        stop_process(process, "gunicorn")


@contextmanager
def pull_workers(
    bench: Bench, api: str, names: list[str]
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """One bench/pull_worker.py per pull consumer; each writes <name>.json to the logs on exit."""
    script = str(ROOT / "bench" / "pull_worker.py")

    def start(name: str) -> subprocess.Popen[bytes]:
        tokens = ["--channel-token", CHANNEL_TOKEN, "--consumer-token", f"{name}-token"]
        where = ["--api", api, "--channel", CHANNEL, "--consumer", name]
        out = ["--out", str(bench.logs / f"{name}.json")]
        command = [sys.executable, script, *where, *tokens, *out]
        return start_process(command, bench.logs / f"{name}.log")

    processes = [start(name) for name in names]
    try:
        yield processes
    finally:
        for process in processes:
            stop_process(process, "pull worker")


def publish_steadily(
    api: str, args: argparse.Namespace, run: Run, sample: Callable[[], None]
) -> None:
    """Broadcast `rate` messages/s for `seconds` (open loop), sampling memory as it goes."""
    session = requests.Session()
    session.headers.update(
        {
            "X-Broker-Channel-Token": CHANNEL_TOKEN,
            "X-Broker-Producer-ID": PRODUCER,
            "X-Broker-Producer-Token": PRODUCER_TOKEN,
            "Content-Type": "application/json",
        }
    )
    start = time.perf_counter()
    for n in range(int(args.rate * args.seconds)):
        pause = start + n / args.rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        message_id = f"s{n}"
        sent = time.time()
        answer = session.post(
            f"{api}/channel/{CHANNEL}/broadcast",
            data=PAYLOAD,
            headers={"X-Broker-Message-ID": message_id},
        )
        if answer.status_code == 201:
            run.published[message_id] = sent
        else:
            run.rejected += 1
        sample()


def processes_to_watch(
    dispatching: list[subprocess.Popen[bytes]], pulling: list[subprocess.Popen[bytes]]
) -> dict[str, int]:
    watched = {f"dispatcher {n}": p.pid for n, p in enumerate(dispatching)}
    watched |= {f"pull worker {n}": p.pid for n, p in enumerate(pulling)}
    gunicorn = subprocess.run(["pgrep", "-f", "broker.wsgi"], capture_output=True, text=True)  # noqa: S607
    for n, pid in enumerate(sorted(int(p) for p in gunicorn.stdout.split())):
        watched[f"gunicorn {n}"] = pid
    return watched


def wait_until_all_delivered(bench: Bench, expected: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        delivered = bench.scalar("SELECT count(*) FROM jobs_job WHERE status = 'DELIVERED'")
        if delivered >= expected:
            return True
        time.sleep(0.5)
    return False


def latency_by_minute(run: Run, arrivals: dict[str, float]) -> list[tuple[int, int, float, float]]:
    """(minute, count, p50 ms, p99 ms) of publish → arrival, by the minute of publishing."""
    start = min(run.published.values(), default=0.0)
    by_minute: dict[int, list[float]] = defaultdict(list)
    for message_id, arrived in arrivals.items():
        published = run.published.get(message_id)
        if published is not None:
            by_minute[int((published - start) // 60)].append(1000 * (arrived - published))
    return [
        (minute, len(values), percentile(values, 0.5), percentile(values, 0.99))
        for minute, values in sorted(by_minute.items())
    ]


def print_latency(kind: str, rows: list[tuple[int, int, float, float]]) -> None:
    arrival = "claim" if kind.startswith("pull") else "arrival"
    print(f"  {kind} latency, publish -> {arrival}, by minute:")
    for minute, count, p50, p99 in rows:
        print(f"    minute {minute:2}: {count:6} jobs  p50 {p50:7.1f} ms  p99 {p99:7.1f} ms")


def memory_growth(run: Run, seconds: float) -> dict[str, tuple[float, float, float]]:
    """Per process: (RSS at start, at a quarter of the run, at the end) in MB."""
    growth = {}
    for name, samples in run.memory.items():
        quarter = next((rss for at, rss in samples if at >= seconds / 4), samples[-1][1])
        growth[name] = (samples[0][1], quarter, samples[-1][1])
    return growth


def main() -> None:
    args = parse_arguments()
    print(f"soak, {machine()}", flush=True)
    print(
        f"  {args.seconds:g} s at {args.rate:g} messages/s over HTTP; {args.push} push consumers"
        f" ({args.dispatchers} dispatchers, --concurrency {args.concurrency}), {args.pull} pull"
        f" consumers (one worker process each)",
        flush=True,
    )
    run = Run()
    with ExitStack() as stack:
        url = stack.enter_context(fresh_database(DATABASE))
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-soak-")))
        bench = Bench(args, url, logs)
        stack.callback(bench.db.close)
        setup_django(bench.env)
        stack.callback(close_django_connections)
        sinks = stack.enter_context(receivers(bench))
        prepare(bench, args.push, sinks.port)
        pull_names = make_pull_consumers(args.pull)
        api = stack.enter_context(api_server(bench, args.web_workers))
        options = DispatchOptions(args.concurrency, args.batch_size, args.poll_seconds)
        with (
            dispatchers(bench, args.dispatchers, options) as dispatching,
            pull_workers(bench, api, pull_names) as pulling,
        ):
            soak(bench, api, run, processes_to_watch(dispatching, pulling))
            push = sinks.received()
        pull = {name: json.loads((logs / f"{name}.json").read_text()) for name in pull_names}
        rows = bench.db.execute("SELECT status, count(*) FROM jobs_job GROUP BY 1").fetchall()
        statuses: dict[str, int] = dict(rows)
    failures = report(args, run, push, pull, statuses)
    for failure in failures:
        print(f"  FAILED: {failure}")
    sys.exit(1 if failures else 0)


def soak(bench: Bench, api: str, run: Run, watched: dict[str, int]) -> None:
    """Publish for the run's length, then wait until every job is DELIVERED."""
    args = bench.args
    started = time.monotonic()
    last_sample = -math.inf

    def sample(force: bool = False) -> None:
        nonlocal last_sample
        now = time.monotonic() - started
        if force or now - last_sample >= args.sample_seconds:
            last_sample = now
            for name, pid in watched.items():
                run.memory[name].append((now, rss_mb(pid)))

    sample(force=True)
    publish_steadily(api, args, run, sample)
    sample(force=True)
    expected = len(run.published) * (args.push + args.pull)
    wait_until_all_delivered(bench, expected, args.drain_timeout)
    sample(force=True)


def report(
    args: argparse.Namespace,
    run: Run,
    push: dict[str, list[float]],
    pull: dict[str, dict[str, Any]],
    statuses: dict[str, int],
) -> list[str]:
    """Print the figures; return what failed."""
    failures = []
    consumers = args.push + args.pull
    expected = len(run.published) * consumers
    delivered = statuses.get("DELIVERED", 0)
    print(f"\n  published {len(run.published):,} messages ({run.rejected} rejected);"
          f" jobs by status: {statuses}")  # fmt: skip
    received = [set(taken["jobs"]) for taken in pull.values()]  # message IDs per consumer
    for n in range(args.push):
        received.append({key.split(" ")[0] for key in push if key.endswith(f" c{n}")})
    lost = sum(len(run.published.keys() - ids) for ids in received)
    repeats = sum(int(count) - 1 for count, _ in push.values())
    repeats += sum(int(c) - 1 for taken in pull.values() for c, _ in taken["jobs"].values())
    errors = sum(taken["errors"] for taken in pull.values())
    print(f"  lost {lost}, repeated deliveries {repeats}, pull worker errors {errors}")
    if run.rejected or lost or delivered != expected or sum(statuses.values()) != expected:
        failures.append(f"{expected:,} jobs expected DELIVERED: {statuses}, lost {lost}")
    arrivals = {key.split(" ")[0]: first for key, (_, first) in push.items() if key.endswith(" c0")}
    print_latency("push (c0)", latency_by_minute(run, arrivals))
    for name, taken in pull.items():
        claims = {message_id: first for message_id, (_, first) in taken["jobs"].items()}
        print_latency(f"pull ({name})", latency_by_minute(run, claims))
    print("  resident memory MB: start, at 1/4 of the run, end")
    for name, (start, quarter, end) in memory_growth(run, args.seconds).items():
        grew = end - quarter
        print(f"    {name:14} {start:7.1f} {quarter:7.1f} {end:7.1f}  ({grew:+.1f} after 1/4)")
        if grew > args.max_growth_mb:
            failures.append(f"{name} grew {grew:.1f} MB after the first quarter")
    return failures


if __name__ == "__main__":
    main()
