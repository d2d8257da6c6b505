"""Template filters of the operator UI: times in UTC with the zone named (docs/ui.md)."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template

register = template.Library()


@register.filter
def utc(value: datetime | None) -> str:
    """2026-11-25 04:10:07 UTC; "" for no time (so that `|default:` applies)."""
    return _utc(value, "%Y-%m-%d %H:%M:%S")


@register.filter
def utc_minute(value: datetime | None) -> str:
    """2026-11-25 04:10 UTC, for per-minute figures."""
    return _utc(value, "%Y-%m-%d %H:%M")


def _utc(value: datetime | None, layout: str) -> str:
    if not isinstance(value, datetime):
        return ""
    return value.astimezone(UTC).strftime(layout) + " UTC"
