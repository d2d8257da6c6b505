"""Text the operator UI cannot store (issue 36 §4), in every form field and query parameter that
tests/ui/test_fuzz.py fuzzes (its routes, fields and rows): generated text holding a lone
surrogate or a NUL (tests/reliability/hostile.py), percent-encoded as UTF-8 (the surrogate as the
bytes a careless client writes) or under a declared charset that would decode it back
(`unicode_escape`). No page answers 5xx, and a 400 names the parameter it refuses.

A charset that is no text encoding (`base64`) made Django raise while it built the request, before
any middleware; broker/utf8_requests.py reads every URL and form as UTF-8. The last test sends
such requests to `broker.wsgi.application` itself, which the servers run.
"""

from __future__ import annotations

import io
from typing import Any
from urllib.parse import quote

import pytest
from django.core.signals import request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import FORM
from tests.reliability.hostile import form_encoded, unstorable_text
from tests.ui.test_fuzz import (  # noqa: F401 (the fixtures)
    FORM_FIELDS,
    QUERY_PARAMETERS,
    assert_answered,
    clock,
    path_of,
    root,
    rows,
)

pytestmark = pytest.mark.django_db

CHARSETS = ["utf-8", "unicode_escape"]
FORM_PLACES = [(name, field) for name, fields in FORM_FIELDS.items() for field in fields]
QUERY_PLACES = [
    (name, parameter) for name, names in QUERY_PARAMETERS.items() for parameter in names
]
GENERATED = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@GENERATED
@given(where=st.sampled_from(FORM_PLACES), text=unstorable_text, charset=st.sampled_from(CHARSETS))
def test_unstorable_text_in_any_form_field(root, rows, where, text, charset):  # noqa: F811
    name, field = where
    body = form_encoded({**FORM_FIELDS[name], field: text}, charset)

    response = root.post(path_of(name, rows), body, content_type=f"{FORM}; charset={charset}")

    # Form pages show a refused field next to its input (400), actions name it on a 400 page.
    assert response.status_code < 500, (name, field, response.content[:300])


@GENERATED
@given(where=st.sampled_from(QUERY_PLACES), text=unstorable_text, charset=st.sampled_from(CHARSETS))
def test_unstorable_text_in_any_query_parameter(root, rows, where, text, charset):  # noqa: F811
    name, parameter = where
    query = form_encoded({parameter: text}, charset)

    response = root.get(
        f"{path_of(name, rows)}?{query}", CONTENT_TYPE=f"text/plain; charset={charset}"
    )

    assert_answered(response, parameter)


@pytest.mark.parametrize("charset", ["unicode_escape", "base64", "idna", "punycode", "utf-7"])
def test_the_servers_application_reads_urls_and_forms_as_utf8(rows, charset):  # noqa: F811
    """The report's request: a UI search for `\\ud800` under `charset=unicode_escape` was a 500;
    under `charset=base64` Django raised before answering at all."""
    from broker.wsgi import application

    answered: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], *exc_info: object) -> Any:
        answered.append(status)
        return lambda data: None

    body = b"name=" + quote("\\ud800").encode()
    environ = {
        "REQUEST_METHOD": "PUT",
        "PATH_INFO": "/producer/p-new",
        "QUERY_STRING": "q=%5Cud800",
        "CONTENT_TYPE": f"{FORM}; charset={charset}",
        "CONTENT_LENGTH": str(len(body)),
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "HTTP_AUTHORIZATION": "Bearer ui-fuzz-admin-token",
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": io.StringIO(),
    }

    # As Django's test client does: the test's transaction must outlive the request.
    request_started.disconnect(close_old_connections)
    try:
        chunks = application(environ, start_response)
    finally:
        request_started.connect(close_old_connections)

    assert answered == ["200 OK"], b"".join(chunks)
    assert b'"Name":"\\\\ud800"' in b"".join(chunks)  # the six characters, as UTF-8 reads them
