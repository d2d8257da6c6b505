"""libcurl's multi interface (pycurl) driven by the running asyncio loop: the transport of
jobs/curl_delivery.py and bench/http_clients.py (measured in docs/performance-history.md,
"Delivery: HTTP clients compared (issue 18)").

libcurl does the HTTP work (connections, keep-alive, writing requests, parsing answers) in C; the
loop only watches the sockets libcurl asks it to (CURLMOPT_SOCKETFUNCTION) and its one timer
(CURLMOPT_TIMERFUNCTION), and calls `socket_action` when either fires. Python runs per request to
set the handle's options and read its status, plus a few callbacks:

* CURLOPT_OPENSOCKETFUNCTION judges every address libcurl is about to connect to, whatever
  resolved it (a name, an IP literal in any form): the address guard on the address really used,
  before any packet is sent to it. A kept-alive connection was judged when it was opened.
* CURLOPT_PREREQFUNCTION runs on the connection a request will use, just before libcurl writes
  it: the "headers were sent" signal the dispatcher needs at shutdown.
* The body excerpt reader stops the transfer after EXCERPT_BYTES (a bounded read).
* A streamed body is read from an async iterator; the read callback pauses the transfer until
  the next chunk is there, so storage I/O never blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pycurl  # type: ignore[import-untyped,import-not-found,unused-ignore]

EXCERPT_BYTES = 4096
PREREQ_OK = 0  # CURL_PREREQFUNC_OK


@dataclass
class Answer:
    """What one request ended with: a status (0: none) or libcurl's error, and what was seen."""

    status: int = 0
    # A CURLE_* code; 0 once the answer's status and headers were all read, whatever happened to
    # its body after them (cut off, too slow, or its excerpt taken): that is the answer.
    error_code: int = 0
    error: str = ""
    excerpt: bytes = b""
    header_lines: list[bytes] = field(default_factory=list)
    refused: str = ""  # an address the guard refused


class _Excerpt:
    """The bounded body reader: keeps the first EXCERPT_BYTES, then ends the transfer (libcurl
    reports CURLE_WRITE_ERROR, which `_finish` reads as "answered": the headers came first)."""

    __slots__ = ("chunks", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> int | None:
        self.chunks.append(data)
        self.size += len(data)
        return 0 if self.size > EXCERPT_BYTES else None  # 0: "wrote nothing", the transfer ends


class _Upload:
    """A request body streamed from an async iterator through libcurl's read callback."""

    def __init__(self, handle: Any, chunks: AsyncIterator[bytes]) -> None:
        self.handle, self.chunks = handle, chunks
        self.buffer = b""
        self.done = False
        self.fetching: asyncio.Task[None] | None = None

    def read(self, size: int) -> bytes | int:
        if self.buffer:
            data, self.buffer = self.buffer[:size], self.buffer[size:]
            return data
        if self.done:
            return b""
        if self.fetching is None:
            self.fetching = asyncio.get_running_loop().create_task(self._fetch())
        return int(pycurl.READFUNC_PAUSE)  # resumed by `_fetch` once the next chunk is in

    async def _fetch(self) -> None:
        try:
            self.buffer = await anext(self.chunks)
        except StopAsyncIteration:
            self.done = True
        finally:
            self.fetching = None
        with contextlib.suppress(pycurl.error):  # the transfer may have ended meanwhile
            self.handle.pause(pycurl.PAUSE_CONT)

    def cancel(self) -> None:
        if self.fetching is not None:
            self.fetching.cancel()


@dataclass
class _Pending:
    future: asyncio.Future[Answer]
    answer: Answer
    excerpt: _Excerpt
    on_sent: Callable[[], None] | None
    streamed: bool  # its handle is not reused


class CurlMulti:
    """One libcurl multi handle on the running loop, keeping up to `connections` alive.

    `allow_address(ip)` says whether a connection to `ip` may be opened (None: any). `pinned`
    names resolve to the given addresses ("host:port:address" lines, CURLOPT_RESOLVE)."""

    def __init__(
        self,
        connections: int,
        timeout: float,
        connect_timeout: float | None = None,
        allow_address: Callable[[str], bool] | None = None,
        pinned: Sequence[str] = (),
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.timeout_ms = int(timeout * 1000)
        self.connect_timeout_ms = int((connect_timeout or timeout) * 1000)
        self.allow_address = allow_address
        self.pinned = list(pinned)
        # The certificate authorities Python's ssl module trusts, SSL_CERT_FILE and SSL_CERT_DIR
        # included, rather than the paths the libcurl in pycurl's wheel was built with.
        self.trusted = ssl.get_default_verify_paths()
        self.multi = pycurl.CurlMulti()
        self.multi.setopt(pycurl.M_SOCKETFUNCTION, self._watch)
        self.multi.setopt(pycurl.M_TIMERFUNCTION, self._set_timer)
        self.multi.setopt(pycurl.M_MAXCONNECTS, connections)
        self.multi.setopt(pycurl.M_MAX_TOTAL_CONNECTIONS, connections)
        self._timer: asyncio.Handle | None = None
        self._timer_soon = False  # `_timer` is a call_soon
        self._watched: dict[int, int] = {}  # fd: the POLL_IN and POLL_OUT bits the loop watches
        self._idle: list[Any] = []
        self._pending: dict[Any, _Pending] = {}

    async def post(
        self,
        url: str,
        headers: list[str] | list[bytes],
        body: bytes,
        on_sent: Callable[[], None] | None = None,
        *,
        stream: AsyncIterator[bytes] | None = None,
        size: int = 0,
        read: Callable[[int], bytes] | None = None,
        resolve: list[str] | None = None,
        timeout: float | None = None,
    ) -> Answer:
        """POST `body` to `url` with `headers` ("Name: value" lines); never raises but when
        cancelled. With `stream` (or a blocking `read`), the body is `size` bytes from it
        instead. `resolve` pins names to addresses for this request ("host:port:address");
        `timeout` replaces the multi handle's for this request."""
        streamed = stream is not None or read is not None
        # A streamed body gets a handle of its own, closed after it: libcurl cannot be told to
        # forget a handle's POSTFIELDS, which would win over the read callback.
        handle = self._idle.pop() if self._idle and not streamed else self._new_handle()
        answer, excerpt = Answer(), _Excerpt()
        upload = _Upload(handle, stream) if stream is not None else None
        handle.setopt(pycurl.URL, url)
        handle.setopt(pycurl.HTTPHEADER, headers)
        self._set_body(handle, body, upload.read if upload else read, size)
        if resolve:  # kept by the handle and libcurl's DNS cache: for checks, not deliveries
            handle.setopt(pycurl.RESOLVE, resolve)
        handle.setopt(pycurl.WRITEFUNCTION, excerpt.write)
        handle.setopt(pycurl.HEADERFUNCTION, answer.header_lines.append)
        handle.setopt(pycurl.TIMEOUT_MS, int(timeout * 1000) if timeout else self.timeout_ms)
        future: asyncio.Future[Answer] = self.loop.create_future()
        self._pending[handle] = _Pending(future, answer, excerpt, on_sent, streamed)
        self.multi.add_handle(handle)
        try:
            return await future
        finally:
            if upload is not None:
                upload.cancel()
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

    def _new_handle(self) -> Any:
        handle = pycurl.Curl()
        handle.setopt(pycurl.NOSIGNAL, 1)
        handle.setopt(pycurl.FOLLOWLOCATION, 0)  # a 3xx is an answer, never a new destination
        handle.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        handle.setopt(pycurl.NOPROXY, "*")  # a proxy would resolve names out of the guard's sight
        handle.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        handle.setopt(pycurl.TIMEOUT_MS, self.timeout_ms)
        handle.setopt(pycurl.CONNECTTIMEOUT_MS, self.connect_timeout_ms)
        if self.trusted.cafile:
            handle.setopt(pycurl.CAINFO, self.trusted.cafile)
        if self.trusted.capath:
            handle.setopt(pycurl.CAPATH, self.trusted.capath)
        if self.pinned:
            handle.setopt(pycurl.RESOLVE, self.pinned)
        # Set once per handle: they find the request they serve in `_pending`.
        handle.setopt(pycurl.PREREQFUNCTION, lambda *_: self._sending(handle))
        if self.allow_address is not None:
            handle.setopt(pycurl.OPENSOCKETFUNCTION, lambda _, address: self._open(handle, address))
        return handle

    @staticmethod
    def _set_body(
        handle: Any, body: bytes, read: Callable[[int], bytes | int] | None, size: int
    ) -> None:
        if read is None:
            handle.setopt(pycurl.POSTFIELDS, body)
            return
        handle.setopt(pycurl.POST, 1)
        handle.setopt(pycurl.READFUNCTION, read)
        handle.setopt(pycurl.POSTFIELDSIZE_LARGE, size)

    def _sending(self, handle: Any) -> int:
        """CURLOPT_PREREQFUNCTION: the connection is ready and the request is written next."""
        pending = self._pending[handle]
        if pending.on_sent is not None:
            pending.on_sent()
        return PREREQ_OK

    def _open(self, handle: Any, address: Any) -> socket.socket | None:
        """CURLOPT_OPENSOCKETFUNCTION: a socket for `address`, or None when it is refused."""
        ip = address.addr[0]
        if self.allow_address is None or self.allow_address(ip):
            return socket.socket(address.family, address.socktype, address.protocol)
        self._pending[handle].answer.refused = ip
        return None  # CURL_SOCKET_BAD: libcurl tries the next address, or fails to connect

    # --- the loop's side: sockets, the timer, finished transfers -----------------------------

    def _watch(self, what: int, fd: int, multi: object, data: object) -> None:
        # Only what changed goes to the loop: asyncio's add and remove calls are the dearest
        # part of driving libcurl (a selector lookup and an epoll_ctl each), and libcurl
        # reports every socket's wishes at each step of every request.
        wanted = 0 if what == pycurl.POLL_REMOVE else what
        had = self._watched.pop(fd, 0)
        if wanted:
            self._watched[fd] = wanted
        changed = had ^ wanted
        if changed & pycurl.POLL_IN:
            if wanted & pycurl.POLL_IN:
                self.loop.add_reader(fd, self._act, fd, pycurl.CSELECT_IN)
            else:
                self.loop.remove_reader(fd)
        if changed & pycurl.POLL_OUT:
            if wanted & pycurl.POLL_OUT:
                self.loop.add_writer(fd, self._act, fd, pycurl.CSELECT_OUT)
            else:
                self.loop.remove_writer(fd)

    def _set_timer(self, milliseconds: int) -> None:
        # Called from inside socket_action: only schedule, never act here. libcurl asks for "at
        # once" on every new request: call_soon, which costs no timer heap entry, and one
        # pending "at once" serves every request added before it runs. -1: no timer.
        if milliseconds == 0 and self._timer is not None and self._timer_soon:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_soon = milliseconds == 0
        if milliseconds == 0:
            self._timer = self.loop.call_soon(self._on_timer)
        elif milliseconds > 0:
            self._timer = self.loop.call_later(milliseconds / 1000, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._act(pycurl.SOCKET_TIMEOUT, 0)

    def _act(self, fd: int, events: int) -> None:
        self.multi.socket_action(fd, events)
        while True:
            queued, succeeded, failed = self.multi.info_read()
            for handle in succeeded:
                self._finish(handle, 0, "")
            for handle, code, message in failed:
                self._finish(handle, code, message)
            if not queued:
                return

    def _finish(self, handle: Any, code: int, message: str) -> None:
        self.multi.remove_handle(handle)
        pending = self._pending.pop(handle)
        answer, future = pending.answer, pending.future
        answer.status = handle.getinfo(pycurl.RESPONSE_CODE)
        answer.excerpt = b"".join(pending.excerpt.chunks)[:EXCERPT_BYTES]
        if code and not _headers_read(answer):
            answer.error_code, answer.error = code, message
        if pending.streamed:
            handle.close()
        else:
            self._idle.append(handle)
        if not future.done():
            future.set_result(answer)


def _headers_read(answer: Answer) -> bool:
    """Whether a final status line and the blank line after its headers arrived."""
    lines = answer.header_lines
    return answer.status >= 200 and (b"\r\n" in lines or b"\n" in lines)
