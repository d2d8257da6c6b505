"""A real webhook receiver on 127.0.0.1 for delivery tests: records requests, answers as told."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: datetime = field(default_factory=lambda: datetime.now(UTC))  # when it arrived


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    delay: float = 0.0  # seconds before answering


STOP_GRACE_SECONDS = 1.0


class Receiver:
    """Answers each path with its Reply (default 200) and keeps every request it got."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls  # serves HTTPS with it when set
        self.replies: dict[str, Reply] = {}
        # Decides per request when set (None: fall back to `replies`); runs on the receiver's loop.
        self.rule: Callable[[Received], Reply | None] | None = None
        self.received: list[Received] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def url(self, path: str = "/hook") -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"

    def start(self) -> Receiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        if self._runner:
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def paths(self) -> list[str]:
        return [request.path for request in self.received]

    async def _close(self) -> None:
        assert self._runner
        await self._runner.cleanup()
        # The answers cut off at the grace's end end here, not as tasks destroyed pending.
        cut_off = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in cut_off:
            task.cancel()
        await asyncio.gather(*cut_off, return_exceptions=True)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # At stop, answers still held back (a Reply's delay) get a second, then are cut off: the
        # test is over, and waiting them out cost seconds of every slow receiver's teardown.
        self._runner = web.AppRunner(app, shutdown_timeout=STOP_GRACE_SECONDS)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls)
        await site.start()
        server: Any = site._server  # the only way to learn the chosen port
        self.port = server.sockets[0].getsockname()[1]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        received = Received(request.path, dict(request.headers), body)
        self.received.append(received)
        reply = (self.rule and self.rule(received)) or self.replies.get(request.path, Reply())
        if reply.delay:
            await asyncio.sleep(reply.delay)
        return web.Response(status=reply.status, headers=reply.headers, body=reply.body)
