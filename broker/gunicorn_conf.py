"""gunicorn's settings for the broker's web server (docs/deploy.md), wherever it runs:
`gunicorn --config python:broker.gunicorn_conf broker.wsgi` (`manage.py runbroker`, the image,
the Kubernetes example, the benchmarks).

Options on the command line and in GUNICORN_CMD_ARGS override these; WEB_CONCURRENCY (or
`--workers`) sets the worker processes, one per core. gunicorn takes the names below that are
its settings and ignores the others (`command`).
"""

from __future__ import annotations

import sys
from typing import Any

CONFIG = "python:broker.gunicorn_conf"

# Threads, not one request per process: a pull worker's long poll (`POST …/claim` with `wait`)
# holds a thread for up to 20 s, and with sync workers as many long polls as processes took the
# whole server (issue 36). A process lets fewer claims wait than it has threads
# (BROKER_PULL_WAITERS_PER_PROCESS, jobs/api/long_poll.py), so every other request finds one.
# 4: the connection pool's default size (DATABASE_POOL_MAX_SIZE), and 2 workers x 4 threads cost
# the least server CPU per broadcast of the gunicorn setups measured
# (docs/performance-history.md). The gthread worker's heartbeat comes from its main loop, so a
# long request is never taken for a hung worker (--timeout).
worker_class = "gthread"
threads = 4


def post_worker_init(worker: Any) -> None:
    """Tell the pull API, in each worker process, how many threads serve requests there and
    when the worker is stopping (gunicorn calls this once the application is loaded)."""
    from gunicorn.workers.gthread import ThreadWorker
    from gunicorn.workers.sync import SyncWorker

    from jobs.api.long_poll import served_by

    if isinstance(worker, ThreadWorker):
        served_by(worker.cfg.threads, stopping=lambda: not worker.alive)
    elif isinstance(worker, SyncWorker):  # `--worker-class sync`: one request at a time
        served_by(1, stopping=lambda: not worker.alive)


def command(bind: str, workers: int) -> list[str]:
    """The web server's command line with these settings, run by this Python."""
    gunicorn = [sys.executable, "-m", "gunicorn", "--config", CONFIG, "broker.wsgi"]
    return [*gunicorn, "--bind", bind, "--workers", str(workers)]
