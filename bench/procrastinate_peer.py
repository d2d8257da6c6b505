"""A peer of bench/dispatch.py: procrastinate, the PostgreSQL-native task queue, + requests.

One job per webhook (bench/peer_task.py's POST), retried by a retry strategy with the Celery
peer's schedule on a connection error, a timeout or a non-2xx answer, and on nothing else. The
queue lives in a database of its own on the bench's PostgreSQL server, `bench_procrastinate`
(created with procrastinate's schema and dropped by the bench), whose jobs table is analyzed
once the jobs are deferred. procrastinate's defaults otherwise: LISTEN/NOTIFY for new jobs,
finished jobs kept in `procrastinate_jobs`.

Its workers are single processes running one job at a time (`--concurrency 1`: requests blocks,
and procrastinate runs a synchronous task in a thread); the bench runs as many as the run has
dispatchers, forked from one process that imported everything first, as Celery's prefork pool
does, so that no worker's start-up runs while the others deliver:

    cd bench && ../.venv/bin/python procrastinate_peer.py 2     # two workers until SIGTERM

Needs `pip install -r bench/requirements.txt`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import procrastinate  # type: ignore[import-not-found,unused-ignore]
import psycopg
from peer_task import MAX_RETRIES, DeliveryFailed, post_webhook, retry_countdown

if TYPE_CHECKING:
    from dispatch_harness import Webhook

DATABASE = "bench_procrastinate"
CONNINFO = os.environ.get(
    "BENCH_PROCRASTINATE_DATABASE_URL", f"postgresql://postgres@127.0.0.1:5432/{DATABASE}"
)
QUEUE = "bench_dispatch"
DEFER_BATCH = 1000  # jobs per batch_defer call (one INSERT statement each)


class CeleryLikeRetry(procrastinate.BaseRetryStrategy):  # type: ignore[misc,unused-ignore]
    """Retry a failed delivery MAX_RETRIES times at most, after retry_countdown(n) seconds."""

    def get_retry_decision(
        self, *, exception: BaseException, job: procrastinate.jobs.Job
    ) -> procrastinate.RetryDecision | None:
        if job.attempts >= MAX_RETRIES or not isinstance(exception, DeliveryFailed):
            return None
        return procrastinate.RetryDecision(retry_in={"seconds": retry_countdown(job.attempts)})


app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=CONNINFO))


@app.task(name="send_webhook", queue=QUEUE, retry=CeleryLikeRetry())  # type: ignore[untyped-decorator,unused-ignore]
def send_webhook(url: str, body: str, headers: dict[str, str]) -> None:
    post_webhook(url, body, headers)


def run_workers(processes: int) -> None:
    """Fork `processes` workers and wait for them; SIGTERM and SIGINT are passed on to them."""
    children: list[int] = []

    def pass_on(signum: int, _frame: Any) -> None:
        for child in children:
            os.kill(child, signum)

    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, pass_on)
    for number in range(processes):
        child = os.fork()
        if child == 0:
            for stop_signal in (signal.SIGTERM, signal.SIGINT):
                signal.signal(stop_signal, signal.SIG_DFL)  # the worker installs its own
            app.run_worker(queues=[QUEUE], concurrency=1, name=f"bench-{number}")
            os._exit(0)
        children.append(child)
    for child in children:
        os.waitpid(child, 0)


class ProcrastinatePeer:
    """The bench's side: the database and its schema, the deferred jobs, the workers."""

    name = "procrastinate"
    broker = "database"
    database: str | None = DATABASE

    def label(self, processes: int) -> str:
        return f"procrastinate {version('procrastinate')} + requests, {processes} worker(s)"

    @staticmethod
    def unavailable() -> str | None:
        return None  # imported: installed; the bench's PostgreSQL is there

    @staticmethod
    def open() -> None:
        from dispatch_harness import create_database

        logging.getLogger("procrastinate").setLevel(logging.WARNING)  # not a line per batch
        create_database(DATABASE)
        with app.open():
            app.schema_manager.apply_schema()

    @staticmethod
    def close() -> None:
        from dispatch_harness import drop_database

        drop_database(DATABASE)

    @staticmethod
    def enqueue(webhooks: list[Webhook]) -> None:
        jobs: list[dict[str, Any]] = [
            {"url": w.url, "body": w.body, "headers": w.headers("bench-procrastinate/1")}
            for w in webhooks
        ]
        with app.open():
            for start in range(0, len(jobs), DEFER_BATCH):
                send_webhook.batch_defer(*jobs[start : start + DEFER_BATCH])
        # What autovacuum would do after such an insert (this server runs without it): without
        # statistics the fetch read and sorted every queued job, 7.9 ms against 0.3 ms with
        # 2,500 queued (EXPLAIN ANALYZE).
        with psycopg.connect(CONNINFO, autocommit=True) as connection:
            connection.execute("ANALYZE procrastinate_jobs")

    @staticmethod
    def start(processes: int, log: Path) -> subprocess.Popen[bytes]:
        from dispatch_harness import BENCH, start_process

        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        command = [sys.executable, str(BENCH / "procrastinate_peer.py"), str(processes)]
        return start_process(command, log, env, cwd=BENCH)


if __name__ == "__main__":
    run_workers(int(sys.argv[1]))
