"""bench/claim_partitions.py's report: the claims' times and plans per layout, and issue 40's
TARGET line."""

from __future__ import annotations

import argparse
import statistics
from typing import TYPE_CHECKING, Any

from dispatch_harness import percentile
from scale import print_rows

if TYPE_CHECKING:
    from claim_partitions import Layout

CLAIM = 10  # jobs per claim, as bench/claim_partitions.py claims
MODES = ("auto", "force_custom_plan", "force_generic_plan")
EXPLAINS = 5  # EXPLAIN (ANALYZE) runs of the claim per layout (the median is reported)
TARGET_MS = 10.0  # issue 40: the claim at 94 partitions


def claimed_text(claimed: list[int]) -> str:
    return str(CLAIM) if set(claimed) == {CLAIM} else f"SHORT: {min(claimed)}-{max(claimed)}"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_report(results: list[tuple[Layout, dict[str, Any]]], args: argparse.Namespace) -> None:
    print(
        f"\n## the push claim against partitions of jobs: claim_for_push({CLAIM}) rolled back,"
        f" ms, median / p90 of {args.runs} after {args.warmup}; {args.jobs:,} due jobs made in"
        f" the last hour, {args.old_pending:,} as old as the partitions, {args.jobs:,} delivered"
        " over them\n"
    )
    rows = [
        ("layout", "partitions of jobs", "claimed per claim",
         *(f"{mode}: median / p90" for mode in MODES), "EXPLAIN: planning / execution",
         "lower bound worked out"),
    ]  # fmt: skip
    for layout, r in results:
        claimed = [n for mode in MODES for n in r["modes"][mode]["claimed"]]
        times = [r["modes"][mode]["times_ms"] for mode in MODES]
        rows.append(
            (
                layout.label,
                str(r["partitions"]),
                claimed_text(claimed),
                *(f"{ms(statistics.median(t))} / {ms(percentile(t, 0.9))}" for t in times),
                f"{ms(r['planning_ms'])} / {ms(r['execution_ms'])}",
                ms(r["bound_ms"]),
            )
        )
    print_rows(rows)
    print(
        "(partitions of jobs: pg_inherits, the DEFAULT partition among them. EXPLAIN (ANALYZE):"
        f" the claim's statement with its values written in, median of {EXPLAINS}. Lower bound:"
        " jobs/partitions/pending.py's oldest_pending_partition_at(), ms, median of"
        f" {EXPLAINS}.)\n"
    )
    rows = [
        ("layout", "plan_cache_mode", "claim prepared: generic / custom plans",
         "CPU ms per claim: PostgreSQL backend / this bench"),
    ]  # fmt: skip
    for layout, r in results:
        for mode in MODES:
            figures = r["modes"][mode]
            plans = figures["plans"]
            rows.append(
                (
                    layout.text,
                    mode,
                    f"yes: {plans[0]} / {plans[1]}" if plans else "no",
                    f"{ms(figures['server_cpu_ms'])} / {ms(figures['own_cpu_ms'])}",
                )
            )
    print_rows(rows)
    most = max(results, key=lambda result: result[1]["partitions"])
    claim = statistics.median(most[1]["modes"]["auto"]["times_ms"])
    print(
        f"TARGET a flat claim, <= {TARGET_MS:g} ms at 94 partitions: {claim:.1f} ms (auto median)"
        f" with {most[1]['partitions']} partitions ({most[0].text})"
        f" -> {'met' if claim <= TARGET_MS and most[1]['partitions'] >= 94 else 'NOT met'}\n"
    )
    print(
        "(prepared: the claim's statement in that session, after the timed claims. CPU over"
        " the timed claims, from /proc in clock ticks: '-' where PostgreSQL's processes are not"
        " visible.)"
    )
