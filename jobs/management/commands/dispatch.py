from __future__ import annotations

import asyncio
import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from prometheus_client import start_http_server

from jobs.dispatch import BrokenDatabase, Dispatcher, DispatcherConfig
from jobs.wakeup import listen_for_jobs


class Command(BaseCommand):
    help = "Deliver push jobs (run any number, anywhere, against one database). SIGTERM: graceful."

    def add_arguments(self, parser: CommandParser) -> None:
        defaults = DispatcherConfig()
        parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
        parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
        parser.add_argument("--poll-seconds", type=float, default=defaults.poll_seconds)
        parser.add_argument("--grace-seconds", type=float, default=defaults.grace_seconds)
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=0,
            help="serve this dispatcher's Prometheus metrics on this port (0: off)",
        )
        parser.add_argument("--metrics-address", default="127.0.0.1")

    def handle(self, *args: Any, **options: Any) -> None:
        config = DispatcherConfig(
            concurrency=options["concurrency"],
            batch_size=options["batch_size"],
            poll_seconds=options["poll_seconds"],
            grace_seconds=options["grace_seconds"],
        )
        if options["metrics_port"]:
            start_http_server(options["metrics_port"], addr=options["metrics_address"])
        self.stdout.write(f"dispatcher {config.dispatcher_id} starting")
        try:
            asyncio.run(self._run(Dispatcher(config)))
        except BrokenDatabase as exc:
            # The one way a dispatcher ends on its own: no delivery's failure ends it.
            raise CommandError(f"dispatcher {config.dispatcher_id} stopped: {exc}") from exc
        self.stdout.write(f"dispatcher {config.dispatcher_id} stopped")

    async def _run(self, dispatcher: Dispatcher) -> None:
        loop = asyncio.get_running_loop()
        for stop_signal in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(stop_signal, dispatcher.stop)
        listener = None
        if connection.vendor == "postgresql":  # SQLite: polling only
            listener = asyncio.create_task(listen_for_jobs(dispatcher.wake))
        try:
            await dispatcher.run()
        finally:
            if listener:
                listener.cancel()
