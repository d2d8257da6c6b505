"""Soak (issue 9): a steady publish rate for minutes, push and pull consumers together.

What runs, each as a process of its own: the API under gunicorn (broadcasts and the pull API),
two dispatchers (`manage.py dispatch`) delivering to push consumers on a receiver
(bench/webhook_sink.py), and one pull worker per pull consumer (bench/pull_worker.py). This
process publishes over HTTP at `--rate` messages/s (open loop) and samples every process's resident
memory. At the end it checks that every job is DELIVERED, counts repeats and lost jobs, and prints
publish → delivery latency per minute (push: arrival at the receiver; pull: the claim).

It exits non-zero when a broadcast failed, a job was lost or is not DELIVERED, a process of the
soak died (named, with its exit status and the end of its log), or a process's memory grew by more
than `--max-growth-mb` after the first quarter of the run. Speed is reported, never judged: on a
loaded machine publishing and delivery take longer, and the soak waits for them as long as jobs
keep being delivered.

    .venv/bin/python bench/soak.py                    # 600 s at 25 messages/s (100 jobs/s)
    .venv/bin/python bench/soak.py --seconds 60       # tests/reliability/test_soak.py's short run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
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
    children_of,
    close_django_connections,
    dispatchers,
    free_port,
    fresh_database,
    log_tail,
    machine,
    percentile,
    prepare,
    receivers,
    resident_mb,
    setup_django,
    start_process,
    stop_process,
)

# One database per run: two soaks at once (a test run and a manual one) would otherwise drop each
# other's database, since fresh_database() drops it WITH (FORCE) first.
DATABASE = f"bench_soak_{os.getpid()}"
CHANNEL_TOKEN, PRODUCER_TOKEN = "bench-channel-token", "bench-producer-token"
PUBLISH_TIMEOUT_SECONDS = 60  # a broadcast that takes longer means a stuck server, not a slow one
Samples = dict[str, list[tuple[float, float]]]  # process name -> [(seconds into the soak, MB)]


@dataclass
class Run:
    """What the soak saw: when each message was published, failed broadcasts, memory samples."""

    published: dict[str, float] = field(default_factory=dict)
    failed: Counter[str] = field(default_factory=Counter)  # why -> broadcasts
    memory: Samples = field(default_factory=lambda: defaultdict(list))


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
    add("--stall-seconds", type=float, default=120.0,
        help="after publishing, give up when no job was delivered for this long")  # fmt: skip
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


# --- the processes ----------------------------------------------------------------------------


@contextmanager
def api_server(bench: Bench, workers: int) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """gunicorn with gthread workers; (its URL, the master process)."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "gunicorn"), "broker.wsgi", "--bind",
               f"{HOST}:{port}", "--workers", str(workers), "--threads", "4"]  # fmt: skip
    log = bench.logs / "gunicorn.log"
    process = start_process(command, log, bench.env)
    url = f"http://{HOST}:{port}"
    try:
        wait_until_answering(url, process, log)
        yield url, process
    finally:
        stop_process(process, "gunicorn")


def wait_until_answering(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    # A loaded machine can take many seconds to import Django in the workers: wait for as long as
    # the master lives (the cap only keeps a broken start from hanging the soak).
    deadline = time.monotonic() + 300
    while True:
        try:
            requests.get(f"{url}/_status", timeout=10)
            return
        except requests.RequestException:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"gunicorn did not start:\n{log_tail(log)}") from None
            time.sleep(0.2)


@contextmanager
def pull_workers(
    bench: Bench, api: str, names: list[str]
) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """One bench/pull_worker.py per pull consumer; each writes <name>.json to the logs on exit."""
    script = str(ROOT / "bench" / "pull_worker.py")

    def start(name: str) -> subprocess.Popen[bytes]:
        tokens = ["--channel-token", CHANNEL_TOKEN, "--consumer-token", f"{name}-token"]
        where = ["--api", api, "--channel", CHANNEL, "--consumer", name]
        out = ["--out", str(bench.logs / f"{name}.json")]
        command = [sys.executable, script, *where, *tokens, *out]
        return start_process(command, bench.logs / f"{name}.log")

    processes = {name: start(name) for name in names}
    try:
        yield processes
    finally:
        for process in processes.values():
            stop_process(process, "pull worker")


def log_of(pid: int) -> Path | None:
    """The file a process writes to (start_process gives each one a log of its own)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/fd/1"))
    except OSError:  # it has ended already
        return None


@dataclass
class Watched:
    """A process of this soak: its memory is sampled while it runs; its end is a finding."""

    name: str
    pid: int
    process: subprocess.Popen[bytes] | None = None  # started by the soak: poll() tells its end
    log: Path | None = None
    ended: float | None = None  # seconds into the soak when it was seen gone

    def is_gone(self, gunicorn_workers: set[int]) -> bool:
        if self.process:
            return self.process.poll() is not None
        return self.pid not in gunicorn_workers


class Watch:
    """This soak's processes: the ones it started, and the workers of its own gunicorn master.

    The workers are the master's children, never "every process whose command line says
    broker.wsgi" (`pgrep -f`): that also finds the other gunicorns on the machine (another test's,
    a developer's, a shell running one), and the end of one of those once crashed the soak. They
    are looked up at every sample, since gunicorn replaces a worker that ends with a new process.
    """

    def __init__(self, started: dict[str, subprocess.Popen[bytes]], master_pid: int) -> None:
        self.master_pid = master_pid
        self.processes = [
            Watched(name, p.pid, process=p, log=log_of(p.pid)) for name, p in started.items()
        ]

    def sample(self, at: float, memory: Samples) -> None:
        """Record each running process's memory; note the ones that ended since the last sample."""
        workers = children_of(self.master_pid)
        known = {watched.pid for watched in self.processes}
        for pid in sorted(workers - known):
            self.processes.append(Watched(f"gunicorn worker {pid}", pid))
        for watched in self.running():
            rss = None if watched.is_gone(workers) else resident_mb(watched.pid)
            if rss is None:
                watched.ended = at
            else:
                memory[watched.name].append((at, rss))

    def running(self) -> list[Watched]:
        return [watched for watched in self.processes if watched.ended is None]

    def ended(self) -> list[Watched]:
        return [watched for watched in self.processes if watched.ended is not None]

    def started_one_died(self) -> Watched | None:
        """A process this soak started that ended: the soak has failed, no point going on."""
        return next((watched for watched in self.ended() if watched.process), None)


# --- publishing and waiting -------------------------------------------------------------------


def publish_steadily(
    api: str, args: argparse.Namespace, run: Run, sample: Callable[[], None], watch: Watch
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
        publish(session, f"{api}/channel/{CHANNEL}/broadcast", f"s{n}", run)
        sample()
        if watch.started_one_died():
            return


def publish(session: requests.Session, url: str, message_id: str, run: Run) -> None:
    sent = time.time()
    try:
        answer = session.post(
            url,
            data=PAYLOAD,
            headers={"X-Broker-Message-ID": message_id},
            timeout=PUBLISH_TIMEOUT_SECONDS,
        )
    except requests.RequestException as error:  # e.g. the worker serving it was killed
        run.failed[type(error).__name__] += 1
        return
    if answer.status_code == 201:
        run.published[message_id] = sent
    else:
        run.failed[f"HTTP {answer.status_code}"] += 1


def wait_until_all_delivered(
    bench: Bench, expected: int, sample: Callable[[], None], watch: Watch
) -> None:
    """Until every job is DELIVERED, for as long as deliveries go on: a loaded machine drains
    slowly, and only a stall (nothing delivered for --stall-seconds) or a death ends the wait."""
    delivered, progressed = -1, time.monotonic()
    while not watch.started_one_died():
        now = bench.scalar("SELECT count(*) FROM jobs_job WHERE status = 'DELIVERED'")
        if now >= expected:
            return
        if now > delivered:
            delivered, progressed = now, time.monotonic()
        elif time.monotonic() - progressed > bench.args.stall_seconds:
            print(f"  gave up: no job delivered for {bench.args.stall_seconds:g} s", flush=True)
            return
        sample()
        time.sleep(0.5)


# --- why a process ended ----------------------------------------------------------------------

# A log record starts with a date: gunicorn's "[2026-11-24 03:59:50 +0000] [pid] [LEVEL] …" and
# Django's "2026-11-24 03:59:50,007 LEVEL …"; the lines that follow (a traceback) belong to it.
RECORD_START = re.compile(r"^\[?\d{4}-\d\d-\d\d ")
# How gunicorn's master tells of a worker that did not end by itself (arbiter.py: murder_workers,
# reap_workers): its heartbeat stopped for --timeout seconds, a signal, a non-zero exit.
WORKER_KILLED = re.compile(
    r"WORKER TIMEOUT \(pid:(?P<timeout>\d+)\).*|Worker \(pid:(?P<pid>\d+)\) (?:was sent|exited).*"
)
STOPPING = "Handling signal: term"  # the master asked to stop: the soak is over


@dataclass
class Finding:
    """A process that ended during the soak: why, its log's relevant lines, whether it fails."""

    name: str
    why: str
    fails: bool
    log: list[str]

    def show(self) -> str:
        verdict = "fails the soak" if self.fails else "reported, not a failure"
        lines = "\n".join(f"      | {line}" for line in self.log)
        return f"    {self.name}: {self.why} ({verdict})\n{lines}"


def exit_status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def started_process_finding(watched: Watched, process: subprocess.Popen[bytes]) -> Finding:
    """A dispatcher, pull worker or the gunicorn master ending is always a failure."""
    why = f"pid {watched.pid} {exit_status(process.returncode)}, seen {watched.ended:.0f} s in"
    tail = log_tail(watched.log, 15).splitlines() if watched.log else ["(no log found)"]
    return Finding(watched.name, why, True, tail or ["(its log is empty)"])


def gunicorn_records(log: Path) -> list[list[str]]:
    """The master's log up to its stop, as records (a first line and its continuation)."""
    records: list[list[str]] = []
    for line in log.read_text(errors="replace").splitlines():
        if STOPPING in line:
            break
        if RECORD_START.match(line) or not records:
            records.append([line])
        else:
            records[-1].append(line)
    return records


def worker_findings(log: Path, ended: dict[int, Watched]) -> list[Finding]:
    """Each gunicorn worker that ended during the soak, or that the master's log says was killed
    (one can be born and killed between two samples).

    A killed worker fails the soak: the requests it was serving die with it (a producer gets a
    connection error, a pull worker's claimed jobs wait for their lease to expire), and a timeout
    means one of its requests or its heartbeat was stuck for --timeout seconds. A worker that
    ended by itself and was replaced (gunicorn's --max-requests recycling) is reported only.
    """
    records = gunicorn_records(log)
    killed = killed_workers(records)
    findings = []
    for pid in sorted(killed.keys() | ended.keys()):
        named = (f"[{pid}]", f"pid:{pid})", f"(pid: {pid})")
        about = [r for r in records if any(mark in r[0] for mark in named)]
        # The first line of each record and the end of its traceback: where the worker was.
        lines = [line for r in about for line in (r[0], *r[1:][-4:])]
        name = ended[pid].name if pid in ended else f"gunicorn worker {pid}"
        why = killed.get(pid, "ended by itself; gunicorn replaced it")
        findings.append(Finding(name, why, pid in killed, lines or ["(no record in the log)"]))
    return findings


def killed_workers(records: list[list[str]]) -> dict[int, str]:
    """pid -> what the master's log says of each worker it saw killed."""
    killed: dict[int, list[str]] = defaultdict(list)
    for record in records:
        for match in WORKER_KILLED.finditer(record[0]):
            killed[int(match["timeout"] or match["pid"])].append(match[0])
    return {pid: "; ".join(messages) for pid, messages in killed.items()}


def findings(watch: Watch, gunicorn_log: Path) -> list[Finding]:
    """Read once every process is stopped, so that every log is complete."""
    started = [started_process_finding(w, w.process) for w in watch.ended() if w.process]
    workers = {w.pid: w for w in watch.ended() if not w.process}
    return started + worker_findings(gunicorn_log, workers)


# --- the figures ------------------------------------------------------------------------------


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


def memory_growth(run: Run, seconds: float) -> dict[str, tuple[float, float, float, float]]:
    """Per process: (first sample's time, RSS then, at a quarter of the run, at its end) in MB."""
    growth = {}
    for name, samples in run.memory.items():
        quarter = next((rss for at, rss in samples if at >= seconds / 4), samples[-1][1])
        growth[name] = (samples[0][0], samples[0][1], quarter, samples[-1][1])
    return growth


def memory_failures(run: Run, args: argparse.Namespace) -> list[str]:
    print("  resident memory MB: start, at 1/4 of the run, end")
    failures = []
    growth = memory_growth(run, args.seconds)
    first_sample = min((first for first, *_ in growth.values()), default=0.0)
    for name, (first, start, quarter, end) in growth.items():
        grew = end - quarter
        # A process born during the run (a replacement worker) was still loading the app at its
        # first sample: its growth is not a leak, and its birth is a finding of its own.
        judged = first == first_sample
        note = f"{grew:+.1f} after 1/4" if judged else f"started {first:.0f} s in, not judged"
        print(f"    {name:22} {start:7.1f} {quarter:7.1f} {end:7.1f}  ({note})")
        if judged and grew > args.max_growth_mb:
            failures.append(f"{name} grew {grew:.1f} MB after the first quarter")
    return failures


def pull_record(path: Path) -> dict[str, Any] | None:
    """What a pull worker took (None when it wrote nothing: it was killed)."""
    return json.loads(path.read_text()) if path.exists() else None


# --- the run ----------------------------------------------------------------------------------


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
        watch, push, pull = run_processes(bench, run)
        ended = findings(watch, logs / "gunicorn.log")
        rows = bench.db.execute("SELECT status, count(*) FROM jobs_job GROUP BY 1").fetchall()
    failures = report(args, run, push, pull, dict(rows), ended)
    for failure in failures:
        print(f"  FAILED: {failure}")
    sys.exit(1 if failures else 0)


def run_processes(
    bench: Bench, run: Run
) -> tuple[Watch, dict[str, list[float]], dict[str, dict[str, Any] | None]]:
    """Start every process, soak, stop them all (so that every log is complete): the watch, what
    the receiver got, what each pull worker took."""
    args = bench.args
    with ExitStack() as stack:
        sinks = stack.enter_context(receivers(bench))
        prepare(bench, args.push, sinks.port)
        pull_names = make_pull_consumers(args.pull)
        api, master = stack.enter_context(api_server(bench, args.web_workers))
        options = DispatchOptions(args.concurrency, args.batch_size, args.poll_seconds)
        dispatching = stack.enter_context(dispatchers(bench, args.dispatchers, options))
        pulling = stack.enter_context(pull_workers(bench, api, pull_names))
        started = {f"dispatcher {n}": p for n, p in enumerate(dispatching)}
        started |= {f"pull worker {name}": p for name, p in pulling.items()}
        watch = Watch({**started, "gunicorn master": master}, master.pid)
        soak(bench, api, run, watch)
        push = sinks.received()
    return watch, push, {name: pull_record(bench.logs / f"{name}.json") for name in pull_names}


def soak(bench: Bench, api: str, run: Run, watch: Watch) -> None:
    """Publish for the run's length, then wait until every job is DELIVERED."""
    args = bench.args
    started = time.monotonic()
    last_sample = -math.inf

    def sample(force: bool = False) -> None:
        nonlocal last_sample
        now = time.monotonic() - started
        if force or now - last_sample >= args.sample_seconds:
            last_sample = now
            watch.sample(now, run.memory)

    sample(force=True)
    publish_steadily(api, args, run, sample, watch)
    sample(force=True)
    published = time.monotonic() - started
    expected = len(run.published) * (args.push + args.pull)
    wait_until_all_delivered(bench, expected, sample, watch)
    sample(force=True)
    # How long it took is the machine's business as much as the broker's: shown, not judged.
    drained = time.monotonic() - started - published
    print(f"  publishing took {published:.0f} s ({args.seconds:g} s planned), the drain after it"
          f" {drained:.0f} s", flush=True)  # fmt: skip


def report(
    args: argparse.Namespace,
    run: Run,
    push: dict[str, list[float]],
    pull: dict[str, dict[str, Any] | None],
    statuses: dict[str, int],
    ended: list[Finding],
) -> list[str]:
    """Print the figures; return what failed."""
    failures = [f"{f.name} died during the soak: {f.why}" for f in ended if f.fails]
    failures += [
        f"pull worker {name} wrote no record: its jobs count as lost"
        for name in pull
        if not pull[name]
    ]
    taken = {name: record or {"jobs": {}, "errors": {}} for name, record in pull.items()}
    failures += delivery_failures(args, run, push, taken, statuses)
    arrivals = {key.split(" ")[0]: first for key, (_, first) in push.items() if key.endswith(" c0")}
    print_latency("push (c0)", latency_by_minute(run, arrivals))
    for name, record in taken.items():
        claims = {message_id: first for message_id, (_, first) in record["jobs"].items()}
        print_latency(f"pull ({name})", latency_by_minute(run, claims))
    failures += memory_failures(run, args)
    print("  processes that ended during the soak:" if ended else "  no process ended")
    for finding in ended:
        print(finding.show())
    return failures


def delivery_failures(
    args: argparse.Namespace,
    run: Run,
    push: dict[str, list[float]],
    pull: dict[str, dict[str, Any]],
    statuses: dict[str, int],
) -> list[str]:
    """Print what was published and delivered; return what failed, was lost or not DELIVERED."""
    failed = sum(run.failed.values())
    print(f"\n  published {len(run.published):,} messages ({failed} failed: {dict(run.failed)});"
          f" jobs by status: {statuses}")  # fmt: skip
    received = [set(record["jobs"]) for record in pull.values()]  # message IDs per consumer
    for n in range(args.push):
        received.append({key.split(" ")[0] for key in push if key.endswith(f" c{n}")})
    lost = sum(len(run.published.keys() - ids) for ids in received)
    repeats = sum(int(count) - 1 for count, _ in push.values())
    repeats += sum(int(c) - 1 for record in pull.values() for c, _ in record["jobs"].values())
    errors: Counter[str] = sum((Counter(record["errors"]) for record in pull.values()), Counter())
    print(f"  lost {lost}, repeated deliveries {repeats}, pull worker errors {dict(errors)}")
    failures = []
    if failed:
        # One that failed with a connection error may still have been stored, and then has jobs.
        failures.append(f"broadcasts failed: {failed} {dict(run.failed)}")
    if lost:
        failures.append(f"{lost} jobs of accepted broadcasts never reached their consumer")
    if set(statuses) - {"DELIVERED"}:
        failures.append(f"jobs not DELIVERED: {statuses}")
    expected = len(run.published) * (args.push + args.pull)
    if not failed and sum(statuses.values()) != expected:
        failures.append(f"{sum(statuses.values()):,} jobs in the database, {expected:,} expected")
    return failures


if __name__ == "__main__":
    main()
