"""PostgreSQL connections held by the broker's processes under concurrent broadcasts.

For each server setup asked for, the benchmark

1. creates a role `bench_connections` (not a superuser, at most `--connection-limit` connections)
   and a fresh database of the same name owned by it, migrates it, and creates bench/ingest.py's
   channel, consumer and producer (with ingest.py's helpers);
2. starts the server on a free loopback port: `manage.py runserver --noreload` (what a developer
   runs), or gunicorn with sync or gthread workers; with `--workers`, also `manage.py dispatch`
   and `manage.py qcluster` (django-q2) next to it;
3. drives POST /channel/{c}/broadcast from `--clients` concurrent producers, each request on a
   TCP connection of its own unless `--keep-alive`, for `--messages` requests or `--duration`
   seconds, while a sampler counts the database's rows in pg_stat_activity every 10 ms, by
   process (each runs under an `application_name` of its own);
4. prints the peak number of connections of each process and in all, the number still open a
   second after the load, the answers that were not 201 (by status) and the 201s per second;
5. stops the processes and drops the database and the role.

The role's connection limit keeps a setup that leaks connections from taking all of the
server's `max_connections` away from whatever else uses it (superusers ignore such limits, hence
the role): a leak shows up as `503 database unavailable` once the role has used its limit.

It talks to 127.0.0.1 only and stops by itself. Run from the project root:

    .venv/bin/python bench/connections.py                        # runserver, sync:5, gthread:2x4
    .venv/bin/python bench/connections.py --server sync:5 --workers   # with a dispatcher, qcluster
    .venv/bin/python bench/connections.py --env DATABASE_POOL=false --env DATABASE_CONN_MAX_AGE=60
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import psycopg
from dispatch_harness import machine  # the run's header: date, CPU, versions, load, commit
from ingest import (
    CORES,
    HOST,
    PG_PORT,
    ROOT,
    LoadResult,
    ServerConfig,
    admin_connection,
    broker_environment,
    drive,
    free_port,
    prepare_broker,
    stop,
    wait_until_serving,
    web_server,
)
from psycopg import sql

NAME = "bench_connections"  # the role and the database
RUNSERVER = "runserver"
# What a developer runs, the documented production setup (2 x cores + 1 sync workers) and the
# gthread setup docs/performance-history.md compares with it.
DEFAULT_SERVERS = [RUNSERVER, f"sync:{2 * CORES + 1}", f"gthread:{CORES}x4"]
SERVER, DISPATCHER, QCLUSTER = "server", "dispatcher", "qcluster"
AdminConnection = psycopg.Connection[tuple[object, ...]]


@dataclass
class Connections:
    peak: int = 0  # the most rows pg_stat_activity had for the database at once
    peaks: Counter[str] = field(default_factory=Counter)  # the same, by application_name
    after: int = 0  # rows a second after the load ended


# --- the database -------------------------------------------------------------------------


@contextmanager
def fresh_database(connection_limit: int) -> Iterator[str]:
    """A new database owned by a role allowed `connection_limit` connections; both dropped
    afterwards whatever happens."""
    name = sql.Identifier(NAME)
    with admin_connection() as conn:
        drop(conn)
        limit = sql.Literal(connection_limit)
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT {}").format(name, limit))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(name, name))
    try:
        yield f"postgres://{NAME}@{HOST}:{PG_PORT}/{NAME}"
    finally:
        with admin_connection() as conn:
            drop(conn)


def drop(conn: AdminConnection) -> None:
    name = sql.Identifier(NAME)
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
    conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(name))


def connections_by_application(conn: AdminConnection) -> Counter[str]:
    rows = conn.execute(
        "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s GROUP BY 1",
        [NAME],
    ).fetchall()
    return Counter({str(name): int(str(count)) for name, count in rows})


class Sampler:
    """Counts the database's connections every 10 ms in a thread, from a connection of its own
    to the `postgres` database (so it does not count itself)."""

    def __init__(self) -> None:
        self.connections = Connections()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Connections:
        self._thread.start()
        return self.connections

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        time.sleep(1)  # what the processes keep, once they have finished the last requests
        with admin_connection() as conn:
            self.connections.after = connections_by_application(conn).total()

    def _run(self) -> None:
        with admin_connection() as conn:
            while not self._stop.wait(0.01):
                now = connections_by_application(conn)
                self.connections.peak = max(self.connections.peak, now.total())
                self.connections.peaks |= now  # | keeps the larger count of each


# --- the processes ------------------------------------------------------------------------


def as_application(env: dict[str, str], name: str) -> dict[str, str]:
    """`env` with the process's connections named `name` in pg_stat_activity."""
    return {**env, "DATABASE_URL": f"{env['DATABASE_URL']}?application_name={name}"}


@contextmanager
def process(command: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A process of our own (its output discarded: runserver logs every request), SIGTERM on
    exit, then SIGKILL to its process group if it lingers."""
    started = subprocess.Popen(  # noqa: S603
        command,
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield started
    finally:
        stop(started)


def runserver_command(port: int) -> list[str]:
    return [sys.executable, "manage.py", "runserver", "--noreload", f"{HOST}:{port}"]


@contextmanager
def serving(setup: str, env: dict[str, str]) -> Iterator[int]:
    """The server of `setup` under the application name "server"; yields its port."""
    env = as_application(env, SERVER)
    if setup == RUNSERVER:
        port = free_port()
        with process(runserver_command(port), env) as server:
            wait_until_serving(port, server)
            yield port
    else:
        with web_server(ServerConfig.parse(setup), env) as (port, _):
            yield port


def start_workers(stack: ExitStack, env: dict[str, str]) -> None:
    """A dispatcher (deliveries fail: nothing listens on the consumer's port) and django-q2's
    cluster, each under its own application name."""
    manage = [sys.executable, "manage.py"]
    env = {**env, "BROKER_ALLOW_PRIVATE_CALLBACKS": "true"}
    stack.enter_context(process([*manage, "dispatch"], as_application(env, DISPATCHER)))
    stack.enter_context(process([*manage, "qcluster"], as_application(env, QCLUSTER)))


def command_line(setup: str) -> str:
    """The server's command, for the report."""
    command = runserver_command(0) if setup == RUNSERVER else ServerConfig.parse(setup).command(0)
    return "python " + " ".join(command[1:]).replace(f"{HOST}:0", f"{HOST}:<free port>")


# --- one run ------------------------------------------------------------------------------


def run(setup: str, args: argparse.Namespace) -> tuple[Connections, LoadResult]:
    print(f"\n== {setup}: {command_line(setup)}", flush=True)
    with fresh_database(args.connection_limit) as database_url, ExitStack() as stack:
        env = {**broker_environment(database_url), **dict(args.env)}
        prepare_broker(env, channels=1)
        if args.workers:
            start_workers(stack, env)
        port = stack.enter_context(serving(setup, env))
        with Sampler() as connections:
            load = drive(port, args.clients, 1, args.messages, args.duration, "b", args.keep_alive)
            result = asyncio.run(load)
    by_process = ", ".join(f"{name} {n}" for name, n in sorted(connections.peaks.items()))
    refused = ", ".join(f"{name}: {n}" for name, n in result.errors.most_common()) or "none"
    print(
        f"connections: peak {connections.peak} ({by_process}),"
        f" {connections.after} a second after the load\n"
        f"accepted {result.accepted} of {result.sent} in {result.elapsed:.1f} s"
        f" = {result.rate:.0f}/s; not 201: {refused}",
        flush=True,
    )
    return connections, result


def server_setup(text: str) -> str:
    if text != RUNSERVER:
        ServerConfig.parse(text)  # refuses a typo before any work
    return text


def environment_pair(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: use NAME=VALUE")
    return name, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server",
        type=server_setup,
        action="append",
        default=[],
        help=f"{RUNSERVER}, sync:WORKERS or gthread:WORKERSxTHREADS (default: all of "
        f"{', '.join(DEFAULT_SERVERS)})",
    )
    parser.add_argument("--env", type=environment_pair, action="append", default=[],
                        help="NAME=VALUE for every process's environment (repeatable)")  # fmt: skip
    parser.add_argument("--workers", action="store_true", help="also a dispatcher and qcluster")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--messages", type=int, default=3000, help="requests at most")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds at most")
    parser.add_argument("--keep-alive", action="store_true", help="reuse each TCP connection")
    parser.add_argument("--connection-limit", type=int, default=50, help="of the bench's role")
    args = parser.parse_args()
    setups = args.server or DEFAULT_SERVERS
    settings = " ".join(f"{name}={value}" for name, value in args.env) or "the defaults"
    reuse = "keep-alive" if args.keep_alive else "a TCP connection per request"
    print(f"connections benchmark, {machine()}")
    print(
        f"{args.clients} clients ({reuse}), up to {args.messages} broadcasts or"
        f" {args.duration:g} s; settings: {settings}; role limited to"
        f" {args.connection_limit} connections"
    )
    results = [(setup, *run(setup, args)) for setup in setups]
    print("\nserver             peak  server  after  not 201  accepted/s")
    for setup, connections, result in results:
        print(
            f"{setup:17} {connections.peak:5} {connections.peaks[SERVER]:7}"
            f" {connections.after:6} {sum(result.errors.values()):8} {result.rate:11.0f}"
        )


if __name__ == "__main__":
    main()
