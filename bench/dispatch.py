"""Push delivery: `manage.py dispatch` throughput, latency and memory, and its peers side by side.

Scenarios (`--scenario`, comma-separated, default `all`):

    drain    10,000 queued jobs delivered to a fast receiver by 1 and 2 dispatcher processes,
             with 1 and 10 push consumers; every job must arrive exactly once
    peers    the same jobs as webhooks sent with requests by Celery 5 (RabbitMQ on
             127.0.0.1:5672), procrastinate and django-q2 (both on PostgreSQL), each with as many
             worker processes as dispatchers, beside our drain: one table of deliveries/s, CPU
             per delivery (workers and broker) and exactly-once; our rate / Celery's judged
             (bench/peers.py; --peers picks some)
    celery   peers with Celery alone (not in `all`)
    slow     a receiver that answers after 200 ms: one dispatcher with enough concurrency
    latency  publish -> arrival at the receiver at 500 and 2,000 messages/s offered, one
             dispatcher that waits idle for NOTIFY; `broker.publish()` (or `publish_many()` with
             --publish-batch) from processes forked for the rate (bench/steady_publish.py), which
             print the rate they reached; and how many NOTIFYs the publishes sent (a publish
             sends one only while a dispatcher guards: docs/dispatcher.md, "Waking up")
    backlog  the drain rate with 1,000,000 other queued jobs in the table (all due, due tomorrow,
             or a paused consumer's), against the rate without them, measured right before;
             --explain prints EXPLAIN (ANALYZE, BUFFERS) of the claim on each queue
    rss      the dispatcher's resident memory while messages are published at a steady rate
             (--rss-rate, publishers as for latency); flat = under 5 % growth from the sample at
             20 % of the run to the end
    ordered  an ordered consumer with 1,000 ordering keys against the same consumer unordered,
             and the cost of its claim statement with 10,000 and 1,000,000 queued jobs
    scheduled  200 messages scheduled 0.1 s apart, released by two dispatchers: how late each
             was released and delivered after its time, and that each went out exactly once
    ratelimit  a consumer with maxPerSecond 20 (--rate-limit) and a backlog, beside an unlimited
             one, on two dispatchers: what the limited one got in 60 s (--rate-seconds) and in
             its busiest second, and the unlimited one's drain rate against its rate alone

The benchmark creates a fresh PostgreSQL database `bench_dispatch` (BENCH_DISPATCH_DATABASE names
another) on 127.0.0.1:5432 (dropped first if left over) and migrates it; every run empties the
tables, creates the consumers and inserts its jobs with bulk SQL. Receivers (bench/webhook_sink.py)
and dispatchers run as processes of their own, dispatchers with
BROKER_ALLOW_PRIVATE_CALLBACKS=true; the dispatchers start first and wait idle, and the jobs appear
in one committed transaction (with the NOTIFY a publish sends to idle dispatchers). A drain is
timed from the first request at the receiver until SQL counts every job DELIVERED; then the
dispatchers get SIGTERM, and the script checks with SQL and the receiver's counts that every job
was delivered exactly once. It talks to 127.0.0.1 only, stops by itself and drops the database.

    .venv/bin/python bench/dispatch.py                         # everything, about 6 minutes
    .venv/bin/python bench/dispatch.py --scenario peers --jobs 5000 --dispatchers 1
    .venv/bin/python bench/dispatch.py --scenario rss --rss-seconds 600 --rss-rate 2000
    .venv/bin/python bench/dispatch.py --help

The peers need `.venv/bin/pip install -r bench/requirements.txt`, and Celery RabbitMQ
(`rabbitmq-server -detached`); a peer that cannot run is named in the table with the reason.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from dispatch_harness import (
    CHANNEL,
    HOST,
    PAYLOAD,
    PRODUCER,
    ROOT,
    Bench,
    Check,
    DispatchOptions,
    Drain,
    Receivers,
    close_django_connections,
    cpu_by_group,
    cpu_table,
    dispatchers,
    drain_ours,
    drain_queued,
    fresh_database,
    machine,
    percentile,
    prepare,
    process_cpu,
    queue_jobs,
    receivers,
    rss_mb,
    setup_django,
    verify,
    wait_for,
    wait_for_delivered,
)
from peers import PEERS, scenario_celery, scenario_peers
from psycopg import sql
from steady_publish import publish_steadily

# The channel of the dispatchers' wake-up (jobs/queue/rules.py, WAKEUP_CHANNEL; not imported: the
# bench reads it before Django is set up).
WAKEUP_CHANNEL = "broker_jobs"

SCENARIOS = [
    "drain", "peers", "celery", "slow", "latency", "backlog", "rss", "ordered", "scheduled",
    "ratelimit",
]  # fmt: skip
EVERY_SCENARIO = [name for name in SCENARIOS if name != "celery"]  # `peers` runs Celery too
BACKLOG_KINDS = ["due", "future", "paused"]

# The targets.
DRAIN_TARGETS = {1: 2000, 2: 3500}  # deliveries/s by dispatcher processes
DRAIN_STRETCH = 5000  # with two
SLOW_TARGET = 1000
LATENCY_P50_MS, LATENCY_P99_MS = 10.0, 50.0
LATENCY_P50_RATE = 500.0  # p50 is judged at the 500/s; p99 at every rate
PUBLISHER_RATE = 400.0  # messages/s one publishing process is asked for (it manages ~600)
BACKLOG_RATIO = 0.8
RSS_LIMIT_MB = 200.0
# "Flat": grows less than 5 % from the sample at 20 % of the run (minute 2 of 10) to the end.
RSS_FLAT_SHARE, RSS_SETTLED_SHARE = 0.05, 0.2
ORDERED_RATIO = 0.5
CLAIM_FLAT_FACTOR = 2.0  # "flat": 100 times the queue costs less than twice as much per claim


# --- scenarios ------------------------------------------------------------------------------


def scenario_drain(bench: Bench) -> None:
    args = bench.args
    options = bench.options()
    print(f"\n== drain: {args.jobs} queued jobs, fast receiver; manage.py dispatch {options}")
    with receivers(bench) as sinks:
        for consumers in args.consumers:
            for processes in args.dispatchers:
                ids = prepare(bench, consumers, sinks.port, args.max_in_flight or None)
                label = f"{processes} dispatcher(s), {consumers} consumer(s)"
                drain = drain_queued(bench, sinks, label, processes, options, ids)
                bench.drains[consumers, processes] = drain
                judge_drain(bench, drain, processes)


def judge_drain(bench: Bench, drain: Drain, processes: int) -> None:
    target = DRAIN_TARGETS.get(processes)
    figure = f"{drain.label}: {drain.rate:,.0f}/s"
    complete = drain.check.ok and not drain.timed_out
    if target is not None:
        bench.verdict(
            "drain", figure, f">= {target:,}/s with {processes}", complete and drain.rate >= target
        )
    if processes == 2:
        bench.verdict(
            "drain",
            figure,
            f"stretch >= {DRAIN_STRETCH:,}/s with 2",
            complete and drain.rate >= DRAIN_STRETCH,
        )


def scenario_slow(bench: Bench) -> None:
    args = bench.args
    options = DispatchOptions(args.slow_concurrency, args.batch_size, args.poll_seconds)
    cap = args.slow_max_in_flight or args.slow_concurrency
    print(
        f"\n== slow: {args.jobs} jobs, receiver answers after {args.slow_delay_ms:g} ms;"
        f" 1 dispatcher, manage.py dispatch {options};"
        f" {args.slow_consumers} consumer(s) with maxInFlight {cap}"
    )
    with receivers(bench, args.slow_delay_ms) as sinks:
        ids = prepare(bench, args.slow_consumers, sinks.port, max_in_flight=cap)
        drain = drain_queued(bench, sinks, "1 dispatcher, slow receiver", 1, options, ids)
    bench.verdict(
        "slow",
        f"{drain.rate:,.0f}/s (--concurrency {args.slow_concurrency}, maxInFlight {cap})",
        f">= {SLOW_TARGET:,}/s from one dispatcher",
        drain.check.ok and not drain.timed_out and drain.rate >= SLOW_TARGET,
    )


def publishers(bench: Bench, rate: float) -> int:
    """Publishing processes for `rate`: --publishers, or one per PUBLISHER_RATE calls/s."""
    calls = rate / int(bench.args.publish_batch)
    return int(bench.args.publishers) or max(1, math.ceil(calls / PUBLISHER_RATE))


def publishing(bench: Bench, rate: float, processes: int) -> str:
    """How the scenario publishes, for its header."""
    batch = bench.args.publish_batch
    call = "broker.publish()" if batch == 1 else f"broker.publish_many() of {batch} messages"
    return f"{call} from {processes} process(es) at {rate:g} messages/s"


@contextmanager
def vacuuming(bench: Bench) -> Iterator[None]:
    """`VACUUM jobs_job` every --vacuum-seconds meanwhile (0: never), on a connection of its own:
    what autovacuum does in a deployment (at most once a minute per database by default, with
    migration jobs/0004's thresholds), which this machine's PostgreSQL has switched off."""
    every = bench.args.vacuum_seconds
    if not every:
        yield
        return
    stop = threading.Event()
    runs: list[float] = []

    def vacuum() -> None:
        with psycopg.connect(bench.database_url, autocommit=True) as conn:
            while not stop.wait(every):
                started = time.perf_counter()
                conn.execute("VACUUM jobs_job")
                runs.append(time.perf_counter() - started)

    thread = threading.Thread(target=vacuum, name="bench-vacuum", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        print(f"  VACUUM jobs_job every {every:g} s: {len(runs)} runs, {sum(runs):.1f} s in all")


@contextmanager
def counting_notifies(bench: Bench) -> Iterator[list[int]]:
    """How many wake-up NOTIFYs were sent meanwhile (and up to half a second after), counted on a
    connection that LISTENs and never guards (jobs/queue/wakeup.py). `[count]`, filled at exit."""
    counted, ready, stop = [0], threading.Event(), threading.Event()

    def listen() -> None:
        with psycopg.connect(bench.database_url, autocommit=True) as conn:
            conn.execute(f"LISTEN {WAKEUP_CHANNEL}")
            ready.set()
            while not stop.is_set():
                counted[0] += sum(1 for _ in conn.notifies(timeout=0.1))
            counted[0] += sum(1 for _ in conn.notifies(timeout=0.5))  # the last commits'

    thread = threading.Thread(target=listen, name="bench-notifies", daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield counted
    finally:
        stop.set()
        thread.join()


def scenario_latency(bench: Bench) -> None:
    for rate in bench.args.latency_rate:
        latency_at(bench, rate)


def distribution(values: list[float]) -> str:
    quantiles = (percentile(values, q) for q in (0.5, 0.95, 0.99))
    return "p50 {:.1f}  p95 {:.1f}  p99 {:.1f}".format(*quantiles)


def latency_at(bench: Bench, rate: float) -> None:
    args = bench.args
    options = bench.options()
    processes = publishers(bench, rate)
    print(
        f"\n== latency: {publishing(bench, rate, processes)},"
        f" {args.latency_warmup:g} s warm-up then {args.latency_seconds:g} s measured;"
        f" 1 consumer, 1 dispatcher ({options}) idle on LISTEN/NOTIFY"
    )
    with receivers(bench) as sinks:
        prepare(bench, 1, sinks.port)
        with dispatchers(bench, 1, options) as running, vacuuming(bench):
            batch = args.publish_batch
            warm = publish_steadily(rate, args.latency_warmup, "w", processes, batch=batch)
            wait_for_delivered(bench, sinks, warm.count, running)
            before = cpu_table()
            with counting_notifies(bench) as notifies:
                published = publish_steadily(
                    rate, args.latency_seconds, "l", processes, batch=batch
                )
            _, timed_out = wait_for_delivered(bench, sinks, warm.count + published.count, running)
            after = cpu_table()
            groups = {"dispatcher": {p.pid for p in running}, "receiver": sinks.pids}
        received = sinks.received()
    cpu = cpu_by_group(before, after, groups)
    cpu["publishers"] = published.cpu_seconds
    latencies = [
        1000 * (received[f"{message_id} c0"][1] - at)
        for message_id, at in published.sent.items()
        if f"{message_id} c0" in received
    ]
    # The dispatcher's share: from the commit (publish() returned) to the arrival.
    after_commit = [
        1000 * (received[f"{message_id} c0"][1] - at)
        for message_id, at in published.committed.items()
        if f"{message_id} c0" in received
    ]
    calls = [1000 * (published.committed[m] - at) for m, at in published.sent.items()]
    check = verify(bench, received)
    p50, p95, p99 = (percentile(latencies, q) for q in (0.5, 0.95, 0.99))
    per_message = ", ".join(
        f"{name} {1000 * seconds / published.count:.3f}" for name, seconds in cpu.items()
    )
    print(
        f"  {published}\n  {len(latencies)} of {published.count} measured"
        f"{' (TIMED OUT)' if timed_out else ''}\n"
        f"  publish -> arrival ms: p50 {p50:.1f}  p95 {p95:.1f}  p99 {p99:.1f}"
        f"  max {max(latencies, default=math.nan):.1f}\n"
        f"  of which the publish call ms: {distribution(calls)}\n"
        f"  its return (committed) -> arrival ms: {distribution(after_commit)}\n"
        f"  CPU ms per message (publishing until delivered): {per_message}\n"
        f"  NOTIFYs sent while publishing: {notifies[0]:,} for {published.count:,} messages\n"
        f"  {check}"
    )
    complete = check.ok and len(latencies) == published.count and published.kept
    figure = (
        f"p50 {p50:.1f}, p95 {p95:.1f}, p99 {p99:.1f} ms at {published.rate:,.0f}/s"
        f" ({rate:,.0f}/s asked)"
    )
    at = f" at {rate:,.0f}/s"
    if rate <= LATENCY_P50_RATE:
        bench.verdict(
            "latency",
            figure,
            f"p50 <= {LATENCY_P50_MS:g} ms{at}",
            complete and p50 <= LATENCY_P50_MS,
        )
    bench.verdict(
        "latency", figure, f"p99 <= {LATENCY_P99_MS:g} ms{at}", complete and p99 <= LATENCY_P99_MS
    )


# The backlog jobs: one statement, as fast as PostgreSQL inserts (with the jobs table's indexes).
def build_backlog(
    bench: Bench, rows: int, consumers: list[int], delay_seconds: float, keys: int = 0
) -> None:
    started = time.perf_counter()
    bench.db.execute("SET work_mem = '256MB'")
    queue_jobs(bench, rows, consumers, "b", delay_seconds, keys)
    inserted = time.perf_counter() - started
    bench.db.execute("VACUUM ANALYZE jobs_job")
    bench.db.execute("VACUUM ANALYZE broker_message")
    bench.db.execute("RESET work_mem")
    print(
        f"  built {rows:,} backlog jobs in {inserted:.1f} s"
        f" (+ {time.perf_counter() - started - inserted:.1f} s VACUUM ANALYZE)",
        flush=True,
    )


def scenario_backlog(bench: Bench) -> None:
    args = bench.args
    options = bench.options()
    consumers, processes = args.backlog_consumers, args.backlog_dispatchers
    print(
        f"\n== backlog: {args.jobs} deliveries with {args.backlog_rows:,} other queued jobs in"
        f" the table ({', '.join(args.backlog_kind)}); {processes} dispatcher(s), {consumers}"
        f" consumers, manage.py dispatch {options}"
    )
    with receivers(bench) as sinks:
        ids = prepare(bench, consumers, sinks.port, args.max_in_flight or None)
        if args.explain:
            explain_claim(bench, f"{args.jobs} due jobs, no backlog",
                          functools.partial(queue_jobs, bench, args.jobs, ids, "x"))  # fmt: skip
        baseline = drain_queued(bench, sinks, "baseline, no backlog", processes, options, ids)
        for kind in args.backlog_kind:
            drain = drain_with_backlog(bench, sinks, kind, processes, options)
            ratio = drain.rate / baseline.rate if baseline.rate else 0.0
            bench.verdict(
                "backlog",
                f"{kind}: {drain.rate:,.0f}/s = {100 * ratio:.0f} % of {baseline.rate:,.0f}/s",
                f">= {100 * BACKLOG_RATIO:.0f} % of the rate without backlog",
                drain.check.ok
                and baseline.check.ok
                and not drain.timed_out
                and ratio >= BACKLOG_RATIO,
            )


def drain_with_backlog(
    bench: Bench, sinks: Receivers, kind: str, processes: int, options: DispatchOptions
) -> Drain:
    """due: every backlog job is due (a receiver was down for hours, or a burst), and the first
    `jobs` of them are timed; they belong to paused consumers until the dispatchers are ready.
    future: the backlog waits for retries a day from now and `jobs` fresh due jobs are timed.
    paused: the backlog belongs to one more, paused, consumer."""
    args = bench.args
    ids = prepare(bench, args.backlog_consumers, sinks.port, args.max_in_flight or None)
    if kind == "due":
        bench.db.execute("UPDATE consumers_consumer SET paused = true")
        build_backlog(bench, args.backlog_rows, ids, 0)

        def resume() -> None:
            bench.db.execute("UPDATE consumers_consumer SET paused = false")

        def make_due() -> None:
            with bench.db.transaction():
                resume()
                bench.db.execute("SELECT pg_notify('broker_jobs', '')")

        setup: Callable[[], object] = resume

    else:
        if kind == "future":
            build_backlog(bench, args.backlog_rows, ids, 86400)
        else:
            paused = prepare_paused_consumer(sinks.port)
            build_backlog(bench, args.backlog_rows, [paused], 0)

        def make_due() -> None:
            queue_jobs(bench, args.jobs, ids, "d")

        setup = functools.partial(queue_jobs, bench, args.jobs, ids, "x")

    label = f"{kind} backlog of {args.backlog_rows:,}"
    if args.explain:
        explain_claim(bench, f"{label}, before the drain", setup)
    drain = drain_ours(
        bench, sinks, label, processes, options, make_due, args.jobs, touched_only=True
    )
    if args.explain:
        explain_claim(bench, f"{label}, after the drain")
    return drain


# The claim's parameters as a prepared statement's ($n), to EXPLAIN it with a generic plan.
# The claim's parameters in a prepared statement: the time, its lease, and the rest as a
# dispatcher passes them (no room of its own for any consumer: every one is new to it).
CLAIM_PLACEHOLDERS = {
    "now": "$1", "lease_until": "$2", "limit": "$3", "candidates": "$4",
    "dispatcher": "'bench'", "room_consumers": "'{}'", "rooms": "'{}'", "new": "'{}'",
    "new_room": "$3", "new_budget": "$3",
}  # fmt: skip
PLAN_MODES = {"custom": "force_custom_plan", "generic": "force_generic_plan"}


def explain_claim(bench: Bench, label: str, setup: Callable[[], object] | None = None) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of the dispatcher's claim (a claim of 100, as `manage.py
    dispatch` makes) on the queue as it is, after `setup`, everything rolled back. Twice: with a
    custom plan (the values known, as the first five runs of a prepared statement) and a generic
    one (what PostgreSQL may keep for a prepared statement after five runs)."""
    from django.utils import timezone

    from jobs.queue.queries import statement as queue_statement

    claim_sql = queue_statement("claim_for_push")
    from jobs.queue.rules import lease_expiry

    statement = claim_sql % CLAIM_PLACEHOLDERS
    for name, mode in PLAN_MODES.items():
        with bench.db.transaction() as explained:
            if setup:
                setup()
            bench.db.execute(f"SET LOCAL plan_cache_mode = {mode}")
            bench.db.execute(
                "PREPARE bench_claim (timestamptz, timestamptz, int, int) AS " + statement
            )
            now = timezone.now()
            query = sql.SQL(
                "EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_claim ({}, {}, 100, 200)"
            ).format(sql.Literal(now), sql.Literal(lease_expiry(now)))
            plan = [line for (line,) in bench.db.execute(query).fetchall()]
            bench.db.execute("DEALLOCATE bench_claim")
            raise psycopg.Rollback(explained)
        print(f"  claim plan, {label}, {name} plan:")
        print("\n".join(f"    {line}" for line in plan), flush=True)


def prepare_paused_consumer(port: int) -> int:
    from consumers.models import Consumer

    return Consumer.objects.create(
        channel_id=CHANNEL, public_id="paused", name="Paused", paused=True,
        callback_url=f"http://{HOST}:{port}/paused",
    ).pk  # fmt: skip


def scenario_ordered(bench: Bench) -> None:
    args = bench.args
    options = bench.options()
    keys = args.ordered_keys
    print(
        f"\n== ordered: {args.jobs} jobs to 1 consumer, unordered, then ordered with {keys:,}"
        f" ordering keys (round robin); 1 dispatcher, manage.py dispatch {options}"
    )
    rates = {}
    with receivers(bench) as sinks:
        for mode in ("none", "ordered"):
            [consumer] = prepare(bench, 1, sinks.port, args.max_in_flight or None)
            bench.db.execute(
                "UPDATE consumers_consumer SET ordering = %s WHERE id = %s", (mode, consumer)
            )
            make_due = functools.partial(queue_jobs, bench, args.jobs, [consumer], "d", 0, keys)
            drain = drain_ours(bench, sinks, f"ordering={mode}", 1, options, make_due, args.jobs)
            rates[mode] = drain.rate if drain.check.ok and not drain.timed_out else 0.0
            if mode == "ordered":
                report_order(bench, keys)
    ratio = rates["ordered"] / rates["none"] if rates["none"] else 0.0
    bench.verdict(
        "ordered",
        f"{rates['ordered']:,.0f}/s = {100 * ratio:.0f} % of {rates['none']:,.0f}/s unordered",
        f">= {100 * ORDERED_RATIO:.0f} % of the unordered rate",
        ratio >= ORDERED_RATIO,
    )
    claim_costs = [time_ordered_claims(bench, rows, keys) for rows in args.claim_backlogs]
    growth = claim_costs[-1] / claim_costs[0] if claim_costs[0] else math.inf
    backlogs = " vs ".join(
        f"{rows:,}: {ms:.2f} ms" for rows, ms in zip(args.claim_backlogs, claim_costs, strict=True)
    )
    bench.verdict(
        "ordered",
        f"claim of 100 (median) {backlogs}",
        f"claim cost flat (x{CLAIM_FLAT_FACTOR:g} at most)",
        growth <= CLAIM_FLAT_FACTOR,
    )


def scenario_scheduled(bench: Bench) -> None:
    from datetime import UTC, datetime, timedelta

    from django.conf import settings

    from broker import publish

    args = bench.args
    options = bench.options()
    count, spacing = args.scheduled_messages, args.scheduled_spacing
    print(
        f"\n== scheduled: {count} messages scheduled {spacing:g} s apart (broker.publish() with"
        f" scheduled_for), 2 dispatchers ({options}), 1 consumer"
    )
    settings.BROKER_MIN_SCHEDULE_DELAY_SECONDS = 0  # in this process only: no 2-minute wait
    with receivers(bench) as sinks:
        prepare(bench, 1, sinks.port)
        with dispatchers(bench, 2, options) as running:
            first = datetime.now(UTC) + timedelta(seconds=3)
            for n in range(count):
                due = first + timedelta(seconds=n * spacing)
                publish(CHANNEL, PAYLOAD.encode(), producer=PRODUCER, message_id=f"s{n}",
                        scheduled_for=due)  # fmt: skip
            _, timed_out = wait_for_delivered(bench, sinks, count, running)
        received = sinks.received()
    rows = bench.db.execute(
        "SELECT public_id, extract(epoch FROM scheduled_for),"
        " extract(epoch FROM dispatched_at - scheduled_for) FROM broker_message"
    ).fetchall()
    released = [1000 * float(late) for _, _, late in rows]
    delivered = [
        1000 * (received[f"{message_id} c0"][1] - float(due))
        for message_id, due, _ in rows
        if f"{message_id} c0" in received
    ]
    check = verify(bench, received)
    for name, values in [("released", released), ("delivered", delivered)]:
        print(
            f"  {name} after the scheduled time, ms: median {percentile(values, 0.5):.0f}"
            f"  p99 {percentile(values, 0.99):.0f}  max {max(values, default=math.nan):.0f}"
            f"  (min {min(values, default=math.nan):.0f})"
        )
    print(f"  {check}")
    p99 = percentile(released, 0.99)
    bench.verdict(
        "scheduled",
        f"release lateness median {percentile(released, 0.5):.0f} ms, p99 {p99:.0f} ms",
        "released within 1 s of the scheduled time (p99)",
        check.ok and not timed_out and len(released) == count and p99 <= 1000,
    )


def scenario_ratelimit(bench: Bench) -> None:
    from consumers.models import Consumer

    args = bench.args
    options = bench.options()
    rate, seconds, jobs = args.rate_limit, args.rate_seconds, args.jobs
    print(
        f"\n== ratelimit: c0 with maxPerSecond {rate:g} and a backlog, c1 unlimited with {jobs:,}"
        f" jobs, 2 dispatchers ({options}); c0 watched for {seconds:g} s"
    )
    with receivers(bench) as sinks:
        limited, unlimited = prepare(bench, 2, sinks.port, args.max_in_flight or None)
        make_due = functools.partial(queue_jobs, bench, jobs, [unlimited], "a")
        drain_ours(bench, sinks, "c1 alone", 2, options, make_due, jobs)
        alone = arrival_rate(arrivals(sinks.received(), "a", "c1"))
        Consumer.objects.filter(pk=limited).update(max_per_second=rate)
        sinks.reset()
        with dispatchers(bench, 2, options) as running:
            queue_jobs(bench, math.ceil(rate * (seconds + 30)), [limited], "r")
            queue_jobs(bench, jobs, [unlimited], "u")
            start = wait_for_first(sinks, "r", "c0", running)
            time.sleep(max(start + seconds + 1 - time.time(), 0))
            wait_for(lambda: len(arrivals(sinks.received(), "u", "c1")), jobs, 60, lambda: True)
        received = sinks.received()
    paced = [t for t in arrivals(received, "r", "c0") if t < start + seconds]
    beside = arrival_rate(arrivals(received, "u", "c1"))
    busiest = busiest_second(paced)
    duplicates = sum(count - 1 for count, _ in received.values())
    spent = bench.scalar(
        "SELECT count(*) FROM jobs_job WHERE consumer_id = %(c)s AND status = 'QUEUED'"
        " AND attempts > 0",
        {"c": limited},
    )
    print(
        f"  c0: {len(paced):,} delivered in {seconds:g} s (expected {rate * seconds:,.0f}),"
        f" busiest second {busiest} (any 1-second window), {duplicates} duplicates,"
        f" {spent} held-back jobs with an attempt used"
    )
    print(f"  c1: {beside:,.0f}/s beside c0, {alone:,.0f}/s alone ({beside / alone:.0%})")
    expected = rate * seconds
    bench.verdict(
        "ratelimit",
        f"c0 {len(paced):,} in {seconds:g} s, busiest second {busiest}",
        f"{expected:,.0f} ± 2 %, no second above {rate * 1.1:g}",
        abs(len(paced) - expected) <= 0.02 * expected
        and busiest <= rate * 1.1
        and not duplicates
        and not spent,
    )
    bench.verdict(
        "ratelimit",
        f"c1 {beside:,.0f}/s beside, {alone:,.0f}/s alone",
        "an unlimited consumer keeps its rate (>= 90 %)",
        beside >= 0.9 * alone,
    )


def arrivals(received: dict[str, list[float]], prefix: str, consumer: str) -> list[float]:
    """The first arrival times, sorted, of the jobs of `consumer` whose messages' IDs start
    with `prefix` (queue_jobs's)."""
    return sorted(
        first
        for job, (_, first) in received.items()
        if job.startswith(prefix) and job.endswith(f" {consumer}")
    )


def arrival_rate(times: list[float]) -> float:
    """Jobs per second from the first arrival to the last."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else math.nan


def busiest_second(times: list[float]) -> int:
    """The most arrivals within any one second (a sliding window over sorted times)."""
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= 1:
            first += 1
        most = max(most, last - first + 1)
    return most


def wait_for_first(
    sinks: Receivers, prefix: str, consumer: str, running: list[subprocess.Popen[bytes]]
) -> float:
    """The first arrival of one of the consumer's jobs, once there is one."""
    deadline = time.monotonic() + 60
    while not (times := arrivals(sinks.received(), prefix, consumer)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in running):
            raise RuntimeError(f"no job of {consumer} arrived")
        time.sleep(0.1)
    return times[0]


def report_order(bench: Bench, keys: int) -> None:
    """Check that within each key the receiver saw the messages in publish order."""
    arrivals = bench.db.execute(
        "SELECT m.ordering_key, m.id, min(a.started_at) FROM jobs_deliveryattempt a"
        " JOIN jobs_job j ON j.id = a.job_id JOIN broker_message m ON m.id = j.message_id"
        " GROUP BY m.ordering_key, m.id ORDER BY m.ordering_key, m.id"
    ).fetchall()
    out_of_order = sum(
        1
        for (key, _, sent), (next_key, _, next_sent) in itertools.pairwise(arrivals)
        if key == next_key and next_sent < sent
    )
    print(
        f"  order: {out_of_order} messages sent before an earlier one of their key ({keys:,} keys)"
    )


def time_ordered_claims(bench: Bench, rows: int, keys: int) -> float:
    """The median time of the claim statement for an ordered consumer with `rows` queued jobs
    over `keys` keys, each claim rolled back so that every one sees the same queue."""
    from django.utils import timezone

    from jobs.queue import ClaimRooms
    from jobs.queue.postgres import claim_parameters
    from jobs.queue.queries import statement as queue_statement

    claim_sql = queue_statement("claim_for_push")

    [consumer] = prepare(bench, 1, 9, None)  # nothing is sent
    bench.db.execute(
        "UPDATE consumers_consumer SET ordering = 'ordered' WHERE id = %s", (consumer,)
    )
    build_backlog(bench, rows, [consumer], 0, keys)
    timings = []
    for _ in range(bench.args.claim_samples):
        parameters = claim_parameters(100, timezone.now(), ClaimRooms.unbounded(100), "bench")
        with bench.db.transaction() as claim:
            started = time.perf_counter()
            claimed = len(bench.db.execute(claim_sql, parameters).fetchall())
            timings.append((time.perf_counter() - started) * 1000)
            raise psycopg.Rollback(claim)  # hand nothing out: every claim sees the same queue
    median = percentile(timings, 0.5)
    print(
        f"  claim with {rows:,} queued jobs over {keys:,} keys: {claimed} jobs,"
        f" median {median:.2f} ms, p90 {percentile(timings, 0.9):.2f} ms"
    )
    return median


@dataclass(frozen=True)
class Sample:
    seconds: float  # since the dispatcher was ready
    rss_mb: float
    delivered: int  # jobs the receiver has got
    cpu: float  # the dispatcher's CPU seconds so far


def scenario_rss(bench: Bench) -> None:
    args = bench.args
    options = bench.options()
    processes = publishers(bench, args.rss_rate)
    print(
        f"\n== rss: dispatcher resident memory over {args.rss_seconds:g} s while publishing"
        f" ({publishing(bench, args.rss_rate, processes)}) to 1 consumer; sampled every"
        f" {args.rss_sample_seconds:g} s"
    )
    samples: list[Sample] = []
    with receivers(bench) as sinks:
        prepare(bench, 1, sinks.port)
        with dispatchers(bench, 1, options) as running, vacuuming(bench):
            pid, started = running[0].pid, time.monotonic()

            def sample(every: float = 0.0) -> None:
                elapsed = time.monotonic() - started
                if not samples or elapsed - samples[-1].seconds >= every:
                    delivered = sinks.summary()[1]
                    samples.append(Sample(elapsed, rss_mb(pid), delivered, process_cpu(pid)))

            sample()
            before = cpu_table()
            published = publish_steadily(
                args.rss_rate,
                args.rss_seconds,
                "r",
                processes,
                lambda: sample(args.rss_sample_seconds),
                batch=args.publish_batch,
                keep_times=False,
            )
            sample()
            backlog = published.count - samples[-1].delivered
            finished, timed_out = wait_for_delivered(bench, sinks, published.count, running)
            after = cpu_table()
            groups = {"dispatcher": {pid}, "receiver": sinks.pids}
            sample()
        check = verify(bench, sinks.received())
    cpu = cpu_by_group(before, after, groups)
    cpu["publishers"] = published.cpu_seconds
    # From the schedule's start until the last job was DELIVERED, or the wait for them ran out.
    delivered = samples[-1].delivered
    delivery_rate = delivered / (finished - published.start)
    per_delivery = ", ".join(f"{name} {1000 * used / delivered:.3f}" for name, used in cpu.items())
    print(
        f"  {published}\n  {backlog:,} jobs not yet delivered when publishing ended;"
        f" {delivered:,} delivered {finished - published.start:.1f} s after the first publish"
        f"{' (TIMED OUT)' if timed_out else ''}: {delivery_rate:,.0f} deliveries/s\n"
        f"  CPU ms per delivery over the run: {per_delivery}"
    )
    report_rss(bench, samples, check, timed_out)
    bench.verdict(
        "rss",
        f"{delivery_rate:,.0f} deliveries/s; {published}",
        f"delivered at {args.rss_rate:,.0f}/s (97 %)",
        published.kept and delivery_rate >= 0.97 * args.rss_rate,
    )


def report_rss(bench: Bench, samples: list[Sample], check: Check, timed_out: bool) -> None:
    print("  seconds  RSS MB  deliveries/s  dispatcher CPU ms per delivery (since the last line)")
    print(f"  {samples[0].seconds:7.0f}  {samples[0].rss_mb:6.1f}")
    for before, after in itertools.pairwise(samples):
        delivered = after.delivered - before.delivered
        rate = delivered / (after.seconds - before.seconds)
        cpu = f"{1000 * (after.cpu - before.cpu) / delivered:.3f}" if delivered else "-"
        print(f"  {after.seconds:7.0f}  {after.rss_mb:6.1f}  {rate:12.0f}  {cpu}")
    start, end = samples[0].rss_mb, samples[-1].rss_mb
    peak = max(s.rss_mb for s in samples)
    last = samples[-1].seconds
    settled = next(s for s in samples if s.seconds >= RSS_SETTLED_SHARE * last)
    growth = (end - settled.rss_mb) / settled.rss_mb
    print(f"  {check}{' (TIMED OUT)' if timed_out else ''}")
    figure = (
        f"start {start:.1f} MB, at {settled.seconds:.0f} s {settled.rss_mb:.1f} MB, max"
        f" {peak:.1f} MB, end {end:.1f} MB ({100 * growth:+.1f} %)"
    )
    complete = check.ok and not timed_out
    bench.verdict("rss", figure, f"RSS < {RSS_LIMIT_MB:g} MB", complete and peak < RSS_LIMIT_MB)
    bench.verdict(
        "rss",
        figure,
        f"flat: + < {100 * RSS_FLAT_SHARE:g} % from {100 * RSS_SETTLED_SHARE:g} % of the run",
        complete and growth < RSS_FLAT_SHARE,
    )


# --- main -----------------------------------------------------------------------------------


def integers(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def numbers(text: str) -> list[float]:
    return [float(part) for part in text.split(",")]


def names(choices: list[str], every: list[str] | None = None) -> Callable[[str], list[str]]:
    """Comma-separated names of `choices`, or "all" for `every` (default: all of them)."""

    def parse(text: str) -> list[str]:
        chosen = (every or choices) if text == "all" else text.split(",")
        if unknown := set(chosen) - set(choices):
            raise argparse.ArgumentTypeError(f"unknown: {', '.join(sorted(unknown))}")
        return chosen

    return parse


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    # String defaults go through `type` like given values, so --help shows them as typed.
    scenarios = names(SCENARIOS, EVERY_SCENARIO)
    add("--scenario", type=scenarios, default="all", help=",".join(SCENARIOS) + " or all")
    add("--jobs", type=int, default=10000, help="jobs per drain")
    add("--consumers", type=integers, default="1,10", help="drain: push consumers, a run each")
    add("--dispatchers", type=integers, default="1,2", help="drain, peers: processes, a run each")
    add("--peers", type=names(PEERS), default="all", help="peers: " + ",".join(PEERS) + " or all")
    add("--concurrency", type=int, default=128, help="manage.py dispatch --concurrency")
    add("--max-in-flight", type=int, default=0, help="consumers' maxInFlight (0: not set)")
    add("--batch-size", type=int, default=100, help="manage.py dispatch --batch-size")
    add("--poll-seconds", type=float, default=1.0, help="manage.py dispatch --poll-seconds")
    add("--receivers", type=int, default=1, help="receiver processes sharing the port")
    add(
        "--dispatch-command",
        default=f"{sys.executable} {ROOT / 'manage.py'} dispatch",
        help="how to start a dispatcher (a profiling wrapper, say); options are appended",
    )
    add("--timeout", type=float, default=0, help="seconds a drain may take (0: by its size)")
    add("--celery-pool", default="prefork", help="celery worker --pool")
    add("--celery-concurrency", type=int, default=0, help="celery --concurrency (0: dispatchers)")
    add("--slow-delay-ms", type=float, default=200.0, help="slow: the receiver's delay")
    add("--slow-concurrency", type=int, default=400, help="slow: manage.py dispatch --concurrency")
    add("--slow-consumers", type=int, default=1, help="slow: push consumers")
    add("--slow-max-in-flight", type=int, default=0, help="slow: maxInFlight (0: concurrency)")
    add("--latency-rate", type=numbers, default="500,2000", help="latency: messages/s, a run each")
    add("--publishers", type=int, default=0, help="latency, rss: processes (0: one per 400/s)")
    add("--publish-batch", type=int, default=1, help="latency, rss: messages per publish call")
    add("--vacuum-seconds", type=float, default=0, help="latency, rss: VACUUM jobs every (0: no)")
    add("--latency-seconds", type=float, default=20.0, help="latency: measured publishing time")
    add("--latency-warmup", type=float, default=2.0, help="latency: publishing time not measured")
    add("--backlog-rows", type=int, default=1_000_000, help="backlog: other queued jobs")
    kinds = ",".join(BACKLOG_KINDS)
    add("--backlog-kind", type=names(BACKLOG_KINDS), default="due,future", help=f"{kinds} or all")
    add("--backlog-consumers", type=int, default=10, help="backlog: push consumers")
    add("--backlog-dispatchers", type=int, default=1, help="backlog: dispatcher processes")
    add(
        "--explain",
        action="store_true",
        help="backlog: EXPLAIN (ANALYZE, BUFFERS) the claim, custom and generic plan, per queue",
    )
    add("--rss-seconds", type=float, default=60.0, help="rss: publishing time (600: the target's)")
    add("--rss-rate", type=float, default=500.0, help="rss: messages/s published")
    add("--rss-sample-seconds", type=float, default=5.0, help="rss: sampling interval")
    add("--ordered-keys", type=int, default=1000, help="ordered: ordering keys")
    add("--scheduled-messages", type=int, default=200, help="scheduled: messages")
    add("--scheduled-spacing", type=float, default=0.1, help="scheduled: seconds between them")
    add("--claim-backlogs", type=integers, default="10000,1000000", help="ordered: queued jobs")
    add("--claim-samples", type=int, default=50, help="ordered: claims timed per backlog")
    add("--rate-limit", type=float, default=20.0, help="ratelimit: c0's maxPerSecond")
    add("--rate-seconds", type=float, default=60.0, help="ratelimit: how long c0 is watched")
    return parser.parse_args()


RUNNERS: dict[str, Callable[[Bench], None]] = {
    "drain": scenario_drain,
    "peers": scenario_peers,
    "celery": scenario_celery,
    "slow": scenario_slow,
    "latency": scenario_latency,
    "backlog": scenario_backlog,
    "rss": scenario_rss,
    "ordered": scenario_ordered,
    "scheduled": scenario_scheduled,
    "ratelimit": scenario_ratelimit,
}


def main() -> None:
    args = parse_arguments()
    print(f"dispatch benchmark, {machine()}", flush=True)
    with ExitStack() as stack:
        database_url = stack.enter_context(fresh_database())
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-dispatch-")))
        bench = Bench(args, database_url, logs)
        stack.callback(bench.db.close)
        setup_django(bench.env)
        stack.callback(close_django_connections)
        for name in args.scenario:
            RUNNERS[name](bench)
    print("\nscenario  target                                       met      figure")
    for v in bench.verdicts:
        print(f"{v.scenario:9} {v.target:44} {'met' if v.met else 'NOT met':8} {v.figure}")


if __name__ == "__main__":
    main()
