"""`manage.py runbroker`: the whole broker in one command, for a first run and for development.

It migrates, makes sure there is a way to use the admin API, then starts the three processes a
broker is made of (web server, push dispatcher, housekeeping) and supervises them: their output is
shown line by line with the process's name, Ctrl-C or SIGTERM stops all of them gracefully, and
when one of them ends by itself the others are stopped too, so a half-running broker never goes
unnoticed. Production runs the same processes under its own supervisor (docs/deploy.md).

Without DATABASE_URL it first starts the embedded PostgreSQL server of postgres/ in the directory
it runs in (broker/embedded_postgres.py), gives its URL to every process, and stops it last.
"""

from __future__ import annotations

import importlib.util
import io
import os
import signal
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

import broker
from broker import gunicorn_conf
from broker.conf import broker_settings
from broker.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError
from broker.env import database_settings
from broker.models import ApiKey
from broker.supervisor import Supervisor
from broker.tokens import hash_token

# Where the first admin token is written, readable by its owner only, so that the README's quick
# start can use it: beside the default SQLite file, in the directory the broker runs in.
FIRST_TOKEN_FILE = Path(".broker-admin-token")
FIRST_KEY_NAME = "runbroker: first admin token"


class Command(BaseCommand):
    help = (
        "Run the whole broker: web server, push dispatcher and housekeeping, started together and "
        "stopped together on Ctrl-C or SIGTERM. Migrates first. Without DATABASE_URL, on the "
        "embedded PostgreSQL server of ./postgres, started first and stopped last."
    )
    # The system checks run in handle(), once the store they may need (E003) is running.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--bind", default="127.0.0.1:8000", help="address:port of the web server"
        )
        parser.add_argument(
            "--workers",
            type=int,
            default=2,
            help="gunicorn worker processes of the web server (4 threads each)",
        )
        parser.add_argument(
            "--dispatchers",
            type=int,
            default=1,
            help="push dispatcher processes (0: none; one must run somewhere: it also sweeps leases"
            " and releases scheduled messages)",
        )
        parser.add_argument(
            "--no-housekeeping",
            action="store_false",
            dest="housekeeping",
            help="do not run the housekeeping cluster (manage.py qcluster)",
        )
        parser.add_argument(
            "--stop-seconds",
            type=float,
            default=30.0,
            help="how long the processes may take to stop gracefully before they are killed",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        _require_module("gunicorn", "the web server")
        if options["housekeeping"]:
            _require_module("django_q", "housekeeping")
        # Until the supervisor takes over, SIGTERM and SIGHUP interrupt as Ctrl-C does, so that
        # the embedded server started below is stopped on the way out too.
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.default_int_handler)
        embedded = None
        try:
            embedded = start_embedded_postgres(settings.EMBEDDED_POSTGRES_DIR)
            self.check()
            self._run(options, embedded)
        except KeyboardInterrupt:
            raise CommandError("interrupted while starting", returncode=130) from None
        finally:
            if embedded is not None:
                embedded.stop()  # last: every process that used it has stopped

    def _run(self, options: dict[str, Any], embedded: EmbeddedPostgres | None) -> None:
        quiet = {"verbosity": 0, "stdout": io.StringIO()}
        call_command("migrate", interactive=False, **quiet)
        call_command("collectstatic", interactive=False, **quiet)
        if options["housekeeping"]:
            call_command("install_schedules", **quiet)
        self.stdout.write(self._banner(options["bind"], embedded))
        supervisor = Supervisor(_processes(options), self._write_line, options["stop_seconds"])
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: terminal closed
            signal.signal(signum, lambda *_: supervisor.request_stop())
        exit_code = supervisor.run()
        if exit_code:
            raise CommandError(supervisor.reason, returncode=exit_code)

    def _write_line(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()  # piped output too shows each line as it comes

    def _banner(self, bind: str, embedded: EmbeddedPostgres | None) -> str:
        base = f"http://{bind}"
        lines = [
            "",
            f"Webhook broker on {base}",
            f"  API docs   {base}/api/docs/",
            f"  Health     {base}/_status",
            f"  Operator UI {base}/ui/  (log in with a user from `manage.py createsuperuser`)",
            f"  Admin      {base}/admin/",
            f"  Admin API  {first_admin_token()}",
        ]
        if embedded is not None:
            address = embedded.url.split("@", 1)[1]  # not the password: it is in the directory
            lines.append(f"  Database   PostgreSQL on {address}, in {embedded.directory}")
        if broker_settings.BROKER_ALLOW_PRIVATE_CALLBACKS:
            lines.append(
                "  Note       BROKER_ALLOW_PRIVATE_CALLBACKS is on: callbacks may reach this "
                "machine and private networks"
            )
        return "\n".join([*lines, "Ctrl-C stops everything.", ""])


def start_embedded_postgres(directory: Path | None) -> EmbeddedPostgres | None:
    """Without DATABASE_URL (`directory` set): the embedded server started, and its URL given to
    this process's settings (nothing has connected yet) and, through the environment, to the
    processes it starts."""
    if directory is None:
        return None
    server = EmbeddedPostgres(directory)
    try:
        url = server.start()
    except EmbeddedPostgresError as exc:
        raise CommandError(f"the embedded PostgreSQL: {exc}") from None
    os.environ["DATABASE_URL"] = url
    settings.DATABASES["default"].update(database_settings(url))
    return server


def _require_module(module: str, purpose: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise CommandError(
            f"{purpose} needs the Python package {module!r}: "
            "pip install -r requirements.txt (or pip install 'webhook-broker-django[server]')"
        )


def _processes(options: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """The command lines of the broker's processes, run by this Python with these settings."""
    # They import the same `broker` package as this process, wherever it is run from.
    package_home = str(Path(broker.__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [package_home, os.environ.get("PYTHONPATH")])
    )
    django = [sys.executable, "-m", "django"]
    processes = [("web", web_command(options["bind"], options["workers"]))]
    dispatchers = options["dispatchers"]
    for number in range(1, dispatchers + 1):
        name = "dispatch" if dispatchers == 1 else f"dispatch-{number}"
        processes.append((name, [*django, "dispatch"]))
    if options["housekeeping"]:
        processes.append(("housekeeping", [*django, "qcluster"]))
    return processes


def web_command(bind: str, workers: int) -> list[str]:
    """The web server's command line, as this command runs it (and the tests of the server):
    gunicorn with the broker's settings (broker/gunicorn_conf.py)."""
    web = [*gunicorn_conf.command(bind, workers), "--graceful-timeout", "10"]
    web += ["--no-control-socket"]  # one per user's home otherwise: two runs would share it
    return web


def first_admin_token() -> str:
    """How to authenticate to the admin API, creating a first key when there is none at all.

    The key is written to FIRST_TOKEN_FILE (mode 0600) and shown once; later runs point to the
    file while its key is still valid. With keys made otherwise, nothing is created.
    """
    if broker_settings.BROKER_ADMIN_TOKENS:
        return "Bearer token: one of BROKER_ADMIN_TOKENS"
    if FIRST_TOKEN_FILE.exists():
        token = FIRST_TOKEN_FILE.read_text().strip()
        if ApiKey.objects.filter(key_hash=hash_token(token)).exists():
            return f"Bearer token: in {FIRST_TOKEN_FILE.resolve()}"
    if ApiKey.objects.exists():
        return "Bearer token: make one with `manage.py create_api_key NAME`"
    _, token = ApiKey.issue(FIRST_KEY_NAME)
    write_private_file(FIRST_TOKEN_FILE, token + "\n")
    return f"Bearer token: {token}  (saved in {FIRST_TOKEN_FILE.resolve()}, shown once)"


def write_private_file(path: Path, text: str) -> None:
    """Write a file only its owner can read, even when a file (or a link) is already there."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
