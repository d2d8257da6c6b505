"""Pull consumers over REST (issue 18): claim and acknowledge, in batches and one job at a time.

The benchmark

1. creates a fresh PostgreSQL database `bench_pull` on 127.0.0.1:5432 (dropped first if left
   over), runs the migrations, and makes a channel with one pull consumer per phase;
2. starts gunicorn, the documented server (`--server`, as bench/ingest.py), on a free loopback
   port, its log in a temporary directory;
3. per phase, queues its jobs in one SQL statement, then times `--workers` client processes
   (HTTP/1.1 keep-alive, stdlib only) that each `claim` `--claim` jobs and acknowledge them until
   a claim comes back empty:
   - per-job: one `POST …/job/{j}` `{"NextState": "DELIVERED"}` per job (today's path);
   - batch: one `POST …/report` with every claimed job DELIVERED;
4. prints jobs/s, the CPU that gunicorn, this database's PostgreSQL backends and the clients
   spent per acknowledged job, and checks with SQL that every job is DELIVERED, claimed once,
   and acknowledged once by the clients;
5. times one acknowledgement against one broadcast on the same server, sequentially, in
   alternating blocks of 10 (a channel of its own with one pull consumer, whose jobs the
   broadcasts make), with the CPU each kind cost;
6. does all of it `--rounds` times, then prints the medians and a TARGET line per target of the
   issue, stops gunicorn and drops the database.

With `--before DIR`, an older checkout of the broker (`mkdir DIR; git archive afb3c23 | tar -x
-C DIR`) serves on a gunicorn of its own beside it, and each round first measures its per-job
path and single acknowledgement: the same database, migrations and clients. Run from the project
root:

    .venv/bin/python bench/pull.py                           # this checkout alone
    .venv/bin/python bench/pull.py --before /tmp/before --server sync:5  # and the older tree
    # (sync:5: a tree older than issue 36 has no broker/gunicorn_conf.py for `documented`)
    .venv/bin/python bench/pull.py --worker                  # and the Python client's Worker
    .venv/bin/python bench/pull.py --help

`--worker` adds a phase to each round: the Python client's Worker drains as many jobs as the
batch phase with a handler that does nothing (bench/pull_client_worker.py), and a TARGET line
compares its jobs/s with the raw batch API's in the same run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import multiprocessing
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from dispatch_harness import (
    CHANNEL,
    CORES,
    HOST,
    PRODUCER,
    ROOT,
    Bench,
    CpuTable,
    close_django_connections,
    cpu_by_group,
    cpu_table,
    database_backends,
    fresh_database,
    machine,
    percentile,
    queue_jobs,
    setup_django,
    start_process,
    stop_process,
)
from ingest import DEFAULT_SERVER, ServerConfig, free_port, wait_until_serving
from pull_client_worker import run_worker_phase, worker_verdict

DATABASE = "bench_pull"
CHANNEL_TOKEN = "bench-channel-token"  # noqa: S105 (a throwaway database's credentials)
CONSUMER_TOKEN = "bench-consumer-token"  # noqa: S105
PRODUCER_TOKEN = "bench-producer-token"  # noqa: S105
LATENCY_CHANNEL = "bench-latency"
BROADCAST_BODY = json.dumps(
    {"order": 12345, "items": [{"sku": "A-1", "qty": 2}], "note": "x" * 160}
)
TARGET_RATE, TARGET_RATIO = 5000, 10  # acknowledged jobs/s; batch over per-job, same run


@dataclass
class Phase:
    """One timed drain of a consumer's queued jobs by the client processes."""

    label: str
    jobs: int
    seconds: float = 0.0
    acknowledged: list[str] = field(default_factory=list)  # job IDs, as the clients saw 202
    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds by group
    statuses: dict[tuple[str, int], int] = field(default_factory=dict)  # (status, attempts)

    @property
    def rate(self) -> float:
        return len(self.acknowledged) / self.seconds if self.seconds else 0.0

    def cpu_ms(self, *groups: str) -> float:
        done = len(self.acknowledged) or math.nan
        return 1000 * sum(self.cpu.get(group, 0.0) for group in groups) / done

    @property
    def verified(self) -> bool:
        once = len(self.acknowledged) == len(set(self.acknowledged)) == self.jobs
        return once and not self.errors and self.statuses == {("DELIVERED", 1): self.jobs}

    def report(self) -> None:
        errors = ", ".join(f"{what}: {n}" for what, n in self.errors.most_common()) or "none"
        stored = ", ".join(f"{n} {s} after {a} claim(s)" for (s, a), n in self.statuses.items())
        print(
            f"  {self.label}: {len(self.acknowledged)} jobs acknowledged in {self.seconds:.2f} s"
            f" = {self.rate:,.0f} jobs/s; {self.requests} requests; errors: {errors}\n"
            f"  CPU ms per acknowledged job: gunicorn {self.cpu_ms('gunicorn'):.3f}"
            f" + postgres {self.cpu_ms('postgres'):.3f}"
            f" = {self.cpu_ms('gunicorn', 'postgres'):.3f}; clients {self.cpu_ms('clients'):.3f}\n"
            f"  SQL: {stored}; every job acknowledged once by the clients:"
            f" {len(self.acknowledged) == len(set(self.acknowledged))}"
            f" -> {'OK' if self.verified else 'MISMATCH'}",
            flush=True,
        )


# --- the clients (processes of their own) ------------------------------------------------------


class Client:
    """One keep-alive connection to the broker, as one pull consumer."""

    def __init__(self, port: int, consumer: str, channel: str = CHANNEL) -> None:
        self.connection = http.client.HTTPConnection(HOST, port, timeout=60)
        self.base = f"/channel/{channel}/consumer/{consumer}"
        self.headers = {
            "Content-Type": "application/json",
            "X-Broker-Channel-Token": CHANNEL_TOKEN,
            "X-Broker-Consumer-Token": CONSUMER_TOKEN,
        }

    def post(self, path: str, body: object) -> tuple[int, bytes]:
        self.connection.request("POST", path, json.dumps(body), self.headers)
        answer = self.connection.getresponse()
        return answer.status, answer.read()

    def claim(self, limit: int) -> list[str]:
        status, body = self.post(f"{self.base}/claim", {"limit": limit})
        if status != 200:
            raise RuntimeError(f"claim: HTTP {status}")
        return [job["ID"] for job in json.loads(body)["Result"]]

    def acknowledge_each(self, job_ids: list[str]) -> tuple[list[str], Counter[str]]:
        done, errors = [], Counter[str]()
        for job_id in job_ids:
            status, _ = self.post(f"{self.base}/job/{job_id}", {"NextState": "DELIVERED"})
            if status == 202:
                done.append(job_id)
            else:
                errors[f"job: HTTP {status}"] += 1
        return done, errors

    def acknowledge_batch(self, job_ids: list[str]) -> tuple[list[str], Counter[str]]:
        jobs = [{"ID": job_id, "NextState": "DELIVERED"} for job_id in job_ids]
        status, body = self.post(f"{self.base}/report", {"Jobs": jobs})
        if status != 200:
            return [], Counter({f"report: HTTP {status}": len(job_ids)})
        results = json.loads(body)["Result"]
        done = [r["ID"] for r in results if r["Status"] == 202 and r["State"] == "DELIVERED"]
        return done, Counter(f"report: job {r['Status']}" for r in results if r["Status"] != 202)


def drain(
    port: int, consumer: str, batch: bool, limit: int, go: Event, ready: Any, out: Any
) -> None:
    """A client process: claim and acknowledge until a claim comes back empty."""
    client = Client(port, consumer)
    acknowledge = client.acknowledge_batch if batch else client.acknowledge_each
    acknowledged: list[str] = []
    errors: Counter[str] = Counter()
    requests = 0
    ready.put(True)
    go.wait()
    while job_ids := client.claim(limit):
        done, failed = acknowledge(job_ids)
        acknowledged += done
        errors += failed
        requests += 1 + (1 if batch else len(job_ids))
    out.put((acknowledged, errors, requests + 1, time.time()))


# --- the phases ----------------------------------------------------------------------------------


def run_phase(
    bench: Bench, phase: Phase, consumer: str, batch: bool, port: int, master: int
) -> None:
    consumer_pk = queue_phase_jobs(bench, phase, consumer)
    spawn = multiprocessing.get_context("spawn")
    go, ready, out = spawn.Event(), spawn.Queue(), spawn.Queue()
    args = (port, consumer, batch, bench.args.claim, go, ready, out)
    clients = [spawn.Process(target=drain, args=args) for _ in range(bench.args.workers)]
    for process in clients:
        process.start()
    for _ in clients:  # started and connected: their imports are not timed
        ready.get(timeout=120)
    before = cpu_table()
    started = time.time()
    go.set()
    finished = []
    for _ in clients:
        acknowledged, errors, requests, at = out.get(timeout=3600)
        phase.acknowledged += acknowledged
        phase.errors += errors
        phase.requests += requests
        finished.append(at)
    after = cpu_table()
    for process in clients:
        process.join()
    phase.seconds = max(finished) - started
    groups = {"gunicorn": {master}, "clients": {process.pid for process in clients if process.pid}}
    close_phase(bench, phase, consumer_pk, groups, (before, after))


def queue_phase_jobs(bench: Bench, phase: Phase, consumer: str) -> int:
    """The phase's jobs queued for `consumer`; its row's key."""
    query = "SELECT id FROM consumers_consumer WHERE public_id = %(consumer)s"
    consumer_pk = int(bench.scalar(query, {"consumer": consumer}))
    queue_jobs(bench, phase.jobs, [consumer_pk], f"{consumer}-")
    # Statistics, as autovacuum keeps them in production (this server runs without it): the
    # planner then reaches a report's jobs by key, not through all of the consumer's jobs.
    bench.db.execute("ANALYZE jobs_job, broker_message")
    return consumer_pk


def close_phase(
    bench: Bench,
    phase: Phase,
    consumer_pk: int,
    groups: dict[str, set[int]],
    cpu: tuple[CpuTable, CpuTable],
) -> None:
    """The phase's CPU by group of processes and this database's PostgreSQL backends, its jobs'
    final states and attempts (read with SQL), and its report."""
    before, after = cpu
    phase.cpu = cpu_by_group(before, after, groups)
    phase.cpu["postgres"] = database_backends_cpu(bench, before, after)
    rows = bench.db.execute(
        "SELECT status, attempts, count(*) FROM jobs_job WHERE consumer_id = %s"
        " GROUP BY status, attempts ORDER BY 1, 2",
        [consumer_pk],
    ).fetchall()
    phase.statuses = {(status, attempts): count for status, attempts, count in rows}
    phase.report()


def database_backends_cpu(bench: Bench, before: CpuTable, after: CpuTable) -> float:
    """CPU of the PostgreSQL backends serving this database (gunicorn's pooled connections): the
    server is shared with other work on this machine, whose backends are left out."""
    pids = database_backends(bench)
    return float(
        sum(after[pid][2] - before.get(pid, (0, "", 0.0))[2] for pid in pids if pid in after)
    )


@dataclass
class Singles:
    """One acknowledgement against one broadcast: each request's time, and the CPU of both
    kinds (gunicorn and this database's backends), in alternating blocks."""

    acks: list[float] = field(default_factory=list)
    broadcasts: list[float] = field(default_factory=list)
    ack_cpu: float = 0.0
    broadcast_cpu: float = 0.0

    @property
    def ack_ms(self) -> float:
        return 1000 * statistics.median(self.acks)

    @property
    def broadcast_ms(self) -> float:
        return 1000 * statistics.median(self.broadcasts)

    @property
    def ack_cpu_ms(self) -> float:
        return 1000 * self.ack_cpu / len(self.acks)

    @property
    def broadcast_cpu_ms(self) -> float:
        return 1000 * self.broadcast_cpu / len(self.broadcasts)

    def report(self, label: str = "") -> None:
        print(
            f"  {label}one acknowledgement vs one broadcast, {len(self.acks)} of each, sequential:"
            f" median {self.ack_ms:.2f} vs {self.broadcast_ms:.2f} ms"
            f" (p90 {1000 * percentile(self.acks, 0.9):.2f}"
            f" vs {1000 * percentile(self.broadcasts, 0.9):.2f});"
            f" CPU ms per request (gunicorn + postgres) {self.ack_cpu_ms:.2f}"
            f" vs {self.broadcast_cpu_ms:.2f}",
            flush=True,
        )


def singles(
    bench: Bench, port: int, master: int, consumer: str, samples: int, label: str = ""
) -> Singles:
    """Blocks of 10 acknowledgements (`POST …/job/{j}` DELIVERED) and 10 broadcasts, in turn,
    each request on its own and timed; a channel with one pull consumer, whose jobs the
    broadcasts make."""
    client = Client(port, consumer, LATENCY_CHANNEL)
    publisher = http.client.HTTPConnection(HOST, port, timeout=60)
    headers = {
        "Content-Type": "application/json",
        "X-Broker-Channel-Token": CHANNEL_TOKEN,
        "X-Broker-Producer-ID": PRODUCER,
        "X-Broker-Producer-Token": PRODUCER_TOKEN,
    }

    def broadcast() -> float:
        started = time.perf_counter()
        publisher.request("POST", f"/channel/{LATENCY_CHANNEL}/broadcast", BROADCAST_BODY, headers)
        answer = publisher.getresponse()
        answer.read()
        if answer.status != 201:
            raise RuntimeError(f"broadcast: HTTP {answer.status}")
        return time.perf_counter() - started

    def acknowledge(job_id: str) -> float:
        started = time.perf_counter()
        if not client.acknowledge_each([job_id])[0]:
            raise RuntimeError("a single acknowledgement was refused")
        return time.perf_counter() - started

    for _ in range(samples):  # the jobs to acknowledge, and a warm-up of both paths
        broadcast()
    held = [job_id for _ in range(math.ceil(samples / 100)) for job_id in client.claim(100)]
    result = Singles()
    for block in range(0, samples, 10):
        before = cpu_table()
        result.acks += [acknowledge(job_id) for job_id in held[block : block + 10]]
        middle = cpu_table()
        result.broadcasts += [broadcast() for _ in held[block : block + 10]]
        after = cpu_table()
        result.ack_cpu += server_cpu(bench, master, before, middle)
        result.broadcast_cpu += server_cpu(bench, master, middle, after)
    result.report(label)
    return result


def server_cpu(bench: Bench, master: int, before: CpuTable, after: CpuTable) -> float:
    gunicorn = cpu_by_group(before, after, {"gunicorn": {master}})["gunicorn"]
    return gunicorn + database_backends_cpu(bench, before, after)


# --- setup and the run ---------------------------------------------------------------------------


def prepare(rounds: int) -> None:
    """The channels, the producer, and a pull consumer per phase, round and tree."""
    from broker.models import Channel, Producer
    from consumers.models import Consumer

    producer = Producer(id=PRODUCER, name="Bench producer")
    producer.set_token(PRODUCER_TOKEN)
    producer.save()
    kinds = ("per-job", "batch", "before-per-job", "worker")
    phases = ["warm-up", "before-warm-up", *(f"{k}-{n}" for n in range(rounds) for k in kinds)]
    singles = [f"{tree}singles-{n}" for n in range(rounds) for tree in ("", "before-")]
    for channel_id, consumers in ((CHANNEL, phases), (LATENCY_CHANNEL, singles)):
        channel = Channel(id=channel_id, name=channel_id)
        channel.set_token(CHANNEL_TOKEN)
        channel.save()
        for consumer_id in consumers:
            consumer = Consumer(
                channel=channel,
                public_id=consumer_id,
                name=consumer_id,
                callback_url=f"http://{HOST}:9/{consumer_id}",
                type=Consumer.Type.PULL,
            )
            consumer.set_token(CONSUMER_TOKEN)
            consumer.save()


@contextmanager
def server(
    config: ServerConfig, env: dict[str, str], log: Path, root: Path = ROOT
) -> Iterator[tuple[int, int]]:
    """gunicorn serving the broker from the checkout `root`: yields (port, master pid)."""
    port = free_port()
    process = start_process(config.command(port), log, env, cwd=root)
    try:
        wait_until_serving(port, process)
        yield port, process.pid
    finally:
        stop_process(process, "gunicorn")


@dataclass
class Round:
    per_job: Phase
    batch: Phase
    singles: Singles
    before_per_job: Phase | None = None  # with --before: the older checkout's
    before_singles: Singles | None = None
    worker: Phase | None = None  # with --worker: the Python client's Worker


def one_round(
    bench: Bench, n: int, current: tuple[int, int], before: tuple[int, int] | None
) -> Round:
    """Each phase once, the older checkout's (if any) first."""
    args = bench.args
    print(f"round {n + 1}", flush=True)
    before_per_job = before_singles = None
    if before:
        before_per_job = Phase("before: per-job", args.per_job_jobs)
        run_phase(bench, before_per_job, f"before-per-job-{n}", False, *before)
        before_singles = singles(bench, *before, f"before-singles-{n}", args.samples, "before: ")
    per_job = Phase("per-job (claim + POST …/job/{j} each)", args.per_job_jobs)
    run_phase(bench, per_job, f"per-job-{n}", False, *current)
    batch = Phase("batch (claim + POST …/report)", args.jobs)
    worker = None
    if args.worker:
        shape = f"concurrency {args.worker_concurrency}, prefetch {args.worker_prefetch}"
        worker = Phase(f"worker (the Python client's Worker, {shape})", args.jobs)
    # The batch phase and the Worker's take turns to go first: a phase that follows another on
    # the same tables meets that one's dead rows, which would count against it every round.
    for phase in (batch, worker) if n % 2 == 0 else (worker, batch):
        if phase is batch:
            run_phase(bench, batch, f"batch-{n}", True, *current)
        elif phase is not None:
            tokens = (CHANNEL_TOKEN, CONSUMER_TOKEN)
            run_worker_phase(bench, phase, f"worker-{n}", tokens, *current)
    now = singles(bench, *current, f"singles-{n}", args.samples)
    return Round(per_job, batch, now, before_per_job, before_singles, worker)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--server", type=ServerConfig.parse, default=ServerConfig.parse(DEFAULT_SERVER))
    add("--workers", type=int, default=4, help="client processes")
    add("--claim", type=int, default=50, help="jobs per claim")
    add("--jobs", type=int, default=20000, help="jobs of the batch phase")
    add("--per-job-jobs", type=int, default=2000, help="jobs of the per-job phase")
    add("--samples", type=int, default=200, help="acknowledgements and broadcasts timed")
    add("--rounds", type=int, default=3, help="of every phase, in turn; medians are judged")
    add(
        "--before",
        type=Path,
        help="an older checkout (`git archive REV | tar -x -C DIR`): its per-job path and single"
        " acknowledgement are measured too, on its own gunicorn, same database, same rounds",
    )
    add(
        "--worker",
        action="store_true",
        help="also time the Python client's Worker (clients/python) on as many jobs as the batch"
        " phase, against the raw batch API's rate",
    )
    add("--worker-concurrency", type=int, default=1, help="the Worker's handler threads")
    add("--worker-prefetch", type=int, default=49, help="jobs the Worker holds beyond them")
    return parser.parse_args()


def main() -> None:
    args = parse_arguments()
    print(f"pull benchmark, {machine()}")
    print(
        f"server: {args.server}; {args.workers} client processes claiming {args.claim} jobs at a"
        f" time; per round {args.per_job_jobs} jobs one by one, {args.jobs} in batches,"
        f" {args.samples} single acknowledgements and broadcasts; {args.rounds} rounds"
        + (f"; before: {args.before}" if args.before else ""),
        flush=True,
    )
    with ExitStack() as stack:
        database_url = stack.enter_context(fresh_database(DATABASE))
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pull-")))
        bench = Bench(args, database_url, logs)
        stack.callback(bench.db.close)
        bench.env["DJANGO_ALLOWED_HOSTS"] = HOST
        setup_django(bench.env)
        prepare(args.rounds)
        close_django_connections()
        current = stack.enter_context(server(args.server, bench.env, logs / "gunicorn.log"))
        run_phase(bench, Phase("warm-up", 500), "warm-up", True, *current)
        before = None
        if args.before:
            before = stack.enter_context(
                server(args.server, bench.env, logs / "before.log", args.before)
            )
            run_phase(bench, Phase("before: warm-up", 500), "before-warm-up", False, *before)
        rounds = [one_round(bench, n, current, before) for n in range(args.rounds)]
    verdicts(rounds)


def verdicts(rounds: list[Round]) -> None:
    """The medians over the rounds, against the issue's targets."""
    median = statistics.median
    batch = median(r.batch.rate for r in rounds)
    per_job = median(r.per_job.rate for r in rounds)
    cpu = median(r.batch.cpu_ms("gunicorn", "postgres", "clients") for r in rounds)
    ack = median(r.singles.ack_ms for r in rounds)
    broadcast = median(r.singles.broadcast_ms for r in rounds)
    print(
        f"\nmedians of {len(rounds)} rounds: batch {batch:,.0f} jobs/s at {cpu:.3f} CPU ms per"
        f" job (gunicorn + postgres + clients: {CORES} cores could take"
        f" {1000 * CORES / cpu:,.0f} jobs/s), per-job {per_job:,.0f} jobs/s;"
        f" one acknowledgement {ack:.2f} ms ({median(r.singles.ack_cpu_ms for r in rounds):.2f}"
        f" ms CPU) vs one broadcast {broadcast:.2f} ms"
        f" ({median(r.singles.broadcast_cpu_ms for r in rounds):.2f} ms CPU)"
    )
    ratio = median(r.batch.rate / r.per_job.rate for r in rounds)
    today = "this checkout's per-job path"
    if all(r.before_per_job and r.before_singles for r in rounds):
        old = [(r.before_per_job, r.before_singles) for r in rounds]
        print(
            f"before: per-job {median(p.rate for p, _ in old if p):,.0f} jobs/s; one"
            f" acknowledgement {median(s.ack_ms for _, s in old if s):.2f} ms"
            f" ({median(s.ack_cpu_ms for _, s in old if s):.2f} ms CPU) vs one broadcast"
            f" {median(s.broadcast_ms for _, s in old if s):.2f} ms; batch over this checkout's"
            f" per-job path {ratio:.1f}x"
        )
        ratio = median(r.batch.rate / r.before_per_job.rate for r in rounds if r.before_per_job)
        today = "the older checkout's per-job path"
    verified = all(r.per_job.verified and r.batch.verified for r in rounds)
    if all(r.worker for r in rounds):
        workers = [r.worker for r in rounds if r.worker]
        verified = verified and all(w.verified for w in workers)
        worker_verdict([r.batch.rate for r in rounds], [w.rate for w in workers], verified)
    for met, target, figure in [
        (batch >= TARGET_RATE and verified, f">= {TARGET_RATE:,} jobs/s acknowledged",
         f"{batch:,.0f} jobs/s"),
        (ratio >= TARGET_RATIO, f">= {TARGET_RATIO}x today's per-job path in the same run",
         f"{ratio:.1f}x {today}"),
        (ack <= broadcast, "one acknowledgement no dearer than a broadcast",
         f"{ack:.2f} vs {broadcast:.2f} ms median"),
    ]:  # fmt: skip
        print(f"TARGET {target}: {figure} -> {'met' if met else 'NOT met'}")
    if not verified:
        raise SystemExit("the database or the clients' counts do not match the jobs queued")


if __name__ == "__main__":
    main()
