"""The machinery of bench/dispatch.py: database, receivers, dispatchers, CPU and memory, timing.

A drain (`drain_ours`) starts dispatcher processes and waits until they LISTEN, makes jobs due in
one committed transaction, times them from the first arrival at the receiver until SQL counts them
DELIVERED, stops the dispatchers with SIGTERM, and checks with SQL and the receiver's counts that
every job arrived exactly once. CPU comes from /proc, per group of processes.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
HOST = "127.0.0.1"
PG_PORT, PG_USER = 5432, "postgres"
# Another name lets a second run share the server (each drops and creates its own database).
DATABASE = os.environ.get("BENCH_DISPATCH_DATABASE", "bench_dispatch")
CHANNEL, PRODUCER = "bench", "bench-producer"
PAYLOAD = json.dumps({"order": 12345, "items": [{"sku": "A-1", "qty": 2}], "note": "x" * 160})
CORES = os.cpu_count() or 1
# The application_name of a dispatcher's LISTEN connection begins so (jobs/queue/rules.py,
# SESSION_PREFIX; not imported: the harness reads it before Django is set up).
LISTENER_PREFIX = "webhook-broker dispatcher "


@dataclass(frozen=True)
class DispatchOptions:
    concurrency: int = 128
    batch_size: int = 100
    poll_seconds: float = 1.0

    def arguments(self) -> list[str]:
        return [
            "--concurrency", str(self.concurrency),
            "--batch-size", str(self.batch_size),
            "--poll-seconds", str(self.poll_seconds),
        ]  # fmt: skip

    def __str__(self) -> str:
        return " ".join(self.arguments())


@dataclass
class Check:
    """Did every job arrive exactly once? From the receiver's counts and, for ours, from SQL."""

    expected: int = 0
    requests: int = 0
    duplicates: int = 0  # requests beyond the first per job
    missing: int = 0  # jobs that should have arrived and did not
    unexpected: int = 0  # jobs that arrived but are not DELIVERED
    statuses: Counter[str] = field(default_factory=Counter)
    retried: int = 0  # jobs that used more than one attempt
    attempt_rows: int | None = None

    @property
    def ok(self) -> bool:
        # SQL: every job looked at must be DELIVERED (a drain stopped midway through a backlog
        # looks only at jobs that were touched: the rest must still be QUEUED with no attempt).
        sql_ok = self.attempt_rows is None or set(self.statuses) == {"DELIVERED"}
        return not (self.duplicates or self.missing or self.unexpected) and sql_ok

    def __str__(self) -> str:
        text = (
            f"receiver: {self.requests} requests for {self.expected} jobs, {self.duplicates}"
            f" duplicates, {self.missing} missing, {self.unexpected} not DELIVERED"
        )
        if self.attempt_rows is not None:
            statuses = ", ".join(f"{n} {status}" for status, n in sorted(self.statuses.items()))
            text += f"; SQL: {statuses}, {self.retried} retried, {self.attempt_rows} attempt rows"
        return f"{text} -> {'OK' if self.ok else 'MISMATCH'}"


@dataclass
class Drain:
    """One timed run: `jobs` deliveries between the first arrival and the last completion."""

    label: str
    jobs: int
    first_arrival: float  # time.time()
    finished: float
    cpu: dict[str, float]  # CPU seconds by group over the run
    check: Check
    timed_out: bool = False

    @property
    def seconds(self) -> float:
        return self.finished - self.first_arrival

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    def report(self) -> None:
        per_job = {name: 1000 * cpu / self.jobs for name, cpu in self.cpu.items() if cpu}
        busy = {name: 100 * cpu / self.seconds for name, cpu in self.cpu.items() if cpu}
        timed_out = " (TIMED OUT)" if self.timed_out else ""
        print(
            f"  {self.label}: {self.jobs} deliveries in {self.seconds:.2f} s ="
            f" {self.rate:,.0f}/s{timed_out}\n"
            "  CPU ms per delivery: "
            + ", ".join(
                f"{name} {ms:.3f} ({busy[name]:.0f} % of a core)" for name, ms in per_job.items()
            )
            + f"\n  {self.check}",
            flush=True,
        )


@dataclass
class Verdict:
    scenario: str
    figure: str
    target: str
    met: bool


class Bench:
    """What the scenarios share: arguments, the database, logs, and the verdicts so far."""

    def __init__(self, args: argparse.Namespace, database_url: str, logs: Path) -> None:
        self.args = args
        self.database_url = database_url
        self.env = broker_environment(database_url)
        self.logs = logs
        self.db = psycopg.connect(database_url, autocommit=True)
        self.verdicts: list[Verdict] = []
        self.drains: dict[tuple[int, int], Drain] = {}  # (consumers, processes) -> our drain

    def verdict(self, scenario: str, figure: str, target: str, met: bool) -> None:
        self.verdicts.append(Verdict(scenario, figure, target, met))
        print(f"  TARGET {target}: {figure} -> {'met' if met else 'NOT met'}", flush=True)

    def options(self) -> DispatchOptions:
        """The dispatcher options the command line asked for."""
        return DispatchOptions(self.args.concurrency, self.args.batch_size, self.args.poll_seconds)

    def scalar(self, query: str, params: dict[str, Any] | None = None) -> Any:
        row = self.db.execute(query, params).fetchone()
        return row[0] if row else None


# --- the database ---------------------------------------------------------------------------


def admin_connection() -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(
        host=HOST, port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True
    )


def drop_database(name: str = DATABASE) -> None:
    with admin_connection() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def create_database(name: str) -> str:
    """An empty database `name` (dropped first if left over); its URL."""
    drop_database(name)
    with admin_connection() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return f"postgres://{PG_USER}@{HOST}:{PG_PORT}/{name}"


@contextmanager
def fresh_database(name: str = DATABASE) -> Iterator[str]:
    url = create_database(name)
    try:
        yield url
    finally:
        drop_database(name)


def broker_environment(database_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "broker.settings",
        "BROKER_ALLOW_PRIVATE_CALLBACKS": "true",
        "PYTHONUNBUFFERED": "1",
        "PYTHONWARNINGS": "ignore:No directory at:UserWarning",
    }


def setup_django(env: dict[str, str]) -> None:
    """Django in this process too: consumers are made with the ORM (their secrets are encrypted)
    and the latency and rss scenarios publish with `broker.publish()`."""
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)


def prepare(bench: Bench, consumers: int, port: int, max_in_flight: int | None = None) -> list[int]:
    """Empty tables, then one channel with `consumers` push consumers of the receiver on `port`."""
    from broker.models import Channel, Message, Producer
    from consumers.models import Consumer
    from jobs.models import DeliveryAttempt, DispatcherHeartbeat, Job

    tables = [model._meta.db_table for model in (DeliveryAttempt, Job, Message, Consumer)]
    tables.append(DispatcherHeartbeat._meta.db_table)
    bench.db.execute(
        sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
            sql.SQL(", ").join(map(sql.Identifier, tables))
        )
    )
    if not Producer.objects.filter(pk=PRODUCER).exists():
        producer = Producer(id=PRODUCER, name="Bench producer")
        producer.set_token("bench-producer-token")
        producer.save()
        channel = Channel(id=CHANNEL, name="Bench")
        channel.set_token("bench-channel-token")
        channel.save()
    return [
        Consumer.objects.create(
            channel_id=CHANNEL,
            public_id=f"c{n}",
            name=f"Consumer {n}",
            callback_url=f"http://{HOST}:{port}/c{n}",
            max_in_flight=max_in_flight,
        ).pk
        for n in range(consumers)
    ]


# Messages and one job per consumer, in one statement. Jobs are due at their message's time
# (spread over the last milliseconds, as if just published) plus `delay`.
# With `keys` > 0, message g gets the ordering key "k<g mod keys>" (round robin over the keys).
QUEUE_SQL = """
WITH message AS (
    INSERT INTO broker_message (channel_id, producer_id, public_id, payload, payload_file,
        payload_size, content_type, priority, headers, ordering_key, status, received_at,
        dispatched_at)
    SELECT %(channel)s, %(producer)s, %(prefix)s::text || g, %(payload)s::bytea, '',
        length(%(payload)s::bytea), 'application/json', 0, '{}'::jsonb,
        CASE WHEN %(keys)s::int > 0 THEN 'k' || g %% %(keys)s::int ELSE '' END, 'DISPATCHED', t, t
    FROM generate_series(1, %(messages)s::int) AS g,
        LATERAL (SELECT now() - (%(messages)s::int - g) * interval '1 microsecond' AS t) AS at
    RETURNING id, received_at, ordering_key
)
INSERT INTO jobs_job (message_id, consumer_id, status, priority, ordering_key, attempts,
    next_attempt_at, incremental_timeout, last_error, created_at, status_changed_at)
SELECT message.id, consumer.id, 'QUEUED', 0, message.ordering_key, 0,
    message.received_at + %(delay)s::interval, 0, '', message.received_at, message.received_at
FROM message CROSS JOIN unnest(%(consumers)s::bigint[]) AS consumer(id)
ORDER BY message.id, consumer.id
"""


def queue_jobs(
    bench: Bench,
    jobs: int,
    consumers: list[int],
    prefix: str,
    delay_seconds: float = 0,
    keys: int = 0,
) -> float:
    """Insert `jobs` jobs (jobs / consumers messages) in one transaction; the commit time."""
    messages = math.ceil(jobs / len(consumers))
    with bench.db.transaction():
        bench.db.execute(
            QUEUE_SQL,
            {
                "channel": CHANNEL,
                "producer": PRODUCER,
                "prefix": prefix,
                "payload": PAYLOAD.encode(),
                "messages": messages,
                "delay": f"{delay_seconds} seconds",
                "consumers": consumers,
                "keys": keys,
            },
        )
        bench.db.execute("SELECT pg_notify('broker_jobs', '')")  # as a publish does
    return time.time()


def delivered_so_far(bench: Bench) -> int:
    """Successful attempts recorded (written in the transaction that marks the job DELIVERED)."""
    return int(
        bench.scalar(
            "SELECT count(*) FROM jobs_deliveryattempt WHERE status_code BETWEEN 200 AND 299"
        )
    )


JOBS_SQL = """
SELECT m.public_id || ' ' || c.public_id, j.status, j.attempts
FROM jobs_job j JOIN broker_message m ON m.id = j.message_id
JOIN consumers_consumer c ON c.id = j.consumer_id
"""


def verify(
    bench: Bench, received: dict[str, list[float]], *, touched_only: bool = False, prefix: str = ""
) -> Check:
    """Compare the jobs in the database with what the receiver got.

    touched_only: only jobs that left QUEUED or were delivered (a drain stopped midway through a
    backlog); the QUEUED rest must then be untouched (attempts 0).
    prefix: only the jobs of messages whose ID begins so, and what the receiver got of them (one
    step of bench/end_to_end.py).
    """
    where = " WHERE starts_with(m.public_id, %(prefix)s)"
    where += " AND (j.status <> 'QUEUED' OR j.attempts <> 0)" if touched_only else ""
    rows = bench.db.execute(JOBS_SQL + where, {"prefix": prefix}).fetchall()
    delivered = {key for key, status, _ in rows if status == "DELIVERED"}
    check = Check(expected=len(rows) if not touched_only else len(delivered))
    check.statuses = Counter(status for _, status, _ in rows)
    check.retried = sum(attempts > 1 for _, _, attempts in rows)
    check.attempt_rows = int(
        bench.scalar(
            "SELECT count(*) FROM jobs_deliveryattempt a JOIN jobs_job j ON j.id = a.job_id"
            " JOIN broker_message m ON m.id = j.message_id"
            " WHERE starts_with(m.public_id, %(prefix)s)",
            {"prefix": prefix},
        )
        if prefix
        else bench.scalar("SELECT count(*) FROM jobs_deliveryattempt")
    )
    ours = {key: seen for key, seen in received.items() if key.startswith(prefix)}
    count_receipts(check, ours, delivered)
    return check


def count_receipts(check: Check, received: dict[str, list[float]], expected: set[str]) -> None:
    check.requests = int(sum(count for count, _ in received.values()))
    check.duplicates = int(sum(count - 1 for count, _ in received.values()))
    check.missing = len(expected - received.keys())
    check.unexpected = len(received.keys() - expected)


# --- processes ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def http_json(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method)  # noqa: S310 (our own loopback URL)
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
        return json.load(answer)


def start_process(
    command: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    """A process in a session of its own (so that it can be killed with its children)."""
    with log.open("wb") as output:
        return subprocess.Popen(  # noqa: S603
            command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def log_tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def stop_process(process: subprocess.Popen[bytes], name: str, timeout: float = 30) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        code = process.wait()
        print(f"  warning: {name} ignored SIGTERM for {timeout:g} s and was killed", flush=True)
    if code not in (0, -signal.SIGTERM):
        print(f"  warning: {name} exited with {code}", flush=True)


class Receivers:
    """`count` webhook_sink processes sharing one delivery port; their counts merged."""

    def __init__(self, count: int, delay_ms: float, logs: Path, status: int = 200) -> None:
        self.port = free_port()
        self.control_ports = [free_port() for _ in range(count)]
        command = [sys.executable, str(BENCH / "webhook_sink.py"), "--port", str(self.port)]
        command += ["--delay-ms", str(delay_ms), "--status", str(status), "--control-port"]
        self.processes = [
            start_process([*command, str(control)], logs / f"receiver-{control}.log")
            for control in self.control_ports
        ]
        self.delay_ms = delay_ms

    @property
    def pids(self) -> set[int]:
        return {process.pid for process in self.processes}

    def wait_until_serving(self, timeout: float = 60) -> None:
        # Generous: on a loaded machine the receiver's imports alone can take seconds.
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.summary()
                return
            except OSError:
                if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                    raise RuntimeError("the receiver did not start") from None
                time.sleep(0.1)

    def _each(self, path: str, method: str = "GET") -> list[Any]:
        return [http_json(f"http://{HOST}:{port}{path}", method) for port in self.control_ports]

    def reset(self) -> None:
        self._each("/reset", "POST")

    def summary(self) -> tuple[int, int]:
        """Requests and distinct jobs received so far (jobs summed over processes)."""
        answers = self._each("/summary")
        return sum(a["requests"] for a in answers), sum(a["jobs"] for a in answers)

    def received(self) -> dict[str, list[float]]:
        """Per job: [requests, first arrival], merged over the processes."""
        merged: dict[str, list[float]] = {}
        for answer in self._each("/stats"):
            for job, (count, first) in answer["jobs"].items():
                seen = merged.setdefault(job, [0, first])
                seen[0] += count
                seen[1] = min(seen[1], first)
        return merged

    def stop(self) -> None:
        for process in self.processes:
            stop_process(process, "receiver")


@contextmanager
def receivers(bench: Bench, delay_ms: float = 0) -> Iterator[Receivers]:
    sinks = Receivers(bench.args.receivers, delay_ms, bench.logs)
    try:
        sinks.wait_until_serving()
        yield sinks
    finally:
        sinks.stop()


def wait_until_listening(
    bench: Bench, processes: list[subprocess.Popen[bytes]], logs: list[Path]
) -> None:
    """Until every dispatcher has written its heartbeat and LISTENs (so a NOTIFY wakes it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for process, log in zip(processes, logs, strict=True):
            if process.poll() is not None:
                raise RuntimeError(f"a dispatcher exited early:\n{log_tail(log)}")
        beats = bench.scalar("SELECT count(*) FROM jobs_dispatcherheartbeat")
        # The last statement of its LISTEN connection: a LISTEN, or once it has run out of work a
        # statement of its wake-up guard, which comes after them (jobs/queue/sql/wakeup.sql).
        listening = bench.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND starts_with(application_name, %(prefix)s)"
            " AND (query ILIKE 'LISTEN%%' OR query ILIKE '%%advisory%%')",
            {"prefix": LISTENER_PREFIX},
        )
        if beats >= len(processes) and listening >= len(processes):
            return
        time.sleep(0.05)
    print("  warning: dispatchers not seen listening after 60 s; going on", flush=True)


@contextmanager
def dispatchers(
    bench: Bench, count: int, options: DispatchOptions
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`count` dispatcher processes, idle and listening; SIGTERM and waited for on exit."""
    command = [*bench.args.dispatch_command.split(), *options.arguments()]
    processes: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        for _ in range(count):
            logs.append(bench.logs / f"dispatcher-{time.monotonic_ns()}.log")
            processes.append(start_process(command, logs[-1], bench.env))
        wait_until_listening(bench, processes, logs)
        yield processes
    finally:
        for process in processes:
            stop_process(process, "dispatcher")


# --- CPU and memory from /proc (Linux) ------------------------------------------------------


class ProcessCpu(NamedTuple):
    parent: int
    command: str
    cpu: float  # its own CPU seconds so far
    # And of its children that have ended and been waited for: a worker process that a pool
    # replaced is still counted, by its parent.
    ended_children: float


CpuTable = dict[int, ProcessCpu]  # by pid


def process_stat(pid: int | str) -> ProcessCpu:
    """A process's parent, command and CPU so far, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    command = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[1]: parent pid; fields[11] to [14]: utime, stime, cutime, cstime in clock ticks
    # (man 5 proc).
    own, children = (int(fields[n]) + int(fields[n + 1]) for n in (11, 13))
    tick = os.sysconf("SC_CLK_TCK")
    return ProcessCpu(int(fields[1]), command, own / tick, children / tick)


def cpu_table() -> CpuTable:
    table: CpuTable = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                table[int(entry.name)] = process_stat(entry.name)
            except OSError:  # it ended meanwhile
                continue
    return table


def descendants(table: CpuTable, roots: set[int]) -> set[int]:
    """`roots` and every process below them in `table`."""
    members = roots & table.keys()
    while grown := {pid for pid, process in table.items() if process.parent in members} - members:
        members |= grown
    return members


def cpu_by_group(
    before: CpuTable, after: CpuTable, groups: dict[str, set[int]], rabbitmq: bool = False
) -> dict[str, float]:
    """CPU seconds between two tables for each group of processes (with every process below
    them, those that ended in between included), for PostgreSQL (every process named postgres; a
    backend that ended in between is not counted) and, when asked, for RabbitMQ (its Erlang VM,
    beam.smp)."""

    def tree(table: CpuTable, roots: set[int]) -> float:
        return sum(table[pid].cpu + table[pid].ended_children for pid in descendants(table, roots))

    def used(pid: int) -> float:
        return after[pid].cpu - (before[pid].cpu if pid in before else 0.0)

    totals = {name: tree(after, pids) - tree(before, pids) for name, pids in groups.items()}
    named = {"postgres": "postgres", **({"rabbitmq": "beam.smp"} if rabbitmq else {})}
    for name, prefix in named.items():
        totals[name] = sum(used(pid) for pid in commands(after, prefix))
    return totals


def commands(table: CpuTable, prefix: str) -> set[int]:
    """The processes in `table` whose command begins with `prefix`."""
    return {pid for pid, process in table.items() if process.command.startswith(prefix)}


def database_backends(bench: Bench, database: str | None = None) -> set[int]:
    """The PostgreSQL backends serving `database` (default: the bench's) now, but the bench's own
    connection. As a group of `cpu_by_group`: what the server did for them alone, where every
    process named postgres includes the other work on this shared machine."""
    rows = bench.db.execute(
        "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
        " AND datname = coalesce(%(database)s, current_database())",
        {"database": database},
    ).fetchall()
    return {int(row[0]) for row in rows}


def process_cpu(pid: int) -> float:
    return process_stat(pid)[2]


def resident_mb(pid: int) -> float | None:
    """Resident memory in MB; None once the process has ended (a zombie has no VmRSS)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def rss_mb(pid: int) -> float:
    """Resident memory in MB of a process that must still be running."""
    rss = resident_mb(pid)
    if rss is None:
        raise ProcessLookupError(f"process {pid} has ended")
    return rss


def children_of(pid: int) -> set[int]:
    """The running children of `pid` (/proc/PID/task/*/children needs CONFIG_PROC_CHILDREN,
    which the test machine's kernel lacks)."""
    return {child for child, process in cpu_table().items() if process.parent == pid}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def close_django_connections() -> None:
    from django.db import connections

    connections.close_all()


# --- timing a drain -------------------------------------------------------------------------


def wait_for(
    progress: Callable[[], int], target: int, timeout: float, alive: Callable[[], bool]
) -> tuple[float, bool]:
    """Poll `progress` until it reaches `target`: (the time it did, timed out?)."""
    deadline = time.monotonic() + timeout
    while progress() < target:
        if time.monotonic() > deadline or not alive():
            return time.time(), True
        time.sleep(0.02)
    return time.time(), False


def drain_timeout(bench: Bench, jobs: int) -> float:
    return float(bench.args.timeout or max(60.0, jobs / 100))


def wait_for_delivered(
    bench: Bench, sinks: Receivers, jobs: int, processes: list[subprocess.Popen[bytes]]
) -> tuple[float, bool]:
    """Until `jobs` jobs are DELIVERED: (that moment, timed out?).

    The receiver's in-memory count is polled first: counting rows every 20 ms would cost
    PostgreSQL more as the table grows, and steal CPU from what is measured. SQL then confirms:
    a successful attempt row is written in the transaction that marks its job DELIVERED.
    """

    def alive() -> bool:
        return all(process.poll() is None for process in processes)

    arrived, timed_out = wait_for(
        lambda: sinks.summary()[1], jobs, drain_timeout(bench, jobs), alive
    )
    if timed_out:
        return arrived, True
    return wait_for(lambda: delivered_so_far(bench), jobs, 30, alive)


def drain_ours(
    bench: Bench,
    sinks: Receivers,
    label: str,
    processes: int,
    options: DispatchOptions,
    make_due: Callable[[], object],
    jobs: int,
    *,
    touched_only: bool = False,
) -> Drain:
    """Start dispatchers, let `make_due` commit `jobs` due jobs, time them until DELIVERED."""
    sinks.reset()
    with dispatchers(bench, processes, options) as running:
        before = cpu_table()
        make_due()
        finished, timed_out = wait_for_delivered(bench, sinks, jobs, running)
        after = cpu_table()
        groups = {"dispatcher": {p.pid for p in running}, "receiver": sinks.pids}
        groups["database"] = database_backends(bench)
    received = sinks.received()
    first = min((seen[1] for seen in received.values()), default=finished)
    check = verify(bench, received, touched_only=touched_only)
    cpu = cpu_by_group(before, after, groups)
    # Cut off by the timeout: the rate (and CPU per delivery) of what was delivered by then.
    done = check.statuses["DELIVERED"] if timed_out else jobs
    drain = Drain(label, done, first, finished, cpu, check, timed_out)
    drain.report()
    return drain


def drain_queued(
    bench: Bench,
    sinks: Receivers,
    label: str,
    processes: int,
    options: DispatchOptions,
    consumer_ids: list[int],
) -> Drain:
    """The drain of `--jobs` fresh jobs spread over the consumers."""
    jobs = bench.args.jobs
    make_due = functools.partial(queue_jobs, bench, jobs, consumer_ids, "d")
    return drain_ours(bench, sinks, label, processes, options, make_due, jobs)


# --- the same webhooks through a peer (bench/celery_peer.py and the others) -----------------


@dataclass(frozen=True)
class Webhook:
    """One job as a peer sends it: our payload to a consumer's URL on the receiver."""

    url: str
    message_id: str
    consumer: str
    body: str = PAYLOAD

    def headers(self, agent: str) -> dict[str, str]:
        """The headers our dispatcher sends, but for the signature (the peer's task signs)."""
        return {
            "Content-Type": "application/json",
            "X-Broker-Message-ID": self.message_id,
            "X-Broker-Message-Priority": "0",
            "X-Broker-Channel-ID": CHANNEL,
            "X-Broker-Consumer-ID": self.consumer,
            "X-Broker-Consumer-Token": "t" * 43,
            "X-Request-ID": os.urandom(16).hex(),
            "User-Agent": agent,
        }


def peer_webhooks(port: int, jobs: int, consumers: int) -> list[Webhook]:
    """`jobs` webhooks, as `queue_jobs` lays them out: jobs / consumers messages to each."""
    messages = math.ceil(jobs / consumers)
    return [
        Webhook(f"http://{HOST}:{port}/c{n}", f"k{g}", f"c{n}")
        for g in range(1, messages + 1)
        for n in range(consumers)
    ]


class Peer(Protocol):
    """A task queue that sends the same webhooks as our dispatchers (a module of its own each)."""

    name: str  # its CPU group
    broker: str  # the CPU group of its broker: "database" (PostgreSQL's backends) or "rabbitmq"
    database: str | None  # the broker's database, if not the bench's

    def label(self, processes: int) -> str: ...
    def unavailable(self) -> str | None: ...  # why it cannot run here, if it cannot
    def open(self) -> None: ...  # before its first drain
    def close(self) -> None: ...  # leaves the server as it found it
    def enqueue(self, webhooks: list[Webhook]) -> None: ...  # with no worker running
    def start(self, processes: int, log: Path) -> subprocess.Popen[bytes]: ...  # the workers


def drain_peer(bench: Bench, sinks: Receivers, peer: Peer, processes: int, consumers: int) -> Drain:
    """Queue one task per job with the peer's workers stopped, start them, and time them from
    the first request at the receiver (their start-up is not counted) until the receiver has
    every webhook; CPU of the workers (every process below the one started) and of the broker
    (its database's backends, or RabbitMQ)."""
    webhooks = peer_webhooks(sinks.port, bench.args.jobs, consumers)
    sinks.reset()
    started = time.perf_counter()
    peer.enqueue(webhooks)
    print(f"  {peer.name}: queued {len(webhooks)} tasks in {time.perf_counter() - started:.1f} s")
    log = bench.logs / f"{peer.name}-{processes}.log"
    worker = peer.start(processes, log)
    try:
        wait_for(lambda: sinks.summary()[0], 1, 60, lambda: worker.poll() is None)
        before = cpu_table()
        finished, timed_out = wait_for(
            lambda: sinks.summary()[1],
            len(webhooks),
            drain_timeout(bench, len(webhooks)),
            lambda: worker.poll() is None,
        )
        after = cpu_table()
        groups = {peer.name: {worker.pid}, "receiver": sinks.pids}
        if peer.broker == "database":
            groups["database"] = database_backends(bench, peer.database)
    finally:
        if worker.poll() is not None:
            print(f"  the {peer.name} workers exited early:\n{log_tail(log)}")
        stop_process(worker, f"{peer.name} workers")
    received = sinks.received()
    check = Check(expected=len(webhooks))
    count_receipts(check, received, {f"{w.message_id} {w.consumer}" for w in webhooks})
    first = min((seen[1] for seen in received.values()), default=finished)
    cpu = cpu_by_group(before, after, groups, rabbitmq=peer.broker == "rabbitmq")
    done = len(received) if timed_out else len(webhooks)
    drain = Drain(peer.label(processes), done, first, finished, cpu, check, timed_out)
    drain.report()
    return drain


# --- the run's header ---


def machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    with admin_connection() as conn:
        version = conn.execute("SHOW server_version").fetchone()
        # Long runs churn the jobs table: without autovacuum its dead rows are never reclaimed.
        autovacuum = conn.execute("SHOW autovacuum").fetchone()
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {CORES} cores ({model}); Python"
        f" {platform.python_version()}; PostgreSQL {version[0] if version else '?'}"
        f" (autovacuum {autovacuum[0] if autovacuum else '?'}); code {revision()};"
        f" load average {load}"
    )


def revision() -> str:
    """The commit measured, and whether the broker's code differs from it."""

    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)  # noqa: S603, S607
        return run.stdout.strip()

    changed = git("status", "--porcelain", "--", "broker", "consumers", "jobs")
    return (git("rev-parse", "--short", "HEAD") or "?") + (
        " + uncommitted changes" if changed else ""
    )
