"""The push claim against the number of time partitions of jobs (issues 21 and 40): how long
`jobs.queue.claim_for_push(10)`, rolled back, takes as jobs have more partitions, under each of
PostgreSQL's `plan_cache_mode` settings. The claim plans only the partitions that can hold
pending work (jobs/partitions/pending.py); issue 40's target, a flat claim of at most 10 ms at 94
partitions, gets a TARGET line. Also printed: the time to work out the claim's lower bound once
(a process does so every 10 s at most).

Each layout DAYSxHISTORY is a fresh database `bench_claimparts_DAYSxHISTORY`, migrated with
BROKER_PARTITION_DAYS=DAYS, with partitions over the last HISTORY days (`ensure_partitions`), 10
push consumers (callbacks on http://127.0.0.1:9/, never called), --jobs DELIVERED jobs spread
over the history, --jobs QUEUED due jobs made in the last hour (pending work is young) and
--old-pending QUEUED jobs at the far end of the history (an old backlog: the claim then plans
every partition), then VACUUM (ANALYZE). A child process with the broker's database settings
(prepared statements, JIT off, no pool: a closed connection is a new session) opens a session
per `plan_cache_mode`, runs --warmup claims and times --runs more, each of which must claim 10
jobs (exit 1 otherwise); then EXPLAIN (ANALYZE) of the claim with its values written in.

A claim rolled back is never a prepared statement (psycopg forgets them at a rollback): each is
planned anew for its values (`auto`, `force_custom_plan`) or generically (`force_generic_plan`).
A dispatcher's claims commit: its session prepares the claim at the 6th, and `auto` may then
settle on a generic plan; `force_generic_plan` shows what that costs, and the second table
whether the claim was prepared.

    .venv/bin/python bench/claim_partitions.py             # 7x0, 7x33, 1x33, 1x90; 10,000 jobs
    .venv/bin/python bench/claim_partitions.py --old-pending 10    # with an old backlog
    .venv/bin/python bench/claim_partitions.py --layouts 7x10 --jobs 500 --runs 5   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from claim_partitions_report import CLAIM, EXPLAINS, MODES, print_report
from dispatch_harness import (
    CHANNEL,
    PAYLOAD,
    PRODUCER,
    ROOT,
    Bench,
    broker_environment,
    drop_database,
    machine,
    prepare,
    process_cpu,
)
from psycopg import ClientCursor
from scale import json_of_child, rolled_back_claim
from ui import create_database, database_url, migrate

CONSUMERS = 10
DISCARD_PORT = 9  # the consumers' callbacks: nothing is delivered
NO_HISTORY_SPREAD = timedelta(hours=1)  # where the jobs of a database without history fall

# Messages spread evenly over `spread` back from `until`, one job each per consumer in `status`,
# due since its creation and in the time partition of its creation.
JOBS_SQL = """
WITH message AS (
    INSERT INTO broker_message (channel_id, producer_id, public_id, payload, payload_file,
        payload_size, content_type, priority, headers, ordering_key, status, received_at,
        dispatched_at)
    SELECT %(channel)s, %(producer)s, %(prefix)s || g, %(payload)s::bytea, '',
        length(%(payload)s::bytea), 'application/json', 0, '{}'::jsonb, '', 'DISPATCHED', t, t
    FROM generate_series(1, %(messages)s::int) AS g,
        LATERAL (SELECT %(until)s::timestamptz
                        - %(spread)s::interval * (g::float8 / %(messages)s::int) AS t) AS at
    RETURNING id, received_at
)
INSERT INTO jobs_job (message_id, consumer_id, status, priority, ordering_key, attempts,
    next_attempt_at, incremental_timeout, last_error, created_at, status_changed_at, enqueued_at,
    partition_at)
SELECT message.id, consumer.id, %(status)s, 0, '', 0, message.received_at, 0, '',
    message.received_at, message.received_at, message.received_at, message.received_at
FROM message CROSS JOIN unnest(%(consumers)s::bigint[]) AS consumer(id)
ORDER BY message.id, consumer.id
"""
PARTITIONS_SQL = "SELECT count(*) FROM pg_inherits WHERE inhparent = 'jobs_job'::regclass"
# How PostgreSQL planned the claim's prepared statements in this session, found by the claim's
# first line (none: psycopg prepares a statement at its 6th execution, but forgets it and the
# count at each rollback).
PLANS_SQL = """
SELECT sum(generic_plans), sum(custom_plans) FROM pg_prepared_statements
WHERE strpos(statement, %s) > 0
"""


@dataclass(frozen=True)
class Layout:
    days: int  # BROKER_PARTITION_DAYS
    history_days: int  # partitions made back this far

    @property
    def text(self) -> str:
        return f"{self.days}x{self.history_days}"

    @property
    def database(self) -> str:
        return f"bench_claimparts_{self.text}"

    @property
    def label(self) -> str:
        history = f"over {self.history_days} days" if self.history_days else "as migrated"
        return f"{self.days}-day partitions {history} ({self.text})"


def layout(text: str) -> Layout:
    found = re.fullmatch(r"(\d+)x(\d+)", text.strip())
    if not found or int(found[1]) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: DAYSxHISTORY, such as 7x33 (DAYS >= 1)")
    return Layout(int(found[1]), int(found[2]))


def layouts(text: str) -> list[Layout]:
    return [layout(part) for part in text.split(",")]


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--layouts",
        type=layouts,
        default=layouts("7x0,7x33,1x33,1x90"),
        help="DAYSxHISTORY,...: BROKER_PARTITION_DAYS and the days of partitions back from now",
    )
    parser.add_argument(
        "--jobs", type=int, default=10_000, help="QUEUED jobs, all due; as many DELIVERED"
    )
    parser.add_argument(
        "--old-pending", type=int, default=0, help="QUEUED jobs more, as old as the partitions"
    )
    parser.add_argument("--runs", type=int, default=20, help="timed claims per plan_cache_mode")
    parser.add_argument("--warmup", type=int, default=10, help="claims before, not timed")
    parser.add_argument("--keep", action="store_true", help="leave the databases in place")
    parser.add_argument("--child", type=layout, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.jobs < CLAIM or args.runs < 1 or args.warmup < 0:
        parser.error(f"--jobs at least {CLAIM}, --runs at least 1, --warmup not negative")
    return args


# --- the child: one layout's database, filled and measured ----------------------------------


def fill(layout: Layout, jobs: int, old_pending: int) -> int:
    """The layout's partitions, consumers and jobs (module docstring), vacuumed; the partitions
    of jobs."""
    from django.utils import timezone

    from jobs import partitions

    now = timezone.now()
    history = timedelta(days=layout.history_days)
    partitions.ensure_partitions(now, since=now - history)
    # prepare() uses only the bench's connection: no dispatchers here, no logs.
    bench = Bench(argparse.Namespace(), os.environ["DATABASE_URL"], ROOT)
    try:
        consumers = prepare(bench, CONSUMERS, DISCARD_PORT)
        batches = [
            ("finished-", "DELIVERED", jobs, now, history or NO_HISTORY_SPREAD),
            ("young-", "QUEUED", jobs, now, NO_HISTORY_SPREAD),
            ("old-", "QUEUED", old_pending, now - history + NO_HISTORY_SPREAD, NO_HISTORY_SPREAD),
        ]
        for prefix, status, count, until, spread in batches:
            if count:
                parameters = {"channel": CHANNEL, "producer": PRODUCER, "consumers": consumers}
                bench.db.execute(
                    JOBS_SQL,
                    {
                        **parameters,
                        "prefix": f"claimparts-{prefix}",
                        "status": status,
                        "payload": PAYLOAD.encode(),
                        "messages": math.ceil(count / CONSUMERS),
                        "until": until,
                        "spread": spread,
                    },
                )
        bench.db.execute("VACUUM (ANALYZE)")  # as autovacuum would have left the tables
        return int(bench.scalar(PARTITIONS_SQL))
    finally:
        bench.db.close()


def bound_ms() -> float:
    """Working out the claim's lower bound of partitions once (jobs/partitions/pending.py), ms:
    the median of EXPLAINS."""
    from jobs.partitions import pending

    times = []
    for _ in range(EXPLAINS):
        started = time.perf_counter()
        pending.oldest_pending_partition_at()
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def cpu_seconds(backend: int) -> tuple[float | None, float]:
    """CPU so far of PostgreSQL's backend (None where /proc does not show it) and of us."""
    try:
        server: float | None = process_cpu(backend)
    except OSError:
        server = None
    own = resource.getrusage(resource.RUSAGE_SELF)
    return server, own.ru_utime + own.ru_stime


def measure_mode(mode: str, warmup: int, runs: int) -> dict[str, Any]:
    """`warmup` claims then `runs` timed ones in a new session with `mode`: each claim's time
    and jobs, the CPU of the backend and of this process over the timed ones, and the plans."""
    from django.db import connection

    from jobs.queue.queries import statement as queue_statement

    claim_sql = queue_statement("claim_for_push")

    connection.close()  # without a pool, the next query opens a new session
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('plan_cache_mode', %s, false), pg_backend_pid()", [mode])
        backend = int(cursor.fetchone()[1])
    for _ in range(warmup):
        rolled_back_claim(CLAIM)
    server_before, own_before = cpu_seconds(backend)
    claims = [rolled_back_claim(CLAIM) for _ in range(runs)]
    server_after, own_after = cpu_seconds(backend)
    with connection.cursor() as cursor:
        cursor.execute(PLANS_SQL, [claim_sql.strip().splitlines()[0]])
        plans = cursor.fetchone()
    server = None if server_before is None or server_after is None else server_after - server_before
    return {
        "times_ms": [took for took, _ in claims],
        "claimed": [claimed for _, claimed in claims],
        "server_cpu_ms": None if server is None else 1000 * server / runs,
        "own_cpu_ms": 1000 * (own_after - own_before) / runs,
        "plans": [int(plans[0]), int(plans[1])] if plans[0] is not None else None,
    }


def explained_claim() -> tuple[float, float]:
    """One claim's statement with its values written in, EXPLAIN (ANALYZE)d and rolled back:
    (planning ms, execution ms)."""
    from django.db import connection, transaction

    from jobs.queue.queries import statement as queue_statement

    claim_sql = queue_statement("claim_for_push")

    statements: list[str] = []

    def capture(
        execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if sql == claim_sql:  # client-side binding writes the values in
            with ClientCursor(connection.connection) as client:
                statements.append(client.mogrify(sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        rolled_back_claim(CLAIM)
    if not statements:
        raise RuntimeError("claim_for_push ran no claim_sql: not PostgreSQL's queue?")
    plan: dict[str, Any] = {}
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statements[0])
            plan = cursor.fetchone()[0][0]
        transaction.set_rollback(True)
    return plan["Planning Time"], plan["Execution Time"]


def child_main(args: argparse.Namespace) -> None:
    """`claim_partitions.py --child LAYOUT`: on the database of DATABASE_URL, migrated with the
    layout's BROKER_PARTITION_DAYS; its figures as a JSON line on stdout."""
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    started = time.monotonic()
    found = fill(args.child, args.jobs, args.old_pending)
    filled = time.monotonic() - started
    modes = {mode: measure_mode(mode, args.warmup, args.runs) for mode in MODES}
    explained = [explained_claim() for _ in range(EXPLAINS)]
    figures = {
        "partitions": found,
        "fill_seconds": filled,
        "modes": modes,
        "planning_ms": statistics.median(planning for planning, _ in explained),
        "execution_ms": statistics.median(execution for _, execution in explained),
        "bound_ms": bound_ms(),
    }
    print(json.dumps(figures), flush=True)


# --- the parent: a database per layout ------------------------------------------------------


def measure_layout(layout: Layout, args: argparse.Namespace) -> dict[str, Any]:
    """The layout's database made and migrated, then filled and measured by a child."""
    started = time.monotonic()
    url = database_url(layout.database)
    env = {
        **broker_environment(url),
        "BROKER_PARTITION_DAYS": str(layout.days),
        "DATABASE_POOL": "false",
    }
    create_database(layout.database)
    migrate(env)
    command = [
        sys.executable, __file__, "--child", layout.text, "--jobs", str(args.jobs),
        "--old-pending", str(args.old_pending), "--runs", str(args.runs),
        "--warmup", str(args.warmup),
    ]  # fmt: skip
    result = json_of_child(command, env, layout.text)
    auto = statistics.median(result["modes"]["auto"]["times_ms"])
    print(
        f"  {layout.label}: {result['partitions']} partitions of jobs, claim median {auto:.1f} ms"
        f" (auto); fill {result['fill_seconds']:.0f} s, in all {time.monotonic() - started:.0f} s",
        flush=True,
    )
    return result


def main() -> None:
    args = arguments()
    if args.child:
        child_main(args)
        return
    print(f"# the push claim against time partitions: {machine()}")
    results = []
    try:
        for layout in args.layouts:
            results.append((layout, measure_layout(layout, args)))
    finally:
        if not args.keep:
            for layout in args.layouts:
                drop_database(layout.database)
    print_report(results, args)
    short = [
        f"{layout.text} {mode}"
        for layout, r in results
        for mode in MODES
        if set(r["modes"][mode]["claimed"]) != {CLAIM}
    ]
    if short:
        print(f"\nFAILED: claims took fewer than {CLAIM} jobs ({', '.join(short)})")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
