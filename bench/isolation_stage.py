"""The stage of bench/isolation.py: tenants, the web server, a row's processes, HTTP publishing,
and the healthy consumer's drain, timed and checked.

A row runs on two stacks: `infra` (web server, dispatchers) closes last, after the healthy jobs
had their chance to be delivered; `attack` (the attacker's receivers, clients, locks, frozen
processes) closes first, as soon as the drain is measured.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from dispatch_harness import (
    HOST,
    LISTENER_NAME,
    PAYLOAD,
    ROOT,
    Bench,
    Check,
    DispatchOptions,
    Receivers,
    count_receipts,
    dispatchers,
    free_port,
    start_process,
    stop_process,
    wait_for,
)
from ingest import wait_until_serving
from psycopg import sql

TOKEN = "bench-isolation-token"  # noqa: S105 (every token of a throwaway database)
ADMIN_TOKEN = "bench-isolation-admin-token"  # noqa: S105
HEALTHY = "healthy"  # the healthy tenant's channel; its one consumer answers at once
SETTLE_SECONDS = 45.0  # after the attack ends, for the healthy jobs left to be delivered
HTTP_GRACE = 5.0  # over gunicorn's 30 s worker timeout, for requests that wait for one


def producer_of(channel: str) -> str:
    return f"{channel}-producer"


def producer_headers(channel: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-Broker-Channel-Token": TOKEN,
        "X-Broker-Producer-ID": producer_of(channel),
        "X-Broker-Producer-Token": TOKEN,
    }


def post(
    port: int, path: str, body: bytes, headers: dict[str, str], timeout: float, method: str = "POST"
) -> int:
    """One request on a connection of its own (sync workers close it anyway): its status.
    OSError or http.client.HTTPException when no answer came."""
    connection = http.client.HTTPConnection(HOST, port, timeout=max(timeout, 0.1))
    try:
        connection.request(method, path, body, headers)
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def publish_batch(port: int, channel: str, count: int, timeout: float = 60) -> None:
    """`count` messages to `channel` in batch broadcasts of at most 1,000 (the attacker's
    backlog: how it got there does not matter, only that it is there)."""
    for start in range(0, count, 1000):
        messages = [{"payload": PAYLOAD, "content_type": "application/json"}]
        body = json.dumps({"messages": messages * min(1000, count - start)}).encode()
        path = f"/channel/{channel}/broadcast-batch"
        status = post(port, path, body, producer_headers(channel), timeout)
        if status != 201:
            raise RuntimeError(f"batch broadcast to {channel}: HTTP {status}")


# --- tenants ------------------------------------------------------------------------------------


def reset_tables(bench: Bench) -> None:
    """Every row starts from empty tables: no job, heartbeat or lock of the row before."""
    from broker.models import Channel, EventType, Message, Producer
    from consumers.models import Consumer
    from jobs.models import DeliveryAttempt, DispatcherHeartbeat, Job

    models = (DeliveryAttempt, Job, Message, Consumer, EventType, DispatcherHeartbeat, Channel)
    tables = [model._meta.db_table for model in (*models, Producer)]
    bench.db.execute(
        sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
            sql.SQL(", ").join(map(sql.Identifier, tables))
        )
    )


def make_tenant(channel: str, callbacks: list[str], *, pull: bool = False) -> list[int]:
    """A channel, its producer and a consumer per callback URL (push, or pull): their IDs."""
    from broker.models import Channel, Producer

    stored, _ = Channel.objects.get_or_create(id=channel, defaults={"name": channel})
    stored.set_token(TOKEN)
    stored.save()
    producer = Producer(id=producer_of(channel), name=producer_of(channel))
    producer.set_token(TOKEN)
    producer.save()
    return add_consumers(channel, callbacks, pull=pull)


def add_consumers(channel: str, callbacks: list[str], *, pull: bool = False) -> list[int]:
    from consumers.models import Consumer

    first = Consumer.objects.filter(channel_id=channel).count()
    kind = Consumer.Type.PULL if pull else Consumer.Type.PUSH
    ids = []
    for number, url in enumerate(callbacks, start=first):
        consumer = Consumer(
            channel_id=channel, public_id=f"{channel}-{number}", name=f"{channel} {number}",
            callback_url=url, type=kind,
        )  # fmt: skip
        consumer.set_token(TOKEN)
        consumer.save()
        ids.append(consumer.pk)
    return ids


# --- the web server -----------------------------------------------------------------------------


def web_workers() -> int:
    """gunicorn's workers in compose.yaml's web service (its WEB_CONCURRENCY default): the
    documented deployment's, which the adversarial test of issue 36 ran against."""
    found = re.search(r"WEB_CONCURRENCY:-(\d+)", (ROOT / "compose.yaml").read_text())
    return int(found.group(1)) if found else 3


def web_command(port: int, workers: int) -> list[str]:
    """The web server exactly as `manage.py runbroker` starts it (whatever server, worker class
    and options it picks on this tree), bound to our port: the bench follows the project's
    choice instead of keeping a copy of it."""
    from broker.management.commands.runbroker import Command, _processes

    parser = Command().create_parser("manage.py", "runbroker")
    arguments = ["--bind", f"{HOST}:{port}", "--workers", str(workers)]
    options = vars(parser.parse_args([*arguments, "--dispatchers", "0", "--no-housekeeping"]))
    return dict(_processes(options))["web"]


@contextmanager
def web_server(bench: Bench, workers: int) -> Iterator[int]:
    port = free_port()
    process = start_process(web_command(port, workers), bench.logs / f"web-{port}.log", bench.env)
    try:
        wait_until_serving(port, process, timeout=60)
        yield port
    finally:
        # Workers stuck in a regular expression ignore SIGTERM: gunicorn kills them after its
        # graceful timeout, and so do we after ours.
        stop_process(process, "web server", timeout=15)


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL to an attacker's process group: nothing of it needs a clean exit."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


# --- a row --------------------------------------------------------------------------------------


@dataclass
class Row:
    """One run of the healthy drain, beside an attack or alone."""

    bench: Bench
    options: DispatchOptions
    healthy_sink: Receivers
    web_port: int
    infra: ExitStack
    attack: ExitStack
    timeout: float
    dispatchers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    finishers: list[Callable[[], None]] = field(default_factory=list)  # after the drain
    resume_seconds: float | None = None  # the kill row's figure
    resume_timed_out: bool = False

    def note(self, text: str) -> None:
        print(f"  {text}", flush=True)
        self.notes.append(text)

    def start_dispatchers(self, count: int) -> list[subprocess.Popen[bytes]]:
        started = self.infra.enter_context(dispatchers(self.bench, count, self.options))
        self.dispatchers += started
        wait_dispatchers_ready(self.bench, len(self.dispatchers))
        return list(started)

    def attacker_sink(self, delay_ms: float, status: int = 200) -> Receivers:
        """A receiver of the attacker's consumers, killed as soon as the attack ends."""
        sink = Receivers(1, delay_ms, self.bench.logs, status)
        for process in sink.processes:
            self.attack.callback(kill_group, process)
        sink.wait_until_serving()
        return sink

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [process for process in self.dispatchers if process.poll() is None]


def wait_dispatchers_ready(bench: Bench, count: int) -> None:
    """Until `count` dispatchers beat and listen (the harness's wait counts only the processes it
    has just started, and a second start would find the first one's heartbeat)."""
    query = (
        "SELECT least((SELECT count(*) FROM jobs_dispatcherheartbeat), (SELECT count(*)"
        " FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = %(name)s))"
    )

    def ready() -> int:
        return int(bench.scalar(query, {"name": LISTENER_NAME}))

    _, timed_out = wait_for(ready, count, 60, lambda: True)
    if timed_out:
        print(f"  warning: {count} dispatchers not seen ready after 60 s; going on", flush=True)


def steady_count(progress: Callable[[], int], quiet: float = 1.0, timeout: float = 15) -> int:
    """Wait until `progress` is above 0 and has not moved for `quiet` seconds: its value then
    (the requests a receiver holds once every slot it can get is taken)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        value = progress()
        if value != last:
            last, since = value, time.monotonic()
        elif value > 0 and time.monotonic() - since >= quiet:
            break
        time.sleep(0.05)
    return max(last, 0)


# --- the healthy drain --------------------------------------------------------------------------


@dataclass
class Drain:
    """The healthy tenant's `messages` published over HTTP until all are DELIVERED."""

    messages: int
    accepted: int = 0  # 201s
    delivered: int = 0  # DELIVERED when the clock stopped
    seconds: float = 0.0
    timed_out: bool = False
    publish_seconds: list[float] = field(default_factory=list)
    refusals: Counter[str] = field(default_factory=Counter)  # non-201 answers and errors

    @property
    def complete(self) -> bool:
        return not self.timed_out and self.accepted == self.delivered == self.messages

    def describe(self) -> str:
        if self.complete:
            return f"{self.seconds:.2f} s"
        how = "timed out" if self.timed_out else f"{self.messages - self.accepted} refused"
        return f"{how}: {self.delivered} of {self.messages} delivered in {self.seconds:.0f} s"

    def publish_figures(self) -> str:
        if not self.publish_seconds:
            return "no broadcast answered"
        median = statistics.median(self.publish_seconds)
        text = f"broadcast median {seconds(median)}, max {seconds(max(self.publish_seconds))}"
        refused = ", ".join(f"{what} x{n}" for what, n in self.refusals.most_common())
        return text + (f"; not accepted: {refused}" if refused else "")


def seconds(value: float) -> str:
    return f"{1000 * value:.0f} ms" if value < 1 else f"{value:.1f} s"


def healthy_counts(bench: Bench) -> tuple[int, int]:
    """(DELIVERED, all) jobs of the healthy tenant."""
    row = bench.db.execute(
        "SELECT count(*) FILTER (WHERE j.status = 'DELIVERED'), count(*) FROM jobs_job j"
        " JOIN consumers_consumer c ON c.id = j.consumer_id WHERE c.channel_id = %s",
        [HEALTHY],
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def publish_healthy(row: Row, drain: Drain, publishers: int, deadline: float) -> None:
    """`drain.messages` broadcasts from `publishers` threads, each waiting for its answer, until
    all are sent or the deadline passes."""
    numbers = iter(range(drain.messages))
    lock = threading.Lock()
    headers = producer_headers(HEALTHY)
    path = f"/channel/{HEALTHY}/broadcast"

    def publish() -> None:
        while (left := deadline - time.monotonic()) > 0:
            with lock:
                if next(numbers, None) is None:
                    return
            started = time.monotonic()
            try:
                answer: int | str = post(row.web_port, path, PAYLOAD.encode(), headers, left)
            except (OSError, http.client.HTTPException) as error:
                answer = type(error).__name__
            with lock:
                if answer == 201:
                    drain.accepted += 1
                    drain.publish_seconds.append(time.monotonic() - started)
                else:
                    drain.refusals[str(answer)] += 1

    threads = [threading.Thread(target=publish, daemon=True) for _ in range(publishers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def healthy_drain(row: Row, messages: int, publishers: int) -> Drain:
    """Publish over HTTP and time until every healthy job is DELIVERED (SQL), within the row's
    timeout. Counts from what was there before, so that a frame can drain several times."""
    drain = Drain(messages)
    before, _ = healthy_counts(row.bench)
    started = time.monotonic()
    deadline = started + row.timeout
    publish_healthy(row, drain, publishers, deadline)
    target = before + drain.accepted
    _, timed_out = wait_for(
        lambda: healthy_counts(row.bench)[0], target, max(0.0, deadline - time.monotonic()),
        lambda: bool(row.alive()),
    )  # fmt: skip
    drain.delivered = healthy_counts(row.bench)[0] - before
    drain.seconds = time.monotonic() - started
    drain.timed_out = timed_out or time.monotonic() >= deadline
    print(f"  healthy drain: {drain.describe()}; {drain.publish_figures()}", flush=True)
    return drain


@dataclass
class Loss:
    """What became of the healthy jobs once the attack was over."""

    jobs: int = 0
    undelivered: int = 0  # jobs still not DELIVERED after SETTLE_SECONDS
    missing: int = 0  # DELIVERED jobs the receiver never saw
    duplicates: int = 0

    @property
    def lost(self) -> int:
        return self.undelivered + self.missing

    def describe(self) -> str:
        text = f"{self.jobs} healthy jobs at the end: "
        if self.undelivered:
            text += f"{self.undelivered} not DELIVERED {SETTLE_SECONDS:g} s after the attack"
        else:
            text += "all DELIVERED"
        return f"{text}, {self.missing} never received, {self.duplicates} received twice or more"


def settle(row: Row) -> Loss:
    """Give the healthy jobs time to be delivered now that the attack is over, then compare
    SQL with the receiver: every job must be DELIVERED, and have arrived."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline and row.alive():
        delivered, jobs = healthy_counts(row.bench)
        if delivered == jobs:
            break
        time.sleep(0.1)
    delivered, jobs = healthy_counts(row.bench)
    keys = row.bench.db.execute(
        "SELECT m.public_id || ' ' || c.public_id FROM jobs_job j"
        " JOIN broker_message m ON m.id = j.message_id"
        " JOIN consumers_consumer c ON c.id = j.consumer_id"
        " WHERE c.channel_id = %s AND j.status = 'DELIVERED'",
        [HEALTHY],
    ).fetchall()
    check = Check()
    count_receipts(check, row.healthy_sink.received(), {key for (key,) in keys})
    loss = Loss(jobs, jobs - delivered, check.missing, check.duplicates)
    print(f"  {loss.describe()}", flush=True)
    return loss
