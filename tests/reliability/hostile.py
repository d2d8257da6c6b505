"""Hypothesis strategies for what hostile or broken receivers answer, and for the text hostile
clients send (tests/reliability/test_hostile_*.py).

Each strategy makes bytes as they go on the wire: status lines that are HTTP and that are not,
headers a receiver may send (Retry-After in every date form and none, Set-Cookie,
Content-Encoding, Transfer-Encoding, Content-Length that lies) with huge and malformed values,
bodies with NULs, compressed or not, and an ending of the connection
(tests/reliability/faulty_receiver.py).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import format_datetime
from urllib.parse import quote

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.reliability.faulty_receiver import Script

# How many generated cases each property runs (CI: the default); HOSTILE_EXAMPLES=2000 for a
# longer search. Derandomized: every run tries the same cases, so CI never fails by chance.
EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "150"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,  # each case makes real requests over loopback
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # the fixtures are the same for every case
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

HUGE = b"x" * 70_000  # beyond every header size limit


def _http_date(moment: datetime, zone: str, form: str) -> str:
    """`moment` as an HTTP-date in one of its three forms, with any zone text."""
    if form == "rfc850":
        text = moment.strftime("%A, %d-%b-%y %H:%M:%S")
    elif form == "asctime":
        return moment.strftime("%a %b %d %H:%M:%S %Y")
    else:
        text = format_datetime(moment.replace(tzinfo=UTC), usegmt=True).removesuffix(" GMT")
    return f"{text} {zone}".strip()


http_dates = st.builds(
    _http_date,
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
    st.sampled_from(["GMT", "UTC", "-0000", "+0000", "+1400", "-1200", "+9999", "EST", ""]),
    st.sampled_from(["rfc1123", "rfc850", "asctime"]),
)
retry_after_values = st.one_of(
    http_dates,
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.just("9" * 5000),
    st.text(max_size=40),
)
_latin1 = st.text(st.characters(max_codepoint=255), max_size=60)
_header_values: dict[str, st.SearchStrategy[str]] = {
    "Retry-After": retry_after_values,
    "Set-Cookie": st.one_of(
        st.just("session=stolen; Path=/; Max-Age=86400"),
        st.builds(lambda v: f"id={v}; Domain=localhost; Path=/", _latin1),
        _latin1,
    ),
    "Content-Encoding": st.sampled_from(
        ["gzip", "deflate", "br", "zstd", "identity", "x-bogus", "gzip, gzip", ""]
    ),
    "Transfer-Encoding": st.sampled_from(["chunked", "gzip, chunked", "bogus", "chunked, chunked"]),
    "Content-Length": st.one_of(st.integers(-5, 10**20).map(str), _latin1),
    "Content-Type": st.one_of(st.just("text/plain; charset=utf-8"), _latin1),
    "Location": _latin1,
    "Connection": st.sampled_from(["close", "keep-alive", "upgrade", "bogus"]),
}


def _encode(text: str) -> bytes:
    return text.encode("latin-1", errors="replace")


# Mostly headers a receiver sends, with hostile values; now and then no header at all. (A
# strategy in one_of is drawn as often as each other one: the well-formed are listed twice.)
_known_headers = st.sampled_from(sorted(_header_values)).flatmap(
    lambda name: _header_values[name].map(lambda value: _encode(f"{name}: {value}"))
)
header_lines = st.one_of(
    _known_headers,
    _known_headers,
    _known_headers,
    st.builds(lambda name, value: _encode(f"{name}: {value}"), _latin1, _latin1),
    st.just(b"X-Huge: " + HUGE),
    st.binary(max_size=60),  # not a header line at all
)
_codes = st.sampled_from([200, 201, 204, 301, 400, 404, 408, 410, 429, 500, 503])
_status_line = st.builds(
    lambda code, reason: _encode(f"HTTP/1.1 {code} {reason}"),
    _codes | st.integers(0, 1000),
    st.sampled_from(["OK", ""]) | _latin1,
)
status_lines = st.one_of(_status_line, _status_line, _status_line, st.binary(max_size=40))
bodies = st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=300).map(gzip.compress),
    st.just(b"\x00" * 64),  # NUL bytes, which PostgreSQL text refuses
    st.just(b"5\r\nhello\r\nZZ\r\n"),  # broken chunked encoding
)
_generic = st.builds(
    lambda status, headers, body: status + b"\r\n" + _head(headers) + body,
    status_lines,
    st.lists(header_lines, max_size=6),
    bodies,
)
# Well-formed answers that ask to be retried later, with any Retry-After.
_retry_later = st.builds(
    lambda code, value: (
        _encode(f"HTTP/1.1 {code} Later\r\nRetry-After: {value}\r\n") + b"Content-Length: 0\r\n\r\n"
    ),
    st.sampled_from([429, 503]),
    retry_after_values,
)
scripts = st.builds(
    Script,
    st.one_of(_generic, _generic, _retry_later),
    st.sampled_from(["close", "close", "close", "cut", "reset", "trickle", "hang"]),
)


def _head(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\r\n" for line in lines) + b"\r\n"


# Text the database cannot store: ordinary text around one lone surrogate or one NUL. (st.text
# never makes a surrogate itself, so the one put in stays lone.)
UNSTORABLE_CHARACTERS = ["\ud800", "\udbff", "\udc00", "\udfff", "\x00"]
unstorable_text = st.builds(
    lambda before, bad, after: before + bad + after,
    st.text(max_size=8),
    st.sampled_from(UNSTORABLE_CHARACTERS),
    st.text(max_size=8),
)


def form_encoded(fields: Mapping[str, str | list[str]], charset: str) -> str:
    """`fields` form-encoded as a client writing `charset` would; "utf-8" writes a surrogate as
    the bytes "surrogatepass" gives it, which are no UTF-8 (a client that does not check)."""
    encoding, errors = ("utf-8", "surrogatepass") if charset == "utf-8" else (charset, "strict")
    return "&".join(
        f"{name}={quote(value.encode(encoding, errors), safe='')}"
        for name, values in fields.items()
        for value in ([values] if isinstance(values, str) else values)
    )
