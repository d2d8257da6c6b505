"""Query strings and form fields are read as UTF-8, whatever charset a request declares: the
request classes of the broker's WSGI and ASGI applications (broker/wsgi.py, broker/asgi.py).

Django decodes both with the `charset` of the request's Content-Type when Python has a codec of
that name, and Python has codecs that are no text encodings: `charset=unicode_escape` turns
`%5Cud800` into a lone surrogate, which no column can store (a 500 wherever it was written), and
`charset=base64` or `charset=idna` make the decoding raise while Django builds the request, before
any middleware runs. The URL and HTML form standards (WHATWG) read both as UTF-8, always, and so
do the broker's clients: browsers, Go's and Python's HTTP libraries and curl send forms without a
charset.

So the declared charset is kept in `content_params` but never becomes the request's `encoding`;
bytes that are not UTF-8 become U+FFFD, as they do for a request that declares nothing. UTF-8 has
no lone surrogates, so no form value or query parameter can hold one, and forms need no check of
their own for them (NUL, which UTF-8 has, is refused by the form fields: Django's and DRF's
CharField). Bodies that are not forms are untouched: a broadcast's payload is stored as the bytes
it is, with its Content-Type, and JSON bodies are read as bytes (broker/storable_text.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import django
from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.core.handlers.wsgi import WSGIHandler, WSGIRequest
from django.utils.http import parse_header_parameters


class Utf8Decoding:
    """For a request class: Django's `_set_content_type_params` without taking the charset as
    the request's encoding (which stays None: DEFAULT_CHARSET, UTF-8)."""

    content_type: str | None
    content_params: dict[str, str] | None

    def _set_content_type_params(self, meta: Mapping[str, Any]) -> None:
        self.content_type, self.content_params = parse_header_parameters(
            meta.get("CONTENT_TYPE", "")
        )


class Utf8WSGIRequest(Utf8Decoding, WSGIRequest):
    pass


class Utf8ASGIRequest(Utf8Decoding, ASGIRequest):
    pass


class Utf8WSGIHandler(WSGIHandler):
    request_class = Utf8WSGIRequest


class Utf8ASGIHandler(ASGIHandler):
    request_class = Utf8ASGIRequest


def wsgi_application() -> WSGIHandler:
    """`django.core.wsgi.get_wsgi_application()` with the request class above."""
    django.setup(set_prefix=False)
    return Utf8WSGIHandler()


def asgi_application() -> ASGIHandler:
    """`django.core.asgi.get_asgi_application()` with the request class above."""
    django.setup(set_prefix=False)
    return Utf8ASGIHandler()
