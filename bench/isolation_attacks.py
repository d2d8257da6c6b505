"""The attackers of bench/isolation.py, each mounted on a row (bench/isolation_stage.py) before the
healthy tenant's drain is timed, and each undone when the attack stack closes.

The shapes are those of the adversarial test of issue 36 on the code before its fixes: slow and
hanging receivers that fill the dispatchers' slots, a dispatcher frozen or killed while it holds
something, a session idle in transaction on a consumer row, schemas that make a broadcast's
check fetch, backtrack or compare for tens of seconds, and long polls that hold web workers.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import queue
import signal
import subprocess
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from dispatch_harness import HOST, PAYLOAD, Bench, wait_for
from isolation_stage import (
    ADMIN_TOKEN,
    HTTP_GRACE,
    TOKEN,
    Row,
    add_consumers,
    kill_group,
    make_tenant,
    post,
    producer_headers,
    publish_batch,
    steady_count,
)

NEVER_MS = 10_000_000.0  # a receiver's delay that outlasts any row: it never answers
FREEZE_SECONDS = 45.0  # to catch a dispatcher while it records failures
PROBE_SECONDS = 10.0  # how long a broadcast to the attacked channel is waited for


@dataclass(frozen=True)
class Attack:
    name: str
    what: str
    mount: Callable[[Row, int], None]  # (row, dispatchers): starts them, then attacks
    least_dispatchers: int = 1


def alone(row: Row, count: int) -> None:
    row.start_dispatchers(count)


def url(port: int, path: str) -> str:
    return f"http://{HOST}:{port}/{path}"


def timed_publish(row: Row, channel: str, timeout: float) -> Callable[[], None]:
    """One broadcast to `channel` (the attacked consumer's own), timed in a thread while the
    healthy drain runs; the returned finisher notes how long it took."""
    outcome: dict[str, Any] = {}

    def publish() -> None:
        started = time.monotonic()
        try:
            path = f"/channel/{channel}/broadcast"
            status = post(row.web_port, path, PAYLOAD.encode(), producer_headers(channel), timeout)
            outcome["text"] = f"HTTP {status} after {time.monotonic() - started:.2f} s"
        except TimeoutError:
            outcome["text"] = f"no answer in {timeout:g} s"
        except (OSError, http.client.HTTPException) as error:
            outcome["text"] = f"{type(error).__name__} after {time.monotonic() - started:.2f} s"

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()

    def finish() -> None:
        thread.join(timeout + 1)
        row.note(f"a broadcast to channel {channel!r} meanwhile: {outcome.get('text', '?')}")

    return finish


# --- slots taken: slow and hanging receivers --------------------------------------------------


def filled_by(row: Row, count: int, channel: str, delay_ms: float, messages: int) -> None:
    """Three consumers of `channel` (one receiver, answering after `delay_ms`) and `messages`
    messages to it (a job each per consumer); waits until the dispatchers took every slot they
    would give them."""
    row.start_dispatchers(count)
    sink = row.attacker_sink(delay_ms)
    make_tenant(channel, [url(sink.port, f"{channel}/{n}") for n in range(3)])
    publish_batch(row.web_port, channel, messages)
    held = steady_count(lambda: sink.summary()[0])
    row.note(f"the attacker's receiver holds {held} requests")


def slow(row: Row, count: int) -> None:
    filled_by(row, count, "slow", 25_000, 500)


def hanging(row: Row, count: int) -> None:
    filled_by(row, count, "hanging", NEVER_MS, 300)


# --- a dispatcher frozen while it records failures --------------------------------------------

# Backends whose open transaction locked (or updated) one of these consumer rows: a row's xmax
# is the locker's transaction ID while it runs.
HOLDERS_SQL = """
SELECT a.pid, a.client_port, c.id FROM consumers_consumer c
JOIN pg_stat_activity a ON a.backend_xid = c.xmax
WHERE c.id = ANY(%(ids)s) AND a.datname = current_database()
"""


def lock_holders(bench: Bench, ids: list[int]) -> list[tuple[int, int, int]]:
    """(backend pid, its client port, consumer ID) of each lock held on these consumer rows."""
    return [(int(a), int(b), int(c)) for a, b, c in bench.db.execute(HOLDERS_SQL, {"ids": ids})]


def blocks_publishers(bench: Bench, consumer: int) -> bool:
    """Is the row locked FOR UPDATE? A publish's foreign key check (FOR KEY SHARE) then waits:
    exactly what this probe cannot take. NOWAIT alone is not enough: on a row updated since
    (the recording moved its circuit columns) PostgreSQL follows the update chain and waits
    there whatever NOWAIT says, so lock_timeout bounds the probe."""
    try:
        with bench.db.transaction():
            bench.db.execute("SET LOCAL lock_timeout = '200ms'")
            bench.db.execute(
                "SELECT FROM consumers_consumer WHERE id = %s FOR KEY SHARE NOWAIT", [consumer]
            )
    except psycopg.errors.LockNotAvailable:  # either way: NOWAIT or lock_timeout
        return True
    return False


def waiting_for(row: Row, backend: int, timeout: float) -> list[str]:
    """Who waits for a lock `backend` holds, once someone does or `timeout` has passed: a
    dispatcher, found by its connection's port, or the session's name."""
    query = (
        "SELECT client_port, application_name FROM pg_stat_activity"
        " WHERE %(backend)s = ANY(pg_blocking_pids(pid))"
    )

    def waiters() -> list[tuple[int, str]]:
        return [(int(p or 0), str(n)) for p, n in row.bench.db.execute(query, {"backend": backend})]

    wait_for(lambda: len(waiters()), 1, timeout, lambda: True)
    names = []
    for port, name in waiters():
        owner = owner_of(port, row.alive())
        names.append(f"dispatcher {owner.pid}" if owner else name or "a session")
    return sorted(names)


def await_waiters(row: Row, backend: int, timeout: float = 5) -> None:
    """Until another session waits for a lock `backend` holds (the attack has bitten: what is
    timed next runs against it), or `timeout` passes (a tree where nothing waits for it); noted."""
    names = waiting_for(row, backend, timeout)
    if names:
        row.note("waiting for its lock: " + ", ".join(names))
    else:
        row.note(f"no session waits for its lock after {timeout:g} s")


def owner_of(port: int, processes: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes] | None:
    """The process whose TCP socket has local port `port` (a backend's client_port): the
    socket's inode from /proc/net/tcp*, then the process holding it among its descriptors."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    for process in processes:
        for descriptor in Path(f"/proc/{process.pid}/fd").iterdir():
            try:
                if os.readlink(descriptor) in inodes:
                    return process
            except OSError:  # closed meanwhile
                continue
    return None


def catch_recording(row: Row, ids: list[int], strict: bool, until: float) -> tuple[str, int] | None:
    """SIGSTOP a dispatcher while its transaction holds a lock on one of these consumer rows
    (strict: FOR UPDATE, the lock that makes publishes wait, and another dispatcher comes to
    wait for it within 3 s: the frozen one may have caught the last recording of that
    consumer). Kept frozen, with SIGCONT when the attack ends, only if the lock is still held
    once it is stopped: what was caught and the backend holding the lock, or None."""
    while time.monotonic() < until:
        for backend, port, consumer in lock_holders(row.bench, ids):
            process = owner_of(port, row.alive())
            if process is None:
                continue
            os.kill(process.pid, signal.SIGSTOP)
            # Resumed when the attack ends, whatever happens from here (SIGCONT to a running
            # process does nothing): a frozen dispatcher would ignore the SIGTERM that stops it.
            row.attack.callback(os.kill, process.pid, signal.SIGCONT)
            time.sleep(0.3)  # a statement already sent finishes; the transaction cannot
            held = any(pid == backend for pid, _, _ in lock_holders(row.bench, [consumer]))
            update = held and blocks_publishers(row.bench, consumer)
            bites = update and bool(waiting_for(row, backend, 3))
            if bites or (held and not strict):
                lock = "FOR UPDATE" if update else "a lock weaker than FOR UPDATE"
                caught = f"dispatcher {process.pid} frozen holding {lock} on consumer {consumer}"
                return caught, backend
            os.kill(process.pid, signal.SIGCONT)
        time.sleep(0.002)
    return None


def sigstop(row: Row, count: int) -> None:
    """Consumers of channel `failing` whose receiver answers 503 after a second, a fresh few
    at a time (each opens its circuit after its first failures), until a dispatcher is caught
    recording their failures while the other one has failures of the same consumer left to
    record (both hold some of each consumer's jobs); the last third of the time any lock will
    do, then any moment (a tree whose recording takes no such lock)."""
    row.start_dispatchers(count)
    sink = row.attacker_sink(1_000, status=503)
    make_tenant("failing", [])
    started = time.monotonic()
    caught = None
    while caught is None and (spent := time.monotonic() - started) < FREEZE_SECONDS:
        ids = add_consumers("failing", [url(sink.port, "failing") for _ in range(4)])
        publish_batch(row.web_port, "failing", 100)
        strict = spent < FREEZE_SECONDS * 2 / 3
        caught = catch_recording(row, ids, strict, time.monotonic() + 4)
    if caught is None:
        victim = row.alive()[0]
        row.attack.callback(os.kill, victim.pid, signal.SIGCONT)
        os.kill(victim.pid, signal.SIGSTOP)
        row.note(f"no recording caught in {FREEZE_SECONDS:g} s: dispatcher {victim.pid} frozen")
    else:
        row.note(caught[0])
        await_waiters(row, caught[1])
    row.finishers.append(timed_publish(row, "failing", PROBE_SECONDS))


# --- a dispatcher killed ----------------------------------------------------------------------


def kill(row: Row, count: int) -> None:
    """One dispatcher alone takes every slot of consumer `held` (its receiver answers after
    5 s), the others start, and it gets SIGKILL: how long until that consumer gets a request
    again, while the healthy drain runs on the survivors."""
    sink = row.attacker_sink(5_000)
    make_tenant("held", [url(sink.port, "held")])
    [victim] = row.start_dispatchers(1)
    publish_batch(row.web_port, "held", 1000)
    held = steady_count(lambda: sink.summary()[0])
    row.start_dispatchers(count - 1)
    before = sink.summary()[0]
    killed_at = time.monotonic()
    kill_group(victim)
    row.note(f"dispatcher {victim.pid} killed with {held} requests of consumer 'held' in flight")
    resumed: dict[str, float] = {}

    def watch() -> None:
        while time.monotonic() < killed_at + row.timeout:
            if sink.summary()[0] > before:
                resumed["at"] = time.monotonic()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def finish() -> None:
        watcher.join(max(0.0, killed_at + row.timeout - time.monotonic()) + 1)
        row.resume_timed_out = "at" not in resumed
        row.resume_seconds = resumed.get("at", time.monotonic()) - killed_at
        how = "none in" if row.resume_timed_out else "the first after"
        row.note(f"consumer 'held' requests after the kill: {how} {row.resume_seconds:.1f} s")

    row.finishers.append(finish)


# --- a session idle in transaction on a consumer row ------------------------------------------


def psql(row: Row, count: int) -> None:
    """Consumer `locked` has requests in flight that will fail (503 after 2 s); a session of
    its own (psycopg, doing what `BEGIN; SELECT … FOR UPDATE;` in psql does) then locks its row
    and stays idle in transaction until the attack ends."""
    row.start_dispatchers(count)
    sink = row.attacker_sink(2_000, status=503)
    [locked] = make_tenant("locked", [url(sink.port, "locked")])
    publish_batch(row.web_port, "locked", 200)
    steady_count(lambda: sink.summary()[0], quiet=0.3, timeout=10)
    session = psycopg.connect(row.bench.database_url, application_name="bench isolation psql")
    row.attack.callback(session.close)  # ends the transaction: the lock goes with it
    session.execute("SELECT id FROM consumers_consumer WHERE id = %s FOR UPDATE", [locked])
    row.note(f"a session holds consumer 'locked' FOR UPDATE, idle in transaction ({locked})")
    await_waiters(row, session.info.backend_pid)  # the 503s come back within 2 s
    row.finishers.append(timed_publish(row, "locked", PROBE_SECONDS))


# --- web workers held: hostile schemas and long polls -----------------------------------------


def web_attackers(
    row: Row, clients: int, path: str, body: bytes, headers: dict[str, str], method: str = "POST"
) -> None:
    """`clients` processes sending the same request back to back until the attack ends, when
    their answers are noted.

    They stand for clients on other machines, so they must not take this machine's CPU from the
    healthy tenant: they are processes (threads would take the GIL of this one, whose threads
    publish the healthy messages) at nice 19 (with 2 cores, their own work of sending requests
    flat out would otherwise count as the broker's cost). The notes give the rate they reached."""
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    ready = spawn.Semaphore(0)
    answers: multiprocessing.Queue[str] = spawn.Queue()
    request = (row.web_port, path, body, headers, 30 + HTTP_GRACE, method)
    attackers = [
        spawn.Process(target=attack_client, args=(request, stop, ready, answers), daemon=True)
        for _ in range(clients)
    ]
    for attacker in attackers:
        attacker.start()
    for _ in attackers:
        ready.acquire(timeout=30)  # its first request goes out next
    started = time.monotonic()

    def end() -> None:
        stop.set()
        seconds = time.monotonic() - started
        counted: Counter[str] = Counter()
        for attacker in attackers:
            attacker.join(timeout=1)  # a request under way (a long poll) is not waited for
            attacker.kill()
        while True:
            try:
                counted[answers.get(timeout=0.5)] += 1
            except queue.Empty:
                break
        told = ", ".join(f"{a} x{n}" for a, n in counted.most_common()) or "none (all waiting)"
        rate = sum(counted.values()) / seconds
        row.note(f"attacker answers: {told} ({rate:.0f}/s over {seconds:.1f} s)")

    row.attack.callback(end)
    time.sleep(1)  # their first requests reach the workers


def attack_client(
    request: tuple[int, str, bytes, dict[str, str], float, str],
    stop: Any,
    ready: Any,
    answers: multiprocessing.Queue[str],
) -> None:
    """One attacker's loop, in a process of its own: each answer's status onto `answers`."""
    port, path, body, headers, timeout, method = request
    os.nice(19)
    ready.release()
    while not stop.is_set():
        try:
            answer = f"HTTP {post(port, path, body, headers, timeout, method)}"
        except (OSError, http.client.HTTPException) as error:
            answer = type(error).__name__
        answers.put(answer)


def schema_attack(row: Row, count: int, schema: dict[str, Any], payload: Any) -> None:
    """The attacker's event type gets `schema` through the admin API (a tree that refuses it
    there has met this attack), then its producers publish `payload` with that type."""
    row.start_dispatchers(count)
    make_tenant("schema", [])
    body = urllib.parse.urlencode({"schema": json.dumps(schema)}).encode()
    headers = {
        "Authorization": f"Bearer {ADMIN_TOKEN}",
        "Content-Type": "application/x-www-form-urlencoded",
    }
    status = post(row.web_port, "/channel/schema/event-type/evil", body, headers, 30, "PUT")
    row.note(f"PUT of the schema: HTTP {status}")
    headers = producer_headers("schema") | {"X-Broker-Event-Type": "evil"}
    encoded = json.dumps(payload).encode()
    path = "/channel/schema/broadcast"
    web_attackers(row, row.bench.args.web_attackers, path, encoded, headers)


def schema_ref(row: Row, count: int) -> None:
    hang = row.attacker_sink(NEVER_MS)  # the $ref's document never comes
    schema_attack(row, count, {"$ref": url(hang.port, "s.json")}, {})


def schema_regex(row: Row, count: int) -> None:
    schema_attack(row, count, {"type": "string", "pattern": "^(a+)+$"}, "a" * 34 + "!")


def schema_unique(row: Row, count: int) -> None:
    items = [{"n": n} for n in range(4000)]  # distinct objects: compared pair by pair
    schema_attack(row, count, {"type": "array", "uniqueItems": True}, items)


def longpoll(row: Row, count: int) -> None:
    """Pull workers of another tenant long-polling `claim` with `wait: 20` on an empty queue."""
    row.start_dispatchers(count)
    make_tenant("pull", [url(9, "pull")], pull=True)
    path = "/channel/pull/consumer/pull-0/claim"
    body = json.dumps({"limit": 1, "wait": 20}).encode()
    headers = {
        "Content-Type": "application/json",
        "X-Broker-Channel-Token": TOKEN,
        "X-Broker-Consumer-Token": TOKEN,
    }
    web_attackers(row, row.bench.args.web_attackers, path, body, headers)


ATTACKS = {
    attack.name: attack
    for attack in [
        Attack("slow", "3 consumers answering 200 after 25 s, 500 messages to them", slow),
        Attack("hanging", "3 consumers that never answer, 300 messages to them", hanging),
        Attack("sigstop", "a dispatcher SIGSTOPped while it records failures", sigstop, 2),
        Attack("kill", "kill -9 of a dispatcher holding a consumer's slots", kill, 2),
        Attack("psql", "a session idle in transaction, FOR UPDATE on a consumer row", psql),
        Attack("schema-ref", "broadcasts checked by a schema whose $ref hangs", schema_ref),
        Attack("schema-regex", 'pattern "^(a+)+$" against "a" * 34 + "!"', schema_regex),
        Attack("schema-unique", "uniqueItems over 4,000 objects", schema_unique),
        Attack("longpoll", "pull workers long-polling claim with wait 20", longpoll),
    ]
}
