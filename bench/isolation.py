"""Tenant isolation (issue 36): a healthy consumer's drain alone and beside each attacker.

"No tenant can starve or stall another." In one run, for 1 and 2 dispatcher processes:

1. the healthy tenant alone: `--messages` broadcasts over HTTP to its channel (`--publishers`
   threads, each waiting for its answer) until SQL counts all of its consumer's jobs DELIVERED
   (its receiver answers at once); the median of `--baseline-runs` drains;
2. the same drain beside each attacker (bench/isolation_attacks.py), mounted first and left
   running while it is timed: slow receivers (200 after 25 s), receivers that never answer, a
   dispatcher SIGSTOPped while it records failures (holding FOR UPDATE on a consumer row), a
   dispatcher killed with SIGKILL, a session idle in transaction holding a consumer row FOR
   UPDATE, schemas whose check fetches a hanging `$ref`, backtracks (`^(a+)+$`) or compares
   4,000 objects, and pull workers long-polling `claim`;
3. per row: the healthy time alone and beside the attacker, their ratio and the verdict: the
   target is at most 2x. The kill row also times how long the killed dispatcher's consumer waits
   for its next request (target 5 s); the sigstop and psql rows note how long a broadcast to the
   locked consumer's channel waited;
4. once each attack is undone, every healthy job must end DELIVERED and have reached the
   receiver: nothing lost.

Each row starts from empty tables, with its own web server (the command `manage.py runbroker`
uses, with compose.yaml's worker count) and dispatchers (`manage.py dispatch`, default options);
a drain is cut off after `--row-timeout` seconds and reported as timed out. Everything it starts
is stopped and its database (`bench_isolation`) dropped, on Ctrl-C too. 127.0.0.1 only.

    .venv/bin/python bench/isolation.py                          # every row, 1 and 2 dispatchers
    .venv/bin/python bench/isolation.py --rows slow,kill --dispatchers 2
    .venv/bin/python bench/isolation.py --no-fail                # exit 0 even if rows fail

Exit status 1 when a row misses its target or loses a job, unless `--no-fail`.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from dispatch_harness import (
    HOST,
    Bench,
    DispatchOptions,
    Receivers,
    close_django_connections,
    fresh_database,
    machine,
    receivers,
    setup_django,
)
from isolation_attacks import ATTACKS, Attack, alone
from isolation_stage import (
    ADMIN_TOKEN,
    HEALTHY,
    Drain,
    Loss,
    Row,
    healthy_drain,
    make_tenant,
    reset_tables,
    settle,
    web_command,
    web_server,
    web_workers,
)

RATIO_TARGET = 2.0  # beside an attacker / alone
RESUME_TARGET = 5.0  # seconds from a dispatcher's death to its consumer's next request
ALONE = Attack("alone", "no attacker", alone)


@dataclass
class Result:
    row: str
    dispatchers: int
    alone: float
    drain: Drain
    loss: Loss
    notes: list[str]
    resume_seconds: float | None = None
    resume_timed_out: bool = False

    @property
    def ratio(self) -> float:
        return self.drain.seconds / self.alone

    @property
    def resumed(self) -> bool:
        if self.resume_seconds is None:
            return True
        return not self.resume_timed_out and self.resume_seconds <= RESUME_TARGET

    @property
    def passed(self) -> bool:
        within = self.drain.complete and self.ratio <= RATIO_TARGET
        return within and self.resumed and not self.loss.lost

    def cells(self) -> list[str]:
        ratio = f"{self.ratio:.1f}x" if self.drain.complete else f"> {self.ratio:.0f}x"
        resume = "" if self.resume_seconds is None else f"{self.resume_seconds:.1f} s"
        if self.resume_timed_out:
            resume = f"> {resume}"
        verdict = "pass" if self.passed else "FAIL"
        lost = str(self.loss.lost) if self.loss.lost else ""
        return [
            self.row, str(self.dispatchers), f"{self.alone:.2f} s", self.drain.describe(), ratio,
            resume, lost, verdict,
        ]  # fmt: skip


def frame(
    bench: Bench, healthy: Receivers, attack: Attack, count: int, drains: int = 1
) -> tuple[list[Drain], Loss, Row]:
    """One row: empty tables, the healthy tenant, a web server; the attack mounted (it starts
    the dispatchers); `drains` healthy drains timed; the attack undone; the healthy jobs left
    time to arrive and checked; then every process of the row stopped."""
    args = bench.args
    print(f"\n== {attack.name}, {count} dispatcher(s): {attack.what}", flush=True)
    reset_tables(bench)
    healthy.reset()
    make_tenant(HEALTHY, [f"http://{HOST}:{healthy.port}/{HEALTHY}"])
    with ExitStack() as infra:
        port = infra.enter_context(web_server(bench, args.web_workers))
        row = Row(bench, DispatchOptions(), healthy, port, infra, ExitStack(), args.row_timeout)
        with row.attack:
            attack.mount(row, count)
            close_django_connections()  # the ORM's session idle, never in the attack's way
            timed = [healthy_drain(row, args.messages, args.publishers) for _ in range(drains)]
            for finish in row.finishers:
                finish()
        loss = settle(row)
    return timed, loss, row


def baseline(bench: Bench, healthy: Receivers, count: int) -> float:
    """The median healthy drain alone, which the rows with `count` dispatchers are judged by."""
    drains, loss, _ = frame(bench, healthy, ALONE, count, bench.args.baseline_runs)
    if loss.lost or not all(drain.complete for drain in drains):
        raise SystemExit("the healthy drain does not complete even alone: nothing to compare")
    seconds = statistics.median(drain.seconds for drain in drains)
    print(f"  alone with {count} dispatcher(s): median {seconds:.2f} s", flush=True)
    return seconds


def run(bench: Bench, healthy: Receivers) -> list[Result]:
    results = []
    for count in bench.args.dispatchers:
        attacks = [ATTACKS[name] for name in bench.args.rows]
        attacks = [attack for attack in attacks if count >= attack.least_dispatchers]
        if not attacks:
            continue
        alone_seconds = baseline(bench, healthy, count)
        for attack in attacks:
            [drain], loss, row = frame(bench, healthy, attack, count)
            result = Result(attack.name, count, alone_seconds, drain, loss, row.notes)
            result.resume_seconds = row.resume_seconds
            result.resume_timed_out = row.resume_timed_out
            results.append(result)
    return results


def report(results: list[Result]) -> None:
    header = ["row", "dispatchers", "alone", "beside the attacker", "ratio", "resumed", "lost"]
    rows = [[*header, "verdict"], *(result.cells() for result in results)]
    widths = [max(len(row[n]) for row in rows) for n in range(len(header) + 1)]
    print(
        f"\ntargets: beside an attacker <= {RATIO_TARGET:g}x alone, every healthy job delivered;"
        f" a killed dispatcher's consumer served again within {RESUME_TARGET:g} s"
    )
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    print("\nnotes:")
    for result in results:
        print(f"  {result.row}, {result.dispatchers}: " + "; ".join(result.notes))


def row_names(text: str) -> list[str]:
    names = list(ATTACKS) if text == "all" else [name.strip() for name in text.split(",")]
    unknown = set(names) - set(ATTACKS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown rows {sorted(unknown)}; any of {list(ATTACKS)}")
    return names


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--rows", type=row_names, default=list(ATTACKS), help=f"all, or of {','.join(ATTACKS)}")
    add("--dispatchers", type=lambda t: [int(n) for n in t.split(",")], default=[1, 2])
    add("--messages", type=int, default=300, help="healthy broadcasts per drain")
    add("--publishers", type=int, default=2, help="threads publishing the healthy messages")
    add("--baseline-runs", type=int, default=3, help="healthy drains alone; the median counts")
    add("--row-timeout", type=float, default=60.0, help="seconds a drain may take")
    add("--web-workers", type=int, default=web_workers(), help="compose.yaml's by default")
    add("--web-attackers", type=int, default=3, help="schema publishers, long-polling workers")
    add("--database", default="bench_isolation")
    add("--logs", type=Path, help="keep the processes' logs here (default: a temporary directory)")
    add("--no-fail", action="store_true", help="exit 0 even when rows fail (a 'before' figure)")
    # The harness's dispatcher command; a short grace keeps a row's teardown short.
    add("--dispatch-command", default=f"{sys.executable} manage.py dispatch --grace-seconds 2")
    return parser.parse_args()


def interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds every stack: processes stopped, database dropped


def main() -> None:
    args = parse_arguments()
    # SIGINT too: a shell without job control starts a background job with SIGINT ignored.
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, interrupt)
    print(f"isolation benchmark, {machine()}")
    try:
        results = run_all(args)
    except KeyboardInterrupt:
        raise SystemExit(
            "interrupted: every process of the run stopped, its database dropped"
        ) from None
    report(results)
    if not args.no_fail and not all(result.passed for result in results):
        raise SystemExit(1)


def run_all(args: argparse.Namespace) -> list[Result]:
    with ExitStack() as stack:
        database_url = stack.enter_context(fresh_database(args.database))
        logs = args.logs or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="iso-")))
        logs.mkdir(parents=True, exist_ok=True)
        bench = Bench(args, database_url, logs)
        stack.callback(bench.db.close)
        bench.env |= {"DJANGO_ALLOWED_HOSTS": HOST, "BROKER_ADMIN_TOKENS": ADMIN_TOKEN}
        setup_django(bench.env)
        print(
            f"web server: {' '.join(web_command(0, args.web_workers))}; dispatchers:"
            f" {args.dispatch_command}; {args.messages} healthy broadcasts from"
            f" {args.publishers} threads; rows cut off after {args.row_timeout:g} s",
            flush=True,
        )
        args.receivers = 1
        healthy = stack.enter_context(receivers(bench))
        started = time.monotonic()
        results = run(bench, healthy)
        print(f"\n{time.monotonic() - started:.0f} s of rows")
    return results


if __name__ == "__main__":
    main()
