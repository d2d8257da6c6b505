"""The fast webhook receiver of bench/dispatch.py, run as a process of its own.

It answers every POST on its delivery port with 200 (or `--status`; after `--delay-ms`, if given)
and counts the requests per job: the `X-Broker-Message-ID` and `X-Broker-Consumer-ID` headers name
one job, so a count above one is a duplicate delivery. It records `time.time()` at each job's first
arrival for the latency figures. The counts are served as JSON on a separate control port, so that
several receiver processes can share the delivery port (SO_REUSEPORT) and still be asked one by
one:

    GET  /summary   {"requests": n, "jobs": distinct jobs}
    GET  /stats     {"requests": n, "jobs": {"<message ID> <consumer ID>": [count, first arrival]}}
    POST /reset     forget everything

    .venv/bin/python bench/webhook_sink.py --port 8001 --control-port 8002 [--delay-ms 200]
        [--status 503]

It listens on 127.0.0.1 only and runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time

from aiohttp import web

HOST = "127.0.0.1"


class Sink:
    def __init__(self, delay: float, status: int = 200) -> None:
        self.delay = delay
        self.status = status
        self.requests = 0
        self.jobs: dict[str, list[float]] = {}  # job -> [count, first arrival]

    async def deliver(self, request: web.BaseRequest) -> web.StreamResponse:
        arrived = time.time()
        await request.read()
        headers = request.headers
        job = f"{headers.get('X-Broker-Message-ID', '')} {headers.get('X-Broker-Consumer-ID', '')}"
        self.requests += 1
        seen = self.jobs.get(job)
        if seen is None:
            self.jobs[job] = [1, arrived]
        else:
            seen[0] += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(text="ok", status=self.status)

    async def summary(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": self.requests, "jobs": len(self.jobs)})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": self.requests, "jobs": self.jobs})

    async def reset(self, request: web.Request) -> web.Response:
        self.requests, self.jobs = 0, {}
        return web.json_response({"requests": 0, "jobs": 0})


async def serve(port: int, control_port: int, delay: float, status: int) -> None:
    sink = Sink(delay, status)
    # The low-level server: no router or middleware between the socket and the handler.
    delivery = web.ServerRunner(web.Server(sink.deliver), access_log=None)
    control_app = web.Application()
    control_app.router.add_get("/summary", sink.summary)
    control_app.router.add_get("/stats", sink.stats)
    control_app.router.add_post("/reset", sink.reset)
    control = web.AppRunner(control_app, access_log=None)
    for runner in (delivery, control):
        await runner.setup()
    await web.TCPSite(delivery, HOST, port, reuse_port=True, backlog=1024).start()
    await web.TCPSite(control, HOST, control_port).start()
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(stop_signal, stopped.set)
    await stopped.wait()
    for runner in (delivery, control):
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="delivery port (shareable)")
    parser.add_argument("--control-port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="wait before answering")
    # bench/isolation.py's consumers that fail after a while (503: unavailable, as the circuit
    # breaker counts it), so that their outcomes are recorded when it chooses.
    parser.add_argument("--status", type=int, default=200, help="the status of every answer")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.control_port, args.delay_ms / 1000, args.status))


if __name__ == "__main__":
    main()
