"""The admin API at upstream's size (issue 21): every read endpoint of the admin REST API against
gunicorn over 25,000,000 jobs and 50,000,000 delivery attempts generated in SQL, the database's
size per million jobs, and optionally the dispatcher's drain rate, the broadcast latency, and
requeue and purge of a 1,000,000-job DLQ.

Targets (issue 21): every admin read endpoint answers within 1 s, most within 100 ms (the median
of 5 requests with a warm cache, after one warm-up); the size per million jobs is reported for
disk planning. With --dispatch: the drain rate >= 80 % and the broadcast's median answer time
within 20 % of the same measurement on a fresh empty database. With --dlq-actions: how long
requeue and purge of the biggest DLQ take, in how many batches, the longest batch's
transaction, and how fast the dispatcher's claim still answers meanwhile (run through the API's
own batches, committed; the DLQ is saved before and put back after, so the data set stays).
With --ui: the operator UI's dashboard, lists and detail pages (bench/ui.py's pages, in headless
Chromium as a staff superuser) each load within 500 ms, median of 5 after a warm-up.

Builds the database `broker_bench_scale` once (migrations, then 30 days of messages of
realistic sizes over 20 channels and 200 consumers, 20 % of the jobs DEAD, 4 % QUEUED, the rest
DELIVERED, two attempts per job on average, set-based SQL from bench/scale_data.sql and
bench/ui_data.sql) and reuses it on later runs; `--rebuild` makes it again. The build is
resumable: every batch commits with a row saying it is done, so a build cut short (Ctrl-C, a
restart of PostgreSQL, which it waits for and survives) goes on where it stopped when run
again. Then starts gunicorn as production runs it on a free loopback port, times each endpoint
with urllib as an admin (a token of BROKER_ADMIN_TOKENS) and prints a table. The database is
left in place.

    .venv/bin/python bench/scale.py                        # 25,000,000 jobs (builds once)
    .venv/bin/python bench/scale.py --scale 0.01 --database broker_bench_scale_small  # CI smoke
    .venv/bin/python bench/scale.py --build-only           # build or resume, measure nothing
    .venv/bin/python bench/scale.py --explain              # and EXPLAIN the endpoints over bound
    .venv/bin/python bench/scale.py --dispatch --dlq-actions --ui  # and the rest of issue 21's

With `--from-migration 0013` a new build is made at jobs migration 0013 (before the time
partitions: plain tables, as a broker upgraded from then has them), and then `manage.py
migrate` is run over it as an operator upgrading runs it, timed, and checked: every job and
attempt kept, in the same states, every index of every partition valid and attached. Exits 1
if not (CI runs it on the 1 % set):

    .venv/bin/python bench/scale.py --scale 0.01 --database broker_bench_m1 --rebuild \
        --from-migration 0013 --build-only
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dispatch_harness
import psycopg
from dispatch_harness import (
    HOST,
    PAYLOAD,
    ROOT,
    Bench,
    Receivers,
    admin_connection,
    broker_environment,
    dispatchers,
    drop_database,
    machine,
    percentile,
    queue_jobs,
    receivers,
    wait_for,
)
from psycopg import sql
from secondary_indexes import BIG_TABLES, require_valid_indexes, secondary_indexes
from ui import (
    BROKER_RETRY_DELAYS,
    CHANNELS,
    CONSUMERS,
    create_database,
    data_steps,
    database_url,
    django_here,
    fill_profiles,
    gunicorn,
    has_column,
    make_consumers,
    migrate,
    timed,
)
from ui import explain as explain_pages
from ui import measure_all as measure_pages
from ui import print_table as print_pages

DEFAULT_DATABASE = "broker_bench_scale"
DEFAULT_JOBS = 25_000_000
DATA_SQL = Path(__file__).with_name("scale_data.sql")
# BROKER_ADMIN_TOKENS of this bench's server only.
ADMIN_TOKEN = "bench-scale-admin-token"  # noqa: S105
BOUND_MS, FAST_MS = 1000, 100  # every endpoint within 1 s, most within 100 ms (issue 21)

# The data set's shape (issue 21): of every 25 jobs, 5 DEAD, 1 QUEUED, the rest DELIVERED; two
# attempts per job on average.
DEAD_SHARE, QUEUED_SHARE, ATTEMPTS_PER_JOB = 0.20, 0.04, 2.0
QUEUED_RETRY = 0.2  # of the QUEUED jobs, those that failed once and wait for their retry
HISTORY = timedelta(days=30)
# The consumer whose DLQ the requeue and purge measurements need at 1,000,000 jobs: ui.py's
# most failing consumer of the largest channel (44 % of the messages), down from the start of
# the history until OUTAGE_END before its end, so that 91 % of its jobs are dead.
CHANNEL, DLQ_CONSUMER = "orders", "clickhouse-sink"
OUTAGE_END = timedelta(days=2.7)
FIRST_CHANNEL_SHARE = 0.44  # scale_data.sql's messages step: the other 19 share the rest
# How far each consumer lags behind, as a multiple of the mean lag (QUEUED_SHARE of the
# history, 28.8 h): its newest jobs wait QUEUED. The multiples average 1, so 4 % of the jobs
# wait; every one of the 200 consumers has some.
LAG = {
    "billing": 0.5, "warehouse": 1.5, "analytics": 0.8, "crm-sync": 0.3, "search-indexer": 3.0,
    "email": 0.6, "fraud-check": 0.2, "clickhouse-sink": 0.1, "slack-notify": 1.0,
    "audit-log": 2.0,
}  # fmt: skip
MESSAGES_PER_BATCH = 200_000  # messages per INSERT (each a transaction of its own)
JOBS_PER_BATCH = 1_000_000  # jobs (and their ~2,000,000 attempts) per transaction
RECONNECTS = 10  # restarts of PostgreSQL a build waits for before it gives up
# gunicorn's worker timeout and start-up wait: an endpoint far over its bound (minutes, cold)
# still gets a figure rather than a killed worker, and the start may wait on a busy database.
LENIENT = {"timeout": 900, "start_seconds": 120}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--jobs", type=int, help=f"jobs to generate (default {DEFAULT_JOBS:,})")
    size.add_argument("--scale", type=float, help=f"jobs as a fraction of {DEFAULT_JOBS:,}")
    parser.add_argument("--database", default=DEFAULT_DATABASE)
    parser.add_argument("--rebuild", action="store_true", help="drop and generate it again")
    parser.add_argument("--build-only", action="store_true", help="build (or resume), no timing")
    parser.add_argument(
        "--from-migration", metavar="N", help="build at jobs migration N, then migrate (see above)"
    )
    parser.add_argument("--runs", type=int, default=5, help="measured requests per endpoint")
    parser.add_argument("--page", type=int, default=100, help="the deep page of the lists")
    parser.add_argument("--workers", type=int, default=2 * (os.cpu_count() or 1) + 1)
    parser.add_argument(
        "--dlq-actions",
        action="store_true",
        help="also time requeue and purge of the big DLQ in batches (put back after; then VACUUM)",
    )
    parser.add_argument("--dlq-action", choices=sorted(ACTIONS), help=argparse.SUPPRESS)
    parser.add_argument(
        "--dispatch",
        action="store_true",
        help="also the drain rate and broadcast latency against an empty database",
    )
    parser.add_argument("--dispatch-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--ui",
        action="store_true",
        help="also the operator UI's dashboard, lists and detail pages in headless Chromium",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="for each endpoint (and with --ui each page) over its bound, its slowest queries with"
        " EXPLAIN (ANALYZE, BUFFERS)",
    )
    args = parser.parse_args()
    args.jobs = args.jobs or round(DEFAULT_JOBS * (args.scale or 1))
    if args.jobs < 100_000:
        parser.error("--jobs: at least 100,000 (every consumer needs dead and queued jobs)")
    return args


# --- the data set's plan: rates that give the shares asked for -----------------------------


def channel_shares() -> list[float]:
    """Each channel's share of the messages, as scale_data.sql's messages step draws them."""
    rest = 1 - FIRST_CHANNEL_SHARE
    return [
        FIRST_CHANNEL_SHARE,
        *(rest * (math.sqrt((k + 1) / 19) - math.sqrt(k / 19)) for k in range(19)),
    ]


@dataclass(frozen=True)
class Share:
    """One consumer: its share of all jobs, the shares of its jobs that are QUEUED (its lag)
    and in its outage, its relative dead rate, and its attempts."""

    jobs: float
    queued: float
    outage: float
    dead_weight: float
    max_attempts: int
    dead_attempts: int


def consumer_shares() -> dict[tuple[str, str], Share]:
    """(channel, consumer) -> Share, from ui.py's consumers and this bench's LAG and outage."""
    shares = {}
    for channel, channel_share in zip(CHANNELS, channel_shares(), strict=True):
        for name, behaviour in CONSUMERS.items():
            attempts = 1 + len(behaviour.retry_delays or BROKER_RETRY_DELAYS)
            shares[(channel, name)] = Share(
                jobs=channel_share / len(CONSUMERS),
                queued=LAG[name] * QUEUED_SHARE,
                outage=1 - OUTAGE_END / HISTORY
                if (channel, name) == (CHANNEL, DLQ_CONSUMER)
                else 0,
                dead_weight=behaviour.dead_rate,
                max_attempts=attempts,
                dead_attempts=1 if behaviour.non_retryable else attempts,
            )
    return shares


def bisect(function: Callable[[float], float], target: float, low: float, high: float) -> float:
    """x in [low, high] where the increasing `function` reaches `target`."""
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if function(middle) < target else (low, middle)
    return (low + high) / 2


def dead_share(scale: float, shares: dict[tuple[str, str], Share]) -> float:
    """The expected share of DEAD jobs when each consumer dies at `scale` x its weight."""
    return sum(
        s.jobs * (s.outage + (1 - s.queued - s.outage) * min(1.0, scale * s.dead_weight))
        for s in shares.values()
    )


def attempts_per_job(retry_p: float, scale: float, shares: dict[tuple[str, str], Share]) -> float:
    """The expected attempts per job: a dead job used all of its consumer's, a delivered one
    1 + a geometric number (capped), a share of the QUEUED ones one."""
    total = 0.0
    for s in shares.values():
        dead = s.outage + (1 - s.queued - s.outage) * min(1.0, scale * s.dead_weight)
        delivered = 1 - s.queued - dead
        per_delivered = (1 - retry_p**s.max_attempts) / (1 - retry_p)
        total += s.jobs * (
            dead * s.dead_attempts + s.queued * QUEUED_RETRY + delivered * per_delivered
        )
    return total


@dataclass(frozen=True)
class Plan:
    jobs: int
    history_end: datetime
    dead_scale: float  # a consumer's dead rate: this x its Behaviour.dead_rate
    retry_p: float  # a delivered job needed another attempt with this probability

    @property
    def messages(self) -> int:
        return self.jobs // len(CONSUMERS)


def make_plan(jobs: int, history_end: datetime) -> Plan:
    shares = consumer_shares()
    scale = bisect(lambda x: dead_share(x, shares), DEAD_SHARE, 0, 20)
    retry_p = bisect(lambda p: attempts_per_job(p, scale, shares), ATTEMPTS_PER_JOB, 0, 0.95)
    return Plan(jobs, history_end, scale, retry_p)


# --- the database: a resumable build ---------------------------------------------------------

PROGRESS_TABLE = """
CREATE TABLE IF NOT EXISTS bench_scale_progress (step text PRIMARY KEY, seconds float8 NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now())
"""
PLAN_TABLE = """
CREATE TABLE IF NOT EXISTS bench_scale_plan (jobs bigint NOT NULL,
    history_end timestamptz NOT NULL, dead_scale float8 NOT NULL, retry_p float8 NOT NULL)
"""


def database_exists(name: str) -> bool:
    with admin_connection() as conn:
        return bool(conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone())


def finished_build(url: str) -> dict[str, Any] | None:
    """The meta row of a finished build (written last), or None."""
    with psycopg.connect(url) as conn:
        if conn.execute("SELECT to_regclass('bench_scale_meta')").fetchone() == (None,):
            return None
        cursor = conn.execute("SELECT * FROM bench_scale_meta")
        row = cursor.fetchone()
        names = [column.name for column in cursor.description or []]
    return dict(zip(names, row, strict=True)) if row else None


def stored_plan(url: str) -> Plan | None:
    """The plan of a build begun in this database (so a resumed build keeps its history's end)."""
    with psycopg.connect(url) as conn:
        if conn.execute("SELECT to_regclass('bench_scale_plan')").fetchone() == (None,):
            return None
        row = conn.execute("SELECT jobs, history_end, dead_scale, retry_p FROM bench_scale_plan")
        found = row.fetchone()
    return Plan(int(found[0]), found[1], float(found[2]), float(found[3])) if found else None


class Builder:
    """Runs the build's steps once each: a step commits with its row in bench_scale_progress,
    so a step that was cut short runs again from its start, and a finished one never again."""

    SESSION = (
        "session_replication_role = replica",  # no foreign key triggers while loading
        "synchronous_commit = off",
        "maintenance_work_mem = '1GB'",
        "work_mem = '256MB'",
    )

    def __init__(self, url: str, plan: Plan) -> None:
        self.url = url
        self.plan = plan
        self.conn = self.connect()

    def connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.url, autocommit=True)
        for setting in self.SESSION:
            conn.execute(f"SET {setting}")
        for name, value in {
            "bench.now": self.plan.history_end.isoformat(),
            "bench.messages": str(self.plan.messages),
            "bench.retry_p": repr(self.plan.retry_p),
            "bench.queued_retry": repr(QUEUED_RETRY),
        }.items():
            conn.execute("SELECT set_config(%s, %s, false)", [name, value])
        return conn

    def done(self, step: str) -> bool:
        found = self.conn.execute("SELECT 1 FROM bench_scale_progress WHERE step = %s", [step])
        return found.fetchone() is not None

    def step(self, name: str, work: Callable[[psycopg.Connection[Any]], object]) -> None:
        """`work` and its progress row in one transaction, unless it is done already."""
        if self.done(name):
            return
        started = time.monotonic()
        with self.conn.transaction():
            work(self.conn)
            self.record(name, time.monotonic() - started)
        print(f"  {name}: {time.monotonic() - started:.0f} s", flush=True)

    def outside_transaction(
        self, name: str, work: Callable[[psycopg.Connection[Any]], object]
    ) -> None:
        """For VACUUM, which cannot run in a transaction (and may simply run again)."""
        if self.done(name):
            return
        started = time.monotonic()
        work(self.conn)
        self.record(name, time.monotonic() - started)
        print(f"  {name}: {time.monotonic() - started:.0f} s", flush=True)

    def record(self, name: str, seconds: float) -> None:
        self.conn.execute(
            "INSERT INTO bench_scale_progress (step, seconds) VALUES (%s, %s)", [name, seconds]
        )

    def batch(
        self, statements: list[str], lo: int, hi: int
    ) -> Callable[[psycopg.Connection[Any]], None]:
        def run(conn: psycopg.Connection[Any]) -> None:
            conn.execute("SELECT set_config('bench.lo', %s, false)", [str(lo)])
            conn.execute("SELECT set_config('bench.hi', %s, false)", [str(hi)])
            for statement in statements:
                conn.execute(statement)

        return run


def sql_steps() -> dict[str, str]:
    """This bench's steps (scale_data.sql) over ui_data.sql's, which it reuses in part."""
    parts = re.split(r"^-- step: (\S+)\n", DATA_SQL.read_text(), flags=re.MULTILINE)
    ours = {
        name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }
    return {**data_steps(), **ours}


def profiles(conn: psycopg.Connection[Any], plan: Plan) -> None:
    """ui.py's consumer profiles (fill_profiles) with this data set's dead rates, outage and
    lags instead of ui.py's outages and backlogs (with those the shares would not add up)."""
    fill_profiles(conn, plan.history_end)
    shares = consumer_shares()
    rows = conn.execute("SELECT consumer_id, channel_id, name FROM bench_ui_profile").fetchall()
    end = plan.history_end
    updates = []
    for consumer_id, channel, name in rows:
        share = shares[(channel, name)]
        outage = (
            (end - HISTORY - timedelta(days=1), end - OUTAGE_END) if share.outage else (None, None)
        )
        updates.append(
            (
                min(1.0, plan.dead_scale * share.dead_weight),
                *outage,
                end - share.queued * HISTORY,
                consumer_id,
            )
        )
    conn.cursor().executemany(
        "UPDATE bench_ui_profile SET dead_rate = %s, down_from = %s, down_to = %s,"
        " backlog_since = %s WHERE consumer_id = %s",
        updates,
    )


def time_partitions(conn: psycopg.Connection[Any], url: str, plan: Plan) -> None:
    """The time partitions (BROKER_PARTITION_DAYS) of jobs and attempts over the whole history,
    made by the broker's own code as its housekeeping would have made them during the month."""
    since = plan.history_end - HISTORY - timedelta(days=2)
    code = (
        "from datetime import datetime; from django.utils import timezone;"
        " from jobs import partitions; partitions.ensure_partitions("
        f"timezone.now(), since=datetime.fromisoformat({since.isoformat()!r}))"
    )
    command = [sys.executable, "manage.py", "shell", "-c", code]
    subprocess.run(command, cwd=ROOT, env={**os.environ, "DATABASE_URL": url}, check=True)  # noqa: S603


def drop_indexes(conn: psycopg.Connection[Any]) -> None:
    """The bulk load runs without the secondary indexes of the three big tables (built once at
    the end, far faster than kept up row by row) and without autovacuum on them (it would scan
    what the next batch makes stale). Their definitions are kept for the index steps."""
    conn.execute("CREATE TABLE bench_scale_index (name text PRIMARY KEY, definition text)")
    for name, definition in secondary_indexes(conn):  # built again on every partition
        conn.execute("INSERT INTO bench_scale_index VALUES (%s, %s)", [name, definition])
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
    for table in leaf_tables(conn):
        conn.execute(
            sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(sql.Identifier(table))
        )


def leaf_tables(conn: psycopg.Connection[Any]) -> list[str]:
    """The big tables, or their partitions where they are partitioned (a partitioned table
    takes no storage parameter such as autovacuum_enabled)."""
    found = conn.execute(
        "SELECT c.relname FROM pg_class c WHERE c.relkind = 'r'"
        " AND c.relnamespace = 'public'::regnamespace"
        " AND coalesce(pg_partition_root(c.oid), c.oid)::regclass::text = ANY(%s)",
        [BIG_TABLES],
    )
    return [name for (name,) in found.fetchall()]


def enable_autovacuum(conn: psycopg.Connection[Any]) -> None:
    for table in leaf_tables(conn):
        conn.execute(
            sql.SQL("ALTER TABLE {} RESET (autovacuum_enabled)").format(sql.Identifier(table))
        )


def vacuum(conn: psycopg.Connection[Any]) -> None:
    """Visibility map and statistics, as autovacuum would have them on a broker that has run
    for a month (the counts' index-only scans depend on the former)."""
    for table in BIG_TABLES:
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table)))
    conn.execute("ANALYZE")


def run_sql(statement: str) -> Callable[[psycopg.Connection[Any]], None]:
    def run(conn: psycopg.Connection[Any]) -> None:
        conn.execute(statement)

    return run


def ranges(first: int, last: int, size: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + size, last + 1)) for lo in range(first, last + 1, size)]


def load(builder: Builder) -> None:
    """Every SQL step of the build, each skipped when done."""
    plan, steps = builder.plan, sql_steps()
    for function in ("functions", "pick"):  # CREATE OR REPLACE: cheap, run every time
        builder.conn.execute(steps[function])
    builder.step("profiles", functools.partial(profiles, plan=plan))
    if has_column(builder.conn, "jobs_job", "partition_at"):  # since jobs 0014
        builder.step(
            "time partitions", functools.partial(time_partitions, url=builder.url, plan=plan)
        )
    else:
        steps["jobs"] = without_partition_key(steps["jobs"])
    builder.step("drop secondary indexes", drop_indexes)
    for lo, hi in ranges(1, plan.messages, MESSAGES_PER_BATCH):
        builder.step(f"messages {lo:,}-{hi - 1:,}", builder.batch([steps["messages"]], lo, hi))
    first, last = builder.conn.execute(
        "SELECT min(id), max(id) FROM broker_message WHERE status = 'DISPATCHED'"
    ).fetchone() or (1, 0)
    per_batch = JOBS_PER_BATCH // len(CONSUMERS)
    batches = ranges(first, last, per_batch)
    for number, (lo, hi) in enumerate(batches, start=1):
        work = builder.batch([steps["jobs"], steps["attempts"]], lo, hi)
        builder.step(f"jobs and attempts {number}/{len(batches)} (messages {lo}-{hi - 1})", work)
    for step in ("scheduled", "heartbeats"):
        builder.step(step, run_sql(steps[step]))
    indexes = builder.conn.execute("SELECT name, definition FROM bench_scale_index ORDER BY name")
    for name, definition in indexes.fetchall():
        builder.step(f"index {name}", run_sql(definition))
    require_valid_indexes(builder.conn)
    if has_column(builder.conn, "consumers_consumer", "last_failure_at"):  # since issue 20
        builder.step("last_failures", run_sql(steps["last_failures"]))
    builder.step("autovacuum back on", enable_autovacuum)
    builder.outside_transaction("VACUUM (ANALYZE)", vacuum)


def wait_for_server(url: str, timeout: float = 600) -> None:
    """Until PostgreSQL accepts connections again (after a restart by someone else)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg.connect(url, connect_timeout=5).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def resilient(url: str, work: Callable[[], None]) -> None:
    """`work`, run again (it resumes) each time PostgreSQL goes away under it."""
    from django.db import connections
    from django.db.utils import Error as DjangoDatabaseError

    for attempt in range(RECONNECTS + 1):
        try:
            work()
            return
        except (psycopg.OperationalError, DjangoDatabaseError) as error:
            if attempt == RECONNECTS:
                raise
            print(f"  database connection lost ({str(error).strip()[:120]}); resuming", flush=True)
            connections.close_all()
            time.sleep(2)
            wait_for_server(url)


def start_plan(url: str, jobs: int) -> Plan:
    """The plan stored by a build begun earlier, or a new one stored now."""
    found = stored_plan(url)
    if found is not None:
        if found.jobs != jobs:
            raise SystemExit(f"a build of {found.jobs:,} jobs is under way here: pass --rebuild")
        return found
    plan = make_plan(jobs, datetime.now().astimezone().replace(microsecond=0))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PLAN_TABLE)
        conn.execute(PROGRESS_TABLE)
        conn.execute(
            "INSERT INTO bench_scale_plan VALUES (%s, %s, %s, %s)",
            [plan.jobs, plan.history_end, plan.dead_scale, plan.retry_p],
        )
    return plan


def make_consumers_once(url: str, plan: Plan) -> None:
    """Channels, producers, consumers and the superuser through the ORM (ui.py's), in one
    transaction: present entirely or not at all."""
    from django.db import transaction

    from consumers.models import Consumer

    if Consumer.objects.exists():
        return
    started = time.monotonic()
    with transaction.atomic():
        make_consumers(plan.history_end)
    print(f"  channels, consumers (ORM): {time.monotonic() - started:.0f} s", flush=True)


def summarize(url: str, plan: Plan, wall_seconds: float) -> None:
    """The meta row, written last: what was built, counted exactly, and how long it took."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bench_scale_meta AS SELECT %s::bigint AS jobs,"
            " %s::timestamptz AS history_end,"
            " (SELECT sum(seconds) FROM bench_scale_progress) AS build_seconds,"
            " %s::float8 AS last_run_wall_seconds,"
            " (SELECT count(*) FROM broker_message) AS messages,"
            " (SELECT avg(payload_size) FROM broker_message) AS mean_payload,"
            " (SELECT count(*) FROM jobs_deliveryattempt) AS attempts,"
            " (SELECT jsonb_object_agg(status, n) FROM"
            "   (SELECT status, count(*) AS n FROM jobs_job GROUP BY status) AS s) AS statuses",
            [plan.jobs, plan.history_end, wall_seconds],
        )


def ensure_database(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """Build (or resume building) the database unless a finished build of its size is there;
    its meta row."""
    url = database_url(args.database)
    if args.rebuild or not database_exists(args.database):
        create_database(args.database)
    meta = finished_build(url)
    if meta is not None and meta["jobs"] != args.jobs:
        raise SystemExit(
            f"{args.database} holds {meta['jobs']:,} jobs, not {args.jobs:,}: pass --rebuild to"
            " generate it again, or --database NAME to build another"
        )
    print("migrating", flush=True)
    if args.from_migration and meta is None:
        migrate_jobs_to(args.from_migration, env)
    else:
        migrate(env)  # also on reuse: the code may have moved on
    django_here({**env, "BROKER_ADMIN_TOKENS": ADMIN_TOKEN})
    if meta is not None:
        print(f"reusing {args.database} (built in {meta['build_seconds']:.0f} s)")
        return meta
    started = time.monotonic()
    plan = start_plan(url, args.jobs)
    print(
        f"building {args.database}: {plan.jobs:,} jobs over the 30 days to {plan.history_end}"
        f" (dead rate x {plan.dead_scale:.3f}, retry probability {plan.retry_p:.3f})",
        flush=True,
    )

    def build() -> None:
        make_consumers_once(url, plan)
        builder = Builder(url, plan)
        try:
            load(builder)
        finally:
            builder.conn.close()

    resilient(url, build)
    summarize(url, plan, time.monotonic() - started)
    if args.from_migration:
        upgrade(url, env)
    meta = finished_build(url)
    if meta is None:
        raise RuntimeError("the build wrote no bench_scale_meta row")
    print(f"build: {meta['build_seconds']:.0f} s ({meta['build_seconds'] / 60:.1f} min)")
    return meta


# --- the upgrade of a populated database (--from-migration) --------------------------------


def migrate_jobs_to(name: str, env: dict[str, str]) -> None:
    """Every app the build needs at its latest but jobs, and jobs at migration `name`."""
    for target in (["auth"], ["broker"], ["consumers"], ["jobs", name]):
        command = [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0", *target]
        subprocess.run(command, cwd=ROOT, env=env, check=True)  # noqa: S603


def without_partition_key(statement: str) -> str:
    """The jobs step for a jobs table from before migration 0014 (no partition_at)."""
    changed = statement.replace(", partition_at)", ")", 1).replace(
        "m.received_at, m.received_at\nFROM", "m.received_at\nFROM", 1
    )
    if changed.count("partition_at") or changed == statement:
        raise RuntimeError("the jobs step of scale_data.sql no longer reads as expected")
    return changed


CONTENTS = """
SELECT (SELECT jsonb_object_agg(status, n) FROM
        (SELECT status, count(*) AS n FROM jobs_job GROUP BY status) AS s),
    (SELECT count(*) FROM jobs_deliveryattempt), (SELECT max(id) FROM jobs_job)
"""


def upgrade(url: str, env: dict[str, str]) -> None:
    """`manage.py migrate` over the database built at an older migration, timed; exits 1
    unless every job and attempt is kept as it was, in partitioned tables whose every index
    is valid and attached."""
    from jobs.partitions import UNATTACHED_INDEXES_SQL

    with psycopg.connect(url, autocommit=True) as conn:
        before = conn.execute(CONTENTS).fetchone()
    started = time.monotonic()
    migrate(env)
    seconds = time.monotonic() - started
    with psycopg.connect(url, autocommit=True) as conn:
        after = conn.execute(CONTENTS).fetchone()
        partitioned = has_column(conn, "jobs_job", "partition_at") and conn.execute(
            "SELECT count(*) FROM pg_partitioned_table"
            " WHERE partrelid IN ('jobs_job'::regclass, 'jobs_deliveryattempt'::regclass)"
        ).fetchone() == (2,)
        unattached = [name for (name,) in conn.execute(UNATTACHED_INDEXES_SQL).fetchall()]
    if before is None or after is None:
        raise RuntimeError("no contents counted")
    ok = before == after and partitioned and not unattached
    print(
        f"migrate over it: {seconds:.1f} s; jobs by state and attempts before {before[:2]},"
        f" after {after[:2]}; both tables partitioned: {partitioned}; invalid or unattached"
        f" indexes: {unattached or 'none'}: {'OK' if ok else 'FAILED'}",
        flush=True,
    )
    if not ok:
        raise SystemExit(1)


def describe(meta: dict[str, Any]) -> str:
    statuses = meta["statuses"]
    total = sum(statuses.values())
    text = ", ".join(
        f"{status} {n:,} ({100 * n / total:.1f} %)"
        for status, n in sorted(statuses.items(), key=lambda item: -item[1])
    )
    return (
        f"{total:,} jobs: {text}; {meta['attempts']:,} attempts"
        f" ({meta['attempts'] / total:.2f} per job); {meta['messages']:,} messages, mean payload"
        f" {float(meta['mean_payload']):,.0f} bytes"
    )


# --- the server -----------------------------------------------------------------------------


# --- the endpoints --------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    name: str
    path: str
    bound_ms: int = BOUND_MS


@dataclass
class Result:
    endpoint: Endpoint
    times_ms: list[float]
    size: int = 0
    error: str = ""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms) if self.times_ms else float("nan")

    @property
    def met(self) -> bool:
        return not self.error and self.median_ms <= self.endpoint.bound_ms


def get(base: str, path: str) -> tuple[int, bytes]:
    """One admin GET: (status, body)."""
    request = urllib.request.Request(  # noqa: S310 (our own loopback URL)
        base + path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=900) as answer:  # noqa: S310
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def get_json(base: str, path: str) -> Any:
    status, body = get(base, path)
    if status != 200:
        raise RuntimeError(f"GET {path}: HTTP {status}: {body[:300]!r}")
    return json.loads(body)


def deep_page(base: str, path: str, page: int) -> str:
    """The address of the list's `page`th page, reached as a client does: by following each
    page's `Pages.next` link."""
    for _ in range(page - 1):
        path = get_json(base, path)["Pages"]["next"]
    return path


def endpoints(base: str, page: int) -> list[Endpoint]:
    """Every read endpoint of the admin API (broker/urls.py, docs/api.md), on the largest
    channel and the consumer with the largest DLQ; the lists' first and `page`th pages, and
    a message with its jobs (the DLQ's newest)."""
    consumer = f"/channel/{CHANNEL}/consumer/{DLQ_CONSUMER}"
    messages, dlq = f"/channel/{CHANNEL}/messages", f"{consumer}/dlq"
    dispatched = f"{messages}?status=DISPATCHED"
    message = get_json(base, dlq)["DeadJobs"][0]["MessageURL"]
    return [
        Endpoint("job-status", "/job-status"),
        Endpoint("dlq-status", "/dlq-status"),
        Endpoint("metrics scrape", "/metrics"),
        Endpoint("messages-status", f"/channel/{CHANNEL}/messages-status"),
        Endpoint("messages, page 1", messages),
        Endpoint(f"messages, page {page}", deep_page(base, messages, page)),
        Endpoint("messages ?status=DISPATCHED, page 1", dispatched),
        Endpoint(f"messages ?status=DISPATCHED, page {page}", deep_page(base, dispatched, page)),
        Endpoint("DLQ, page 1", dlq),
        Endpoint(f"DLQ, page {page}", deep_page(base, dlq, page)),
        Endpoint(
            "DLQ of a small consumer, page 1", f"/channel/{CHANNELS[-1]}/consumer/billing/dlq"
        ),
        Endpoint("message with its jobs", message),
        Endpoint("scheduled messages", f"/channel/{CHANNEL}/scheduled-messages"),
        Endpoint("periodic messages", f"/channel/{CHANNEL}/periodic-messages"),
        Endpoint("event types", f"/channel/{CHANNEL}/event-types"),
        Endpoint("channels", "/channels"),
        Endpoint("channel", f"/channel/{CHANNEL}"),
        Endpoint("producers", "/producers"),
        Endpoint("producer", "/producer/shop-backend"),
        Endpoint("consumers", f"/channel/{CHANNEL}/consumers"),
        Endpoint("consumer", consumer),
        Endpoint("signing secret", f"{consumer}/secret"),
        Endpoint("_status", "/_status"),
    ]


def measure(base: str, endpoint: Endpoint, runs: int) -> Result:
    """One warm-up request, then `runs` timed ones (the whole answer read)."""
    times: list[float] = []
    size = 0
    for run in range(runs + 1):
        started = time.perf_counter()
        status, body = get(base, endpoint.path)
        elapsed = 1000 * (time.perf_counter() - started)
        if status != 200:
            return Result(endpoint, times, len(body), f"HTTP {status}")
        if run:
            times.append(elapsed)
        size = len(body)
    return Result(endpoint, times, size)


def measure_all(base: str, args: argparse.Namespace) -> list[Result]:
    results = []
    for endpoint in endpoints(base, args.page):
        result = measure(base, endpoint, args.runs)
        print(f"  {endpoint.name}: {result.median_ms:.0f} ms {result.error}", flush=True)
        results.append(result)
    return results


# --- the report -----------------------------------------------------------------------------


def print_rows(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for number, row in enumerate(rows):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |")
        if number == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def verdict(result: Result) -> str:
    if result.error:
        return f"no ({result.error})"
    if not result.met:
        return "NOT met"
    return "met, <= 100 ms" if result.median_ms <= FAST_MS else "met"


def print_endpoints(results: list[Result]) -> None:
    rows = [("endpoint", "path", "median ms", "bound ms", "verdict", "runs ms", "bytes")]
    for r in results:
        path = r.endpoint.path if len(r.endpoint.path) <= 60 else r.endpoint.path[:57] + "..."
        runs = " ".join(f"{ms:.0f}" for ms in r.times_ms)
        rows.append(
            (
                r.endpoint.name,
                path,
                f"{r.median_ms:.0f}",
                str(r.endpoint.bound_ms),
                verdict(r),
                runs,
                f"{r.size:,}",
            )
        )
    print_rows(rows)
    missed = [r.endpoint.name for r in results if not r.met]
    fast = sum(r.met and r.median_ms <= FAST_MS for r in results)
    print(
        f"\n{len(results) - len(missed)} of {len(results)} endpoints within {BOUND_MS} ms,"
        f" {fast} within {FAST_MS} ms" + (f"; over: {', '.join(missed)}" if missed else "")
    )


# Partitions (jobs/partitions/) count in their table, and partition indexes in their index
# (pg_partition_tree has no rows for an index of a table that is not partitioned).
SIZES_SQL = """
SELECT root.relname, sum(pg_table_size(c.oid))::bigint, sum(pg_indexes_size(c.oid))::bigint,
    sum(pg_total_relation_size(c.oid))::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_class root ON root.oid = coalesce(pg_partition_root(c.oid), c.oid)
WHERE n.nspname = 'public' AND c.relkind = 'r' AND root.relname NOT LIKE 'bench\\_%%'
GROUP BY root.relname ORDER BY 4 DESC
"""
INDEX_SIZES_SQL = """
SELECT t.relname, i.relname,
    coalesce((SELECT sum(pg_relation_size(relid))::bigint FROM pg_partition_tree(i.oid)),
        pg_relation_size(i.oid))
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
WHERE t.relname = ANY(%s) ORDER BY 1, 3 DESC
"""


def gib(size: float) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


def print_sizes(url: str, jobs: int) -> None:
    """Tables (heap and TOAST) and indexes, in all and per million jobs, for disk planning."""
    millions = jobs / 1_000_000
    with psycopg.connect(url) as conn:
        tables = conn.execute(SIZES_SQL).fetchall()
        indexes = conn.execute(INDEX_SIZES_SQL, [BIG_TABLES]).fetchall()
        database = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    rows = [("table", "table (heap+TOAST)", "indexes", "total", "total per 1M jobs")]
    big = [row for row in tables if row[0] in BIG_TABLES]
    other = [row for row in tables if row[0] not in BIG_TABLES]
    summed = ("every other table", *(sum(row[i] for row in other) for i in (1, 2, 3)))
    everything = ("all broker tables", *(sum(row[i] for row in tables) for i in (1, 2, 3)))
    for name, heap, index, total in [*big, summed, everything]:
        rows.append((str(name), gib(heap), gib(index), gib(total), gib(total / millions)))
    print_rows(rows)
    whole = gib(database[0] if database else 0)
    print(f"database (pg_database_size, with the bench's own tables): {whole}")
    print("\nindexes of the big tables, per 1M jobs:")
    print_rows(
        [("table", "index", "size", "per 1M jobs")]
        + [(t, i, gib(size), gib(size / millions)) for t, i, size in indexes]
    )


# --- the dispatcher's drain and publish latency, against an empty database ------------------

# Measured in a child process per database (Django is bound to one), first on a fresh empty
# database, then on the data set, the same way: dispatch_harness's channel "bench" with
# DRAIN_CONSUMERS consumers of a webhook_sink receiver, DRAIN_RUNS drains of DRAIN_JOBS jobs
# queued at once by one `manage.py dispatch` (dispatch.py's defaults), then PUBLISHES
# sequential POST /channel/bench/broadcast to gunicorn (the broadcast's answer time). On the
# data set every other consumer is paused meanwhile: their 1,000,000 QUEUED jobs, most of them
# due, stay for the claim to pass over, but nothing goes to their made-up addresses.
EMPTY_DATABASE = "broker_bench_scale_empty"
# Where dispatch_harness.queue_jobs publishes.
BENCH_CHANNEL, BENCH_PRODUCER = dispatch_harness.CHANNEL, dispatch_harness.PRODUCER

DRAIN_JOBS, DRAIN_CONSUMERS, DRAIN_RUNS = 10_000, 10, 3
PUBLISHES, PUBLISH_WARMUP = 300, 30
CHANNEL_TOKEN, PRODUCER_TOKEN = "bench-channel-token", "bench-producer-token"
DRAIN_SHARE, PUBLISH_SLACK = 0.8, 1.2  # the bounds: >= 80 % of the rate, <= 120 % of the time


def bench_consumers(port: int) -> list[int]:
    """The channel "bench", its producer and consumers of the receiver on `port` (made, or
    pointed at this run's receiver); earlier runs' jobs and messages there deleted, and the
    tables vacuumed."""
    from django.db import connection

    from broker.models import Channel, Producer
    from consumers.models import Consumer

    if not Producer.objects.filter(pk=BENCH_PRODUCER).exists():
        producer = Producer(id=BENCH_PRODUCER, name="Bench producer")
        producer.set_token(PRODUCER_TOKEN)
        producer.save()
        channel = Channel(id=BENCH_CHANNEL, name="Bench")
        channel.set_token(CHANNEL_TOKEN)
        channel.save()
    ids = [
        Consumer.objects.update_or_create(
            channel_id=BENCH_CHANNEL,
            public_id=f"c{n}",
            defaults={"name": f"Consumer {n}", "callback_url": f"http://{HOST}:{port}/c{n}"},
        )[0].pk
        for n in range(DRAIN_CONSUMERS)
    ]
    with connection.cursor() as cursor:
        for table, column in (("jobs_deliveryattempt", "consumer_id"), ("jobs_job", "consumer_id")):
            cursor.execute(f"DELETE FROM {table} WHERE {column} = ANY(%s)", [ids])  # noqa: S608
        cursor.execute("DELETE FROM broker_message WHERE channel_id = %s", [BENCH_CHANNEL])
        # What those runs left behind (dead rows, index entries the claim would walk over)
        # cleared, as autovacuum would have (this server may run without it).
        for table in BIG_TABLES:
            cursor.execute(f"VACUUM (ANALYZE) {table}")
    return ids


@contextmanager
def others_paused() -> Iterator[int]:
    """Every consumer outside the channel "bench" paused, and resumed after."""
    from consumers.models import Consumer

    running = Consumer.objects.filter(paused=False).exclude(channel_id=BENCH_CHANNEL)
    ids = list(running.values_list("pk", flat=True))
    Consumer.objects.filter(pk__in=ids).update(paused=True)
    try:
        yield len(ids)
    finally:
        Consumer.objects.filter(pk__in=ids).update(paused=False)


def delivered(bench: Bench, ids: list[int]) -> int:
    found = bench.scalar(
        "SELECT count(*) FROM jobs_job WHERE consumer_id = ANY(%(ids)s) AND status = 'DELIVERED'",
        {"ids": ids},
    )
    return int(found)


def drain_rate(bench: Bench, sinks: Receivers, ids: list[int], prefix: str) -> float:
    """One drain: DRAIN_JOBS jobs queued in one transaction, from the first arrival at the
    receiver until SQL counts them all DELIVERED; deliveries per second."""
    sinks.reset()
    before = delivered(bench, ids)
    with dispatchers(bench, 1, bench.options()) as running:

        def alive() -> bool:
            return all(process.poll() is None for process in running)

        queue_jobs(bench, DRAIN_JOBS, ids, prefix)
        _, late = wait_for(lambda: sinks.summary()[1], DRAIN_JOBS, 600, alive)
        finished, later = wait_for(lambda: delivered(bench, ids) - before, DRAIN_JOBS, 60, alive)
    if late or later:
        raise RuntimeError(f"the drain did not finish: {sinks.summary()} received")
    first = min(seen[1] for seen in sinks.received().values())
    return DRAIN_JOBS / (finished - first)


def publish_times(env: dict[str, str]) -> list[float]:
    """Milliseconds of each POST /channel/bench/broadcast, one after another, after a warm-up."""
    headers = {
        "X-Broker-Channel-Token": CHANNEL_TOKEN,
        "X-Broker-Producer-ID": BENCH_PRODUCER,
        "X-Broker-Producer-Token": PRODUCER_TOKEN,
        "Content-Type": "application/json",
    }
    times = []
    with gunicorn(env, 2 * (os.cpu_count() or 1) + 1, **LENIENT) as base:
        for n in range(PUBLISH_WARMUP + PUBLISHES):
            request = urllib.request.Request(  # noqa: S310 (our own loopback URL)
                f"{base}/channel/{BENCH_CHANNEL}/broadcast",
                data=PAYLOAD.encode(),
                headers={**headers, "X-Broker-Message-ID": f"p{n}"},
                method="POST",
            )
            started = time.perf_counter()
            with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
                answer.read()
            if n >= PUBLISH_WARMUP:
                times.append(1000 * (time.perf_counter() - started))
    return times


def dispatch_child() -> None:
    """`scale.py --dispatch-child`: drains and publishes on the database of DATABASE_URL, its
    figures as a JSON line on stdout."""
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    url = os.environ["DATABASE_URL"]
    args = argparse.Namespace(
        dispatch_command=f"{sys.executable} {ROOT / 'manage.py'} dispatch",
        receivers=1, timeout=0, jobs=DRAIN_JOBS, concurrency=128, batch_size=100, poll_seconds=1.0,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as logs, others_paused() as paused:
        bench = Bench(args, url, Path(logs))
        with receivers(bench) as sinks:
            ids = bench_consumers(sinks.port)
            rates = [drain_rate(bench, sinks, ids, f"d{run}-") for run in range(DRAIN_RUNS)]
        publishes = publish_times(dict(os.environ))
        bench.db.close()
    print(json.dumps({"paused": paused, "rates": rates, "publish_ms": publishes}), flush=True)


def run_child(option: str, env: dict[str, str], label: str) -> dict[str, Any]:
    """This script again with `option`, in `env`; the JSON line it printed last."""
    return json_of_child([sys.executable, __file__, option], env, label)


def json_of_child(command: list[str], env: dict[str, str], label: str) -> dict[str, Any]:
    """`command` run in `env`; the JSON line it printed last (its output shown if it failed)."""
    done = subprocess.run(  # noqa: S603
        command, cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        print(done.stdout[-2000:] + done.stderr[-4000:], file=sys.stderr)
        raise RuntimeError(f"{label}: the child failed with {done.returncode}")
    found: dict[str, Any] = json.loads(lines[-1])
    return found


def measure_dispatch(server_env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The drains and publishes on a fresh empty database (dropped after), then on the data
    set."""
    empty_env = {**server_env, "DATABASE_URL": database_url(EMPTY_DATABASE)}
    create_database(EMPTY_DATABASE)
    try:
        migrate(empty_env)
        results = {}
        for name, env in (("empty", empty_env), ("data set", server_env)):
            results[name] = run_child("--dispatch-child", env, f"drain on the {name}")
            rates = ", ".join(f"{rate:,.0f}" for rate in results[name]["rates"])
            publish = statistics.median(results[name]["publish_ms"])
            print(f"  {name}: drains {rates}/s; broadcast median {publish:.1f} ms", flush=True)
    finally:
        drop_database(EMPTY_DATABASE)
    return results


def print_dispatch(results: dict[str, dict[str, Any]]) -> None:
    empty, full = results["empty"], results["data set"]
    rate_empty, rate_full = (statistics.median(r["rates"]) for r in (empty, full))
    pub_empty, pub_full = (statistics.median(r["publish_ms"]) for r in (empty, full))
    p99_empty, p99_full = (percentile(r["publish_ms"], 0.99) for r in (empty, full))
    drain_met = "met" if rate_full >= DRAIN_SHARE * rate_empty else "NOT met"
    publish_met = "met" if pub_full <= PUBLISH_SLACK * pub_empty else "NOT met"
    rows = [
        ("figure", "empty database", "data set", "ratio", "bound", "verdict"),
        (
            f"drain, 1 dispatcher, {DRAIN_CONSUMERS} consumers (median of {DRAIN_RUNS}, /s)",
            f"{rate_empty:,.0f}", f"{rate_full:,.0f}", f"{rate_full / rate_empty:.2f}",
            f">= {DRAIN_SHARE:.2f}", drain_met,
        ),
        (
            f"broadcast answer, median of {PUBLISHES} (ms)",
            f"{pub_empty:.1f}", f"{pub_full:.1f}", f"{pub_full / pub_empty:.2f}",
            f"<= {PUBLISH_SLACK:.2f}", publish_met,
        ),
        (
            "broadcast answer, p99 (ms)", f"{p99_empty:.1f}", f"{p99_full:.1f}",
            f"{p99_full / p99_empty:.2f}", "-", "-",
        ),
    ]  # fmt: skip
    print_rows(rows)
    drains = "; ".join(
        f"{name}: " + ", ".join(f"{rate:,.0f}" for rate in r["rates"])
        for name, r in results.items()
    )
    print(f"(each drain /s: {drains}; consumers paused on the data set: {full['paused']})")


# --- requeue and purge of the big DLQ -------------------------------------------------------

# Each action runs in a child process with the server's settings (server-side binding, as
# gunicorn has it), through the batches the API's POST and DELETE …/dlq run (jobs/dlq_actions.py:
# the request runs them for a couple of seconds, housekeeping the rest), each batch committed
# as in production; the parent saves the DLQ's jobs and attempts before and puts them back after
# (a copy an interrupted run left is put back first), so the data set stays as built. Meanwhile a
# thread of the child runs the dispatcher's claim (jobs.queue.claim_for_push, rolled back) from
# a connection of its own every PROBE_SECONDS, and a real dispatcher drains DRAIN_JOBS jobs of the
# channel "bench" to a receiver (as --dispatch does, every other consumer paused), one drain after
# another for as long as the action runs, against the same drain before the action with the probe
# running too: whether other consumers' deliveries keep flowing.
PROBE_SECONDS = 0.1
ACTIONS = {
    "requeue": "POST …/dlq (jobs.dlq_actions: batches of 2,000 dead jobs, SKIP LOCKED)",
    "purge": "DELETE …/dlq (the same batches: their attempts, then them)",
}
BATCH_BOUND_MS = 1000  # no batch transaction blocks anyone for a second (issue 21)
SAVED_JOBS, SAVED_ATTEMPTS = "bench_dlq_saved_jobs", "bench_dlq_saved_attempts"
# What a requeue changes in a job (jobs.models.requeue_changes and the status), put back.
REQUEUED_COLUMNS = (
    "status", "status_changed_at", "attempts", "next_attempt_at", "lease_expires_at",
    "enqueued_at", "last_error",
)  # fmt: skip


class RolledBack(Exception):
    """Raised to leave the measured transaction without committing it."""


def rolled_back_claim(limit: int = 10) -> tuple[float, int]:
    """The dispatcher's claim of up to `limit` due jobs (jobs.queue.claim_for_push) in a
    transaction rolled back, on this thread's connection: (milliseconds, jobs claimed)."""
    from django.db import transaction

    from jobs.queue import claim_for_push

    claimed = 0
    started = time.perf_counter()
    try:
        with transaction.atomic():
            claimed = len(claim_for_push(limit))
            raise RolledBack
    except RolledBack:
        pass
    return 1000 * (time.perf_counter() - started), claimed


class ClaimProbe(threading.Thread):
    """The dispatcher's claim of up to 10 due jobs every PROBE_SECONDS, each rolled back; how
    long each took."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.halt = threading.Event()
        self.times_ms: list[float] = []
        self.claimed = 0

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.halt.is_set():
                took_ms, claimed = rolled_back_claim()
                self.claimed += claimed
                self.times_ms.append(took_ms)
                self.halt.wait(PROBE_SECONDS)
        finally:
            connection.close()


class StatementCounter:
    """A Django execute wrapper: how many statements ran, and the most bind parameters one
    had (PostgreSQL's protocol takes at most 65,535), without keeping them (Django's own
    query log keeps only the last 9,000)."""

    def __init__(self) -> None:
        self.statements = 0
        self.most_parameters = 0

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        self.statements += 1
        self.most_parameters = max(self.most_parameters, len(params or ()))
        return execute(sql, params, many, context)


@contextmanager
def probing_beside() -> Iterator[ClaimProbe]:
    """A claim probe running for the length of the block."""
    probe = ClaimProbe()
    probe.start()
    try:
        yield probe
    finally:
        probe.halt.set()
        probe.join()


def probing(seconds: float) -> ClaimProbe:
    """A probe run alone for `seconds`: the claim's own time, before any action."""
    with probing_beside() as probe:
        time.sleep(seconds)
    return probe


def run_action(action: str) -> dict[str, Any]:
    """In the child: `action` on the DLQ consumer, batch by batch as the API and housekeeping
    run it, each batch timed, with a claim probe beside it and real drains of other consumers'
    jobs (a dispatcher delivering to a receiver) one after another for as long as it runs,
    against a drain without it (the probe beside that one too: only the action differs)."""
    from consumers.models import Consumer
    from jobs.states import DEAD

    consumer = Consumer.objects.get(channel_id=CHANNEL, public_id=DLQ_CONSUMER)
    dead = consumer.jobs.filter(status=DEAD).count()
    alone = probing(3)
    drain_args = argparse.Namespace(
        dispatch_command=f"{sys.executable} {ROOT / 'manage.py'} dispatch",
        receivers=1, timeout=0, jobs=DRAIN_JOBS, concurrency=128, batch_size=100, poll_seconds=1.0,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as logs, others_paused():
        bench = Bench(drain_args, os.environ["DATABASE_URL"], Path(logs))
        with receivers(bench) as sinks:
            ids = bench_consumers(sinks.port)
            with probing_beside():
                drain_alone = drain_rate(bench, sinks, ids, f"{action}-alone-")
            acting = threading.Event()
            drained: list[float] = []

            def drain_while_acting() -> None:
                # Only drains that ended while the action ran count, the first always.
                for run in itertools.count():
                    rate = drain_rate(bench, sinks, ids, f"{action}-during{run}-")
                    if not drained or acting.is_set():
                        drained.append(rate)
                    if not acting.is_set():
                        return

            drain = threading.Thread(target=drain_while_acting, daemon=True)
            sinks.reset()
            acting.set()
            drain.start()
            # The action starts once deliveries flow (the dispatcher takes a moment to start).
            wait_for(lambda: sinks.summary()[1], 1, 120, drain.is_alive)
            figures = timed_action(consumer, action)
            acting.clear()
            drain.join(900)
        bench.db.close()
    return {
        "action": action,
        "dead": dead,
        **figures,
        "claim_alone_ms": statistics.median(alone.times_ms) if alone.times_ms else None,
        "drain_alone": drain_alone,
        "drain_during": statistics.median(drained) if drained else None,
        "drains_during": drained,
    }


def timed_action(consumer: Any, action: str) -> dict[str, Any]:
    """`action` on `consumer`'s DLQ batch by batch, with a claim probe beside it: its figures."""
    from django.db import connection

    from jobs import dlq_actions
    from jobs.queue.dead_jobs import DeadRange, count_range

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    counter = StatementCounter()
    batches_ms: list[float] = []
    outcome, estimate_ms, started = "", 0.0, time.perf_counter()
    with connection.execute_wrapper(counter), probing_beside() as probe:
        try:
            taken = dlq_actions.start(consumer, action)
            # What a hand-over to housekeeping counts once: the estimate of the total.
            counted = time.perf_counter()
            count_range(DeadRange(consumer.pk, taken.resume_from, taken.died_before))
            estimate_ms = 1000 * (time.perf_counter() - counted)
            more = True
            while more:
                batch_started = time.perf_counter()
                more = dlq_actions.step(taken)  # one transaction: the batch and its progress
                took = time.perf_counter() - batch_started
                batches_ms.append(1000 * took)
                if more:  # as jobs.dlq_actions.run does between batches
                    dlq_actions.yield_to_deliveries(took)
            outcome = f"{taken.done:,} jobs, {taken.state}"
            taken.delete()
        except Exception as error:  # what the API would answer 500 for
            outcome = f"FAILED: {type(error).__name__}: {str(error).strip()[:150]}"
        seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "outcome": outcome,
        "batches": len(batches_ms),
        "batch_max_ms": max(batches_ms, default=None),
        "batch_median_ms": statistics.median(batches_ms) if batches_ms else None,
        "estimate_ms": estimate_ms,
        "statements": counter.statements,
        "most_parameters": counter.most_parameters,
        "rss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024,
        "claim_median_ms": statistics.median(probe.times_ms) if probe.times_ms else None,
        "claim_max_ms": max(probe.times_ms, default=None),
        "claims": len(probe.times_ms),
        "claimed": probe.claimed,
    }


def child_main(action: str) -> None:
    """`scale.py --dlq-action ACTION`: Django with the environment as given (the server's),
    one action, its figures as a JSON line on stdout."""
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    print(json.dumps(run_action(action)), flush=True)


def measure_dlq_actions(env: dict[str, str], url: str) -> list[tuple[str, dict[str, Any]]]:
    """Requeue and purge as the server runs them, each between a save and a restore of the DLQ;
    after each, a VACUUM of what it changed (this server's autovacuum may be off), so that the
    next starts from the table as built."""
    results = []
    with psycopg.connect(url, autocommit=True) as conn:
        restore_dlq(conn)  # what an interrupted run left saved
        for action in ACTIONS:
            with timed(f"saving the DLQ before the {action}"):
                save_dlq(conn)
            result = run_child(f"--dlq-action={action}", env, action)
            print(f"  {action}: {result['seconds']:.1f} s, {result['outcome']}", flush=True)
            results.append((action, result))
            with timed(f"restoring the DLQ after the {action}"):
                restore_dlq(conn)
            with timed(f"VACUUM after the {action}"):
                for table in ("jobs_job", "jobs_deliveryattempt"):
                    conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table)))
    return results


def save_dlq(conn: psycopg.Connection[Any]) -> None:
    """The DLQ consumer's dead jobs and their attempts, copied aside (in one transaction: a
    copy is whole or absent)."""
    with conn.transaction():
        conn.execute(
            sql.SQL(
                "CREATE TABLE {jobs} AS SELECT job.* FROM jobs_job job"
                " JOIN consumers_consumer consumer ON consumer.id = job.consumer_id"
                " WHERE consumer.channel_id = %s AND consumer.public_id = %s"
                " AND job.status = 'DEAD'"
            ).format(jobs=sql.Identifier(SAVED_JOBS)),
            (CHANNEL, DLQ_CONSUMER),
        )
        # A nested loop over attempt_job_idx: the attempts table is the biggest of all.
        conn.execute(
            sql.SQL(
                "CREATE TABLE {attempts} AS SELECT attempt.* FROM {jobs} job CROSS JOIN LATERAL"
                " (SELECT * FROM jobs_deliveryattempt a WHERE a.job_id = job.id) attempt"
            ).format(attempts=sql.Identifier(SAVED_ATTEMPTS), jobs=sql.Identifier(SAVED_JOBS))
        )


def restore_dlq(conn: psycopg.Connection[Any]) -> None:
    """Put the saved DLQ back as it was (requeued jobs dead again, purged ones and their
    attempts inserted again), forget the actions, and drop the copy; nothing without one.
    Rows are found by their whole primary keys: by id alone each probes every time partition
    (the restore of 2,000,000 attempts took more than 20 minutes so)."""
    found = conn.execute("SELECT to_regclass(%s)", (SAVED_JOBS,)).fetchone()
    if found is None or found[0] is None:
        return
    jobs, attempts = sql.Identifier(SAVED_JOBS), sql.Identifier(SAVED_ATTEMPTS)
    columns = sql.SQL(", ").join(map(sql.Identifier, REQUEUED_COLUMNS))
    saved = sql.SQL(", ").join(sql.Identifier("saved", name) for name in REQUEUED_COLUMNS)
    with conn.transaction():
        conn.execute(
            sql.SQL(
                "UPDATE jobs_job job SET ({columns}) = ({saved}) FROM {jobs} saved"
                " WHERE job.id = saved.id AND job.partition_at = saved.partition_at"
                " AND job.status <> 'DEAD'"
            ).format(columns=columns, saved=saved, jobs=jobs)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO jobs_job SELECT saved.* FROM {jobs} saved"
                " WHERE NOT EXISTS (SELECT FROM jobs_job job"
                " WHERE job.id = saved.id AND job.partition_at = saved.partition_at)"
            ).format(jobs=jobs)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO jobs_deliveryattempt SELECT saved.* FROM {attempts} saved"
                " WHERE NOT EXISTS (SELECT FROM jobs_deliveryattempt a"
                " WHERE a.id = saved.id AND a.started_at = saved.started_at)"
            ).format(attempts=attempts)
        )
        conn.execute("DELETE FROM jobs_deadletteraction")
        conn.execute(sql.SQL("DROP TABLE {}, {}").format(jobs, attempts))


def print_dlq_actions(results: list[tuple[str, dict[str, Any]]]) -> None:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    rows = [
        ("action", "DLQ jobs", "seconds", "outcome", "batches", "longest batch ms",
         "median batch ms", "estimate count ms", "statements", "most parameters",
         "RSS growth MB", "claim alone ms", "claim during: median / max ms (claims)",
         "other consumers' drain /s: alone, median during (drains)", "bound met"),
    ]  # fmt: skip
    for label, r in results:
        during = f"{ms(r['claim_median_ms'])} / {ms(r['claim_max_ms'])} ({r['claims']})"
        drains = f"{ms(r['drain_alone'])}, {ms(r['drain_during'])} ({len(r['drains_during'])})"
        met = (
            r["batch_max_ms"] is not None
            and r["batch_max_ms"] < BATCH_BOUND_MS
            and r["drain_during"] is not None
            and r["drain_during"] >= DRAIN_SHARE * r["drain_alone"]
        )
        rows.append(
            (label, f"{r['dead']:,}", f"{r['seconds']:.1f}", r["outcome"], f"{r['batches']:,}",
             ms(r["batch_max_ms"]), ms(r["batch_median_ms"]), ms(r["estimate_ms"]),
             f"{r['statements']:,}", f"{r['most_parameters']:,}", f"{r['rss_growth_mb']:.0f}",
             ms(r["claim_alone_ms"]), during, drains, "yes" if met else "NO")
        )  # fmt: skip
    print_rows(rows)
    print(
        "(each batch one transaction, committed; the DLQ is saved before and put back after."
        " The API's calls: "
        + "; ".join(f"{name}: {call}" for name, call in ACTIONS.items())
        + f". Bounds: every batch under {BATCH_BOUND_MS:,} ms; a drain of {DRAIN_JOBS:,} jobs of"
        f" {DRAIN_CONSUMERS} other consumers by one dispatcher, one after another while the"
        f" action runs: their median at {DRAIN_SHARE:.0%} of the drain alone or more.)"
    )


# --- why an endpoint is slow ----------------------------------------------------------------


def explain(results: list[Result]) -> None:
    """Each endpoint over its bound, fetched once more in this process through Django's test
    client (client-side binding: the captured SQL is what EXPLAIN takes): its slowest
    queries, each with EXPLAIN (ANALYZE, BUFFERS)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST=HOST, HTTP_AUTHORIZATION=f"Bearer {ADMIN_TOKEN}")
    for result in results:
        if result.met:
            continue
        with CaptureQueriesContext(connection) as captured:
            client.get(result.endpoint.path)
        ordered = sorted(captured.captured_queries, key=lambda q: -float(q["time"]))
        # The two slowest, but none under 20 ms beside a slower one: those are not the cause.
        slowest = ordered[:1] + [q for q in ordered[1:2] if float(q["time"]) >= 0.02]
        print(f"\n## {result.endpoint.name}: {result.endpoint.path}")
        print(f"{len(captured.captured_queries)} queries; the slowest:")
        for captured_query in slowest:
            print(f"\n-- {1000 * float(captured_query['time']):.0f} ms\n{captured_query['sql']}\n")
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + captured_query["sql"])
                print("\n".join(line for (line,) in cursor.fetchall()))


# --- what housekeeping keeps, and the operator UI (--ui) ------------------------------------

UI_BOUND_MS = 500  # issue 21: the dashboard and lists at 25,000,000 jobs


def run_housekeeping(command_name: str, what: str, env: dict[str, str]) -> None:
    """`manage.py command_name`, a refresh housekeeping runs on its schedule, timed."""
    started = time.monotonic()
    command = [sys.executable, "manage.py", command_name]
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)  # noqa: S603
    print(f"{what} refreshed in {time.monotonic() - started:.1f} s")


def refresh_job_status_summary(env: dict[str, str]) -> None:
    """The summary housekeeping keeps every 5 minutes (jobs/status_summary.py): the job counts
    past their live limits are read from it."""
    run_housekeeping("refresh_job_status_summary", "job status summary", env)


def prepare_ui(url: str, env: dict[str, str]) -> None:
    """What only the UI reads, as a broker that has run for a month has it: the delivery
    reports Spark would have written (ui_data.sql's reports step, once), and the dashboard's
    rollup as housekeeping keeps it."""
    plan = stored_plan(url)
    if plan is None:
        raise RuntimeError("the database has no bench_scale_plan row")
    builder = Builder(url, plan)
    try:
        builder.step("reports", run_sql(sql_steps()["reports"]))
    finally:
        builder.conn.close()
    run_housekeeping("refresh_delivery_stats", "dashboard rollup", env)


# --- main -----------------------------------------------------------------------------------


def main() -> None:
    # SIGTERM as Ctrl-C: the servers, dispatchers and receivers started are stopped on the way
    # out (they run in sessions of their own, which a plain SIGTERM would leave behind).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = arguments()
    if args.dlq_action:  # a child of measure_dlq_actions
        child_main(args.dlq_action)
        return
    if args.dispatch_child:  # a child of measure_dispatch
        dispatch_child()
        return
    print(f"# admin API at scale: {machine()}")
    url = database_url(args.database)
    env = broker_environment(url)
    meta = ensure_database(args, env)
    print(describe(meta))
    if args.build_only:
        return
    server_env = {**env, "BROKER_ADMIN_TOKENS": ADMIN_TOKEN}  # prepared statements on, as shipped
    refresh_job_status_summary(env)
    if args.ui:
        prepare_ui(url, env)
    print(f"gunicorn broker.wsgi, {args.workers} sync workers; {args.runs} requests per endpoint")
    with gunicorn(server_env, args.workers, **LENIENT) as base:
        results = measure_all(base, args)
        if args.ui:
            print("operator UI pages (headless Chromium, as a staff superuser):")
            pages = measure_pages(base, url, meta["history_end"], args.runs, UI_BOUND_MS)
    print(f"\n## admin API, {meta['jobs']:,} jobs (median of {args.runs}, warm cache)\n")
    print_endpoints(results)
    if args.ui:
        print(f"\n## operator UI, {meta['jobs']:,} jobs (median of {args.runs} loads, warm)\n")
        print_pages(pages)
    print(f"\n## database size, {meta['jobs']:,} jobs\n")
    print_sizes(url, meta["jobs"])
    if args.dispatch:
        print("\n## dispatcher drain and publish, against an empty database\n")
        print_dispatch(measure_dispatch(server_env))
    if args.dlq_actions:
        print(f"\n## requeue and purge of the {CHANNEL}/{DLQ_CONSUMER} DLQ\n")
        print_dlq_actions(measure_dlq_actions(server_env, url))
    if args.explain:
        explain(results)
        if args.ui:
            explain_pages(pages)


if __name__ == "__main__":
    main()
