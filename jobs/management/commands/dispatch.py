from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from prometheus_client import start_http_server

from broker.conf import broker_settings
from jobs.dispatch import Dispatcher, DispatcherConfig
from jobs.dispatch_threads import BrokenDatabase
from jobs.health import DEFAULT_STALE_AFTER_SECONDS, HealthServer, start_health_server
from jobs.queue import Listener


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """BROKER_DISPATCH_EVENT_LOOP's loop; None for asyncio's own."""
    if broker_settings.BROKER_DISPATCH_EVENT_LOOP == "uvloop":
        # libuv's loop, for trying it: asyncio's own work (selector, callbacks, transports) is a
        # fifth of the dispatcher's CPU, but the drain measured no steady gain from uvloop
        # (docs/performance-history.md "Delivery: the event loop (issue 18)").
        import uvloop  # not on Windows: BROKER_DISPATCH_EVENT_LOOP=asyncio there

        return uvloop.new_event_loop
    return None


class Command(BaseCommand):
    help = "Deliver push jobs (run any number, anywhere, against one database). SIGTERM: graceful."

    def add_arguments(self, parser: CommandParser) -> None:
        defaults = DispatcherConfig()
        parser.add_argument(
            "--concurrency",
            type=int,
            default=defaults.concurrency,
            help="deliveries in flight in this process (default: %(default)s)",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=defaults.batch_size,
            help="jobs taken per claim (default: %(default)s)",
        )
        parser.add_argument(
            "--poll-seconds",
            type=float,
            default=defaults.poll_seconds,
            help="longest idle wait when nothing wakes the dispatcher: no NOTIFY, no delivery"
            " ending (default: %(default)s)",
        )
        parser.add_argument(
            "--grace-seconds",
            type=float,
            default=defaults.grace_seconds,
            help="on SIGTERM or SIGINT, how long in-flight deliveries may finish before they are"
            " cut off (default: %(default)s)",
        )
        parser.add_argument(
            "--slow-seconds",
            type=float,
            default=defaults.slow_seconds,
            help="a consumer whose answer takes longer than this is slow: slow consumers share"
            ' --slow-share of the slots (docs/dispatcher.md, "Fair share"; default:'
            " %(default)s)",
        )
        parser.add_argument(
            "--slow-share",
            type=float,
            default=defaults.slow_share,
            help="the share of --concurrency that slow consumers hold at most, all together"
            " (default: %(default)s)",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=0,
            help="serve this dispatcher's Prometheus metrics on this port (0: off)",
        )
        parser.add_argument(
            "--metrics-address",
            default="127.0.0.1",
            help="address the metrics port listens on (default: %(default)s)",
        )
        parser.add_argument(
            "--health-port",
            type=int,
            default=0,
            help="serve GET /livez (the loop is turning) and GET /readyz (the database answers:"
            " it can claim) on this port, for container health checks (0: off; docs/deploy.md)",
        )
        parser.add_argument(
            "--health-address",
            default="127.0.0.1",
            help="address the health port listens on; 0.0.0.0 for probes from outside the"
            " container, such as Kubernetes' (default: %(default)s)",
        )
        parser.add_argument(
            "--health-stale-seconds",
            type=float,
            default=DEFAULT_STALE_AFTER_SECONDS,
            help="/livez and /readyz answer 503 once the loop has not turned, or no database step"
            " has succeeded, for this long; at least twice --poll-seconds (default: %(default)s)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        config = DispatcherConfig(
            concurrency=options["concurrency"],
            batch_size=options["batch_size"],
            poll_seconds=options["poll_seconds"],
            grace_seconds=options["grace_seconds"],
            slow_seconds=options["slow_seconds"],
            slow_share=options["slow_share"],
        )
        if not (0 < config.slow_share <= 1 and config.slow_seconds > 0):
            raise CommandError("--slow-share must be in (0, 1] and --slow-seconds above 0")
        if options["health_port"] and options["health_stale_seconds"] < 2 * config.poll_seconds:
            # Idle, or with the database down, the loop turns once per poll interval.
            raise CommandError("--health-stale-seconds must be at least twice --poll-seconds")
        if options["metrics_port"]:
            start_http_server(options["metrics_port"], addr=options["metrics_address"])
        dispatcher = Dispatcher(config)
        health = self._serve_health(dispatcher, options) if options["health_port"] else None
        self.stdout.write(f"dispatcher {config.dispatcher_id} starting")
        try:
            with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
                runner.run(self._run(dispatcher))
        except BrokenDatabase as exc:
            # The one way a dispatcher ends on its own: no delivery's failure ends it.
            raise CommandError(f"dispatcher {config.dispatcher_id} stopped: {exc}") from exc
        finally:
            if health:
                health.shutdown()
                health.server_close()
        self.stdout.write(f"dispatcher {config.dispatcher_id} stopped")

    def _serve_health(self, dispatcher: Dispatcher, options: dict[str, Any]) -> HealthServer:
        address, port = options["health_address"], options["health_port"]
        try:
            server = start_health_server(
                dispatcher.health, port, address, options["health_stale_seconds"]
            )
        except OSError as exc:
            raise CommandError(f"cannot serve health checks on {address}:{port}: {exc}") from exc
        self.stdout.write(f"health checks on http://{address}:{port}/livez and /readyz")
        return server

    async def _run(self, dispatcher: Dispatcher) -> None:
        loop = asyncio.get_running_loop()
        loop_name = type(loop).__module__.split(".")[0]
        self.stdout.write(f"event loop: {loop_name}")
        for stop_signal in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(stop_signal, dispatcher.stop)
        # The LISTEN connection, and the guard the dispatcher holds there while it is idle.
        dispatcher.idle.listener = Listener(dispatcher.wake, dispatcher.config.dispatcher_id)
        listening = asyncio.create_task(dispatcher.idle.listener.run())
        try:
            await dispatcher.run()
        finally:
            listening.cancel()
