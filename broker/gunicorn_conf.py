"""gunicorn's settings for the broker's web server (docs/deploy.md), wherever it runs:
`gunicorn --config python:broker.gunicorn_conf broker.wsgi` (`manage.py runbroker`, the image,
the Kubernetes example, the benchmarks).

Options on the command line and in GUNICORN_CMD_ARGS override these; WEB_CONCURRENCY (or
`--workers`) sets the worker processes, one per core. gunicorn takes the names below that are
its settings and ignores the others (`command`). Its answers to requests it refuses itself are
JSON, as the API's (`answer_own_errors_in_json`).
"""

from __future__ import annotations

import json
import sys
from http import HTTPStatus
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
    when the worker is stopping, and make the worker's own error answers JSON (gunicorn calls
    this once the application is loaded)."""
    from gunicorn.workers.gthread import ThreadWorker
    from gunicorn.workers.sync import SyncWorker

    from jobs.api.long_poll import served_by

    if isinstance(worker, ThreadWorker):
        served_by(worker.cfg.threads, stopping=lambda: not worker.alive)
    elif isinstance(worker, SyncWorker):  # `--worker-class sync`: one request at a time
        served_by(1, stopping=lambda: not worker.alive)
    answer_own_errors_in_json(worker.cfg)


def answer_own_errors_in_json(cfg: Any) -> None:
    """Make gunicorn's own answers (a request it refuses before Django sees it: headers or a
    request line over its limits, malformed HTTP) JSON in the API's error shape, not HTML.

    gunicorn writes every one of them through `gunicorn.util.write_error(sock, status, reason,
    message)` and has no setting for their format. Replacing that one function, rather than the
    worker's `handle_error`, leaves gunicorn its choice of status, its log line and its access log
    entry, for every worker class; tests/reliability/test_gunicorn_errors.py holds it to this.
    """
    from gunicorn import util

    def write_json_error(sock: Any, status: int, reason: str, message: str) -> None:
        body = json.dumps({"Error": gunicorn_error_message(cfg, status, reason, message)})
        head = (
            f"HTTP/1.1 {status} {_phrase(status, reason)}\r\n"
            "Connection: close\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        util.write_nonblock(sock, (head + body).encode("ascii"))  # json.dumps escapes to ASCII

    util.write_error = write_json_error


def gunicorn_error_message(cfg: Any, status: int, reason: str, message: str) -> str:
    """The `Error` of one of gunicorn's own answers: for the two limits a client can run into by
    itself, which one and its value (none when set to 0: gunicorn's own maximum); gunicorn's
    reason and words otherwise."""
    if status == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
        fields, size = cfg.limit_request_fields, cfg.limit_request_field_size
        limits = (
            f": at most {fields:,} fields of at most {size:,} bytes each, name and value included"
            if fields and size
            else ""
        )
        return f"The request's header fields are too large{limits}."
    if status == HTTPStatus.REQUEST_URI_TOO_LONG:
        line = cfg.limit_request_line
        limit = f": at most {line:,} bytes" if line else ""
        return (
            f"The request line (method, path with query string, HTTP version) is too long{limit}."
        )
    if status >= HTTPStatus.INTERNAL_SERVER_ERROR and not message:
        return "Internal error; it has been logged."  # as the API's own 500
    # A refused request's words quote it (a header's name, the method): shown, bounded.
    return f"{reason}: {message[:300]}" if message else reason


def _phrase(status: int, reason: str) -> str:
    """The status line's reason: the standard one (gunicorn answers 501 "Bad Request")."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return reason


def command(bind: str, workers: int) -> list[str]:
    """The web server's command line with these settings, run by this Python."""
    gunicorn = [sys.executable, "-m", "gunicorn", "--config", CONFIG, "broker.wsgi"]
    return [*gunicorn, "--bind", bind, "--workers", str(workers)]
