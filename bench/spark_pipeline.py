"""spark_etl on a large history: `report` and `archive` over 1,000,000 jobs and 3,000,000
attempts with local[2] (targets: report <= 3 min, archive <= 5 min).

Builds a fresh `bench_spark_etl` database, generates the history in SQL (generate_series),
runs `python -m spark_etl report`, then `archive`, each as the command an operator runs,
times
them, checks the figures and the counts, and drops the database.

    .venv/bin/python bench/spark_pipeline.py                   # the targets' size
    .venv/bin/python bench/spark_pipeline.py --messages 25000  # a quick run (10x smaller)

With `--copy-of broker_bench_scale` (the 25,000,000-job set of bench/scale.py, in time
partitions) it instead copies that database (CREATE DATABASE ... TEMPLATE) and runs only the
archive on the copy, with `--retention-days` (default 28: the oldest days' partitions go), while
a probe runs the dispatcher's claim every 100 ms on the copy: how long the archive takes per
partition, whether the manifest holds every job of the partitions it dropped, and how long the
claim waited meanwhile (a detach takes a brief lock on the parent table). The source is not
touched; the copy is dropped after.

    .venv/bin/python bench/spark_pipeline.py --copy-of broker_bench_scale --retention-days 28

(Not bench/spark_etl.py: a script of that name would shadow the spark_etl package for mypy and
for anything run from bench/.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from dispatch_harness import HOST, PG_PORT, PG_USER, ROOT, admin_connection, machine
from psycopg import sql

DATABASE = "bench_spark_etl"
CONSUMERS = 4
DAYS = 10  # the history spans ten days, 45 to 35 days ago (older than the 30-day retention)
TARGETS = {"report": 180.0, "archive": 300.0}


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--messages", type=int, default=250_000, help="x 4 consumers = jobs; x ~3 = attempts"
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="3g")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--copy-of", help="archive a copy of this database instead (see above)")
    parser.add_argument("--retention-days", type=int, default=28, help="with --copy-of")
    return parser.parse_args()


def database_url() -> str:
    return f"postgres://{PG_USER}@{HOST}:{PG_PORT}/{DATABASE}"


def recreate_database() -> None:
    with admin_connection() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))


def drop_database() -> None:
    with admin_connection() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE))
        )


def environment(output: str, retention_days: int = 30) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "broker.settings",
        "SPARK_ETL_OUTPUT": output,
        "BROKER_RETENTION_DAYS": str(retention_days),
        "PYTHONWARNINGS": "ignore:No directory at:UserWarning",
    }


def migrate_and_make_consumers(env: dict[str, str]) -> None:
    """The schema, one channel and its consumers through Django (secrets are encrypted)."""
    script = (
        "import django; django.setup()\n"
        "from django.core.management import call_command\n"
        "call_command('migrate', interactive=False, verbosity=0)\n"
        "from broker.models import Channel, Producer\n"
        "from consumers.models import Consumer\n"
        "c = Channel(id='bench', name='Bench'); c.set_token('t'); c.save()\n"
        "p = Producer(id='bench-producer', name='P'); p.set_token('t'); p.save()\n"
        f"for n in range({CONSUMERS}):\n"
        "    Consumer.objects.create(channel=c, public_id=f'c{n}', name=f'c{n}',"
        " callback_url='http://127.0.0.1:9/hook')\n"
    )
    subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, check=True)  # noqa: S603


# Jobs placed by when they were created, as the broker places them (`partition_at`): older than
# every partition (a fresh database's begin this week), so in the DEFAULT partitions of jobs and
# attempts, which the archive takes by rows. Left to the column's default (the insert's time)
# they would sit in this week's partition, which no archive takes for another 30 days.
# Jobs: 1 in 10 DEAD, the rest DELIVERED; 1 + id % 5 attempts (3 on average), the last one of a
# delivered job a 200, the others 503 or a timeout; latencies spread from 0.05 s to ~2 min.
HISTORY_SQL = """
INSERT INTO broker_message (channel_id, producer_id, public_id, payload, payload_file, payload_size,
    content_type, priority, headers, ordering_key, status, received_at)
SELECT 'bench', 'bench-producer', 'm-' || i, '\\x7b7d'::bytea, '', 2, 'application/json', 0,
    '{}'::jsonb, '', 'DISPATCHED',
    now() - interval '45 days' + (i * interval '10 days' / %(messages)s)
FROM generate_series(1, %(messages)s) AS i;

INSERT INTO jobs_job (message_id, consumer_id, status, priority, ordering_key, attempts,
    next_attempt_at, incremental_timeout, last_error, created_at, partition_at, status_changed_at)
SELECT m.id, c.id, CASE WHEN (m.id + c.id) %% 10 = 0 THEN 'DEAD' ELSE 'DELIVERED' END, 0, '',
    1 + (m.id + c.id) %% 5, m.received_at, 0, '', m.received_at, m.received_at,
    m.received_at + ((50 + (m.id * 7919 + c.id * 104729) %% 120000) * interval '1 millisecond')
FROM broker_message m CROSS JOIN consumers_consumer c;

INSERT INTO jobs_deliveryattempt (job_id, attempt_number, started_at, duration_ms, status_code,
    error_class, response_excerpt, dispatcher_id)
SELECT j.id, n, j.created_at + n * interval '1 second', 12.5,
    CASE WHEN n = j.attempts AND j.status = 'DELIVERED' THEN 200
         WHEN n %% 2 = 1 THEN 503 END,
    CASE WHEN n = j.attempts AND j.status = 'DELIVERED' THEN ''
         WHEN n %% 2 = 1 THEN 'http-status' ELSE 'timeout' END,
    '', 'bench'
FROM jobs_job j CROSS JOIN LATERAL generate_series(1, j.attempts) AS n;

ANALYZE;
"""


def generate_history(messages: int) -> tuple[int, int, int]:
    with psycopg.connect(database_url(), autocommit=True) as conn:
        for statement in filter(str.strip, HISTORY_SQL.split(";\n")):
            conn.execute(statement, {"messages": messages})
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM broker_message), (SELECT count(*) FROM jobs_job),"
            " (SELECT count(*) FROM jobs_deliveryattempt)"
        ).fetchone()
    if counts is None:
        raise SystemExit("no counts")
    return counts[0], counts[1], counts[2]


def run_job(job: str, args: argparse.Namespace, env: dict[str, str]) -> tuple[float, str]:
    command = [sys.executable, "-m", "spark_etl", job, "--master", args.master]
    conf = {**env, "SPARK_ETL_CONF": f"spark.driver.memory={args.driver_memory}"}
    started = time.monotonic()
    run = subprocess.run(command, env=conf, cwd=ROOT, capture_output=True, text=True, check=False)  # noqa: S603
    seconds = time.monotonic() - started
    if run.returncode:
        sys.stderr.write(run.stderr[-5000:])
        raise SystemExit(f"{job} failed")
    for line in run.stderr.splitlines():
        if f"spark_etl.{job} " in line:  # the job's own progress (its module's logger), timed
            print("  " + line)
    return seconds, run.stdout.strip().splitlines()[-1]


def check_report(jobs: int) -> str:
    with psycopg.connect(database_url()) as conn:
        row = conn.execute(
            "SELECT count(*), coalesce(sum(jobs), 0), coalesce(sum(delivered), 0),"
            " coalesce(sum(dead), 0) FROM jobs_deliveryreport"
            " WHERE grain = 'day'"
        ).fetchone()
        hours = conn.execute(
            "SELECT count(*), coalesce(sum(jobs), 0) FROM jobs_deliveryreport WHERE grain = 'hour'"
        ).fetchone()
        expected = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'DELIVERED'), count(*) FILTER"
            " (WHERE status = 'DEAD') FROM jobs_job"
        ).fetchone()
    if not (row and hours and expected):
        raise SystemExit("no report figures")
    ok = row[1] == jobs == hours[1] and (row[2], row[3]) == expected
    return (
        f"{row[0]} day rows and {hours[0]} hour rows; jobs {row[1]:,} (hours {hours[1]:,}),"
        f" delivered {row[2]:,}, dead {row[3]:,}: {'OK' if ok else 'MISMATCH'}"
    )


def check_archive(counts: tuple[int, int, int]) -> str:
    with psycopg.connect(database_url()) as conn:
        archived = conn.execute(
            "SELECT count(*), coalesce(sum(messages), 0), coalesce(sum(jobs), 0),"
            " coalesce(sum(attempts), 0) FROM spark_etl_archive_batch"
            " WHERE state = 'done'"
        ).fetchone()
        left = conn.execute(
            "SELECT (SELECT count(*) FROM broker_message), (SELECT count(*) FROM jobs_job),"
            " (SELECT count(*) FROM jobs_deliveryattempt)"
        ).fetchone()
    if not (archived and left):
        raise SystemExit("no archive figures")
    if not archived[0]:
        raise SystemExit(
            f"archive: nothing was archived; left in PostgreSQL {tuple(left)} (messages, jobs,"
            f" attempts), jobs by partition: {jobs_by_partition()}"
        )
    ok = tuple(archived[1:]) == counts and tuple(left) == (0, 0, 0)
    return (
        f"{archived[0]} batches; archived {archived[1]:,} messages, {archived[2]:,} jobs,"
        f" {archived[3]:,} attempts; left in PostgreSQL {left}: {'OK' if ok else 'MISMATCH'}"
    )


def jobs_by_partition() -> dict[str, int]:
    """Where the jobs the archive left are: which partition holds how many."""
    with psycopg.connect(database_url()) as conn:
        rows = conn.execute(
            "SELECT tableoid::regclass::text, count(*) FROM jobs_job GROUP BY 1 ORDER BY 1"
        ).fetchall()
    return dict(rows)


def parquet_rows(output: str) -> str:
    sizes = {
        table: sum(f.stat().st_size for f in Path(output, "archive", table).rglob("*.parquet"))
        for table in ("messages", "jobs", "attempts")
    }
    return ", ".join(f"{table} {size / 2**20:.0f} MiB" for table, size in sizes.items())


# --- the archive of a copy of the 25M set --------------------------------------------------

# The claim probe of bench/scale.py (the dispatcher's claim of 10, rolled back, every 100 ms), in
# a process of its own on the copy until its stdin closes; the claims' times as JSON on stdout.
CLAIM_PROBE = """
import json, sys
import django
django.setup()
sys.path.insert(0, "bench")
from scale import probing_beside
with probing_beside() as probe:
    sys.stdin.read()
print(json.dumps(probe.times_ms))
"""


def copy_database(source: str) -> float:
    started = time.monotonic()
    drop_database()
    with admin_connection() as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(DATABASE), sql.Identifier(source)
            )
        )
    return time.monotonic() - started


def due_partitions(days: int) -> dict[str, int]:
    """The partitions of jobs the archive should take, with their jobs: those that end before
    the cutoff with every job finished."""
    cutoff = datetime.now(UTC) - timedelta(days=days)
    due = {}
    with psycopg.connect(database_url()) as conn:
        for name, bound in conn.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'jobs_job'::regclass"
        ).fetchall():
            end = re.search(r"TO \('([^']+)'\)", bound)
            if end is None or datetime.fromisoformat(end[1]) > cutoff:
                continue  # DEFAULT, MINVALUE or too young
            table = sql.Identifier(name)
            busy = conn.execute(
                sql.SQL(
                    "SELECT EXISTS (SELECT FROM {} WHERE status IN ('QUEUED', 'INFLIGHT'))"
                ).format(table)
            ).fetchone()
            if busy == (False,):
                counted = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
                due[name] = counted[0] if counted else 0
    return due


def archive_copy(args: argparse.Namespace, output: str) -> None:
    print(f"copy of {args.copy_of}: {copy_database(args.copy_of):.0f} s")
    env = environment(output, args.retention_days)
    due = due_partitions(args.retention_days)
    print(f"partitions of jobs due ({args.retention_days}-day retention): {len(due)},"
          f" {sum(due.values()):,} jobs")  # fmt: skip
    probe = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", CLAIM_PROBE], env=env, cwd=ROOT, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        seconds, line = run_job("archive", args, env)
    finally:
        claims, _ = probe.communicate("", timeout=60)
    times = sorted(json.loads(claims))
    print(f"archive: {seconds:.1f} s - {line}")
    print(f"  claim meanwhile: median {times[len(times) // 2]:.0f} ms, max {times[-1]:.0f} ms"
          f" ({len(times):,} claims)")  # fmt: skip
    print("  check: " + check_partitions(due))


def check_partitions(due: dict[str, int]) -> str:
    """Each due partition in the manifest, done, with its count of jobs, and gone."""
    with psycopg.connect(database_url()) as conn:
        done: dict[str, int] = dict(
            conn.execute(
                "SELECT name, rows FROM spark_etl_archive_partition"
                " WHERE parent = 'jobs_job' AND state = 'done'"
            ).fetchall()
        )
        left = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relname = ANY(%s)", (list(due),)
        ).fetchone()
    missing = {name for name, jobs in due.items() if done.get(name) != jobs}
    ok = not missing and left == (0,)
    return (
        f"{len(done)} partitions of jobs archived ({sum(done.values()):,} jobs),"
        f" {left[0] if left else '?'} of the due ones still present,"
        f" missing or miscounted: {sorted(missing) or 'none'}: {'OK' if ok else 'MISMATCH'}"
    )


def main() -> None:
    args = arguments()
    if args.copy_of:
        print(f"# spark_etl archive of a copy: {machine()}")
        output = tempfile.mkdtemp(prefix="bench-spark-etl-")
        try:
            archive_copy(args, output)
        finally:
            if not args.keep:
                drop_database()
            subprocess.run(["rm", "-rf", output], check=False)  # noqa: S603, S607
        return
    print(f"# spark_etl bench: {machine()}")
    print(f"master {args.master}, driver memory {args.driver_memory}")
    output = tempfile.mkdtemp(prefix="bench-spark-etl-")
    env = environment(output)
    recreate_database()
    try:
        migrate_and_make_consumers(env)
        started = time.monotonic()
        counts = generate_history(args.messages)
        print(
            f"history: {counts[0]:,} messages, {counts[1]:,} jobs, {counts[2]:,} attempts"
            f" (generated in {time.monotonic() - started:.0f} s)"
        )
        results = {}
        for job in ("report", "archive"):
            seconds, line = run_job(job, args, env)
            results[job] = seconds
            print(f"{job}: {seconds:.1f} s (target {TARGETS[job]:.0f} s) - {line}")
            if job == "report":
                print("  check: " + check_report(counts[1]))
            else:
                print("  check: " + check_archive(counts))
                print("  Parquet: " + parquet_rows(output))
        for job, seconds in results.items():
            met = "met" if seconds <= TARGETS[job] else "MISSED"
            print(f"verdict {job}: {seconds:.1f} s <= {TARGETS[job]:.0f} s: {met}")
    finally:
        if not args.keep:
            drop_database()
        subprocess.run(["rm", "-rf", output], check=False)  # noqa: S603, S607


if __name__ == "__main__":
    main()
