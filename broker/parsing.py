"""Parsing of numbers given as text by clients (forms, headers, query strings)."""

from __future__ import annotations

import re

# At most 18 digits: always a 64-bit integer. Surrounding blanks are allowed.
_INTEGER = re.compile(r"\s*[+-]?[0-9]{1,18}\s*\Z")


def parse_int(text: str) -> int:
    """An integer in ASCII digits; int() alone also takes other scripts' digits and "1_000"."""
    if not _INTEGER.match(text):
        raise ValueError(f"not an integer: {text[:50]!r}")
    return int(text)
