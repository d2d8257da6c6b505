"""What the delivery statistics count (jobs/stats.py keeps and reads the rollup): the latency
buckets, the status-code classes of failures, and `Tally`, the figures of some attempts added up
from rollup rows. Apart so that the rollup's refresh and reads stay a module of their own."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from jobs.models import DeliveryStats

# Latency buckets: 8 per decade of milliseconds, bucket k holding [10^(k/8), 10^((k+1)/8)) ms,
# so an estimate taken from a bucket's middle is within 16% of the truth. Bucket 0 also holds
# anything under 1.33 ms (clock skew between hosts can even make latencies negative); the last
# one anything from 10^8 ms (28 hours) up.
BUCKETS_PER_DECADE = 8
LAST_BUCKET = 8 * BUCKETS_PER_DECADE
BUCKETS_PER_LN = BUCKETS_PER_DECADE / math.log(10)
ROUNDING_EPSILON = (
    1e-9  # so that rounding cannot put exactly 10 ms (a bucket's lower edge) below it
)

# The status-code classes of failed attempts and the DeliveryStats columns that count them; a 2xx
# is `delivered`. A failure in none of them (a status outside 300..599) counts in `failed` only.
FAILURE_CLASSES = {
    "3xx": "status_3xx",
    "4xx": "status_4xx",
    "5xx": "status_5xx",
    "no answer": "no_answer",
}


def latency_bucket(latency_ms: float) -> int:
    """The bucket of a latency, as the refresh's SQL computes it."""
    return min(
        math.floor(math.log(max(latency_ms, 1.0)) * BUCKETS_PER_LN + ROUNDING_EPSILON), LAST_BUCKET
    )


def bucket_estimate_ms(bucket: int) -> float:
    """The latency that stands for a bucket: its geometric middle (the last: its lower edge)."""
    if bucket >= LAST_BUCKET:
        return float(10 ** (LAST_BUCKET / BUCKETS_PER_DECADE))
    return float(10 ** ((bucket + 0.5) / BUCKETS_PER_DECADE))


@dataclass
class Tally:
    """Attempts of some consumers over some period, added up from rollup rows."""

    attempts: int = 0
    delivered: int = 0
    failed: int = 0
    histogram: Counter[int] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)  # per class of FAILURE_CLASSES

    def add(self, other: Tally | DeliveryStats) -> None:
        if isinstance(other, Tally):
            self.count(other.attempts, other.delivered, other.failed, failures=other.failures)
            self.histogram.update(other.histogram)
        else:
            failures = {name: getattr(other, column) for name, column in FAILURE_CLASSES.items()}
            self.count(
                other.attempts, other.delivered, other.failed, other.latency_histogram, failures
            )

    def count(
        self,
        attempts: int,
        delivered: int,
        failed: int,
        histogram: dict[str, int] | None = None,
        failures: dict[str, int] | None = None,
    ) -> None:
        """Add a rollup row's figures; its stored histogram (bucket numbers as text) and its
        failures per class if given."""
        self.attempts += attempts
        self.delivered += delivered
        self.failed += failed
        for bucket, deliveries in (histogram or {}).items():
            self.histogram[int(bucket)] += deliveries
        self.failures.update(failures or {})

    def status_classes(self) -> dict[str, int]:
        """Attempts per status-code class: "2xx" (delivered), then each of FAILURE_CLASSES, and
        "other" when some failures are in none (a status outside 300..599, or a row counted
        before classes were)."""
        classes = {"2xx": self.delivered} | {name: self.failures[name] for name in FAILURE_CLASSES}
        unclassified = self.failed - sum(self.failures.values())
        return classes | {"other": unclassified} if unclassified else classes

    @property
    def success_rate(self) -> float | None:
        """Delivered attempts out of all attempts (0..1); None without attempts."""
        return self.delivered / self.attempts if self.attempts else None

    def latency_ms(self, quantile: float) -> float | None:
        """Estimated latency percentile (quantile 0..1) of the delivered attempts."""
        total = sum(self.histogram.values())
        if not total:
            return None
        rank = max(1, math.ceil(quantile * total))  # the rank-th fastest delivery
        seen = 0
        for bucket in sorted(self.histogram):
            seen += self.histogram[bucket]
            if seen >= rank:
                return bucket_estimate_ms(bucket)
        raise AssertionError("unreachable: the ranks add up to total")
