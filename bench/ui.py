"""The operator UI at scale (issue 20): every list, filter and detail page, and the dashboard, in
headless Chromium against gunicorn over a history of 10,000,000 jobs generated in SQL.

Targets: every list and filter page loads in <= 300 ms, the dashboard in <= 500 ms (the median
of 5 Playwright navigations to the `load` event, after one warm-up).

Builds the database `broker_bench_ui` once (migrations, then 30 days of messages, jobs in every
status and their delivery attempts, set-based SQL from bench/ui_data.sql), and reuses it on
later runs; `--rebuild` makes it again. Then starts gunicorn as production runs it on a free
loopback port, logs Chromium in as a staff superuser, measures each page and prints a table.
The database is left in place.

    .venv/bin/python bench/ui.py                           # 10,000,000 jobs (builds once)
    .venv/bin/python bench/ui.py --jobs 100000 --database broker_bench_ui_small   # a smoke run
    .venv/bin/python bench/ui.py --scale 0.1 --rebuild     # 1,000,000 jobs, built again
    .venv/bin/python bench/ui.py --explain                 # and EXPLAIN the pages over bound
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlencode

import psycopg
from dispatch_harness import (
    HOST,
    PG_PORT,
    PG_USER,
    ROOT,
    admin_connection,
    broker_environment,
    machine,
)
from ingest import free_port, stop, wait_until_serving
from psycopg import sql
from secondary_indexes import require_valid_indexes, secondary_indexes

DEFAULT_DATABASE = "broker_bench_ui"
DEFAULT_JOBS = 10_000_000
DATA_SQL = Path(__file__).with_name("ui_data.sql")
CHROMIUM = "/usr/bin/chromium"
# tests/ui/browser.py's flags: headless, no sandbox, and none of Chromium's calls to Google.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
USERNAME, PASSWORD = "bench-ui", "bench-ui-password"  # a superuser of the bench database only
LIST_BOUND_MS, DASHBOARD_BOUND_MS = 300, 500
JOBS_PER_BATCH = 1_000_000  # jobs (and their attempts) per INSERT: progress, bounded transactions

CHANNELS = [
    "orders", "payments", "shipments", "invoices", "customers", "inventory", "refunds",
    "subscriptions", "reviews", "carts", "coupons", "returns", "notifications", "audit",
    "catalog", "prices", "tickets", "sessions", "leads", "partners",
]  # fmt: skip


@dataclass(frozen=True)
class Behaviour:
    """How one kind of consumer answers: its share of jobs that fail every attempt, the
    statuses they fail with (0: a timeout, 1: no connection), whether those are
    non-retryable (dead after one attempt), and its retry delays (None: the broker's)."""

    dead_rate: float
    fail_codes: tuple[int, ...]
    retry_delays: tuple[int, ...] | None
    non_retryable: bool = False


# The ten consumers every channel has. Together about 11 % of jobs die, plus outages below.
CONSUMERS = {
    "billing": Behaviour(0.02, (503, 0), None),
    "warehouse": Behaviour(0.03, (503, 502), (10, 60, 300)),
    "analytics": Behaviour(0.04, (503, 0, 1), None),
    "crm-sync": Behaviour(0.20, (401, 422), (30, 120), non_retryable=True),
    "search-indexer": Behaviour(0.08, (502, 504, 0), (30, 120, 600, 1800, 3600)),
    "email": Behaviour(0.03, (503, 429), None),
    "fraud-check": Behaviour(0.02, (500, 0), (10, 60, 300)),
    "clickhouse-sink": Behaviour(0.45, (500, 500, 1), (60, 300, 900, 3600)),
    "slack-notify": Behaviour(0.25, (429, 503), (5, 30)),
    "audit-log": Behaviour(0.01, (503,), None),
}
# What the measured pages look at: the largest channel and its most failing consumer.
CHANNEL, CONSUMER = "orders", "clickhouse-sink"
BROKER_RETRY_DELAYS = (30, 120, 600, 1800, 3600, 7200, 21600, 43200)  # the setting's default
# (channel, consumer): down (every attempt fails) from, until (None: still down) before the
# history's end; the first has its circuit open now.
OUTAGES = {
    ("orders", "analytics"): (timedelta(hours=30), None),
    ("payments", "email"): (timedelta(days=12), timedelta(days=11)),
    ("customers", "search-indexer"): (timedelta(days=4), timedelta(days=3, hours=18)),
}
# (channel, consumer): its jobs since this long before the end wait QUEUED, untried: the first
# is paused, the second limited to a rate it cannot keep up with (maxPerSecond).
BACKLOGS = {
    ("shipments", "warehouse"): timedelta(hours=20),
    (CHANNEL, "search-indexer"): timedelta(days=4),
}
PAUSED = ("shipments", "warehouse")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--jobs", type=int, help=f"jobs to generate (default {DEFAULT_JOBS:,})")
    size.add_argument("--scale", type=float, help=f"jobs as a fraction of {DEFAULT_JOBS:,}")
    parser.add_argument("--database", default=DEFAULT_DATABASE)
    parser.add_argument("--rebuild", action="store_true", help="drop and generate it again")
    parser.add_argument("--runs", type=int, default=5, help="measured loads per page")
    parser.add_argument("--workers", type=int, default=2 * (os.cpu_count() or 1) + 1)
    parser.add_argument(
        "--explain",
        action="store_true",
        help="for each page over its bound, its slowest queries with EXPLAIN (ANALYZE, BUFFERS)",
    )
    args = parser.parse_args()
    args.jobs = args.jobs or round(DEFAULT_JOBS * (args.scale or 1))
    if args.jobs < 10_000:
        parser.error("--jobs: at least 10,000 (every channel needs messages)")
    return args


# --- the database ---------------------------------------------------------------------------


def database_url(name: str) -> str:
    return f"postgres://{PG_USER}@{HOST}:{PG_PORT}/{name}"


def built_jobs(name: str) -> int | None:
    """The jobs of a finished build of `name`; None if there is no database or no finished
    build in it (the meta row is written last)."""
    with admin_connection() as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return None
    with psycopg.connect(database_url(name)) as conn:
        if conn.execute("SELECT to_regclass('bench_ui_meta')").fetchone() != (None,):
            row = conn.execute("SELECT jobs FROM bench_ui_meta").fetchone()
            return int(row[0]) if row else None
    return None


def create_database(name: str) -> None:
    with admin_connection() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def migrate(env: dict[str, str]) -> None:
    """`manage.py migrate`, as an operator runs it (also on reuse: the code may have moved on)."""
    command = [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"]
    subprocess.run(command, cwd=ROOT, env=env, check=True)  # noqa: S603


def django_here(env: dict[str, str]) -> None:
    """Django in this process, on the bench database: consumers go through the ORM (their
    secrets are encrypted), and --explain fetches pages with the test client. Client-side
    binding here, so that captured queries are SQL that EXPLAIN can take as it is."""
    os.environ.update(env, DATABASE_PREPARED_STATEMENTS="false")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def make_consumers(history_end: datetime) -> None:
    """Channels, producers, the 10 consumers of every channel, a few periodic messages and the
    superuser, through the ORM."""
    from django.contrib.auth.models import User

    from broker.models import Channel, PeriodicMessage, Producer
    from consumers.models import Consumer

    producers = []
    for name in ("shop-backend", "billing-service", "crm"):
        producer = Producer(id=name, name=name)
        producer.set_token()
        producer.save()
        producers.append(producer)
    for index, channel_id in enumerate(CHANNELS):
        channel = Channel(id=channel_id, name=channel_id.title())
        channel.set_token()
        channel.save()
        for name, behaviour in CONSUMERS.items():
            Consumer.objects.create(
                channel=channel,
                public_id=name,
                name=f"{name} ({channel_id})",
                callback_url=f"https://{host_of(channel_id, name)}/hooks/broker",
                retry_delays=list(behaviour.retry_delays) if behaviour.retry_delays else None,
                non_retryable_statuses=list(behaviour.fail_codes)
                if behaviour.non_retryable
                else [],
                paused=(channel_id, name) == PAUSED,
                max_per_second=2.0 if (channel_id, name) in BACKLOGS.keys() - {PAUSED} else None,
            )
        PeriodicMessage.objects.create(
            channel=channel,
            producer=producers[index % 3],
            public_id=f"{channel_id}-daily-digest",
            payload=b'{"digest": true}',
            content_type="application/json",
            interval_seconds=3600 * (1 + index % 24),
            next_run_at=history_end + timedelta(minutes=5 + index),
        )
    # Consumers older than the history, as in a broker that has run for a while.
    Consumer.objects.update(created_at=history_end - timedelta(days=60))
    Consumer.objects.filter(channel_id=CHANNEL, public_id="analytics").update(
        circuit_failures=5, circuit_open_until=history_end + timedelta(minutes=5)
    )
    User.objects.create_superuser(USERNAME, password=PASSWORD)


def host_of(channel_id: str, consumer: str) -> str:
    if consumer == "clickhouse-sink":
        return "clickhouse-sink.data.internal"
    return f"{consumer}.{channel_id}.internal"


def offsets(delays: tuple[int, ...]) -> list[float]:
    """Seconds from a job's creation to each of its attempts: the first at once (0.25 s),
    each retry after the previous attempt's delay."""
    times = [0.25]
    for delay in delays:
        times.append(times[-1] + delay)
    return times


def fill_profiles(conn: psycopg.Connection[Any], history_end: datetime) -> None:
    """bench_ui_channel and bench_ui_profile, which ui_data.sql joins to: each channel's
    producer and message shape, each consumer's behaviour (CONSUMERS, OUTAGES, BACKLOGS)."""
    conn.execute(
        "CREATE TABLE bench_ui_channel (idx int PRIMARY KEY, id text, producer_id text,"
        " prefix text, ordered boolean)"
    )
    producers = ("shop-backend", "billing-service", "crm")
    conn.cursor().executemany(
        "INSERT INTO bench_ui_channel VALUES (%s, %s, %s, %s, %s)",
        [
            (i, channel, producers[i % 3], channel[:3], i % 5 == 0)
            for i, channel in enumerate(CHANNELS)
        ],
    )
    conn.execute(
        "CREATE TABLE bench_ui_profile (consumer_id bigint PRIMARY KEY, idx int, channel_id text,"
        " name text, host text, dead_rate float8, fail_codes int[], non_retryable boolean,"
        " offsets float8[], max_attempts int, down_from timestamptz, down_to timestamptz,"
        " backlog_since timestamptz)"
    )
    ids = {
        (channel, name): pk
        for pk, channel, name in conn.execute(
            "SELECT id, channel_id, public_id FROM consumers_consumer"
        ).fetchall()
    }
    rows = []
    for i, channel in enumerate(CHANNELS):
        for j, (name, behaviour) in enumerate(CONSUMERS.items()):
            times = offsets(behaviour.retry_delays or BROKER_RETRY_DELAYS)
            outage = OUTAGES.get((channel, name))
            down_from = history_end - outage[0] if outage else None
            down_to = (history_end - outage[1] if outage[1] else datetime.max) if outage else None
            backlog = BACKLOGS.get((channel, name))
            rows.append(
                (
                    ids[(channel, name)], i * len(CONSUMERS) + j, channel, name,
                    host_of(channel, name), behaviour.dead_rate, list(behaviour.fail_codes),
                    behaviour.non_retryable, times, len(times), down_from,
                    "infinity" if down_to == datetime.max else down_to,
                    history_end - backlog if backlog else None,
                )
            )  # fmt: skip
    conn.cursor().executemany(
        "INSERT INTO bench_ui_profile VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        rows,
    )


def data_steps() -> dict[str, str]:
    """The statements of ui_data.sql by step name ("-- step: name" starts each)."""
    parts = re.split(r"^-- step: (\S+)\n", DATA_SQL.read_text(), flags=re.MULTILINE)
    return {
        name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def has_column(conn: psycopg.Connection[Any], table: str, column: str) -> bool:
    found = conn.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = %s",
        [table, column],
    )
    return found.fetchone() is not None


def drop_secondary_indexes(conn: psycopg.Connection[Any]) -> list[str]:
    """The bulk load runs without the secondary indexes of the three big tables (built once at
    the end, far faster than kept up row by row) and without foreign key triggers (the generated
    rows are consistent by construction); primary keys and unique constraints stay. Returns the
    statements that build them again, on every partition."""
    found = secondary_indexes(conn)
    for name, _ in found:
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
    return [definition for _, definition in found]


@contextmanager
def timed(label: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    print(f"  {label}: {time.monotonic() - started:.0f} s", flush=True)


def generate(conn: psycopg.Connection[Any], jobs: int, history_end: datetime) -> None:
    """The history, step by step (ui_data.sql), the jobs and attempts in batches of messages."""
    steps = data_steps()
    messages = jobs // len(CONSUMERS)
    conn.execute("SELECT set_config('bench.now', %s, false)", [history_end.isoformat()])
    conn.execute("SELECT set_config('bench.messages', %s, false)", [str(messages)])
    for step in ("functions", "pick", "messages"):
        with timed(f"{step} ({messages:,} messages)" if step == "messages" else step):
            conn.execute(steps[step])
    first, last = conn.execute("SELECT min(id), max(id) FROM broker_message").fetchone() or (1, 0)
    per_batch = max(1, JOBS_PER_BATCH // len(CONSUMERS))
    for number, lo in enumerate(range(first, last + 1, per_batch), start=1):
        conn.execute("SELECT set_config('bench.lo', %s, false)", [str(lo)])
        conn.execute("SELECT set_config('bench.hi', %s, false)", [str(lo + per_batch)])
        batches = -(-(last - first + 1) // per_batch)
        with timed(f"jobs and attempts, batch {number} of {batches}"):
            conn.execute(steps["jobs"])
            conn.execute(steps["attempts"])
    for step in ("scheduled", "reports", "heartbeats"):
        with timed(step):
            conn.execute(steps[step])


def build(args: argparse.Namespace, env: dict[str, str]) -> float:
    """Create and fill the database; returns the seconds it took."""
    started = time.monotonic()
    history_end = datetime.now().astimezone().replace(microsecond=0)
    print(f"building {args.database}: {args.jobs:,} jobs over the 30 days to {history_end}")
    create_database(args.database)
    with timed("migrate"):
        migrate(env)
    django_here(env)
    with timed("channels, consumers, periodic messages, superuser (ORM)"):
        make_consumers(history_end)
    with psycopg.connect(database_url(args.database), autocommit=True) as conn:
        for setting in (
            "session_replication_role = replica",  # no foreign key triggers while loading
            "synchronous_commit = off",
            "maintenance_work_mem = '1GB'",
            "work_mem = '256MB'",
        ):
            conn.execute(f"SET {setting}")
        fill_profiles(conn, history_end)
        indexes = drop_secondary_indexes(conn)
        generate(conn, args.jobs, history_end)
        with timed(f"{len(indexes)} secondary indexes"):
            for definition in indexes:
                conn.execute(definition)
            require_valid_indexes(conn)
        if has_column(conn, "consumers_consumer", "last_failure_at"):  # since issue 20
            with timed("last_failures"):
                conn.execute(data_steps()["last_failures"])
        with timed("VACUUM (ANALYZE)"):
            conn.execute("VACUUM (ANALYZE)")
    with timed("manage.py refresh_delivery_stats (the dashboard's rollup)"):
        command = [sys.executable, "manage.py", "refresh_delivery_stats"]
        subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)  # noqa: S603
    seconds = time.monotonic() - started
    with psycopg.connect(database_url(args.database), autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bench_ui_meta AS SELECT %s::bigint AS jobs,"
            " %s::timestamptz AS history_end, %s::float8 AS build_seconds",
            [args.jobs, history_end, seconds],
        )
    return seconds


def describe(url: str) -> tuple[datetime, str]:
    """The history's end, and its counts by status."""
    with psycopg.connect(url) as conn:
        end = conn.execute("SELECT history_end FROM bench_ui_meta").fetchone()
        statuses = conn.execute(
            "SELECT status, count(*) FROM jobs_job GROUP BY status ORDER BY 2 DESC"
        ).fetchall()
        attempts = conn.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE relname = 'jobs_deliveryattempt'"
        ).fetchone()
        size = conn.execute("SELECT pg_size_pretty(pg_database_size(current_database()))")
        size_row = size.fetchone()
    total = sum(n for _, n in statuses)
    text = ", ".join(f"{status} {n:,} ({100 * n / total:.1f} %)" for status, n in statuses)
    return (
        end[0] if end else datetime.now().astimezone(),
        f"{total:,} jobs: {text}; ~{attempts[0] if attempts else 0:,} attempts;"
        f" database {size_row[0] if size_row else '?'}",
    )


# --- the server -----------------------------------------------------------------------------


@contextmanager
def gunicorn(
    env: dict[str, str], workers: int, timeout: int = 120, start_seconds: float = 30
) -> Iterator[str]:
    """`gunicorn broker.wsgi` as production runs it (sync workers, DEBUG off), on a free
    loopback port; yields its base URL. A worker timeout of `timeout` s instead of 30 s, so that
    a page far over its bound still gets a figure rather than a killed worker."""
    port = free_port()
    command = [
        sys.executable, "-m", "gunicorn", "broker.wsgi",
        "--bind", f"{HOST}:{port}",
        "--workers", str(workers),
        "--timeout", str(timeout),
        "--log-level", "warning",
    ]  # fmt: skip
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(  # noqa: S603
            command, cwd=ROOT, env=env, start_new_session=True, stdout=output, stderr=output
        )
        try:
            wait_until_serving(port, process, timeout=start_seconds)
            yield f"http://{HOST}:{port}"
        except BaseException:
            print_tail(output)
            raise
        finally:
            stop(process)


def print_tail(output: IO[bytes]) -> None:
    output.seek(max(0, output.seek(0, os.SEEK_END) - 4000))
    print(output.read().decode(errors="replace"), file=sys.stderr)


# --- the pages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    path: str
    bound_ms: int = LIST_BOUND_MS


@dataclass
class Result:
    target: Target
    times_ms: list[float]
    first_byte_ms: list[float]
    error: str = ""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms) if self.times_ms else float("nan")

    @property
    def median_first_byte_ms(self) -> float:
        return statistics.median(self.first_byte_ms) if self.first_byte_ms else float("nan")

    @property
    def met(self) -> bool:
        return not self.error and self.median_ms <= self.target.bound_ms


def query(path: str, **parameters: str) -> str:
    return f"{path}?{urlencode(parameters)}"


def fixed_targets(history_end: datetime) -> list[Target]:
    """The pages whose address is known beforehand. Times: a day ten days before the end."""
    day = (history_end - timedelta(days=10)).date()
    since, until = day.isoformat(), (day + timedelta(days=1)).isoformat()
    dead = "/ui/dead-jobs"
    consumer = f"/ui/consumers/{CHANNEL}/{CONSUMER}"
    return [
        Target("dashboard", "/ui/", DASHBOARD_BOUND_MS),
        Target("dead jobs", dead),
        Target("dead: channel", query(dead, channel=CHANNEL)),
        Target("dead: consumer", query(dead, consumer="billing")),
        Target("dead: channel+consumer", query(dead, channel=CHANNEL, consumer=CONSUMER)),
        Target("dead: since/until", query(dead, since=since, until=until)),
        Target("dead: status_code match", query(dead, status_code="503")),
        Target("dead: status_code no match", query(dead, status_code="418")),
        Target("dead: error match", query(dead, error="clickhouse")),
        Target("dead: error no match", query(dead, error="no such error text")),
        Target("consumers", "/ui/consumers"),
        Target("consumer", consumer),
        Target("consumer: status_code match", query(consumer, status_code="500")),
        Target("consumer: status_code no match", query(consumer, status_code="418")),
        Target("consumer: outcome 5xx", query(consumer, outcome="5xx")),
        Target("consumer: outcome connection", query(consumer, outcome="connection")),
        Target("consumer: outcome 2xx", query(consumer, outcome="2xx")),
        Target("consumer: since/until", query(consumer, since=since, until=until)),
        Target("messages", "/ui/messages"),
        Target("messages: channel", query("/ui/messages", channel=CHANNEL)),
        Target("scheduled", "/ui/scheduled"),
        Target("periodic", "/ui/periodic"),
        Target("reports", "/ui/reports"),
        Target("reports: hour", query("/ui/reports", grain="hour")),
    ]


def found_targets(page: Any, base: str, url: str) -> list[Target]:
    """Pages reached through links, as an operator reaches them: the dead jobs' second page
    ("Older"), a dead job of CONSUMER, its message (by id, by its public address, and by
    search), and the messages list's second page."""
    dead = "/ui/dead-jobs"
    page.goto(base + dead)
    older = page.locator("a", has_text="Older").first.get_attribute("href")
    page.goto(base + query(dead, channel=CHANNEL, consumer=CONSUMER))
    job = page.locator('a[href^="/ui/jobs/"]').first.get_attribute("href")
    page.goto(base + job)
    message = page.locator('a[href^="/ui/messages/"]').first.get_attribute("href")
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT channel_id, public_id FROM broker_message WHERE id = %s",
            [int(message.rsplit("/", 1)[1])],
        ).fetchone()
    channel_id, public_id = row if row else ("", "")
    page.goto(base + "/ui/messages")
    messages_older = page.locator("a", has_text="Older").first.get_attribute("href")
    return [
        Target("dead jobs, page 2 (Older)", dead + older),
        Target("job", job),
        Target("message", message),
        Target("message by channel/ID", f"/ui/messages/{channel_id}/{public_id}"),
        Target("messages: search by ID", query("/ui/messages", q=public_id)),
        Target("messages, page 2 (Older)", "/ui/messages" + messages_older),
    ]


def log_in(page: Any, base: str) -> None:
    """Through the admin's login page, where the UI sends anonymous users."""
    page.goto(f"{base}/admin/login/?next=/ui/")
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/ui/")


# The browser's own account of the navigation: from sending the request to the answer's first
# byte, which is the server's time (on loopback); the rest of a load is the browser's.
FIRST_BYTE_JS = """() => {
    const entry = performance.getEntriesByType('navigation')[0];
    return entry.responseStart - entry.requestStart;
}"""


def load_ms(page: Any, url: str) -> tuple[float, float, int]:
    """One navigation to `url` until its `load` event: milliseconds, milliseconds to the first
    byte of the answer, and the HTTP status."""
    started = time.perf_counter()
    response = page.goto(url, wait_until="load")
    elapsed = 1000 * (time.perf_counter() - started)
    return elapsed, float(page.evaluate(FIRST_BYTE_JS)), response.status if response else 0


def measure(page: Any, base: str, target: Target, runs: int) -> Result:
    """One warm-up load, then `runs` measured ones."""
    times: list[float] = []
    first_bytes: list[float] = []
    for run in range(runs + 1):
        ms, first_byte_ms, status = load_ms(page, base + target.path)
        if status != 200:
            return Result(target, times, first_bytes, f"HTTP {status}")
        if run:
            times.append(ms)
            first_bytes.append(first_byte_ms)
    return Result(target, times, first_bytes)


def measure_all(
    base: str, url: str, history_end: datetime, runs: int, list_bound_ms: int = LIST_BOUND_MS
) -> list[Result]:
    """Every page, in one logged-in browser; the list and detail pages judged against
    `list_bound_ms` (bench/scale.py passes issue 21's 500 ms at 25,000,000 jobs)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        page = browser.new_page()
        page.set_default_timeout(180_000)  # a page far over its bound still gets its figure
        log_in(page, base)
        targets = fixed_targets(history_end)
        second_page, *details = found_targets(page, base, url)
        targets[2:2] = [second_page]  # next to the first page
        targets += details
        targets = [
            replace(target, bound_ms=list_bound_ms) if target.bound_ms == LIST_BOUND_MS else target
            for target in targets
        ]
        results = []
        for target in targets:
            result = measure(page, base, target, runs)
            print(f"  {target.name}: {result.median_ms:.0f} ms {result.error}", flush=True)
            results.append(result)
        browser.close()
    return results


def print_table(results: list[Result]) -> None:
    rows = [("page", "URL", "median ms", "bound", "met", "first byte ms", "runs ms")]
    for r in results:
        runs = " ".join(f"{ms:.0f}" for ms in r.times_ms)
        met = "yes" if r.met else ("no" if not r.error else f"no ({r.error})")
        rows.append(
            (
                r.target.name,
                r.target.path,
                f"{r.median_ms:.0f}",
                str(r.target.bound_ms),
                met,
                f"{r.median_first_byte_ms:.0f}",
                runs,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for number, row in enumerate(rows):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |")
        if number == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    print(
        "(first byte: the median time from request to the answer's first byte, the server's share)"
    )
    missed = [r.target.name for r in results if not r.met]
    print(f"\n{len(results) - len(missed)} of {len(results)} pages within their bound", end="")
    print(f"; over: {', '.join(missed)}" if missed else "")


# --- why a page is slow ---------------------------------------------------------------------


def explain(results: list[Result]) -> None:
    """Each page over its bound, fetched once more in this process through Django's test
    client: its slowest queries, each with EXPLAIN (ANALYZE, BUFFERS). Run after the browser
    is closed (Playwright's sync API keeps an event loop that the ORM refuses to run under)."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST=HOST)
    client.force_login(User.objects.get(username=USERNAME))
    for result in results:
        if result.met:
            continue
        with CaptureQueriesContext(connection) as captured:
            client.get(result.target.path)
        slowest = sorted(captured.captured_queries, key=lambda q: -float(q["time"]))[:2]
        print(f"\n## {result.target.name}: {result.target.path}")
        print(f"{len(captured.captured_queries)} queries; the slowest:")
        for captured_query in slowest:
            print(f"\n-- {1000 * float(captured_query['time']):.0f} ms\n{captured_query['sql']}\n")
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + captured_query["sql"])
                print("\n".join(line for (line,) in cursor.fetchall()))


# --- main -----------------------------------------------------------------------------------


def ensure_database(args: argparse.Namespace, env: dict[str, str]) -> None:
    """Build the database unless a finished build of the same size is there."""
    jobs = None if args.rebuild else built_jobs(args.database)
    if jobs is None:
        seconds = build(args, env)
        print(f"build: {seconds:.0f} s ({seconds / 60:.1f} min)")
        return
    if jobs != args.jobs:
        raise SystemExit(
            f"{args.database} holds {jobs:,} jobs, not {args.jobs:,}: pass --rebuild to generate"
            f" it again, or --database NAME to build another"
        )
    with psycopg.connect(database_url(args.database)) as conn:
        row = conn.execute("SELECT build_seconds FROM bench_ui_meta").fetchone()
    print(f"reusing {args.database} (built in {row[0] if row else 0:.0f} s); migrating")
    migrate(env)
    django_here(env)


def main() -> None:
    args = arguments()
    print(f"# operator UI bench: {machine()}")
    url = database_url(args.database)
    env = broker_environment(url)
    server_env = {**env}  # the server keeps production's settings (prepared statements on)
    ensure_database(args, env)
    history_end, summary = describe(url)
    print(summary)
    print(f"gunicorn broker.wsgi, {args.workers} sync workers; {args.runs} loads per page")
    with gunicorn(server_env, args.workers) as base:
        results = measure_all(base, url, history_end, args.runs)
    print()
    print_table(results)
    if args.explain:
        explain(results)


if __name__ == "__main__":
    main()
