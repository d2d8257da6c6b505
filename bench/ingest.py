"""Broadcast ingest throughput: concurrent producers POST /channel/{c}/broadcast to gunicorn.

For each server configuration asked for, the benchmark

1. creates a fresh PostgreSQL database `bench_ingest` on 127.0.0.1:5432 (dropped first if left
   over) and runs the migrations against it;
2. creates the channels (one push consumer each) and a producer through the ORM;
3. starts gunicorn on a free loopback port with that configuration and waits for `/_status`;
4. warms up, then drives POST /channel/{c}/broadcast from `--clients` concurrent keep-alive
   connections (one asyncio event loop, stdlib only) until `--messages` requests were sent or
   `--duration` seconds passed, whichever comes first;
5. prints accepted (201) messages/s, errors, latency percentiles and the CPU time the client,
   gunicorn and PostgreSQL spent per message;
6. checks with SQL that the database holds exactly one message and one job per consumer for
   every 201, then stops gunicorn and drops the database.

It talks to 127.0.0.1 only and stops by itself. Run from the project root:

    .venv/bin/python bench/ingest.py                       # the documented production setup
    .venv/bin/python bench/ingest.py --compare             # every candidate server setup
    .venv/bin/python bench/ingest.py --server gthread:2x8  # one setup: class:workers[xthreads]
    .venv/bin/python bench/ingest.py --batch 1000          # POST …/broadcast-batch, 1000 a request

With `--batch N` each request is a batch broadcast of N messages (docs/api.md, "Batch broadcast")
and `--messages`, `--warmup`, the rate and the CPU figures count messages, the latencies requests.
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
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
PG_PORT = 5432
PG_USER = "postgres"
DATABASE = "bench_ingest"
CHANNEL_TOKEN = "bench-channel-token"  # noqa: S105 (a throwaway database's credentials)
PRODUCER_ID = "bench-producer"
PRODUCER_TOKEN = "bench-producer-token"  # noqa: S105
PAYLOAD = json.dumps({"order": 12345, "items": [{"sku": "A-1", "qty": 2}], "note": "x" * 160})
CORES = os.cpu_count() or 1
# The documented production setup, gunicorn's 2 x cores + 1 sync workers (docs/performance.md
# says why), and the other worker models measured against it by --compare.
DEFAULT_SERVER = f"sync:{2 * CORES + 1}"
CANDIDATES = [
    DEFAULT_SERVER,
    f"gthread:{CORES}x4",
    f"gthread:{CORES}x8",
    f"gthread:{2 * CORES}x4",
    "gthread:1x16",
]
TARGET_RATE, TARGET_P99_MS = 2000, 50  # issue 18's targets for this 2-core machine


@dataclass(frozen=True)
class ServerConfig:
    """A gunicorn worker model: `sync:5` (5 sync workers), `gthread:2x8` (2 workers x 8 threads)."""

    worker_class: str
    workers: int
    threads: int = 1

    @classmethod
    def parse(cls, text: str) -> ServerConfig:
        worker_class, _, shape = text.partition(":")
        workers, _, threads = shape.partition("x")
        if worker_class not in ("sync", "gthread") or not workers.isdigit():
            raise argparse.ArgumentTypeError(
                f"{text!r}: use sync:WORKERS or gthread:WORKERSxTHREADS"
            )
        if worker_class == "sync" and threads:
            raise argparse.ArgumentTypeError(f"{text!r}: sync workers have one thread each")
        return cls(worker_class, int(workers), int(threads or 1))

    def __str__(self) -> str:
        if self.worker_class == "sync":
            return f"sync, {self.workers} workers"
        return f"gthread, {self.workers} workers x {self.threads} threads"

    def command(self, port: int) -> list[str]:
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
    database_cpu: float = 0.0

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
def gunicorn(config: ServerConfig, env: dict[str, str]) -> Iterator[tuple[int, int]]:
    """gunicorn serving the broker: yields (port, master pid); stopped on exit."""
    port = free_port()
    process = subprocess.Popen(config.command(port), cwd=ROOT, env=env, start_new_session=True)  # noqa: S603
    try:
        wait_until_serving(port, process)
        yield port, process.pid
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
            raise RuntimeError(f"gunicorn exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/_status", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:  # refused, reset or timed out (URLError is one too): not up yet
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not answer /_status in time")


# --- CPU accounting from /proc (Linux) ----------------------------------------------------


def process_table() -> list[tuple[int, int, str, float]]:
    """(pid, parent pid, command, CPU seconds) of every process we can read."""
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
        # fields[1] is the parent pid; fields[11], fields[12] are utime and stime (man 5 proc).
        cpu = (int(fields[11]) + int(fields[12])) / ticks
        rows.append((int(entry.name), int(fields[1]), command, cpu))
    return rows


def cpu_seconds(master: int) -> tuple[float, float]:
    """CPU used so far by gunicorn (master and workers) and by every PostgreSQL process."""
    table = process_table()
    server = sum(cpu for pid, ppid, _, cpu in table if master in (pid, ppid))
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
    total = 0.0
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
            total += cpu
    return total


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
    print(f"\n== {config}: python {command}", flush=True)
    with fresh_database() as database_url:
        env = broker_environment(database_url)
        prepare_broker(env, args.channels)
        with gunicorn(config, env) as (port, master):
            load(port, args, args.warmup, 60, "w")
            server_before, database_before = cpu_seconds(master)
            client_before, own_before = time.process_time(), own_database_cpu()
            result = load(port, args, args.messages, args.duration, "b")
            own_cpu = own_database_cpu() - own_before
            result.client_cpu = time.process_time() - client_before
            server_after, database_after = cpu_seconds(master)
            result.server_cpu = server_after - server_before
            result.database_cpu = database_after - database_before
        messages, jobs = stored_counts(database_url)
    report(result)
    per_message = 1e6 / result.accepted if result.accepted else math.nan  # microseconds
    print(
        f"CPU us per message: gunicorn {result.server_cpu * per_message:.1f}"
        f"  postgres {result.database_cpu * per_message:.1f}"
        f" ({own_cpu * per_message:.1f} of it for {DATABASE}; the rest is other databases' work)"
        f"  client {result.client_cpu * per_message:.1f}"
    )
    if args.batch:
        verdict = "met" if result.rate >= BATCH_TARGET_RATE else "NOT met"
        print(f"batch target >= {BATCH_TARGET_RATE} messages/s: {verdict}")
    else:
        met = result.rate >= TARGET_RATE and 1000 * result.percentile(0.99) <= TARGET_P99_MS
        verdict = "met" if met else "NOT met"
        print(f"target >= {TARGET_RATE} messages/s with p99 <= {TARGET_P99_MS} ms: {verdict}")
    verified = messages == result.accepted and jobs == result.accepted
    print(
        f"stored: {messages} messages, {jobs} jobs for {result.accepted} accepted"
        f" -> {'OK' if verified else 'MISMATCH'}"
    )
    if not verified:
        raise SystemExit("the database does not hold exactly what was accepted")
    return result


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
        f"CPU ms per message: gunicorn {result.server_cpu * per_message:.2f}"
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
    args = parser.parse_args()
    configs = list(args.server)
    if args.compare:
        configs += [ServerConfig.parse(text) for text in CANDIDATES]
    configs = configs or [ServerConfig.parse(DEFAULT_SERVER)]
    print(f"ingest benchmark, {machine()}")
    if args.batch:
        print(f"batch broadcasts of {args.batch} messages; latencies are per request")
    print(
        f"{args.clients} clients (keep-alive where the server allows it),"
        f" {args.channels} channel(s) with one consumer each, {len(PAYLOAD)}-byte JSON payload,"
        f" up to {args.messages} messages or {args.duration:g} s"
    )
    results = [(config, run(config, args)) for config in configs]
    if len(results) > 1:
        print("\nserver                           msg/s   p50 ms  p95 ms  p99 ms  errors")
        for config, result in results:
            print(
                f"{config!s:32} {result.rate:6.0f}  {1000 * result.percentile(0.5):6.1f}"
                f"  {1000 * result.percentile(0.95):6.1f}  {1000 * result.percentile(0.99):6.1f}"
                f"  {sum(result.errors.values())}"
            )


if __name__ == "__main__":
    main()
