"""A list's filters that do not read (issue 20): the list's own page comes back, 400, with the
form as typed and each problem named above it, never a separate error page that loses what was
typed."""

from __future__ import annotations

import re

import pytest

from tests.helpers import make_consumer

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("path", "query", "field", "typed"),
    [
        ("/ui/dead-jobs", {"since": "yesterday", "error": "clickhouse"}, "since", "clickhouse"),
        (
            "/ui/consumers/orders/billing",
            {"status_code": "700", "since": "2026-11-25"},
            "status_code",
            "2026-11-25",
        ),
        ("/ui/reports", {"until": "2026-13-45", "channel": "orders"}, "until", "orders"),
        ("/ui/messages", {"channel": "no spaces allowed", "q": "order-42"}, "channel", "order-42"),
    ],
)
def test_the_page_keeps_what_was_typed_and_names_the_problem(
    staff_client, channel, path, query, field, typed
):
    make_consumer(channel)

    response = staff_client.get(path, query)

    assert response.status_code == 400
    page = response.content.decode()
    problems = page.split('class="form-errors"')[1].split("</div>")[0]
    assert f"<code>{field}</code>" in problems
    assert f'value="{query[field]}"' in page  # the wrong value, as typed, to correct
    assert f'value="{typed}"' in page  # and the rest of the form
    assert 'class="site-nav"' in page or "<nav" in page  # inside the UI's layout


@pytest.mark.parametrize(
    ("path", "query", "field", "fine"),
    [
        ("/ui/dead-jobs", {"since": "yesterday", "error": "x"}, "since", "error"),
        ("/ui/consumers/orders/billing", {"status_code": "700"}, "status_code", "since"),
        ("/ui/reports", {"until": "2026-13-45"}, "until", "channel"),
        ("/ui/messages", {"channel": "no spaces allowed", "q": "x"}, "channel", "q"),
    ],
)
def test_the_refused_field_is_described_by_its_problem(
    staff_client, channel, path, query, field, fine
):
    """Issue 38: a screen reader reaching the field says what is wrong with it."""
    make_consumer(channel)

    page = staff_client.get(path, query).content.decode()

    def tag(name: str) -> str:
        found = re.search(rf'<(?:input|select)[^>]*\bname="{name}"[^>]*>', page)
        assert found, name
        return found.group(0)

    assert f'aria-describedby="filter-error-{field}"' in tag(field)
    assert 'aria-invalid="true"' in tag(field)
    assert re.search(rf'<li id="filter-error-{field}"><code>{field}</code>: \w', page)
    assert "aria-invalid" not in tag(fine)
    assert "aria-describedby" not in tag(fine)
