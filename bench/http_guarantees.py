"""Which of the delivery guarantees each candidate HTTP client of bench/http_clients.py can keep,
checked against a real receiver on 127.0.0.1 (issue 18).

The receiver (this script with `--serve`, a process of its own) has one path per check:

    /ok        200 "ok"; its body says which client port the request came from (keep-alive)
    /redirect  302 to /landed, which counts its requests (redirects must not be followed)
    /hold      reads the request and never answers (timeouts, the "headers were sent" signal)
    /big       a 200 with a 64 MiB body, written until the client stops reading (bounded read)
    /length    answers how many body bytes arrived and how (streaming from a file)
    /count     GET: how many requests /landed had

For each candidate and guarantee it prints a verdict: "yes"/"no" from the check, and how it was
done or what failed. The address guard is checked by pinning a name that does not resolve
(`pinned.invalid`) to 127.0.0.1 for one request, and, where the client allows it, by refusing
127.0.0.1 at connect time. The dispatcher's own guarantees (jobs/delivery.py over libcurl) are
tested in tests/ (tests/dispatch, tests/reliability); aiohttp, its sender until issue 37, is
checked here too.

    .venv/bin/python bench/http_guarantees.py [--clients pycurl,pyreqwest]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable

from aiohttp import web
from dispatch_harness import BENCH, HOST, ROOT, free_port
from guarantee_clients import CLIENTS, Adapter

BIG_BYTES = 64 * 1024 * 1024
FILE_BYTES = 5 * 1024 * 1024


# --- the receiver ---------------------------------------------------------------------------


class Receiver:
    def __init__(self) -> None:
        self.landed = 0

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method == "GET" and request.path == "/count":
            return web.Response(text=str(self.landed))
        received = 0  # counted, not kept: a streamed body may be larger than aiohttp's limit
        async for chunk in request.content.iter_any():
            received += len(chunk)
        if request.path == "/redirect":
            return web.Response(status=302, headers={"Location": "/landed"})
        if request.path == "/landed":
            self.landed += 1
            return web.Response(text="landed")
        if request.path == "/hold":
            await asyncio.sleep(60)
        if request.path == "/big":
            return await self.big(request)
        if request.path == "/length":
            how = "chunked" if request.headers.get("Transfer-Encoding") else "content-length"
            return web.Response(text=f"{received} {how}")
        peer = request.transport.get_extra_info("peername") if request.transport else None
        return web.Response(text=str(peer[1] if peer else 0))

    async def big(self, request: web.BaseRequest) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": str(BIG_BYTES)})
        await response.prepare(request)
        chunk = b"x" * 65536
        try:
            for _ in range(BIG_BYTES // len(chunk)):
                await response.write(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return response


async def serve(port: int) -> None:
    runner = web.ServerRunner(web.Server(Receiver().handle), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, HOST, port).start()
    await asyncio.Event().wait()


# --- the checks -----------------------------------------------------------------------------


def landed(port: int) -> int:
    with urllib.request.urlopen(f"http://{HOST}:{port}/count", timeout=5) as answer:
        return int(answer.read())


Check = Callable[[Adapter, str, int], Awaitable[str]]


async def no_redirects(client: Adapter, base: str, port: int) -> str:
    before = landed(port)
    attempt = await client.post(f"{base}/redirect", b"{}", timeout=5)
    followed = landed(port) - before
    ok = attempt.status == 302 and not followed
    return _verdict(ok, f"302 reported as such, /landed hit {followed} times; {attempt.error}")


async def timeouts(client: Adapter, base: str, port: int) -> str:
    started = time.monotonic()
    attempt = await client.post(f"{base}/hold", b"{}", timeout=1)
    took = time.monotonic() - started
    ok = attempt.status == 0 and took < 3
    return _verdict(ok, f"unanswered request ended after {took:.1f} s ({attempt.error[:60]})")


async def bounded_read(client: Adapter, base: str, port: int) -> str:
    started = time.monotonic()
    attempt = await client.post(f"{base}/big", b"{}", timeout=20, excerpt=True)
    took = time.monotonic() - started
    ok = attempt.status == 200 and attempt.body_bytes <= 4096 * 16 and took < 5
    return _verdict(ok, f"kept {attempt.body_bytes} bytes of 64 MiB in {took:.2f} s")


async def keep_alive(client: Adapter, base: str, port: int) -> str:
    ports = set()
    for _ in range(20):
        attempt = await client.post(f"{base}/ok", b"{}", timeout=5, read_body=True)
        ports.add(attempt.body)
    return _verdict(len(ports) == 1, f"20 sequential requests over {len(ports)} connection(s)")


async def pinned_address(client: Adapter, base: str, port: int) -> str:
    if not client.can_pin:
        return client.cannot_pin
    attempt = await client.post(
        f"http://pinned.invalid:{port}/ok", b"{}", timeout=5, pin=("pinned.invalid", port, HOST)
    )
    ok = attempt.status == 200
    return _verdict(ok, f"{client.pin_how}; {attempt.error[:80]}")


async def guard_at_connect(client: Adapter, base: str, port: int) -> str:
    if not client.can_guard:
        return client.cannot_guard
    attempt = await client.post(f"{base}/ok", b"{}", timeout=5, refuse=HOST)
    ok = attempt.status == 0 and not attempt.sent
    return _verdict(ok, f"{client.guard_how}; refused 127.0.0.1: {attempt.error[:70]}")


async def streamed_file(client: Adapter, base: str, port: int) -> str:
    if not client.can_stream:
        return client.cannot_stream
    with tempfile.TemporaryFile() as file:
        file.write(os.urandom(FILE_BYTES))
        file.seek(0)
        attempt = await client.post(f"{base}/length", b"", timeout=20, file=file, read_body=True)
    ok = attempt.body == f"{FILE_BYTES} content-length"
    return _verdict(ok, f"{client.stream_how}; receiver got {attempt.body or attempt.error}")


async def sent_signal(client: Adapter, base: str, port: int) -> str:
    if not client.can_signal:
        return client.cannot_signal
    cut_off = await client.post(f"{base}/hold", b"{}", timeout=30, cancel_after=0.5)
    refused = await client.post(f"http://{HOST}:{free_port()}/ok", b"{}", timeout=5)
    ok = cut_off.sent and not refused.sent
    detail = f"cut off after the request went out: {cut_off.sent}; refused connection: "
    return _verdict(ok, f"{client.signal_how}; {detail}{refused.sent}")


CHECKS: dict[str, Check] = {
    "pin the resolved address per request": pinned_address,
    "guard the address connected to": guard_at_connect,
    "no redirects": no_redirects,
    "timeouts": timeouts,
    "bounded response read": bounded_read,
    "keep-alive": keep_alive,
    "stream the body from a file": streamed_file,
    "'headers were sent' signal": sent_signal,
}


def _verdict(ok: bool, detail: str) -> str:
    return ("yes: " if ok else "NO: ") + detail.strip().rstrip(";")


async def check_client(name: str, port: int) -> dict[str, str]:
    client = await CLIENTS[name]()
    verdicts = {}
    try:
        for guarantee, check in CHECKS.items():
            try:
                verdicts[guarantee] = await asyncio.wait_for(
                    check(client, f"http://{HOST}:{port}", port), 40
                )
            except Exception as exc:  # a check that could not run says why
                verdicts[guarantee] = f"NO: {type(exc).__name__}: {str(exc)[:100]}"
    finally:
        await client.close()
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
    sys.path.insert(0, str(ROOT))
    port = free_port()
    server = subprocess.Popen(  # noqa: S603
        [sys.executable, str(BENCH / "http_guarantees.py"), "--serve", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port)
        for name in args.clients.split(","):
            print(f"\n## {name}")
            for guarantee, verdict in asyncio.run(check_client(name, port)).items():
                print(f"- {guarantee}: {verdict}", flush=True)
    finally:
        server.terminate()
        server.wait()


def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            landed(port)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the receiver did not start")


if __name__ == "__main__":
    main()
