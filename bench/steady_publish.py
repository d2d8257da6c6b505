"""Publishing at a steady rate, with `broker.publish()` for bench/dispatch.py's latency and rss
scenarios, or over HTTP for bench/end_to_end.py (any `sender`).

One process calling `broker.publish()` (a transaction and a commit per message, and a NOTIFY when a
dispatcher is idle) kept up with about 600 messages/s on the 2-core VM, so a higher rate is shared
between processes forked from the benchmark: process i of N publishes messages i, i + N, i + 2N,
..., message n at `start + n / rate` on the wall clock (open loop: a late message does not move the
schedule, the process catches up as fast as it can, and stops at the end of the `seconds`, whatever
it has not published by then). With `batch` > 1 the unit is a batch of that many consecutive
messages, published with one `broker.publish_many()` call (one statement, one commit, at most one
NOTIFY) at the time of its first message; each of its messages counts as published then. Each
process reports when it called `publish()` for each of its messages and when the call returned
(committed), when it finished, how far it fell behind and its own CPU time, so the caller can print
the rate that was actually reached, not the one asked for.

A `sender` is made in each forked process (a connection of its own: none is shared across a fork)
and publishes one unit; it answers whether the broker accepted it. `broker_sender` calls
`broker.publish()` and raises on failure; an HTTP sender answers False for a refused broadcast,
which then counts in `failed`, not in `count`, `sent` or `committed`.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from dispatch_harness import CHANNEL, PAYLOAD, PRODUCER, close_django_connections

START_DELAY = 0.5  # seconds for the processes to fork and import before the schedule starts
# Publishes messages `prefix` + first, ... + first + batch - 1; True when the broker accepted them.
Sender = Callable[[int, int], bool]
SenderFactory = Callable[[str], Sender]  # prefix -> a sender, made in each forked process


@dataclass
class Published:
    requested: float  # messages/s asked for
    start: float  # time.time() the schedule started
    count: int  # messages accepted
    seconds: float  # from the schedule's start until the last publish() returned
    cpu_seconds: float  # the publishing processes' own CPU (PostgreSQL's is not in it)
    behind: float  # the most any publish() started after its scheduled time, seconds
    sent: dict[str, float] = field(default_factory=dict)  # message ID -> time.time() before
    committed: dict[str, float] = field(default_factory=dict)  # -> time.time() once it returned
    failed: int = 0  # messages the broker refused (an HTTP sender's non-201 or broken connection)

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def kept(self) -> bool:
        """Did the publishers keep the rate asked for (within 3 %)?"""
        return self.rate >= 0.97 * self.requested

    def __str__(self) -> str:
        refused = f", {self.failed:,} refused" if self.failed else ""
        return (
            f"published {self.count:,} messages{refused} at {self.rate:,.0f}/s"
            f" ({self.requested:,.0f}/s asked: {'kept' if self.kept else 'NOT kept'});"
            f" at most {1000 * self.behind:.0f} ms behind schedule; publishers' CPU"
            f" {1000 * self.cpu_seconds / max(self.count, 1):.3f} ms per message"
        )


def publish_steadily(
    rate: float,
    seconds: float,
    prefix: str,
    processes: int,
    tick: Callable[[], None] | None = None,
    *,
    batch: int = 1,
    keep_times: bool = True,
    sender: SenderFactory | None = None,
) -> Published:
    """Publish `rate` messages/s for `seconds` from `processes` forked processes, `batch` messages
    per call, with `sender` (default `broker_sender`); `tick` is called in this process every
    50 ms meanwhile. Message IDs are `prefix` + n.
    """
    total = int(rate * seconds) // batch * batch
    close_django_connections()  # the children open their own; none is shared across a fork
    context = multiprocessing.get_context("fork")
    start = time.time() + START_DELAY
    pipes, children = [], []
    for index in range(processes):
        receiving, sending = context.Pipe(duplex=False)
        share = (index, processes, rate, total, batch, start, seconds, prefix, keep_times,
                 sender or broker_sender, sending)  # fmt: skip
        child = context.Process(target=_publish_share, args=share, daemon=True)
        child.start()
        sending.close()
        pipes.append(receiving)
        children.append(child)
    results: dict[int, tuple[bytes, float, float, float, int, int]] = {}
    waiting = {id(pipe): (index, pipe) for index, pipe in enumerate(pipes)}
    while waiting:
        for ready in wait([pipe for _, pipe in waiting.values()], timeout=0.05):
            index, pipe = waiting.pop(id(ready))
            try:
                results[index] = pipe.recv()
            except EOFError:
                raise RuntimeError(f"publisher {index} ended without its result") from None
        if tick:
            tick()
    for child in children:
        child.join()
    sent: dict[str, float] = {}
    committed: dict[str, float] = {}
    for index, (stamps, *_) in results.items():
        times = array("d")
        # Per call made: before, returned (NaN when refused); none with keep_times=False.
        times.frombytes(stamps)
        calls = range(index * batch, total, processes * batch)
        for first, before, returned in zip(calls, times[::2], times[1::2], strict=False):
            if math.isnan(returned):
                continue
            for n in range(first, first + batch):
                sent[f"{prefix}{n}"], committed[f"{prefix}{n}"] = before, returned
    finished = max(end for _, end, *_ in results.values())
    refused = batch * sum(calls_refused for *_, calls_refused in results.values())
    return Published(
        requested=rate,
        start=start,
        count=batch * sum(calls for *_, calls, _ in results.values()) - refused,
        seconds=finished - start,
        cpu_seconds=sum(cpu for _, _, cpu, *_ in results.values()),
        behind=max(late for _, _, _, late, *_ in results.values()),
        sent=sent,
        committed=committed,
        failed=refused,
    )


def broker_sender(prefix: str) -> Sender:
    """`broker.publish()`, or `publish_many()` for a batch; raises when refused."""
    from broker.publishing import publish
    from broker.publishing_batch import BatchMessage, publish_many

    payload = PAYLOAD.encode()

    def send(first: int, batch: int) -> bool:
        if batch == 1:
            publish(CHANNEL, payload, producer=PRODUCER, message_id=f"{prefix}{first}",
                    content_type="application/json")  # fmt: skip
        else:
            messages = [
                BatchMessage(payload, f"{prefix}{n}", content_type="application/json")
                for n in range(first, first + batch)
            ]
            publish_many(CHANNEL, messages, producer=PRODUCER)
        return True

    return send


def _publish_share(
    index: int,
    processes: int,
    rate: float,
    total: int,
    batch: int,
    start: float,
    seconds: float,
    prefix: str,
    keep_times: bool,
    make_sender: SenderFactory,
    result: Connection,
) -> None:
    """One forked publisher: units index, index + processes, ... on their schedule, until the
    schedule's end."""
    cpu = time.process_time()
    send = make_sender(prefix)
    stamps = array("d")
    behind = 0.0
    calls = refused = 0
    for first in range(index * batch, total, processes * batch):
        if time.time() >= start + seconds:
            break  # behind schedule: what is left is not published
        pause = start + first / rate - time.time()
        if pause > 0:
            time.sleep(pause)
        else:
            behind = max(behind, -pause)
        before = time.time()
        accepted = send(first, batch)
        calls += 1
        refused += not accepted
        if keep_times:
            stamps.extend((before, time.time() if accepted else math.nan))
    finished = time.time()
    close_django_connections()
    result.send((stamps.tobytes(), finished, time.process_time() - cpu, behind, calls, refused))
    result.close()
