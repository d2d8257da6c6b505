"""Shares of the broadcast server's CPU by step, from the py-spy raw profile `bench/ingest.py
--profile FILE` records, as docs/performance-history.md ("Ingest: broadcast throughput") reports
them.

Each stack counts for the first step whose rule matches it, so the steps go from the innermost
(the statement, the token check) to the outermost (the HTTP server); samples of start-up (imports,
loading the application) and of waits (`WAITS`) are left out. `bench/ingest.py --profile` samples
with `--gil` (only threads holding the GIL), so the shares are of the server's Python CPU.

    .venv/bin/python bench/ingest.py --profile ingest_profile.txt --no-pgbench
    .venv/bin/python bench/ingest_profile.py ingest_profile.txt
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from pyspy_shares import print_shares, shares

MIDDLEWARE_FILES = (
    "broker/request_ids.py",
    "broker/gateway_auth.py",
    "broker/ui/csp.py",
    "broker/api/errors.py",
    "whitenoise/",
    "django/middleware/",
    "django/contrib/sessions/middleware",
    "django/contrib/auth/middleware",
    "django/contrib/messages/middleware",
    "django/utils/deprecation.py",  # MiddlewareMixin.__call__
)


def _any(*parts: str) -> Callable[[str], bool]:
    return lambda stack: any(part in stack for part in parts)


STEPS: list[tuple[str, Callable[[str], bool]]] = [
    ("access log (the broker.access line, logging handlers)", _any("log_access (", "logging/")),
    (
        "connection: pool checkout and return, health check",
        _any(
            "psycopg_pool/",
            "ensure_connection (",
            "close_old_connections (",
            "close_if_unusable_or_obsolete (",
        ),
    ),
    ("token check: the hashes query (psycopg)", _any("_stored_credentials (")),
    ("token check: hashing and comparing the tokens", _any("broker/api/tokens.py")),
    ("rate limit", _any("broker/ratelimit.py")),
    ("publish statement (psycopg: bind, send, wait, rows)", _any("jobs/queue/")),
    ("publish(): validation, encoding", _any("broker/publishing.py", "broker/scheduling.py")),
    ("view: headers, body, response", _any("broker/api/broadcast.py")),
    ("Django's database layer otherwise", _any("django/db/")),
    ("DRF: request wrapping, dispatch, finalize", _any("rest_framework/")),
    ("URL resolving", _any("django/urls/")),
    ("request signals", _any("django/dispatch/")),
    ("middleware (twelve)", _any(*MIDDLEWARE_FILES)),
    ("Django handler: WSGIRequest, response, close", _any("django/")),
    ("gunicorn master (arbiter)", lambda s: "arbiter.py" in s and "workers/" not in s),
    ("HTTP server: accept, parse, write (gunicorn's Python)", _any("gunicorn/")),
    ("HTTP server: granian's WSGI glue", _any("granian/")),
]


# Innermost frames that wait rather than work: the connection pool's background threads
# (`Queue.get`, `Event.wait`) and psycopg waiting for PostgreSQL's answer. py-spy's idle test
# does not always see these as waits (without --gil); they are left out of the shares.
WAITS = ("Condition.wait (", "Event.wait (", "Queue.get (", "Connection.wait (", "wait_c (")


def is_start_up(stack: str) -> bool:
    return any(
        part in stack
        for part in ("_find_and_load", "exec_module", "load_wsgiapp", "get_wsgi_application")
    )


def is_waiting(stack: str) -> bool:
    return stack.rsplit(";", 1)[-1].startswith(WAITS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path, help="py-spy record -f raw output")
    args = parser.parse_args()
    lines = args.profile.read_text().splitlines()
    waiting = sum(
        int(line.rpartition(" ")[2]) for line in lines if is_waiting(line.rpartition(" ")[0])
    )
    print_shares(*shares(lines, STEPS, lambda stack: is_start_up(stack) or is_waiting(stack)))
    print(f"({waiting} of those left out were waits: {', '.join(WAITS)})")


if __name__ == "__main__":
    main()
