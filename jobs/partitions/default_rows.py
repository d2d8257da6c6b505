"""What the DEFAULT partitions hold, for the warning of /_status, the dashboard and /metrics.

A row lands in a DEFAULT partition when no time partition covers it: jobs created while
housekeeping did not run for longer than a partition's span, a clock that jumped, old data
imported with old times. Retention takes such rows row by row (jobs/partitions/retention.py), and
housekeeping places young jobs into a partition every hour, but rows there mean housekeeping was
behind, and every query the planner cannot keep out of the DEFAULT partition reads them: an
operator should hear of it.

The count stops at `limit` rows: it reads at most that many rows of each DEFAULT partition (it
costs a few index-free page reads while they are empty, as they should be), never the table.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections

from jobs.partitions.catalog import ATTEMPTS, JOBS

COUNT_LIMIT = 1000  # rows counted per DEFAULT partition; past it "≥ 1,000"


@dataclass(frozen=True)
class DefaultRows:
    """Rows of the DEFAULT partitions of jobs and of attempts, each counted up to `limit`."""

    jobs: int
    attempts: int
    limit: int = COUNT_LIMIT

    def __bool__(self) -> bool:
        return bool(self.jobs or self.attempts)

    def shown(self, count: int, noun: str) -> str:
        if count >= self.limit:
            return f"≥ {self.limit:,} {noun}s"
        return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"

    @property
    def warning(self) -> str:
        """One sentence for /_status and the dashboard ("" while both are empty)."""
        if not self:
            return ""
        return (
            f"{self.shown(self.jobs, 'job')} and {self.shown(self.attempts, 'attempt')} are in the"
            " DEFAULT partitions (no time partition covers them): is the hourly 'broker: maintain"
            " partitions' schedule running? Retention takes them row by row (docs/scaling.md)."
        )


def default_partition_rows(limit: int = COUNT_LIMIT, using: str = "default") -> DefaultRows:
    """Count the rows of both DEFAULT partitions, up to `limit` each, in one query (the
    dashboard's count of queries is fixed)."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"""SELECT (SELECT count(*) FROM (SELECT FROM "{JOBS.default}" LIMIT %s) AS jobs),
            (SELECT count(*) FROM (SELECT FROM "{ATTEMPTS.default}" LIMIT %s) AS attempts)""",  # noqa: S608
            [limit, limit],
        )
        jobs, attempts = cursor.fetchone()
    return DefaultRows(int(jobs), int(attempts), limit)
