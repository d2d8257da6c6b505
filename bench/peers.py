"""bench/dispatch.py's `peers` and `celery` scenarios: the same webhooks through the task queues a
Django team on PostgreSQL would pick instead of the broker, beside our dispatchers, in one table.

For each --dispatchers count: our drain (`drain_queued`, or the drain scenario's of the same size),
then each peer (`drain_peer`) with as many worker processes, each delivering one webhook at a
time with requests: Celery 5 on RabbitMQ (bench/celery_peer.py), procrastinate on PostgreSQL
(bench/procrastinate_peer.py), django-q2 with its ORM broker on PostgreSQL
(bench/djangoq_peer.py). `celery` is `peers` with Celery alone. The table gives deliveries/s,
CPU ms per delivery of the workers and of their broker, and whether the receiver got every
webhook exactly once; the Celery ratio is also judged against the issue's target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

from dispatch_harness import (
    Bench,
    Drain,
    Peer,
    Receivers,
    drain_peer,
    drain_queued,
    prepare,
    receivers,
)

PEERS = ["celery", "procrastinate", "django-q2"]
CELERY_RATIO = 3.0  # ours / Celery, deliveries/s (issue 40)
BROKER_NAMES = {"database": "PostgreSQL backends", "rabbitmq": "RabbitMQ"}


def celery(bench: Bench) -> Peer:
    from celery_peer import CeleryPeer

    return CeleryPeer(bench.args.celery_pool, bench.args.celery_concurrency)


def procrastinate(bench: Bench) -> Peer:
    from procrastinate_peer import ProcrastinatePeer

    return ProcrastinatePeer()


def django_q2(bench: Bench) -> Peer:
    from djangoq_peer import DjangoQPeer

    return DjangoQPeer(bench.env)


MAKERS: dict[str, Callable[[Bench], Peer]] = {
    "celery": celery,
    "procrastinate": procrastinate,
    "django-q2": django_q2,
}


@dataclass
class Row:
    name: str
    processes: int
    drain: Drain | None  # None: not run
    workers: str = ""  # the CPU group of its workers
    broker: str = ""  # and of its broker
    why_not: str = ""

    def cells(self) -> list[str]:
        if self.drain is None:
            return [self.name, str(self.processes), f"not run: {self.why_not}", *[""] * 4]
        drain = self.drain
        workers, broker = (1000 * drain.cpu[g] / drain.jobs for g in (self.workers, self.broker))
        once = "yes" if drain.check.ok and not drain.timed_out else f"NO: {drain.check}"
        return [
            drain.label, str(self.processes), f"{drain.rate:,.0f}", f"{workers:.3f}",
            f"{broker:.3f} ({BROKER_NAMES[self.broker]})", f"{workers + broker:.3f}",
            once,
        ]  # fmt: skip


HEADER = [
    "sender", "processes", "deliveries/s", "CPU ms per delivery: workers",
    "broker (counted)", "total", "every webhook exactly once",
]  # fmt: skip


def scenario_peers(bench: Bench) -> None:
    run_peers(bench, "peers", bench.args.peers)


def scenario_celery(bench: Bench) -> None:
    run_peers(bench, "celery", ["celery"])


def run_peers(bench: Bench, scenario: str, names: list[str]) -> None:
    args = bench.args
    consumers = max(args.consumers)
    print(
        f"\n== {scenario}: the same {args.jobs} webhooks ({consumers} consumer URLs) from ours and"
        f" from {', '.join(names)}, as many worker processes as dispatchers"
    )
    rows: list[Row] = []
    with ExitStack() as stack:
        sinks = stack.enter_context(receivers(bench))
        peers, why_not = open_peers(bench, names, stack)
        for processes in args.dispatchers:
            ours = our_drain(bench, sinks, consumers, processes)
            rows.append(Row("ours", processes, ours, "dispatcher", "database"))
            for name in names:
                peer = peers.get(name)
                if peer is None:
                    rows.append(Row(name, processes, None, why_not=why_not[name]))
                    continue
                drain = drain_peer(bench, sinks, peer, processes, consumers)
                rows.append(Row(name, processes, drain, peer.name, peer.broker))
                if name == "celery":
                    judge_celery(bench, processes, ours, drain)
        if "celery" in why_not:
            bench.verdict("celery", "not run", f"ours / Celery >= {CELERY_RATIO:g}x", False)
    print_table(rows)


def open_peers(
    bench: Bench, names: list[str], stack: ExitStack
) -> tuple[dict[str, Peer], dict[str, str]]:
    """The peers that can run here, opened (closed by `stack`), and why the others cannot."""
    peers: dict[str, Peer] = {}
    why_not: dict[str, str] = {}
    for name in names:
        try:
            peer = MAKERS[name](bench)
        except ImportError as error:
            why_not[name] = f"{error.name} is not installed: pip install -r bench/requirements.txt"
        else:
            if reason := peer.unavailable():
                why_not[name] = reason
            else:
                peer.open()
                stack.callback(peer.close)
                peers[name] = peer
        if name in why_not:
            print(f"  {name}: not run, {why_not[name]}")
    return peers, why_not


def our_drain(bench: Bench, sinks: Receivers, consumers: int, processes: int) -> Drain:
    """The drain scenario's drain of this size, or one now."""
    ours = bench.drains.get((consumers, processes))
    if ours is None:
        ids = prepare(bench, consumers, sinks.port, bench.args.max_in_flight or None)
        label = f"ours (manage.py dispatch), {processes} dispatcher(s)"
        ours = drain_queued(bench, sinks, label, processes, bench.options(), ids)
        bench.drains[consumers, processes] = ours
    return ours


def judge_celery(bench: Bench, processes: int, ours: Drain, celery: Drain) -> None:
    ratio = ours.rate / celery.rate if celery.rate else math.inf
    ok = ours.check.ok and celery.check.ok and not (ours.timed_out or celery.timed_out)
    bench.verdict(
        "celery",
        f"{processes} process(es): ours {ours.rate:,.0f}/s / Celery {celery.rate:,.0f}/s"
        f" = {ratio:.1f}x",
        f"ours / Celery >= {CELERY_RATIO:g}x",
        ok and ratio >= CELERY_RATIO,
    )


def print_table(rows: list[Row]) -> None:
    """A Markdown table, ready for docs/performance.md."""
    lines = [HEADER, ["---", "---:", "---:", "---:", "---:", "---:", "---"]]
    lines += [row.cells() for row in rows]
    print("\n" + "\n".join("| " + " | ".join(cells) + " |" for cells in lines))
    print(
        "\nCPU from /proc over each drain (a peer's from its first request at the receiver, so"
        " not its start-up) until the receiver had every webhook. Workers: every process of the"
        " sender (our dispatchers; the peers' worker processes with their parent: Celery's"
        " prefork pool, django-q2's sentinel, pusher and monitor), those a pool replaced"
        " meanwhile included. Broker: RabbitMQ's Erlang VM for Celery; for the others the"
        " PostgreSQL backends connected to their database at the end (each sender keeps its"
        " connections), not the server's other processes nor other work on the machine."
    )
