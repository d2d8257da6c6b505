"""Template filters of the operator UI (docs/ui.md): times in UTC with the zone named, durations
in a unit a person reads at a glance, counts with thousands separators."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django import template

register = template.Library()

# What a figure that does not apply shows (no attempts, no deliveries to take a percentile of).
NOT_APPLICABLE = "—"


@register.filter
def utc(value: datetime | None) -> str:
    """2026-11-25 04:10:07 UTC; "" for no time (so that `|default:` applies)."""
    return _utc(value, "%Y-%m-%d %H:%M:%S")


@register.filter
def utc_minute(value: datetime | None) -> str:
    """2026-11-25 04:10 UTC, for per-minute figures."""
    return _utc(value, "%Y-%m-%d %H:%M")


# Units of a duration, largest first: (milliseconds in one, its symbol).
TIME_UNITS = [(3_600_000, "h"), (60_000, "min"), (1000, "s"), (1, "ms")]


def time_unit(largest_ms: float) -> tuple[int, str]:
    """The unit to show durations up to `largest_ms` in: (milliseconds in one, symbol)."""
    return next((size, symbol) for size, symbol in TIME_UNITS if largest_ms >= size or size == 1)


@register.filter
def duration(ms: float | None) -> str:
    """812 ms, 2.3 s, 38.1 min, 1.5 h; "—" for none."""
    if not isinstance(ms, int | float):
        return NOT_APPLICABLE
    size, symbol = time_unit(float(ms))
    value = float(ms) / size
    return f"{value:,.0f} {symbol}" if size == 1 else f"{value:,.1f} {symbol}"


@register.filter
def estimated_duration(ms: float | None) -> str:
    """A duration that is an estimate (a percentile read from histogram buckets, jobs/stats.py),
    marked as one: "≈ 365 ms"; "—" for none."""
    text = duration(ms)
    return text if text == NOT_APPLICABLE else f"≈ {text}"


# Steps of an age in words, smallest first: (below this many seconds, seconds in its unit, unit).
AGE_STEPS = [(90, 1, "s"), (90 * 60, 60, "min"), (48 * 3600, 3600, "h")]


@register.filter
def time_ago(age: timedelta | None) -> str:
    """How long ago something happened, from its age: "12 s ago", "4 min ago", "3 h ago",
    "2 d ago". Under a second, and for a time ahead of this host's clock (another host's clock
    runs a little fast, or it wrote after this page read the time), "just now": never "-1 s
    ago". "" for no age."""
    if not isinstance(age, timedelta):
        return ""
    seconds = age.total_seconds()
    if seconds < 1:
        return "just now"
    for below, size, unit in AGE_STEPS:
        if seconds < below:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds // 86400):,} d ago"


@register.filter
def thousands(number: int | float | None) -> str:
    """12,345; "—" for none."""
    if not isinstance(number, int | float):
        return NOT_APPLICABLE
    return f"{number:,}" if isinstance(number, int) else f"{number:,.0f}"


def _utc(value: datetime | None, layout: str) -> str:
    if not isinstance(value, datetime):
        return ""
    return value.astimezone(UTC).strftime(layout) + " UTC"
