"""The candidate clients of bench/http_clients.py, each behind the same small interface.

Every candidate is configured as the dispatcher would need it, as far as it can be: no redirects,
no cookies, no proxy from the environment, no decompression, a timeout per request, keep-alive
connections as many as requests in flight, and the answer's status and a body excerpt read.
A candidate's `send(index)` posts request `index` of the workload and says whether it got a 2xx.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from dispatch_harness import ROOT

sys.path.insert(0, str(ROOT))  # the broker's modules: jobs/delivery.py, jobs/curl_multi.py

# About 300 bytes, like the bench payloads of bench/dispatch.py.
BODY = json.dumps({"order": 12345, "items": [{"sku": "A-1", "qty": 2}], "note": "x" * 200}).encode()
NO_JOB = datetime(2026, 1, 1, tzinfo=UTC)  # the requests' time partition: they are of no job


@dataclass
class Workload:
    url: str
    count: int
    timeout: float
    headers: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Built before the clock starts: the dispatcher gets its headers from the claim step.
        self.headers = [_webhook_headers(index) for index in range(self.count)]


def _webhook_headers(index: int) -> dict[str, str]:
    message_id = f"msg_bench{index:016d}"
    signature = base64.b64encode(hashlib.sha256(message_id.encode()).digest()).decode()
    return {
        "Content-Type": "application/json",
        "User-Agent": "webhook-broker-django/bench",
        "webhook-id": message_id,
        "webhook-timestamp": "1764000000",
        "webhook-signature": f"v1,{signature}",
        "X-Broker-Message-ID": message_id,
        "X-Broker-Consumer-ID": "bench",
        "X-Broker-Metadata-Headers": "",
    }


class Candidate(Protocol):
    first_error: str

    async def send(self, index: int) -> bool: ...

    async def close(self) -> None: ...


class _Base:
    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.first_error = ""

    def failed(self, error: object) -> bool:
        self.first_error = self.first_error or str(error)[:200]
        return False


class AiohttpPost(_Base):
    """aiohttp's session as the dispatcher configured it while aiohttp was one of its senders
    (until issue 37), without its address guard: no cookies, no decompression, no proxy from the
    environment; `session.post` with the same options, without `deliver()` around it."""

    def __init__(self, workload: Workload, width: int) -> None:
        super().__init__(workload)
        import aiohttp

        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=width),
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            headers={"Accept-Encoding": "identity"},
            trust_env=False,
        )

    async def send(self, index: int) -> bool:
        import aiohttp

        try:
            async with self.session.post(
                self.workload.url,
                data=BODY,
                headers=self.workload.headers[index],
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=self.workload.timeout),
            ) as response:
                await response.content.read(4096)
                return 200 <= response.status < 300 or self.failed(response.status)
        except Exception as exc:
            return self.failed(exc)

    async def close(self) -> None:
        await self.session.close()


class PycurlDeliver(_Base):
    """The dispatcher's sender: jobs/delivery.py's `deliver()` over jobs/curl_delivery.py's POST,
    with the address guard on every connection."""

    def __init__(self, workload: Workload, width: int) -> None:
        super().__init__(workload)
        import django

        django.setup()
        import functools

        from jobs import curl_delivery, delivery
        from jobs.curl_multi import CurlMulti

        self.delivery = delivery
        self.multi = CurlMulti(width, workload.timeout, allow_address=curl_delivery.allowed_address)
        self.curl_post = functools.partial(curl_delivery.post, self.multi)
        self.sent: set[int] = set()
        self.requests = [
            delivery.DeliveryRequest(index, NO_JOB, 1, 1, workload.url, headers, BODY)
            for index, headers in enumerate(workload.headers)
        ]

    async def send(self, index: int) -> bool:
        request = self.requests[index]
        result = await self.delivery.deliver(
            self.curl_post, request, self.workload.timeout, on_sent=lambda: self.sent.add(index)
        )
        self.sent.discard(index)  # as the dispatcher's `_send` does
        return result.succeeded or self.failed(result.error)

    async def close(self) -> None:
        self.multi.close()


class Pycurl(_Base):
    """libcurl's multi interface on the loop (jobs/curl_multi.py), without `deliver()`."""

    def __init__(self, workload: Workload, width: int) -> None:
        super().__init__(workload)
        from jobs.curl_multi import CurlMulti

        self.multi = CurlMulti(width, workload.timeout)
        self.sent: set[int] = set()

    async def send(self, index: int) -> bool:
        headers = [f"{name}: {value}" for name, value in self.workload.headers[index].items()]
        answer = await self.multi.post(
            self.workload.url, headers, BODY, on_sent=lambda: self.sent.add(index)
        )
        self.sent.discard(index)
        ok = not answer.error_code and 200 <= answer.status < 300
        return ok or self.failed(answer.error or answer.status)

    async def close(self) -> None:
        self.multi.close()


class CurlCffi(_Base):
    """curl_cffi's AsyncSession: libcurl's multi interface under curl_cffi's own driver."""

    def __init__(self, workload: Workload, width: int) -> None:
        super().__init__(workload)
        from curl_cffi.requests import AsyncSession

        self.session: Any = AsyncSession(
            max_clients=width, allow_redirects=False, trust_env=False, timeout=workload.timeout
        )

    async def send(self, index: int) -> bool:
        try:
            response = await self.session.post(
                self.workload.url,
                content=BODY,
                headers=self.workload.headers[index],
                accept_encoding=None,
                discard_cookies=True,
            )
        except Exception as exc:
            return self.failed(exc)
        return 200 <= response.status_code < 300 or self.failed(response.status_code)

    async def close(self) -> None:
        await self.session.close()


class Pyreqwest(_Base):
    """pyreqwest's async Client: reqwest (hyper, Tokio) in Rust, awaited from the loop."""

    def __init__(self, workload: Workload, width: int) -> None:
        super().__init__(workload)
        from pyreqwest.client import ClientBuilder

        self.client: Any = (
            ClientBuilder()
            .max_connections(width)
            .follow_redirects(False)
            .default_cookie_store(False)
            .no_proxy()
            .gzip(False)
            .timeout(timedelta(seconds=workload.timeout))
            .build()
        )

    async def send(self, index: int) -> bool:
        request = (
            self.client.post(self.workload.url)
            .headers(self.workload.headers[index])
            .body_bytes(BODY)
            .build_streamed()
        )
        try:
            async with request as response:
                await response.body_reader.read(4096)
                status = response.status
        except Exception as exc:
            return self.failed(exc)
        return 200 <= status < 300 or self.failed(status)

    async def close(self) -> None:
        await self.client.close()


class Httpr(_Base):
    """httpr's AsyncClient: reqwest in Rust, each request a blocking call on an executor thread."""

    def __init__(self, workload: Workload, width: int) -> None:
        super().__init__(workload)
        import httpr

        self.client: Any = httpr.AsyncClient(
            max_concurrency=width,
            follow_redirects=False,
            cookie_store=False,
            referer=False,
            timeout=workload.timeout,
        )

    async def send(self, index: int) -> bool:
        try:
            response = await self.client.post(
                self.workload.url, content=BODY, headers=self.workload.headers[index]
            )
        except Exception as exc:
            return self.failed(exc)
        return 200 <= response.status_code < 300 or self.failed(response.status_code)

    async def close(self) -> None:
        await self.client.aclose()


class HarnessAlone(_Base):
    """No request at all: what the workload's own loop costs per request, the floor under every
    candidate's figure."""

    def __init__(self, workload: Workload, width: int) -> None:
        super().__init__(workload)

    async def send(self, index: int) -> bool:
        await asyncio.sleep(0)
        return True

    async def close(self) -> None:
        pass


async def _made(kind: Callable[[Workload, int], Candidate], workload: Workload, width: int) -> Any:
    return kind(workload, width)  # on the running loop: some clients take it when made


def _factory(kind: Callable[[Workload, int], Candidate]) -> Callable[..., Awaitable[Candidate]]:
    return lambda workload, width: _made(kind, workload, width)


CANDIDATES: dict[str, Callable[[Workload, int], Awaitable[Candidate]]] = {
    "aiohttp": _factory(AiohttpPost),
    "pycurl-deliver": _factory(PycurlDeliver),
    "pycurl": _factory(Pycurl),
    "curl-cffi": _factory(CurlCffi),
    "pyreqwest": _factory(Pyreqwest),
    "httpr": _factory(Httpr),
    "harness-alone": _factory(HarnessAlone),
}
MODULES = {
    "aiohttp": "aiohttp",
    "pycurl-deliver": "pycurl",
    "pycurl": "pycurl",
    "curl-cffi": "curl_cffi",
    "pyreqwest": "pyreqwest",
    "httpr": "httpr",
    "harness-alone": "asyncio",
}
