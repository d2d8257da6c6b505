"""bench/pull.py's `--worker` phase: the Python client's Worker (clients/python) drains the same
kind of jobs as the raw batch phase, with a handler that does nothing, so the two rates compare
the worker's own overhead (job objects, handler threads, lease keeper, its claim and report
rules) with bare `claim` + `report` requests.

Each of `--workers` processes runs one Worker (`--worker-concurrency` handler threads,
`--worker-prefetch` jobs held beyond them: a claim takes their sum). The clock starts when they
are all imported and connected and stops when SQL sees every job DELIVERED; the processes are
then stopped with SIGTERM, the Worker's graceful stop, and send back the job IDs their handler
saw, so the phase can check each was handled once. SQL is asked only once the handlers have seen
every job (each process keeps its count in shared memory, read every 20 ms): counting a consumer's
DELIVERED jobs while 20,000 of them change costs PostgreSQL about 8 ms a time, which polled
throughout took a quarter of a core from the server (uncounted, as the bench's own backend) and
only from this phase.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing.synchronize import Event
from typing import TYPE_CHECKING, Any

from dispatch_harness import CHANNEL, HOST, ROOT, Bench, cpu_table

if TYPE_CHECKING:
    from pull import Phase

CLIENT_SOURCE = ROOT / "clients" / "python" / "src"
POLL_SECONDS = 0.02
TARGET_SHARE = 0.8  # the worker's jobs/s over the raw batch API's, same run


def work(
    port: int,
    consumer: str,
    tokens: tuple[str, str],
    shape: tuple[int, int],
    go: Event,
    io: Any,
    counts: Any,
    index: int,
) -> None:
    """A worker process: one Worker until SIGTERM, its count of jobs handled in `counts[index]`
    as it goes; then the job IDs it handled and the requests it sent."""
    client, http = client_modules()
    requests = [0]
    send = http.HttpClient.request

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        requests[0] += 1
        return send(self, *args, **kwargs)

    http.HttpClient.request = counted  # a bench's count of the requests, nothing more
    handled: list[str] = []

    def handler(job: Any) -> None:
        handled.append(job.id)
        counts[index] = len(handled)

    concurrency, prefetch = shape
    url = f"http://{HOST}:{port}"
    worker = client.Worker(
        url, CHANNEL, consumer, *tokens, concurrency=concurrency, prefetch=prefetch, wait_seconds=1
    )
    ready, out = io
    ready.put(os.getpid())
    go.wait()
    worker.run(handler)  # the main thread: SIGTERM stops it
    out.put((handled, requests[0]))


def client_modules() -> tuple[Any, Any]:
    """The client package of this checkout (and its HTTP layer), ahead of any installed one;
    imported by name, so that type checks of the benches do not depend on which is installed."""
    sys.path.insert(0, str(CLIENT_SOURCE))
    client = importlib.import_module("webhook_broker_client")
    if not str(client.__file__).startswith(str(CLIENT_SOURCE)):
        raise RuntimeError(f"webhook_broker_client came from {client.__file__}, not this checkout")
    return client, importlib.import_module("webhook_broker_client._http")


def run_worker_phase(
    bench: Bench, phase: Phase, consumer: str, tokens: tuple[str, str], port: int, master: int
) -> None:
    from pull import close_phase, queue_phase_jobs

    args = bench.args
    consumer_pk = queue_phase_jobs(bench, phase, consumer)
    spawn = multiprocessing.get_context("spawn")
    go, ready, out = spawn.Event(), spawn.Queue(), spawn.Queue()
    counts = spawn.Array("q", args.workers, lock=False)  # a slot per process, written by it alone
    shape = (args.worker_concurrency, args.worker_prefetch)
    workers = [
        spawn.Process(
            target=work, args=(port, consumer, tokens, shape, go, (ready, out), counts, index)
        )
        for index in range(args.workers)
    ]
    for process in workers:
        process.start()
    for _ in workers:
        ready.get(timeout=120)
    count = "SELECT count(*) FROM jobs_job WHERE consumer_id = %(pk)s AND status = 'DELIVERED'"
    before = cpu_table()
    started = time.time()
    go.set()

    def all_delivered() -> bool:
        if sum(counts) < phase.jobs:
            return False
        return int(bench.scalar(count, {"pk": consumer_pk})) >= phase.jobs

    while not all_delivered():
        if time.time() - started > 3600 or not all(p.is_alive() for p in workers):
            break
        time.sleep(POLL_SECONDS)
    phase.seconds = time.time() - started
    after = cpu_table()
    for process in workers:
        if process.pid:
            os.kill(process.pid, signal.SIGTERM)
    for _ in workers:
        handled, requests = out.get(timeout=120)
        phase.acknowledged += handled
        phase.requests += requests
    for process in workers:
        process.join(timeout=60)
    groups = {"gunicorn": {master}, "clients": {p.pid for p in workers if p.pid}}
    close_phase(bench, phase, consumer_pk, groups, (before, after))


def worker_verdict(batch_rates: list[float], worker_rates: list[float], verified: bool) -> None:
    """The worker's share of the raw batch rate, round by round, and its TARGET line."""
    import statistics

    shares = [w / b for w, b in zip(worker_rates, batch_rates, strict=True) if b]
    share = statistics.median(shares) if shares else 0.0
    print(
        f"worker: {statistics.median(worker_rates):,.0f} jobs/s beside the raw batch API's"
        f" {statistics.median(batch_rates):,.0f} (medians); per round "
        + ", ".join(f"{s:.0%}" for s in shares)
    )
    met = share >= TARGET_SHARE and verified
    print(
        f"TARGET worker >= {TARGET_SHARE:.0%} of raw batch: {share:.0%} (median of the rounds'"
        f" shares) -> {'met' if met else 'NOT met'}"
    )
