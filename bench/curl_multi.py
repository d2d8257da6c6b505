"""libcurl's multi interface (pycurl) driven by an asyncio loop, for bench/http_clients.py.

libcurl does the HTTP work (connections, keep-alive, request writing, response parsing) in C; the
loop only watches the sockets libcurl asks it to watch (CURLMOPT_SOCKETFUNCTION) and its one timer
(CURLMOPT_TIMERFUNCTION), and calls `socket_action` when either fires. Python runs per request to
set the handle's options and to read its status when it finishes, plus a few callbacks: the body
excerpt, the header lines, and CURLOPT_PREREQFUNCTION, which libcurl calls on the connection it
will use just before it writes the request (the dispatcher's "headers were sent" signal).

A bench prototype, not the broker's sender: see docs/performance.md, "Delivery: HTTP clients
compared (issue 18)", for what it would take to make one of it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pycurl  # type: ignore[import-untyped,import-not-found,unused-ignore]

EXCERPT_BYTES = 4096
PREREQ_OK = 0  # CURL_PREREQFUNC_OK
PREREQ_ABORT = 1  # CURL_PREREQFUNC_ABORT


@dataclass
class Answer:
    """What one request ended with: a status (0: none), or libcurl's error."""

    status: int = 0
    error_code: int = 0
    error: str = ""
    excerpt: bytes = b""
    header_lines: list[bytes] = field(default_factory=list)
    sent: bool = False  # the PREREQ callback ran: the request went to the wire


class _Excerpt:
    """A bounded body reader: keeps the first EXCERPT_BYTES, then stops the transfer (libcurl
    then reports CURLE_WRITE_ERROR, which `CurlMulti` reads as "answered, excerpt cut")."""

    __slots__ = ("chunks", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> int | None:
        self.chunks.append(data)
        self.size += len(data)
        return 0 if self.size > EXCERPT_BYTES else None  # 0: "wrote nothing", the transfer ends


class CurlMulti:
    """One libcurl multi handle on the running loop, with a keep-alive cache of `connections`."""

    def __init__(
        self,
        connections: int,
        timeout: float,
        connect_timeout: float = 5.0,
        allow_address: Callable[[str], bool] | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        # Judges the address of every connection libcurl opens, before it connects: the address
        # guard on the address actually used, whatever resolved it (CURLOPT_OPENSOCKETFUNCTION).
        self.allow_address = allow_address
        self.timeout_ms = int(timeout * 1000)
        self.connect_timeout_ms = int(connect_timeout * 1000)
        self.multi = pycurl.CurlMulti()
        self.multi.setopt(pycurl.M_SOCKETFUNCTION, self._watch)
        self.multi.setopt(pycurl.M_TIMERFUNCTION, self._set_timer)
        self.multi.setopt(pycurl.M_MAXCONNECTS, connections)
        self.multi.setopt(pycurl.M_MAX_TOTAL_CONNECTIONS, connections)
        self._timer: asyncio.TimerHandle | None = None
        self._idle: list[pycurl.Curl] = []
        self._pending: dict[pycurl.Curl, tuple[asyncio.Future[Answer], Answer, _Excerpt]] = {}

    async def post(
        self,
        url: str,
        headers: list[str],
        body: bytes,
        on_sent: Callable[[], None] | None = None,
        *,
        read: Callable[[int], bytes] | None = None,
        size: int = 0,
        resolve: list[str] | None = None,
    ) -> Answer:
        """POST `body` to `url` with `headers` ("Name: value" lines); never raises.

        With `read`, the body is `size` bytes streamed from it instead (a file's `read`).
        `resolve` pins names to addresses for this request ("host:port:address" entries).
        """
        handle = self._idle.pop() if self._idle else self._new_handle()
        answer, excerpt = Answer(), _Excerpt()

        def prereq(primary_ip: str, local_ip: str, primary_port: int, local_port: int) -> int:
            answer.sent = True
            if on_sent is not None:
                on_sent()
            return PREREQ_OK

        handle.setopt(pycurl.URL, url)
        handle.setopt(pycurl.HTTPHEADER, headers)
        if read is None:
            handle.setopt(pycurl.POSTFIELDS, body)
        else:
            handle.setopt(pycurl.POST, 1)
            handle.setopt(pycurl.READFUNCTION, read)
            handle.setopt(pycurl.POSTFIELDSIZE_LARGE, size)
        if resolve is not None:
            handle.setopt(pycurl.RESOLVE, resolve)
        handle.setopt(pycurl.WRITEFUNCTION, excerpt.write)
        handle.setopt(pycurl.HEADERFUNCTION, answer.header_lines.append)
        handle.setopt(pycurl.PREREQFUNCTION, prereq)
        future: asyncio.Future[Answer] = self.loop.create_future()
        self._pending[handle] = (future, answer, excerpt)
        self.multi.add_handle(handle)
        try:
            return await future
        finally:
            # Cancelled before libcurl finished: take the handle off the multi handle. (Once
            # finished, the handle may already be another request's: only our future says.)
            if not future.done() or future.cancelled():
                del self._pending[handle]
                self.multi.remove_handle(handle)
                handle.close()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for handle in [*self._pending, *self._idle]:
            handle.close()
        self.multi.close()

    def _new_handle(self) -> pycurl.Curl:
        handle = pycurl.Curl()
        handle.setopt(pycurl.NOSIGNAL, 1)
        handle.setopt(pycurl.FOLLOWLOCATION, 0)  # a 3xx is an answer, never a new destination
        handle.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        handle.setopt(pycurl.NOPROXY, "*")  # no proxy from the environment
        handle.setopt(pycurl.TIMEOUT_MS, self.timeout_ms)
        handle.setopt(pycurl.CONNECTTIMEOUT_MS, self.connect_timeout_ms)
        handle.setopt(pycurl.ACCEPT_ENCODING, None)  # read as sent: no decompression
        if self.allow_address is not None:
            handle.setopt(pycurl.OPENSOCKETFUNCTION, self._open_socket)
        return handle

    def _open_socket(self, purpose: int, address: Any) -> socket.socket | None:
        host = address.addr[0]
        if self.allow_address is None or self.allow_address(host):
            return socket.socket(address.family, address.socktype, address.protocol)
        return None  # CURL_SOCKET_BAD: libcurl reports "could not connect"

    # --- the loop's side: sockets, the timer, finished transfers -----------------------------

    def _watch(self, what: int, fd: int, multi: object, data: object) -> None:
        loop = self.loop
        if what == pycurl.POLL_REMOVE or what & pycurl.POLL_IN == 0:
            loop.remove_reader(fd)
        if what == pycurl.POLL_REMOVE or what & pycurl.POLL_OUT == 0:
            loop.remove_writer(fd)
        if what != pycurl.POLL_REMOVE:
            if what & pycurl.POLL_IN:
                loop.add_reader(fd, self._act, fd, pycurl.CSELECT_IN)
            if what & pycurl.POLL_OUT:
                loop.add_writer(fd, self._act, fd, pycurl.CSELECT_OUT)

    def _set_timer(self, milliseconds: int) -> None:
        # Called from inside socket_action: only schedule, never act here.
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if milliseconds >= 0:
            self._timer = self.loop.call_later(
                milliseconds / 1000, self._act, pycurl.SOCKET_TIMEOUT, 0
            )

    def _act(self, fd: int, events: int) -> None:
        self.multi.socket_action(fd, events)
        self._collect()

    def _collect(self) -> None:
        while True:
            queued, succeeded, failed = self.multi.info_read()
            for handle in succeeded:
                self._finish(handle, 0, "")
            for handle, code, message in failed:
                self._finish(handle, code, message)
            if not queued:
                return

    def _finish(self, handle: pycurl.Curl, code: int, message: str) -> None:
        self.multi.remove_handle(handle)
        future, answer, excerpt = self._pending.pop(handle)
        answer.status = handle.getinfo(pycurl.RESPONSE_CODE)
        answer.excerpt = b"".join(excerpt.chunks)[:EXCERPT_BYTES]
        if code and not (code == pycurl.E_WRITE_ERROR and answer.status):
            answer.error_code, answer.error = code, message
        self._idle.append(handle)
        if not future.done():
            future.set_result(answer)
