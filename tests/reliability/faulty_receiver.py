"""A webhook receiver that misbehaves on purpose, at the TCP level (issue 9's fault matrix).

tests/receiver.py answers through aiohttp, which always speaks proper HTTP; this one writes the
bytes itself, so it can hang, cut a response in the middle, trickle it byte by byte or send an
endless body. The behaviour is chosen by the request's path (`BEHAVIOURS`), or is a `Script`
given for that path (the property-based tests of hostile receivers generate them).
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\ndown"
HUGE_BODY_BYTES = 64 * 1024 * 1024
TRICKLED_BYTES = 200

Writer = asyncio.StreamWriter
Behaviour = Callable[["FaultyReceiver", Writer], Awaitable[None]]


async def answer_ok(receiver: FaultyReceiver, writer: Writer) -> None:
    writer.write(OK)


async def flap(receiver: FaultyReceiver, writer: Writer) -> None:
    """Up, 503, connection dropped, up, ... in turn, request by request."""
    turn = next(receiver.flap_turns) % 3
    if turn == 0:
        writer.write(OK)
    elif turn == 1:
        writer.write(UNAVAILABLE)
    # turn 2: close without a word


async def hang(receiver: FaultyReceiver, writer: Writer) -> None:
    """Never answer (the dispatcher's timeout must end the attempt)."""
    await asyncio.sleep(3600)


async def cut_in_status_line(receiver: FaultyReceiver, writer: Writer) -> None:
    writer.write(b"HTTP/1.1 20")


async def cut_in_body(receiver: FaultyReceiver, writer: Writer) -> None:
    """A complete 200 status and headers, then the connection drops mid-body."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly the first bytes")


async def trickle(receiver: FaultyReceiver, writer: Writer, pause: float) -> None:
    for byte in OK:
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(pause)


async def trickle_fast(receiver: FaultyReceiver, writer: Writer) -> None:
    """The whole answer within the timeout, one byte every 10 ms."""
    await trickle(receiver, writer, 0.01)


async def trickle_slow(receiver: FaultyReceiver, writer: Writer) -> None:
    """One byte every 0.5 s: the status line alone takes longer than the timeout."""
    await trickle(receiver, writer, 0.5)


async def huge_body(receiver: FaultyReceiver, writer: Writer) -> None:
    """A 200 with a 64 MiB body; the dispatcher must read only an excerpt of it."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % HUGE_BODY_BYTES)
    chunk = b"x" * (1024 * 1024)
    for _ in range(HUGE_BODY_BYTES // len(chunk)):
        writer.write(chunk)
        await writer.drain()


async def endless_body(receiver: FaultyReceiver, writer: Writer) -> None:
    """A chunked 200 body that never ends."""
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    while True:
        writer.write(b"10000\r\n" + b"y" * 0x10000 + b"\r\n")
        await writer.drain()


@dataclass(frozen=True)
class Script:
    """An answer written byte for byte, and how the connection ends."""

    answer: bytes  # status line, headers and body exactly as sent (valid HTTP or not)
    # "close": all of it, then close; "cut": the first half, then close; "reset": the first
    # half, then a TCP reset; "trickle": the first bytes one at a time, then the rest; "hang":
    # all of it, then silence.
    ending: Literal["close", "cut", "reset", "trickle", "hang"] = "close"


async def play(script: Script, writer: Writer) -> None:
    answer = script.answer
    if script.ending in ("cut", "reset"):
        answer = answer[: len(answer) // 2]
    if script.ending == "trickle":
        for byte in answer[:TRICKLED_BYTES]:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.001)
        answer = answer[TRICKLED_BYTES:]
    writer.write(answer)
    await writer.drain()
    if script.ending == "reset":
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
    elif script.ending == "hang":
        await asyncio.sleep(3600)


BEHAVIOURS: dict[str, Behaviour] = {
    "/ok": answer_ok,
    "/flap": flap,
    "/hang": hang,
    "/cut-in-status-line": cut_in_status_line,
    "/cut-in-body": cut_in_body,
    "/trickle-fast": trickle_fast,
    "/trickle-slow": trickle_slow,
    "/huge-body": huge_body,
    "/endless-body": endless_body,
}


class FaultyReceiver:
    """Serves BEHAVIOURS on 127.0.0.1 in a thread of its own; counts the requests per path."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.scripts: dict[str, Script] = {}  # answers by path, before BEHAVIOURS
        self.flap_turns = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> FaultyReceiver:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        future.result(timeout=10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        socket: Any = self._server.sockets[0]
        self.port = socket.getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        try:
            path = await read_request(reader)
            self.requests[path] += 1
            if path in self.scripts:
                await play(self.scripts[path], writer)
            else:
                await BEHAVIOURS.get(path, answer_ok)(self, writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the dispatcher gave up first: what these behaviours are for
        finally:
            writer.close()


async def read_request(reader: asyncio.StreamReader) -> str:
    """Read one request (head and Content-Length body); return its path."""
    head = await reader.readuntil(b"\r\n\r\n")
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)
    return request_line.split(" ")[1]
