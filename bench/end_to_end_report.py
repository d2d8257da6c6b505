"""bench/end_to_end.py's steps: what each measured, its verdict, the table and the result."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dispatch_harness import CORES, Check, percentile
from steady_publish import Published

CONSUMERS = ("c0", "c1")  # the push consumers' public IDs (dispatch_harness.prepare's)
GROUPS = ("web", "dispatchers", "database", "receiver", "producers")  # CPU, by process group


@dataclass
class Step:
    """One rate, published for a step's time, and what it took to deliver it."""

    rate: float  # asked for, messages/s
    published: Published
    seconds: float  # the schedule's start until the last delivery (or the settle time's end)
    backlog: int  # jobs not DELIVERED when publishing ended
    oldest_ms: float  # the oldest of them, its age then
    kept_up: bool  # every delivery arrived within the settle time
    arrived: dict[str, float]  # "<message ID> <consumer>" -> time.time() of its first arrival
    cpu: dict[str, float]  # CPU seconds by group
    busy_cores: float  # the whole machine's, other work included
    transactions: int  # committed and rolled back in this database (pg_stat_database)
    check: Check

    @property
    def publish_ms(self) -> list[float]:
        """HTTP publish: the request sent → its 201 read."""
        sent = self.published.sent
        return [1000 * (at - sent[m]) for m, at in self.published.committed.items()]

    def since(self, times: dict[str, float]) -> list[float]:
        """ms from each message's time in `times` to each of its arrivals."""
        keys = ((m, f"{m} {consumer}") for m in times for consumer in CONSUMERS)
        return [1000 * (self.arrived[key] - times[m]) for m, key in keys if key in self.arrived]

    @property
    def delivery_ms(self) -> list[float]:
        """Publish → delivery: the request sent → the first arrival, one per delivery."""
        return self.since(self.published.sent)

    @property
    def missing(self) -> int:
        return len(CONSUMERS) * self.published.count - len(self.delivery_ms)

    @property
    def behind(self) -> list[str]:
        """Why the step fell behind, if it did."""
        published = self.published
        return [
            why
            for why, fell in (
                (f"producers reached {published.rate:,.0f}/s", not published.kept),
                (f"{published.failed:,} broadcasts refused", published.failed),
                (f"{self.backlog:,} jobs not delivered in time", not self.kept_up),
                (f"{self.missing:,} deliveries missing", self.missing),
                (f"check: {self.check}", not self.check.ok),
            )
            if fell
        ]

    def faults(self, p99_ms: float) -> list[str]:
        p99 = percentile(self.delivery_ms, 0.99)
        too_slow = [f"p99 {p99:.0f} ms > {p99_ms:g} ms"] if not p99 <= p99_ms else []
        return self.behind + too_slow

    def per_message(self, group: str) -> float:
        """CPU ms per message published."""
        return 1000 * self.cpu.get(group, 0.0) / max(self.published.count, 1)


def distribution(values: list[float], width: int = 6, between: str = " ") -> str:
    """p50 and p99."""
    return f"{percentile(values, 0.5):{width}.1f}{between}{percentile(values, 0.99):{width}.1f}"


def print_step(step: Step, p99_ms: float) -> None:
    """The step's row of the table (HEADER)."""
    faults = step.faults(p99_ms)
    cpu = " ".join(f"{step.per_message(group):5.2f}" for group in GROUPS)
    total = sum(step.per_message(group) for group in GROUPS)
    transactions = step.transactions / max(step.published.count, 1)
    print(
        f"{step.rate:6,.0f} {step.published.rate:6,.0f} {step.published.failed:4}"
        f"  {distribution(step.publish_ms)}  {distribution(step.delivery_ms)}"
        f" {step.backlog:6,} {step.oldest_ms:6.0f}  {'yes' if step.kept_up else 'NO':3}"
        f"  {cpu} {total:5.2f} {transactions:5.1f}  {step.busy_cores:4.2f}"
        f"  {'; '.join(faults) or 'pass'}",
        flush=True,
    )


HEADER = (
    "        published  HTTP publish  publish→delivery backlog at end in   CPU ms per message"
    "                     tx per busy\n"
    "  rate  msg/s fail   p50    p99    p50    p99     jobs  age ms time  web  disp    db"
    "  recv  prod total msg   cores verdict"
)


def print_result(steps: list[Step], args: argparse.Namespace) -> None:
    """Every step's check, the TARGET/RESULT line and, at the result's rate, where the CPU
    went."""
    checks = [step.check for step in steps]
    print(
        f"\nchecked: {sum(c.expected for c in checks):,} jobs of {len(steps)} steps,"
        f" {sum(c.requests for c in checks):,} requests at the receiver,"
        f" {sum(c.duplicates for c in checks)} duplicates, {sum(c.missing for c in checks)}"
        f" missing, {sum(c.unexpected for c in checks)} not DELIVERED,"
        f" {sum(c.retried for c in checks)} retried"
        f" -> {'OK' if all(c.ok for c in checks) else 'MISMATCH'}"
    )
    passing = 0
    while passing < len(steps) and not steps[passing].faults(args.p99_ms):
        passing += 1
    target = f"p99 publish → delivery <= {args.p99_ms:g} ms, nothing behind"
    if not passing:
        print(f"TARGET {target}: RESULT none of the steps passed")
        return
    best = steps[passing - 1]
    later = [step.rate for step in steps[passing:] if not step.faults(args.p99_ms)]
    print(
        f"TARGET {target}: RESULT {best.published.rate:,.0f} msg/s"
        f" ({best.rate:,.0f}/s asked; {len(CONSUMERS) * best.published.rate:,.0f}"
        f" deliveries/s): publish → delivery p50 {percentile(best.delivery_ms, 0.5):.1f} ms,"
        f" p99 {percentile(best.delivery_ms, 0.99):.1f} ms; of which HTTP publish p50/p99"
        f" {distribution(best.publish_ms, 0, '/')} ms, its 201 → arrival"
        f" {distribution(best.since(best.published.committed), 0, '/')} ms"
        + (
            f" (a later step passed too: {', '.join(f'{r:,.0f}' for r in later)}/s)"
            if later
            else ""
        )
    )
    total = sum(best.cpu.get(group, 0.0) for group in GROUPS)
    print(f"where the CPU goes at {best.rate:,.0f} msg/s ({best.seconds:.1f} s measured):")
    for group in GROUPS:
        seconds = best.cpu.get(group, 0.0)
        print(
            f"  {group:12} {best.per_message(group):6.3f} ms per message"
            f"  {100 * seconds / best.seconds:5.1f} % of a core  {100 * seconds / total:4.1f} %"
        )
    print(
        f"  {'in all':12} {1000 * total / best.published.count:6.3f} ms per message"
        f"  {100 * total / best.seconds:5.1f} % of a core; the machine was busy"
        f" {best.busy_cores:.2f} of {CORES} cores (other sessions' work included; every"
        f" PostgreSQL process: {best.per_message('postgres'):.3f} ms per message); about"
        f" {best.transactions / best.published.count:.1f} transactions per message in the"
        " database"
    )
