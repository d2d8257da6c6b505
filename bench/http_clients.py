"""The delivery step's HTTP client: the dispatcher's sender (libcurl) against other clients, aiohttp
(its sender until issue 37) and clients that do the HTTP work outside the interpreter, on the same
receiver in the same run (issue 18).

Every candidate sends the same workload from a process of its own (so that its CPU is its own,
threads included: `resource.getrusage(RUSAGE_SELF)`): POSTs of a ~300-byte JSON body with
webhook-like headers (`webhook-id`, `webhook-timestamp`, `webhook-signature`, `content-type`, the
broker's IDs) to bench/webhook_sink.py on 127.0.0.1, over keep-alive connections, with 64, 128 and
256 requests in flight; `--warmup` requests first, then `--requests` measured. It prints, per
client and concurrency, requests/s, the client process's CPU per request and the requests that
failed, and checks with the receiver's count that every measured request arrived.

    aiohttp          an aiohttp session configured as the dispatcher's was (until issue 37),
                     `session.post` alone, without the address guard
    pycurl-deliver   jobs/delivery.py's `deliver()` over jobs/curl_delivery.py: what the
                     dispatcher runs (address guard, no redirects, timeout, excerpt, sent signal)
    pycurl           libcurl's multi interface on the asyncio loop (jobs/curl_multi.py) alone
    curl-cffi        curl_cffi's AsyncSession (libcurl, its own asyncio driver)
    pyreqwest        pyreqwest's async Client (Rust reqwest/hyper on a Tokio thread)
    httpr            httpr's AsyncClient (Rust reqwest, one blocking call per executor thread)
    harness-alone    no request: the workload loop's own cost per request (not sent, so the
                     receiver's count is 0)

    .venv/bin/pip install -r bench/requirements.txt
    flock /work/bench.lock .venv/bin/python bench/http_clients.py
    .venv/bin/python bench/http_clients.py --clients aiohttp,pycurl --concurrency 128

Clients that are not installed are reported and skipped. It talks to 127.0.0.1 only and stops
its receiver when done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from dispatch_harness import BENCH, HOST, ROOT, Receivers, machine
from http_candidates import CANDIDATES, MODULES, Workload

DEFAULT_CLIENTS = ",".join(CANDIDATES)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default=DEFAULT_CLIENTS, help="comma-separated")
    parser.add_argument("--concurrency", default="64,128,256", help="requests in flight")
    parser.add_argument("--requests", type=int, default=20_000, help="measured per run")
    parser.add_argument("--warmup", type=int, default=2_000, help="sent before measuring")
    parser.add_argument("--rounds", type=int, default=2, help="every client, every round")
    parser.add_argument("--timeout", type=float, default=10.0, help="per request, seconds")
    parser.add_argument("--logs", type=Path, default=None, help="receiver log directory")
    parser.add_argument(
        "--loop", choices=["asyncio", "uvloop"], default="asyncio", help="the clients' event loop"
    )
    # Internal: one client process's run.
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


# --- one client process ---------------------------------------------------------------------


def cpu_seconds() -> float:
    """This process's CPU, every thread's (some clients have threads of their own)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def drive(send: Callable[[int], Awaitable[bool]], first: int, count: int, width: int) -> int:
    """Send requests `first`..`first + count - 1` with `width` in flight; return the failures."""
    next_index, failures = first, 0
    end = first + count

    async def sender() -> None:
        nonlocal next_index, failures
        while next_index < end:
            index = next_index
            next_index += 1
            if not await send(index):
                failures += 1

    await asyncio.gather(*(sender() for _ in range(width)))
    return failures


async def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    width = int(args.concurrency)
    workload = Workload(
        f"http://{HOST}:{args.port}/hook", args.warmup + args.requests, args.timeout
    )
    client = await CANDIDATES[args.worker](workload, width)
    try:
        warm_failures = await drive(client.send, 0, args.warmup, width)
        cpu, started = cpu_seconds(), time.perf_counter()
        failures = await drive(client.send, args.warmup, args.requests, width)
        elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    finally:
        await client.close()
    return {
        "rate": args.requests / elapsed,
        "cpu_ms": cpu * 1000 / args.requests,
        "failures": failures,
        "warmup_failures": warm_failures,
        "threads": len(os.listdir("/proc/self/task")),
        "first_error": client.first_error,
    }


# --- the orchestrating process --------------------------------------------------------------


def run_client(args: argparse.Namespace, name: str, width: int, port: int) -> dict[str, Any]:
    command = [sys.executable, str(BENCH / "http_clients.py"), "--worker", name]
    command += ["--port", str(port), "--concurrency", str(width), "--requests", str(args.requests)]
    command += ["--warmup", str(args.warmup), "--timeout", str(args.timeout), "--loop", args.loop]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)  # noqa: S603
    if run.returncode != 0:
        return {"error": (run.stderr.strip().splitlines() or ["exited " + str(run.returncode)])[-1]}
    result: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def event_loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None  # asyncio's own


def installed(name: str) -> str:
    """'' when the client's package imports, else why not."""
    module = MODULES[name]
    probe = subprocess.run(  # noqa: S603
        [sys.executable, "-c", f"import {module}; print(getattr({module}, '__version__', '?'))"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return "" if probe.returncode == 0 else probe.stderr.strip().splitlines()[-1]


def main() -> None:
    args = arguments()
    if args.worker:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
        os.environ["BROKER_ALLOW_PRIVATE_CALLBACKS"] = "true"  # the receiver is on loopback
        with asyncio.Runner(loop_factory=event_loop_factory(args.loop)) as runner:
            print(json.dumps(runner.run(run_worker(args))))
        return
    names = [name.strip() for name in args.clients.split(",") if name.strip()]
    widths = [int(width) for width in args.concurrency.split(",")]
    print(f"# {machine()}")
    print(f"# {args.requests} measured requests per run after {args.warmup} warm-up requests;")
    print(f"# {args.rounds} rounds; {args.loop} loop; clients: {', '.join(names)}", flush=True)
    missing = {name: why for name in names if (why := installed(name))}
    for name, why in missing.items():
        print(f"# skipped {name}: {why}")
    names = [name for name in names if name not in missing]
    logs = args.logs or Path(tempfile.mkdtemp(prefix="http_clients-"))
    logs.mkdir(parents=True, exist_ok=True)
    sink = Receivers(1, 0, logs)
    try:
        sink.wait_until_serving()
        results = measure(args, names, widths, sink)
    finally:
        sink.stop()
    print_table(results, names, widths)


def measure(
    args: argparse.Namespace, names: list[str], widths: list[int], sink: Receivers
) -> dict[tuple[str, int], list[dict[str, Any]]]:
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    header = "round  client           in flight  requests/s  CPU ms/request  failed  at receiver"
    print(header, flush=True)
    for round_number in range(1, args.rounds + 1):
        # Alternate the order from round to round, so that no client always runs first.
        order = names if round_number % 2 else names[::-1]
        for width in widths:
            for name in order:
                sink.reset()
                result = run_client(args, name, width, sink.port)
                result["received"] = sink.summary()[0]
                results.setdefault((name, width), []).append(result)
                sent = 0 if name == "harness-alone" else args.warmup + args.requests
                line = describe(result, sent)
                print(f"{round_number:>5}  {name:<15}  {width:>9}  {line}", flush=True)
    return results


def describe(result: dict[str, Any], sent: int) -> str:
    """One run's line; the receiver counts the warm-up too, so it should have `sent` requests."""
    if "error" in result:
        return f"did not run: {result['error']}"
    line = f"{result['rate']:>10,.0f}  {result['cpu_ms']:>14.4f}  {result['failures']:>6}"
    line += f"  {result['received']:>11}  ({result['threads']} threads)"
    if result["received"] != sent:
        line += f"  MISMATCH: {sent} sent"
    if result["first_error"]:
        line += f"  first error: {result['first_error']}"
    return line


def print_table(
    results: dict[tuple[str, int], list[dict[str, Any]]], names: list[str], widths: list[int]
) -> None:
    """The best round of each (client, concurrency): the one with the least CPU per request."""
    print("\n| client | in flight | requests/s | client CPU ms per request | failed |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        for width in widths:
            runs = [r for r in results.get((name, width), []) if "error" not in r]
            if not runs:
                print(f"| {name} | {width} | - | - | did not run |")
                continue
            best = min(runs, key=lambda r: r["cpu_ms"])
            failed = sum(r["failures"] for r in runs)
            rates = ", ".join(f"{r['rate']:,.0f}" for r in runs)
            cpus = ", ".join(f"{r['cpu_ms']:.4f}" for r in runs)
            print(f"| {name} | {width} | {rates} | {cpus} (best {best['cpu_ms']:.4f}) | {failed} |")


if __name__ == "__main__":
    main()
