"""Every screen of the UI (issue 20), through Django's test client: error pages in the UI's
layout, the admin's way back to the UI, the viewport and colour-scheme declarations, times in
UTC with the zone named. In the browser, at phone size and in dark mode:
tests/ui/test_browser_screens.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.templatetags.ui_format import duration, thousands, utc, utc_minute
from tests.helpers import make_channel, make_consumer

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "path", ["/ui/no-such-page", "/ui/no/such/page/", "/ui/consumers/orders/nobody"]
)
def test_a_page_not_found_is_an_html_page_in_the_layout(staff_client, path):
    make_channel()

    response = staff_client.get(path, follow=True)

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "<h1>Not found</h1>" in page
    assert 'href="/ui/dead-jobs"' in page  # the navigation
    assert "Go to the dashboard" in page


def test_the_api_keeps_its_json_errors(admin_client):
    response = admin_client.get("/channel/nope")

    assert response.status_code == 404
    assert response.json()["Error"] == "Request resource not found."


def test_a_page_asked_for_with_a_trailing_slash_is_still_redirected(staff_client):
    response = staff_client.get("/ui/dead-jobs/?status=x")

    assert response.status_code == 308
    assert response["Location"] == "/ui/dead-jobs?status=x"


def test_a_refused_post_is_an_html_page(client):
    from django.test import Client

    from tests.helpers import make_operator

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(make_operator())
    response = strict.post("/ui/dead-jobs/bulk", {"action": "requeue"})

    assert response.status_code == 403
    assert "<h1>Refused</h1>" in response.content.decode()


def test_the_admins_view_site_link_leads_to_the_ui(superuser_client):
    page = superuser_client.get("/admin/").content.decode()

    assert '<a href="/ui/">View site</a>' in page


def test_every_page_declares_the_viewport_and_both_colour_schemes(staff_client):
    page = staff_client.get("/ui/").content.decode()

    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert '<meta name="color-scheme" content="light dark">' in page
    assert "ui/adapt.css" in page


def test_times_are_shown_in_utc_with_the_zone_named(staff_client):
    consumer = make_consumer(make_channel())
    shown = utc(consumer.changed_at)

    assert shown.endswith(" UTC")
    assert shown in staff_client.get("/ui/consumers/orders/billing").content.decode()


def test_the_time_filters():
    moment = datetime(2026, 11, 25, 4, 10, 7, tzinfo=UTC)

    assert utc(moment) == "2026-11-25 04:10:07 UTC"
    assert utc_minute(moment) == "2026-11-25 04:10 UTC"
    assert utc(None) == ""


@pytest.mark.parametrize(
    ("ms", "shown"),
    [
        (812.4, "812 ms"),
        (2287.6, "2.3 s"),
        (2_287_592, "38.1 min"),
        (5_400_000, "1.5 h"),
        (0, "0 ms"),
        (None, "—"),
    ],
)
def test_durations_read_in_a_human_unit(ms, shown):
    assert duration(ms) == shown


def test_counts_have_thousands_separators():
    assert thousands(234_403) == "234,403"
    assert thousands(None) == "—"
