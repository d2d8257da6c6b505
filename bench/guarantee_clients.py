"""One adapter per candidate client for bench/http_guarantees.py: a POST with the options a check
needs (a pinned address, a refused address, a body from a file, a bounded read, a cut-off), done
the way that client allows, or a sentence saying that it does not.

Every adapter's `post` returns an `Attempt` and never raises; `sent` says whether the client told
us that the request went on the wire (the dispatcher's shutdown signal).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import IO, Any

EXCERPT = 4096


@dataclass
class Attempt:
    status: int = 0  # 0: no answer
    body: str = ""
    body_bytes: int = 0
    sent: bool = False
    error: str = ""


class Adapter:
    can_pin = can_guard = can_stream = can_signal = True
    pin_how = guard_how = stream_how = signal_how = ""
    cannot_pin = cannot_guard = cannot_stream = cannot_signal = ""

    def __init__(self) -> None:
        self.sent = False

    async def post(
        self,
        url: str,
        body: bytes,
        *,
        timeout: float,
        excerpt: bool = False,
        read_body: bool = False,
        pin: tuple[str, int, str] | None = None,
        refuse: str | None = None,
        file: IO[bytes] | None = None,
        cancel_after: float | None = None,
    ) -> Attempt:
        self.sent = False
        options = {"excerpt": excerpt or read_body, "pin": pin, "refuse": refuse, "file": file}
        task = asyncio.ensure_future(self.send(url, body, timeout, **options))
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            task.cancel()
        try:
            attempt = await task
        except asyncio.CancelledError:
            attempt = Attempt(error="cut off")
        except Exception as exc:
            attempt = Attempt(error=f"{type(exc).__name__}: {exc}")
        attempt.sent = self.sent
        return attempt

    def mark_sent(self) -> None:
        self.sent = True

    async def send(self, url: str, body: bytes, timeout: float, **options: Any) -> Attempt:
        raise NotImplementedError

    async def close(self) -> None:
        pass


def _file_size(file: IO[bytes]) -> int:
    return os.fstat(file.fileno()).st_size


async def _chunks(file: IO[bytes], on_first: Callable[[], None] | None) -> AsyncIterator[bytes]:
    if on_first:
        on_first()
    while chunk := await asyncio.to_thread(file.read, 256 * 1024):
        yield chunk


class Aiohttp(Adapter):
    pin_how = "a resolver of the session's connector (the broker's SafeResolver until issue 37)"
    cannot_guard = (
        "yes, by resolution: a resolver that drops non-public addresses (the broker's SafeResolver"
        " until issue 37), as aiohttp connects only to what it returned; IP literals, which skip"
        " the resolver, need a check of the URL"
    )
    can_guard = False
    stream_how = "an async generator with Content-Length"
    signal_how = "the body object's write (ReportingBody)"

    def __init__(self) -> None:
        super().__init__()
        import aiohttp
        from aiohttp.abc import AbstractResolver
        from aiohttp.payload import BytesPayload

        mark_sent = self.mark_sent

        class ReportingBody(BytesPayload):
            """A body that reports when it starts going out: aiohttp sends a request's headers
            with the first chunk of its body."""

            async def write_with_length(self, writer: Any, content_length: int | None) -> None:
                mark_sent()
                await super().write_with_length(writer, content_length)

        self.reporting_body = ReportingBody

        pins: dict[str, str] = {}

        class PinningResolver(AbstractResolver):
            async def resolve(self, host: str, port: int = 0, family: Any = 0) -> list[Any]:
                address = pins.get(host, host)
                return [{"hostname": host, "host": address, "port": port, "family": 2,
                         "proto": 0, "flags": 0}]  # fmt: skip

            async def close(self) -> None:
                pass

        self.pins = pins
        self.aiohttp = aiohttp
        connector = aiohttp.TCPConnector(limit=8, resolver=PinningResolver())
        self.session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False
        )

    async def send(self, url: str, body: bytes, timeout: float, **options: Any) -> Attempt:
        if options["pin"]:
            host, _, address = options["pin"]
            self.pins[host] = address
        file, headers = options["file"], {}
        data: Any = self.reporting_body(body)
        if file is not None:
            data, headers = _chunks(file, self.mark_sent), {"Content-Length": str(_file_size(file))}
        async with self.session.post(
            url,
            data=data,
            headers=headers,
            allow_redirects=False,
            timeout=self.aiohttp.ClientTimeout(total=timeout),
        ) as response:
            chunk = await response.content.read(EXCERPT) if options["excerpt"] else b""
            return Attempt(response.status, chunk.decode(errors="replace"), len(chunk))

    async def close(self) -> None:
        await self.session.close()


class Pycurl(Adapter):
    pin_how = "CURLOPT_RESOLVE on the request's handle"
    guard_how = "CURLOPT_OPENSOCKETFUNCTION judges each address before libcurl connects"
    stream_how = "CURLOPT_READFUNCTION with POSTFIELDSIZE_LARGE"
    signal_how = "CURLOPT_PREREQFUNCTION (connection ready, request about to be written)"

    def __init__(self) -> None:
        super().__init__()
        from jobs.curl_multi import CurlMulti

        self.refused: set[str] = set()
        self.multi = CurlMulti(8, 30, allow_address=lambda address: address not in self.refused)

    async def send(self, url: str, body: bytes, timeout: float, **options: Any) -> Attempt:
        import pycurl  # type: ignore[import-untyped,import-not-found,unused-ignore]

        self.multi.timeout_ms = int(timeout * 1000)
        self.multi._idle.clear()  # handles take the timeout when made
        self.refused = {options["refuse"]} if options["refuse"] else set()
        resolve = None
        if options["pin"]:
            host, port, address = options["pin"]
            resolve = [f"{host}:{port}:{address}"]
        file, extra = options["file"], {}
        headers = ["Expect:"]  # no 100-continue round trip before a large body
        if file is not None:
            extra = {"read": file.read, "size": _file_size(file)}
        answer = await self.multi.post(url, headers, body, self.mark_sent, resolve=resolve, **extra)
        error = f"{answer.error_code} {answer.error}" if answer.error_code else ""
        status = 0 if answer.error_code == pycurl.E_OPERATION_TIMEDOUT else answer.status
        text = answer.excerpt.decode(errors="replace")
        return Attempt(status, text, len(answer.excerpt), error=error)

    async def close(self) -> None:
        self.multi.close()


class CurlCffi(Adapter):
    pin_how = "CURLOPT_RESOLVE in curl_options, which AsyncSession takes per session only"
    can_guard = False
    cannot_guard = (
        "no: AsyncSession exposes no socket or pre-request callback (its Curl wraps only the"
        " write, header, read and debug callbacks); only a session per pinned address"
    )
    stream_how = "content=<file> (libcurl's read callback over the file)"
    can_signal = False
    cannot_signal = "no: no callback when the request is written; the handle is not exposed"

    def __init__(self) -> None:
        super().__init__()
        from curl_cffi.requests import AsyncSession

        self.session_type = AsyncSession
        self.session: Any = AsyncSession(max_clients=8, allow_redirects=False, trust_env=False)

    async def send(self, url: str, body: bytes, timeout: float, **options: Any) -> Attempt:
        from curl_cffi import CurlOpt

        session = self.session
        if options["pin"]:
            host, port, address = options["pin"]
            pinned = {CurlOpt.RESOLVE: [f"{host}:{port}:{address}"]}
            session = self.session_type(allow_redirects=False, trust_env=False, curl_options=pinned)
        content = options["file"] if options["file"] is not None else body
        kwargs = {"content": content, "timeout": timeout, "accept_encoding": None}
        try:
            if not options["excerpt"]:
                response = await session.post(url, **kwargs)
                return Attempt(response.status_code)
            return await self._excerpt(session, url, kwargs)
        finally:
            if session is not self.session:
                await session.close()

    async def _excerpt(self, session: Any, url: str, kwargs: dict[str, Any]) -> Attempt:
        kept = b""
        async with session.stream("POST", url, **kwargs) as response:
            async for chunk in response.aiter_content():
                kept += chunk
                if len(kept) >= EXCERPT:
                    break
        return Attempt(response.status_code, kept[:EXCERPT].decode(errors="replace"), len(kept))

    async def close(self) -> None:
        await self.session.close()


class Pyreqwest(Adapter):
    pin_how = "ClientBuilder.resolve(): per client, so one client per pinned address"
    can_guard = False
    cannot_guard = (
        "no: no resolver or connect hook is exposed; only static names per client"
        " (ClientBuilder.resolve)"
    )
    stream_how = "body_stream() of an async generator, with Content-Length"
    signal_how = "the body stream's first read (costs a stream per request)"

    def __init__(self) -> None:
        super().__init__()
        self.client = self._client(None)

    def _client(self, pin: tuple[str, int, str] | None) -> Any:
        from pyreqwest.client import ClientBuilder

        builder = ClientBuilder().follow_redirects(False).default_cookie_store(False).no_proxy()
        builder = builder.gzip(False)
        if pin:
            host, port, address = pin
            builder = builder.resolve(host, address, port)
        return builder.build()

    async def send(self, url: str, body: bytes, timeout: float, **options: Any) -> Attempt:
        client = self._client(options["pin"]) if options["pin"] else self.client
        request = client.post(url).timeout(timedelta(seconds=timeout))
        file = options["file"]
        if file is not None:
            request = request.header("Content-Length", str(_file_size(file)))
            request = request.body_stream(_chunks(file, self.mark_sent))
        else:
            request = request.body_stream(_chunks_of_bytes(body, self.mark_sent))
            request = request.header("Content-Length", str(len(body)))
        try:
            async with request.build_streamed() as response:
                chunk = await response.body_reader.read(EXCERPT) if options["excerpt"] else None
                data = bytes(chunk) if chunk else b""
                return Attempt(response.status, data.decode(errors="replace"), len(data))
        finally:
            if client is not self.client:
                await client.close()

    async def close(self) -> None:
        await self.client.close()


async def _chunks_of_bytes(body: bytes, on_first: Callable[[], None]) -> AsyncIterator[bytes]:
    on_first()
    yield body


class Httpr(Adapter):
    can_pin = can_guard = can_stream = can_signal = False
    cannot_pin = "no: no resolver, no static names, no connect hook"
    cannot_guard = cannot_pin
    cannot_stream = "no: a request body is bytes (or a multipart of file paths)"
    cannot_signal = "no: the request is one blocking call on an executor thread"

    def __init__(self) -> None:
        super().__init__()
        import httpr

        self.client: Any = httpr.AsyncClient(
            max_concurrency=8, follow_redirects=False, cookie_store=False, referer=False
        )

    async def send(self, url: str, body: bytes, timeout: float, **options: Any) -> Attempt:
        if not options["excerpt"]:
            response = await self.client.post(url, content=body, timeout=timeout)
            return Attempt(response.status_code)
        kept = b""
        async with self.client.stream("POST", url, content=body, timeout=timeout) as response:
            async for chunk in response.aiter_bytes():
                kept += bytes(chunk)
                if len(kept) >= EXCERPT:
                    break
            status = response.status_code
        return Attempt(status, kept[:EXCERPT].decode(errors="replace"), len(kept))

    async def close(self) -> None:
        await self.client.aclose()


async def _made(kind: type[Adapter]) -> Adapter:
    return kind()  # on the running loop


CLIENTS: dict[str, Callable[[], Awaitable[Adapter]]] = {
    "aiohttp": lambda: _made(Aiohttp),
    "pycurl": lambda: _made(Pycurl),
    "curl-cffi": lambda: _made(CurlCffi),
    "pyreqwest": lambda: _made(Pyreqwest),
    "httpr": lambda: _made(Httpr),
}
