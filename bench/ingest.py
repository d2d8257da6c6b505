"""Broadcast ingest throughput: concurrent producers POST /channel/{c}/broadcast to gunicorn or
granian, beside PostgreSQL alone (pgbench) doing what those broadcasts ask of it.

For each server configuration asked for, the benchmark

1. creates a fresh PostgreSQL database `bench_ingest` on 127.0.0.1:5432 (dropped first if left
   over) and runs the migrations against it;
2. creates the channels (one push consumer each) and a producer through the ORM;
3. starts the server (gunicorn sync or gthread, or granian's WSGI interface) on a free loopback
   port with that configuration, its output (the access log) to a file, and waits for
   `/_status`;
4. warms up, then drives POST /channel/{c}/broadcast from `--clients` concurrent keep-alive
   connections (one asyncio event loop, stdlib only) until `--messages` requests were sent or
   `--duration` seconds passed, whichever comes first;
5. prints accepted (201) messages/s, errors, latency percentiles and the CPU time the client,
   the server (every process of the session it was started in, every thread) and PostgreSQL
   spent per message;
6. checks with SQL that the database holds exactly one message and one job per consumer for
   every 201, and stops the server;
7. unless `--no-pgbench`: records the statements one real broadcast sends and has pgbench
   replay them over as many connections, for as long as step 4 took (`ingest_pgbench.py`);
   checks one message and one job per transaction, no failures, and deletes them; then drops
   the database.

It talks to 127.0.0.1 only and stops by itself. Run from the project root:

    .venv/bin/python bench/ingest.py                       # the documented production setup
    .venv/bin/python bench/ingest.py --compare             # every candidate server setup
    .venv/bin/python bench/ingest.py --server gthread:2x8  # one setup: class:workers[xthreads]
    .venv/bin/python bench/ingest.py --server granian:2x4  # granian, 2 workers x 4 threads
    .venv/bin/python bench/ingest.py --batch 1000          # POST …/broadcast-batch, 1000 a request
    .venv/bin/python bench/ingest.py --profile FILE --no-pgbench  # py-spy samples of the server

With `--batch N` each request is a batch broadcast of N messages (docs/api.md, "Batch broadcast")
and `--messages`, `--warmup`, the rate and the CPU figures count messages, the latencies requests;
pgbench does not run then.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from dispatch_harness import machine  # the run's header: date, CPU, versions, load, commit
from ingest_pgbench import PgbenchResult, captured_statements, run_pgbench
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the broker's modules: broker/gunicorn_conf.py
HOST = "127.0.0.1"
PG_PORT = 5432
PG_USER = "postgres"
DATABASE = "bench_ingest"
CHANNEL_TOKEN = "bench-channel-token"  # noqa: S105 (a throwaway database's credentials)
PRODUCER_ID = "bench-producer"
PRODUCER_TOKEN = "bench-producer-token"  # noqa: S105
PAYLOAD = json.dumps({"order": 12345, "items": [{"sku": "A-1", "qty": 2}], "note": "x" * 160})
CORES = os.cpu_count() or 1
# The documented production setup (broker/gunicorn_conf.py: a gthread worker of 4 threads per
# core, since issue 36; 2 x cores + 1 sync workers before), and the other worker models measured
# against it by --compare.
DEFAULT_SERVER = f"documented:{CORES}"
SERVER_CLASSES = ("documented", "sync", "gthread", "granian")
# granian: workers x blocking threads (the threads that run Django; one Rust runtime thread per
# worker does the HTTP work). 2 x 1 and 2 x 8 were tried too, and were slower than these.
CANDIDATES = [
    DEFAULT_SERVER,
    f"sync:{2 * CORES + 1}",
    f"granian:{CORES}x4",
    f"granian:{CORES}x2",
    "granian:1x4",
    f"granian:{2 * CORES}x1",
]
TARGET_RATE, TARGET_P99_MS = 2000, 50  # issue 18's targets for this 2-core machine


@dataclass(frozen=True)
class ServerConfig:
    """A server and its shape: `documented:2` (gunicorn as runbroker and the image run it,
    broker/gunicorn_conf.py, 2 workers), `sync:5` (gunicorn, 5 sync workers), `gthread:2x8`
    (gunicorn, 2 workers x 8 threads), `granian:2x4` (granian's WSGI interface, 2 workers x 4
    blocking threads, the threads that run the application)."""

    worker_class: str
    workers: int
    threads: int = 1

    @classmethod
    def parse(cls, text: str) -> ServerConfig:
        worker_class, _, shape = text.partition(":")
        workers, _, threads = shape.partition("x")
        if worker_class not in SERVER_CLASSES or not workers.isdigit():
            raise argparse.ArgumentTypeError(
                f"{text!r}: use documented:WORKERS, sync:WORKERS, gthread:WORKERSxTHREADS or"
                " granian:WORKERSxTHREADS"
            )
        if worker_class in ("documented", "sync") and threads:
            raise argparse.ArgumentTypeError(f"{text!r}: {worker_class} workers have no xTHREADS")
        return cls(worker_class, int(workers), int(threads or 1))

    def __str__(self) -> str:
        if self.worker_class == "documented":
            return f"documented (broker/gunicorn_conf.py), {self.workers} workers"
        if self.worker_class == "sync":
            return f"sync, {self.workers} workers"
        if self.worker_class == "granian":
            return f"granian, {self.workers} workers x {self.threads} threads"
        return f"gthread, {self.workers} workers x {self.threads} threads"

    def command(self, port: int) -> list[str]:
        if self.worker_class == "documented":
            from broker import gunicorn_conf  # this checkout's (ROOT is on sys.path)

            return [*gunicorn_conf.command(f"{HOST}:{port}", self.workers), "--log-level=warning"]
        if self.worker_class == "granian":
            # The WSGI interface; one Rust runtime thread per worker does the HTTP work, the
            # blocking threads run Django. No websockets, no access log (granian's default), as
            # gunicorn runs here.
            return [
                sys.executable, "-m", "granian", "broker.wsgi:application",
                "--interface", "wsgi",
                "--host", HOST, "--port", str(port),
                "--workers", str(self.workers),
                "--blocking-threads", str(self.threads),
                "--no-ws",
                "--log-level", "warning",
            ]  # fmt: skip
        return [
            sys.executable, "-m", "gunicorn", "broker.wsgi",
            "--bind", f"{HOST}:{port}",
            "--worker-class", self.worker_class,
            "--workers", str(self.workers),
            "--threads", str(self.threads),
            "--log-level", "warning",
        ]  # fmt: skip


@dataclass
class LoadResult:
    sent: int = 0
    accepted: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # seconds, one per request
    elapsed: float = 0.0
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    database_cpu: float = 0.0  # the benchmark database's backends, and the shared ones
    pgbench: PgbenchResult | None = None  # PostgreSQL alone, same statements, same run

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan

    @property
    def rate(self) -> float:
        return self.accepted / self.elapsed if self.elapsed else 0.0


# --- the database -------------------------------------------------------------------------


def admin_connection() -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        host=HOST, port=PG_PORT, user=PG_USER, dbname="postgres", autocommit=True
    )


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty database for one run; dropped afterwards whatever happens."""
    with admin_connection() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    try:
        yield f"postgres://{PG_USER}@{HOST}:{PG_PORT}/{DATABASE}"
    finally:
        with admin_connection() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE))
            )


def stored_counts(database_url: str) -> tuple[int, int]:
    """Messages sent by the measured phase, and their jobs."""
    with psycopg.connect(database_url) as conn:
        messages = conn.execute(
            "SELECT count(*) FROM broker_message WHERE public_id LIKE 'b-%'"
        ).fetchone()
        jobs = conn.execute(
            "SELECT count(*) FROM jobs_job j JOIN broker_message m ON m.id = j.message_id"
            " WHERE m.public_id LIKE 'b-%'"
        ).fetchone()
    if messages is None or jobs is None:
        raise RuntimeError("count(*) returned no row")
    return int(str(messages[0])), int(str(jobs[0]))


# --- the broker ---------------------------------------------------------------------------


def broker_environment(database_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_ALLOWED_HOSTS": HOST,
        "DJANGO_SETTINGS_MODULE": "broker.settings",
        "PYTHONUNBUFFERED": "1",
        # No collectstatic in the benchmark: WhiteNoise's warning about it is noise here.
        "PYTHONWARNINGS": "ignore:No directory at:UserWarning",
    }


SETUP_CODE = """
from broker.models import Channel, Producer
from consumers.models import Consumer
producer = Producer(id={producer!r}, name="Bench producer")
producer.set_token({producer_token!r})
producer.save()
for n in range({channels}):
    channel = Channel(id=f"bench-{{n}}", name=f"Bench {{n}}")
    channel.set_token({channel_token!r})
    channel.save()
    Consumer.objects.create(
        channel=channel, public_id="sink", name="Sink", callback_url="http://127.0.0.1:9/sink"
    )
"""


def prepare_broker(env: dict[str, str], channels: int) -> None:
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, check=True, timeout=300)  # noqa: S603
    code = SETUP_CODE.format(
        producer=PRODUCER_ID,
        producer_token=PRODUCER_TOKEN,
        channel_token=CHANNEL_TOKEN,
        channels=channels,
    )
    subprocess.run([*manage, "shell", "-v", "0", "-c", code], env=env, check=True, timeout=120)  # noqa: S603


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@contextmanager
def web_server(config: ServerConfig, env: dict[str, str]) -> Iterator[tuple[int, int]]:
    """gunicorn or granian serving the broker: yields (port, pid of the process started, which
    leads a session of its own with every worker in it); stopped on exit. Its output (the
    broker's access log, a line per request) goes to a file, as in production to a collector,
    and its end is printed if the server fails."""
    port = free_port()
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(  # noqa: S603
            config.command(port),
            cwd=ROOT,
            env=env,
            start_new_session=True,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until_serving(port, process)
            yield port, process.pid
        except BaseException:
            output.seek(max(0, output.seek(0, os.SEEK_END) - 4000))
            print(output.read().decode(errors="replace"), file=sys.stderr)
            raise
        finally:
            stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL to its process group (started with start_new_session) if it
    lingers over 20 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_until_serving(port: int, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/_status", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:  # refused, reset or timed out (URLError is one too): not up yet
            time.sleep(0.2)
    raise RuntimeError("the server did not answer /_status in time")


# --- CPU accounting from /proc (Linux) ----------------------------------------------------


def process_table() -> list[tuple[int, int, str, float]]:
    """(pid, session id, command, CPU seconds, all its threads) of every process we can read."""
    ticks = os.sysconf("SC_CLK_TCK")
    rows = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        command = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        # fields[3] is the session id; fields[11], fields[12] are utime and stime (man 5 proc).
        cpu = (int(fields[11]) + int(fields[12])) / ticks
        rows.append((int(entry.name), int(fields[3]), command, cpu))
    return rows


def cpu_seconds(leader: int) -> tuple[float, float]:
    """CPU used so far by the server (every process of the session it was started in: gunicorn's
    master and workers, granian's and its workers, all their threads) and by every PostgreSQL
    process (other databases' work on the same server included)."""
    table = process_table()
    server = sum(cpu for _, session, _, cpu in table if session == leader)
    database = sum(cpu for _, _, command, cpu in table if command.startswith("postgres"))
    return server, database


# --- the load -----------------------------------------------------------------------------


class BroadcastClient:
    """One producer connection: HTTP/1.1 keep-alive, reconnecting when the server closes."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def broadcast(self, channel: str, message_id: str) -> int:
        body = PAYLOAD.encode()
        return await self.post(f"/channel/{channel}/broadcast", body, message_id)

    async def post(self, path: str, body: bytes, message_id: str = "") -> int:
        """POST `body` with the producer's tokens (and a message ID when given); the status."""
        if self.reader is None or self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(HOST, self.port)
        named = f"X-Broker-Message-ID: {message_id}\r\n" if message_id else ""
        self.writer.write(
            f"POST {path} HTTP/1.1\r\n"
            f"Host: {HOST}:{self.port}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            f"X-Broker-Channel-Token: {CHANNEL_TOKEN}\r\n"
            f"X-Broker-Producer-ID: {PRODUCER_ID}\r\n"
            f"X-Broker-Producer-Token: {PRODUCER_TOKEN}\r\n"
            f"{named}"
            "\r\n".encode()
            + body
        )
        status, close = await read_response(self.reader)
        if close:
            await self.close()
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()
        self.reader = self.writer = None


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """The status of one response, read to its end, and whether the server closes afterwards."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection")
    version, status = status_line.split()[:2]
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    close = headers.get("connection") == "close" or version == b"HTTP/1.0"
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        while size := int((await reader.readline()).split(b";")[0], 16):
            await reader.readexactly(size + 2)
        await reader.readline()
    else:
        await reader.read()
        close = True
    return int(status), close


async def drive(
    port: int,
    clients: int,
    channels: int,
    limit: int,
    duration: float,
    prefix: str,
    keep_alive: bool = True,
    batch: int = 0,
) -> LoadResult:
    """`clients` concurrent producers, `limit` messages or `duration` seconds in all: single
    broadcasts, or with `batch` POST …/broadcast-batch of that many messages (`sent` and
    `accepted` count messages, `latencies` requests).

    Without `keep_alive` each request has a TCP connection of its own, as a producer that sends
    with curl or an HTTP client without a session does.
    """
    result = LoadResult()
    deadline = time.monotonic() + duration
    per_request = batch or 1

    async def producer(number: int) -> None:
        client = BroadcastClient(port)
        try:
            while result.sent < limit and time.monotonic() < deadline:
                index = result.sent
                result.sent += per_request
                channel, name = (
                    f"bench-{index // per_request % channels}",
                    f"{prefix}-{number}-{index}",
                )
                body = batch_body(name, batch) if batch else b""
                started = time.perf_counter()
                try:
                    if batch:
                        status = await client.post(f"/channel/{channel}/broadcast-batch", body)
                    else:
                        status = await client.broadcast(channel, name)
                except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
                    result.errors[type(exc).__name__] += 1
                    await client.close()
                    continue
                result.latencies.append(time.perf_counter() - started)
                if not keep_alive:
                    await client.close()
                if status == 201:
                    result.accepted += per_request
                else:
                    result.errors[f"HTTP {status}"] += 1
        finally:
            await client.close()

    started = time.perf_counter()
    await asyncio.gather(*(producer(number) for number in range(clients)))
    result.elapsed = time.perf_counter() - started
    return result


# --- batches (--batch N) -----------------------------------------------------------------------

BATCH_TARGET_RATE = 20000  # the batch ingest target, messages/s on this 2-core machine


def batch_body(prefix: str, count: int) -> bytes:
    """A batch of `count` messages with the benchmark's payload and IDs `<prefix>-<n>`."""
    payload = json.dumps(PAYLOAD)  # the payload as a JSON string, escaped once
    items = ",".join(f'{{"id":"{prefix}-{n}","payload":{payload}}}' for n in range(count))
    return f'{{"messages":[{items}]}}'.encode()


def own_database_cpu() -> float:
    """CPU used so far by the PostgreSQL processes that serve the benchmark's database (its
    backends, and the background writers every database shares), not by other databases' work
    on the same server (a CI run, tests)."""
    return sum(own_database_processes().values())


def own_database_processes() -> dict[int, float]:
    """CPU seconds so far of each process own_database_cpu() counts, by pid."""
    own = {}
    for pid, _, command, cpu in process_table():
        if not command.startswith("postgres"):
            continue
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        backend = (
            f" {PG_USER} " in title and "(" in title
        )  # "postgres: 15/main: user db host(port)"
        if not backend or f" {DATABASE} " in title:
            own[pid] = cpu
    return own


def load(
    port: int, args: argparse.Namespace, limit: int, duration: float, prefix: str
) -> LoadResult:
    """One phase of load: single broadcasts, or batches with --batch."""
    return asyncio.run(
        drive(port, args.clients, args.channels, limit, duration, prefix, batch=args.batch)
    )


# --- one run ------------------------------------------------------------------------------


def run(config: ServerConfig, args: argparse.Namespace) -> LoadResult:
    command = " ".join(config.command(0)[1:]).replace(f"{HOST}:0", f"{HOST}:<free port>")
    command = command.replace("--port 0", "--port <free port>")
    print(f"\n== {config}: python {command}", flush=True)
    with fresh_database() as database_url:
        env = broker_environment(database_url)
        prepare_broker(env, args.channels)
        with web_server(config, env) as (port, master):
            load(port, args, args.warmup, 60, "w")
            server_before, database_before = cpu_seconds(master)
            client_before, own_before = time.process_time(), own_database_cpu()
            with profiled(master, args.profile):
                result = load(port, args, args.messages, args.duration, "b")
            result.database_cpu = own_database_cpu() - own_before
            result.client_cpu = time.process_time() - client_before
            server_after, database_after = cpu_seconds(master)
            result.server_cpu = server_after - server_before
            every_database = database_after - database_before
        messages, jobs = stored_counts(database_url)
        report(result)
        per_message = 1e6 / result.accepted if result.accepted else math.nan  # microseconds
        print(
            f"CPU us per message: server {result.server_cpu * per_message:.1f}"
            f"  postgres {result.database_cpu * per_message:.1f} for {DATABASE}"
            f" ({every_database * per_message:.1f} with other databases' work on the server)"
            f"  client {result.client_cpu * per_message:.1f}"
        )
        judge(result, args)
        verified = messages == result.accepted and jobs == result.accepted
        print(
            f"stored: {messages} messages, {jobs} jobs for {result.accepted} accepted"
            f" -> {'OK' if verified else 'MISMATCH'}"
        )
        if not verified:
            raise SystemExit("the database does not hold exactly what was accepted")
        if args.pgbench and not args.batch:
            seconds = max(5, round(result.elapsed))  # as long as the HTTP phase took
            result.pgbench = postgres_alone(env, database_url, args.clients, seconds)
    return result


def judge(result: LoadResult, args: argparse.Namespace) -> None:
    if args.batch:
        verdict = "met" if result.rate >= BATCH_TARGET_RATE else "NOT met"
        print(f"batch target >= {BATCH_TARGET_RATE} messages/s: {verdict}")
    else:
        met = result.rate >= TARGET_RATE and 1000 * result.percentile(0.99) <= TARGET_P99_MS
        verdict = "met" if met else "NOT met"
        print(f"target >= {TARGET_RATE} messages/s with p99 <= {TARGET_P99_MS} ms: {verdict}")


def postgres_alone(
    env: dict[str, str], database_url: str, clients: int, seconds: int
) -> PgbenchResult:
    """pgbench replaying what one real broadcast sends (ingest_pgbench.py), with the server
    stopped, over as many connections as there were clients and as long as the HTTP phase; its
    rows checked (one message and one job per transaction) and deleted."""
    tokens = {
        "X-Broker-Channel-Token": CHANNEL_TOKEN,
        "X-Broker-Producer-ID": PRODUCER_ID,
        "X-Broker-Producer-Token": PRODUCER_TOKEN,
    }
    statements = captured_statements(env, "bench-0", tokens, PAYLOAD)
    first_lines = "; ".join(" ".join(s.sql.split())[:60] + "…" for s in statements)
    print(f"pgbench: the broadcast's {len(statements)} statement(s): {first_lines}", flush=True)
    bench = run_pgbench(database_url, statements, clients, seconds, own_database_processes)
    per_transaction = 1000 / bench.transactions if bench.transactions else math.nan
    verified = bench.failed == 0 and bench.stored == (bench.transactions, bench.transactions)
    print(
        f"pgbench -M prepared -c {clients} -j 2 -T {seconds}:"
        f" {bench.transactions} transactions, {bench.failed} failed, {bench.tps:.0f} tps;"
        f" CPU ms per transaction: postgres {bench.database_cpu * per_transaction:.2f}"
        f"  pgbench {bench.client_cpu * per_transaction:.2f}\n"
        f"stored: {bench.stored[0]} messages, {bench.stored[1]} jobs for {bench.transactions}"
        f" transactions -> {'OK' if verified else 'MISMATCH'} (deleted afterwards)",
        flush=True,
    )
    if not verified:
        raise SystemExit("pgbench did not insert exactly one message and one job per transaction")
    return bench


@contextmanager
def profiled(leader: int, out: Path | None) -> Iterator[None]:
    """py-spy sampling the server's processes (all of them, 100 times a second, only threads
    holding the GIL, as the dispatcher's profile does) while the block runs, its raw samples
    written to `out`: bench/ingest_profile.py sorts them by step."""
    if out is None:
        yield
        return
    command = [
        str(Path(sys.executable).parent / "py-spy"), "record", "--subprocesses", "--gil",
        "-r", "100", "-f", "raw", "-o", str(out), "-p", str(leader),
    ]  # fmt: skip
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL)  # noqa: S603
    time.sleep(2)  # attached to every process
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
        spy.wait(timeout=60)


def report(result: LoadResult) -> None:
    per_message = 1000 / result.accepted if result.accepted else math.nan
    errors = ", ".join(f"{name}: {count}" for name, count in result.errors.most_common()) or "none"
    print(
        f"accepted {result.accepted} of {result.sent} in {result.elapsed:.1f} s"
        f" = {result.rate:.0f} messages/s; errors: {errors}\n"
        f"latency ms: p50 {1000 * result.percentile(0.50):.1f}"
        f"  p95 {1000 * result.percentile(0.95):.1f}"
        f"  p99 {1000 * result.percentile(0.99):.1f}"
        f"  max {1000 * max(result.latencies, default=math.nan):.1f}\n"
        f"CPU ms per message: server {result.server_cpu * per_message:.2f}"
        f"  postgres {result.database_cpu * per_message:.2f}"
        f"  client {result.client_cpu * per_message:.2f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", type=ServerConfig.parse, action="append", default=[])
    parser.add_argument("--compare", action="store_true", help=f"run {', '.join(CANDIDATES)}")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--channels", type=int, default=1, help="one consumer each")
    parser.add_argument("--messages", type=int, default=20000, help="requests at most")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds at most")
    parser.add_argument("--warmup", type=int, default=500, help="requests before measuring")
    parser.add_argument(
        "--batch", type=int, default=0, help="messages per POST …/broadcast-batch (0: broadcast)"
    )
    parser.add_argument(
        "--pgbench",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after each server, pgbench replays a real broadcast's statements (not with --batch)",
    )
    parser.add_argument(
        "--profile", type=Path, help="py-spy raw samples of the server's measured phase to FILE"
    )
    args = parser.parse_args()
    configs = list(args.server)
    if args.compare:
        configs += [ServerConfig.parse(text) for text in CANDIDATES]
    configs = configs or [ServerConfig.parse(DEFAULT_SERVER)]
    if args.profile and len(configs) > 1:
        parser.error("--profile samples one server: give one --server (or none)")
    print(f"ingest benchmark, {machine()}")
    if args.batch:
        print(f"batch broadcasts of {args.batch} messages; latencies are per request")
    print(
        f"{args.clients} clients (keep-alive where the server allows it),"
        f" {args.channels} channel(s) with one consumer each, {len(PAYLOAD)}-byte JSON payload,"
        f" up to {args.messages} messages or {args.duration:g} s"
    )
    results = [(config, run(config, args)) for config in configs]
    if len(results) > 1 or args.pgbench:
        summary(results)


def summary(results: list[tuple[ServerConfig, LoadResult]]) -> None:
    """The run's table: each server beside PostgreSQL alone measured right after it."""
    print(
        "\nserver                          msg/s  p50 ms  p99 ms  err"
        "  CPU ms/msg srv/pg/cli  pgbench tps  pg CPU ms/tx  broker/pgbench"
    )
    for config, result in results:
        per_message = 1000 / result.accepted if result.accepted else math.nan
        cpu = "/".join(
            f"{seconds * per_message:.2f}"
            for seconds in (result.server_cpu, result.database_cpu, result.client_cpu)
        )
        bench = result.pgbench
        alone = (
            f"{bench.tps:11.0f}  {1000 * bench.database_cpu / bench.transactions:12.2f}"
            f"  {100 * result.rate / bench.tps:13.0f} %"
            if bench and bench.transactions
            else f"{'-':>11}  {'-':>12}  {'-':>15}"
        )
        print(
            f"{config!s:31} {result.rate:6.0f}  {1000 * result.percentile(0.5):6.1f}"
            f"  {1000 * result.percentile(0.99):6.1f}  {sum(result.errors.values()):3}"
            f"  {cpu:>21}  {alone}"
        )


if __name__ == "__main__":
    main()
