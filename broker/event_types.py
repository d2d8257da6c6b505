"""Event types (docs/api.md, "Event types"): the type a message may carry, and the patterns a
consumer subscribes with. A consumer with no patterns receives every message, as before event
types existed (and as webhook-broker's consumers do); otherwise a message reaches it when its type
matches one of them: the same type, a prefix ending in `*` (`order.*` matches `order.created` and
`order.item.added`), or `*` (every message, typed or not). A message without a type matches only
consumers without patterns and `*`.

The rule is applied in SQL on PostgreSQL (jobs/queue/sql/shared.sql, the fragments `subscribed` and
`matching_patterns`) and by `matches` elsewhere; tests hold the two to the same answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

EVENT_TYPE = re.compile(r"[A-Za-z0-9_.:-]{1,255}")
_PATTERN = re.compile(r"\*|[A-Za-z0-9_.:-]{1,254}\*?")
MAX_PATTERNS = 100
TYPE_RULE = "1 to 255 letters, digits, '_', '.', ':' or '-'"


class InvalidEventType(ValueError):
    pass


def checked_event_type(value: str) -> str:
    """`value` if it is a valid event type; InvalidEventType naming the rule otherwise."""
    if not EVENT_TYPE.fullmatch(value):
        raise InvalidEventType(f"Event type {value[:80]!r} is not valid: use {TYPE_RULE}.")
    return value


def checked_patterns(patterns: Iterable[str]) -> list[str]:
    """The patterns without blanks and repeats, in their order; InvalidEventType naming the
    first one that is not a type, a type's prefix followed by `*`, or `*`."""
    kept: list[str] = []
    for pattern in (pattern.strip() for pattern in patterns):
        if not pattern or pattern in kept:
            continue
        if not _PATTERN.fullmatch(pattern):
            raise InvalidEventType(
                f"Event type pattern {pattern[:80]!r} is not valid: use an event type"
                f" ({TYPE_RULE}), a prefix of one ending in '*' (order.*), or '*'."
            )
        kept.append(pattern)
    if len(kept) > MAX_PATTERNS:
        raise InvalidEventType(f"At most {MAX_PATTERNS} event type patterns per consumer.")
    return kept


def parse_patterns(text: str) -> list[str]:
    """The patterns of a comma-separated form field."""
    return checked_patterns(text.split(","))


def matches(patterns: list[str], event_type: str | None) -> bool:
    """Whether a message of `event_type` (None: untyped) reaches a consumer with `patterns`."""
    if not patterns:
        return True
    for pattern in patterns:
        if pattern == "*":
            return True
        if event_type is None:
            continue
        if pattern.endswith("*"):
            if event_type.startswith(pattern[:-1]):
                return True
        elif pattern == event_type:
            return True
    return False
